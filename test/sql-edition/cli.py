"""What the SQL edition's check scripts share: their common arguments and
how a run ends (an unexpected error is one failure, not a silent pass)."""
import argparse

import psycopg2

import common  # test/upgrade/common.py, put on sys.path by the caller
from common import check


def parser(description):
    """--host, --port, --dbname, --schema, --owner; the caller adds its own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument('--host', default='127.0.0.1')
    p.add_argument('--port', type=int, required=True)
    p.add_argument('--dbname', required=True)
    p.add_argument('--schema', required=True)
    p.add_argument('--owner', required=True)
    return p


def connect(args, user, dbname=None, autocommit=True, tenant=None):
    """A connection as user to --dbname (or dbname), --schema first on its
    search_path and, with tenant, app.tenant (tenant isolation's setting) set."""
    options = '-c search_path=%s' % args.schema
    if tenant is not None:
        options += ' -c app.tenant=%s' % tenant
    conn = psycopg2.connect(host=args.host, port=args.port, dbname=dbname or args.dbname, user=user,
                            options=options)
    conn.autocommit = autocommit
    return conn


def finish(run, tag):
    """Run the checks, print "TAG passed=N failed=M" and exit 1 on a failure."""
    try:
        run()
    except Exception as ex:
        check(False, 'unexpected error: %r' % (ex,))
        common.result_line(tag)
        raise SystemExit(1)
    raise SystemExit(1 if common.failed else 0)
