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

-- ===========================================================================
-- Section 2: scale-out you can operate (docs/scale-out.md)
-- ===========================================================================
-- Nothing here calls Citus while the script runs: CREATE EXTENSION must work
-- without it, and ALTER EXTENSION ... UPDATE runs this script again on every
-- worker.  What depends on Citus is looked up when it is called.

-- 2a. Tenant isolation on a distributed table.  A call runs on the node
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
-- distributed gets the distributed policy.
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
    -- the way a distributed call can (2a above)
    UPDATE @extschema@.idem_tenant_isolation SET setting = setting
     WHERE NOT EXISTS (
           SELECT FROM pg_catalog.pg_policy p
            WHERE p.polrelid OPERATOR(pg_catalog.=) records
              AND p.polname OPERATOR(pg_catalog.=) 'idem_tenant_isolation'
              AND pg_catalog.strpos(pg_catalog.pg_get_expr(p.polqual, p.polrelid),
                                    'idem_current_tenant') OPERATOR(pg_catalog.>) 0);
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
