#!/usr/bin/python3
"""Write the headline table of docs/benchmarks.md from a full run's results.

    docs_table.py RESULTS_DIR DOC

Replaces what stands between the lines <!-- bench:headline --> and
<!-- /bench:headline --> in DOC with the run's machine line and the
synchronous_commit = on figures of the headline scenarios, read from
RESULTS_DIR/latest.csv and latest.md.  test/bench/run calls it after a full
run on the host's PostgreSQL, so the table always shows the latest run."""

import csv
import os
import sys

BEGIN = "<!-- bench:headline -->"
END = "<!-- /bench:headline -->"

# (scenario id, how the table names it)
ROWS = [
    ("1", "bare business transaction"),
    ("1b", "lean hand-written SQL (same statements)"),
    ("2", "**extension, in-transaction**"),
    ("3", "extension, two-phase"),
    ("4", "seed articles' SQL"),
    ("5", "PL/pgSQL version of the same contract"),
    ("2f", "C driver: extension, 2 round trips (pipelined)"),
    ("6", "C driver: Redis SET NX + PG transaction + Redis SET"),
]


def number(value, digits=0):
    return "–" if value in ("", None) else f"{float(value):,.{digits}f}"


def table(results):
    with open(os.path.join(results, "latest.csv"), newline="") as f:
        on = {r["id"]: r for r in csv.DictReader(f) if r["table"] == "on"}
    with open(os.path.join(results, "latest.md")) as f:
        header = f.read().split("\n")
    title = header[0].replace("# idempotency benchmark — ", "")
    machine = next((line for line in header if line.startswith("Machine:")), "")
    lines = [f"Latest run ({title}, `test/bench/run`): {machine.replace('Machine: ', '')} "
             "synchronous_commit = on; medians of the rounds, full tables in "
             "[`latest.md`](../test/bench/results/latest.md).",
             "",
             "| scenario | round trips | ops/s | p99 ms | WAL B/op | CPU µs/op |",
             "|---|---|---:|---:|---:|---:|"]
    for sid, name in ROWS:
        r = on.get(sid)
        if r is None:
            continue
        lines.append(f"| {name} | {r['round_trips']} | {number(r['rate'])} "
                     f"| {number(r['p99_ms'], 1)} | {number(r['wal_b_op'])} "
                     f"| {number(r['cpu_us_op'])} |")
    return lines


def main(results, doc):
    with open(doc) as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        print(f"docs_table: {doc} has no {BEGIN} ... {END} block", file=sys.stderr)
        return 1
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(doc, "w") as f:
        f.write(head + BEGIN + "\n" + "\n".join(table(results)) + "\n" + END + tail)
    print(f"docs_table: the headline table of {doc} now shows this run")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
