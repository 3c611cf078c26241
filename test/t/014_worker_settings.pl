# The sweeper's settings: a reload (SIGHUP) changes the interval at once and
# sweep_interval = 0 switches sweeping off; invalid values are refused with
# a clear message, in SQL and in postgresql.conf; with no free worker slot
# the launcher warns (once) and sweeps when slots are there again.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('settings');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.sweep_interval = 1h
lc_messages = 'C'
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

sub add_expired
{
	my ($n, $prefix) = @_;
	$node->safe_psql('postgres', qq{
		INSERT INTO idempotency_records
			(token, expires_at, created_at, updated_at, ttl, tenant_id, key, status)
		SELECT 1, now() - interval '1 hour', now(), now(), interval '1 hour',
			'tenant', '$prefix-' || g, 'completed'
		FROM generate_series(1, $n) g});
}

sub expired_left
{
	return $node->safe_psql('postgres',
		'SELECT count(*) FROM idempotency_records WHERE expires_at < now()');
}

sub launcher_says
{
	my ($pattern) = @_;
	return $node->poll_query_until('postgres', qq{
		SELECT count(*) = 1 FROM pg_stat_activity
		WHERE backend_type = 'idempotency sweeper launcher' AND query LIKE '$pattern'});
}

sub set_and_reload
{
	my ($name, $value) = @_;
	$node->safe_psql('postgres', "ALTER SYSTEM SET idempotency.$name = '$value'");
	$node->reload;
}

# ---------- reload changes the interval at once ----------

# the first round runs at start; the next would be an hour later
ok(launcher_says('waiting for the next sweep round'), 'first round done, next in an hour');
my $launcher = $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency sweeper launcher'");
add_expired(200, 'a');
sleep 2;
is(expired_left(), 200, 'with sweep_interval = 1h nothing is swept for now');

set_and_reload('sweep_interval', '1s');
ok($node->poll_query_until('postgres', 'SELECT count(*) = 0 FROM idempotency_records'),
	'pg_reload_conf() with sweep_interval = 1s: swept without waiting out the hour');

# ---------- 0 switches sweeping off ----------

set_and_reload('sweep_interval', '0');
ok(launcher_says('sweeping is off%'), 'sweep_interval = 0: the launcher reports sweeping is off');
add_expired(200, 'b');
sleep 3;
is(expired_left(), 200, 'sweep_interval = 0: nothing is swept');
is( $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency sweeper launcher'"),
	$launcher, 'the launcher stays, idle, and is the same process');

set_and_reload('sweep_interval', '1s');
ok($node->poll_query_until('postgres', 'SELECT count(*) = 0 FROM idempotency_records'),
	'sweep_interval back to 1s: swept again');

# a sub-second interval is kept as it is, not rounded down to 0 (= off)
set_and_reload('sweep_interval', '500ms');
is($node->safe_psql('postgres', 'SHOW idempotency.sweep_interval'), '500ms',
	'sweep_interval = 500ms is kept');
add_expired(200, 'c');
ok($node->poll_query_until('postgres', 'SELECT count(*) = 0 FROM idempotency_records'),
	'sweep_interval = 500ms: swept');
set_and_reload('sweep_interval', '1s');

# ---------- invalid values are refused ----------

# PostgreSQL 17 prints the unit on both range bounds and refuses a misspelt
# name under a reserved prefix in ALTER SYSTEM as an invalid name
my $v17 = $node->pg_version >= 17;

my @refused = (
	[ q{ALTER SYSTEM SET idempotency.sweep_interval = -1},
		$v17
		? qr/-1 ms is outside the valid range for parameter "idempotency.sweep_interval" \(0 ms \.\. 86400000 ms\)/
		: qr/-1 ms is outside the valid range for parameter "idempotency.sweep_interval" \(0 \.\. 86400000\)/ ],
	[ q{ALTER SYSTEM SET idempotency.sweep_interval = 'often'},
		qr/invalid value for parameter "idempotency.sweep_interval": "often"/ ],
	[ q{ALTER SYSTEM SET idempotency.sweep_interval = '2 days'},
		qr/invalid value for parameter "idempotency.sweep_interval": "2 days"/ ],
	[ q{ALTER SYSTEM SET idempotency.sweep_interval = '25h'},
		qr/outside the valid range for parameter "idempotency.sweep_interval"/ ],
	[ q{ALTER SYSTEM SET idempotency.sweep_batch_size = 0},
		qr/0 is outside the valid range for parameter "idempotency.sweep_batch_size" \(1 \.\. 1000000\)/ ],
	[ q{SET idempotency.sweep_interval = 5},
		qr/parameter "idempotency.sweep_interval" cannot be changed now/ ],
	[ q{SET idempotency.sweep_intervall = 5},
		qr/invalid configuration parameter name "idempotency.sweep_intervall"/ ],
	[ q{ALTER SYSTEM SET idempotency.sweep_intervall = 5},
		$v17
		? qr/invalid configuration parameter name "idempotency.sweep_intervall"\nDETAIL:  "idempotency" is a reserved prefix\./
		: qr/unrecognized configuration parameter "idempotency.sweep_intervall"/ ],);
for my $case (@refused)
{
	my ($sql, $message) = @$case;
	my ($rc, $out, $err) = $node->psql('postgres', $sql);
	ok($rc != 0 && $err =~ $message, "refused: $sql") or diag($err);
}
is($node->safe_psql('postgres', 'SHOW idempotency.sweep_interval'), '1s',
	'the interval is unchanged');

# a bad value in postgresql.conf: the reload logs it and keeps the old value
my $log_offset = -s $node->logfile;
$node->append_conf('postgresql.conf', "idempotency.sweep_batch_size = 'lots'");
$node->reload;
ok( $node->wait_for_log(
		qr/invalid value for parameter "idempotency.sweep_batch_size": "lots"/, $log_offset),
	'a bad value in postgresql.conf is reported in the log');
is($node->safe_psql('postgres', 'SHOW idempotency.sweep_batch_size'), '1000',
	'and the old value stays in force');
add_expired(200, 'c');
ok($node->poll_query_until('postgres', 'SELECT count(*) = 0 FROM idempotency_records'),
	'sweeping goes on');
$node->adjust_conf('postgresql.conf', 'idempotency.sweep_batch_size', '1000');

# ---------- no free worker slot ----------

# the launcher takes the only slot (the logical replication launcher,
# which would take one more, is switched off): no worker can be started
$node->append_conf('postgresql.conf', qq{
max_logical_replication_workers = 0
max_worker_processes = 1
});
$log_offset = -s $node->logfile;
$node->restart;
add_expired(200, 'd');
ok($node->wait_for_log(qr/no background worker slot is free/, $log_offset),
	'max_worker_processes = 1: the launcher warns that no worker slot is free');
sleep 3;
my @warnings = (slurp_file($node->logfile, $log_offset) =~ /no background worker slot is free/g);
is(scalar @warnings, 1, 'the warning is not repeated every interval');
is(expired_left(), 200, 'nothing was swept');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency sweeper launcher'"),
	1, 'the launcher keeps running');

$node->adjust_conf('postgresql.conf', 'max_worker_processes', '2');
$node->restart;
ok($node->poll_query_until('postgres', 'SELECT count(*) = 0 FROM idempotency_records'),
	'max_worker_processes = 2 (the documented need): swept');

$node->stop;
done_testing();
