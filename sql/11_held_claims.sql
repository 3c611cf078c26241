-- A fresh claim at the top level of a READ COMMITTED transaction is written
-- once, at COMMIT (src/held.c).  Nothing may be able to tell: the
-- transaction itself sees its processing row wherever it looks, savepoints
-- undo exactly what they undid before, and everywhere else claims are
-- written at once.
SET idempotency.durability_check = off;

-- rows written to the table since w_mark(), from this backend's counters
-- (pg_stat_xact_user_tables may still hold earlier transactions' counts).
-- Views, not functions: a statement calling a user function could read
-- the table, so it would make held claims be written first.
CREATE TEMP TABLE w_base (ins bigint, upd bigint, del bigint);
CREATE VIEW w_counts AS
  SELECT coalesce(sum(n_tup_ins), 0) AS ins, coalesce(sum(n_tup_upd), 0) AS upd,
         coalesce(sum(n_tup_del), 0) AS del
  FROM pg_stat_xact_user_tables WHERE relname = 'idempotency_records';
CREATE FUNCTION w_mark() RETURNS void LANGUAGE sql AS $$
  DELETE FROM w_base; INSERT INTO w_base SELECT * FROM w_counts;
$$;
CREATE VIEW w_writes AS
  SELECT format('%s inserted, %s updated, %s deleted', c.ins - b.ins, c.upd - b.upd, c.del - b.del)
         AS w_writes
  FROM w_counts c, w_base b;

-- claim + complete in one transaction: nothing written until COMMIT, then
-- one INSERT and no UPDATE (the table's cumulative counters, flushed)
SELECT pg_stat_force_next_flush();
SELECT n_tup_ins AS ins0, n_tup_upd AS upd0 FROM pg_stat_user_tables
 WHERE relname = 'idempotency_records' \gset
BEGIN;
SELECT w_mark();
SELECT token AS t FROM idem_claim('w1', 'once') \gset
SELECT * FROM w_writes;
SELECT idem_complete('w1', 'once', :t, '{"ok": 1}');
SELECT * FROM w_writes;
COMMIT;
SELECT pg_stat_force_next_flush();
SELECT n_tup_ins - :ins0 AS inserted, n_tup_upd - :upd0 AS updated
  FROM pg_stat_user_tables WHERE relname = 'idempotency_records';
SELECT status, token = :t AS same_token, response, lease_expires_at IS NULL AS no_lease,
       expires_at > now() + interval '23 hours' AS kept_for_ttl
  FROM idempotency_records WHERE tenant_id = 'w1' AND key = 'once';
SELECT outcome, response FROM idem_claim('w1', 'once');

-- the claiming transaction sees its processing row wherever it looks
BEGIN;
SELECT w_mark();
SELECT token AS t FROM idem_claim('w1', 'seen', lease => '10 min') \gset
SELECT status, token = :t AS same_token, lease_expires_at = expires_at AS lease_is_expiry
  FROM idempotency_records WHERE tenant_id = 'w1' AND key = 'seen';
SELECT * FROM w_writes;
SELECT status FROM idem_lookup('w1', 'seen');
COMMIT;

-- a statement in a function and COPY see it too
CREATE FUNCTION w_status(k text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE s text;
BEGIN
  SELECT status INTO s FROM idempotency_records WHERE tenant_id = 'w1' AND key = k;
  RETURN coalesce(s, 'none');
END $$;
BEGIN;
SELECT w_mark();
SELECT outcome FROM idem_claim('w1', 'fn');
SELECT w_status('fn');
SELECT outcome FROM idem_claim('w1', 'copy');
COPY (SELECT key, status FROM idempotency_records WHERE tenant_id = 'w1' AND key = 'copy') TO STDOUT;
ROLLBACK;

-- the two-phase pattern: the claim commits as a processing row
BEGIN;
SELECT w_mark();
SELECT token AS t2 FROM idem_claim('w1', 'two-phase') \gset
COMMIT;
SELECT status, token = :t2 AS same_token FROM idempotency_records
 WHERE tenant_id = 'w1' AND key = 'two-phase';
SELECT idem_complete('w1', 'two-phase', :t2, '"done"');
SELECT status, response FROM idempotency_records WHERE tenant_id = 'w1' AND key = 'two-phase';

-- a second claim in the same transaction, fencing, heartbeat (a heartbeat
-- writes a held claim first, then extends it as a written one)
BEGIN;
SELECT w_mark();
SELECT token AS t FROM idem_claim('w1', 'same', fingerprint => 'f1', lease => '1 min') \gset
SELECT outcome, token, expires_at > now() AS lease_shown FROM idem_claim('w1', 'same', fingerprint => 'f1');
SELECT outcome, token FROM idem_claim('w1', 'same', fingerprint => 'f2');
\set VERBOSITY sqlstate
SELECT idem_complete('w1', 'same', :t + 1, '{}');
\set VERBOSITY default
ROLLBACK;
BEGIN;
SELECT w_mark();
SELECT token AS t FROM idem_claim('w1', 'beat', lease => '1 min') \gset
SELECT idem_heartbeat('w1', 'beat', :t, '2 hours') > now() + interval '1 hour' AS extended;
SELECT * FROM w_writes;
COMMIT;
SELECT status, lease_expires_at > now() + interval '1 hour' AS extended
  FROM idempotency_records WHERE tenant_id = 'w1' AND key = 'beat';

-- release without failure writes nothing; with a failure, one INSERT at COMMIT
BEGIN;
SELECT w_mark();
SELECT token AS t FROM idem_claim('w1', 'rel') \gset
SELECT idem_release('w1', 'rel', :t);
SELECT * FROM w_writes;
SELECT outcome FROM idem_claim('w1', 'rel');
SELECT token AS t FROM idem_claim('w1', 'relf') \gset
SELECT idem_release('w1', 'relf', :t, '{"error": "declined"}');
SELECT * FROM w_writes;
COMMIT;
SELECT key, status, response FROM idempotency_records
 WHERE tenant_id = 'w1' AND key IN ('rel', 'relf') ORDER BY key;

-- savepoints undo a completion and a release of an unwritten claim (inside a
-- subtransaction the claim is written first, then settled as a written one)
BEGIN;
SELECT w_mark();
SELECT token AS t FROM idem_claim('w1', 'sp') \gset
SAVEPOINT a;
SELECT idem_complete('w1', 'sp', :t, '"inner"');
SELECT * FROM w_writes;
ROLLBACK TO a;
SAVEPOINT b;
SELECT idem_release('w1', 'sp', :t);
ROLLBACK TO b;
SELECT status FROM idem_lookup('w1', 'sp');
SELECT idem_complete('w1', 'sp', :t, '"outer"');
COMMIT;
SELECT status, response FROM idempotency_records WHERE tenant_id = 'w1' AND key = 'sp';

-- ... and a write made inside them: the claim is unwritten again
BEGIN;
SELECT w_mark();
SELECT token AS t FROM idem_claim('w1', 'sp2') \gset
SAVEPOINT a;
SELECT count(*) FROM idempotency_records WHERE tenant_id = 'w1' AND key = 'sp2';
ROLLBACK TO a;
SELECT count(*) FROM idempotency_records WHERE tenant_id = 'w1' AND key = 'sp2';
SAVEPOINT b;
SELECT idem_complete('w1', 'sp2', :t, '"in b"');
RELEASE b;
COMMIT;
SELECT status, response FROM idempotency_records WHERE tenant_id = 'w1' AND key = 'sp2';

-- a claim inside a subtransaction is written at once, and undone with it
BEGIN;
SELECT w_mark();
SAVEPOINT a;
SELECT outcome FROM idem_claim('w1', 'inner');
SELECT * FROM w_writes;
ROLLBACK TO a;
SELECT outcome FROM idem_claim('w1', 'inner');
ROLLBACK;

-- REPEATABLE READ writes at once
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT w_mark();
SELECT outcome FROM idem_claim('w1', 'rr');
SELECT * FROM w_writes;
ROLLBACK;

-- more claims than are kept unwritten: every one still commits
BEGIN;
SELECT w_mark();
SELECT count(*) FILTER (WHERE c.outcome = 'claimed') AS claimed
  FROM generate_series(1, 40) g, LATERAL idem_claim('w1', 'many-' || g) c;
COMMIT;
SELECT count(*) AS processing FROM idempotency_records
 WHERE tenant_id = 'w1' AND key LIKE 'many-%' AND status = 'processing';

-- dropping the extension in the claiming transaction writes the claim first
BEGIN;
SELECT w_mark();
SELECT outcome FROM idem_claim('w1', 'dropped');
DROP EXTENSION idempotency;
COMMIT;
CREATE EXTENSION idempotency;
SELECT count(*) FROM idempotency_records;

DROP VIEW w_writes;
DROP FUNCTION w_mark();
DROP VIEW w_counts;
DROP FUNCTION w_status(text);
