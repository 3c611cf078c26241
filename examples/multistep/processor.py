#!/usr/bin/python3
"""A stand-in card processor for the multi-step example (127.0.0.1 only).

    POST /v1/charges   Idempotency-Key: <key>   {"amount_cents": 1250, "order_ref": "..."}

behaves like Stripe's idempotent requests: the first call with a key creates
a charge and answers 201 with it; every later call with the same key and the
same body answers the same charge again (200, header Idempotent-Replayed:
true) and charges nothing; the same key with another body is refused (422);
a call without a key is refused (400).  Calls with one key are serialised, so
two concurrent retries still create one charge.

Every call it receives is recorded, replays and refusals included:

    GET /v1/calls      [{"key": ..., "body": {...}, "status": 201, "charge_id": ...,
                         "replayed": false, "at": ...}, ...]
    GET /v1/charges    {"<key>": {"id": ..., "amount_cents": ..., ...}, ...}

(`--journal FILE` also appends each call to FILE as one JSON line.)  So a
test can count, per key, the effects (charges created) and the calls
separately.  State lives in memory: restarting the processor forgets it.

Usage: processor.py [--port 0] [--journal FILE]
Python 3 standard library only.
"""
import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Ledger:
    """Charges by idempotency key, and every call received."""

    def __init__(self, journal=None):
        self.lock = threading.Lock()
        self.charges = {}      # key -> (request body, charge)
        self.calls = []
        self.journal = journal

    def charge(self, key, body):
        """(status, charge or error document, replayed) for one call."""
        with self.lock:        # one lock: calls with one key never interleave
            if key in self.charges:
                first_body, charge = self.charges[key]
                if first_body != body:
                    result = (422, {"error": "idempotency_key_reused",
                                    "detail": "this key was used with another request"}, False)
                else:
                    result = (200, charge, True)
            else:
                charge = {"id": "ch_%06d" % (len(self.charges) + 1),
                          "amount_cents": body.get("amount_cents"),
                          "order_ref": body.get("order_ref"), "status": "succeeded"}
                self.charges[key] = (body, charge)
                result = (201, charge, False)
            self.record(key, body, result)
            return result

    def record(self, key, body, result):
        status, doc, replayed = result
        call = {"key": key, "body": body, "status": status, "replayed": replayed,
                "charge_id": doc.get("id"), "at": time.time()}
        self.calls.append(call)
        if self.journal:
            with open(self.journal, "a", encoding="utf-8") as f:
                f.write(json.dumps(call) + "\n")


class Handler(BaseHTTPRequestHandler):
    server_version = "StandInProcessor/1"

    def log_message(self, fmt, *args):     # quiet: the journal is the log
        pass

    def answer(self, status, doc, headers=()):
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        ledger = self.server.ledger
        with ledger.lock:
            if self.path == "/v1/calls":
                return self.answer(200, list(ledger.calls))
            if self.path == "/v1/charges":
                return self.answer(200, {k: c for k, (_, c) in ledger.charges.items()})
        self.answer(404, {"error": "not_found"})

    def do_POST(self):
        if self.path != "/v1/charges":
            return self.answer(404, {"error": "not_found"})
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return self.answer(400, {"error": "invalid_json"})
        key = self.headers.get("Idempotency-Key")
        if not key:
            self.server.ledger.record(None, body, (400, {}, False))
            return self.answer(400, {"error": "missing_idempotency_key"})
        status, doc, replayed = self.server.ledger.charge(key, body)
        self.answer(status, doc, [("Idempotent-Replayed", "true")] if replayed else [])


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, default=0, help="0: any free port")
    p.add_argument("--journal", help="append every call to this file, one JSON line each")
    a = p.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    server.daemon_threads = True
    server.ledger = Ledger(a.journal)
    print("card processor listening on http://127.0.0.1:%d" % server.server_address[1],
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
