"""Clients that deliver keys at least once and record every call and answer.

A delivery of a key is: claim it; on "claimed", write the business row
(ledger) and complete the claim with a response in the same transaction,
then COMMIT; on "replay", the stored response is the answer; on
"in_progress", try again a moment later.  A delivery ends only with an
acknowledged COMMIT or a replay: any error, a dropped connection or a COMMIT
without an answer (an unknown outcome) makes the client reconnect and
deliver the key again, which is what every broker and HTTP client does.

Every call goes to the history (a list of dicts, written as JSON lines):
  claim   k, c, t0, t1, ep, out (claimed|replay|in_progress|error), tok, resp, err
  commit  k, c, t0, t1, ep, tok, resp, res (ok|unknown)
ep is the port of the server that answered (the epoch, across a failover);
t0/t1 bound, on the host clock, when the server executed the call.
"""
import json
import queue
import random
import threading
import time

import psycopg2
import psycopg2.extras

TENANT = "fo"

SETUP_SQL = """
CREATE EXTENSION IF NOT EXISTS idempotency;
CREATE TABLE ledger (id bigserial PRIMARY KEY, key text NOT NULL, token bigint NOT NULL,
                     client text NOT NULL);
"""

# A deferred constraint trigger runs inside COMMIT, before the commit record:
# it holds the COMMIT open for a few milliseconds, the window in which
# pg_terminate_backend catches a session whose COMMIT is in flight.
COMMIT_WINDOW_SQL = """
CREATE FUNCTION commit_window() RETURNS trigger LANGUAGE plpgsql AS
$$BEGIN PERFORM pg_sleep(0.004); RETURN NULL; END$$;
CREATE CONSTRAINT TRIGGER ledger_commit_window AFTER INSERT ON ledger
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION commit_window();
"""


class Client(threading.Thread):
    def __init__(self, name, dsn, work, history, stats, deadline):
        super().__init__(daemon=True)
        self.name_ = name
        self.dsn = dsn
        self.work = work              # queue of keys, None ends
        self.history = history
        self.stats = stats
        self.deadline = deadline
        self.conn = None
        self.port = None
        self.error = None

    def record(self, event):
        event["c"] = self.name_
        self.history.append(event)    # list.append is atomic under the GIL

    def bump(self, what):
        with self.stats["lock"]:
            self.stats[what] = self.stats.get(what, 0) + 1

    def drop(self):
        if self.conn is not None:
            try:
                self.conn.close()
            except psycopg2.Error:
                pass
        self.conn = None

    def connect(self):
        while self.conn is None:
            if time.time() > self.deadline:
                raise TimeoutError("no server accepted a connection before the deadline")
            try:
                self.conn = psycopg2.connect(self.dsn)
                self.port = self.conn.info.port
                self.bump("connections")
            except psycopg2.Error:
                self.bump("connect_failures")
                time.sleep(0.05)

    def deliver(self, key):
        attempts = 0
        while True:
            attempts += 1
            if attempts > 1:
                self.bump("retries")
            if time.time() > self.deadline:
                raise TimeoutError("key %s did not settle before the deadline" % key)
            self.connect()
            cur = self.conn.cursor()
            t0 = time.time()
            try:
                cur.execute("SELECT outcome, token, response FROM idem_claim(%s, %s, %s,"
                            " lease => '60 s', wait => '2 s')", (TENANT, key, "fp-" + key))
                outcome, token, response = cur.fetchone()
            except psycopg2.Error as e:
                self.record({"ev": "claim", "k": key, "t0": t0, "t1": time.time(), "ep": self.port,
                             "out": "error", "err": e.pgcode or type(e).__name__})
                self.drop()
                time.sleep(0.02)
                continue
            self.record({"ev": "claim", "k": key, "t0": t0, "t1": time.time(), "ep": self.port,
                         "out": outcome, "tok": token, "resp": response})
            if outcome == "replay":
                try:
                    self.conn.rollback()
                except psycopg2.Error:
                    self.drop()
                self.bump("replays")
                return
            if outcome != "claimed":
                try:
                    self.conn.rollback()
                except psycopg2.Error:
                    self.drop()
                time.sleep(0.02)
                continue
            answer = {"key": key, "token": token, "by": self.name_}
            try:
                cur.execute("INSERT INTO ledger (key, token, client) VALUES (%s, %s, %s)",
                            (key, token, self.name_))
                cur.execute("SELECT idem_complete(%s, %s, %s, %s)",
                            (TENANT, key, token, json.dumps(answer)))
            except psycopg2.Error:
                # the transaction is lost either way: nothing of it commits
                self.drop()
                continue
            t0 = time.time()
            try:
                self.conn.commit()
            except psycopg2.Error:
                self.record({"ev": "commit", "k": key, "t0": t0, "t1": time.time(), "ep": self.port,
                             "tok": token, "resp": answer, "res": "unknown"})
                self.bump("unknown_commits")
                self.drop()
                continue
            self.record({"ev": "commit", "k": key, "t0": t0, "t1": time.time(), "ep": self.port,
                         "tok": token, "resp": answer, "res": "ok"})
            self.bump("acknowledged")
            return

    def run(self):
        try:
            while True:
                key = self.work.get()
                if key is None:
                    break
                self.deliver(key)
                self.bump("deliveries")
        except Exception as e:   # reported by the driver, which fails the run
            self.error = "%s: %s" % (type(e).__name__, e)
        self.drop()


def delivery_order(keys, deliveries, seed):
    """Every key deliveries times, duplicates a few places apart so that
    concurrent clients often hold deliveries of one key at once."""
    rng = random.Random(seed)
    order = []
    for i in range(0, len(keys), 8):
        block = [k for k in keys[i:i + 8] for _ in range(deliveries)]
        rng.shuffle(block)
        order.extend(block)
    return order


def run_clients(dsn, keys, deliveries, clients, seed, deadline, history, stats, on_progress=None):
    """Deliver keys with `clients` threads; on_progress(done) is called by
    the caller's thread about every 50 ms until all are done.  Returns the
    clients' errors."""
    work = queue.Queue()
    order = delivery_order(keys, deliveries, seed)
    for key in order:
        work.put(key)
    threads = [Client("client-%d" % i, dsn, work, history, stats, deadline) for i in range(clients)]
    for _ in threads:
        work.put(None)
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        if on_progress is not None:
            on_progress(stats.get("deliveries", 0), len(order))
        time.sleep(0.05)
    return [t.error for t in threads if t.error]


def new_stats():
    return {"lock": threading.Lock()}


def final_state(dsn):
    """The business rows and the records of the tenant, as the checker reads them."""
    conn = psycopg2.connect(dsn)
    cur = conn.cursor()
    cur.execute("SELECT key, token, client FROM ledger ORDER BY id")
    ledger = [list(r) for r in cur.fetchall()]
    cur.execute("SELECT key, status, token, response FROM idempotency_records WHERE tenant_id = %s",
                (TENANT,))
    records = {k: [status, token, response] for k, status, token, response in cur.fetchall()}
    conn.close()
    return {"ledger": ledger, "records": records}


def write_history(path, history):
    with open(path, "w") as f:
        for event in history:
            f.write(json.dumps(event, sort_keys=True) + "\n")


def read_history(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
