#!/usr/bin/env python3
"""Moving between editions, and pg_dump/pg_restore of the SQL edition (run by
test/suites/36-sql-edition).

On a server that has the C library, database --dbname gets the SQL edition
(plain script) from --owner in --schema, tenant isolation on, an extra index,
the application role 'mover_app' with docs/privileges.md's grants, and
records in every state for two tenants: completed, failed, a claim committed
with a live lease, a recovery point, a stale claim, a key released without
failure (its record gone).  Then sql-edition/migrate to-c and back to-sql,
each while a claim of mover_app is uncommitted (the move waits for it and
carries it).  After each move: every record equal in every column, the
extension as expected, the grants, isolation and index kept, and the calls
go on: replays, in_progress for the live claim whose holder still
heartbeats, the recovery point, a takeover at the old token + 1, the gone
key and a new key above every earlier token.  Last, pg_dump -Fc and
pg_restore of the database into a new one, by a superuser and by the
schema's owner with --no-owner (no superuser): the same records, the token
mark, isolation, grants, and working claims.  Last line:
MIGRATE-RESULT passed=N failed=M.
"""
import os
import subprocess
import sys
import threading
import time

import psycopg2
import psycopg2.errors

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'upgrade'))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
import common  # noqa: E402
from common import check, one, rows  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
args = None
APP = 'mover_app'
# docs/managed.md's "Grants": the SQL edition's SECURITY DEFINER helpers
HELPERS = ('idem_sql_fresh_tokens(integer)', 'idem_sql_successor_token(bigint)', 'idem_sql_isolation_setting()',
           'idem_sql_tenant_keylock(text, text)')
HELPER_GRANT = 'GRANT EXECUTE ON FUNCTION ' + ', '.join(HELPERS) + ' TO %s'


def connect(user, db=None, tenant=None, autocommit=True):
    return cli.connect(args, user, db, autocommit, tenant)


def ex(conn, sql, params=None):
    with conn.cursor() as cur:
        cur.execute(sql, params)


def claim(conn, tenant, key, lease=None):
    return one(conn, "SELECT outcome, token FROM idem_claim(%s, %s, NULL, %s::interval)", (tenant, key, lease))


def snapshot(conn):
    return rows(conn, "SELECT tenant_id, key, * FROM idempotency_records ORDER BY tenant_id, key")


def psql_base(db=None):
    return ['-h', args.host, '-p', str(args.port), '-U', 'postgres', '-d', db or args.dbname]


def tokens_mark(su):
    return one(su, "SELECT last_value FROM idempotency_tokens")[0]


class State:
    """What the records were before a move, per tenant and key."""

    def __init__(self):
        self.tokens = {}      # (tenant, key) -> token when claimed
        self.top = 0          # the largest token handed out so far


def write_records(st, tag):
    """Records in every state, for tenants t1 and t2, keys suffixed by tag."""
    for tenant in ('t1', 't2'):
        app = connect(APP, tenant=tenant)
        for name, lease in (('done', None), ('failed', None), ('live', '10 minutes'), ('point', '10 minutes'),
                            ('stale', '1 ms'), ('gone', None)):
            key = '%s-%s' % (name, tag)
            outcome, tok = claim(app, tenant, key, lease)
            check(outcome == 'claimed', 'before the move (%s): %s/%s claimed' % (tag, tenant, key), outcome)
            st.tokens[(tenant, key)] = tok
            st.top = max(st.top, tok)
        ex(app, "SELECT idem_complete(%s, %s, %s, '{\"ok\": 1}')", (tenant, 'done-' + tag, st.tokens[(tenant, 'done-' + tag)]))
        ex(app, "SELECT idem_release(%s, %s, %s, '{\"error\": 1}')", (tenant, 'failed-' + tag, st.tokens[(tenant, 'failed-' + tag)]))
        ex(app, "SELECT idem_checkpoint(%s, %s, %s, 'step-1', '{\"n\": 1}')", (tenant, 'point-' + tag, st.tokens[(tenant, 'point-' + tag)]))
        ex(app, "SELECT idem_release(%s, %s, %s)", (tenant, 'gone-' + tag, st.tokens[(tenant, 'gone-' + tag)]))
        # a claim in flight with a holder (1.4), to be re-entered after the move
        outcome, tok = one(app, "SELECT outcome, token FROM idem_claim(%s, %s, lease => '10 minutes', holder => 'run-1')",
                           (tenant, 'run-' + tag))
        check(outcome == 'claimed', 'before the move (%s): %s/run-%s claimed with a holder' % (tag, tenant, tag), outcome)
        st.tokens[(tenant, 'run-' + tag)] = tok
        st.top = max(st.top, tok)
        app.close()


def lock_wait_seen(su, query_like, seconds=30):
    """Is a session running a statement like query_like seen waiting on a
    heavyweight lock within seconds?"""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if one(su, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
               (query_like,))[0] > 0:
            return True
        time.sleep(0.05)
    return False


def move(direction, st, su, tag):
    """Run sql-edition/migrate DIRECTION while mover_app holds an uncommitted
    claim; the move must wait for it, then carry it."""
    holder = connect(APP, tenant='t1', autocommit=False)
    outcome, tok = claim(holder, 't1', 'held-' + tag, '10 minutes')
    st.tokens[('t1', 'held-' + tag)] = tok
    st.top = max(st.top, tok)
    result = {}

    # to-c names the schema; to-sql finds it on the search_path
    where = ['--schema', args.schema] if direction == 'to-c' else []
    env = dict(os.environ, PGOPTIONS='-c search_path=%s' % args.schema)

    def run():
        result['p'] = subprocess.run([os.path.join(ROOT, 'sql-edition', 'migrate'), direction] + where + psql_base(),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    def during():
        # a claim made while the move waits: it waits behind the move
        conn = connect(APP, tenant='t1')
        try:
            result['during'] = claim(conn, 't1', 'during-' + tag)
        except psycopg2.Error as e:
            result['during'] = (e.pgcode, e.diag.message_primary)
        conn.close()
    t = threading.Thread(target=run)
    d = threading.Thread(target=during)
    t0 = time.time()
    # each starts once the one before is seen waiting on its lock (psql's
    # start alone can take longer than any fixed pause on a loaded machine)
    t.start()
    waited = lock_wait_seen(su, '%LOCK TABLE%idempotency_records%')
    d.start()
    waited = lock_wait_seen(su, "%'during-" + tag + "'%") and waited and t.is_alive()
    holder.commit()
    holder.close()
    t.join(60)
    d.join(60)
    p = result.get('p')
    check(waited and p is not None and p.returncode == 0,
          'sql-edition/migrate %s waits for the uncommitted claim, then moves (%.1f s)' % (direction, time.time() - t0),
          (waited, p and p.stdout))
    # the claim made during the move: an error, or claimed and its record there
    got = result.get('during')
    app = connect(APP, tenant='t1')
    row = one(app, "SELECT status, token FROM idem_lookup('t1', %s)", ('during-' + tag,))
    if got and got[0] == 'claimed':
        check(row == ('processing', got[1]), '%s: a claim made while the move waited answered claimed, and its record '
              'is in the new edition' % direction, (got, row))
    else:
        again = claim(app, 't1', 'during-' + tag)
        check(got is not None and row is None and again[0] == 'claimed',
              '%s: a claim made while the move waited ended in an error (%s %s) and wrote nothing; claimed again after'
              % (direction, got and got[0], got and got[1]), (got, row, again))
        got = again
    st.tokens[('t1', 'during-' + tag)] = got[1]
    st.top = max(st.top, got[1])
    app.close()
    return p.stdout.strip() if p else ''


def after_move(edition, st, su, before, mark_before, tag):
    """The checks after a move into EDITION ('C' or 'SQL')."""
    ext = [r[0] for r in rows(su, "SELECT extname FROM pg_extension WHERE extname LIKE 'idempotency%' ORDER BY 1")]
    c_funcs = one(su, "SELECT count(*) FROM pg_proc WHERE pronamespace = %s::regnamespace"
                      " AND prolang = (SELECT oid FROM pg_language WHERE lanname = 'c')", (args.schema,))[0]
    owner = one(su, "SELECT string_agg(DISTINCT proowner::regrole::text, ',') FROM pg_proc"
                    " WHERE pronamespace = %s::regnamespace", (args.schema,))[0]
    if edition == 'C':
        check(ext == ['idempotency'] and c_funcs > 0, 'after to-c: the C extension is installed in %s' % args.schema,
              (ext, c_funcs))
    else:
        check(ext == [] and c_funcs == 0 and owner == args.owner,
              'after to-sql: the SQL edition, no extension, no C function, every function owned by %s' % args.owner,
              (ext, c_funcs, owner))
        acl = rows(su, "SELECT format('%%s(%%s)', p.proname, oidvectortypes(p.proargtypes)),"
                       " CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END"
                       " FROM pg_proc p, aclexplode(p.proacl) a WHERE p.pronamespace = %s::regnamespace"
                       " AND p.prosecdef AND a.grantee <> p.proowner ORDER BY 1, 2", (args.schema,))
        want = sorted([(h, APP) for h in HELPERS] +
                      [('idem_metrics()', 'pg_monitor'), ('idem_metrics_tenants(integer)', 'pg_monitor')])
        check(acl == want, 'after to-sql: the SECURITY DEFINER helpers are granted to %s (it may claim), the'
              ' monitoring functions to pg_monitor, none to PUBLIC' % APP, acl)
    after = snapshot(su)
    held = [r for r in after if r[1] == 'held-' + tag]
    # besides the records before: the claim committed while the move waited,
    # and the one made during the move (checked by move())
    check([r for r in after if r[1] not in ('held-' + tag, 'during-' + tag)] == before,
          '%s: every record moved unchanged, in every column (%d)' % (edition, len(before)),
          [r for r in before if r not in after][:3])
    check(len(held) == 1 and held[0][0] == 't1' and held[0][2] == st.tokens[('t1', 'held-' + tag)],
          '%s: the claim committed while the move waited is a record, with its token' % edition, held)
    check(tokens_mark(su) >= mark_before and tokens_mark(su) >= st.top,
          '%s: the token mark is at least what it was' % edition, (tokens_mark(su), mark_before, st.top))
    check(one(su, "SELECT count(*) FROM pg_indexes WHERE schemaname = %s AND indexname = 'idempotency_records_status_idx'",
              (args.schema,))[0] == 1, '%s: the extra index is kept' % edition)
    check(one(su, "SELECT setting FROM idem_tenant_isolation")[0] == 'app.tenant' and
          one(su, "SELECT relrowsecurity FROM pg_class WHERE oid = 'idempotency_records'::regclass")[0],
          '%s: tenant isolation is on, with its setting' % edition)

    # the application role, with its grants as before
    t1 = connect(APP, tenant='t1')
    check(one(t1, "SELECT count(DISTINCT tenant_id) || '/' || min(tenant_id) FROM idempotency_records")[0] == '1/t1',
          "%s: mover_app sees only its tenant's records" % edition)
    bare = connect(APP)
    try:
        claim(bare, 't1', 'no-tenant')
        refused = None
    except psycopg2.Error as e:
        refused = e.pgcode
    check(refused in ('55000', '42501'), '%s: without the tenant set, a claim is refused' % edition, refused)
    bare.close()
    for tag_ in sorted({k.rsplit('-', 1)[1] for _, k in st.tokens if '-' in k}):
        if ('t1', 'done-' + tag_) not in st.tokens:
            continue
        done = one(t1, "SELECT status, token FROM idem_lookup('t1', %s)", ('done-' + tag_,))
        check(claim(t1, 't1', 'done-' + tag_)[0] == 'replay' and done == ('completed', st.tokens[('t1', 'done-' + tag_)]),
              '%s: done-%s replays, its token kept' % (edition, tag_), done)
        check(claim(t1, 't1', 'failed-' + tag_)[0] == 'failed', '%s: failed-%s replays its failure' % (edition, tag_))
    # the claims in flight of this round: the live one, the one held during the move
    for key in ('live-' + tag, 'held-' + tag):
        tok = st.tokens[('t1', key)]
        check(claim(t1, 't1', key)[0] == 'in_progress' and
              one(t1, "SELECT status, token FROM idem_lookup('t1', %s)", (key,)) == ('processing', tok),
              '%s: %s is still in progress with its token' % (edition, key))
        ex(t1, "SELECT idem_heartbeat('t1', %s, %s)", (key, tok))
        ex(t1, "SELECT idem_complete('t1', %s, %s, '{\"after\": \"move\"}')", (key, tok))
        check(claim(t1, 't1', key)[0] == 'replay', '%s: its holder heartbeats and completes %s with its token' % (edition, key))
    point = one(t1, "SELECT recovery_point, state FROM idem_lookup('t1', %s)", ('point-' + tag,))
    check(point == ('step-1', {'n': 1}), '%s: the recovery point of point-%s is kept' % (edition, tag), point)
    run = 'run-' + tag
    again = one(t1, "SELECT outcome, token FROM idem_claim('t1', %s, holder => 'run-1')", (run,))
    other = one(t1, "SELECT outcome FROM idem_claim('t1', %s, holder => 'run-2')", (run,))[0]
    check(again == ('claimed', st.tokens[('t1', run)]) and other == 'in_progress' and
          one(t1, "SELECT holder FROM idem_lookup('t1', %s)", (run,)) == ('run-1',),
          '%s: the claim of %s moved with its holder: re-entered by it with its token, in_progress to another'
          % (edition, run), (again, other))
    outcome, tok = claim(t1, 't1', 'stale-' + tag)
    old = st.tokens[('t1', 'stale-' + tag)]
    check(outcome == 'claimed' and tok == old + 1, '%s: the stale claim is taken over at the old token + 1' % edition,
          (outcome, tok, old))
    outcome, tok = claim(t1, 't1', 'gone-' + tag)
    check(outcome == 'claimed' and tok > st.top, '%s: the released key is claimed again above every earlier token' % edition,
          (tok, st.top))
    outcome, fresh = claim(t1, 't1', 'fresh-' + tag)
    check(outcome == 'claimed' and fresh > tok, '%s: a new key gets a larger token still' % edition, (fresh, tok))
    st.top = max(st.top, fresh)
    t1.close()


def cron_job_runs(su, direction, tag):
    """pg_cron itself runs the sweep job after the move, and its history
    (cron.job_run_details) says it succeeded.  The job is yearly the rest of
    the time, so that it sweeps nothing between the records' snapshots; for
    this check it runs every second (pg_cron 1.5 and later) or at the next
    minute (1.4, Debian bookworm's), then goes back to yearly.  The stale
    claim of t2 (its lease of 1 ms long over) is what it must remove."""
    jobid, user = one(su, "SELECT jobid, username FROM cron.job WHERE jobname = 'idem_sweep'")
    seconds = one(su, "SELECT pg_catalog.string_to_array(pg_catalog.split_part(extversion, '-', 1), '.')::int[] >= '{1,5}'"
                      " FROM pg_extension WHERE extname = 'pg_cron'")[0]
    since = one(su, 'SELECT pg_catalog.now()')[0]
    ex(su, 'SELECT cron.alter_job(%s, schedule => %s)', (jobid, '1 seconds' if seconds else '* * * * *'))
    run = None
    deadline = time.time() + 90
    while run is None and time.time() < deadline:
        time.sleep(0.5)
        run = one(su, "SELECT status, return_message FROM cron.job_run_details"
                      " WHERE jobid = %s AND start_time >= %s AND status IN ('succeeded', 'failed')"
                      " ORDER BY start_time LIMIT 1", (jobid, since))
    ex(su, "SELECT cron.alter_job(%s, schedule => '0 0 1 1 *')", (jobid,))
    # a run already started ends before the next snapshot
    while time.time() < deadline + 30 and one(
            su, "SELECT count(*) FROM cron.job_run_details WHERE jobid = %s"
                " AND status NOT IN ('succeeded', 'failed')", (jobid,))[0] > 0:
        time.sleep(0.2)
    check(user == args.owner and run is not None and run[0] == 'succeeded',
          "after migrate %s, pg_cron ran the sweep job as its role (%s) and its history says it succeeded"
          % (direction, user), run)
    left = one(su, "SELECT count(*) FROM idempotency_records WHERE tenant_id = 't2' AND key = %s", ('stale-' + tag,))
    check(left == (0,), 'after migrate %s, the job removed the stale claim t2/stale-%s' % (direction, tag), left)


def run():
    su = connect('postgres')
    ex(su, "DROP ROLE IF EXISTS %s" % APP)
    ex(su, "CREATE ROLE %s LOGIN" % APP)
    ex(su, "CREATE SCHEMA %s AUTHORIZATION %s" % (args.schema, args.owner))
    subprocess.run(['psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-v', 'schema=' + args.schema, '-f',
                    os.path.join(ROOT, 'sql-edition', 'idempotency_sql--1.4.sql'),
                    '-h', args.host, '-p', str(args.port), '-U', args.owner, '-d', args.dbname],
                   check=True, stdout=subprocess.DEVNULL)
    owner = connect(args.owner)
    s = args.schema
    ex(owner, 'GRANT USAGE ON SCHEMA %s TO %s' % (s, APP))
    ex(owner, 'GRANT EXECUTE ON FUNCTION idem_claim(text, text, text, interval, interval, interval, text),'
              ' idem_claim_many(text, text[], text[], interval, interval),'
              ' idem_complete(text, text, bigint, jsonb), idem_release(text, text, bigint, jsonb),'
              ' idem_heartbeat(text, text, bigint, interval),'
              ' idem_checkpoint(text, text, bigint, text, jsonb, interval),'
              ' idem_child_key(text, text, text), idem_lookup(text, text) TO %s' % APP)
    ex(owner, 'GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_records TO %s' % APP)
    ex(owner, HELPER_GRANT % APP)
    ex(owner, "SELECT idem_set_tenant_isolation(true)")
    ex(owner, "SELECT idem_create_index(ARRAY['status'])")
    owner.close()

    # a pg_cron sweep job scheduled by the owner with idem_schedule_sweep()
    # (yearly: it must not sweep during the test), to be run as its role
    # after the move
    cron = one(su, "SELECT pg_catalog.current_setting('shared_preload_libraries') LIKE '%pg_cron%'")[0]
    if cron:
        ex(su, 'CREATE EXTENSION pg_cron')
        ex(su, 'GRANT USAGE ON SCHEMA cron TO %s' % args.owner)
        owner = connect(args.owner)
        ex(owner, "SELECT idem_schedule_sweep('0 0 1 1 *')")
        owner.close()

    st = State()
    write_records(st, 'a')
    before, mark = snapshot(su), tokens_mark(su)

    # an object of the user's that depends on the edition stops the move, and
    # nothing changes
    ex(su, "CREATE VIEW public.open_claims AS SELECT key FROM %s.idempotency_records WHERE status = 'processing'" % s)
    p = subprocess.run([os.path.join(ROOT, 'sql-edition', 'migrate'), 'to-c', '--schema', s] + psql_base(),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    check(p.returncode != 0 and 'depend' in p.stdout and snapshot(su) == before and
          one(su, "SELECT count(*) FROM pg_extension WHERE extname = 'idempotency'")[0] == 0,
          'a view of the user\'s on idempotency_records stops migrate to-c, and nothing changes', p.stdout)
    ex(su, "DROP VIEW public.open_claims")

    out = move('to-c', st, su, 'a')
    check(any(line.startswith('migrate: %d records moved into the C edition' % (len(before) + 1))
              for line in out.splitlines()), 'to-c says what it moved', out)
    if cron:
        check("pg_cron's sweep job runs as %s: granted it what idem_sweep() needs" % args.owner in out,
              "to-c says it granted pg_cron's sweep job's role what idem_sweep() needs", out)
    after_move('C', st, su, before, mark, 'a')
    if cron:
        cron_job_runs(su, 'to-c', 'a')

    write_records(st, 'b')   # written by the C edition
    before, mark = snapshot(su), tokens_mark(su)
    out = move('to-sql', st, su, 'b')
    check(out.startswith('migrate: %d records moved into the SQL edition' % (len(before) + 1)), 'to-sql says what it moved', out)
    after_move('SQL', st, su, before, mark, 'b')
    if cron:
        cron_job_runs(su, 'to-sql', 'b')
        # out of the way of the dump and restore below (pg_cron belongs in
        # cron.database_name only); dropping it drops the job (pg_cron 1.5's
        # unschedule by name finds only the current user's jobs)
        ex(su, 'DROP EXTENSION pg_cron')

    # a failed move changes nothing: to-sql again (no C extension there)
    before = snapshot(su)
    p = subprocess.run([os.path.join(ROOT, 'sql-edition', 'migrate'), 'to-sql', '--schema', s] + psql_base(),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    check(p.returncode != 0 and 'not installed' in p.stdout and snapshot(su) == before,
          'migrate to-sql on the SQL edition refuses and changes nothing', p.stdout)
    p = subprocess.run([os.path.join(ROOT, 'sql-edition', 'migrate'), 'to-c'] + psql_base(),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    check(p.returncode != 0 and 'no idempotency_records on the search_path' in p.stdout and snapshot(su) == before,
          'migrate without --schema and no idempotency_records on the search_path refuses', p.stdout)

    # pg_dump -Fc / pg_restore of the database using the SQL edition: by a
    # superuser, and by the schema's owner (no superuser, --no-owner) into a
    # database it owns, as on a managed service
    # a stale claim for the restored databases to take over (the sweep job's
    # run after to-sql removed the earlier ones, as a sweep does)
    app = connect(APP, tenant='t2')
    outcome, tok = claim(app, 't2', 'stale-dump', '1 ms')
    app.close()
    check(outcome == 'claimed', 'before the dump: t2/stale-dump claimed with a lease of 1 ms', outcome)
    st.tokens[('t2', 'stale-dump')] = tok
    st.top = max(st.top, tok)
    before = snapshot(su)
    dump = os.path.join(args.workdir, 'sql-edition.dump')
    subprocess.run(['pg_dump', '-Fc', '-f', dump] + psql_base(), check=True)
    for who, flags in (('postgres', []), (args.owner, ['--no-owner'])):
        restored = '%s_restored_by_%s' % (args.dbname, who)
        ex(su, 'CREATE DATABASE %s OWNER %s' % (restored, who))
        p = subprocess.run(['pg_restore', '--exit-on-error', '-d', restored, '-h', args.host, '-p', str(args.port),
                            '-U', who] + flags + [dump], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        label = 'restored by %s' % who
        check(p.returncode == 0, 'pg_restore %sof a pg_dump -Fc of the SQL edition database, as %s'
              % (' '.join(flags) + ' ' if flags else '', who), p.stdout[-2000:])
        r = connect('postgres', db=restored)
        check(snapshot(r) == before, '%s: every record, in every column (%d)' % (label, len(before)))
        check(tokens_mark(r) == tokens_mark(su), '%s: the token mark' % label, (tokens_mark(r), tokens_mark(su)))
        check(one(r, "SELECT setting FROM idem_tenant_isolation")[0] == 'app.tenant' and
              one(r, "SELECT relrowsecurity FROM pg_class WHERE oid = 'idempotency_records'::regclass")[0] and
              one(r, "SELECT count(*) FROM pg_policies WHERE tablename = 'idempotency_records'")[0] == 1,
              '%s: tenant isolation on, its policy' % label)
        check(one(r, "SELECT count(*) FROM pg_indexes WHERE indexname = 'idempotency_records_status_idx'")[0] == 1,
              '%s: the extra index' % label)
        check(one(r, "SELECT string_agg(DISTINCT proowner::regrole::text, ',') FROM pg_proc"
                     " WHERE pronamespace = %s::regnamespace", (s,))[0] == args.owner,
              '%s: every function owned by %s' % (label, args.owner))
        a = connect(APP, db=restored, tenant='t2')
        check(one(a, "SELECT count(DISTINCT tenant_id) || '/' || min(tenant_id) FROM idempotency_records")[0] == '1/t2',
              "%s: mover_app sees only its tenant's records" % label)
        outcome, tok = claim(a, 't2', 'after-restore')
        check(outcome == 'claimed' and tok > st.top, '%s: a claim by mover_app gets a token above every earlier one'
              % label, (outcome, tok, st.top))
        outcome, tok = claim(a, 't2', 'stale-dump')
        check(outcome == 'claimed' and tok == st.tokens[('t2', 'stale-dump')] + 1,
              '%s: a stale claim is taken over at the old token + 1' % label, (outcome, tok))
        a.close()
        r.close()
    common.result_line('MIGRATE-RESULT')


def main():
    global args
    p = cli.parser(__doc__.splitlines()[0])
    p.add_argument('--workdir', required=True)
    args = p.parse_args()
    cli.finish(run, 'MIGRATE-RESULT')


if __name__ == '__main__':
    main()
