"""The secure rows' set-up (issue 34): databases with tenant isolation on
(bench_tenant, bench_tenant_replay) and off (bench_tenant_off), and the
application role that the secure scenarios run as.

The role gets exactly the application role's GRANT lines of
docs/privileges.md, read from the page (test/privileges/documented_roles.py,
as 55-privileges reads them), plus what the business and hand-written tables
need (sql/tenant_isolation.sql).  Before the rounds, check() makes sure the
figures mean what they say: the role is no superuser, not the table's owner
and has no BYPASSRLS, and in the databases with isolation on a call without
the tenant set is refused (55000) and the hand-written tables show it none
of the seeded rows, while with isolation off the same call runs."""

import os
import re
import sys

import psycopg2

from scenarios import APP_ROLE

ISOLATED = ("bench_tenant", "bench_tenant_replay")
OPEN = ("bench_tenant_off",)
DATABASES = ISOLATED + OPEN


def documented_app_grants(source_dir):
    """docs/privileges.md's GRANT lines of the application role, to APP_ROLE."""
    sys.path.insert(0, os.path.join(source_dir, "test", "privileges"))
    from documented_roles import documented_grants
    grants, problems = documented_grants(source_dir)
    if problems or not grants["app"]:
        raise RuntimeError(f"docs/privileges.md: {problems or 'no GRANT line for app'}")
    return [re.sub(r"\sTO\s+app\s*;$", f" TO {APP_ROLE};", line) for line in grants["app"]]


def create_role(pg):
    admin = pg.connect("postgres")
    admin.cursor().execute(f"CREATE ROLE {APP_ROLE} LOGIN")
    admin.close()


def prepare(pg, db, bench_dir, source_dir):
    """In db (made by schema.sql): the documented grants, then isolation on or
    off and the tables' grants (sql/tenant_isolation.sql)."""
    conn = pg.connect(db)
    with conn.cursor() as cur:
        for line in documented_app_grants(source_dir):
            cur.execute(line)
    conn.close()
    pg.psql_file(db, os.path.join(bench_dir, "sql", "tenant_isolation.sql"),
                 {"isolation": "on" if db in ISOLATED else "off", "role": APP_ROLE})


def refusal(pg, db, sql):
    """None when sql runs as APP_ROLE without the tenant set, else its SQLSTATE."""
    conn = psycopg2.connect(host="127.0.0.1", port=pg.port, dbname=db, user=APP_ROLE)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return None
    except psycopg2.Error as e:
        return e.pgcode
    finally:
        conn.close()


def check(pg):
    """Raise unless the secure rows measure what they claim (module doc)."""
    conn = pg.connect("bench_tenant")
    with conn.cursor() as cur:
        cur.execute("SELECT r.rolsuper OR r.rolbypassrls OR pg_has_role(%s, c.relowner, 'MEMBER') "
                    "FROM pg_roles r, pg_class c "
                    "WHERE r.rolname = %s AND c.oid = 'idempotency_records'::regclass",
                    (APP_ROLE, APP_ROLE))
        if cur.fetchone()[0]:
            raise RuntimeError(f"{APP_ROLE} bypasses row-level security")
    conn.close()
    lookup = "SELECT idem_lookup('bench', 'nothing')"
    for db in DATABASES:
        got = refusal(pg, db, lookup)
        wanted = "55000" if db in ISOLATED else None
        if got != wanted:
            raise RuntimeError(f"{db}: {lookup} as {APP_ROLE} without app.tenant gave "
                               f"{got or 'no error'}, not {wanted or 'no error'}")
    for db, table in (("bench_tenant", "lean_records"), ("bench_tenant_replay", "replay_plain")):
        conn = psycopg2.connect(host="127.0.0.1", port=pg.port, dbname=db, user=APP_ROLE)
        with conn.cursor() as cur:
            cur.execute(f"SELECT count(*) FROM {table}")
            seen = cur.fetchone()[0]
        conn.close()
        if seen:
            raise RuntimeError(f"{db}: {APP_ROLE} sees {seen} rows of {table} without app.tenant")


if __name__ == "__main__":
    # test/bench/profile: the application grants, to run with psql
    print("\n".join(documented_app_grants(sys.argv[1])))
