"""examples/http/server.py with the tenant set in each request's
transaction: 75-http's isolation pass runs the reference server through
this script, with the same arguments and LEDGER_TENANT_SETTING (e.g.
app.tenant) in the environment.

The server's create_payment(conn, client, ...) is wrapped: the transaction
psycopg2 opens on the connection starts with
set_config(LEDGER_TENANT_SETTING, client, true), as the packages'
tenant_setting does, and create_payment's own `with conn` then commits or
rolls back that same transaction.  Nothing else of the server changes.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.getcwd(), "examples/http"))
import server  # noqa: E402

SETTING = os.environ["LEDGER_TENANT_SETTING"]
create_payment = server.create_payment


def create_payment_as_tenant(conn, client, key, payment, **hooks):
    with conn.cursor() as cur:
        cur.execute("SELECT pg_catalog.set_config(%s, %s, true)", (SETTING, client))
    return create_payment(conn, client, key, payment, **hooks)


server.create_payment = create_payment_as_tenant
sys.exit(server.main())
