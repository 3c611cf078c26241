-- idem_metrics() and idem_metrics_tenants(top) (1.3): every figure moves.
-- A database of its own, so that the gauges count only this file's records
-- and the counters start at zero.
\set regdb :DBNAME
CREATE DATABASE idem_metrics_db;
\c idem_metrics_db
CREATE EXTENSION idempotency;

-- one row, nothing counted yet
SELECT datname, claimed_total, replays_total, in_progress_total, mismatches_total,
       failed_total, takeovers_total, claims_in_progress, oldest_claim_age_seconds,
       stuck_claims, resumable_records, expired_unswept_records, sweeps_total,
       sweep_errors_total, last_sweep_at, last_sweep_seconds, last_sweep_removed,
       lock_table_used_ratio >= 0 AS ratio_ok
FROM idem_metrics();

-- claims, a replay, an in-progress answer, a mismatch, a failed replay, a takeover
SELECT token AS t FROM idem_claim('m', 'a', 'fp') \gset
SELECT outcome FROM idem_claim('m', 'a', 'fp');                   -- in_progress
SELECT claims_in_progress, stuck_claims, oldest_claim_age_seconds >= 0 AS age_ok
FROM idem_metrics();
SELECT idem_complete('m', 'a', :t, '{}');
SELECT outcome FROM idem_claim('m', 'a', 'fp');                   -- replay
SELECT replays_total, mismatches_total FROM idem_metrics();
SELECT outcome FROM idem_claim('m', 'a', 'other');                -- mismatch
SELECT token AS t FROM idem_claim('m', 'b') \gset
SELECT idem_release('m', 'b', :t, '{"e": 1}');
SELECT outcome FROM idem_claim('m', 'b');                         -- failed
SELECT claimed_total, replays_total, in_progress_total, mismatches_total, failed_total,
       takeovers_total, claims_in_progress
FROM idem_metrics();

-- a stuck claim: its lease ended, nobody took it over; its age grows
SELECT outcome FROM idem_claim('m', 'stuck', lease => '1 ms');
SELECT pg_sleep(0.05);
SELECT claims_in_progress, stuck_claims, oldest_claim_age_seconds AS age1
FROM idem_metrics() \gset
SELECT :claims_in_progress AS claims_in_progress, :stuck_claims AS stuck_claims,
       :age1 >= 0.05 AS at_least_the_sleep;
SELECT pg_sleep(0.05);
SELECT oldest_claim_age_seconds >= :age1 + 0.05 AS age_grew FROM idem_metrics();
-- the tenant view shows it too
SELECT tenant, claims_in_progress, oldest_claim_age_seconds >= :age1 AS age_ok
FROM idem_metrics_tenants() WHERE tenant = 'm';
-- a retry takes it over: no longer stuck
SELECT outcome FROM idem_claim('m', 'stuck');
SELECT takeovers_total, claims_in_progress, stuck_claims FROM idem_metrics();

-- a resumable record: a recovery point, lease ended
SELECT token AS t FROM idem_claim('m', 'multi', lease => '1 ms') \gset
SELECT idem_checkpoint('m', 'multi', :t, 'step-1');
SELECT pg_sleep(0.05);
SELECT claims_in_progress, stuck_claims, resumable_records FROM idem_metrics();

-- expired and not swept, then a sweep removes it
SELECT token AS t FROM idem_claim('m', 'short', ttl => '1 ms') \gset
SELECT idem_complete('m', 'short', :t, '{}');
SELECT pg_sleep(0.05);
SELECT expired_unswept_records, sweeps_total, last_sweep_at FROM idem_metrics();
SELECT expired_removed FROM idem_sweep();
SELECT expired_unswept_records, sweeps_total, sweep_errors_total,
       last_sweep_at > now() - interval '1 minute' AS swept_recently,
       last_sweep_seconds >= 0 AS seconds_ok, last_sweep_removed
FROM idem_metrics();

-- a tenant's conflicts: in-progress and mismatch answers, per tenant; a
-- claimed or replayed answer counts none
BEGIN;
SELECT outcome FROM idem_claim('noisy', 'x', 'f1');
SELECT (idem_claim('noisy', 'x', 'f1')).outcome, count(*)
FROM generate_series(1, 8) GROUP BY 1;                            -- 8 in_progress
SELECT outcome FROM idem_claim('noisy', 'x', 'f2');               -- mismatch
SELECT outcome, count(*) FROM idem_claim_many('noisy', ARRAY['y', 'y'])
GROUP BY 1 ORDER BY 1;                                            -- claimed, in_progress
SELECT outcome FROM idem_claim('noisy', 'z', 'f1');               -- claimed: no conflict
ROLLBACK;
SELECT outcome FROM idem_claim('m', 'a', 'fp');                   -- replay: no conflict
SELECT tenant, claims_in_progress, conflicts_total FROM idem_metrics_tenants(3) ORDER BY tenant;

-- The bound: the conflict table keeps 128 tenants (server-wide); 300 more
-- tenants with one conflict each do not push out the heaviest one, and a
-- caller never gets more than top rows.
BEGIN;
SELECT count(*) FROM generate_series(1, 300) i,
       LATERAL (SELECT idem_claim('t' || i, 'k', 'f1'), idem_claim('t' || i, 'k', 'f2')) c;
ROLLBACK;
SELECT count(*) <= 100 AS bounded, max(conflicts_total) AS heaviest
FROM idem_metrics_tenants(100);
SELECT tenant, conflicts_total FROM idem_metrics_tenants(100)
ORDER BY conflicts_total DESC LIMIT 1;
-- first the busiest by claims in progress and the busiest by conflicts
SELECT tenant FROM idem_metrics_tenants(2);
SELECT count(*) FROM idem_metrics_tenants(50);
SELECT count(*) FROM idem_metrics_tenants(5);
SELECT count(*) FROM idem_metrics_tenants();                      -- default 10

-- idem_stats_reset() forgets this database's tenants too
SELECT idem_stats_reset();
SELECT claimed_total, stats_reset > now() - interval '1 minute' AS reset_recently FROM idem_metrics();
SELECT tenant, claims_in_progress, conflicts_total FROM idem_metrics_tenants(100)
ORDER BY tenant;

-- bad input: top outside 1 .. 100
\set VERBOSITY sqlstate
SELECT * FROM idem_metrics_tenants(0);
SELECT * FROM idem_metrics_tenants(101);
SELECT * FROM idem_metrics_tenants(NULL);
\set VERBOSITY default
SELECT * FROM idem_metrics_tenants(-1);

-- the lock table's fill moves with the locks a transaction holds
SELECT lock_table_used_ratio AS before FROM idem_metrics() \gset
BEGIN;
SELECT count(pg_advisory_xact_lock(i)) FROM generate_series(1, 2000) i;
SELECT lock_table_used_ratio > :before + 0.05 AS grew,
       lock_table_used_ratio < 1 AS below_one
FROM idem_metrics();
COMMIT;

-- Who may call: pg_monitor (not PUBLIC); a member counts every tenant's
-- records under tenant isolation, without any right on the table.
SELECT idem_set_tenant_isolation(true, 'app.tenant');
SELECT outcome FROM idem_claim('other', 'k');
CREATE ROLE idem_metrics_mon IN ROLE pg_monitor;
CREATE ROLE idem_metrics_nobody;
-- the owner (the superuser running this test, whatever its name) and pg_monitor
SELECT p.proname,
       CASE WHEN a.grantee = p.proowner AND p.proowner = current_user::regrole
            THEN 'owner (current_user)' ELSE a.grantee::regrole::text END AS grantee,
       a.privilege_type
FROM pg_proc p, aclexplode(p.proacl) a
WHERE p.proname LIKE 'idem_metrics%' ORDER BY 1, 2;
SET ROLE idem_metrics_mon;
SELECT claims_in_progress, stuck_claims, resumable_records FROM idem_metrics();
SELECT tenant, claims_in_progress FROM idem_metrics_tenants(10) ORDER BY tenant;
SELECT count(*) FROM idempotency_records;                         -- no right on the table
RESET ROLE;
SET ROLE idem_metrics_nobody;
SELECT * FROM idem_metrics();
SELECT * FROM idem_metrics_tenants();
RESET ROLE;

\c :regdb
DROP DATABASE idem_metrics_db;
DROP ROLE idem_metrics_mon;
DROP ROLE idem_metrics_nobody;
