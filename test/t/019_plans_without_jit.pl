# The extension's own statements are never compiled by JIT.
#
# They read or write a few rows; compiling them costs about a fifth of a
# second.  Until PostgreSQL 18 a sequential scan left in a plan made with
# enable_seqscan off (hooks.c plan_own_statement) carries the disable cost,
# so a child table by inheritance (which has no index) pushed every claim's
# statements past jit_above_cost: a claim took 0.7 s (45-differential's
# inherited shape, ended by its watchdog under load).  The plans are read
# from auto_explain, which logs the statements our functions run through SPI;
# a user's own statement in the same session is still compiled, so the test
# knows JIT is there to be taken.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('plans_without_jit');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.sweep_interval = 0
lc_messages = 'C'
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

# auto_explain's notices of one session's statements, split per plan
sub plans
{
	my ($sql) = @_;
	my ($stdout, $stderr);
	$node->psql('postgres', qq{
		LOAD 'auto_explain';
		SET auto_explain.log_min_duration = 0;
		SET auto_explain.log_nested_statements = on;
		SET auto_explain.log_level = notice;
		$sql
	}, stdout => \$stdout, stderr => \$stderr, on_error_die => 1);
	return grep { /Query Text:/ } split /NOTICE:\s+duration:/, $stderr;
}

my @control = plans(q{
	SET jit_above_cost = 0;
	SELECT count(*) FROM pg_class;
});
plan skip_all => 'this server has no JIT (jit_provider not installed)'
  unless grep { /JIT:/ } @control;
ok(1, 'a user statement with jit_above_cost = 0 is compiled (the control)');

# 1. a child by inheritance: its sequential scan's disable cost
$node->safe_psql('postgres', q{
	CREATE TABLE archive () INHERITS (idempotency_records);
	SELECT idem_claim('t', 'k1');
	UPDATE idempotency_records SET expires_at = now() - interval '1 min',
		lease_expires_at = now() - interval '1 min' WHERE key = 'k1';
});
my @own = grep { /idempotency_records/ } plans(q{
	BEGIN;
	SELECT outcome FROM idem_claim('t', 'k1');
	SELECT outcome FROM idem_claim('t', 'k2');
	SELECT idem_complete('t', 'k2', (SELECT token FROM idempotency_records WHERE key = 'k2'), '{}');
	SELECT status FROM idem_lookup('t', 'k1');
	COMMIT;
});
cmp_ok(scalar(@own), '>=', 3, 'auto_explain showed the claims\' statements (' . scalar(@own) . ')');
my @seq = grep { /Seq Scan on archive/ } @own;
cmp_ok(scalar(@seq), '>', 0, 'with the child table, their plans scan it sequentially');
my @jit = grep { /JIT:/ && /Query Text: (SELECT status, token|UPDATE public|INSERT INTO public|DELETE FROM public)/ } @own;
is(scalar(@jit), 0, 'no statement of a claim, takeover, completion or lookup was compiled')
  or diag($jit[0]);

# 2. every statement compiled if it could be: jit_above_cost = 0
@own = grep { /public\.idempotency_records/ } plans(q{
	SET jit_above_cost = 0;
	SET jit_inline_above_cost = 0;
	SET jit_optimize_above_cost = 0;
	SELECT outcome FROM idem_claim('t', 'k3');
	SELECT outcome FROM idem_claim('t', 'k3');
	SELECT * FROM idem_claim_many('t', ARRAY['k4', 'k5']);
	SELECT idem_release('t', 'k4', (SELECT token FROM idempotency_records WHERE key = 'k4'));
	SELECT * FROM idem_sweep(100);
});
cmp_ok(scalar(@own), '>=', 4, 'auto_explain showed the statements run on the table (' . scalar(@own) . ')');
@jit = grep { /JIT:/ } @own;
is(scalar(@jit), 0, 'with jit_above_cost = 0, none of them was compiled')
  or diag($jit[0]);

$node->stop;
done_testing();
