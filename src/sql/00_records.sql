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
