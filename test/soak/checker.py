"""Checks the invariants I1-I7 of the idempotency extension, and I9 for
multi-step work (recovery points: no restart, and no deletion of a
checkpointed record, while its retention lasts), from a soak history
(history.py) and the final tables.

The history gives, for every call, the client-clock interval [t0, t1] in
which the server executed it; server timestamps (lease ends) come from the
same host clock.  A claim holder "certainly holds" the key from the moment
its claim returned until it sent its COMMIT/ROLLBACK (in-transaction work),
or until its lease (or last heartbeat) ran out or it began to settle
(two-phase work).  Two such spans of different holders of one key must never
overlap: that is the single-winner and the single-valid-lease property.
Transactions whose COMMIT got no answer (a crash) are "unknown": the checker
never assumes they committed or that they did not.
"""
import hashlib
import time
from collections import defaultdict

SETTLES = ("complete", "release", "fail", "heartbeat", "checkpoint")
POINT_PHASE = {None: 0, "p1": 1, "p2": 2}   # multi-step recovery point -> phases done
FENCING_SQLSTATES = ("ID001", "ID002")   # no record / token no longer holds the key


def fencing(op):
    """Is op's error a fencing refusal?  (A stale token gets ID002 even on a
    key completed meanwhile: the token check comes first.)"""
    return op.get("err") in FENCING_SQLSTATES
GRACE_S = 2.0                           # scheduling slack on top of lease + sweep interval


def sha(text):
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


class Check:
    def __init__(self, name, title):
        self.name = name
        self.title = title
        self.checked = 0
        self.violations = []
        self.notes = []

    def fail(self, what):
        self.violations.append(what)

    def line(self):
        status = "PASS" if not self.violations else "FAIL (%d violations)" % len(self.violations)
        return "CHECK %s %s: %s; %s" % (self.name, self.title, status, "; ".join(self.notes))


class Txn:
    def __init__(self, x):
        self.x = x
        self.ops = []
        self.end = None

    @property
    def status(self):
        if self.end is None:
            return "lost"
        res = self.end["res"]
        if res == "ok":
            return "committed" if self.end["how"] == "commit" else "rolledback"
        return {"unknown": "unknown", "lost": "lost"}.get(res, "failed")

    @property
    def t0(self):
        return min(op["t0"] for op in self.ops) if self.ops else self.end["t0"]

    @property
    def t1(self):
        return self.end["t1"] if self.end else max(op["t1"] for op in self.ops)

    def maybe_committed(self):
        return self.status in ("committed", "unknown")


class Holder:
    """A claim that returned 'claimed', with what its delivery did after."""

    def __init__(self, claim, txn):
        self.claim = claim
        self.txn = txn
        self.key = (claim["tn"], claim["k"])
        self.tok = claim["tok"]
        self.fp = claim["fp"]
        self.mode = claim["m"]
        self.heartbeats = []
        self.settles = []
        self.checkpoints = []

    def spans(self, txns):
        """Client-clock spans in which this holder certainly held the key."""
        c = self.claim
        if self.mode == "tx" or self.txn.status != "committed":
            return [(c["t1"], self.txn.end["t0"] if self.txn.end else self.txn.t1)]
        spans = [(c["t1"], max(c["exp"], self.txn.end["t0"]))]
        for hb in self.heartbeats:
            if hb.get("ok") and txns[hb["x"]].status == "committed":
                spans.append((hb["t1"], hb["exp"]))
        if self.settles:
            cut = self.settles[0]["t0"]
            spans = [(a, min(b, cut)) for a, b in spans if a < cut]
        return spans

    def valid_until(self, txns):
        until = self.claim["exp"]
        for hb in self.heartbeats:
            if hb.get("ok") and txns[hb["x"]].status == "committed":
                until = max(until, hb["exp"])
        return until


class Report:
    def __init__(self, checks, figures):
        self.checks = checks
        self.figures = figures
        self.violations = sum(len(c.violations) for c in checks)

    def print_report(self, elapsed):
        for line in self.figures:
            print(line)
        for c in self.checks:
            print(c.line())
            for v in c.violations[:5]:
                print("    %s" % v)
        print("violations: %d" % self.violations)


def load_final(conn, tenants):
    cur = conn.cursor()
    cur.execute("SELECT tenant_id, key, status, token, response::text, fingerprint,"
                " extract(epoch FROM lease_expires_at)::float8"
                " FROM idempotency_records WHERE tenant_id = ANY(%s)", (tenants,))
    records = {(r[0], r[1]): {"status": r[2], "tok": r[3], "sha": sha(r[4]), "fp": r[5],
                              "lease_end": r[6]} for r in cur.fetchall()}
    payments = defaultdict(list)
    effects = defaultdict(list)
    steps = defaultdict(list)
    cur.execute("SELECT 1 FROM pg_class WHERE oid = to_regclass('soak.steps')")
    if cur.fetchone():
        cur.execute("SELECT tenant_id, key, phase, delivery, token FROM soak.steps")
        for r in cur.fetchall():
            steps[(r[0], r[1])].append({"ph": r[2], "d": r[3], "tok": r[4]})
    cur.execute("SELECT 1 FROM pg_class WHERE oid = to_regclass('soak.payments')")
    if cur.fetchone():
        cur.execute("SELECT tenant_id, key, delivery, token, response_sha FROM soak.payments")
        for r in cur.fetchall():
            payments[(r[0], r[1])].append({"d": r[2], "tok": r[3], "sha": r[4]})
        cur.execute("SELECT tenant_id, key, delivery, token FROM soak.effects")
        for r in cur.fetchall():
            effects[(r[0], r[1])].append({"d": r[2], "tok": r[3]})
    return records, payments, effects, steps


def acknowledged_settles(events):
    """complete/fail calls that returned and whose COMMIT was acknowledged."""
    ends = {e["x"]: e for e in events if e["e"] == "end"}
    out = []
    for e in events:
        if e["e"] in ("complete", "fail") and e.get("ok"):
            end = ends.get(e["x"])
            if end and end["how"] == "commit" and end["res"] == "ok":
                out.append((e, end))
    return out


def verify_acknowledged(conn, events):
    """I4 alone: every acknowledged completion in the history is stored."""
    tenants = events[0]["tenants"]
    records = load_final(conn, tenants)[0]
    lost = []
    acked = acknowledged_settles(events)
    for e, _ in acked:
        rec = records.get((e["tn"], e["k"]))
        want = "completed" if e["e"] == "complete" else "failed"
        if rec is None or rec["status"] != want or rec["tok"] != e["tok"] or rec["sha"] != e["sha"]:
            lost.append("%s/%s token %s %s acknowledged at %.3f, stored: %s"
                        % (e["tn"], e["k"], e["tok"], e["e"], e["t1"], rec))
    return len(acked), lost


class History:
    """The history indexed for the checks."""

    def __init__(self, events):
        self.header = events[0]
        self.txns = {}
        self.by_attempt = defaultdict(list)
        self.claims = []
        self.holders = defaultdict(list)        # key -> [Holder]
        self.txns_by_key = defaultdict(dict)    # key -> {x: Txn}
        self.mode = {}                          # key -> tx | lease
        self.gaveup = []
        self.abandoned = []
        self.errors = []
        self.deleted = defaultdict(list)        # key -> commit times of its records' DELETEs
        self.sweeps = defaultdict(list)         # key -> idem_sweep() calls forced for it
        for e in events[1:]:
            kind = e["e"]
            if kind == "deleted":
                self.deleted[(e["tn"], e["k"])].append((e["t1"], e.get("xid")))
                continue
            if kind == "sweep":
                self.sweeps[(e["tn"], e["k"])].append(e)
                continue
            if kind == "gaveup":
                self.gaveup.append(e)
                continue
            if kind == "abandon":
                self.abandoned.append(e)
                continue
            txn = self.txns.setdefault(e["x"], Txn(e["x"]))
            if kind == "end":
                txn.end = e
                continue
            txn.ops.append(e)
            self.mode[(e["tn"], e["k"])] = e["m"]
            self.by_attempt[(e["d"], e["a"])].append(e)
            self.txns_by_key[(e["tn"], e["k"])][e["x"]] = txn
            if kind == "claim":
                self.claims.append(e)
        for c in self.claims:
            if c.get("ok") and c["out"] == "claimed":
                h = Holder(c, self.txns[c["x"]])
                for op in self.by_attempt[(c["d"], c["a"])]:
                    if op.get("tok") == c["tok"] and op is not c:
                        if op["e"] == "heartbeat":
                            h.heartbeats.append(op)
                        elif op["e"] == "checkpoint":
                            h.checkpoints.append(op)
                        elif op["e"] in ("complete", "release", "fail"):
                            h.settles.append(op)
                self.holders[h.key].append(h)

    def holder_of(self, key, tok):
        for h in self.holders.get(key, ()):
            if h.tok == tok:
                return h
        return None


def check_single_winner(hist, i1, i2):
    """I1: claimed tokens distinct per key; holders never overlap in time.
    The overlap test also proves I2's 'one valid lease holder at a time'."""
    overlaps = 0
    second = 0
    lease_pairs = 0
    for key, holders in hist.holders.items():
        i1.checked += len(holders)
        seen = {}
        for h in holders:
            if h.txn.status != "committed":
                continue   # a claim that never became durable may share a token
            if h.tok in seen:
                i1.fail("%s/%s: token %d claimed twice (deliveries %d and %d)"
                        % (key + (h.tok, seen[h.tok].claim["d"], h.claim["d"])))
            seen[h.tok] = h
        spans = [(a, b, h) for h in holders for a, b in h.spans(hist.txns) if b > a]
        spans.sort(key=lambda s: s[0])
        for i, (a1, b1, h1) in enumerate(spans):
            for a2, b2, h2 in spans[i + 1:]:
                if a2 >= b1:
                    break
                if h2 is h1:
                    continue
                overlaps += 1
                what = ("%s/%s: holders of token %d (delivery %d, %s) and %d (delivery %d)"
                        " both held the key during [%.3f, %.3f]"
                        % (key[0], key[1], h1.tok, h1.claim["d"], h1.mode, h2.tok,
                           h2.claim["d"], a2, min(b1, b2)))
                i1.fail(what)
                if h1.mode == "lease":
                    lease_pairs += 1
                    i2.fail(what)
        # a committed completion is final: no later claim may win the key, and
        # an in-transaction key has exactly one committed winner
        durable = [h for h in holders if h.txn.status == "committed"]
        for h in durable:
            done = [s for s in h.settles if s["e"] in ("complete", "fail") and s.get("ok")
                    and hist.txns[s["x"]].status == "committed"]
            if done:
                for later in durable:
                    if later.tok > h.tok:
                        second += 1
                        i1.fail("%s/%s: token %d won the key after token %d %sd it"
                                % (key + (later.tok, h.tok, done[0]["e"])))
        if durable and durable[0].mode == "tx" and len(durable) > 1:
            second += 1
            i1.fail("%s/%s: %d committed winners (tokens %s)"
                    % (key + (len(durable), [h.tok for h in durable])))
    i1.notes.append("%d claims won, %d overlapping holders, %d winners after a committed one"
                    % (i1.checked, overlaps, second))
    return lease_pairs


def check_no_double_execution(hist, final, i2, lease_pairs, events):
    """I2: in-transaction work committed exactly once per completed key and
    never for other keys; one accepted settle per key; every two-phase
    completion preceded by its holder's work; executions only by winners."""
    records, payments, effects = final[:3]
    accepted = defaultdict(list)
    for e, _ in acknowledged_settles(events):
        accepted[(e["tn"], e["k"])].append(e)
    keys = set(hist.mode)
    n_pay = sum(len(v) for v in payments.values())
    n_eff = sum(len(v) for v in effects.values())
    for key in keys:
        i2.checked += 1
        if len(accepted[key]) > 1:
            i2.fail("%s/%s: %d accepted completions (tokens %s)"
                    % (key + (len(accepted[key]), [e["tok"] for e in accepted[key]])))
        rec = records.get(key)
        if hist.mode[key] == "tx":
            pays = payments.get(key, [])
            if rec is not None and rec["status"] == "completed":
                if len(pays) != 1 or pays[0]["tok"] != rec["tok"] or pays[0]["sha"] != rec["sha"]:
                    i2.fail("%s/%s: completed with token %d but business rows %s"
                            % (key + (rec["tok"], pays)))
            else:
                if pays:
                    i2.fail("%s/%s: not completed (%s) but business rows %s"
                            % (key + (rec and rec["status"], pays)))
                if rec is not None:
                    i2.fail("%s/%s: in-transaction key left %s" % (key + (rec["status"],)))
        elif hist.mode[key] == "lease" and rec is not None and rec["status"] in ("completed",
                                                                                   "failed"):
            if not any(e["tok"] == rec["tok"] for e in effects.get(key, [])):
                i2.fail("%s/%s: %s by token %d whose holder never did the work"
                        % (key + (rec["status"], rec["tok"])))
    winners = {(h.claim["d"], h.tok) for hs in hist.holders.values() for h in hs}
    for rows in list(payments.values()) + list(effects.values()):
        for r in rows:
            if (r["d"], r["tok"]) not in winners:
                i2.fail("business row of delivery %d token %d without a winning claim"
                        % (r["d"], r["tok"]))
    i2.notes.append("%d keys, %d business rows in-transaction, %d two-phase executions,"
                    " %d overlapping valid leases" % (len(keys), n_pay, n_eff, lease_pairs))
    return n_pay, n_eff


def check_fencing(hist, final, i3):
    """I3: a settle whose token was superseded before it started is refused
    (ID001/ID002), refusals have a cause, and refused settles left nothing."""
    records = final[0]
    refused = defaultdict(int)
    for key, holders in hist.holders.items():
        for h in holders:
            for s in h.settles + h.heartbeats + h.checkpoints:
                i3.checked += 1
                newer = [n for n in holders if n.tok > h.tok]
                if s.get("ok"):
                    for n in newer:
                        if n.txn.status == "committed" and n.txn.end["t1"] < s["t0"]:
                            i3.fail("%s/%s: %s with stale token %d accepted after token %d"
                                    " was claimed and committed"
                                    % (key + (s["e"], h.tok, n.tok)))
                            break
                    continue
                if not fencing(s):
                    continue   # reported by the error check
                refused[s["err"]] += 1
                cause = any(n.claim["t0"] < s["t1"] and n.txn.maybe_committed() for n in newer)
                if not cause and s["err"] == "ID001":
                    # the sweeper may delete a claim once its lease ran out
                    # (in server time, before this settle read the row)
                    cause = s["t1"] >= h.valid_until(hist.txns)
                if not cause:
                    i3.fail("%s/%s: %s of token %d refused with %s but no newer claim existed"
                            " and its lease had not run out" % (key + (s["e"], h.tok, s["err"])))
                rec = records.get(key)
                if s.get("sha") and rec is not None and rec["sha"] == s["sha"]:
                    i3.fail("%s/%s: refused %s of token %d was stored anyway"
                            % (key + (s["e"], h.tok)))
    # every stored outcome comes from a settle that was accepted
    accepted = {}
    for hs in hist.holders.values():
        for h in hs:
            for s in h.settles:
                if s.get("ok") and hist.txns[s["x"]].maybe_committed():
                    accepted[(s["tn"], s["k"], s["tok"])] = s
    for key, rec in records.items():
        if rec["status"] == "processing":
            continue
        s = accepted.get(key + (rec["tok"],))
        if s is None or s["sha"] != rec["sha"]:
            i3.fail("%s/%s: stored %s (token %d) matches no accepted settle"
                    % (key + (rec["status"], rec["tok"])))
    i3.notes.append("%d settles and heartbeats, stale ones refused: %s"
                    % (i3.checked, ", ".join("%s %d" % kv for kv in sorted(refused.items()))
                       or "none"))
    return sum(refused.values())


def check_no_lost_completion(hist, final, i4, events):
    records = final[0]
    acked = acknowledged_settles(events)
    lost = 0
    for e, _ in acked:
        i4.checked += 1
        rec = records.get((e["tn"], e["k"]))
        want = "completed" if e["e"] == "complete" else "failed"
        if rec is None or rec["status"] != want or rec["tok"] != e["tok"] or rec["sha"] != e["sha"]:
            lost += 1
            i4.fail("%s/%s: %s of token %d acknowledged at %.3f; stored: %s"
                    % (e["tn"], e["k"], e["e"], e["tok"], e["t1"], rec))
    unknown = sum(1 for t in hist.txns.values() if t.status == "unknown")
    i4.notes.append("%d acknowledged completions checked, %d lost, %d commits of unknown outcome"
                    % (i4.checked, lost, unknown))
    return i4.checked, lost


def check_replays(hist, final, i5, i6, events):
    """I5: every replay is the stored response, byte for byte; after a
    completion is acknowledged every same-fingerprint delivery replays it.
    I6 (second half): after it, every other fingerprint gets mismatch."""
    records = final[0]
    replays = 0
    for c in hist.claims:
        if not c.get("ok") or c["out"] not in ("replay", "failed"):
            continue
        replays += 1
        i5.checked += 1
        rec = records.get((c["tn"], c["k"]))
        want = "completed" if c["out"] == "replay" else "failed"
        if rec is None or rec["status"] != want or rec["sha"] != c["sha"]:
            i5.fail("%s/%s: %s at %.3f returned sha %s, stored %s"
                    % (c["tn"], c["k"], c["out"], c["t0"], (c["sha"] or "")[:12], rec))
    settled = {}
    for e, end in acknowledged_settles(events):
        h = hist.holder_of((e["tn"], e["k"]), e["tok"])
        if h is not None:
            settled[(e["tn"], e["k"])] = (end["t1"], h.fp,
                                          "replay" if e["e"] == "complete" else "failed")
    after = 0
    for c in hist.claims:
        if not c.get("ok"):
            continue
        s = settled.get((c["tn"], c["k"]))
        if s is None or c["t0"] <= s[0]:
            continue
        after += 1
        if c["fp"] == s[1]:
            if c["out"] != s[2]:
                i5.fail("%s/%s: delivery %d after the acknowledged completion got %s"
                        % (c["tn"], c["k"], c["d"], c["out"]))
        else:
            i6.checked += 1
            if c["out"] != "mismatch":
                i6.fail("%s/%s: delivery %d with fingerprint %s after completion by %s got %s"
                        % (c["tn"], c["k"], c["d"], c["fp"], s[1], c["out"]))
    i5.notes.append("%d replays byte-identical to the stored response, %d deliveries after"
                    " an acknowledged completion" % (replays, after))
    return replays


def check_mismatch(hist, i6):
    """I6 (first half): mismatch only against a committed record with another
    fingerprint; a stale claim is never taken over by another fingerprint."""
    mismatches = 0
    for c in hist.claims:
        if not c.get("ok") or c["out"] != "mismatch":
            continue
        mismatches += 1
        i6.checked += 1
        key = (c["tn"], c["k"])
        if not any(h.fp != c["fp"] and h.txn.maybe_committed() and h.txn.end["t0"] < c["t1"]
                   for h in hist.holders.get(key, ())):
            i6.fail("%s/%s: delivery %d got mismatch but no record with another fingerprint"
                    " was committed" % (key + (c["d"],)))
    for key, holders in hist.holders.items():
        by_tok = {h.tok: h for h in holders if h.txn.maybe_committed()}
        for h in holders:
            prev = by_tok.get(h.tok - 1)
            if prev is not None and prev.fp != h.fp:
                i6.fail("%s/%s: token %d (%s) took over token %d of fingerprint %s"
                        % (key + (h.tok, h.fp, prev.tok, prev.fp)))
    i6.notes.append("%d mismatches, none executed" % mismatches)
    return mismatches


def check_liveness_in_run(hist, i7):
    """I7 while running: in_progress only while a lease is live or another
    transaction works on the key; every delivery reaches an outcome."""
    busy = 0
    for c in hist.claims:
        if not c.get("ok") or c["out"] != "in_progress":
            continue
        i7.checked += 1
        if c.get("exp") is not None:
            if c["exp"] <= c["t0"]:
                i7.fail("%s/%s: in_progress at %.3f for a lease that ended at %.3f"
                        % (c["tn"], c["k"], c["t0"], c["exp"]))
            continue
        busy += 1
        others = hist.txns_by_key[(c["tn"], c["k"])]
        if not any(t.x != c["x"] and t.t0 <= c["t1"] and t.t1 >= c["t0"]
                   for t in others.values()):
            i7.fail("%s/%s: in_progress (claim in flight) at [%.3f, %.3f] but no other"
                    " transaction worked on the key" % (c["tn"], c["k"], c["t0"], c["t1"]))
    i7.notes.append("%d in_progress answers justified" % i7.checked)
    for g in hist.gaveup:
        i7.fail("%s/%s: delivery %d still in_progress after %d redeliveries"
                % (g["tn"], g["k"], g["d"], g["a"]))
    return busy


def sweep_interval(conn):
    cur = conn.cursor()
    try:
        # in seconds; the setting itself is kept in its unit (milliseconds)
        cur.execute("SELECT extract(epoch FROM (setting || unit)::interval)::float8"
                    " FROM pg_settings WHERE name = 'idempotency.sweep_interval'")
        row = cur.fetchone()
        return row[0] if row else 0
    except Exception:
        return 0


def worker_running(conn):
    cur = conn.cursor()
    cur.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type ILIKE '%idem%'")
    return cur.fetchone()[0] > 0


def abandoned_keys(hist, records):
    """Keys left to a dead holder: processing at the end, or whose last
    durable holder never settled.  key -> (fingerprint, lease end)."""
    out = {}
    for key, holders in hist.holders.items():
        durable = [h for h in holders if h.txn.status == "committed"]
        if durable:
            last = max(durable, key=lambda h: h.tok)
            if last.mode in ("lease", "multi") and not last.settles:
                out[key] = (last.fp, last.valid_until(hist.txns))
    for key, r in records.items():
        if r["status"] == "processing":
            out[key] = (r["fp"], max(r["lease_end"], out.get(key, (None, 0))[1]))
    return out


def check_liveness_at_end(conn, hist, final, tenants, i7, sweeper):
    """I7 at the end: no processing row outlives its lease plus one sweep
    interval (plus GRACE_S) -- one with a recovery point, its retention
    after the lease --, and every abandoned key can be claimed again."""
    stale = abandoned_keys(hist, final[0])
    interval = sweep_interval(conn)
    use_worker = sweeper == "worker" or (sweeper == "auto" and interval > 0
                                         and worker_running(conn))
    cur = conn.cursor()
    last_lease = max([v[1] for v in stale.values()] + [time.time()])
    # A record with a recovery point is kept after its lease until its
    # retention ends (expires_at), to be resumed: stale only after that.
    if use_worker:
        time.sleep(max(0.0, last_lease + interval + GRACE_S - time.time()))
        how = "the sweeper worker (interval %d s)" % interval
        slack = interval + GRACE_S
    else:
        time.sleep(max(0.0, last_lease + 0.05 - time.time()))
        cur.execute("SELECT * FROM idem_sweep()")
        how = "idem_sweep() (no sweeper worker %s)" % (
            "requested" if sweeper == "call" else "running")
        slack = 0
    cur.execute("SELECT tenant_id, key, extract(epoch FROM now() - lease_expires_at)::float8,"
                " recovery_point IS NOT NULL"
                " FROM idempotency_records WHERE tenant_id = ANY(%s)"
                " AND status = 'processing'"
                " AND lease_expires_at < now() - make_interval(secs => %s)"
                " AND (recovery_point IS NULL OR expires_at < now() - make_interval(secs => %s))",
                (tenants, slack, slack))
    for tn, k, late, point in cur.fetchall():
        i7.fail("%s/%s still processing %.1f s after its lease ended%s (swept by %s)"
                % (tn, k, late, " and its retention" if point else "", how))
    cur.execute("SELECT count(*) FROM idempotency_records WHERE tenant_id = ANY(%s)"
                " AND status = 'processing' AND recovery_point IS NOT NULL"
                " AND lease_expires_at < now()", (tenants,))
    resumable = cur.fetchone()[0]
    reclaimed = 0
    for (tn, k), (fp, _) in sorted(stale.items()):
        cur.execute("SELECT outcome, token FROM idem_claim(%s, %s, %s, lease => '1 second')",
                    (tn, k, fp))
        outcome, token = cur.fetchone()
        if outcome != "claimed":
            i7.fail("%s/%s: abandoned key answered %s instead of claimed" % (tn, k, outcome))
            continue
        reclaimed += 1
        cur.execute("SELECT idem_release(%s, %s, %s)", (tn, k, token))
    i7.notes.append("%d keys left to dead holders freed by %s (%d of them kept with their"
                    " recovery point, to be resumed), %d claimable again"
                    % (len(stale), how, resumable, reclaimed))


def lease_end_of(hist, h):
    """When holder h's claim stopped holding the key: its lease (or last
    heartbeat), or its release without a failure if that came first."""
    end = h.valid_until(hist.txns)
    for st in h.settles:
        if st["e"] == "release" and st.get("ok") and hist.txns[st["x"]].end:
            end = min(end, hist.txns[st["x"]].end["t0"])
    return end


def check_multi_step(hist, final, i9):
    """I9: multi-step keys.  Every phase's row (soak.steps, written in the
    transaction of its checkpoint) exists at most once per key and, for a
    completed key, exactly once; every holder received the recovery point
    and state of the last committed checkpoint and ran only the phases after
    it.  A record with a recovery point outlives its lease and the sweeper
    for its retention (the claim's ttl, header ttl_s) after the lease ended
    or it was released: a deletion of such a record before that (seen
    through the logical slot) is a violation, and so is any holder handed a
    point before the last committed one (a restart).  Only after the
    retention may the record go; the next holder then starts over and its
    phases repeat, which is allowed.  Only a sweep may delete: not a call of
    the key's own holders (their transaction ids are in the history: a
    release that deleted a checkpointed record, say).  Holders are taken in
    token order (tokens increase per key across takeovers, releases and
    deletions); a deletion forgets the rows whose transaction sent COMMIT
    before it committed.  Also counted: the forced sweeps (sweep events)
    that ran while a key had a committed checkpoint, no completion, and its
    last holder's lease was over -- each one a chance for the sweeper to
    delete the record."""
    records, steps = final[0], final[3]
    ttl = hist.header.get("ttl_s")
    if ttl is None:
        ttl = float("inf")      # a history without it: no deletion is allowed
    commit_of = {}      # (key, token, phase) -> the step transaction
    own_xids = defaultdict(set)
    for t in hist.txns.values():
        for op in t.ops:
            if op["e"] == "step":
                commit_of[((op["tn"], op["k"]), op["tok"], op["ph"])] = t
            if op.get("xid") is not None:
                own_xids[(op["tn"], op["k"])].add(op["xid"])
    keys = [k for k, m in hist.mode.items() if m == "multi"]
    once = restarts = after_retention = within_retention = resumed = rows_total = 0
    chances = 0
    by_point = defaultdict(int)
    for key in keys:
        i9.checked += 1
        holders = sorted((h for h in hist.holders.get(key, ()) if h.txn.maybe_committed()),
                         key=lambda h: h.tok)
        toks = {h.tok for h in holders}
        rows = defaultdict(list)
        for r in steps.get(key, []):
            rows_total += 1
            if r["tok"] not in toks:
                i9.fail("%s/%s: phase %d written by token %d, which never won the key"
                        % (key + (r["ph"], r["tok"])))
                continue
            rows[r["tok"]].append(r)
        deletions = sorted(hist.deleted.get(key, ()))
        remembered = {}        # phase -> (token, delivery, COMMIT sent at)
        applied = 0
        prev = None
        for h in holders:
            while applied < len(deletions) and deletions[applied][0] < h.claim["t1"]:
                d, xid = deletions[applied]
                applied += 1
                kept = {p: v for p, v in remembered.items() if v[2] > d}
                if len(kept) == len(remembered) or 3 in remembered:
                    continue    # no checkpoint forgotten (or a completed record's expiry)
                if xid in own_xids[key]:
                    i9.fail("%s/%s: a call of the key's own holders (transaction %d) deleted"
                            " the record with checkpoint %s" % (key + (xid, max(remembered))))
                    continue
                lease_end = lease_end_of(hist, prev) if prev else 0
                if d < lease_end:
                    within_retention += 1
                    i9.fail("%s/%s: the record with checkpoint %s was deleted at %.3f, while"
                            " the lease of token %d ran until %.3f"
                            % (key + (max(remembered), d, prev.tok, lease_end)))
                    continue
                if d < lease_end + ttl:
                    within_retention += 1
                    i9.fail("%s/%s: the record with checkpoint %s was deleted at %.3f, %.3f s"
                            " after the lease of token %d ended, within its retention"
                            " (%.0f s)" % (key + (max(remembered), d, d - lease_end, prev.tok,
                                                  ttl)))
                    continue
                after_retention += 1     # allowed: the record's retention was over
                remembered = kept
            done = max((p for p in remembered if p < 3), default=0)
            got = POINT_PHASE.get(h.claim.get("rp"), -1)
            if got:
                resumed += 1
                by_point[h.claim["rp"]] += 1
            if 3 in remembered:
                pass        # a winner after a completion: I1 reports it
            elif got != done:
                if 0 <= got < done:
                    restarts += 1
                i9.fail("%s/%s: holder of token %d (delivery %d) received recovery point %s;"
                        " the last committed one is %s%s"
                        % (key + (h.tok, h.claim["d"], h.claim.get("rp"),
                                  "p%d" % done if done else None,
                                  " (a restart while the record's retention lasted)"
                                  if 0 <= got < done else "")))
            elif got:
                tok, dlv, _ = remembered[got]
                want = {"d": dlv, "tok": tok, "phase": got}
                if h.claim.get("st") != want:
                    i9.fail("%s/%s: holder of token %d received state %s, checkpointed %s"
                            % (key + (h.tok, h.claim.get("st"), want)))
            for r in sorted(rows.get(h.tok, []), key=lambda r: r["ph"]):
                txn = commit_of.get((key, h.tok, r["ph"]))
                if r["ph"] <= got:
                    i9.fail("%s/%s: holder of token %d ran phase %d after receiving point %s"
                            % (key + (h.tok, r["ph"], h.claim.get("rp"))))
                if r["ph"] in remembered:
                    i9.fail("%s/%s: phase %d ran twice (tokens %d and %d) with no deletion of"
                            " the record after its retention between them"
                            % (key + (r["ph"], remembered[r["ph"]][0], h.tok)))
                sent = txn.end["t0"] if txn is not None and txn.end else float("inf")
                remembered[r["ph"]] = (h.tok, r["d"], sent)
            prev = h
        chances += sweep_chances(hist, key, holders)
        rec = records.get(key)
        if rec is not None and rec["status"] == "completed":
            last = {p: v[0] for p, v in remembered.items()}
            if sorted(last) != [1, 2, 3] or last[3] != rec["tok"]:
                i9.fail("%s/%s: completed by token %d, phases of the last run %s"
                        % (key + (rec["tok"], last)))
        elif rec is not None and rec["status"] == "failed":
            i9.fail("%s/%s: a multi-step key ended failed" % key)
        phases = [r["ph"] for r in steps.get(key, [])]
        if phases and all(phases.count(p) == 1 for p in phases):
            once += 1
    sweeps = [s for k in keys for s in hist.sweeps.get(k, ())]
    why = defaultdict(int)
    for sw in sweeps:
        why[sw.get("why")] += 1
    i9.notes.append(
        "%d keys, %d phase rows; every phase exactly once in %d keys; %d forced sweeps (%s),"
        " %d of them while a checkpointed key's lease was over; %d resumed holders (%s);"
        " restarts from an earlier phase %d, checkpointed records deleted within their"
        " retention %d, after it %d (retention %s)"
        % (len(keys), rows_total, once, len(sweeps),
           ", ".join("%s %d" % kv for kv in sorted(why.items())) or "none", chances, resumed,
           ", ".join("from %s %d" % kv for kv in sorted(by_point.items())), restarts,
           within_retention, after_retention, "%.0f s" % ttl if ttl != float("inf") else "unknown"))
    return {"keys": len(keys), "rows": rows_total, "once": once, "restarts": restarts,
            "within": within_retention, "after": after_retention, "resumed": resumed,
            "sweeps": len(sweeps), "chances": chances, "ttl": ttl}


def sweep_chances(hist, key, holders):
    """The forced sweeps of key that ran while a checkpoint of it had
    committed, no completion had, and its last holder's lease was over."""
    commits = []        # (acknowledged at, phase)
    for h in holders:
        for op in hist.by_attempt[(h.claim["d"], h.claim["a"])]:
            if op["e"] == "step" and op.get("tok") == h.tok:
                t = hist.txns[op["x"]]
                if t.status == "committed":
                    commits.append((t.end["t1"], op["ph"]))
    n = 0
    for sw in hist.sweeps.get(key, ()):
        if not sw.get("ok"):
            continue
        t = sw["t0"]
        done = [p for at, p in commits if at < t]
        if not done or 3 in done:
            continue
        before = [h for h in holders if h.claim["t1"] < t]
        if before and lease_end_of(hist, before[-1]) < t:
            n += 1
    return n


def check_errors(hist, errs, crashes_expected):
    """Every failed call is a fencing refusal (judged by I3) or, when the soak
    crashes the server on purpose, a lost connection."""
    conn_lost = 0
    for t in hist.txns.values():
        for op in t.ops:
            errs.checked += 1
            if op.get("ok"):
                continue
            err = op.get("err")
            if err == "conn":
                conn_lost += 1
                if not crashes_expected:
                    errs.fail("%s/%s: %s lost its connection" % (op["tn"], op["k"], op["e"]))
            elif not (op["e"] in SETTLES and fencing(op)):
                errs.fail("%s/%s: %s of delivery %d failed with SQLSTATE %s (%s)"
                          % (op["tn"], op["k"], op["e"], op["d"], err, op.get("msg")))
        if t.end is not None and t.end["res"] == "error":
            errs.fail("transaction %s: %s failed with SQLSTATE %s"
                      % (t.x, t.end["how"], t.end.get("err")))
    for sweeps in hist.sweeps.values():
        for sw in sweeps:
            errs.checked += 1
            if sw.get("ok"):
                continue
            if sw.get("err") == "conn":
                conn_lost += 1
                if crashes_expected:
                    continue
            errs.fail("%s/%s: idem_sweep() forced %s failed with SQLSTATE %s (%s)"
                      % (sw["tn"], sw["k"], sw.get("why"), sw.get("err"), sw.get("msg")))
    errs.notes.append("%d calls, %d interrupted by lost connections" % (errs.checked, conn_lost))


def check_history(events, final, crashes_expected=False):
    """Every check that needs only the history and the final tables.
    Returns (report, hist); the I7 check still lacks its end-of-run part."""
    hist = History(events)
    i1 = Check("I1", "single winner")
    i2 = Check("I2", "no double execution")
    i3 = Check("I3", "fencing")
    i4 = Check("I4", "no lost completion")
    i5 = Check("I5", "identical replay")
    i6 = Check("I6", "mismatch never executes")
    i7 = Check("I7", "liveness")
    errs = Check("E", "only documented errors")
    i9 = Check("I9", "multi-step: each phase once, resume from the last point")

    lease_pairs = check_single_winner(hist, i1, i2)
    n_pay, n_eff = check_no_double_execution(hist, final, i2, lease_pairs, events)
    refused = check_fencing(hist, final, i3)
    acked, lost = check_no_lost_completion(hist, final, i4, events)
    replays = check_replays(hist, final, i5, i6, events)
    mismatches = check_mismatch(hist, i6)
    busy = check_liveness_in_run(hist, i7)
    check_errors(hist, errs, crashes_expected)
    multi = hist.header.get("multi")
    if multi:
        m = check_multi_step(hist, final, i9)

    takeovers = sum(1 for hs in hist.holders.values() for h in hs
                    if any(p.tok == h.tok - 1 for p in hs))
    rollbacks = sum(1 for t in hist.txns.values() if t.status == "rolledback"
                    and any(op["e"] == "claim" and op.get("out") == "claimed" for op in t.ops))
    releases = sum(1 for hs in hist.holders.values() for h in hs
                   for s in h.settles if s["e"] in ("release", "fail") and s.get("ok"))
    figures = [
        "executions: %d (in-transaction %d, two-phase %d); replays %d; mismatches %d;"
        " takeovers %d; stale settles refused %d; rollbacks %d; releases %d;"
        " abandoned holders %d; in_progress while a claim was in flight %d"
        % (n_pay + n_eff, n_pay, n_eff, replays, mismatches, takeovers, refused,
           rollbacks, releases, len(hist.abandoned), busy),
        "acknowledged completions checked: %d, lost: %d" % (acked, lost),
    ]
    checks = [i1, i2, i3, i4, i5, i6, i7, errs]
    if multi:
        multi_holders = [h for k, hs in hist.holders.items() if hist.mode[k] == "multi"
                         for h in hs]
        faults = defaultdict(int)
        for a in hist.abandoned:
            if a.get("m") == "multi":
                faults[a.get("how")] += 1
        releases = sum(1 for h in multi_holders for s in h.settles
                       if s["e"] == "release" and s.get("ok"))
        refused = sum(1 for h in multi_holders for c in h.checkpoints + h.settles
                      if not c.get("ok") and fencing(c))
        checkpoints = sum(1 for h in multi_holders for c in h.checkpoints if c.get("ok"))
        figures.append(
            "multi-step: %d keys, %d holders, %d phase rows, %d checkpoints accepted; between"
            " phases %d holders died, %d rolled a phase back and died, %d released, %d stalled"
            " past their lease (zombies; %d checkpoints or completions refused); forced sweeps"
            " %d (%d while a checkpointed key's lease was over); resumed holders %d; restarts"
            " %d; checkpointed records deleted within their retention %d, after it %d"
            " (retention %s); deletions observed %d"
            % (m["keys"], len(multi_holders), m["rows"], checkpoints, faults["die"],
               faults["rollback"], releases, faults["stall"], refused, m["sweeps"],
               m["chances"], m["resumed"], m["restarts"], m["within"], m["after"],
               "%.0f s" % m["ttl"] if m["ttl"] != float("inf") else "unknown",
               sum(len(v) for v in hist.deleted.values())))
        checks.insert(7, i9)
        m["faults"] = sum(faults.values()) + releases
    report = Report(checks, figures)
    report.multi = m if multi else None
    return report, hist


def check(conn, events, sweeper="auto", crashes_expected=False):
    """All checks: the history ones, then I7's end-of-run part (which waits
    for or runs the sweeper and claims every abandoned key again)."""
    final = load_final(conn, events[0]["tenants"])
    report, hist = check_history(events, final, crashes_expected)
    i7 = next(c for c in report.checks if c.name == "I7")
    check_liveness_at_end(conn, hist, final, events[0]["tenants"], i7, sweeper)
    m = report.multi
    if m and m["sweeps"] and m["faults"] and not m["chances"]:
        # the whole run (not the self-test's samples): the forced sweeps must
        # have met checkpointed records with their lease over, or I9 proved
        # nothing about the sweeper
        i9 = next(c for c in report.checks if c.name == "I9")
        i9.fail("%d forced sweeps after %d faults, none while a checkpointed key's lease was"
                " over: the sweeper never had a chance to remove a checkpointed record"
                % (m["sweeps"], m["faults"]))
    report.violations = sum(len(c.violations) for c in report.checks)
    return report
