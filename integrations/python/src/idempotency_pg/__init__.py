"""Exactly-once HTTP endpoints and queue consumers on the idempotency
PostgreSQL extension (idem_claim / idem_complete / idem_release), with the
claim, the work's own writes and the stored result in one transaction.

    from idempotency_pg import idempotent_function        # psycopg 3 functions
    from idempotency_pg.fastapi import Idempotency, Claim  # FastAPI endpoints

The FastAPI part is imported only from idempotency_pg.fastapi, so consumers
need neither FastAPI nor pydantic.
"""
from .core import (RETRY_AFTER_MAX, RETRY_AFTER_MIN, IdempotencyError, IdempotencyInProgressError,
                   IdempotencyKeyError, IdempotencyPayloadMismatchError, IdempotencyStoredFailureError)
from .function import IdempotencyTenantSettingError, idempotent_function

__version__ = "2.0.0"
# the oldest extension version this package works with (idem_claim's wait and expires_at)
EXTENSION_VERSION = "1.2"

__all__ = ["IdempotencyError", "IdempotencyInProgressError", "IdempotencyKeyError",
           "IdempotencyPayloadMismatchError", "IdempotencyStoredFailureError", "IdempotencyTenantSettingError",
           "idempotent_function",
           "__version__", "EXTENSION_VERSION", "RETRY_AFTER_MIN", "RETRY_AFTER_MAX"]
