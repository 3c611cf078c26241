-- Leases, takeover, heartbeat, expiry of retention, stale_action.
CREATE TEMP TABLE seen (name text PRIMARY KEY, token bigint);

-- an expired lease is taken over: new token = old + 1
INSERT INTO seen SELECT 'zombie', token FROM idem_claim('t', 'lease-1', 'fp', lease => '10 ms');
SELECT pg_sleep(0.05);
INSERT INTO seen SELECT 'owner', token FROM idem_claim('t', 'lease-1', 'fp');
SELECT (SELECT token FROM seen WHERE name = 'owner') > (SELECT token FROM seen WHERE name = 'zombie')
       AS token_greater;

-- the zombie is fenced: complete, release and heartbeat fail with ID002 and change nothing
\set VERBOSITY sqlstate
SELECT idem_complete('t', 'lease-1', (SELECT token FROM seen WHERE name = 'zombie'), '{"by": "zombie"}');
SELECT idem_release('t', 'lease-1', (SELECT token FROM seen WHERE name = 'zombie'));
SELECT idem_heartbeat('t', 'lease-1', (SELECT token FROM seen WHERE name = 'zombie'));
\set VERBOSITY default
SELECT status, response, token = (SELECT token FROM seen WHERE name = 'owner') AS owner_token
FROM idempotency_records WHERE key = 'lease-1';

-- the owner completes; the zombie still cannot
SELECT idem_complete('t', 'lease-1', (SELECT token FROM seen WHERE name = 'owner'), '{"by": "owner"}');
\set VERBOSITY sqlstate
SELECT idem_complete('t', 'lease-1', (SELECT token FROM seen WHERE name = 'zombie'), '{"by": "zombie"}');
\set VERBOSITY default
SELECT outcome, response FROM idem_claim('t', 'lease-1', 'fp');

-- a stale claim with a different fingerprint is still a mismatch
SELECT outcome FROM idem_claim('t', 'lease-2', 'fp', lease => '1 ms');
SELECT pg_sleep(0.02);
SELECT outcome FROM idem_claim('t', 'lease-2', 'other');

-- heartbeat extends a live lease and returns the new end; no takeover then
INSERT INTO seen SELECT 'hb', token FROM idem_claim('t', 'lease-3', lease => '200 ms');
SELECT idem_heartbeat('t', 'lease-3', (SELECT token FROM seen WHERE name = 'hb'), lease => '1 hour')
       BETWEEN now() + interval '59 min' AND now() + interval '61 min' AS extended;
SELECT pg_sleep(0.3);
SELECT outcome FROM idem_claim('t', 'lease-3');
SELECT lease_expires_at = expires_at AS lease_is_expiry FROM idempotency_records WHERE key = 'lease-3';
-- heartbeat with the default lease (idempotency.lease)
SET idempotency.lease = '2min';
SELECT idem_heartbeat('t', 'lease-3', (SELECT token FROM seen WHERE name = 'hb'))
       BETWEEN now() + interval '110 s' AND now() + interval '130 s' AS default_lease;
RESET idempotency.lease;

-- a completed record whose retention expired counts as absent: claimed again,
-- token still grows, fingerprint check does not apply to the old request
INSERT INTO seen SELECT 'short', token FROM idem_claim('t', 'ttl-1', 'fp-old', ttl => '10 ms');
SELECT idem_complete('t', 'ttl-1', (SELECT token FROM seen WHERE name = 'short'), '{"old": true}');
SELECT pg_sleep(0.05);
SELECT outcome, token > (SELECT token FROM seen WHERE name = 'short') AS token_greater
FROM idem_claim('t', 'ttl-1', 'fp-new');
SELECT status, fingerprint, response FROM idempotency_records WHERE key = 'ttl-1';

-- the same for a failed record
SELECT token AS t FROM idem_claim('t', 'ttl-2', ttl => '10 ms') \gset
SELECT idem_release('t', 'ttl-2', :t, '{"error": "boom"}');
SELECT pg_sleep(0.05);
SELECT outcome FROM idem_claim('t', 'ttl-2');

-- the retention is the claim's ttl, applied when the record is completed
SELECT token AS t FROM idem_claim('t', 'ttl-3', ttl => '7 days') \gset
SELECT idem_complete('t', 'ttl-3', :t);
SELECT ttl, expires_at BETWEEN now() + interval '6 days 23 hours' AND now() + interval '7 days 1 hour' AS kept_7_days
FROM idempotency_records WHERE key = 'ttl-3';
-- default ttl from idempotency.ttl
SET idempotency.ttl = '1h';
SELECT token AS t FROM idem_claim('t', 'ttl-4') \gset
SELECT idem_complete('t', 'ttl-4', :t);
SELECT ttl FROM idempotency_records WHERE key = 'ttl-4';
RESET idempotency.ttl;

-- intervals count a day as 24 hours and a month as 30 days
SELECT token AS t FROM idem_claim('t', 'ttl-5', ttl => '1 mon 1 day') \gset
SELECT ttl FROM idempotency_records WHERE key = 'ttl-5';

-- stale_action = 'fail': an expired claim becomes failed instead of being taken over
SET idempotency.stale_action = 'fail';
SELECT outcome FROM idem_claim('t', 'stale-1', lease => '1 ms');
SELECT pg_sleep(0.02);
SELECT outcome, token, response FROM idem_claim('t', 'stale-1');
SELECT status, lease_expires_at, response FROM idempotency_records WHERE key = 'stale-1';
SELECT outcome, response FROM idem_claim('t', 'stale-1');
RESET idempotency.stale_action;

-- wait on a committed live lease: reports in_progress when the wait runs out
SELECT outcome FROM idem_claim('t', 'busy', lease => '1 hour');
SELECT outcome, clock_timestamp() - now() >= interval '100 ms' AS waited
FROM idem_claim('t', 'busy', wait => '120 ms');
-- ... and claims as soon as the lease expires within the wait
SELECT outcome FROM idem_claim('t', 'busy-2', lease => '50 ms');
SELECT outcome FROM idem_claim('t', 'busy-2', wait => '5 s');
