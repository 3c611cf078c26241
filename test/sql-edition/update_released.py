#!/usr/bin/env python3
"""The update from a released SQL edition to this one, on either route (run by test/suites/36-sql-edition).

--dbname holds the edition installed by --owner (not a superuser) into
--schema from the released files of --from, exactly as they shipped
(sql-edition/idempotency_sql--1.3.sql with psql -f, or on --route pgtle the
1.3 wrapper, run by --admin, and CREATE EXTENSION); --fresh-db holds a fresh
install of --to by the same route.  In both the roles of docs/privileges.md
get the grants of docs/managed.md as each version documents them (--from:
no idem_sql_tenant_keylock; --to: with it).  In --dbname records in every
state are written for two tenants, tenant isolation is switched on and
confines the application role, and one claim is held open in a transaction;
then the update: on the plain route --update (idempotency_sql--1.3--1.4.sql)
with psql -f by --owner; on pg_tle the wrapper --update by --admin and
ALTER EXTENSION idempotency_sql UPDATE by --owner.  Then:

  every function of --from is kept in place (same OID, re-created), and the
    schema's objects (functions with their definitions, flags, settings and
    grants; tables, columns, indexes, policies, row-level security,
    comments; on pg_tle the extension's members) are those of --fresh-db;
  idem_sql_tenant_keylock is granted to the roles that had
    idem_sql_isolation_setting() and to no other;
  every record is unchanged, isolation still on and confining, the open
    claim's holder completes it after the update with its token, the
    committed claim in flight too, the recovery point is kept, a takeover
    and a new key get larger tokens, the key locks are keyed (the public
    hash is not the lock any more, and the confined role gets its own
    tenant's lock through its new grant);
  on the plain route a second run fails and changes nothing.

36-sql-edition then runs security.py against the updated database.  The
last line is UPDATE-RESULT passed=N failed=M.
"""
import os
import subprocess
import sys
import threading
import time

import psycopg2

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'upgrade'))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import catalog  # noqa: E402
import cli  # noqa: E402
import common  # noqa: E402
from common import check, one, rows  # noqa: E402

args = None
TENANTS = ('u1', 'u2')
# idem_claim as the version has it (1.4 added holder) comes first
CLAIM = {'1.3': 'idem_claim(text, text, text, interval, interval, interval)',
         '1.4': 'idem_claim(text, text, text, interval, interval, interval, text)'}
# what the update 1.3 -> 1.4 drops and creates again, with the grants given
# back: {old signature: new signature}; and 1.3's idem_sql_claim_one, dropped
RECREATED = {'idem_claim(text,text,text,interval,interval,interval)':
             'idem_claim(text,text,text,interval,interval,interval,text)',
             'idem_lookup(text,text)': 'idem_lookup(text,text)'}
DROPPED = ('idem_sql_claim_one(text,text,text,bigint,bigint,bigint,boolean)',)
API = ('idem_claim_many(text, text[], text[], interval, interval),'
       ' idem_complete(text, text, bigint, jsonb), idem_release(text, text, bigint, jsonb),'
       ' idem_heartbeat(text, text, bigint, interval), idem_checkpoint(text, text, bigint, text, jsonb, interval),'
       ' idem_child_key(text, text, text), idem_lookup(text, text)')
OPERATOR = 'idem_lookup(text, text), idem_forget(text, text), idem_sweep(integer), idem_record_states()'


def connect(user, dbname=None, autocommit=True, tenant=None):
    return cli.connect(args, user, dbname, autocommit, tenant)


def ex(conn, sql, params=None):
    with conn.cursor() as cur:
        cur.execute(sql, params)


def grant(owner, with_keylock, version):
    """docs/privileges.md's roles with docs/managed.md's grants; the key lock
    helper only where the version documents it (--to).  And idem_lookup to
    rel_mon with the grant option, so that the update's giving back of the
    grants of the functions it creates again is seen to keep that too."""
    s = args.schema
    ex(owner, 'GRANT USAGE ON SCHEMA %s TO rel_app, rel_op, rel_mon, rel_nobody' % s)
    ex(owner, 'GRANT EXECUTE ON FUNCTION %s, %s TO rel_app' % (CLAIM[version], API))
    ex(owner, 'GRANT EXECUTE ON FUNCTION idem_lookup(text, text) TO rel_mon WITH GRANT OPTION')
    ex(owner, 'GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_records TO rel_app')
    ex(owner, 'GRANT EXECUTE ON FUNCTION %s TO rel_op' % OPERATOR)
    ex(owner, 'GRANT SELECT, UPDATE, DELETE ON idempotency_records TO rel_op')
    ex(owner, 'GRANT EXECUTE ON FUNCTION idem_sql_fresh_tokens(integer), idem_sql_successor_token(bigint),'
              ' idem_sql_isolation_setting() TO rel_app')
    ex(owner, 'GRANT EXECUTE ON FUNCTION idem_sql_isolation_setting() TO rel_op')
    if with_keylock:
        ex(owner, 'GRANT EXECUTE ON FUNCTION idem_sql_tenant_keylock(text, text) TO rel_app, rel_op')


def schema_snapshot(conn):
    """catalog.snapshot's properties for every function, relation and type of
    the schema (the plain route has no extension to list them)."""
    s = args.schema
    members = rows(conn, """
        SELECT 'pg_proc', p.oid, pg_catalog.pg_describe_object('pg_proc'::regclass, p.oid, 0)
          FROM pg_proc p WHERE p.pronamespace = %(s)s::regnamespace
        UNION ALL
        SELECT 'pg_class', c.oid, pg_catalog.pg_describe_object('pg_class'::regclass, c.oid, 0)
          FROM pg_class c WHERE c.relnamespace = %(s)s::regnamespace AND c.relkind IN ('r', 'S', 'v', 'm', 'p')
        UNION ALL
        SELECT 'pg_type', t.oid, pg_catalog.pg_describe_object('pg_type'::regclass, t.oid, 0)
          FROM pg_type t WHERE t.typnamespace = %(s)s::regnamespace AND t.typtype IN ('c', 'd', 'e')
           AND (t.typrelid = 0 OR (SELECT c.relkind FROM pg_class c WHERE c.oid = t.typrelid) = 'c')""",
                   {'s': s})
    snap, by_catalog = {}, {}
    for cat, oid, name in members:
        snap[name] = {}
        by_catalog.setdefault(cat, {})[oid] = name
    for cat, objs in by_catalog.items():
        for oid, k, v in rows(conn, catalog.PER_CATALOG[cat], (list(objs),)):
            snap[objs[oid]][k] = v
    rels = list(by_catalog.get('pg_class', {}))
    rels += [r[0] for r in rows(conn, "SELECT typrelid FROM pg_type WHERE oid = ANY(%s) AND typrelid <> 0",
                                (list(by_catalog.get('pg_type', {})),))]
    for obj, k, v in rows(conn, catalog.RELATION_PARTS, {'rels': rels}):
        snap.setdefault(obj, {})[k] = v
    return snap


def procs(su):
    """{oid: (signature, xmin)} of the schema's functions (the schema is on
    the search_path: signatures unqualified)."""
    return {r[0]: (r[1], r[2]) for r in rows(su, "SELECT oid::int, oid::regprocedure::text, xmin::text FROM pg_proc"
                                                 " WHERE pronamespace = %s::regnamespace", (args.schema,))}


def records(conn):
    return rows(conn, "SELECT tenant_id, key, status, token, fingerprint, response::text, lease_expires_at,"
                      " expires_at, created_at, updated_at, ttl, recovery_point, state::text"
                      " FROM idempotency_records ORDER BY tenant_id, key")


def claim(conn, tenant, key, lease=None):
    return one(conn, "SELECT outcome, token FROM idem_claim(%s, %s, NULL, %s::interval)", (tenant, key, lease))


def wait_for(conn, sql, seconds=20):
    """Whether the count sql answers reaches 1 within seconds."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if one(conn, sql)[0] >= 1:
            return True
        time.sleep(0.05)
    return False


def run_update():
    """The update as the route's users run it; returns (ok, output)."""
    psql = ['psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-h', args.host, '-p', str(args.port), '-d', args.dbname]
    # a lock the update waits for longer is a failure here, not a hang
    env = dict(os.environ, PGOPTIONS='-c lock_timeout=30s', PGAPPNAME='idem-update')
    if args.route == 'plain':
        p = subprocess.run(psql + ['-U', args.owner, '-v', 'schema=' + args.schema, '-f', args.update],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        return p.returncode == 0, p.stdout
    p = subprocess.run(psql + ['-U', args.admin, '-f', args.update],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if p.returncode != 0:
        return False, p.stdout
    q = subprocess.run(psql + ['-U', args.owner, '-c', 'ALTER EXTENSION idempotency_sql UPDATE'],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    return q.returncode == 0, p.stdout + q.stdout


def run():
    s = args.schema
    su = connect('postgres')
    for r, extra in (('rel_app', ''), ('rel_op', ''), ('rel_mon', 'IN ROLE pg_monitor'), ('rel_nobody', '')):
        if one(su, 'SELECT count(*) FROM pg_roles WHERE rolname = %s', (r,))[0] == 0:
            ex(su, 'CREATE ROLE %s LOGIN %s' % (r, extra))
    owner = connect(args.owner)
    fresh_owner = connect(args.owner, args.fresh_db)
    grant(owner, False, args.from_version)
    grant(fresh_owner, True, args.to)
    ex(fresh_owner, 'SELECT idem_set_tenant_isolation(true)')

    # records in every state for two tenants, written by the confined
    # application role under isolation
    ex(owner, 'SELECT idem_set_tenant_isolation(true)')
    tokens = {}
    for t in TENANTS:
        app = connect('rel_app', tenant=t)
        _, tokens[t, 'done'] = claim(app, t, 'done')
        ex(app, "SELECT idem_complete(%s, 'done', %s, '{\"ok\": 1}')", (t, tokens[t, 'done']))
        _, tokens[t, 'failed'] = claim(app, t, 'failed')
        ex(app, "SELECT idem_release(%s, 'failed', %s, '{\"error\": \"x\"}')", (t, tokens[t, 'failed']))
        _, tokens[t, 'live'] = claim(app, t, 'live', '10 minutes')
        _, tokens[t, 'point'] = claim(app, t, 'point', '10 minutes')
        ex(app, "SELECT idem_checkpoint(%s, 'point', %s, 'step-2', '{\"n\": 2}')", (t, tokens[t, 'point']))
        _, tokens[t, 'stale'] = claim(app, t, 'stale', '1 ms')
        app.close()
    # a claim held open across the update, by the application under isolation
    holder = connect('rel_app', autocommit=False, tenant='u1')
    outcome, t_open = claim(holder, 'u1', 'open')
    before = records(owner)
    procs_before = procs(su)
    acl = "SELECT p.oid::regprocedure::text, p.proacl::text FROM pg_proc p WHERE p.pronamespace = %s::regnamespace ORDER BY 1"
    acls_before = dict(rows(su, acl, (s,)))
    top = one(owner, 'SELECT max(token) FROM idempotency_records')[0]
    check(outcome == 'claimed' and len(before) == 10 and
          one(connect('rel_app', tenant='u2'), 'SELECT count(*) FROM idempotency_records')[0] == 5,
          'the released %s: records in every state for two tenants written by the application role under tenant'
          ' isolation (it sees only its own), one claim held open in a transaction' % args.from_version,
          (outcome, len(before)))

    # the update waits for the claim held open (it changes every key lock's
    # value when it commits), and a call made meanwhile waits for the update;
    # from 1.3 that call fails then, as docs/managed.md says: it runs 1.3's
    # idem_claim, which the update drops (1.4 creates idem_claim again, with
    # the argument holder), so it cannot return
    result = []
    updater = threading.Thread(target=lambda: result.append(run_update()))
    updater.start()
    waiting = "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE NOT l.granted AND " \
              "l.relation = %s::regclass AND " % ("'%s.idempotency_records'" % s)
    update_waits = wait_for(su, waiting + "a.application_name = 'idem-update'")
    late = connect('rel_app', tenant='u1')
    answer = []

    def late_claim():
        try:
            answer.append(claim(late, 'u1', 'open'))
        except psycopg2.Error as e:
            answer.append((e.pgcode, e.diag.message_primary))
    waiter = threading.Thread(target=late_claim)
    waiter.start()
    late_waits = wait_for(su, waiting + "l.pid = %d" % late.get_backend_pid())
    ex(holder, "SELECT idem_complete('u1', 'open', %s, '{\"ok\": 3}')", (t_open,))
    holder.commit()
    holder.close()
    updater.join(60)
    waiter.join(60)
    late.close()
    ok, out = result[0] if result else (False, 'the update did not end')
    check(ok and update_waits,
          '%s: the update %s -> %s (%s) ran as %s, waiting for the transaction that held a claim open'
          % (args.route, args.from_version, args.to, os.path.basename(args.update),
             args.owner if args.route == 'plain' else '%s, then ALTER EXTENSION ... UPDATE by %s'
             % (args.admin, args.owner)), (update_waits, out[-3000:]))
    dropped = args.from_version == '1.3' and args.to == '1.4'
    check(late_waits and answer and (answer[0][0] == 'replay' if not dropped else
                                     answer[0][0] == 'XX000' and answer[0][1].startswith('cache lookup failed for function')
                                     and claim(connect('rel_app', tenant='u1'), 'u1', 'open')[0] == 'replay'),
          'a claim of that key made meanwhile waits for the update, then %s' %
          ('replays what the holder completed' if not dropped else
           'fails (XX000: the idem_claim it called was dropped by the update); made again, it replays what the holder'
           ' completed'), (late_waits, answer))
    if args.route == 'pgtle':
        check(one(su, "SELECT extversion FROM pg_extension WHERE extname = 'idempotency_sql'")[0] == args.to,
              'idempotency_sql is at %s' % args.to)

    # functions kept in place, objects as a fresh install's
    procs_after = procs(su)
    gone = set(RECREATED) | set(DROPPED)
    in_place = {o: p for o, p in procs_before.items() if p[0] not in gone}
    kept = [o for o in in_place if o in procs_after and procs_after[o][0] == in_place[o][0]]
    rewritten = [o for o in kept if procs_after[o][1] != in_place[o][1]]
    check(len(kept) == len(in_place) and len(rewritten) == len(kept) and len(in_place) == len(procs_before) - 3,
          'every function of %s kept in place and re-created (%d of %d: same OID, new body) but the three 1.4'
          ' drops (%s)' % (args.from_version, len(rewritten), len(procs_before), ', '.join(sorted(gone))),
          sorted(in_place[o][0] for o in in_place if o not in rewritten))
    now = sorted(p[0] for p in procs_after.values())
    check(not gone & set(now) - set(RECREATED.values()) and
          all(new in now and not any(o in procs_after for o in procs_before if procs_before[o][0] == old)
              for old, new in RECREATED.items()),
          'idem_claim (with holder) and idem_lookup (with its column holder) created again; 1.3\'s idem_claim,'
          ' idem_lookup and idem_sql_claim_one dropped', now)
    fresh_su = connect('postgres', args.fresh_db)
    diff = catalog.diff(schema_snapshot(su), schema_snapshot(fresh_su), 'updated', 'fresh ' + args.to)
    check(diff == [], 'the schema\'s functions (definitions, flags, settings, grants), tables, columns, indexes,'
          ' policies, row-level security and comments are a fresh %s install\'s with the same grants' % args.to,
          '\n'.join(diff))
    if args.route == 'pgtle':
        members = sorted(catalog.snapshot(su, 'idempotency_sql'))
        fresh_members = sorted(catalog.snapshot(fresh_su, 'idempotency_sql'))
        check(members == fresh_members, 'the extension\'s members are a fresh %s install\'s' % args.to,
              '\n'.join(catalog.diff({m: {} for m in members}, {m: {} for m in fresh_members})))
    acls_after = dict(rows(su, acl, (s,)))
    changed = [f for f in acls_before if f not in DROPPED and acls_after.get(RECREATED.get(f, f)) != acls_before[f]]
    check(changed == [] and all(acls_before[f] for f in RECREATED),
          'every grant on a function of %s is kept; those of idem_claim and idem_lookup, which 1.4 creates again,'
          ' given back (%s)' % (args.from_version, '; '.join('%s: %s' % (f, acls_before[f]) for f in RECREATED)),
          [(f, acls_before[f], acls_after.get(RECREATED.get(f, f))) for f in changed])
    has = {r: one(su, "SELECT has_function_privilege(%s, %s, 'EXECUTE')",
                  (r, '%s.idem_sql_tenant_keylock(text, text)' % s))[0]
           for r in ('rel_app', 'rel_op', 'rel_mon', 'rel_nobody')}
    check(has == {'rel_app': True, 'rel_op': True, 'rel_mon': False, 'rel_nobody': False},
          'idem_sql_tenant_keylock is granted to the roles that had idem_sql_isolation_setting() and to no other', has)

    # the records and isolation come through
    check([r for r in records(owner) if r[:2] != ('u1', 'open')] == before,
          'every record is unchanged by the update (%d; the one held open is added by its commit)' % len(before))
    check(one(owner, 'SELECT setting FROM idem_tenant_isolation') == ('app.tenant',) and
          rows(connect('rel_app', tenant='u2'), 'SELECT DISTINCT tenant_id FROM idempotency_records') == [('u2',)],
          'tenant isolation is still on and confines the application role')
    app = {t: connect('rel_app', tenant=t) for t in TENANTS}
    check(one(app['u1'], "SELECT status, token FROM idem_lookup('u1', 'open')") == ('completed', t_open) and
          claim(app['u1'], 'u1', 'open')[0] == 'replay',
          'the claim held open across the update is completed by its holder with its token, and replays')
    for t in TENANTS:
        a = app[t]
        ok = claim(a, t, 'done')[0] == 'replay' and claim(a, t, 'failed')[0] == 'failed'
        ok = ok and claim(a, t, 'live')[0] == 'in_progress'
        ex(a, "SELECT idem_complete(%s, 'live', %s, '{\"ok\": 2}')", (t, tokens[t, 'live']))
        ok = ok and one(a, "SELECT status, token FROM idem_lookup(%s, 'live')", (t,)) == ('completed', tokens[t, 'live'])
        ex(a, "SELECT idem_heartbeat(%s, 'point', %s)", (t, tokens[t, 'point']))
        ok = ok and one(a, "SELECT recovery_point, state FROM idem_lookup(%s, 'point')", (t,)) == ('step-2', {'n': 2})
        outcome, t_new = claim(a, t, 'stale')
        ok = ok and outcome == 'claimed' and t_new > tokens[t, 'stale']
        outcome, t_fresh = claim(a, t, 'fresh')
        check(ok and outcome == 'claimed' and t_fresh > top,
              'tenant %s after the update: replays, the claim in flight completed by its holder with its token,'
              ' the recovery point kept, the stale claim taken over and a new key with larger tokens' % t,
              (outcome, t_fresh, top))

    # the holder (1.4): the records of the release have none; the application
    # role, its grant given back, claims with one and re-enters; idem_lookup,
    # given back to the operator, shows it
    a = app['u1']
    first = one(a, "SELECT outcome, token FROM idem_claim('u1', 'run', holder => 'run-1')")
    again = one(a, "SELECT outcome, token FROM idem_claim('u1', 'run', holder => 'run-1')")
    other = one(a, "SELECT outcome, token FROM idem_claim('u1', 'run', holder => 'run-2')")
    seen = one(connect('rel_op', tenant='u1'), "SELECT holder FROM idem_lookup('u1', 'run')")[0]
    check(one(owner, "SELECT count(*) FROM idempotency_records WHERE holder IS NOT NULL AND key <> 'run'")[0] == 0 and
          first[0] == 'claimed' and again == first and other == ('in_progress', None) and seen == 'run-1',
          'after the update: the records of %s have no holder; the application role re-enters a claim made with'
          ' one, another holder is in_progress; idem_lookup shows it to the operator'
          % args.from_version, (first, again, other, seen))

    # the key locks are keyed now: the public hash is not a key's lock, and
    # the confined application gets its own tenant's through its new grant
    mine = one(owner, "SELECT idem_sql_keylock('u1', 'k'), hashtextextended('k', hashtextextended('u1', 0))")
    theirs = one(app['u1'], "SELECT idem_sql_keylock('u1', 'k')")[0]
    check(mine[0] != mine[1] and theirs == mine[0],
          'the key lock is keyed with the secret (not the public hash), and the confined application role gets'
          ' its own tenant\'s lock', (mine, theirs))
    for a in app.values():
        a.close()

    if args.route == 'plain':
        again = procs(su)
        ok, out = run_update()
        check(not ok and procs(su) == again, 'running the update again fails without a trace (one transaction)',
              out[-500:])
    common.result_line('UPDATE-RESULT')


def main():
    global args
    p = cli.parser(__doc__.splitlines()[0])
    p.add_argument('--route', choices=('plain', 'pgtle'), required=True)
    p.add_argument('--fresh-db', required=True)
    p.add_argument('--update', required=True, help='the plain update script, or the pg_tle wrapper')
    p.add_argument('--from', dest='from_version', required=True)
    p.add_argument('--to', required=True)
    p.add_argument('--admin', help='the pgtle_admin member that runs the wrapper (pg_tle)')
    args = p.parse_args()
    cli.finish(run, 'UPDATE-RESULT')


if __name__ == '__main__':
    main()
