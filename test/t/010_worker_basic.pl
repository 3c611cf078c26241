# The background sweeper on one server: which databases it sweeps and which
# it leaves alone, what a sweep does to each kind of record, databases and
# the extension created and dropped while it runs, and an error in one
# database that does not stop the others.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('sweeper');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
# off while the databases are set up, so that none is swept half-prepared
idempotency.sweep_interval = 0
lc_messages = 'C'
});
$node->start;

# n completed records whose retention ended an hour ago
sub add_expired
{
	my ($db, $n, $prefix) = @_;
	$node->safe_psql($db, qq{
		INSERT INTO idempotency_records
			(token, expires_at, created_at, updated_at, ttl, tenant_id, key, status)
		SELECT 1, now() - interval '1 hour', now(), now(), interval '1 hour',
			'tenant', '$prefix-' || g, 'completed'
		FROM generate_series(1, $n) g});
}

sub count_rows
{
	my ($db, $where) = @_;
	return $node->safe_psql($db,
		"SELECT count(*) FROM idempotency_records WHERE $where");
}

sub wait_swept
{
	my ($db, $what) = @_;
	ok( $node->poll_query_until(
			$db, "SELECT count(*) = 0 FROM idempotency_records WHERE expires_at < now()"),
		"$what: expired records in $db are swept");
}

# sweeps recorded for a database (the statistics count every finished pass)
sub sweeps_of
{
	my ($db) = @_;
	return $node->safe_psql('postgres',
		"SELECT coalesce(max(sweeps), 0) FROM idem_stats WHERE datname = '$db'");
}

# wait until the launcher has completed at least two more rounds, seen
# through the sweep count of a database every round visits
sub wait_two_rounds
{
	my $before = sweeps_of('postgres');
	ok( $node->poll_query_until(
			'postgres',
			"SELECT coalesce(max(sweeps), 0) >= $before + 2 FROM idem_stats WHERE datname = 'postgres'"),
		'two more sweep rounds went by');
}

# ---------- the launcher ----------

ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity
		 WHERE backend_type = 'idempotency sweeper launcher' AND datid IS NULL"),
	'one launcher runs, connected to no database');

# the postgres database carries the extension too: its sweep count shows
# that rounds go by
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

# ---------- what a sweep does to each kind of record ----------

for my $db (qw(app1 app2))
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
}
# stale claims in app2 become failed records: the worker honours settings
# given to its database
$node->safe_psql('postgres',
	"ALTER DATABASE app2 SET idempotency.stale_action = 'fail'");

for my $db (qw(app1 app2))
{
	$node->safe_psql($db, q{
		SELECT idem_claim('t', 'stale', lease => '1 millisecond');
		SELECT idem_claim('t', 'live', lease => '1 hour');
		SELECT idem_complete('t', 'kept', (idem_claim('t', 'kept', ttl => '1 hour')).token);
		SELECT idem_complete('t', 'done', (idem_claim('t', 'done', ttl => '1 millisecond')).token,
							 '{"ok": true}');
	});
	add_expired($db, 2500, 'old');
}

# databases it must leave alone (checked below)
# no extension, but a table of the same name full of "expired" rows
$node->safe_psql('postgres', 'CREATE DATABASE plain');
$node->safe_psql('plain', q{
	CREATE TABLE idempotency_records (key text, status text, expires_at timestamptz);
	INSERT INTO idempotency_records
	SELECT 'k' || g, 'completed', now() - interval '1 day' FROM generate_series(1, 100) g;
});
# the extension, but a template, or closed to connections
for my $db (qw(tmpl closed))
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
	add_expired($db, 100, 'old');
}
$node->safe_psql('postgres', 'ALTER DATABASE tmpl IS_TEMPLATE true');
$node->safe_psql('postgres', 'ALTER DATABASE closed ALLOW_CONNECTIONS false');

$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.sweep_interval = '1s'});
$node->reload;

for my $db (qw(app1 app2))
{
	ok( $node->poll_query_until(
			$db, "SELECT count(*) = 0 FROM idempotency_records
				  WHERE key LIKE 'old-%' OR key = 'done'"),
		"$db: completed records past their retention are deleted");
	is(count_rows($db, "key = 'live' AND status = 'processing'"),
		1, "$db: a live claim is kept");
	is(count_rows($db, "key = 'kept' AND status = 'completed'"),
		1, "$db: a record within its retention is kept");
}
ok($node->poll_query_until('app1', "SELECT count(*) = 0 FROM idempotency_records WHERE key = 'stale'"),
	'app1: a stale claim is released (stale_action = release)');
ok( $node->poll_query_until(
		'app2',
		"SELECT count(*) = 1 FROM idempotency_records WHERE key = 'stale' AND status = 'failed'"),
	'app2: a stale claim is failed (ALTER DATABASE ... SET stale_action = fail)');

my $stats = $node->safe_psql('postgres', q{
	SELECT datname, swept_expired >= 2501, swept_stale = 1, last_sweep_at IS NOT NULL,
		   last_sweep_error IS NULL, sweeps > 0
	FROM idem_stats WHERE datname IN ('app1', 'app2') ORDER BY datname});
is($stats, "app1|t|t|t|t|t\napp2|t|t|t|t|t",
	'idem_stats shows the last sweep of each database');

# ---------- databases it must leave alone ----------


wait_two_rounds();
is(count_rows('plain', 'true'), 100, 'a database without the extension is untouched');
is(count_rows('tmpl', 'true'), 100, 'a template database is untouched');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM idem_stats WHERE datname IN ('plain', 'tmpl', 'closed')"),
	0, 'no sweep is recorded for them');

# ---------- created and dropped while it runs ----------

$node->safe_psql('postgres', 'CREATE DATABASE app3');
$node->safe_psql('app3', 'CREATE EXTENSION idempotency');
add_expired('app3', 500, 'old');
wait_swept('app3', 'CREATE DATABASE and CREATE EXTENSION without a restart');

$node->safe_psql('app1', 'DROP EXTENSION idempotency');
wait_two_rounds();
$node->safe_psql('app1', 'CREATE EXTENSION idempotency');
add_expired('app1', 500, 'again');
wait_swept('app1', 'DROP EXTENSION then CREATE EXTENSION');

my ($rc, $out, $err) = $node->psql('postgres', 'DROP DATABASE app1');
is($rc, 0, 'DROP DATABASE of a swept database succeeds');
add_expired('app3', 500, 'after-drop');
wait_swept('app3', 'after DROP DATABASE');

# ---------- an error in one database does not stop the others ----------

my $log_offset = -s $node->logfile;
$node->safe_psql('app2',
	'ALTER TABLE idempotency_records RENAME COLUMN expires_at TO broken_expires_at');
add_expired('app3', 500, 'while-broken');
wait_swept('app3', 'while app2 is broken');
ok( $node->poll_query_until(
		'postgres',
		"SELECT last_sweep_error LIKE '%idempotency_records%no longer has the shape%'
		 FROM idem_stats WHERE datname = 'app2'"),
	'the error is recorded as the last sweep of app2');
ok($node->wait_for_log(qr/idempotency sweep of database "app2"/, $log_offset),
	'the error is logged, naming the database');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency sweeper launcher'"),
	1, 'the launcher is still running');

$node->safe_psql('app2',
	'ALTER TABLE idempotency_records RENAME COLUMN broken_expires_at TO expires_at');
add_expired('app2', 300, 'repaired');
wait_swept('app2', 'after the repair');
ok( $node->poll_query_until(
		'postgres',
		"SELECT last_sweep_error IS NULL FROM idem_stats WHERE datname = 'app2'"),
	'a successful sweep clears the error');

# ---------- a database closed to connections stays untouched ----------

$node->safe_psql('postgres', 'ALTER SYSTEM SET idempotency.sweep_interval = 0');
$node->reload;
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity
		 WHERE backend_type = 'idempotency sweeper launcher'
		   AND query LIKE 'sweeping is off%'"),
	'sweeping switched off');
$node->safe_psql('postgres', 'ALTER DATABASE closed ALLOW_CONNECTIONS true');
is(count_rows('closed', 'true'), 100,
	'a database that does not allow connections was untouched');

$node->stop;
done_testing();
