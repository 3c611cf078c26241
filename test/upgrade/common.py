"""Shared helpers of the upgrade and dump/restore suites: checks that count,
connections, small query helpers."""

import sys

import psycopg2

passed = 0
failed = 0


def check(ok, what, detail=''):
    global passed, failed
    if ok:
        passed += 1
        print('ok   ' + what)
    else:
        failed += 1
        print('FAIL ' + what)
        if detail:
            text = detail if isinstance(detail, str) else repr(detail)
            for line in text.splitlines()[:40]:
                print('     ' + line)
    sys.stdout.flush()
    return ok


def result_line(tag):
    print('%s passed=%d failed=%d' % (tag, passed, failed))


class Server:
    def __init__(self, host, port):
        self.host, self.port = host, port

    def connect(self, db, autocommit=True, **kw):
        c = psycopg2.connect(host=self.host, port=self.port, dbname=db, user=kw.pop('user', 'postgres'),
                             application_name=kw.pop('application_name', 'idem-upgrade-test'), **kw)
        c.autocommit = autocommit
        return c


def one(conn, sql, params=None):
    cur = conn.cursor()
    cur.execute(sql, params)
    r = cur.fetchone()
    cur.close()
    return r


def rows(conn, sql, params=None):
    cur = conn.cursor()
    cur.execute(sql, params)
    r = cur.fetchall()
    cur.close()
    return r


def run(conn, sql, params=None):
    cur = conn.cursor()
    cur.execute(sql, params)
    cur.close()


def sqlstate(conn, sql, params=None):
    """Runs sql; returns None or the SQLSTATE it failed with (rolling back)."""
    try:
        run(conn, sql, params)
        return None
    except psycopg2.Error as e:
        if not conn.autocommit:
            conn.rollback()
        return e.pgcode


# Every column of every record, as text, in key order: equal lists mean
# byte-identical records (jsonb's text form is canonical).
RECORDS = """
    SELECT tenant_id, key, status, token::text, response::text, fingerprint,
           expires_at::text, lease_expires_at::text, created_at::text, updated_at::text, ttl::text
    FROM public.idempotency_records ORDER BY tenant_id, key"""


def records(conn):
    return {(r[0], r[1]): r for r in rows(conn, RECORDS)}


def claim(conn, tenant, key, **kw):
    """idem_claim as (outcome, token, response text, expires_at text)."""
    args = ', '.join('%s => %%(%s)s' % (k, k) for k in kw)
    sql = ('SELECT outcome, token, response::text, expires_at::text FROM public.idem_claim('
           'tenant_id => %(tenant)s, key => %(key)s' + (', ' + args if args else '') + ')')
    params = dict(kw, tenant=tenant, key=key)
    return one(conn, sql, params)
