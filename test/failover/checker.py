#!/usr/bin/env python3
"""Checks a failover or lost-connection history (workload.py) against the
final database: exactly once, no lost acknowledgement, true replays,
growing tokens.

    checker.py HISTORY STATE [--allow-loss-before-port PORT]

HISTORY: JSON lines of claim and commit events; STATE: JSON {"ledger":
[[key, token, client], ...], "records": {key: [status, token, response]}}
read from the surviving server at the end.

Checks, per key of the history:
  exactly-once    exactly one business row in the final database;
  record          the final record is completed, with the token of that row
                  and the response its execution stored;
  acknowledged    every acknowledged COMMIT is the final execution, with
                  its response.  With --allow-loss-before-port P (asynchronous
                  replication, P the failed primary) an acknowledged COMMIT
                  answered by P may be missing: it is counted as lost, and
                  its key must then have been executed again exactly once on
                  another server (the exactly-once check sees a second);
                  more than one acknowledged execution per server is always
                  a double execution;
  replay          every replay equals the final response, or (a replay the
                  failed primary gave, loss allowed) the response of an
                  execution of the key that server may have committed;
  tokens          a claim that started after another claim of the key had
                  returned got a larger token.
Exit status 0 when there is no violation; the last line says how many.
"""
import argparse
import json
import sys
from collections import defaultdict


def canon(value):
    """Responses compare as JSON values (jsonb reorders keys)."""
    if isinstance(value, str):
        value = json.loads(value)
    return json.dumps(value, sort_keys=True)


def check(history, state, lost_port=None):
    """Returns (violations, figures)."""
    violations = []
    figures = defaultdict(int)
    by_key = defaultdict(list)
    for e in history:
        by_key[e["k"]].append(e)
        figures["calls"] += 1
        if e["ev"] == "claim":
            figures["claims_" + e["out"]] += 1
        else:
            figures["commits_" + e["res"]] += 1

    ledger = defaultdict(list)
    for key, token, client in state["ledger"]:
        ledger[key].append((token, client))
    records = state["records"]

    for key in sorted(by_key):
        events = by_key[key]
        rows = ledger.get(key, [])
        if len(rows) != 1:
            violations.append("exactly-once: key %s has %d business rows %s" % (key, len(rows), rows))
        final_token = final_resp = None
        rec = records.get(key)
        if rec is None:
            violations.append("record: key %s has no record" % key)
        else:
            status, final_token, final_resp = rec
            final_resp = canon(final_resp) if final_resp is not None else None
            if status != "completed":
                violations.append("record: key %s is %s, not completed" % (key, status))
            if rows and rows[-1][0] != final_token:
                violations.append("record: key %s has token %s, its business row %s"
                                  % (key, final_token, rows[-1][0]))
            if rows:
                token, client = rows[-1]
                expected = canon({"key": key, "token": token, "by": client})
                if final_resp != expected:
                    violations.append("record: key %s stores %s, its execution wrote %s"
                                      % (key, final_resp, expected))

        commits = [e for e in events if e["ev"] == "commit"]
        acked = [e for e in commits if e["res"] == "ok"]
        per_server = defaultdict(list)
        for e in acked:
            per_server[e["ep"]].append(e["tok"])
        for port, tokens in per_server.items():
            if len(tokens) > 1:
                violations.append("acknowledged: key %s executed and acknowledged %d times by the "
                                  "server on port %s (tokens %s): a double execution"
                                  % (key, len(tokens), port, tokens))
        lost_here = []
        for e in acked:
            if e["tok"] == final_token:
                if canon(e["resp"]) != final_resp:
                    violations.append("acknowledged: key %s acknowledged %s, stored %s"
                                      % (key, canon(e["resp"]), final_resp))
            elif lost_port is not None and e["ep"] == lost_port:
                lost_here.append(e)
            else:
                violations.append("acknowledged: key %s: the completion with token %s acknowledged "
                                  "by port %s is lost (the final token is %s)"
                                  % (key, e["tok"], e["ep"], final_token))
        if lost_here:
            figures["lost_acknowledged"] += len(lost_here)
            # the execution that replaced it ran on another server, once
            winner = [e for e in events if e["ev"] == "claim" and e["out"] == "claimed"
                      and e["tok"] == final_token]
            if not winner or winner[0]["ep"] == lost_port:
                violations.append("acknowledged: key %s lost its acknowledged completion and was "
                                  "not executed again after the failover" % key)
            else:
                figures["lost_reexecuted"] += 1

        maybe_committed_on_lost = {canon(e["resp"]) for e in commits if e["ep"] == lost_port}
        for e in events:
            if e["ev"] != "claim" or e["out"] != "replay":
                continue
            got = canon(e["resp"])
            if got == final_resp:
                continue
            if lost_port is not None and e["ep"] == lost_port and got in maybe_committed_on_lost:
                figures["replays_of_lost"] += 1
                continue
            violations.append("replay: key %s replayed %s, the committed response is %s"
                              % (key, got, final_resp))

        for e in commits:
            if e["res"] == "unknown":
                figures["unknown_committed" if e["tok"] == final_token
                        else "unknown_not_committed"] += 1

        winners = sorted((e for e in events if e["ev"] == "claim" and e["out"] == "claimed"),
                         key=lambda e: e["t0"])
        for i, a in enumerate(winners):
            for b in winners[i + 1:]:
                if a["t1"] < b["t0"] and not a["tok"] < b["tok"]:
                    violations.append("tokens: key %s: claim at %.6f got %s, after a claim that "
                                      "returned %s at %.6f" % (key, b["t0"], b["tok"], a["tok"], a["t1"]))
    figures["keys"] = len(by_key)
    return violations, dict(figures)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("history")
    ap.add_argument("state")
    ap.add_argument("--allow-loss-before-port", type=int, default=None)
    args = ap.parse_args()
    with open(args.history) as f:
        history = [json.loads(line) for line in f if line.strip()]
    with open(args.state) as f:
        state = json.load(f)
    violations, figures = check(history, state, args.allow_loss_before_port)
    for v in violations[:50]:
        print("VIOLATION " + v)
    print("figures: " + ", ".join("%s %d" % kv for kv in sorted(figures.items())))
    print("checker: %d violations" % len(violations))
    sys.exit(1 if violations else 0)


if __name__ == "__main__":
    main()
