# The sweep's DELETE fetches its batch by ctid, whatever the statistics say.
#
# A batch is "DELETE ... WHERE ctid = ANY (ARRAY(SELECT ctid ... LIMIT n))"
# plus, for the batch that deletes without row locks, a recheck of the
# expiry.  Written as an operator, that recheck let the planner, fed
# statistics taken before the backlog existed (every expiry in the future),
# scan the expires_at index for the whole backlog and test each entry
# against the batch's ctids: one batch of a 3,000,000-row backlog ran for
# over 12 s and the launcher never reached the next database (found by the
# full benchmark, fixed in 9b019a5).  The plans are read from auto_explain,
# which logs the statements idem_sweep() runs through SPI.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $backlog = 200_000;

my $node = PostgreSQL::Test::Cluster->new('sweep_plan');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.sweep_interval = 0
# the statistics must stay those taken before the backlog
autovacuum = off
lc_messages = 'C'
log_statement = none
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

# The statistics of a table whose records all expire tomorrow ...
$node->safe_psql('postgres', q{
	INSERT INTO idempotency_records
		(token, expires_at, created_at, updated_at, ttl, tenant_id, key, status, response)
	SELECT g, now() + interval '1 day', now(), now(), interval '1 day',
		'live', 'order-' || g, 'completed', '{"status": 201}'
	FROM generate_series(1, 20000) g;
	ANALYZE idempotency_records;
});
# ... then a backlog they know nothing of: completed records and stale
# claims, all expired
$node->safe_psql('postgres', qq{
	INSERT INTO idempotency_records
		(token, expires_at, lease_expires_at, created_at, updated_at, ttl, tenant_id, key,
		 status, response)
	SELECT 100000 + g, now() - interval '1 hour' + g * interval '10 ms',
		CASE WHEN g % 4 = 0 THEN now() - interval '1 hour' END,
		now() - interval '1 day', now() - interval '1 day', interval '1 day',
		'backlog', 'order-' || g, CASE WHEN g % 4 = 0 THEN 'processing' ELSE 'completed' END,
		CASE WHEN g % 4 = 0 THEN NULL ELSE '{"status": 201}'::jsonb END
	FROM generate_series(1, $backlog) g;
});

my ($stdout, $stderr);
$node->psql('postgres', q{
	LOAD 'auto_explain';
	SET auto_explain.log_min_duration = 0;
	SET auto_explain.log_nested_statements = on;
	SET auto_explain.log_level = notice;
	SELECT expired_removed + stale_released FROM idem_sweep(10000);
}, stdout => \$stdout, stderr => \$stderr, on_error_die => 1);

is($stdout, $backlog, "idem_sweep() removed or released the whole backlog of $backlog");
is($node->safe_psql('postgres',
	q{SELECT count(*) FROM idempotency_records WHERE tenant_id = 'backlog'}),
	'0', 'no backlog record is left');

# one auto_explain notice per statement; keep the sweep's DELETEs
my @plans = grep { /Query Text: DELETE FROM/ } split /NOTICE:\s+duration:/, $stderr;
cmp_ok(scalar(@plans), '>=', $backlog / 10000,
	'auto_explain showed the plan of every batch (' . scalar(@plans) . ' DELETEs)');
my @by_ctid = grep { /TID Cond: \(ctid = ANY/ } @plans;
is(scalar(@by_ctid), scalar(@plans),
	'every batch fetches its rows by ctid (a Tid Scan), none walks the expires_at index')
  or diag((grep { !/TID Cond: \(ctid = ANY/ } @plans)[0]);
my @unlocked = grep { /timestamptz_le/ } @plans;
cmp_ok(scalar(@unlocked), '>', 0,
	'the batches that delete without row locks, with their expiry recheck, were among them');

$node->stop;
done_testing();
