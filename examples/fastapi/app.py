"""Example service: POST /entries books a batch of ledger entries (a JSON
array) at most once per (client, Idempotency-Key), with the idempotency-pg
package (integrations/python).

    python3 -m venv --system-site-packages .venv
    .venv/bin/pip install --no-build-isolation --no-deps integrations/python
    LEDGER_DSN="dbname=ledger user=ledger_app" \
        .venv/bin/python -m uvicorn app:app --app-dir examples/fastapi --port 8080

LEDGER_POOL_SIZE (default 10) sets the database connections per process;
LEDGER_TEST_HOOKS=1 (tests only) honours X-Test-Delay-Ms (a slow booking)
and X-Test-Fail-After-Write (an exception after the inserts).

Runs on FastAPI 0.92 with pydantic 1 (Debian bookworm) and on FastAPI 0.115
with pydantic 2 (Debian trixie): it uses only what both have (conint, a
validating dependency instead of constr(regex=)/conlist(min_items=), and a
lifespan set on the router, which FastAPI 0.92 has without its lifespan=
argument).
"""
import asyncio
import contextlib
import os
import re
from typing import List

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, conint

from idempotency_pg.fastapi import Claim, Idempotency, problem

DSN = os.environ.get("LEDGER_DSN", "dbname=ledger user=ledger_app")
POOL_SIZE = int(os.environ.get("LEDGER_POOL_SIZE", "10"))
TEST_HOOKS = os.environ.get("LEDGER_TEST_HOOKS") == "1"
ACCOUNT = re.compile(r"[a-z0-9-]{1,64}")
MAX_ENTRIES = 100


@contextlib.asynccontextmanager
async def lifespan(app):
    # autocommit connections: the decorator opens and commits the transaction
    app.state.pool = AsyncConnectionPool(DSN, min_size=1, max_size=POOL_SIZE, kwargs={"autocommit": True},
                                         open=False)
    await app.state.pool.open(wait=True)
    yield
    await app.state.pool.close()


app = FastAPI(title="ledger")
app.router.lifespan_context = lifespan


class Entry(BaseModel):
    account: str
    amount: conint(strict=True, gt=0)                   # minor units (cents)


class InvalidBody(Exception):
    pass


async def valid_entries(entries: List[Entry]) -> List[Entry]:
    """The body, checked beyond its types before the claim (a dependency runs first)."""
    if not 1 <= len(entries) <= MAX_ENTRIES:
        raise InvalidBody(f"between 1 and {MAX_ENTRIES} entries are allowed, not {len(entries)}")
    bad = [str(i) for i, e in enumerate(entries) if not ACCOUNT.fullmatch(e.account)]
    if bad:
        raise InvalidBody(f"entries {', '.join(bad)}: account must be 1 to 64 of a-z, 0-9 and -")
    return entries


async def authenticated_client(x_client_id: str = Header("default")) -> str:
    """Whose keys these are.  A stand-in for authentication: a real service
    returns the authenticated principal's id here (Depends(current_user))."""
    return x_client_id


idempotent = Idempotency(pool=lambda: app.state.pool, tenant=authenticated_client)


@app.exception_handler(RequestValidationError)
async def invalid_request(request: Request, exc: RequestValidationError):
    """400, refused before the claim: nothing is stored, the key may be reused
    with a corrected body (422 is kept for a key reused with another body)."""
    return problem(400, "The request body is invalid.", "; ".join(
        f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))


@app.exception_handler(InvalidBody)
async def invalid_entries(request: Request, exc: InvalidBody):
    return problem(400, "The request body is invalid.", str(exc))


@app.exception_handler(Exception)
async def internal_error(request: Request, exc: Exception):
    """500: the decorator has already rolled back the endpoint's writes and its claim."""
    return problem(500, "Internal error.", "Nothing was stored; retrying with the same key is safe.")


@app.post("/entries")
@idempotent(status_code=201)
async def post_entries(request: Request, conn: AsyncConnection, claim: Claim,
                       entries: List[Entry] = Depends(valid_entries)):
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
