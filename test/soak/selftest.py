#!/usr/bin/env python3
"""Proves that every invariant check of checker.py can fail.

Takes the history of a soak that passed and the final tables it left, and
plants one fault at a time (a second winner, a double execution, an accepted
stale settle, a lost completion, a changed replay, an executed mismatch, a
stuck key, an undocumented error; for multi-step keys: a phase run twice, a
resumed holder handed no recovery point, a checkpointed record deleted
within its retention with the next holder restarting from phase 1, a
zombie's checkpoint accepted).  Each fault must be reported by the check it
belongs to; the unchanged history must report none, and neither may the
same deletion and restart once the record's retention is over (a control).

Usage: selftest.py --history FILE --host H --port P [--dbname D --user U]
"""
import argparse
import sys
import os

import psycopg2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checker  # noqa: E402
import history  # noqa: E402


def committed_ends(events):
    return {e["x"]: e for e in events if e["e"] == "end" and e["how"] == "commit"
            and e["res"] == "ok"}


def acked_times(events):
    ends = committed_ends(events)
    return {(e["tn"], e["k"]): ends[e["x"]]["t1"] for e in events
            if e["e"] == "complete" and e.get("ok") and e["x"] in ends}


# Each fault: where it can be planted (a predicate on one event, given the
# committed transaction ends and acknowledgement times), and how (changes
# events/final in place, returns a function undoing the change).

def committed_tx_winner(e, ends, acked):
    return (e["e"] == "claim" and e.get("out") == "claimed" and e["m"] == "tx"
            and e["x"] in ends)


def second_winner(events, final, c, ends):
    """An in-transaction holder with a twin that won the same key at once."""
    twin = dict(c, x="fault.1", a=999, tok=c["tok"] + 1000)
    end = dict(ends[c["x"]], x="fault.1")
    events.extend([twin, end])
    return lambda: (events.remove(twin), events.remove(end))


def paid_and_committed(e, ends, acked):
    return e["e"] == "pay" and e["x"] in ends


def double_execution(events, final, pay, ends):
    rows = final[1][(pay["tn"], pay["k"])]
    rows.append(dict(rows[0]))
    return rows.pop


def refused_stale_settle(e, ends, acked):
    return e["e"] in ("complete", "release", "fail") and e.get("err") == "ID002"


def stale_settle_accepted(events, final, s, ends):
    s["ok"], err = True, s.pop("err")

    def undo():
        s["ok"], s["err"] = False, err
    return undo


def acked_complete(e, ends, acked):
    return e["e"] == "complete" and e.get("ok") and e["x"] in ends


def lost_completion(events, final, s, ends):
    key = (s["tn"], s["k"])
    rec = final[0].pop(key)
    return lambda: final[0].__setitem__(key, rec)


def a_replay(e, ends, acked):
    return e["e"] == "claim" and e.get("out") == "replay"


def replay_changed(events, final, c, ends):
    old = c["sha"]
    c["sha"] = "0" * 64
    return lambda: c.__setitem__("sha", old)


def mismatch_after_ack(e, ends, acked):
    return (e["e"] == "claim" and e.get("out") == "mismatch"
            and e["t0"] > acked.get((e["tn"], e["k"]), float("inf")))


def mismatch_executed(events, final, c, ends):
    """A different fingerprint, after the completion was acknowledged, is
    answered as if it were the same request."""
    old_sha = c.get("sha")
    c["out"], c["sha"] = "replay", final[0][(c["tn"], c["k"])]["sha"]

    def undo():
        c["out"], c["sha"] = "mismatch", old_sha
    return undo


def in_progress_on_lease(e, ends, acked):
    return e["e"] == "claim" and e.get("out") == "in_progress" and e.get("exp") is not None


def stuck_key(events, final, c, ends):
    old = c["exp"]
    c["exp"] = c["t0"] - 1.0
    return lambda: c.__setitem__("exp", old)


def undocumented_error(events, final, c, ends):
    saved = dict(c)
    c["ok"], c["err"] = False, "XX000"

    def undo():
        c.clear()
        c.update(saved)
    return undo


def multi_step_row(e, ends, acked):
    return e["e"] == "step" and e["ph"] == 1 and e["x"] in ends


def phase_twice(events, final, step, ends):
    """The phase's row written a second time by the same holder."""
    rows = final[3][(step["tn"], step["k"])]
    row = next(r for r in rows if r["tok"] == step["tok"] and r["ph"] == step["ph"])
    rows.append(dict(row))
    return rows.pop


def resumed_holder(e, ends, acked):
    return e["e"] == "claim" and e.get("out") == "claimed" and e.get("rp") is not None


def resumed_from_scratch(events, final, c, ends):
    old = c["rp"], c["st"]
    c["rp"], c["st"] = None, None

    def undo():
        c["rp"], c["st"] = old
    return undo


def restart_after_deletion(events, final, c, ends):
    """The sweeper deleted the checkpointed record just before this resumed
    holder's claim (after the last lease ended, long before the retention
    did), and the holder, handed no recovery point, ran every phase from
    the first: what a 1.1 sweep did.  Nothing else is inconsistent, so only
    the retention rule can report it."""
    deleted = {"e": "deleted", "tn": c["tn"], "k": c["k"], "t0": c["t1"] - 1e-6,
               "t1": c["t1"] - 1e-6, "xid": None}
    old = c["rp"], c["st"]
    done = checker.POINT_PHASE[c["rp"]]
    rows = final[3][(c["tn"], c["k"])]
    again = [{"ph": ph, "d": c["d"], "tok": c["tok"]} for ph in range(1, done + 1)]
    events.append(deleted)
    rows.extend(again)
    c["rp"], c["st"] = None, None

    def undo():
        c["rp"], c["st"] = old
        events.remove(deleted)
        for r in again:
            rows.remove(r)
    return undo


def restart_after_retention(events, final, c, ends):
    """The same deletion and restart with the run's retention shortened to
    nothing: the record's retention was over, so the deletion and the
    restart are allowed (docs/multistep.md) and nothing may be reported."""
    header = events[0]
    ttl = header.get("ttl_s")
    header["ttl_s"] = 0.0
    undo_restart = restart_after_deletion(events, final, c, ends)

    def undo():
        undo_restart()
        header["ttl_s"] = ttl
    return undo


def refused_checkpoint(e, ends, acked):
    return e["e"] == "checkpoint" and e.get("err") == "ID002"


FAULTS = [
    ("two winners of one key at once", committed_tx_winner, second_winner, "I1"),
    ("a second business row for a completed key", paid_and_committed, double_execution, "I2"),
    ("a stale-token settle accepted", refused_stale_settle, stale_settle_accepted, "I3"),
    ("an acknowledged completion missing", acked_complete, lost_completion, "I4"),
    ("a replay differing from the stored response", a_replay, replay_changed, "I5"),
    ("another fingerprint answered as a replay", mismatch_after_ack, mismatch_executed, "I6"),
    ("in_progress for a lease that had ended", in_progress_on_lease, stuck_key, "I7"),
    ("an XX000 error", a_replay, undocumented_error, "E"),
    ("a multi-step phase run twice", multi_step_row, phase_twice, "I9"),
    ("a resumed holder handed no recovery point", resumed_holder, resumed_from_scratch, "I9"),
    ("a checkpointed record deleted within its retention, the next holder restarting from"
     " phase 1", resumed_holder, restart_after_deletion, "I9"),
    ("a zombie's checkpoint accepted", refused_checkpoint, stale_settle_accepted, "I3"),
]
MULTI_FAULTS = {"I9"}
# The resumed claims that directly follow a successful release of their key
# and are its last winners: the released record's lease ended when the
# release committed, before the claim, so a deletion planted just before the
# claim is after the lease.  (After a takeover the checker can only bound the
# lease's end from the client's clock, which may fall after such a planted
# deletion.)  The last winner, because the planted restart rewrites the
# key's checkpoints: a later holder would still show the state the history
# handed it, from the checkpoints before the restart.
AFTER_RELEASE = set()


def mark_claims_after_release(events):
    pending, last_winner = set(), {}
    for e in events[1:]:
        key = (e.get("tn"), e.get("k"))
        if e["e"] == "release" and e.get("ok"):
            pending.add(key)
        elif e["e"] == "claim" and e.get("out") == "claimed":
            last_winner[key] = (e, key in pending)
            pending.discard(key)
    AFTER_RELEASE.update(id(e) for e, after_release in last_winner.values() if after_release)


def resumed_after_release(e, ends, acked):
    return resumed_holder(e, ends, acked) and id(e) in AFTER_RELEASE


# Planted like the faults, but allowed: no check may report them.
CONTROLS = [
    ("a checkpointed record deleted after its retention, the next holder starting over",
     resumed_after_release, restart_after_retention),
]
SAMPLE_KEYS = 300


def violations_by_check(events, final):
    report, _ = checker.check_history(events, final)
    return {c.name: len(c.violations) for c in report.checks}


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--history", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5432)
    p.add_argument("--dbname", default="postgres")
    p.add_argument("--user")
    a = p.parse_args(argv)
    events = history.load(a.history)
    conn = psycopg2.connect(host=a.host, port=a.port, dbname=a.dbname, user=a.user)
    final = checker.load_final(conn, events[0]["tenants"])
    conn.close()

    # Plant every fault on the first event that allows it.  The checks are
    # per key, so they run on those keys plus a sample, which keeps a run of
    # a default soak's history to seconds.
    ends = committed_ends(events)
    acked = acked_times(events)
    if not events[0].get("multi"):       # a soak without multi-step keys
        FAULTS[:] = [f for f in FAULTS if f[3] not in MULTI_FAULTS
                     and f[1] is not refused_checkpoint]
        CONTROLS[:] = []
    mark_claims_after_release(events)
    targets = {}
    for title, where, plant, expect in FAULTS:
        targets[title] = next((e for e in events[1:] if where(e, ends, acked)), None)
    for title, where, plant in CONTROLS:
        targets[title] = next((e for e in events[1:] if where(e, ends, acked)), None)
    keys = {(e["tn"], e["k"]) for e in targets.values() if e is not None}
    all_keys = sorted({(e["tn"], e["k"]) for e in events[1:] if "k" in e})
    keys.update(all_keys[::max(1, len(all_keys) // SAMPLE_KEYS)])
    txns = {e.get("x") for e in events[1:] if "k" in e and (e["tn"], e["k"]) in keys}
    sub = [events[0]] + [e for e in events[1:]
                         if ("k" in e and (e["tn"], e["k"]) in keys)
                         or (e["e"] == "end" and e["x"] in txns)]
    final = tuple({k: v for k, v in part.items() if k in keys} for part in final)

    bad = caught = 0
    base = violations_by_check(sub, final)
    if any(base.values()):
        print("selftest: the unchanged history already has violations: %s" % base)
        return 1
    print("selftest: unchanged history of %d keys: no violation" % len(keys))
    for title, where, plant, expect in FAULTS:
        if targets[title] is None:
            print("selftest: NOT TESTED (no event to plant it on): %s" % title)
            bad += 1
            continue
        undo = plant(sub, final, targets[title], ends)
        got = violations_by_check(sub, final)
        undo()
        if got[expect] > 0:
            caught += 1
            print("selftest: caught by %s: %s" % (expect, title))
        else:
            bad += 1
            print("selftest: MISSED by %s: %s (violations: %s)" % (expect, title, got))
    allowed = 0
    for title, where, plant in CONTROLS:
        if targets[title] is None:
            print("selftest: NOT TESTED (no event to plant it on): %s" % title)
            bad += 1
            continue
        undo = plant(sub, final, targets[title], ends)
        got = violations_by_check(sub, final)
        undo()
        if any(got.values()):
            bad += 1
            print("selftest: WRONGLY REPORTED (allowed): %s (violations: %s)" % (title, got))
        else:
            allowed += 1
            print("selftest: allowed, as it must be: %s" % title)
    print("selftest: %d of %d planted faults caught%s"
          % (caught, len(FAULTS),
             ", %d of %d allowed cases not reported" % (allowed, len(CONTROLS))
             if CONTROLS else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
