"""The three roles of docs/privileges.md, created with exactly its GRANT lines.

Called by privileges.py (test/suites/55-privileges).  The GRANT lines are
read from the ```sql blocks of docs/privileges.md -- every line of the form
`GRANT ... TO app;`, `... TO idem_operator;` or `... TO idem_sweeper;` --
and run as they are, in a database of their own, so the docs cannot drift
from what is tested.  Any other page of README.md or docs/ that grants one
of these roles something must repeat a line of docs/privileges.md
verbatim.  Then, for each role, every capability the page documents must
work and every refusal it documents must come with 42501; and every
privilege of each role's table GRANT line is needed (revoking it makes a
documented capability fail with 42501).

Coverage, from the catalog: every function of the extension (pg_depend
deptype 'e' on pg_proc) is granted by some role's lines or listed in the
page's "Owner only" table with a reason; each role is granted exactly the
functions ROLE_FUNCTIONS below says it needs (a function in a role it
should not be in fails); each role is refused (42501) every function of the
extension its lines do not grant, called with the catalog's argument
types.  And the application role, with tenant isolation switched on as the
README's quick start does, runs the README's multi-step block as written.
"""

import glob
import os
import re
import time

import psycopg2

ROLES = ('app', 'idem_operator', 'idem_sweeper')

# The functions each documented role needs, and which its checks below
# exercise: its GRANT lines on docs/privileges.md must name exactly these.
# A function added to the extension must be given to a role here and on the
# page, or be listed in the page's "Owner only" table with a reason.
ROLE_FUNCTIONS = {
    'app': {'idem_claim', 'idem_claim_many', 'idem_complete', 'idem_release', 'idem_heartbeat',
            'idem_checkpoint', 'idem_child_key', 'idem_lookup'},
    'idem_operator': {'idem_lookup', 'idem_forget', 'idem_sweep', 'idem_stats_read', 'idem_stats_reset',
                      'idem_node_stats', 'idem_cluster_stats', 'idem_record_states'},
    'idem_sweeper': {'idem_sweep'},
}
# Executable by PUBLIC on purpose (docs/privileges.md says why): so by every
# role, whatever its lines grant.
PUBLIC_FUNCTIONS = {'idem_current_tenant'}
# Executable by pg_monitor (the extension grants it; docs/privileges.md,
# "Monitoring"): none of the three roles is a member, so each is refused them.
MONITOR_FUNCTIONS = {'idem_metrics', 'idem_metrics_tenants'}
OWNER_ONLY_HEADING = '## Owner only'
OWNER_ROW = re.compile(r'^\|\s*`([A-Za-z_][A-Za-z0-9_]*\([^)]*\))`\s*\|\s*(.*?)\s*\|\s*$')
DB = 'documented'
GRANT_LINE = re.compile(r'^\s*(GRANT\s.*\sTO\s+(%s)\s*;)\s*$' % '|'.join(ROLES), re.I)


def sql_block_lines(path):
    """(line number, text) of every line inside a ```sql block."""
    result, inside = [], False
    with open(path, encoding='utf-8') as f:
        for no, line in enumerate(f, 1):
            if re.match(r'^\s*```', line):
                inside = (not inside) and bool(re.match(r'^\s*```sql\s*$', line))
                continue
            if inside:
                result.append((no, line.rstrip('\n')))
    return result


def documented_grants(repo):
    """{role: [GRANT line, ...]} from docs/privileges.md, and the problems:
    a GRANT to one of the roles split over lines, or a line elsewhere that
    is not on the page."""
    page = os.path.join(repo, 'docs', 'privileges.md')
    grants = {r: [] for r in ROLES}
    problems = []
    for no, line in sql_block_lines(page):
        m = GRANT_LINE.match(line)
        if m:
            grants[m.group(2).lower()].append(m.group(1))
        elif re.match(r'^\s*GRANT\b', line, re.I) and re.search(r'\bTO\s+(%s)\b' % '|'.join(ROLES), line) is None \
                and not line.rstrip().endswith(';'):
            problems.append('docs/privileges.md:%d: a GRANT that does not fit on one line: %s' % (no, line))
    every = {g for lines in grants.values() for g in lines}
    others = [os.path.join(repo, 'README.md')] + glob.glob(os.path.join(repo, 'docs', '**', '*.md'), recursive=True)
    for path in others:
        if os.path.abspath(path) == os.path.abspath(page):
            continue
        for no, line in sql_block_lines(path):
            m = GRANT_LINE.match(line)
            if m and m.group(1) not in every:
                problems.append('%s:%d: grants %s something docs/privileges.md does not: %s'
                                % (os.path.relpath(path, repo), no, m.group(2), m.group(1)))
    return grants, problems


def owner_only(repo):
    """{signature as written: reason} from the table under '## Owner only'
    of docs/privileges.md."""
    result, inside = {}, False
    with open(os.path.join(repo, 'docs', 'privileges.md'), encoding='utf-8') as f:
        for line in f:
            if line.startswith('## '):
                inside = line.strip() == OWNER_ONLY_HEADING
                continue
            m = OWNER_ROW.match(line) if inside else None
            if m:
                result[m.group(1)] = m.group(2)
    return result


def sql_blocks(path):
    """The text of every ```sql block of a page, one string per block."""
    blocks, current = [], None
    with open(path, encoding='utf-8') as f:
        for line in f:
            if re.match(r'^\s*```', line):
                if current is None and re.match(r'^\s*```sql\s*$', line):
                    current = []
                elif current is not None:
                    blocks.append(''.join(current))
                    current = None
                continue
            if current is not None:
                current.append(line)
    return blocks


_db = None                      # privileges.DB, set by run()


def connect(P, db, user):
    return _db.connect(db, user)


def expect_refused(P, conn, calls):
    """{name: sqlstate} for each call that was not refused with 42501."""
    return {name: st for name, st in ((n, P.sqlstate_of(conn, sql)) for n, sql in calls.items()) if st != '42501'}


# what each role can do; each returns a list of problems (empty: it works)

def app_can(P, own):
    c = connect(P, DB, 'app')
    try:
        return P.workflow(c, 'docs-app', 'k%d' % time.monotonic_ns())
    except psycopg2.Error as e:
        return ['%s %s' % (e.pgcode, str(e).strip().splitlines()[0])]
    finally:
        c.close()


def prepare_expired(own, tenant):
    """A completed record past its retention and a stale claim (lease over)."""
    cur = own.cursor()
    cur.execute("SELECT token FROM idem_claim(%s, 'done', ttl => '1 ms')", (tenant,))
    tok = cur.fetchone()[0]
    cur.execute("SELECT idem_complete(%s, 'done', %s, '{}')", (tenant, tok))
    cur.execute("SELECT token FROM idem_claim(%s, 'stale', lease => '1 ms')", (tenant,))
    time.sleep(0.02)


def sweeps(P, own, user):
    """The role's idem_sweep removes an expired record and, with
    stale_action = 'fail' (set for the role's session), fails a stale claim:
    the sweep needs DELETE, and UPDATE for both FOR UPDATE and the failing."""
    tenant = 'sweep-%s-%d' % (user, time.monotonic_ns())
    prepare_expired(own, tenant)
    own.cursor().execute("ALTER ROLE %s IN DATABASE %s SET idempotency.stale_action = 'fail'" % (user, DB))
    c = connect(P, DB, user)
    own.cursor().execute('ALTER ROLE %s IN DATABASE %s RESET idempotency.stale_action' % (user, DB))
    try:
        r = P.one(c, 'SELECT expired_removed, stale_released, stale_failed FROM idem_sweep()')
        left = P.one(own, "SELECT count(*) FILTER (WHERE key = 'done'), "
                          "count(*) FILTER (WHERE key = 'stale' AND status = 'failed') "
                          "FROM idempotency_records WHERE tenant_id = %s", (tenant,))
        return [] if r[0] >= 1 and r[2] >= 1 and left == (0, 1) else ['sweep: %r, left %r' % (r, left)]
    except psycopg2.Error as e:
        return ['%s %s' % (e.pgcode, str(e).strip().splitlines()[0])]
    finally:
        c.close()


def operator_can(P, own):
    problems = []
    tenant = 'ops-%d' % time.monotonic_ns()
    P.one(own, "SELECT outcome FROM idem_claim(%s, 'k')", (tenant,))
    c = connect(P, DB, 'idem_operator')
    try:
        r = P.rows(c, "SELECT status FROM idem_lookup(%s, 'k')", (tenant,))
        if r != [('processing',)]:
            problems.append('lookup: %r' % (r,))
        r = P.rows(c, "SELECT records FROM idem_record_states() WHERE state = 'processing'")
        if not r or r[0][0] < 1:
            problems.append('idem_record_states: %r (want at least the claim just made)' % (r,))
        r = P.one(c, "SELECT idem_forget(%s, 'k')", (tenant,))
        gone = P.one(own, "SELECT count(*) FROM idempotency_records WHERE tenant_id = %s", (tenant,))[0]
        if r != (True,) or gone != 0:
            problems.append('forget: %r, %d left' % (r, gone))
        stats = P.rows(c, 'SELECT datname FROM idem_stats')
        if [s[0] for s in stats] != [DB]:
            problems.append('idem_stats: %r (want the row of %s only)' % (stats, DB))
        P.one(c, 'SELECT idem_stats_reset()')
        claims = P.one(c, 'SELECT claims FROM idem_stats')
        if claims != (0,):
            problems.append('after idem_stats_reset: %r' % (claims,))
        # without Citus these run and refuse with 55000, which proves EXECUTE
        for call in ('SELECT * FROM idem_node_stats()', 'SELECT * FROM idem_cluster_stats()'):
            st = P.sqlstate_of(c, call)
            if st != '55000':
                problems.append('%s: SQLSTATE %s (want 55000: runs, and needs Citus)' % (call, st))
    except psycopg2.Error as e:
        problems.append('%s %s' % (e.pgcode, str(e).strip().splitlines()[0]))
    finally:
        c.close()
    return problems + sweeps(P, own, 'idem_operator')


def sweeper_can(P, own):
    return sweeps(P, own, 'idem_sweeper')


CAN = {'app': app_can, 'idem_operator': operator_can, 'idem_sweeper': sweeper_can}

SETTLE = {
    'idem_complete': "SELECT idem_complete('t', 'k', 1, '{}')",
    'idem_release': "SELECT idem_release('t', 'k', 1)",
    'idem_heartbeat': "SELECT idem_heartbeat('t', 'k', 1)",
}
REFUSED = {
    'app': {
        'idem_forget': "SELECT idem_forget('t', 'k')",
        'idem_sweep': 'SELECT * FROM idem_sweep()',
        'idem_stats': 'SELECT * FROM idem_stats',
        'idem_stats_read': 'SELECT * FROM idem_stats_read()',
        'idem_stats_reset': 'SELECT idem_stats_reset()',
        'idem_record_states': 'SELECT * FROM idem_record_states()',
    },
    'idem_operator': dict(SETTLE, **{
        'idem_claim': "SELECT * FROM idem_claim('t', 'k')",
        'idem_claim_many': "SELECT * FROM idem_claim_many('t', ARRAY['k'])",
        'INSERT into the table': """INSERT INTO idempotency_records (tenant_id, key, status, token, expires_at,
            ttl, created_at, updated_at) VALUES ('t', 'k', 'completed', 1, now(), '1 day', now(), now())""",
    }),
    'idem_sweeper': dict(SETTLE, **{
        'idem_claim': "SELECT * FROM idem_claim('t', 'k')",
        'idem_claim_many': "SELECT * FROM idem_claim_many('t', ARRAY['k'])",
        'idem_lookup': "SELECT * FROM idem_lookup('t', 'k')",
        'idem_forget': "SELECT idem_forget('t', 'k')",
        'idem_stats': 'SELECT * FROM idem_stats',
        'idem_stats_read': 'SELECT * FROM idem_stats_read()',
        'idem_stats_reset': 'SELECT idem_stats_reset()',
        'idem_record_states': 'SELECT * FROM idem_record_states()',
    }),
}


def extension_functions(P, own):
    """[(signature, name, call with NULLs of the argument types,
    {role: has EXECUTE})] for every function of the extension."""
    result = []
    for sig, name, args in P.rows(own, """
            SELECT p.oid::pg_catalog.regprocedure::text, p.proname,
                   pg_catalog.array_to_string(ARRAY(
                       SELECT pg_catalog.format('(SELECT NULL::%s)', pg_catalog.format_type(u.t, NULL))
                       FROM pg_catalog.unnest(p.proargtypes::pg_catalog.oid[]) WITH ORDINALITY AS u(t, i)
                       ORDER BY u.i), ', ')
            FROM pg_catalog.pg_depend d
            JOIN pg_catalog.pg_proc p ON p.oid = d.objid
            JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
            WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.deptype = 'e'
            ORDER BY 1"""):
        held = {r: P.one(own, "SELECT pg_catalog.has_function_privilege(%s, %s::pg_catalog.regprocedure, 'EXECUTE')",
                         (r, sig))[0] for r in ROLES}
        result.append((sig, name, 'SELECT %s(%s)' % (name, args), held))
    return result


def check_coverage(P, own, repo):
    """Every function of the extension is in a documented role or listed as
    owner only, each role holds exactly what it needs, and is refused the
    rest."""
    fns = extension_functions(P, own)
    listed = owner_only(repo)
    resolved, bad_rows = {}, []
    for written, why in listed.items():
        r = P.one(own, 'SELECT pg_catalog.to_regprocedure(%s)::text', (written,))[0]
        if r is None or r not in [f[0] for f in fns]:
            bad_rows.append('%s: not a function of the extension' % written)
        elif len(why) < 10:
            bad_rows.append('%s: no reason given' % written)
        else:
            resolved[r] = why
    P.check(listed and not bad_rows,
            'docs/privileges.md, "Owner only": %d functions of the extension, each with a reason' % len(listed),
            bad_rows or 'the table is missing')
    fns = [f for f in fns if f[1] not in PUBLIC_FUNCTIONS]
    monitor = [f[0] for f in fns if f[1] in MONITOR_FUNCTIONS]
    not_monitor = [sig for sig in monitor if not P.one(
        own, "SELECT pg_catalog.has_function_privilege('pg_monitor', %s::pg_catalog.regprocedure, 'EXECUTE')",
        (sig,))[0]]
    P.check(len(monitor) == len(MONITOR_FUNCTIONS) and not not_monitor,
            'pg_monitor may execute the %d monitoring functions' % len(MONITOR_FUNCTIONS),
            {'not executable by pg_monitor': not_monitor, 'found': monitor})
    uncovered = [f[0] for f in fns if not any(f[3].values()) and f[0] not in resolved
                 and f[1] not in MONITOR_FUNCTIONS]
    P.check(fns and not uncovered,
            'each of the %d functions of the extension (pg_depend) is in a documented role\'s GRANT lines '
            'or listed as owner only' % len(fns),
            {'in no role and not listed as owner only (add it to docs/privileges.md)': uncovered})
    both = [f[0] for f in fns if any(f[3].values()) and f[0] in resolved]
    P.check(not both, 'no function listed as owner only is granted to a documented role', both)
    for r in ROLES:
        granted = {f[1] for f in fns if f[3][r]}
        extra, missing = sorted(granted - ROLE_FUNCTIONS[r]), sorted(ROLE_FUNCTIONS[r] - granted)
        P.check(not extra and not missing,
                '%s\'s documented lines grant exactly the %d functions it needs' % (r, len(ROLE_FUNCTIONS[r])),
                {'granted but not for this role': extra, 'needed but not granted': missing})
        c = connect(P, DB, r)
        wrong = {}
        for sig, name, call, held in fns:
            if not held[r]:
                st = P.sqlstate_of(c, call)
                if st != '42501':
                    wrong[sig] = st
        c.close()
        refused = [f for f in fns if not f[3][r]]
        P.check(refused and not wrong,
                '%s is refused (42501) each of the %d functions its lines do not grant' % (r, len(refused)),
                wrong)


def app_runs_readme_multistep(P, own, repo):
    """The README's multi-step block as written, run by psql as the
    documented app role with tenant isolation on (the README's quick start):
    the deployer (the owner here) creates its table; the role does the rest.
    Returns a list of problems."""
    import subprocess
    blocks = [b for b in sql_blocks(os.path.join(repo, 'README.md'))
              if "idem_checkpoint('" in b and "idem_child_key('" in b]        # calls, not GRANT lines
    if len(blocks) != 1:
        return ['README.md has %d ```sql blocks with idem_checkpoint and idem_child_key (want 1)' % len(blocks)]
    block = blocks[0]
    tenant = re.search(r"idem_claim\('([^']+)'", block)
    if tenant is None:
        return ['the multi-step block claims no tenant by position: %r' % block[:200]]
    tenant = tenant.group(1)
    creates = re.findall(r'^CREATE TABLE\s+(\w+)[^;]*;', block, re.M | re.I)
    script = block
    for stmt in re.finditer(r'^CREATE TABLE\s+\w+[^;]*;', block, re.M | re.I):
        own.cursor().execute(stmt.group(0))
        script = script.replace(stmt.group(0), '')
    for t in creates:
        own.cursor().execute('GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO app' % t)
    own.cursor().execute("SELECT idem_set_tenant_isolation(true, 'app.tenant')")
    problems = []
    try:
        def psql(sql, as_tenant):
            env = dict(os.environ, PGOPTIONS='-c app.tenant=%s' % as_tenant)
            return subprocess.run(['psql', '-X', '-q', '-At', '-v', 'ON_ERROR_STOP=1', '-h', _db.args.host,
                                   '-p', str(_db.args.port), '-U', 'app', '-d', DB, '-f', '-'],
                                  input=sql, capture_output=True, text=True, env=env, timeout=60)
        r = psql(script, tenant)
        if r.returncode != 0:
            problems.append('psql as app (tenant %s) failed: %s' % (tenant, r.stderr.strip()[-600:]))
        key = re.search(r"idem_claim\('[^']+',\s*'([^']+)'", block).group(1)
        status = P.rows(own, 'SELECT status FROM idempotency_records WHERE tenant_id = %s AND key = %s',
                        (tenant, key))
        if status != [('completed',)]:
            problems.append('after the block the record of %s/%s is %r (want completed)' % (tenant, key, status))
        lookup = "SELECT count(*) FROM idem_lookup('%s', '%s');" % (tenant, key)
        mine, other = psql(lookup, tenant), psql(lookup, 'another-tenant')
        refused = 'tenant isolation confines this session to tenant "another-tenant"'
        if mine.stdout.strip() != '1' or other.returncode == 0 or refused not in other.stderr:
            problems.append('isolation: app sees %r of its own tenant\'s record, and as another tenant '
                            'gets %r (want 1, and the look-up refused): %s %s'
                            % (mine.stdout.strip(), other.stdout.strip(), mine.stderr.strip(),
                               other.stderr.strip()))
    finally:
        own.cursor().execute('SELECT idem_set_tenant_isolation(false)')
        for t in creates:
            own.cursor().execute('DROP TABLE %s' % t)
    return problems


def table_privileges(lines):
    for g in lines:
        m = re.match(r'GRANT\s+(.*?)\s+ON\s+(TABLE\s+)?idempotency_records\s+TO', g, re.I)
        if m:
            return [p.strip().upper() for p in m.group(1).split(',')]
    return []


def run(P, db, repo):
    global _db
    _db = db
    print('# documented roles: docs/privileges.md GRANT lines, run as written')
    grants, problems = documented_grants(repo)
    P.check(not problems and all(grants[r] for r in ROLES),
            'docs/privileges.md gives one-line GRANTs for app (%d), idem_operator (%d), idem_sweeper (%d); '
            'no other page grants them anything else' % tuple(len(grants[r]) for r in ROLES),
            problems or grants)
    if not all(grants[r] for r in ROLES):
        return

    root = _db.connect('postgres')
    root.cursor().execute('DROP DATABASE IF EXISTS %s' % DB)
    root.cursor().execute('CREATE DATABASE %s' % DB)
    for r in ROLES:
        if not P.one(root, 'SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s', (r,)):
            root.cursor().execute('CREATE ROLE %s LOGIN' % r)
    root.close()
    own = _db.connect(DB)
    own.cursor().execute('CREATE EXTENSION idempotency')
    failures = []
    for r in ROLES:
        for g in grants[r]:
            try:
                own.cursor().execute(g)
            except psycopg2.Error as e:
                failures.append('%s -- %s' % (g, str(e).strip()))
    P.check(not failures, 'every documented GRANT line runs as written', failures)

    check_coverage(P, own, repo)

    what = {
        'app': 'claim, heartbeat, complete, replay, mismatch, lookup, release (with and without failure), '
               'takeover, fencing, claim_many',
        'idem_operator': 'lookup, forget, idem_stats (its own database only), idem_stats_reset, '
                         'idem_node_stats and idem_cluster_stats (55000 without Citus), '
                         'idem_sweep (expired and stale records)',
        'idem_sweeper': 'idem_sweep (expired and stale records)',
    }
    for r in ROLES:
        probs = CAN[r](P, own)
        P.check(not probs, '%s with the documented grants can: %s' % (r, what[r]), probs)
        c = connect(P, DB, r)
        wrong = expect_refused(P, c, REFUSED[r])
        c.close()
        P.check(not wrong, '%s is refused with 42501: %s' % (r, ', '.join(REFUSED[r])), wrong)

    # every table privilege of each role's GRANT line is needed
    for r in ROLES:
        needed, unneeded = [], []
        for priv in table_privileges(grants[r]):
            own.cursor().execute('REVOKE %s ON idempotency_records FROM %s' % (priv, r))
            probs = CAN[r](P, own)
            own.cursor().execute('GRANT %s ON idempotency_records TO %s' % (priv, r))
            (needed if any(p.startswith('42501') for p in probs) else unneeded).append(priv)
        P.check(needed and not unneeded,
                '%s: each table privilege it is granted (%s) is needed: without it a documented '
                'capability fails with 42501' % (r, ', '.join(needed + unneeded)), {'not needed': unneeded})

    probs = app_runs_readme_multistep(P, own, repo)
    P.check(not probs, 'app, with tenant isolation on, runs the README\'s multi-step block as written '
            '(idem_checkpoint, idem_child_key) and sees only its own tenant\'s records', probs)
    own.close()
