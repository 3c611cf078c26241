-- The table has no CHECK constraints (they cost a quarter of a claim's CPU,
-- see idempotency--1.0.sql); the functions keep its invariants.  After a
-- workload that reaches every state, every row must satisfy them.
TRUNCATE idempotency_records;
SELECT idem_complete('inv', 'done', token, '{}') FROM idem_claim('inv', 'done');
SELECT idem_release('inv', 'failed', token, '{"e": 1}') FROM idem_claim('inv', 'failed');
SELECT outcome FROM idem_claim('inv', 'processing');
SELECT idem_heartbeat('inv', 'beating', token) IS NOT NULL FROM idem_claim('inv', 'beating');
SELECT outcome FROM idem_claim('inv', 'taken-over', lease => '1 ms');
SELECT outcome FROM idem_claim('inv', 'stale', lease => '1 ms');
SELECT outcome FROM idem_claim('inv', 'reused', ttl => '1 ms');
SELECT pg_sleep(0.02);
SELECT outcome FROM idem_claim('inv', 'taken-over');
SET idempotency.stale_action = 'fail';
SELECT outcome FROM idem_claim('inv', 'stale');
RESET idempotency.stale_action;
SELECT outcome FROM idem_claim('inv', 'reused');
SELECT count(*) FROM idem_claim_many('inv', ARRAY['m1', 'm2', 'done']);

SELECT status, count(*) FROM idempotency_records GROUP BY status ORDER BY status;
SELECT count(*) AS rows_breaking_invariants
FROM idempotency_records
WHERE status NOT IN ('processing', 'completed', 'failed')
   OR token <= 0
   OR (status = 'processing') <> (lease_expires_at IS NOT NULL)
   OR (status = 'processing' AND expires_at <> lease_expires_at)
   OR (status = 'processing' AND response IS NOT NULL)
   OR updated_at < created_at;
