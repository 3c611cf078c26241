#!/usr/bin/env python3
"""Exactly-once soak for the idempotency extension (issue 4, suite 2).

Many sessions deliver every key several times, in shuffled order with
bursts of concurrent duplicates, the way a broker redelivers messages:

  * in-transaction keys: BEGIN; idem_claim; if claimed, INSERT a row into
    soak.payments and idem_complete with a response carrying a hash; COMMIT.
    10 % of the winners ROLLBACK instead (before or after idem_complete).
  * two-phase keys: idem_claim with a short lease, COMMIT; the work (a row in
    soak.effects) runs outside that transaction; then idem_complete,
    idem_release or idem_release with a failure in a second transaction.
    Some holders heartbeat, some stall past their lease (so a redelivery
    takes the key over and the holder's late settle must be refused with
    ID002), a few die without settling (the sweeper must free the key).
  * multi-step keys (issue 14): idem_claim with a short lease, then three
    phases, each one transaction: a row in soak.steps and idem_checkpoint
    ('p1', 'p2', with a small state) or, for the last, idem_complete.  Between
    phases some holders die (the lease runs out), roll the phase back and die,
    release without a failure, or stall past their lease (a zombie whose next
    checkpoint must be refused); the key is then redelivered the way a broker
    does (after the lease, or at once after a release) and the next holder
    must resume after the last committed point.  The sweeper gets every
    chance to remove a checkpointed record: on top of the sweeper worker,
    the sessions call idem_sweep() (each time in a transaction of its own)
    right after each fault (death, rollback, release, stall), after each
    phase a holder commits, and before each claim of a redelivery or of a
    key a holder failed on -- such a claim comes after the failed holder's
    lease, so that sweep finds the checkpointed record with its lease over.
    Since 1.2 such a record is kept for its retention (the claim's --ttl,
    1 hour by default, far longer than the run), so no holder may restart
    from an earlier phase.  Deletions are read from a logical replication
    slot (wal_level = logical; without it the multi-step keys are left out):
    the checker allows a checkpointed record to be deleted only after its
    retention ended (then the next holder starts over, as documented).
  * some deliveries carry a different fingerprint (mismatch, never executed).
  * a delivery answered in_progress is redelivered later.

Every call goes to a history (history.py); checker.py then verifies the
invariants I1-I7 and I9 (multi-step) from the history and the final tables.  Exit status 0 only
if every invariant holds.

Other modes: --check-only FILE re-checks a saved history against the
database; --verify-acked FILE checks only that every acknowledged completion
in FILE is stored (the crash test runs it after each restart while the soak
goes on).  --crash-tolerant makes sessions reconnect after the server dies
(an interrupted delivery is redelivered; a COMMIT without answer is recorded
as unknown).

Keys repeat across tenants (the same key string in each of --tenants), so
every per-key check also catches a tenant seeing another tenant's record.
The checker models stale claims as released (idempotency.stale_action =
release, the default); the soak refuses to run otherwise.  selftest.py proves
each check can fail by planting faults into a history that passed.

Nothing depends on session state between transactions, so the soak also runs
through PgBouncer in transaction pooling mode.
"""
import argparse
import hashlib
import heapq
import json
import os
import random
import struct
import sys
import tempfile
import threading
import time

import psycopg2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checker  # noqa: E402
import history  # noqa: E402

TX_LEASE = "60 seconds"     # in-transaction claims: the transaction is the lease
CLAIM_WAIT = "200 milliseconds"
MAX_ATTEMPTS = 200          # redeliveries of one in_progress delivery
MULTI_POINTS = ("p1", "p2")  # recovery points of the multi-step keys; phase 3 completes
MULTI_FAULTS = ("die", "rollback", "release", "stall")
DELETIONS = "idem_soak_deletions"   # publication and logical slot that see every DELETE
SWEEP_SQL = "SELECT expired_removed, stale_released, stale_failed FROM idem_sweep()"


class ConnectionLost(Exception):
    """The server went away in the middle of a delivery."""


def sha(text):
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def xid32(xid8):
    """The 32-bit transaction id (as pgoutput reports it) of an xid8, or None."""
    return None if xid8 is None else int(xid8) & 0xFFFFFFFF


def jsonb_text(doc):
    """The text jsonb prints for a flat object: keys ordered by length, then
    bytes, ", " and ": " separators.  Sending exactly that text lets the
    checker compare the stored and replayed responses byte for byte with
    what the holder sent."""
    items = sorted(doc.items(), key=lambda kv: (len(kv[0].encode()), kv[0].encode()))
    return "{" + ", ".join(json.dumps(k) + ": " + json.dumps(v) for k, v in items) + "}"


class Plan:
    """Which keys exist, their mode, and the order of their deliveries."""

    def __init__(self, args):
        rng = random.Random(args.seed)
        self.tenants = ["soak-t%d" % i for i in range(args.tenants)]
        self.keys = []   # index -> (tenant, key, mode)
        for i in range(args.keys):
            # the same key string lives in every tenant
            tenant = self.tenants[i % args.tenants]
            key = "k%06d" % (i // args.tenants)
            r = rng.random()
            mode = ("tx" if r < args.tx_share else
                    "multi" if r < args.tx_share + args.multi_share else "lease")
            self.keys.append((tenant, key, mode))
        # orphans: delivered once, by a holder that dies; only the sweeper
        # (or a later claim) can free them, which the liveness check tests
        self.orphans = set(range(args.keys, args.keys + args.orphans))
        for i in sorted(self.orphans):
            self.keys.append((self.tenants[i % args.tenants], "orphan%04d" % i, "lease"))
        groups = [[i * args.deliveries] for i in sorted(self.orphans)]
        for i in range(args.keys):
            ds = [i * args.deliveries + n for n in range(args.deliveries)]
            if rng.random() < args.burst and len(ds) >= 2:
                # a burst: 2-3 deliveries queued back to back, so that idle
                # sessions pick them up at the same instant
                n = min(len(ds), rng.choice((2, 3)))
                groups.append(ds[:n])
                groups.extend([d] for d in ds[n:])
            else:
                groups.extend([d] for d in ds)
        rng.shuffle(groups)
        self.order = [d for g in groups for d in g]
        self.mismatch = {d for d in self.order if rng.random() < args.mismatch}

    def delivery(self, d, deliveries):
        """(tenant, key, mode, fingerprint, orphan) of delivery d."""
        tenant, key, mode = self.keys[d // deliveries]
        fp = "fp-%s-%s" % (tenant, key)
        if d in self.mismatch:
            fp += "-other%d" % d
        return tenant, key, mode, fp, d // deliveries in self.orphans


class DeliveryQueue:
    """Deliveries ready now (in plan order) or later (redeliveries).  Urgent
    redeliveries (multi-step keys, the way a broker hands a message to the
    next consumer when its visibility timeout ends) go before the backlog
    once they are due."""

    def __init__(self, order):
        self.cv = threading.Condition()
        self.heap = [(0.0, i, (d, 0)) for i, d in enumerate(order)]
        self.urgent = []
        self.seq = len(order)
        self.outstanding = len(order)
        self.stopped = False

    def get(self):
        with self.cv:
            while True:
                if self.outstanding == 0 or self.stopped:
                    return None
                now = time.monotonic()
                for heap in (self.urgent, self.heap):
                    if heap and heap[0][0] <= now:
                        return heapq.heappop(heap)[2]
                due = [heap[0][0] for heap in (self.urgent, self.heap) if heap]
                if due:
                    self.cv.wait(min(due) - now)
                else:
                    self.cv.wait()

    def redeliver(self, item, delay, urgent=False):
        with self.cv:
            self.seq += 1
            heapq.heappush(self.urgent if urgent else self.heap,
                           (time.monotonic() + delay, self.seq, item))
            self.cv.notify()

    def done(self):
        with self.cv:
            self.outstanding -= 1
            if self.outstanding == 0:
                self.cv.notify_all()

    def stop(self):
        with self.cv:
            self.stopped = True
            self.cv.notify_all()


def connect(args):
    return psycopg2.connect(host=args.host, port=args.port, dbname=args.dbname,
                            user=args.user, application_name="idem-soak",
                            connect_timeout=5)


def is_connection_error(exc, conn):
    """The server went away (crash, shutdown) rather than refused the call.
    An error without SQLSTATE never came from the server: libpq lost the
    connection."""
    if isinstance(exc, psycopg2.InterfaceError) or conn is None or conn.closed:
        return True
    code = getattr(exc, "pgcode", None)
    return code is None or code.startswith("57P") or code.startswith("08")


class Session(threading.Thread):
    """One client connection taking deliveries off the queue."""

    def __init__(self, sid, driver):
        super().__init__(name="soak-%d" % sid, daemon=True)
        self.sid = sid
        self.driver = driver
        self.args = driver.args
        self.conn = None
        self.txn_seq = 0
        self.x = None
        self.last_ok = None
        self.error = None
        self.calls = {}     # calls that reached the server, by event kind

    # ---- plumbing -------------------------------------------------------

    def reconnect(self):
        deadline = time.time() + self.args.reconnect_timeout
        while True:
            try:
                if self.conn is not None:
                    self.conn.close()
            except psycopg2.Error:
                pass
            try:
                self.conn = connect(self.args)
                return
            except psycopg2.Error:
                if time.time() >= deadline or self.driver.queue.stopped:
                    raise
                time.sleep(0.2)

    def begin(self):
        self.txn_seq += 1
        self.x = "%d.%d" % (self.sid, self.txn_seq)
        self.last_ok = None

    def call(self, ev, sql, params):
        """Run one statement of the current transaction; record it.  Returns
        the first row (or None), and the SQLSTATE when it failed."""
        ev.update(s=self.sid, x=self.x)
        ev["t0"] = time.time()
        try:
            cur = self.conn.cursor()
            cur.execute(sql, params)
            row = cur.fetchone() if cur.description else None
            ev["t1"] = time.time()
            ev["ok"] = True
            self.last_ok = ev["t1"]
            self.calls[ev["e"]] = self.calls.get(ev["e"], 0) + 1
            return row, ev
        except psycopg2.Error as exc:
            ev["t1"] = time.time()
            ev["ok"] = False
            lost = is_connection_error(exc, self.conn)
            ev["err"] = "conn" if lost else exc.pgcode
            if lost or exc.pgcode not in ("ID001", "ID002"):
                ev["msg"] = "%s: %s" % (type(exc).__name__, str(exc).strip()[:200])
            if lost:
                # the caller never sees this event: record it here
                self.record(ev)
                self.end_lost("lost")
                raise ConnectionLost() from exc
            self.calls[ev["e"]] = self.calls.get(ev["e"], 0) + 1
            return None, ev

    def record(self, ev):
        self.driver.history.add(ev)

    def end(self, how):
        """COMMIT or ROLLBACK; returns True when the server acknowledged it."""
        ev = {"e": "end", "how": how, "s": self.sid, "x": self.x, "t0": time.time()}
        try:
            if how == "commit":
                self.conn.commit()
            else:
                self.conn.rollback()
            ev["t1"] = time.time()
            ev["res"] = "ok"
            self.record(ev)
            return True
        except psycopg2.Error as exc:
            ev["t1"] = time.time()
            if is_connection_error(exc, self.conn):
                # the COMMIT may or may not have reached the WAL
                ev["res"] = "unknown" if how == "commit" else "lost"
                self.record(ev)
                raise ConnectionLost() from exc
            ev["res"] = "error"
            ev["err"] = exc.pgcode
            self.record(ev)
            self.conn.rollback()
            return False

    def end_lost(self, res):
        self.record({"e": "end", "how": "none", "s": self.sid, "x": self.x,
                     "t0": self.last_ok or time.time(), "t1": time.time(), "res": res})

    # ---- the work -------------------------------------------------------

    def run(self):
        try:
            self.reconnect()
            while True:
                item = self.driver.queue.get()
                if item is None:
                    break
                self.deliver(item)
        except Exception as exc:   # a bug in the driver, or the server is gone for good
            self.error = exc
            self.driver.queue.stop()
        finally:
            if self.conn is not None:
                self.conn.close()

    def deliver(self, item):
        d, attempt = item
        tenant, key, mode, fp, orphan = self.driver.plan.delivery(d, self.args.deliveries)
        rng = random.Random(self.args.seed * 1000003 + d * 1009 + attempt)
        base = {"d": d, "a": attempt, "tn": tenant, "k": key, "m": mode, "fp": fp}
        self.handed_on = False      # a stalled multi-step holder redelivered its delivery
        try:
            if mode == "tx":
                outcome, retry_after = self.deliver_in_transaction(base, rng)
            elif mode == "multi":
                outcome, retry_after = self.deliver_multi_step(base, rng)
            else:
                outcome, retry_after = self.deliver_two_phase(base, rng, orphan)
        except ConnectionLost:
            if not self.args.crash_tolerant:
                self.driver.queue.stop()
                raise RuntimeError("connection lost (run with --crash-tolerant "
                                   "if the server is meant to crash)")
            self.reconnect()
            if not self.handed_on:
                self.driver.queue.redeliver((d, attempt + 1), 0.05, urgent=mode == "multi")
            return
        if outcome == "handed_on":
            return      # a stalled holder's delivery went on as a redelivery
        if outcome in ("in_progress", "redeliver"):
            if attempt + 1 >= MAX_ATTEMPTS:
                self.record(dict(base, e="gaveup", t0=time.time(), t1=time.time()))
                self.driver.queue.done()
            else:
                self.driver.queue.redeliver((d, attempt + 1), retry_after,
                                            urgent=mode == "multi")
            return
        self.driver.queue.done()

    def claim(self, base, lease, wait, resume=False):
        """resume: also read the recovery point and state (multi-step keys)."""
        self.begin()
        row, ev = self.call(dict(base, e="claim"),
                            "SELECT outcome, token, response::text,"
                            " extract(epoch FROM expires_at)::float8"
                            + (", recovery_point, state::text,"
                               " pg_current_xact_id_if_assigned()::text" if resume else "") +
                            " FROM idem_claim(%s, %s, %s, lease => %s::interval,"
                            " ttl => %s::interval, wait => %s::interval)",
                            (base["tn"], base["k"], base["fp"], lease,
                             self.args.ttl, wait))
        if row is not None:
            ev.update(out=row[0], tok=row[1], sha=sha(row[2]), exp=row[3])
            if resume:
                ev.update(rp=row[4], st=None if row[5] is None else json.loads(row[5]),
                          xid=xid32(row[6]))
        self.record(ev)
        return row

    def retry_delay(self, expires_at, rng):
        """A broker's redelivery backoff: about when the lease ends."""
        lease_s = self.args.lease_ms / 1000.0
        if expires_at is None:
            return rng.uniform(0.01, lease_s / 2)
        return min(max(expires_at - time.time(), 0.01) + rng.uniform(0, lease_s / 2),
                   3 * lease_s)

    def response(self, base, token, rng, failure=False):
        doc = {"ok": not failure, "tenant": base["tn"], "key": base["k"],
               "delivery": base["d"], "token": token,
               "hash": hashlib.sha256(("%s|%s|%d|%d" % (base["tn"], base["k"], base["d"],
                                                       token)).encode()).hexdigest()}
        if failure:
            doc["error"] = "declined"
        elif rng.random() < 0.05:
            # large enough to be compressed and moved out of line (TOAST)
            doc["receipt"] = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789")
                                     for _ in range(6000))
        else:
            doc["receipt"] = "r" * rng.randrange(0, 200)
        return jsonb_text(doc)

    def settle(self, base, kind, token, doc=None):
        """complete / release / fail, in the current transaction."""
        if kind == "complete":
            sql, params = "SELECT idem_complete(%s, %s, %s, %s::jsonb)", (
                base["tn"], base["k"], token, doc)
        elif kind == "fail":
            sql, params = "SELECT idem_release(%s, %s, %s, %s::jsonb)", (
                base["tn"], base["k"], token, doc)
        else:
            sql, params = "SELECT idem_release(%s, %s, %s)", (base["tn"], base["k"], token)
        _, ev = self.call(dict(base, e=kind, tok=token, sha=sha(doc)), sql, params)
        self.record(ev)
        return ev["ok"]

    def forced_sweep(self, base, why):
        """idem_sweep() in a transaction of its own, on behalf of a multi-step
        key (before a claim, between phases, after a fault): the sweeper gets
        every chance to remove a checkpointed record whose lease is over."""
        if why == "fault":
            self.driver.faulted.add((base["tn"], base["k"]))
        ev = dict(base, e="sweep", why=why, s=self.sid, t0=time.time())
        try:
            cur = self.conn.cursor()
            cur.execute(SWEEP_SQL)
            ev["n"] = list(cur.fetchone())
            self.conn.commit()
            ev["t1"] = time.time()
            ev["ok"] = True
            self.calls["sweep"] = self.calls.get("sweep", 0) + 1
        except psycopg2.Error as exc:
            ev["t1"] = time.time()
            ev["ok"] = False
            lost = is_connection_error(exc, self.conn)
            ev["err"] = "conn" if lost else exc.pgcode
            ev["msg"] = "%s: %s" % (type(exc).__name__, str(exc).strip()[:200])
            self.record(ev)
            if lost:
                raise ConnectionLost() from exc
            self.conn.rollback()
            return
        self.record(ev)

    def deliver_in_transaction(self, base, rng):
        wait = CLAIM_WAIT if rng.random() < self.args.wait_share else None
        row = self.claim(base, TX_LEASE, wait)
        if row is None:
            self.end("rollback")
            return "error", 0
        outcome, token, _, expires_at = row
        if outcome != "claimed":
            self.end("commit")
            return outcome, self.retry_delay(expires_at, rng)
        doc = self.response(base, token, rng)
        _, ev = self.call(dict(base, e="pay", tok=token, sha=sha(doc)),
                          "INSERT INTO soak.payments (tenant_id, key, delivery, token,"
                          " amount, response_sha) VALUES (%s, %s, %s, %s, %s, %s)",
                          (base["tn"], base["k"], base["d"], token,
                           rng.randrange(1, 100000), sha(doc)))
        self.record(ev)
        rollback = rng.random() < self.args.rollback
        if not (rollback and rng.random() < 0.5):
            if not self.settle(base, "complete", token, doc):
                rollback = True    # never happens; the checker reports the error
        self.end("rollback" if rollback else "commit")
        return "claimed", 0

    def deliver_two_phase(self, base, rng, orphan):
        lease_s = self.args.lease_ms / 1000.0
        lease = "%d milliseconds" % self.args.lease_ms
        row = self.claim(base, lease, None)
        if row is None:
            self.end("rollback")
            return "error", 0
        outcome, token, _, expires_at = row
        if not self.end("commit"):
            return "error", 0
        if outcome != "claimed":
            return outcome, self.retry_delay(expires_at, rng)

        if orphan or rng.random() < self.args.abandon:
            # the holder dies: nobody settles; a takeover or the sweeper must free the key
            self.record(dict(base, e="abandon", tok=token, s=self.sid,
                             t0=time.time(), t1=time.time()))
            return "claimed", 0

        # the work, outside any claim transaction (an HTTP call, a message...)
        self.begin()
        _, ev = self.call(dict(base, e="effect", tok=token),
                          "INSERT INTO soak.effects (tenant_id, key, delivery, token)"
                          " VALUES (%s, %s, %s, %s)",
                          (base["tn"], base["k"], base["d"], token))
        self.record(ev)
        self.end("commit")

        if rng.random() < self.args.stall:
            # a GC pause, a slow downstream: the lease runs out meanwhile
            time.sleep(lease_s * rng.uniform(2.0, 3.0))
        if rng.random() < self.args.heartbeat:
            self.begin()
            row, ev = self.call(dict(base, e="heartbeat", tok=token),
                                "SELECT extract(epoch FROM idem_heartbeat(%s, %s, %s,"
                                " %s::interval))::float8",
                                (base["tn"], base["k"], token, lease))
            if row is not None:
                ev["exp"] = row[0]
            self.record(ev)
            if not ev["ok"]:
                self.end("rollback")
                return "claimed", 0          # fenced: stop working on the key
            self.end("commit")

        self.begin()
        r = rng.random()
        if r < self.args.rollback * 0.8:
            ok = self.settle(base, "release", token)
        elif r < self.args.rollback:
            ok = self.settle(base, "fail", token, self.response(base, token, rng, failure=True))
        else:
            ok = self.settle(base, "complete", token, self.response(base, token, rng))
        self.end("commit" if ok else "rollback")
        return "claimed", 0


    def deliver_multi_step(self, base, rng):
        """Claim with a lease, then phases 1-3, each one transaction: its row
        in soak.steps and its checkpoint (the last one: idem_complete).  A
        fault between phases ends the holder; the key is redelivered."""
        lease_s = self.args.lease_ms / 1000.0
        if base["a"] > 0 or (base["tn"], base["k"]) in self.driver.faulted:
            # a redelivery, or a delivery of a key whose holder failed: it
            # comes after the last holder's lease, so this sweep finds a
            # checkpointed record with the lease over
            self.forced_sweep(base, "claim")
        row = self.claim(base, "%d milliseconds" % self.args.lease_ms, None, resume=True)
        if row is None:
            self.end("rollback")
            return "error", 0
        outcome, token, _, expires_at, point, _, _ = row
        if not self.end("commit"):
            return "error", 0
        if outcome == "in_progress" and expires_at is not None:
            # a broker's visibility timeout: redelivered when the lease ends
            return outcome, max(expires_at - time.time(), 0.005) + rng.uniform(0, 0.02)
        if outcome != "claimed":
            return outcome, self.retry_delay(expires_at, rng)

        def lease_left():
            return max(expires_at - time.time(), 0.005) + rng.uniform(0, 0.02)

        done = MULTI_POINTS.index(point) + 1 if point else 0
        handed_on = False
        for phase in range(done + 1, 4):
            fault = (rng.choice(MULTI_FAULTS) if rng.random() < self.args.multi_fault
                     and not handed_on else None)
            if fault == "die":
                self.record(dict(base, e="abandon", tok=token, s=self.sid, ph=phase,
                                 how="die", t0=time.time(), t1=time.time()))
                self.forced_sweep(base, "fault")
                return "redeliver", lease_left()
            if fault == "release":
                # gives up without a failure: the next holder resumes at once
                self.begin()
                row, ev = self.call(dict(base, e="release", tok=token, sha=None),
                                    "SELECT idem_release(%s, %s, %s),"
                                    " pg_current_xact_id_if_assigned()::text",
                                    (base["tn"], base["k"], token))
                if row is not None:
                    ev["xid"] = xid32(row[1])
                self.record(ev)
                ok = ev["ok"]
                self.end("commit" if ok else "rollback")
                if ok:
                    # the released record's lease is over at once: sweep it now
                    self.forced_sweep(base, "fault")
                return ("redeliver", 0.005) if ok else ("claimed", 0)
            if fault == "stall":
                # a GC pause past the lease: the broker hands the message to
                # the next consumer when the lease ends, and this holder, a
                # zombie, goes on; its next checkpoint must be refused
                self.driver.queue.redeliver((base["d"], base["a"] + 1), lease_left(),
                                            urgent=True)
                handed_on = self.handed_on = True
                self.record(dict(base, e="abandon", tok=token, s=self.sid, ph=phase,
                                 how="stall", t0=time.time(), t1=time.time()))
                self.forced_sweep(base, "fault")
                time.sleep(lease_s * rng.uniform(2.0, 3.0))
            self.begin()
            _, ev = self.call(dict(base, e="step", tok=token, ph=phase),
                              "INSERT INTO soak.steps (tenant_id, key, phase, delivery, token)"
                              " VALUES (%s, %s, %s, %s, %s)",
                              (base["tn"], base["k"], phase, base["d"], token))
            self.record(ev)
            if phase < 3:
                state = jsonb_text({"d": base["d"], "tok": token, "phase": phase})
                row, ev = self.call(dict(base, e="checkpoint", tok=token,
                                         pt=MULTI_POINTS[phase - 1], sha=sha(state)),
                                    "SELECT idem_checkpoint(%s, %s, %s, %s, %s::jsonb),"
                                    " pg_current_xact_id_if_assigned()::text",
                                    (base["tn"], base["k"], token, MULTI_POINTS[phase - 1],
                                     state))
                if row is not None:
                    ev["xid"] = xid32(row[1])
                self.record(ev)
                ok = ev["ok"]
            else:
                ok = self.settle(base, "complete", token, self.response(base, token, rng))
            if not ok:                       # fenced: our lease was taken over
                self.end("rollback")
                return ("handed_on" if handed_on else "claimed"), 0
            if fault == "rollback":
                # the phase fails and the holder dies: nothing of the phase stays
                self.end("rollback")
                self.record(dict(base, e="abandon", tok=token, s=self.sid, ph=phase,
                                 how="rollback", t0=time.time(), t1=time.time()))
                self.forced_sweep(base, "fault")
                return "redeliver", lease_left()
            if not self.end("commit"):
                return ("handed_on" if handed_on else "claimed"), 0
            if phase < 3:
                self.forced_sweep(base, "phase")     # between this phase and the next
        return ("handed_on" if handed_on else "claimed"), 0


class Driver:
    def __init__(self, args):
        self.args = args
        self.plan = Plan(args)
        self.queue = DeliveryQueue(self.plan.order)
        self.faulted = set()    # multi-step keys a holder failed on: their claims sweep first
        path = args.history
        if path is None:
            fd, path = tempfile.mkstemp(prefix="idem-soak-", suffix=".jsonl")
            os.close(fd)
        self.history = history.HistoryWriter(path, flush_each=args.crash_tolerant)

    def prepare(self):
        conn = connect(self.args)
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute("SELECT NOT EXISTS (SELECT FROM pg_catalog.pg_proc"
                    " WHERE proname = 'idem_claim')")
        if cur.fetchone()[0]:
            cur.execute("CREATE EXTENSION idempotency")
        # the checker models stale claims being released (deleted), the default
        cur.execute("SELECT current_setting('idempotency.stale_action', true)")
        if cur.fetchone()[0] not in (None, "release"):
            raise SystemExit("the soak needs idempotency.stale_action = release")
        # the retention of every claim (--ttl), in seconds, for the checker:
        # a checkpointed record may be deleted only after it
        cur.execute("SELECT extract(epoch FROM %s::interval)::float8", (self.args.ttl,))
        self.ttl_s = cur.fetchone()[0]
        cur.execute("CREATE SCHEMA IF NOT EXISTS soak")
        # no unique constraint on purpose: a double execution must show, not fail
        cur.execute("CREATE TABLE IF NOT EXISTS soak.payments (id bigserial PRIMARY KEY,"
                    " tenant_id text NOT NULL, key text NOT NULL, delivery int NOT NULL,"
                    " token bigint NOT NULL, amount int NOT NULL, response_sha text NOT NULL,"
                    " at timestamptz NOT NULL DEFAULT clock_timestamp())")
        cur.execute("CREATE TABLE IF NOT EXISTS soak.effects (id bigserial PRIMARY KEY,"
                    " tenant_id text NOT NULL, key text NOT NULL, delivery int NOT NULL,"
                    " token bigint NOT NULL,"
                    " at timestamptz NOT NULL DEFAULT clock_timestamp())")
        cur.execute("CREATE TABLE IF NOT EXISTS soak.steps (id bigserial PRIMARY KEY,"
                    " tenant_id text NOT NULL, key text NOT NULL, phase int NOT NULL,"
                    " delivery int NOT NULL, token bigint NOT NULL,"
                    " at timestamptz NOT NULL DEFAULT clock_timestamp())")
        cur.execute("TRUNCATE soak.payments, soak.effects, soak.steps")
        cur.execute("DELETE FROM idempotency_records WHERE tenant_id = ANY(%s)",
                    (self.plan.tenants,))
        self.multi = any(m == "multi" for _, _, m in self.plan.keys)
        if self.multi:
            why = self.watch_deletions(cur)
            if why:
                print("multi-step keys left out: %s" % why)
                self.args.multi_share = 0.0
                self.plan = Plan(self.args)
                self.queue = DeliveryQueue(self.plan.order)
                self.multi = False
        conn.close()

    def watch_deletions(self, cur):
        """A logical slot that sees every DELETE on the records table, so the
        checker knows when the sweeper removed a multi-step key's record (its
        checkpoint is then forgotten, as documented).  Returns why not, or
        None."""
        cur.execute("SELECT current_setting('wal_level'),"
                    " to_regprocedure('idem_checkpoint(text, text, bigint, text, jsonb,"
                    " interval)') IS NOT NULL"                                  # 1.2
                    " OR to_regprocedure('idem_checkpoint(text, text, bigint, text, jsonb)')"
                    " IS NOT NULL")                                             # 1.1
        wal_level, api = cur.fetchone()
        if not api:
            return "the extension has no idem_checkpoint"
        if wal_level != "logical":
            return "wal_level is %s, not logical (sweeper deletions unobservable)" % wal_level
        try:
            self.drop_deletion_watch(cur)
            cur.execute("CREATE PUBLICATION %s FOR TABLE idempotency_records"
                        " WITH (publish = 'delete')" % DELETIONS)
            cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')",
                        (DELETIONS,))
        except psycopg2.Error as exc:
            return "no logical slot: %s" % str(exc).strip()
        return None

    @staticmethod
    def drop_deletion_watch(cur):
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                    " WHERE slot_name = %s", (DELETIONS,))
        cur.execute("DROP PUBLICATION IF EXISTS %s" % DELETIONS)

    def record_deletions(self):
        """Every record deleted during the run, as 'deleted' events (server
        commit time in t0 and t1) appended to the history."""
        conn = connect(self.args)
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute("SELECT data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL,"
                    " 'proto_version', '1', 'publication_names', %s)", (DELETIONS, DELETIONS))
        rows = read_pgoutput_deletions(bytes(r[0]) for r in cur)
        self.drop_deletion_watch(cur)
        conn.close()
        tenants = set(self.plan.tenants)
        events = [{"e": "deleted", "tn": r["tenant_id"], "k": r["key"], "t0": r["t"],
                   "t1": r["t"], "xid": r["xid"]} for r in rows if r.get("tenant_id") in tenants]
        with open(self.history.path, "a", encoding="utf-8") as f:
            for ev in events:
                self.history.events.append(ev)
                f.write(json.dumps(ev, separators=(",", ":")) + "\n")
        return len(events)


    def run(self):
        a = self.args
        self.history.add({"e": "run", "t0": time.time(), "sessions": a.sessions,
                          "keys": a.keys, "deliveries": a.deliveries,
                          "lease_ms": a.lease_ms, "seed": a.seed,
                          "tenants": self.plan.tenants, "crash_tolerant": a.crash_tolerant,
                          "multi": self.multi, "ttl_s": self.ttl_s})
        sessions = [Session(i, self) for i in range(a.sessions)]
        started = time.time()
        for s in sessions:
            s.start()
        for s in sessions:
            s.join()
        elapsed = time.time() - started
        self.history.close()
        self.calls = {}
        for s in sessions:
            for kind, n in s.calls.items():
                self.calls[kind] = self.calls.get(kind, 0) + n
        errors = [s.error for s in sessions if s.error is not None]
        return elapsed, errors


PG_EPOCH = 946684800        # 2000-01-01 in Unix time: pgoutput's timestamps count from it


def read_pgoutput_deletions(messages):
    """The deleted rows' key columns, with their transaction's commit time,
    from pgoutput protocol 1 messages (Relation, Begin, Delete, Commit)."""
    relations, pending, out, xid = {}, [], [], None
    for m in messages:
        kind = m[:1]
        if kind == b"R":
            relid = struct.unpack(">I", m[1:5])[0]
            pos = m.index(b"\0", 5) + 1           # namespace
            pos = m.index(b"\0", pos) + 1         # relation name
            pos += 1                               # replica identity
            ncols = struct.unpack(">h", m[pos:pos + 2])[0]
            pos += 2
            names = []
            for _ in range(ncols):
                end = m.index(b"\0", pos + 1)
                names.append(m[pos + 1:end].decode())
                pos = end + 1 + 8                  # type oid, type modifier
            relations[relid] = names
        elif kind == b"B":
            pending = []
            xid = struct.unpack(">I", m[17:21])[0]
        elif kind == b"D":
            relid = struct.unpack(">I", m[1:5])[0]
            pos = 6                                # after 'K' (key) or 'O' (old row)
            ncols = struct.unpack(">h", m[pos:pos + 2])[0]
            pos += 2
            row = {"xid": xid}
            for name in relations[relid][:ncols]:
                tag = m[pos:pos + 1]
                pos += 1
                if tag == b"t":
                    n = struct.unpack(">i", m[pos:pos + 4])[0]
                    row[name] = m[pos + 4:pos + 4 + n].decode()
                    pos += 4 + n
            pending.append(row)
        elif kind == b"C":
            ts = struct.unpack(">q", m[18:26])[0] / 1e6 + PG_EPOCH
            for row in pending:
                row["t"] = ts
            out.extend(pending)
            pending = []
    return out

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--host", default=os.environ.get("PGHOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("PGPORT", "5432")))
    p.add_argument("--dbname", default=os.environ.get("PGDATABASE", "postgres"))
    p.add_argument("--user", default=os.environ.get("PGUSER"))
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--keys", type=int, default=10000)
    p.add_argument("--deliveries", type=int, default=5)
    p.add_argument("--tenants", type=int, default=4)
    p.add_argument("--lease-ms", type=int, default=400,
                   help="lease of two-phase claims (stalls last 2-3 leases)")
    p.add_argument("--ttl", default="1 hour",
                   help="retention of completed records, and of checkpointed ones after"
                   " their lease (the checker allows no deletion of a checkpointed record"
                   " before it)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--history", help="history file (default: a new temp file)")
    p.add_argument("--tx-share", type=float, default=0.6,
                   help="share of keys worked in the claim's transaction")
    p.add_argument("--multi-share", type=float, default=0.15,
                   help="share of keys worked in three checkpointed phases (needs"
                   " wal_level = logical, else left out)")
    p.add_argument("--multi-fault", type=float, default=0.15,
                   help="chance of a fault before each phase of a multi-step key (die,"
                   " roll back and die, release, stall past the lease)")
    p.add_argument("--rollback", type=float, default=0.10)
    p.add_argument("--mismatch", type=float, default=0.05)
    p.add_argument("--burst", type=float, default=0.3,
                   help="share of keys with concurrent duplicate deliveries")
    p.add_argument("--wait-share", type=float, default=0.3,
                   help="share of in-transaction claims that pass wait")
    p.add_argument("--stall", type=float, default=0.08)
    p.add_argument("--abandon", type=float, default=0.01)
    p.add_argument("--heartbeat", type=float, default=0.25)
    p.add_argument("--orphans", type=int, default=20,
                   help="extra keys delivered once to a holder that dies")
    p.add_argument("--sweeper", choices=("auto", "worker", "call"), default="auto",
                   help="I7 at the end: wait for the sweeper worker, or call idem_sweep()")
    p.add_argument("--crash-tolerant", action="store_true",
                   help="reconnect when the server dies; redeliver interrupted deliveries")
    p.add_argument("--reconnect-timeout", type=float, default=120.0)
    p.add_argument("--check-only", metavar="FILE",
                   help="check a saved history against the database, run nothing")
    p.add_argument("--verify-acked", metavar="FILE",
                   help="only check that every acknowledged completion in FILE is stored")
    return p.parse_args(argv)


def print_figures(args, events, elapsed, calls):
    idem = ("claim", "complete", "release", "fail", "heartbeat", "checkpoint", "sweep")
    n = sum(v for k, v in calls.items() if k in idem)
    claims = [e for e in events if e["e"] == "claim" and e.get("ok")]
    outcomes = {}
    for e in claims:
        outcomes[e["out"]] = outcomes.get(e["out"], 0) + 1
    print("soak: %d sessions x %d keys x %d deliveries, lease %d ms, seed %d"
          % (args.sessions, args.keys, args.deliveries, args.lease_ms, args.seed))
    print("calls: %d idem_* calls (%s) in %.1f s = %.0f calls/s; business statements %d"
          % (n, ", ".join("%s %d" % kv for kv in sorted(calls.items()) if kv[0] in idem),
             elapsed, n / elapsed if elapsed else 0,
             sum(v for k, v in calls.items() if k not in idem)))
    print("claim outcomes: %s" % ", ".join("%s %d" % kv for kv in sorted(outcomes.items())))


def main(argv):
    args = parse_args(argv)
    if args.verify_acked:
        events = history.load(args.verify_acked)
        conn = connect(args)
        checked, lost = checker.verify_acknowledged(conn, events)
        conn.close()
        print("acknowledged completions checked: %d, lost: %d" % (checked, len(lost)))
        for v in lost[:10]:
            print("  LOST: %s" % v)
        return 1 if lost else 0

    if args.check_only:
        events = history.load(args.check_only)
        header = events[0]
        args.crash_tolerant = header.get("crash_tolerant", False)
        elapsed = None
    else:
        driver = Driver(args)
        driver.prepare()
        elapsed, errors = driver.run()
        if driver.multi:
            driver.record_deletions()
        events = driver.history.events
        print_figures(args, events, elapsed, driver.calls)
        print("history: %s" % driver.history.path)
        if errors:
            print("soak aborted: %s" % errors[0])
            print("violations: 1")
            return 1

    conn = connect(args)
    conn.autocommit = True
    report = checker.check(conn, events, sweeper=args.sweeper,
                           crashes_expected=args.crash_tolerant)
    conn.close()
    report.print_report(elapsed)
    return 0 if report.violations == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
