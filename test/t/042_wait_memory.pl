# A claim that waits keeps its memory flat (issue 34).  A claim with wait
# polls the record while a committed lease runs; when reads go through SQL
# (store.c's SPI read), each poll's tuple table stayed allocated until the
# call ended, about 8 kB a poll at 20 polls a second: some 9 MB over a
# minute.  Two claims wait 60 s at once on a running lease, as an
# application role under tenant isolation: one with the direct read (the
# extension's own policy), one with idempotency.direct_reads = off (SQL).
# The private memory of each waiting backend is sampled after 5 s and
# shortly before the wait ends; it may grow by less than 1 MB (the record's
# fingerprint, copied out of each poll's tuple, is about 80 bytes a poll).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);

my $wait_s = 60;
my $bound_kb = 1024;

my $node = PostgreSQL::Test::Cluster->new('wait_memory');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.sweep_interval = 0
lc_messages = 'C'
});
$node->start;

# The application role's grants of docs/privileges.md, and isolation on.
$node->safe_psql('postgres', q{
CREATE EXTENSION idempotency;
CREATE ROLE app LOGIN;
GRANT USAGE ON SCHEMA public TO app;
GRANT EXECUTE ON FUNCTION idem_claim(text, text, text, interval, interval, interval, text) TO app;
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_records TO app;
SELECT idem_set_tenant_isolation(true, 'app.tenant');
SET app.tenant = 'a';
SELECT idem_claim('a', 'k', 'fp-' || repeat('x', 60), lease => '1 hour');
});

# Private_Dirty of backend $pid, in kB.
sub private_kb
{
	my ($pid) = @_;
	open(my $fh, '<', "/proc/$pid/smaps_rollup") or return undef;
	my ($kb) = map { /^Private_Dirty:\s+(\d+) kB/ ? $1 : () } <$fh>;
	close $fh;
	return $kb;
}

my %waiters;
for my $reads ('on', 'off')
{
	my $session = $node->background_psql('postgres', on_error_stop => 0,
		extra_params => [ '-U', 'app' ]);
	my $pid = $session->query_safe('SELECT pg_backend_pid()');
	$session->query_safe("SET app.tenant = 'a'; SET idempotency.direct_reads = $reads");
	# taken before the claim is sent: the wait cannot have begun earlier
	my $sent = time;
	$session->query_until(qr/go/, "\\echo go\n"
		  . "SELECT outcome FROM idem_claim('a', 'k', 'fp-' || repeat('x', 60), wait => '$wait_s s');\n");
	$waiters{$reads} = { session => $session, pid => $pid, sent => $sent };
}
my $started = time;

plan skip_all => 'no /proc/PID/smaps_rollup to read a backend\'s memory from'
  unless defined private_kb($waiters{on}{pid});

sleep(5 - (time - $started));
$_->{early} = private_kb($_->{pid}) for values %waiters;
sleep($wait_s - 3 - (time - $started));
$_->{late} = private_kb($_->{pid}) for values %waiters;

for my $reads ('on', 'off')
{
	my $w = $waiters{$reads};
	my $grown = $w->{late} - $w->{early};
	note("direct_reads = $reads: $w->{early} kB after 5 s, $w->{late} kB after "
		  . ($wait_s - 3) . " s: grown by $grown kB");
	cmp_ok($grown, '<', $bound_kb,
		"a $wait_s s wait with isolation on and direct_reads = $reads: "
		  . "memory grows by less than $bound_kb kB (grew $grown kB)");
	# the claim's answer comes before this query's
	like($w->{session}->query('SELECT 1'), qr/^in_progress\n/,
		"direct_reads = $reads: the claim waited to the end, in_progress");
	# from before the claim was sent to after its answer came: a bound on
	# the wait from above, short of $wait_s if the wait ended early
	cmp_ok(time - $w->{sent}, '>=', $wait_s, "direct_reads = $reads: the wait lasted $wait_s s");
	$w->{session}->quit;
}

$node->stop;
done_testing();
