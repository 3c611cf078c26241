# Tokens never go backwards (src/tokens.c): per key, a new holder's token
# is greater than any earlier holder's, after the key's record was released
# or swept, with the server's clock really moved a day back (libfaketime on
# the server process), after a crash (pg_ctl -m immediate: no checkpoint,
# recovery replays the WAL) and on a
# promoted standby whose clock is also behind.  An earlier holder's late
# complete is refused every time.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $libfaketime = '/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1';
plan skip_all => "libfaketime is not installed ($libfaketime)" unless -e $libfaketime;

# Start (or restart) a node with its clock moved by $offset ('' = real).
sub start_with_clock
{
	my ($node, $offset) = @_;
	local $ENV{LD_PRELOAD} = $offset eq '' ? ($ENV{LD_PRELOAD} // '') : $libfaketime;
	local $ENV{FAKETIME} = $offset;
	local $ENV{FAKETIME_DONT_FAKE_MONOTONIC} = '1';
	$node->start;
}

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.sweep_interval = 0
idempotency.durability_check = off
lc_messages = 'C'
});
start_with_clock($primary, '');
$primary->safe_psql('postgres', 'CREATE EXTENSION idempotency');

# claim and complete key k, keeping it only 1 ms, then sweep it away
sub claim_complete_sweep
{
	my ($node, $key) = @_;
	my $token = $node->safe_psql('postgres', qq{
		BEGIN;
		SELECT set_config('t.token', token::text, true) FROM idem_claim('t', '$key', ttl => '1 ms');
		SELECT idem_complete('t', '$key', current_setting('t.token')::bigint, '{}');
		SELECT current_setting('t.token');
		COMMIT;
	});
	($token) = $token =~ /(\d+)\s*$/;
	$node->safe_psql('postgres', q{SELECT pg_sleep(0.01); SELECT idem_sweep();});
	return $token;
}

sub claim_token
{
	my ($node, $key) = @_;
	return $node->safe_psql('postgres',
		"SELECT token FROM idem_claim('t', '$key', lease => '1 hour')");
}

sub late_complete_refused
{
	my ($node, $key, $token, $what) = @_;
	my ($rc, $out, $err) = $node->psql('postgres',
		"SELECT idem_complete('t', '$key', $token, '{\"late\": true}')",
		extra_params => [ '-v', 'VERBOSITY=sqlstate' ]);
	like($err, qr/ERROR:\s+ID002/, "$what: the earlier holder's late complete is refused (ID002)");
}

my $t1 = claim_complete_sweep($primary, 'k');
is($primary->safe_psql('postgres', "SELECT count(*) FROM idempotency_records WHERE key = 'k'"),
	'0', 'the first record of k was swept');

# the clock a day back: a new claim of k still gets a greater token
$primary->stop;
start_with_clock($primary, '-1d');
cmp_ok($primary->safe_psql('postgres',
		"SELECT extract(epoch FROM now())::bigint"),
	'<', time() - 80000, 'the server clock is really a day behind');
my $t2 = claim_token($primary, 'k');
cmp_ok($t2, '>', $t1, 'after a sweep and the clock stepped back, the new token is greater');
late_complete_refused($primary, 'k', $t1, 'clock stepped back');

# a crash (immediate shutdown, recovery at start) with the clock still behind
$primary->safe_psql('postgres', "SELECT idem_forget('t', 'k')");
$primary->stop('immediate');
start_with_clock($primary, '-1d');
my $t3 = claim_token($primary, 'k');
cmp_ok($t3, '>', $t2, 'after a crash restart, the new token is greater');
late_complete_refused($primary, 'k', $t2, 'crash');

# tokens of a whole batch, after a takeover: all above what came before
my $batch_min = $primary->safe_psql('postgres',
	"SELECT min(token) FROM idem_claim_many('t', ARRAY['b1', 'b2', 'b3'])");
cmp_ok($batch_min, '>', $t3, 'batch claims get greater tokens too');

# a standby, its clock two days behind, promoted after the primary dies
$primary->backup('backup');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'backup', has_streaming => 1);
start_with_clock($standby, '-2d');
$primary->safe_psql('postgres', "SELECT idem_forget('t', 'k')");
my $t4 = claim_token($primary, 'k');
cmp_ok($t4, '>', $t3, 'the primary keeps handing out greater tokens');
$primary->wait_for_catchup($standby, 'replay');
$primary->stop('immediate');
$standby->promote;
$standby->safe_psql('postgres', "SELECT idem_forget('t', 'k')");
my $t5 = claim_token($standby, 'k');
cmp_ok($t5, '>', $t4, 'on the promoted standby with a clock behind, the new token is greater');
late_complete_refused($standby, 'k', $t4, 'promotion');

$standby->stop;
done_testing();
