# idem_sweep() in one transaction, as pg_cron runs it (issue 46, item 4):
# over a backlog of many batches it uses a bounded number of subtransaction
# XIDs (each batch that tries the delete without row locks is a
# subtransaction; past the first 32, batches use the locking statement,
# which needs none), and its memory stays flat from batch to batch (each
# batch's rows and allocations go when it ends).
#   - XIDs: before COMMIT, the distinct xmax of the deleted rows (pageinspect)
#     are the top transaction's and at most 32 subtransactions';
#   - memory: a statement trigger on the records table samples the backend's
#     memory in use (pg_backend_memory_contexts) at every batch's DELETE.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('sweep_one_xact');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.sweep_interval = 0
lc_messages = 'C'
});
$node->start;

my $rows = 80000;
my $batch = 1000;
$node->safe_psql('postgres', qq{
	CREATE EXTENSION idempotency;
	CREATE EXTENSION pageinspect;
	INSERT INTO idempotency_records
		(token, expires_at, created_at, updated_at, ttl, tenant_id, key, status, response)
	SELECT g, now() - interval '1 hour' + g * interval '1 ms', now(), now(), interval '1 hour',
		'tenant-' || (g % 7), 'key-' || g, 'completed', '{"ok": true}'
	FROM generate_series(1, $rows) g;
	CREATE TABLE sweep_memory (n bigserial PRIMARY KEY, used bigint NOT NULL);
	CREATE FUNCTION sample_memory() RETURNS trigger LANGUAGE plpgsql AS \$\$
	BEGIN
		INSERT INTO public.sweep_memory (used)
		SELECT sum(used_bytes) FROM pg_catalog.pg_backend_memory_contexts;
		RETURN NULL;
	END \$\$;
	CREATE TRIGGER sample_memory AFTER DELETE ON idempotency_records
		FOR EACH STATEMENT EXECUTE FUNCTION sample_memory();
});

my $out = $node->safe_psql('postgres', qq{
	BEGIN;
	SELECT expired_removed FROM idem_sweep($batch);
	SELECT count(DISTINCT t_xmax::text)
	FROM generate_series(0, pg_relation_size('idempotency_records') / 8192 - 1) AS b,
		LATERAL heap_page_items(get_raw_page('idempotency_records', b::int)) AS t
	WHERE t.t_xmax <> '0';
	COMMIT;
});
my ($removed, $xids) = split /\n/, $out;
is($removed, $rows, "idem_sweep($batch) removes the $rows expired records in one transaction");
cmp_ok($xids, '<=', 33,
	"the deleted rows carry at most 33 distinct xmax (the transaction and 32 subtransactions): $xids");

# the level at the end against the level at the start (medians of 10
# samples each, past the first few): a batch's executor state comes and
# goes, what a pass keeps from batch to batch would add up
my ($batches, $growth) = split /\|/, $node->safe_psql('postgres', q{
	WITH s AS (SELECT used, row_number() OVER (ORDER BY n) AS i, count(*) OVER () AS k
	           FROM sweep_memory)
	SELECT max(k),
	       (percentile_cont(0.5) WITHIN GROUP (ORDER BY used) FILTER (WHERE i > k - 10)
	        - percentile_cont(0.5) WITHIN GROUP (ORDER BY used) FILTER (WHERE i BETWEEN 6 AND 15))::bigint
	FROM s});
cmp_ok($batches, '>=', $rows / $batch - 5, "the trigger sampled $batches batch statements");
cmp_ok($growth, '<', 256 * 1024,
	"the backend's memory in use at the last batches is within 256 kB of the first ($growth bytes more)");

$node->stop;
done_testing();
