#!/usr/bin/python3
"""Privileges, search-path capture and install-time safety of the extension.

Run by test/suites/55-privileges against a server that preloads idempotency
and pg_stat_statements (track = all).  Creates its own databases and roles.

What it proves (each line of output is one check):
  catalog   PUBLIC can execute no function and use no relation of the
            extension (docs/privileges.md lists none); every function is SECURITY
            INVOKER and not LEAKPROOF; every member belongs to the installing
            superuser; the control file says trusted = false, superuser = true.
  roles     the application role with the documented grants works end to end;
            it cannot run the operator functions; a role without grants gets
            42501 everywhere; a role with EXECUTE but no table privileges gets
            42501 from inside the call (the functions run with the caller's
            rights); row-level security stays in force through the functions.
  documented  the three roles of docs/privileges.md (app, idem_operator,
            idem_sweeper) created with exactly its GRANT lines can do what the
            page says, are refused the rest, and need every table privilege
            they are given (test/privileges/documented_roles.py).
  hostile   a role with CREATE on public plants twins of every pg_catalog
            operator and plain function over the types our SQL uses, a
            look-alike table in its own schema and in pg_temp, and the victim
            sessions (application role and superuser) put pg_temp, evil and
            public before pg_catalog: every code path still gives the right
            answers, writes only the real table, and no twin ever runs.  The
            statements the C code actually ran (pg_stat_statements) pass the
            SQL review (every operator, function and relation qualified).
  install   CREATE EXTENSION fails instead of adopting objects a hostile role
            created first (CVE-2022-2625); a schema name with a quote is
            refused (CVE-2023-39417); installed in its own schema, qualified
            calls cannot be shadowed by overloads in public.
"""

import argparse
import os
import subprocess
import sys
import time

import psycopg2
import psycopg2.errors

HERE = os.path.dirname(os.path.abspath(__file__))

# What docs/privileges.md documents.  PUBLIC gets nothing.
# the tenant isolation policy of a distributed table calls it as the confined role
PUBLIC_EXECUTABLE = {'idem_current_tenant(text)'}
# SECURITY DEFINER on purpose (1.3): they count every tenant's records for a
# pg_monitor member that has no right on the table, and return only counts
# and tenant names; their search_path is pinned (checked below).
MONITOR_DEFINERS = {'idem_metrics()', 'idem_metrics_tenants(integer)'}
APP_FUNCTIONS = ['idem_claim', 'idem_claim_many', 'idem_complete', 'idem_release',
                 'idem_heartbeat', 'idem_checkpoint', 'idem_child_key', 'idem_lookup']
OPS_FUNCTIONS = ['idem_forget', 'idem_sweep', 'idem_stats_read', 'idem_stats_reset', 'idem_record_states']
HOSTILE_PATH = 'pg_temp, evil, public, pg_catalog'

passed = 0
failed = 0


def check(ok, what, detail=''):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
    print('%s %s%s' % ('ok  ' if ok else 'FAIL', what, (' -- ' + str(detail)) if detail and not ok else ''),
          flush=True)
    return ok


class DB:
    def __init__(self, args):
        self.args = args

    def connect(self, dbname, user='postgres', search_path=None, autocommit=True):
        opts = '-c search_path=%s' % search_path.replace(' ', '\\ ') if search_path else None
        conn = psycopg2.connect(host=self.args.host, port=self.args.port, dbname=dbname, user=user,
                                options=opts, application_name='idem-privileges')
        conn.autocommit = autocommit
        return conn


def one(conn, sql, params=None):
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone() if cur.description else None


def rows(conn, sql, params=None):
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


def sqlstate_of(conn, sql, params=None):
    """Run sql; return None on success or the SQLSTATE it raised."""
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            if cur.description:
                cur.fetchall()
        return None
    except psycopg2.Error as e:
        if not conn.autocommit:
            conn.rollback()
        return e.pgcode


def ext_functions(conn):
    return rows(conn, """
        SELECT p.oid::pg_catalog.regprocedure::text, p.proname, p.prosecdef, p.proleakproof,
               p.proconfig, p.proacl IS NULL, p.proowner::pg_catalog.regrole::text
        FROM pg_catalog.pg_depend d
        JOIN pg_catalog.pg_proc p ON p.oid = d.objid
        JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid
        WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.deptype = 'e'
          AND e.extname = 'idempotency'
        ORDER BY 2""")


def signature(conn, name):
    r = one(conn, """SELECT p.oid::pg_catalog.regprocedure::text FROM pg_catalog.pg_proc p
                     JOIN pg_catalog.pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
                     JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
                     WHERE p.proname = %s""", (name,))
    return r[0] if r else None


# --------------------------------------------------------------------------
# catalog


def test_catalog(db):
    print('# catalog: grants, security mode, ownership')
    c = db.connect('privs')
    fns = ext_functions(c)
    names = {f[1] for f in fns}
    check({'idem_claim', 'idem_complete', 'idem_release', 'idem_heartbeat', 'idem_lookup',
           'idem_forget', 'idem_sweep'} <= names, 'the extension has its core functions (%d functions)' % len(fns),
          sorted(names))
    public_exec = [f[0] for f in fns if f[5]] + [r[0] for r in rows(c, """
        SELECT p.oid::pg_catalog.regprocedure::text
        FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_proc p ON p.oid = d.objid
        JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
        CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
        WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.deptype = 'e'
          AND a.grantee = 0 AND a.privilege_type = 'EXECUTE'""")]
    check(set(public_exec) <= PUBLIC_EXECUTABLE,
          'PUBLIC can execute no function of the extension but idem_current_tenant (docs: privileges.md)', public_exec)
    public_rel = rows(c, """
        SELECT c.oid::pg_catalog.regclass::text, a.privilege_type
        FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_class c ON c.oid = d.objid
        JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
        CROSS JOIN LATERAL pg_catalog.aclexplode(coalesce(c.relacl,
                        pg_catalog.acldefault('r', c.relowner))) a
        WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.deptype = 'e'
          AND a.grantee = 0""")
    check(not public_rel, 'PUBLIC has no privilege on any relation of the extension (table, view)', public_rel)
    definers = [f[0] for f in fns if f[2] and f[0] not in MONITOR_DEFINERS]
    unpinned = [f[0] for f in fns if f[2] and not any(
        (s or '').startswith('search_path=') and s.rstrip().endswith('pg_temp') for s in (f[4] or []))]
    check(not definers, 'every function is SECURITY INVOKER (the caller\'s rights apply) but the two '
          'monitoring functions for pg_monitor (docs/privileges.md#monitoring-pg_monitor)', definers)
    check(not unpinned, 'no SECURITY DEFINER function without search_path pinned, pg_temp last', unpinned)
    check(not [f[0] for f in fns if f[3]], 'no function is LEAKPROOF (they may not run before RLS quals)')
    foreign = rows(c, """
        SELECT pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid), o.owner
        FROM pg_catalog.pg_depend d
        JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
        CROSS JOIN LATERAL (
            SELECT p.proowner AS owner FROM pg_catalog.pg_proc p
              WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND p.oid = d.objid
            UNION ALL SELECT r.relowner FROM pg_catalog.pg_class r
              WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND r.oid = d.objid
            UNION ALL SELECT t.typowner FROM pg_catalog.pg_type t
              WHERE d.classid = 'pg_catalog.pg_type'::pg_catalog.regclass AND t.oid = d.objid) o
        WHERE d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass AND d.deptype = 'e'
          AND o.owner <> e.extowner""")
    check(not foreign, 'every member of the extension belongs to the superuser that installed it', foreign)
    ctl = one(c, """SELECT trusted, superuser, relocatable FROM pg_catalog.pg_available_extension_versions
                    WHERE name = 'idempotency' AND installed""")
    check(ctl == (False, True, False), 'control file: trusted = false, superuser = true, relocatable = false', ctl)
    check(not one(c, "SELECT pg_catalog.has_schema_privilege('idem_nogrant', 'public', 'CREATE')")[0],
          'PostgreSQL 15 default: a plain role cannot CREATE in public (the hostile tests grant it on purpose)')
    c.close()


# --------------------------------------------------------------------------
# roles


def grant_app(c, role):
    c.cursor().execute('GRANT USAGE ON SCHEMA public TO %s' % role)
    for f in APP_FUNCTIONS:
        sig = signature(c, f)
        if sig:
            c.cursor().execute('GRANT EXECUTE ON FUNCTION %s TO %s' % (sig, role))
    c.cursor().execute('GRANT SELECT, INSERT, UPDATE, DELETE ON public.idempotency_records TO %s' % role)


HAS_CLAIM_MANY = False       # set from the catalog by main()


def workflow(c, tenant, tag, expect_response='{"n": 1}'):
    """Every code path an application uses, with plain calls (no operator or
    function of our own in the statements, so that nothing in them can be
    captured either).  Returns a list of problems."""
    problems = []
    cur = c.cursor()

    def call(sql, params):
        cur.execute(sql, params)
        return cur.fetchall() if cur.description else None

    k = lambda n: '%s-%s' % (tag, n)
    r = call('SELECT * FROM public.idem_claim(tenant_id => %s, key => %s, fingerprint => %s)',
             (tenant, k(1), 'fp'))
    if r[0][0] != 'claimed':
        problems.append('claim: %r' % (r,))
        return problems
    tok = r[0][1]
    hb = call('SELECT * FROM public.idem_heartbeat(tenant_id => %s, key => %s, token => %s, lease => %s)',
              (tenant, k(1), tok, '10 min'))
    if hb[0][0] is None:
        problems.append('heartbeat returned NULL')
    call('SELECT * FROM public.idem_complete(tenant_id => %s, key => %s, token => %s, response => %s)',
         (tenant, k(1), tok, expect_response))
    r = call('SELECT * FROM public.idem_claim(tenant_id => %s, key => %s, fingerprint => %s)',
             (tenant, k(1), 'fp'))
    if r[0][0] != 'replay' or r[0][2] != {'n': 1}:
        problems.append('replay: %r' % (r,))
    r = call('SELECT * FROM public.idem_claim(tenant_id => %s, key => %s, fingerprint => %s)',
             (tenant, k(1), 'other'))
    if r[0][0] != 'mismatch':
        problems.append('mismatch: %r' % (r,))
    r = call('SELECT * FROM public.idem_lookup(tenant_id => %s, key => %s)', (tenant, k(1)))
    if len(r) != 1 or r[0][0] != 'completed':
        problems.append('lookup: %r' % (r,))
    # release with a failure, then the failure is replayed
    r = call('SELECT * FROM public.idem_claim(tenant_id => %s, key => %s)', (tenant, k(2)))
    call('SELECT * FROM public.idem_release(tenant_id => %s, key => %s, token => %s, failure => %s)',
         (tenant, k(2), r[0][1], '{"error": "x"}'))
    r = call('SELECT * FROM public.idem_claim(tenant_id => %s, key => %s)', (tenant, k(2)))
    if r[0][0] != 'failed':
        problems.append('failed replay: %r' % (r,))
    # plain release: the key is claimable again, with a larger token
    r = call('SELECT * FROM public.idem_claim(tenant_id => %s, key => %s)', (tenant, k(3)))
    t3 = r[0][1]
    call('SELECT * FROM public.idem_release(tenant_id => %s, key => %s, token => %s)', (tenant, k(3), t3))
    r = call('SELECT * FROM public.idem_claim(tenant_id => %s, key => %s)', (tenant, k(3)))
    if r[0][0] != 'claimed' or not r[0][1] > t3:
        problems.append('reclaim after release: %r' % (r,))
    # takeover of an expired lease, and the zombie is fenced off
    r = call('SELECT * FROM public.idem_claim(tenant_id => %s, key => %s, lease => %s)', (tenant, k(4), '1 ms'))
    t4 = r[0][1]
    time.sleep(0.01)
    r = call('SELECT * FROM public.idem_claim(tenant_id => %s, key => %s)', (tenant, k(4)))
    if r[0][0] != 'claimed' or not r[0][1] > t4:
        problems.append('takeover: %r (old token %s)' % (r, t4))
    try:
        call('SELECT * FROM public.idem_complete(tenant_id => %s, key => %s, token => %s)', (tenant, k(4), t4))
        problems.append('zombie complete was accepted')
    except psycopg2.Error as e:
        if e.pgcode != 'ID002':
            problems.append('zombie complete: %s' % e.pgcode)
    # in_progress for a live claim
    r = call('SELECT * FROM public.idem_claim(tenant_id => %s, key => %s)', (tenant, k(4)))
    if r[0][0] != 'in_progress':
        problems.append('in_progress: %r' % (r,))
    # batch claims, if the extension has them
    if HAS_CLAIM_MANY:
        r = call('SELECT * FROM public.idem_claim_many(tenant_id => %s, keys => %s::text[])',
                 (tenant, [k(5), k(6), k(1)]))
        if [x[1] for x in r] != ['claimed', 'claimed', 'replay']:
            problems.append('claim_many: %r' % (r,))
    return problems


def test_roles(db):
    print('# roles: application grants, no grants, EXECUTE without table rights, row-level security')
    own = db.connect('privs')
    grant_app(own, 'idem_app')
    grant_app(own, 'idem_ops')
    for f in OPS_FUNCTIONS:
        sig = signature(own, f)
        if sig:
            own.cursor().execute('GRANT EXECUTE ON FUNCTION %s TO idem_ops' % sig)
    if one(own, "SELECT pg_catalog.to_regclass('public.idem_stats')")[0]:
        own.cursor().execute('GRANT SELECT ON public.idem_stats TO idem_ops')
    own.cursor().execute('GRANT USAGE ON SCHEMA public TO idem_execonly')
    for f in APP_FUNCTIONS:
        sig = signature(own, f)
        if sig:
            own.cursor().execute('GRANT EXECUTE ON FUNCTION %s TO idem_execonly' % sig)

    app = db.connect('privs', 'idem_app')
    problems = workflow(app, 'app', 'roles')
    check(not problems, 'application role with the documented grants: claim, heartbeat, complete, replay, '
          'mismatch, lookup, release (with and without failure), takeover, fencing, claim_many', problems)

    calls = {
        'idem_forget': "SELECT public.idem_forget('app', 'roles-1')",
        'idem_sweep': 'SELECT * FROM public.idem_sweep()',
        'idem_stats_read': 'SELECT * FROM public.idem_stats_read()',
        'idem_stats_reset': 'SELECT public.idem_stats_reset()',
    }
    refused = {f: sqlstate_of(app, sql) for f, sql in calls.items() if signature(own, f)}
    if one(own, "SELECT pg_catalog.to_regclass('public.idem_stats')")[0]:
        refused['idem_stats (view)'] = sqlstate_of(app, 'SELECT * FROM public.idem_stats')
    check(all(v == '42501' for v in refused.values()),
          'application role is refused the operator functions and views (42501): ' + ', '.join(refused), refused)

    ops = db.connect('privs', 'idem_ops')
    ops_states = {f: sqlstate_of(ops, sql) for f, sql in calls.items() if signature(own, f)}
    check(all(v is None for v in ops_states.values()),
          'operator role (application grants + EXECUTE on ' + ', '.join(ops_states) + ') can run them', ops_states)

    nog = db.connect('privs', 'idem_nogrant')
    # the one function PUBLIC may execute tells a role its own settings, never
    # one only superusers (or pg_read_all_settings) may read
    check(sqlstate_of(nog, "SELECT public.idem_current_tenant('data_directory')") == '42501',
          'idem_current_tenant() refuses a role a setting it may not read (42501)',
          sqlstate_of(nog, "SELECT public.idem_current_tenant('data_directory')"))
    states = {}
    for sig in [f[0] for f in ext_functions(own)]:
        if sig.replace('public.', '') in PUBLIC_EXECUTABLE:
            continue        # granted to PUBLIC on purpose (checked above)
        name, argtypes = sig.split('(', 1)
        nargs = len([a for a in argtypes.rstrip(')').split(',') if a])
        strict, trigger = one(own, """SELECT proisstrict, prorettype = 'pg_catalog.trigger'::pg_catalog.regtype
                                     FROM pg_catalog.pg_proc WHERE oid = %s::pg_catalog.regprocedure""", (sig,))
        if strict or trigger:
            # the planner folds a STRICT call with NULL arguments to NULL
            # without running (or checking) it, and a trigger function cannot
            # be called: ask the catalog instead
            states[name] = None if one(own, "SELECT pg_catalog.has_function_privilege('idem_nogrant', %s, "
                                            "'EXECUTE')", (sig,))[0] else '42501'
            continue
        states[name] = sqlstate_of(nog, 'SELECT * FROM public.%s(%s)' % (name, ', '.join(['NULL'] * nargs)))
    states['SELECT table'] = sqlstate_of(nog, 'SELECT * FROM public.idempotency_records')
    states['INSERT table'] = sqlstate_of(nog, """INSERT INTO public.idempotency_records
        (token, expires_at, created_at, updated_at, ttl, tenant_id, key, status)
        VALUES (1, pg_catalog.now(), pg_catalog.now(), pg_catalog.now(), '1 day', 'x', 'y', 'completed')""")
    check(all(v == '42501' for v in states.values()),
          'role without grants: every function and the table refuse with 42501 (%d objects)' % len(states),
          {k: v for k, v in states.items() if v != '42501'})

    ex = db.connect('privs', 'idem_execonly')
    st = sqlstate_of(ex, "SELECT * FROM public.idem_claim('execonly', 'k')")
    st2 = sqlstate_of(ex, "SELECT * FROM public.idem_lookup('app', 'roles-1')")
    n = one(own, "SELECT pg_catalog.count(*) FROM public.idempotency_records WHERE tenant_id = 'execonly'")[0]
    check(st == '42501' and st2 == '42501' and n == 0,
          'EXECUTE without table privileges: claim and lookup fail with 42501 inside the call '
          '(SECURITY INVOKER), nothing written', (st, st2, n))

    # row-level security stays in force through the functions (SPI, not direct heap access)
    own.cursor().execute("""
        ALTER TABLE public.idempotency_records ENABLE ROW LEVEL SECURITY;
        CREATE POLICY tenant_isolation ON public.idempotency_records
            USING (tenant_id OPERATOR(pg_catalog.=) pg_catalog.current_setting('app.tenant', true))
            WITH CHECK (tenant_id OPERATOR(pg_catalog.=) pg_catalog.current_setting('app.tenant', true));
        SELECT * FROM public.idem_claim('B', 'secret');""")
    tokb = one(own, "SELECT token FROM public.idem_lookup('B', 'secret')")[0]
    own.cursor().execute("SELECT public.idem_complete('B', 'secret', %s, '{\"card\": \"4242\"}')", (tokb,))
    before = one(own, "SELECT row(r.*)::text FROM public.idempotency_records r "
                      "WHERE tenant_id = 'B' AND key = 'secret'")[0]
    rls = db.connect('privs', 'idem_app')
    rls.cursor().execute("SELECT pg_catalog.set_config('app.tenant', 'A', false)")
    a_ok = workflow(rls, 'A', 'rls')
    seen = rows(rls, "SELECT * FROM public.idem_lookup('B', 'secret')")
    claim_b = sqlstate_of(rls, "SELECT * FROM public.idem_claim('B', 'secret')")
    leaked = None
    try:
        r = rows(rls, "SELECT * FROM public.idem_claim('B', 'secret')")
        leaked = r
    except psycopg2.Error:
        pass
    comp_b = sqlstate_of(rls, "SELECT public.idem_complete('B', 'secret', %s, '{}')", (tokb,))
    fgt = sqlstate_of(rls, "SELECT public.idem_forget('B', 'secret')")
    after = one(own, "SELECT row(r.*)::text FROM public.idempotency_records r "
                     "WHERE tenant_id = 'B' AND key = 'secret'")[0]
    check(not a_ok and seen == [] and claim_b is not None and leaked is None and comp_b == 'ID001'
          and before == after,
          'row-level security (tenant = app.tenant): tenant A works, sees nothing of B (lookup: no row), '
          'cannot claim B\'s key (%s), cannot complete it (ID001), B\'s record unchanged' % claim_b,
          (a_ok, seen, claim_b, leaked, comp_b, fgt, before == after))
    own.cursor().execute("""DROP POLICY tenant_isolation ON public.idempotency_records;
                            ALTER TABLE public.idempotency_records DISABLE ROW LEVEL SECURITY""")
    for conn in (app, ops, nog, ex, rls, own):
        conn.close()


# --------------------------------------------------------------------------
# hostile objects and search_path


def test_hostile(db):
    print('# hostile: look-alike operators, functions and tables ahead of pg_catalog in search_path')
    own = db.connect('privs')
    own.cursor().execute("""
        GRANT CREATE ON SCHEMA public TO idem_evil;
        CREATE SCHEMA evil AUTHORIZATION idem_evil;
        GRANT SELECT ON public.idempotency_records TO idem_evil""")
    own.cursor().execute('SELECT public.pg_stat_statements_reset()')
    evil = db.connect('privs', 'idem_evil')
    notices = []
    evil.notices = notices
    with open(os.path.join(HERE, 'hostile.sql')) as f:
        evil.cursor().execute(f.read())
    made = [n for n in evil.notices if 'HOSTILE' in n]
    n_ops, n_fns = (int(x.split('=')[1]) for x in made[0].split('HOSTILE')[1].split()) if made else (0, 0)
    check(n_ops > 50 and n_fns > 500,
          'hostile role planted %d look-alike operators and %d look-alike functions in public, '
          'a table evil.idempotency_records' % (n_ops, n_fns), made)
    evil.close()

    # the application role, with the hostile search_path from its first statement
    app = db.connect('privs', 'idem_app', search_path=HOSTILE_PATH)
    app_notices = app.notices
    app.cursor().execute('CREATE TEMP TABLE idempotency_records (LIKE public.idempotency_records)')
    problems = workflow(app, 'hostile', 'app')
    check(not problems, 'application role under search_path "%s" with a temp look-alike table: every '
          'outcome right' % HOSTILE_PATH, problems)
    n_real = one(own, "SELECT pg_catalog.count(*) FROM public.idempotency_records WHERE tenant_id = 'hostile'")[0]
    n_temp = one(app, 'SELECT pg_catalog.count(*) FROM pg_temp.idempotency_records')[0]
    n_evil = one(own, 'SELECT pg_catalog.count(*) FROM evil.idempotency_records')[0]
    check(n_real >= 6 and n_temp == 0 and n_evil == 0,
          'the real table got the writes (%d rows); the pg_temp and evil look-alikes none' % n_real,
          (n_real, n_temp, n_evil))

    # a session that prepared its plans under a safe path, then switches
    sw = db.connect('privs', 'idem_app')
    workflow(sw, 'switch-before', 'sw')
    sw.cursor().execute("CREATE TEMP VIEW idempotency_records AS SELECT * FROM evil.idempotency_records")
    sw.cursor().execute('SET search_path = ' + HOSTILE_PATH)
    problems = workflow(sw, 'switch-after', 'sw')
    check(not problems, 'a session whose cached plans were made under a safe path, after switching to the '
          'hostile path and adding a temp look-alike view: every outcome right', problems)

    # a superuser under the same path: sweeper, forget, stale_action = fail
    su = db.connect('privs', search_path=HOSTILE_PATH)
    su_notices = su.notices
    cur = su.cursor()
    problems = []
    cur.execute("SELECT * FROM public.idem_claim(tenant_id => 'hostile-su', key => 'stale', lease => '1 ms')")
    cur.execute("SELECT * FROM public.idem_claim(tenant_id => 'hostile-su', key => 'gone', lease => '1 ms', "
                "ttl => '1 ms')")
    tok = cur.fetchone()[1]
    cur.execute("SELECT * FROM public.idem_complete(tenant_id => 'hostile-su', key => 'gone', token => %s)", (tok,))
    cur.execute("SELECT * FROM public.idem_claim(tenant_id => 'hostile-su', key => 'stale2', lease => '1 ms')")
    time.sleep(0.02)
    cur.execute("SET idempotency.stale_action = 'fail'")
    cur.execute("SELECT * FROM public.idem_claim(tenant_id => 'hostile-su', key => 'stale')")
    r = cur.fetchone()
    if r[0] != 'failed':
        problems.append('stale claim under stale_action=fail: %r' % (r,))
    cur.execute('SELECT * FROM public.idem_sweep(batch_size => 1)')
    r = cur.fetchone()
    if r[0] < 1 or r[2] < 1:
        problems.append('sweep (fail stale): %r' % (r,))
    cur.execute("SET idempotency.stale_action = 'release'")
    cur.execute("SELECT * FROM public.idem_claim(tenant_id => 'hostile-su', key => 'stale3', lease => '1 ms')")
    time.sleep(0.02)
    cur.execute('SELECT * FROM public.idem_sweep()')
    r = cur.fetchone()
    if r[1] < 1:
        problems.append('sweep (release stale): %r' % (r,))
    cur.execute("SELECT * FROM public.idem_forget(tenant_id => 'hostile-su', key => 'stale')")
    if cur.fetchone()[0] is not True:
        problems.append('forget')
    if signature(own, 'idem_stats_read'):
        cur.execute('SELECT * FROM public.idem_stats_read()')
        cur.fetchall()
    check(not problems, 'superuser under the hostile path: stale claim failed, sweep (fail and release), '
          'forget, stats: every outcome right', problems)

    seq = one(own, 'SELECT last_value, is_called FROM evil.captures')
    logged = rows(own, 'SELECT what FROM evil.capture_log')
    warned = [n for n in app_notices + su_notices + sw.notices if 'CAPTURED' in n]
    check(not seq[1] and not logged and not warned,
          'no look-alike ran: the trap sequence was never called, nothing logged, no warning',
          (seq, logged[:5], warned[:5]))

    # control: the traps are live, so the check above could fail.  The same
    # hostile session runs an unqualified operator, function and relation.
    ctl = db.connect('privs', 'idem_app', search_path=HOSTILE_PATH)
    ctl.cursor().execute('CREATE TEMP TABLE idempotency_records (LIKE public.idempotency_records)')
    one(ctl, "SELECT 'a'::text = 'b'::text, now(), (SELECT count(*) FROM idempotency_records)")
    after = one(own, 'SELECT last_value, is_called FROM evil.captures')
    what = {r[0] for r in rows(own, 'SELECT what FROM evil.capture_log')}
    check(after[1] and 'operator =(text, text)' in what and 'function now()' in what,
          'control: the same path does capture an unqualified operator (=) and function (now()) '
          'in a statement of our own', (after, what))
    ctl.close()

    # the SQL our C code really ran, reviewed like the install script
    texts = [r[0] for r in rows(own, """
        SELECT DISTINCT query FROM public.pg_stat_statements
        WHERE NOT toplevel AND query LIKE '%idempotency_records%'""")]
    sys.path.insert(0, HERE)
    import sql_lint
    findings = []
    for t in texts:
        findings += sql_lint.lint(t, query_mode=True, name='spi')
    check(len(texts) >= 8 and not findings,
          'the %d distinct statements the C code ran (pg_stat_statements) qualify every operator, '
          'function and relation' % len(texts), findings[:10] + ([] if len(texts) >= 8 else texts))
    own.cursor().execute('REVOKE CREATE ON SCHEMA public FROM idem_evil')
    for conn in (app, sw, su, own):
        conn.close()


# --------------------------------------------------------------------------
# install time


def test_install(db):
    print('# install: pre-created objects, unsafe schema names, a dedicated schema')
    root = db.connect('postgres')
    for obj, ddl, expect in (
            ('function', 'CREATE FUNCTION public.idem_sweep(batch_size integer DEFAULT NULL, OUT expired_removed '
                         'bigint, OUT stale_released bigint, OUT stale_failed bigint) RETURNS record LANGUAGE sql '
                         'AS $$ SELECT 0::bigint, 0::bigint, 0::bigint $$', '42723'),
            ('table', 'CREATE TABLE public.idempotency_records (x int)', '42P07')):
        root.cursor().execute('DROP DATABASE IF EXISTS privs_preempt')
        root.cursor().execute('CREATE DATABASE privs_preempt')
        own = db.connect('privs_preempt')
        own.cursor().execute('GRANT CREATE ON SCHEMA public TO idem_evil')
        ev = db.connect('privs_preempt', 'idem_evil')
        ev.cursor().execute(ddl)
        ev.close()
        st = sqlstate_of(own, 'CREATE EXTENSION idempotency')
        adopted = one(own, """SELECT pg_catalog.count(*) FROM pg_catalog.pg_depend d
                              JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid
                              WHERE e.extname = 'idempotency'""")[0]
        check(st == expect and adopted == 0,
              'a %s created first by a hostile role: CREATE EXTENSION fails (%s) and adopts nothing' % (obj, st),
              (st, adopted))
        own.close()
    root.cursor().execute('DROP DATABASE IF EXISTS privs_preempt')

    # CVE-2023-39417: a schema name that would break out of a quoted @extschema@
    root.cursor().execute('DROP DATABASE IF EXISTS privs_quote')
    root.cursor().execute('CREATE DATABASE privs_quote')
    q = db.connect('privs_quote')
    q.cursor().execute('CREATE SCHEMA "x\'y"')
    msg = None
    try:
        q.cursor().execute('CREATE EXTENSION idempotency SCHEMA "x\'y"')
    except psycopg2.Error as e:
        msg = '%s %s' % (e.pgcode, e.pgerror.strip())
    check(msg is not None and 'invalid character in extension' in msg,
          'CREATE EXTENSION into a schema named x\'y is refused by the server\'s guard (CVE-2023-39417): the '
          'quoted @extschema@ in pg_extension_config_dump cannot be broken out of', msg)
    q.close()
    root.cursor().execute('DROP DATABASE privs_quote')

    # a dedicated schema nobody else can write: qualified calls cannot be shadowed
    root.cursor().execute('DROP DATABASE IF EXISTS privs_schema')
    root.cursor().execute('CREATE DATABASE privs_schema')
    own = db.connect('privs_schema')
    own.cursor().execute("""
        CREATE SCHEMA idem;
        CREATE EXTENSION idempotency SCHEMA idem;
        GRANT USAGE ON SCHEMA idem TO idem_app;
        GRANT SELECT, INSERT, UPDATE, DELETE ON idem.idempotency_records TO idem_app;
        GRANT CREATE ON SCHEMA public TO idem_evil;
        CREATE SCHEMA evil AUTHORIZATION idem_evil""")
    for f in APP_FUNCTIONS:
        r = one(own, "SELECT p.oid::pg_catalog.regprocedure::text FROM pg_catalog.pg_proc p "
                     "WHERE p.proname = %s AND p.pronamespace = 'idem'::regnamespace", (f,))
        if r:
            own.cursor().execute('GRANT EXECUTE ON FUNCTION %s TO idem_app' % r[0])
    ev = db.connect('privs_schema', 'idem_evil')
    ev.cursor().execute("""
        CREATE SEQUENCE evil.captures;
        GRANT USAGE ON SCHEMA evil TO PUBLIC;
        CREATE FUNCTION evil.trap() RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog
            AS $$ SELECT pg_catalog.nextval('evil.captures') $$;
        CREATE FUNCTION public.idem_claim(tenant_id text, key text) RETURNS text LANGUAGE sql
            SECURITY DEFINER SET search_path = pg_catalog AS $$ SELECT evil.trap(); SELECT 'EVIL' $$;
        CREATE FUNCTION public.idem_claim(tenant_id varchar, key varchar, fingerprint varchar DEFAULT NULL)
            RETURNS text LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog
            AS $$ SELECT evil.trap(); SELECT 'EVIL' $$;
        CREATE FUNCTION public.idem_complete(tenant_id varchar, key varchar, token bigint, response jsonb DEFAULT NULL)
            RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$ SELECT evil.trap() $$""")
    ev.close()
    app = db.connect('privs_schema', 'idem_app', search_path='public, idem')
    cur = app.cursor()
    outcomes = []
    for sql, params in (("SELECT outcome FROM idem.idem_claim(%s, %s)", ('s', 'k1')),
                        ("SELECT outcome FROM idem.idem_claim(%s::varchar, %s::varchar)", ('s', 'k2')),
                        ("SELECT outcome FROM idem.idem_claim(tenant_id => %s::varchar, key => %s::varchar, "
                         "fingerprint => %s::varchar)", ('s', 'k3', 'f'))):
        cur.execute(sql, params)
        outcomes.append(cur.fetchone()[0])
    tok = one(app, "SELECT token FROM idem.idem_lookup('s', 'k1')")[0]
    cur.execute("SELECT idem.idem_complete(%s::varchar, %s::varchar, %s)", ('s', 'k1', tok))
    status = one(own, "SELECT status FROM idem.idempotency_records WHERE tenant_id = 's' AND key = 'k1'")[0]
    trapped = one(own, 'SELECT is_called FROM evil.captures')[0]
    check(outcomes == ['claimed'] * 3 and status == 'completed' and not trapped,
          'installed in its own schema: schema-qualified calls (text, varchar and named arguments) reach the '
          'extension despite overloads in public', (outcomes, status, trapped))
    # the hazard the README warns about, shown (not counted): unqualified calls
    # with varchar arguments resolve to the overload in public
    cur.execute("SELECT idem_claim(%s::varchar, %s::varchar)", ('s', 'k4'))
    print('note: unqualified idem_claim(varchar, varchar) with an overload in a writable schema on the path '
          'returned %r (why the README says: qualify calls, keep CREATE on the extension\'s schema to '
          'trusted roles)' % (cur.fetchone()[0],))
    app.close()
    own.close()
    root.cursor().execute('DROP DATABASE privs_schema')
    root.close()


# --------------------------------------------------------------------------
# script review


def test_script_review(args):
    print('# script review (pgspot stand-in: test/privileges/sql_lint.py)')
    sys.path.insert(0, HERE)
    import sql_lint
    allow = sql_lint.load_allow(os.path.join(HERE, 'lint-allow.txt'))
    sharedir = subprocess.run(['pg_config', '--sharedir'], capture_output=True, text=True).stdout.strip()
    extdir = os.path.join(sharedir, 'extension')
    scripts = sorted(os.path.join(extdir, f) for f in os.listdir(extdir)
                     if f.startswith('idempotency--') and f.endswith('.sql'))
    # the committed scripts too (the install and update scripts of every version)
    scripts += sorted(os.path.join(args.repo, f) for f in os.listdir(args.repo)
                      if f.startswith('idempotency--') and f.endswith('.sql'))
    results = []
    for path in scripts:
        results.append((path, sql_lint.lint(open(path, encoding='utf-8').read(), name=os.path.basename(path))))
    for path, found in results:
        kept, allowed = sql_lint.apply_allow(found, allow)
        for a in allowed:
            print('      allowed: ' + a)
        check(not kept, 'no search_path or CREATE OR REPLACE hazard in %s' % path, kept)

    bad = open(os.path.join(HERE, 'lint_bad_sample.sql'), encoding='utf-8').read()
    fired = {f.split()[1] for f in sql_lint.lint(bad, name='sample')}
    want = {'R%d' % i for i in range(1, 15)}
    check(want <= fired, 'the review catches every rule R1-R14 in test/privileges/lint_bad_sample.sql',
          sorted(want - fired))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--host', default='127.0.0.1')
    ap.add_argument('--port', type=int, required=True)
    ap.add_argument('--repo', default=os.path.dirname(os.path.dirname(HERE)))
    args = ap.parse_args()
    db = DB(args)

    root = db.connect('postgres')
    root.cursor().execute('DROP DATABASE IF EXISTS privs')
    root.cursor().execute('CREATE DATABASE privs')
    for r in ('idem_app', 'idem_ops', 'idem_nogrant', 'idem_execonly', 'idem_evil'):
        if not one(root, 'SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s', (r,)):
            root.cursor().execute('CREATE ROLE %s LOGIN' % r)
    root.close()
    own = db.connect('privs')
    own.cursor().execute('CREATE EXTENSION idempotency')
    own.cursor().execute('CREATE EXTENSION pg_stat_statements')
    global HAS_CLAIM_MANY
    HAS_CLAIM_MANY = signature(own, 'idem_claim_many') is not None
    own.close()

    sys.path.insert(0, HERE)
    import documented_roles

    def test_documented_roles(db):
        documented_roles.run(sys.modules[__name__], db, args.repo)

    for test in (test_catalog, test_roles, test_documented_roles, test_hostile, test_install):
        try:
            test(db)
        except Exception as e:          # a crash of the test itself is a failure, not a stop
            check(False, '%s raised %s: %s' % (test.__name__, type(e).__name__, str(e).strip()[:500]))
    try:
        test_script_review(args)
    except Exception as e:
        check(False, 'script review raised %s: %s' % (type(e).__name__, e))
    print('PRIVILEGES-RESULT passed=%d failed=%d' % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == '__main__':
    sys.exit(main())
