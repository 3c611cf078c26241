# idem_claim_many leaves no subtransaction XIDs behind (issue 34).  It
# inserted each 100-key chunk in a subtransaction of its own, which took an
# XID; a subtransaction that commits keeps its XID in the backend's cache
# of 64 until the top transaction ends, so a few 1000-key calls in one
# transaction overflowed the cache, and every snapshot in the server then
# has to look XIDs up in pg_subtrans.
#
# In one transaction: 20 calls of 1000 new keys, then 20 calls of 500 new
# keys and 500 keys with a record (a consumer replaying), then 20 calls
# with 50 keys another batch in flight inserted among 950 new ones.  Around
# each call a second session takes a transaction ID of its own: the
# difference, less its own, is how many XIDs the call assigned, and so an
# upper bound of the subtransaction XIDs it can have left in the cache
# (PostgreSQL 15 shows the cache nowhere; a subtransaction's own XID lock
# is let go when it commits, so pg_locks does not show them either).
# autovacuum is off, so nothing else takes an XID meanwhile.  The batch now
# needs no subtransaction at all (a probe of the key index leaves out the
# keys that have a row, and the rest go in with one plain INSERT), so the
# bound is zero XIDs per call, and none in all.  On PostgreSQL 16 and
# later, pg_stat_get_backend_subxact must show none and no overflow.  The
# outcomes are checked as well.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $calls = 20;

my $node = PostgreSQL::Test::Cluster->new('claim_many_subxacts');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.sweep_interval = 0
autovacuum = off
lc_messages = 'C'
});
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION idempotency;
-- the keys a consumer replays: completed before
SELECT count(*) FROM generate_series(1, 20) c,
	LATERAL idem_claim_many('t', ARRAY(SELECT 'old-' || c || '-' || g FROM generate_series(1, 500) g));
UPDATE idempotency_records SET status = 'completed', response = '{}';
});
my $server_version = $node->safe_psql('postgres', 'SHOW server_version_num');

# Another batch in flight: its rows are there, its key locks given back.
my $other = $node->background_psql('postgres', on_error_stop => 0);
$other->query_safe(q{BEGIN; SELECT count(*) FROM idem_claim_many('t',
	ARRAY(SELECT 'flight-' || c || '-' || g FROM generate_series(1, 20) c, generate_series(1, 50) g))});

my $batch = $node->background_psql('postgres', on_error_stop => 0);
my $pid = $batch->query_safe('SELECT pg_backend_pid()');
# the top transaction's XID first, so that a call assigns only its own
$batch->query_safe('BEGIN; SELECT txid_current()');

sub next_xid
{
	return $node->safe_psql('postgres', 'SELECT txid_current()');
}

my %rounds = (
	'1000 new keys' => q{'new-%d-' || g FROM generate_series(1, 1000) g},
	'500 new keys, 500 with a record' =>
	  q{CASE WHEN g <= 500 THEN 'old-%1$d-' || g ELSE 'more-%1$d-' || g END FROM generate_series(1, 1000) g},
	'950 new keys, 50 of a batch in flight' =>
	  q{CASE WHEN g <= 50 THEN 'flight-%1$d-' || g ELSE 'most-%1$d-' || g END FROM generate_series(1, 1000) g},
);
my %expected = (
	'1000 new keys' => "claimed|1000",
	'500 new keys, 500 with a record' => "claimed|500\nreplay|500",
	'950 new keys, 50 of a batch in flight' => "claimed|950\nin_progress|50",
);
my $total = 0;
for my $round (sort keys %rounds)
{
	my @counts;
	my $outcomes_right = 1;
	for my $c (1 .. $calls)
	{
		my $keys = sprintf($rounds{$round}, $c);
		my $before = next_xid();
		my $outcomes = $batch->query_safe(qq{
	SELECT outcome, count(*) FROM idem_claim_many('t', ARRAY(SELECT $keys)) GROUP BY 1 ORDER BY 1});
		push @counts, next_xid() - $before - 1;
		$outcomes_right &&= $outcomes eq $expected{$round};
		diag("$round, call $c: $outcomes") unless $outcomes eq $expected{$round};
	}
	note("$round: XIDs each call assigned: @counts");
	ok($outcomes_right, "$round: every call's outcomes as expected");
	is((grep { $_ != 0 } @counts), 0,
		"$round: none of $calls calls in one transaction assigned a subtransaction XID (@counts)");
	$total += $_ for @counts;
}
is($total, 0, 'no subtransaction XID in all ' . 3 * $calls . ' calls of one transaction');

SKIP:
{
	skip 'pg_stat_get_backend_subxact comes with PostgreSQL 16', 1 if $server_version < 160000;
	is($node->safe_psql('postgres', qq{
	SELECT s.subxact_count || ' ' ||
	       CASE WHEN s.subxact_overflowed THEN 'overflowed' ELSE 'not overflowed' END
	  FROM pg_stat_get_backend_idset() AS b, pg_stat_get_backend_subxact(b) AS s
	 WHERE pg_stat_get_backend_pid(b) = $pid}), '0 not overflowed',
		'pg_stat_get_backend_subxact: none, not overflowed');
}

$batch->query_safe('COMMIT');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM idempotency_records WHERE key LIKE 'new-%' OR key LIKE 'more-%' OR key LIKE 'most-%'}),
	$calls * (1000 + 500 + 950), 'every claimed key has its record');
$batch->quit;
$other->quit;
$node->stop;
done_testing();
