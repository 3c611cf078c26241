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
"""

import glob
import os
import re
import time

import psycopg2

ROLES = ('app', 'idem_operator', 'idem_sweeper')
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
    }),
}


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

    what = {
        'app': 'claim, heartbeat, complete, replay, mismatch, lookup, release (with and without failure), '
               'takeover, fencing, claim_many',
        'idem_operator': 'lookup, forget, idem_stats (its own database only), idem_stats_reset, '
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
    own.close()
