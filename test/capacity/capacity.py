#!/usr/bin/python3
"""The lock-table capacity that docs/capacity.md documents, measured.

Run by test/suites/57-capacity against a server that preloads idempotency.
Every fresh key a transaction claims with idem_claim holds one lock (a
transaction-level advisory lock) in the server's shared lock table until the
transaction ends; idem_claim_many holds its fresh keys' locks only during its
INSERT, at most 100 at a time.  PostgreSQL guarantees room for

    N = max_locks_per_transaction * (max_connections + autovacuum_max_workers + 1
        + max_worker_processes + max_wal_senders + max_prepared_transactions)

locks across all sessions (InitializeMaxBackends + NLOCKENTS in lock.c); past
N the table borrows the server's spare shared memory until that is gone too.
Checks (each line of output is one):
  - idem_claim: one lock per fresh key until the transaction ends;
    idem_claim_many: none once it returns, whatever the outcomes (replays,
    keys of claims or of another batch in flight, fresh keys);
  - 20 consumers each with a batch of 1000 fresh keys in an open
    transaction, then 5 more batches each at the same time (far more keys
    than N): no error, the shared table far from full; then the committed
    batches claimed again by all 20 at once (every key in_progress): no
    error;
  - 4 consumers holding, together, N minus the locks already held by others
    (measured in pg_locks) minus a margin of 16, claiming with idem_claim up
    to 1000 keys per statement, all succeed: the documented guarantee;
  - a fifth session then claims until the table is full: it fails with 53200
    "out of shared memory", and the total reached is at least N (printed
    with its ratio to N);
  - while the table is full, another session's idem_claim of 10 keys fails
    with 53200 and a new connection fails with FATAL "out of shared memory";
  - once the holders roll back, claims and connections work again.
"""

import argparse
import sys
import threading

import psycopg2

passed = 0
failed = 0


def check(ok, what, detail=''):
    global passed, failed
    passed += bool(ok)
    failed += not ok
    print('%s %s%s' % ('ok  ' if ok else 'FAIL', what, ' -- %s' % (detail,) if detail and not ok else ''),
          flush=True)
    return ok


def connect(args):
    c = psycopg2.connect(host=args.host, port=args.port, dbname='postgres', user='postgres',
                         application_name='idem-capacity')
    return c


def one(c, sql, params=None):
    with c.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone() if cur.description else None


def advisory_locks(c, pid):
    return one(c, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s", (pid,))[0]


def claim_range(c, tenant, start, count, batch=1000):
    """Claim keys start..start+count-1 with idem_claim, one key per row of
    a statement of at most `batch` rows, in this session's open transaction
    (each claimed key keeps its key lock until the transaction ends);
    returns how many came back claimed."""
    claimed = 0
    n = start
    while n < start + count:
        size = min(batch, start + count - n)
        claimed += one(c, """SELECT count(*) FILTER (WHERE (idem_claim(%s, 'k' || g)).outcome = 'claimed')
                             FROM generate_series(%s, %s) g""",
                       (tenant, n, n + size - 1))[0]
        n += size
    return claimed


def claim_batch(c, tenant, start, count):
    """One idem_claim_many of keys start..start+count-1; returns how many
    came back claimed."""
    return one(c, """SELECT count(*) FILTER (WHERE outcome = 'claimed')
                     FROM idem_claim_many(%s, ARRAY(SELECT 'k' || g FROM generate_series(%s, %s) g))""",
               (tenant, start, start + count - 1))[0]


def all_at_once(conns, work):
    """Run work(conn, i) for every connection in a thread of its own, all at
    once; returns the problems (work's messages and errors)."""
    errors = []

    def run(i):
        try:
            problem = work(conns[i], i)
            if problem:
                errors.append('consumer %d: %s' % (i, problem))
        except psycopg2.Error as e:
            errors.append('consumer %d: %s %s' % (i, e.pgcode, e.pgerror.splitlines()[0]))
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(conns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def fill_until_full(c, tenant, start):
    """Claim more keys under savepoints until a claim fails with 53200; the
    batch that failed is rolled back to its savepoint, then single keys fill
    the rest.  Returns (keys held, the error)."""
    held = 0
    error = None
    for size in (100, 10, 1):
        while True:
            with c.cursor() as cur:
                cur.execute('SAVEPOINT s')
                try:
                    held += claim_range(c, tenant, start + held, size, batch=size)
                    cur.execute('RELEASE SAVEPOINT s')
                except psycopg2.Error as e:
                    error = e
                    cur.execute('ROLLBACK TO SAVEPOINT s')
                    break
            if held > 10_000_000:
                raise RuntimeError('no limit reached')
    return held, error


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--host', default='127.0.0.1')
    ap.add_argument('--port', type=int, required=True)
    args = ap.parse_args()

    admin = connect(args)
    admin.autocommit = True
    one(admin, 'CREATE EXTENSION IF NOT EXISTS idempotency')
    names = ['max_locks_per_transaction', 'max_connections', 'autovacuum_max_workers',
             'max_worker_processes', 'max_wal_senders', 'max_prepared_transactions']
    s = {n: int(one(admin, 'SELECT setting FROM pg_settings WHERE name = %s', (n,))[0]) for n in names}
    backends = (s['max_connections'] + s['autovacuum_max_workers'] + 1 + s['max_worker_processes']
                + s['max_wal_senders'])
    N = s['max_locks_per_transaction'] * (backends + s['max_prepared_transactions'])
    print('# settings: %s' % ', '.join('%s=%d' % (n, s[n]) for n in names))
    print('# documented lock table size N = %d x (%d + %d + 1 + %d + %d + %d) = %d'
          % (s['max_locks_per_transaction'], s['max_connections'], s['autovacuum_max_workers'],
             s['max_worker_processes'], s['max_wal_senders'], s['max_prepared_transactions'], N))

    # idem_claim: one lock per fresh key, to the end of the transaction
    c = connect(args)
    pid = c.get_backend_pid()
    claimed = claim_range(c, 'count', 0, 500)
    check(claimed == 500 and advisory_locks(admin, pid) == 500,
          '500 idem_claim calls that claim hold 500 key locks until the transaction ends',
          (claimed, advisory_locks(admin, pid)))
    c.commit()
    check(advisory_locks(admin, pid) == 0, 'COMMIT gives the key locks back')

    # idem_claim_many: its fresh keys' locks only during its INSERT
    claimed = claim_batch(c, 'count', 1000, 1000)
    check(claimed == 1000 and advisory_locks(admin, pid) == 0,
          'an idem_claim_many of 1000 fresh keys holds no key lock once it returns',
          (claimed, advisory_locks(admin, pid)))
    c.commit()
    one(c, """SELECT count(idem_complete('done', key, token))
              FROM idem_claim_many('done', ARRAY(SELECT 'k' || g FROM generate_series(0, 249) g))""")
    c.commit()
    other = connect(args)
    claim_range(other, 'done', 1000, 100)            # 100 keys held by another transaction's claims
    claim_batch(other, 'done', 2000, 100)            # 100 keys inserted by another batch in flight
    rows = one(c, """SELECT count(*) FILTER (WHERE outcome = 'replay'),
                            count(*) FILTER (WHERE outcome = 'in_progress'),
                            count(*) FILTER (WHERE outcome = 'claimed')
                     FROM idem_claim_many('done', ARRAY(
                         SELECT 'k' || g FROM generate_series(0, 249) g
                         UNION ALL SELECT 'k' || g FROM generate_series(1000, 1099) g
                         UNION ALL SELECT 'k' || g FROM generate_series(2000, 2099) g
                         UNION ALL SELECT 'k' || g FROM generate_series(5000, 5009) g))""")
    check(rows == (250, 200, 10) and advisory_locks(admin, pid) == 0,
          'replays (250), keys of claims and of a batch in flight (in_progress, 200) and '
          'fresh keys (10): no lock held after the batch', (rows, advisory_locks(admin, pid)))
    c.rollback()
    other.rollback()
    other.close()

    # 20 consumers, each with a batch of 1000 fresh keys in an open transaction,
    # then 20 more batches each, all at once in threads: far past the table's size
    consumers = [connect(args) for _ in range(20)]
    claimed = sum(claim_batch(cons, 'batch-%d' % i, 0, 1000) for i, cons in enumerate(consumers))
    shared = one(admin, 'SELECT count(*) FROM pg_locks WHERE NOT fastpath')[0]
    check(claimed == 20000 and shared < N,
          '20 consumers hold a batch of 1000 fresh keys each (20,000 keys, N = %d): '
          '%d locks in the shared table' % (N, shared), (claimed, shared, N))

    def consume(cons, i):
        for b in range(1, 6):
            if claim_batch(cons, 'batch-%d' % i, b * 1000, 1000) != 1000:
                return 'a batch was not all claimed'
        return None
    errors = all_at_once(consumers, consume)
    check(not errors, '20 consumers claiming 5 more batches of 1000 at the same time (120,000 '
          'keys held uncommitted): no error', errors[:5])

    # live claims met again cost no lock either: commit the first batches,
    # then all 20 consumers claim them again at the same time
    for cons in consumers:
        cons.commit()

    def claim_again(cons, i):
        rows = one(cons, """SELECT count(*) FILTER (WHERE outcome = 'in_progress')
                            FROM idem_claim_many(%s, ARRAY(SELECT 'k' || g
                                                           FROM generate_series(0, 999) g))""",
                   ('batch-%d' % i,))
        cons.commit()
        return None if rows == (1000,) else 'got %r' % (rows,)
    errors = all_at_once(consumers, claim_again)
    check(not errors, '20 consumers claiming their committed batches of 1000 again at the same '
          'time (live claims: in_progress): no error', errors[:5])
    for cons in consumers:
        cons.rollback()
        cons.close()

    # the guarantee: 4 consumers together hold N minus what others hold
    consumers = [connect(args) for _ in range(4)]
    probe = connect(args)                      # connected before the table fills up
    held_by_others = one(admin, 'SELECT count(*) FROM pg_locks WHERE NOT fastpath')[0]
    margin = 16
    total_target = N - held_by_others - margin
    share = total_target // len(consumers)
    got = 0
    problems = []
    for i, cons in enumerate(consumers):
        try:
            got += claim_range(cons, 'consumer-%d' % i, 0, share)
        except psycopg2.Error as e:
            problems.append('consumer %d: %s %s' % (i, e.pgcode, e.pgerror.splitlines()[0]))
            cons.rollback()
    check(not problems and got == share * len(consumers),
          '4 consumers hold %d key locks at once (N %d - %d held by others - margin %d), '
          'claiming up to 1000 keys per statement' % (share * len(consumers), N, held_by_others, margin),
          problems)

    # past N: the table borrows spare shared memory, then the next lock fails
    filler = connect(args)
    more, err = fill_until_full(filler, 'filler', 0)
    total = got + more + held_by_others
    check(err is not None and err.pgcode == '53200' and 'out of shared memory' in err.pgerror,
          'claiming on until the table is full fails with 53200 "out of shared memory"',
          err and (err.pgcode, err.pgerror))
    check(total >= N, 'locks held when the table was full: %d = %.2f x N (at least N, as documented)'
          % (total, total / N), (total, N))

    # exhaustion hurts everyone: another session, and new connections
    # (ten keys: the filler's failed statement gave back what it had taken,
    # which may leave room for a lock or two)
    try:
        r = one(probe, "SELECT count(*) FROM generate_series(1, 10) g, idem_claim('bystander', 'y' || g)")
        probe_state = 'succeeded: %s' % (r,)
    except psycopg2.Error as e:
        probe_state = e.pgcode
    probe.rollback()
    check(probe_state == '53200', "another session claiming 10 keys fails with 53200 while the table is full",
          probe_state)
    try:
        connect(args).close()
        conn_state = 'connected'
    except psycopg2.OperationalError as e:
        conn_state = str(e).strip()
    check('FATAL' in conn_state and 'out of shared memory' in conn_state,
          'a new connection fails with FATAL "out of shared memory" while the table is full', conn_state)

    for x in consumers + [filler]:
        x.rollback()
        x.close()
    try:
        r = one(probe, "SELECT outcome FROM idem_claim('bystander', 'x')")[0]
        probe.commit()
        connect(args).close()
        after = r
    except psycopg2.Error as e:
        after = e.pgcode
    check(after == 'claimed', 'after the holders roll back, claims and new connections work again', after)

    print('CAPACITY-RESULT passed=%d failed=%d' % (passed, failed))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
