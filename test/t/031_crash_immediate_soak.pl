
# Immediate shutdown in the middle of the exactly-once soak (issue 4,
# suite 3; plan rows 14 and 22).
#
# test/soak/soak.py runs against the cluster with --crash-tolerant: its
# sessions reconnect when the server dies, redeliver what was interrupted,
# and record a COMMIT that got no answer as "unknown".  While it runs, the
# server is stopped with `pg_ctl -m immediate` (no checkpoint, no clean
# shutdown: recovery replays the WAL) and started again, 5 times.  After each
# restart, every completion whose COMMIT was acknowledged before the crash
# (the history as it stood when the server went down) must be stored, with
# its token and its exact response (I4).  When the soak ends, its checker
# verifies I1-I7 over the whole run, crashes included.

use strict;
use warnings;

use File::Copy;
use FindBin;
use POSIX ':sys_wait_h';
use Time::HiRes qw(usleep);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $cycles = 5;
my $soak = "$FindBin::Bin/../soak/soak.py";
my $python = -x '/usr/bin/python3' ? '/usr/bin/python3' : 'python3';

my $node = PostgreSQL::Test::Cluster->new('crash_soak');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.sweep_interval = '1s'
max_connections = 60
lc_messages = 'C'
});
# 46-defer-off runs this test with held claims switched off
$node->append_conf('postgresql.conf',
	'idempotency.defer_writes = ' . ($ENV{IDEM_DEFER_WRITES} // 'on'));
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

my $dir = PostgreSQL::Test::Utils::tempdir;
my $history = "$dir/history.jsonl";
my $soak_log = "$PostgreSQL::Test::Utils::log_path/031_soak.log";

# The soak in the background; sized to outlast the crash cycles.
my @soak = (
	$python, $soak,
	'--host' => $node->host,
	'--port' => $node->port,
	'--dbname' => 'postgres',
	'--sessions' => 16,
	'--keys' => 6000,
	'--deliveries' => 5,
	'--lease-ms' => 400,
	'--seed' => 31,
	'--history' => $history,
	'--crash-tolerant');
note "running: @soak";
my $soak_pid = fork() // die "fork: $!";
if ($soak_pid == 0)
{
	open STDOUT, '>', $soak_log or die "$soak_log: $!";
	open STDERR, '>&', \*STDOUT or die;
	exec @soak or die "exec: $!";
}

my $soak_status;
sub soak_running
{
	return 0 if defined $soak_status;
	return 1 if waitpid($soak_pid, WNOHANG) == 0;
	$soak_status = $?;
	return 0;
}

# wait until acknowledged completions accumulate
sub wait_history_growth
{
	my ($bytes) = @_;
	my $start = -s $history // 0;
	for (1 .. 600)
	{
		return 1 if (-s $history // 0) >= $start + $bytes;
		usleep(10_000);
	}
	return 0;
}

my ($mid_soak, $verified, $lost_total, $checked_last) = (0, 0, 0, 0);
for my $cycle (1 .. $cycles)
{
	wait_history_growth(1_000_000);
	$mid_soak++ if soak_running();

	$node->stop('immediate');
	# what the soak had been told before the crash
	my $acked = "$dir/acked-before-crash-$cycle.jsonl";
	copy($history, $acked) or die "copy: $!";
	$node->start;

	my ($stdout, $stderr);
	my $rc = IPC::Run::run [
		$python, $soak, '--host' => $node->host,
		'--port' => $node->port, '--dbname' => 'postgres',
		'--verify-acked' => $acked ],
	  '>' => \$stdout, '2>' => \$stderr;
	note "cycle $cycle: $stdout$stderr";
	if ($stdout =~ /acknowledged completions checked: (\d+), lost: (\d+)/)
	{
		$verified++ if $rc && $2 == 0 && $1 > $checked_last;
		$lost_total += $2;
		$checked_last = $1;
		diag "crash $cycle: $1 acknowledged completions checked after restart, $2 lost";
	}
}

is($mid_soak, $cycles, "$cycles immediate shutdowns, each in the middle of the soak");
is($verified, $cycles,
	"after each restart, the acknowledged completions (more each time) were all checked");
is($lost_total, 0, 'no acknowledged completion lost across the crashes');

# let the soak finish (it redelivers what the crashes interrupted) and judge it
my $waited = 0;
while (soak_running() && $waited++ < 1800) { usleep(100_000); }
if (soak_running())
{
	kill 'KILL', $soak_pid;
	waitpid($soak_pid, 0);
	$soak_status = $?;
	diag 'the soak did not finish in 3 minutes: killed';
}
my $exit = $soak_status >> 8;
my $out = slurp_file($soak_log);
note $out;
diag $_ for grep { /^(calls|executions|acknowledged|violations)/ } split /\n/, $out;
for my $line (grep { /^CHECK / } split /\n/, $out)
{
	my ($name) = $line =~ /^CHECK (\S+ [^:]+):/;
	ok($line =~ /: PASS;/, "soak across $cycles crashes: $name") or diag $line;
}
like($out, qr/acknowledged completions checked: [1-9]\d*, lost: 0\n/,
	'soak across the crashes: every acknowledged completion stored at the end');
like($out, qr/^violations: 0$/m, 'soak across the crashes: no violation');
is($exit, 0, 'the soak exited with status 0');

$node->stop;
done_testing();
