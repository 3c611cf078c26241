-- Bad input: a clear error with a documented SQLSTATE, and nothing written.
-- try() reports the SQLSTATE and message of a statement, and whether the
-- table changed.
CREATE FUNCTION pg_temp.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    before text;
    after  text;
BEGIN
    SELECT md5(coalesce(string_agg(r::text, ',' ORDER BY tenant_id, key), '')) INTO before
    FROM idempotency_records r;
    BEGIN
        EXECUTE stmt;
        RETURN 'ok';
    EXCEPTION WHEN OTHERS THEN
        SELECT md5(coalesce(string_agg(r::text, ',' ORDER BY tenant_id, key), '')) INTO after
        FROM idempotency_records r;
        RETURN SQLSTATE || ': ' || SQLERRM ||
               CASE WHEN before IS DISTINCT FROM after THEN ' [TABLE CHANGED]' ELSE '' END;
    END;
END $$;

SELECT token AS t FROM idem_claim('bad', 'held') \gset

-- tenant_id and key: required, non-empty, at most 255 bytes
SELECT pg_temp.try($$SELECT idem_claim(NULL, 'k')$$);
SELECT pg_temp.try($$SELECT idem_claim('bi', NULL)$$);
SELECT pg_temp.try($$SELECT idem_claim('', 'k')$$);
SELECT pg_temp.try($$SELECT idem_claim('bi', '')$$);
SELECT pg_temp.try($$SELECT idem_claim('bi', repeat('k', 255))$$);
SELECT pg_temp.try($$SELECT idem_claim('bi', repeat('k', 256))$$);
SELECT pg_temp.try($$SELECT idem_claim(repeat('t', 256), 'k')$$);
SELECT pg_temp.try($$SELECT idem_claim('bi', repeat('é', 128))$$);  -- 256 bytes in UTF-8
SELECT pg_temp.try($$SELECT idem_claim('bi', repeat('x', 1024 * 1024))$$);
SELECT pg_temp.try($$SELECT idem_claim('bi', 'k', fingerprint => repeat('f', 256))$$);
SELECT pg_temp.try($$SELECT idem_claim('bi', 'k', fingerprint => '')$$);

-- durations: positive lease and ttl, non-negative wait, within range
SELECT pg_temp.try($$SELECT idem_claim('bi', 'k', lease => '0')$$);
SELECT pg_temp.try($$SELECT idem_claim('bi', 'k', lease => '-1 s')$$);
SELECT pg_temp.try($$SELECT idem_claim('bi', 'k', ttl => '0')$$);
SELECT pg_temp.try($$SELECT idem_claim('bi', 'k', ttl => '-1 day')$$);
SELECT pg_temp.try($$SELECT idem_claim('bi', 'k', wait => '-1 ms')$$);
SELECT pg_temp.try($$SELECT idem_claim('bi', 'k', lease => '1 mon -31 days')$$);
SELECT pg_temp.try($$SELECT idem_claim('bi', 'k', ttl => '178000000 years')$$);
SELECT pg_temp.try($$SELECT idem_claim('bi', 'k', lease => '300000 years')$$);
SELECT pg_temp.try($$SELECT idem_heartbeat('bad', 'held', $$ || :t || $$, lease => '0')$$);

-- tokens: required and positive; unknown key, wrong token, already settled
SELECT pg_temp.try($$SELECT idem_complete('bad', 'held', NULL)$$);
SELECT pg_temp.try($$SELECT idem_complete('bad', 'held', 0)$$);
SELECT pg_temp.try($$SELECT idem_complete('bad', 'held', -5)$$);
SELECT pg_temp.try($$SELECT idem_complete('bad', 'unknown', 1)$$);
SELECT pg_temp.try($$SELECT idem_complete('bad', 'held', 9223372036854775807)$$);
SELECT pg_temp.try($$SELECT idem_release('bad', 'held', 12345)$$);
SELECT pg_temp.try($$SELECT idem_heartbeat('bad', 'held', 12345)$$);
SELECT pg_temp.try($$SELECT idem_release('bad', 'unknown', 1)$$);
SELECT pg_temp.try($$SELECT idem_heartbeat('bad', 'unknown', 1)$$);
SELECT pg_temp.try($$SELECT idem_complete(NULL, 'held', 1)$$);
SELECT pg_temp.try($$SELECT idem_lookup('', 'held')$$);
SELECT pg_temp.try($$SELECT idem_forget('bad', NULL)$$);

-- responses over idempotency.max_response_size (1MB) are refused before use
SELECT pg_temp.try($$SELECT idem_complete('bad', 'held', $$ || :t || $$,
                    jsonb_build_object('blob', repeat('x', 1100000)))$$);
SELECT pg_temp.try($$SELECT idem_release('bad', 'held', $$ || :t || $$,
                    jsonb_build_object('blob', repeat('x', 1100000)))$$);
SET idempotency.max_response_size = '100B';
SELECT pg_temp.try($$SELECT idem_complete('bad', 'held', $$ || :t || $$,
                    jsonb_build_object('blob', repeat('x', 200)))$$);
RESET idempotency.max_response_size;

-- completing a completed key, releasing a completed key
SELECT idem_complete('bad', 'held', :t, '{"done": 1}');
SELECT pg_temp.try($$SELECT idem_complete('bad', 'held', $$ || :t || $$, '{"again": 1}')$$);
SELECT pg_temp.try($$SELECT idem_release('bad', 'held', $$ || :t || $$)$$);
SELECT pg_temp.try($$SELECT idem_heartbeat('bad', 'held', $$ || :t || $$)$$);
SELECT response FROM idempotency_records WHERE key = 'held';

-- wrong types through named arguments are caught by the parser
SELECT pg_temp.try($$SELECT idem_claim(tenant_id => 'bi', key => 'k', lease => 5)$$);
SELECT pg_temp.try($$SELECT idem_claim(tenant_id => 'bi', key => 'k', nonsense => 1)$$);
SELECT pg_temp.try($$SELECT idem_complete('bad', 'held', 'not-a-number')$$);

-- idem_sweep batch size
SELECT pg_temp.try($$SELECT idem_sweep(0)$$);
SELECT pg_temp.try($$SELECT idem_sweep(-1)$$);

-- nothing above left a record behind
-- (the one valid call above, the 255-byte key, is the only claim in tenant bi)
SELECT tenant_id, length(key) AS key_bytes, status FROM idempotency_records
WHERE tenant_id IN ('bi', 'bad') ORDER BY 1, 2;

-- durations are capped at 1000 years, so that no expiry computed from them,
-- now or when the claim is settled, can leave the timestamp range
SELECT pg_temp.try($$SELECT idem_claim('bi', 'huge-ttl', ttl => '9223372036854775807 microseconds')$$);
SELECT pg_temp.try($$SELECT idem_claim('bi', 'huge-ttl-2', ttl => '1001 years')$$);
SELECT pg_temp.try($$SELECT idem_claim('bi', 'huge-lease', lease => '1001 years')$$);
SELECT pg_temp.try($$SELECT idem_claim('bi', 'huge-wait', wait => '1001 years')$$);
SELECT token AS t FROM idem_claim('bi', 'long-ttl', ttl => '1000 years') \gset
SELECT idem_complete('bi', 'long-ttl', :t);
SELECT outcome FROM idem_claim('bi', 'long-ttl');
