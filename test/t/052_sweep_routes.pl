# Every documented sweep route (issue 46, item 1) under every set-up of the
# table that changes what a sweep may see:
#
#   routes (docs/operations.md "Sweeping", docs/privileges.md):
#     worker    the background sweeper (idempotency.sweep_interval set)
#     cron      pg_cron running SELECT idem_sweep() as idem_sweeper, scheduled
#               with cron.schedule_in_database(..., username => idem_sweeper)
#     operator  idem_sweep() called by idem_operator
#     dba       idem_sweep() called by a superuser that does not own the table
#     bootstrap idem_sweep() called by the bootstrap superuser (the table's
#               owner where the owner is a superuser)
#   set-ups:
#     isolation off / on (idem_set_tenant_isolation)
#     owner     superuser (the bootstrap superuser) / ordinary role
#     FORCE ROW LEVEL SECURITY off / on
#
# Every role has exactly its GRANT lines of docs/privileges.md.  Each route
# of each set-up gets expired records of three tenants, a stale claim, a live
# claim and a completed record still within its retention, written by the
# table's owner; then either every expired record of every tenant and the
# stale claim are gone and the other two are kept, or the route is refused
# as documented (42501, "cannot sweep table ...: row-level security applies
# to role ...") and nothing is gone.
#
# Combinations left out, because they are the same as one that is in:
#   - isolation off with FORCE: isolation off leaves row-level security
#     disabled on the table, and FORCE only subjects the owner to policies
#     where row-level security is enabled (check_enable_rls), so it changes
#     nothing: the same as isolation off without FORCE;
#   - isolation off with a BYPASSRLS owner: nothing to bypass.
# Kept although no refusal is expected: FORCE with a superuser owner
# (superusers bypass row-level security even when it is forced) and FORCE
# with a BYPASSRLS owner (the second fix the refusal's hint names).
#
# And a role holding everything but DELETE is refused by idem_sweep(), called
# directly and as a pg_cron job, with 42501 naming DELETE and the GRANT line.
#
# Runtime: pg_cron's jobs are scheduled first, and everything else is set up
# and the synchronous routes run while they wait for their first run (the
# next minute boundary on pg_cron 1.4, Debian bookworm's, which schedules by
# the minute; 2 seconds on 1.5+).  Every job of every set-up runs at once,
# each in its own database, so covering every set-up costs no more waiting
# than covering one.  The worker (idempotency.sweep_interval = 0 until then)
# comes last, once pg_cron's jobs are unscheduled.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);

my $node = PostgreSQL::Test::Cluster->new('routes');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'pg_cron,idempotency'
cron.database_name = 'postgres'
# jobs run in background workers, so no TCP connection or password is needed;
# every job of every set-up runs at once, each in a worker of its own
cron.use_background_workers = on
max_worker_processes = 32
# off until the worker's turn
idempotency.sweep_interval = 0
lc_messages = 'C'
# the server log gives each error's SQLSTATE (the worker's refusals)
log_error_verbosity = verbose
});
$node->start;

my $bootstrap = $node->safe_psql('postgres', 'SELECT current_user');

# The roles of docs/privileges.md, a superuser that owns nothing, the two
# ordinary owners, and a sweeping role without DELETE.
$node->safe_psql('postgres', q{
	CREATE EXTENSION pg_cron;
	CREATE ROLE idem_operator LOGIN;
	CREATE ROLE idem_sweeper LOGIN;
	CREATE ROLE dba LOGIN SUPERUSER;
	CREATE ROLE owner_plain LOGIN;
	CREATE ROLE owner_bypass LOGIN BYPASSRLS;
	CREATE ROLE sweeper_nodelete LOGIN;
});

# exactly the lines of docs/privileges.md (test/suites/55-privileges checks
# them against the file)
my $grants = q{
GRANT USAGE ON SCHEMA public TO idem_operator;
GRANT EXECUTE ON FUNCTION idem_lookup(text, text), idem_forget(text, text), idem_sweep(integer), idem_record_states(), idem_stats_read(), idem_stats_reset(), idem_node_stats(), idem_cluster_stats() TO idem_operator;
GRANT SELECT, UPDATE, DELETE ON idempotency_records TO idem_operator;
GRANT SELECT ON idem_stats TO idem_operator;
GRANT USAGE ON SCHEMA public TO idem_sweeper;
GRANT EXECUTE ON FUNCTION idem_sweep(integer) TO idem_sweeper;
GRANT SELECT, UPDATE, DELETE ON idempotency_records TO idem_sweeper;
};
# the sweeping role's lines, DELETE left out
my $grants_nodelete = q{
GRANT USAGE ON SCHEMA public TO sweeper_nodelete;
GRANT EXECUTE ON FUNCTION idem_sweep(integer) TO sweeper_nodelete;
GRANT SELECT, UPDATE ON idempotency_records TO sweeper_nodelete;
};

# The set-ups: iso (tenant isolation), owner (the table's), force (FORCE ROW
# LEVEL SECURITY); refused: the role every route's refusal names, none where
# every route sweeps.
my @setups = (
	{ name => 'off_super',       iso => 0, owner => $bootstrap,    force => 0 },
	{ name => 'off_plain',       iso => 0, owner => 'owner_plain', force => 0 },
	{ name => 'on_super',        iso => 1, owner => $bootstrap,    force => 0 },
	{ name => 'on_super_force',  iso => 1, owner => $bootstrap,    force => 1 },
	{ name => 'on_plain',        iso => 1, owner => 'owner_plain', force => 0 },
	{ name => 'on_plain_force',  iso => 1, owner => 'owner_plain', force => 1,
	  refused => 'owner_plain' },
	{ name => 'on_bypass_force', iso => 1, owner => 'owner_bypass', force => 1 },
);

sub describe
{
	my ($s) = @_;
	return sprintf('isolation %s, %s owner%s',
		$s->{iso} ? 'on' : 'off',
		$s->{owner} eq $bootstrap ? 'superuser'
		  : $s->{owner} eq 'owner_bypass' ? 'ordinary BYPASSRLS'
		  : 'ordinary',
		$s->{force} ? ', FORCE ROW LEVEL SECURITY' : '');
}

my $refusal_re = sub {
	my ($role) = @_;
	return qr/cannot sweep table public\.idempotency_records: row-level security applies to role "\Q$role\E"/;
};

# One database per set-up and route family: c_ (pg_cron), s_ (the
# synchronous routes, one after another, each with records of its own), w_
# (the worker).
sub set_up
{
	my ($db, $s) = @_;
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	my $sql = "CREATE EXTENSION idempotency;\n";
	$sql .= "SELECT idem_set_tenant_isolation(true, 'app.tenant');\n" if $s->{iso};
	$sql .= "ALTER TABLE idempotency_records OWNER TO $s->{owner};\n"
	  if $s->{owner} ne $bootstrap;
	$sql .= "ALTER TABLE idempotency_records FORCE ROW LEVEL SECURITY;\n" if $s->{force};
	$sql .= $grants . $grants_nodelete;
	$node->safe_psql($db, $sql);
}

# Records for one route, written by the table's owner, one tenant at a time
# (under FORCE the policy applies to an ordinary owner's INSERT too):
# 5 expired completed records of each of three tenants, a stale claim (its
# lease ended), a live claim and a completed record within its retention.
sub add_records
{
	my ($db, $owner, $p) = @_;
	my $sql = '';
	for my $t (qw(tenant-a tenant-b tenant-c))
	{
		$sql .= qq{
			SET app.tenant = '$t';
			INSERT INTO idempotency_records
				(token, expires_at, created_at, updated_at, ttl, tenant_id, key, status)
			SELECT g, now() - interval '1 hour', now() - interval '2 hours',
				now() - interval '2 hours', interval '1 hour', '$t', '$p-expired-' || g, 'completed'
			FROM generate_series(1, 5) g;
		};
	}
	$sql .= qq{
		SET app.tenant = 'tenant-c';
		INSERT INTO idempotency_records
			(token, expires_at, lease_expires_at, created_at, updated_at, ttl, tenant_id, key, status)
		VALUES (10, now() - interval '1 minute', now() - interval '1 minute', now() - interval '2 minutes',
			now() - interval '2 minutes', interval '1 hour', 'tenant-c', '$p-stale', 'processing');
		SET app.tenant = 'tenant-a';
		INSERT INTO idempotency_records
			(token, expires_at, lease_expires_at, created_at, updated_at, ttl, tenant_id, key, status)
		VALUES (11, now() + interval '1 hour', now() + interval '1 hour', now(), now(),
			interval '1 hour', 'tenant-a', '$p-live', 'processing');
		SET app.tenant = 'tenant-b';
		INSERT INTO idempotency_records
			(token, expires_at, created_at, updated_at, ttl, tenant_id, key, status)
		VALUES (12, now() + interval '1 hour', now(), now(), interval '1 hour',
			'tenant-b', '$p-kept', 'completed');
	};
	$node->safe_psql($db, $sql, extra_params => [ '-U', $owner ]);
}

# What is left of one route's records, read by the bootstrap superuser (who
# bypasses row-level security, and meets no code of the owner's here).
sub left_of
{
	my ($db, $p) = @_;
	return $node->safe_psql($db, qq{
		SELECT 'expired: ' || coalesce((
			SELECT string_agg(tenant_id || '=' || n, ' ' ORDER BY tenant_id)
			FROM (SELECT tenant_id, count(*) AS n FROM idempotency_records
				  WHERE key LIKE '$p-expired-%' GROUP BY tenant_id) e), 'none')
		|| '; stale: ' || (SELECT count(*) FROM idempotency_records WHERE key = '$p-stale')
		|| '; kept: ' || coalesce((
			SELECT string_agg(key, ' ' ORDER BY key) FROM idempotency_records
			WHERE key IN ('$p-live', '$p-kept')), 'none')});
}

sub all_left    { my ($p) = @_; return "expired: tenant-a=5 tenant-b=5 tenant-c=5; stale: 1; kept: $p-kept $p-live" }
sub swept_state { my ($p) = @_; return "expired: none; stale: 0; kept: $p-kept $p-live" }

# --- pg_cron first, so that everything else runs while it waits for its
# first run.  pg_cron 1.5 schedules in seconds; 1.4 by the minute.
for my $s (@setups)
{
	set_up("c_$s->{name}", $s);
	add_records("c_$s->{name}", $s->{owner}, 'cron');
}
set_up('c_nodelete', { iso => 1, owner => 'owner_plain', force => 0 });
add_records('c_nodelete', 'owner_plain', 'cron');

my @cron_version = split /[.-]/, $node->safe_psql('postgres',
	q{SELECT extversion FROM pg_extension WHERE extname = 'pg_cron'});
my $seconds = $cron_version[0] > 1 || ($cron_version[0] == 1 && $cron_version[1] >= 5);
my $schedule = $seconds ? '2 seconds' : '* * * * *';
my %job;
for my $db ((map { "c_$_->{name}" } @setups), 'c_nodelete')
{
	my $role = $db eq 'c_nodelete' ? 'sweeper_nodelete' : 'idem_sweeper';
	$job{$db} = $node->safe_psql('postgres', qq{
		SELECT cron.schedule_in_database('sweep-$db', '$schedule', 'SELECT idem_sweep()',
										 '$db', '$role')});
}
is( $node->safe_psql('postgres', q{
		SELECT string_agg(DISTINCT username || ' ' || command, ', '
			ORDER BY username || ' ' || command) FROM cron.job}),
	'idem_sweeper SELECT idem_sweep(), sweeper_nodelete SELECT idem_sweep()',
	'the pg_cron jobs run SELECT idem_sweep() as idem_sweeper (and one as sweeper_nodelete)');

for my $s (@setups)
{
	set_up("s_$s->{name}", $s);
	set_up("w_$s->{name}", $s);
	add_records("w_$s->{name}", $s->{owner}, 'worker');
}

# --- the synchronous routes: idem_sweep() by the operator, by a superuser
# that does not own the table, by the bootstrap superuser
sub call_sweep
{
	my ($db, $role) = @_;
	my ($out, $err) = ('', '');
	$node->psql($db, "\\set VERBOSITY verbose\nSELECT * FROM idem_sweep();",
		stdout => \$out, stderr => \$err, extra_params => [ '-U', $role ]);
	return ($out, $err);
}

for my $s (@setups)
{
	my $db = "s_$s->{name}";
	for my $role ('idem_operator', 'dba', $bootstrap)
	{
		my $p = $role eq $bootstrap ? 'bootstrap' : $role;
		my $route = $role eq $bootstrap
		  ? ($s->{owner} eq $bootstrap ? 'the bootstrap superuser (the owner)' : 'the bootstrap superuser')
		  : $role eq 'dba' ? 'a superuser not the owner' : 'the operator';
		add_records($db, $s->{owner}, $p);
		my ($out, $err) = call_sweep($db, $role);
		if ($s->{refused})
		{
			like($err, qr/ERROR:  42501: ${\ $refusal_re->($s->{refused}) }/,
				describe($s) . ": idem_sweep() by $route is refused (42501)");
			like($err, qr/HINT:  ALTER TABLE public\.idempotency_records NO FORCE ROW LEVEL SECURITY, or give the owner BYPASSRLS\./,
				describe($s) . ": the refusal names the fixes");
			is(left_of($db, $p), all_left($p), describe($s) . ": and nothing is removed");
		}
		else
		{
			is($out, '15|1|0',
				describe($s) . ": idem_sweep() by $route removes 15 expired records and releases the stale claim")
			  or diag($err);
			is(left_of($db, $p), swept_state($p),
				describe($s) . ": no expired record of any tenant is left, the live ones are kept");
		}
	}

	# a role with the sweeping role's grants but DELETE
	add_records($db, $s->{owner}, 'nodelete');
	my ($out, $err) = call_sweep($db, 'sweeper_nodelete');
	like($err, qr/ERROR:  42501: idem_sweep\(\) needs the DELETE privilege on table public\.idempotency_records\n/,
		describe($s) . ': idem_sweep() by a role without DELETE is refused (42501), naming DELETE');
	like($err, qr/HINT:  GRANT SELECT, UPDATE, DELETE ON public\.idempotency_records TO sweeper_nodelete;\n/,
		describe($s) . ': the refusal gives the GRANT line');
	is(left_of($db, 'nodelete'), all_left('nodelete'), describe($s) . ': and nothing is removed');
}

# --- pg_cron's first runs
my $jobs = join(', ', values %job);
ok( $node->poll_query_until('postgres', qq{
		SELECT count(DISTINCT jobid) = ${\ scalar(keys %job) } FROM cron.job_run_details
		WHERE jobid IN ($jobs) AND status IN ('succeeded', 'failed')}),
	'pg_cron has run every job');
$node->safe_psql('postgres', "SELECT cron.unschedule(jobid) FROM cron.job");

sub first_run
{
	my ($db) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT status || ': ' || return_message FROM cron.job_run_details
		WHERE jobid = $job{$db} AND status IN ('succeeded', 'failed')
		ORDER BY runid LIMIT 1});
}

for my $s (@setups)
{
	my $db = "c_$s->{name}";
	my $run = first_run($db);
	if ($s->{refused})
	{
		like($run, qr/^failed: .*${\ $refusal_re->($s->{refused}) }/,
			describe($s) . ": the pg_cron job fails with the refusal");
		like($run, qr/HINT: ALTER TABLE public\.idempotency_records NO FORCE ROW LEVEL SECURITY, or give the owner BYPASSRLS\./,
			describe($s) . ": its history names the fixes");
		is(left_of($db, 'cron'), all_left('cron'), describe($s) . ': and nothing is removed');
	}
	else
	{
		is($run, 'succeeded: SELECT 1', describe($s) . ': the pg_cron job succeeds');
		is(left_of($db, 'cron'), swept_state('cron'),
			describe($s) . ": pg_cron's idem_sweep() leaves no expired record of any tenant, keeps the live ones");
	}
}
my $nodelete_run = first_run('c_nodelete');
like($nodelete_run,
	qr/^failed: .*idem_sweep\(\) needs the DELETE privilege on table public\.idempotency_records/,
	'a pg_cron job as a role without DELETE fails, naming DELETE');
like($nodelete_run,
	qr/HINT: GRANT SELECT, UPDATE, DELETE ON public\.idempotency_records TO sweeper_nodelete;/,
	"its history gives the GRANT line for the job's role");
is(left_of('c_nodelete', 'cron'), all_left('cron'), 'and removes nothing');

# Does the server log, from offset on, match re?  Waits for it up to the
# default timeout (the worker logs its error before idem_stats shows it, so
# this normally answers at once).
sub log_shows
{
	my ($re, $offset) = @_;
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	while (1)
	{
		return 1 if slurp_file($node->logfile, $offset) =~ $re;
		return 0 if time() > $deadline;
		sleep(0.1);
	}
}

# --- the worker, over every w_ database at once; until now nothing swept them
is_deeply(
	{ map { ("w_$_->{name}" => left_of("w_$_->{name}", 'worker')) } @setups },
	{ map { ("w_$_->{name}" => all_left('worker')) } @setups },
	'before the worker runs, every record of its databases is there');
my $log_offset = -s $node->logfile;
$node->safe_psql('postgres', q{
	ALTER SYSTEM SET idempotency.sweep_interval = '1s';
	SELECT pg_reload_conf();
});

for my $s (@setups)
{
	my $db = "w_$s->{name}";
	if ($s->{refused})
	{
		my $message = qq{cannot sweep table public.idempotency_records: row-level security applies to role "$s->{refused}"};
		ok( $node->poll_query_until($db, qq{
				SELECT last_sweep_error = '$message'
				FROM idem_stats WHERE datname = current_database()}),
			describe($s) . ": the worker's pass fails with the refusal (idem_stats.last_sweep_error)");
		is($node->safe_psql($db, 'SELECT sweep_errors_total > 0 FROM idem_metrics()'), 't',
			describe($s) . ': idem_metrics counts the failed passes (sweep_errors_total)');
		is(left_of($db, 'worker'), all_left('worker'), describe($s) . ': and nothing is removed');
		ok( log_shows(
				qr/ERROR:  42501: \Q$message\E\n(?:(?!.*ERROR:).*\n){0,4}?.*CONTEXT:  idempotency sweep of database "$db"\n/,
				$log_offset),
			describe($s) . ': the server log has the refusal, 42501, with its database');
	}
	else
	{
		ok( $node->poll_query_until($db, q{
				SELECT count(*) = 0 FROM idempotency_records
				WHERE key LIKE 'worker-expired-%' OR key = 'worker-stale'}),
			describe($s) . ': the worker sweeps');
		is(left_of($db, 'worker'), swept_state('worker'),
			describe($s) . ": the worker leaves no expired record of any tenant, keeps the live ones");
		is($node->safe_psql($db, q{
				SELECT last_sweep_error IS NULL FROM idem_stats WHERE datname = current_database()}),
			't', describe($s) . ': with no sweep error');
	}
}

$node->stop;
done_testing();
