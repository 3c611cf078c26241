"""Tenant isolation for the integration suites (75-http, 76-python, 77-node,
79-go): each runs its contract with isolation off, then on.

prepare(admin, role, setting) gives the application role exactly the
application role's GRANT lines of docs/privileges.md (read from the page, as
55-privileges does; its own business tables aside) and switches tenant
isolation on with that setting (None: off).  check_role says the role holds
exactly those grants and nothing that bypasses row-level security (not a
superuser, not the table's owner, no BYPASSRLS).  check_in_force runs as
that role: a record of one tenant is seen by its own tenant's session only,
and a claim without the setting, or naming another tenant, is refused with
55000 or 42501; with isolation off the same probes see and claim (a control:
the checks can tell the two apart).

The setting is 'app.tenant', as README.md and docs/integrations.md use it.

With IDEM_EDITION=sql the suite runs against the SQL edition (sql-edition/,
installed into public by the suite): the role also gets docs/managed.md's
"Grants" line for the application role, and its functions are the idem_*
functions of public instead of the extension's members.
"""
import os
import re
import subprocess
import sys

import psycopg2

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../sql-edition"))
import edition  # noqa: E402  (IDEM_EDITION: the C extension or the SQL edition)

SETTING = "app.tenant"
PASSES = (None, SETTING)          # tenant isolation off, then on
# 55000 (the extension's own error: the setting is not set) or 42501 (row-level
# security, or the extension's error when the setting names another tenant)
REFUSED = ("55000", "42501")
TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
ROOT = os.getcwd()
EDITION = edition.EDITION


def describe(setting):
    return (f"tenant isolation on (idem_set_tenant_isolation(true, '{setting}'); the packages pass"
            f" tenant_setting '{setting}')" if setting else "tenant isolation off")


def documented_app_grants(role):
    """The application role's GRANT lines of docs/privileges.md, granted to role instead of app."""
    sys.path.insert(0, os.path.join(ROOT, "test/privileges"))
    from documented_roles import documented_grants
    grants, problems = documented_grants(ROOT)
    if problems or not grants["app"]:
        raise RuntimeError(f"docs/privileges.md: {problems or 'no GRANT line for app'}")
    lines = grants["app"]
    if EDITION == "sql":
        with open(os.path.join(ROOT, "docs/managed.md")) as f:
            helpers = [line.strip() for line in f if re.match(r"GRANT EXECUTE ON FUNCTION idem_sql_\w+\(.*\sTO app;$", line)]
        if not helpers:
            raise RuntimeError("docs/managed.md: no GRANT line of the SQL edition's helpers for app")
        lines = lines + helpers
    return [re.sub(r"\sTO\s+app\s*;$", f" TO {role};", line) for line in lines]


def prepare(admin, role, setting):
    """As the superuser admin (autocommit): role holds exactly the documented
    application grants on the extension's objects, and isolation is on with
    setting (or off)."""
    with admin.cursor() as cur:
        cur.execute(f"REVOKE ALL ON idempotency_records FROM {role}")
        cur.execute(f"REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA public FROM {role}")
        for line in documented_app_grants(role):
            cur.execute(line)
        if setting:
            cur.execute("SELECT idem_set_tenant_isolation(true, %s)", (setting,))
        else:
            cur.execute("SELECT idem_set_tenant_isolation(false)")


def check_role(check, admin, role, setting):
    """The role holds exactly the documented grants, cannot bypass row-level
    security, and isolation is what this pass says."""
    lines = documented_app_grants(role)
    with admin.cursor() as cur:
        wanted_functions = set()
        for line in (g for g in lines if "EXECUTE" in g):
            for signature in re.findall(r"\b(idem_\w+\([^)]*\))", line):
                cur.execute("SELECT to_regprocedure(%s)::oid", (signature,))
                wanted_functions.add(cur.fetchone()[0])
        members = ("SELECT p.oid, p.oid::regprocedure::text, has_function_privilege(%s, p.oid, 'EXECUTE'),"
                   " has_function_privilege('public', p.oid, 'EXECUTE') FROM pg_proc p ")
        if EDITION == "sql":
            cur.execute(members + "WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem\\_%%'",
                        (role,))
        else:
            cur.execute(members + """JOIN pg_depend d ON p.oid = d.objid
                         JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
                        WHERE d.classid = 'pg_proc'::regclass AND d.deptype = 'e'""", (role,))
        functions = cur.fetchall()
        wrong = sorted(sig for oid, sig, held, public in functions if held != (oid in wanted_functions or public))
        table_line = next(g for g in lines if " ON idempotency_records " in g)
        wanted_table = {p.strip() for p in re.match(r"GRANT\s+(.*?)\s+ON\s", table_line).group(1).split(",")}
        held_table = set()
        for privilege in TABLE_PRIVILEGES:
            cur.execute("SELECT has_table_privilege(%s, 'idempotency_records', %s)", (role, privilege))
            if cur.fetchone()[0]:
                held_table.add(privilege)
        cur.execute("""SELECT r.rolsuper, r.rolbypassrls, pg_has_role(%s, c.relowner, 'MEMBER'),
                              c.relrowsecurity,
                              (SELECT string_agg(pg_get_expr(p.polqual, p.polrelid), ' ') FROM pg_policy p
                                WHERE p.polrelid = c.oid)
                         FROM pg_roles r, pg_class c
                        WHERE r.rolname = %s AND c.oid = 'idempotency_records'::regclass""", (role, role))
        superuser, bypass, owner, rls, policy = cur.fetchone()
    check(wanted_functions and len(functions) > len(wanted_functions) and not wrong
          and held_table == wanted_table,
          f"{role} holds exactly the application role's grants of docs/privileges.md: EXECUTE on"
          f" {len(wanted_functions)} functions (and what PUBLIC may), {', '.join(sorted(wanted_table))} on the table",
          f"functions held or missing against the page: {wrong}; table {sorted(held_table)}")
    check(not superuser and not bypass and not owner,
          f"{role} is no superuser, not the table's owner (nor a member of it), has no BYPASSRLS",
          f"superuser {superuser}, owner {owner}, bypassrls {bypass}")
    if setting:
        check(rls and policy is not None and f"'{setting}'" in policy,
              f"row-level security is on, its policy reads {setting}", f"rls {rls}, policy {policy}")
    else:
        check(not rls and policy is None, "row-level security is off, no policy", f"rls {rls}, policy {policy}")


def sqlstate(conn, sql, args=()):
    """None when sql runs, else its SQLSTATE; the transaction is rolled back either way."""
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
        return None
    except psycopg2.Error as e:
        return e.pgcode
    finally:
        conn.rollback()


def visible(conn, as_tenant, key):
    """The tenant_id of the records of key that a session of as_tenant sees."""
    with conn.cursor() as cur:
        cur.execute("SELECT set_config(%s, %s, true)", (SETTING, as_tenant))
        cur.execute("SELECT tenant_id FROM idempotency_records WHERE key = %s ORDER BY 1", (key,))
        rows = [r[0] for r in cur.fetchall()]
    conn.rollback()
    return rows


def check_in_force(check, admin, role_dsn, setting, key, tenants):
    """key was written through the app by each of tenants (two or more):
    the records carry those tenant_ids; as the role, each tenant's session
    sees its own record only and a session of a tenant with none sees
    nothing (isolation off: every session sees all of them); a claim with
    the setting unset, or naming another tenant, is refused (off: claimed)."""
    with admin.cursor() as cur:
        cur.execute("SELECT tenant_id FROM idempotency_records WHERE key = %s ORDER BY 1", (key,))
        written = [r[0] for r in cur.fetchall()]
    check(written == sorted(tenants), f"the records of {key!r} carry the tenant_id of the request that wrote them",
          f"{written} vs {sorted(tenants)}")
    conn = psycopg2.connect(role_dsn)
    try:
        seen = {t: visible(conn, t, key) for t in (*tenants, "tenant-without-records")}
        want = {t: [t] for t in tenants} if setting else {t: sorted(tenants) for t in tenants}
        want["tenant-without-records"] = [] if setting else sorted(tenants)
        check(seen == want,
              "as the application role, each tenant's session sees its own record only, another tenant's"
              " session nothing" if setting else
              "control, isolation off: every session of the application role sees every tenant's record",
              f"{seen}")
        unset = sqlstate(conn, "SELECT * FROM idem_claim(%s, 'probe-unset')", (tenants[0],))
        other = sqlstate(conn, "SELECT set_config(%s, %s, true); SELECT * FROM idem_claim(%s, 'probe-other')",
                         (SETTING, tenants[1], tenants[0]))
    finally:
        conn.close()
    if setting:
        check(unset in REFUSED and other in REFUSED,
              f"as the application role a claim without {setting}, or with it naming another tenant, is refused"
              " (55000 or 42501)", f"unset: {unset}, another tenant: {other}")
    else:
        check(unset is None and other is None, "control, isolation off: those claims run", f"{unset} {other}")


def app_role_database(check, env, role):
    """For a package's own tests (77-node, 79-go): the database env names
    (PG* variables, a superuser), created with the extension (or the SQL
    edition: test/sql-edition/edition.py), and role
    (created if missing) holding exactly the documented application grants
    there.  The tests switch isolation on or off themselves."""
    connect = dict(host=env["PGHOST"], port=env["PGPORT"], user=env["PGUSER"])
    root = psycopg2.connect(dbname="postgres", **connect)
    root.autocommit = True
    with root.cursor() as cur:
        cur.execute(f"CREATE DATABASE {env['PGDATABASE']}")
        cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
        if cur.fetchone() is None:
            cur.execute(f"CREATE ROLE {role} LOGIN")
    root.close()
    edition.create(lambda *args: subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", env["PGHOST"], "-p", str(env["PGPORT"]),
         "-U", env["PGUSER"], "-d", env["PGDATABASE"], *args], check=True, stdout=subprocess.DEVNULL))
    admin = psycopg2.connect(dbname=env["PGDATABASE"], **connect)
    admin.autocommit = True
    prepare(admin, role, None)
    check_role(check, admin, role, None)
    admin.close()
