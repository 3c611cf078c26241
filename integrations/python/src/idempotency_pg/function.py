"""@idempotent_function: run any function that takes a psycopg 3 connection
at most once per (tenant, key): queue consumers, scheduled jobs, webhooks.

    @idempotent_function(key="order_id", tenant="billing", payload_validation=["order_id", "amount"])
    def charge(conn: psycopg.Connection, event: dict) -> dict:
        conn.execute("INSERT INTO charges ...")     # same transaction as the claim
        return {"charge_id": ...}                   # stored; returned again on a duplicate

One transaction on the function's own connection:

    idem_claim(tenant, key, fingerprint)
      claimed      call the function, store its return value (as JSON, the
                   value itself, as the Node.js and Go packages store it) with
                   idem_complete; its writes, the claim and the result commit
                   together; return the result as stored (JSON read back)
      replay       return the stored result without calling the function
      in_progress  raise IdempotencyInProgressError  (nack / requeue with a delay)
      mismatch     raise IdempotencyPayloadMismatchError (dead-letter)
      failed       raise IdempotencyStoredFailureError (settled earlier as a failure)

If the function raises, the transaction rolls back: its writes and the claim
disappear together, and the next delivery runs it again.
"""
import contextlib
import dataclasses
import functools
import inspect
import json
import re
from typing import Any, Callable, Iterable, Optional, Union

import psycopg
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from .core import (RETRY_AFTER_SQL, SET_TENANT_SQL, IdempotencyError, IdempotencyInProgressError,
                   IdempotencyKeyError, IdempotencyPayloadMismatchError, IdempotencyStoredFailureError,
                   check_identifier, check_tenant_setting, interval_text, jsonable, payload_fingerprint, value_getter)

__all__ = ["IdempotencyTenantSettingError", "idempotent_function"]

# the first parameter is the call's wait, for retry_after (as the HTTP integration's 409 says it)
CLAIM_SQL = (f"SELECT outcome, token, response, expires_at, {RETRY_AFTER_SQL} FROM idem_claim(%s, %s, %s,"
             " lease => %s::interval, ttl => %s::interval, wait => %s::interval)")
# with a holder (extension 1.4): named only when given, so a 1.3 server still takes the claim without
CLAIM_HOLDER_SQL = CLAIM_SQL[:-1] + ", holder => %s::text)"
# store the result and read back what was stored: the first call returns what every replay returns
COMPLETE_SQL = "SELECT d.r FROM (SELECT %s::jsonb) AS d(r), idem_complete(%s, %s, %s, response => d.r)"
CONNECTIONS = (psycopg.Connection, psycopg.AsyncConnection)
_REQUIRED = object()
# The server's refusal of a claim when tenant isolation is on and its setting is unset (SQLSTATE
# 55000).  Its hint says to run set_config by hand: with this package, tenant_setting= does.
TENANT_UNSET = re.compile(r'tenant isolation is on, but "([^"]+)" is not set')


class IdempotencyTenantSettingError(IdempotencyError, psycopg.errors.ObjectNotInPrerequisiteState):
    """Tenant isolation is on, and the setting its policy reads was not set
    before the claim: the decorator or the Idempotency was made without
    tenant_setting= (or with another setting's name).  A psycopg error of
    SQLSTATE 55000 (.sqlstate), as the server's, which is its __cause__;
    .setting is the setting the policy reads."""

    def __init__(self, message: str, setting: str):
        super().__init__(message)
        self.setting = setting


@contextlib.contextmanager
def naming_tenant_setting(given: Optional[str], where: str, whose: str):
    """Around a claim: the server's 55000 for an unset tenant setting is raised
    again as IdempotencyTenantSettingError, naming this package's tenant_setting
    option (where: the decorator or class it is given to; whose: "request's",
    "event's"); any other error passes unchanged."""
    try:
        yield
    except psycopg.errors.ObjectNotInPrerequisiteState as e:
        m = TENANT_UNSET.fullmatch(e.diag.message_primary or "")
        if m is None or isinstance(e, IdempotencyTenantSettingError):
            raise
        wanted = m.group(1)
        if given:
            text = (f'Tenant isolation is on and its policy reads "{wanted}", but {where} was given'
                    f' tenant_setting="{given}" (SQLSTATE 55000). Give tenant_setting="{wanted}".')
        else:
            text = (f'Tenant isolation is on, but "{wanted}" is not set (SQLSTATE 55000): give {where} the'
                    f' tenant_setting option, tenant_setting="{wanted}", and it sets "{wanted}" to each {whose}'
                    " tenant in the claim's transaction.")
        raise IdempotencyTenantSettingError(text, wanted) from e


def _per_call(value, what):
    """ttl, lease, wait: interval text, seconds, a timedelta, None, or a
    function of the event returning one of those (per call)."""
    if callable(value):
        return lambda event: interval_text(value(event), what)
    text = interval_text(value, what)
    return lambda event: text


def _holder(value):
    """holder: None, a non-empty string, or a function of the event returning one (or None)."""
    def checked(holder):
        if holder is None:
            return None
        if not isinstance(holder, str) or holder == "":
            raise TypeError(f"holder must be a non-empty string or None, not {holder!r}.")
        return holder
    if callable(value):
        return lambda event: checked(value(event))
    fixed = checked(value)
    return lambda event: fixed


def _serializer(spec) -> Optional[Callable[[Any], Any]]:
    """output_serializer: None (the JSON as stored), a pydantic model class, a
    dataclass, or a function of the stored JSON."""
    if spec is None:
        return None
    if isinstance(spec, type) and hasattr(spec, "model_validate"):          # pydantic 2
        return spec.model_validate
    if isinstance(spec, type) and hasattr(spec, "parse_obj"):               # pydantic 1
        return spec.parse_obj
    if isinstance(spec, type) and dataclasses.is_dataclass(spec):
        return lambda data: spec(**data)
    if callable(spec):
        return spec
    raise TypeError("output_serializer must be a pydantic model, a dataclass or a function of the stored JSON.")


def _jmespath(expression: str, what: str, encoder) -> Callable[[Any], Any]:
    """A function of the event from a JMESPath expression (Debian: python3-jmespath),
    compiled when the function is decorated; the event is read as its JSON."""
    try:
        import jmespath
    except ImportError:
        raise ImportError(f"{what} needs the jmespath module (Debian: python3-jmespath; pip: jmespath);"
                          " a field path (key=, payload_validation=) needs nothing.") from None
    if not isinstance(expression, str) or not expression.strip():
        raise ValueError(f"{what} must be a JMESPath expression.")
    compiled = jmespath.compile(expression)
    dumps = functools.partial(json.dumps, default=encoder or jsonable)
    return lambda event: compiled.search(json.loads(dumps(event)))


def idempotent_function(func: Optional[Callable] = None, *,
                        key: Union[None, str, Callable[[Any], Any]] = None,
                        tenant: Union[str, Callable[[Any], Any]] = _REQUIRED,
                        payload_validation: Union[None, str, Iterable[str], Callable[[Any], Any]] = None,
                        ttl=None, lease=None, wait=None, holder=None,
                        event_argument: Optional[str] = None,
                        connection_argument: Optional[str] = None,
                        raise_on_missing_key: bool = True,
                        key_required: Optional[bool] = None,
                        encoder: Optional[Callable[[Any], Any]] = None,
                        output_serializer=None,
                        response_hook: Optional[Callable[[Any, bool], Any]] = None,
                        tenant_setting: Optional[str] = None,
                        event_key_jmespath: Optional[str] = None,
                        payload_validation_jmespath: Optional[str] = None):
    """Make func run at most once per (tenant, key).

    key                 where the key is in the event: a field path ("order_id",
                        "body.order.id", "Records[0].messageId") or a function
                        of the event.
    event_key_jmespath, payload_validation_jmespath
                        AWS Powertools' names: the key, or what makes the
                        fingerprint, as a JMESPath expression over the event
                        (its JSON), instead of key= or payload_validation=.
                        Needs the jmespath module (Debian: python3-jmespath).
    payload_validation  which fields make the fingerprint, compared when a key
                        comes again (a different one raises
                        IdempotencyPayloadMismatchError): None (default, no
                        comparison), "*" (the whole event), a path, a list of
                        paths, or a function of the event.
    tenant              whose keys these are (required): a string, or a
                        function of the event.  Name it yourself (the
                        consumer group, the queue) so a refactoring cannot
                        change it.
    ttl, lease, wait    passed to idem_claim: '1 day', seconds, a timedelta,
                        or a function of the event returning one (per call);
                        None takes the server's defaults.  wait > 0 makes a
                        duplicate wait that long for the original to finish
                        and return its result instead of raising in_progress.
    holder              who is claiming (extension 1.4): a string naming the
                        execution (a durable execution's ARN, a workflow run
                        id) or a function of the event returning one.  While
                        a claim this holder committed is in progress with a
                        live lease, the same holder claims it again (the
                        function runs, with the record's token); any other
                        holder, or none, gets IdempotencyInProgressError.
                        None (default): no holder is sent (1.3 servers too).
    event_argument      the name of the parameter holding the event (default:
                        the first parameter that is not the connection).
    connection_argument the name of the connection parameter (default: the
                        argument that is a psycopg Connection/AsyncConnection).
    raise_on_missing_key  True (default): an event without a key raises
                        IdempotencyKeyError.  False: it runs the function
                        without a claim, storing nothing (still in a
                        transaction of its own that a raise rolls back).
                        key_required is the older name of this option.
    encoder             json.dumps' default for the result and fingerprint
                        (default: dataclasses, pydantic models, dates,
                        decimals, UUIDs, sets).
    output_serializer   what the stored JSON is turned into, on the first
                        call as on every replay: a pydantic model, a
                        dataclass or a function of the JSON.  Default None:
                        the JSON as stored (dicts, lists, strings, numbers).
    response_hook       a function (result, replayed) called with every
                        result; what it returns is returned.  replayed is
                        True when the function did not run (a duplicate).
    tenant_setting      with tenant isolation on (idem_set_tenant_isolation(true,
                        'app.tenant')), the setting its policy reads: the
                        transaction runs set_config(tenant_setting, tenant,
                        true) before the claim.  None (default): nothing is set.

    The function may be sync (psycopg.Connection) or async
    (psycopg.AsyncConnection).  Its return value must be JSON-serializable;
    the first call and every duplicate return the stored JSON (through
    output_serializer when given), so they return the same type.
    """
    if (key is None) == (event_key_jmespath is None):
        raise TypeError("idempotent_function needs key= (a field path or a function of the event) or"
                        " event_key_jmespath=, one of them.")
    if payload_validation is not None and payload_validation_jmespath is not None:
        raise TypeError("payload_validation= and payload_validation_jmespath= are two ways of one option: give one.")
    if event_key_jmespath is not None:
        key = _jmespath(event_key_jmespath, "event_key_jmespath", encoder)
    if payload_validation_jmespath is not None:
        payload_validation = _jmespath(payload_validation_jmespath, "payload_validation_jmespath", encoder)
    if tenant is _REQUIRED:
        raise TypeError("idempotent_function needs tenant=: a string naming the consumer (its group, its queue)"
                        " or a function of the event.")
    options = dict(key=key, payload_validation=payload_validation, tenant=tenant, ttl=ttl, lease=lease, wait=wait,
                   holder=holder, event_argument=event_argument, connection_argument=connection_argument,
                   raise_on_missing_key=raise_on_missing_key if key_required is None else key_required,
                   encoder=encoder, output_serializer=output_serializer, response_hook=response_hook,
                   tenant_setting=tenant_setting)
    if func is None:
        return lambda f: _decorate(f, options)
    return _decorate(func, options)


def claim_sql(claim_args):
    """idem_claim with holder => only when the call has a holder (its 7th argument)."""
    return CLAIM_HOLDER_SQL if len(claim_args) > 6 else CLAIM_SQL


def _decorate(func, options):
    settings = _Settings(func, **options)

    if inspect.iscoroutinefunction(func):
        @functools.wraps(func)
        async def async_wrapper(*args, **kwargs):
            conn, claim_args = settings.prepare(args, kwargs, psycopg.AsyncConnection)
            if claim_args is None:      # no key, raise_on_missing_key=False: no claim, the same transaction
                async with conn.transaction():
                    return await func(*args, **kwargs)
            async with conn.transaction():
                cur = conn.cursor(row_factory=tuple_row)
                if settings.tenant_setting:
                    await cur.execute(SET_TENANT_SQL, (settings.tenant_setting, claim_args[0]))
                with naming_tenant_setting(settings.tenant_setting, "idempotent_function(...)", "event's"):
                    await cur.execute(claim_sql(claim_args), (claim_args[5], *claim_args))
                outcome, token, stored, *expiry = await cur.fetchone()
                if outcome == "claimed":
                    result = await func(*args, **kwargs)
                    await cur.execute(COMPLETE_SQL, (settings.document(result), *claim_args[:2], token))
                    (stored,) = await cur.fetchone()
            # after the commit: a serializer or hook that raises cannot undo the stored result
            return settings.settled(claim_args, outcome, stored, *expiry)
        return async_wrapper

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        conn, claim_args = settings.prepare(args, kwargs, psycopg.Connection)
        if claim_args is None:          # no key, raise_on_missing_key=False: no claim, the same transaction
            with conn.transaction():
                return func(*args, **kwargs)
        with conn.transaction():
            cur = conn.cursor(row_factory=tuple_row)
            if settings.tenant_setting:
                cur.execute(SET_TENANT_SQL, (settings.tenant_setting, claim_args[0]))
            with naming_tenant_setting(settings.tenant_setting, "idempotent_function(...)", "event's"):
                cur.execute(claim_sql(claim_args), (claim_args[5], *claim_args))
            outcome, token, stored, *expiry = cur.fetchone()
            if outcome == "claimed":
                result = func(*args, **kwargs)
                cur.execute(COMPLETE_SQL, (settings.document(result), *claim_args[:2], token))
                (stored,) = cur.fetchone()
        return settings.settled(claim_args, outcome, stored, *expiry)
    return wrapper


class _Settings:
    """The decorator's configuration, checked once when the function is decorated."""

    def __init__(self, func, key, payload_validation, tenant, ttl, lease, wait, holder, event_argument,
                 connection_argument, raise_on_missing_key, encoder, output_serializer, response_hook,
                 tenant_setting):
        self.signature = inspect.signature(func)
        names = list(self.signature.parameters)
        for what, name in (("event_argument", event_argument), ("connection_argument", connection_argument)):
            if name is not None and name not in names:
                raise TypeError(f'{func.__qualname__} has no parameter "{name}" ({what}).')
        self.connection_argument = connection_argument
        self.event_argument = event_argument
        self.key = value_getter(key, "key")
        self.encoder = encoder or jsonable
        self.fingerprint = payload_fingerprint(payload_validation, self.encoder)
        self.tenant = tenant if callable(tenant) else (lambda event, t=check_identifier(tenant, "tenant"): t)
        self.intervals = (_per_call(lease, "lease"), _per_call(ttl, "ttl"), _per_call(wait, "wait"))
        self.holder = _holder(holder)
        self.key_required = raise_on_missing_key
        self.serializer = _serializer(output_serializer)
        if response_hook is not None and not callable(response_hook):
            raise TypeError("response_hook must be a function (result, replayed).")
        self.response_hook = response_hook
        self.tenant_setting = check_tenant_setting(tenant_setting)
        self.func_name = func.__qualname__

    def prepare(self, args, kwargs, connection_class):
        """(connection, idem_claim's arguments), or (connection, None) to run untouched."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
        if self.connection_argument:
            conn_name = self.connection_argument
        else:
            conn_name = next((n for n, v in values.items() if isinstance(v, CONNECTIONS)), None)
        conn = values.get(conn_name)
        if not isinstance(conn, connection_class):
            raise TypeError(f"{self.func_name} must be called with a {connection_class.__module__}."
                            f"{connection_class.__name__}" + (f' as "{conn_name}"' if conn_name else "") +
                            f", not {type(conn).__name__}.")
        event_name = self.event_argument or next((n for n in values if n != conn_name), None)
        if event_name is None:
            raise TypeError(f"{self.func_name} has no argument besides the connection to take the key from.")
        event = values[event_name]

        key = self.key(event)
        if key is None:
            if not self.key_required:
                return conn, None
            raise IdempotencyKeyError(f"The event has no idempotency key (argument \"{event_name}\" of"
                                      f" {self.func_name}).")
        key = check_identifier(key, "idempotency key")
        tenant = check_identifier(self.tenant(event), "tenant")
        fingerprint = self.fingerprint(event) if self.fingerprint else None
        holder = self.holder(event)
        return conn, (tenant, key, fingerprint, *(f(event) for f in self.intervals),
                      *(() if holder is None else (holder,)))

    def document(self, result) -> Jsonb:
        """What idem_complete stores: the result itself (None as JSON null), the
        shape the Node.js and Go packages store, so a record written by one
        replays in the others."""
        return Jsonb(result, dumps=self._dumps)

    def _dumps(self, value) -> str:
        return json.dumps(value, default=self.encoder, ensure_ascii=False, separators=(",", ":"))

    def answer(self, stored, replayed: bool):
        """What the caller gets of a stored document, the first time as on a replay."""
        result = stored
        if self.serializer is not None:
            result = self.serializer(result)
        if self.response_hook is not None:
            result = self.response_hook(result, replayed)
        return result

    def settled(self, claim_args, outcome, stored, expires_at, retry_after):
        """Every outcome but claimed: the stored result, or the exception that says why not."""
        tenant, key = claim_args[:2]
        if outcome in ("claimed", "replay"):
            return self.answer(stored, outcome == "replay")
        if outcome == "in_progress":
            raise IdempotencyInProgressError(tenant, key, expires_at, retry_after)
        if outcome == "mismatch":
            raise IdempotencyPayloadMismatchError(tenant, key)
        if outcome == "failed":
            raise IdempotencyStoredFailureError(tenant, key, stored)
        raise RuntimeError(f'idem_claim answered an outcome this package does not know: "{outcome}".')
