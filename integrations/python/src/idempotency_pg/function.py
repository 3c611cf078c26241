"""@idempotent_function: run any function that takes a psycopg 3 connection
at most once per (tenant, key): queue consumers, scheduled jobs, webhooks.

    @idempotent_function(key="order_id", payload_validation=["order_id", "amount"])
    def charge(conn: psycopg.Connection, event: dict) -> dict:
        conn.execute("INSERT INTO charges ...")     # same transaction as the claim
        return {"charge_id": ...}                   # stored; returned again on a duplicate

One transaction on the function's own connection:

    idem_claim(tenant, key, fingerprint)
      claimed      call the function, store {"result": its return value} with
                   idem_complete; its writes, the claim and the result commit together
      replay       return the stored result without calling the function
      in_progress  raise IdempotencyInProgressError  (nack / requeue with a delay)
      mismatch     raise IdempotencyPayloadMismatchError (dead-letter)
      failed       raise IdempotencyStoredFailureError (settled earlier as a failure)

If the function raises, the transaction rolls back: its writes and the claim
disappear together, and the next delivery runs it again.
"""
import functools
import inspect
import json
from typing import Any, Callable, Iterable, Optional, Union

import psycopg
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from .core import (SET_TENANT_SQL, IdempotencyInProgressError, IdempotencyKeyError,
                   IdempotencyPayloadMismatchError, IdempotencyStoredFailureError, check_identifier,
                   check_tenant_setting, jsonable, payload_fingerprint, value_getter)

__all__ = ["idempotent_function"]

CLAIM_SQL = ("SELECT outcome, token, response, expires_at FROM idem_claim(%s, %s, %s,"
             " lease => %s::interval, ttl => %s::interval, wait => %s::interval)")
COMPLETE_SQL = "SELECT idem_complete(%s, %s, %s, response => %s)"
CONNECTIONS = (psycopg.Connection, psycopg.AsyncConnection)
Interval = Union[None, str]


def _interval(value) -> Optional[str]:
    """'5 minutes', a number of seconds, or a datetime.timedelta as PostgreSQL interval text."""
    if value is None or isinstance(value, str):
        return value
    if hasattr(value, "total_seconds"):
        value = value.total_seconds()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value} seconds"
    raise TypeError(f"An interval must be a string such as '5 minutes', seconds or a timedelta, not {value!r}.")


def idempotent_function(func: Optional[Callable] = None, *,
                        key: Union[str, Callable[[Any], Any]],
                        payload_validation: Union[None, str, Iterable[str], Callable[[Any], Any]] = None,
                        tenant: Union[None, str, Callable[[Any], Any]] = None,
                        ttl=None, lease=None, wait=None,
                        event_argument: Optional[str] = None,
                        connection_argument: Optional[str] = None,
                        key_required: bool = True,
                        encoder: Optional[Callable[[Any], Any]] = None,
                        tenant_setting: Optional[str] = None):
    """Make func run at most once per (tenant, key).

    key                 where the key is in the event: a field path ("order_id",
                        "body.order.id", "Records[0].messageId") or a function
                        of the event.
    payload_validation  which fields make the fingerprint, compared when a key
                        comes again (a different one raises
                        IdempotencyPayloadMismatchError): None (default, no
                        comparison), "*" (the whole event), a path, a list of
                        paths, or a function of the event.
    tenant              whose keys these are: a string, or a function of the
                        event.  Default: the function's module and qualified
                        name, so two consumers never share keys by accident.
    ttl, lease, wait    passed to idem_claim: '1 day', seconds or a timedelta;
                        None takes the server's defaults.  wait > 0 makes a
                        duplicate wait that long for the original to finish
                        and return its result instead of raising in_progress.
    event_argument      the name of the parameter holding the event (default:
                        the first parameter that is not the connection).
    connection_argument the name of the connection parameter (default: the
                        argument that is a psycopg Connection/AsyncConnection).
    key_required        False: an event without a key (None or missing) runs
                        the function without a claim, storing nothing (still
                        in a transaction of its own that a raise rolls back).
    encoder             json.dumps' default for the result and fingerprint
                        (default: dataclasses, pydantic models, dates,
                        decimals, UUIDs, sets).
    tenant_setting      with tenant isolation on (idem_set_tenant_isolation(true,
                        'app.tenant')), the setting its policy reads: the
                        transaction runs set_config(tenant_setting, tenant,
                        true) before the claim.  None (default): nothing is set.

    The function may be sync (psycopg.Connection) or async
    (psycopg.AsyncConnection).  Its return value must be JSON-serializable;
    on a duplicate the stored result is returned, as JSON decodes it.
    """
    if func is None:
        return functools.partial(idempotent_function, key=key, payload_validation=payload_validation,
                                 tenant=tenant, ttl=ttl, lease=lease, wait=wait,
                                 event_argument=event_argument, connection_argument=connection_argument,
                                 key_required=key_required, encoder=encoder, tenant_setting=tenant_setting)
    settings = _Settings(func, key, payload_validation, tenant, ttl, lease, wait,
                         event_argument, connection_argument, key_required, encoder, tenant_setting)

    if inspect.iscoroutinefunction(func):
        @functools.wraps(func)
        async def async_wrapper(*args, **kwargs):
            conn, claim_args = settings.prepare(args, kwargs, psycopg.AsyncConnection)
            if claim_args is None:      # no key, key_required=False: no claim, the same transaction
                async with conn.transaction():
                    return await func(*args, **kwargs)
            async with conn.transaction():
                cur = conn.cursor(row_factory=tuple_row)
                if settings.tenant_setting:
                    await cur.execute(SET_TENANT_SQL, (settings.tenant_setting, claim_args[0]))
                await cur.execute(CLAIM_SQL, claim_args)
                outcome, token, stored, expires_at = await cur.fetchone()
                if outcome == "claimed":
                    result = await func(*args, **kwargs)
                    await cur.execute(COMPLETE_SQL, (*claim_args[:2], token, settings.document(result)))
                    return result
            return settings.settled(claim_args, outcome, stored, expires_at)
        return async_wrapper

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        conn, claim_args = settings.prepare(args, kwargs, psycopg.Connection)
        if claim_args is None:          # no key, key_required=False: no claim, the same transaction
            with conn.transaction():
                return func(*args, **kwargs)
        with conn.transaction():
            cur = conn.cursor(row_factory=tuple_row)
            if settings.tenant_setting:
                cur.execute(SET_TENANT_SQL, (settings.tenant_setting, claim_args[0]))
            cur.execute(CLAIM_SQL, claim_args)
            outcome, token, stored, expires_at = cur.fetchone()
            if outcome == "claimed":
                result = func(*args, **kwargs)
                cur.execute(COMPLETE_SQL, (*claim_args[:2], token, settings.document(result)))
                return result
        return settings.settled(claim_args, outcome, stored, expires_at)
    return wrapper


class _Settings:
    """The decorator's configuration, checked once when the function is decorated."""

    def __init__(self, func, key, payload_validation, tenant, ttl, lease, wait,
                 event_argument, connection_argument, key_required, encoder, tenant_setting):
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
        if tenant is None:
            tenant = f"{func.__module__}.{func.__qualname__}"[-255:]
        self.tenant = tenant if callable(tenant) else (lambda event, t=check_identifier(tenant, "tenant"): t)
        self.intervals = (_interval(lease), _interval(ttl), _interval(wait))
        self.key_required = key_required
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
        return conn, (tenant, key, fingerprint, *self.intervals)

    def document(self, result) -> Jsonb:
        """What idem_complete stores: {"result": ...}, so that None is a result too."""
        return Jsonb({"result": result}, dumps=self._dumps)

    def _dumps(self, value) -> str:
        return json.dumps(value, default=self.encoder, ensure_ascii=False, separators=(",", ":"))

    @staticmethod
    def settled(claim_args, outcome, stored, expires_at):
        """Every outcome but claimed: the stored result, or the exception that says why not."""
        tenant, key = claim_args[:2]
        if outcome == "replay":
            # a record another writer completed (an HTTP handler, SQL) is returned whole
            return stored["result"] if isinstance(stored, dict) and stored.keys() == {"result"} else stored
        if outcome == "in_progress":
            raise IdempotencyInProgressError(tenant, key, expires_at)
        if outcome == "mismatch":
            raise IdempotencyPayloadMismatchError(tenant, key)
        if outcome == "failed":
            raise IdempotencyStoredFailureError(tenant, key, stored)
        raise RuntimeError(f'idem_claim answered an outcome this package does not know: "{outcome}".')
