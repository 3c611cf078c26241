"""IDEM_EDITION for the suites that can run against either edition (75-http,
78-multistep): 'c' (default) the C extension, preloaded and created by the
example's schema.sql; 'sql' the SQL edition (sql-edition/), installed into
public with its plain script before schema.sql, whose CREATE EXTENSION line
is left out.  36-sql-edition runs those suites with IDEM_EDITION=sql."""
import os

EDITION = os.environ.get("IDEM_EDITION", "c")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def preload():
    """shared_preload_libraries for the suite's server."""
    return "" if EDITION == "sql" else "idempotency"


def install(psql, schema, workdir):
    """Run the example's schema.sql with psql(*args) (connected to its
    database, ON_ERROR_STOP), after the SQL edition when that is the one."""
    if EDITION != "sql":
        psql("-f", schema)
        return
    psql("-v", "schema=public", "-f", os.path.join(ROOT, "sql-edition", "idempotency_sql--1.2.sql"))
    without = os.path.join(workdir, "schema-sql-edition.sql")
    with open(schema) as src, open(without, "w") as dst:
        text = src.read()
        line = "CREATE EXTENSION IF NOT EXISTS idempotency;\n"
        if line not in text:
            raise RuntimeError("%s: no line %r to leave out for the SQL edition" % (schema, line.strip()))
        dst.write(text.replace(line, "", 1))
    psql("-f", without)
