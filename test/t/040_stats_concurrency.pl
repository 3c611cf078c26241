# idem_stats counters are exact under concurrency: 8 pgbench clients claim
# overlapping keys at once; every call is counted once, outcomes add up to
# the claims, and every claimed key completed is counted as a completion.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $clients      = 8;
my $transactions = 500;
my $calls        = $clients * $transactions;

my $node = PostgreSQL::Test::Cluster->new('stats');
$node->init;
$node->append_conf('postgresql.conf',
	"shared_preload_libraries = 'idempotency'\nidempotency.sweep_interval = 0\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

# A small key range and a short retention, so claims, replays, in_progress
# answers and reuse of expired records all happen concurrently.
$node->pgbench(
	"--no-vacuum --client=$clients --jobs=2 --transactions=$transactions",
	0,
	[qr{processed: $calls/$calls}],
	[qr{^$}],
	'concurrent claims and completions',
	{
		'claim_complete' => q{
\set k random(1, 50)
BEGIN;
SELECT outcome = 'claimed' AS won, coalesce(token, 0) AS token
  FROM idem_claim('t', 'k' || :k, ttl => '5 ms') \gset
\if :won
SELECT idem_complete('t', 'k' || :k, :token, '{"ok": true}');
\endif
COMMIT;
}
	});

my ($claims, $sum, $claimed, $completes, $in_progress, $replays) = split /\|/,
  $node->safe_psql('postgres', q{
	SELECT claims, claimed + replays + in_progress + mismatches + failed_replays,
	       claimed, completes, in_progress, replays
	FROM idem_stats WHERE datname = 'postgres'});

is($claims, $calls, "every claim counted exactly once ($calls calls)");
is($sum, $claims, 'outcome counters add up to the claims');
is($completes, $claimed, 'every claimed key completed once, each counted');
cmp_ok($claimed, '>', 0, 'some claims won');
note("claims=$claims claimed=$claimed replays=$replays in_progress=$in_progress");

# The slot of a dropped database is given back (the table holds 128).
$node->safe_psql('postgres', 'CREATE DATABASE gone');
$node->safe_psql('gone', "CREATE EXTENSION idempotency; SELECT idem_claim('t', 'k')");
is($node->safe_psql('postgres', "SELECT count(*) FROM idem_stats WHERE datname = 'gone'"),
	'1', 'a database that claimed has a row');
$node->safe_psql('postgres', 'DROP DATABASE gone');
is($node->safe_psql('postgres', 'SELECT count(*) FROM idem_stats WHERE datname IS NULL'),
	'0', 'the row of a dropped database is reclaimed');

$node->stop;
done_testing();
