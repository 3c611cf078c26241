#!/usr/bin/python3
"""Batch consumers and single claims on the same keys, concurrently.

idem_claim_many gives its fresh keys' locks back once its INSERT is done;
claimers then meet its rows in flight through a probe of the key index
(docs/capacity.md).  This drives that hard: SESSIONS threads take random,
overlapping slices of KEYS keys, each transaction either one idem_claim_many
of up to 200 keys or a handful of idem_claim calls (some with wait), then,
for every key it won, writes the effect row and completes the key with a
response naming its token, and commits (one transaction in ten rolls back
instead).  Every answer is checked as it comes:

  - claimed: the key had no committed effect; replay: the stored response is
    the one the effect row's token wrote; in_progress: fine, retried later;
  - no error at all (no deadlock, no lock wait error, no unique violation).

At the end: every key has exactly one effect row and a completed record
whose response names that row's token; none is left processing; a monitor
sampling pg_locks never saw more key locks than a session may hold at once:
100 during a batch's INSERT, then one per key it completes (its whole batch,
at most MAX_BATCH, until COMMIT: a fenced write keeps the key's lock), or
its single claims' own (docs/capacity.md).  Prints CHECK lines like soak.py.
"""
import argparse
import os
import json
import random
import sys
import threading
import time

import psycopg2

MAX_BATCH = 200
SINGLES_PER_TX = 5
LOCKED_AT_ONCE = 100          # IDEM_CLAIM_MANY_LOCKED_AT_ONCE in src/claim_many.c
KEYLOCK_CLASS = 0x4944        # IDEM_KEYLOCK_CLASS in src/keylock.c


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument('--host', default='127.0.0.1')
    ap.add_argument('--port', type=int, required=True)
    ap.add_argument('--dbname', default='postgres')
    ap.add_argument('--user', default='postgres')
    ap.add_argument('--sessions', type=int, default=12)
    ap.add_argument('--keys', type=int, default=3000)
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--seconds', type=float, default=120.0, help='give up after this long')
    ap.add_argument('--edition', choices=('c', 'sql'), default=os.environ.get('IDEM_EDITION', 'c'),
                    help='the C extension, or the SQL edition already installed (IDEM_EDITION)')
    return ap.parse_args()


class Run:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.pending = set('k%d' % i for i in range(args.keys))
        self.problems = []
        self.counts = {'claimed': 0, 'replay': 0, 'in_progress': 0, 'rolled_back': 0,
                       'batches': 0, 'singles': 0}
        self.max_key_locks = 0
        self.stop = threading.Event()

    def connect(self):
        a = self.args
        return psycopg2.connect(host=a.host, port=a.port, dbname=a.dbname, user=a.user,
                                application_name='idem-batches')

    def problem(self, text):
        with self.lock:
            self.problems.append(text)

    def count(self, what, n=1):
        with self.lock:
            self.counts[what] += n

    def slice(self, rng, size):
        with self.lock:
            pool = sorted(self.pending)
        return rng.sample(pool, min(size, len(pool))) if pool else []


def answer(run, cur, key, outcome, token, response, effects):
    """Check one claim's answer against what committed; returns the token to
    settle, or None."""
    if outcome == 'claimed':
        return token
    if outcome == 'replay':
        cur.execute("SELECT token FROM effects WHERE key = %s", (key,))
        row = cur.fetchone()
        if row is None or response != {'key': key, 'token': row[0]}:
            run.problem('%s: replay %r, effect row %r' % (key, response, row))
        with run.lock:
            run.pending.discard(key)
        run.count('replay')
    elif outcome == 'in_progress':
        run.count('in_progress')
    else:
        run.problem('%s: unexpected outcome %s' % (key, outcome))
    return None


def consume(run, sid):
    rng = random.Random(run.args.seed * 1000 + sid)
    conn = run.connect()
    cur = conn.cursor()
    deadline = time.time() + run.args.seconds
    while not run.stop.is_set() and time.time() < deadline:
        batch = rng.random() < 0.6
        keys = run.slice(rng, rng.randint(1, MAX_BATCH) if batch else rng.randint(1, SINGLES_PER_TX))
        if not keys:
            break
        won = []
        try:
            if batch:
                cur.execute("SELECT key, outcome, token, response FROM idem_claim_many('b', %s)",
                            (keys,))
                rows = cur.fetchall()
                run.count('batches')
            else:
                rows = []
                for k in keys:
                    wait = '200 ms' if rng.random() < 0.3 else '0'
                    cur.execute("SELECT %s, outcome, token, response FROM idem_claim('b', %s,"
                                " wait => %s::interval)", (k, k, wait))
                    rows.append(cur.fetchone())
                run.count('singles')
            for key, outcome, token, response in rows:
                t = answer(run, cur, key, outcome, token, response, None)
                if t is not None:
                    won.append((key, t))
            for key, t in won:
                cur.execute("INSERT INTO effects (key, token) VALUES (%s, %s)", (key, t))
                cur.execute("SELECT idem_complete('b', %s, %s, %s)",
                            (key, t, json.dumps({'key': key, 'token': t})))
            if won and rng.random() < 0.1:
                conn.rollback()
                run.count('rolled_back', len(won))
            else:
                conn.commit()
                run.count('claimed', len(won))
                with run.lock:
                    run.pending.difference_update(k for k, _ in won)
        except psycopg2.Error as e:
            run.problem('session %d: %s %s' % (sid, e.pgcode, (e.pgerror or '').strip().splitlines()[:1]))
            conn.rollback()
        time.sleep(rng.random() * 0.002)
    conn.close()


def monitor(run):
    conn = run.connect()
    conn.autocommit = True
    cur = conn.cursor()
    while not run.stop.is_set():
        # key locks only: their class (src/keylock.c) is the fourth field;
        # the SQL edition's are pg_advisory_xact_lock(bigint)'s, objsubid 1
        # (docs/managed.md, difference 5), and nothing else here takes one
        cur.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                    " AND objsubid = %s", (1 if run.args.edition == 'sql' else KEYLOCK_CLASS,))
        n = cur.fetchone()[0]
        with run.lock:
            run.max_key_locks = max(run.max_key_locks, n)
        time.sleep(0.005)
    conn.close()


def check(ok, what, detail=''):
    print('CHECK %s: %s; %s' % (what, 'PASS' if ok else 'FAIL', detail))
    return ok


def main():
    args = parse_args()
    run = Run(args)
    setup = run.connect()
    setup.autocommit = True
    cur = setup.cursor()
    if args.edition == 'c':
        cur.execute("CREATE EXTENSION IF NOT EXISTS idempotency")
    cur.execute("DROP TABLE IF EXISTS effects")
    cur.execute("CREATE TABLE effects (key text, token bigint)")
    cur.execute("DELETE FROM idempotency_records WHERE tenant_id = 'b'")

    started = time.time()
    mon = threading.Thread(target=monitor, args=(run,))
    mon.start()
    threads = [threading.Thread(target=consume, args=(run, i)) for i in range(args.sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run.stop.set()
    mon.join()
    elapsed = time.time() - started

    cur.execute("SELECT count(*) FROM (SELECT key FROM effects GROUP BY key HAVING count(*) > 1) d")
    doubled = cur.fetchone()[0]
    cur.execute("SELECT count(DISTINCT key) FROM effects")
    executed = cur.fetchone()[0]
    cur.execute("""SELECT count(*) FROM effects e
                   LEFT JOIN idempotency_records r ON r.tenant_id = 'b' AND r.key = e.key
                   WHERE r.status IS DISTINCT FROM 'completed'
                      OR r.response IS DISTINCT FROM jsonb_build_object('key', e.key, 'token', e.token)""")
    mismatched = cur.fetchone()[0]
    cur.execute("SELECT count(*) FROM idempotency_records WHERE tenant_id = 'b' AND status = 'processing'")
    processing = cur.fetchone()[0]
    c = run.counts
    print('batches: %d sessions, %d keys, %.1f s; %d batch and %d single-claim transactions; '
          'claimed %d, replays %d, in_progress %d, rolled back %d; at most %d key locks at once'
          % (args.sessions, args.keys, elapsed, c['batches'], c['singles'], c['claimed'],
             c['replay'], c['in_progress'], c['rolled_back'], run.max_key_locks))
    ok = check(not run.problems, 'every answer as committed, no error',
               '%d problems %s' % (len(run.problems), run.problems[:5]))
    ok &= check(doubled == 0 and executed == args.keys,
                'each key executed exactly once', '%d of %d keys executed, %d twice'
                % (executed, args.keys, doubled))
    ok &= check(mismatched == 0 and processing == 0,
                'every record completed with its executor\'s response',
                '%d mismatched, %d processing' % (mismatched, processing))
    ok &= check(c['in_progress'] > 0 and c['batches'] > 0 and c['singles'] > 0,
                'batches and single claims met on the same keys', 'in_progress %d' % c['in_progress'])
    limit = args.sessions * max(LOCKED_AT_ONCE, MAX_BATCH, SINGLES_PER_TX)
    ok &= check(run.max_key_locks <= limit, 'key locks held at once stay within %d' % limit,
                'at most %d seen' % run.max_key_locks)
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
