#!/usr/bin/python3
"""Reference HTTP integration of the idempotency extension.

POST /payments takes an Idempotency-Key header (IETF draft
draft-ietf-httpapi-idempotency-key-header, as Stripe uses it) and charges at
most once per (client, key), however often and however concurrently the
request is retried.  Each request is ONE database transaction:

    idem_claim(client, key, fingerprint) says what this request does:
      claimed      run the charge, store the response with idem_complete -> 201
      replay       send the stored status and body again  (Idempotent-Replayed: true)
      failed       send the stored error status and body  (Idempotent-Replayed: true)
      in_progress  the first request is still running     -> 409 + Retry-After
      mismatch     the key was used for another request   -> 422
    COMMIT

What is stored (Stripe's rule: results are saved once execution began):
  - 201 and business failures (a declined card, 402) are stored: a retry gets
    the same answer and never charges again;
  - a request refused before execution (missing or bad key, invalid body:
    400) is not stored, so the client may fix it and reuse the key;
  - an unexpected error (500) is not stored either, and needs not be: the
    claim and the charge commit together, so the error rolled both back and
    a retry simply runs again.

Usage:  server.py --dsn "host=127.0.0.1 dbname=payments user=payments_app" --port 8080
(schema.sql creates the table and the role).  Python 3 stdlib + psycopg2.
"""
import argparse
import hashlib
import json
import re
import sys
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg2
import psycopg2.pool
from psycopg2.extras import Json

MAX_IDENTIFIER_BYTES = 255           # the extension's limit on tenant_id and key
DECLINED_SOURCE = "tok_chargeDeclined"  # Stripe's test token for a declined card
SF_STRING = re.compile(r'"((?:[^"\\]|\\["\\])*)"')  # RFC 8941 sf-string


class Refused(Exception):
    """A request refused before any work starts; nothing is stored."""

    def __init__(self, status, title, detail=None):
        super().__init__(title)
        self.status, self.title, self.detail = status, title, detail


def problem(status, title, detail=None):
    """An RFC 7807 problem document, as the IETF draft recommends."""
    doc = {"type": "about:blank", "title": title, "status": status}
    if detail:
        doc["detail"] = detail
    return doc


def parse_identifier(value, name):
    """A printable-ASCII identifier of 1..255 bytes (so bytes == characters)."""
    if not value:
        raise Refused(400, f"{name} must not be empty")
    if len(value) > MAX_IDENTIFIER_BYTES:
        raise Refused(400, f"{name} is too long",
                      f"{len(value)} characters; the limit is {MAX_IDENTIFIER_BYTES}.")
    if not all(" " <= c <= "~" for c in value):
        raise Refused(400, f"{name} must be printable ASCII")
    return value


def parse_idempotency_key(values):
    """The key: an sf-string ("abc") per the IETF draft, or bare (abc) as Stripe sends it."""
    if not values:
        raise Refused(400, "Idempotency-Key header is required",
                      "POST /payments needs an Idempotency-Key, e.g. a UUID v4.")
    if len(values) > 1:
        raise Refused(400, "only one Idempotency-Key header is allowed")
    raw = values[0].strip()
    if raw.startswith('"'):
        quoted = SF_STRING.fullmatch(raw)
        if not quoted:
            raise Refused(400, "Idempotency-Key is not a valid structured-field string")
        raw = re.sub(r'\\(["\\])', r"\1", quoted.group(1))
    return parse_identifier(raw, "Idempotency-Key")


def parse_payment(body):
    """Validate the request body: {"amount": cents > 0, "currency": "EUR", "source": ...}."""
    try:
        payment = json.loads(body)
    except ValueError:
        raise Refused(400, "the body is not valid JSON") from None
    if not isinstance(payment, dict):
        raise Refused(400, "the body must be a JSON object")
    amount = payment.get("amount")
    if type(amount) is not int or amount <= 0:
        raise Refused(400, "amount must be a positive integer (minor units)")
    if not isinstance(payment.get("currency"), str) or not re.fullmatch(r"[A-Z]{3}", payment["currency"]):
        raise Refused(400, "currency must be an ISO 4217 code such as EUR")
    if not isinstance(payment.get("source", ""), str):
        raise Refused(400, "source must be a string")
    return payment


def canonical_json(value):
    """One byte form per JSON value: the first response and its replays are byte-identical."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def fingerprint(method, path, payment):
    """What makes two requests "the same": method, path and the canonical body."""
    return hashlib.sha256(f"{method} {path}\n".encode() + canonical_json(payment)).hexdigest()


def create_payment(conn, client, key, payment, test_delay=0.0, test_fail=False):
    """The whole idempotent operation.  Returns (status, body, replayed, extra headers)."""
    with conn, conn.cursor() as cur:   # one transaction: COMMIT on return, ROLLBACK on exception
        cur.execute("SELECT outcome, token, response FROM idem_claim(%s, %s, %s)",
                    (client, key, fingerprint("POST", "/payments", payment)))
        outcome, token, stored = cur.fetchone()

        if outcome in ("replay", "failed"):
            # ours are {"status", "body"}; anything else (such as the extension's
            # {"error": "lease_expired"} under stale_action = fail) replays as a 500
            if not (isinstance(stored, dict) and "status" in stored):
                stored = {"status": 500, "body": stored}
            return stored["status"], stored["body"], True, {}
        if outcome == "in_progress":
            return 409, problem(409, "a request with this Idempotency-Key is still being processed",
                                "Retry later with the same key."), False, {"Retry-After": "1"}
        if outcome == "mismatch":
            return 422, problem(422, "this Idempotency-Key was used for a different request",
                                "A key must not be reused with another payload."), False, {}

        # claimed: this request, and only this one, runs the charge
        time.sleep(test_delay)
        if payment.get("source") == DECLINED_SOURCE:
            failure = {"status": 402, "body": {"error": {
                "type": "card_error", "code": "card_declined", "message": "Your card was declined."}}}
            cur.execute("SELECT idem_release(%s, %s, %s, failure => %s)",
                        (client, key, token, Json(failure)))
            return failure["status"], failure["body"], False, {}

        cur.execute("INSERT INTO payments (client_id, idempotency_key, amount, currency)"
                    " VALUES (%s, %s, %s, %s)"
                    " RETURNING id, extract(epoch FROM created_at)::bigint",
                    (client, key, payment["amount"], payment["currency"]))
        payment_id, created = cur.fetchone()
        if test_fail:
            raise RuntimeError("test hook: failing after the charge")
        response = {"status": 201, "body": {
            "id": f"pay_{payment_id}", "object": "payment", "status": "succeeded",
            "amount": payment["amount"], "currency": payment["currency"], "created": created}}
        cur.execute("SELECT idem_complete(%s, %s, %s, %s)", (client, key, token, Json(response)))
        return response["status"], response["body"], False, {}


class ConnectionPool:
    """A few connections shared by the request threads; a request waits for a free one."""

    def __init__(self, dsn, size):
        self._pool = psycopg2.pool.ThreadedConnectionPool(1, size, dsn)
        self._free = threading.BoundedSemaphore(size)

    @contextmanager
    def connection(self):
        with self._free:
            conn = self._pool.getconn()
            try:
                yield conn
            finally:
                self._pool.putconn(conn, close=bool(conn.closed))


class PaymentsHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/payments":
            return self.reply(404, problem(404, "not found"), content_type="application/problem+json")
        try:
            client = parse_identifier(self.headers.get("X-Client-Id", "default"), "X-Client-Id")
            key = parse_idempotency_key(self.headers.get_all("Idempotency-Key"))
            payment = parse_payment(body)
        except Refused as r:
            return self.reply(r.status, problem(r.status, r.title, r.detail),
                              content_type="application/problem+json")

        hooks = {}
        if self.server.test_hooks:   # only with --test-hooks: make the charge slow or fail
            hooks = {"test_delay": int(self.headers.get("X-Test-Delay-Ms", 0)) / 1000,
                     "test_fail": "X-Test-Fail-After-Charge" in self.headers}
        try:
            with self.server.pool.connection() as conn:
                status, body, replayed, headers = create_payment(conn, client, key, payment, **hooks)
        except Exception as e:   # rolled back: nothing was charged or stored
            self.log_error("POST /payments failed: %r", e)
            return self.reply(500, problem(500, "internal error",
                                           "Nothing was stored; retrying with the same key is safe."),
                              content_type="application/problem+json")
        if replayed:
            headers["Idempotent-Replayed"] = "true"
        is_problem = status in (409, 422)
        self.reply(status, body, headers,
                   content_type="application/problem+json" if is_problem else "application/json")

    def reply(self, status, body, headers=None, content_type="application/json"):
        data = canonical_json(body)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, fmt, *args):
        if self.server.verbose:
            super().log_message(fmt, *args)

    def log_error(self, fmt, *args):
        super().log_message(fmt, *args)   # errors are always logged


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dsn", required=True, help="libpq connection string")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--pool-size", type=int, default=10, help="database connections")
    ap.add_argument("--verbose", action="store_true", help="log every request")
    ap.add_argument("--test-hooks", action="store_true",
                    help="honour X-Test-Delay-Ms and X-Test-Fail-After-Charge (tests only)")
    args = ap.parse_args()

    ThreadingHTTPServer.request_queue_size = 128   # bursts of concurrent retries
    server = ThreadingHTTPServer((args.host, args.port), PaymentsHandler)
    server.daemon_threads = True
    server.pool = ConnectionPool(args.dsn, args.pool_size)
    server.verbose, server.test_hooks = args.verbose, args.test_hooks
    print(f"listening on http://{args.host}:{args.port}/payments", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
