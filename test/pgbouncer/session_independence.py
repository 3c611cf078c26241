#!/usr/bin/python3
"""Prove that a claim's life needs no session state: through PgBouncer in
transaction pooling, each step of one claim (claim, heartbeat, complete or
release) runs on a different server connection, checked with
pg_backend_pid(), and the protocol still works.

To force a step onto another server connection, "pinning" clients open a
transaction on every backend already used, so PgBouncer must pick another.

Usage: session_independence.py --bouncer-port P --pg-port Q --dbname D
Prints one "ok ..." or "FAIL ..." line per check (counted by 70-pgbouncer).
"""
import argparse
import sys
import time

import psycopg2

args = None
failures = 0


def check(ok, what, detail=""):
    global failures
    failures += not ok
    print(("ok   " if ok else "FAIL ") + what + ("" if ok or not detail else f": {detail}"), flush=True)


def bouncer():
    """A client connection through PgBouncer; psycopg2 opens a transaction per statement batch."""
    return psycopg2.connect(host="127.0.0.1", port=args.bouncer_port, dbname=args.dbname, user="postgres")


def direct():
    conn = psycopg2.connect(host="127.0.0.1", port=args.pg_port, dbname=args.dbname, user="postgres")
    conn.autocommit = True
    return conn


def one_transaction(conn, sql, params=()):
    """Run sql as its own transaction; return (backend pid, first row)."""
    with conn, conn.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
        cur.execute(sql, params)
        return pid, cur.fetchone()


class Pins:
    """Clients holding a transaction open on chosen server connections."""

    def __init__(self):
        self.held = {}

    def pin(self, pid, tries=7):
        """Hold the server connection with this pid; PgBouncer reuses the last released one first."""
        spare = []
        try:
            for _ in range(tries):
                conn = bouncer()
                with conn.cursor() as cur:
                    cur.execute("SELECT pg_backend_pid()")   # opens a transaction: the server is now held
                    got = cur.fetchone()[0]
                if got == pid:
                    self.held[pid] = conn
                    return True
                spare.append(conn)
            return False
        finally:
            for conn in spare:
                conn.rollback()
                conn.close()

    def release(self):
        for conn in self.held.values():
            conn.rollback()   # give the server back clean rather than make PgBouncer drop it
            conn.close()
        self.held.clear()


def locks_left(db):
    with db.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 18756")
        return cur.fetchone()[0]


def test_complete_elsewhere(db):
    app, other, pins = bouncer(), bouncer(), Pins()
    try:
        pid1, (outcome, token) = one_transaction(
            app, "SELECT outcome, token FROM idem_claim('si', 'complete-1', 'fp')")
        check(outcome == "claimed", "claim through PgBouncer", outcome)
        check(locks_left(db) == 0, "no key lock outlives the claim's transaction (nothing session-level)")
        _, (seen,) = one_transaction(other, "SELECT outcome FROM idem_claim('si', 'complete-1', 'fp')")
        check(seen == "in_progress", "another client sees the committed claim as in_progress", seen)

        pinned1 = pins.pin(pid1)
        pid2, _ = one_transaction(app, "SELECT idem_heartbeat('si', 'complete-1', %s)", (token,))
        pinned2 = pins.pin(pid2)
        pid3, _ = one_transaction(app, "SELECT idem_complete('si', 'complete-1', %s, '{\"v\": 1}')", (token,))
        pins.release()
        check(pinned1 and pinned2 and len({pid1, pid2, pid3}) == 3,
              "claim, heartbeat and complete of one key ran on three server connections",
              f"pids {pid1} {pid2} {pid3}, pinned {pinned1} {pinned2}")
        _, (outcome, response) = one_transaction(
            other, "SELECT outcome, response FROM idem_claim('si', 'complete-1', 'fp')")
        check(outcome == "replay" and response == {"v": 1},
              "the complete made on another server connection is replayed", f"{outcome} {response}")
    finally:
        pins.release()
        app.close()
        other.close()


def test_release_elsewhere():
    app, pins = bouncer(), Pins()
    try:
        pid1, (outcome, token1) = one_transaction(
            app, "SELECT outcome, token FROM idem_claim('si', 'release-1')")
        pinned = pins.pin(pid1)
        pid2, _ = one_transaction(app, "SELECT idem_release('si', 'release-1', %s)", (token1,))
        pins.release()
        pid3, (again, token2) = one_transaction(
            app, "SELECT outcome, token FROM idem_claim('si', 'release-1')")
        check(outcome == "claimed" and pinned and pid1 != pid2 and again == "claimed" and token2 > token1,
              "release on another server connection frees the key; the next claim gets a larger token",
              f"{outcome} {again} tokens {token1} {token2} pids {pid1} {pid2} {pid3}")

        # the new claim (token2) is committed and live: a late complete with token1 must be refused
        pid4, (outcome, _) = one_transaction(app, "SELECT outcome, token FROM idem_claim('si', 'release-1')")
        _, (_, token_now) = one_transaction(app, "SELECT status, token FROM idem_lookup('si', 'release-1')")
        pins.pin(pid4)
        try:
            one_transaction(app, "SELECT idem_complete('si', 'release-1', %s)", (token1,))
            refused = None
        except psycopg2.Error as e:
            refused = e.pgcode
        pins.release()
        check(outcome == "in_progress" and refused == "ID002",
              "a stale token is fenced (ID002) whichever server connection it arrives on",
              f"{outcome} {refused} current token {token_now}")
    finally:
        pins.release()
        app.close()


def test_wait_restores_lock_timeout():
    holder, waiter = bouncer(), bouncer()
    try:
        with holder.cursor() as cur:   # a claim in flight: the transaction stays open
            cur.execute("SELECT outcome FROM idem_claim('si', 'wait-1')")
            held = cur.fetchone()[0]
        for session_value, expect in ((None, "0"), ("5s", "5s")):
            with waiter, waiter.cursor() as cur:
                if session_value:
                    cur.execute("SET LOCAL lock_timeout = %s", (session_value,))
                started = time.monotonic()
                cur.execute("SELECT outcome FROM idem_claim('si', 'wait-1', wait => '200ms')")
                outcome = cur.fetchone()[0]
                waited = time.monotonic() - started
                cur.execute("SHOW lock_timeout")
                after = cur.fetchone()[0]
            check(held == "claimed" and outcome == "in_progress" and waited >= 0.15 and after == expect,
                  f"a claim that waited leaves the caller's lock_timeout as it was ({expect})",
                  f"{held} {outcome} waited {waited:.2f}s lock_timeout {after!r}")
        holder.rollback()
    finally:
        holder.close()
        waiter.close()


def test_set_local_settings():
    """Behind transaction pooling a plain SET would stick to a server connection; SET LOCAL is the way."""
    app = bouncer()
    try:
        with app, app.cursor() as cur:
            cur.execute("SET LOCAL idempotency.lease = '42s'")
            cur.execute("SELECT expires_at - now() FROM idem_claim('si', 'set-local-1')")
            lease = cur.fetchone()[0].total_seconds()
        _, (setting,) = one_transaction(app, "SELECT current_setting('idempotency.lease')")
        check(41 <= lease <= 43 and setting == "5min",
              "SET LOCAL idempotency.lease applies to its transaction and nothing after it",
              f"lease {lease:.1f}s, setting afterwards {setting!r}")
    finally:
        app.close()


def main():
    global args
    ap = argparse.ArgumentParser()
    ap.add_argument("--bouncer-port", type=int, required=True)
    ap.add_argument("--pg-port", type=int, required=True)
    ap.add_argument("--dbname", required=True)
    args = ap.parse_args()
    db = direct()
    try:
        test_complete_elsewhere(db)
        test_release_elsewhere()
        test_wait_restores_lock_timeout()
        test_set_local_settings()
    except Exception as e:
        check(False, "session independence checks ran to the end", repr(e))
    db.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
