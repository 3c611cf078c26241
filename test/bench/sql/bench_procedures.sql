-- Procedures for the sweep (9) and storage (10) scenarios, created in their
-- own databases next to the extension.

-- Scenario 9's baseline and scenario 10's cleanup of the plain table: a raw
-- batched DELETE of expired rows, one transaction per batch, walking the
-- expires_at index with a keyset cursor -- the same algorithm as the
-- extension's sweep, minus its row locks (FOR UPDATE SKIP LOCKED) and
-- status handling, i.e. the fastest batched DELETE one would hand-write.
CREATE PROCEDURE raw_batched_delete(tbl regclass, batch_size int)
LANGUAGE plpgsql
AS $$
DECLARE
    v_from timestamptz := '-infinity';
    v_last timestamptz;
    n      bigint;
BEGIN
    LOOP
        EXECUTE format(
            'WITH d AS (DELETE FROM %1$s WHERE ctid = ANY (ARRAY('
            ' SELECT ctid FROM %1$s WHERE expires_at <= $1 AND expires_at >= $2'
            ' ORDER BY expires_at LIMIT $3)) RETURNING expires_at)'
            ' SELECT count(*), max(expires_at) FROM d', tbl)
        INTO n, v_last USING clock_timestamp(), v_from, batch_size;
        COMMIT;
        EXIT WHEN n < batch_size;
        v_from := v_last;
    END LOOP;
END
$$;

-- Scenario 10: records written the way an application writes them, through
-- the API: a claim and a complete per key (36-byte keys).  The client calls
-- it once per 100 keys, each time in a transaction it opens with BEGIN and
-- ends with COMMIT, as an application's transactions are (a claim is held
-- until it settles only in such a transaction block, see
-- docs/held-claims.md).  A 1 ms retention makes the records expire at once
-- for the sweep.
CREATE PROCEDURE fill_via_api(p_tenant text, p_first bigint, p_n int, p_response jsonb)
LANGUAGE plpgsql
AS $$
DECLARE
    v_key   text;
    v_token bigint;
BEGIN
    FOR i IN p_first .. p_first + p_n - 1 LOOP
        v_key := md5(i::text)::uuid::text;
        SELECT c.token INTO v_token
          FROM idem_claim(p_tenant, v_key, ttl => interval '1 millisecond') c;
        PERFORM idem_complete(p_tenant, v_key, v_token, p_response);
    END LOOP;
END
$$;

-- Scenario 10: the same records in a plain table with the same columns,
-- written the way the lean hand-written SQL (1b) writes them: INSERT the
-- processing row, then UPDATE it to completed.
CREATE PROCEDURE fill_plain_two_writes(p_tbl regclass, p_tenant text, p_first bigint,
                                       p_n int, p_response jsonb)
LANGUAGE plpgsql
AS $$
DECLARE
    v_key text;
    v_ins text := format(
        'INSERT INTO %s (tenant_id, key, token, expires_at, lease_expires_at,'
        ' created_at, updated_at, ttl, status)'
        ' VALUES ($1, $2, 1, now() + interval ''5 min'', now() + interval ''5 min'','
        ' now(), now(), interval ''1 millisecond'', ''processing'')'
        ' ON CONFLICT DO NOTHING', p_tbl);
    v_upd text := format(
        'UPDATE %s SET status = ''completed'', response = $3, lease_expires_at = NULL,'
        ' expires_at = now() + ttl, updated_at = now()'
        ' WHERE tenant_id = $1 AND key = $2 AND token = 1', p_tbl);
BEGIN
    FOR i IN p_first .. p_first + p_n - 1 LOOP
        v_key := md5(i::text)::uuid::text;
        EXECUTE v_ins USING p_tenant, v_key;
        EXECUTE v_upd USING p_tenant, v_key, p_response;
        IF i % 100 = 0 THEN
            COMMIT;
        END IF;
    END LOOP;
END
$$;

-- Scenario 9 and 10: the same completed records inserted once, in their
-- final state (the least a table can hold for them).
CREATE PROCEDURE fill_final_rows(p_tbl regclass, p_tenant text, p_first bigint, p_n int,
                                 p_response jsonb, p_expires_from timestamptz,
                                 p_expires_to timestamptz)
LANGUAGE plpgsql
AS $$
BEGIN
    EXECUTE format(
        'INSERT INTO %s (tenant_id, key, token, expires_at, lease_expires_at,'
        ' created_at, updated_at, ttl, status, response)'
        ' SELECT $1, md5(g::text)::uuid::text, g,'
        '        $4 + ($5 - $4) * ((g - $2)::float8 / greatest($3, 1)),'
        '        NULL, now(), now(), interval ''1 day'', ''completed'', $6'
        '   FROM generate_series($2, $2 + $3 - 1) g', p_tbl)
    USING p_tenant, p_first, p_n, p_expires_from, p_expires_to, p_response;
END
$$;
