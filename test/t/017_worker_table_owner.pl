# The worker connects as the bootstrap superuser but sweeps as the owner of
# idempotency_records, in a security-restricted operation: when the table
# belongs to an ordinary role, that role's triggers cannot borrow the
# worker's superuser rights.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('owner');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.sweep_interval = 1s
lc_messages = 'C'
});
$node->start;

$node->safe_psql('postgres', q{
	CREATE ROLE app LOGIN;
	GRANT CREATE ON SCHEMA public TO app;
	CREATE EXTENSION idempotency;
	ALTER TABLE idempotency_records OWNER TO app;
});

sub add_expired
{
	my ($prefix) = @_;
	$node->safe_psql('postgres', qq{
		INSERT INTO idempotency_records
			(token, expires_at, created_at, updated_at, ttl, tenant_id, key, status)
		SELECT 1, now() - interval '1 hour', now(), now(), interval '1 hour',
			'tenant', '$prefix-' || g, 'completed'
		FROM generate_series(1, 100) g});
}

add_expired('plain');
ok($node->poll_query_until('postgres', 'SELECT count(*) = 0 FROM idempotency_records'),
	'a table owned by an ordinary role is swept');

# the owner plants a trigger that tries to make it a superuser
$node->safe_psql('postgres', q{
	SET ROLE app;
	CREATE FUNCTION promote_me() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		ALTER ROLE app SUPERUSER;
		RETURN NULL;
	END $$;
	CREATE TRIGGER promote_me AFTER DELETE ON idempotency_records
		FOR EACH STATEMENT EXECUTE FUNCTION promote_me();
});
add_expired('trap');
# PostgreSQL 16 reworded the refusal (the rest moved to its DETAIL)
my $superuser_refusal = $node->pg_version >= 16
  ? 'permission denied to alter role'
  : 'must be superuser to alter superuser roles or change superuser attribute';
ok( $node->poll_query_until(
		'postgres', qq{
		SELECT last_sweep_error = '$superuser_refusal'
		FROM idem_stats WHERE datname = current_database()}),
	"the trigger runs with the owner's rights and fails");
# idem_metrics (1.3) counts the passes that ended in an error
is( $node->safe_psql(
		'postgres', q{
		SELECT sweep_errors_total > 0 AND sweep_errors_total <= sweeps_total
		FROM idem_metrics()}),
	't',
	'idem_metrics counts the failed passes (sweep_errors_total)');
is($node->safe_psql('postgres', q{SELECT rolsuper FROM pg_roles WHERE rolname = 'app'}),
	'f', 'the owner did not become a superuser');
is($node->safe_psql('postgres', 'SELECT count(*) FROM idempotency_records'),
	100, 'the failed batch was rolled back');

$node->stop;
done_testing();
