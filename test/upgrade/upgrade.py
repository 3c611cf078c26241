#!/usr/bin/python3
"""In-place upgrade 1.0 -> current default version, with live claims.

1. database upg: CREATE EXTENSION idempotency VERSION '1.0' with the new
   shared library; every function of the 1.0 SQL works.
2. fill it: completed (varied response documents), failed, processing
   records; remember every record and every replay.
3. live holders: a claim held in an open transaction (not yet written), a
   second one that will release with a failure, a prepared transaction
   holding a claim, committed processing claims whose tokens the client
   keeps, and a session claiming and completing fresh keys in a loop.
4. ALTER EXTENSION idempotency UPDATE in its own session while all that is
   open.
5. after: every untouched record is byte-identical, every replay returns the
   same outcome and bytes, every holder completes/releases/heartbeats with
   its token, the loop saw no error.
6. the upgraded objects equal a fresh install in another database (generic
   catalog comparison, test/upgrade/catalog.py), also after switching tenant
   isolation and an extra index on in both; and the comparison itself is
   shown to catch deliberately different objects.
"""

import argparse
import os
import sys
import threading
import time

import psycopg2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import catalog  # noqa: E402
from common import Server, check, one, rows, run, sqlstate, records, claim, result_line  # noqa: E402
import common  # noqa: E402

RESPONSES = [
    '{"status": 201, "body": {"id": 1, "name": "caf\\u00e9 \\ud83d\\ude00"}}',
    '[1, 2.50, -0.0, 1e100, "x", null, true, false]',
    '"a plain string with \\"quotes\\" and \\\\ backslashes"',
    '{"nested": {"deep": [[[{"a": {}}]]], "empty": []}, "n": 12345678901234567890}',
    'null',
    '{"big": "' + 'y' * 5000 + '"}',
]


def library_works_on_10(srv, db):
    """Every function of the 1.0 script, called through the 1.0 SQL objects
    with the library built from this tree."""
    c = srv.connect(db)
    v = one(c, "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'idempotency'")[0]
    check(v == '1.0', "CREATE EXTENSION idempotency VERSION '1.0' installs 1.0 (got %s)" % v)
    problems = []
    o, tok, _, _ = claim(c, 'lib', 'k1', fingerprint='f1')
    if o != 'claimed' or not tok:
        problems.append('claim: %s' % o)
    t2 = one(c, "SELECT public.idem_heartbeat('lib', 'k1', %s, '10 minutes')", (tok,))[0]
    if t2 is None:
        problems.append('heartbeat returned NULL')
    run(c, """SELECT public.idem_complete('lib', 'k1', %s, '{"ok": 1}')""", (tok,))
    r = claim(c, 'lib', 'k1', fingerprint='f1')
    if r[0] != 'replay' or r[2] != '{"ok": 1}':
        problems.append('replay: %r' % (r,))
    if claim(c, 'lib', 'k1', fingerprint='other')[0] != 'mismatch':
        problems.append('mismatch not reported')
    o, tok, _, _ = claim(c, 'lib', 'k2')
    run(c, """SELECT public.idem_release('lib', 'k2', %s, '{"error": "bad"}')""", (tok,))
    if claim(c, 'lib', 'k2')[0:3] != ('failed', None, '{"error": "bad"}'):
        problems.append('failed record not replayed')
    lk = rows(c, "SELECT status, token FROM public.idem_lookup('lib', 'k1')")
    if len(lk) != 1 or lk[0][0] != 'completed':
        problems.append('lookup: %r' % lk)
    if not one(c, "SELECT public.idem_forget('lib', 'k2')")[0]:
        problems.append('forget returned false')
    many = rows(c, "SELECT key, outcome FROM public.idem_claim_many('lib', ARRAY['m1', 'm2', 'k1']) ORDER BY key")
    if [tuple(x) for x in many] != [('k1', 'replay'), ('m1', 'claimed'), ('m2', 'claimed')]:
        problems.append('claim_many: %r' % many)
    run(c, "SELECT * FROM public.idem_sweep()")
    st = one(c, "SELECT claims FROM public.idem_stats WHERE datname = pg_catalog.current_database()")
    if st is None or st[0] < 1:
        problems.append('idem_stats: %r' % (st,))
    run(c, "DELETE FROM public.idempotency_records WHERE tenant_id = 'lib'")
    # the background sweeper on a 1.0 database: a record past its retention is removed
    o, tok, _, _ = claim(c, 'lib', 'expired', ttl='1 microsecond')
    run(c, "SELECT public.idem_complete('lib', 'expired', %s, NULL)", (tok,))
    adm = srv.connect('postgres')
    run(adm, "ALTER SYSTEM SET idempotency.sweep_interval = '1s'")
    run(adm, 'SELECT pg_catalog.pg_reload_conf()')
    deadline = time.time() + 120          # a cap for a broken sweeper, not a measured duration
    while time.time() < deadline and one(c, "SELECT pg_catalog.count(*) FROM public.idempotency_records "
                                            "WHERE tenant_id = 'lib' AND key = 'expired'")[0]:
        time.sleep(0.2)
    swept = one(c, "SELECT swept_expired, last_sweep_error FROM public.idem_stats "
                   "WHERE datname = pg_catalog.current_database()")
    run(adm, 'ALTER SYSTEM RESET idempotency.sweep_interval')
    run(adm, 'SELECT pg_catalog.pg_reload_conf()')
    adm.close()
    if not swept or swept[0] < 1 or swept[1] is not None:
        problems.append('the background sweeper did not sweep the 1.0 database: %r' % (swept,))
    check(not problems, 'the new library works through the 1.0 SQL objects: claim, heartbeat, complete, '
          'replay, mismatch, release with failure, lookup, forget, claim_many, sweep, idem_stats, '
          'the background sweeper', problems)
    c.close()


def fill(srv, db):
    """Completed, failed and processing records; returns the tokens of the
    processing ones (the client's capability to finish them)."""
    c = srv.connect(db)
    processing = {}
    for i in range(300):
        tenant = 'tenant-%d' % (i % 3)
        key = 'rec-%04d' % i
        kind = i % 10
        fp = 'fp-%d' % i if i % 4 == 0 else None
        o, tok, _, _ = claim(c, tenant, key, fingerprint=fp, lease='1 hour', ttl='7 days')
        assert o == 'claimed', (o, tenant, key)
        if kind < 6:
            run(c, 'SELECT public.idem_complete(%s, %s, %s, %s::jsonb)',
                (tenant, key, tok, RESPONSES[i % len(RESPONSES)] if i % 13 else None))
        elif kind < 8:
            run(c, 'SELECT public.idem_release(%s, %s, %s, %s::jsonb)',
                (tenant, key, tok, '{"error": "declined", "i": %d}' % i))
        else:
            processing[(tenant, key)] = tok
    counts = dict(rows(c, 'SELECT status, pg_catalog.count(*) FROM public.idempotency_records GROUP BY 1'))
    check(counts.get('completed', 0) == 180 and counts.get('failed', 0) == 60 and counts.get('processing', 0) == 60,
          '1.0 filled: 180 completed, 60 failed, 60 processing records (%r)' % counts)
    c.close()
    return processing


def all_replays(srv, db, keys):
    c = srv.connect(db)
    out = {k: claim(c, k[0], k[1]) for k in keys}
    c.close()
    return out


class Looper(threading.Thread):
    """Claims and completes fresh keys, one transaction each, until stopped."""

    def __init__(self, srv, db):
        super().__init__(daemon=True)
        self.srv, self.db = srv, db
        self.stop = threading.Event()
        self.done = []
        self.errors = []

    def run(self):
        c = self.srv.connect(self.db, autocommit=False, application_name='idem-upgrade-loop')
        i = 0
        while not self.stop.is_set():
            key = 'live-%06d' % i
            try:
                o, tok, _, _ = claim(c, 'loop', key)
                if o != 'claimed':
                    self.errors.append((key, o))
                else:
                    run(c, 'SELECT public.idem_complete(%s, %s, %s, %s::jsonb)',
                        ('loop', key, tok, '{"i": %d}' % i))
                c.commit()
                self.done.append(key)
            except psycopg2.Error as e:
                c.rollback()
                self.errors.append((key, e.pgcode, str(e).strip()))
            i += 1
            time.sleep(0.002)
        c.close()


def wait_update(srv, db, thread):
    """Waits for the ALTER EXTENSION thread to end, or to be seen waiting for
    a lock (then the holders must go first).  Returns the lock wait seen."""
    mon = srv.connect('postgres')
    seen = None
    while thread.is_alive():
        r = one(mon, """SELECT wait_event_type, wait_event FROM pg_catalog.pg_stat_activity
                        WHERE application_name = 'idem-upgrade-alter' AND state = 'active'""")
        if r and r[0] == 'Lock':
            seen = r
            break
        thread.join(0.05)
    mon.close()
    return seen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--host', default='127.0.0.1')
    ap.add_argument('--port', type=int, required=True)
    args = ap.parse_args()
    srv = Server(args.host, args.port)

    adm = srv.connect('postgres')
    for db in ('upg', 'fresh'):
        run(adm, 'DROP DATABASE IF EXISTS %s' % db)
        run(adm, 'CREATE DATABASE %s' % db)
    default = one(adm, "SELECT default_version FROM pg_catalog.pg_available_extensions WHERE name = 'idempotency'")[0]
    path = one(adm, """SELECT path FROM pg_catalog.pg_extension_update_paths('idempotency')
                       WHERE source = '1.0' AND target = %s""", (default,))
    check(default != '1.0' and path is not None and path[0] is not None,
          'the installed scripts lead from 1.0 to the default version %s (path %s)' % (default, path and path[0]))

    print('# 1.0 with the new library')
    u = srv.connect('upg')
    run(u, "CREATE EXTENSION idempotency VERSION '1.0'")
    library_works_on_10(srv, 'upg')

    print('# fill 1.0 and open live holders')
    processing = fill(srv, 'upg')
    settled = [k for k, r in records(u).items() if r[2] in ('completed', 'failed')]
    replays_before = all_replays(srv, 'upg', settled)
    before = records(u)
    check(all(r[0] in ('replay', 'failed') for r in replays_before.values()),
          'every completed/failed record replays before the update (%d)' % len(replays_before))

    # holder A: a claim held in an open transaction (its record not written yet)
    a = srv.connect('upg', autocommit=False, application_name='idem-upgrade-holder-a')
    a_tok = claim(a, 'hold', 'open-complete')[1]
    # holder A2: another open transaction that will release with a failure
    a2 = srv.connect('upg', autocommit=False, application_name='idem-upgrade-holder-a2')
    a2_tok = claim(a2, 'hold', 'open-release')[1]
    # holder P: a prepared transaction holding a claim
    p = srv.connect('upg', autocommit=False, application_name='idem-upgrade-holder-p')
    p_tok = claim(p, 'hold', 'prepared')[1]
    run(p, "PREPARE TRANSACTION 'idem_upgrade_p'")
    p.close()
    check(all((a_tok, a2_tok, p_tok)), 'three live holders: two open transactions and a prepared one')
    probe = srv.connect('upg')
    busy = [claim(probe, 'hold', k)[0] for k in ('open-complete', 'open-release', 'prepared')]
    check(busy == ['in_progress'] * 3, 'another session sees every live holder as in_progress (%r)' % busy)

    loop = Looper(srv, 'upg')
    loop.start()
    while len(loop.done) < 20 and loop.is_alive() and not loop.errors:
        time.sleep(0.01)

    print('# ALTER EXTENSION idempotency UPDATE with everything open')
    upd_error = []

    def do_update():
        c = srv.connect('upg', application_name='idem-upgrade-alter')
        try:
            run(c, 'ALTER EXTENSION idempotency UPDATE')
        except psycopg2.Error as e:
            upd_error.append(str(e).strip())
        c.close()

    ut = threading.Thread(target=do_update, daemon=True)
    ut.start()
    lock_wait = wait_update(srv, 'upg', ut)
    if lock_wait:
        # the update script takes a table lock an open claim holds: it waits
        # for the holders, which must still be able to finish first
        print('     note: the update waits for a lock (%s/%s) until the open holders end' % lock_wait)
    else:
        check(not upd_error, 'ALTER EXTENSION idempotency UPDATE ran while claims were held', upd_error)
        v = one(probe, "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'idempotency'")[0]
        check(v == default, 'the extension is now at %s (got %s)' % (default, v))
        busy = [claim(probe, 'hold', k)[0] for k in ('open-complete', 'open-release', 'prepared')]
        check(busy == ['in_progress'] * 3, 'after the update, every live holder is still in_progress (%r)' % busy)

    print('# the holders finish after the update')
    problems = []
    try:
        run(a, """SELECT public.idem_complete('hold', 'open-complete', %s, '{"a": "done"}')""", (a_tok,))
        a.commit()
    except psycopg2.Error as e:
        problems.append('A: %s' % e)
    try:
        run(a2, """SELECT public.idem_release('hold', 'open-release', %s, '{"a2": "failed"}')""", (a2_tok,))
        a2.commit()
    except psycopg2.Error as e:
        problems.append('A2: %s' % e)
    try:
        run(probe, "COMMIT PREPARED 'idem_upgrade_p'")
        run(probe, """SELECT public.idem_complete('hold', 'prepared', %s, '{"p": "done"}')""", (p_tok,))
    except psycopg2.Error as e:
        problems.append('P: %s' % e)
    if lock_wait:
        ut.join()
        check(not upd_error, 'ALTER EXTENSION idempotency UPDATE finished once the holders ended', upd_error)
        v = one(probe, "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'idempotency'")[0]
        check(v == default, 'the extension is now at %s (got %s)' % (default, v))
    # the committed processing claims: complete, heartbeat + complete, release, or leave
    finished = {}
    for n, ((tenant, key), tok) in enumerate(sorted(processing.items())):
        try:
            if n % 4 == 0:
                run(probe, "SELECT public.idem_complete(%s, %s, %s, %s::jsonb)",
                    (tenant, key, tok, '{"late": %d}' % n))
                finished[(tenant, key)] = ('replay', '{"late": %d}' % n)
            elif n % 4 == 1:
                run(probe, "SELECT public.idem_heartbeat(%s, %s, %s, '2 hours')", (tenant, key, tok))
                run(probe, "SELECT public.idem_complete(%s, %s, %s, NULL)", (tenant, key, tok))
                finished[(tenant, key)] = ('replay', None)
            elif n % 4 == 2:
                run(probe, "SELECT public.idem_release(%s, %s, %s, NULL)", (tenant, key, tok))
                finished[(tenant, key)] = ('gone', None)
        except psycopg2.Error as e:
            problems.append('%s/%s: %s' % (tenant, key, str(e).strip()))
    check(not problems, 'every holder finished with its token after the update: the open transactions '
          '(complete, release with failure), the prepared one, %d committed processing claims' % len(finished),
          problems)

    loop.stop.set()
    loop.join()
    check(not loop.errors and len(loop.done) > 20,
          'a session claimed and completed fresh keys throughout the update: %d keys, %d errors'
          % (len(loop.done), len(loop.errors)), loop.errors[:5])

    print('# records and replays after the update')
    after = records(u)
    untouched = [k for k in before if k not in finished]
    changed = [k for k in untouched if after.get(k) != before[k]]
    check(not changed, 'all %d records not finished since are byte-identical (every column)' % len(untouched),
          [(before[k], after.get(k)) for k in changed[:3]])
    replays_after = all_replays(srv, 'upg', settled)
    differ = [k for k in settled if replays_after[k] != replays_before[k]]
    check(not differ, 'all %d replays return the same outcome, response bytes and expiry' % len(settled),
          [(k, replays_before[k], replays_after[k]) for k in differ[:3]])
    still = [k for k in processing if k not in finished]
    stuck = [(k, claim(probe, k[0], k[1])[0]) for k in still]
    check(all(o == 'in_progress' for _, o in stuck), 'the %d processing claims left alone are still in_progress'
          % len(still), [s for s in stuck if s[1] != 'in_progress'][:3])
    wrong = []
    for k, (outcome, resp) in finished.items():
        r = claim(probe, k[0], k[1])
        if outcome == 'gone':
            if r[0] != 'claimed':
                wrong.append((k, r))
        elif r[0] != outcome or r[2] != resp:
            wrong.append((k, r))
    hold = [claim(probe, 'hold', k)[0:3] for k in ('open-complete', 'open-release', 'prepared')]
    want = [('replay', None, '{"a": "done"}'), ('failed', None, '{"a2": "failed"}'), ('replay', None, '{"p": "done"}')]
    check(not wrong and hold == want, 'what the holders finished replays as they finished it', (wrong[:3], hold))
    highest = max([one(probe, 'SELECT pg_catalog.max(token) FROM public.idempotency_records')[0],
                   a_tok, a2_tok, p_tok] + list(processing.values()))
    fresh_tok = claim(probe, 'after', 'update')[1]
    check(fresh_tok is not None and fresh_tok > highest,
          'a claim after the update gets a token above every token handed out before or during it',
          (fresh_tok, highest))
    lost = [k for k in loop.done if claim(probe, 'loop', k)[0] != 'replay']
    check(not lost, 'every key the loop completed across the update replays (%d)' % len(loop.done), lost[:5])

    print('# the upgraded objects equal a fresh install')
    f = srv.connect('fresh')
    run(f, 'CREATE EXTENSION idempotency')
    s_up, s_fresh = catalog.snapshot(u), catalog.snapshot(f)
    d = catalog.diff(s_up, s_fresh)
    check(not d, 'upgraded and fresh %s: the same %d objects, %d properties (members, columns, indexes, '
          'constraints, triggers, policies, functions, grants, config dump)'
          % (default, len(s_fresh), catalog.count_properties(s_fresh)), '\n'.join(d))
    uninspected = sorted({v['uninspected catalog'] for v in s_fresh.values() if 'uninspected catalog' in v})
    if uninspected:
        print('     note: members in %s are compared by presence only' % ', '.join(uninspected))
    for c in (u, f):
        run(c, "SELECT public.idem_set_tenant_isolation(true, 'app.tenant')")
        run(c, "SELECT public.idem_create_index(ARRAY['tenant_id', 'created_at'])")
    d = catalog.diff(catalog.snapshot(u), catalog.snapshot(f))
    check(not d, 'still equal with tenant isolation and an extra index switched on in both', '\n'.join(d))
    for c in (u, f):
        run(c, "SELECT public.idem_set_tenant_isolation(false)")
        run(c, "SELECT public.idem_drop_index('idempotency_records_tenant_id_created_at_idx')")
    d = catalog.diff(catalog.snapshot(u), catalog.snapshot(f))
    check(not d, 'and equal again once both are switched off', '\n'.join(d))

    print('# self-check: the comparison catches a different object')
    tampers = [
        ('a member missing', 'ALTER EXTENSION idempotency DROP FUNCTION public.idem_forget(text, text)',
         'idem_forget'),
        ('an extra member', 'CREATE FUNCTION public.idem_extra() RETURNS int LANGUAGE sql RETURN 1; '
                            'ALTER EXTENSION idempotency ADD FUNCTION public.idem_extra()', 'idem_extra'),
        ('a function attribute', 'ALTER FUNCTION public.idem_lookup(text, text) VOLATILE', 'idem_lookup'),
        ('a function signature', 'ALTER EXTENSION idempotency DROP FUNCTION public.idem_sweep(integer); '
                                 'DROP FUNCTION public.idem_sweep(integer); '
                                 "CREATE FUNCTION public.idem_sweep(bigint) RETURNS int LANGUAGE sql RETURN 1; "
                                 'ALTER EXTENSION idempotency ADD FUNCTION public.idem_sweep(bigint)', 'idem_sweep'),
        ('a column default', "ALTER TABLE public.idempotency_records ALTER COLUMN ttl SET DEFAULT '1 day'",
         'idempotency_records.ttl'),
        ('a missing column', 'ALTER TABLE public.idempotency_records ADD COLUMN extra int',
         'column idempotency_records.extra'),
        ('a column type', 'ALTER TABLE public.idempotency_records ALTER COLUMN fingerprint TYPE varchar',
         'fingerprint'),
        ('an index', 'CREATE INDEX idem_tamper_idx ON public.idempotency_records (status)', 'idem_tamper_idx'),
        ('a constraint', "ALTER TABLE public.idempotency_records ADD CONSTRAINT idem_tamper_ck CHECK (token > 0)",
         'idem_tamper_ck'),
        ('a grant', 'GRANT EXECUTE ON FUNCTION public.idem_claim(text, text, text, interval, interval, interval, text) '
                    'TO PUBLIC', 'idem_claim'),
        ('row-level security', 'ALTER TABLE public.idempotency_records ENABLE ROW LEVEL SECURITY',
         'row_security'),
        ('a config dump mark', "UPDATE pg_catalog.pg_extension SET extconfig = extconfig[1:1], "
                               "extcondition = extcondition[1:1] WHERE extname = 'idempotency'", 'config_dump'),
        ('a comment', "COMMENT ON FUNCTION public.idem_claim_many(text, text[], text[], interval, interval) "
                      "IS 'x'", 'idem_claim_many'),
        ('a view', 'CREATE OR REPLACE VIEW public.idem_stats AS SELECT * FROM public.idem_stats_read() '
                   'WHERE claims > 0', 'idem_stats'),
        ('the type of a result column', 'ALTER TYPE public.idem_claim_result ALTER ATTRIBUTE outcome TYPE varchar',
         'outcome'),
    ]
    f.autocommit = False
    missed = []
    for what, sql, needle in tampers:
        try:
            run(f, sql)
            dd = catalog.diff(catalog.snapshot(f), s_fresh, 'tampered', 'fresh')
        except psycopg2.Error as e:
            dd = None
            missed.append('%s: the tamper itself failed: %s' % (what, str(e).strip()))
        f.rollback()
        if dd is not None and not any(needle in line for line in dd):
            missed.append('%s: not reported (%r)' % (what, dd[:3]))
    check(not missed, 'the comparison reports each of %d deliberately different objects' % len(tampers), missed)
    f.autocommit = True
    check(not catalog.diff(catalog.snapshot(f), s_fresh), 'and nothing once they are rolled back')

    for c in (a, a2, u, f, probe, adm):
        c.close()
    result_line('UPGRADE-RESULT')


if __name__ == '__main__':
    try:
        main()
    except Exception as e:  # an unexpected error counts as a failure, with its trace
        import traceback
        traceback.print_exc()
        check(False, 'upgrade.py ended with an unexpected error: %s' % e)
        result_line('UPGRADE-RESULT')
        sys.exit(1)
    sys.exit(1 if common.failed else 0)
