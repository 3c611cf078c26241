"""What every integration shares: the exceptions, identifier checks,
canonical JSON, fingerprints and field paths into an event.

No framework and no database driver is imported here.
"""
import dataclasses
import datetime
import decimal
import enum
import hashlib
import json
import re
import uuid
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Optional, Sequence, Union

MAX_IDENTIFIER_BYTES = 255          # the extension's limit on tenant_id and key (22001 beyond)
# A custom setting as idem_set_tenant_isolation accepts it: two or more
# dot-separated identifiers ("app.tenant").
SETTING_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*(?:\.[A-Za-z_][A-Za-z0-9_$]*)+")
# Run in the claim's transaction before the claim: transaction-local (is_local
# true), so it ends with the transaction, also through PgBouncer's transaction
# pooling.  Name and tenant are bind parameters.
SET_TENANT_SQL = "SELECT pg_catalog.set_config(%s, %s, true)"

# The same in the Python, Node.js and Go packages (docs/integrations.md,
# "One behaviour in three packages"): the titles of the problem documents...
TITLE_KEY_REQUIRED = "An Idempotency-Key header is required"
TITLE_KEY_INVALID = "The Idempotency-Key header is invalid"
TITLE_TENANT_INVALID = "The tenant is invalid"
TITLE_IN_PROGRESS = "A request with this Idempotency-Key is still being processed"
TITLE_MISMATCH = "This Idempotency-Key was used for a different request"
# ...the headers a stored answer keeps and replays (an allow-list, lower case)...
DEFAULT_REPLAYED_HEADERS = ("location", "content-location", "link")
# ...and Retry-After of a 409 (seconds, RETRY_AFTER_MIN..RETRY_AFTER_MAX): the
# seconds left of the holder's lease when its end is known (a committed claim,
# the two-phase pattern); while the holder has not committed its claim (claim
# and handler in one transaction: the usual case) its answer comes with its
# commit, so the call's wait (a duplicate that waited that long tries again
# after as long), else 1.  %s is the call's wait.
RETRY_AFTER_MIN, RETRY_AFTER_MAX = 1, 60
RETRY_AFTER_SQL = (f"greatest({RETRY_AFTER_MIN}, least({RETRY_AFTER_MAX}, ceil(extract(epoch FROM"
                   " coalesce(expires_at - clock_timestamp(), %s::interval, interval '1 second')))))::int")
# 4xx answers that may differ on a retry (the IETF draft's advice: never store a 409)
NOT_DETERMINISTIC_4XX = frozenset({408, 409, 425, 429})


def default_store_status(status: int) -> bool:
    """Which answers are stored and replayed by default: 2xx and 3xx, and the
    deterministic 4xx (not 408, 409, 425, 429); never a 5xx.  An answer not
    stored rolls back the handler's writes with the claim, so a retry runs
    again."""
    return 200 <= status < 400 or (400 <= status < 500 and status not in NOT_DETERMINISTIC_4XX)


class IdempotencyError(Exception):
    """Base class of every exception this package raises on purpose."""


class IdempotencyKeyError(IdempotencyError, ValueError):
    """The key or the tenant is missing, empty, too long or not text.
    Nothing was claimed: fix the caller, or derive the key differently."""


class IdempotencyInProgressError(IdempotencyError):
    """Another transaction holds the key: the original is still running (or
    committed a claim whose lease is live).  Retry later with the same key;
    a queue consumer should nack or requeue with a delay of retry_after
    seconds, as an HTTP 409's Retry-After: the holder's lease left when its
    claim is committed, else the call's wait or 1; between 1 and 60."""

    def __init__(self, tenant: str, key: str, lease_expires_at=None, retry_after: Optional[int] = None):
        super().__init__(f'The idempotency key "{key}" of tenant "{tenant}" is being processed'
                         " by another transaction; retry later.")
        self.tenant, self.key, self.lease_expires_at = tenant, key, lease_expires_at
        self.retry_after = retry_after


class IdempotencyPayloadMismatchError(IdempotencyError):
    """The key was used before with another payload (another fingerprint).
    Usually a bug upstream: a dead letter, not a retry."""

    def __init__(self, tenant: str, key: str):
        super().__init__(f'The idempotency key "{key}" of tenant "{tenant}" was used before'
                         " with a different payload.")
        self.tenant, self.key = tenant, key


class IdempotencyStoredFailureError(IdempotencyError):
    """The key was settled earlier as a failure (idem_release with a failure
    document, or a lease that expired under idempotency.stale_action = 'fail').
    The stored document is in .failure."""

    def __init__(self, tenant: str, key: str, failure: Any):
        super().__init__(f'The idempotency key "{key}" of tenant "{tenant}" was settled earlier'
                         f" as a failure: {json.dumps(failure)[:200]}")
        self.tenant, self.key, self.failure = tenant, key, failure


def check_identifier(value: Any, what: str, printable_ascii: bool = False) -> str:
    """A tenant or key as the extension takes it: text of 1..255 UTF-8 bytes
    without NUL; printable ASCII only when it comes from an HTTP header."""
    if isinstance(value, bool) or not isinstance(value, (str, int, uuid.UUID)):
        raise IdempotencyKeyError(f"The {what} must be a string, an integer or a UUID, not {type(value).__name__}.")
    value = str(value)
    if not value:
        raise IdempotencyKeyError(f"The {what} must not be empty.")
    size = len(value.encode("utf-8"))
    if size > MAX_IDENTIFIER_BYTES:
        raise IdempotencyKeyError(f"The {what} is too long: {size} bytes; the limit is {MAX_IDENTIFIER_BYTES}.")
    if printable_ascii and not all(" " <= c <= "~" for c in value):
        raise IdempotencyKeyError(f"The {what} must be printable ASCII.")
    if "\0" in value:
        raise IdempotencyKeyError(f"The {what} must not contain a NUL character.")
    return value


def check_tenant_setting(name: Optional[str]) -> Optional[str]:
    """tenant_setting: None, or the custom setting the isolation policy reads
    (the one given to idem_set_tenant_isolation, e.g. "app.tenant")."""
    if name is None:
        return None
    if not isinstance(name, str) or not SETTING_NAME.fullmatch(name):
        raise ValueError(f"tenant_setting must name a custom setting such as 'app.tenant' (two or more"
                         f" dot-separated identifiers), not {name!r}.")
    return name


def interval_text(value: Any, what: str = "An interval") -> Optional[str]:
    """None, or interval text for PostgreSQL from '5 minutes', a number of
    seconds or a datetime.timedelta."""
    if value is None or isinstance(value, str):
        return value
    if hasattr(value, "total_seconds"):
        value = value.total_seconds()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value} seconds"
    raise TypeError(f"{what} must be an interval such as '5 minutes', seconds or a timedelta, not {value!r}.")


def jsonable(value: Any) -> Any:
    """json.dumps' default: the usual types of events and results that JSON
    has no type for (dataclasses, pydantic models, dates, decimals, UUIDs, sets)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "model_dump"):                    # pydantic 2
        return value.model_dump(mode="json")
    if hasattr(value, "dict") and hasattr(value, "__fields__"):   # pydantic 1
        return json.loads(value.json())
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=canonical_json)
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "backslashreplace")
    raise TypeError(f"{type(value).__name__} is not JSON serializable; pass an encoder that converts it.")


def canonical_json(value: Any, default: Callable[[Any], Any] = None) -> str:
    """JSON with sorted keys and no spacing: equal data, equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=default or jsonable)


def sha256_hex(data: Union[str, bytes]) -> str:
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


# ---------------------------------------------------------------- field paths

_MISSING = object()
_SEGMENT = re.compile(r"""
    (?P<name>[^.\[\]]+)                 # a field name
  | \[(?P<index>-?\d+)\]                # [3], [-1]: a list index
  | \[(?P<quote>["'])(?P<quoted>.*?)(?P=quote)\]   # ["a.b"]: a name with dots
  | (?P<dot>\.)
""", re.VERBOSE)


def parse_path(path: str) -> tuple:
    """'body.order.id', 'records[0].messageId', 'headers["x-request.id"]' into
    its steps: names (str) and indexes (int).  A small subset of JMESPath:
    enough to point at one value; use a function for anything more."""
    if not isinstance(path, str) or not path.strip():
        raise ValueError("A field path must be a non-empty string.")
    steps, pos, expect_name = [], 0, True
    while pos < len(path):
        m = _SEGMENT.match(path, pos)
        if not m:
            raise ValueError(f'The field path "{path}" is invalid at character {pos + 1}.')
        if m.group("dot"):
            if expect_name:
                raise ValueError(f'The field path "{path}" has an empty field name at character {pos + 1}.')
            expect_name = True
        elif m.group("name") is not None:
            if not expect_name:
                raise ValueError(f'The field path "{path}" needs a "." before character {pos + 1}.')
            steps.append(m.group("name").strip())
            expect_name = False
        elif m.group("index") is not None:
            steps.append(int(m.group("index")))
            expect_name = False
        else:
            steps.append(m.group("quoted"))
            expect_name = False
        pos = m.end()
    if expect_name:
        raise ValueError(f'The field path "{path}" ends with ".".')
    return tuple(steps)


def lookup(event: Any, steps: Sequence) -> Any:
    """The value at steps in event (mappings by key, sequences by index,
    other objects, such as dataclasses and pydantic models, by attribute),
    or _MISSING.  A name never reads a method or an attribute of a
    sequence, string, number or None ('items.count', 'amount.real' are
    missing, as in the Node.js package and JMESPath)."""
    value = event
    for step in steps:
        if isinstance(step, int):
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                return _MISSING
            try:
                value = value[step]
            except IndexError:
                return _MISSING
        elif isinstance(value, Mapping):
            if step not in value:
                return _MISSING
            value = value[step]
        else:
            if value is None or isinstance(value, (str, bytes, int, float, Sequence)):
                return _MISSING
            value = getattr(value, step, _MISSING)
            if value is _MISSING or callable(value):
                return _MISSING
    return value


def value_getter(spec: Union[str, Callable[[Any], Any]], what: str) -> Callable[[Any], Any]:
    """A function of the event from a field path or a function; a missing
    field gives None."""
    if callable(spec):
        return spec
    steps = parse_path(spec)

    def get(event):
        value = lookup(event, steps)
        return None if value is _MISSING else value

    get.__name__ = f"{what}_at_{spec}"
    return get


def payload_fingerprint(spec: Union[None, str, Iterable[str], Callable[[Any], Any]],
                        encoder: Callable[[Any], Any] = None) -> Optional[Callable[[Any], str]]:
    """The fingerprint function for payload_validation:
    None        no fingerprint (the key alone decides; nothing is compared);
    "*"         the whole event;
    a path      that field;
    paths       those fields (a missing one counts as null);
    a function  what it returns.
    Each is hashed as canonical JSON (encoder: json.dumps' default), so key
    order and spacing do not count."""
    if spec is None:
        return None
    if callable(spec):
        return lambda event: "sha256:" + sha256_hex(canonical_json(spec(event), encoder))
    if spec == "*":
        return lambda event: "sha256:" + sha256_hex(canonical_json(event, encoder))
    paths = [spec] if isinstance(spec, str) else list(spec)
    if not paths:
        raise ValueError("payload_validation needs at least one field path.")
    parsed = [(p, parse_path(p)) for p in paths]

    def fingerprint(event):
        fields = {}
        for path, steps in parsed:
            value = lookup(event, steps)
            fields[path] = None if value is _MISSING else value
        return "sha256:" + sha256_hex(canonical_json(fields, encoder))

    return fingerprint
