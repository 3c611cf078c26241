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
import time
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
    optional = Idempotency(pool, tenant="X-Client-Id", raise_on_missing_key=False, tenant_setting=tenant_setting)

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


async def post(app, body, headers=(), errors=None, path="/payments"):
    """One POST to path through the ASGI interface: (status, headers, body).
    With a list as errors, an exception the app raises after answering (as
    FastAPI does after its 500) is appended to it instead of raised."""
    data = json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
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
        asyncio.run(check_options(check, admin, app_dsn, tenant_setting))
        asyncio.run(check_holder(check, admin, app_dsn, tenant_setting))


async def check_holder(check, admin, app_dsn, tenant_setting):
    """holder= (extension 1.4): Idempotency.run with the holder of a committed, live claim re-enters it
    (the handler runs with the record's token), another holder or none gets 409; the decorator passes
    the request's holder (stored with the record)."""
    pool = AsyncConnectionPool(app_dsn, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False)
    await pool.open(wait=True)
    try:
        idem = Idempotency(pool, tenant="X-Client-Id", tenant_setting=tenant_setting,
                           holder=lambda request: request.headers.get("x-execution"))
        async with pool.connection() as conn:
            async with conn.transaction():
                if tenant_setting:
                    await conn.execute("SELECT set_config(%s, 'shop-h', true)", (tenant_setting,))
                cur = await conn.execute("SELECT token FROM idem_claim('shop-h', 'held-1', lease => '10 minutes',"
                                         " holder => 'exec-1')")
                (token,) = await cur.fetchone()
        tokens = []

        async def handler(conn, claim):
            tokens.append(claim.token)
            return {"by": "exec-1"}

        busy = [(await idem.run("shop-h", "held-1", None, handler, 201, holder=h)).status_code
                for h in ("exec-2", None)]
        busy.append((await idem.run("shop-h", "held-1", None, handler, 201)).status_code)
        mine = await idem.run("shop-h", "held-1", None, handler, 201, holder="exec-1")
        status = admin.execute("SELECT status FROM idempotency_records WHERE tenant_id = 'shop-h'"
                               " AND key = 'held-1'").fetchone()
        check(busy == [409, 409, 409] and mine.status_code == 201 and tokens == [token] and status == ("completed",),
              "fastapi holder=: the same holder re-enters its committed claim (the handler runs once, with the"
              " record's token); another holder, none, or the Idempotency's (a function: none in run()) get 409",
              f"{busy} {mine.status_code} {tokens} {token} {status}")

        app = FastAPI()

        @app.post("/payments")
        @idem(status_code=201)
        async def pay(payment: Payment, claim: Claim):
            return {"amount": payment.amount}

        headers = (("Idempotency-Key", "held-2"), ("X-Client-Id", "shop-h"), ("X-Execution", "exec-9"))
        s1, _, _ = await post(app, {"amount": 5}, headers)
        s2, _, _ = await post(app, {"amount": 5}, (("Idempotency-Key", "held-3"), ("X-Client-Id", "shop-h")))
        stored = admin.execute("SELECT key, holder FROM idempotency_records WHERE tenant_id = 'shop-h'"
                               " AND key IN ('held-2', 'held-3') ORDER BY key").fetchall()
        check(s1 == 201 and s2 == 201 and stored == [("held-2", "exec-9"), ("held-3", None)],
              "fastapi holder=: the decorator claims with the request's holder, and without one when it gives None",
              f"{s1} {s2} {stored}")
    finally:
        await pool.close()


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
              "fastapi raise_on_missing_key=False: a request without a key runs untouched, each time (two rows)",
              f"{s1} {s2} {b1!r} {b2!r} {rows(11)}")
        count = admin.execute("SELECT count(*) FROM idempotency_records WHERE tenant_id = 'shop-1'").fetchone()[0]
        check(count == 0, "fastapi raise_on_missing_key=False: nothing stored for requests without a key", f"{count}")

        s, h, b = await post(app, {"amount": 600})
        check(s == 503 and rows(600) == 0,
              "fastapi raise_on_missing_key=False: a 5xx without a key still rolls back the endpoint's insert",
              f"{s} {rows(600)}")

        keyed = (("Idempotency-Key", "pay-1"), ("X-Client-Id", "shop-1"))
        s1, h1, b1 = await post(app, {"amount": 12}, keyed)
        s2, h2, b2 = await post(app, {"amount": 12}, keyed)
        check(s1 == 201 and s2 == 201 and json.loads(b1)["keyed"] is True and b1 == b2
              and h2.get("idempotent-replayed") == "true" and rows(12) == 1,
              "fastapi raise_on_missing_key=False: a request with a key is still claimed and replayed byte for byte",
              f"{s1} {s2} {b1!r} {b2!r} {h2}")
        s, h, b = await post(app, {"amount": 13}, (("Idempotency-Key", "k" * 256), ("X-Client-Id", "shop-1")))
        check(s == 400 and rows(13) == 0, "fastapi raise_on_missing_key=False: a bad key is still refused with 400",
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
    if tenant_setting:
        # the server's hint says set_config by hand: the error names this package's option instead
        e = errors[0] if errors else None
        check(isinstance(e, psycopg.Error) and e.sqlstate == "55000" and "set_config" not in str(e)
              and f'give Idempotency(...) the tenant_setting option, tenant_setting="{tenant_setting}"' in str(e),
              "fastapi, isolation on: without tenant_setting the error names the option (tenant_setting=), not"
              " set_config, and keeps SQLSTATE 55000", repr(e))
    # a request without the tenant's header: a 400 that names the header, not "... not NoneType"
    status, _, body = await post(make_app(pool, tenant_setting), {"amount": 15}, (("Idempotency-Key", "no-tenant"),))
    detail = json.loads(body).get("detail", "") if body.startswith(b"{") else body
    check(status == 400 and "The X-Client-Id header is missing" in detail and "NoneType" not in detail
          and rows(15) == 0, "fastapi: a request without the tenant header is refused with 400, naming the header",
          f"{status} {body[:300]!r}")


# ---------------------------------------------------------------- the options shared with Node.js and Go

# docs/integrations.md, "One behaviour in three packages": the same titles in every package
TITLES = {400: "An Idempotency-Key header is required", "bad key": "The Idempotency-Key header is invalid",
          409: "A request with this Idempotency-Key is still being processed",
          422: "This Idempotency-Key was used for a different request"}


def options_app(pool, tenant_setting, hooks):
    """Endpoints under test of the options: wait, lease, per-call ttl,
    store_status, replayed_headers, response_hook."""
    app = FastAPI()

    def hook(response, replayed):
        hooks.append(replayed)
        response.headers["X-Hook"] = "replay" if replayed else "first"

    base = dict(tenant="X-Client-Id", tenant_setting=tenant_setting, response_hook=hook)
    plain = Idempotency(pool, lease="40 seconds", ttl=lambda request: request.headers.get("X-Ttl"), **base)
    waiting = Idempotency(pool, wait="5 seconds", **base)
    brief_wait = Idempotency(pool, wait=1.2, **base)
    only_2xx = Idempotency(pool, store_status=lambda status: 200 <= status < 300,
                           replayed_headers=["X-Trace"], **base)

    def answer(status, amount):
        return JSONResponse({"amount": amount}, status_code=status,
                            headers={"Location": f"/things/{amount}", "X-Trace": f"trace-{amount}"})

    async def book(conn, payment, status):
        await conn.execute("INSERT INTO optional_key_effects (key, amount) VALUES ('options', %s)", (payment.amount,))
        return answer(status, payment.amount)

    @app.post("/plain/{status}")
    @plain
    async def plain_endpoint(status: int, payment: Payment, conn: AsyncConnection):
        return await book(conn, payment, status)

    @app.post("/waiting")
    @waiting(status_code=201)
    async def waiting_endpoint(payment: Payment, conn: AsyncConnection):
        return {"amount": payment.amount}

    @app.post("/brief-wait")
    @brief_wait(status_code=201)
    async def brief_wait_endpoint(payment: Payment, conn: AsyncConnection):
        return {"amount": payment.amount}

    @app.post("/only-2xx/{status}")
    @only_2xx
    async def only_2xx_endpoint(status: int, payment: Payment, conn: AsyncConnection):
        return await book(conn, payment, status)

    return app


async def check_options(check, admin, app_dsn, tenant_setting):
    def rows(amount):
        return admin.execute("SELECT count(*) FROM optional_key_effects WHERE amount = %s", (amount,)).fetchone()[0]

    def stored(key):
        return admin.execute("SELECT status, ttl FROM idempotency_records WHERE tenant_id = 'opt' AND key = %s",
                             (key,)).fetchone()

    def holder():
        conn = psycopg.connect(app_dsn)
        if tenant_setting:
            conn.execute("SELECT set_config(%s, 'opt', false)", (tenant_setting,))
            conn.commit()
        return conn

    def title(body):
        return json.loads(body).get("title")

    pool = AsyncConnectionPool(app_dsn, min_size=1, max_size=3, kwargs={"autocommit": True}, open=False)
    await pool.open(wait=True)
    hooks = []
    app = options_app(pool, tenant_setting, hooks)
    client = ("X-Client-Id", "opt")
    try:
        # titles
        s1, _, b1 = await post(app, {"amount": 1}, (client,), path="/plain/201")
        s2, _, b2 = await post(app, {"amount": 1}, (client, ("Idempotency-Key", "k" * 256)), path="/plain/201")
        s3, _, b3 = await post(app, {"amount": 1}, (("Idempotency-Key", "opt-no-tenant"),), path="/plain/201")
        check(s1 == 400 and title(b1) == TITLES[400] and s2 == 400 and title(b2) == TITLES["bad key"]
              and s3 == 400 and title(b3) == "The tenant is invalid",
              "fastapi: the 400 titles are the three packages' (no key; an invalid key; no tenant)",
              f"{b1!r} {b2!r} {b3!r}")

        # per-call ttl, replayed_headers' default, response_hook
        key = (client, ("Idempotency-Key", "opt-1"), ("X-Ttl", "3 days"))
        s1, h1, b1 = await post(app, {"amount": 21}, key, path="/plain/201")
        s2, h2, b2 = await post(app, {"amount": 21}, key, path="/plain/201")
        rec = stored("opt-1")
        check(s1 == s2 == 201 and b1 == b2 and rec is not None and str(rec[1]) in ("3 days, 0:00:00", "3 days"),
              "fastapi: ttl as a function of the request sets this call's retention (3 days)", f"{s1} {s2} {rec}")
        check(h1.get("location") == h2.get("location") == "/things/21" and "x-trace" not in h1 and "x-trace" not in h2,
              "fastapi: the first answer and its replay carry the allow-listed headers only (Location by default,"
              " not X-Trace)",
              f"{h1} {h2}")
        check(hooks[-2:] == [False, True] and h1.get("x-hook") == "first" and h2.get("x-hook") == "replay",
              "fastapi: response_hook sees every answer and whether it is a replay", f"{hooks} {h1} {h2}")

        # store_status: the default stores a deterministic 4xx, not a 409 or a 5xx
        for status, key, expect in ((422, "opt-422", "failed"), (409, "opt-409", None), (503, "opt-503", None)):
            amount, hooked = 30 + status, len(hooks)
            r1 = await post(app, {"amount": amount}, (client, ("Idempotency-Key", key)), path=f"/plain/{status}")
            r2 = await post(app, {"amount": amount}, (client, ("Idempotency-Key", key)), path=f"/plain/{status}")
            rec = stored(key)
            ok = r1[0] == r2[0] == status and (rec[0] if rec else None) == expect
            ok = ok and hooks[hooked:] == ([False, True] if expect else [])   # no hook for an answer not stored
            ok = ok and (r2[1].get("idempotent-replayed") == "true" if expect else
                         "idempotent-replayed" not in r2[1] and rows(amount) == 0)
            check(ok, f"fastapi: store_status by default {'stores and replays' if expect else 'does not store'}"
                      f" a {status}" + ("" if expect else " (the endpoint's insert rolled back, a retry runs again)"),
                  f"{r1[0]} {r2[0]} {rec} {r2[1]} rows {rows(amount)}")

        # store_status and replayed_headers given
        r1 = await post(app, {"amount": 40}, (client, ("Idempotency-Key", "opt-only-422")), path="/only-2xx/422")
        r2 = await post(app, {"amount": 41}, (client, ("Idempotency-Key", "opt-only-201")), path="/only-2xx/201")
        r3 = await post(app, {"amount": 41}, (client, ("Idempotency-Key", "opt-only-201")), path="/only-2xx/201")
        check(r1[0] == 422 and stored("opt-only-422") is None and rows(40) == 0
              and r3[1].get("idempotent-replayed") == "true" and r3[1].get("x-trace") == "trace-41"
              and "location" not in r3[1],
              "fastapi: store_status=2xx only leaves a 422 unstored; replayed_headers=['X-Trace'] replays X-Trace"
              " and not Location", f"{r1[0]} {stored('opt-only-422')} {r3[1]}")

        # 409: its title, Retry-After (docs/integrations.md: the lease left of a committed claim, else the
        # call's wait or 1; between 1 and 60)
        conn = holder()
        try:
            conn.execute("SELECT idem_claim('opt', 'opt-busy', lease => '20 seconds')")
            conn.execute("SELECT idem_claim('opt', 'opt-busy-long', lease => '10 minutes')")
            conn.commit()                           # committed claims: their lease ends are known
            s, h, b = await post(app, {"amount": 50}, (client, ("Idempotency-Key", "opt-busy")), path="/plain/201")
            check(s == 409 and title(b) == TITLES[409] and h.get("retry-after", "").isdigit()
                  and 18 <= int(h["retry-after"]) <= 20,
                  "fastapi: 409 while a committed claim's lease runs: Retry-After is its remaining lease (<= 20 s)",
                  f"{s} {h} {b!r}")
            s, h, _ = await post(app, {"amount": 50}, (client, ("Idempotency-Key", "opt-busy-long")),
                                 path="/plain/201")
            check(s == 409 and h.get("retry-after") == "60",
                  "fastapi: 409 while a committed claim's 10-minute lease runs: Retry-After is capped at 60",
                  f"{s} {h}")
            conn.execute("SELECT idem_claim('opt', 'opt-busy-2')")         # uncommitted: its lease end unknown
            s, h, b = await post(app, {"amount": 51}, (client, ("Idempotency-Key", "opt-busy-2")), path="/plain/201")
            check(s == 409 and h.get("retry-after") == "1",
                  "fastapi: 409 while an uncommitted claim runs, no wait: Retry-After 1 (not the lease, 40 s)",
                  f"{s} {h}")
            started = time.monotonic()
            s, h, b = await post(app, {"amount": 51}, (client, ("Idempotency-Key", "opt-busy-2")),
                                 path="/brief-wait")
            waited = time.monotonic() - started
            check(s == 409 and h.get("retry-after") == "2" and waited >= 1.2,
                  "fastapi: 409 after waiting 1.2 s for an uncommitted claim: Retry-After is the wait, rounded up (2)",
                  f"{s} {h} waited {waited:.2f} s")
            conn.rollback()

            # wait: the duplicate gets the original's answer when it comes within the wait
            (token,) = conn.execute("SELECT token FROM idem_claim('opt', 'opt-wait')").fetchone()
            done = asyncio.get_running_loop().call_later(0.3, lambda: (conn.execute(
                "SELECT idem_complete('opt', 'opt-wait', %s, '{\"status\": 201, \"body\": {\"amount\": 60}}')",
                (token,)), conn.commit()))
            s, h, b = await post(app, {"amount": 60}, (client, ("Idempotency-Key", "opt-wait")), path="/waiting")
            done.cancel()
            check(s == 201 and h.get("idempotent-replayed") == "true" and json.loads(b) == {"amount": 60},
                  "fastapi: with wait, a duplicate during the first attempt gets its answer (a replay)",
                  f"{s} {h} {b!r}")
        finally:
            conn.close()
        s1, _, _ = await post(app, {"amount": 70}, (client, ("Idempotency-Key", "opt-mm")), path="/plain/201")
        s2, _, b2 = await post(app, {"amount": 71}, (client, ("Idempotency-Key", "opt-mm")), path="/plain/201")
        check(s1 == 201 and s2 == 422 and title(b2) == TITLES[422], "fastapi: the 422 title is the three packages'",
              f"{s2} {b2!r}")
    finally:
        await pool.close()

    try:
        Idempotency(pool)(lambda payment: payment)
        e = None
    except TypeError as exc:
        e = exc
    check(e is not None and "async def" in str(e),
          "fastapi: a sync def endpoint is refused when decorated, saying to make it async def", repr(e))
