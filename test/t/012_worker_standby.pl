# On a hot standby the sweeper does nothing (no process, no error, records
# untouched); once the standby is promoted it starts sweeping without a
# restart.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
# the primary does not sweep, so that expired records reach the standby
$primary->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.sweep_interval = 0
lc_messages = 'C'
});
$primary->start;
$primary->safe_psql('postgres', 'CREATE DATABASE app');
$primary->safe_psql('app', 'CREATE EXTENSION idempotency');

$primary->backup('backup');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'backup', has_streaming => 1);
$standby->append_conf('postgresql.conf', 'idempotency.sweep_interval = 1s');
$standby->start;

$primary->safe_psql('app', q{
	INSERT INTO idempotency_records
		(token, expires_at, created_at, updated_at, ttl, tenant_id, key, status)
	SELECT 1, now() - interval '1 hour', now(), now(), interval '1 hour',
		'tenant', 'old-' || g, 'completed'
	FROM generate_series(1, 1000) g;
	SELECT idem_claim('tenant', 'live', lease => '1 hour');
});
$primary->wait_for_catchup($standby, 'replay');

is($standby->safe_psql('app', 'SELECT pg_is_in_recovery()'), 't', 'the standby is in recovery');
is($standby->safe_psql('app', 'SELECT count(*) FROM idempotency_records'),
	1001, 'the expired records have reached the standby');

# several sweep intervals go by on the standby
my $log_offset = -s $standby->logfile;
sleep 3;
is( $standby->safe_psql('postgres', q{
		SELECT count(*) FROM pg_stat_activity
		WHERE backend_type LIKE 'idempotency sweeper%'}),
	0, 'no sweeper process runs on the standby');
is($standby->safe_psql('app', 'SELECT count(*) FROM idempotency_records'),
	1001, 'the standby leaves the records alone');
ok( !$standby->log_contains(
		qr/sweeper launcher started|background worker|ERROR|FATAL|WARNING/, $log_offset),
	'and keeps quiet about it');

$standby->promote;
ok( $standby->poll_query_until(
		'postgres', q{
		SELECT count(*) = 1 FROM pg_stat_activity
		WHERE backend_type = 'idempotency sweeper launcher'}),
	'after promotion the launcher runs, without a restart');
ok( $standby->poll_query_until(
		'app', q{SELECT count(*) = 1 AND bool_and(key = 'live') FROM idempotency_records}),
	'the promoted server sweeps the expired records and keeps the live claim');

$standby->stop;
$primary->stop;
done_testing();
