#!/usr/bin/python3
"""Dump and restore across PostgreSQL major versions (test/suites/84-cross-major).

  xmajor.py prepare --port P --state FILE
      on the old server: database src with tenant isolation on, an extra
      index made and one adopted, the application grants and records of
      three tenants written under row-level security; writes what the
      restore must reproduce to FILE (JSON)
  xmajor.py verify --port P --state FILE --source-major N
      on the new server, database restored (made with the new version's
      pg_dump and pg_restore): the same records, replays, isolation,
      indexes and grants, and the extension works
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import Server, check, one, rows, run, sqlstate, records, claim, result_line  # noqa: E402
import dump_restore as dr  # noqa: E402

INDEXES = """SELECT pg_catalog.pg_get_indexdef(i.indexrelid) FROM pg_catalog.pg_index i
             WHERE i.indrelid = 'public.idempotency_records'::pg_catalog.regclass ORDER BY 1"""
POLICIES = """SELECT p.polname::text, p.polcmd::text, pg_catalog.pg_get_expr(p.polqual, p.polrelid),
                     pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid)
              FROM pg_catalog.pg_policy p
              WHERE p.polrelid = 'public.idempotency_records'::pg_catalog.regclass ORDER BY 1"""
RLS = """SELECT relrowsecurity FROM pg_catalog.pg_class
         WHERE oid = 'public.idempotency_records'::pg_catalog.regclass"""
CONFIG = """SELECT (SELECT pg_catalog.json_agg(t) FROM public.idem_tenant_isolation t)::text,
                   (SELECT pg_catalog.json_agg(x ORDER BY x.index_name) FROM public.idem_extra_indexes x)::text"""
GRANTS = """SELECT pg_catalog.has_table_privilege('idem_app', 'public.idempotency_records', 'SELECT, INSERT, UPDATE, DELETE'),
                   pg_catalog.has_function_privilege('idem_app', 'public.idem_claim(text, text, text, interval, interval, interval, text)', 'EXECUTE'),
                   pg_catalog.has_function_privilege('idem_app', 'public.idem_sweep(integer)', 'EXECUTE'),
                   pg_catalog.has_table_privilege('idem_app', 'public.idem_extra_indexes', 'SELECT')"""


def listify(x):
    return json.loads(json.dumps(x, default=str))


def state_of(srv, db):
    c = srv.connect(db)
    st = {
        'records': sorted(listify(list(records(c).values()))),
        'replays': sorted(listify([[k[0], k[1]] + list(v) for k, v in dr.replays(srv, db).items()])),
        'indexes': listify(rows(c, INDEXES)),
        'policies': listify(rows(c, POLICIES)),
        'rls': one(c, RLS)[0],
        'config': listify(one(c, CONFIG)),
        'grants': listify(one(c, GRANTS)),
        'max_token': one(c, 'SELECT pg_catalog.max(token) FROM public.idempotency_records')[0],
        'server': one(c, 'SHOW server_version_num')[0],
    }
    c.close()
    return st


def prepare(srv, path):
    adm = srv.connect('postgres')
    run(adm, 'DROP DATABASE IF EXISTS src')
    run(adm, 'DROP ROLE IF EXISTS idem_app')
    run(adm, 'CREATE ROLE idem_app LOGIN')
    run(adm, 'CREATE DATABASE src')
    s = srv.connect('src')
    run(s, 'CREATE EXTENSION idempotency')
    run(s, dr.APP_GRANTS)
    run(s, "SELECT public.idem_set_tenant_isolation(true, 'app.tenant')")
    run(s, "SELECT public.idem_create_index(ARRAY['tenant_id', 'created_at'])")
    run(s, 'CREATE INDEX CONCURRENTLY idem_status_idx ON public.idempotency_records (status, expires_at)')
    run(s, "SELECT public.idem_create_index(ARRAY['status', 'expires_at'], 'idem_status_idx')")
    tokens = dr.fill(srv, 'src')
    dr.isolation_holds(dr.tenant_view(srv, 'src'), 'source')
    st = state_of(srv, 'src')
    st['tokens'] = [[t, k, tok] for (t, k), tok in sorted(tokens.items())]
    check(st['rls'] and len(st['records']) == 120 and len(st['indexes']) == 4,
          'source (PostgreSQL %d): 120 records, row-level security on, 4 indexes' % (int(st['server']) // 10000))
    with open(path, 'w') as f:
        json.dump(st, f)
    s.close()
    adm.close()


def verify(srv, path, source_major):
    with open(path) as f:
        want = json.load(f)
    got = state_of(srv, 'restored')
    major = int(got['server']) // 10000
    check(major > source_major, 'the restore runs on PostgreSQL %d, the dump came from %d' % (major, source_major))
    for what, key in (('all 120 records byte-identical (every column)', 'records'),
                      ('every tenant\'s replays return the same outcome and bytes', 'replays'),
                      ('row-level security on', 'rls'),
                      ('the policy idem_tenant_isolation, as on the source', 'policies'),
                      ('the same 4 indexes (primary key, expiry, the two extra ones)', 'indexes'),
                      ('the isolation and index choices', 'config'),
                      ('the application grants (and no more)', 'grants')):
        check(got[key] == want[key], 'PostgreSQL %d restore: %s' % (major, what), (want[key], got[key]))
    dr.isolation_holds(dr.tenant_view(srv, 'restored'), 'PostgreSQL %d restore' % major)
    t, key, tok = want['tokens'][0]
    c = dr.as_tenant(srv, 'restored', t)
    e = sqlstate(c, """SELECT public.idem_complete(%s, %s, %s, '{"after": "restore"}')""", (t, key, tok))
    o, new_tok, _, _ = claim(c, t, 'brand-new')
    c.close()
    check(e is None and o == 'claimed' and new_tok > want['max_token'],
          'PostgreSQL %d restore: a processing claim completes with its token; a new claim gets a token above '
          'every restored one' % major, (e, o, new_tok, want['max_token']))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('mode', choices=('prepare', 'verify'))
    ap.add_argument('--host', default='127.0.0.1')
    ap.add_argument('--port', type=int, required=True)
    ap.add_argument('--state', required=True)
    ap.add_argument('--source-major', type=int, default=15)
    args = ap.parse_args()
    srv = Server(args.host, args.port)
    if args.mode == 'prepare':
        prepare(srv, args.state)
    else:
        verify(srv, args.state, args.source_major)
    result_line('XMAJOR-RESULT')


if __name__ == '__main__':
    try:
        main()
    except Exception as e:
        import traceback
        traceback.print_exc()
        check(False, 'xmajor.py ended with an unexpected error: %s' % e)
        result_line('XMAJOR-RESULT')
        sys.exit(1)
    sys.exit(1 if common.failed else 0)
