# Planted code (issue 45): a non-superuser owner of idempotency_records plants
# code that makes it a superuser if it ever runs with a superuser's rights
# (an expression index, a partial-index predicate, expression statistics, a
# trigger, a rule, a column default, a policy), and then every path of the
# extension that runs with more rights than its caller runs: a pg_monitor
# scrape, several passes of the sweeper worker, idem_sweep() called by a
# superuser and by the operator role, a pg_cron job scheduled by the
# superuser, and ALTER EXTENSION ... UPDATE run by a superuser.  Nothing
# escalates, and the planted code, wherever it runs, runs as the owner: the
# server log names the role it ran as.  Tenant isolation is on and every
# role has exactly the grants of docs/privileges.md.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);

my $node = PostgreSQL::Test::Cluster->new('planted');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'pg_cron,idempotency'
cron.database_name = 'postgres'
cron.use_background_workers = on
idempotency.sweep_interval = 0
lc_messages = 'C'
});
$node->start;

# the roles of docs/privileges.md, and mallory, who will own the table
$node->safe_psql('postgres', q{
	CREATE EXTENSION pg_cron;
	CREATE ROLE mallory LOGIN;
	GRANT CREATE ON SCHEMA public TO mallory;
	CREATE ROLE scraper LOGIN IN ROLE pg_monitor;
	CREATE ROLE idem_operator LOGIN;
	CREATE EXTENSION idempotency;
	SELECT idem_set_tenant_isolation(true, 'app.tenant');
	GRANT USAGE ON SCHEMA public TO idem_operator;
	GRANT EXECUTE ON FUNCTION idem_lookup(text, text), idem_forget(text, text), idem_sweep(integer), idem_record_states(), idem_stats_read(), idem_stats_reset(), idem_node_stats(), idem_cluster_stats() TO idem_operator;
	GRANT SELECT, UPDATE, DELETE ON idempotency_records TO idem_operator;
	ALTER TABLE idempotency_records OWNER TO mallory;
});

# What mallory plants.  escalate() makes mallory a superuser when it runs as
# one, and logs the role it runs as; planted_imm() is IMMUTABLE, so that
# index expressions, predicates and statistics may call it, and PostgreSQL
# folds it (runs it) when it plans or opens the table.
my $plant = q{
	CREATE FUNCTION public.escalate() RETURNS boolean LANGUAGE plpgsql AS $$
	BEGIN
		RAISE LOG 'planted code ran as %', current_user;
		IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
			ALTER ROLE mallory SUPERUSER;
		END IF;
		RETURN true;
	END $$;
	CREATE FUNCTION public.planted_imm() RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
	BEGIN
		PERFORM public.escalate();
		RETURN 'x';
	END $$;
	CREATE FUNCTION public.escalate_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM public.escalate();
		RETURN NULL;
	END $$;
	CREATE INDEX planted_expression ON idempotency_records ((key || public.planted_imm()));
	CREATE INDEX planted_predicate ON idempotency_records (key) WHERE public.planted_imm() = 'x';
	CREATE STATISTICS planted_statistics ON (key || public.planted_imm()), status
		FROM idempotency_records;
	CREATE TRIGGER planted_trigger AFTER DELETE ON idempotency_records
		FOR EACH STATEMENT EXECUTE FUNCTION public.escalate_trigger();
	CREATE RULE planted_rule AS ON UPDATE TO idempotency_records DO ALSO SELECT public.escalate();
	ALTER TABLE idempotency_records ALTER COLUMN fingerprint
		SET DEFAULT (CASE WHEN public.escalate() THEN NULL END);
	CREATE POLICY planted_policy ON idempotency_records AS RESTRICTIVE
		USING (public.escalate());
	ANALYZE idempotency_records;
};

sub plant
{
	my ($db) = @_;
	as_owner($db, $plant);
}

# The test reads and writes the table only as mallory: a superuser's own
# statement on it would run mallory's code with superuser rights in plain
# PostgreSQL too, whatever the extension does.
sub as_owner
{
	my ($db, $sql) = @_;
	return $node->safe_psql($db, $sql, extra_params => [ '-U', 'mallory' ]);
}

sub add_expired
{
	my ($db, $prefix, $n) = @_;
	as_owner($db, qq{
		INSERT INTO idempotency_records
			(token, expires_at, created_at, updated_at, ttl, tenant_id, key, status, fingerprint)
		SELECT g, now() - interval '1 hour', now(), now(), interval '1 hour',
			'tenant-' || (g % 3), '$prefix-' || g, 'completed', NULL
		FROM generate_series(1, $n) g});
}

sub left_of
{
	my ($db, $prefix) = @_;
	return as_owner($db,
		"SELECT count(*) FROM idempotency_records WHERE key LIKE '$prefix-%'");
}

# Did mallory become a superuser?  Taken back at once, so that each path is
# judged on its own.
sub mallory_is_superuser
{
	my $is = $node->safe_psql('postgres',
		q{SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'}) eq 't';
	$node->safe_psql('postgres', 'ALTER ROLE mallory NOSUPERUSER') if $is;
	return $is;
}

plant('postgres');
my $log_start = -s $node->logfile;

# --- a pg_monitor scrape
add_expired('postgres', 'scrape', 10);
my ($rc, $out, $err) = $node->psql('postgres',
	'SELECT expired_unswept_records FROM idem_metrics()',
	extra_params => [ '-U', 'scraper' ]);
is($out, '10', "a scrape (idem_metrics() as a member of pg_monitor) counts every tenant's records")
  or diag($err);
($rc, $out, $err) = $node->psql('postgres',
	'SELECT count(*) >= 0 FROM idem_metrics_tenants(10)',
	extra_params => [ '-U', 'scraper' ]);
is($out, 't', 'idem_metrics_tenants() as a member of pg_monitor') or diag($err);
ok(!mallory_is_superuser(), 'after the scrape, the owner is not a superuser');

# --- idem_sweep() by a superuser, as pg_cron's superuser job would run it
($rc, $out, $err) = $node->psql('postgres',
	'SELECT expired_removed FROM idem_sweep()');
is($out, '10', 'idem_sweep() by a superuser removes the expired records') or diag($err);
ok(!mallory_is_superuser(), 'after idem_sweep() by a superuser, the owner is not a superuser');

# --- idem_sweep() by the operator, tenant isolation on, no tenant set
add_expired('postgres', 'operator', 9);
($rc, $out, $err) = $node->psql('postgres',
	'SELECT expired_removed FROM idem_sweep()',
	extra_params => [ '-U', 'idem_operator' ]);
is($out, '9', "idem_sweep() by the operator removes every tenant's expired records")
  or diag($err);
ok(!mallory_is_superuser(), 'after idem_sweep() by the operator, the owner is not a superuser');

# --- the sweeper worker, several passes
add_expired('postgres', 'worker', 30);
$node->safe_psql('postgres', q{
	ALTER SYSTEM SET idempotency.sweep_interval = '1s';
	SELECT pg_reload_conf();
});
my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
sleep(0.1) while left_of('postgres', 'worker') ne '0' && time() < $deadline;
is(left_of('postgres', 'worker'), '0', 'the sweeper removes the expired records');
my $sweeps = $node->safe_psql('postgres', 'SELECT sweeps_total FROM idem_metrics()');
ok( $node->poll_query_until(
		'postgres', "SELECT sweeps_total >= $sweeps + 3 FROM idem_metrics()"),
	'the sweeper makes three more passes');
ok(!mallory_is_superuser(), 'after the sweeper passes, the owner is not a superuser');
$node->safe_psql('postgres', q{
	ALTER SYSTEM SET idempotency.sweep_interval = 0;
	SELECT pg_reload_conf();
});

# --- a pg_cron job, scheduled by the superuser
add_expired('postgres', 'cron', 5);
my $cron_version = $node->safe_psql('postgres',
	q{SELECT extversion FROM pg_extension WHERE extname = 'pg_cron'});
# pg_cron 1.5 schedules in seconds; 1.4 (bookworm's) by the minute
my $schedule = $cron_version ge '1.5' ? '2 seconds' : '* * * * *';
my $job = $node->safe_psql('postgres',
	qq{SELECT cron.schedule('planted-sweep', '$schedule', 'SELECT idem_sweep()')});
ok( $node->poll_query_until(
		'postgres', qq{
		SELECT count(*) > 0 FROM cron.job_run_details
		WHERE jobid = $job AND status IN ('succeeded', 'failed')}),
	'pg_cron has run the superuser\'s idem_sweep() job');
$node->safe_psql('postgres', qq{SELECT cron.unschedule($job)});
is(left_of('postgres', 'cron'), '0', "the pg_cron job removed the expired records");
ok(!mallory_is_superuser(), 'after the pg_cron job, the owner is not a superuser');

# --- ALTER EXTENSION ... UPDATE by a superuser, on a table planted before it:
# the released scripts 1.0--1.1 and 1.1--1.2 read and update the table with
# the updater's rights, so the update is refused until the code is gone
$node->safe_psql('postgres', 'CREATE DATABASE updated');
$node->safe_psql('updated', q{
	GRANT CREATE ON SCHEMA public TO mallory;
	CREATE EXTENSION idempotency VERSION '1.0';
	ALTER TABLE idempotency_records OWNER TO mallory;
});
as_owner('updated', q{
	INSERT INTO idempotency_records
		(token, expires_at, created_at, updated_at, ttl, tenant_id, key, status)
	VALUES (1, now() + interval '1 hour', now(), now(), interval '1 hour', 't', 'k', 'completed');
});
plant('updated');
($rc, $out, $err) = $node->psql('updated', 'ALTER EXTENSION idempotency UPDATE');
like($err, qr/cannot update extension "idempotency" while table public\.idempotency_records carries code of its owner "mallory"/,
	'ALTER EXTENSION idempotency UPDATE is refused while the table carries the owner\'s code');
is($node->safe_psql('updated', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'1.0', 'and nothing was updated');
ok(!mallory_is_superuser(), 'after the refused update, the owner is not a superuser');
as_owner('updated', q{
	DROP INDEX planted_expression, planted_predicate;
	DROP STATISTICS planted_statistics;
	DROP TRIGGER planted_trigger ON idempotency_records;
	DROP RULE planted_rule ON idempotency_records;
	ALTER TABLE idempotency_records ALTER COLUMN fingerprint DROP DEFAULT;
	DROP POLICY planted_policy ON idempotency_records;
});
($rc, $out, $err) = $node->psql('updated', 'ALTER EXTENSION idempotency UPDATE');
is($rc, 0, 'once the owner dropped its code, the update runs') or diag($err);
is(as_owner('updated', q{SELECT count(*) FROM idempotency_records}), '1',
	'and keeps the record');

# --- where the planted code ran
my $log = slurp_file($node->logfile, $log_start);
my %ran_as;
$ran_as{$1}++ while $log =~ /LOG:  planted code ran as (\w+)/g;
ok($ran_as{mallory}, 'the planted code ran, as its owner, on these paths')
  or diag(explain \%ran_as);
is_deeply([ grep { $_ ne 'mallory' } sort keys %ran_as ], [],
	'the planted code never ran as anyone but its owner')
  or diag(explain \%ran_as);

$node->stop;
done_testing();
