#!/usr/bin/env python3
"""pg_tle's update path for the SQL edition (run by test/suites/36-sql-edition).

On a server preloading pg_tle where idempotency_sql 1.2 was registered by
--admin (a pgtle_admin member, not a superuser) from the 1.2 release's
wrapper (test/sql-edition/idempotency_sql--1.2-pgtle.sql, the file
sql-edition/build made for 1.2, kept unchanged for this test) and created
with CREATE EXTENSION by --owner in --schema: records in every state are
written, the wrappers --update (one or more, in order: the 1.3 release's
sql-edition/idempotency_sql--1.3-pgtle.sql, which registers 1.3 and the
path 1.2 -> 1.3, then sql-edition/idempotency_sql--1.4-pgtle.sql, which
registers --to and the path 1.3 -> --to) are run by --admin, one ALTER
EXTENSION idempotency_sql UPDATE is run by --owner (pg_tle chains the
paths), and the records, their tokens and the claims in flight must come
through unchanged and go on working, every function of 1.2 re-created in
place (but idem_claim, idem_lookup and idem_sql_claim_one, which 1.4
creates again with the holder), the monitoring functions of 1.3 and the key
lock helper of 1.4 added with their grants; then DROP EXTENSION
leaves nothing behind (after pg_dump -Fc / pg_restore of the database into
a new one: the same version, records, token mark and isolation), CREATE
EXTENSION installs the new default version,
sql-edition/migrate to-c moves it to the C extension (on the server's
installed C library, not preloaded), and pgtle.uninstall_extension
unregisters it.  The last line is
PGTLE-RESULT passed=N failed=M.
"""
import os
import subprocess
import sys

import psycopg2

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'upgrade'))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
import common  # noqa: E402
from common import check, one, rows  # noqa: E402

# the functions the update 1.3 -> 1.4 drops and creates again (new OIDs):
# idem_claim's new argument holder, idem_lookup's new column, and the
# helper that takes the holder
RECREATED = ('idem_claim', 'idem_lookup', 'idem_sql_claim_one')
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
args = None


def connect(user):
    conn = psycopg2.connect(host=args.host, port=args.port, dbname=args.dbname, user=user,
                            options='-c search_path=%s' % args.schema)
    conn.autocommit = True
    return conn


def ex(conn, sql, params=None):
    """Run a statement, with or without a result."""
    with conn.cursor() as cur:
        cur.execute(sql, params)


def claim(conn, key, lease=None):
    return one(conn, "SELECT outcome, token FROM idem_claim('t', %s, NULL, %s::interval)", (key, lease))


def snapshot(conn):
    return rows(conn, "SELECT tenant_id, key, status, token, fingerprint, response, lease_expires_at,"
                      " expires_at, created_at, updated_at, ttl, recovery_point, state"
                      " FROM idempotency_records ORDER BY tenant_id, key")


def run():
    owner = connect(args.owner)
    admin = connect(args.admin)
    su = connect('postgres')

    # records in every state: completed, failed, a claim in flight with a
    # live lease, one with a recovery point, a stale one
    _, t_done = claim(owner, 'done')
    ex(owner, "SELECT idem_complete('t', 'done', %s, '{\"ok\": 1}')", (t_done,))
    _, t_failed = claim(owner, 'failed')
    ex(owner, "SELECT idem_release('t', 'failed', %s, '{\"error\": \"x\"}')", (t_failed,))
    _, t_live = claim(owner, 'live', '10 minutes')
    _, t_point = claim(owner, 'point', '10 minutes')
    ex(owner, "SELECT idem_checkpoint('t', 'point', %s, 'step-2', '{\"n\": 2}')", (t_point,))
    _, t_stale = claim(owner, 'stale', '1 ms')
    before = snapshot(owner)
    procs_before = dict(rows(su, "SELECT oid::int, xmin::text FROM pg_proc WHERE pronamespace = %s::regnamespace"
                                 " AND proname <> ALL (%s)", (args.schema, list(RECREATED))))
    top = one(owner, "SELECT max(token) FROM idempotency_records")[0]

    for wrapper in args.update:
        with admin.cursor() as cur:
            cur.execute(open(wrapper).read())
    path = one(admin, "SELECT path FROM pgtle.extension_update_paths('idempotency_sql')"
                      " WHERE source = '1.2' AND target = %s", (args.to,))
    check(path is not None and path[0] is not None,
          'the update path 1.2 -> %s is registered by %s (pgtle_admin, not a superuser) with %s: %s'
          % (args.to, args.admin, ', '.join(os.path.basename(w) for w in args.update), path and path[0]))
    # a role with docs/managed.md's isolation helper (1.2), and one without
    for r in ('upd_app', 'upd_nobody'):
        if one(su, "SELECT count(*) FROM pg_roles WHERE rolname = %s", (r,))[0] == 0:
            ex(su, "CREATE ROLE %s" % r)
    ex(owner, "GRANT EXECUTE ON FUNCTION %s.idem_sql_isolation_setting() TO upd_app" % args.schema)
    ex(owner, "ALTER EXTENSION idempotency_sql UPDATE")
    check(one(owner, "SELECT extversion FROM pg_extension WHERE extname = 'idempotency_sql'")[0] == args.to,
          'ALTER EXTENSION idempotency_sql UPDATE by %s moves it to %s' % (args.owner, args.to))
    procs_after = dict(rows(su, "SELECT oid::int, xmin::text FROM pg_proc WHERE pronamespace = %s::regnamespace",
                            (args.schema,)))
    rewritten = [o for o in procs_before if procs_after.get(o) not in (None, procs_before[o])]
    check(set(procs_before) <= set(procs_after) and len(rewritten) == len(procs_before),
          'the update script re-created every function of 1.2 in place (%d, same OIDs) but the three 1.4 creates'
          ' again (%s)' % (len(rewritten), ', '.join(RECREATED)), (len(procs_before), len(procs_after), len(rewritten)))
    added = rows(su, "SELECT proname::text, pronargs::int FROM pg_proc WHERE pronamespace = %s::regnamespace"
                     " AND oid::int <> ALL (%s) ORDER BY 1", (args.schema, list(procs_before)))
    check(added == [('idem_claim', 7), ('idem_lookup', 2), ('idem_metrics', 0), ('idem_metrics_tenants', 1),
                    ('idem_sql_claim_one', 9), ('idem_sql_metrics_window', 1), ('idem_sql_tenant_keylock', 2)],
          'and added the monitoring functions of 1.3 and the key lock helper of 1.4, and created idem_claim with its'
          ' argument holder, idem_lookup with its column holder and the helper that takes it (1.4)', added)
    check(one(su, "SELECT has_function_privilege('upd_app', %s, 'EXECUTE')",
              ('%s.idem_sql_tenant_keylock(text, text)' % args.schema,))[0] is True
          and one(su, "SELECT has_function_privilege('upd_nobody', %s, 'EXECUTE')",
                  ('%s.idem_sql_tenant_keylock(text, text)' % args.schema,))[0] is False,
          'the update grants idem_sql_tenant_keylock to the roles that had idem_sql_isolation_setting() only')
    grants = rows(su, "SELECT p.proname, a.grantee::regrole::text FROM pg_proc p, aclexplode(p.proacl) a"
                      " WHERE p.pronamespace = %s::regnamespace AND p.proname LIKE 'idem\\_metrics%%'"
                      " AND a.grantee <> p.proowner ORDER BY 1, 2", (args.schema,))
    check(grants == [('idem_metrics', 'pg_monitor'), ('idem_metrics_tenants', 'pg_monitor')],
          'idem_metrics and idem_metrics_tenants: EXECUTE to pg_monitor only', grants)
    m = one(su, "SELECT claims_in_progress, stuck_claims, resumable_records, claimed_total FROM idem_metrics()")
    check(m == (3, 1, 0, None), 'idem_metrics() after the update: the 3 claims in flight, the stale one stuck,'
          ' no counters (NULL)', m)
    check(snapshot(owner) == before, 'every record is unchanged by the update (%d records)' % len(before))
    public = rows(su, "SELECT p.proname FROM pg_proc p, aclexplode(p.proacl) a WHERE p.pronamespace = %s::regnamespace"
                      " AND p.prosecdef AND a.grantee = 0", (args.schema,))
    check(public == [] and one(su, "SELECT count(*) FROM pg_proc WHERE pronamespace = %s::regnamespace AND prosecdef",
                               (args.schema,))[0] == 6,
          'after the update no SECURITY DEFINER function (4 helpers, 2 monitoring) is executable by PUBLIC', public)

    # the records go on working, tokens still increase per key
    def looked(key):
        return one(owner, "SELECT status, token FROM idem_lookup('t', %s)", (key,))
    check(claim(owner, 'done')[0] == 'replay' and looked('done') == ('completed', t_done),
          'the completed record replays, its token kept', (claim(owner, 'done'), looked('done')))
    check(claim(owner, 'failed')[0] == 'failed', 'the failed record replays its failure',
          claim(owner, 'failed'))
    check(claim(owner, 'live')[0] == 'in_progress' and looked('live') == ('processing', t_live),
          'the claim in flight is still in progress with its token', looked('live'))
    ex(owner, "SELECT idem_complete('t', 'live', %s, '{\"ok\": 2}')", (t_live,))
    check(claim(owner, 'live')[0] == 'replay' and looked('live') == ('completed', t_live),
          'its holder completes it with its token after the update', looked('live'))
    ex(owner, "SELECT idem_heartbeat('t', 'point', %s)", (t_point,))
    r = one(owner, "SELECT recovery_point, state FROM idem_lookup('t', 'point')")
    check(r == ('step-2', {'n': 2}), 'the recovery point is kept and its holder still heartbeats', r)
    outcome, t_new = claim(owner, 'stale')
    check(outcome == 'claimed' and t_new > t_stale, 'the stale claim is taken over with a larger token',
          (outcome, t_new, t_stale))
    outcome, t_fresh = claim(owner, 'fresh')
    check(outcome == 'claimed' and t_fresh > top, 'a new key gets a token above every earlier one',
          (t_fresh, top))

    # pg_dump -Fc / pg_restore into a new database by a superuser (pg_tle's
    # registration functions are in the dump): the same version, records,
    # token mark, isolation
    ex(owner, "SELECT idem_set_tenant_isolation(true)")
    before = snapshot(owner)
    mark = one(su, "SELECT last_value FROM idempotency_tokens")[0]
    dump = os.path.join(args.workdir, 'pgtle.dump')
    restored = args.dbname + '_restored'
    conn_args = ['-h', args.host, '-p', str(args.port), '-U', 'postgres']
    subprocess.run(['pg_dump', '-Fc', '-f', dump, '-d', args.dbname] + conn_args, check=True)
    ex(su, 'CREATE DATABASE %s' % restored)
    # without pg_cron, whose extension may be created only in cron.database_name
    listing = subprocess.run(['pg_restore', '-l', dump], stdout=subprocess.PIPE, text=True, check=True).stdout
    with open(dump + '.list', 'w') as f:
        f.write(''.join(line + '\n' for line in listing.splitlines()
                        if 'pg_cron' not in line and ' cron ' not in line))
    p = subprocess.run(['pg_restore', '--exit-on-error', '-L', dump + '.list', '-d', restored] + conn_args + [dump],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    check(p.returncode == 0, 'pg_restore of a pg_dump -Fc of the pg_tle edition database', p.stdout[-2000:])
    r = psycopg2.connect(host=args.host, port=args.port, dbname=restored, user='postgres',
                         options='-c search_path=%s' % args.schema)
    r.autocommit = True
    check(one(r, "SELECT extversion FROM pg_extension WHERE extname = 'idempotency_sql'") == (args.to,) and
          snapshot(r) == before and one(r, "SELECT last_value FROM idempotency_tokens")[0] == mark,
          'restored: idempotency_sql %s, every record (%d), the token mark' % (args.to, len(before)))
    check(one(r, "SELECT setting FROM idem_tenant_isolation") == ('app.tenant',) and
          one(r, "SELECT count(*) FROM pg_policies WHERE tablename = 'idempotency_records'")[0] == 1,
          'restored: tenant isolation on, its policy')
    outcome, tok = claim(r, 'after-restore')
    check(claim(r, 'done')[0] == 'replay' and outcome == 'claimed' and tok > mark,
          'restored: the replay, and a new key above the token mark', (outcome, tok, mark))
    r.close()

    # DROP EXTENSION, then unregister it: nothing is left
    ex(owner, "DROP EXTENSION idempotency_sql")
    left = one(su, "SELECT (SELECT count(*) FROM pg_class WHERE relnamespace = %s::regnamespace)"
                   " + (SELECT count(*) FROM pg_proc WHERE pronamespace = %s::regnamespace)"
                   " + (SELECT count(*) FROM pg_type WHERE typnamespace = %s::regnamespace)",
               (args.schema, args.schema, args.schema))[0]
    check(left == 0, 'DROP EXTENSION idempotency_sql removes every object of the schema', left)

    # created again (the default, the new version), and
    # moved to the C extension with sql-edition/migrate to-c
    ex(owner, "CREATE EXTENSION idempotency_sql SCHEMA %s" % args.schema)
    check(one(owner, "SELECT extversion FROM pg_extension WHERE extname = 'idempotency_sql'")[0] == args.to,
          'CREATE EXTENSION idempotency_sql installs the default %s' % args.to)
    _, t_done = claim(owner, 'done')
    ex(owner, "SELECT idem_complete('t', 'done', %s, '{\"ok\": 1}')", (t_done,))
    _, t_live = claim(owner, 'live', '10 minutes')
    before = snapshot(owner)
    p = subprocess.run([os.path.join(ROOT, 'sql-edition', 'migrate'), 'to-c', '--schema', args.schema,
                        '-h', args.host, '-p', str(args.port), '-U', 'postgres', '-d', args.dbname],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ext = [r[0] for r in rows(su, "SELECT extname FROM pg_extension WHERE extname LIKE 'idempotency%'")]
    check(p.returncode == 0 and ext == ['idempotency'] and snapshot(su) == before,
          'sql-edition/migrate to-c moves the pg_tle edition to the C extension with its %d records' % len(before),
          (p.stdout, ext))
    check(claim(su, 'done')[0] == 'replay' and claim(su, 'live')[0] == 'in_progress',
          'after the move: the replay, and the claim in flight still in progress')
    ex(su, "SELECT idem_complete('t', 'live', %s)", (t_live,))
    check(one(su, "SELECT status, token FROM idem_lookup('t', 'live')") == ('completed', t_live),
          'its holder completes it with its token')
    ex(su, "DROP EXTENSION idempotency")
    ex(admin, "SELECT pgtle.uninstall_extension('idempotency_sql')")
    check(one(su, "SELECT count(*) FROM pgtle.available_extensions() WHERE name = 'idempotency_sql'")[0] == 0,
          'pgtle.uninstall_extension by %s unregisters it' % args.admin)

    common.result_line('PGTLE-RESULT')


def main():
    global args
    p = cli.parser(__doc__.splitlines()[0])
    p.add_argument('--admin', required=True)
    p.add_argument('--update', required=True, action='append', help='a wrapper to run; repeat, in order')
    p.add_argument('--to', required=True)
    p.add_argument('--workdir', required=True)
    args = p.parse_args()
    cli.finish(run, 'PGTLE-RESULT')


if __name__ == '__main__':
    main()
