"""One stored shape across the packages' consumer wrappers: a record written
by one package replays in another (docs/integrations.md, "One behaviour in
three packages", the row "stored result, consumer").

Every consumer wrapper (Python idempotent_function, Node.js idempotent(),
Go Run) stores its function's result itself as the record's response, JSON
null for none, and returns the stored JSON on every delivery.  77-node and
79-go call check() with their package as the peer: the Python package
(integrations/python/src, psycopg 3) writes a record of each of CASES that
the peer replays, and the peer writes a record of each that Python replays;
79-go also with the Node.js package as the other side (Go <-> Node.js);
each record's response must be the result as it is (no envelope), and no
replay may run its function.

A peer is a function (mode, tenant, cases) -> {key: {"result", "replayed"}}
where mode is "write" (its function returns the case's result) or "replay"
(its function raises if it runs).
"""
import json
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))

# (key suffix, result): results whose JSON every language reads back the same
# (no integer beyond 2^53, which JavaScript would round).  {"result": 5} is
# the envelope the Python package stored before 2.0.0: a result of that
# shape must come back as it is, not unwrapped.
CASES = [
    ("object", {"charged": 1250, "currency": "EUR", "lines": [{"sku": "a-1", "qty": 2}]}),
    ("null", None),
    ("envelope-shaped", {"result": 5}),
    ("array", [1, "two", {"three": 3.5}, None, True]),
    ("string", "déjà vu \u2713"),
    ("number", 42),
    ("false", False),
]


def python_peer(dsn):
    """The Python package as a peer, from the tree (integrations/python/src)."""
    sys.path.insert(0, os.path.join(ROOT, "integrations/python/src"))
    import psycopg
    from idempotency_pg import idempotent_function

    def peer(mode, tenant, cases):
        answers = {}
        with psycopg.connect(dsn) as conn:
            for key, result in cases:
                replays = []

                @idempotent_function(key="id", tenant=tenant,
                                     response_hook=lambda value, replayed: replays.append(replayed) or value)
                def consume(conn, event, result=result):
                    if mode == "replay":
                        raise AssertionError(f"the function ran for {event['id']}, which should replay")
                    return result

                answers[key] = {"result": consume(conn, {"id": key}), "replayed": replays == [True]}
        return answers

    return peer


def check(check, admin_dsn, app_dsn, name, peer, other=None, other_name="Python"):
    """Python (or other, a peer named other_name) writes, peer replays; peer
    writes, Python (other) replays; the stored responses are the results
    themselves.  check(ok, what, detail) counts."""
    import psycopg
    python = other or python_peer(app_dsn)
    expected = {f"{name}-{suffix}": result for suffix, result in CASES}
    cases = list(expected.items())

    def stored(tenant):
        with psycopg.connect(admin_dsn) as admin:
            rows = admin.execute("SELECT key, response, jsonb_typeof(response) FROM idempotency_records"
                                 " WHERE tenant_id = %s", (tenant,)).fetchall()
        return {key: (response, kind) for key, response, kind in rows}

    def same_shape(tenant):
        records = stored(tenant)
        wrong = {k: records.get(k) for k, v in expected.items()
                 if k not in records or records[k][0] != v or (v is None and records[k][1] != "null")}
        return wrong

    def replayed_all(answers):
        wrong = {k: answers.get(k) for k, v in expected.items()
                 if k not in answers or answers[k]["result"] != v or answers[k]["replayed"] is not True}
        return wrong

    for writer, writer_name, reader, reader_name in ((python, other_name, peer, name), (peer, name, python, other_name)):
        tenant = f"cross-{writer_name.lower()}-to-{reader_name.lower()}"
        try:
            first = writer("write", tenant, cases)
            firsts = {k: first.get(k) for k, v in expected.items()
                      if k not in first or first[k]["result"] != v or first[k]["replayed"] is not False}
            wrong_shape = same_shape(tenant)
            check(not firsts and not wrong_shape,
                  f"consumer records: {writer_name} stores each result as it is (no envelope; null as JSON null) and"
                  f" returns it on the first call ({len(cases)} results)",
                  json.dumps({"first calls": firsts, "records": wrong_shape}, default=str)[:1500])
            answers = reader("replay", tenant, cases)
            wrong = replayed_all(answers)
            check(not wrong, f"consumer records: {reader_name} replays each record {writer_name} wrote (the same"
                             " value, replayed, its function not run)", json.dumps(wrong, default=str)[:1500])
        except Exception as e:
            check(False, f"consumer records: {writer_name} writes, {reader_name} replays", repr(e)[:1500])
