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
