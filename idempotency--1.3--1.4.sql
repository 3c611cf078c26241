-- idempotency 1.3 -> 1.4.
--
-- CREATE EXTENSION runs idempotency--1.0.sql and the update scripts up to
-- this one, so a fresh install and an upgraded one execute the same
-- statements.  The conventions of idempotency--1.0--1.1.sql hold here too
-- (everything qualified with @extschema@. or pg_catalog., no CREATE OR
-- REPLACE of what a user could have made, REVOKE ALL ... FROM PUBLIC on
-- every new object, short locks only: it runs while applications claim
-- keys).  One section per change, each with its header.

\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.4'" to load this file. \quit

-- ===========================================================================
-- Section 1: re-entrant claims (issue 47, docs/reference.md#idem_claim)
-- ===========================================================================
-- idem_claim(..., holder => text): a claim made with a holder (an execution
-- ARN, a workflow run id) answers claimed again, with the same token and
-- lease end, to a later claim with the same holder while its lease is live;
-- every other caller gets in_progress as before.  The holder is stored in
-- the record (a takeover replaces it) and shown by idem_lookup.
--
-- The 1.4 library works with the 1.3 objects until this script has run: it
-- reads the holder column only where the table has it, and the six-argument
-- idem_claim of 1.3 passes no holder.
--
-- Citus: a function re-created with DROP and CREATE loses its distribution,
-- and the new column must reach every shard.  As in 1.1 -> 1.2, the
-- coordinator of a distributed table first updates the workers itself (each
-- in its own transaction; Citus's own ALTER EXTENSION then finds them
-- updated), adds the column through Citus (an EXECUTEd ALTER TABLE, which
-- Citus sends to every shard and to the workers' copy of the table, so a
-- worker adds nothing itself), and distributes the re-created functions
-- again at the end.
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

-- Only from 1.3, on a distributed cluster: in an update from 1.1 the 1.1 ->
-- 1.2 script has already distributed functions again and re-created the
-- isolation policy through this transaction's own connections to the
-- workers, whose locks the workers' update below would wait for while this
-- transaction waits for it (a deadlock no one detects).  The workers' version
-- tells: 1.3 (or 1.4, after an update that failed on the coordinator) for an
-- update that starts at 1.3.
DO $update$
DECLARE
    failed record;
BEGIN
    IF NOT @extschema@.idem_update_is_distributed_coordinator() THEN
        RETURN;
    END IF;
    FOR failed IN SELECT w.nodename, w.nodeport, w.result
                    FROM pg_catalog.run_command_on_workers(
                         'SELECT extversion FROM pg_catalog.pg_extension'
                         ' WHERE extname OPERATOR(pg_catalog.=) ''idempotency''') w
                   WHERE NOT w.success
                      OR w.result OPERATOR(pg_catalog.<>) ALL (ARRAY['1.3', '1.4'])
    LOOP
        RAISE EXCEPTION 'cannot update the distributed idempotency extension to 1.4 from before 1.3 in one step'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = pg_catalog.format('Node %s:%s runs version %s.', failed.nodename,
                                             failed.nodeport, failed.result),
                  HINT = 'Run ALTER EXTENSION idempotency UPDATE TO ''1.3'', then ALTER EXTENSION idempotency UPDATE.';
    END LOOP;
    FOR failed IN SELECT w.nodename, w.nodeport, w.result
                    FROM pg_catalog.run_command_on_workers(
                         'SET citus.enable_ddl_propagation TO off; '
                         'ALTER EXTENSION idempotency UPDATE TO ''1.4''') w
                   WHERE NOT w.success
    LOOP
        RAISE EXCEPTION 'could not update the idempotency extension on node %:%: %',
            failed.nodename, failed.nodeport, failed.result
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Install the files of idempotency 1.4 on every node first.';
    END LOOP;
    -- run_command_on_workers reports the first command's result (the SET):
    -- the update is checked by the version it left
    FOR failed IN SELECT w.nodename, w.nodeport, w.result
                    FROM pg_catalog.run_command_on_workers(
                         'SELECT extversion FROM pg_catalog.pg_extension'
                         ' WHERE extname OPERATOR(pg_catalog.=) ''idempotency''') w
                   WHERE NOT w.success OR w.result OPERATOR(pg_catalog.<>) '1.4'
    LOOP
        RAISE EXCEPTION 'could not update the idempotency extension on node %:%', failed.nodename,
            failed.nodeport
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = pg_catalog.format('The node runs version %s; its server log has the error.',
                                             failed.result),
                  HINT = 'Install the files of idempotency 1.4 on every node first.';
    END LOOP;
END
$update$;

-- The column, appended: nullable without a default, so nothing is
-- rewritten.  COLLATE "C": holders are compared byte for byte, as tenant_id
-- and key are.  Not on a worker of a distributed table: the coordinator's
-- ALTER TABLE reaches it (above).  No comment on the column: a worker could
-- not make it (the column comes later, from the coordinator), and Citus
-- need not send it on, so a distributed cluster would differ from a fresh
-- install (docs/reference.md describes the column).
DO $update$
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        IF EXISTS (SELECT FROM pg_catalog.pg_dist_partition d
                    WHERE d.logicalrelid OPERATOR(pg_catalog.=)
                          '@extschema@.idempotency_records'::pg_catalog.regclass)
           AND (SELECT l.groupid FROM pg_catalog.pg_dist_local_group l)
               OPERATOR(pg_catalog.<>) 0 THEN
            RETURN;
        END IF;
    END IF;
    EXECUTE 'ALTER TABLE @extschema@.idempotency_records'
            ' ADD COLUMN holder text COLLATE pg_catalog."C"';
END
$update$;

-- idem_claim gains the holder argument and idem_lookup the holder column:
-- only DROP and CREATE can change them.  The EXECUTE grants that roles had
-- on them are given back.
DO $update$
DECLARE
    old_signatures text[] := ARRAY[
        '@extschema@.idem_claim(text, text, text, interval, interval, interval)',
        '@extschema@.idem_lookup(text, text)'];
    new_signatures text[] := ARRAY[
        '@extschema@.idem_claim(text, text, text, interval, interval, interval, text)',
        '@extschema@.idem_lookup(text, text)'];
    acls       text[] := '{}';
    g          record;
BEGIN
    FOR i IN 1 .. pg_catalog.array_length(old_signatures, 1) LOOP
        acls := acls OPERATOR(pg_catalog.||)
            (SELECT proacl::text FROM pg_catalog.pg_proc
              WHERE oid OPERATOR(pg_catalog.=) old_signatures[i]::pg_catalog.regprocedure);
    END LOOP;

    DROP FUNCTION @extschema@.idem_claim(text, text, text, interval, interval, interval);
    CREATE FUNCTION @extschema@.idem_claim(
        tenant_id   text,
        key         text,
        fingerprint text     DEFAULT NULL,
        lease       interval DEFAULT NULL,
        ttl         interval DEFAULT NULL,
        wait        interval DEFAULT NULL,
        holder      text     DEFAULT NULL)
    RETURNS @extschema@.idem_claim_result
    AS 'MODULE_PATHNAME', 'idem_claim'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;

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
        OUT state            jsonb,
        OUT holder           text)
    RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'idem_lookup'
    LANGUAGE C STABLE PARALLEL UNSAFE ROWS 1;

    FOR i IN 1 .. pg_catalog.array_length(new_signatures, 1) LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', new_signatures[i]);
        FOR g IN SELECT a.grantee, a.is_grantable
                   FROM pg_catalog.aclexplode(acls[i]::pg_catalog.aclitem[]) a
                  WHERE a.grantee OPERATOR(pg_catalog.<>) 0
        LOOP
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %I%s',
                new_signatures[i], pg_catalog.pg_get_userbyid(g.grantee),
                CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        END LOOP;
    END LOOP;
END
$update$;

-- Citus, the end: distribute again what this update re-created.  Keep last.
DO $update$
BEGIN
    IF @extschema@.idem_update_is_distributed_coordinator() THEN
        PERFORM @extschema@.idem_distribute();
    END IF;
END
$update$;
DROP FUNCTION @extschema@.idem_update_is_distributed_coordinator();
