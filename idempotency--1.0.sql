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
    CONSTRAINT idempotency_records_pkey PRIMARY KEY (tenant_id, key)
    -- No CHECK constraints: PostgreSQL parses a table's CHECK expressions
    -- again for every execution of a prepared INSERT or UPDATE, which cost a
    -- quarter of a claim's CPU.  The functions are the writers and keep the
    -- invariants (status is processing|completed|failed, token > 0, a lease
    -- exactly while processing); sql/01_install.sql checks what they write.
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
-- Batch claims for message consumers: one statement for a whole batch.

CREATE FUNCTION @extschema@.idem_claim_many(
    tenant_id    text,
    keys         text[],
    fingerprints text[]   DEFAULT NULL,
    lease        interval DEFAULT NULL,
    ttl          interval DEFAULT NULL,
    OUT key        text,
    OUT outcome    text,
    OUT token      bigint,
    OUT response   jsonb,
    OUT expires_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_claim_many'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

REVOKE ALL ON FUNCTION
    @extschema@.idem_claim_many(text, text[], text[], interval, interval)
FROM PUBLIC;
-- Live statistics from shared memory (needs shared_preload_libraries).

CREATE FUNCTION @extschema@.idem_stats_read(
    OUT datid              oid,
    OUT datname            text,
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
AS 'MODULE_PATHNAME', 'idem_stats_read'
LANGUAGE C VOLATILE PARALLEL SAFE;

CREATE FUNCTION @extschema@.idem_stats_reset()
RETURNS void
AS 'MODULE_PATHNAME', 'idem_stats_reset'
LANGUAGE C VOLATILE PARALLEL SAFE;

-- One row per database since the server started (or the last reset).
CREATE VIEW @extschema@.idem_stats AS
    SELECT * FROM @extschema@.idem_stats_read();

REVOKE ALL ON FUNCTION @extschema@.idem_stats_read(), @extschema@.idem_stats_reset() FROM PUBLIC;
REVOKE ALL ON @extschema@.idem_stats FROM PUBLIC;
