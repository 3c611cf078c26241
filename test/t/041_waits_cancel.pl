# Every wait of our functions answers statement_timeout, pg_cancel_backend
# and pg_terminate_backend at once (issue 34).  For each kind of wait the
# waiter would otherwise wait 30 s (or, for the fenced writes, as long as
# the other transaction stays open); the cancel must be acknowledged within
# 1 s of being sent (for statement_timeout: of the timeout's expiry).  The
# figures are printed; they are a few milliseconds when the wait answers.
#
# The waits:
#   - idem_claim with wait on a key another open transaction claimed (the
#     key lock, held claim), and on a key whose committed lease runs (the
#     poll loop);
#   - idem_complete, idem_release, idem_heartbeat, idem_checkpoint and
#     idem_forget on a key another open transaction claimed (keylock.c's
#     idem_keylock_take);
#   - idem_claim with wait and the same five on a key an idem_claim_many
#     still in flight inserted (the wait for the inserting transaction);
#   - the same on a key whose row stays "in progress" after its
#     transaction ended (a held claim written inside a subtransaction that
#     rolled back, issue 34): the claim's loop and idem_keylock_take spun
#     on it without looking at interrupts.  Once such a row can no longer
#     be made, those waiters answer at once: that is counted as a pass
#     (nothing to wait for), and noted.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# The bound asserted, in ms: generous against scheduling noise on a busy
# machine, and 30 times below the wait that would otherwise go on.
my $bound_ms = 1000;

my $node = PostgreSQL::Test::Cluster->new('waits_cancel');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.sweep_interval = 0
autovacuum = off
lc_messages = 'C'
});
$node->start;

# autovacuum is off so that no other transaction with an XID ends while a
# row of an ended transaction still looks in progress: the first that ends
# makes it dead.
$node->safe_psql('postgres', q{
CREATE EXTENSION idempotency;

-- How long pid takes, in ms, to stop running its statement sql once told
-- (how: 'cancel', 'terminate', or 'timeout' for its own
-- statement_timeout of timeout_ms).  -1: it never waited (sql was no
-- longer running 200 ms after it started).  give_up_ms: it is still
-- running after that long.
CREATE FUNCTION ack_ms(pid int, sql text, how text, timeout_ms int, give_up_ms int)
RETURNS numeric LANGUAGE plpgsql AS $$
DECLARE
	a record;
	started timestamptz;
	told timestamptz;
	looked timestamptz := clock_timestamp();
BEGIN
	LOOP
		PERFORM pg_stat_clear_snapshot();
		SELECT s.state, s.query, s.query_start INTO a FROM pg_stat_activity s
		 WHERE s.pid = ack_ms.pid;
		IF strpos(a.query, sql) > 0 THEN
			IF a.state <> 'active' THEN
				RETURN -1;
			END IF;
			started := a.query_start;
			EXIT WHEN clock_timestamp() - started >= interval '200 ms';
		ELSIF clock_timestamp() - looked > interval '10 s' THEN
			RAISE 'backend % never ran %', pid, sql;
		END IF;
		PERFORM pg_sleep(0.005);
	END LOOP;
	IF how = 'cancel' THEN
		told := clock_timestamp();
		PERFORM pg_cancel_backend(pid);
	ELSIF how = 'terminate' THEN
		told := clock_timestamp();
		PERFORM pg_terminate_backend(pid);
	ELSE
		told := started + make_interval(secs => timeout_ms / 1000.0);
	END IF;
	LOOP
		PERFORM pg_stat_clear_snapshot();
		PERFORM FROM pg_stat_activity s
		 WHERE s.pid = ack_ms.pid AND s.state = 'active' AND s.query_start = started;
		EXIT WHEN NOT FOUND;
		IF clock_timestamp() - told > make_interval(secs => give_up_ms / 1000.0) THEN
			RETURN give_up_ms;
		END IF;
		PERFORM pg_sleep(0.001);
	END LOOP;
	RETURN round(extract(epoch FROM clock_timestamp() - told) * 1000, 1);
END $$;
});

my $monitor = $node->background_psql('postgres', on_error_stop => 0);

# A session holding an open transaction that ran $sql.
sub holder
{
	my ($sql) = @_;
	my $session = $node->background_psql('postgres', on_error_stop => 0);
	$session->query_safe("BEGIN; $sql");
	return $session;
}

my %expected_error = (
	cancel    => qr/canceling statement due to user request/,
	timeout   => qr/canceling statement due to statement timeout/,
);

# Start $sql in a new session, tell it to stop ($how) once it has waited
# 200 ms, and check that it stops within the bound.  $may_not_wait: the
# statement may answer at once instead (the row it would wait on can no
# longer be made).
sub check_wait
{
	my ($what, $sql, $how, $may_not_wait) = @_;
	my $timeout_ms = 500;
	my $give_up_ms = 5000;
	my $waiter = $node->background_psql('postgres', on_error_stop => 0);
	my $pid = $waiter->query_safe('SELECT pg_backend_pid()');
	$waiter->query_safe("SET statement_timeout = '$timeout_ms ms'") if $how eq 'timeout';
	$waiter->{stderr} = '';
	$waiter->query_until(qr/go/, "\\echo go\n$sql;\n");
	my $ms = $monitor->query_safe(
		"SELECT ack_ms($pid, \$sql\$$sql\$sql\$, '$how', $timeout_ms, $give_up_ms)");
	my $ended = $how eq 'terminate' && $ms >= 0;

	if ($ms == $give_up_ms)
	{
		# still waiting or spinning: any transaction with an XID that ends
		# lets a spin go; the waiter is then ended for good
		$node->safe_psql('postgres', "SELECT txid_current(); SELECT pg_terminate_backend($pid)");
		$ended = 1;
	}
	if ($ended)
	{
		# psql has gone, or notices the lost connection at its next input
		eval { $waiter->quit };
	}
	else
	{
		$waiter->query('SELECT 1');
		$waiter->quit;
	}

	if ($ms < 0 && $may_not_wait)
	{
		note("$what, $how: answered at once (nothing to wait for)");
		pass("$what: $how (did not wait)");
		return;
	}
	note("$what, $how: acknowledged in $ms ms");
	ok($ms >= 0 && $ms < $bound_ms,
		"$what: $how ends the wait within $bound_ms ms (took $ms ms; -1: never waited)");
	if ($how eq 'terminate')
	{
		ok($node->poll_query_until('postgres',
				"SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid"),
			"$what: $how ends the backend");
	}
	else
	{
		like($waiter->{stderr}, $expected_error{$how}, "$what: $how is the error reported");
	}
}

my @settles = (
	[ 'idem_complete',   "SELECT idem_complete('t', '%s', 1)" ],
	[ 'idem_release',    "SELECT idem_release('t', '%s', 1)" ],
	[ 'idem_heartbeat',  "SELECT idem_heartbeat('t', '%s', 1)" ],
	[ 'idem_checkpoint', "SELECT idem_checkpoint('t', '%s', 1, 'p')" ],
	[ 'idem_forget',     "SELECT idem_forget('t', '%s')" ],
);
my $claim_waiting = "SELECT idem_claim('t', '%s', wait => '30 s')";

# A claim held by an open transaction (held in memory), one written at once
# (defer_writes off), and a committed claim whose lease runs.
my $held = holder("SELECT idem_claim('t', 'held')");
my $written = holder("SET LOCAL idempotency.defer_writes = off; SELECT idem_claim('t', 'written')");
$node->safe_psql('postgres', "SELECT idem_claim('t', 'leased', lease => '1 hour')");
# An idem_claim_many in flight: its row is there, its key lock given back.
my $batch = holder("SELECT count(*) FROM idem_claim_many('t', ARRAY['batched'])");

for my $how (qw(timeout cancel terminate))
{
	check_wait('idem_claim with wait on a held claim', sprintf($claim_waiting, 'held'), $how);
	check_wait('idem_claim with wait on a written claim', sprintf($claim_waiting, 'written'), $how);
	check_wait('idem_claim with wait on a running lease', sprintf($claim_waiting, 'leased'), $how);
	check_wait('idem_claim with wait on a batch in flight', sprintf($claim_waiting, 'batched'), $how);
	for my $settle (@settles)
	{
		my ($name, $sql) = @$settle;
		check_wait("$name on a held claim", sprintf($sql, 'held'), $how);
		check_wait("$name on a batch in flight", sprintf($sql, 'batched'), $how);
	}
}

# The holders' keys are still held: every wait above was the waiter's own
# to end.
is($node->safe_psql('postgres', "SELECT outcome FROM idem_claim('t', 'batched')"),
	'in_progress', 'the batch in flight still holds its key');
$_->quit for ($held, $written, $batch);

# A row that stays "in progress" after its transaction ended: a held claim
# written at a COMMIT that became a rollback (issue 34), made afresh for
# each waiter (the next transaction with an XID to end makes it dead).
my $n = 0;
for my $how (qw(timeout cancel terminate))
{
	for my $case ([ 'idem_claim with wait', $claim_waiting ], @settles)
	{
		my ($name, $sql) = @$case;
		my $key = 'orphan' . $n++;
		$node->psql('postgres',
			"BEGIN; SELECT idem_claim('t', '$key'); SAVEPOINT s; SELECT 1/0; COMMIT;",
			on_error_stop => 0);
		check_wait("$name on a row left in progress", sprintf($sql, $key), $how, 1);
	}
}

$monitor->quit;
$node->stop;
done_testing();
