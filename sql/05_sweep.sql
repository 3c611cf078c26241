-- idem_sweep: expired records and stale claims go, live ones stay.
TRUNCATE idempotency_records;

-- live: a processing claim, a completed record within its retention
SELECT outcome FROM idem_claim('s', 'live-claim');
SELECT idem_complete('s', 'live-done', token, '{}') FROM idem_claim('s', 'live-done');
-- expired: completed and failed records past retention, a stale claim
SELECT idem_complete('s', 'old-done', token, '{}') FROM idem_claim('s', 'old-done', ttl => '1 ms');
SELECT idem_release('s', 'old-failed', token, '{"e": 1}') FROM idem_claim('s', 'old-failed', ttl => '1 ms');
SELECT outcome FROM idem_claim('s', 'stale-claim', lease => '1 ms');
SELECT pg_sleep(0.02);

SELECT * FROM idem_sweep();
SELECT key, status FROM idempotency_records ORDER BY key;
-- a second pass finds nothing
SELECT * FROM idem_sweep();

-- stale_action = 'fail': stale claims become failed records (kept for their ttl)
SELECT outcome FROM idem_claim('s', 'stale-2', lease => '1 ms', ttl => '1 hour');
SELECT pg_sleep(0.02);
SET idempotency.stale_action = 'fail';
SELECT * FROM idem_sweep();
SELECT status, response, lease_expires_at,
       expires_at > now() + interval '59 min' AS kept_for_ttl
FROM idempotency_records WHERE key = 'stale-2';
RESET idempotency.stale_action;

-- many batches: 2,500 expired records with a batch of 100
INSERT INTO idempotency_records (tenant_id, key, status, token, ttl, expires_at, created_at, updated_at)
SELECT 'bulk', 'k' || i, 'completed', i, '1 s', now() - interval '1 hour', now(), now()
FROM generate_series(1, 2500) i;
SELECT * FROM idem_sweep(batch_size => 100);
SELECT count(*) AS bulk_left FROM idempotency_records WHERE tenant_id = 'bulk';

-- a record being settled right now is not swept: rows locked by another
-- transaction are skipped (proven with concurrency in the isolation specs)

-- a swept key can be claimed again, with a larger token than before
SELECT token AS t FROM idem_claim('s', 'again', lease => '1 ms') \gset
SELECT pg_sleep(0.02);
SELECT stale_released FROM idem_sweep();
SELECT outcome, token > :t AS larger_token FROM idem_claim('s', 'again');
