#!/usr/bin/env python3
"""The checker's self-test: into a history and final state that passed,
plant one violation at a time; the checker must report each.

    selftest.py HISTORY STATE [--allow-loss-before-port PORT]

Planted: a double execution (a second business row and a second
acknowledged COMMIT of one key), a lost acknowledgement (an acknowledged
COMMIT whose execution is not the final one), a wrong replay, a token that
goes backwards; with a failed primary given, also a lost acknowledgement
answered by the surviving server, which is never allowed.
Prints one "ok"/"FAIL" line per plant.
"""
import argparse
import copy
import json
import sys

from checker import check


def first(history, pred, what):
    for e in history:
        if pred(e):
            return e
    raise SystemExit("selftest: the history has no %s to plant a fault into" % what)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("history")
    ap.add_argument("state")
    ap.add_argument("--allow-loss-before-port", type=int, default=None)
    args = ap.parse_args()
    with open(args.history) as f:
        clean_history = [json.loads(line) for line in f if line.strip()]
    with open(args.state) as f:
        clean_state = json.load(f)
    lost_port = args.allow_loss_before_port
    records = clean_state["records"]

    def final_ack(e):
        return (e["ev"] == "commit" and e["res"] == "ok"
                and records.get(e["k"], [None, None])[1] == e["tok"])

    plants = []

    def double_execution(h, s):
        e = first(h, final_ack, "acknowledged final completion")
        second = dict(e, tok=e["tok"] + 2, t0=e["t1"] + 1, t1=e["t1"] + 1.01,
                      resp=dict(e["resp"], token=e["tok"] + 2))
        h.append(second)
        s["ledger"].append([e["k"], e["tok"] + 2, e["c"]])
        return "exactly-once"
    plants.append(("a double execution (second business row, second acknowledgement)",
                   double_execution))

    def lost_acknowledgement(h, s):
        e = first(h, final_ack, "acknowledged final completion")
        # the key's final execution is another one: the acknowledged one vanished
        new_token = e["tok"] + 1000
        s["ledger"] = [[k, new_token if k == e["k"] else t, c] for k, t, c in s["ledger"]]
        s["records"][e["k"]] = ["completed", new_token,
                                {"key": e["k"], "token": new_token, "by": e["c"]}]
        if lost_port is not None:
            e["ep"] = lost_port + 1 if e["ep"] == lost_port else e["ep"]
        return "acknowledged"
    plants.append(("a lost acknowledged completion", lost_acknowledgement))

    def wrong_replay(h, s):
        e = first(h, lambda e: e["ev"] == "claim" and e["out"] == "replay", "replay")
        e["resp"] = dict(e["resp"], token=-1)
        return "replay"
    plants.append(("a replay that differs from the committed response", wrong_replay))

    def token_backwards(h, s):
        e = first(h, lambda e: e["ev"] == "claim" and e["out"] == "claimed", "winning claim")
        later = dict(e, t0=e["t1"] + 0.5, t1=e["t1"] + 0.51, tok=e["tok"] - 2)
        h.append(later)
        return "tokens"
    plants.append(("a claim whose token is below an earlier claim's", token_backwards))

    if lost_port is not None:
        def double_on_failed_primary(h, s):
            e = first(h, lambda e: e["ev"] == "commit" and e["res"] == "ok" and e["ep"] == lost_port,
                      "acknowledged completion on the failed primary")
            h.append(dict(e, tok=e["tok"] + 2, t0=e["t1"] + 0.1, t1=e["t1"] + 0.11))
            return "acknowledged"
        plants.append(("two acknowledged executions of one key on the failed primary",
                       double_on_failed_primary))

    failed = 0
    violations, _ = check(clean_history, clean_state, lost_port)
    if violations:
        print("FAIL checker self-test: the clean history already has %d violations" % len(violations))
        failed += 1
    for title, plant in plants:
        h = copy.deepcopy(clean_history)
        s = copy.deepcopy(clean_state)
        category = plant(h, s)
        violations, _ = check(h, s, lost_port)
        if any(v.startswith(category + ":") for v in violations):
            print("ok   checker self-test: planted %s, reported as %s" % (title, category))
        else:
            print("FAIL checker self-test: planted %s, not reported as %s (%d other violations)"
                  % (title, category, len(violations)))
            failed += 1
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
