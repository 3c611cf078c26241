-- idem_stats: counters in shared memory (the test instance preloads the library).
SELECT idem_stats_reset();
SELECT claims, claimed, replays, in_progress, mismatches, failed_replays, takeovers,
       completes, releases, heartbeats, swept_stale, swept_expired
FROM idem_stats WHERE datname = current_database();

SELECT token AS t FROM idem_claim('st', 'a', 'fp') \gset
SELECT outcome FROM idem_claim('st', 'a', 'fp');                  -- in_progress
SELECT idem_heartbeat('st', 'a', :t) IS NOT NULL;
SELECT idem_complete('st', 'a', :t, '{}');
SELECT outcome FROM idem_claim('st', 'a', 'fp');                  -- replay
SELECT outcome FROM idem_claim('st', 'a', 'other');               -- mismatch
SELECT token AS t FROM idem_claim('st', 'b') \gset
SELECT idem_release('st', 'b', :t, '{"e": 1}');
SELECT outcome FROM idem_claim('st', 'b');                        -- failed
SELECT outcome FROM idem_claim('st', 'c', lease => '1 ms');
SELECT pg_sleep(0.02);
SELECT outcome FROM idem_claim('st', 'c');                        -- takeover
SELECT outcome FROM idem_claim('st', 'd', lease => '1 ms', ttl => '1 ms');
SELECT pg_sleep(0.02);
SELECT * FROM idem_sweep();
SELECT count(*) FROM idem_claim_many('st', ARRAY['e', 'f', 'e']);  -- 2 claimed, 1 in_progress

SELECT claims, claimed, replays, in_progress, mismatches, failed_replays, takeovers,
       completes, releases, heartbeats, swept_stale, swept_expired,
       last_sweep_at IS NOT NULL AS swept, sweeps, last_sweep_error
FROM idem_stats WHERE datname = current_database();

SELECT idem_stats_reset();
SELECT claims, stats_reset > now() - interval '1 minute' AS reset_recently
FROM idem_stats WHERE datname = current_database();

-- idempotency.track_stats = off stops counting (the benchmark measures the cost)
SET idempotency.track_stats = off;
SELECT outcome FROM idem_claim('st', 'untracked');
RESET idempotency.track_stats;
SELECT claims FROM idem_stats WHERE datname = current_database();

-- idempotency.claim_sweep: what a fresh claim removes counts as swept
-- (a stale claim in swept_stale, an expired record in swept_expired),
-- without a sweep pass
SELECT outcome FROM idem_claim('st-cs', 'k2', lease => '1 ms');
SELECT idem_complete('st-cs', 'k3', token, '{}') FROM idem_claim('st-cs', 'k3', ttl => '1 ms');
SELECT pg_sleep(0.02);
SELECT idem_stats_reset();
SET idempotency.claim_sweep = 8;
SELECT outcome FROM idem_claim('st-cs', 'k1');
RESET idempotency.claim_sweep;
SELECT claims, swept_stale, swept_expired, sweeps FROM idem_stats WHERE datname = current_database();
SELECT count(*) AS left_st_cs FROM idempotency_records WHERE tenant_id = 'st-cs';
DELETE FROM idempotency_records WHERE tenant_id = 'st-cs';

-- A reader sees only its own database's row, unless it has the privileges of
-- pg_read_all_stats (superusers have them).
\set regdb :DBNAME
CREATE DATABASE idem_stats_other;
\c idem_stats_other
CREATE EXTENSION idempotency;
SELECT outcome FROM idem_claim('st', 'elsewhere');
\c :regdb
CREATE ROLE idem_stats_reader;
GRANT EXECUTE ON FUNCTION idem_stats_read() TO idem_stats_reader;
GRANT SELECT ON idem_stats TO idem_stats_reader;
SELECT count(*) FILTER (WHERE datname = current_database()) AS this_database,
       count(*) FILTER (WHERE datname = 'idem_stats_other') AS other
FROM idem_stats;                                                   -- superuser: both
SET ROLE idem_stats_reader;
SELECT count(*) FILTER (WHERE datname = current_database()) AS this_database,
       count(*) FILTER (WHERE datname <> current_database()) AS others
FROM idem_stats;                                                   -- 1, 0
SELECT count(*) AS others FROM idem_stats_read() WHERE datid <> (
    SELECT oid FROM pg_database WHERE datname = current_database());  -- the function too
RESET ROLE;
GRANT pg_read_all_stats TO idem_stats_reader;
SET ROLE idem_stats_reader;
SELECT count(*) FILTER (WHERE datname = 'idem_stats_other') AS other FROM idem_stats;  -- 1
RESET ROLE;
DROP DATABASE idem_stats_other;
REVOKE ALL ON FUNCTION idem_stats_read() FROM idem_stats_reader;
REVOKE ALL ON idem_stats FROM idem_stats_reader;
DROP ROLE idem_stats_reader;
