#!/usr/bin/env python3
"""The focused contract of the SQL edition (run by test/suites/36-sql-edition).

Runs against a server that does NOT load the C library, where the SQL
edition was installed with psql -f into --schema by --owner (not a
superuser).  Each check prints "ok" or "FAIL"; the last line is
CONTRACT-RESULT passed=N failed=M.

The C edition's regression files (sql/*.sql) are not reused in this slice:
their expected output holds the C edition's held claims, shared-memory
statistics and error CONTEXT lines, so here the behaviour they pin down is
asserted directly, and test/sql-edition/differential.py compares the two
editions call by call.
"""
import os
import re
import sys
import threading
import time

import psycopg2
import psycopg2.errors

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'upgrade'))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
import common  # noqa: E402  (test/upgrade/common.py: counted checks, query helpers)
from common import check, rows  # noqa: E402

args = None
# the SQL edition's SECURITY DEFINER helpers (docs/managed.md, "Grants")
DEFINER_HELPERS = ('idem_sql_fresh_tokens(integer)', 'idem_sql_successor_token(bigint)',
                   'idem_sql_isolation_setting()', 'idem_sql_tenant_keylock(text, text)')
# and the monitoring functions of 1.3, EXECUTE to pg_monitor (as the C edition's)
MONITORING = ('idem_metrics()', 'idem_metrics_tenants(integer)')


def connect(user, autocommit=True, options=None):
    conn = psycopg2.connect(host=args.host, port=args.port, dbname=args.dbname, user=user,
                            options='-c search_path=%s%s' % (args.schema, ' ' + options if options else ''))
    conn.autocommit = autocommit
    return conn


def one(conn, sql, params=None):
    """The first row, or None for a statement without a result (SET, GRANT)."""
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone() if cur.description else None


def error(conn, sql, params=None):
    """(sqlstate, primary message) of a failing statement, or None."""
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
    except psycopg2.Error as e:
        if not conn.autocommit:
            conn.rollback()
        return (e.pgcode, e.diag.message_primary)
    return None


def claim(conn, tenant, key, fp=None, lease=None, ttl=None, wait=None, holder=None):
    return one(conn, 'SELECT outcome, token, response, expires_at, recovery_point, state'
                     ' FROM idem_claim(%s, %s, %s, %s::interval, %s::interval, %s::interval, %s)',
               (tenant, key, fp, lease, ttl, wait, holder))


def reentry(su, owner, app):
    """Re-entrant claims (1.4, issue 47): a claim with a holder answers claimed
    again, with the same token and lease, to the same holder while its lease
    lasts, and in_progress to everyone else; a takeover after the lease is
    anyone's and fences the old token; the holder is stored, shown by
    idem_lookup, checked like a key; tenant isolation still confines."""
    def row(key, tenant='re'):
        return one(su, "SELECT token, lease_expires_at, expires_at, updated_at, holder, xmin::text, ctid::text"
                       " FROM idempotency_records WHERE tenant_id = %s AND key = %s", (tenant, key))

    c = claim(app, 're', 'k1', holder='run-1')
    before = row('k1')
    check(c[0] == 'claimed' and before[4] == 'run-1', 'a fresh claim with a holder stores it', (c, before))
    again = claim(app, 're', 'k1', holder='run-1')
    check(again == ('claimed', c[1], None, before[1], None, None),
          're-entry: the same holder gets claimed, the same token, expires_at the record\'s lease end', (c, again))
    check(row('k1') == before, 're-entry writes nothing (the row version, lease and updated_at unchanged)',
          (before, row('k1')))
    r = claim(app, 're', 'k1', holder='run-2')
    check(r[0] == 'in_progress' and r[1] is None and r[3] == before[1], 'another holder: in_progress, the lease end', r)
    r = claim(app, 're', 'k1')
    check(r[0] == 'in_progress' and r[1] is None, 'no holder: in_progress', r)
    check(row('k1') == before, 'and neither writes', row('k1'))
    t0 = time.time()
    r = claim(app, 're', 'k1', wait='2 s', holder='run-1')
    check(r[0] == 'claimed' and r[1] == c[1] and time.time() - t0 < 1.5,
          're-entry with a wait answers at once (it does not wait for its own claim)', (r, time.time() - t0))
    r = claim(app, 're', 'k1', wait='100 ms', holder='run-2')
    check(r[0] == 'in_progress', 'another holder with a wait: in_progress once the wait is over', r)
    # a claim stored without a holder is re-entered by no one
    n = claim(app, 're', 'k-none')
    check(n[0] == 'claimed' and row('k-none')[4] is None and claim(app, 're', 'k-none', holder='run-1')[0] == 'in_progress'
          and claim(app, 're', 'k-none')[0] == 'in_progress',
          'a claim made without a holder: the holder is NULL and no one re-enters it, with a holder or without', row('k-none'))

    # the fingerprint is checked first
    f = claim(app, 're', 'k-fp', fp='fp-a', holder='run-1')
    check(claim(app, 're', 'k-fp', fp='fp-b', holder='run-1')[0] == 'mismatch' and
          claim(app, 're', 'k-fp', fp='fp-a', holder='run-1')[:2] == ('claimed', f[1]) and
          claim(app, 're', 'k-fp', holder='run-1')[:2] == ('claimed', f[1]),
          'the same holder with another fingerprint: mismatch; with the same or none: re-entry', f)

    # the recovery point and state, as a takeover hands them on; a heartbeat's lease
    p = claim(app, 're', 'k-point', holder='run-1')
    one(app, "SELECT idem_checkpoint('re', 'k-point', %s, 'step-2', '{\"n\": 2}')", (p[1],))
    hb = one(app, "SELECT idem_heartbeat('re', 'k-point', %s, '10 minutes')", (p[1],))[0]
    r = claim(app, 're', 'k-point', holder='run-1')
    check(r == ('claimed', p[1], None, hb, 'step-2', {'n': 2}),
          're-entry after a checkpoint and a heartbeat: the recovery point, the state and the heartbeat\'s lease end', r)

    # complete (with the token both calls got); the completed record keeps its holder and replays
    one(app, "SELECT idem_complete('re', 'k1', %s, '{\"ok\": 1}')", (c[1],))
    r = claim(app, 're', 'k1', holder='run-1')
    check(r[0] == 'replay' and r[2] == {'ok': 1} and row('k1')[4] == 'run-1',
          'completed: the same holder gets the replay, and the record keeps its holder', (r, row('k1')))

    # in one transaction: the claim it wrote is re-entered too
    tx = connect('app', autocommit=False)
    a = claim(tx, 're', 'k-tx', holder='run-tx')
    b = claim(tx, 're', 'k-tx', holder='run-tx')
    o = claim(tx, 're', 'k-tx', holder='run-other')
    tx.commit()
    tx.close()
    check(a[0] == 'claimed' and b[:2] == ('claimed', a[1]) and o[0] == 'in_progress',
          'in the claiming transaction: the same holder re-enters, another is in_progress', (a, b, o))

    # after the lease: the normal takeover, for the same holder or another
    for who, then in (('run-1', 'run-1'), ('run-1', 'run-2'), ('run-1', None), (None, 'run-2')):
        key = 'k-lease-%s-%s' % (who, then)
        old = claim(app, 're', key, lease='1 ms', holder=who)[1]
        time.sleep(0.01)
        new = claim(app, 're', key, holder=then)
        e = error(app, "SELECT idem_complete('re', %s, %s)", (key, old))
        check(new[0] == 'claimed' and new[1] > old and row(key)[4] == then and row(key)[0] == new[1] and
              e is not None and e[0] == 'ID002' and claim(app, 're', key, holder=then)[0] ==
              ('claimed' if then else 'in_progress'),
              'lease over, held by %s: %s takes it over with a new token, the holder stored is %s, the old token'
              ' is fenced (ID002)' % (who or 'no holder', then or 'a claim without a holder', then or 'NULL'),
              (old, new, row(key), e))
    # a recovery point handed on by a takeover after the lease, re-entered by the new holder
    p = claim(app, 're', 'k-resume', lease='1 ms', holder='run-1')
    one(app, "SELECT idem_checkpoint('re', 'k-resume', %s, 'step-1')", (p[1],))
    time.sleep(0.01)
    t = claim(app, 're', 'k-resume', holder='run-2')
    check(t[0] == 'claimed' and t[1] > p[1] and t[4] == 'step-1' and
          claim(app, 're', 'k-resume', holder='run-2')[:2] == ('claimed', t[1]) and
          claim(app, 're', 'k-resume', holder='run-1')[0] == 'in_progress',
          'a takeover of a resumable claim by another holder: it re-enters, the old holder is in_progress', t)

    # idem_claim_many takes no holder: its claims store none
    many = rows(app, "SELECT key, outcome FROM idem_claim_many('re', ARRAY['k1', 'k-fp', 'k-many'])")
    check(many == [('k1', 'replay'), ('k-fp', 'in_progress'), ('k-many', 'claimed')] and row('k-many')[4] is None,
          'idem_claim_many: a held claim is in_progress to it, and its own claims have no holder', many)

    # idem_lookup shows the holder
    check(rows(app, "SELECT status, holder FROM idem_lookup('re', 'k-fp')") == [('processing', 'run-1')] and
          rows(app, "SELECT holder FROM idem_lookup('re', 'k-none')") == [(None,)],
          'idem_lookup shows the holder (NULL without one)')

    # bad holders: as a key or fingerprint is checked
    for sql, want, what in (
            ("SELECT idem_claim('re', 'bad', holder => '')", ('22023', 'holder must not be empty'), 'empty'),
            ("SELECT idem_claim('re', 'bad', holder => repeat('h', 256))", ('22001', 'holder is too long'),
             '256 bytes'),
            ("SELECT idem_claim('re', 'bad', holder => repeat('é', 128))", ('22001', 'holder is too long'),
             '128 two-byte characters (bytes count)'),
            ("SELECT idem_claim('re', 'bad', 'fp', holder => '')", ('22023', 'holder must not be empty'),
             'empty, after a valid fingerprint'),
            ("SELECT idem_claim('re', '', holder => '')", ('22023', 'key must not be empty'),
             'empty with an empty key: the key is checked first'),
            ("SELECT idem_claim('re', 'bad', lease => '0', holder => '')", ('22023', 'lease must be positive'),
             'empty with a lease of 0: the lease is checked first, as in the C edition')):
        e = error(app, sql)
        check(e == want, 'holder %s: %s %s' % (what, want[0], want[1]), e)
    e = None
    try:
        with app.cursor() as cur:
            cur.execute("SELECT idem_claim('re', 'bad', holder => repeat('h', 256))")
    except psycopg2.Error as ex:
        e = ex.diag.message_detail
    check(e == 'holder has 256 bytes; the limit is 255.', 'its detail names the length and the limit', e)
    check(claim(app, 're', 'h255', holder='h' * 255)[0] == 'claimed' and row('h255')[4] == 'h' * 255 and
          one(su, "SELECT count(*) FROM idempotency_records WHERE key = 'bad'")[0] == 0,
          'a holder of 255 bytes is stored; the refused calls wrote nothing')

    # tenant isolation: re-entry inside the session's tenant only
    one(owner, "SELECT idem_set_tenant_isolation(true)")
    iso = connect('app')
    one(iso, "SET app.tenant = 're-a'")
    a = claim(iso, 're-a', 'k', holder='run-1')
    b = claim(iso, 're-a', 'k', holder='run-1')
    e = error(iso, "SELECT idem_claim('re-b', 'k', holder => 'run-1')")
    bad = error(iso, "SELECT idem_claim('re-b', 'k', holder => '')")
    one(iso, "SET app.tenant = 're-b'")
    o = claim(iso, 're-b', 'k', holder='run-1')
    check(a[0] == 'claimed' and b[:2] == ('claimed', a[1]) and
          e == ('42501', 'tenant isolation confines this session to tenant "re-a", not "re-b"') and
          bad == ('22023', 'holder must not be empty') and o[0] == 'claimed' and o[1] != a[1] and
          rows(iso, "SELECT tenant_id, holder FROM idempotency_records WHERE key = 'k'") == [('re-b', 'run-1')],
          'tenant isolation on: re-entry in the session\'s tenant; another tenant refused (42501, an empty holder'
          ' 22023 first); the same key and holder in another tenant is a claim of its own', (a, b, e, bad, o))
    iso.close()
    one(owner, "SELECT idem_set_tenant_isolation(false)")


def metrics(su, owner, app, op, nobody, cron_ran):
    """idem_metrics() and idem_metrics_tenants(top) (1.3): each gauge moved by a
    real load, the sweeper's columns from pg_cron, the lock table's fill, no
    counters (NULL), who may call, 22023."""
    s = args.schema
    one(su, 'DROP ROLE IF EXISTS idem_scraper')
    one(su, 'CREATE ROLE idem_scraper LOGIN IN ROLE pg_monitor')
    one(owner, 'GRANT USAGE ON SCHEMA %s TO idem_scraper' % s)
    mon = connect('idem_scraper')
    cols = ('claims_in_progress', 'oldest_claim_age_seconds', 'stuck_claims', 'resumable_records',
            'expired_unswept_records')

    def gauges(conn=mon):
        return one(conn, 'SELECT ' + ', '.join(cols) + ' FROM idem_metrics()')

    one(su, 'DELETE FROM idempotency_records')
    check(gauges() == (0, 0.0, 0, 0, 0), 'idem_metrics() on an empty table: every gauge 0', gauges())
    r = one(mon, 'SELECT datname, claimed_total, replays_total, in_progress_total, mismatches_total, failed_total,'
                 ' takeovers_total, last_sweep_removed, stats_reset FROM idem_metrics()')
    check(r == (args.dbname,) + (None,) * 8, 'the counters, last_sweep_removed and stats_reset are NULL'
          ' (no shared memory: docs/managed.md difference 2)', r)
    # the sweeper's columns: pg_cron's runs of this schema's idem_sweep
    runs = one(su, "SELECT count(*), count(*) FILTER (WHERE status = 'failed'), max(start_time)"
                   " FROM cron.job_run_details WHERE database = current_database()"
                   " AND command LIKE %s AND status IN ('succeeded', 'failed')",
               ('SELECT * FROM %s.idem_sweep(%%' % s,)) if one(su, "SELECT to_regclass('cron.job_run_details')")[0] \
        else None
    r = one(mon, 'SELECT sweeps_total, sweep_errors_total, last_sweep_at, last_sweep_seconds >= 0 FROM idem_metrics()')
    if runs is None:
        check(r == (None, None, None, None), 'without pg_cron the sweeper\'s columns are NULL', r)
    else:
        check(r[:3] == runs and (r[3] is None) == (runs[2] is None) and (runs[0] >= 1 or not cron_ran),
              'sweeps_total, sweep_errors_total, last_sweep_at: pg_cron\'s finished runs of idem_sweep (%d%s)'
              % (runs[0], ', the job pg_cron ran above' if cron_ran else ''), (r, runs))

    # a load: 20 live claims in three tenants, 2 stuck, 1 resumable, 4 expired
    t0 = time.time()
    for tenant, n in (('mtr1', 12), ('mtr2', 5), ('mtr3', 3)):
        for i in range(n):
            claim(app, tenant, 'live-%d' % i)
    check(gauges()[0] == 20 and gauges()[2:] == (0, 0, 0), '20 claims: claims_in_progress 20, nothing else',
          gauges())
    for i in range(2):
        claim(app, 'mtr2', 'stuck-%d' % i, lease='1 ms')
    t = claim(app, 'mtr3', 'multi', lease='1 ms')[1]
    one(app, "SELECT idem_checkpoint('mtr3', 'multi', %s, 'step-1', NULL, '1 ms')", (t,))
    for i in range(4):
        t = claim(app, 'mtr1', 'short-%d' % i, ttl='1 ms')[1]
        one(app, "SELECT idem_complete('mtr1', %s, %s)", ('short-%d' % i, t))
    time.sleep(0.1)
    g = gauges()
    check(g[0] == 22 and g[2:] == (2, 1, 4), 'claims_in_progress 22 (stuck ones included), stuck_claims 2,'
          ' resumable_records 1, expired_unswept_records 4', g)
    check(0.1 <= g[1] <= time.time() - t0 + 0.01, 'oldest_claim_age_seconds: the age of the first claim', g[1])
    time.sleep(0.2)
    check(gauges()[1] >= g[1] + 0.2, 'and it grows', (g[1], gauges()[1]))
    ten = rows(mon, 'SELECT tenant, claims_in_progress, oldest_claim_age_seconds > 0, conflicts_total'
                    ' FROM idem_metrics_tenants(2)')
    check(ten == [('mtr1', 12, True, None), ('mtr2', 7, True, None)],
          'idem_metrics_tenants(2): the two tenants with the most claims in progress, conflicts_total NULL', ten)
    check(len(rows(mon, 'SELECT * FROM idem_metrics_tenants()')) == 3 and
          rows(mon, 'SELECT tenant FROM idem_metrics_tenants(100)') == [('mtr1',), ('mtr2',), ('mtr3',)],
          'the default (10) and top = 100: every tenant with claims in progress, the busiest first')
    # the sweep takes the stuck claims and the expired records; the resumable one stays
    one(op, 'SELECT idem_sweep()')
    check(gauges()[0] == 20 and gauges()[2:] == (0, 1, 0), 'after idem_sweep(): 20 claims, none stuck, 1 resumable,'
          ' nothing expired left', gauges())
    for i in range(5):
        one(app, "SELECT idem_complete('mtr1', %s, (SELECT token FROM idem_lookup('mtr1', %s)))",
            ('live-%d' % i, 'live-%d' % i))
    check(gauges()[0] == 15, 'completing 5 claims: 15 in progress', gauges())

    # under tenant isolation, pg_monitor counts every tenant, without any right on the table
    one(owner, "SELECT idem_set_tenant_isolation(true)")
    check(gauges()[0] == 15 and len(rows(mon, 'SELECT * FROM idem_metrics_tenants(10)')) == 3,
          'isolation on: a pg_monitor member still counts every tenant\'s claims (SECURITY DEFINER)', gauges())
    e = error(mon, 'SELECT count(*) FROM idempotency_records')
    check(e is not None and e[0] == '42501', 'while it may not read the table (42501)', e)
    one(owner, "SELECT idem_set_tenant_isolation(false)")
    for who, conn in (('the application role', app), ('a role without grants', nobody)):
        for call in ('SELECT * FROM idem_metrics()', 'SELECT * FROM idem_metrics_tenants()'):
            e = error(conn, call)
            check(e is not None and e[0] == '42501', '%s may not call %s (42501: pg_monitor only)'
                  % (who, call.split()[3]), e)
    for top in ('0', '101', 'NULL', '-1'):
        e = error(mon, 'SELECT * FROM idem_metrics_tenants(%s)' % top)
        check(e == ('22023', 'top must be between 1 and 100'), 'idem_metrics_tenants(%s): 22023' % top, e)

    # the lock table's fill moves with the locks a transaction holds
    before = one(mon, 'SELECT lock_table_used_ratio FROM idem_metrics()')[0]
    locker = connect('idem_scraper', autocommit=False)
    one(locker, 'SELECT count(pg_advisory_xact_lock(i)) FROM generate_series(1, 2000) i')
    during = one(mon, 'SELECT lock_table_used_ratio FROM idem_metrics()')[0]
    locker.rollback()
    locker.close()
    after = one(mon, 'SELECT lock_table_used_ratio FROM idem_metrics()')[0]
    check(0 <= before < 0.1 and before + 0.1 < during < 1 and after < during - 0.1,
          'lock_table_used_ratio: 2,000 advisory locks held move it up, releasing them down', (before, during, after))
    mon.close()
    one(su, 'DELETE FROM idempotency_records')
    one(owner, 'REVOKE ALL ON SCHEMA %s FROM idem_scraper' % s)
    one(su, 'DROP ROLE idem_scraper')


def run():
    owner = connect(args.owner)
    su = connect('postgres')

    # ---- roles with exactly docs/privileges.md's grants
    for r in ('app', 'idem_operator', 'nobody'):
        one(su, 'DROP ROLE IF EXISTS %s' % r)
        one(su, 'CREATE ROLE %s LOGIN' % r)
    s = args.schema
    one(owner, 'GRANT USAGE ON SCHEMA %s TO app, idem_operator, nobody' % s)
    one(owner, 'GRANT EXECUTE ON FUNCTION idem_claim(text, text, text, interval, interval, interval, text),'
               ' idem_claim_many(text, text[], text[], interval, interval),'
               ' idem_complete(text, text, bigint, jsonb), idem_release(text, text, bigint, jsonb),'
               ' idem_heartbeat(text, text, bigint, interval),'
               ' idem_checkpoint(text, text, bigint, text, jsonb, interval),'
               ' idem_child_key(text, text, text), idem_lookup(text, text) TO app')
    one(owner, 'GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_records TO app')
    one(owner, 'GRANT EXECUTE ON FUNCTION idem_lookup(text, text), idem_forget(text, text),'
               ' idem_sweep(integer), idem_record_states(), idem_stats_read(), idem_stats_reset(),'
               ' idem_node_stats(), idem_cluster_stats() TO idem_operator')
    one(owner, 'GRANT SELECT, UPDATE, DELETE ON idempotency_records TO idem_operator')
    one(owner, 'GRANT SELECT ON idem_stats TO idem_operator')
    # and docs/managed.md's "Grants": the SECURITY DEFINER helpers, not PUBLIC's
    one(owner, 'GRANT EXECUTE ON FUNCTION ' + ', '.join(DEFINER_HELPERS) + ' TO app')
    one(owner, 'GRANT EXECUTE ON FUNCTION idem_sql_isolation_setting(), idem_sql_tenant_keylock(text, text)'
               ' TO idem_operator')
    app = connect('app')
    op = connect('idem_operator')
    nobody = connect('nobody')

    # ---- the objects: names, argument names, defaults, result columns as the C edition's 1.2
    sigs = dict(rows(su, "SELECT p.proname, pg_get_function_arguments(p.oid) || ' -> ' ||"
                         " pg_get_function_result(p.oid) FROM pg_proc p"
                         " WHERE p.pronamespace = %s::regnamespace AND p.proname LIKE 'idem\\_%%'"
                         " AND p.proname NOT LIKE 'idem\\_sql\\_%%'", (s,)))
    expected = {
        'idem_claim': 'tenant_id text, key text, fingerprint text DEFAULT NULL::text, lease interval DEFAULT NULL::interval, ttl interval DEFAULT NULL::interval, wait interval DEFAULT NULL::interval, holder text DEFAULT NULL::text -> idem_claim_result',
        'idem_claim_many': 'tenant_id text, keys text[], fingerprints text[] DEFAULT NULL::text[], lease interval DEFAULT NULL::interval, ttl interval DEFAULT NULL::interval, OUT key text, OUT outcome text, OUT token bigint, OUT response jsonb, OUT expires_at timestamp with time zone, OUT recovery_point text, OUT state jsonb -> SETOF record',
        'idem_complete': 'tenant_id text, key text, token bigint, response jsonb DEFAULT NULL::jsonb -> void',
        'idem_release': 'tenant_id text, key text, token bigint, failure jsonb DEFAULT NULL::jsonb -> void',
        'idem_heartbeat': 'tenant_id text, key text, token bigint, lease interval DEFAULT NULL::interval -> timestamp with time zone',
        'idem_checkpoint': 'tenant_id text, key text, token bigint, point text, state jsonb DEFAULT NULL::jsonb, lease interval DEFAULT NULL::interval -> void',
        'idem_child_key': 'tenant_id text, key text, step text -> text',
        'idem_lookup': 'tenant_id text, key text, OUT status text, OUT token bigint, OUT response jsonb, OUT fingerprint text, OUT lease_expires_at timestamp with time zone, OUT expires_at timestamp with time zone, OUT created_at timestamp with time zone, OUT updated_at timestamp with time zone, OUT recovery_point text, OUT state jsonb, OUT holder text -> SETOF record',
        'idem_forget': 'tenant_id text, key text -> boolean',
        'idem_sweep': 'batch_size integer DEFAULT NULL::integer, OUT expired_removed bigint, OUT stale_released bigint, OUT stale_failed bigint -> record',
        'idem_record_states': 'OUT state text, OUT records bigint, OUT oldest_updated_at timestamp with time zone, OUT next_expires_at timestamp with time zone -> SETOF record',
        'idem_set_tenant_isolation': "enabled boolean, setting text DEFAULT 'app.tenant'::text -> boolean",
        'idem_create_index': 'columns text[], index_name text DEFAULT NULL::text -> text',
        'idem_drop_index': 'index_name text -> boolean',
        'idem_current_tenant': 'setting text -> text',
        'idem_distribute': 'shard_count integer DEFAULT NULL::integer -> void',
        'idem_metrics': 'OUT datname text, OUT claimed_total bigint, OUT replays_total bigint, OUT in_progress_total bigint, OUT mismatches_total bigint, OUT failed_total bigint, OUT takeovers_total bigint, OUT claims_in_progress bigint, OUT oldest_claim_age_seconds double precision, OUT stuck_claims bigint, OUT resumable_records bigint, OUT expired_unswept_records bigint, OUT sweeps_total bigint, OUT sweep_errors_total bigint, OUT last_sweep_at timestamp with time zone, OUT last_sweep_seconds double precision, OUT last_sweep_removed bigint, OUT lock_table_used_ratio double precision, OUT stats_reset timestamp with time zone -> record',
        'idem_metrics_tenants': 'top integer DEFAULT 10, OUT tenant text, OUT claims_in_progress bigint, OUT oldest_claim_age_seconds double precision, OUT conflicts_total bigint -> SETOF record',
    }
    for name, sig in expected.items():
        check(sigs.get(name) == sig, 'signature of %s' % name, sigs.get(name))
    for name in ('idem_stats_read', 'idem_stats_reset', 'idem_node_stats', 'idem_cluster_stats',
                 'idem_apply_tenant_isolation', 'idem_apply_extra_index',
                 'idem_schedule_sweep', 'idem_unschedule_sweep'):
        check(name in sigs, '%s exists' % name)
    cols = rows(su, "SELECT attname, format_type(atttypid, atttypmod), attnotnull,"
                    " coalesce((SELECT collname FROM pg_collation WHERE oid = attcollation), '')"
                    " FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 ORDER BY attnum",
                (s + '.idempotency_records',))
    check(cols == [('token', 'bigint', True, ''), ('expires_at', 'timestamp with time zone', True, ''),
                   ('lease_expires_at', 'timestamp with time zone', False, ''),
                   ('created_at', 'timestamp with time zone', True, ''),
                   ('updated_at', 'timestamp with time zone', True, ''), ('ttl', 'interval', True, ''),
                   ('tenant_id', 'text', True, 'C'), ('key', 'text', True, 'C'),
                   ('status', 'text', True, 'default'), ('fingerprint', 'text', False, 'default'),
                   ('response', 'jsonb', False, ''), ('recovery_point', 'text', False, 'default'),
                   ('state', 'jsonb', False, ''), ('holder', 'text', False, 'C')],
          'idempotency_records has the C edition\'s columns, order, types, collations', cols)
    check(rows(su, "SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                   " WHERE i.indrelid = %s::regclass ORDER BY 1", (s + '.idempotency_records',)) ==
          [('idempotency_records_expires_at_idx',), ('idempotency_records_pkey',)],
          'the table has the primary key and the expiry index, nothing else')

    # ---- outcomes, as the application role with exactly its grants
    c = claim(app, 'acme', 'order-1', 'fp-a')
    check(c[0] == 'claimed' and c[1] > 0 and c[2] is None and c[3] is not None and c[4] is None,
          'a fresh key is claimed with a token and a lease', c)
    t1 = c[1]
    check(one(app, "SELECT lease_expires_at = expires_at AND lease_expires_at BETWEEN now() + interval '4 min 50 s'"
                   " AND now() + interval '5 min 10 s' AND ttl = interval '24 hours' AND status = 'processing'"
                   " FROM idempotency_records WHERE tenant_id = 'acme' AND key = 'order-1'")[0],
          'the record: processing, default lease 5 min, ttl 24 h')
    c = claim(app, 'acme', 'order-1', 'fp-a')
    check(c[0] == 'in_progress' and c[1] is None and c[3] is not None, 'a live claim is in_progress with its lease end', c)
    check(claim(app, 'globex', 'order-1', 'fp-b')[0] == 'claimed', 'the same key in another tenant is independent')
    check(claim(app, 'acme', 'order-1', 'fp-other')[0] == 'mismatch', 'another fingerprint is a mismatch, also while processing')
    one(app, "SELECT idem_complete('acme', 'order-1', %s, %s::jsonb)", (t1, '{"status": 201, "body": {"n": [1, {"a": null}]}}'))
    c = claim(app, 'acme', 'order-1', 'fp-a')
    check(c[0] == 'replay' and c[1] is None and c[2] == {"status": 201, "body": {"n": [1, {"a": None}]}},
          'completed: replay of the stored response', c)
    check(one(app, "SELECT r.response::text = c.response::text AND jsonb_send(r.response) = jsonb_send(c.response)"
                   " FROM idempotency_records r, idem_claim('acme', 'order-1') c"
                   " WHERE r.tenant_id = 'acme' AND r.key = 'order-1'")[0], 'the replay is byte-identical jsonb')
    check(claim(app, 'acme', 'order-1', None)[0] == 'replay', 'a NULL fingerprint skips the check')
    check(claim(app, 'acme', 'order-1', 'x')[0] == 'mismatch', 'a different fingerprint on a completed record is a mismatch')
    e = error(app, "SELECT idem_complete('acme', 'order-1', %s)", (t1,))
    check(e == ('ID003', 'cannot complete: the key is already completed'), 'complete twice: ID003', e)
    e = error(app, "SELECT idem_complete('acme', 'nokey', 5)")
    check(e == ('ID001', 'cannot complete: no record exists for this key'), 'complete of no record: ID001', e)
    t = claim(app, 'acme', 'order-2', 'fp')[1]
    one(app, "SELECT idem_release('acme', 'order-2', %s, failure => '{\"error\": \"card_declined\"}')", (t,))
    c = claim(app, 'acme', 'order-2', 'fp')
    check(c[0] == 'failed' and c[2] == {"error": "card_declined"}, 'released with a failure: failed, replayed', c)
    t = claim(app, 'acme', 'order-3')[1]
    one(app, "SELECT idem_release('acme', 'order-3', %s)", (t,))
    check(one(app, "SELECT count(*) FROM idempotency_records WHERE key = 'order-3'")[0] == 0,
          'a release without failure deletes the record')
    c = claim(app, 'acme', 'order-3')
    check(c[0] == 'claimed' and c[1] > t + 1, 'the key is claimed again with a larger fresh token (> old + 1)', (t, c[1]))
    e = error(app, "SELECT idem_release('acme', 'order-3', %s)", (t,))
    check(e is not None and e[0] == 'ID002' and e[1] == 'cannot release: token %d does not hold this key' % t,
          'the old token is fenced off: ID002', e)

    # ---- in one transaction: a second claim is in_progress; after a release, claimed again
    tx = connect('app', autocommit=False)
    a = claim(tx, 'acme', 'same-tx')
    b = claim(tx, 'acme', 'same-tx')
    one(tx, "SELECT idem_release('acme', 'same-tx', %s)", (a[1],))
    c = claim(tx, 'acme', 'same-tx')
    tx.commit()
    check(a[0] == 'claimed' and b[0] == 'in_progress' and c[0] == 'claimed' and c[1] > a[1],
          'same transaction: claimed, in_progress, release, claimed with a larger token', (a[0], b[0], c[0]))
    # own claim past its lease in the same transaction is still ours
    a = claim(tx, 'acme', 'own-stale', lease='1 ms')
    time.sleep(0.01)
    b = claim(tx, 'acme', 'own-stale')
    tx.rollback()
    check(a[0] == 'claimed' and b[0] == 'in_progress', 'a claim of our own transaction past its lease is in_progress, not taken over', b)

    # ---- leases, takeover, heartbeat, fencing of a zombie
    z = claim(app, 'acme', 'lease-1', 'fp', lease='50 ms')
    time.sleep(0.1)
    n = claim(app, 'acme', 'lease-1', 'fp')
    check(n[0] == 'claimed' and n[1] == z[1] + 1, 'an expired lease is taken over with the old token + 1', (z[1], n[1]))
    e = error(app, "SELECT idem_complete('acme', 'lease-1', %s, '{}')", (z[1],))
    check(e is not None and e[0] == 'ID002', 'the zombie cannot complete (ID002)', e)
    e = error(app, "SELECT idem_heartbeat('acme', 'lease-1', %s)", (z[1],))
    check(e is not None and e[0] == 'ID002' and e[1].startswith('cannot heartbeat: token'), 'nor heartbeat', e)
    h = one(app, "SELECT idem_heartbeat('acme', 'lease-1', %s, '1 hour') BETWEEN now() + interval '59 min' AND now() + interval '61 min'", (n[1],))[0]
    check(h and one(app, "SELECT lease_expires_at = expires_at AND lease_expires_at > now() + interval '59 min'"
                         " FROM idempotency_records WHERE key = 'lease-1'")[0], 'a heartbeat extends the lease and returns its end')
    z = claim(app, 'acme', 'lease-2', lease='10 ms')
    time.sleep(0.03)
    one(app, "SELECT idem_complete('acme', 'lease-2', %s, '\"late\"')", (z[1],))
    check(claim(app, 'acme', 'lease-2')[0] == 'replay', 'a holder past its lease that nobody took over may still complete')

    # ---- stale_action = fail (a placeholder setting here)
    one(app, "SET idempotency.stale_action = 'fail'")
    claim(app, 'acme', 'stale-f', lease='10 ms')
    time.sleep(0.03)
    c = claim(app, 'acme', 'stale-f')
    check(c[0] == 'failed' and c[2] == {"error": "lease_expired"}, "stale_action = 'fail': the stale claim becomes failed", c)
    one(app, "RESET idempotency.stale_action")

    # ---- recovery points (1.1/1.2)
    t = claim(app, 'acme', 'multi', 'fp', lease='30 ms', ttl='1 hour')[1]
    one(app, "SELECT idem_checkpoint('acme', 'multi', %s, 'charged', '{\"charge\": \"ch_1\"}')", (t,))
    check(one(app, "SELECT expires_at = lease_expires_at + interval '1 hour' FROM idempotency_records WHERE key = 'multi'")[0],
          'a checkpointed record is kept its ttl after the lease')
    time.sleep(0.06)
    check(one(app, "SELECT status FROM idem_lookup('acme', 'multi')")[0] == 'resumable', 'idem_lookup shows it resumable')
    check(dict(rows(op, "SELECT state, records FROM idem_record_states()")).get('resumable') == 1,
          'idem_record_states counts it resumable')
    one(op, "SELECT idem_sweep()")
    c = claim(app, 'acme', 'multi', 'fp')
    check(c[0] == 'claimed' and c[1] == t + 1 and c[4] == 'charged' and c[5] == {"charge": "ch_1"},
          'the sweep keeps it; the next claim resumes from the recovery point', c)
    one(app, "SELECT idem_checkpoint('acme', 'multi', %s, 'shipped', lease => '1 hour')", (c[1],))
    one(app, "SELECT idem_release('acme', 'multi', %s)", (c[1],))
    r = one(app, "SELECT token, status, recovery_point, lease_expires_at <= now() FROM idempotency_records WHERE key = 'multi'")
    check(r == (c[1] + 1, 'processing', 'shipped', True), 'a release without failure hands a checkpointed record on (token + 1)', r)
    c2 = claim(app, 'acme', 'multi')
    check(c2[0] == 'claimed' and c2[1] == c[1] + 2 and c2[4] == 'shipped', 'and the next claim resumes it', c2)
    e = error(app, "SELECT idem_checkpoint('acme', 'multi', %s, '')", (c2[1],))
    check(e == ('22023', 'point must not be empty'), 'an empty point: 22023', e)

    # ---- child keys: the C edition's, byte for byte (known values computed by the C edition)
    check(one(app, "SELECT idem_child_key('shop', 'order-1', 'charge')")[0] ==
          'idem-5830c308c5dbc959038c27792e6378a176178892bd52a0d8a50e44a94e6b34b1',
          'idem_child_key equals the C edition\'s for the docs example')
    ck = one(app, "SELECT idem_child_key('t', 'k', 's'), idem_child_key('t', 'k', 's2'), idem_child_key('t2', 'k', 's'),"
             " length(idem_child_key('t', 'k', 's'))")
    check(len(set(ck[:3])) == 3 and ck[3] == 69, 'child keys differ per tenant and step, 69 characters', ck)
    e = error(app, "SELECT idem_child_key('t', 'k', NULL)")
    check(e == ('22004', 'step must not be null'), 'a NULL step: 22004', e)

    # ---- claim_many
    rs = rows(app, "SELECT key, outcome, token IS NOT NULL FROM idem_claim_many('batch', ARRAY['a', 'b', 'a'])")
    check(rs == [('a', 'claimed', True), ('b', 'claimed', True), ('a', 'in_progress', False)],
          'claim_many: input order, a repeated key in_progress', rs)
    rs = rows(app, "SELECT key, outcome FROM idem_claim_many('batch', ARRAY['a', 'c'], ARRAY['x', NULL])")
    check(rs == [('a', 'in_progress'), ('c', 'claimed')], 'claim_many per key as idem_claim', rs)
    for sql, want in [
        ("SELECT * FROM idem_claim_many('batch', NULL)", ('22004', 'keys must not be null')),
        ("SELECT * FROM idem_claim_many('batch', ARRAY['a', NULL])", ('22004', 'keys[2] must not be null')),
        ("SELECT * FROM idem_claim_many('batch', ARRAY['a', ''])", ('22023', 'keys[2] must not be empty')),
        ("SELECT * FROM idem_claim_many('batch', ARRAY[['a'], ['b']])", ('22023', 'keys must be a one-dimensional array')),
        ("SELECT * FROM idem_claim_many('batch', ARRAY['a', 'b'], ARRAY['x'])", ('22023', 'fingerprints must have as many elements as keys')),
        ("SELECT * FROM idem_claim_many('batch', ARRAY(SELECT 'k' || g FROM generate_series(1, 1001) g))", ('54000', 'keys has too many elements')),
    ]:
        e = error(app, sql)
        check(e == want, 'claim_many refuses: %s' % want[1], e)
    check(one(app, "SELECT count(*) FROM idempotency_records WHERE tenant_id = 'batch'")[0] == 3,
          'refused batches claimed nothing')

    # ---- bad input: SQLSTATEs and messages as the C edition documents them
    for sql, want in [
        ("SELECT idem_claim(NULL, 'k')", ('22004', 'tenant_id must not be null')),
        ("SELECT idem_claim('bi', '')", ('22023', 'key must not be empty')),
        ("SELECT idem_claim('bi', repeat('k', 256))", ('22001', 'key is too long')),
        ("SELECT idem_claim('bi', 'k', '')", ('22023', 'fingerprint must not be empty')),
        ("SELECT idem_claim('bi', 'k', lease => '0')", ('22023', 'lease must be positive')),
        ("SELECT idem_claim('bi', 'k', ttl => '-1 s')", ('22023', 'ttl must be positive')),
        ("SELECT idem_claim('bi', 'k', wait => '-1 s')", ('22023', 'wait must be zero or positive')),
        ("SELECT idem_claim('bi', 'k', lease => '1001 years')", ('22023', 'lease is out of range')),
        ("SELECT idem_claim('bi', 'k', lease => '2147483647 days')", ('22023', 'lease is out of range')),
        ("SELECT idem_complete('bi', 'k', NULL)", ('22004', 'token must not be null')),
        ("SELECT idem_complete('bi', 'k', 0)", ('22023', 'token must be positive')),
        ("SELECT idem_sweep(0)", ('22023', 'batch_size must be positive')),
        ("SELECT idem_claim('bi', 'k', 1)", ('42883', None)),
    ]:
        e = error(app if 'sweep' not in sql else op, sql)
        check(e is not None and e[0] == want[0] and (want[1] is None or e[1] == want[1]),
              'bad input %s -> %s' % (sql, want[0]), e)
    check(one(app, "SELECT count(*) FROM idempotency_records WHERE tenant_id = 'bi'")[0] == 0, 'bad input wrote nothing')
    one(app, "SET idempotency.max_response_size = '100'")
    t = claim(app, 'acme', 'big')[1]
    e = error(app, "SELECT idem_complete('acme', 'big', %s, jsonb_build_object('x', repeat('y', 200)))", (t,))
    check(e is not None and e == ('54000', 'response is too large'), 'a response above max_response_size: 54000', e)
    one(app, "RESET idempotency.max_response_size")
    one(app, "SET idempotency.min_ttl = '1h'")
    e = error(app, "SELECT idem_claim('acme', 'short', ttl => '1 min')")
    check(e == ('22023', 'ttl is shorter than idempotency.min_ttl'), 'min_ttl refuses a shorter ttl', e)
    one(app, "RESET idempotency.min_ttl")
    one(app, "SET idempotency.lease = '2s'")
    check(one(app, "SELECT expires_at < now() + interval '3 s' FROM idem_claim('acme', 'lease-setting')")[0],
          'SET idempotency.lease works as a placeholder setting')
    one(app, "RESET idempotency.lease")
    # ---- a replay answers from its one read of the record (issue 48), with
    # what every check would have answered
    t = claim(app, 'acme', 'replayed')[1]
    one(app, "SELECT idem_complete('acme', 'replayed', %s, '{\"paid\": 1}')", (t,))
    one(app, "SET idempotency.ttl = 'soon'")
    check(claim(app, 'acme', 'replayed')[:3] == ('replay', None, {'paid': 1}),
          'a replay uses no idempotency.ttl: a bad value is not read (docs/managed.md, "Settings")')
    e = error(app, "SELECT idem_claim('acme', 'not-replayed')")
    check(e == ('22023', 'invalid value for parameter "idempotency.ttl": "soon"'),
          'a claim that writes reads idempotency.ttl and refuses a bad value (22023)', e)
    one(app, "RESET idempotency.ttl")
    one(app, "SET idempotency.min_ttl = '2 days'")
    e = error(app, "SELECT idem_claim('acme', 'replayed')")
    check(e == ('22023', 'ttl is shorter than idempotency.min_ttl'),
          'idempotency.min_ttl is checked on a replay too, as the C edition checks it', e)
    one(app, "RESET idempotency.min_ttl")
    # records written around the functions with keys no claim accepts: the
    # call is refused as bad input, not answered from the record
    for bad, want in (('', ('22023', 'key must not be empty')), ('k' * 256, ('22001', 'key is too long'))):
        one(owner, "INSERT INTO idempotency_records (tenant_id, key, token, expires_at, created_at, updated_at,"
                   " ttl, status, response) VALUES ('planted', %s, 7, now() + interval '1 day', now(), now(),"
                   " interval '1 day', 'completed', '{}')", (bad,))
        e = error(app, "SELECT idem_claim('planted', %s)", (bad,))
        check(e == want, 'a planted completed record under a bad key: %s (%s), not a replay' % want[::-1], e)
    one(owner, "DELETE FROM idempotency_records WHERE tenant_id = 'planted'")
    ro = connect('app', autocommit=False)
    one(ro, "SET TRANSACTION READ ONLY")
    e = error(ro, "SELECT idem_claim('acme', 'ro')")
    check(e is not None and e[0] == '25006', 'a claim in a read-only transaction: 25006', e)
    ro.close()

    # ---- privileges: exactly the grants of docs/privileges.md
    e = error(app, "SELECT idem_sweep()")
    check(e is not None and e[0] == '42501', 'the application role may not sweep (42501)', e)
    e = error(nobody, "SELECT idem_claim('acme', 'x')")
    check(e is not None and e[0] == '42501', 'a role without grants may not claim (42501)', e)
    e = error(nobody, "SELECT idem_child_key('a', 'b', 'c')")
    check(e is not None and e[0] == '42501', 'nor derive child keys', e)
    # the SECURITY DEFINER helpers: exactly these three, a pinned search_path
    # (pg_temp last), executable by the owner and the roles granted them only
    definers = rows(su, "SELECT format('%%s(%%s)', p.proname, oidvectortypes(p.proargtypes)), p.proconfig,"
                        " (SELECT array_agg(CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END"
                        "  ORDER BY 1) FROM aclexplode(p.proacl) a WHERE a.grantee <> p.proowner)"
                        " FROM pg_proc p WHERE p.pronamespace = %s::regnamespace AND p.prosecdef ORDER BY 1", (s,))
    check(sorted(d[0] for d in definers) == sorted(DEFINER_HELPERS + MONITORING), 'the SECURITY DEFINER functions are'
          ' the four helpers and the two monitoring functions', [d[0] for d in definers])
    check(all(d[1] == ['search_path=pg_catalog, pg_temp'] for d in definers),
          'each SECURITY DEFINER helper pins search_path = pg_catalog, pg_temp', [d[1] for d in definers])
    want = {'idem_sql_isolation_setting()': ['app', 'idem_operator'],
            'idem_sql_tenant_keylock(text, text)': ['app', 'idem_operator'],
            'idem_metrics()': ['pg_monitor'], 'idem_metrics_tenants(integer)': ['pg_monitor']}
    check(all(d[2] == want.get(d[0], ['app']) for d in definers),
          'none is executable by PUBLIC; each only by the roles of docs/managed.md\'s grants (monitoring: pg_monitor)',
          [(d[0], d[2]) for d in definers])
    for call in ('SELECT idem_sql_fresh_tokens(1)', 'SELECT idem_sql_successor_token(9223372036854775806)',
                 'SELECT idem_sql_isolation_setting()', "SELECT idem_sql_tenant_keylock('t', 'k')"):
        e = error(nobody, call)
        check(e is not None and e[0] == '42501' and e[1].startswith('permission denied for function idem_sql_'),
              'a role without the grant may not call %s (42501)' % call.split('(')[0][7:], e)
    mark = one(su, "SELECT last_value FROM idempotency_tokens")[0]
    check(mark < 9000000000000000000, 'the token sequence did not move (%d)' % mark)
    # a role with the C edition's grants only (docs/privileges.md) is refused
    # a claim until it has the helpers' grant too
    one(su, 'DROP ROLE IF EXISTS app_c_grants_only')
    one(su, 'CREATE ROLE app_c_grants_only LOGIN')
    one(owner, 'GRANT USAGE ON SCHEMA %s TO app_c_grants_only' % s)
    one(owner, 'GRANT EXECUTE ON FUNCTION idem_claim(text, text, text, interval, interval, interval, text)'
               ' TO app_c_grants_only')
    one(owner, 'GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_records TO app_c_grants_only')
    bare = connect('app_c_grants_only')
    e = error(bare, "SELECT idem_claim('acme', 'c-grants-only')")
    check(e == ('42501', 'permission denied for function idem_sql_fresh_tokens'),
          'the C edition\'s grants alone: a claim is refused (42501) until the helpers are granted', e)
    check(one(su, "SELECT count(*) FROM idempotency_records WHERE key = 'c-grants-only'")[0] == 0,
          'and it wrote nothing')
    one(owner, 'GRANT EXECUTE ON FUNCTION ' + ', '.join(DEFINER_HELPERS) + ' TO app_c_grants_only')
    check(one(bare, "SELECT outcome FROM idem_claim('acme', 'c-grants-only')")[0] == 'claimed',
          'with docs/managed.md\'s grant it claims')
    bare.close()
    one(su, "DELETE FROM idempotency_records WHERE key = 'c-grants-only'")
    one(owner, 'REVOKE ALL ON FUNCTION ' + ', '.join(DEFINER_HELPERS) + ', idem_claim(text, text, text, interval,'
               ' interval, interval, text) FROM app_c_grants_only')
    one(owner, 'REVOKE ALL ON idempotency_records FROM app_c_grants_only')
    one(owner, 'REVOKE ALL ON SCHEMA %s FROM app_c_grants_only' % s)
    one(su, 'DROP ROLE app_c_grants_only')
    e = error(op, "SELECT * FROM idem_stats")
    check(e is not None and e[0] == '55000' and 'C edition' in e[1], 'idem_stats: 55000, absent with a clear error', e)

    # ---- sweep: expired records, stale claims, counts as the C sweep's
    for i in range(5):
        t = claim(app, 'sw', 'done-%d' % i, ttl='1 ms')[1]
        one(app, "SELECT idem_complete('sw', %s, %s)", ('done-%d' % i, t))
    for i in range(3):
        claim(app, 'sw', 'stale-%d' % i, lease='1 ms')
    claim(app, 'sw', 'live')
    time.sleep(0.02)
    r = one(op, "SELECT * FROM idem_sweep(2)")
    check(r == (5, 3, 0), 'idem_sweep(2): 5 expired removed, 3 stale released, in batches', r)
    check(rows(op, "SELECT key FROM idempotency_records WHERE tenant_id = 'sw'") == [('live',)], 'the live claim stays')
    one(op, "SET idempotency.stale_action = 'fail'")
    claim(app, 'sw', 'stale-x', lease='1 ms')
    time.sleep(0.02)
    r = one(op, "SELECT * FROM idem_sweep()")
    check(r == (0, 0, 1) and one(op, "SELECT status FROM idempotency_records WHERE key = 'stale-x'")[0] == 'failed',
          "idem_sweep with stale_action = 'fail' fails the stale claim", r)
    one(op, "RESET idempotency.stale_action")
    check(one(op, "SELECT idem_forget('sw', 'live')")[0] and not one(op, "SELECT idem_forget('sw', 'live')")[0],
          'idem_forget: true once, then false')

    # ---- concurrency: an uncommitted claim makes duplicates answer in_progress at once
    holder = connect('app', autocommit=False)
    h = claim(holder, 'conc', 'k')
    other = connect('app', options='-c statement_timeout=3000')
    t0 = time.time()
    c = claim(other, 'conc', 'k')
    dt = time.time() - t0
    check(c[0] == 'in_progress' and c[3] is None and dt < 0.5,
          'a duplicate of an uncommitted claim is in_progress without waiting (%.3f s)' % dt, c)
    lock = one(holder, "SELECT classid::bigint, objid::bigint, objsubid, %s.idem_sql_keylock('conc', 'k')"
                       " FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()" % s)
    check(lock is not None and lock[2] == 1 and ((lock[0] << 32) | lock[1]) == (lock[3] & 0xFFFFFFFFFFFFFFFF),
          'the key lock: pg_locks advisory, objsubid 1, classid/objid the 64-bit hash', lock)
    rs = rows(other, "SELECT outcome FROM idem_claim_many('conc', ARRAY['k', 'k2'])")
    check(rs == [('in_progress',), ('claimed',)], 'claim_many meets the uncommitted claim without waiting', rs)
    # a waiting claim sees the holder's outcome
    res = {}

    def waiter():
        w = connect('app')
        res['c'] = claim(w, 'conc', 'k', wait='3 s')
        w.close()
    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.3)
    one(holder, "SELECT idem_complete('conc', 'k', %s, '\"done\"')", (h[1],))
    holder.commit()
    th.join()
    check(res.get('c') is not None and res['c'][0] == 'replay' and res['c'][2] == 'done',
          'a claim with wait => 3 s waits for the holder and replays its outcome', res.get('c'))
    # many sessions, the same fresh keys: one winner per key, never 23505
    keys = ['race-%d' % i for i in range(60)]
    outcomes = {}
    errors = []

    def racer(n):
        conn = connect('app')
        try:
            for k in keys:
                o = claim(conn, 'race', k)[0]
                outcomes.setdefault(k, []).append(o)
        except psycopg2.Error as ex:
            errors.append((ex.pgcode, str(ex)))
        conn.close()
    ths = [threading.Thread(target=racer, args=(i,)) for i in range(6)]
    for x in ths:
        x.start()
    for x in ths:
        x.join()
    winners = [k for k in keys if outcomes.get(k, []).count('claimed') == 1
               and all(o == 'in_progress' for o in outcomes[k] if o != 'claimed')]
    check(not errors and len(winners) == len(keys),
          '6 sessions x 60 keys: exactly one claimed per key, the rest in_progress, no error', (errors[:2], len(winners)))
    xs = rows(app, "SELECT count(*) FROM idempotency_records WHERE tenant_id = 'race'")
    check(xs == [(60,)], 'and one record per key', xs)

    # ---- tenant isolation (the C edition's objects and errors)
    one(owner, "SELECT idem_set_tenant_isolation(true)")
    e = error(app, "SELECT idem_claim('iso', 'k')")
    check(e == ('55000', 'tenant isolation is on, but "app.tenant" is not set'), 'isolation on, setting unset: 55000', e)
    one(app, "SET app.tenant = 'iso'")
    e = error(app, "SELECT idem_claim('other', 'k')")
    check(e == ('42501', 'tenant isolation confines this session to tenant "iso", not "other"'),
          'isolation on, another tenant: 42501', e)
    check(claim(app, 'iso', 'k')[0] == 'claimed', 'isolation on, the session\'s tenant: claimed')
    check(one(app, "SELECT count(*) FROM idempotency_records")[0] == 1, 'the session sees only its tenant\'s records')
    check(one(owner, "SELECT count(*) FROM idempotency_records")[0] > 1 and
          claim(owner, 'other', 'owner-k')[0] == 'claimed', 'the owner is not confined')
    one(owner, "SELECT idem_set_tenant_isolation(false)")
    one(app, "RESET app.tenant")

    reentry(su, owner, app)

    # ---- pg_cron: one call schedules idem_sweep(), one unschedules it; the job sweeps
    have_cron = one(su, "SELECT count(*) FROM pg_extension WHERE extname = 'pg_cron'")[0] == 1
    if have_cron:
        claim(owner, 'cron', 'gone', lease='1 ms')
        # pg_cron 1.5 and later run a job every second; 1.4 (bookworm) every minute at best
        seconds = error(owner, "SELECT idem_schedule_sweep('1 seconds')") is None
        job = one(owner, "SELECT jobid FROM cron.job WHERE jobname = 'idem_sweep'")[0] if seconds else \
            one(owner, "SELECT idem_schedule_sweep()")[0]
        cmd = one(su, "SELECT command, username, schedule FROM cron.job WHERE jobid = %s", (job,))
        check(cmd == ('SELECT * FROM %s.idem_sweep(NULL)' % s, args.owner, '1 seconds' if seconds else '* * * * *'),
              'idem_schedule_sweep makes the cron job', cmd)
        if seconds:
            deadline = time.time() + 8
            while time.time() < deadline and one(owner, "SELECT count(*) FROM idempotency_records WHERE tenant_id = 'cron'")[0]:
                time.sleep(0.2)
            how = 'pg_cron ran the job'
        else:
            one(owner, cmd[0])      # the job's command, as pg_cron would run it
            how = "the job's command (pg_cron 1.4 runs it within a minute)"
        check(one(owner, "SELECT count(*) FROM idempotency_records WHERE tenant_id = 'cron'")[0] == 0,
              '%s: the stale claim was swept' % how)
        again = one(owner, "SELECT idem_schedule_sweep('*/5 * * * *')")[0]
        check(one(su, "SELECT count(*), min(schedule) FROM cron.job WHERE jobname = 'idem_sweep'") == (1, '*/5 * * * *'),
              'scheduling again replaces the job of that name', again)
        check(one(owner, "SELECT idem_unschedule_sweep()")[0] is True and
              one(owner, "SELECT idem_unschedule_sweep()")[0] is False and
              one(su, "SELECT count(*) FROM cron.job WHERE jobname = 'idem_sweep'")[0] == 0,
              'idem_unschedule_sweep removes it (true), then false')
    else:
        check(False, 'pg_cron is installed in the test database')

    metrics(su, owner, app, op, nobody, have_cron and seconds)

    # ---- docs/managed.md: every ```sql-edition block runs here, as the owner
    if args.docs:
        text = open(args.docs).read()
        blocks = re.findall(r'^```sql-edition\n(.*?)^```', text, re.S | re.M)
        ran = 0
        for b in blocks:
            e = error(owner, b)
            check(e is None, 'docs/managed.md block %d runs' % (ran + 1), (e, b[:80]))
            ran += 1
        check(ran > 0, 'docs/managed.md has ```sql-edition blocks (%d)' % ran)

    common.result_line('CONTRACT-RESULT')


def main():
    global args
    p = cli.parser(__doc__.splitlines()[0])
    p.add_argument('--docs')
    args = p.parse_args()
    cli.finish(run, 'CONTRACT-RESULT')


if __name__ == '__main__':
    main()
