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
