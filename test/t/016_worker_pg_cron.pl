# Sweeping with pg_cron instead of the worker: the worker is switched off
# (sweep_interval = 0) and pg_cron runs SELECT idem_sweep() in the
# application database on a schedule.  pg_cron 1.4 (Debian bookworm)
# schedules by the minute, so this test waits for the next minute boundary.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('cron');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'pg_cron,idempotency'
cron.database_name = 'postgres'
# jobs run in background workers, so no TCP connection or password is needed
cron.use_background_workers = on
idempotency.sweep_interval = 0
lc_messages = 'C'
});
$node->start;

$node->safe_psql('postgres', 'CREATE EXTENSION pg_cron');
$node->safe_psql('postgres', 'CREATE DATABASE app');
$node->safe_psql('app', q{
	CREATE EXTENSION idempotency;
	INSERT INTO idempotency_records
		(token, expires_at, created_at, updated_at, ttl, tenant_id, key, status)
	SELECT 1, now() - interval '1 hour', now(), now(), interval '1 hour',
		'tenant', 'old-' || g, 'completed'
	FROM generate_series(1, 1000) g;
	SELECT idem_claim('tenant', 'stale', lease => '1 millisecond');
	SELECT idem_claim('tenant', 'live', lease => '1 hour');
});

ok( $node->poll_query_until(
		'postgres', q{
		SELECT query = 'sweeping is off (idempotency.sweep_interval = 0)'
		FROM pg_stat_activity WHERE backend_type = 'idempotency sweeper launcher'}),
	'the worker is switched off');

my $job = $node->safe_psql('postgres', q{
	SELECT cron.schedule_in_database('idempotency-sweep', '* * * * *',
									 'SELECT idem_sweep()', 'app')});
like($job, qr/^\d+$/, 'idem_sweep() is scheduled every minute in database app');

# the first run comes at the next minute boundary
ok( $node->poll_query_until(
		'postgres', qq{
		SELECT count(*) > 0 FROM cron.job_run_details
		WHERE jobid = $job AND status IN ('succeeded', 'failed')}),
	'pg_cron has run the job');
is( $node->safe_psql('postgres', qq{
		SELECT status || ': ' || return_message FROM cron.job_run_details
		WHERE jobid = $job ORDER BY runid LIMIT 1}),
	'succeeded: SELECT 1',
	'the scheduled idem_sweep() succeeded');
is( $node->safe_psql('app', q{SELECT string_agg(key, ',') FROM idempotency_records}),
	'live', 'it removed the expired records and the stale claim, and kept the live claim');
is( $node->safe_psql('app', q{
		SELECT swept_expired, swept_stale, sweeps >= 1 FROM idem_stats WHERE datname = 'app'}),
	'1000|1|t', 'the sweep is counted in idem_stats');

$node->stop;
done_testing();
