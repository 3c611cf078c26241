# Tenant against tenant (issue 45): what a role confined to one tenant by
# tenant isolation, with exactly the application grants of
# docs/privileges.md, can do to other tenants through the extension.
#   - tokens: it may update its own records (a takeover needs UPDATE), so it
#     can set a token by hand; a takeover of a token never handed out is
#     refused (ID004) and the database's token mark, shared by every tenant,
#     does not move: the other tenants' fresh claims go on;
#   - row_security off: every call fails as every statement on the table
#     does (42501), with held claims on as with them off;
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('tenants');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.sweep_interval = 0
lc_messages = 'C'
});
$node->start;

$node->safe_psql('postgres', q{
	CREATE ROLE app LOGIN;
	CREATE EXTENSION idempotency;
	GRANT USAGE ON SCHEMA public TO app;
	GRANT EXECUTE ON FUNCTION idem_claim(text, text, text, interval, interval, interval, text), idem_claim_many(text, text[], text[], interval, interval), idem_complete(text, text, bigint, jsonb), idem_release(text, text, bigint, jsonb), idem_heartbeat(text, text, bigint, interval), idem_checkpoint(text, text, bigint, text, jsonb, interval), idem_child_key(text, text, text), idem_lookup(text, text) TO app;
	GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_records TO app;
	SELECT idem_set_tenant_isolation(true, 'app.tenant');
});

# psql as app, confined to tenant: (stdout, stderr) of sql
sub as_tenant
{
	my ($tenant, $sql, %opts) = @_;
	my ($out, $err);
	$node->psql('postgres', "SET app.tenant = '$tenant';\n$sql",
		stdout => \$out, stderr => \$err,
		extra_params => [ '-U', 'app', '-v', 'ON_ERROR_STOP=1' ], %opts);
	return ($out, $err);
}

sub mark
{
	return $node->safe_psql('postgres', 'SELECT last_value FROM idempotency_tokens');
}

# --- tokens
my ($out, $err) = as_tenant('ta', q{
	SELECT idem_complete('ta', 'k', token, '{"ok": true}') FROM idem_claim('ta', 'k') \g /dev/null
	UPDATE idempotency_records SET token = 9223372036854775806,
		expires_at = now() - interval '1 minute' WHERE tenant_id = 'ta' AND key = 'k';
	SELECT count(*) FROM idempotency_records WHERE token = 9223372036854775806;
});
is($out, '1', "tenant ta sets its own expired record's token to 2^63 - 2 by hand") or diag($err);
my $mark = mark();
($out, $err) = as_tenant('ta', q{SELECT outcome, token FROM idem_claim('ta', 'k')});
like($err, qr/fencing token 9223372036854775806 was never handed out in this database/,
	"its takeover is refused: that token was never handed out");
is(mark(), $mark, "the database's token mark did not move");
($out, $err) = as_tenant('tb', q{SELECT outcome FROM idem_claim('tb', 'fresh')});
is($out, 'claimed', "tenant tb's fresh claims go on") or diag($err);
$node->safe_psql('postgres', q{SELECT idem_forget('ta', 'k')});
($out, $err) = as_tenant('ta', q{SELECT outcome FROM idem_claim('ta', 'k')});
is($out, 'claimed', 'once the operator forgot the record, tenant ta claims the key again')
  or diag($err);

# --- row_security off
for my $defer ('on', 'off')
{
	($out, $err) = as_tenant('ta', qq{
		SET idempotency.defer_writes = $defer;
		SET row_security = off;
		BEGIN;
		SELECT outcome FROM idem_claim('ta', 'rs-$defer');
		COMMIT;
	});
	like($err, qr/query would be affected by row-level security policy for table "idempotency_records"/,
		"row_security off: a claim fails as the statements do (defer_writes $defer)");
	($out, $err) = as_tenant('ta', qq{
		SET idempotency.defer_writes = $defer;
		BEGIN;
		SELECT token FROM idem_claim('ta', 'rs-settle-$defer') \\gset
		SET LOCAL row_security = off;
		SELECT idem_complete('ta', 'rs-settle-$defer', :token, '{"ok": true}');
		COMMIT;
	});
	like($err, qr/query would be affected by row-level security policy for table "idempotency_records"/,
		"row_security off: completing a claim fails as the statements do (defer_writes $defer)");
	($out, $err) = as_tenant('ta', qq{
		SET idempotency.defer_writes = $defer;
		SET row_security = off;
		SELECT outcome FROM idem_claim('ta', 'k');
	});
	like($err, qr/query would be affected by row-level security policy for table "idempotency_records"/,
		"row_security off: a replay fails as the statements do (defer_writes $defer)");
}
is($node->safe_psql('postgres',
	q{SELECT count(*) FROM idempotency_records WHERE key LIKE 'rs-%'}), '0',
	'nothing was written with row_security off');

$node->stop;
done_testing();
