#!/usr/bin/python3
"""Does a backend's memory stay flat over a long run of calls?

One backend makes --calls calls (default 200,000) in chunks: claim and
complete in one statement, replay, claim_many, heartbeat, lookup, release
with and without a failure, fenced writes that fail (ID001/ID002/ID003), bad
input (22004/22023/22001/54000) caught in a PL/pgSQL block, and claims that
wait on a key another session holds (the internal subtransaction of a lock
wait).  Every path of the C code that a long-lived application connection
uses runs thousands of times.

The first 10% of the calls warm the backend up (catalog caches, prepared
plans, the stats slot).  Then it reads two measures, before and after the
remaining 90%, each the smaller of two readings:
  * the sum of total_bytes over pg_backend_memory_contexts (memory in
    PostgreSQL's allocator, whatever context it leaks into), and
  * RssAnon of the backend in /proc/<pid>/status (anonymous memory: malloc
    included, shared buffers excluded, as those grow with the data touched).

Bounds, and why: a leak is memory that grows with the number of calls.  The
smallest palloc chunk costs 24 bytes (8 of data and a 16-byte header), so
leaking one palloc per call over the measured ~180,000 calls adds at least
4 MiB.  The contexts bound, 1 MiB, therefore catches any per-call leak of a
palloc into a long-lived context (and anything from ~6 bytes per call); the
RssAnon bound, 4 MiB, leaves room for the allocator's own jitter and catches
a malloc-level leak from ~24 bytes per call.  What the run settles to after
warm-up is not a leak and does not count.  This asserts the absence of a leak,
not speed.
"""

import argparse
import sys
import time

import psycopg2

CTX_BOUND = 1 << 20
RSS_BOUND = 4 << 20
KEYS_PER_CHUNK = 40


def read_rss(pid):
    out = {}
    with open('/proc/%d/status' % pid) as f:
        for line in f:
            k, _, v = line.partition(':')
            if k in ('VmRSS', 'RssAnon', 'VmHWM'):
                out[k] = int(v.split()[0]) * 1024
    return out


def measure(cur, pid):
    best = None
    for _ in range(2):
        cur.execute('SELECT pg_catalog.sum(total_bytes)::bigint FROM pg_catalog.pg_backend_memory_contexts')
        ctx = cur.fetchone()[0]
        rss = read_rss(pid)
        if best is None or ctx < best[0]:
            best = (ctx, rss['RssAnon'], rss['VmRSS'])
    return best


def contexts(cur):
    cur.execute("""SELECT name, coalesce(ident, ''), pg_catalog.sum(total_bytes)::bigint
                   FROM pg_catalog.pg_backend_memory_contexts GROUP BY 1, 2""")
    return {(n, i): b for n, i, b in cur.fetchall()}


def chunk_sql(chunk, has_many):
    """One round trip: about 8 calls per key, each statement its own query."""
    parts = []
    calls = 0
    for j in range(KEYS_PER_CHUNK):
        k = 'c%d-%d' % (chunk, j)
        parts.append(
            "WITH c AS (SELECT * FROM public.idem_claim('mem', '%s', 'fp', lease => '1 min')) "
            "SELECT public.idem_heartbeat('mem', '%s', c.token), "
            "public.idem_complete('mem', '%s', c.token, '{\"chunk\": %d, \"payload\": \"%s\"}') FROM c" %
            (k, k, k, chunk, 'x' * (j * 10)))
        parts.append("SELECT * FROM public.idem_claim('mem', '%s', 'fp')" % k)           # replay
        parts.append("SELECT * FROM public.idem_lookup('mem', '%s')" % k)
        calls += 5
        if j % 4 == 0:
            r = k + '-r'
            parts.append(
                "WITH c AS (SELECT * FROM public.idem_claim('mem', '%s')) "
                "SELECT public.idem_release('mem', '%s', c.token, '{\"error\": 1}') FROM c" % (r, r))
            parts.append("SELECT * FROM public.idem_claim('mem', '%s')" % r)             # failed replay
            parts.append("SELECT * FROM public.idem_claim('mem', '%s', 'fp')" % r)       # failed, fingerprint given
            parts.append(
                "WITH c AS (SELECT * FROM public.idem_claim('mem', '%s-d')) "
                "SELECT public.idem_release('mem', '%s-d', c.token) FROM c" % (r, r))
            calls += 6
    if has_many:
        keys = ','.join('"m%d-%d"' % (chunk, j) for j in range(10))
        parts.append("SELECT * FROM public.idem_claim_many('mem', '{%s}')" % keys)
        parts.append("SELECT * FROM public.idem_claim_many('mem', '{%s}')" % keys)     # all in_progress
        calls += 20
    return ';\n'.join(parts), calls


ERROR_BLOCK = """
DO $$
DECLARE
    n   integer := 0;
    big jsonb := pg_catalog.jsonb_build_object('p', pg_catalog.repeat('x', 1100000));
BEGIN
    FOR i IN 1 .. %d LOOP
        BEGIN PERFORM public.idem_complete('mem', 'c0-0', 1, NULL); EXCEPTION WHEN OTHERS THEN n := n + 1; END;
        BEGIN PERFORM public.idem_complete('mem', 'nope-' || i, 1, NULL); EXCEPTION WHEN OTHERS THEN n := n + 1; END;
        BEGIN PERFORM public.idem_heartbeat('mem', 'c0-0', 1); EXCEPTION WHEN OTHERS THEN n := n + 1; END;
        BEGIN PERFORM public.idem_claim('mem', NULL); EXCEPTION WHEN OTHERS THEN n := n + 1; END;
        BEGIN PERFORM public.idem_claim('mem', 'k', lease => '-1 s'); EXCEPTION WHEN OTHERS THEN n := n + 1; END;
        BEGIN PERFORM public.idem_claim('mem', pg_catalog.repeat('k', 300)); EXCEPTION WHEN OTHERS THEN n := n + 1; END;
        BEGIN PERFORM public.idem_release('mem', 'c0-1', 1, big); EXCEPTION WHEN OTHERS THEN n := n + 1; END;
    END LOOP;
    IF n <> 7 * %d THEN RAISE EXCEPTION 'expected every call to fail, %% did', n; END IF;
END
$$"""
ERROR_CALLS_PER_ITER = 7

WAIT_BLOCK = """
DO $$
BEGIN
    FOR i IN 1 .. %d LOOP
        IF (public.idem_claim('mem', 'held', wait => '1 ms')).outcome <> 'in_progress' THEN
            RAISE EXCEPTION 'a held key was not in_progress';
        END IF;
    END LOOP;
END
$$"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--host', default='127.0.0.1')
    ap.add_argument('--port', type=int, required=True)
    ap.add_argument('--dbname', default='postgres')
    ap.add_argument('--calls', type=int, default=200000)
    args = ap.parse_args()

    conn = psycopg2.connect(host=args.host, port=args.port, dbname=args.dbname, user='postgres',
                            application_name='idem-leak-loop')
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute('SELECT pg_catalog.pg_backend_pid()')
    pid = cur.fetchone()[0]
    cur.execute("SELECT pg_catalog.to_regproc('public.idem_claim_many') IS NOT NULL")
    has_many = cur.fetchone()[0]

    # another session holds 'held' for the whole run: the wait path
    holder = psycopg2.connect(host=args.host, port=args.port, dbname=args.dbname, user='postgres')
    hcur = holder.cursor()
    hcur.execute("SELECT * FROM public.idem_claim('mem', 'held')")

    done = 0
    chunk = 0
    warmup = args.calls // 10
    base = None
    base_ctx = None
    trend = []
    t0 = time.time()
    step = 0
    while done < args.calls:
        if base is None and done >= warmup:
            base = measure(cur, pid)
            base_ctx = contexts(cur)
            trend.append((done, base))
            calls_at_base = done
        step += 1
        if step % 10 == 0:
            cur.execute(ERROR_BLOCK % (100, 100))
            done += 100 * ERROR_CALLS_PER_ITER
        elif step % 10 == 5:
            cur.execute(WAIT_BLOCK % 100)
            done += 100
        else:
            sql, n = chunk_sql(chunk, has_many)
            chunk += 1
            cur.execute(sql)
            done += n
        if base is not None and step % 100 == 0:
            trend.append((done, measure(cur, pid)))
    end = measure(cur, pid)
    trend.append((done, end))
    elapsed = time.time() - t0
    end_ctx = contexts(cur)
    holder.rollback()
    holder.close()

    measured = done - calls_at_base
    d_ctx = end[0] - base[0]
    d_rss = end[1] - base[1]
    print('memory: %d calls in one backend (pid %d) in %.1f s; measured over the last %d'
          % (done, pid, elapsed, measured))
    print('  contexts total: %d -> %d bytes (%+d, %+.2f bytes/call); bound %d'
          % (base[0], end[0], d_ctx, d_ctx / measured, CTX_BOUND))
    print('  RssAnon:        %d -> %d bytes (%+d, %+.2f bytes/call); bound %d  (VmRSS %d -> %d)'
          % (base[1], end[1], d_rss, d_rss / measured, RSS_BOUND, base[2], end[2]))
    print('  trend (calls: contexts, RssAnon): ' +
          '; '.join('%d: %d, %d' % (n, m[0], m[1]) for n, m in trend[::max(1, len(trend) // 8)]))
    grew = sorted(((end_ctx.get(k, 0) - base_ctx.get(k, 0), k) for k in set(end_ctx) | set(base_ctx)),
                  key=lambda x: -x[0])[:3]
    print('  contexts that grew most: ' + (', '.join(
        '%s%s %+d' % (k[0], (' (%s)' % k[1][:30]) if k[1] else '', d) for d, k in grew if d > 0) or 'none'))

    # control: the same measure does see memory that stays behind, here
    # 2,000 prepared statements (each keeps its plan source in
    # CacheMemoryContext), so the check above can fail
    for i in range(2000):
        cur.execute('PREPARE leak_control_%d AS SELECT %d, $1::text' % (i, i))
    control = measure(cur, pid)
    cur.execute('DEALLOCATE ALL')

    checks = [
        (d_ctx <= CTX_BOUND, 'backend memory contexts grew by at most 1 MiB after warm-up'),
        (d_rss <= RSS_BOUND, 'backend anonymous memory (RssAnon) grew by at most 4 MiB after warm-up'),
        (control[0] - end[0] > CTX_BOUND,
         'control: 2,000 prepared statements do show up (%+d bytes of contexts)' % (control[0] - end[0])),
    ]
    for ok, what in checks:
        print('%s %s' % ('ok  ' if ok else 'FAIL', what))
    n_ok = sum(1 for ok, _ in checks if ok)
    print('MEMORY-RESULT passed=%d failed=%d calls=%d ctx_growth=%d rss_growth=%d'
          % (n_ok, len(checks) - n_ok, done, d_ctx, d_rss))
    return 0 if n_ok == len(checks) else 1


if __name__ == '__main__':
    sys.exit(main())
