# idem_metrics() and idem_metrics_tenants() without the library preloaded
# (issue 46, item 2): a server not restarted yet after the library was added
# to shared_preload_libraries (or a database just migrated from the SQL
# edition) answers with what the table and the lock table give, and NULL for
# what only shared memory holds (the outcome counters, the sweeps, the
# tenants' conflicts), instead of failing every scrape with 55000.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('metrics_no_preload');
$node->init;
$node->append_conf('postgresql.conf', "lc_messages = 'C'\n");
$node->start;

$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	SELECT idem_claim('shop-a', 'in-flight', lease => '1 hour');
	INSERT INTO idempotency_records
		(token, expires_at, created_at, updated_at, ttl, tenant_id, key, status)
	SELECT g, now() - interval '1 minute', now(), now(), interval '1 hour', 'shop-b', 'old-' || g, 'completed'
	FROM generate_series(1, 3) g;
});
is( $node->safe_psql('postgres', q{SHOW shared_preload_libraries}), '',
	'the library is not preloaded');
is( $node->safe_psql('postgres', q{
		SELECT claims_in_progress || ' ' || expired_unswept_records || ' '
		       || (lock_table_used_ratio BETWEEN 0 AND 1)
		FROM idem_metrics()}),
	'1 3 true', 'idem_metrics() gives the gauges of the table and the lock table');
is( $node->safe_psql('postgres', q{
		SELECT num_nulls(claimed_total, replays_total, in_progress_total, mismatches_total,
		                 failed_total, takeovers_total, sweeps_total, sweep_errors_total,
		                 last_sweep_at, stats_reset)
		FROM idem_metrics()}),
	'10', 'and NULL for the counters and sweeps that only shared memory holds');
is( $node->safe_psql('postgres', q{
		SELECT tenant || ' ' || claims_in_progress || ' ' || (conflicts_total IS NULL)
		FROM idem_metrics_tenants(10)}),
	'shop-a 1 true', 'idem_metrics_tenants() names the tenants with claims, conflicts NULL');

$node->stop;
done_testing();
