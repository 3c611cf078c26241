#!/usr/bin/python3
"""Hostile-input fuzz of every idempotency function, as a non-owner role.

Generates a seeded, reproducible stream of calls (NULLs, empty strings,
255/256-byte and 1 MB identifiers, multibyte and 4-byte UTF-8, extreme and
random tokens, negative/zero/huge/month-and-day intervals, deep and large
jsonb, wrong types and unknown names through named arguments) and runs them in
batches through test/fuzz/driver.sql, one subtransaction per call.

Checks (each one can fail):
  * no backend crash: no connection lost, and the server log has no
    "terminated by signal", "PANIC" or "server process ... was terminated";
  * every error's SQLSTATE is listed in test/fuzz/sqlstates.txt, and none is
    in class XX (internal error / data corrupted);
  * each call whose outcome follows from its arguments alone (bad input, the
    server's own type checks) raised exactly the SQLSTATE the contract
    promises, checked in the order the C code validates its arguments;
  * a failed call wrote nothing: no row of idempotency_records was inserted,
    updated or deleted by it (per-transaction tuple counters, which count the
    writes of aborted subtransactions too);
  * results are well formed (claim: token set exactly when claimed, positive;
    lookup: at most one row, a known status; ...);
  * after the run the table satisfies the contract (no identifier over 255
    bytes, no empty one, tokens positive, a lease exactly while processing)
    and its indexes pass amcheck.

Usage (normally through test/suites/50-fuzz, which starts the server):
  fuzz.py --port P [--host H] [--calls 100000] [--seed 1] --server-log FILE
  fuzz.py --show N [--seed S]   print the SQL of generated call N and exit
"""

import argparse
import json
import os
import random
import re
import sys
import time

import psycopg2
import psycopg2.errors

HERE = os.path.dirname(os.path.abspath(__file__))

INT64_MAX = 2 ** 63 - 1
INT64_MIN = -2 ** 63
INT32_MAX = 2 ** 31 - 1
INT32_MIN = -2 ** 31
USECS_PER_DAY = 86_400_000_000
END_TIMESTAMP = 9223371331200000000          # PostgreSQL's first invalid timestamp, in us since 2000
MAX_DURATION_US = 1000 * 12 * 30 * 86400 * 1_000_000     # longest lease, ttl or wait: 1000 years of 360 days
NOW_US = int((time.time() - 946684800) * 1_000_000)   # for judging only
GEN_NOW_US = 820_540_800_000_000               # 2026-01-01, for generating (a seed means the same calls)
MARGIN_US = 400 * 86400 * 1_000_000 * 365      # "near the end of time": outcome depends on the clock
MAX_IDENT = 255
BATCH = 250                                    # calls per round trip (one transaction)
BATCH_TIMEOUT = '20s'                          # a batch normally takes well under a second (--batch-timeout)
WAIT_CAP_US = 20_000                           # longest wait on a key that may be held (see gen_claim)

# ---------------------------------------------------------------------------
# SQL text helpers


def q(s):
    """A standard-conforming string literal."""
    return "'" + s.replace("'", "''") + "'"


def nbytes(s):
    return len(s.encode('utf-8'))


class Arg:
    """One generated argument: its SQL text and what the oracle knows of it.

    kind: how the function will judge it ('null', 'empty', 'long', 'ok',
    'nonpos', 'pos', 'lookup', 'overflow', 'dur', 'json', 'batch').
    parse: a set of SQLSTATEs PostgreSQL raises before the function runs
    (wrong type, bad literal), '?' when some parser error is expected but
    which one is not pinned down, or None when the argument is well typed.
    """

    __slots__ = ('sql', 'kind', 'us', 'size', 'value', 'parse', 'fresh')

    def __init__(self, sql, kind='ok', us=None, size=None, value=None,
                 parse=None, fresh=False):
        self.sql = sql
        self.kind = kind
        self.us = us
        self.size = size
        self.value = value
        self.parse = parse
        self.fresh = fresh


# ---------------------------------------------------------------------------
# Value pools (fixed, so a seed always means the same calls)

TENANTS = [('fz', 70), ('fz2', 15), ('ténant-ü', 5), ('🦄-tenant', 5),
           ('t' * 255, 3), ('€' * 85, 2)]          # the last two are exactly 255 bytes

POOL_KEYS = (['k%03d' % i for i in range(150)] +
             ['ключ-%d' % i for i in range(10)] +
             ['🔑' * 63 + 'abc',                       # 255 bytes, 4-byte UTF-8
              'a' * 251 + '🦄',                         # 255 bytes, last char 4 bytes
              "it's", 'back\\slash', 'semi;colon', "'); DROP TABLE idempotency_records; --",
              '%s%n%x%p', '\t\n\r spaces ', 'NULL', 'null', ' ', 'e\u0301', '\u200b',
              '\u202eevil', '\ufeffbom', '\U0010ffff', '😀', '$1', '$$', 'OPERATOR(pg_catalog.=)'])
EDITION = 'c'                                  # --edition: 'sql' for the SQL edition
BUSY_KEYS = ['busy-%d' % i for i in range(8)]       # held uncommitted by another session
FINGERPRINTS = ['fp-a', 'fp-b', 'fp-ü', 'f' * 255, '🦄' * 63 + 'xyz']

# Unicode ranges for random strings: ASCII, Latin-1, 2-byte, 3-byte (no
# surrogates), 4-byte (astral) code points.  NUL is never produced: text
# cannot hold it.
RANGES = [(0x20, 0x7e), (0x01, 0x1f), (0xa0, 0x7ff), (0x800, 0xd7ff),
          (0xe000, 0xfffd), (0x10000, 0x10ffff)]


def rand_text(rng, max_bytes):
    out = []
    size = 0
    target = rng.randint(1, max_bytes)
    while size < target:
        lo, hi = rng.choice(RANGES)
        ch = chr(rng.randint(lo, hi))
        b = nbytes(ch)
        if size + b > max_bytes:
            break
        out.append(ch)
        size += b
    return ''.join(out) or 'x'


# ---------------------------------------------------------------------------
# Argument generators


class Gen:
    def __init__(self, seed, phase):
        self.rng = random.Random(seed)
        self.phase = phase
        self.fresh_n = 0

    def fresh_key(self):
        self.fresh_n += 1
        return 'fresh-%s-%d-%s' % (self.phase['name'], self.fresh_n,
                                   rand_text(self.rng, 12))

    # -- identifiers -------------------------------------------------------

    def ident_from(self, s):
        b = nbytes(s)
        return Arg(q(s), 'empty' if b == 0 else 'long' if b > MAX_IDENT else 'ok',
                   value=s)

    def ident_special(self):
        rng = self.rng
        choice = rng.randrange(13)
        if choice == 0:
            return Arg('NULL', 'null')
        if choice == 1:
            return Arg('NULL::text', 'null')
        if choice == 2:
            return Arg("''", 'empty', value='')
        if choice == 3:
            return self.ident_from('k' * 256)
        if choice == 4:
            return self.ident_from('a' * 253 + '€')            # 256 bytes, crosses the limit mid-character
        if choice == 5:
            return self.ident_from('😀' * 64)                  # 256 bytes of 4-byte characters
        if choice == 6:
            return Arg("pg_catalog.repeat('k', 1048576)", 'long')          # 1 MB
        if choice == 7:
            return Arg('(SELECT t FROM pg_temp.fuzz_blobs WHERE id = 1)', 'long')   # 1 MB, compressed
        if choice == 8:
            return Arg('(SELECT t FROM pg_temp.fuzz_blobs WHERE id = 4)', 'ok')   # 255, from a table
        if choice == 9:
            return Arg('(SELECT t FROM pg_temp.fuzz_blobs WHERE id = 5)', 'long')   # 4000, compressed inline
        if choice == 10:
            return Arg("pg_catalog.repeat('€', 85)", 'ok')                  # 255 bytes computed
        if choice == 11:
            return Arg("pg_catalog.repeat('é', 128)", 'long')               # 256 bytes computed
        return self.ident_from(rand_text(rng, 300))

    def tenant(self):
        rng = self.rng
        r = rng.random()
        if r < 0.06:
            return self.ident_special()
        if r < 0.08:
            return self.ident_from(rand_text(rng, 40))
        return self.ident_from(rng.choices([t for t, _ in TENANTS],
                                           [w for _, w in TENANTS])[0])

    def key(self):
        rng = self.rng
        r = rng.random()
        if r < 0.06:
            return self.ident_special()
        if r < 0.20:
            a = self.ident_from(self.fresh_key())
            a.fresh = True
            return a
        if r < 0.21:
            return self.ident_from(rand_text(rng, 300))
        return self.ident_from(rng.choice(POOL_KEYS))

    def fingerprint(self):
        rng = self.rng
        r = rng.random()
        if r < 0.45:
            return None                                        # omitted
        if r < 0.55:
            return Arg('NULL', 'null')
        if r < 0.90:
            return self.ident_from(rng.choice(FINGERPRINTS))
        if r < 0.95:
            return self.ident_special()
        return self.ident_from(rand_text(rng, 300))

    # -- arrays (idem_claim_many) --------------------------------------------

    def key_array(self):
        rng = self.rng
        r = rng.random()
        if r < 0.04:
            return Arg(rng.choice(['NULL', 'NULL::text[]']), 'null')
        if r < 0.07:
            return Arg("'{}'::text[]", 'array', value=[], size=0)
        if r < 0.09:
            return Arg("ARRAY[['a', 'b'], ['c', 'd']]", 'multidim')
        if r < 0.10:
            n = rng.choice([CLAIM_MANY_MAX, CLAIM_MANY_MAX + 1, 5000])
            self.fresh_n += 1
            return Arg("ARRAY(SELECT 'many-%s-%d-' || g FROM pg_catalog.generate_series(1, %d) g)"
                       % (self.phase['name'], self.fresh_n, n), 'array', value=None, size=n)
        if r < 0.13:
            sql, parse = rng.choice([("ARRAY[1, 2]", {'42883'}), ("'k'", {'22P02'}),
                                     ("'k'::text", {'42883'}), ("'{{a},{b'", {'22P02'})])
            return Arg(sql, 'bad', parse=parse)
        elems = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            # mostly sound elements, so that most batches get to claim
            elems.append(Arg('NULL', 'null') if r < 0.01 else self.key() if r < 0.06 else
                         self.ident_from(self.fresh_key()) if r < 0.5 else
                         self.ident_from(rng.choice(POOL_KEYS)))
        if rng.random() < 0.3:
            elems.append(rng.choice(elems))                       # a key twice in one batch
        cast = rng.choice(['::text[]', '::text[]', '::varchar[]'])
        return Arg('ARRAY[%s]%s' % (', '.join(e.sql for e in elems), cast), 'array',
                   value=elems, size=len(elems))

    def fingerprint_array(self, keys):
        rng = self.rng
        r = rng.random()
        if r < 0.5:
            return None
        if r < 0.6:
            return Arg('NULL', 'null')
        if r < 0.63:
            return Arg("ARRAY[['a'], ['b']]", 'multidim')
        n = keys.size if keys.kind == 'array' and keys.size is not None and keys.size <= 50 else 3
        if rng.random() < 0.15:
            n += rng.choice([-1, 1])                                # lengths differ
        elems = []
        for _ in range(max(n, 0)):
            f = self.fingerprint()
            elems.append(f if f is not None else Arg('NULL', 'null'))
        return Arg('ARRAY[%s]::text[]' % ', '.join(e.sql for e in elems) if elems else "'{}'::text[]",
                   'array', value=elems, size=len(elems))

    # -- tokens ------------------------------------------------------------

    def token(self, tenant, key):
        rng = self.rng
        r = rng.random()
        if r < 0.04:
            return Arg('NULL', 'null')
        if r < 0.10:
            v = rng.choice([0, -1, INT64_MIN, -rng.randint(1, INT64_MAX), INT32_MIN])
            return Arg(q(str(v)) if v < -INT32_MAX else str(v), 'nonpos', value=v)
        if r < 0.13:
            sql, parse = rng.choice([
                ('1.5', {'42883'}), ("'abc'", {'22P02'}), ("'9223372036854775808'", {'22003'}),
                ('1e19', {'42883'}), ('true', {'42883'}), ("'1'::text", {'42883'}),
                ("'-9223372036854775809'", {'22003'}), ('9223372036854775808', {'42883'})])
            return Arg(sql, 'ok', parse=parse)
        if r < 0.55 and tenant.kind == 'ok' and key.kind == 'ok' and tenant.value is not None \
                and key.value is not None:
            # the key's current token, so that settling calls succeed too
            return Arg('(SELECT l.token FROM %s.idem_lookup(%s, %s) l)'
                       % (self.phase['schema'], tenant.sql, key.sql), 'lookup')
        v = rng.choice([1, 2, INT64_MAX, INT32_MAX + 1, rng.randint(1, INT64_MAX),
                        GEN_NOW_US + rng.randint(-10 ** 9, 10 ** 9), rng.randint(1, 1000)])
        return Arg(str(v), 'pos', value=v)

    # -- intervals -----------------------------------------------------------

    HUMAN = [('1 us', 0, 0, 1), ('1 ms', 0, 0, 1000), ('10 ms', 0, 0, 10000),
             ('1 s', 0, 0, 10 ** 6), ('30 s', 0, 0, 30 * 10 ** 6), ('5 min', 0, 0, 300 * 10 ** 6),
             ('1 hour', 0, 0, 3600 * 10 ** 6), ('1 day', 0, 1, 0), ('1 week', 0, 7, 0),
             ('1 mon', 1, 0, 0), ('1 year', 12, 0, 0), ('1000 years', 12000, 0, 0),
             ('100000 years', 1200000, 0, 0), ('290000 years', 3480000, 0, 0),
             ('1000000 years', 12000000, 0, 0), ('-1 us', 0, 0, -1), ('0', 0, 0, 0),
             ('-1 day', 0, -1, 0), ('1 mon -30 days', 1, -30, 0), ('1 mon -29 days', 1, -29, 0),
             ('-2 mons 61 days', -2, 61, 0), ('1 day -86400.000001 seconds', 0, 1, -86400000001),
             ('00:00:00.000001', 0, 0, 1), ('5', 0, 0, 5 * 10 ** 6),
             ('9223372036854775807 microseconds', 0, 0, INT64_MAX),
             ('-9223372036854775808 microseconds', 0, 0, INT64_MIN),
             ('2147483647 days', 0, INT32_MAX, 0), ('2147483647 mons', INT32_MAX, 0, 0)]
    BAD_INTERVALS = [("'infinity'", {'22007'}), ("'-infinity'", {'22007'}), ("'abc'", {'22007'}),
                     ("'1 fortnight'", {'22007'}), ("'178956971 years'", {'22008'}),
                     ("'9223372036854775808 us'", {'22015'}), ('5', {'42883'}),
                     ('pg_catalog.now()', {'42883'}), ("'1 day'::text", {'42883'}),
                     ("interval '1 day' * 1e300", {'22008'}), ("''", {'22007'}),
                     ("'1 day'::interval::date", {'42846'}), ('true', {'42883'})]
    EXTREME_FIELDS = [0, 1, -1, 2, 12, 30, INT32_MAX, INT32_MIN, 10 ** 6, -10 ** 6]
    EXTREME_US = [0, 1, -1, 1000, INT64_MAX, INT64_MIN, 86_400_000_000, 10 ** 15, -10 ** 15,
                  END_TIMESTAMP - GEN_NOW_US, END_TIMESTAMP]

    @staticmethod
    def to_us(m, d, t):
        """Microseconds as validate.c counts them, or None on int64 overflow."""
        def ok(v):
            return INT64_MIN <= v <= INT64_MAX
        days_us = d * USECS_PER_DAY
        months_us = m * 30 * USECS_PER_DAY
        us = t + days_us
        if not (ok(days_us) and ok(months_us) and ok(us) and ok(us + months_us)):
            return None
        return us + months_us

    def duration(self, short_bias=False):
        rng = self.rng
        r = rng.random()
        if r < 0.45:
            return None                                        # omitted
        if r < 0.51:
            return Arg(rng.choice(['NULL', 'NULL::interval']), 'null')
        if r < 0.54:
            sql, parse = rng.choice(self.BAD_INTERVALS)
            return Arg(sql, 'bad', parse=parse)
        if r < 0.62:
            m = rng.choice(self.EXTREME_FIELDS + [rng.randint(-100, 100)])
            d = rng.choice(self.EXTREME_FIELDS + [rng.randint(-1000, 1000)])
            t = rng.choice(self.EXTREME_US + [rng.randint(-10 ** 12, 10 ** 12)])
            lit = "'%d mons %d days %d microseconds'" % (m, d, t)
        else:
            if short_bias and rng.random() < 0.6:
                lit, m, d, t = rng.choice(self.HUMAN[:7])          # short leases: takeovers
            elif rng.random() < 0.7:
                lit, m, d, t = rng.choice(self.HUMAN[:11])         # ordinary values
            else:
                lit, m, d, t = rng.choice(self.HUMAN)
            lit = q(lit)
        if rng.random() < 0.3:
            lit += '::interval'
        us = self.to_us(m, d, t)
        return Arg(lit, 'overflow' if us is None else 'dur', us=us)

    # -- jsonb ---------------------------------------------------------------

    def rand_json(self, depth=0):
        rng = self.rng
        r = rng.random()
        if depth > 4 or r < 0.4:
            return rng.choice([None, True, False, 0, -0.0, 1e308, -1e-308, 2 ** 70, 12.5,
                               rand_text(rng, 20), '', 'ü', '😀', '\u2028'])
        if r < 0.7:
            return [self.rand_json(depth + 1) for _ in range(rng.randint(0, 5))]
        return {rand_text(rng, 8): self.rand_json(depth + 1) for _ in range(rng.randint(0, 5))}

    def jsonb(self):
        rng = self.rng
        limit = self.phase['max_response_size']
        r = rng.random()
        if r < 0.15:
            return None
        if r < 0.20:
            return Arg(rng.choice(['NULL', 'NULL::jsonb']), 'null')
        if r < 0.72:
            text = json.dumps(self.rand_json(), ensure_ascii=rng.random() < 0.5)
            lit = q(text) + ('::jsonb' if rng.random() < 0.3 else '')
            # a small document; its binary size is below 2 kB
            return Arg(lit, 'json', size=None if len(text) > 300 else -2000)
        if r < 0.80:
            # around the limit (1 MB documents cost a few ms each, so not too often)
            if limit > 100000 and rng.random() < 0.6:
                n = rng.choice([4096 - 13, 4096 - 12, 51, 52, 100, 1000, 100000])
            else:
                n = rng.choice([limit - 14, limit - 13, limit - 12, 1048576 - 13, 1048576 - 12,
                                4096 - 13, 4096 - 12, 51, 52, 100, 1000, 100000, 2000000])
            n = max(n, 0)
            return Arg("pg_catalog.jsonb_build_object('p', pg_catalog.repeat('x', %d))" % n,
                       'json', size=n + 13)
        if r < 0.86:
            which = rng.choice(['deep_array', 'deep_object', 'wide'])
            return Arg(SPECIAL_JSON[which], 'json', size=self.phase['json_sizes'][which])
        if r < 0.90:
            which = rng.choice([2, 3])
            return Arg('(SELECT j FROM pg_temp.fuzz_blobs WHERE id = %d)' % which, 'json',
                       size={2: 2097152 + 13, 3: 600000 + 13}[which])
        if r < 0.95:
            sql, parse = rng.choice([
                ("'x'", {'22P02'}), ("'{}'::json", {'42883'}), ("'{}'::text", {'42883'}),
                ('1', {'42883'}), ("'{\"a\":'", {'22P02'}), ("'\"\\u0000\"'", {'22P05'}),
                (SPECIAL_JSON['too_deep'], {'54001'}), ("'1e1000000'", {'22003'}),
                ("'\"\\ud83d\"'", {'22P02'}), ("ARRAY['{}']::jsonb[]", {'42883'})])
            return Arg(sql, 'json', parse=parse)
        # odd but valid documents
        return Arg(rng.choice(["'1e1000'", "'-0'", "'\"\\ud83d\\ude00\"'", "'[]'", "'{}'",
                               "'\"\"'", "'null'", "'[[[[[[[[[[[[]]]]]]]]]]]]'"]), 'json', size=-2000)

    # -- sweep batch size ----------------------------------------------------

    def batch_size(self):
        rng = self.rng
        r = rng.random()
        if r < 0.3:
            return None
        if r < 0.4:
            return Arg('NULL', 'null')
        if r < 0.9:
            v = rng.choice([0, -1, 1, 2, 10, 1000, INT32_MAX, INT32_MIN, rng.randint(-5, 5000)])
            return Arg(q(str(v)) if v == INT32_MIN else str(v), 'batch', value=v)
        sql, parse = rng.choice([("'2147483648'", {'22003'}), ('1.5', {'42883'}),
                                 ('3000000000', {'42883'}), ("'abc'", {'22P02'}),
                                 ("'1'::text", {'42883'})])
        return Arg(sql, 'batch', parse=parse)


SPECIAL_JSON = {
    # 10,000 nested arrays and 5,000 nested objects: accepted by jsonb_in, stored, replayed
    'deep_array': "(pg_catalog.repeat('[', 10000) || pg_catalog.repeat(']', 10000))::jsonb",
    'deep_object': "(pg_catalog.repeat('{\"a\":', 5000) || '1' || pg_catalog.repeat('}', 5000))::jsonb",
    'wide': "(SELECT pg_catalog.jsonb_agg(g) FROM pg_catalog.generate_series(1, 5000) g)",
    # 100,000 levels: jsonb_in runs out of stack before our function is called
    'too_deep': "(pg_catalog.repeat('[', 100000) || pg_catalog.repeat(']', 100000))::jsonb",
}


# ---------------------------------------------------------------------------
# Calls


class Call:
    __slots__ = ('fn', 'sql', 'expect', 'check')

    def __init__(self, fn, sql, expect, check):
        self.fn = fn
        self.sql = sql
        self.expect = expect          # set of allowed outcomes ('ok' = success), or None: unknown
        self.check = check            # post-condition on a successful result, or None


WRAP = {
    'idem_claim': 'SELECT c.outcome AS a, c.token AS b, pg_catalog.pg_column_size(c.response)::bigint AS c'
                  ' FROM {s}.idem_claim({args}) c',
    'idem_complete': 'SELECT \'ok\'::text AS a, NULL::bigint AS b, NULL::bigint AS c FROM {s}.idem_complete({args})',
    'idem_release': 'SELECT \'ok\'::text AS a, NULL::bigint AS b, NULL::bigint AS c FROM {s}.idem_release({args})',
    'idem_heartbeat': 'SELECT \'ok\'::text AS a, pg_catalog.date_part(\'epoch\', h)::bigint AS b, NULL::bigint AS c'
                      ' FROM {s}.idem_heartbeat({args}) h',
    'idem_lookup': 'SELECT coalesce(pg_catalog.max(l.status), \'none\') AS a, pg_catalog.max(l.token) AS b,'
                   ' pg_catalog.count(*) AS c FROM {s}.idem_lookup({args}) l',
    'idem_forget': 'SELECT f::text AS a, NULL::bigint AS b, NULL::bigint AS c FROM {s}.idem_forget({args}) f',
    'idem_sweep': 'SELECT \'ok\'::text AS a, (w.expired_removed + w.stale_released + w.stale_failed) AS b,'
                  ' LEAST(w.expired_removed, w.stale_released, w.stale_failed) AS c'
                  ' FROM {s}.idem_sweep({args}) w',
    'idem_claim_many': 'SELECT pg_catalog.string_agg(DISTINCT m.outcome, \',\' ORDER BY m.outcome) AS a,'
                       ' pg_catalog.count(*) AS b,'
                       ' pg_catalog.count(*) FILTER (WHERE (m.outcome = \'claimed\') IS DISTINCT FROM (m.token IS NOT NULL)'
                       ' OR m.token <= 0 OR m.key IS NULL) AS c'
                       ' FROM {s}.idem_claim_many({args}) m',
    'idem_checkpoint': 'SELECT \'ok\'::text AS a, NULL::bigint AS b, NULL::bigint AS c'
                       ' FROM {s}.idem_checkpoint({args})',
    'idem_child_key': 'SELECT pg_catalog.left(k, 5) AS a, pg_catalog.length(k)::bigint AS b,'
                      ' (k OPERATOR(pg_catalog.~) \'^[!-~]+$\')::int::bigint AS c FROM {s}.idem_child_key({args}) k',
    'generic': 'SELECT \'ok\'::text AS a, pg_catalog.count(*) AS b, NULL::bigint AS c FROM {s}.{fn}({args}) x',
}

MIDWAY_STATES = {'53200', '40001', '40P01', '57014', '55P03'}
OUTCOMES = {'claimed', 'replay', 'failed', 'in_progress', 'mismatch'}


def check_claim(a, b, c):
    if a not in OUTCOMES:
        return 'unknown outcome %r' % a
    if (a == 'claimed') != (b is not None):
        return 'outcome %s with token %r' % (a, b)
    if b is not None and b <= 0:
        return 'non-positive token %d' % b
    return None


def check_lookup(a, b, c):
    if c not in (0, 1):
        return '%d rows' % c
    if a not in ('none', 'processing', 'resumable', 'completed', 'failed'):   # resumable: 1.2
        return 'status %r' % a
    if (c == 1) != (b is not None) or (b is not None and b <= 0):
        return 'token %r with %d rows' % (b, c)
    return None


def check_heartbeat(a, b, c):
    return None if b is not None and b > 0 else 'lease end %r' % b


def check_forget(a, b, c):
    return None if a in ('true', 'false') else 'returned %r' % a


def check_sweep(a, b, c):
    return None if b is not None and b >= 0 and c is not None and c >= 0 else 'counts %r %r' % (b, c)


def check_claim_many(a, b, c):
    if a is not None and not set(a.split(',')) <= OUTCOMES:
        return 'outcomes %r' % a
    if c:
        return '%d rows with a token not matching the outcome' % c
    return None


def check_child_key(a, b, c):
    return None if a == 'idem-' and b == 69 and c == 1 else 'child key %r, %r characters, printable %r' % (a, b, c)


CHECKS = {'idem_claim_many': check_claim_many, 'idem_claim': check_claim, 'idem_lookup': check_lookup,
          'idem_heartbeat': check_heartbeat, 'idem_forget': check_forget,
          'idem_sweep': check_sweep, 'idem_child_key': check_child_key}

# Arguments in declaration order, with the generator of each and whether it
# is required.  The C code validates them in this order.
SIGNATURES = {
    'idem_claim': [('tenant_id', 'tenant', True), ('key', 'key', True),
                   ('fingerprint', 'fingerprint', False), ('lease', 'duration', False),
                   ('ttl', 'duration', False), ('wait', 'duration', False),
                   ('holder', 'fingerprint', False)],       # holder: 1.4
    'idem_complete': [('tenant_id', 'tenant', True), ('key', 'key', True),
                      ('token', 'token', True), ('response', 'jsonb', False)],
    'idem_release': [('tenant_id', 'tenant', True), ('key', 'key', True),
                     ('token', 'token', True), ('failure', 'jsonb', False)],
    'idem_heartbeat': [('tenant_id', 'tenant', True), ('key', 'key', True),
                       ('token', 'token', True), ('lease', 'duration', False)],
    'idem_checkpoint': [('tenant_id', 'tenant', True), ('key', 'key', True),
                        ('token', 'token', True), ('point', 'fingerprint', True),
                        ('state', 'jsonb', False), ('lease', 'duration', False)],
    'idem_child_key': [('tenant_id', 'tenant', True), ('key', 'key', True),
                       ('step', 'fingerprint', True)],
    'idem_lookup': [('tenant_id', 'tenant', True), ('key', 'key', True)],
    'idem_forget': [('tenant_id', 'tenant', True), ('key', 'key', True)],
    'idem_sweep': [('batch_size', 'batch_size', False)],
    'idem_claim_many': [('tenant_id', 'tenant', True), ('keys', 'key_array', True),
                        ('fingerprints', 'fingerprint_array', False), ('lease', 'duration', False),
                        ('ttl', 'duration', False)],
}
CLAIM_MANY_MAX = 1000
OUT_NAMES = {'idem_claim': ['outcome', 'expires_at'], 'idem_lookup': ['status', 'created_at'],
             'idem_sweep': ['expired_removed'], 'idem_claim_many': ['outcome', 'expires_at']}
WEIGHTS = {'idem_claim_many': 4, 'idem_claim': 30, 'idem_complete': 15, 'idem_release': 11, 'idem_heartbeat': 10,
           'idem_lookup': 12, 'idem_forget': 5, 'idem_sweep': 3, 'idem_checkpoint': 8, 'idem_child_key': 3}
GENERIC_WEIGHT = 3          # per function the fuzz has no signature for (e.g. idem_claim_many)


def judge(fn, args, phase):
    """The outcomes the contract allows for a call with these arguments.

    Arguments are judged in validation order; the first one that is
    certainly invalid decides the SQLSTATE.  Outcomes that depend on the
    table's state are allowed as a set.
    """
    allowed = set()
    vals = dict(args)
    limit = phase['max_response_size']

    def dur_check(a, zero_ok):
        if a is None or a.kind == 'null':
            return {'valid'}
        if a.kind == 'overflow':
            return {'22023'}
        if a.us > MAX_DURATION_US:            # the contract's cap: 1000 years
            return {'22023'}
        if a.us < 0 or (a.us == 0 and not zero_ok):
            return {'22023'}
        return {'valid'}

    def end_check(us):
        """Outcome of adding us to 'now' (idem_add_duration)."""
        t = NOW_US + us
        if t < END_TIMESTAMP - MARGIN_US:
            return {'valid'}
        if t >= END_TIMESTAMP + MARGIN_US:
            return {'22023'}
        return {'valid', '22023'}

    checks = []
    for name, gen, required in SIGNATURES[fn]:
        if fn == 'idem_claim' and name == 'holder':
            continue                           # judged after the ttl floor, below
        a = vals.get(name)
        if a is not None and a.parse is not None:
            checks.append({'valid'})           # the parser's error comes first (see render)
            continue
        if gen in ('tenant', 'key', 'fingerprint'):
            if a is None or a.kind == 'null':
                checks.append({'22004'} if required else {'valid'})
            elif a.kind == 'empty':
                checks.append({'22023'})
            elif a.kind == 'long':
                checks.append({'22001'})
            else:
                checks.append({'valid'})
        elif gen == 'token':
            checks.append({'22004'} if a.kind == 'null' else {'22023'} if a.kind == 'nonpos'
                          else {'valid', '22004'} if a.kind == 'lookup' else {'valid'})
        elif gen == 'jsonb':
            if a is None or a.kind == 'null':
                checks.append({'valid'})
            elif a.size is None:
                checks.append({'valid', '54000'})
            elif a.size < 0:                   # an upper bound
                checks.append({'valid'} if -a.size <= limit else {'valid', '54000'})
            else:
                checks.append({'54000'} if a.size > limit else {'valid'})
        elif gen == 'duration':
            checks.append(dur_check(a, zero_ok=(name == 'wait')))
        elif gen == 'batch_size':
            checks.append({'valid'} if a is None or a.kind == 'null' or a.value > 0 else {'22023'})
        elif gen in ('key_array', 'fingerprint_array'):
            if a is None or a.kind == 'null':
                checks.append({'22004'} if required else {'valid'})
            elif a.kind == 'multidim':
                checks.append({'22023'})
            elif a.size > CLAIM_MANY_MAX:
                checks.append({'54000'})
            elif gen == 'fingerprint_array' and vals['keys'].kind == 'array' and vals['keys'].parse is None \
                    and a.size != vals['keys'].size:
                checks.append({'22023'})
            else:
                checks.append({'valid'})
    if fn == 'idem_claim':
        ttl = vals.get('ttl')
        ttl_us = ttl.us if ttl is not None and ttl.kind == 'dur' else phase['ttl_s'] * 10 ** 6
        checks.append({'22023'} if phase['min_ttl_s'] and ttl_us < phase['min_ttl_s'] * 10 ** 6
                      else {'valid'})
        # holder (1.4): read after the other arguments and their ttl floor
        holder = vals.get('holder')
        if holder is not None and holder.parse is not None:
            checks.append({'valid'})
        elif holder is None or holder.kind == 'null':
            checks.append({'valid'})
        else:
            checks.append({'22023'} if holder.kind == 'empty' else {'22001'} if holder.kind == 'long'
                          else {'valid'})
        wait = vals.get('wait')
        checks.append(end_check(wait.us if wait is not None and wait.kind == 'dur' else 0))
    if fn == 'idem_claim_many':
        ttl = vals.get('ttl')
        ttl_us = ttl.us if ttl is not None and ttl.kind == 'dur' else phase['ttl_s'] * 10 ** 6
        checks.append({'22023'} if phase['min_ttl_s'] and ttl_us < phase['min_ttl_s'] * 10 ** 6
                      else {'valid'})
        keys, fps = vals.get('keys'), vals.get('fingerprints')
        if keys is not None and keys.kind == 'array' and keys.value is not None and keys.parse is None:
            fpl = fps.value if fps is not None and fps.kind == 'array' and fps.parse is None else None
            for i, k in enumerate(keys.value):
                checks.append({'22004'} if k.kind == 'null' else {'22023'} if k.kind == 'empty'
                              else {'22001'} if k.kind == 'long' else {'valid'})
                if fpl is not None and i < len(fpl):
                    f = fpl[i]
                    checks.append({'22023'} if f.kind == 'empty' else {'22001'} if f.kind == 'long'
                                  else {'valid'})
    if fn == 'idem_heartbeat':
        lease = vals.get('lease')
        checks.append(end_check(lease.us if lease is not None and lease.kind == 'dur'
                                else phase['lease_ms'] * 1000))
    if fn == 'idem_checkpoint':
        lease = vals.get('lease')             # 1.2: only a given lease is added to now
        if lease is not None and lease.kind == 'dur':
            checks.append(end_check(lease.us))

    for c in checks:
        allowed |= c - {'valid'}
        if 'valid' not in c:
            return allowed
    # arguments valid: what the table's state may add
    allowed.add('ok')
    if fn in ('idem_claim', 'idem_claim_many'):
        lease = vals.get('lease')
        lease_us = lease.us if lease is not None and lease.kind == 'dur' else phase['lease_ms'] * 1000
        allowed |= end_check(lease_us) - {'valid'}          # only on the paths that write
        allowed.add('55P03')          # the row was locked by the sweeper's batch past lock_timeout
        if fn == 'idem_claim_many' and (vals['keys'].size or 0) >= 500:
            allowed.add('53200')      # every claimed key holds a lock until the transaction ends
    elif fn in ('idem_complete', 'idem_release', 'idem_heartbeat', 'idem_checkpoint'):
        allowed |= {'ID001', 'ID002', 'ID003', '55P03'}
    elif fn in ('idem_forget', 'idem_sweep'):
        allowed.add('55P03')          # a claim of the key in flight / the worker's sweep, past lock_timeout
    return allowed


class Generator:
    """The stream of calls for one phase: a pure function of (seed, phase)."""

    def __init__(self, seed, phase, generic_fns):
        self.g = Gen(seed, phase)
        self.phase = phase
        self.generic = generic_fns
        self.fns = list(WEIGHTS) + [f['name'] for f in generic_fns]
        self.weights = list(WEIGHTS.values()) + [GENERIC_WEIGHT] * len(generic_fns)

    def next(self):
        g = self.g
        rng = g.rng
        fn = rng.choices(self.fns, self.weights)[0]
        if fn not in SIGNATURES:
            return self.generic_call(fn)

        args = []
        tenant = key = keys_arg = None
        for name, gen, required in SIGNATURES[fn]:
            if gen == 'tenant':
                a = tenant = g.tenant()
            elif gen == 'key':
                a = key = g.key()
                if rng.random() < 0.004:
                    tenant = g.ident_from('fz')
                    args[0] = ('tenant_id', tenant)
                    a = key = g.ident_from(rng.choice(BUSY_KEYS))
            elif gen == 'token':
                a = g.token(tenant, key)
            elif gen == 'duration':
                a = g.duration(short_bias=(name == 'lease'))
            elif gen == 'fingerprint':
                a = g.fingerprint()
            elif gen == 'key_array':
                a = keys_arg = g.key_array()
            elif gen == 'fingerprint_array':
                a = g.fingerprint_array(keys_arg)
            else:
                a = getattr(g, gen)()
            if a is None and required:
                a = Arg('NULL', 'null')
            args.append((name, a))

        if fn == 'idem_claim':
            wait = args[5][1]
            # A claim waits for a live lease of a key it does not hold as long
            # as wait says.  Leases here reach years, so long waits go to keys
            # nobody holds (fresh ones); keys that may be held get short waits.
            # (A key held by an uncommitted claim, BUSY_KEYS, is a lock wait,
            # which the session's lock_timeout of 20 ms bounds; the SQL
            # edition's wait polls, which lock_timeout does not end, so there
            # it gets a short wait too: docs/managed.md, difference 7.)
            busy = key.value in BUSY_KEYS and tenant.value == 'fz' and EDITION != 'sql'
            if wait is not None and wait.kind == 'dur' and wait.us > WAIT_CAP_US and not key.fresh \
                    and key.kind == 'ok' and not busy:
                if rng.random() < 0.5:
                    args[1] = ('key', g.ident_from(g.fresh_key()))
                    args[1][1].fresh = True
                else:
                    us = rng.randint(1, WAIT_CAP_US)
                    args[5] = ('wait', Arg("'%d us'" % us, 'dur', us=us))

        expect = judge(fn, args, self.phase)
        sql, parse_expect = self.render(fn, args)
        if parse_expect is not None:
            expect = None if parse_expect == '?' else parse_expect
        return Call(fn, WRAP[fn].format(s=self.phase['schema'], args=sql), expect, CHECKS.get(fn))

    def render(self, fn, args):
        """Lay the arguments out as a call, sometimes a malformed one."""
        rng = self.g.rng
        present = [(n, a) for n, a in args if a is not None]
        parse = None
        for n, a in present:
            if a.parse is not None:
                parse = a.parse if parse is None else (parse | a.parse if parse != '?' and a.parse != '?' else '?')
        arg_parse = parse
        style = rng.random()
        mutation = rng.random()
        names = [n for n, _, _ in SIGNATURES[fn]]

        if style < 0.6 or any(names.index(n) != i for i, (n, _) in enumerate(present)):
            # named notation, in random order
            rng.shuffle(present)
            parts = ['%s => %s' % (n, a.sql) for n, a in present]
        elif style < 0.85:
            parts = [a.sql for _, a in present]                 # positional
        else:
            k = rng.randint(0, len(present))                    # mixed: positional first
            parts = [a.sql for _, a in present[:k]] + ['%s => %s' % (n, a.sql) for n, a in present[k:]]

        if mutation < 0.07:
            m = rng.randrange(8)
            if m == 0:
                parts.append('foo => 1')                                        # unknown name
                parse = {'42883'}
            elif m == 1 and present:
                n, a = rng.choice(present)
                parts.append('%s => %s' % (n, a.sql))                         # given twice
                parse = {'42601', '42883'}
            elif m == 2 and parts:
                parts = ['%s => %s' % (names[0], 'NULL')] + ["'x'"]              # positional after named
                parse = {'42601'}
            elif m == 3:
                parts = [a.sql if a is not None else 'NULL' for _, a in args] + ['NULL']  # one too many
                parse = {'42883'}
            elif m == 4 and fn in OUT_NAMES:
                parts.append('%s => NULL' % rng.choice(OUT_NAMES[fn]))         # an OUT parameter's name
                parse = {'42883'}
            elif m == 5:
                parts.append('"%s" => NULL' % names[-1].upper())               # wrong case
                parse = {'42883'}
            elif m == 6 and len(names) >= 2 and SIGNATURES[fn][0][2]:
                parts = ['%s => %s' % (n, a.sql) for n, a in present if n != names[0]]  # required missing
                parse = {'42883'}
            elif m == 7:
                parts = ['%s => %s' % (n, a.sql) for n, a in present]
                parts.append('tenant_id => ARRAY[\'a\']' if fn != 'idem_sweep' else 'batch_size => ROW(1)')
                parse = {'42601', '42883'}
        if mutation < 0.07 and arg_parse is not None and parse is not None and parse is not arg_parse:
            # an argument expression that fails (a bad cast) may fail before the call is resolved
            parse = parse | arg_parse if arg_parse != '?' else '?'
        return ', '.join(parts), parse

    def generic_call(self, fn):
        """A function the fuzz has no signature for: random values by type."""
        g = self.g
        rng = g.rng
        info = next(f for f in self.generic if f['name'] == fn)
        parts = []
        for name, typ in zip(info['argnames'], info['argtypes']):
            a = self.value_of_type(typ)
            if a is None:
                continue
            parts.append('%s => %s' % (name, a.sql) if name else a.sql)
        if rng.random() < 0.05:
            parts.append('foo => 1')
        sql = WRAP['generic'].format(s=self.phase['schema'], fn=fn, args=', '.join(parts))
        return Call(fn, sql, None, None)

    def value_of_type(self, typ):
        g = self.g
        rng = g.rng
        if typ == 'text':
            return g.key() if rng.random() < 0.9 else Arg('NULL', 'null')
        if typ == 'text[]':
            r = rng.random()
            if r < 0.1:
                return Arg('NULL', 'null')
            if r < 0.15:
                return Arg("'{}'::text[]", 'ok')
            if r < 0.17:
                n = rng.choice([1000, 5000])
                return Arg("ARRAY(SELECT 'many-' || g FROM pg_catalog.generate_series(1, %d) g)" % n, 'ok')
            elems = []
            for _ in range(rng.randint(1, 12)):
                a = g.key()
                elems.append(a.sql if rng.random() < 0.95 else 'NULL')
            if rng.random() < 0.3 and elems:
                elems.append(elems[0])                          # a duplicate
            return Arg('ARRAY[%s]::text[]' % ', '.join(elems), 'ok')
        if typ == 'bigint':
            return g.token(Arg('NULL', 'null'), Arg('NULL', 'null'))
        if typ == 'integer':
            return g.batch_size()
        if typ == 'interval':
            return g.duration()
        if typ == 'jsonb':
            return g.jsonb()
        if typ == 'boolean':
            return Arg(rng.choice(['true', 'false', 'NULL']))
        if typ == 'jsonb[]':
            return Arg(rng.choice(['NULL', "ARRAY['{}'::jsonb, NULL]", "'{}'::jsonb[]"]))
        return Arg('NULL', 'null')


# ---------------------------------------------------------------------------
# Running


LOG_CRASH = re.compile(r'terminated by signal|PANIC|server process .* was terminated|'
                       r'terminating any other active server processes|TRAP:')


class Results:
    def __init__(self, documented):
        self.documented = documented
        self.calls = 0
        self.per_fn = {}
        self.states = {}
        self.outcomes = {}
        self.failures = {}          # category -> list of examples
        self.crashes = 0
        self.hangs = 0
        self.time_us = {}
        self.slow = []

    def fail(self, category, text, fn=None, state=None):
        # keep a couple of examples of each (function, SQLSTATE), so that a
        # frequent failure does not hide a rare one
        by = self.failures.setdefault(category + '#by', {})
        n = by[(fn, state)] = by.get((fn, state), 0) + 1
        lst = self.failures.setdefault(category, [])
        if n <= 2 and len(lst) < 20:
            lst.append(text)
        self.failures.setdefault(category + '#count', [0])[0] += 1

    def count(self, category):
        return self.failures.get(category + '#count', [0])[0]


def load_documented(path):
    codes = {}
    with open(path) as f:
        for line in f:
            line = line.rstrip('\n')
            if not line or line.startswith('#'):
                continue
            parts = line.split('\t')
            codes[parts[0]] = parts[1]
    return codes


def short(s, n=300):
    s = s if isinstance(s, str) else repr(s)
    return s if len(s) <= n else s[:n] + '...(%d chars)' % len(s)


def judge_row(call, row, res, phase_name):
    n, state, message, a, b, c, writes, us = row
    res.calls += 1
    res.time_us[call.fn] = res.time_us.get(call.fn, 0) + us
    if us > 200000:
        res.slow.append((us, call.fn, state, short(call.sql, 200)))
    res.per_fn[call.fn] = res.per_fn.get(call.fn, 0) + 1
    if state is not None:
        res.states[state] = res.states.get(state, 0) + 1
        where = '[%s] %s\n      -> %s %s' % (phase_name, short(call.sql), state, short(message, 200))
        if state.startswith('XX'):
            res.fail('internal error (class XX)', where, call.fn, state)
        elif state not in res.documented:
            res.fail('undocumented SQLSTATE', where, call.fn, state)
        # A call refused for its arguments or the key's state must fail before
        # it writes anything.  Running out of a resource or losing a race may
        # stop a multi-row call half way (the statement's writes roll back).
        if writes and state not in MIDWAY_STATES:
            res.fail('failed call wrote rows', '%s (%d row writes)' % (where, writes), call.fn, state)
        if call.expect is not None and state not in call.expect:
            res.fail('SQLSTATE not the one the contract gives',
                     '%s (allowed: %s)' % (where, ', '.join(sorted(call.expect))), call.fn, state)
    else:
        key = call.fn if call.fn != 'idem_claim' else 'idem_claim:' + str(a)
        res.outcomes[key] = res.outcomes.get(key, 0) + 1
        if call.expect is not None and 'ok' not in call.expect:
            res.fail('call succeeded where the contract gives an error',
                     '[%s] %s\n      -> returned %r (expected: %s)'
                     % (phase_name, short(call.sql), (a, b, c), ', '.join(sorted(call.expect))))
        if call.check is not None:
            problem = call.check(a, b, c)
            if problem:
                res.fail('malformed result', '[%s] %s\n      -> %s' % (phase_name, short(call.sql), problem))


def connect(args, user, **settings):
    conn = psycopg2.connect(host=args.host, port=args.port, dbname=args.dbname, user=user,
                            application_name='idem-fuzz')
    conn.set_client_encoding('UTF8')
    if settings:
        with conn.cursor() as cur:
            for k, v in settings.items():
                cur.execute('SELECT pg_catalog.set_config(%s, %s, false)', (k, v))
        conn.commit()
    return conn


def wait_for_server(args, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            c = connect(args, args.owner)
            c.close()
            return True
        except psycopg2.OperationalError:
            time.sleep(0.5)
    return False


def open_fuzz_session(args, phase, table):
    conn = connect(args, 'idem_fuzz', lock_timeout='20ms', statement_timeout=BATCH_TIMEOUT,
                   **phase['session'])
    with conn.cursor() as cur, open(os.path.join(HERE, 'driver.sql')) as f:
        cur.execute(f.read())
    conn.commit()
    return conn


def run_batch(conn, calls, table):
    with conn.cursor() as cur:
        cur.execute('SELECT * FROM pg_temp.fuzz_batch(%s::text[], %s::regclass)',
                    ([c.sql for c in calls], table))
        rows = cur.fetchall()
    conn.commit()
    return rows


def bisect_crash(args, phase, table, calls, res):
    """Find which call of a batch took the backend down: replay them one by one."""
    found = 0
    for call in calls:
        if found >= 3:
            break
        if not wait_for_server(args):
            res.fail('backend crash', 'server did not come back')
            return
        conn = open_fuzz_session(args, phase, table)
        try:
            run_batch(conn, [call], table)
        except (psycopg2.OperationalError, psycopg2.InterfaceError) as e:
            found += 1
            res.fail('backend crash', '[%s] %s\n      -> %s' % (phase['name'], short(call.sql, 2000), e))
            continue
        except psycopg2.Error:
            pass
        finally:
            try:
                conn.close()
            except psycopg2.Error:
                pass
    if not found:
        res.fail('backend crash', 'a batch lost its connection but no single call reproduces it')


def run_phase(args, phase, ncalls, res, generic_fns, table):
    gen = Generator(args.seed * 1000 + phase['index'], phase, generic_fns)
    owner = connect(args, args.owner)
    owner.autocommit = True
    with owner.cursor() as cur:
        cur.execute('ALTER ROLE idem_fuzz RESET ALL')
        for k, v in phase['role'].items():
            cur.execute('ALTER ROLE idem_fuzz SET %s = %s' % (k, q(v)))
        for k, v in phase.get('system', {}).items():
            cur.execute('ALTER SYSTEM SET %s = %s' % (k, q(v)))
        cur.execute('SELECT pg_catalog.pg_reload_conf()')

    # Another session holds claims on BUSY_KEYS, uncommitted, all phase long:
    # calls on them meet a claim in flight (in_progress, lock waits, 55P03).
    holder = connect(args, args.owner)
    with holder.cursor() as cur:
        for k in BUSY_KEYS:
            cur.execute('SELECT outcome FROM %s.idem_claim(%%s, %%s, lease => %%s)' % phase['schema'],
                        ('fz', k, '1 hour'))

    conn = open_fuzz_session(args, phase, table)
    done = 0
    while done < ncalls:
        calls = [gen.next() for _ in range(min(BATCH, ncalls - done))]
        done += len(calls)
        try:
            rows = run_batch(conn, calls, table)
        except psycopg2.errors.QueryCanceled as e:
            # statement_timeout on the batch: some call hung
            conn.rollback()
            res.hangs += 1
            res.fail('hang', '[%s] %s' % (phase['name'], short(str(e), 600)))
            continue
        except (psycopg2.OperationalError, psycopg2.InterfaceError) as e:
            res.crashes += 1
            print('  connection lost in phase %s: %s' % (phase['name'], str(e).strip()), flush=True)
            bisect_crash(args, phase, table, calls, res)
            if not wait_for_server(args):
                break
            conn = open_fuzz_session(args, phase, table)
            holder = connect(args, args.owner)
            continue
        except psycopg2.Error as e:
            conn.rollback()
            res.fail('batch failed outside a call', '%s %s' % (e.pgcode, short(str(e))))
            continue
        for call, row in zip(calls, rows):
            judge_row(call, row, res, phase['name'])
    conn.close()
    try:
        holder.rollback()
        holder.close()
    except psycopg2.Error:
        pass
    with owner.cursor() as cur:
        cur.execute('ALTER ROLE idem_fuzz RESET ALL')
        for k in phase.get('system', {}):
            cur.execute('ALTER SYSTEM RESET %s' % k)
        cur.execute('SELECT pg_catalog.pg_reload_conf()')
    owner.close()


PHASES = [
    # defaults
    dict(name='defaults', share=0.55, role={}, session={},
         max_response_size=1048576, min_ttl_s=0, ttl_s=86400, lease_ms=300000),
    # stale claims fail; a small response limit; a retention floor of an hour
    dict(name='fail-4kB-minttl', share=0.25,
         system={'idempotency.stale_action': 'fail'},          # the sweeper's too
         role={'idempotency.stale_action': 'fail', 'idempotency.max_response_size': '4kB',
               'idempotency.min_ttl': '1h'},
         session={'idempotency.lease': '50ms'},
         max_response_size=4096, min_ttl_s=3600, ttl_s=86400, lease_ms=50),
    # everything expires at once; a 64-byte response limit
    dict(name='1ms-64B', share=0.20,
         role={'idempotency.max_response_size': '64'},
         session={'idempotency.lease': '1ms', 'idempotency.ttl': '1s'},
         max_response_size=64, min_ttl_s=0, ttl_s=1, lease_ms=1),
]


def setup(args):
    """Roles, grants, and what the fuzz needs to know about the extension."""
    conn = connect(args, args.owner)
    conn.autocommit = True
    cur = conn.cursor()
    if args.edition == 'sql':
        # the SQL edition (sql-edition/, installed by the suite): no
        # extension; its schema is idempotency_records' on the search_path
        cur.execute("""SELECT c.relnamespace::pg_catalog.regnamespace::text FROM pg_catalog.pg_class c
                       WHERE c.oid = pg_catalog.to_regclass('idempotency_records')""")
    else:
        cur.execute("""SELECT n.nspname FROM pg_catalog.pg_extension e
                       JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
                       WHERE e.extname = 'idempotency'""")
    row = cur.fetchone()
    if row is None and args.edition == 'sql':
        raise SystemExit('fuzz.py --edition sql: no idempotency_records on the search_path')
    if row is None:
        cur.execute('CREATE EXTENSION idempotency')
        cur.execute("""SELECT n.nspname FROM pg_catalog.pg_extension e
                       JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
                       WHERE e.extname = 'idempotency'""")
        row = cur.fetchone()
    schema = row[0]
    cur.execute('CREATE SCHEMA IF NOT EXISTS fuzz_tools')
    cur.execute('CREATE EXTENSION IF NOT EXISTS amcheck SCHEMA fuzz_tools')
    cur.execute("SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'idem_fuzz'")
    if cur.fetchone() is None:
        cur.execute('CREATE ROLE idem_fuzz LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE')
    sq = '"%s"' % schema.replace('"', '""')
    # the application grants the README documents ...
    cur.execute('GRANT USAGE ON SCHEMA %s TO idem_fuzz' % sq)
    cur.execute('GRANT SELECT, INSERT, UPDATE, DELETE ON %s.idempotency_records TO idem_fuzz' % sq)
    # ... and EXECUTE on every function of the extension, so that the
    # operator functions (idem_forget, idem_sweep, ...) are fuzzed as well
    # (the SQL edition: every idem_* function of its schema but the internal
    # idem_sql_* helpers; the three SECURITY DEFINER ones are granted as
    # docs/managed.md's "Grants" says)
    if args.edition == 'sql':
        cur.execute('GRANT EXECUTE ON FUNCTION %s.idem_sql_fresh_tokens(integer), %s.idem_sql_successor_token(bigint),'
                    ' %s.idem_sql_isolation_setting() TO idem_fuzz' % (sq, sq, sq))
        cur.execute("""SELECT p.oid::pg_catalog.regprocedure::text, p.proname,
                                  coalesce(p.proargnames, '{}'), p.proargtypes::pg_catalog.regtype[]::text[],
                                  p.pronargs
                       FROM pg_catalog.pg_proc p
                       WHERE p.pronamespace = %s::pg_catalog.regnamespace AND p.proname LIKE 'idem\\_%%'
                         AND p.proname NOT LIKE 'idem\\_sql\\_%%' AND p.prokind = 'f'
                       ORDER BY 2""", (schema,))
    else:
        cur.execute("""SELECT p.oid::pg_catalog.regprocedure::text, p.proname,
                                  coalesce(p.proargnames, '{}'), p.proargtypes::pg_catalog.regtype[]::text[],
                                  p.pronargs
                       FROM pg_catalog.pg_depend d
                       JOIN pg_catalog.pg_proc p ON p.oid = d.objid
                       JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid
                       WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
                         AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
                         AND d.deptype = 'e' AND e.extname = 'idempotency'
                       ORDER BY 2""")
    fns = cur.fetchall()
    generic = []
    for sig, name, argnames, argtypes, nargs in fns:
        cur.execute('GRANT EXECUTE ON FUNCTION %s.%s TO idem_fuzz' % (sq, sig))
        if name not in SIGNATURES:
            generic.append(dict(name=name, argnames=list(argnames[:nargs]) + [None] * (nargs - len(argnames[:nargs])),
                                argtypes=list(argtypes)))
    missing = [f for f in SIGNATURES if f not in {r[1] for r in fns}]
    cur.execute("SELECT pg_catalog.to_regclass(%s)", ('%s.idempotency_records' % sq,))
    table = cur.fetchone()[0]
    # exact binary sizes of the large generated documents
    json_sizes = {}
    for k, sql in SPECIAL_JSON.items():
        if k == 'too_deep':
            continue
        cur.execute('SELECT pg_catalog.pg_column_size(%s) - 4' % sql)
        json_sizes[k] = cur.fetchone()[0]
    conn.close()
    return sq, table, generic, missing, json_sizes


def final_checks(args, table, res):
    conn = connect(args, args.owner)
    cur = conn.cursor()
    cur.execute("""SELECT pg_catalog.count(*),
          pg_catalog.count(*) FILTER (WHERE pg_catalog.octet_length(tenant_id) NOT BETWEEN 1 AND 255
                                      OR pg_catalog.octet_length(key) NOT BETWEEN 1 AND 255
                                      OR pg_catalog.octet_length(fingerprint) NOT BETWEEN 1 AND 255),
          pg_catalog.count(*) FILTER (WHERE token <= 0),
          pg_catalog.count(*) FILTER (WHERE (status = 'processing') <> (lease_expires_at IS NOT NULL)
                                      OR status NOT IN ('processing', 'completed', 'failed'))
        FROM %s""" % table)
    rows, bad_ident, bad_token, bad_state = cur.fetchone()
    print('  records at the end: %d' % rows)
    ok = True
    for n, what in ((bad_ident, 'identifiers outside 1..255 bytes'), (bad_token, 'non-positive tokens'),
                    (bad_state, 'rows with a lease not matching processing')):
        if n:
            res.fail('table violates the contract', '%d %s' % (n, what))
            ok = False
    cur.execute("""SELECT c.relname, fuzz_tools.bt_index_check(c.oid, true) IS NULL
                   FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
                   WHERE i.indrelid = %s::regclass""", (table,))
    for name, _ in cur.fetchall():
        print('  amcheck bt_index_check(%s, heapallindexed): ok' % name)
    conn.close()
    return ok


def scan_log(path, offset):
    bad = []
    worker_errors = []
    with open(path, errors='replace') as f:
        f.seek(offset)
        for line in f:
            if LOG_CRASH.search(line):
                bad.append(line.rstrip())
            # background processes (the sweeper) must not fail on what clients stored
            m = re.search(r'\] (.+?): (ERROR|FATAL):', line)
            if m and m.group(1) not in ('client backend',):
                worker_errors.append(line.rstrip())
    return bad, worker_errors


def main():
    global BATCH_TIMEOUT, EDITION
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--host', default='127.0.0.1')
    ap.add_argument('--port', type=int, default=5432)
    ap.add_argument('--dbname', default='postgres')
    ap.add_argument('--owner', default='postgres', help='superuser that owns the extension')
    ap.add_argument('--calls', type=int, default=100000)
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--server-log', help='server log to scan for crashes')
    ap.add_argument('--edition', choices=('c', 'sql'), default=os.environ.get('IDEM_EDITION', 'c'),
                    help='the C extension, or the SQL edition installed in the search_path (IDEM_EDITION)')
    ap.add_argument('--batch-timeout', default=BATCH_TIMEOUT,
                    help='statement_timeout of a batch of %d calls (a hang detector)' % BATCH)
    ap.add_argument('--show', type=int, help='print generated call N (0-based, across phases) and exit')
    args = ap.parse_args()

    documented = load_documented(os.path.join(HERE, 'sqlstates.txt'))
    BATCH_TIMEOUT = args.batch_timeout
    EDITION = args.edition

    if args.show is not None:
        n = args.show
        for i, ph in enumerate(PHASES):
            ph = dict(ph, index=i, schema='public',
                      json_sizes={k: None for k in SPECIAL_JSON})
            k = int(args.calls * ph['share'])
            if n < k:
                gen = Generator(args.seed * 1000 + i, ph, [])
                for _ in range(n):
                    gen.next()
                c = gen.next()
                print('-- phase %s, call %d; allowed: %s' % (ph['name'], n, c.expect))
                print(c.sql + ';')
                return 0
            n -= k
        return 1

    start = time.time()
    log_offset = os.path.getsize(args.server_log) if args.server_log else 0
    schema, table, generic, missing, json_sizes = setup(args)
    res = Results(documented)
    print('fuzz: seed %d, %d calls as role idem_fuzz (non-owner; application grants + EXECUTE on '
          'every function), schema %s' % (args.seed, args.calls, schema))
    if generic:
        print('  also fuzzed by argument type: %s' % ', '.join(f['name'] for f in generic))
    for f in missing:
        res.fail('function missing', f)

    for i, ph in enumerate(PHASES):
        ph = dict(ph, index=i, schema=schema, json_sizes=json_sizes)
        n = int(args.calls * ph['share']) if i < len(PHASES) - 1 else \
            args.calls - sum(int(args.calls * p['share']) for p in PHASES[:-1])
        t0 = time.time()
        before = res.calls
        run_phase(args, ph, n, res, generic, table)
        print('  phase %-16s %6d calls in %5.1f s  (%s)' % (
            ph['name'], res.calls - before, time.time() - t0,
            ', '.join('%s=%s' % kv for kv in sorted(ph.get('system', {}).items()) +
                      sorted(ph['role'].items()) + sorted(ph['session'].items()))
            or 'default settings'))

    table_ok = final_checks(args, table, res)
    crash_lines, worker_errors = scan_log(args.server_log, log_offset) if args.server_log else ([], [])
    elapsed = time.time() - start

    print('  calls per function: ' + ', '.join('%s %d' % kv for kv in sorted(res.per_fn.items())))
    print('  successful outcomes: ' + ', '.join('%s %d' % kv for kv in sorted(res.outcomes.items())))
    print('  SQLSTATEs seen (%d distinct): ' % len(res.states) +
          ', '.join('%s %d' % kv for kv in sorted(res.states.items())))
    print('  server time per function (ms): ' +
          ', '.join('%s %.0f' % (f, t / 1000) for f, t in sorted(res.time_us.items())))
    for us, fn, state, sql in sorted(res.slow, reverse=True)[:3]:
        print('  slowest: %.0f ms %s %s' % (us / 1000, state or 'ok', sql))
    print('  elapsed %.1f s' % elapsed)

    checks = []

    def check(name, ok, detail=''):
        checks.append(ok)
        print('%s %s%s' % ('ok  ' if ok else 'FAIL', name, (' -- ' + detail) if detail else ''))

    def examples(cat):
        by = {k: v for k, v in res.failures.get(cat + '#by', {}).items() if k[0] is not None}
        if by:
            print('      by function and SQLSTATE: ' +
                  ', '.join('%s %s: %d' % (f, st, n) for (f, st), n in sorted(by.items())))
        for e in res.failures.get(cat, []):
            print('      ' + e)

    check('at least %d calls made, every function called' % args.calls,
          res.calls >= args.calls and not res.count('function missing'),
          '%d calls' % res.calls)
    examples('function missing')
    check('no backend crash (connections lost: %d; crash lines in the server log: %d)'
          % (res.crashes, len(crash_lines)),
          res.crashes == 0 and not crash_lines and not res.count('backend crash'))
    examples('backend crash')
    for line in crash_lines[:5]:
        print('      ' + line)
    check('no call hung (statement_timeout %s per batch)' % BATCH_TIMEOUT, res.hangs == 0)
    examples('hang')
    for cat in ('internal error (class XX)', 'undocumented SQLSTATE',
                'SQLSTATE not the one the contract gives', 'call succeeded where the contract gives an error',
                'failed call wrote rows', 'malformed result', 'batch failed outside a call'):
        check(cat.replace('internal error (class XX)', 'no internal error (class XX)')
              if cat.startswith('internal') else 'none: ' + cat,
              res.count(cat) == 0, '%d calls' % res.count(cat) if res.count(cat) else '')
        examples(cat)
    check('table satisfies the contract after the run, indexes pass amcheck', table_ok)
    examples('table violates the contract')
    check('no background process logged an ERROR (the sweeper must survive stored data)',
          not worker_errors, '%d lines' % len(worker_errors) if worker_errors else '')
    for line in worker_errors[:5]:
        print('      ' + short(line, 400))

    passed = sum(1 for c in checks if c)
    print('FUZZ-RESULT passed=%d failed=%d calls=%d crashes=%d distinct_sqlstates=%d seconds=%.0f'
          % (passed, len(checks) - passed, res.calls, res.crashes + len(crash_lines),
             len(res.states), elapsed))
    return 0 if passed == len(checks) else 1


if __name__ == '__main__':
    sys.exit(main())
