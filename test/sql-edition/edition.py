"""IDEM_EDITION for the suites that can run against either edition (75-http,
76-python, 77-node, 78-multistep, 79-go, the last three through
test/integrations/contract.py and isolation.py): 'c' (default) the C
extension, preloaded and created by the example's schema.sql or CREATE
EXTENSION; 'sql' the SQL edition (sql-edition/), no library preloaded,
installed into public with its plain script (before schema.sql, whose CREATE
EXTENSION line is left out).  36-sql-edition runs those suites with
IDEM_EDITION=sql."""
import os

EDITION = os.environ.get("IDEM_EDITION", "c")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "sql-edition", "idempotency_sql--1.4.sql")
# objsubid of a claim's key lock in pg_locks (docs/managed.md, difference 5)
KEY_LOCK_OBJSUBID = 1 if EDITION == "sql" else 18756


def preload():
    """shared_preload_libraries for the suite's server."""
    return "" if EDITION == "sql" else "idempotency"


def run_independent(what):
    """Whether to run the checks of what that do not depend on the edition
    (packaging, types, the README's recipes): with the C edition yes; with
    the SQL edition no, and a line saying so (the suite's own run has them)."""
    if EDITION == "sql":
        print(f"     not with IDEM_EDITION=sql ({what}: the same with either edition; the suite's own run checks it)")
        return False
    return True


def create(psql):
    """The API in the database psql(*args) is connected to (a superuser,
    ON_ERROR_STOP): CREATE EXTENSION idempotency, or the SQL edition's plain
    script into public."""
    if EDITION == "sql":
        psql("-v", "schema=public", "-f", SCRIPT)
    else:
        psql("-c", "CREATE EXTENSION idempotency")


def install(psql, schema, workdir):
    """Run the example's schema.sql with psql(*args) (connected to its
    database, ON_ERROR_STOP), after the SQL edition when that is the one."""
    if EDITION != "sql":
        psql("-f", schema)
        return
    create(psql)
    without = os.path.join(workdir, "schema-sql-edition.sql")
    with open(schema) as src, open(without, "w") as dst:
        text = src.read()
        line = "CREATE EXTENSION IF NOT EXISTS idempotency;\n"
        if line not in text:
            raise RuntimeError("%s: no line %r to leave out for the SQL edition" % (schema, line.strip()))
        dst.write(text.replace(line, "", 1))
    psql("-f", without)
