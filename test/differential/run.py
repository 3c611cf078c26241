#!/usr/bin/python3
"""Differential suite: the same SQL with idempotency.defer_writes on and off.

A seeded generator (shapes.py) writes cases of many statement shapes that
use the extension's functions.  Each case runs twice on identical starting
data, in two databases of one cluster: diff_on (ALTER DATABASE ... SET
idempotency.defer_writes = on: a fresh claim is held in memory and written
later, and a record is read by primary key without SPI where that is
allowed, src/direct_read.c) and diff_off (every claim's record written at
once and every record read through SQL: the reference).
Every observable is compared after normalisation (harness.py): each
statement's success or SQLSTATE and message, rows, row counts, notices and
notifications, then the records and business tables.  Any difference is
printed with its case id and a reproducer (the SQL and both observations).

Usage:
  run.py --port P [--host H] --seed S --cases N      run, exit 1 on any difference
  run.py --port P --seed S --show CASE               one case: SQL, both observations, verdict
  run.py --port P --seed S --cases N --self-test     plant differences and check each is reported
  run.py --seed S --print CASE                       the SQL of one case (no server)
  run.py --port P --seed S --cases N --only SHAPE,...  only the cases of these shapes

It (re)creates the databases diff_on and diff_off itself (--keep-dbs reuses
them; --db-prefix names others, for two runs on one server).  The server
must preload the library, have max_prepared_transactions > 0 and room for
parallel workers (test/suites/45-differential starts one).
"""

import argparse
import collections
import json
import os
import queue
import random
import re
import sys
import threading
import time

import psycopg2

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import shapes                   # noqa: E402
from harness import Case, Side, Step, normalise, diff      # noqa: E402

MAX_FULL_REPORTS = 2            # full reproducers printed per shape (and one per class)
MAX_BRIEF_REPORTS = 10          # difference lines printed per shape (all are counted)


def make_case(seed, num):
    """Case num of seed: the same case every time (its own random stream)."""
    rng = random.Random('%s/%d' % (seed, num))
    names = [s[0] for s in shapes.SHAPES]
    weights = [s[2] for s in shapes.SHAPES]
    shape_name = rng.choices(names, weights)[0]
    fn = dict((s[0], s[1]) for s in shapes.SHAPES)[shape_name]
    case = Case(seed, num, shape_name)
    g = shapes.G(rng, case)
    fn(g)
    case.rows, case.rec_triggers, case.steps, case.note = g.rows, g.triggers, g.steps, g.note
    case.observe_locks = g.observe_locks
    return case


def dsn(args, db):
    return 'host=%s port=%d user=%s dbname=%s' % (args.host, args.port, args.user, db)


def databases(args):
    return {'on': args.db_prefix + '_on', 'off': args.db_prefix + '_off'}


def setup_databases(args):
    conn = psycopg2.connect(dsn(args, 'postgres'))
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute('SHOW server_version_num')
    version = int(cur.fetchone()[0])
    if not args.keep_dbs:
        with open(os.path.join(HERE, 'schema.sql')) as f:
            schema = f.read()
        for role in ('diff_app', 'diff_noinsert', 'diff_owner'):
            cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
            if not cur.fetchone():
                cur.execute('CREATE ROLE %s' % role)
        cur.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", ('d-%s\\_%%' % args.db_prefix,))
        for (gid,) in cur.fetchall():
            cur.execute("ROLLBACK PREPARED %s", (gid,))
        for side, db in databases(args).items():
            cur.execute('DROP DATABASE IF EXISTS %s' % db)
            cur.execute('CREATE DATABASE %s' % db)
            cur.execute('ALTER DATABASE %s SET idempotency.defer_writes = %s' % (db, side))
            # the off side also reads every record through SQL, so the
            # replay fast path (src/direct_read.c) is compared too
            cur.execute('ALTER DATABASE %s SET idempotency.direct_reads = %s' % (db, side))
            cur.execute("ALTER DATABASE %s SET TimeZone = 'UTC'" % db)
            c2 = psycopg2.connect(dsn(args, db))
            c2.autocommit = True
            k = c2.cursor()
            k.execute('CREATE EXTENSION idempotency')
            k.execute(schema)
            c2.close()
    conn.close()
    shapes.PARALLEL_GUC = shapes.force_parallel_setting(version)
    return version


def holding_probe(side, args):
    """Has one fresh claim (BEGIN; SELECT * FROM idem_claim(...)) written its
    record before it settles?  Asked without looking from inside the
    transaction (any function call may count as a reader that makes held
    claims be written): a second session reads the size of the table's file,
    emptied just before.  Returns the bytes written (0: the claim is held)."""
    side.reset(Case(args.seed, 0, 'probe', rows=1))
    cur = side.conn.cursor()
    cur.execute('BEGIN')
    cur.execute("SELECT * FROM idem_claim('probe', 'probe')")
    peer = side.peer_conn().cursor()
    peer.execute("SELECT pg_relation_size('idempotency_records')")
    n = peer.fetchone()[0]
    peer.close()
    cur.execute('ROLLBACK')
    cur.close()
    return n


class Runner(threading.Thread):
    """Runs every case on one side, in order; results go to a queue."""

    def __init__(self, side, cases, plants):
        super().__init__(daemon=True)
        self.side = side
        self.cases = cases
        self.plants = plants
        self.out = queue.Queue()
        self.seconds = collections.Counter()

    def run(self):
        for case in self.cases:
            try:
                extra = self.plants.get((case.num, self.side.name))
                t0 = time.time()
                obs = self.side.run_case(case, extra if isinstance(extra, Step) else None)
                self.seconds[case.shape] += time.time() - t0
                self.out.put((case.num, obs, None))
            except Exception as e:           # a harness failure, not a difference
                self.out.put((case.num, None, '%s: %s' % (type(e).__name__, e)))
                try:
                    self.side.close()
                    self.side.connect()
                except Exception:
                    pass


def mutate(obs, rng):
    """Change one leaf of a normalised observation (self-test)."""
    leaves = []

    def walk(v, path):
        if isinstance(v, dict):
            for k in v:
                walk(v[k], path + [k])
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(x, path + [i])
        else:
            leaves.append(path)
    walk(obs, [])
    path = rng.choice(leaves)
    node = obs
    for p in path[:-1]:
        node = node[p]
    v = node[path[-1]]
    if isinstance(v, bool):
        node[path[-1]] = not v
    elif isinstance(v, int):
        node[path[-1]] = v + 1
    elif v is None:
        node[path[-1]] = 'planted'
    else:
        node[path[-1]] = str(v) + '~planted'
    return 'mutated %s' % '/'.join(str(p) for p in path)


def plant_for(case, rng):
    r = rng.random()
    t = q = shapes.q
    if r < 0.25:
        return Step("INSERT INTO audit (what, info) VALUES ('planted', %s)" % q(case.cid))
    if r < 0.45:
        # the tenant set too, for the cases with tenant isolation on
        return Step("SELECT set_config('app.tenant', %s, true), idem_claim(%s, 'planted')"
                    % (t('t%d' % case.num), t('t%d' % case.num)))
    if r < 0.55:
        return Step("UPDATE ledger SET amount = amount + 1 WHERE id = (SELECT min(id) FROM ledger)")
    if r < 0.6:
        return Step("INSERT INTO ledger VALUES (990000, 1, 'planted')")
    return 'mutate'


def show_obs(label, obs):
    print('---- %s' % label)
    for i, s in enumerate(obs['steps']):
        print('  step %d: %s' % (i, json.dumps(s, default=str)))
    for k, v in obs['state'].items():
        print('  final %s: %s' % (k, json.dumps(v, default=str)))


def brief(where, obs):
    """One line for one side at the place of a difference."""
    if where.startswith('step '):
        i = int(where.split()[1])
        o = obs['steps'][i] if i < len(obs['steps']) else None
        if o is None:
            return 'no step'
        if 'skipped' in o:
            return o['skipped']
        if 'stuck' in o:
            return 'STUCK ' + o['stuck']
        if not o['ok']:
            return 'ERROR %s %s' % (o['sqlstate'], o['error'][:90])
        text = o['tag'] or ''
        if 'rows' in o:
            text += ' ' + json.dumps(o['rows'], default=str)[:90]
        if 'copy' in o:
            text += ' copy ' + json.dumps(o['copy'], default=str)[:90]
        if 'notices' in o:
            text += ' notices %d' % len(o['notices'])
        if 'notifies' in o:
            text += ' notifies %s' % json.dumps(o['notifies'])[:60]
        if 'locks' in o:
            text += ' locks %d' % len(o['locks'])
        return text
    return json.dumps(obs['state'].get(where.split()[1]), default=str)[:110]


def signature(case, where, a, b):
    """A difference's class: shape, place kind and both sides in brief, digits
    and names blurred."""
    kind = 'step' if where.startswith('step ') else where
    sa = re.sub(r'\d+', 'N', brief(where, a))[:70]
    sb = re.sub(r'\d+', 'N', brief(where, b))[:70]
    return '%s @ %s: on [%s] / off [%s]' % (case.shape, kind, sa, sb)


def report_difference(case, where, a, b, count, new_class=False):
    """count: how many differences of this shape were reported before; the
    first of each class (see signature) is printed in full."""
    if count >= MAX_BRIEF_REPORTS and not new_class:
        return
    full = count < MAX_FULL_REPORTS or new_class
    print('DIFFERENCE case %s shape %s at %s' % (case.cid, case.shape, where))
    print('  brief on : %s' % brief(where, a))
    print('  brief off: %s' % brief(where, b))
    if not full:
        print('  (reproduce: run.py --seed %s --show %d)' % (case.seed, case.num))
        return
    print(case.sql_text())
    if where.startswith('step '):
        i = int(where.split()[1])
        print('  on : %s' % json.dumps(a['steps'][i] if i < len(a['steps']) else None, default=str))
        print('  off: %s' % json.dumps(b['steps'][i] if i < len(b['steps']) else None, default=str))
    else:
        k = where.split()[1]
        print('  on : %s' % json.dumps(a['state'].get(k), default=str)[:3000])
        print('  off: %s' % json.dumps(b['state'].get(k), default=str)[:3000])
    print('  (all observations: run.py --seed %s --show %d)' % (case.seed, case.num))


def run(args):
    version = setup_databases(args)
    side_opts = {'on': None, 'off': None}
    if args.self_test:
        # both sides write at once: an unplanted case must show no difference
        both_off = '-c idempotency.defer_writes=off -c idempotency.direct_reads=off'
        side_opts = {'on': both_off, 'off': both_off}
    sides = {name: Side(name, dsn(args, databases(args)[name]), side_opts[name]) for name in ('on', 'off')}
    want = {'on': 'off' if args.self_test else 'on', 'off': 'off'}
    for name, s in sides.items():
        if s.defer_writes != want[name]:
            print('ERROR: side %s has idempotency.defer_writes = %s, expected %s'
                  % (name, s.defer_writes, want[name]))
            return 2
    if not args.self_test and args.show is None:
        probe = {name: holding_probe(s, args) for name, s in sides.items()}
        print('DIFF-PROBE on=%d off=%d (bytes the records table holds after BEGIN; one fresh claim: '
              '0 = the claim is held in memory, so the comparison exercises holding)'
              % (probe['on'], probe['off']))
    print('server %d, %s = forced parallel plans; sides: on (%s), off (%s)%s'
          % (version, shapes.PARALLEL_GUC, sides['on'].defer_writes, sides['off'].defer_writes,
             ' [self-test: both off, differences planted]' if args.self_test else ''))

    if args.show is not None:
        cases = [make_case(args.seed, args.show)]
    elif args.only:
        # the same case numbers as a full run, keeping the shapes asked for
        wanted = set(args.only.split(','))
        cases, n = [], args.first
        while len(cases) < args.cases and n < args.first + 1000 * args.cases:
            c = make_case(args.seed, n)
            if c.shape in wanted:
                cases.append(c)
            n += 1
    else:
        cases = [make_case(args.seed, n) for n in range(args.first, args.first + args.cases)]
    nums = [c.num for c in cases]
    plants = {}
    prng = random.Random('plant/%s' % args.seed)
    if args.self_test:
        for c in cases:
            if prng.random() < args.plant_rate:
                side = prng.choice(['on', 'off'])
                plants[(c.num, side)] = plant_for(c, prng)

    t0 = time.time()
    runners = {name: Runner(sides[name], cases, plants) for name in sides}
    for r in runners.values():
        r.start()

    per_shape = collections.Counter()
    diff_shape = collections.Counter()
    reported = collections.Counter()
    differences = 0
    harness_errors = 0
    planted = caught = false_pos = 0
    classes = {}
    for case in cases:
        na, a, ea = runners['on'].out.get()
        nb, b, eb = runners['off'].out.get()
        assert na == nb == case.num
        per_shape[case.shape] += 1
        if ea or eb:
            harness_errors += 1
            print('HARNESS ERROR case %s shape %s: on: %s; off: %s' % (case.cid, case.shape, ea, eb))
            continue
        a, b = normalise(a), normalise(b)
        plant = plants.get((case.num, 'on')) or plants.get((case.num, 'off'))
        if plant == 'mutate':
            victim = a if (case.num, 'on') in plants else b
            what = mutate(victim, prng)
        elif plant is not None:
            what = 'extra statement on side %s: %s' % ('on' if (case.num, 'on') in plants else 'off', plant.sql)
        where = diff(a, b)
        if args.show is not None:
            print(case.sql_text())
            show_obs('on  (defer_writes=%s)' % sides['on'].defer_writes, a)
            show_obs('off (defer_writes=%s)' % sides['off'].defer_writes, b)
            print('VERDICT: %s' % ('difference at ' + where if where else 'no difference'))
            return 1 if where else 0
        if args.self_test:
            if plant is not None:
                planted += 1
                if where:
                    caught += 1
                else:
                    print('SELF-TEST MISSED case %s (%s)' % (case.cid, what))
            elif where:
                false_pos += 1
                report_difference(case, where, a, b, reported[case.shape])
                reported[case.shape] += 1
            continue
        if where:
            differences += 1
            diff_shape[case.shape] += 1
            sig = signature(case, where, a, b)
            new_class = sig not in classes
            if new_class:
                classes[sig] = [0, case.cid]
            classes[sig][0] += 1
            report_difference(case, where, a, b, reported[case.shape], new_class)
            reported[case.shape] += 1
        if args.progress and case.num % args.progress == 0:
            print('... %d cases, %d differences, %.0fs' % (case.num - args.first + 1, differences,
                                                         time.time() - t0), flush=True)

    elapsed = time.time() - t0
    for s in sides.values():
        s.close()
    print('cases run: %d in %.1f s (seed %s, cases %d..%d)' % (len(cases), elapsed, args.seed, nums[0], nums[-1]))
    print('shapes covered:')
    for name, _, _ in shapes.SHAPES:
        print('  shape %-22s cases=%d differences=%d (%.1f s)'
              % (name, per_shape[name], diff_shape[name], max(r.seconds[name] for r in runners.values())))
    if harness_errors:
        print('harness errors: %d' % harness_errors)
    if args.self_test:
        print('SELF-TEST planted=%d caught=%d unplanted-differences=%d' % (planted, caught, false_pos))
        ok = planted > 0 and caught == planted and false_pos == 0 and harness_errors == 0
        print('DIFF-SELFTEST %s' % ('ok' if ok else 'failed'))
        return 0 if ok else 1
    if classes:
        print('difference classes (count, first case, signature):')
        for sig, (n, cid) in sorted(classes.items(), key=lambda x: (-x[1][0], x[0]))[:60]:
            print('  %5d  %-8s %s' % (n, cid, sig))
        if len(classes) > 60:
            print('  ... %d more classes' % (len(classes) - 60))
    print('differences: %d' % differences)
    print('DIFF-RESULT cases=%d differences=%d harness_errors=%d' % (len(cases), differences, harness_errors))
    return 0 if differences == 0 and harness_errors == 0 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--host', default='127.0.0.1')
    ap.add_argument('--port', type=int, default=int(os.environ.get('IDEM_TEST_PORT_BASE', '5432')))
    ap.add_argument('--user', default='postgres')
    ap.add_argument('--seed', default='1')
    ap.add_argument('--cases', type=int, default=5000)
    ap.add_argument('--first', type=int, default=1, help='number of the first case')
    ap.add_argument('--show', type=int, help='run one case and print everything')
    ap.add_argument('--only', help='run only cases of these shapes (comma-separated)')
    ap.add_argument('--print', type=int, dest='print_case', help='print the SQL of one case (no server)')
    ap.add_argument('--self-test', action='store_true')
    ap.add_argument('--plant-rate', type=float, default=0.25)
    ap.add_argument('--keep-dbs', action='store_true')
    ap.add_argument('--db-prefix', default='diff', help='the databases are PREFIX_on and PREFIX_off')
    ap.add_argument('--progress', type=int, default=0, help='print progress every N cases')
    args = ap.parse_args()
    if args.print_case is not None:
        print(make_case(args.seed, args.print_case).sql_text())
        return 0
    return run(args)


if __name__ == '__main__':
    sys.exit(main())
