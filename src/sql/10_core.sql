-- The claim protocol.  All functions run with the caller's rights (SECURITY
-- INVOKER): the caller needs privileges on idempotency_records, so row-level
-- security and GRANTs stay in force.  The C code reaches the table only
-- through schema-qualified SQL, so search_path cannot redirect it.

-- The result row is a named type rather than OUT parameters: PostgreSQL
-- finds a named type's descriptor in its type cache, while OUT parameters
-- are decoded from pg_proc again for every execution of a query that calls
-- the function in FROM.
CREATE TYPE @extschema@.idem_claim_result AS (
    outcome    text,
    token      bigint,
    response   jsonb,
    expires_at timestamptz);

CREATE FUNCTION @extschema@.idem_claim(
    tenant_id   text,
    key         text,
    fingerprint text     DEFAULT NULL,
    lease       interval DEFAULT NULL,
    ttl         interval DEFAULT NULL,
    wait        interval DEFAULT NULL)
RETURNS @extschema@.idem_claim_result
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_complete(
    tenant_id text,
    key       text,
    token     bigint,
    response  jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_complete'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_release(
    tenant_id text,
    key       text,
    token     bigint,
    failure   jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_release'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_heartbeat(
    tenant_id text,
    key       text,
    token     bigint,
    lease     interval DEFAULT NULL)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'idem_heartbeat'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

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
    OUT updated_at       timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_lookup'
LANGUAGE C STABLE PARALLEL UNSAFE ROWS 1;

CREATE FUNCTION @extschema@.idem_forget(
    tenant_id text,
    key       text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_forget'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_sweep(
    batch_size integer DEFAULT NULL,
    OUT expired_removed bigint,
    OUT stale_released  bigint,
    OUT stale_failed    bigint)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_sweep'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- Nothing is executable by PUBLIC; the README lists the grants an
-- application role needs.
REVOKE ALL ON FUNCTION
    @extschema@.idem_claim(text, text, text, interval, interval, interval),
    @extschema@.idem_complete(text, text, bigint, jsonb),
    @extschema@.idem_release(text, text, bigint, jsonb),
    @extschema@.idem_heartbeat(text, text, bigint, interval),
    @extschema@.idem_lookup(text, text),
    @extschema@.idem_forget(text, text),
    @extschema@.idem_sweep(integer)
FROM PUBLIC;
