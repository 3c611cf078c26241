"""Checks of @idempotent_function against a real PostgreSQL with the
extension, run by test/suites/76-python as the unprivileged role of the
example schema (examples/fastapi/schema.sql, role ledger_app).

run(check, admin_dsn, app_dsn, tenant_setting): check(ok, what, detail="")
counts one assertion; admin_dsn is a superuser's (to create the table these
checks write to), app_dsn the application role's; tenant_setting is None
with tenant isolation off, else the setting its policy reads ('app.tenant'),
given to every decorator under test.
"""
import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import SimpleNamespace

import psycopg

from idempotency_pg import (IdempotencyError, IdempotencyInProgressError, IdempotencyKeyError,
                            IdempotencyPayloadMismatchError, IdempotencyStoredFailureError, idempotent_function)
from idempotency_pg.core import _MISSING as MISSING, lookup, parse_path

SCHEMA = """
CREATE TABLE IF NOT EXISTS consumer_effects (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    handler text   NOT NULL,
    key     text   NOT NULL,
    amount  bigint
);
GRANT SELECT, INSERT ON consumer_effects TO ledger_app;
"""
calls = {}          # handler name -> how many times its body ran
calls_lock = threading.Lock()


def ran(name):
    with calls_lock:
        calls[name] = calls.get(name, 0) + 1


def effects(admin, handler, key=None):
    """How many rows the handler's body committed (for key, if given)."""
    cur = admin.execute("SELECT count(*) FROM consumer_effects WHERE handler = %s"
                        " AND (%s::text IS NULL OR key = %s)", (handler, key, key))
    return cur.fetchone()[0]


def record(admin, tenant, key):
    """(status, response, ttl) of the record, or None."""
    return admin.execute("SELECT status, response, ttl FROM idempotency_records WHERE tenant_id = %s AND key = %s",
                         (tenant, key)).fetchone()


def raises(exc_type, call):
    """The exception call() raised if it is an exc_type, else None."""
    try:
        call()
    except exc_type as e:
        return e
    except Exception as e:      # the wrong exception is a failed check, shown in the detail
        return RuntimeError(f"raised {type(e).__name__}: {e}")
    return None


# ---------------------------------------------------------------- handlers under test

@dataclass
class Job:
    job_id: int
    payload: dict


def handlers(tenant_setting):
    """The decorated functions under test, each given tenant_setting (None:
    tenant isolation off)."""
    @idempotent_function(key="order_id", payload_validation=["order_id", "amount"], tenant="billing", ttl="7 days",
                         tenant_setting=tenant_setting)
    def charge(conn, event):
        ran("charge")
        conn.execute("INSERT INTO consumer_effects (handler, key, amount) VALUES ('charge', %s, %s)",
                     (event["order_id"], event["amount"]))
        if event.get("fail"):
            raise RuntimeError("the charge failed after its insert")
        return {"charged": event["amount"], "currency": "EUR"}

    @idempotent_function(key="Records[0].body.message_id", tenant=lambda e: e["Records"][0]["queue"],
                         tenant_setting=tenant_setting)
    def consume(conn: psycopg.Connection, message: dict):
        ran("consume")
        conn.execute("INSERT INTO consumer_effects (handler, key) VALUES ('consume', %s)",
                     (message["Records"][0]["body"]["message_id"],))
        return None                                   # nothing to return is a result too

    @idempotent_function(key=lambda job: None if job.job_id is None else f"job-{job.job_id}", payload_validation="*",
                         tenant="jobs", event_argument="job", connection_argument="db", raise_on_missing_key=False,
                         tenant_setting=tenant_setting)
    def run_job(job: Job, db, attempt: int = 1):
        ran("run_job")
        db.execute("INSERT INTO consumer_effects (handler, key) VALUES ('run_job', %s)", (str(job.job_id),))
        return {"job": job.job_id, "payload": job.payload}

    @idempotent_function(key="id", tenant="slow", wait="10 seconds", tenant_setting=tenant_setting)
    def slow(conn, event):
        ran("slow")
        conn.execute("INSERT INTO consumer_effects (handler, key) VALUES ('slow', %s)", (event["id"],))
        time.sleep(0.3)
        return {"done": event["id"]}

    @idempotent_function(key="id", tenant="unserializable", tenant_setting=tenant_setting)
    def unserializable(conn, event):
        conn.execute("INSERT INTO consumer_effects (handler, key) VALUES ('unserializable', %s)", (event["id"],))
        return {"lock": threading.Lock()}

    @idempotent_function(key="id", payload_validation="amount", tenant="async", tenant_setting=tenant_setting)
    async def charge_async(conn: psycopg.AsyncConnection, event):
        ran("charge_async")
        await conn.execute("INSERT INTO consumer_effects (handler, key, amount) VALUES ('charge_async', %s, %s)",
                           (event["id"], event["amount"]))
        if event.get("fail"):
            raise RuntimeError("failing after the insert")
        return {"charged": event["amount"]}

    return SimpleNamespace(charge=charge, consume=consume, run_job=run_job, slow=slow,
                           unserializable=unserializable, charge_async=charge_async)


# ---------------------------------------------------------------- checks

h = None                # this run's handlers (handlers(tenant_setting))
setting = None          # this run's tenant_setting


def as_tenant(conn, tenant):
    """A connection the checks claim on directly, as tenant (for the rest of
    its session) when tenant isolation is on."""
    if setting:
        conn.execute("SELECT set_config(%s, %s, false)", (setting, tenant))
        conn.commit()


def run(check, admin_dsn, app_dsn, tenant_setting=None):
    """tenant_setting: None with tenant isolation off; with it on, the setting
    its policy reads, given to every decorator under test."""
    global h, setting
    h, setting = handlers(tenant_setting), tenant_setting
    calls.clear()
    admin = psycopg.connect(admin_dsn, autocommit=True)
    admin.execute(SCHEMA)
    app = psycopg.connect(app_dsn)                       # not autocommit: the decorator's transaction
    started = time.time()
    try:
        check_tenant_setting(check, admin, app)
        check_basic(check, admin, app)
        check_isolated(check, admin, app)
        check_paths_tenants_results(check, admin, app)
        check_failures(check, admin, app)
        check_in_progress(check, admin, app, app_dsn)
        check_holder(check, admin, app, app_dsn)
        check_caller_transaction(check, admin, app)
        check_results_and_options(check, admin, app)
        check_jmespath(check, admin, app)
        check_concurrent(check, admin, app_dsn)
        asyncio.run(check_async(check, admin, app_dsn))
    finally:
        app.close()
        admin.close()
    print(f"     (decorator checks: {time.time() - started:.1f} s)")


def check_tenant_setting(check, admin, app):
    """tenant_setting is checked when the function is decorated; with tenant
    isolation on, a function decorated without it is refused by the server
    (55000: the setting is not set, or 42501), runs nothing and stores
    nothing; with isolation off it runs."""
    for bad in ("tenant", "app.x'); DROP TABLE consumer_effects; --", 1):
        e = raises(ValueError,
                   lambda: idempotent_function(key="id", tenant="t", tenant_setting=bad)(lambda conn, event: None))
        check(isinstance(e, ValueError) and "tenant_setting" in str(e),
              f"consumer: tenant_setting={bad!r} is refused when the function is decorated", repr(e))

    @idempotent_function(key="id", tenant="no-setting")
    def unset(conn, event):
        ran("unset")
        conn.execute("INSERT INTO consumer_effects (handler, key) VALUES ('unset', %s)", (event["id"],))
        return {"ran": True}

    try:
        result, state = unset(app, {"id": "n-1"}), None
    except psycopg.Error as e:
        result, state = None, e.sqlstate
    if setting:
        check(state in ("55000", "42501") and "unset" not in calls and effects(admin, "unset") == 0
              and record(admin, "no-setting", "n-1") is None,
              "consumer, isolation on: a function decorated without tenant_setting is refused (55000 or 42501),"
              " runs nothing, stores nothing", f"{state} {result} {calls}")
    else:
        check(result == {"ran": True} and calls.get("unset") == 1,
              "consumer, isolation off: a function decorated without tenant_setting runs", f"{state} {result}")
    if setting:
        check_tenant_setting_named(check, app)


def check_tenant_setting_named(check, app):
    """With isolation on, the server's refusal for an unset setting (its hint: set_config by hand)
    comes back naming this package's option, tenant_setting=, still a psycopg error of SQLSTATE 55000;
    a decorator given another setting's name is told which one the policy reads."""
    named = {}
    for given in (None, "app.other_tenant"):
        @idempotent_function(key="id", tenant="no-setting", tenant_setting=given)
        def unnamed(conn, event):
            return {"ran": True}
        try:
            unnamed(app, {"id": f"named-{given}"})
        except psycopg.Error as e:
            named[given] = e
    unset, other = named.get(None), named.get("app.other_tenant")
    check(isinstance(unset, IdempotencyError) and unset.sqlstate == "55000"
          and getattr(unset.__cause__, "sqlstate", None) == "55000" and "set_config" not in str(unset)
          and f'give idempotent_function(...) the tenant_setting option, tenant_setting="{setting}"' in str(unset),
          "consumer, isolation on: without tenant_setting the error names the option (tenant_setting=), not"
          " set_config, and keeps SQLSTATE 55000", repr(unset))
    check(isinstance(other, IdempotencyError) and other.sqlstate == "55000"
          and f'its policy reads "{setting}", but idempotent_function(...) was given'
              ' tenant_setting="app.other_tenant"' in str(other),
          "consumer, isolation on: a tenant_setting naming another setting is told the one the policy reads",
          repr(other))


def check_isolated(check, admin, app):
    """A record the decorator wrote as tenant billing carries it; with
    isolation on, an application session of another tenant does not see it
    (off: it does)."""
    owners = [r[0] for r in admin.execute("SELECT tenant_id FROM idempotency_records WHERE key = 'o-1'")]
    seen = {}
    for tenant in ("billing", "jobs"):
        app.execute("SELECT set_config(%s, %s, true)", (setting or "app.tenant", tenant))
        seen[tenant] = app.execute("SELECT count(*) FROM idempotency_records WHERE key = 'o-1'").fetchone()[0]
        app.rollback()
    check(owners == ["billing"] and seen == {"billing": 1, "jobs": 0 if setting else 1},
          "consumer: the record carries the tenant it was claimed for; another tenant's session sees it only with"
          f" isolation off (isolation {'on' if setting else 'off'})", f"{owners} {seen}")


def check_basic(check, admin, app):
    event = {"order_id": "o-1", "amount": 1250, "received_at": "2026-01-01T10:00:00Z"}
    first = h.charge(app, event)
    rec = record(admin, "billing", "o-1")
    check(first == {"charged": 1250, "currency": "EUR"} and calls["charge"] == 1 and effects(admin, "charge") == 1
          and rec is not None and rec[0] == "completed" and rec[1] == first,
          "consumer: the first delivery runs the function; its insert and its result (stored as it is) commit"
          " together",
          f"{first} {calls} {rec}")
    check(rec is not None and str(rec[2]) in ("7 days, 0:00:00", "7 days"),
          "consumer: ttl is passed to idem_claim (the record keeps 7 days)", f"{rec}")
    again = h.charge(app, dict(event, received_at="2026-01-01T10:05:00Z"))
    check(again == first and calls["charge"] == 1 and effects(admin, "charge") == 1,
          "consumer: a redelivery (a field outside payload_validation differs) returns the stored result,"
          " the function does not run", f"{again} {calls}")
    e = raises(IdempotencyPayloadMismatchError, lambda: h.charge(app, dict(event, amount=1300)))
    check(isinstance(e, IdempotencyPayloadMismatchError) and e.key == "o-1" and calls["charge"] == 1
          and effects(admin, "charge") == 1,
          "consumer: the same key with another amount raises IdempotencyPayloadMismatchError", repr(e))
    check(app.info.transaction_status == psycopg.pq.TransactionStatus.IDLE,
          "consumer: the connection is left idle (committed), not in a transaction",
          str(app.info.transaction_status))


def check_paths_tenants_results(check, admin, app):
    event = {"items": [1, 2], "amount": 5, "note": "x", "job": Job(3, {"n": 1})}
    found = {path: lookup(event, parse_path(path))
             for path in ("items.count", "amount.real", "note.upper", "job.job_id", "job.payload.n")}
    check(found["items.count"] is found["amount.real"] is found["note.upper"] is MISSING
          and found["job.job_id"] == 3 and found["job.payload.n"] == 1,
          "paths: a name never reads a method or an attribute of a list, number or string"
          " (items.count, amount.real, note.upper are missing, as in Node.js); a dataclass's fields are read",
          repr(found))
    message = {"Records": [{"queue": "orders-queue", "body": {"message_id": "m-1"}}]}
    r1, r2 = h.consume(app, message), h.consume(app, message)
    rec = record(admin, "orders-queue", "m-1")
    kind = admin.execute("SELECT jsonb_typeof(response) FROM idempotency_records WHERE tenant_id = 'orders-queue'"
                         " AND key = 'm-1'").fetchone()
    check(r1 is None and r2 is None and calls["consume"] == 1 and rec is not None and kind == ("null",),
          "consumer: a key path with an index (Records[0].body.message_id), the tenant from the event,"
          " a None result stored as JSON null and replayed as None", f"{r1} {r2} {calls} {rec} {kind}")
    other = {"Records": [{"queue": "refunds-queue", "body": {"message_id": "m-1"}}]}
    h.consume(app, other)
    check(calls["consume"] == 2 and effects(admin, "consume", "m-1") == 2,
          "consumer: the same key under another tenant is another operation", f"{calls}")

    job = Job(7, {"n": 1})
    a, b = h.run_job(job, app), h.run_job(Job(7, {"n": 1}), app, attempt=2)
    check(a == b == {"job": 7, "payload": {"n": 1}} and calls["run_job"] == 1,
          "consumer: a key function over a dataclass event, named event and connection arguments",
          f"{a} {b} {calls}")
    e = raises(IdempotencyPayloadMismatchError, lambda: h.run_job(Job(7, {"n": 2}), app))
    check(e is not None and calls["run_job"] == 1,
          'consumer: payload_validation="*" compares the whole event', repr(e))
    before = effects(admin, "run_job")
    h.run_job(Job(None, {}), app)
    h.run_job(Job(None, {}), app)
    check(calls["run_job"] == 3 and effects(admin, "run_job") == before + 2
          and record(admin, "jobs", "job-None") is None,
          "consumer: raise_on_missing_key=False runs an event without a key untouched, every time, storing nothing",
          f"{calls}")

    @idempotent_function(key="id", tenant="strict")
    def strict(conn, event):
        ran("strict")

    e = raises(IdempotencyKeyError, lambda: strict(app, {"no_id": 1}))
    check(isinstance(e, IdempotencyKeyError) and "strict" not in calls,
          "consumer: an event without its key raises IdempotencyKeyError, the function does not run", repr(e))
    e = raises(IdempotencyKeyError, lambda: strict(app, {"id": "k" * 256}))
    check(isinstance(e, IdempotencyKeyError) and "256 bytes" in str(e) and "strict" not in calls,
          "consumer: a key over 255 bytes raises IdempotencyKeyError before any claim", repr(e))
    e = raises(ValueError, lambda: idempotent_function(key="a..b", tenant="t")(lambda conn, event: None))
    check(e is not None, "consumer: an invalid field path is refused when the function is decorated", repr(e))
    e = raises(TypeError, lambda: strict("not a connection", {"id": "x"}))
    check(e is not None and "psycopg.Connection" in str(e), "consumer: calling without a connection is a TypeError",
          repr(e))


def check_failures(check, admin, app):
    event = {"order_id": "o-fail", "amount": 5, "fail": True}
    e = raises(RuntimeError, lambda: h.charge(app, event))
    check(e is not None and effects(admin, "charge", "o-fail") == 0 and record(admin, "billing", "o-fail") is None,
          "consumer: the function raises after its insert: insert and claim rolled back, the exception propagates",
          f"{e!r} {record(admin, 'billing', 'o-fail')}")
    before = calls["charge"]
    result = h.charge(app, dict(event, fail=False))
    check(result == {"charged": 5, "currency": "EUR"} and calls["charge"] == before + 1
          and effects(admin, "charge", "o-fail") == 1,
          "consumer: the redelivery runs the function again, once", f"{result} {calls}")

    n = effects(admin, "unserializable")
    e = raises(TypeError, lambda: h.unserializable(app, {"id": "u-1"}))
    check(e is not None and effects(admin, "unserializable") == n and record(admin, "unserializable", "u-1") is None,
          "consumer: a result that is not JSON raises TypeError and rolls back the function's writes", repr(e))

    admin.execute("SELECT idem_release('billing', 'o-failed', token, failure => '{\"error\": \"declined\"}')"
                  " FROM idem_claim('billing', 'o-failed')")
    before = calls["charge"]
    e = raises(IdempotencyStoredFailureError, lambda: h.charge(app, {"order_id": "o-failed", "amount": 1}))
    check(isinstance(e, IdempotencyStoredFailureError) and e.failure == {"error": "declined"}
          and calls["charge"] == before,
          "consumer: a key settled as a failure raises IdempotencyStoredFailureError with the stored failure",
          repr(e))


def check_in_progress(check, admin, app, app_dsn):
    holder = psycopg.connect(app_dsn)
    try:
        as_tenant(holder, "billing")
        holder.execute("SELECT idem_claim('billing', 'o-busy')")     # held, uncommitted
        before = calls["charge"]
        e = raises(IdempotencyInProgressError, lambda: h.charge(app, {"order_id": "o-busy", "amount": 3}))
        check(isinstance(e, IdempotencyInProgressError) and calls["charge"] == before and e.retry_after == 1,
              "consumer: a key another transaction holds raises IdempotencyInProgressError, retry_after 1 (the"
              " holder's claim is uncommitted, no wait: not the server's 5-minute lease)",
              f"{e!r} {getattr(e, 'retry_after', None)}")

        @idempotent_function(key="id", tenant="billing", wait=lambda event: event["wait"], tenant_setting=setting)
        def patient(conn, event):
            ran("patient")

        started = time.monotonic()
        e = raises(IdempotencyInProgressError, lambda: patient(app, {"id": "o-busy", "wait": "1.2 seconds"}))
        waited = time.monotonic() - started
        check(isinstance(e, IdempotencyInProgressError) and e.retry_after == 2 and waited >= 1.2
              and "patient" not in calls,
              "consumer: after waiting 1.2 s for an uncommitted holder, retry_after is the wait rounded up (2)",
              f"{e!r} {getattr(e, 'retry_after', None)} waited {waited:.2f} s")
        long_lease = psycopg.connect(app_dsn)
        try:
            as_tenant(long_lease, "billing")
            long_lease.execute("SELECT idem_claim('billing', 'o-busy-long', lease => '10 minutes')")
            long_lease.commit()                     # a committed claim: its lease end is known
        finally:
            long_lease.close()
        e = raises(IdempotencyInProgressError, lambda: patient(app, {"id": "o-busy-long", "wait": None}))
        check(isinstance(e, IdempotencyInProgressError) and e.retry_after == 60 and "patient" not in calls,
              "consumer: a committed claim's 10-minute lease: retry_after capped at 60",
              f"{e!r} {getattr(e, 'retry_after', None)}")
        holder.rollback()
        result = h.charge(app, {"order_id": "o-busy", "amount": 3})
        check(result == {"charged": 3, "currency": "EUR"} and calls["charge"] == before + 1,
              "consumer: once the holder rolled back, the next delivery runs", f"{result}")

        # wait: a duplicate waits for the holder and returns what it stored
        as_tenant(holder, "slow")
        (token,) = holder.execute("SELECT token FROM idem_claim('slow', 'w-1')").fetchone()
        timer = threading.Timer(0.3, lambda: (holder.execute(
            "SELECT idem_complete('slow', 'w-1', %s, '{\"done\": \"by the holder\"}')",
            (token,)), holder.commit()))
        timer.start()
        result = h.slow(app, {"id": "w-1"})
        timer.join()
        check(token is not None and result == {"done": "by the holder"} and "slow" not in calls,
              "consumer: with wait, a duplicate waits for the holder and returns its stored result", f"{result}")
    finally:
        holder.close()


def check_holder(check, admin, app, app_dsn):
    """holder= (extension 1.4): a claim committed by execution "exec-1" and left in progress (a
    durable execution suspended mid-way) is claimed again by the same holder, with its token;
    another holder and no holder get IdempotencyInProgressError."""
    @idempotent_function(key="id", tenant="durable", holder=lambda event: event.get("execution"),
                         tenant_setting=setting)
    def step(conn, event):
        ran("step")
        return {"by": event.get("execution")}

    first = psycopg.connect(app_dsn)
    try:
        as_tenant(first, "durable")
        (token,) = first.execute("SELECT token FROM idem_claim('durable', 'h-1', lease => '10 minutes',"
                                 " holder => 'exec-1')").fetchone()
        first.commit()                          # claimed and committed, then suspended
    finally:
        first.close()
    for execution, what in (("exec-2", "another holder"), (None, "no holder")):
        e = raises(IdempotencyInProgressError, lambda: step(app, {"id": "h-1", "execution": execution}))
        check(isinstance(e, IdempotencyInProgressError) and "step" not in calls,
              f"consumer, holder=: {what} gets IdempotencyInProgressError while exec-1's claim is live", repr(e))
    seen = []
    real_step = step.__wrapped__

    @idempotent_function(key="id", tenant="durable", holder="exec-1", tenant_setting=setting)
    def reentered(conn, event):
        seen.append(conn.execute("SELECT token, holder FROM idem_lookup('durable', 'h-1')").fetchone())
        return real_step(conn, event)

    result = reentered(app, {"id": "h-1", "execution": "exec-1"})
    row = record(admin, "durable", "h-1")
    check(result == {"by": "exec-1"} and calls.get("step") == 1 and seen == [(token, "exec-1")]
          and row[0] == "completed",
          "consumer, holder=: the same holder re-enters its committed claim (claimed, the same token), the"
          " function runs once and completes the record", f"{result} {seen} token {token} {row}")
    result = step(app, {"id": "h-1", "execution": "exec-2"})
    check(result == {"by": "exec-1"} and calls.get("step") == 1,
          "consumer, holder=: after completion any holder gets the stored result (replay)", f"{result}")
    result = step(app, {"id": "h-2"})
    check(result == {"by": None} and calls.get("step") == 2
          and admin.execute("SELECT holder FROM idem_lookup('durable', 'h-2')").fetchone() == (None,),
          "consumer, holder=: a call without a holder claims as before (holder => not sent, none stored)",
          f"{result}")
    e = raises(TypeError, lambda: idempotent_function(key="id", tenant="t", holder="")(lambda conn, event: None))
    check(isinstance(e, TypeError), "consumer, holder='' is refused when decorating (TypeError)", repr(e))


def check_caller_transaction(check, admin, app):
    """The caller has a transaction open: the decorator works in a savepoint
    and the caller's commit or rollback decides for the claim too."""
    before = calls["charge"]
    app.execute("SELECT 1")                                     # the caller's transaction begins
    h.charge(app, {"order_id": "o-outer", "amount": 9})
    app.rollback()
    check(calls["charge"] == before + 1 and record(admin, "billing", "o-outer") is None
          and effects(admin, "charge", "o-outer") == 0,
          "consumer: inside the caller's transaction, the caller's rollback undoes the claim and the writes",
          f"{calls}")
    app.execute("SELECT 1")
    result = h.charge(app, {"order_id": "o-outer", "amount": 9})
    in_tx = app.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    app.commit()
    rec = record(admin, "billing", "o-outer")
    check(in_tx and calls["charge"] == before + 2 and rec is not None and rec[0] == "completed"
          and rec[1] == result and effects(admin, "charge", "o-outer") == 1,
          "consumer: run again in a new transaction, it is stored when the caller commits", f"{rec}")


def check_concurrent(check, admin, app_dsn):
    """4 deliveries of each of 5 keys at once, each on its own connection:
    with wait, one execution per key and every delivery gets its result."""
    keys, copies = 5, 4         # 20 connections: the contract's server allows 40 in all
    barrier = threading.Barrier(keys * copies, timeout=30)

    def deliver(k):
        with psycopg.connect(app_dsn) as conn:
            barrier.wait()
            return k, h.slow(conn, {"id": f"c-{k}"})

    calls["slow"] = 0
    with ThreadPoolExecutor(keys * copies) as pool:
        results = list(pool.map(deliver, [k for k in range(keys) for _ in range(copies)]))
    wrong = [(k, r) for k, r in results if r != {"done": f"c-{k}"}]
    counts = [effects(admin, "slow", f"c-{k}") for k in range(keys)]
    check(not wrong and calls["slow"] == keys and counts == [1] * keys,
          f"consumer: {keys} keys x {copies} concurrent deliveries: one execution per key, every delivery"
          " returns its result", f"{calls['slow']} executions, rows {counts}, wrong {wrong[:3]}")


def check_results_and_options(check, admin, app):
    """The first call and a replay return the same type; output_serializer,
    response_hook, a per-call ttl, the tenant required."""
    seen = []

    @idempotent_function(key="job_id", tenant="results", tenant_setting=setting)
    def as_json(conn, job: Job):
        return job

    @idempotent_function(key="job_id", tenant="results-typed", output_serializer=Job,
                         response_hook=lambda result, replayed: seen.append(replayed) or result,
                         ttl=lambda job: f"{job.job_id} days", tenant_setting=setting)
    def as_job(conn, job: Job):
        return job

    first, again = as_json(app, Job(1, {"n": 1})), as_json(app, Job(1, {"n": 1}))
    check(first == again == {"job_id": 1, "payload": {"n": 1}},
          "consumer: a dataclass result comes back as the stored JSON on the first call as on a replay",
          f"{first!r} {again!r}")
    first, again = as_job(app, Job(2, {"n": 2})), as_job(app, Job(2, {"n": 2}))
    rec = record(admin, "results-typed", "2")
    check(first == again == Job(2, {"n": 2}) and type(first) is type(again) is Job,
          "consumer: output_serializer=Job makes the first call and a replay return a Job", f"{first!r} {again!r}")
    check(seen == [False, True], "consumer: response_hook sees whether the result is a replay", f"{seen}")
    check(rec is not None and str(rec[2]) in ("2 days, 0:00:00", "2 days"),
          "consumer: ttl as a function of the event sets this call's retention (2 days)", f"{rec}")
    try:
        from pydantic import BaseModel

        class Order(BaseModel):
            order_id: str
            amount: int

        @idempotent_function(key="order_id", tenant="results-pydantic", output_serializer=Order,
                             tenant_setting=setting)
        def as_model(conn, event):
            return Order(**event)

        first, again = as_model(app, {"order_id": "p-1", "amount": 3}), as_model(app, {"order_id": "p-1", "amount": 3})
        check(type(first) is type(again) is Order and first == again and again.amount == 3,
              "consumer: output_serializer=<a pydantic model> returns the model the first time and on a replay",
              f"{first!r} {again!r}")
    except ImportError:
        pass
    e = raises(TypeError, lambda: idempotent_function(key="id")(lambda conn, event: None))
    check(isinstance(e, TypeError) and "tenant=" in str(e),
          "consumer: a function decorated without tenant= is refused when decorated (no default tenant)", repr(e))


def check_jmespath(check, admin, app):
    """event_key_jmespath and payload_validation_jmespath, Powertools' names
    (the jmespath module: Debian's python3-jmespath, which 76-python needs
    and test/lib/ensure-packages installs); without the module refused when
    decorated (the import blocked here as if it were not installed)."""
    import sys
    saved = sys.modules.get("jmespath")
    sys.modules["jmespath"] = None                  # import jmespath raises ImportError
    try:
        e = raises(ImportError, lambda: idempotent_function(event_key_jmespath="id", tenant="t")(
            lambda conn, event: None))
    finally:
        if saved is None:
            del sys.modules["jmespath"]
        else:
            sys.modules["jmespath"] = saved
    check(isinstance(e, ImportError) and "python3-jmespath" in str(e),
          "consumer: event_key_jmespath without the jmespath module is refused when decorated, naming"
          " python3-jmespath", repr(e))
    runs = []

    @idempotent_function(event_key_jmespath="Records[?source=='orders'] | [0].messageId",
                         payload_validation_jmespath="Records[0].body.[order_id, amount]", tenant="jmespath",
                         tenant_setting=setting)
    def consume(conn, event):
        runs.append(event)
        return {"n": len(runs)}

    def event(amount, note="first"):
        return {"Records": [{"source": "orders", "messageId": "jm-1",
                             "body": {"order_id": "o-7", "amount": amount, "note": note}}]}

    first, again = consume(app, event(5)), consume(app, event(5, note="redelivered"))
    e = raises(IdempotencyPayloadMismatchError, lambda: consume(app, event(6)))
    rec = record(admin, "jmespath", "jm-1")
    check(first == again == {"n": 1} and len(runs) == 1 and rec is not None
          and isinstance(e, IdempotencyPayloadMismatchError),
          "consumer: event_key_jmespath (a filter expression) gives the key, payload_validation_jmespath the"
          " fingerprint: a redelivery with another note replays, another amount is a mismatch",
          f"{first} {again} {runs} {rec} {e!r}")
    e = raises(TypeError, lambda: idempotent_function(key="id", event_key_jmespath="id", tenant="t"))
    check(isinstance(e, TypeError), "consumer: key= and event_key_jmespath= together are refused", repr(e))


async def check_async(check, admin, app_dsn):
    conn = await psycopg.AsyncConnection.connect(app_dsn)
    try:
        first = await h.charge_async(conn, {"id": "a-1", "amount": 40})
        again = await h.charge_async(conn, {"id": "a-1", "amount": 40})
        check(first == again == {"charged": 40} and calls["charge_async"] == 1
              and effects(admin, "charge_async", "a-1") == 1,
              "consumer (async): an async function on an AsyncConnection runs once, then replays",
              f"{first} {again} {calls}")
        try:
            await h.charge_async(conn, {"id": "a-1", "amount": 41})
            e = None
        except IdempotencyPayloadMismatchError as exc:
            e = exc
        check(e is not None, "consumer (async): another amount under the key raises the mismatch")
        try:
            await h.charge_async(conn, {"id": "a-2", "amount": 1, "fail": True})
            e = None
        except RuntimeError as exc:
            e = exc
        check(e is not None and effects(admin, "charge_async", "a-2") == 0 and record(admin, "async", "a-2") is None,
              "consumer (async): a raise rolls back the insert and the claim", repr(e))
        result = await h.charge_async(conn, {"id": "a-2", "amount": 1})
        check(result == {"charged": 1} and effects(admin, "charge_async", "a-2") == 1,
              "consumer (async): the retry runs once", f"{result}")
    finally:
        await conn.close()
