"""FastAPI (Starlette) integration: a decorator that runs an endpoint at most
once per (tenant, Idempotency-Key), with the claim, the endpoint's own
writes and the stored response in ONE database transaction.

    BEGIN
    idem_claim(tenant, key, fingerprint)
      claimed      run the endpoint with the transaction's connection, then
                   idem_complete (status < 400) or idem_release(failure => ...)
                   (4xx: a business failure, stored and replayed)
      replay       the stored status and body, Idempotent-Replayed: true
      failed       the stored failure,          Idempotent-Replayed: true
      in_progress  409 + Retry-After: the seconds left of the original's lease
                   if its claim is committed, else the wait or 1; at most 60
                   (with wait, after waiting that long for its answer)
      mismatch     422 (the key was used for another request)
    COMMIT

If the endpoint raises (HTTPException included) or returns an answer that
store_status refuses (by default a 5xx, 408, 409, 425 or 429), the
transaction rolls back: its writes and the claim disappear together, nothing
is stored, and a retry with the same key simply runs again.

Byte-identical replays: the stored document is {"status", "body", ...}; the
body sent is the stored jsonb as PostgreSQL prints it, for the first answer
(read back by the statement that stores it) as for every replay, so they are
the same bytes whatever the endpoint's key order or number formatting.

    idempotent = Idempotency(pool=lambda: app.state.pool, tenant=current_client)

    @app.post("/entries")
    @idempotent(status_code=201)
    async def post_entries(entries: List[Entry], conn: AsyncConnection, claim: Claim):
        await conn.execute("INSERT ...")          # same transaction as the claim
        return [...]

Parameters annotated AsyncConnection and Claim are filled in by the decorator
and hidden from FastAPI.  Works with FastAPI 0.92 (pydantic 1) and later
(pydantic 2); needs psycopg 3 and psycopg_pool.
"""
import base64
import functools
import inspect
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from fastapi import Depends, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import Response
from psycopg import AsyncConnection, Rollback
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from .core import (DEFAULT_REPLAYED_HEADERS, RETRY_AFTER_SQL, SET_TENANT_SQL, TITLE_IN_PROGRESS, TITLE_KEY_INVALID,
                   TITLE_KEY_REQUIRED, TITLE_MISMATCH, TITLE_TENANT_INVALID, IdempotencyKeyError, check_identifier,
                   check_tenant_setting, default_store_status, interval_text, sha256_hex)
from .function import _holder, naming_tenant_setting

__all__ = ["DEFAULT_REPLAYED_HEADERS", "Claim", "Idempotency", "default_store_status", "fingerprint",
           "parse_idempotency_key", "problem"]

SF_STRING = re.compile(r'"((?:[^"\\]|\\["\\])*)"')      # RFC 8941 sf-string
# The body to send, as PostgreSQL prints the stored jsonb (the whole document if it is not ours)
BODY_TEXT = "coalesce({0}->'body', {0})::text"


@dataclass(frozen=True)
class Claim:
    """What the endpoint may want to know about its claim (e.g. to record the key)."""
    tenant: str
    key: str
    token: int


def problem(status: int, title: str, detail: Optional[str] = None, headers=None) -> Response:
    """An RFC 7807 problem document, as the IETF Idempotency-Key draft recommends."""
    doc = {"type": "about:blank", "title": title, "status": status}
    if detail:
        doc["detail"] = detail
    return Response(compact_json(doc), status_code=status, headers=headers,
                    media_type="application/problem+json")


def compact_json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def parse_idempotency_key(values: list) -> Optional[str]:
    """The key of the Idempotency-Key header values: an sf-string ("abc") per
    the IETF draft, or bare (abc) as Stripe sends it.  None when there is no
    header; IdempotencyKeyError when it is not a usable key."""
    if not values:
        return None
    if len(values) > 1:
        raise IdempotencyKeyError("Only one Idempotency-Key header is allowed.")
    raw = values[0].strip()
    if raw.startswith('"'):
        quoted = SF_STRING.fullmatch(raw)
        if not quoted:
            raise IdempotencyKeyError("The Idempotency-Key is not a valid structured-field string.")
        raw = re.sub(r'\\(["\\])', r"\1", quoted.group(1))
    return check_identifier(raw, "Idempotency-Key", printable_ascii=True)


def fingerprint(request: Request, body: bytes) -> str:
    """What makes two requests "the same": method, path, query and the body
    (canonical JSON when it is JSON, so key order and spacing do not count)."""
    target = request.url.path + ("?" + request.url.query if request.url.query else "")
    try:
        body = json.dumps(json.loads(body), sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False).encode()
    except ValueError:
        pass                                            # not JSON: the bytes as sent
    return sha256_hex(f"{request.method} {target}\n".encode() + body)


async def stored_document(result: Any, status_code: int, replayed_headers=DEFAULT_REPLAYED_HEADERS) -> dict:
    """The endpoint's answer as the document kept in idempotency_records.response;
    of its headers, those named in replayed_headers (lower case)."""
    if not isinstance(result, Response):
        return {"status": status_code, "body": jsonable_encoder(result)}
    body = getattr(result, "body", None)
    if body is None:                                    # a StreamingResponse: drain it
        body = b"".join([c if isinstance(c, bytes) else c.encode() async for c in result.body_iterator])
    doc = {"status": result.status_code}
    content_type = result.headers.get("content-type", "")
    headers = {k: v for k, v in result.headers.items() if k in replayed_headers}
    if headers:
        doc["headers"] = headers
    try:
        if "json" not in content_type:
            raise ValueError
        doc["body"] = json.loads(body)
        if not content_type.startswith("application/json"):
            doc["content_type"] = content_type
    except ValueError:                                  # not JSON: keep the exact bytes
        doc["body_base64"] = base64.b64encode(body).decode()
        doc["content_type"] = content_type or "application/octet-stream"
    return doc


def render(doc: Any, body: str, replayed: bool) -> Response:
    """The HTTP answer of a stored document.  body is the JSON text of its
    "body" as PostgreSQL prints the stored jsonb (BODY_TEXT), so the first
    answer and every replay are the same bytes."""
    if not (isinstance(doc, dict) and isinstance(doc.get("status"), int)):
        # not one of ours, e.g. the extension's {"error": "lease_expired"}
        # under idempotency.stale_action = 'fail'
        doc = {"status": 500}
    headers = dict(doc.get("headers") or {})
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    content = base64.b64decode(doc["body_base64"]) if "body_base64" in doc else body.encode()
    return Response(content, status_code=doc["status"], headers=headers,
                    media_type=doc.get("content_type", "application/json"))


def as_response(result: Any, status_code: int) -> Response:
    """What FastAPI would have sent for the endpoint's return value."""
    if isinstance(result, Response):
        return result
    return Response(compact_json(jsonable_encoder(result)), status_code=status_code,
                    media_type="application/json")


_DEFAULT = object()      # run()'s holder not given: the Idempotency's


def _per_call(value, what):
    """An interval option: None, interval text ('5 minutes'), seconds, a
    timedelta, or a function of the Request returning one of those (per call)."""
    if callable(value):
        return value
    text = interval_text(value, what)
    return lambda request: text


class Idempotency:
    """Configures the decorator once per application.

    pool:         a psycopg_pool.AsyncConnectionPool whose connections are in
                  autocommit mode, or a function returning it (e.g. one
                  created in the app's lifespan).
    tenant:       whose keys these are.  A header name (str) or a FastAPI
                  dependency (a callable; it may depend on your
                  authentication, e.g. return the authenticated principal's id).
    lease, ttl:   passed to idem_claim ('5 minutes', seconds, a timedelta, or
                  a function of the Request returning one: per call; None:
                  the server's defaults).
    wait:         how long a duplicate waits for the original's answer
                  (same forms; default None: answer 409 at once).  An answer
                  that comes within the wait is replayed; else 409.
    holder:       who claims (extension 1.4): a string or a function of the
                  Request returning one (or None).  A claim this holder
                  committed and still holds (a live lease) is claimed again
                  by the same holder; any other holder or none gets 409.
                  None (default): no holder is sent (1.3 servers too).
    raise_on_missing_key: True (default): a request without an Idempotency-Key
                  header is refused with 400.  False: it runs the endpoint
                  untouched (no claim, nothing stored, no replay), still in
                  one transaction that a raise or a 5xx rolls back; Claim is None.
                  (key_required is the older name of this option.)
    store_status: which answers are stored and replayed, a function of the
                  status (default default_store_status: 2xx, 3xx and the
                  deterministic 4xx; never 5xx, 408, 409, 425, 429).  An answer
                  not stored is sent once and its writes rolled back with the claim.
    replayed_headers: the response headers stored and replayed (an
                  allow-list, case-insensitive; default location,
                  content-location, link).  Content-Type is always kept.
    response_hook: a function (response, replayed) called with every stored
                  answer (the first, replayed False) and every replay before
                  it is sent; it may change the response or return another one.
    tenant_setting: with tenant isolation on (idem_set_tenant_isolation(true,
                  'app.tenant')), the setting its policy reads: the claim's
                  transaction runs set_config(tenant_setting, tenant, true)
                  before the claim, so the claim, the endpoint and the stored
                  answer run as that tenant.  None (default): nothing is set.
    """

    def __init__(self, pool, *, tenant: Union[str, Callable] = "X-Client-Id",
                 lease=None, ttl=None, wait=None, holder=None, raise_on_missing_key: bool = True,
                 key_required: Optional[bool] = None, tenant_setting: Optional[str] = None,
                 store_status: Callable[[int], bool] = default_store_status,
                 replayed_headers=DEFAULT_REPLAYED_HEADERS, response_hook: Optional[Callable] = None):
        self._pool = pool if callable(pool) and not hasattr(pool, "connection") else (lambda: pool)
        if not (callable(tenant) or (isinstance(tenant, str) and tenant)):
            raise TypeError("tenant must be a header name or a FastAPI dependency (a function).")
        self.tenant = tenant
        self.intervals = (_per_call(lease, "lease"), _per_call(ttl, "ttl"), _per_call(wait, "wait"))
        self.static_intervals = tuple(None if callable(v) else interval_text(v, n)
                                      for v, n in ((lease, "lease"), (ttl, "ttl"), (wait, "wait")))
        self.holder = _holder(holder)
        self.static_holder = None if callable(holder) else self.holder(None)
        self.key_required = raise_on_missing_key if key_required is None else key_required
        self.tenant_setting = check_tenant_setting(tenant_setting)
        if not callable(store_status):
            raise TypeError("store_status must be a function of the status code (default_store_status).")
        self.store_status = store_status
        if isinstance(replayed_headers, str) or not all(isinstance(h, str) for h in replayed_headers):
            raise TypeError("replayed_headers must be a list of header names.")
        self.replayed_headers = frozenset(h.lower() for h in replayed_headers)
        self.response_hook = response_hook

    def __call__(self, func: Optional[Callable] = None, *, status_code: int = 200):
        """@idempotent or @idempotent(status_code=201): status_code is used when
        the endpoint returns a plain value rather than a Response."""
        if func is None:
            return functools.partial(self.__call__, status_code=status_code)
        return self._wrap(func, status_code)

    def _wrap(self, func: Callable, status_code: int) -> Callable:
        if not inspect.iscoroutinefunction(func):
            raise TypeError(f"@idempotent supports async endpoints only, and {func.__qualname__} is a plain def:"
                            " the claim, the endpoint's writes and the stored answer share one AsyncConnection."
                            " Make it `async def`; for blocking work, `await run_in_threadpool(...)` inside it,"
                            " or use idempotent_function with a psycopg.Connection.")
        signature = inspect.signature(func, eval_str=True)
        conn_param = claim_param = None
        visible = []
        for p in signature.parameters.values():
            if p.annotation is AsyncConnection or getattr(p.annotation, "__origin__", None) is AsyncConnection:
                conn_param = p.name
            elif p.annotation is Claim or p.annotation == Optional[Claim]:
                claim_param = p.name
            else:   # keyword-only: FastAPI passes keywords, and the order of defaults stops mattering
                visible.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY))
        # FastAPI fills in one Request parameter only: share the endpoint's if it has one
        request_param = next((p.name for p in visible if p.annotation is Request), None)
        if request_param is None:
            visible.append(inspect.Parameter("idem_request_", inspect.Parameter.KEYWORD_ONLY, annotation=Request))
        if callable(self.tenant):
            visible.append(inspect.Parameter("idem_tenant_", inspect.Parameter.KEYWORD_ONLY,
                                             annotation=Any, default=Depends(self.tenant)))

        @functools.wraps(func)
        async def endpoint(**kwargs):
            request: Request = kwargs[request_param] if request_param else kwargs.pop("idem_request_")
            tenant = kwargs.pop("idem_tenant_") if callable(self.tenant) else request.headers.get(self.tenant)

            async def handler(conn, claim):
                if conn_param:
                    kwargs[conn_param] = conn
                if claim_param:
                    kwargs[claim_param] = claim
                return await func(**kwargs)

            try:
                key = parse_idempotency_key(request.headers.getlist("idempotency-key"))
            except IdempotencyKeyError as e:
                return problem(400, TITLE_KEY_INVALID, str(e))
            if key is None:
                if not self.key_required:
                    return await self.run_without_key(handler, status_code)
                return problem(400, TITLE_KEY_REQUIRED, "Send a unique key per operation, e.g. a UUID v4.")
            if tenant is None:      # not "... not NoneType": say where the tenant was to come from
                return problem(400, TITLE_TENANT_INVALID, self.missing_tenant())
            try:
                tenant = check_identifier(tenant, "tenant", printable_ascii=True)
            except IdempotencyKeyError as e:
                return problem(400, TITLE_TENANT_INVALID, str(e))
            fp = fingerprint(request, await request.body())
            return await self.run(tenant, key, fp, handler, status_code,
                                  intervals=tuple(interval_text(f(request), n) for f, n in
                                                  zip(self.intervals, ("lease", "ttl", "wait"))),
                                  holder=self.holder(request))

        endpoint.__signature__ = signature.replace(parameters=visible)
        del endpoint.__wrapped__          # FastAPI must see the signature above, not func's
        return endpoint

    def missing_tenant(self) -> str:
        if callable(self.tenant):
            name = getattr(self.tenant, "__qualname__", repr(self.tenant))
            return (f"The tenant dependency {name} returned None: it must return the tenant, e.g. the"
                    " authenticated principal's id.")
        return (f"The {self.tenant} header is missing: it names the tenant whose keys these are. Send it"
                f" ({self.tenant}: <tenant>), or give Idempotency tenant= another header's name or a dependency"
                " returning the authenticated principal.")

    async def run(self, tenant: str, key: str, fp: Optional[str], handler: Callable,
                  status_code: int = 200, intervals=None, holder=_DEFAULT) -> Response:
        """One idempotent execution: claim, handler(conn, claim), store, all in
        one transaction.  Usable without the decorator (e.g. from a plain
        Starlette endpoint).  intervals: (lease, ttl, wait) as interval text,
        default the Idempotency's (functions of the request are not called here); holder
        likewise (None: no holder)."""
        lease, ttl, wait = intervals or self.static_intervals
        holder = self.static_holder if holder is _DEFAULT else _holder(holder)(None)
        response, replayed = await self._run(tenant, key, fp, handler, status_code, lease, ttl, wait, holder)
        if self.response_hook is not None and replayed is not None:
            response = self.response_hook(response, replayed) or response
        return response

    async def _run(self, tenant, key, fp, handler, status_code, lease, ttl, wait, holder=None):
        """(the answer, whether it is a replay: None for a 409, a 422 or an answer not stored)."""
        answer = None
        async with self._pool().connection() as conn:
            async with conn.transaction():
                cur = conn.cursor(row_factory=tuple_row)
                if self.tenant_setting:
                    await cur.execute(SET_TENANT_SQL, (self.tenant_setting, tenant))
                with naming_tenant_setting(self.tenant_setting, "Idempotency(...)", "request's"):
                    await cur.execute(
                        f"SELECT outcome, token, response, {BODY_TEXT.format('response')}, {RETRY_AFTER_SQL}"
                        " FROM idem_claim(%s, %s, %s,"
                        " lease => %s::interval, ttl => %s::interval, wait => %s::interval"
                        # holder => only when given (extension 1.4): without it the call is 1.3's
                        + ("" if holder is None else ", holder => %s::text") + ")",
                        (wait, tenant, key, fp, lease, ttl, wait, *(() if holder is None else (holder,))))
                outcome, token, stored, body, retry_after = await cur.fetchone()
                if outcome in ("replay", "failed"):
                    return render(stored, body, replayed=True), True
                if outcome == "in_progress":
                    return problem(409, TITLE_IN_PROGRESS, "Retry later with the same key.",
                                   {"Retry-After": str(retry_after)}), None
                if outcome == "mismatch":
                    return problem(422, TITLE_MISMATCH, "A key must not be reused with another payload."), None

                # claimed: this request, and only this one, runs the endpoint
                result = await handler(conn, Claim(tenant, key, token))
                doc = await stored_document(result, status_code, self.replayed_headers)
                if not self.store_status(doc["status"]):   # by default a 5xx: store nothing, undo its writes
                    answer = result if isinstance(result, Response) else \
                        render(doc, compact_json(doc.get("body")).decode(), replayed=False)
                    raise Rollback()
                settle = ("idem_complete(%s, %s, %s, response => d.r)" if doc["status"] < 400
                          else "idem_release(%s, %s, %s, failure => d.r)")
                # store it, and read back what was stored: the first answer is rendered from that
                await cur.execute(f"SELECT d.r, {BODY_TEXT.format('d.r')}, {settle}"
                                  " FROM (SELECT %s::jsonb) AS d(r)", (tenant, key, token, Jsonb(doc)))
                stored, body, _ = await cur.fetchone()
            if answer is not None:      # not stored: sent as it is, no hook (as in Node.js and Go)
                return answer, None
            return render(stored, body, replayed=False), False

    async def run_without_key(self, handler: Callable, status_code: int = 200) -> Response:
        """A request without a key (key_required=False): the endpoint runs as
        if undecorated, in a transaction that a raise or a 5xx rolls back."""
        answer = None
        async with self._pool().connection() as conn:
            async with conn.transaction():
                answer = as_response(await handler(conn, None), status_code)
                if answer.status_code >= 500:
                    raise Rollback()
        return answer
