
# Crash between claim and commit (issue 4, suite 3; plan row 13).
#
# A session claims a key (and, every other time, also writes its business
# row and completes the claim) and is killed with SIGKILL before COMMIT.
# The postmaster then restarts the whole cluster (restart_after_crash = on),
# as it does after any backend crash.  After recovery the claim must be gone
# without a trace -- no record, no business row -- and the very first claim
# of the key must win at once, without waiting for any lease.  50 rounds.
# Modelled on postgres' src/test/recovery/t/013_crash_restart.pl.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $rounds = 50;

my $node = PostgreSQL::Test::Cluster->new('crash_backend');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idempotency'
restart_after_crash = on
lc_messages = 'C'
});
$node->start;
# PostgreSQL 18's postmaster names the process type in the crash log line
my $crashed_process = $node->pg_version >= 18 ? 'client backend' : 'server process';
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
CREATE TABLE payments (tenant_id text NOT NULL, key text NOT NULL, token bigint NOT NULL);
});

my ($left_records, $left_payments, $first_claims, $held, $crashes) =
  (0, 0, 0, 0, 0);
for my $i (1 .. $rounds)
{
	my $key = "key-$i";
	my $complete = $i % 2 == 0;

	my $holder = $node->background_psql('postgres', on_error_stop => 0);
	my $pid = $holder->query_safe('SELECT pg_backend_pid()');
	$holder->query_safe('BEGIN');
	my $claim = $holder->query_safe(
		"SELECT outcome || ' ' || token FROM idem_claim('crash', '$key', lease => '1 hour')");
	my ($outcome, $token) = split / /, $claim;
	die "round $i: claim answered '$claim'" unless $outcome eq 'claimed';
	if ($complete)
	{
		$holder->query_safe(
			"INSERT INTO payments VALUES ('crash', '$key', $token)");
		$holder->query_safe(
			"SELECT idem_complete('crash', '$key', $token, '{\"ok\": true}')");
	}

	# the claim is really in flight: a concurrent claim sees it
	$held++
	  if $node->safe_psql('postgres',
		"SELECT outcome FROM idem_claim('crash', '$key')") eq 'in_progress';

	my $log_offset = -s $node->logfile;
	kill 'KILL', $pid or die "could not kill backend $pid: $!";
	$node->wait_for_log(qr/database system is ready to accept connections/,
		$log_offset);
	$crashes++
	  if slurp_file($node->logfile, $log_offset) =~
	  /$crashed_process \(PID $pid\) was terminated by signal 9/;
	eval { $holder->quit };

	# one psql call: what survived, then the first claim after recovery
	my @after = split /\n/, $node->safe_psql(
		'postgres', qq{
SELECT count(*) FROM idempotency_records WHERE tenant_id = 'crash' AND key = '$key';
SELECT count(*) FROM payments WHERE key = '$key';
SELECT outcome FROM idem_claim('crash', '$key');
});
	$left_records++ if $after[0] != 0;
	$left_payments++ if $after[1] != 0;
	$first_claims++ if $after[2] eq 'claimed';
	note "round $i ("
	  . ($complete ? 'claim + business row + complete' : 'claim')
	  . "): records $after[0], payments $after[1], first claim $after[2]";
}

is($held, $rounds, "every killed claim was in flight (a concurrent claim saw in_progress)");
is($crashes, $rounds, "$rounds backends killed with SIGKILL, each followed by a crash restart");
is($left_records, 0, "no record of an uncommitted claim survives the crash");
is($left_payments, 0, "no business row of an uncommitted claim survives the crash");
is($first_claims, $rounds,
	"the first claim after recovery wins the key at once, in all $rounds rounds");

# the keys claimed after recovery behave normally: complete, then replay
$node->safe_psql('postgres', q{
SELECT idem_complete('crash', key, token, '{"after": "crash"}')
FROM idempotency_records WHERE tenant_id = 'crash'
});
is( $node->safe_psql(
		'postgres', q{
SELECT count(*) FROM idempotency_records k, LATERAL idem_claim('crash', k.key) r
WHERE k.tenant_id = 'crash' AND r.outcome = 'replay'
}),
	$rounds,
	'every key claimed after recovery completes and replays');

$node->stop;
done_testing();
