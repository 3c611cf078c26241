# Re-entrant claims (1.4) across a crash and on a standby.  A durable
# execution that replays after its worker died calls idem_claim again with
# its holder, possibly long after the claim was made:
#   A. a claim committed with a holder survives a crash restart: after
#      recovery the same holder re-enters it from a new connection (same
#      token, the lease end recorded before the crash), another holder is
#      in progress, and the holder completes it with that token;
#   B. a held claim (written at COMMIT) re-entered in its own transaction
#      is written with its holder: after a crash restart its record has it;
#   C. on a hot standby a re-entry is a read, as a replay is: the same
#      holder is answered claimed with the primary's token, another holder
#      in_progress, and a claim that would write is refused (25006);
#   D. a holder whose lease ended while the server was down does not
#      re-enter: its next claim takes over with a new token, and the
#      token it had is fenced.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $primary = PostgreSQL::Test::Cluster->new('reentrant');
$primary->init(allows_streaming => 1);
$primary->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.sweep_interval = 0
restart_after_crash = on
lc_messages = 'C'
});
$primary->start;
$primary->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
CREATE FUNCTION sqlstate_of(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE stmt;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE;
END $$;
});

# A. committed with a holder, then a crash
my ($token, $lease_end) = split /\|/, $primary->safe_psql('postgres',
	"SELECT token, expires_at FROM idem_claim('t', 'exec', lease => '1 hour', holder => 'arn:run-1')");
# B. held in a transaction that re-enters it, written at COMMIT
my $held = $primary->safe_psql(
	'postgres', q{
BEGIN;
SELECT token AS first FROM idem_claim('t', 'held', lease => '1 hour', holder => 'arn:run-2') \gset
SELECT outcome || ':' || (token = :first) FROM idem_claim('t', 'held', holder => 'arn:run-2');
COMMIT;
});
is($held, 'claimed:true', 'B. a held claim is re-entered in its own transaction');
# D. a short lease that ends while the server is down
my $short = $primary->safe_psql('postgres',
	"SELECT token FROM idem_claim('t', 'short', lease => '1 s', holder => 'arn:run-3')");

$primary->stop('immediate');
$primary->start;

is( $primary->safe_psql(
		'postgres',
		"SELECT outcome, token = $token, expires_at = '$lease_end'
		   FROM idem_claim('t', 'exec', holder => 'arn:run-1')"),
	'claimed|t|t',
	'A. after a crash restart the holder re-enters its claim: same token, same lease end');
is($primary->safe_psql('postgres', "SELECT outcome FROM idem_claim('t', 'exec', holder => 'arn:run-9')"),
	'in_progress', 'A. another holder is in progress');
is( $primary->safe_psql('postgres',
		"SELECT holder FROM idem_lookup('t', 'held') UNION ALL SELECT status FROM idem_lookup('t', 'held')"),
	"arn:run-2\nprocessing",
	'B. the held claim was written with its holder and survived the crash');

# C. a standby
$primary->backup('backup');
my $standby = PostgreSQL::Test::Cluster->new('reentrant_standby');
$standby->init_from_backup($primary, 'backup', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby, 'replay');
is( $standby->safe_psql(
		'postgres', "SELECT outcome, token = $token FROM idem_claim('t', 'exec', holder => 'arn:run-1')"),
	'claimed|t',
	'C. on the standby the holder re-enters (a read): the primary\'s token');
is($standby->safe_psql('postgres', "SELECT outcome FROM idem_claim('t', 'exec', holder => 'arn:run-9')"),
	'in_progress', 'C. on the standby another holder is in progress');
is( $standby->safe_psql('postgres',
		"SELECT sqlstate_of(\$\$SELECT idem_claim('t', 'fresh', holder => 'arn:run-1')\$\$)"),
	'25006', 'C. on the standby a claim that would write is refused');

# A. the holder completes with the token it re-entered with; the standby replays it
$primary->safe_psql('postgres', "SELECT idem_complete('t', 'exec', $token, '{\"done\": true}')");
$primary->wait_for_catchup($standby, 'replay');
is( $standby->safe_psql('postgres',
		"SELECT outcome, response FROM idem_claim('t', 'exec', holder => 'arn:run-1')"),
	'replay|{"done": true}',
	'A. completed with the re-entered token: a replay, on the standby too');

# D. the lease ended meanwhile: a takeover, not a re-entry
sleep(1) while $primary->safe_psql('postgres',
	"SELECT lease_expires_at > now() FROM idem_lookup('t', 'short')") eq 't';
is( $primary->safe_psql(
		'postgres', "SELECT outcome, token > $short FROM idem_claim('t', 'short', holder => 'arn:run-3')"),
	'claimed|t',
	'D. after its lease the same holder takes over with a new token');
is( $primary->safe_psql('postgres',
		"SELECT sqlstate_of(\$\$SELECT idem_complete('t', 'short', $short)\$\$)"),
	'ID002', 'D. the token it had before is fenced');

$standby->stop;
$primary->stop;
done_testing();
