"""The soak history: one JSON object per line, appended as operations end.

Every call a session makes is one event, written after the server answered
(or after the connection broke), so a history read while the soak still runs
holds every operation acknowledged so far.  The checker works from a list of
these events plus the final tables; nothing else is trusted.

Event fields (short names: a default soak writes about 300,000 of them):
  e    event: run (header), claim, pay (business row, same transaction),
       effect (work outside the transaction), heartbeat, complete, release,
       fail (release with a failure document), end (COMMIT/ROLLBACK),
       abandon (a lease holder that dies), gaveup (a delivery never settled),
       step and checkpoint (multi-step phases), sweep (an idem_sweep() forced
       by a multi-step delivery: why = claim | phase | fault, n = its three
       counts), deleted (a record's DELETE seen by the logical slot)
  d, a delivery id and attempt; s session; x transaction id ("session.n")
  tn, k, m, fp  tenant, key, key mode (tx | lease), fingerprint sent
  t0, t1  client clock (epoch seconds) before the call and after its answer
  out, tok, sha, exp  claim outcome, token, sha256 of the response text
       (claims: as replayed; settles: as sent), lease/expiry end (epoch, server)
  ok, err  call succeeded; SQLSTATE when it failed ("conn" = connection lost)
  how, res (end only)  commit | rollback; ok | unknown (COMMIT sent, no
       answer) | lost (connection died before COMMIT) | error
The header (e = run) carries the run's parameters, among them ttl_s: the
retention of every claim in seconds.
"""
import json
import threading


class HistoryWriter:
    """Thread-safe append-only writer.  flush_each: flush after every event,
    so that another process (the crash test) can read acknowledged events
    while the soak runs."""

    def __init__(self, path, flush_each=False):
        self.path = path
        self.file = open(path, "w", encoding="utf-8")
        self.flush_each = flush_each
        self.lock = threading.Lock()
        self.events = []

    def add(self, event):
        line = json.dumps(event, separators=(",", ":"))
        with self.lock:
            self.events.append(event)
            self.file.write(line + "\n")
            if self.flush_each:
                self.file.flush()

    def close(self):
        with self.lock:
            self.file.close()


def load(path):
    """Read a history file.  A torn last line (the writer is still running)
    is skipped; a torn line anywhere else is an error."""
    events = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        if not line:
            continue
        try:
            events.append(json.loads(line))
        except ValueError:
            if i >= len(lines) - 2:
                break
            raise
    return events
