
# A claim holder that dies with a committed lease (issue 4, suite 3; plan
# row 15).  The claim is committed, so the record outlives its holder; the
# key must be blocked while the lease is valid and reclaimable within
# lease + one sweep interval after it ends:
#   A. by a claim's takeover (sweeper off): the holder's backend is killed
#      (crash restart); the lease survives recovery; a waiting claim takes
#      the key over as soon as the lease ends, with token + 1, and the dead
#      holder's late complete is refused with ID002;
#   B. by the sweeper worker (idempotency.sweep_interval = 1 s), the holder
#      just disconnecting;
#   C. by the sweeper worker after a crash restart killed the holder (the
#      launcher must come back with the cluster);
#   D. by idem_sweep(), which leaves the claim alone while its lease is valid.

use strict;
use warnings;

use Time::HiRes qw(usleep);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $lease_s = 2;
my $crash_lease_s = 5;    # outlasts a crash restart on a loaded machine
my $interval_s = 1;
my $grace_s = 1;    # scheduling slack on a loaded 2-core machine

my $node = PostgreSQL::Test::Cluster->new('crash_lease');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.sweep_interval = '${interval_s}s'
restart_after_crash = on
lc_messages = 'C'
});
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
-- the SQLSTATE a statement fails with, or 'ok'
CREATE FUNCTION sqlstate_of(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE stmt;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE;
END $$;
-- seconds from the lease end of (tenant, key) until its record is gone
-- (negative: gone before the lease ended), NULL if still there after timeout
CREATE FUNCTION seconds_until_gone(t text, k text, timeout float8) RETURNS float8
LANGUAGE plpgsql AS $$
DECLARE
	lease_end timestamptz;
BEGIN
	SELECT lease_expires_at INTO lease_end FROM idempotency_records
	WHERE tenant_id = t AND key = k;
	IF lease_end IS NULL THEN
		RAISE EXCEPTION 'no claim of % to watch', k;
	END IF;
	LOOP
		IF NOT EXISTS (SELECT 1 FROM idempotency_records WHERE tenant_id = t AND key = k) THEN
			RETURN extract(epoch FROM clock_timestamp() - lease_end);
		END IF;
		IF clock_timestamp() > lease_end + make_interval(secs => timeout) THEN
			RETURN NULL;
		END IF;
		PERFORM pg_sleep(0.02);
	END LOOP;
END $$;
});

sub set_sweep_interval
{
	my ($seconds) = @_;
	$node->safe_psql('postgres',
		"ALTER SYSTEM SET idempotency.sweep_interval = '${seconds}s'; SELECT pg_reload_conf();");
	# let the launcher see it, and a sweep already started finish
	usleep(1_500_000);
}

# A holder claims key with a lease and commits; returns (psql, pid, token).
sub committed_claim
{
	my ($key, $lease) = @_;
	my $holder = $node->background_psql('postgres', on_error_stop => 0);
	my $pid = $holder->query_safe('SELECT pg_backend_pid()');
	my ($outcome, $token) = split / /, $holder->query_safe(
		"SELECT outcome || ' ' || token FROM idem_claim('lease', '$key', lease => '$lease s')"
	);
	die "claim of $key answered $outcome" unless $outcome eq 'claimed';
	return ($holder, $pid, $token);
}

sub crash_backend
{
	my ($pid) = @_;
	my $offset = -s $node->logfile;
	kill 'KILL', $pid or die "kill $pid: $!";
	$node->wait_for_log(qr/database system is ready to accept connections/, $offset);
}

# ---- A: takeover by a claim after the holder's backend was killed
set_sweep_interval(0);
my ($holder, $pid, $token) = committed_claim('a', $crash_lease_s);
crash_backend($pid);
eval { $holder->quit };

is( $node->safe_psql('postgres', "SELECT status || ' ' || token FROM idem_lookup('lease', 'a')"),
	"processing $token",
	'A: the committed claim and its lease survive the crash of its holder');
my ($early, $early_left) = split /\|/, $node->safe_psql('postgres',
	"SELECT r.outcome, extract(epoch FROM k.lease_expires_at - clock_timestamp())
	 FROM idempotency_records k, LATERAL idem_claim('lease', 'a') r WHERE k.key = 'a'");
ok($early eq 'in_progress' || ($early eq 'claimed' && $early_left <= 0),
	"A: no claim wins while the dead holder's lease is valid ($early, ${early_left}s left)");

my ($outcome, $new_token) = split / /, $node->safe_psql('postgres',
	"SELECT outcome || ' ' || token FROM idem_claim('lease', 'a', wait => '10 s')");
is($outcome, 'claimed', 'A: a waiting claim takes the key over');
is($new_token, $token + 1, 'A: the takeover carries token + 1');
# a takeover keeps created_at (the dead claim's start, its lease end - lease)
my $late = $node->safe_psql('postgres',
	"SELECT extract(epoch FROM updated_at - created_at) - $crash_lease_s FROM idempotency_records WHERE key = 'a'"
);
ok($late >= 0 && $late <= $grace_s,
	"A: taken over ${late}s after the lease ended (at most ${grace_s}s, never before)");
is( $node->safe_psql('postgres',
		"SELECT sqlstate_of('SELECT idem_complete(''lease'', ''a'', $token, ''{\"zombie\": true}'')')"),
	'ID002',
	"A: the dead holder's late complete is refused with ID002");
is( $node->safe_psql('postgres',
		"SELECT sqlstate_of('SELECT idem_complete(''lease'', ''a'', $new_token, ''{\"new\": true}'')');
		 SELECT response::text FROM idempotency_records WHERE key = 'a';"),
	qq(ok\n{"new": true}),
	"A: the new holder completes; the zombie changed nothing");

# ---- B: the sweeper worker frees the key of a holder that disconnected
set_sweep_interval($interval_s);
is($node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency sweeper launcher'"),
	1, 'B: the sweeper launcher runs');
($holder, $pid, $token) = committed_claim('b', $lease_s);
$holder->quit;
my $gone = $node->safe_psql('postgres',
	"SELECT seconds_until_gone('lease', 'b', $interval_s + $grace_s + 5)");
ok($gone ne '' && $gone >= 0 && $gone <= $interval_s + $grace_s,
	"B: the sweeper removed the dead holder's claim "
	  . ($gone eq '' ? 'never' : "${gone}s")
	  . " after its lease ended (within the ${interval_s}s interval + ${grace_s}s)");
is($node->safe_psql('postgres', "SELECT outcome FROM idem_claim('lease', 'b')"),
	'claimed', 'B: the key is claimable again');

# ---- C: the same after a crash restart killed the holder
($holder, $pid, $token) = committed_claim('c', $crash_lease_s);
crash_backend($pid);
eval { $holder->quit };
$gone = $node->safe_psql('postgres',
	"SELECT seconds_until_gone('lease', 'c', $interval_s + $grace_s + 10)");
ok($gone ne '' && $gone >= 0 && $gone <= $interval_s + $grace_s,
	"C: after the crash restart the sweeper removed the claim "
	  . ($gone eq '' ? 'never' : "${gone}s")
	  . " after its lease ended");
is($node->safe_psql('postgres', "SELECT outcome FROM idem_claim('lease', 'c')"),
	'claimed', 'C: the key is claimable again');

# ---- D: idem_sweep() with the worker off
set_sweep_interval(0);
($holder, $pid, $token) = committed_claim('d', $lease_s);
$holder->quit;
is($node->safe_psql('postgres',
		"SELECT stale_released FROM idem_sweep(); SELECT count(*) FROM idempotency_records WHERE key = 'd';"),
	"0\n1", 'D: idem_sweep() leaves a claim alone while its lease is valid');
$node->poll_query_until('postgres',
	"SELECT clock_timestamp() > lease_expires_at FROM idempotency_records WHERE key = 'd'")
  or die 'lease of d never ended';
is($node->safe_psql('postgres',
		"SELECT stale_released FROM idem_sweep(); SELECT count(*) FROM idempotency_records WHERE key = 'd';"),
	"1\n0", 'D: once the lease ended, idem_sweep() releases the claim');
is($node->safe_psql('postgres', "SELECT outcome FROM idem_claim('lease', 'd')"),
	'claimed', 'D: the key is claimable again');

$node->stop;
done_testing();
