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
-- recovery points: checkpointed, heartbeaten, extended by the checkpoint,
-- handed on by a release, taken over after the lease
SELECT idem_checkpoint('inv', 'point', token, 'p1') FROM idem_claim('inv', 'point');
SELECT idem_heartbeat('inv', 'point-beating', token) IS NOT NULL
  FROM (SELECT token, idem_checkpoint('inv', 'point-beating', token, 'p1')
          FROM idem_claim('inv', 'point-beating')) c;
SELECT idem_checkpoint('inv', 'point-lease', token, 'p1', lease => '1 hour')
  FROM idem_claim('inv', 'point-lease');
SELECT idem_release('inv', 'point-released', token)
  FROM (SELECT token, idem_checkpoint('inv', 'point-released', token, 'p1')
          FROM idem_claim('inv', 'point-released', ttl => '3 hours')) c;
SELECT idem_checkpoint('inv', 'point-taken', token, 'p1')
  FROM idem_claim('inv', 'point-taken', lease => '1 ms');
SELECT pg_sleep(0.02);
SELECT outcome, recovery_point FROM idem_claim('inv', 'point-taken', ttl => '5 hours');

SELECT status, count(*) FROM idempotency_records GROUP BY status ORDER BY status;
SELECT count(*) AS rows_breaking_invariants
FROM idempotency_records
WHERE status NOT IN ('processing', 'completed', 'failed')
   OR token <= 0
   OR (status = 'processing') <> (lease_expires_at IS NOT NULL)
   -- a processing record expires with its lease, or, with a recovery point,
   -- when its retention after the lease ends
   OR (status = 'processing' AND recovery_point IS NULL AND expires_at <> lease_expires_at)
   OR (status = 'processing' AND recovery_point IS NOT NULL
       AND expires_at <> timezone('UTC', timezone('UTC', lease_expires_at) + ttl))
   OR (status = 'processing' AND response IS NOT NULL)
   OR updated_at < created_at;
