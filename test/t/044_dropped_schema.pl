# A catalog lookup that finds nothing is an error of its own, never a NULL
# used as a name (issue 34).  The extension's schema is dropped by another
# session (dblink) inside the statement that calls idem_claim, after the
# call was planned: the records table is then gone, and so is the schema
# its error message named, which came out as schema "(null)".  (The
# session has not called the extension before: a session that has finds
# the table it knows gone when it opens it.)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('dropped_schema');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.sweep_interval = 0
lc_messages = 'C'
});
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION dblink;
CREATE SCHEMA s;
CREATE EXTENSION idempotency SCHEMA s;
});

my $connstr = $node->connstr('postgres');
my ($rc, $out, $err) = $node->psql('postgres', qq{
\\set VERBOSITY verbose
SELECT dblink_exec(\$c\$$connstr\$c\$, 'DROP SCHEMA s CASCADE'), s.idem_claim('t', 'k');
});
unlike($err, qr/\(null\)/, 'no NULL name in the error');
like($err, qr/ERROR:  3F000: schema with OID \d+ does not exist/,
	'a claim whose schema was dropped meanwhile: undefined schema (3F000)');

$node->stop;
done_testing();
