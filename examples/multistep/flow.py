#!/usr/bin/python3
"""A multi-step operation that survives a crashed holder: create an order,
charge it through a card processor, send the receipt.

One idempotency key covers the whole operation.  Each phase is one database
transaction holding the phase's business writes AND its recovery point
(idem_checkpoint), so they commit or roll back together:

    claim     idem_claim(tenant, key, lease => ...)          own transaction
    phase 1   INSERT orders     + idem_checkpoint('order_created', {order_id})
    phase 2   POST /v1/charges with Idempotency-Key = idem_child_key(tenant, key, 'charge')
              INSERT charges    + idem_checkpoint('charged', {order_id, charge_id})
    phase 3   INSERT receipt_outbox + idem_complete(response)

If the holder dies anywhere, the next delivery of the key is 'claimed' once
the lease is over (or at once after idem_release) and receives the
recovery_point and state of the last committed checkpoint: it skips the
phases already done.  Phase 2 talks to a system outside the database: a
holder can die after the processor charged and before 'charged' committed,
so the resumed holder calls again -- with the same child key, which the
processor dedupes, so the card is charged once.

A holder whose lease was taken over (a zombie) is refused by idem_checkpoint
and idem_complete (SQLSTATE ID002): its phase transaction rolls back, its
writes with it.

Usage:
  flow.py --dsn "dbname=shop" --processor http://127.0.0.1:8181 \\
          --tenant shop-42 --key order-7f3a --amount 1250 --email a@example.com
Exit status: 0 done (completed now, or a replay of the stored answer),
3 in progress elsewhere (retry after the printed lease end), 4 stopped by an
injected fault (tests), 1 error.

Test hooks (test/suites/78-multistep): --crash-at POINT --crash-how HOW stops
the holder at POINT (one of CRASH_POINTS) by HOW:
  kill     SIGKILL to this process (an open transaction dies with it)
  abort    roll the open transaction back and exit, leaving the lease to expire
  release  roll back, idem_release without a failure, try a late checkpoint
  stall    SIGSTOP to this process (a GC pause); the test sends SIGCONT later
--events FILE appends what the holder saw and did, one JSON line each.
Python 3 standard library + psycopg2 (Debian: python3-psycopg2).
"""
import argparse
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request

import psycopg2
from psycopg2.extras import Json

CRASH_POINTS = (
    "after-claim",        # claimed, nothing done
    "in-order",           # order written and checkpointed, not committed
    "after-order",        # 'order_created' committed, processor not called
    "after-charge-call",  # the processor charged, 'charged' not written
    "in-charge",          # charge written and checkpointed, not committed
    "after-charge",       # 'charged' committed, receipt not written
    "in-receipt",         # receipt written and completed, not committed
)
CRASH_HOWS = ("kill", "abort", "release", "stall")


class Stopped(Exception):
    """An injected fault ended this holder (abort or release)."""


class Holder:
    def __init__(self, conn, args):
        self.conn = conn
        self.a = args
        self.token = None

    # ---- test hooks ----------------------------------------------------

    def event(self, **ev):
        if not self.a.events:
            return
        ev.update(pid=os.getpid(), tenant=self.a.tenant, key=self.a.key, token=self.token,
                  t=time.time())
        # one write(2) per line on an O_APPEND descriptor: lines from holders
        # running side by side never interleave, and a line written survives
        # a SIGKILL right after
        fd = os.open(self.a.events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(ev) + "\n").encode())
        finally:
            os.close(fd)

    def crash_point(self, point):
        if self.a.crash_at != point:
            return
        how = self.a.crash_how
        self.event(ev="crash", at=point, how=how)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif how == "stall":
            os.kill(os.getpid(), signal.SIGSTOP)   # resumes here on SIGCONT
            self.event(ev="resumed", at=point)
            return
        raise Stopped(how)     # the open transaction, if any, rolls back

    def release(self, at):
        """The holder gives up without a failure: the next claim takes over
        at once, from the last committed checkpoint."""
        with self.conn, self.conn.cursor() as cur:
            cur.execute("SELECT idem_release(%s, %s, %s)", (self.a.tenant, self.a.key, self.token))
        self.event(ev="released", at=at)
        try:                   # a late call of the released holder must be refused
            with self.conn, self.conn.cursor() as cur:
                self.checkpoint(cur, "late", None)
            self.event(ev="late", at=at, sqlstate=None)
        except psycopg2.Error as e:
            self.event(ev="late", at=at, sqlstate=e.pgcode)

    # ---- the operation -------------------------------------------------

    def checkpoint(self, cur, point, state):
        cur.execute("SELECT idem_checkpoint(%s, %s, %s, %s, %s)",
                    (self.a.tenant, self.a.key, self.token, point,
                     None if state is None else Json(state)))

    def claim(self):
        a = self.a
        with self.conn, self.conn.cursor() as cur:
            cur.execute("SELECT outcome, token, response, expires_at, recovery_point, state"
                        " FROM idem_claim(%s, %s, %s, lease => %s::interval)",
                        (a.tenant, a.key, "amount=%d;email=%s" % (a.amount, a.email), a.lease))
            return cur.fetchone()

    def run(self):
        outcome, self.token, response, expires_at, point, state = self.claim()
        self.event(ev="claim", outcome=outcome, rp=point, state=state,
                   expires_at=expires_at.timestamp() if expires_at else None)
        if outcome != "claimed":
            return outcome, response, expires_at
        state = state or {}
        self.crash_point("after-claim")

        if point is None:                                   # phase 1: the order
            with self.conn, self.conn.cursor() as cur:
                cur.execute("INSERT INTO orders (tenant_id, idem_key, amount_cents, email)"
                            " VALUES (%s, %s, %s, %s) RETURNING id",
                            (self.a.tenant, self.a.key, self.a.amount, self.a.email))
                state = {"order_id": cur.fetchone()[0]}
                self.checkpoint(cur, "order_created", state)
                self.crash_point("in-order")
            point = "order_created"
            self.event(ev="committed", point=point, state=state)
            self.crash_point("after-order")

        if point == "order_created":                        # phase 2: the charge
            charge, child = self.charge(state["order_id"])
            self.crash_point("after-charge-call")
            with self.conn, self.conn.cursor() as cur:
                cur.execute("INSERT INTO charges (order_id, charge_id, child_key, amount_cents)"
                            " VALUES (%s, %s, %s, %s)",
                            (state["order_id"], charge["id"], child, self.a.amount))
                state = dict(state, charge_id=charge["id"])
                self.checkpoint(cur, "charged", state)
                self.crash_point("in-charge")
            point = "charged"
            self.event(ev="committed", point=point, state=state)
            self.crash_point("after-charge")

        if point != "charged":
            raise RuntimeError("unknown recovery point %r" % point)
        response = {"status": 201, "order_id": state["order_id"],
                    "charge_id": state["charge_id"]}
        with self.conn, self.conn.cursor() as cur:         # phase 3: the receipt
            cur.execute("INSERT INTO receipt_outbox (order_id, email, body)"
                        " VALUES (%s, %s, %s)",
                        (state["order_id"], self.a.email,
                         "Order %d: %.2f charged (%s)" % (state["order_id"], self.a.amount / 100,
                                                         state["charge_id"])))
            cur.execute("SELECT idem_complete(%s, %s, %s, %s)",
                        (self.a.tenant, self.a.key, self.token, Json(response)))
            self.crash_point("in-receipt")
        self.event(ev="committed", point="completed", state=response)
        return "completed", response, None

    def charge(self, order_id):
        """POST the charge with the step's child key: the same key on every
        attempt of this operation, so the processor charges at most once."""
        with self.conn, self.conn.cursor() as cur:
            cur.execute("SELECT idem_child_key(%s, %s, 'charge')", (self.a.tenant, self.a.key))
            child = cur.fetchone()[0]
        body = json.dumps({"amount_cents": self.a.amount,
                           "order_ref": "%s/%s" % (self.a.tenant, self.a.key)}).encode()
        req = urllib.request.Request(self.a.processor.rstrip("/") + "/v1/charges", data=body,
                                     method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Idempotency-Key": child})
        with urllib.request.urlopen(req, timeout=10) as r:
            charge = json.loads(r.read())
            self.event(ev="called", child=child, status=r.status, charge_id=charge["id"],
                       order_id=order_id)
        return charge, child


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dsn", required=True)
    p.add_argument("--processor", required=True, help="base URL of the card processor")
    p.add_argument("--tenant", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--amount", type=int, required=True, help="in cents")
    p.add_argument("--email", default="customer@example.com")
    p.add_argument("--lease", default="30 seconds",
                   help="how long a dead holder keeps the key (longer than a phase)")
    p.add_argument("--crash-at", choices=CRASH_POINTS)
    p.add_argument("--crash-how", choices=CRASH_HOWS, default="kill")
    p.add_argument("--events", help="append what happened to this file (JSON lines)")
    return p.parse_args(argv)


def main(argv):
    a = parse_args(argv)
    conn = psycopg2.connect(a.dsn, application_name="multistep-flow")
    holder = Holder(conn, a)
    try:
        outcome, response, expires_at = holder.run()
    except Stopped as e:
        if a.crash_how == "release":
            holder.release(a.crash_at)
        print("stopped by an injected fault (%s at %s)" % (e, a.crash_at))
        return 4
    except (psycopg2.Error, urllib.error.URLError) as e:
        # a refused checkpoint (ID002: our lease was taken over) lands here
        # too; the phase's transaction rolled back, nothing of it remains
        holder.event(ev="error", sqlstate=getattr(e, "pgcode", None), msg=str(e).strip()[:200])
        print("error: %s" % str(e).strip(), file=sys.stderr)
        return 1
    finally:
        conn.close()
    if outcome == "in_progress":
        print("in_progress until %s" % (expires_at.isoformat() if expires_at else "unknown"))
        return 3
    print(json.dumps({"outcome": outcome, "response": response}, sort_keys=True))
    return 0 if outcome in ("completed", "replay") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
