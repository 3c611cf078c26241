# The token slot of a dropped database is freed (issue 34).  src/tokens.c
# keeps the last token of each database in one of 64 shared-memory slots;
# a database without a slot reads and moves the durable mark in the
# sequence for every token, and flushes its WAL before the token is
# returned: one WAL flush per claim.  Slots were never given back, so after
# about 70 databases created, used and dropped, every new database took
# that path.
#
# 70 cycles of CREATE DATABASE, a claim, DROP DATABASE; then a new
# database's claims must be served from a slot: over 50 claims in
# autocommit with synchronous_commit = off (whose commits flush nothing),
# the server's WAL syncs (pg_stat_wal's wal_sync; from PostgreSQL 18,
# pg_stat_io's fsyncs of WAL) may grow by the mark moving once or twice and
# what the WAL writer does meanwhile (it sleeps 10 s between rounds), far
# below one sync per claim.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $cycles = 70;
my $claims = 50;
my $bound = 10;

my $node = PostgreSQL::Test::Cluster->new('tokens_dropped');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.sweep_interval = 0
idempotency.durability_check = off
autovacuum = off
wal_writer_delay = '10s'
lc_messages = 'C'
});
$node->start;
$node->safe_psql('postgres', 'CREATE DATABASE tmpl');
$node->safe_psql('tmpl', 'CREATE EXTENSION idempotency');

# FILE_COPY: with fsync off (the test's default) the quicker way to copy
for my $i (1 .. $cycles)
{
	$node->safe_psql('postgres', "CREATE DATABASE d$i TEMPLATE tmpl STRATEGY = FILE_COPY");
	$node->safe_psql("d$i", "SELECT idem_claim('t', 'k')");
	$node->safe_psql('postgres', "DROP DATABASE d$i");
}
pass("$cycles databases created, claimed in and dropped");

# WAL syncs counted, on every version (18 moved them from pg_stat_wal to
# pg_stat_io); only real syncs are counted
my $wal_syncs = $node->safe_psql('postgres', 'SHOW server_version_num') >= 180000
  ? "SELECT coalesce(sum(fsyncs), 0) FROM pg_stat_io WHERE object = 'wal';\n"
  : "SELECT wal_sync FROM pg_stat_wal;\n";
$node->append_conf('postgresql.conf', "fsync = on\n");
$node->reload;
$node->safe_psql('postgres', 'CREATE DATABASE fresh TEMPLATE tmpl');
# the first claim loads the slot (and moves the mark)
$node->safe_psql('fresh', "SELECT idem_claim('t', 'first')");

my $script = $wal_syncs . "SET synchronous_commit = off;\n";
$script .= "SELECT token FROM idem_claim('t', 'k$_');\n" for 1 .. $claims;
$script .= "SELECT pg_stat_force_next_flush();\nSELECT 1;\n" . $wal_syncs;
my @out = split /\n/, $node->safe_psql('fresh', $script);
my ($before, $after) = ($out[0], $out[-1]);
my @tokens = @out[ 1 .. $claims ];
my $syncs = $after - $before;
note("after $cycles dropped databases: $syncs WAL syncs over $claims claims in a new database");
cmp_ok($syncs, '<', $bound,
	"a new database's $claims claims use a token slot: fewer than $bound WAL syncs (took $syncs)");
is(scalar(grep { $tokens[$_] <= $tokens[ $_ - 1 ] } 1 .. $#tokens), 0, 'its tokens grow');

$node->stop;
done_testing();
