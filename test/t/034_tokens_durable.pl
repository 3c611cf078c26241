# No token is handed out before the high-water mark that covers it is on
# disk (src/tokens.c).  The mark lives in the sequence idempotency_tokens;
# moving it writes WAL, but that WAL used to reach disk only with some
# later commit.  A token can leave the server long before: it is returned
# inside the claim's open transaction (and handed to another system), or
# committed asynchronously.  If the server then crashed, the mark went back,
# and after a restart with the clock behind, the same key got the same or a
# lower token again: the fence no longer fenced.
#
# Each round hands out tokens, checks that the WAL of the sequence's last
# change is flushed the moment idem_claim returns (pageinspect), crashes the
# server (pg_ctl -m immediate: no shutdown checkpoint, no WAL flush) and
# restarts it with its clock a day behind (libfaketime): the next token of
# the same key must be greater than every token handed out before.
#   A. shared memory: the claim that moves the mark, its transaction open;
#   B. shared memory: a claim covered by a mark another backend moved;
#   C. shared memory: a claim committed asynchronously with a business row;
#   D. without shared memory (the library not preloaded).
# autovacuum is off and the WAL writer sleeps 10 s, so that nothing else
# flushes the WAL by chance before the crash: what the test shows is the
# extension's own flush.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $libfaketime = '/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1';
plan skip_all => "libfaketime is not installed ($libfaketime)" unless -e $libfaketime;

# Start a node with its clock moved by $offset ('' = real).
sub start_with_clock
{
	my ($node, $offset) = @_;
	local $ENV{LD_PRELOAD} = $offset eq '' ? ($ENV{LD_PRELOAD} // '') : $libfaketime;
	local $ENV{FAKETIME} = $offset;
	local $ENV{FAKETIME_DONT_FAKE_MONOTONIC} = '1';
	$node->start;
}

my $node = PostgreSQL::Test::Cluster->new('tokens_durable');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.sweep_interval = 0
idempotency.durability_check = off
autovacuum = off
wal_writer_delay = '10s'
lc_messages = 'C'
});
start_with_clock($node, '');
$node->safe_psql('postgres', q{
CREATE EXTENSION idempotency;
CREATE EXTENSION pageinspect;
CREATE TABLE ledger (key text NOT NULL, token bigint NOT NULL);
});

# Is the WAL of the mark's last change on disk?
my $mark_flushed_sql = q{
SELECT pg_current_wal_flush_lsn() >= lsn
FROM page_header(get_raw_page('idempotency_tokens', 0))};

# A session with an open transaction holding a fresh claim of $key: the
# session, its token, and whether the mark was flushed when it returned.
sub claim_in_open_transaction
{
	my ($key) = @_;
	my $session = $node->background_psql('postgres', on_error_stop => 0);
	$session->query_safe('BEGIN');
	my $token = $session->query_safe(
		"SELECT token FROM idem_claim('t', '$key', lease => '1 hour')");
	my $flushed = $session->query_safe($mark_flushed_sql);
	return ($session, $token, $flushed);
}

# Crash, then start with the clock a day behind.
sub crash_and_restart_behind
{
	my @sessions = @_;
	$node->stop('immediate');
	eval { $_->quit } for @sessions;
	start_with_clock($node, '-1d');
}

sub fresh_token
{
	my ($key) = @_;
	return $node->safe_psql('postgres', qq{
SELECT idem_forget('t', '$key');
SELECT token FROM idem_claim('t', '$key', lease => '1 hour');
}) =~ /(\d+)\s*$/ ? $1 : die "no token for $key";
}

# the extension's own SQL moved the mark; the first claim moves it again
$node->safe_psql('postgres', 'SELECT pg_sleep(0.01)');

# A. The first claim after start moves the mark; its transaction stays open.
my ($session_a, $token_a, $flushed_a) = claim_in_open_transaction('a');
is($flushed_a, 't', 'A: the mark covering the token is flushed before idem_claim returns');
crash_and_restart_behind($session_a);
cmp_ok($node->safe_psql('postgres', 'SELECT extract(epoch FROM now())::bigint'),
	'<', time() - 80000, 'the restarted server\'s clock is a day behind');
my $after_a = fresh_token('a');
cmp_ok($after_a, '>', $token_a,
	'A: after a crash and the clock stepped back, the key\'s next token is greater');

# B. One backend moves the mark (the first claim after a clean restart), a
# second one is handed a token under it without moving it.
$node->stop;
start_with_clock($node, '-1d');
my ($session_b1, $token_b1, $flushed_b1) = claim_in_open_transaction('b1');
my ($session_b2, $token_b2, $flushed_b2) = claim_in_open_transaction('b2');
is($flushed_b1, 't', 'B: the mark mover flushed it before returning');
cmp_ok($token_b2, '>', $token_b1, 'B: the second backend\'s token is the later one');
is($flushed_b2, 't',
	'B: the mark another backend moved is flushed before the covered token is returned');
crash_and_restart_behind($session_b1, $session_b2);
my $after_b = fresh_token('b2');
cmp_ok($after_b, '>', $token_b2, 'B: the covered token\'s key gets a greater token after the crash');
cmp_ok($after_b, '>', $token_b1, 'B: greater than the mark mover\'s token too');

# C. A claim committed asynchronously together with a business row, the
# first claim after a clean restart (so it moves the mark).
$node->stop;
start_with_clock($node, '-1d');
my $token_c = $node->safe_psql('postgres', q{
SET synchronous_commit = off;
INSERT INTO ledger SELECT 'c', token FROM idem_claim('t', 'c', lease => '1 hour') RETURNING token;
});
crash_and_restart_behind();
my $after_c = fresh_token('c');
cmp_ok($after_c, '>', $token_c, 'C: after an asynchronous commit and a crash, the next token is greater');
cmp_ok($after_c, '>', $node->safe_psql('postgres', 'SELECT coalesce(max(token), 0) FROM ledger'),
	'C: greater than every token the ledger kept');

# D. Without shared memory every token moves the mark itself.
$node->append_conf('postgresql.conf', "shared_preload_libraries = ''\n");
$node->stop;
start_with_clock($node, '-1d');
my ($session_d, $token_d, $flushed_d) = claim_in_open_transaction('d');
is($flushed_d, 't', 'D (not preloaded): the mark is flushed before idem_claim returns');
crash_and_restart_behind($session_d);
my $after_d = fresh_token('d');
cmp_ok($after_d, '>', $token_d, 'D (not preloaded): the key\'s next token is greater after the crash');
cmp_ok($after_d, '>', $after_c, 'D: and greater than every token handed out before');

$node->stop;
done_testing();
