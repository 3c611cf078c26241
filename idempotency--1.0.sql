-- The records table: one row per (tenant_id, key).
--
-- Every operator and function below is schema-qualified: CREATE EXTENSION
-- runs this script with the target schema first in search_path, and a role
-- that can create objects there must not be able to capture an operator.

\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

CREATE TABLE @extschema@.idempotency_records (
    -- fixed-width columns first, so the row has no alignment padding
    token            bigint      NOT NULL,
    expires_at       timestamptz NOT NULL,
    lease_expires_at timestamptz,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    ttl              interval    NOT NULL,
    -- "C" collation: keys are opaque identifiers, compared byte by byte,
    -- which is both faster and deterministic (needed to distribute by tenant)
    tenant_id        text COLLATE "C" NOT NULL,
    key              text COLLATE "C" NOT NULL,
    status           text        NOT NULL,
    fingerprint      text,
    response         jsonb,
    CONSTRAINT idempotency_records_pkey PRIMARY KEY (tenant_id, key),
    CONSTRAINT idempotency_records_status_check
        CHECK (status OPERATOR(pg_catalog.=) ANY (ARRAY['processing', 'completed', 'failed']::pg_catalog.text[])),
    CONSTRAINT idempotency_records_token_check
        CHECK (token OPERATOR(pg_catalog.>) 0),
    -- a lease exists exactly while the record is being processed
    CONSTRAINT idempotency_records_lease_check
        CHECK ((status OPERATOR(pg_catalog.=) 'processing') OPERATOR(pg_catalog.=) (lease_expires_at IS NOT NULL))
);

COMMENT ON TABLE @extschema@.idempotency_records IS
    'idempotency keys per tenant; written by idem_claim/idem_complete/idem_release, cleaned by idem_sweep';
COMMENT ON COLUMN @extschema@.idempotency_records.expires_at IS
    'when the record stops counting: the lease end while processing, the retention end once completed or failed';
COMMENT ON COLUMN @extschema@.idempotency_records.ttl IS
    'retention applied when the record is completed or failed';

-- The sweeper walks this index in expiry order.  It is the only index
-- besides the primary key, and it holds no unique constraint.
CREATE INDEX idempotency_records_expires_at_idx
    ON @extschema@.idempotency_records (expires_at);

-- pg_dump must keep the records: losing them would re-execute replays.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idempotency_records', '');

REVOKE ALL ON TABLE @extschema@.idempotency_records FROM PUBLIC;
-- The claim protocol.  All functions run with the caller's rights (SECURITY
-- INVOKER): the caller needs privileges on idempotency_records, so row-level
-- security and GRANTs stay in force.  The C code reaches the table only
-- through schema-qualified SQL, so search_path cannot redirect it.

CREATE FUNCTION @extschema@.idem_claim(
    tenant_id   text,
    key         text,
    fingerprint text     DEFAULT NULL,
    lease       interval DEFAULT NULL,
    ttl         interval DEFAULT NULL,
    wait        interval DEFAULT NULL,
    OUT outcome    text,
    OUT token      bigint,
    OUT response   jsonb,
    OUT expires_at timestamptz)
RETURNS record
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
