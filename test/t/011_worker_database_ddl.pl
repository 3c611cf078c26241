# The sweeper never stands in an operator's way: CREATE DATABASE ... TEMPLATE,
# ALTER DATABASE ... RENAME and DROP DATABASE (without FORCE) all need the
# database to themselves, and all succeed while a sweeper worker is in the
# middle of a long pass over that very database.
#
# The backlog is swept in tiny batches, each slowed down by a statement
# trigger, so that a pass lasts well over the 5 seconds these commands wait
# for other sessions to leave: a worker that stayed for its whole pass would
# make them fail.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $node = PostgreSQL::Test::Cluster->new('ddl');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.sweep_interval = 0
idempotency.sweep_batch_size = 10
lc_messages = 'C'
});
$node->start;

# 3000 rows in batches of 10, 50 ms each: a pass takes at least 15 s
my $backlog = 3000;

sub load_backlog
{
	my ($db) = @_;
	$node->safe_psql($db, qq{
		-- slow in src only: its copy must not keep the worker from src
		CREATE FUNCTION slow_batch() RETURNS trigger LANGUAGE plpgsql AS \$\$
		BEGIN
			IF current_database() LIKE 'src%' THEN PERFORM pg_sleep(0.05); END IF;
			RETURN NULL;
		END \$\$;
		CREATE TRIGGER slow_batch AFTER DELETE ON idempotency_records
			FOR EACH STATEMENT EXECUTE FUNCTION slow_batch();
		INSERT INTO idempotency_records
			(token, expires_at, created_at, updated_at, ttl, tenant_id, key, status)
		SELECT 1, now() - interval '1 hour', now(), now(), interval '1 hour',
			'tenant', 'old-' || g, 'completed'
		FROM generate_series(1, $backlog) g;
		SELECT idem_claim('tenant', 'live', lease => '1 hour');
	});
}

# wait until a sweeper worker is sweeping database $db, batch after batch
sub wait_worker_in
{
	my ($db) = @_;
	return $node->poll_query_until('postgres', qq{
		SELECT count(*) = 1 FROM pg_stat_activity
		WHERE backend_type = 'idempotency sweeper' AND datname = '$db'
		  AND query LIKE 'sweeping idempotency_records: batch %'});
}

# run a command, return (exit code, stderr, seconds)
sub timed_psql
{
	my ($sql) = @_;
	my $t0 = time;
	my ($rc, $out, $err) = $node->psql('postgres', $sql);
	return ($rc, $err, time - $t0);
}

$node->safe_psql('postgres', 'CREATE DATABASE src');
$node->safe_psql('src', 'CREATE EXTENSION idempotency');
load_backlog('src');

$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.sweep_interval = '1s'});
$node->reload;

# ---------- CREATE DATABASE ... TEMPLATE ----------

ok(wait_worker_in('src'), 'a worker is sweeping src');
is( $node->safe_psql('postgres', q{
		SELECT query FROM pg_stat_activity
		WHERE backend_type = 'idempotency sweeper launcher'}),
	'sweeping database "src"',
	'pg_stat_activity shows which database the launcher is sweeping');
my ($rc, $err, $secs) = timed_psql('CREATE DATABASE copy1 TEMPLATE src');
is($rc, 0, 'CREATE DATABASE copy1 TEMPLATE src succeeds while the worker sweeps src')
  or diag($err);
note(sprintf('CREATE DATABASE ... TEMPLATE took %.2f s', $secs));

my $left = $node->safe_psql('src', 'SELECT count(*) FROM idempotency_records');
cmp_ok($left, '>', 1, 'the pass over src was not over yet');

# ---------- ALTER DATABASE ... RENAME ----------

ok(wait_worker_in('src'), 'the next round sweeps src again');
($rc, $err, $secs) = timed_psql('ALTER DATABASE src RENAME TO src_renamed');
is($rc, 0, 'ALTER DATABASE src RENAME succeeds while the worker sweeps it')
  or diag($err);
note(sprintf('ALTER DATABASE ... RENAME took %.2f s', $secs));

# ---------- DROP DATABASE without FORCE ----------

ok(wait_worker_in('src_renamed'), 'the next round sweeps the renamed database');
($rc, $err, $secs) = timed_psql('DROP DATABASE src_renamed');
is($rc, 0, 'DROP DATABASE (without FORCE) succeeds while the worker sweeps it')
  or diag($err);
note(sprintf('DROP DATABASE took %.2f s', $secs));

# ---------- the copy is a normal database that gets swept ----------

$node->safe_psql('postgres', 'ALTER SYSTEM SET idempotency.sweep_batch_size = 5000');
$node->reload;
ok( $node->poll_query_until(
		'copy1', q{SELECT count(*) = 1 AND bool_and(key = 'live') FROM idempotency_records}),
	'the copy is swept to the end (after raising sweep_batch_size by reload)');

ok( !$node->log_contains('is being accessed by other users'),
	'no command was refused because of the sweeper');

$node->stop;
done_testing();
