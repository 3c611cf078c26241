-- Recovery points outlive the sweeper: a processing record with a recovery
-- point whose lease ended is kept until its retention (the claim's ttl)
-- after the lease ends, shown as "resumable", and the next claim resumes it;
-- only after its retention does a sweep remove it.
\set SHOW_CONTEXT never
TRUNCATE idempotency_records;

-- the reproduction: a holder checkpoints, commits and dies; a sweep runs
-- after the lease ends and before the next delivery
SELECT token AS t1 FROM idem_claim('r', 'order-1', lease => '10 ms', ttl => '1 hour') \gset
SELECT idem_checkpoint('r', 'order-1', :t1, 'charged', '{"charge": "ch_1"}');
SELECT expires_at - lease_expires_at AS kept_after_lease FROM idem_lookup('r', 'order-1');
SELECT pg_sleep(0.05);
SELECT status, recovery_point FROM idem_lookup('r', 'order-1');
SELECT * FROM idem_sweep();
SELECT outcome, token > :t1 AS newer_token, recovery_point, state
  FROM idem_claim('r', 'order-1', lease => '1 min');
SELECT status FROM idem_lookup('r', 'order-1');

-- the old holder is fenced off; the new one completes
\set VERBOSITY sqlstate
SELECT idem_complete('r', 'order-1', :t1, '{}');
\set VERBOSITY default
SELECT token AS t1b FROM idem_lookup('r', 'order-1') \gset
SELECT idem_complete('r', 'order-1', :t1b, '{"receipt": 1}');
SELECT status, response FROM idem_lookup('r', 'order-1');

-- a claim without a recovery point is still released by the sweep
SELECT outcome FROM idem_claim('r', 'plain', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT * FROM idem_sweep();
SELECT count(*) AS plain_left FROM idem_lookup('r', 'plain');

-- with stale_action = 'fail' the sweep fails stale claims without a
-- recovery point, never a resumable record, and a claim resumes it
SET idempotency.stale_action = 'fail';
SELECT token AS t2 FROM idem_claim('r', 'order-2', lease => '10 ms') \gset
SELECT idem_checkpoint('r', 'order-2', :t2, 'reserved');
SELECT outcome FROM idem_claim('r', 'plain-2', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT * FROM idem_sweep();
SELECT key, status, recovery_point FROM idempotency_records
 WHERE key IN ('order-2', 'plain-2') ORDER BY key;
SELECT outcome, recovery_point FROM idem_claim('r', 'order-2');
RESET idempotency.stale_action;

-- a release without failure hands the record on for its retention
SELECT token AS t3 FROM idem_claim('r', 'order-3', ttl => '2 hours') \gset
SELECT idem_checkpoint('r', 'order-3', :t3, 'step-1');
SELECT idem_release('r', 'order-3', :t3);
SELECT status, expires_at - updated_at AS kept_for FROM idem_lookup('r', 'order-3');
SELECT * FROM idem_sweep();
SELECT outcome, recovery_point FROM idem_claim('r', 'order-3');

-- a heartbeat keeps the retention after the new lease
SELECT token AS t4 FROM idem_claim('r', 'order-4', ttl => '30 min') \gset
SELECT idem_checkpoint('r', 'order-4', :t4, 'step-1');
SELECT idem_heartbeat('r', 'order-4', :t4, '2 hours') IS NOT NULL AS extended;
SELECT expires_at - lease_expires_at AS kept_after_lease,
       lease_expires_at > now() + interval '119 min' AS new_lease
  FROM idem_lookup('r', 'order-4');

-- idem_checkpoint(..., lease) extends the lease in the same call
SELECT token AS t5 FROM idem_claim('r', 'order-5', lease => '1 min', ttl => '10 min') \gset
SELECT idem_checkpoint('r', 'order-5', :t5, 'step-1', lease => '3 hours');
SELECT lease_expires_at > now() + interval '179 min' AS lease_extended,
       expires_at - lease_expires_at AS kept_after_lease
  FROM idem_lookup('r', 'order-5');
-- without it (or NULL) the lease stays
SELECT lease_expires_at AS l5 FROM idem_lookup('r', 'order-5') \gset
SELECT idem_checkpoint('r', 'order-5', :t5, 'step-2', '{"s": 2}', NULL);
SELECT lease_expires_at = :'l5' AS lease_kept FROM idem_lookup('r', 'order-5');
-- bad leases: 22023, nothing changed
SELECT idem_checkpoint('r', 'order-5', :t5, 'step-3', lease => '0 s');
SELECT idem_checkpoint('r', 'order-5', :t5, 'step-3', lease => '-1 s');
SELECT idem_checkpoint('r', 'order-5', :t5, 'step-3', lease => '2000 years');
SELECT recovery_point, lease_expires_at = :'l5' AS lease_kept FROM idem_lookup('r', 'order-5');

-- batch claims resume a swept resumable record too
SELECT token AS t6 FROM idem_claim('r', 'order-6', lease => '10 ms') \gset
SELECT idem_checkpoint('r', 'order-6', :t6, 'packed', '{"box": 6}');
SELECT pg_sleep(0.05);
SELECT * FROM idem_sweep();
SELECT key, outcome, recovery_point, state
  FROM idem_claim_many('r', ARRAY['order-6', 'order-7']) ORDER BY key;

-- after its retention the record goes like any other: the next claim
-- starts afresh
SELECT token AS t8 FROM idem_claim('r', 'order-8', lease => '10 ms', ttl => '10 ms') \gset
SELECT idem_checkpoint('r', 'order-8', :t8, 'step-1');
SELECT pg_sleep(0.05);
SELECT * FROM idem_sweep();
SELECT count(*) AS order_8_left FROM idem_lookup('r', 'order-8');
SELECT outcome, recovery_point FROM idem_claim('r', 'order-8');
-- ... also with stale_action = 'fail' (deleted, not failed)
SET idempotency.stale_action = 'fail';
SELECT token AS t9 FROM idem_claim('r', 'order-9', lease => '10 ms', ttl => '10 ms') \gset
SELECT idem_checkpoint('r', 'order-9', :t9, 'step-1');
SELECT pg_sleep(0.05);
SELECT * FROM idem_sweep();
SELECT count(*) AS order_9_left FROM idem_lookup('r', 'order-9');
RESET idempotency.stale_action;

-- the states an operator sees
TRUNCATE idempotency_records;
SELECT token AS a FROM idem_claim('r', 'live', lease => '1 hour') \gset
SELECT token AS b FROM idem_claim('r', 'waiting', lease => '10 ms') \gset
SELECT idem_checkpoint('r', 'waiting', :b, 'step-1');
SELECT idem_complete('r', 'done', token, '{}') FROM idem_claim('r', 'done');
SELECT idem_release('r', 'bad', token, '{"e": 1}') FROM idem_claim('r', 'bad');
SELECT pg_sleep(0.05);
-- one record per state: the oldest update and the next expiry are its own
SELECT s.state, s.records,
       s.oldest_updated_at = r.updated_at AS oldest_is_its_update,
       s.next_expires_at = r.expires_at AS next_is_its_expiry,
       s.next_expires_at > now() AS next_expiry_ahead
  FROM idem_record_states() s
  JOIN idempotency_records r
    ON r.key = CASE s.state WHEN 'processing' THEN 'live' WHEN 'resumable' THEN 'waiting'
                            WHEN 'completed' THEN 'done' WHEN 'failed' THEN 'bad' END
 ORDER BY s.state;

TRUNCATE idempotency_records;
