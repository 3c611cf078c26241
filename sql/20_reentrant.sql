-- Re-entrant claims (1.4): a claim made with a holder answers claimed again,
-- with the same token and lease end, to a claim with the same holder while
-- its lease is live; every other caller gets in_progress.  Nothing is
-- written by a re-entry.  After the lease, the takeover is anyone's, the
-- old token stays fenced.
\set SHOW_CONTEXT never
TRUNCATE idempotency_records;
CREATE TEMP TABLE seen (name text PRIMARY KEY, token bigint, expires_at timestamptz);

-- a fresh claim stores its holder
INSERT INTO seen SELECT 'first', token, expires_at
  FROM idem_claim('re', 'k1', 'fp', lease => '1 hour', holder => 'run-1');
SELECT status, holder, token = (SELECT token FROM seen WHERE name = 'first') AS same_token
  FROM idem_lookup('re', 'k1');
SELECT xmin::text AS k1_xmin, updated_at AS k1_updated FROM idempotency_records WHERE key = 'k1' \gset

-- the same holder re-enters: claimed, same token, the lease as it was, nothing written
SELECT outcome, token = (SELECT token FROM seen WHERE name = 'first') AS same_token,
       expires_at = (SELECT expires_at FROM seen WHERE name = 'first') AS same_lease_end,
       response IS NULL AS no_response, recovery_point, state
  FROM idem_claim('re', 'k1', 'fp', lease => '2 hours', holder => 'run-1');
SELECT xmin::text = :'k1_xmin' AS not_rewritten, updated_at = :'k1_updated' AS same_updated_at
  FROM idempotency_records WHERE key = 'k1';
-- without a fingerprint it does not differ: re-entered too
SELECT outcome, token = (SELECT token FROM seen WHERE name = 'first') AS same_token
  FROM idem_claim('re', 'k1', holder => 'run-1');

-- everyone else is in progress: another holder, no holder, a holder that differs only in case
SELECT outcome, token, expires_at = (SELECT expires_at FROM seen WHERE name = 'first') AS lease_end
  FROM idem_claim('re', 'k1', 'fp', holder => 'run-2');
SELECT outcome, token FROM idem_claim('re', 'k1', 'fp');
SELECT outcome, token FROM idem_claim('re', 'k1', 'fp', holder => 'RUN-1');

-- the mismatch rule comes first, for the holder too
SELECT outcome, token FROM idem_claim('re', 'k1', 'other-fp', holder => 'run-1');

-- completion, replay: the completed record keeps its holder
SELECT idem_complete('re', 'k1', (SELECT token FROM seen WHERE name = 'first'), '{"done": 1}');
SELECT outcome, response, token FROM idem_claim('re', 'k1', 'fp', holder => 'run-1');
SELECT status, holder FROM idem_lookup('re', 'k1');

-- a claim made without a holder is never re-entered
SELECT outcome FROM idem_claim('re', 'k2', lease => '1 hour');
SELECT outcome, token FROM idem_claim('re', 'k2', holder => 'run-1');
SELECT holder IS NULL AS no_holder FROM idem_lookup('re', 'k2');

-- a heartbeat extends the lease; a re-entry answers the new end
INSERT INTO seen SELECT 'hb', token, expires_at FROM idem_claim('re', 'k3', holder => 'run-1');
SELECT idem_heartbeat('re', 'k3', (SELECT token FROM seen WHERE name = 'hb'), lease => '3 hours') AS hb_end \gset
SELECT outcome, expires_at = :'hb_end' AS heartbeat_end,
       token = (SELECT token FROM seen WHERE name = 'hb') AS same_token
  FROM idem_claim('re', 'k3', holder => 'run-1');

-- a checkpointed claim re-entered: its recovery point and state, as a takeover gives them
INSERT INTO seen SELECT 'cp', token, expires_at FROM idem_claim('re', 'k4', lease => '1 hour', holder => 'run-1');
SELECT idem_checkpoint('re', 'k4', (SELECT token FROM seen WHERE name = 'cp'), 'step-1', '{"n": 1}');
SELECT outcome, token = (SELECT token FROM seen WHERE name = 'cp') AS same_token, recovery_point, state
  FROM idem_claim('re', 'k4', holder => 'run-1');

-- released: the key is free, the same holder claims it afresh with a new token
SELECT idem_release('re', 'k3', (SELECT token FROM seen WHERE name = 'hb'));
SELECT outcome, token > (SELECT token FROM seen WHERE name = 'hb') AS newer_token
  FROM idem_claim('re', 'k3', holder => 'run-1');

-- after the lease: the same holder takes over with a new token; the old one is fenced
INSERT INTO seen SELECT 'short', token, expires_at FROM idem_claim('re', 'k5', lease => '10 ms', holder => 'run-1');
SELECT pg_sleep(0.05);
INSERT INTO seen SELECT 'same-again', token, expires_at FROM idem_claim('re', 'k5', holder => 'run-1');
SELECT (SELECT token FROM seen WHERE name = 'same-again') > (SELECT token FROM seen WHERE name = 'short')
       AS newer_token, holder FROM idem_lookup('re', 'k5');
\set VERBOSITY sqlstate
SELECT idem_complete('re', 'k5', (SELECT token FROM seen WHERE name = 'short'), '{"by": "old"}');
\set VERBOSITY default
SELECT outcome, token = (SELECT token FROM seen WHERE name = 'same-again') AS current_token
  FROM idem_claim('re', 'k5', holder => 'run-1');

-- ... or another holder does, which then holds it: the first holder is in progress, and fenced
INSERT INTO seen SELECT 'k6-first', token, expires_at FROM idem_claim('re', 'k6', lease => '10 ms', holder => 'run-1');
SELECT pg_sleep(0.05);
INSERT INTO seen SELECT 'k6-second', token, expires_at FROM idem_claim('re', 'k6', holder => 'run-2');
SELECT holder FROM idem_lookup('re', 'k6');
SELECT outcome, token FROM idem_claim('re', 'k6', holder => 'run-1');
SELECT outcome, token = (SELECT token FROM seen WHERE name = 'k6-second') AS same_token
  FROM idem_claim('re', 'k6', holder => 'run-2');
\set VERBOSITY sqlstate
SELECT idem_heartbeat('re', 'k6', (SELECT token FROM seen WHERE name = 'k6-first'));
\set VERBOSITY default

-- ... or a caller without a holder does: the holder is cleared, nobody re-enters
SELECT outcome FROM idem_claim('re', 'k7', lease => '10 ms', holder => 'run-1');
SELECT pg_sleep(0.05);
SELECT outcome FROM idem_claim('re', 'k7');
SELECT holder IS NULL AS holder_cleared FROM idem_lookup('re', 'k7');
SELECT outcome FROM idem_claim('re', 'k7', holder => 'run-1');

-- bad holders, refused before anything is read
\set VERBOSITY sqlstate
SELECT outcome FROM idem_claim('re', 'k8', holder => '');
SELECT outcome FROM idem_claim('re', 'k8', holder => repeat('h', 256));
\set VERBOSITY default
SELECT outcome FROM idem_claim('re', 'k8', holder => repeat('h', 255));
SELECT length(holder) FROM idem_lookup('re', 'k8');
SELECT outcome FROM idem_claim('re', 'k8', holder => repeat('h', 255));
SELECT count(*) AS k8_records FROM idempotency_records WHERE key = 'k8';

-- in one transaction: a held claim (written at COMMIT) re-entered, as its
-- written row would be; then the same with held claims and direct reads off
CREATE TEMP TABLE answers (mode text, step int, outcome text, same_token boolean, lease_end boolean,
                           inserted bigint);
CREATE FUNCTION pg_temp.same_transaction(mode text, k text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    first record;
    r record;
    -- rows inserted into the table, from this backend's counters (which
    -- may still hold earlier transactions' counts: a difference is taken)
    base bigint := (SELECT n_tup_ins FROM pg_stat_xact_user_tables
                     WHERE relname = 'idempotency_records');
BEGIN
    SELECT * INTO first FROM idem_claim('re', k, 'fp', lease => '1 hour', holder => 'run-1');
    INSERT INTO answers VALUES (mode, 1, first.outcome, true, true);
    SELECT * INTO r FROM idem_claim('re', k, 'fp', holder => 'run-1');
    INSERT INTO answers VALUES (mode, 2, r.outcome, r.token = first.token, r.expires_at = first.expires_at);
    SELECT * INTO r FROM idem_claim('re', k, 'fp', holder => 'run-2');
    INSERT INTO answers VALUES (mode, 3, r.outcome, r.token IS NOT DISTINCT FROM first.token, r.expires_at = first.expires_at);
    SELECT * INTO r FROM idem_claim('re', k, 'fp');
    INSERT INTO answers VALUES (mode, 4, r.outcome, r.token IS NOT DISTINCT FROM first.token, r.expires_at = first.expires_at);
    SELECT * INTO r FROM idem_claim('re', k, 'fp2', holder => 'run-1');
    INSERT INTO answers VALUES (mode, 5, r.outcome, r.token IS NOT DISTINCT FROM first.token, r.expires_at IS NOT DISTINCT FROM first.expires_at,
        (SELECT n_tup_ins FROM pg_stat_xact_user_tables WHERE relname = 'idempotency_records') - base);
    PERFORM idem_complete('re', k, first.token, '{"tx": true}');
    SELECT * INTO r FROM idem_claim('re', k, 'fp', holder => 'run-1');
    INSERT INTO answers VALUES (mode, 6, r.outcome, r.token IS NOT DISTINCT FROM first.token, NULL);
END
$$;
BEGIN;
SELECT pg_temp.same_transaction('held', 'tx-1');
COMMIT;
BEGIN;
SET LOCAL idempotency.defer_writes = off;
SET LOCAL idempotency.direct_reads = off;
SELECT pg_temp.same_transaction('written', 'tx-2');
COMMIT;
SELECT step, outcome, same_token, lease_end, count(*) AS modes
  FROM answers GROUP BY step, outcome, same_token, lease_end ORDER BY step;
-- (the held claim was not written before COMMIT, the other one at once)
SELECT mode, inserted AS inserted_before_commit FROM answers WHERE step = 5 ORDER BY mode;
SELECT 'tx-1' AS key, status, holder FROM idem_lookup('re', 'tx-1')
UNION ALL SELECT 'tx-2', status, holder FROM idem_lookup('re', 'tx-2') ORDER BY 1;

-- a transaction that outlived its claim's lease: still in progress to its
-- own holder (the lease is not live), held or written
CREATE FUNCTION pg_temp.outlived(k text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM idem_claim('re', k, lease => '10 ms', holder => 'run-1');
    PERFORM pg_sleep(0.05);
    RETURN (SELECT outcome FROM idem_claim('re', k, holder => 'run-1'));
END
$$;
BEGIN;
SELECT pg_temp.outlived('tx-3') AS held;
ROLLBACK;
BEGIN;
SET LOCAL idempotency.defer_writes = off;
SELECT pg_temp.outlived('tx-4') AS written;
ROLLBACK;

-- shortcuts off: the same answers as above for a committed claim
SET idempotency.direct_reads = off;
SELECT outcome, token = (SELECT token FROM seen WHERE name = 'k6-second') AS same_token
  FROM idem_claim('re', 'k6', holder => 'run-2');
SELECT outcome, token FROM idem_claim('re', 'k6', holder => 'run-1');
RESET idempotency.direct_reads;

-- with tenant isolation on, a tenant's session re-enters its own claims only
CREATE ROLE idem_re_app LOGIN;
GRANT USAGE ON SCHEMA public TO idem_re_app;
GRANT EXECUTE ON FUNCTION idem_claim,
                          idem_complete(text, text, bigint, jsonb),
                          idem_lookup(text, text)
    TO idem_re_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_records TO idem_re_app;
SELECT idem_set_tenant_isolation(true);
SET ROLE idem_re_app;
SET app.tenant = 'shop-1';
SELECT token AS shop_token FROM idem_claim('shop-1', 'order', lease => '1 hour', holder => 'exec-1') \gset
SELECT outcome, token = :shop_token AS same_token FROM idem_claim('shop-1', 'order', holder => 'exec-1');
SELECT outcome FROM idem_claim('shop-1', 'order', holder => 'exec-2');
SELECT status, holder FROM idem_lookup('shop-1', 'order');
BEGIN;
SELECT token AS held_token FROM idem_claim('shop-1', 'held', holder => 'exec-1') \gset
SELECT outcome, token = :held_token AS same_token FROM idem_claim('shop-1', 'held', holder => 'exec-1');
COMMIT;
SELECT outcome FROM idem_claim('shop-2', 'order', holder => 'exec-1');
SET app.tenant = 'shop-2';
SELECT count(*) AS other_tenant_sees FROM idem_lookup('shop-1', 'order');
SELECT outcome FROM idem_claim('shop-2', 'order', holder => 'exec-1');
RESET app.tenant;
RESET ROLE;
SELECT idem_set_tenant_isolation(false);
REVOKE ALL ON FUNCTION idem_claim,
                       idem_complete(text, text, bigint, jsonb),
                       idem_lookup(text, text)
    FROM idem_re_app;
REVOKE ALL ON idempotency_records FROM idem_re_app;
REVOKE USAGE ON SCHEMA public FROM idem_re_app;
DROP ROLE idem_re_app;

-- idem_claim_many takes no holder
SELECT outcome FROM idem_claim_many('re', ARRAY['m1'], holder => 'run-1');

DROP TABLE seen, answers;
TRUNCATE idempotency_records;
