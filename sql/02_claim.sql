-- idem_claim outcomes: claimed, in_progress, replay, failed, mismatch.
CREATE TEMP TABLE tokens (name text PRIMARY KEY, token bigint);

-- a fresh key is claimed: a processing row with a token and a lease
SELECT outcome, token > 0 AS has_token, response, expires_at > now() AS lease_in_future
FROM idem_claim(tenant_id => 'acme', key => 'order-1', fingerprint => 'fp-a');
INSERT INTO tokens SELECT 'order-1', token FROM idempotency_records WHERE key = 'order-1';
SELECT status, fingerprint, lease_expires_at = expires_at AS lease_is_expiry,
       lease_expires_at BETWEEN now() + interval '4 min 50 s' AND now() + interval '5 min 10 s' AS default_lease_5min,
       ttl
FROM idempotency_records WHERE key = 'order-1';

-- while processing (committed claim, live lease): in_progress, no token handed out
SELECT outcome, token, response, expires_at IS NOT NULL AS shows_lease_end
FROM idem_claim('acme', 'order-1', 'fp-a');

-- the same key in another tenant is independent
SELECT outcome FROM idem_claim('globex', 'order-1', 'fp-b');

-- completing stores the response; later claims replay it exactly
SELECT idem_complete('acme', 'order-1', (SELECT token FROM tokens WHERE name = 'order-1'),
                     '{"status": 201, "body": {"id": "pay_1", "amount": 1000, "nested": [1, {"a": null}]}}');
SELECT outcome, token, response, expires_at > now() + interval '23 hours' AS kept_24h
FROM idem_claim('acme', 'order-1', 'fp-a');
SELECT r.response = c.response AS same_value,
       jsonb_send(r.response) = jsonb_send(c.response) AS same_bytes
FROM idempotency_records r, idem_claim('acme', 'order-1') c
WHERE r.key = 'order-1' AND r.tenant_id = 'acme';

-- fingerprint NULL on either side skips the check
SELECT outcome FROM idem_claim('acme', 'order-1', NULL);
-- a different fingerprint is a mismatch, and comes first
SELECT outcome, token, response FROM idem_claim('acme', 'order-1', 'fp-other');
-- ... also while the key is still processing
SELECT outcome FROM idem_claim('globex', 'order-1', 'fp-other');

-- a completed record with a NULL response replays NULL
SELECT token AS t FROM idem_claim('acme', 'no-body') \gset
SELECT idem_complete('acme', 'no-body', :t);
SELECT outcome, response IS NULL AS null_response FROM idem_claim('acme', 'no-body');

-- release with a failure: later claims get outcome failed with the stored failure
SELECT token AS t FROM idem_claim('acme', 'order-2', 'fp') \gset
SELECT idem_release('acme', 'order-2', :t, failure => '{"status": 402, "error": "card_declined"}');
SELECT outcome, token, response FROM idem_claim('acme', 'order-2', 'fp');
SELECT status FROM idempotency_records WHERE key = 'order-2';
-- ... and a different fingerprint on a failed record is still a mismatch
SELECT outcome FROM idem_claim('acme', 'order-2', 'fp-x');

-- release without a failure deletes the record: the key can be claimed again,
-- with a larger token
SELECT token AS t1 FROM idem_claim('acme', 'order-3') \gset
SELECT idem_release('acme', 'order-3', :t1);
SELECT count(*) AS rows_left FROM idempotency_records WHERE key = 'order-3';
SELECT outcome, token > :t1 AS larger_token FROM idem_claim('acme', 'order-3');

-- a second claim of the same key in the same transaction never wins again
BEGIN;
SELECT outcome FROM idem_claim('acme', 'txn-1');
SELECT outcome, token FROM idem_claim('acme', 'txn-1');
SELECT outcome FROM idem_claim('acme', 'txn-1', lease => '1 hour');
COMMIT;
-- even when the transaction outlives its own lease
BEGIN;
SELECT outcome FROM idem_claim('acme', 'txn-2', lease => '1 ms');
SELECT pg_sleep(0.02);
SELECT outcome, token FROM idem_claim('acme', 'txn-2');
ROLLBACK;

-- a rolled-back claim leaves nothing behind
BEGIN;
SELECT outcome FROM idem_claim('acme', 'rolled-back');
ROLLBACK;
SELECT count(*) AS rows_left FROM idempotency_records WHERE key = 'rolled-back';
SELECT outcome FROM idem_claim('acme', 'rolled-back');

-- a claim in a subtransaction that rolls back leaves nothing either, and the
-- key lock goes with it
BEGIN;
SAVEPOINT s;
SELECT outcome FROM idem_claim('acme', 'in-savepoint');
ROLLBACK TO SAVEPOINT s;
SELECT count(*) AS rows_left FROM idempotency_records WHERE key = 'in-savepoint';
SELECT count(*) AS key_locks_held FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 18756 AND pid = pg_backend_pid();
SELECT outcome FROM idem_claim('acme', 'in-savepoint');
COMMIT;

-- a claim that turns a stale claim into a failed record wrote a row: it keeps
-- the key lock until it commits, so other claims answer in_progress instead
-- of waiting on that row (a claim that wrote nothing gives the lock back:
-- shown by the isolation spec claim-wait)
SELECT outcome FROM idem_claim('acme', 'stale-lock', lease => '1 ms');
SELECT pg_sleep(0.02);
BEGIN;
SET LOCAL idempotency.stale_action = 'fail';
SELECT outcome FROM idem_claim('acme', 'stale-lock');
SELECT count(*) AS key_locks_held FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 18756 AND pid = pg_backend_pid();
COMMIT;

-- the in-transaction pattern in one statement: claim, business write, complete
CREATE TABLE payments (tenant_id text, key text, amount int);
WITH c AS (SELECT * FROM idem_claim('acme', 'pay-42')),
     w AS (INSERT INTO payments SELECT 'acme', 'pay-42', 500 FROM c WHERE outcome = 'claimed' RETURNING 1)
SELECT c.outcome, (SELECT count(*) FROM w) AS written FROM c;
SELECT idem_complete('acme', 'pay-42', token, '{"paid": 500}')
FROM idempotency_records WHERE key = 'pay-42';
SELECT outcome, response FROM idem_claim('acme', 'pay-42');
SELECT count(*) AS payments FROM payments;
