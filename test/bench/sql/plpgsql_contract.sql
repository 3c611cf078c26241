-- Scenario 5: the idempotency contract written in plain PL/pgSQL, kept in
-- the benchmark only, to show what the C implementation buys.
--
-- It follows the same decisions as src/claim.c and src/settle.c on its own
-- table plpg_records (same columns and indexes as idempotency_records):
-- read the key; replay / failed / mismatch / in_progress when a live record
-- exists; otherwise a non-blocking per-key advisory lock, then INSERT ... ON
-- CONFLICT DO NOTHING for a fresh key or a token-guarded UPDATE for an
-- expired one, looping if the row changed.  Completing is a token-fenced
-- UPDATE.  It checks its arguments like the C code does.  Left out, because
-- the benchmark never reaches them: wait > 0, stale_action = 'fail', and the
-- precise error for a refused complete (one generic error instead).

CREATE FUNCTION plpg_claim(
    tenant_id   text,
    key         text,
    fingerprint text     DEFAULT NULL,
    lease       interval DEFAULT NULL,
    ttl         interval DEFAULT NULL,
    OUT outcome    text,
    OUT token      bigint,
    OUT response   jsonb,
    OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now   timestamptz := clock_timestamp();
    v_lease interval := coalesce(lease, current_setting('idempotency.lease')::interval);
    v_ttl   interval := coalesce(ttl, current_setting('idempotency.ttl')::interval);
    r       plpg_records;
    v_found boolean;
BEGIN
    IF tenant_id IS NULL OR key IS NULL THEN
        RAISE EXCEPTION 'tenant_id and key must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF tenant_id = '' OR key = '' THEN
        RAISE EXCEPTION 'tenant_id and key must not be empty' USING ERRCODE = '22023';
    END IF;
    IF octet_length(tenant_id) > 255 OR octet_length(key) > 255
       OR octet_length(fingerprint) > 255 THEN
        RAISE EXCEPTION 'identifier longer than 255 bytes' USING ERRCODE = '22001';
    END IF;
    IF v_lease <= interval '0' OR v_ttl <= interval '0' THEN
        RAISE EXCEPTION 'lease and ttl must be positive' USING ERRCODE = '22023';
    END IF;

    FOR attempt IN 1..100 LOOP
        SELECT * INTO r FROM plpg_records p
         WHERE p.tenant_id = plpg_claim.tenant_id AND p.key = plpg_claim.key;
        v_found := FOUND;

        IF v_found AND r.expires_at > v_now THEN
            IF r.fingerprint IS NOT NULL AND plpg_claim.fingerprint IS NOT NULL
               AND r.fingerprint <> plpg_claim.fingerprint THEN
                outcome := 'mismatch';
            ELSIF r.status = 'completed' THEN
                outcome := 'replay'; response := r.response; expires_at := r.expires_at;
            ELSIF r.status = 'failed' THEN
                outcome := 'failed'; response := r.response; expires_at := r.expires_at;
            ELSE
                outcome := 'in_progress'; expires_at := r.lease_expires_at;
            END IF;
            RETURN;
        END IF;

        -- someone else mid-claim on this key: answer at once, never wait
        IF NOT pg_try_advisory_xact_lock(
                 hashtextextended(plpg_claim.tenant_id || E'\x1f' || plpg_claim.key, 0)) THEN
            outcome := 'in_progress';
            RETURN;
        END IF;

        IF NOT v_found THEN
            INSERT INTO plpg_records AS p
                   (tenant_id, key, token, expires_at, lease_expires_at,
                    created_at, updated_at, ttl, status, fingerprint)
            VALUES (plpg_claim.tenant_id, plpg_claim.key,
                    (extract(epoch FROM v_now) * 1000000)::bigint,
                    v_now + v_lease, v_now + v_lease, v_now, v_now, v_ttl,
                    'processing', plpg_claim.fingerprint)
            ON CONFLICT DO NOTHING
            RETURNING p.token, p.expires_at INTO token, expires_at;
        ELSE
            UPDATE plpg_records p
               SET status = 'processing', token = p.token + 1,
                   fingerprint = plpg_claim.fingerprint, response = NULL,
                   lease_expires_at = v_now + v_lease, expires_at = v_now + v_lease,
                   ttl = v_ttl, created_at = v_now, updated_at = v_now
             WHERE p.tenant_id = plpg_claim.tenant_id AND p.key = plpg_claim.key
               AND p.token = r.token AND p.expires_at <= v_now
            RETURNING p.token, p.expires_at INTO token, expires_at;
        END IF;
        IF FOUND THEN
            outcome := 'claimed';
            RETURN;
        END IF;
        v_now := clock_timestamp();
    END LOOP;
    RAISE EXCEPTION 'could not claim key because its record keeps changing'
        USING ERRCODE = '40001';
END
$$;

CREATE FUNCTION plpg_complete(
    tenant_id text,
    key       text,
    token     bigint,
    response  jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    IF tenant_id IS NULL OR key IS NULL OR token IS NULL THEN
        RAISE EXCEPTION 'tenant_id, key and token must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF pg_column_size(response) > pg_size_bytes(current_setting('idempotency.max_response_size')) THEN
        RAISE EXCEPTION 'response too large' USING ERRCODE = '54000';
    END IF;
    -- wait for a claim of this key in flight, as the C code does
    PERFORM pg_advisory_xact_lock(
        hashtextextended(plpg_complete.tenant_id || E'\x1f' || plpg_complete.key, 0));
    UPDATE plpg_records p
       SET status = 'completed', response = plpg_complete.response,
           lease_expires_at = NULL, expires_at = v_now + p.ttl, updated_at = v_now
     WHERE p.tenant_id = plpg_complete.tenant_id AND p.key = plpg_complete.key
       AND p.token = plpg_complete.token AND p.status = 'processing';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'cannot complete: no processing record with this token'
            USING ERRCODE = 'ID002';
    END IF;
END
$$;
