"""The HTTP contract every framework integration must keep, checked end to
end against a running example app of each package (test/suites/76-python,
77-node, 79-go).

The apps are the same ledger service: POST /entries books a JSON array of
{"account", "amount"} entries, one row per entry in ledger_entries, at most
once per (X-Client-Id, Idempotency-Key); schema.sql of the example creates
the table and the role ledger_app; LEDGER_TEST_HOOKS=1 makes the booking slow
(X-Test-Delay-Ms) or raise after its inserts (X-Test-Fail-After-Write).

run(suite, schema, app_command) runs the contract twice, tenant isolation
off then on (isolation.py): each pass starts a throwaway cluster on
127.0.0.1:$IDEM_TEST_PORT_BASE, loads the schema, gives ledger_app exactly
the application role's grants of docs/privileges.md, switches isolation on
or off, starts the app on the next port as ledger_app
(app_command(pg_port, http_port, tenant_setting): with isolation on the app
passes tenant_setting 'app.tenant' to its package), runs every check and
stops everything; with isolation on it also checks that the records are
confined to their tenants and that the same app started without
tenant_setting answers 500 and stores nothing.  Then the summary line.
Python 3 stdlib + Debian's psycopg2; no timed assertions.
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, namedtuple
from concurrent.futures import ThreadPoolExecutor

import psycopg2

import isolation
from isolation import edition   # IDEM_EDITION (test/sql-edition/edition.py): the C extension or the SQL edition

PG_PORT = int(os.environ.get("IDEM_TEST_PORT_BASE", "57500"))
HTTP_PORT = PG_PORT + 1
URL = f"http://127.0.0.1:{HTTP_PORT}/entries"

KEYS, DUPLICATES = 10, 20     # concurrent phase: every key sent 20 times at once
SLOW_MS = 300                 # how long a claimed booking takes in the concurrent phase
# Retry-After of a 409 is the holder's lease left when its claim is committed;
# the original holds its claim uncommitted (claim and booking are one
# transaction), so its answer comes with its commit and Retry-After is the
# call's wait, else 1: the apps set no wait (docs/integrations.md; not the
# server's 5-minute idempotency.lease).
RETRY_AFTER = "1"
# Tokens beyond 2^53 (not exact as a double): the token mark is moved near the
# top of bigint before the first claim, so every claim of the run gets one
# (extension 1.1: tokens.c); with an extension whose takeover hands out the
# old token + 1, the planted expired claims below get one.  The planted
# tokens are below the mark: a takeover of a token above every token handed
# out (and an hour ahead of the clock) is refused since 1.3's ID004, as a
# record written around the functions (docs/security.md).
TOKEN_MARK = 2**63 - 2**32
PLANTED_TOKENS = (2**53 + 2, TOKEN_MARK - 2**31)
token_mark_set = False

passed = failed = 0


def check(ok, what, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok   {what}")
    else:
        failed += 1
        print(f"FAIL {what}" + (f": {detail}" if detail else ""))
    sys.stdout.flush()
    return ok


def project_address():
    """The project's address as docs/integrations.md names it ("The project's address")."""
    docs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../docs/integrations.md")
    with open(docs) as f:
        found = re.search(r"## The project's address\n\nThe three packages name one address for the project,"
                          r" <(https://[^>]+)>", f.read())
    return found.group(1) if found else None


def check_address(package_dir, name):
    """The package's files name the project's address only: no placeholder
    (to-fill-in.example, idempotency.example) and every link into the
    repository (…/blob/main/…) under that address.  Returns the address."""
    address = project_address()
    placeholders, foreign = [], []
    for directory, dirs, files in os.walk(package_dir):
        dirs[:] = [d for d in dirs if d not in ("node_modules", "vendor", "__pycache__", "build")]
        for f in files:
            path = os.path.join(directory, f)
            try:
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
            except (UnicodeDecodeError, OSError):
                continue
            rel = os.path.relpath(path, package_dir)
            placeholders += [rel] if re.search(r"to-fill-in\.example|idempotency\.example", text) else []
            foreign += [(rel, u) for u in re.findall(r"https?://[^\s)>\"'`]+/blob/main/", text)
                        if address is None or u != address + "/blob/main/"]
    check(address is not None and not placeholders and not foreign,
          f"{name}: its files name the project's address ({address}, docs/integrations.md) and no placeholder",
          f"placeholders in {placeholders[:5]}, other links {foreign[:5]}")
    return address


def skip(suite, reason):
    """A suite that cannot run here says why, and counts nothing as passed."""
    print(f"{suite}: cannot run: {reason}")
    print(f"{suite}: 0 passed, 0 failed")
    print(f"{suite}: skipped ({reason})")
    return 0


# ---------------------------------------------------------------- servers

class Servers:
    """The PostgreSQL cluster and the app, stopped whatever happens."""

    def __init__(self, suite):
        self.dir = tempfile.mkdtemp(prefix=f"idem-{suite}-")
        self.data = os.path.join(self.dir, "data")
        self.app = None
        self.pg_started = False

    def run(self, *cmd):
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)

    def psql(self, *args):
        self.run("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(PG_PORT),
                 "-U", "postgres", *args)

    def start(self, schema, tenant_setting):
        self.run("initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8",
                 "--locale=C")
        with open(os.path.join(self.data, "postgresql.conf"), "a") as conf:
            conf.write(f"listen_addresses = '127.0.0.1'\nport = {PG_PORT}\n"
                       f"unix_socket_directories = '{self.dir}'\n"
                       f"shared_preload_libraries = '{edition.preload()}'\n"
                       "max_connections = 40\nfsync = off\nlc_messages = 'C'\n")
        self.run("pg_ctl", "-D", self.data, "-l", os.path.join(self.dir, "postgres.log"), "-w", "start")
        self.pg_started = True
        self.psql("-d", "postgres", "-c", "CREATE DATABASE ledger")
        edition.install(lambda *args: self.psql("-d", "ledger", *args), schema, self.dir)
        global token_mark_set
        db = self.db()
        isolation.prepare(db, "ledger_app", tenant_setting)
        with db.cursor() as cur:
            cur.execute("SELECT setval(seq, %s) FROM (SELECT to_regclass('idempotency_tokens') AS seq) s"
                        " WHERE seq IS NOT NULL", (TOKEN_MARK,))
            token_mark_set = cur.rowcount == 1
        db.close()

    def start_app(self, app_command, tenant_setting):
        cmd, env = app_command(PG_PORT, HTTP_PORT, tenant_setting)
        self.app_log = open(os.path.join(self.dir, "app.log"), "a")
        self.app = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=self.app_log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", HTTP_PORT), timeout=1).close()
                return
            except OSError:
                if self.app.poll() is not None or time.time() > deadline:
                    raise RuntimeError("the app did not start; see " + self.app_log.name)
                time.sleep(0.05)

    def stop_app(self):
        if self.app and self.app.poll() is None:
            os.killpg(self.app.pid, signal.SIGTERM)    # its own session: uvicorn's workers too
            try:
                self.app.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.app.pid, signal.SIGKILL)
                self.app.wait()

    def stop(self):
        self.stop_app()
        if self.pg_started:
            subprocess.run(["pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop"], stdout=subprocess.DEVNULL)
            self.pg_started = False
        if failed == 0:
            subprocess.run(["rm", "-rf", self.dir])
        else:
            print(f"logs kept in {self.dir}")

    def db(self):
        conn = psycopg2.connect(host="127.0.0.1", port=PG_PORT, dbname="ledger", user="postgres")
        conn.autocommit = True
        return conn


# ---------------------------------------------------------------- client

Reply = namedtuple("Reply", "status headers body")


def post(key=None, entries=None, client=None, body=None, delay_ms=None, fail_after_write=False):
    """POST /entries; key=None sends no Idempotency-Key header at all."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    if client is not None:
        headers["X-Client-Id"] = client
    if delay_ms is not None:
        headers["X-Test-Delay-Ms"] = str(delay_ms)
    if fail_after_write:
        headers["X-Test-Fail-After-Write"] = "1"
    data = body if body is not None else json.dumps(entries).encode()
    req = urllib.request.Request(URL, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return Reply(r.status, r.headers, r.read())
    except urllib.error.HTTPError as e:
        with e:
            return Reply(e.code, e.headers, e.read())


def replayed(reply):
    return reply.headers.get("Idempotent-Replayed") == "true"


def is_problem(reply):
    return reply.headers.get_content_type() == "application/problem+json"


def title(reply):
    """The title of a problem document (docs/integrations.md: the same in every package)."""
    try:
        return json.loads(reply.body).get("title")
    except (ValueError, AttributeError):
        return None


def entries(*amounts, account="acc-1"):
    return [{"account": account, "amount": a} for a in amounts]


def rows(db, key, client="default"):
    with db.cursor() as cur:
        cur.execute("SELECT count(*) FROM ledger_entries WHERE client_id = %s AND idempotency_key = %s",
                    (client, key))
        return cur.fetchone()[0]


def record(db, key, client="default"):
    """(status, token, response, the response's body as PostgreSQL prints it) or None."""
    with db.cursor() as cur:
        cur.execute("SELECT status, token, response, (response->'body')::text"
                    " FROM idempotency_records WHERE tenant_id = %s AND key = %s", (client, key))
        return cur.fetchone()


def wait_for_claim_in_flight(db, timeout=10):
    """True once some transaction holds an idempotency key lock (objsubid 0x4944; 1 in the SQL edition)."""
    deadline = time.time() + timeout
    with db.cursor() as cur:
        while time.time() < deadline:
            cur.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                        " AND objsubid = %s AND granted", (edition.KEY_LOCK_OBJSUBID,))
            if cur.fetchone()[0] > 0:
                return True
            time.sleep(0.01)
    return False


# ---------------------------------------------------------------- checks

def test_key_header(db):
    r = post(None, entries(100))
    check(r.status == 400 and is_problem(r) and title(r) == "An Idempotency-Key header is required",
          "no Idempotency-Key: 400 problem+json, the packages' title", f"{r.status} {r.body[:200]!r}")
    r = post("", entries(100))
    check(r.status == 400 and title(r) == "The Idempotency-Key header is invalid",
          "empty Idempotency-Key: 400, the packages' title", f"{r.status} {r.body[:200]!r}")
    r = post("k" * 256, entries(100))
    check(r.status == 400, "Idempotency-Key of 256 bytes: 400", f"{r.status}")
    r = post("k" * 255, entries(100))
    check(r.status == 201 and rows(db, "k" * 255) == 1, "Idempotency-Key of 255 bytes: 201, booked once",
          f"{r.status} {r.body[:200]!r}")

    conn = http.client.HTTPConnection("127.0.0.1", HTTP_PORT, timeout=30)
    body = json.dumps(entries(100)).encode()
    conn.putrequest("POST", "/entries")
    for value in ("two-a", "two-b"):
        conn.putheader("Idempotency-Key", value)
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body)
    status = conn.getresponse().status
    conn.close()
    check(status == 400 and rows(db, "two-a") + rows(db, "two-b") + rows(db, "two-a, two-b") == 0,
          "two Idempotency-Key headers: 400, nothing booked", f"{status}")

    r1 = post('"sf-\\"quoted\\""', entries(100))
    r2 = post('sf-"quoted"', entries(100))
    check(r1.status == 201 and r2.status == 201 and replayed(r2) and r1.body == r2.body
          and rows(db, 'sf-"quoted"') == 1,
          "an sf-string key (RFC 8941) is the same key as its bare form", f"{r1.status} {r2.status}")


def test_mismatch(db):
    first = post("mismatch-1", entries(500))
    r = post("mismatch-1", entries(501))
    check(first.status == 201 and r.status == 422 and is_problem(r) and rows(db, "mismatch-1") == 1
          and title(r) == "This Idempotency-Key was used for a different request",
          "same key with another body: 422 problem+json, the packages' title, not booked again",
          f"{first.status} {r.status} {r.body[:200]!r}")
    r = post("mismatch-1", body=b'[ { "amount" : 500 , "account" : "acc-1" } ]')
    check(r.status == 201 and replayed(r) and r.body == first.body,
          "same JSON with other key order and spacing: replayed (canonical fingerprint)", f"{r.status}")


def test_in_progress(db):
    original = {}
    slow = threading.Thread(target=lambda: original.setdefault("reply", post("slow-1", entries(42), delay_ms=1500)))
    slow.start()
    in_flight = wait_for_claim_in_flight(db)
    r = post("slow-1", entries(42))
    check(in_flight and r.status == 409 and r.headers.get("Retry-After") == RETRY_AFTER and is_problem(r)
          and json.loads(r.body).get("title") == "A request with this Idempotency-Key is still being processed",
          f"same key while the original runs: 409 problem+json, the packages' title, Retry-After: {RETRY_AFTER}"
          " (the original's claim is not committed and the apps set no wait)",
          f"in flight {in_flight}, {r.status} {dict(r.headers)}")
    r = post("slow-1", entries(43))
    check(r.status == 409, "another body while the original runs: 409 (cannot compare yet)", f"{r.status}")
    slow.join()
    first, retry = original["reply"], post("slow-1", entries(42))
    check(first.status == 201 and not replayed(first) and retry.status == 201 and replayed(retry)
          and retry.body == first.body and rows(db, "slow-1") == 1,
          "once the original committed, the retry replays its 201; booked once",
          f"{first.status} {retry.status} {rows(db, 'slow-1')}")


def test_stored_failure(db):
    r1 = post("frozen-1", entries(7, account="frozen-acc"))
    r2 = post("frozen-1", entries(7, account="frozen-acc"))
    rec = record(db, "frozen-1")
    check(r1.status == 403 and not replayed(r1) and r2.status == 403 and replayed(r2) and r1.body == r2.body
          and rows(db, "frozen-1") == 0 and rec is not None and rec[0] == "failed"
          and rec[2] == {"status": 403, "body": json.loads(r1.body)},
          "a business failure (403) is stored as failed and replayed byte for byte",
          f"{r1.status} {r2.status} {rec}")


def test_validation(db):
    r = post("invalid-1", entries(0))
    check(r.status == 400 and is_problem(r) and record(db, "invalid-1") is None,
          "an invalid body (amount 0): 400 before the claim, nothing stored", f"{r.status} {r.body[:200]!r}")
    r = post("invalid-2", body=b"[{not json")
    check(r.status == 400 and record(db, "invalid-2") is None, "a body that is not JSON: 400, nothing stored",
          f"{r.status}")
    r = post("invalid-1", entries(800))
    check(r.status == 201 and not replayed(r) and rows(db, "invalid-1") == 1,
          "the corrected request may reuse the key: 201", f"{r.status}")


def test_handler_error(db):
    r = post("crash-1", entries(9, 10), fail_after_write=True)
    check(r.status == 500 and is_problem(r) and rows(db, "crash-1") == 0 and record(db, "crash-1") is None,
          "the handler raises after its inserts: 500, inserts and claim rolled back together",
          f"{r.status} rows {rows(db, 'crash-1')} record {record(db, 'crash-1')}")
    r = post("crash-1", entries(9, 10))
    again = post("crash-1", entries(9, 10))
    check(r.status == 201 and not replayed(r) and rows(db, "crash-1") == 2
          and again.status == 201 and replayed(again) and again.body == r.body,
          "the retry runs once (two entries booked), the next one replays it", f"{r.status} {again.status}")


def test_array_and_record(db):
    batch = [{"account": "acc-a", "amount": 1}, {"account": "acc-b", "amount": 22},
             {"account": "acc-c", "amount": 333}]
    r = post("array-1", batch)
    body = json.loads(r.body) if r.status == 201 else None
    check(isinstance(body, list) and [(e["account"], e["amount"]) for e in body]
          == [(e["account"], e["amount"]) for e in batch] and rows(db, "array-1") == 3,
          "a JSON array body in, a JSON array answer out, three entries booked", f"{r.status} {r.body[:300]!r}")
    rec = record(db, "array-1")
    check(rec is not None and rec[0] == "completed" and rec[2] == {"status": 201, "body": body}
          and rec[3].encode() == r.body,
          "the record stores {status: 201, body: [...]} and the answer is its body byte for byte",
          f"{rec} vs {r.body[:300]!r}")
    again = post("array-1", batch)
    check(again.status == 201 and replayed(again) and again.body == r.body
          and again.headers.get_content_type() == r.headers.get_content_type(),
          "the replay is byte-identical, with Idempotent-Replayed: true", f"{again.status}")


def test_large_tokens(db):
    """Claims with tokens above 2^53 complete: the integration carries the
    token exactly (no float, no rounding) from idem_claim to idem_complete."""
    for n, old in enumerate(PLANTED_TOKENS):
        key = f"big-token-{n}"
        with db.cursor() as cur:    # an expired claim, so the next claim takes the key over
            cur.execute("INSERT INTO idempotency_records (tenant_id, key, status, token, fingerprint,"
                        " lease_expires_at, expires_at, ttl, created_at, updated_at)"
                        " VALUES ('default', %s, 'processing', %s, NULL, now() - interval '1 min',"
                        " now() - interval '1 min', interval '1 day', now(), now())", (key, old))
        r = post(key, entries(5))
        rec = record(db, key)
        check(r.status == 201 and not replayed(r) and rec is not None and rec[0] == "completed"
              and rec[1] > 2**53 and rec[1] != old and rows(db, key) == 1,
              f"a claim taking over token {old} completes with token {rec[1] if rec else None} (> 2^53)",
              f"{r.status} {r.body[:300]!r} {rec}")


def test_all_tokens_large(db):
    if not token_mark_set:
        print("     (no idempotency_tokens sequence: only the planted claims had tokens above 2^53)")
        return
    with db.cursor() as cur:
        cur.execute("SELECT count(*), count(*) FILTER (WHERE token <= 2^53) FROM idempotency_records")
        total, small = cur.fetchone()
    check(total > 0 and small == 0, f"all {total} records of the run carry tokens above 2^53 (token mark moved)",
          f"{small} at or below 2^53")


def test_tenant_scope(db):
    a = post("shared-key", entries(1234), client="client-a")
    b = post("shared-key", entries(1234), client="client-b")
    check(a.status == 201 and b.status == 201 and not replayed(b) and a.body != b.body
          and rows(db, "shared-key", "client-a") == 1 and rows(db, "shared-key", "client-b") == 1,
          "the same key from another tenant is a new request (keys are scoped by tenant)",
          f"{a.status} {b.status}")


def test_concurrent_duplicates(db):
    """KEYS keys, each sent DUPLICATES times at once (a barrier per key) while
    the first booking is slow: one execution per key, the others 409 or a
    replay; then every 409 is retried until it gets the stored answer."""
    barriers = {k: threading.Barrier(DUPLICATES, timeout=60) for k in range(KEYS)}

    def deliver(k):
        key, batch = f"dup-{k:02d}", entries(100 + k, 200 + k, account=f"acc-{k}")
        barriers[k].wait()
        first = post(key, batch, delay_ms=SLOW_MS)
        reply, retries = first, 0
        while reply.status == 409 and retries < 400:
            time.sleep(0.025)   # a client backing off (Retry-After, 1 s, would make the test slow)
            reply, retries = post(key, batch, delay_ms=SLOW_MS), retries + 1
        return k, first, reply

    started = time.time()
    with ThreadPoolExecutor(KEYS * DUPLICATES) as pool:
        results = list(pool.map(deliver, [k for k in range(KEYS) for _ in range(DUPLICATES)]))
    print(f"     {KEYS} keys x {DUPLICATES} concurrent requests in {time.time() - started:.1f} s")

    by_key = {}
    for k, first, final in results:
        by_key.setdefault(k, []).append((first, final))
    firsts = Counter(f.status for rs in by_key.values() for f, _ in rs)
    print(f"     first answers by status: {dict(firsts)}")
    originals = Counter(sum(f.status == 201 and not replayed(f) for f, _ in rs) for rs in by_key.values())
    check(originals == Counter({1: KEYS}), "per key exactly one request ran the handler (one non-replayed 201)",
          f"keys by number of originals: {dict(originals)}")
    conflicts = [f for rs in by_key.values() for f, _ in rs if f.status == 409]
    check(conflicts and all(is_problem(f) and f.headers.get("Retry-After") == RETRY_AFTER for f in conflicts),
          f"concurrent duplicates met the original in flight: {len(conflicts)} answered 409 with Retry-After",
          f"{len(conflicts)} conflicts")
    other = [f.status for rs in by_key.values() for f, _ in rs if f.status not in (201, 409)]
    check(not other, "no first answer other than 201 or 409", str(other[:5]))
    check(all(f.status != 201 or not replayed(f) or f.body == original_body(rs)
              for rs in by_key.values() for f, _ in rs),
          "every replay among the concurrent answers is byte-identical to the original")
    finals = [r for rs in by_key.values() for _, r in rs]
    differing = [k for k, rs in by_key.items() if len({r.body for _, r in rs}) != 1]
    check(all(r.status == 201 for r in finals) and not differing,
          f"after retrying the 409s all {len(finals)} requests end in 201, byte-identical per key",
          f"statuses {Counter(r.status for r in finals)}, differing keys {differing[:5]}")
    not_marked = [r for rs in by_key.values() for _, r in rs
                  if r is not original(rs) and not replayed(r)] if originals == Counter({1: KEYS}) else finals
    check(not not_marked, "every answer but the original carries Idempotent-Replayed: true",
          f"{len(not_marked)} without")
    with db.cursor() as cur:
        cur.execute("SELECT idempotency_key, count(*) FROM ledger_entries"
                    " WHERE idempotency_key LIKE 'dup-%' GROUP BY 1")
        counts = Counter(n for _, n in cur.fetchall())
    check(counts == Counter({2: KEYS}), f"the ledger holds exactly one booking (two entries) per key ({KEYS} keys)",
          f"keys by number of rows: {dict(counts)}")


def original(rs):
    return next((f for f, _ in rs if f.status == 201 and not replayed(f)), None)


def original_body(rs):
    return getattr(original(rs), "body", None)


# ---------------------------------------------------------------- main

CHECKS = [test_key_header, test_mismatch, test_in_progress, test_stored_failure, test_validation,
          test_handler_error, test_array_and_record, test_large_tokens, test_tenant_scope,
          test_concurrent_duplicates, test_all_tokens_large]


def test_isolation(db, tenant_setting):
    """The records of test_tenant_scope's key, as the application role; with
    isolation on, the refusals a missing tenant_setting brings (isolation.py)."""
    isolation.check_in_force(check, db, f"host=127.0.0.1 port={PG_PORT} dbname=ledger user=ledger_app",
                             tenant_setting, "shared-key", ("client-a", "client-b"))


def test_without_tenant_setting(db):
    """The same app started without tenant_setting, isolation on: a request
    fails (500) and stores nothing."""
    r = post("no-setting-1", entries(61), client="client-a")
    check(r.status == 500 and rows(db, "no-setting-1", "client-a") == 0
          and record(db, "no-setting-1", "client-a") is None,
          "isolation on, the app started without tenant_setting: a request answers 500, nothing booked or stored",
          f"{r.status} {r.body[:300]!r}")


def run(suite, schema, app_command, extra_checks=()):
    """Run the contract, isolation off then on, against the app that
    app_command(pg_port, http_port, tenant_setting) -> (argv, env) starts;
    each extra check is called as extra(pg_port, tenant_setting)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    started = time.time()
    for tenant_setting in isolation.PASSES:
        print(f"# {isolation.describe(tenant_setting)}")
        servers = Servers(suite)
        try:
            servers.start(schema, tenant_setting)
            db = servers.db()
            isolation.check_role(check, db, "ledger_app", tenant_setting)
            servers.start_app(app_command, tenant_setting)
            for extra in extra_checks:
                extra(PG_PORT, tenant_setting)
            for test in CHECKS:
                test(db)
            test_isolation(db, tenant_setting)
            if tenant_setting:
                servers.stop_app()
                servers.start_app(app_command, None)
                test_without_tenant_setting(db)
            db.close()
        except Exception as e:
            check(False, "the suite ran to the end", repr(e))
        finally:
            servers.stop()
    print(f"     ({time.time() - started:.1f} s)")
    print(f"{suite}: {passed} passed, {failed} failed")
    return 1 if failed else 0
