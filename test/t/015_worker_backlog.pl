# A 200,000-record expired backlog is worked off by the worker in batches of
# idempotency.sweep_batch_size, each its own short transaction, while
# pgbench keeps claiming new keys.  Reports the sweep rate and the slowest
# claim that completed during the sweep (figures only: timings are not
# asserted; they depend on the machine).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time sleep);

my $backlog = 200_000;
my $pgbench_seconds = 15;

my $node = PostgreSQL::Test::Cluster->new('backlog');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.sweep_interval = 0
idempotency.sweep_batch_size = 1000
shared_buffers = 128MB
fsync = on
lc_messages = 'C'
# the test cluster logs every statement by default: not 50,000 claims
log_statement = none
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

# Completed records whose retention ended over the last ~35 minutes, one
# every 10 ms, as a day of traffic leaves them; then what autovacuum would
# have done by then.
$node->safe_psql('postgres', qq{
	INSERT INTO idempotency_records
		(token, expires_at, created_at, updated_at, ttl, tenant_id, key, status, response)
	SELECT g, now() - interval '40 minutes' + g * interval '10 ms',
		now() - interval '1 day', now() - interval '1 day', interval '1 day',
		'tenant-' || (g % 50), 'order-' || g, 'completed', '{"status": 201}'
	FROM generate_series(1, $backlog) g;
});
$node->safe_psql('postgres', 'VACUUM ANALYZE idempotency_records');

# pgbench: two clients claiming fresh keys, one claim per transaction
my $dir = PostgreSQL::Test::Utils::tempdir;
PostgreSQL::Test::Utils::append_to_file("$dir/claim.sql", q{
\set k random(1, 1000000000)
SELECT outcome FROM idem_claim('bench', 'key-' || :k || '-' || :client_id);
});
my ($pgbench_out, $pgbench_err) = ('', '');
my $pgbench_started = time;
my $pgbench = IPC::Run::start(
	[
		'pgbench', '-n', '-c', '2', '-j', '2', '-T', $pgbench_seconds,
		'-f', "$dir/claim.sql", '-l', '--log-prefix', "$dir/claims",
		'-h', $node->host, '-p', $node->port, 'postgres'
	],
	'>', \$pgbench_out, '2>', \$pgbench_err);

# one round at once (the launcher never ran), the next in an hour: the
# statistics keep this pass
sleep 1;
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.sweep_interval = '1h'});
$node->reload;

# watch the worker while it sweeps, until its pass is recorded
my (%xids, $max_batch, $max_xact_ms);
$max_batch = 0;
$max_xact_ms = 0;
my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
while (time < $deadline)
{
	my $row = $node->safe_psql('postgres', q{
		SELECT (SELECT count(*) FROM idem_stats WHERE datname = 'postgres' AND sweeps > 0),
			   coalesce(backend_xid::text, ''),
			   coalesce(substring(query from 'batch (\d+)'), '0'),
			   coalesce(extract(epoch from now() - xact_start) * 1000, 0)
		FROM (SELECT 1) one
		LEFT JOIN pg_stat_activity ON backend_type = 'idempotency sweeper'});
	my ($swept, $xid, $batch, $xact_ms) = split /\|/, $row;
	$xids{$xid} = 1 if $xid ne '';
	$max_batch = $batch if $batch > $max_batch;
	$max_xact_ms = $xact_ms if $xact_ms > $max_xact_ms;
	last if $swept;
	sleep 0.1;
}
is($node->safe_psql('postgres',
		"SELECT count(*) FROM idempotency_records WHERE status = 'completed'"),
	0, "the worker swept all $backlog expired records");
# (how many batches and transactions this poll happened to see is a figure
# below; that each batch is its own transaction is shown at the end, where
# the worker is held between two batches)

ok($pgbench->finish, 'every concurrent claim succeeded') or diag($pgbench_err);
is( $node->safe_psql('postgres', q{
		SELECT count(*) > 0 AND bool_and(status = 'processing')
		FROM idempotency_records WHERE tenant_id = 'bench'}),
	't', "pgbench's live claims are all still there");

my ($removed, $sweep_ms, $sweep_end) = split /\|/, $node->safe_psql('postgres', q{
	SELECT last_sweep_removed, last_sweep_ms, extract(epoch from last_sweep_at)
	FROM idem_stats WHERE datname = 'postgres'});
is($removed, $backlog, 'one pass removed the whole backlog');
my $sweep_start = $sweep_end - $sweep_ms / 1000;

# pgbench -l lines: client transaction latency_us script epoch_s epoch_us
my (@during, @outside);
for my $file (glob "$dir/claims.*")
{
	for my $line (split /\n/, slurp_file($file))
	{
		my @f = split / /, $line;
		my $end = $f[4] + $f[5] / 1e6;
		my $ms = $f[2] / 1000;
		if ($end >= $sweep_start && $end - $ms / 1000 <= $sweep_end)
		{
			push @during, $ms;
		}
		else
		{
			push @outside, $ms;
		}
	}
}
cmp_ok(scalar @during, '>', 0, 'claims ran while the worker swept');

sub percentile
{
	my ($p, @v) = @_;
	return 0 unless @v;
	@v = sort { $a <=> $b } @v;
	return $v[ int($p * $#v) ];
}
my $finished = $sweep_end <= $pgbench_started + $pgbench_seconds;
diag(sprintf(
		'backlog: %d expired records swept in %.2f s (%.0f rows/s), batches of 1000, '
		  . 'largest batch number seen %d, %d sweep transactions seen, '
		  . 'longest sweep transaction seen %.0f ms; '
		  . '%d claims during the sweep: slowest %.1f ms, p99 %.1f ms, median %.2f ms; '
		  . '%d claims outside it: slowest %.1f ms, p99 %.1f ms, median %.2f ms%s',
		$removed, $sweep_ms / 1000, $removed / ($sweep_ms / 1000), $max_batch,
		scalar keys %xids, $max_xact_ms, scalar @during, percentile(1, @during), percentile(0.99, @during),
		percentile(0.5, @during), scalar @outside, percentile(1, @outside),
		percentile(0.99, @outside), percentile(0.5, @outside),
		$finished ? '' : ' (pgbench ended before the sweep did)'));

# ---------- one transaction per batch, without depending on timing ----------
# A second backlog of five batches.  Session A holds a SHARE lock on the
# table before the pass starts, so the worker's first DELETE waits; session
# B asks for the same lock and queues behind the worker.  When A commits,
# the worker runs its first batch and commits it, B is granted its lock,
# and the second batch's DELETE queues behind B.  The worker is now held
# between two batches whatever the machine's speed: if the batches shared
# one transaction, none of its deletions could be visible yet.
my $second = 5000;
$node->safe_psql('postgres', qq{
	INSERT INTO idempotency_records
		(token, expires_at, created_at, updated_at, ttl, tenant_id, key, status, response)
	SELECT g, now() - interval '2 days' + g * interval '1 ms',
		now() - interval '3 days', now() - interval '3 days', interval '1 day',
		'second', 'order-' || g, 'completed', '{"status": 201}'
	FROM generate_series(1, $second) g;
});

sub lock_session
{
	my ($name) = @_;
	my %s = (name => $name, in => '', out => '', err => '');
	$s{run} = IPC::Run::start(
		[
			'psql', '-X', '-q', '-A', '-t', '-v', 'ON_ERROR_STOP=1',
			'-d', $node->connstr('postgres') . " application_name=$name"
		],
		'<', \$s{in}, '>', \$s{out}, '2>', \$s{err});
	return \%s;
}

sub send_sql
{
	my ($s, $sql) = @_;
	$s->{in} .= "$sql\n";
	$s->{run}->pump_nb;
}

sub wait_output
{
	my ($s, $marker) = @_;
	my $until = time + $PostgreSQL::Test::Utils::timeout_default;
	while ($s->{out} !~ /\Q$marker\E/ && time < $until)
	{
		$s->{run}->pump_nb;
		sleep 0.05;
	}
	return $s->{out} =~ /\Q$marker\E/;
}

my $waiting_for_table = q{
	SELECT count(*) = 1 FROM pg_locks l JOIN pg_stat_activity a USING (pid)
	WHERE l.relation = 'idempotency_records'::regclass AND NOT l.granted AND };

my $sa = lock_session('holder_a');
send_sql($sa, "BEGIN; LOCK TABLE idempotency_records IN SHARE MODE; SELECT 'a-locked';");
ok(wait_output($sa, 'a-locked'), 'session A holds a SHARE lock on the table');

$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.sweep_interval = '1s'});
$node->reload;
ok( $node->poll_query_until('postgres',
		$waiting_for_table . q{a.backend_type = 'idempotency sweeper'
		AND a.query LIKE '%batch 1, 0 rows removed so far'}),
	"the worker's first batch waits for the table");

my $sb = lock_session('holder_b');
send_sql($sb, "BEGIN; LOCK TABLE idempotency_records IN SHARE MODE; SELECT 'b-locked';");
ok($node->poll_query_until('postgres', $waiting_for_table . q{a.application_name = 'holder_b'}),
	'session B queues behind the worker');

send_sql($sa, "COMMIT; SELECT 'a-done';");
ok(wait_output($sa, 'a-done'), 'session A lets the first batch run');
ok(wait_output($sb, 'b-locked'), 'session B gets its lock after the first batch');
ok( $node->poll_query_until('postgres',
		$waiting_for_table . q{a.backend_type = 'idempotency sweeper'}),
	'the worker waits again, behind session B');

# the worker is held between its batches: check where it is
my $activity = $node->safe_psql('postgres',
	"SELECT query FROM pg_stat_activity WHERE backend_type = 'idempotency sweeper'");
like($activity, qr/batch 2, 1000 rows removed so far$/,
	'in more than one batch: the worker is at its second batch') or diag($activity);
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM idempotency_records WHERE tenant_id = 'second'"),
	$second - 1000,
	'in more than one transaction: the first batch is committed while the pass goes on');
is($node->safe_psql('postgres', q{
		SELECT count(*) FROM pg_stat_activity
		WHERE backend_type = 'idempotency sweeper' AND backend_xid IS NOT NULL}),
	0, 'and the waiting batch has written nothing yet');

send_sql($sb, "COMMIT; SELECT 'b-done';");
ok(wait_output($sb, 'b-done'), 'session B lets the worker go on');
ok( $node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM idempotency_records WHERE tenant_id = 'second'"),
	'the pass then sweeps the rest of the second backlog');
for my $s ($sa, $sb)
{
	send_sql($s, '\q');
	$s->{run}->finish;
}

$node->stop;
done_testing();
