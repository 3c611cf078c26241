#!/usr/bin/env python3
"""Differential check between the editions (run by test/suites/36-sql-edition).

The C edition in one database (--c-db) and the SQL edition in another
(--sql-db) of one server get the same generated call sequences: claims,
completes, releases, heartbeats, checkpoints, lookups, forgets, sweeps,
claim_many, child keys and bad input, with leases and ttls of one
microsecond (expired at the next call, on both sides alike) or one hour, and
idempotency.stale_action switched per sequence; claims with a holder of two
or none (1.4: re-entry, takeovers storing the holder), bad holders.  After every call these must
be equal: the outcome columns, the SQLSTATE and primary message of an error,
every record minus its physical columns (timestamps compared only as
null/not null and lease = expiry; tokens by their rank among the key's
tokens), the lookups, the sweep counts; and on each side each key's tokens
must only grow.  A self-test first plants a difference (a record changed on
one side) and must see it reported.  Last line: DIFF-RESULT passed=N failed=M.
"""
import argparse
import random
import re
import time

import psycopg2

SEQUENCES = 60
STEPS = 40

TENANTS = ['t1', 't2']
KEYS = ['k1', 'k2', 'k3', 'k4']
LEASES = ['1 microsecond', '1 hour', None]
HOLDERS = [None, None, 'h1', 'h2']
TTLS = ['1 microsecond', '1 hour', None]


class Side:
    def __init__(self, name, conn):
        self.name = name
        self.conn = conn
        self.tokens = {}        # (tenant, key) -> tokens in the order first seen
        self.last = {}          # (tenant, key) -> the last token handed to us

    def run(self, sql, params):
        try:
            with self.conn.cursor() as cur:
                cur.execute(sql, params)
                return ('ok', cur.fetchall() if cur.description else None)
        except psycopg2.Error as e:
            # token values differ between the editions (their order is compared)
            return ('error', e.pgcode, re.sub(r'token \d+', 'token N', e.diag.message_primary or ''))

    def note(self, tk, token):
        """Record a token of a key; returns its rank, and whether it grew."""
        seen = self.tokens.setdefault(tk, [])
        if token in seen:
            return seen.index(token), True
        grew = not seen or token > max(seen)
        seen.append(token)
        return len(seen) - 1, grew

    def records(self):
        with self.conn.cursor() as cur:
            cur.execute("SELECT tenant_id, key, status, token, fingerprint, response::text, ttl::text,"
                        " lease_expires_at IS NULL, lease_expires_at = expires_at, recovery_point,"
                        " state::text, holder FROM idempotency_records ORDER BY tenant_id, key")
            return cur.fetchall()


def normalized_records(side, problems):
    out = []
    for r in side.records():
        rank, grew = side.note((r[0], r[1]), r[3])
        if not grew:
            problems.append('%s: token of %s/%s went down' % (side.name, r[0], r[1]))
        out.append(r[:3] + (rank,) + r[4:])
    return out


def make_call(rnd, side, kind, tk, args_):
    """The SQL and parameters of one call, with this side's tokens."""
    tenant, key = tk
    tok_choice = args_.get('tok')
    if tok_choice == 'last':
        token = side.last.get(tk, 424242)
    elif tok_choice == 'older':
        seen = side.tokens.get(tk, [])
        token = seen[0] if seen else 424242
    else:
        token = tok_choice
    if kind == 'claim':
        return ('SELECT outcome, token, response::text, expires_at IS NULL, recovery_point, state::text'
                ' FROM idem_claim(%s, %s, %s, %s::interval, %s::interval, holder => %s)',
                (tenant, key, args_['fp'], args_['lease'], args_['ttl'], args_['holder']))
    if kind == 'claim_many':
        return ('SELECT key, outcome, token, response::text, expires_at IS NULL, recovery_point, state::text'
                ' FROM idem_claim_many(%s, %s::text[], %s::text[], %s::interval, %s::interval)',
                (tenant, args_['keys'], args_['fps'], args_['lease'], args_['ttl']))
    if kind == 'complete':
        return ('SELECT idem_complete(%s, %s, %s, %s::jsonb)', (tenant, key, token, args_['doc']))
    if kind == 'release':
        return ('SELECT idem_release(%s, %s, %s, %s::jsonb)', (tenant, key, token, args_['doc']))
    if kind == 'heartbeat':
        return ('SELECT idem_heartbeat(%s, %s, %s, %s::interval) IS NULL', (tenant, key, token, args_['lease']))
    if kind == 'checkpoint':
        return ('SELECT idem_checkpoint(%s, %s, %s, %s, %s::jsonb, %s::interval)',
                (tenant, key, token, args_['point'], args_['doc'], args_['lease']))
    if kind == 'lookup':
        return ('SELECT status, token, response::text, fingerprint, lease_expires_at IS NULL,'
                ' recovery_point, state::text, holder FROM idem_lookup(%s, %s)', (tenant, key))
    if kind == 'forget':
        return ('SELECT idem_forget(%s, %s)', (tenant, key))
    if kind == 'sweep':
        return ('SELECT * FROM idem_sweep(%s)', (args_['batch'],))
    if kind == 'child_key':
        return ('SELECT idem_child_key(%s, %s, %s)', (args_['t'], args_['k'], args_['s']))
    if kind == 'bad':
        return args_['sql'], args_['params']
    raise ValueError(kind)


BAD = [
    ("SELECT idem_claim(NULL, 'k')", None),
    ("SELECT idem_claim('t', '')", None),
    ("SELECT idem_claim('t', repeat('x', 256))", None),
    ("SELECT idem_claim('t', 'k', '')", None),
    ("SELECT idem_claim('t', 'k', lease => '-1 s')", None),
    ("SELECT idem_claim('t', 'k', ttl => '0')", None),
    ("SELECT idem_claim('t', 'k', wait => '-1 ms')", None),
    ("SELECT idem_claim('t', 'k', ttl => '1001 years')", None),
    ("SELECT idem_claim('t', 'k', lease => '1000 years 1 day')", None),
    ("SELECT idem_claim('t', 'k', lease => '100000000 days')", None),
    ("SELECT idem_complete('t', 'k', -1)", None),
    ("SELECT idem_complete('t', 'k', NULL)", None),
    ("SELECT idem_complete('', 'k', 1)", None),
    ("SELECT idem_release('t', NULL, 1)", None),
    ("SELECT idem_heartbeat('t', 'k', 1, '0 s')", None),
    ("SELECT idem_checkpoint('t', 'k', 1, NULL)", None),
    ("SELECT idem_checkpoint('t', 'k', 1, repeat('p', 256))", None),
    ("SELECT idem_checkpoint('t', 'k', 1, 'p', lease => '-1 s')", None),
    ("SELECT idem_lookup('t', '')", None),
    ("SELECT idem_forget(NULL, 'k')", None),
    ("SELECT idem_sweep(-5)", None),
    ("SELECT * FROM idem_claim_many('t', NULL)", None),
    ("SELECT * FROM idem_claim_many('t', ARRAY['a', NULL])", None),
    ("SELECT * FROM idem_claim_many('t', ARRAY['a', ''])", None),
    ("SELECT * FROM idem_claim_many('t', ARRAY['a', repeat('k', 256)])", None),
    ("SELECT * FROM idem_claim_many('t', ARRAY['a'], ARRAY['x', 'y'])", None),
    ("SELECT * FROM idem_claim_many('t', ARRAY['a', 'b'], ARRAY['x', ''])", None),
    ("SELECT * FROM idem_claim_many('t', ARRAY[['a'], ['b']])", None),
    ("SELECT * FROM idem_claim_many('t', ARRAY(SELECT 'k' || g FROM generate_series(1, 1001) g))", None),
    ("SELECT * FROM idem_claim_many('', ARRAY['a'])", None),
    ("SELECT * FROM idem_claim_many('t', '{}'::text[])", None),
    ("SELECT * FROM idem_claim_many('t', ARRAY['a'], lease => '0')", None),
    ("SELECT idem_child_key('t', '', 's')", None),
    ("SELECT idem_child_key('t', 'k', repeat('s', 256))", None),
    ("SELECT idem_claim('t', 'k', 5)", None),
    ("SELECT idem_claim('t', 'k', holder => '')", None),
    ("SELECT idem_claim('t', 'k', holder => repeat('h', 256))", None),
    ("SELECT idem_claim('t', 'k', holder => repeat('\u00e9', 128))", None),
    ("SELECT idem_claim('t', 'k', lease => '0', holder => '')", None),
    ("SELECT idem_claim('t', '', holder => '')", None),
    ("SELECT idem_claim('t', 'k', '', holder => '')", None),
    ("SELECT * FROM idem_claim_many('t', ARRAY['a'], holder => 'h')", None),
]


def generate(rnd):
    """One call: (kind, (tenant, key), arguments)."""
    tk = (rnd.choice(TENANTS), rnd.choice(KEYS))
    kind = rnd.choices(['claim', 'claim_many', 'complete', 'release', 'heartbeat', 'checkpoint',
                        'lookup', 'forget', 'sweep', 'child_key', 'bad'],
                       [30, 6, 14, 10, 5, 8, 6, 3, 4, 2, 6])[0]
    a = {'tok': rnd.choices(['last', 'older', 424242], [85, 10, 5])[0],
         'fp': rnd.choice([None, None, 'fa', 'fb']),
         'lease': rnd.choice(LEASES), 'ttl': rnd.choice(TTLS),
         'doc': rnd.choice([None, None, '{"status": 200}', '[1, {"a": null}]', '"x"', 'null']),
         'point': rnd.choice(['p1', 'p2', 'charged']), 'batch': rnd.choice([None, 1, 2, 100]),
         'holder': rnd.choice(HOLDERS)}
    if kind == 'checkpoint':
        a['lease'] = rnd.choice([None, None, '1 hour', '1 microsecond'])
    if kind == 'claim_many':
        n = rnd.randint(1, 5)
        a['keys'] = [rnd.choice(KEYS) for _ in range(n)]
        a['fps'] = None if rnd.random() < 0.6 else [rnd.choice([None, 'fa', 'fb']) for _ in range(n)]
    if kind == 'child_key':
        a.update(t=rnd.choice(['shop', 'é', 'a' * 255]), k=rnd.choice(['order-1', 'k', 'ü' * 10]),
                 s=rnd.choice(['charge', 'ship', 'x']))
    if kind == 'bad':
        a['sql'], a['params'] = rnd.choice(BAD)
    return kind, tk, a


def observe(side, kind, tk, res, problems):
    """The comparable form of a result: tokens replaced by ranks, tokens noted."""
    if res[0] == 'error':
        return res
    out = []
    for row in res[1] or []:
        row = list(row)
        if kind == 'claim' and row[1] is not None:
            rank, grew = side.note(tk, row[1])
            if not grew:
                problems.append('%s: a claimed token of %s/%s did not grow' % (side.name, tk[0], tk[1]))
            side.last[tk] = row[1]
            row[1] = ('rank', rank)
        elif kind == 'claim_many' and row[2] is not None:
            k = (tk[0], row[0])
            rank, grew = side.note(k, row[2])
            if not grew:
                problems.append('%s: a claimed token of %s/%s did not grow' % (side.name, k[0], k[1]))
            side.last[k] = row[2]
            row[2] = ('rank', rank)
        elif kind == 'lookup' and row[1] is not None:
            row[1] = ('rank', side.note(tk, row[1])[0])
        out.append(tuple(row))
    return ('ok', out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--host', default='127.0.0.1')
    p.add_argument('--port', type=int, required=True)
    p.add_argument('--c-db', required=True)
    p.add_argument('--sql-db', required=True)
    p.add_argument('--seed', type=int, default=35)
    a = p.parse_args()
    passed = failed = 0

    def conn(db):
        c = psycopg2.connect(host=a.host, port=a.port, dbname=db, user='postgres')
        c.autocommit = True
        return c
    c_side = Side('C', conn(a.c_db))
    s_side = Side('SQL', conn(a.sql_db))
    with s_side.conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_extension WHERE extname = 'idempotency'")
        assert cur.fetchone()[0] == 0, 'the SQL edition database has the C extension'
    with c_side.conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_extension WHERE extname = 'idempotency'")
        assert cur.fetchone()[0] == 1, 'the C edition database lacks the extension'

    # self-test: a planted difference is reported
    for side in (c_side, s_side):
        side.run("SELECT idem_claim('self', 'k')", None)
    s_side.run("UPDATE idempotency_records SET fingerprint = 'planted' WHERE tenant_id = 'self'", None)
    probs = []
    if normalized_records(c_side, probs) != normalized_records(s_side, probs):
        passed += 1
        print('ok   self-test: a record changed on one side is reported')
    else:
        failed += 1
        print('FAIL self-test: a record changed on one side went unnoticed')

    # the key lock: the C edition's 64-bit hash in its own class; the SQL
    # edition's keyed with the database's secret (issue 45: no role computes
    # another tenant's lock), objsubid 1, so not the C edition's value
    locks = []
    for side, cls in ((c_side, 0x4944), (s_side, 1)):
        side.conn.autocommit = False
        side.run("SELECT idem_claim('lock', 'key-1')", None)
        r = side.run("SELECT classid::bigint, objid::bigint, objsubid FROM pg_locks"
                     " WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND objsubid = %s", (cls,))
        if side is s_side:
            keyed = side.run("SELECT idem_sql_keylock('lock', 'key-1')", None)
        locks.append(r)
        side.conn.rollback()
        side.conn.autocommit = True
    if locks[0][0] == 'ok' and len(locks[0][1]) == 1 and locks[1][0] == 'ok' and len(locks[1][1]) == 1 \
            and keyed[0] == 'ok' and ((locks[1][1][0][0] << 32) | locks[1][1][0][1]) == keyed[1][0][0] % (1 << 64) \
            and locks[0][1][0][:2] != locks[1][1][0][:2]:
        passed += 1
        print('ok   the key lock: objsubid %d (C) and 1 (SQL), the SQL edition\'s value keyed'
              ' (idem_sql_keylock), not the C edition\'s public hash' % 0x4944)
    else:
        failed += 1
        print('FAIL the key locks: %r, keyed %r' % (locks, keyed))

    total = diffs = 0
    kinds = {}
    t0 = time.time()
    for seq in range(SEQUENCES):
        rnd = random.Random(a.seed * 100003 + seq)
        for side in (c_side, s_side):
            side.run("TRUNCATE idempotency_records", None)
            side.tokens.clear()
            side.last.clear()
            side.run("SET idempotency.stale_action = %s", ('fail' if seq % 4 == 3 else 'release',))
            side.run("SET idempotency.max_response_size = %s", ('64' if seq % 5 == 4 else '1MB',))
        first_diff = None
        for step in range(STEPS):
            kind, tk, args_ = generate(rnd)
            kinds[kind] = kinds.get(kind, 0) + 1
            problems = []
            results = []
            for side in (c_side, s_side):
                sql, params = make_call(rnd, side, kind, tk, args_)
                res = side.run(sql, params)
                results.append(observe(side, kind, tk, res, problems))
            recs = [normalized_records(side, problems) for side in (c_side, s_side)]
            total += 1
            if results[0] != results[1]:
                problems.append('results differ: C %r / SQL %r' % tuple(results))
            if recs[0] != recs[1]:
                problems.append('records differ: C %r / SQL %r' % tuple(recs))
            if problems and first_diff is None:
                first_diff = (step, kind, tk, args_, problems)
        if first_diff:
            diffs += 1
            failed += 1
            print('FAIL sequence %d (seed %d) step %d: %s %s/%s %r\n     %s' % (
                seq, a.seed, first_diff[0], first_diff[1], first_diff[2][0], first_diff[2][1],
                {k: v for k, v in first_diff[3].items() if k in ('tok', 'fp', 'lease', 'ttl', 'doc', 'keys', 'sql', 'holder')},
                '\n     '.join(first_diff[4][:3])))
        else:
            passed += 1
    print('ok   %d sequences x %d calls (%d calls per edition: %s) in %.1f s; %d sequences differ' % (
        SEQUENCES, STEPS, total, ', '.join('%s %d' % kv for kv in sorted(kinds.items())), time.time() - t0, diffs)
        if diffs == 0 else 'FAIL %d of %d sequences differ' % (diffs, SEQUENCES))
    print('DIFF-RESULT passed=%d failed=%d' % (passed, failed))
    raise SystemExit(1 if failed else 0)


if __name__ == '__main__':
    main()
