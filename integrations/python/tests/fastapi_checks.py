"""Checks of idempotency_pg.fastapi beyond the HTTP contract (which
test/integrations/contract.py runs against examples/fastapi): the
key_required=False option, called in-process through ASGI (no server, no
HTTP client library), against a real PostgreSQL as the application role.

run(check, admin_dsn, app_dsn, tenant_setting) as in function_checks.py:
with tenant isolation on, the Idempotency gets tenant_setting, and one made
without it is refused by the server (55000 or 42501).
"""
import asyncio
import json
from typing import Optional

import psycopg
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

from idempotency_pg.fastapi import Claim, Idempotency

SCHEMA = """
CREATE TABLE IF NOT EXISTS optional_key_effects (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key    text,
    amount bigint NOT NULL
);
GRANT SELECT, INSERT ON optional_key_effects TO ledger_app;
"""


class Payment(BaseModel):
    amount: int


def make_app(pool, tenant_setting):
    app = FastAPI()
    optional = Idempotency(pool, tenant="X-Client-Id", key_required=False, tenant_setting=tenant_setting)

    @app.post("/payments")
    @optional(status_code=201)
    async def pay(payment: Payment, conn: AsyncConnection, claim: Optional[Claim]):
        cur = await conn.execute("INSERT INTO optional_key_effects (key, amount) VALUES (%s, %s) RETURNING id",
                                 (claim.key if claim else None, payment.amount))
        (row_id,) = await cur.fetchone()
        if payment.amount >= 500:       # the endpoint gives up after its insert
            return JSONResponse({"error": "unavailable"}, status_code=503)
        return {"id": row_id, "amount": payment.amount, "keyed": claim is not None}

    return app


async def post(app, body, headers=(), errors=None):
    """One POST /payments through the ASGI interface: (status, headers, body).
    With a list as errors, an exception the app raises after answering (as
    FastAPI does after its 500) is appended to it instead of raised."""
    data = json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/payments", "raw_path": b"/payments", "query_string": b"",
             "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                         *[(k.lower().encode(), v.encode()) for k, v in headers]]}
    sent = [{"type": "http.request", "body": data, "more_body": False}]
    answer = {"headers": {}, "body": b""}

    async def receive():
        return sent.pop(0) if sent else {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
            answer["headers"] = {k.decode().lower(): v.decode() for k, v in message["headers"]}
        elif message["type"] == "http.response.body":
            answer["body"] += message.get("body", b"")

    try:
        await app(scope, receive, send)
    except Exception as e:
        if errors is None:
            raise
        errors.append(e)
    return answer.get("status"), answer["headers"], answer["body"]


def run(check, admin_dsn, app_dsn, tenant_setting=None):
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(SCHEMA)
        asyncio.run(check_optional_key(check, admin, app_dsn, tenant_setting))


async def check_optional_key(check, admin, app_dsn, tenant_setting):
    def rows(amount):
        return admin.execute("SELECT count(*) FROM optional_key_effects WHERE amount = %s", (amount,)).fetchone()[0]

    pool = AsyncConnectionPool(app_dsn, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False)
    await pool.open(wait=True)
    try:
        await check_tenant_setting(check, pool, tenant_setting, rows)
        app = make_app(pool, tenant_setting)
        s1, h1, b1 = await post(app, {"amount": 11})
        s2, h2, b2 = await post(app, {"amount": 11})
        check(s1 == 201 and s2 == 201 and json.loads(b1)["keyed"] is False and b1 != b2
              and "idempotent-replayed" not in h2 and rows(11) == 2,
              "fastapi key_required=False: a request without a key runs untouched, each time (two rows)",
              f"{s1} {s2} {b1!r} {b2!r} {rows(11)}")
        count = admin.execute("SELECT count(*) FROM idempotency_records WHERE tenant_id = 'shop-1'").fetchone()[0]
        check(count == 0, "fastapi key_required=False: nothing stored for requests without a key", f"{count}")

        s, h, b = await post(app, {"amount": 600})
        check(s == 503 and rows(600) == 0,
              "fastapi key_required=False: a 5xx without a key still rolls back the endpoint's insert",
              f"{s} {rows(600)}")

        keyed = (("Idempotency-Key", "pay-1"), ("X-Client-Id", "shop-1"))
        s1, h1, b1 = await post(app, {"amount": 12}, keyed)
        s2, h2, b2 = await post(app, {"amount": 12}, keyed)
        check(s1 == 201 and s2 == 201 and json.loads(b1)["keyed"] is True and b1 == b2
              and h2.get("idempotent-replayed") == "true" and rows(12) == 1,
              "fastapi key_required=False: a request with a key is still claimed and replayed byte for byte",
              f"{s1} {s2} {b1!r} {b2!r} {h2}")
        s, h, b = await post(app, {"amount": 13}, (("Idempotency-Key", "k" * 256), ("X-Client-Id", "shop-1")))
        check(s == 400 and rows(13) == 0, "fastapi key_required=False: a bad key is still refused with 400",
              f"{s} {b!r}")
    finally:
        await pool.close()


async def check_tenant_setting(check, pool, tenant_setting, rows):
    """tenant_setting is checked when the Idempotency is made; with tenant
    isolation on, an endpoint made without it answers 500, its claim refused
    by the server (55000 or 42501), and runs nothing; with isolation off it runs."""
    for bad in ("tenant", "app.x'); DROP TABLE optional_key_effects; --"):
        try:
            Idempotency(pool, tenant_setting=bad)
            e = None
        except ValueError as exc:
            e = exc
        check(e is not None and "tenant_setting" in str(e),
              f"fastapi: tenant_setting={bad!r} is refused when the Idempotency is made", repr(e))
    errors = []
    status, _, body = await post(make_app(pool, None), {"amount": 14},
                                 (("Idempotency-Key", "no-setting"), ("X-Client-Id", "shop-no-setting")), errors)
    state = errors[0].sqlstate if errors and isinstance(errors[0], psycopg.Error) else errors or None
    if tenant_setting:
        check(status == 500 and state in ("55000", "42501") and rows(14) == 0,
              "fastapi, isolation on: an Idempotency made without tenant_setting answers 500 (the claim refused"
              " with 55000 or 42501), the endpoint does not run", f"{status} {state} {body[:200]!r}")
    else:
        check(status == 201 and state is None and rows(14) == 1,
              "fastapi, isolation off: an Idempotency made without tenant_setting runs the endpoint",
              f"{status} {state} {body[:200]!r}")
