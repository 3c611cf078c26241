-- Multi-step operations: recovery points (idem_checkpoint) that a later
-- owner of the key resumes from, and stable child keys (idem_child_key).
\set VERBOSITY sqlstate
SET idempotency.durability_check = off;
CREATE TABLE phases (key text, phase text);

-- a fresh key has no recovery point; a checkpoint on a held claim, kept
-- through its completion; a replay carries none
SELECT outcome, recovery_point IS NULL AS no_point, state IS NULL AS no_state
  FROM idem_claim('cp', 'order-0');
BEGIN;
SELECT token AS t FROM idem_claim('cp', 'order-1') \gset
INSERT INTO phases VALUES ('order-1', 'created');
SELECT idem_checkpoint('cp', 'order-1', :t, 'created', '{"order": 1}');
INSERT INTO phases VALUES ('order-1', 'charged');
SELECT idem_checkpoint('cp', 'order-1', :t, 'charged', '{"order": 1, "charge": "ch_1"}');
SELECT idem_complete('cp', 'order-1', :t, '{"done": true}');
COMMIT;
SELECT status, recovery_point, state FROM idem_lookup('cp', 'order-1');
SELECT outcome, recovery_point, state FROM idem_claim('cp', 'order-1');

-- a holder dies after its first committed phase; the next owner resumes
SELECT token AS t1 FROM idem_claim('cp', 'order-2', lease => '10 ms') \gset
BEGIN;
INSERT INTO phases VALUES ('order-2', 'created');
SELECT idem_checkpoint('cp', 'order-2', :t1, 'created', '{"order": 2}');
COMMIT;
BEGIN;
INSERT INTO phases VALUES ('order-2', 'charged');
SELECT idem_checkpoint('cp', 'order-2', :t1, 'charged');
ROLLBACK;
SELECT pg_sleep(0.05);
SELECT outcome, token > :t1 AS greater, recovery_point, state
  FROM idem_claim('cp', 'order-2');
SELECT token AS t2 FROM idempotency_records WHERE key = 'order-2' \gset
-- the zombie's checkpoint and completion are refused
SELECT idem_checkpoint('cp', 'order-2', :t1, 'charged');
SELECT idem_complete('cp', 'order-2', :t1, '{}');
SELECT idem_checkpoint('cp', 'order-2', :t2, 'charged', '{"charge": "ch_2"}');
SELECT idem_complete('cp', 'order-2', :t2, '{"done": true}');
SELECT status, recovery_point, state FROM idem_lookup('cp', 'order-2');
SELECT count(*) AS phases_of_order_2 FROM phases WHERE key = 'order-2';

-- a release without failure keeps a checkpointed record and hands it on
BEGIN;
SELECT token AS t3 FROM idem_claim('cp', 'order-3') \gset
SELECT idem_checkpoint('cp', 'order-3', :t3, 'created', '{"n": 3}');
SELECT idem_release('cp', 'order-3', :t3);
COMMIT;
SELECT status, token > :t3 AS new_token, recovery_point, lease_expires_at <= now() AS lease_over
  FROM idem_lookup('cp', 'order-3');
SELECT idem_complete('cp', 'order-3', :t3, '{}');
SELECT outcome, recovery_point, state FROM idem_claim('cp', 'order-3');
-- the same for a claim written at once (two-phase: committed, then released)
SELECT token AS t4 FROM idem_claim('cp', 'order-4') \gset
SELECT idem_checkpoint('cp', 'order-4', :t4, 'created');
SELECT idem_release('cp', 'order-4', :t4);
SELECT outcome, recovery_point FROM idem_claim('cp', 'order-4');
-- without a checkpoint the record goes, as before
SELECT token AS t5 FROM idem_claim('cp', 'order-5') \gset
SELECT idem_release('cp', 'order-5', :t5);
SELECT count(*) AS records FROM idempotency_records WHERE key = 'order-5';

-- a checkpoint rolled back with its savepoint is not stored
BEGIN;
SELECT token AS t6 FROM idem_claim('cp', 'order-6') \gset
SELECT idem_checkpoint('cp', 'order-6', :t6, 'created');
SAVEPOINT s;
SELECT idem_checkpoint('cp', 'order-6', :t6, 'charged');
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT status, recovery_point FROM idem_lookup('cp', 'order-6');

-- batch claims return the columns too
SELECT token AS t7 FROM idem_claim('cp', 'order-7', lease => '10 ms') \gset
SELECT idem_checkpoint('cp', 'order-7', :t7, 'created', '{"n": 7}');
SELECT pg_sleep(0.05);
SELECT key, outcome, recovery_point, state
  FROM idem_claim_many('cp', ARRAY['order-7', 'order-8', 'order-1']) ORDER BY key;

-- stale_action = fail does not fail a handed-on record: its recovery point
-- is resumed (sql/17_resumable.sql has the rest of that rule)
SET idempotency.stale_action = fail;
SELECT token AS t9 FROM idem_claim('cp', 'order-9') \gset
SELECT idem_checkpoint('cp', 'order-9', :t9, 'created');
SELECT idem_release('cp', 'order-9', :t9);
SELECT outcome, response, recovery_point FROM idem_claim('cp', 'order-9');
RESET idempotency.stale_action;

-- bad input: SQLSTATE, nothing changed
SELECT token AS t10 FROM idem_claim('cp', 'order-10') \gset
SELECT idem_checkpoint('cp', 'order-10', :t10, NULL);
SELECT idem_checkpoint('cp', 'order-10', :t10, '');
SELECT idem_checkpoint('cp', 'order-10', :t10, repeat('p', 256));
SET idempotency.max_response_size = 100;
SELECT idem_checkpoint('cp', 'order-10', :t10, 'big', jsonb_build_object('x', repeat('s', 200)));
RESET idempotency.max_response_size;
SELECT idem_checkpoint('cp', 'no-such-key', 1, 'created');
SELECT idem_checkpoint('cp', 'order-10', :t10 + 1, 'created');
SELECT idem_checkpoint('cp', 'order-1', 1, 'created');
SELECT recovery_point FROM idem_lookup('cp', 'order-10');
SELECT idem_checkpoint('cp', 'order-10', :t10, repeat('p', 255));
SELECT length(recovery_point) AS longest_point FROM idem_lookup('cp', 'order-10');

-- child keys: stable, distinct per tenant, key and step, header-safe
SELECT idem_child_key('cp', 'order-1', 'charge') = idem_child_key('cp', 'order-1', 'charge') AS stable,
       count(DISTINCT k) AS distinct_keys, max(length(k)) AS longest,
       bool_and(k ~ '^[!-~]+$') AS printable_ascii_no_spaces
  FROM (VALUES (idem_child_key('cp', 'order-1', 'charge')),
               (idem_child_key('cp', 'order-1', 'receipt')),
               (idem_child_key('cp', 'order-2', 'charge')),
               (idem_child_key('cp2', 'order-1', 'charge')),
               (idem_child_key('cp', 'order-1c', 'harge')),
               (idem_child_key(repeat('t', 255), repeat('k', 255), repeat('s', 255)))) AS v(k);
SELECT idem_child_key('cp', 'order-1', 'charge');
SELECT provolatile FROM pg_proc WHERE proname = 'idem_child_key';
SELECT idem_child_key('cp', 'order-1', NULL);
SELECT idem_child_key('cp', '', 'charge');
SELECT idem_child_key('cp', 'order-1', repeat('s', 256));

DROP TABLE phases;
DELETE FROM idempotency_records;
