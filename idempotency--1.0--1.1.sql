-- idempotency 1.0 -> 1.1.
--
-- `CREATE EXTENSION idempotency` installs idempotency--1.0.sql (frozen as
-- shipped, never edited) and then runs this script, so a fresh install and
-- an upgraded one execute the same statements: this file is the only
-- definition of what 1.1 adds.  test/suites/80-upgrade compares an upgraded
-- database (with live claims) against a fresh install.
--
-- Conventions (see docs/upgrading.md):
--   - every name is schema-qualified with @extschema@. and every operator
--     and function from pg_catalog is written pg_catalog.xxx, because the
--     script runs with the extension's schema first in search_path;
--   - no CREATE OR REPLACE of anything a user could have pre-created, no
--     SET search_path; ALTER FUNCTION ... only on our own members;
--   - every new function, table, sequence or view: REVOKE ALL ... FROM PUBLIC;
--   - anything whose content must survive pg_dump (a table holding a
--     choice or state): SELECT pg_catalog.pg_extension_config_dump(...);
--   - each engineer appends one section with a clear header below; the
--     statements must work both on an empty 1.0 table and on a live one
--     (short locks only: this runs while applications claim keys).

\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.1'" to load this file. \quit

-- ===========================================================================
-- Section 1: tenant isolation and operator indexes survive pg_dump (issue 12)
-- ===========================================================================
-- pg_dump does not dump what a user adds to an extension's table: ENABLE
-- ROW LEVEL SECURITY, policies and indexes on idempotency_records vanish in
-- a dump and restore, and with them tenant isolation.  So the extension
-- keeps these choices itself, in two small tables marked with
-- pg_extension_config_dump (their rows are dumped and restored), and a
-- trigger on each applies a row to idempotency_records whenever it is
-- written -- by idem_set_tenant_isolation / idem_create_index, or by the
-- COPY of a restore, which runs after CREATE EXTENSION re-created the table.
-- One code path applies the choice both times.

-- At most one row: present = tenant isolation on, reading tenant_id from the
-- named setting.
CREATE TABLE @extschema@.idem_tenant_isolation (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    setting   text    NOT NULL
);
COMMENT ON TABLE @extschema@.idem_tenant_isolation IS
    'tenant isolation of idempotency_records (one row = on); write it with idem_set_tenant_isolation()';

-- Operator indexes on idempotency_records that pg_dump must keep.
CREATE TABLE @extschema@.idem_extra_indexes (
    index_name text   PRIMARY KEY,
    columns    text[] NOT NULL
);
COMMENT ON TABLE @extschema@.idem_extra_indexes IS
    'extra btree indexes on idempotency_records, re-created on restore; write it with idem_create_index()/idem_drop_index()';

SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_tenant_isolation', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_extra_indexes', '');
REVOKE ALL ON TABLE @extschema@.idem_tenant_isolation, @extschema@.idem_extra_indexes FROM PUBLIC;

-- Applies idem_tenant_isolation to idempotency_records (same schema: the
-- trigger's).  The policy reads the setting with missing_ok, so a session
-- that set no tenant sees and writes nothing.  Turning isolation off drops
-- the policy, and disables row-level security only when no other policy
-- is left on the table (a user's own policies keep it on).
CREATE FUNCTION @extschema@.idem_apply_tenant_isolation()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    tbl text := pg_catalog.format('%I.idempotency_records', TG_TABLE_SCHEMA);
BEGIN
    IF TG_OP OPERATOR(pg_catalog.=) 'TRUNCATE' THEN
        -- would forget the choice while leaving it applied
        RAISE EXCEPTION 'idem_tenant_isolation cannot be truncated'
            USING ERRCODE = '0A000', HINT = 'Use idem_set_tenant_isolation(false).';
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
        IF EXISTS (SELECT FROM pg_catalog.pg_policy p
                   WHERE p.polrelid OPERATOR(pg_catalog.=) tbl::pg_catalog.regclass
                     AND p.polname OPERATOR(pg_catalog.=) 'idem_tenant_isolation') THEN
            EXECUTE pg_catalog.format('DROP POLICY idem_tenant_isolation ON %s', tbl);
        END IF;
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_policy p
                       WHERE p.polrelid OPERATOR(pg_catalog.=) tbl::pg_catalog.regclass) THEN
            EXECUTE pg_catalog.format('ALTER TABLE %s DISABLE ROW LEVEL SECURITY', tbl);
        END IF;
        RETURN OLD;
    END IF;
    -- a custom setting: two or more dot-separated identifiers
    IF NEW.setting IS NULL OR NOT NEW.setting OPERATOR(pg_catalog.~)
            '^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)+$' THEN
        RAISE EXCEPTION 'invalid setting name for tenant isolation: "%"', NEW.setting
            USING ERRCODE = '22023',
                  HINT = 'Name a custom setting such as app.tenant.';
    END IF;
    EXECUTE pg_catalog.format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', tbl);
    IF EXISTS (SELECT FROM pg_catalog.pg_policy p
               WHERE p.polrelid OPERATOR(pg_catalog.=) tbl::pg_catalog.regclass
                 AND p.polname OPERATOR(pg_catalog.=) 'idem_tenant_isolation') THEN
        EXECUTE pg_catalog.format('DROP POLICY idem_tenant_isolation ON %s', tbl);
    END IF;
    EXECUTE pg_catalog.format(
        'CREATE POLICY idem_tenant_isolation ON %s '
        'USING (tenant_id OPERATOR(pg_catalog.=) pg_catalog.current_setting(%L, true))',
        tbl, NEW.setting);
    RETURN NEW;
END
$fn$;

-- Applies idem_extra_indexes: creates the btree index a new row names (or
-- adopts an index of that name already on idempotency_records with exactly
-- those columns, so a large table's index can be built first with CREATE
-- INDEX CONCURRENTLY), drops it when the row is deleted.
CREATE FUNCTION @extschema@.idem_apply_extra_index()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    tbl      pg_catalog.regclass := pg_catalog.format('%I.idempotency_records', TG_TABLE_SCHEMA)::pg_catalog.regclass;
    existing pg_catalog.oid;
    wanted   pg_catalog.int2[];
    cols     text;
    def      text;
BEGIN
    IF TG_OP OPERATOR(pg_catalog.=) 'TRUNCATE' THEN
        -- would forget the indexes while leaving them in place
        RAISE EXCEPTION 'idem_extra_indexes cannot be truncated'
            USING ERRCODE = '0A000', HINT = 'Use idem_drop_index() for each index.';
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
        EXECUTE pg_catalog.format('DROP INDEX IF EXISTS %I.%I', TG_TABLE_SCHEMA, OLD.index_name);
        RETURN OLD;
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
        RAISE EXCEPTION 'an extra index cannot be changed in place'
            USING ERRCODE = '0A000',
                  HINT = 'Drop it with idem_drop_index() and create it again with idem_create_index().';
    END IF;
    IF NEW.index_name IS NULL OR pg_catalog.octet_length(NEW.index_name) OPERATOR(pg_catalog.>) 63
            OR pg_catalog.octet_length(NEW.index_name) OPERATOR(pg_catalog.=) 0 THEN
        RAISE EXCEPTION 'invalid index name: "%"', NEW.index_name
            USING ERRCODE = '42602', DETAIL = 'An index name has 1 to 63 bytes.';
    END IF;
    IF pg_catalog.cardinality(NEW.columns) OPERATOR(pg_catalog.=) 0
            OR pg_catalog.array_position(NEW.columns, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'an extra index needs at least one column and no null column name'
            USING ERRCODE = '22023';
    END IF;
    SELECT pg_catalog.array_agg(a.attnum ORDER BY c.ord) INTO wanted
    FROM pg_catalog.unnest(NEW.columns) WITH ORDINALITY AS c(name, ord)
    JOIN pg_catalog.pg_attribute a
      ON a.attrelid OPERATOR(pg_catalog.=) tbl AND a.attname OPERATOR(pg_catalog.=) c.name
     AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped;
    IF wanted IS NULL OR pg_catalog.cardinality(wanted) OPERATOR(pg_catalog.<>) pg_catalog.cardinality(NEW.columns) THEN
        RAISE EXCEPTION 'idempotency_records has no column named in %', NEW.columns
            USING ERRCODE = '42703';
    END IF;
    SELECT pg_catalog.string_agg(pg_catalog.quote_ident(c.name), ', ' ORDER BY c.ord) INTO cols
    FROM pg_catalog.unnest(NEW.columns) WITH ORDINALITY AS c(name, ord);
    -- exactly what a restore will build again, in pg_get_indexdef's words
    def := pg_catalog.format('CREATE INDEX %I ON %I.idempotency_records USING btree (%s)',
                             NEW.index_name, TG_TABLE_SCHEMA, cols);
    SELECT c.oid INTO existing FROM pg_catalog.pg_class c
    WHERE c.relname OPERATOR(pg_catalog.=) NEW.index_name
      AND c.relnamespace OPERATOR(pg_catalog.=) (SELECT r.relnamespace FROM pg_catalog.pg_class r
                                                 WHERE r.oid OPERATOR(pg_catalog.=) TG_RELID);
    IF existing IS NULL THEN
        EXECUTE def;
    ELSIF NOT EXISTS (SELECT FROM pg_catalog.pg_index i
                      WHERE i.indexrelid OPERATOR(pg_catalog.=) existing AND i.indisvalid
                        AND pg_catalog.pg_get_indexdef(i.indexrelid) OPERATOR(pg_catalog.=) def) THEN
        RAISE EXCEPTION 'relation "%" already exists and is not a valid index "%"', NEW.index_name, def
            USING ERRCODE = '42P07',
                  HINT = 'An index is adopted only when it is exactly the plain btree index a restore would build.';
    END IF;
    RETURN NEW;
END
$fn$;

CREATE TRIGGER idem_apply_tenant_isolation
    AFTER INSERT OR UPDATE OR DELETE ON @extschema@.idem_tenant_isolation
    FOR EACH ROW EXECUTE FUNCTION @extschema@.idem_apply_tenant_isolation();
CREATE TRIGGER idem_apply_extra_index
    AFTER INSERT OR UPDATE OR DELETE ON @extschema@.idem_extra_indexes
    FOR EACH ROW EXECUTE FUNCTION @extschema@.idem_apply_extra_index();
CREATE TRIGGER idem_no_truncate
    BEFORE TRUNCATE ON @extschema@.idem_tenant_isolation
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_apply_tenant_isolation();
CREATE TRIGGER idem_no_truncate
    BEFORE TRUNCATE ON @extschema@.idem_extra_indexes
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_apply_extra_index();

-- The API.  SQL-standard bodies are parsed here, with the names bound now,
-- so no search_path can redirect them later.  They run with the caller's
-- rights: only the table's owner (or a role granted the config tables and
-- ownership) can switch isolation or add indexes.
CREATE FUNCTION @extschema@.idem_set_tenant_isolation(
    enabled boolean,
    setting text DEFAULT 'app.tenant')
RETURNS boolean
LANGUAGE sql VOLATILE STRICT
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    DELETE FROM @extschema@.idem_tenant_isolation WHERE NOT idem_set_tenant_isolation.enabled;
    INSERT INTO @extschema@.idem_tenant_isolation AS t (singleton, setting)
        SELECT true, idem_set_tenant_isolation.setting WHERE idem_set_tenant_isolation.enabled
        ON CONFLICT (singleton) DO UPDATE SET setting = excluded.setting
        WHERE t.setting OPERATOR(pg_catalog.<>) excluded.setting;
    SELECT idem_set_tenant_isolation.enabled;
END;

CREATE FUNCTION @extschema@.idem_create_index(
    columns    text[],
    index_name text DEFAULT NULL)
RETURNS text
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    INSERT INTO @extschema@.idem_extra_indexes (index_name, columns)
        VALUES (COALESCE(idem_create_index.index_name,
                    pg_catalog.concat('idempotency_records_',
                        pg_catalog.array_to_string(idem_create_index.columns, '_'), '_idx')),
                idem_create_index.columns)
        RETURNING index_name;
END;

CREATE FUNCTION @extschema@.idem_drop_index(index_name text)
RETURNS boolean
LANGUAGE sql VOLATILE STRICT
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    WITH gone AS (
        DELETE FROM @extschema@.idem_extra_indexes x
        WHERE x.index_name OPERATOR(pg_catalog.=) idem_drop_index.index_name
        RETURNING 1)
    SELECT EXISTS (SELECT FROM gone);
END;

REVOKE ALL ON FUNCTION
    @extschema@.idem_apply_tenant_isolation(),
    @extschema@.idem_apply_extra_index(),
    @extschema@.idem_set_tenant_isolation(boolean, text),
    @extschema@.idem_create_index(text[], text),
    @extschema@.idem_drop_index(text)
FROM PUBLIC;

-- ===========================================================================
-- Section 2: tokens that never go backwards (issue 10, lead)
-- ===========================================================================
-- A durable high-water mark for fencing tokens (src/tokens.c): every token
-- handed out is at most this sequence's value, which is WAL-logged, so after
-- a crash, a restart, a clock stepped back or a standby's promotion new
-- tokens start above every earlier one.  Only the C code moves it (as the
-- extension's owner); it starts above every token already stored and above
-- the clock in microseconds since 2000-01-01, as tokens did in 1.0.  pg_dump
-- keeps its value.
CREATE SEQUENCE @extschema@.idempotency_tokens AS bigint MINVALUE 1 NO CYCLE;
SELECT pg_catalog.setval('@extschema@.idempotency_tokens'::pg_catalog.regclass,
                         pg_catalog.max(s.t))
  FROM (SELECT pg_catalog.max(token) AS t FROM @extschema@.idempotency_records
        UNION ALL
        SELECT pg_catalog.int8((pg_catalog.date_part('epoch', pg_catalog.clock_timestamp())
                                OPERATOR(pg_catalog.-) 946684800::pg_catalog.float8)
                               OPERATOR(pg_catalog.*) 1000000::pg_catalog.float8)) AS s;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idempotency_tokens', '');
REVOKE ALL ON SEQUENCE @extschema@.idempotency_tokens FROM PUBLIC;

-- ===========================================================================
-- Section 3: multi-step operations -- recovery points and child keys
-- (issue 14, lead)
-- ===========================================================================
-- A holder stores a recovery point (and optional state) between the phases
-- of a multi-step operation with idem_checkpoint, in the same transaction as
-- the phase's business writes.  The next owner of the key (after a takeover,
-- or a release without failure, which keeps a checkpointed record and hands
-- it on) receives the last committed point from idem_claim/idem_claim_many
-- and resumes after it.  idem_child_key gives the stable key a step sends to
-- a downstream service.  Adding nullable columns without a default rewrites
-- nothing.
ALTER TABLE @extschema@.idempotency_records
    ADD COLUMN recovery_point text,
    ADD COLUMN state          jsonb;
COMMENT ON COLUMN @extschema@.idempotency_records.recovery_point IS
    'the last checkpoint of the key''s holders (idem_checkpoint); a new owner resumes after it';

ALTER TYPE @extschema@.idem_claim_result
    ADD ATTRIBUTE recovery_point text,
    ADD ATTRIBUTE state          jsonb;

CREATE FUNCTION @extschema@.idem_checkpoint(
    tenant_id text,
    key       text,
    token     bigint,
    point     text,
    state     jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_checkpoint'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_child_key(
    tenant_id text,
    key       text,
    step      text)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_child_key'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

REVOKE ALL ON FUNCTION
    @extschema@.idem_checkpoint(text, text, bigint, text, jsonb),
    @extschema@.idem_child_key(text, text, text)
FROM PUBLIC;

-- idem_lookup and idem_claim_many gain the two columns too.  Their result
-- columns are OUT parameters, which only DROP and CREATE can change; the
-- EXECUTE grants that roles had on them are given back.
DO $update$
DECLARE
    signatures text[] := ARRAY[
        '@extschema@.idem_lookup(text, text)',
        '@extschema@.idem_claim_many(text, text[], text[], interval, interval)'];
    acls       text[] := '{}';
    g          record;
BEGIN
    FOR i IN 1 .. pg_catalog.array_length(signatures, 1) LOOP
        acls := acls OPERATOR(pg_catalog.||)
            (SELECT proacl::text FROM pg_catalog.pg_proc
              WHERE oid OPERATOR(pg_catalog.=) signatures[i]::pg_catalog.regprocedure);
    END LOOP;

    DROP FUNCTION @extschema@.idem_lookup(text, text);
    CREATE FUNCTION @extschema@.idem_lookup(
        tenant_id text,
        key       text,
        OUT status           text,
        OUT token            bigint,
        OUT response         jsonb,
        OUT fingerprint      text,
        OUT lease_expires_at timestamptz,
        OUT expires_at       timestamptz,
        OUT created_at       timestamptz,
        OUT updated_at       timestamptz,
        OUT recovery_point   text,
        OUT state            jsonb)
    RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'idem_lookup'
    LANGUAGE C STABLE PARALLEL UNSAFE ROWS 1;

    DROP FUNCTION @extschema@.idem_claim_many(text, text[], text[], interval, interval);
    CREATE FUNCTION @extschema@.idem_claim_many(
        tenant_id    text,
        keys         text[],
        fingerprints text[]   DEFAULT NULL,
        lease        interval DEFAULT NULL,
        ttl          interval DEFAULT NULL,
        OUT key            text,
        OUT outcome        text,
        OUT token          bigint,
        OUT response       jsonb,
        OUT expires_at     timestamptz,
        OUT recovery_point text,
        OUT state          jsonb)
    RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'idem_claim_many'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;

    FOR i IN 1 .. pg_catalog.array_length(signatures, 1) LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', signatures[i]);
        FOR g IN SELECT a.grantee, a.is_grantable
                   FROM pg_catalog.aclexplode(acls[i]::pg_catalog.aclitem[]) a
                  WHERE a.grantee OPERATOR(pg_catalog.<>) 0
        LOOP
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %I%s',
                signatures[i], pg_catalog.pg_get_userbyid(g.grantee),
                CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        END LOOP;
    END LOOP;
END
$update$;

-- ===========================================================================
-- Section 4: scale-out on Citus (issue 11)
-- ===========================================================================
-- Nothing here calls Citus: CREATE EXTENSION must work without it, and
-- Citus runs this script again on every worker.  The functions below look
-- Citus up when they are called, and refuse clearly where it is absent.
-- docs/scale-out.md is the user's guide.

-- Distributes idempotency_records by tenant_id, and every function that
-- takes a tenant and reaches the table, colocated with it and delegated to
-- the tenant's node even inside a transaction block (force_delegation).
-- Run once on the coordinator; a second call changes nothing.
CREATE FUNCTION @extschema@.idem_distribute(shard_count integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $distribute$
DECLARE
    records pg_catalog.regclass;
    to_default_collation text;
    fn pg_catalog.regprocedure;
    failed record;
BEGIN
    SELECT pg_catalog.format('%I.idempotency_records', n.nspname)::pg_catalog.regclass
      INTO records
      FROM pg_catalog.pg_extension e
      JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
     WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency';
    -- business tables keyed by a plain text tenant must colocate, and Citus
    -- colocates only equal collations; deterministic either way
    to_default_collation := pg_catalog.format(
        'ALTER TABLE %s ALTER COLUMN tenant_id TYPE pg_catalog.text COLLATE pg_catalog."default"',
        records);
    IF pg_catalog.to_regproc('pg_catalog.create_distributed_table') IS NULL THEN
        RAISE EXCEPTION 'idem_distribute() needs the citus extension in this database'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Run CREATE EXTENSION citus on every node, then call idem_distribute() on the coordinator.';
    END IF;
    IF shard_count OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION 'shard_count must be positive'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                    WHERE p.logicalrelid OPERATOR(pg_catalog.=) records) THEN
        -- Citus created the extension, and so the table, on every worker:
        -- each copy must have the collation the shards will have
        EXECUTE to_default_collation;
        FOR failed IN SELECT w.nodename, w.nodeport, w.result
                        FROM pg_catalog.run_command_on_workers(to_default_collation) w
                       WHERE NOT w.success
        LOOP
            RAISE EXCEPTION 'could not change idempotency_records on node %:%: %',
                failed.nodename, failed.nodeport, failed.result
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Install the idempotency extension on every node first.';
        END LOOP;
        PERFORM pg_catalog.create_distributed_table(records, 'tenant_id',
                                                    shard_count => shard_count);
        -- rows recorded before distribution were copied into the shards
        PERFORM pg_catalog.truncate_local_data_after_distributing_table(records);
    END IF;

    -- every function that takes a tenant first and reaches the table
    -- (idem_child_key only hashes its arguments)
    FOR fn IN SELECT p.oid
                FROM pg_catalog.pg_proc p
                JOIN pg_catalog.pg_depend d
                  ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
                 AND d.objid OPERATOR(pg_catalog.=) p.oid AND d.deptype OPERATOR(pg_catalog.=) 'e'
                JOIN pg_catalog.pg_extension e
                  ON e.oid OPERATOR(pg_catalog.=) d.refobjid
                 AND e.extname OPERATOR(pg_catalog.=) 'idempotency'
               WHERE p.proargnames[1] OPERATOR(pg_catalog.=) 'tenant_id'
                 AND p.proname OPERATOR(pg_catalog.<>) 'idem_child_key'
                 AND NOT EXISTS (
                     SELECT FROM pg_catalog.pg_dist_object o
                      WHERE o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
                        AND o.objid OPERATOR(pg_catalog.=) p.oid
                        AND o.distribution_argument_index OPERATOR(pg_catalog.=) 0
                        AND o.force_delegation)
               ORDER BY p.oid
    LOOP
        PERFORM pg_catalog.create_distributed_function(fn, '$1',
                                                       colocate_with => records::text,
                                                       force_delegation => true);
    END LOOP;
END
$distribute$;

-- idem_stats of this database on every node of the cluster, one row each.
CREATE FUNCTION @extschema@.idem_node_stats(
    OUT nodename           text,
    OUT nodeport           integer,
    OUT claims             bigint,
    OUT claimed            bigint,
    OUT replays            bigint,
    OUT in_progress        bigint,
    OUT mismatches         bigint,
    OUT failed_replays     bigint,
    OUT takeovers          bigint,
    OUT completes          bigint,
    OUT releases           bigint,
    OUT heartbeats         bigint,
    OUT swept_stale        bigint,
    OUT swept_expired      bigint,
    OUT last_sweep_at      timestamptz,
    OUT last_sweep_ms      double precision,
    OUT last_sweep_removed bigint,
    OUT last_sweep_error   text,
    OUT sweeps             bigint,
    OUT stats_reset        timestamptz)
RETURNS SETOF record
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $node_stats$
DECLARE
    node record;
    stats_query text;
BEGIN
    SELECT pg_catalog.format(
               'SELECT pg_catalog.row_to_json(s) FROM %I.idem_stats_read() s'
               ' WHERE s.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()',
               n.nspname)
      INTO stats_query
      FROM pg_catalog.pg_extension e
      JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
     WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency';
    IF pg_catalog.to_regproc('pg_catalog.run_command_on_all_nodes') IS NULL THEN
        RAISE EXCEPTION 'idem_node_stats() needs the citus extension in this database'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'On a single server, read the idem_stats view.';
    END IF;
    FOR node IN SELECT n.nodename, n.nodeport, r.success, r.result
                  FROM pg_catalog.run_command_on_all_nodes(stats_query) r
                  JOIN pg_catalog.pg_dist_node n ON n.nodeid OPERATOR(pg_catalog.=) r.nodeid
                 ORDER BY n.nodename, n.nodeport
    LOOP
        IF NOT node.success THEN
            RAISE EXCEPTION 'could not read the statistics of node %:%: %',
                node.nodename, node.nodeport, node.result
                USING ERRCODE = 'connection_failure';
        END IF;
        nodename := node.nodename;
        nodeport := node.nodeport;
        -- a node that has not counted anything yet has no row
        SELECT s.claims, s.claimed, s.replays, s.in_progress, s.mismatches,
               s.failed_replays, s.takeovers, s.completes, s.releases, s.heartbeats,
               s.swept_stale, s.swept_expired, s.last_sweep_at, s.last_sweep_ms,
               s.last_sweep_removed, s.last_sweep_error, s.sweeps, s.stats_reset
          INTO claims, claimed, replays, in_progress, mismatches,
               failed_replays, takeovers, completes, releases, heartbeats,
               swept_stale, swept_expired, last_sweep_at, last_sweep_ms,
               last_sweep_removed, last_sweep_error, sweeps, stats_reset
          FROM pg_catalog.json_to_record(NULLIF(node.result, '')::pg_catalog.json)
               AS s(claims bigint, claimed bigint, replays bigint, in_progress bigint,
                    mismatches bigint, failed_replays bigint, takeovers bigint,
                    completes bigint, releases bigint, heartbeats bigint,
                    swept_stale bigint, swept_expired bigint, last_sweep_at timestamptz,
                    last_sweep_ms double precision, last_sweep_removed bigint,
                    last_sweep_error text, sweeps bigint, stats_reset timestamptz);
        RETURN NEXT;
    END LOOP;
END
$node_stats$;

-- idem_stats summed over every node of the cluster: one row.
CREATE FUNCTION @extschema@.idem_cluster_stats(
    OUT nodes          integer,
    OUT claims         bigint,
    OUT claimed        bigint,
    OUT replays        bigint,
    OUT in_progress    bigint,
    OUT mismatches     bigint,
    OUT failed_replays bigint,
    OUT takeovers      bigint,
    OUT completes      bigint,
    OUT releases       bigint,
    OUT heartbeats     bigint,
    OUT swept_stale    bigint,
    OUT swept_expired  bigint,
    OUT sweeps         bigint,
    OUT last_sweep_at  timestamptz)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT pg_catalog.count(*)::integer,
           COALESCE(pg_catalog.sum(s.claims), 0)::bigint,
           COALESCE(pg_catalog.sum(s.claimed), 0)::bigint,
           COALESCE(pg_catalog.sum(s.replays), 0)::bigint,
           COALESCE(pg_catalog.sum(s.in_progress), 0)::bigint,
           COALESCE(pg_catalog.sum(s.mismatches), 0)::bigint,
           COALESCE(pg_catalog.sum(s.failed_replays), 0)::bigint,
           COALESCE(pg_catalog.sum(s.takeovers), 0)::bigint,
           COALESCE(pg_catalog.sum(s.completes), 0)::bigint,
           COALESCE(pg_catalog.sum(s.releases), 0)::bigint,
           COALESCE(pg_catalog.sum(s.heartbeats), 0)::bigint,
           COALESCE(pg_catalog.sum(s.swept_stale), 0)::bigint,
           COALESCE(pg_catalog.sum(s.swept_expired), 0)::bigint,
           COALESCE(pg_catalog.sum(s.sweeps), 0)::bigint,
           pg_catalog.max(s.last_sweep_at)
      FROM @extschema@.idem_node_stats() s;
END;

REVOKE ALL ON FUNCTION @extschema@.idem_distribute(integer),
                       @extschema@.idem_node_stats(),
                       @extschema@.idem_cluster_stats() FROM PUBLIC;
