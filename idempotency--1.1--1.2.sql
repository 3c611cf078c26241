-- idempotency 1.1 -> 1.2.
--
-- CREATE EXTENSION runs idempotency--1.0.sql, idempotency--1.0--1.1.sql and
-- this script, so a fresh install and an upgraded one execute the same
-- statements.  The conventions of idempotency--1.0--1.1.sql hold here too
-- (everything qualified with @extschema@. or pg_catalog., no CREATE OR
-- REPLACE of what a user could have made, REVOKE ALL ... FROM PUBLIC on
-- every new object, short locks only: it runs while applications claim
-- keys).  One section per change, each with its header.

\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.2'" to load this file. \quit

-- ===========================================================================
-- Section 1: recovery points that outlive the sweeper (docs/multistep.md)
-- ===========================================================================
-- A processing record with a recovery point whose lease ended waits for the
-- next delivery to resume it: the library keeps it until its retention
-- (the claim's ttl) after the lease ends, and judges a claim's liveness by
-- lease_expires_at.  Only the meaning of expires_at changes for such a
-- record; the table keeps its columns.
COMMENT ON COLUMN @extschema@.idempotency_records.expires_at IS
    'when the record stops counting: the lease end while processing (with a recovery point, the end of the retention after the lease), the retention end once completed or failed';

-- Records checkpointed under 1.1 expire at their lease end; give them the
-- retention the 1.2 library gives (only rows still in the 1.1 form, so a
-- live claim the new library already wrote is left alone).
UPDATE @extschema@.idempotency_records
   SET expires_at = pg_catalog.timezone('UTC',
           pg_catalog.timezone('UTC', lease_expires_at) OPERATOR(pg_catalog.+) ttl)
 WHERE status OPERATOR(pg_catalog.=) 'processing'
   AND recovery_point IS NOT NULL
   AND lease_expires_at IS NOT NULL
   AND expires_at OPERATOR(pg_catalog.=) lease_expires_at;

-- idem_checkpoint can extend the lease in the same call.  Adding an
-- argument takes DROP and CREATE (an overload with a default would make
-- every five-argument call ambiguous); the EXECUTE grants roles had on it
-- are given back.
DO $update$
DECLARE
    acl  text;
    g    record;
BEGIN
    SELECT proacl::text INTO acl FROM pg_catalog.pg_proc
     WHERE oid OPERATOR(pg_catalog.=)
           '@extschema@.idem_checkpoint(text, text, bigint, text, jsonb)'::pg_catalog.regprocedure;

    DROP FUNCTION @extschema@.idem_checkpoint(text, text, bigint, text, jsonb);
    CREATE FUNCTION @extschema@.idem_checkpoint(
        tenant_id text,
        key       text,
        token     bigint,
        point     text,
        state     jsonb    DEFAULT NULL,
        lease     interval DEFAULT NULL)
    RETURNS void
    AS 'MODULE_PATHNAME', 'idem_checkpoint'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;

    REVOKE ALL ON FUNCTION @extschema@.idem_checkpoint(text, text, bigint, text, jsonb, interval)
        FROM PUBLIC;
    FOR g IN SELECT a.grantee, a.is_grantable
               FROM pg_catalog.aclexplode(acl::pg_catalog.aclitem[]) a
              WHERE a.grantee OPERATOR(pg_catalog.<>) 0
    LOOP
        EXECUTE pg_catalog.format(
            'GRANT EXECUTE ON FUNCTION @extschema@.idem_checkpoint(text, text, bigint, text, jsonb, interval) TO %I%s',
            pg_catalog.pg_get_userbyid(g.grantee),
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$update$;

-- How many records are in each state, for an operator: in particular how
-- many operations wait for a redelivery to resume them ("resumable") and
-- since when.  One pass over the table, as the caller sees it (row-level
-- security applies); through the coordinator on a distributed table.
CREATE FUNCTION @extschema@.idem_record_states(
    OUT state             text,
    OUT records           bigint,
    OUT oldest_updated_at timestamptz,
    OUT next_expires_at   timestamptz)
RETURNS SETOF record
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $states$
DECLARE
    records_table text;
BEGIN
    -- the table is found through the extension, as the C code finds it: the
    -- body names no schema and depends on no column
    SELECT pg_catalog.format('%I.idempotency_records', n.nspname)
      INTO records_table
      FROM pg_catalog.pg_extension e
      JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
     WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency';
    RETURN QUERY EXECUTE pg_catalog.format(
        'SELECT s.state, pg_catalog.count(*), pg_catalog.min(s.updated_at),'
        '       pg_catalog.min(s.expires_at)'
        '  FROM (SELECT CASE WHEN r.status OPERATOR(pg_catalog.=) ''processing'''
        '                     AND r.recovery_point IS NOT NULL'
        '                     AND COALESCE(r.lease_expires_at, r.expires_at)'
        '                         OPERATOR(pg_catalog.<=) pg_catalog.now()'
        '                    THEN ''resumable'' ELSE r.status END AS state,'
        '               r.updated_at, r.expires_at'
        '          FROM %s r) s'
        ' GROUP BY s.state'
        ' ORDER BY s.state', records_table);
END
$states$;

REVOKE ALL ON FUNCTION @extschema@.idem_record_states() FROM PUBLIC;

-- ===========================================================================
-- Section 2: scale-out you can operate (docs/scale-out.md)
-- ===========================================================================
-- Nothing here calls Citus on a single server or a worker: CREATE EXTENSION
-- must work without it, and ALTER EXTENSION ... UPDATE runs this script
-- again on every worker.  On the coordinator of a distributed table, 2a
-- updates the workers first and distributes the functions again at the end.

-- 2a. Keep the distribution through this update.  A function that an
-- update re-creates with DROP and CREATE (a changed signature or result)
-- loses its Citus distribution: calls of it would no longer be delegated.
-- On the coordinator of a distributed table, idem_distribute() at the end
-- of this script distributes every tenant function that is not, as after
-- CREATE EXTENSION.  Citus distributes a function, and applies a policy
-- that calls idem_current_tenant() (2b), only where it exists on every
-- worker, and sends this ALTER EXTENSION to the workers only after the
-- coordinator has run this script; so the coordinator first updates the
-- workers itself, here (each in its own transaction; Citus's own ALTER
-- EXTENSION then finds them updated and does nothing).  If the update fails
-- on the coordinator after that, the workers stay at 1.2: running ALTER
-- EXTENSION idempotency UPDATE again finishes it.
CREATE FUNCTION @extschema@.idem_update_is_distributed_coordinator()
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
        RETURN false;
    END IF;
    -- the table found through the extension: the body names no schema
    RETURN EXISTS (SELECT FROM pg_catalog.pg_dist_partition d
                     JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) d.logicalrelid
                     JOIN pg_catalog.pg_extension e
                       ON e.extnamespace OPERATOR(pg_catalog.=) c.relnamespace
                    WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency'
                      AND c.relname OPERATOR(pg_catalog.=) 'idempotency_records')
       AND (SELECT l.groupid FROM pg_catalog.pg_dist_local_group l) OPERATOR(pg_catalog.=) 0;
END
$fn$;
REVOKE ALL ON FUNCTION @extschema@.idem_update_is_distributed_coordinator() FROM PUBLIC;

DO $update$
DECLARE
    failed record;
BEGIN
    IF NOT @extschema@.idem_update_is_distributed_coordinator() THEN
        RETURN;
    END IF;
    FOR failed IN SELECT w.nodename, w.nodeport, w.result
                    FROM pg_catalog.run_command_on_workers(
                         'SET citus.enable_ddl_propagation TO off; '
                         'ALTER EXTENSION idempotency UPDATE TO ''1.2''') w
                   WHERE NOT w.success
    LOOP
        RAISE EXCEPTION 'could not update the idempotency extension on node %:%: %',
            failed.nodename, failed.nodeport, failed.result
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Install the files of idempotency 1.2 on every node first.';
    END LOOP;
END
$update$;

-- 2b. Tenant isolation on a distributed table.  A call runs on the node
-- that holds the tenant's shard, in a session Citus opened there, which a
-- plain SET of the client's session never reaches: current_setting() answers
-- NULL there, the tenant's own claim fails on the policy and its reads come
-- back empty.  On a distributed table the policy therefore reads the tenant
-- through idem_current_tenant(), which refuses an unset setting with an
-- error naming the ways that do reach the node (src/citus.c).  PUBLIC may
-- execute it, unlike every other function of the extension: a policy runs
-- with the rights of the role it confines, and the function only tells that
-- role the value of its own setting.
CREATE FUNCTION @extschema@.idem_current_tenant(setting text)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_current_tenant'
LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION @extschema@.idem_current_tenant(text) IS
    'the tenant of this session for the isolation policy of a distributed idempotency_records; an error when the setting is not set';

-- As in 1.1, plus: the policy of a table Citus distributes reads the tenant
-- through idem_current_tenant().
CREATE OR REPLACE FUNCTION @extschema@.idem_apply_tenant_isolation()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    tbl text := pg_catalog.format('%I.idempotency_records', TG_TABLE_SCHEMA);
    distributed boolean := false;
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
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition'
                ' WHERE logicalrelid OPERATOR(pg_catalog.=) $1)'
            INTO distributed USING tbl::pg_catalog.regclass;
    END IF;
    EXECUTE pg_catalog.format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', tbl);
    IF EXISTS (SELECT FROM pg_catalog.pg_policy p
               WHERE p.polrelid OPERATOR(pg_catalog.=) tbl::pg_catalog.regclass
                 AND p.polname OPERATOR(pg_catalog.=) 'idem_tenant_isolation') THEN
        EXECUTE pg_catalog.format('DROP POLICY idem_tenant_isolation ON %s', tbl);
    END IF;
    IF distributed THEN
        EXECUTE pg_catalog.format(
            'CREATE POLICY idem_tenant_isolation ON %s '
            'USING (tenant_id OPERATOR(pg_catalog.=) %I.idem_current_tenant(%L))',
            tbl, TG_TABLE_SCHEMA, NEW.setting);
    ELSE
        EXECUTE pg_catalog.format(
            'CREATE POLICY idem_tenant_isolation ON %s '
            'USING (tenant_id OPERATOR(pg_catalog.=) pg_catalog.current_setting(%L, true))',
            tbl, NEW.setting);
    END IF;
    RETURN NEW;
END
$fn$;

-- As in 1.1, plus: tenant isolation switched on before the table was
-- distributed (or restored from a dump with it) does not stop it, and gets
-- the distributed policy.
CREATE OR REPLACE FUNCTION @extschema@.idem_distribute(shard_count integer DEFAULT NULL)
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
        -- PostgreSQL refuses to retype tenant_id under the isolation policy
        -- that names it (switched on before distributing, or restored from a
        -- dump); it is re-created the distributed way below
        IF EXISTS (SELECT FROM pg_catalog.pg_policy p
                    WHERE p.polrelid OPERATOR(pg_catalog.=) records
                      AND p.polname OPERATOR(pg_catalog.=) 'idem_tenant_isolation') THEN
            EXECUTE pg_catalog.format('DROP POLICY idem_tenant_isolation ON %s', records);
        END IF;
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

    -- tenant isolation switched on before: its policy now reads the tenant
    -- the way a distributed call can (2b above)
    EXECUTE pg_catalog.format(
        'UPDATE %I.idem_tenant_isolation SET setting = setting'
        ' WHERE NOT EXISTS ('
        '  SELECT FROM pg_catalog.pg_policy p'
        '   WHERE p.polrelid OPERATOR(pg_catalog.=) $1'
        '     AND p.polname OPERATOR(pg_catalog.=) ''idem_tenant_isolation'''
        '     AND pg_catalog.strpos(pg_catalog.pg_get_expr(p.polqual, p.polrelid),'
        '                           ''idem_current_tenant'') OPERATOR(pg_catalog.>) 0)',
        (SELECT n.nspname FROM pg_catalog.pg_class c
           JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
          WHERE c.oid OPERATOR(pg_catalog.=) records))
        USING records;
END
$distribute$;

-- An update of a cluster already distributed with tenant isolation on: the
-- policy, re-created by the coordinator, which holds the isolation row
-- (workers run this script with nothing to do here).  Citus propagates the
-- policy statements to the shards; they run in EXECUTE, so Citus sends each
-- as one command, not this script.
DO $update$
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'UPDATE @extschema@.idem_tenant_isolation SET setting = setting'
                ' WHERE EXISTS (SELECT FROM pg_catalog.pg_dist_partition d'
                '  WHERE d.logicalrelid OPERATOR(pg_catalog.=)'
                '        ''@extschema@.idempotency_records''::pg_catalog.regclass)';
    END IF;
END
$update$;

-- 2c. A node down.  idem_node_stats() and idem_cluster_stats() raised 08006
-- for the whole cluster while any node was unreachable; they now answer for
-- the nodes that are up and name the others: new result columns, which only
-- DROP and CREATE can add (idem_cluster_stats() reads idem_node_stats(), so
-- it goes first).  The EXECUTE grants roles had are given back.
DO $update$
DECLARE
    signatures text[] := ARRAY[
        '@extschema@.idem_node_stats()',
        '@extschema@.idem_cluster_stats()'];
    acls       text[] := '{}';
    g          record;
BEGIN
    FOR i IN 1 .. pg_catalog.array_length(signatures, 1) LOOP
        acls := acls OPERATOR(pg_catalog.||)
            (SELECT proacl::text FROM pg_catalog.pg_proc
              WHERE oid OPERATOR(pg_catalog.=) signatures[i]::pg_catalog.regprocedure);
    END LOOP;

    DROP FUNCTION @extschema@.idem_cluster_stats();
    DROP FUNCTION @extschema@.idem_node_stats();

    -- idem_stats of this database on every node of the cluster, one row each;
    -- a node that cannot be reached has its row too, with reachable false, the
    -- connection error and no counters.
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
        OUT stats_reset        timestamptz,
        OUT reachable          boolean,
        OUT error              text)
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
            nodename := node.nodename;
            nodeport := node.nodeport;
            reachable := node.success;
            error := CASE WHEN NOT node.success THEN node.result END;
            -- a node that has not counted anything yet has no row
            SELECT s.claims, s.claimed, s.replays, s.in_progress, s.mismatches,
                   s.failed_replays, s.takeovers, s.completes, s.releases, s.heartbeats,
                   s.swept_stale, s.swept_expired, s.last_sweep_at, s.last_sweep_ms,
                   s.last_sweep_removed, s.last_sweep_error, s.sweeps, s.stats_reset
              INTO claims, claimed, replays, in_progress, mismatches,
                   failed_replays, takeovers, completes, releases, heartbeats,
                   swept_stale, swept_expired, last_sweep_at, last_sweep_ms,
                   last_sweep_removed, last_sweep_error, sweeps, stats_reset
              FROM pg_catalog.json_to_record(CASE WHEN node.success THEN NULLIF(node.result, '') END::pg_catalog.json)
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

    -- idem_stats summed over the nodes that answered: one row, with the nodes
    -- that did not.
    -- in EXECUTE: PL/pgSQL would end the statement at the first semicolon
    -- of the SQL-standard body
    EXECUTE $create$
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
        OUT last_sweep_at  timestamptz,
        OUT unreachable_nodes text[])
    LANGUAGE sql
    SET search_path = pg_catalog, pg_temp
    BEGIN ATOMIC
        SELECT pg_catalog.count(*) FILTER (WHERE s.reachable)::integer,
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
               pg_catalog.max(s.last_sweep_at),
               COALESCE(pg_catalog.array_agg(pg_catalog.concat(s.nodename, ':', s.nodeport)
                                             ORDER BY s.nodename, s.nodeport)
                            FILTER (WHERE NOT s.reachable), '{}')
          FROM @extschema@.idem_node_stats() s;
    END
    $create$;

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

-- 2a, the end: distribute again what this update re-created.  Keep last.
DO $update$
BEGIN
    IF @extschema@.idem_update_is_distributed_coordinator() THEN
        PERFORM @extschema@.idem_distribute();
    END IF;
END
$update$;
DROP FUNCTION @extschema@.idem_update_is_distributed_coordinator();
