"""Example service: POST /entries books a batch of ledger entries (a JSON
array) at most once per (client, Idempotency-Key).

    LEDGER_DSN="dbname=ledger user=ledger_app" \
        python3 -m uvicorn app:app --app-dir examples/fastapi --port 8080

LEDGER_POOL_SIZE (default 10) sets the database connections per process;
LEDGER_TEST_HOOKS=1 (tests only) honours X-Test-Delay-Ms (a slow booking)
and X-Test-Fail-After-Write (an exception after the inserts).
"""
import asyncio
import os

from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, conint, conlist, constr

from idempotency_fastapi import Claim, Idempotency, problem

DSN = os.environ.get("LEDGER_DSN", "dbname=ledger user=ledger_app")
POOL_SIZE = int(os.environ.get("LEDGER_POOL_SIZE", "10"))
TEST_HOOKS = os.environ.get("LEDGER_TEST_HOOKS") == "1"

app = FastAPI(title="ledger")


Account = constr(regex=r"^[a-z0-9-]{1,64}$")
Cents = conint(strict=True, gt=0)


class Entry(BaseModel):
    account: Account
    amount: Cents                                       # minor units (cents)


async def authenticated_client(x_client_id: str = Header("default")) -> str:
    """Whose keys these are.  A stand-in for authentication: a real service
    returns the authenticated principal's id here (Depends(current_user))."""
    return x_client_id


# connections come from the pool in autocommit mode: the decorator opens the transaction
idempotent = Idempotency(pool=lambda: app.state.pool, tenant=authenticated_client)


@app.on_event("startup")
async def open_pool():
    app.state.pool = AsyncConnectionPool(DSN, min_size=1, max_size=POOL_SIZE, kwargs={"autocommit": True})
    await app.state.pool.wait()


@app.on_event("shutdown")
async def close_pool():
    await app.state.pool.close()


@app.exception_handler(RequestValidationError)
async def invalid_request(request: Request, exc: RequestValidationError):
    """400, refused before the claim: nothing is stored, the key may be reused
    with a corrected body (422 is kept for a key reused with another body)."""
    return problem(400, "the request body is invalid", "; ".join(
        f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))


@app.exception_handler(Exception)
async def internal_error(request: Request, exc: Exception):
    """500: the decorator has already rolled back the endpoint's writes and its claim."""
    return problem(500, "internal error", "Nothing was stored; retrying with the same key is safe.")


@app.post("/entries")
@idempotent(status_code=201)
async def post_entries(entries: conlist(Entry, min_items=1, max_items=100), request: Request,
                       conn: AsyncConnection, claim: Claim):
    frozen = [e.account for e in entries if e.account.startswith("frozen-")]
    if frozen:   # a business failure: stored (idem_release with the failure) and replayed
        return JSONResponse({"error": {"code": "account_frozen", "accounts": frozen}}, status_code=403)

    booked = []
    for e in entries:
        cur = await conn.execute(
            "INSERT INTO ledger_entries (client_id, idempotency_key, account, amount)"
            " VALUES (%s, %s, %s, %s) RETURNING id", (claim.tenant, claim.key, e.account, e.amount))
        (entry_id,) = await cur.fetchone()
        booked.append({"id": f"le_{entry_id}", "account": e.account, "amount": e.amount})

    if TEST_HOOKS:
        await asyncio.sleep(int(request.headers.get("X-Test-Delay-Ms", "0")) / 1000)
        if "X-Test-Fail-After-Write" in request.headers:
            raise RuntimeError("test hook: failing after the inserts")
    return booked
