"""What the examples of integrations/python/README.md leave to their reader,
and the runner that runs them (test/docs/package_examples.py starts it with
the package of the tree on PYTHONPATH and PGHOST/PGPORT naming the docs
suite's server; the examples arrive as JSON on stdin).

The README's blocks run in order in one namespace, as a reader runs them one
after the other.  Before them the namespace holds only what the README leaves
to its reader (CONTEXT below: the authenticated user, the request body's
model, the queue), never the package's own names.  The databases the README's
connection strings name are made first, as the README's install section
says: `shop` (the consumer's charges, its role shop_app) and `ledger`
(examples/fastapi/schema.sql, its role ledger_app), each with the extension
and the application role's grants (docs/privileges.md).

After a block, what it made is used as the README says it is used:
  - a FastAPI app with POST /entries: its lifespan runs (the pool opens) and
    the same request is sent twice: 201, then the same bytes with
    Idempotent-Replayed: true, and the entries booked once;
  - the queue, once a block consumed it: every message acknowledged, each
    order charged once although one message came twice.
One line per block on stdout: EXAMPLE {"name", "problems": [[line, text]]}.
"""
import asyncio
import json
import os
import sys
import traceback

import psycopg
from pydantic import BaseModel

ORDERS = [{"body": {"order_id": "o-1", "amount": 1250}}, {"body": {"order_id": "o-2", "amount": 990}},
          {"body": {"order_id": "o-1", "amount": 1250}}]       # o-1 delivered twice


class User:
    client_id = "shop-42"


def current_user() -> User:
    """The application's authentication dependency."""
    return User()


def current_client() -> str:
    """"Tenant isolation": the tenant dependency of the FastAPI example, under another name."""
    return "shop-42"


class Entry(BaseModel):
    """The request body's model (examples/fastapi's)."""
    account: str
    amount: int


class Queue:
    """A broker's queue: iterating delivers its messages, ack and nack settle them."""
    def __init__(self, messages):
        self.messages, self.acked, self.nacked, self.delivered = list(messages), [], [], 0

    def __iter__(self):
        for m in self.messages:
            self.delivered += 1
            yield m

    def ack(self, message):
        self.acked.append(message)

    def nack(self, message, delay=0):
        self.nacked.append(message)


def context():
    return {"__name__": "__main__", "current_user": current_user, "current_client": current_client,
            "Entry": Entry, "queue": Queue(ORDERS)}


SHOP = """
CREATE EXTENSION idempotency;
CREATE TABLE charges (order_id text NOT NULL, amount integer NOT NULL);
DO $$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'shop_app') THEN CREATE ROLE shop_app LOGIN; END IF;
END $$;
GRANT USAGE ON SCHEMA public TO shop_app;
GRANT EXECUTE ON FUNCTION idem_claim, idem_complete, idem_release, idem_heartbeat, idem_lookup TO shop_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_records TO shop_app;
GRANT SELECT, INSERT ON charges TO shop_app;
"""


def databases(repo):
    with open(os.path.join(repo, "examples/fastapi/schema.sql")) as f:
        ledger = f.read()
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        for name, schema in (("shop", SHOP), ("ledger", ledger)):
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{name}"')
            with psycopg.connect(dbname=name, autocommit=True) as db:
                db.execute(schema)


def count(dbname, sql):
    with psycopg.connect(dbname=dbname) as db:
        return db.execute(sql).fetchone()[0]


async def post(app, path, body, headers):
    data = json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                         *[(k.lower().encode(), v.encode()) for k, v in headers.items()]]}
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

    await app(scope, receive, send)
    return answer


async def use_app(app):
    """The FastAPI example as a client uses it: one POST, then the same again."""
    entries = [{"account": "acc-1", "amount": 1000}, {"account": "acc-2", "amount": 250}]
    async with app.router.lifespan_context(app):
        first = await post(app, "/entries", entries, {"Idempotency-Key": "docs-1"})
        again = await post(app, "/entries", entries, {"Idempotency-Key": "docs-1"})
    booked = count("ledger", "SELECT count(*) FROM ledger_entries WHERE idempotency_key = 'docs-1'")
    if not (first.get("status") == 201 and again.get("status") == 201 and first["body"] == again["body"]
            and again["headers"].get("idempotent-replayed") == "true" and booked == len(entries)):
        return (f"the app did not answer as the README says: first {first.get('status')} {first['body'][:300]!r},"
                f" again {again.get('status')} {again['headers'].get('idempotent-replayed')} {again['body'][:300]!r},"
                f" {booked} entries booked (expected 201, the same bytes replayed, {len(entries)} booked)")
    return None


def consumed(q):
    charged = count("shop", "SELECT count(*) FROM charges")
    if len(q.acked) != len(ORDERS) or q.nacked or charged != 2:
        return (f"the queue was not consumed as the README says: {len(q.acked)} of {len(ORDERS)} messages acked,"
                f" {len(q.nacked)} nacked, {charged} charges booked (expected 2: o-1 came twice)")
    return None


def example_line(name, tb):
    """The example's line an exception comes from (its innermost frame in the example)."""
    lines = [f.lineno for f in traceback.extract_tb(tb) if f.filename == name]
    return lines[-1] if lines else None


def main():
    job = json.load(sys.stdin)
    if not job["fixture"]:
        databases(job["repo"])
    ns = context()
    used = set()
    for example in job["examples"]:
        problems = []
        try:
            exec(compile(example["text"], example["name"], "exec"), ns)
        except BaseException as e:      # noqa: BLE001  (SystemExit too: an example must not end the run)
            problems.append([example_line(example["name"], e.__traceback__),
                             "".join(traceback.format_exception_only(type(e), e)).strip()])
        else:
            app = ns.get("app")
            if app is not None and id(app) not in used and any(getattr(r, "path", None) == "/entries"
                                                               and "POST" in getattr(r, "methods", ())
                                                               for r in getattr(app, "routes", ())):
                used.add(id(app))
                try:
                    wrong = asyncio.run(use_app(app))
                except Exception as e:   # noqa: BLE001
                    wrong = "the app failed: " + "".join(traceback.format_exception(type(e), e, e.__traceback__))[-1500:]
                if wrong:
                    problems.append([None, wrong])
            q = ns.get("queue")
            if isinstance(q, Queue) and q.delivered and id(q) not in used:
                used.add(id(q))
                wrong = consumed(q)
                if wrong:
                    problems.append([None, wrong])
        print("EXAMPLE " + json.dumps({"name": example["name"], "problems": problems}), flush=True)


if __name__ == "__main__":
    main()
