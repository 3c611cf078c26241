# The sweeper survives its own death: kill -9 of the launcher or of a
# per-database worker (the postmaster reinitialises and starts the launcher
# again), pg_terminate_backend of either, and pg_cancel_backend of a worker
# in mid-pass (the error is recorded, the next round carries on).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('crash');
$node->init;
# test clusters do not restart after a crash unless told to
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.sweep_interval = 1s
idempotency.sweep_batch_size = 10
restart_after_crash = on
lc_messages = 'C'
});
$node->start;
$node->safe_psql('postgres', 'CREATE DATABASE app');
# every batch takes 10 ms, so that a worker can be caught in mid-pass
$node->safe_psql('app', q{
	CREATE EXTENSION idempotency;
	CREATE FUNCTION slow_batch() RETURNS trigger LANGUAGE plpgsql
		AS 'BEGIN PERFORM pg_sleep(0.01); RETURN NULL; END';
	CREATE TRIGGER slow_batch AFTER DELETE ON idempotency_records
		FOR EACH STATEMENT EXECUTE FUNCTION slow_batch();
	SELECT idem_claim('tenant', 'live', lease => '1 hour');
});

sub add_expired
{
	my ($n, $prefix) = @_;
	$node->safe_psql('app', qq{
		INSERT INTO idempotency_records
			(token, expires_at, created_at, updated_at, ttl, tenant_id, key, status)
		SELECT 1, now() - interval '1 hour', now(), now(), interval '1 hour',
			'tenant', '$prefix-' || g, 'completed'
		FROM generate_series(1, $n) g});
}

sub wait_swept
{
	my ($what) = @_;
	ok( $node->poll_query_until(
			'app', q{SELECT count(*) = 1 AND bool_and(key = 'live') FROM idempotency_records}),
		"$what: sweeping resumes and finishes (the live claim is kept)");
}

sub pid_of
{
	my ($type) = @_;
	return $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = '$type'");
}

# After the reinitialisation, wait until the server takes connections
# again: a psql that poll_query_until starts meanwhile exits at once ("the
# database system is in recovery mode"), and IPC::Run then dies writing the
# query to its closed stdin (Broken pipe) instead of polling again.
sub wait_ready
{
	my ($offset) = @_;
	$node->wait_for_log(qr/database system is ready to accept connections/, $offset);
}

# poll until a process of this type runs with another pid than $old
sub wait_new_pid
{
	my ($type, $old) = @_;
	$node->poll_query_until('postgres', qq{
		SELECT count(*) = 1 FROM pg_stat_activity
		WHERE backend_type = '$type' AND pid <> $old})
	  or return undef;
	return pid_of($type);
}

sub wait_worker_mid_pass
{
	return $node->poll_query_until('postgres', q{
		SELECT count(*) = 1 FROM pg_stat_activity
		WHERE backend_type = 'idempotency sweeper' AND datname = 'app'
		  AND query LIKE 'sweeping idempotency_records: batch %'});
}

$node->poll_query_until('postgres', q{
	SELECT count(*) = 1 FROM pg_stat_activity
	WHERE backend_type = 'idempotency sweeper launcher'});

# ---------- kill -9 of the launcher ----------

my $launcher = pid_of('idempotency sweeper launcher');
my $log_offset = -s $node->logfile;
kill 'KILL', $launcher;
ok($node->wait_for_log(qr/all server processes terminated; reinitializing/, $log_offset),
	'kill -9 of the launcher: the postmaster reinitialises');
wait_ready($log_offset);
my $new_launcher = wait_new_pid('idempotency sweeper launcher', $launcher);
ok(defined $new_launcher, 'the launcher runs again');
add_expired(500, 'after-kill9-launcher');
wait_swept('after kill -9 of the launcher');

# ---------- kill -9 of a worker in mid-pass ----------

add_expired(2000, 'kill9-worker');
ok(wait_worker_mid_pass(), 'a worker is in mid-pass');
my $worker = pid_of('idempotency sweeper');
$launcher = pid_of('idempotency sweeper launcher');
$log_offset = -s $node->logfile;
kill 'KILL', $worker;
ok($node->wait_for_log(qr/all server processes terminated; reinitializing/, $log_offset),
	'kill -9 of a worker: the postmaster reinitialises');
wait_ready($log_offset);
ok(defined wait_new_pid('idempotency sweeper launcher', $launcher),
	'the launcher runs again');
wait_swept('after kill -9 of a worker');

# ---------- pg_terminate_backend of the launcher ----------

$launcher = pid_of('idempotency sweeper launcher');
$node->safe_psql('postgres', "SELECT pg_terminate_backend($launcher)");
ok(defined wait_new_pid('idempotency sweeper launcher', $launcher),
	'pg_terminate_backend of the launcher: the postmaster starts it again');
add_expired(500, 'after-terminate-launcher');
wait_swept('after pg_terminate_backend of the launcher');

# ---------- pg_terminate_backend of a worker ----------

add_expired(2000, 'terminate-worker');
ok(wait_worker_mid_pass(), 'a worker is in mid-pass');
$worker = pid_of('idempotency sweeper');
$launcher = pid_of('idempotency sweeper launcher');
$node->safe_psql('postgres', "SELECT pg_terminate_backend($worker)");
wait_swept('after pg_terminate_backend of a worker');
is(pid_of('idempotency sweeper launcher'), $launcher,
	'the launcher was not disturbed');

# ---------- pg_cancel_backend of a worker ----------

add_expired(2000, 'cancel-worker');
ok(wait_worker_mid_pass(), 'a worker is in mid-pass');
my $sweeps = $node->safe_psql('app',
	"SELECT sweeps FROM idem_stats WHERE datname = 'app'");
$worker = pid_of('idempotency sweeper');
$node->safe_psql('postgres', "SELECT pg_cancel_backend($worker)");
ok( $node->poll_query_until(
		'app', qq{
		SELECT last_sweep_error = 'canceling statement due to user request'
		FROM idem_stats WHERE datname = 'app' AND sweeps > $sweeps}),
	'pg_cancel_backend: the cancelled pass is recorded with its error');
wait_swept('after pg_cancel_backend of a worker');
ok( $node->poll_query_until(
		'app',
		"SELECT last_sweep_error IS NULL FROM idem_stats WHERE datname = 'app'"),
	'the next pass clears the error');

$node->stop;
done_testing();
