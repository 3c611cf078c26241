#!/usr/bin/env python3
"""The SQL edition's privilege boundary (issue 45, items 2, 5 and 6).

Run by test/suites/36-sql-edition on each install route, in a database of
its own where the edition was installed by --owner (not a superuser) into
--schema and pg_cron is NOT created (so that a role can make a schema named
cron, as on a server where pg_cron lives in another database).  Tenant
isolation on, the roles of docs/privileges.md and docs/managed.md's grants.

  planted code: a role with nothing but CREATE on the database makes a
    schema cron (a view job_run_details calling its function, a table job,
    functions schedule and unschedule) whose code records who runs it and
    tries to grant itself the records; a pg_monitor scrape
    (idem_metrics, idem_metrics_tenants) and the owner's
    idem_schedule_sweep / idem_unschedule_sweep must run none of it.  With
    --pgtle-db, a schema pgtle planted in a database without pg_tle: the
    pg_tle wrapper (--wrapper), run by --admin, must refuse before calling
    anything of it.
  tenant against tenant: a session confined to tenant A writes its own
    expired record's token as 2^63 - 2 and claims it: refused (ID004, as the C edition),
    the shared token mark unmoved, tenant B still claims, idem_forget
    recovers A's key; the granted helpers take no token or count beyond
    their bound; no role computes another tenant's key lock (a role with no
    grant, a session confined to A), and the formula anyone could compute
    before neither blocks B's claim nor tells whether B's key is in flight.
  the sweep's lock: a role with no grant holding the constant lock that
    idem_sweep() took until 1.4 does not block a sweep; two passes by roles
    that read every tenant's records (the owner, a superuser; with
    isolation off docs/privileges.md's sweeping role) take turns on the
    keyed lock; a role that isolation confines sees no secret, and its pass
    takes no lock, neither waiting for another pass nor holding one up, and
    removes only its own tenant's expired records.

The last line is SECURITY-RESULT passed=N failed=M.
"""
import os
import subprocess
import sys
import time

import psycopg2

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'upgrade'))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
import common  # noqa: E402
from common import check  # noqa: E402

args = None
TOP = 9223372036854775806     # 2^63 - 2


def connect(user, dbname=None, autocommit=True, tenant=None):
    return cli.connect(args, user, dbname, autocommit, tenant)


def one(conn, sql, params=None):
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone() if cur.description else None


def error(conn, sql, params=None):
    """(sqlstate, primary message) of a failing statement, or None."""
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
    except psycopg2.Error as e:
        if not conn.autocommit:
            conn.rollback()
        return (e.pgcode, e.diag.message_primary)
    return None


def plant(su, conn, schema):
    """As the planter: schema `schema` (cron or pgtle) with code that logs
    its runner into planter_log and tries to grant the planter the records."""
    s = args.schema
    one(conn, 'CREATE TABLE IF NOT EXISTS public_planter_log (who text, what text)')
    one(conn, 'GRANT INSERT ON public_planter_log TO PUBLIC')
    one(conn, """CREATE OR REPLACE FUNCTION planted(what text) RETURNS boolean
                 LANGUAGE plpgsql AS $$
                 BEGIN
                     INSERT INTO planter.public_planter_log VALUES (current_user, what);
                     BEGIN
                         EXECUTE 'GRANT SELECT ON %s.idempotency_records TO planter';
                         EXECUTE 'ALTER ROLE planter SUPERUSER';
                     EXCEPTION WHEN OTHERS THEN NULL;
                     END;
                     RETURN true;
                 END $$""" % s)
    one(conn, 'GRANT EXECUTE ON FUNCTION planted(text) TO PUBLIC')
    one(conn, 'CREATE SCHEMA %s' % schema)
    one(conn, 'GRANT USAGE ON SCHEMA %s TO PUBLIC' % schema)
    if schema == 'cron':
        one(conn, "CREATE TABLE cron.job (jobid bigint, jobname text, username text, command text,"
                  " schedule text)")
        one(conn, "CREATE VIEW cron.job_run_details AS SELECT current_database()::text AS database,"
                  " 'SELECT * FROM %s.idem_sweep(1)'::text AS command, 'succeeded'::text AS status,"
                  " now() AS start_time, now() AS end_time WHERE planter.planted('job_run_details')" % s)
        one(conn, "CREATE FUNCTION cron.schedule(text, text, text) RETURNS bigint LANGUAGE sql"
                  " AS $$ SELECT 7 WHERE planter.planted('schedule') $$")
        one(conn, "CREATE FUNCTION cron.unschedule(text) RETURNS boolean LANGUAGE sql"
                  " AS $$ SELECT planter.planted('unschedule') $$")
        one(conn, "INSERT INTO cron.job VALUES (7, 'idem_sweep', '%s', 'x', '* * * * *')" % args.owner)
        one(conn, 'GRANT SELECT ON ALL TABLES IN SCHEMA cron TO PUBLIC')
    else:
        one(conn, "CREATE FUNCTION pgtle.available_extensions(OUT name text) RETURNS SETOF text LANGUAGE sql"
                  " AS $$ SELECT 'x' WHERE planter.planted('available_extensions') $$")
        for fn, sig in (('install_extension', 'text, text, text, text, text[]'),
                        ('install_extension_version_sql', 'text, text, text'),
                        ('set_default_version', 'text, text'),
                        ('install_update_path', 'text, text, text, text')):
            one(conn, "CREATE FUNCTION pgtle.%s(%s) RETURNS boolean LANGUAGE sql"
                      " AS $$ SELECT planter.planted('%s') $$" % (fn, sig, fn))
    one(conn, 'GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA %s TO PUBLIC' % schema)


def ran_as(su, dbname=None):
    """Who ran the planted code (not the planter itself), and whether the
    planter gained anything."""
    conn = connect('postgres', dbname) if dbname else su
    who = [r[0] for r in rows_of(conn, "SELECT who || ':' || what FROM planter.public_planter_log"
                                       " WHERE who <> 'planter' ORDER BY 1")]
    gained = one(conn, "SELECT rolsuper FROM pg_roles WHERE rolname = 'planter'")[0]
    if not dbname:
        gained = gained or one(conn, "SELECT has_table_privilege('planter', %s, 'SELECT')",
                               ('%s.idempotency_records' % args.schema,))[0]
    if dbname:
        conn.close()
    return who, gained


def role(su, name, extra=''):
    """A login role, made once per server (the routes' databases share it)."""
    if one(su, 'SELECT count(*) FROM pg_roles WHERE rolname = %s', (name,))[0] == 0:
        one(su, 'CREATE ROLE %s LOGIN %s' % (name, extra))


def rows_of(conn, sql, params=None):
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


def planted_code(su, owner):
    s = args.schema
    role(su, 'planter')
    one(su, 'ALTER ROLE planter NOSUPERUSER')
    one(su, 'GRANT CREATE ON DATABASE %s TO planter' % args.dbname)
    planter = connect('planter')
    one(planter, 'CREATE SCHEMA planter')
    one(planter, 'GRANT USAGE ON SCHEMA planter TO PUBLIC')
    one(planter, 'SET search_path = planter')
    plant(su, planter, 'cron')
    planter.close()

    role(su, 'sec_scraper', 'IN ROLE pg_monitor')
    one(owner, 'GRANT USAGE ON SCHEMA %s TO sec_scraper' % s)
    scraper = connect('sec_scraper')
    r = one(scraper, 'SELECT sweeps_total, last_sweep_at FROM idem_metrics()')
    one(scraper, 'SELECT count(*) FROM idem_metrics_tenants(5)')
    who, gained = ran_as(su)
    check(who == [] and not gained and r == (None, None),
          'planted schema cron (view job_run_details): a pg_monitor scrape runs none of it, the sweep columns'
          ' are NULL (pg_cron is not in this database), the planter gains nothing', (who, gained, r))
    scraper.close()

    e = error(owner, 'SELECT idem_schedule_sweep()')
    who, gained = ran_as(su)
    check(e is not None and e[0] == '55000' and 'needs the pg_cron extension' in e[1] and who == [] and not gained,
          'planted cron.schedule: idem_schedule_sweep() by the owner refuses (55000) and runs none of it',
          (e, who, gained))
    e = error(owner, 'SELECT idem_unschedule_sweep()')
    who, gained = ran_as(su)
    check(e is not None and e[0] == '55000' and who == [] and not gained,
          'planted cron.unschedule: idem_unschedule_sweep() by the owner refuses (55000) and runs none of it',
          (e, who, gained))
    # the superuser too (pg_cron's examples schedule as postgres)
    e = error(su, 'SELECT %s.idem_schedule_sweep()' % s)
    who, gained = ran_as(su)
    check(e is not None and e[0] == '55000' and who == [] and not gained,
          'and idem_schedule_sweep() by a superuser runs none of it either', (e, who, gained))


def planted_pgtle(su):
    """A schema pgtle planted in a database where pg_tle is not created:
    the pg_tle wrapper refuses before calling it."""
    db = args.pgtle_db
    one(su, 'GRANT CREATE ON DATABASE %s TO planter' % db)
    planter = connect('planter', db)
    one(planter, 'CREATE SCHEMA planter')
    one(planter, 'GRANT USAGE ON SCHEMA planter TO PUBLIC')
    one(planter, 'SET search_path = planter')
    plant(su, planter, 'pgtle')
    planter.close()
    p = subprocess.run(['psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-h', args.host, '-p', str(args.port),
                        '-U', args.admin, '-d', db, '-f', args.wrapper], capture_output=True, text=True)
    who, gained = ran_as(su, db)
    check(p.returncode != 0 and 'the pg_tle extension is not installed in this database' in p.stderr
          and who == [] and not gained,
          'planted schema pgtle: the pg_tle wrapper run by %s refuses (55000) and runs none of it' % args.admin,
          (p.returncode, p.stderr.strip().splitlines()[:2], who, gained))


def tenant_against_tenant(su, owner):
    s = args.schema
    for r in ('sec_app', 'sec_op', 'sec_nobody'):
        role(su, r)
    one(owner, 'GRANT USAGE ON SCHEMA %s TO sec_app, sec_op, sec_nobody' % s)
    one(owner, 'GRANT EXECUTE ON FUNCTION idem_claim(text, text, text, interval, interval, interval, text),'
               ' idem_claim_many(text, text[], text[], interval, interval),'
               ' idem_complete(text, text, bigint, jsonb), idem_release(text, text, bigint, jsonb),'
               ' idem_heartbeat(text, text, bigint, interval),'
               ' idem_checkpoint(text, text, bigint, text, jsonb, interval),'
               ' idem_child_key(text, text, text), idem_lookup(text, text) TO sec_app')
    one(owner, 'GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_records TO sec_app')
    one(owner, 'GRANT EXECUTE ON FUNCTION idem_lookup(text, text), idem_forget(text, text) TO sec_op')
    one(owner, 'GRANT SELECT, UPDATE, DELETE ON idempotency_records TO sec_op')
    # docs/managed.md's "Grants", whatever helpers this version has
    helpers = [h[0] for h in rows_of(owner, "SELECT p.oid::regprocedure::text FROM pg_proc p"
                                            " WHERE p.pronamespace = %s::regnamespace AND p.prosecdef"
                                            " AND p.proname LIKE 'idem_sql%%'", (s,))]
    one(owner, 'GRANT EXECUTE ON FUNCTION %s TO sec_app' % ', '.join(helpers))
    one(owner, 'GRANT EXECUTE ON FUNCTION %s TO sec_op'
        % ', '.join(h for h in helpers if h.split('(')[0].split('.')[-1] in
                    ('idem_sql_isolation_setting', 'idem_sql_tenant_keylock')))
    one(owner, 'SELECT idem_set_tenant_isolation(true)')
    mark = lambda: one(su, 'SELECT last_value FROM %s.idempotency_tokens' % s)[0]  # noqa: E731

    a = connect('sec_app', tenant='A')
    b = connect('sec_app', tenant='B')

    # --- item 6: key locks
    nobody = connect('sec_nobody')
    e = error(nobody, "SELECT idem_sql_keylock('B', 'k')")
    check(e is not None and e[0] == '42501', 'a role with no grant cannot compute a key lock (42501)', e)
    e = error(a, "SELECT idem_sql_keylock('B', 'k')")
    check(e is not None and e[0] == '42501', 'a session confined to A cannot compute B\'s key lock (42501)', e)
    # the formula of the C edition's hash, that anyone could compute
    guess = "hashtextextended(%s, hashtextextended(%s, 0))"
    blocker = connect('sec_nobody', autocommit=False)
    one(blocker, 'SELECT pg_advisory_xact_lock(%s)' % guess, ('k', 'B'))
    r = one(b, "SELECT outcome FROM idem_claim('B', 'k')")
    blocker.rollback()
    check(r == ('claimed',), 'a lock on the (public) hash of B\'s key does not make B\'s claim in_progress', r)
    holder = connect('sec_app', autocommit=False, tenant='B')
    one(holder, "SELECT idem_claim('B', 'inflight')")
    probe = one(nobody, 'SELECT pg_try_advisory_lock(%s), pg_advisory_unlock_all()' % guess, ('inflight', 'B'))
    holder.rollback()
    check(probe is not None and probe[0] is True,
          'nor does it tell whether B\'s key is in flight (the lock is free while B holds its claim)', probe)
    # --- item 5: a token written around the functions moves no shared mark
    error(a, "SELECT idem_claim('A', 'absurd', lease => '1 ms')")
    error(a, "UPDATE idempotency_records SET token = %s WHERE tenant_id = 'A' AND key = 'absurd'", (TOP,))
    time.sleep(0.02)
    before = mark()
    e = error(a, "SELECT outcome FROM idem_claim('A', 'absurd')")
    after = mark()
    check(e is not None and e[0] == 'ID004' and e[1] == 'fencing token %d was never handed out in this database' % TOP
          and after == before,
          'tenant A\'s own record with token 2^63 - 2: its takeover is refused (ID004, as the C edition) and the token mark stays',
          (e, before, after))
    c = error(b, "SELECT idem_claim('B', 'fresh-after-absurd')")
    check(c is None and error(b, "SELECT 1 FROM idem_lookup('B', 'fresh-after-absurd')") is None,
          'tenant B still claims a fresh key', c)
    before = mark()
    e = error(a, "SELECT idem_release('A', 'absurd', %s)", (TOP,))
    check(e is None and mark() == before, 'its release (no recovery point) needs no token: the record goes', e)
    error(a, "SELECT idem_claim('A', 'absurd2', lease => '1 ms')")
    error(a, "UPDATE idempotency_records SET token = %s, recovery_point = 'p' WHERE tenant_id = 'A'"
           " AND key = 'absurd2'", (TOP,))
    time.sleep(0.02)
    before = mark()
    e = error(a, "SELECT idem_release('A', 'absurd2', %s)", (TOP,))
    check(e is not None and e[0] == 'ID004' and mark() == before,
          'handing a checkpointed record with token 2^63 - 2 on is refused (ID004), the mark stays', e)
    op = connect('sec_op', tenant='A')
    f = error(op, "SELECT idem_forget('A', 'absurd2')")
    r = None if f else one(a, "SELECT outcome FROM idem_claim('A', 'absurd2')")
    check(f is None and r == ('claimed',), 'idem_forget recovers the key: claimed again afterwards', (f, r))
    op.close()
    before = mark()
    e = error(a, 'SELECT idem_sql_successor_token(%s)', (TOP,))
    check(e is not None and e[0] == 'ID004' and mark() == before,
          'the granted idem_sql_successor_token refuses a token never handed out (ID004) and moves nothing', e)
    before = mark()
    e = error(a, 'SELECT idem_sql_fresh_tokens(100000)')
    check(e is not None and e[0] == '22023' and mark() == before,
          'the granted idem_sql_fresh_tokens refuses more tokens than a batch takes (22023)', e)

    one(owner, 'SELECT idem_set_tenant_isolation(false)')
    for c in (a, b, nobody, blocker, holder):
        c.close()


def sweep_lock(su, owner):
    """idem_sweep()'s turn (issue 45, tenant against tenant): the row of
    idem_sql_secret locked FOR UPDATE, by the roles that see it only; and a
    role tenant isolation confines with no tenant named is refused rather
    than removing nothing (issue 46)."""
    s = args.schema
    role(su, 'sec_stranger')
    role(su, 'sec_sweeper')
    one(owner, 'GRANT USAGE ON SCHEMA %s TO sec_sweeper' % s)
    one(owner, 'GRANT EXECUTE ON FUNCTION idem_sweep(integer) TO sec_sweeper, sec_op')
    one(owner, 'GRANT SELECT, UPDATE, DELETE ON idempotency_records TO sec_sweeper')
    one(owner, 'SELECT idem_set_tenant_isolation(true)')
    old = "hashtextextended('idempotency sweep ' || quote_ident('%s'), 0)" % s

    def held(conn):
        """The advisory locks conn's backend holds, as bigints."""
        return [r[0] for r in rows_of(su, "SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks"
                                          " WHERE locktype = 'advisory' AND granted AND pid = %s",
                                      (conn.get_backend_pid(),))]

    def sweep(conn, timeout='1s'):
        """A pass in conn's open transaction; (error or None)."""
        one(conn, "SET LOCAL lock_timeout = '%s'" % timeout)
        return error(conn, 'SELECT * FROM %s.idem_sweep()' % s)

    # a role with no grant at all holds the constant the sweep locked until 1.4
    stranger = connect('sec_stranger', autocommit=False)
    one(stranger, 'SELECT pg_advisory_xact_lock(%s)' % old)
    sweeper = connect(args.owner, autocommit=False)
    e = sweep(sweeper, '2s')
    sweeper.rollback()
    stranger.rollback()
    check(e is None, 'a role with no grant holding the constant lock idem_sweep() took until 1.4 blocks no sweep'
          ' (the owner\'s pass runs)', e)

    # the owner's pass holds the secret's row; a superuser's pass waits for
    # it; a role with USAGE on the schema and no other grant cannot lock the
    # row (it sees none), and no advisory lock shows a value in pg_locks to
    # copy
    one(owner, 'GRANT USAGE ON SCHEMA %s TO sec_stranger' % s)
    first = connect(args.owner, autocommit=False)
    e1 = sweep(first)
    locks = held(first) if e1 is None else None
    one(stranger, "SET LOCAL lock_timeout = '300ms'")
    squat = error(stranger, 'SELECT count(*) FROM (SELECT FROM %s.idem_sql_secret FOR UPDATE) x' % s)
    squatted = None if squat else one(stranger, 'SELECT count(*) FROM (SELECT FROM %s.idem_sql_secret FOR UPDATE) x'
                                      % s)[0]
    stranger.rollback()
    second = connect('postgres', autocommit=False)
    e2 = sweep(second, '300ms')
    second.rollback()
    first.commit()
    e3 = sweep(second)
    second.rollback()
    check(e1 is None and locks == [] and e2 is not None and e2[0] == '55P03' and e3 is None,
          'under isolation two passes (the owner\'s, a superuser\'s) take turns on the secret\'s row: the second'
          ' waits while the first holds it (55P03 under lock_timeout), then runs; no advisory lock is held',
          (e1, locks, e2, e3))
    check(squat is None and squatted == 0,
          'a role with USAGE on the schema and no other grant locks no row of idem_sql_secret FOR UPDATE (it sees'
          ' none): it cannot hold up a pass',
          (squat, squatted))

    # isolation on: a role it confines with no tenant named (docs/privileges.md's
    # sweeping role, as pg_cron runs it) is refused, not left removing nothing
    one(owner, "SELECT idem_claim('A', 'sweep-gone', lease => '1 ms')")
    time.sleep(0.02)
    blind = connect('sec_sweeper', autocommit=False)
    e = sweep(blind)
    blind.rollback()
    left = rows_of(owner, "SELECT tenant_id FROM idempotency_records WHERE key = 'sweep-gone'")
    check(e is not None and e[0] == '42501' and 'no tenant is named' in e[1] and left == [('A',)],
          'under isolation the sweeping role with no tenant named is refused (42501, naming the roles that sweep'
          ' every tenant), and nothing is removed', (e, left))
    one(owner, "SELECT idem_forget('A', 'sweep-gone')")

    # isolation off: the sweeping role of docs/privileges.md sees the row
    # too, and takes turns with the owner
    one(owner, 'SELECT idem_set_tenant_isolation(false)')
    gone = connect('sec_sweeper', autocommit=False)
    e1 = sweep(gone)
    locks = held(gone) if e1 is None else None
    e2 = sweep(first, '300ms')
    first.rollback()
    gone.commit()
    check(e1 is None and locks == [] and e2 is not None and e2[0] == '55P03',
          'with isolation off the pg_cron sweeping role\'s pass holds the secret\'s row and the owner\'s waits'
          ' for it', (e1, locks, e2))
    one(owner, 'SELECT idem_set_tenant_isolation(true)')

    # a confined role: no secret, no lock; it sweeps its own tenant's rows
    # while the owner's pass (its transaction still open) holds the row
    e0 = sweep(first)
    for t in ('A', 'B'):
        one(owner, "SELECT idem_claim(%s, 'sweep-me', lease => '1 ms')", (t,))
    time.sleep(0.02)
    op = connect('sec_op', autocommit=False, tenant='A')
    seen = one(op, 'SELECT count(*) FROM idem_sql_secret')[0]
    e = sweep(op, '300ms')
    locks = held(op)
    op.commit()
    first.rollback()
    left = rows_of(owner, "SELECT tenant_id FROM idempotency_records WHERE key = 'sweep-me' ORDER BY 1")
    check(e0 is None and seen == 0 and e is None and locks == [] and left == [('B',)],
          'a role confined to A sees no secret; its pass locks nothing, runs while the owner\'s pass holds'
          ' the row, and removes only A\'s expired record', (e0, seen, e, locks, left))
    one(owner, "SELECT idem_forget('B', 'sweep-me')")
    one(owner, 'SELECT idem_set_tenant_isolation(false)')
    for c in (stranger, sweeper, first, second, blind, gone, op):
        c.close()


def run():
    owner = connect(args.owner)
    su = connect('postgres')
    planted_code(su, owner)
    if args.pgtle_db:
        planted_pgtle(su)
    tenant_against_tenant(su, owner)
    sweep_lock(su, owner)
    common.result_line('SECURITY-RESULT')


def main():
    global args
    p = cli.parser(__doc__.splitlines()[0])
    p.add_argument('--pgtle-db', help='a database without pg_tle for the planted pgtle schema')
    p.add_argument('--admin', help='the pgtle_admin member that runs the wrapper')
    p.add_argument('--wrapper', help='the pg_tle wrapper (idempotency_sql--1.4-pgtle.sql)')
    args = p.parse_args()
    cli.finish(run, 'SECURITY-RESULT')


if __name__ == '__main__':
    main()
