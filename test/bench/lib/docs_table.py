#!/usr/bin/python3
"""Write the benchmark tables of README.md and docs/benchmarks.md from a
full run's results.

    docs_table.py RESULTS_DIR FILE...

In each FILE, replaces what stands between <!-- bench:headline --> and
<!-- /bench:headline --> (the full headline table, docs/benchmarks.md) and
between <!-- bench:summary --> and <!-- /bench:summary --> (a few rows,
README.md, with the secure rows of issue 34 and their in-round ratios) with
the run's figures at synchronous_commit = on, read from RESULTS_DIR/latest.csv,
latest-runs.csv and latest.md.  test/bench/run calls it after a full
run on the host's PostgreSQL, so both tables always show the latest run."""

import csv
import os
import sys

from report import ratio_between


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
    ("2t", "**extension, in-transaction, tenant isolation on** (application role, set_config "
           "per transaction)"),
    ("2n", "the same role and statements, isolation off"),
    ("1bt", "lean hand-written SQL + set_config, table under the same policy"),
]


def number(value, digits=0):
    return "–" if value in ("", None) else f"{float(value):,.{digits}f}"


# README.md's few rows, then the secure rows (issue 34)
SUMMARY_ROWS = ["1", "2", "1b", "2f", "6", "2t", "2n", "1bt"]


def read_run(results):
    """The synchronous_commit = on rows by scenario id, and the run's title
    (its date) and machine line."""
    with open(os.path.join(results, "latest.csv"), newline="") as f:
        on = {r["id"]: r for r in csv.DictReader(f) if r["table"] == "on"}
    with open(os.path.join(results, "latest-runs.csv"), newline="") as f:
        runs = [{"table": r["table"], "id": r["id"], "round": int(r["round"]),
                 "tps": float(r["tps"])} for r in csv.DictReader(f)]
    with open(os.path.join(results, "latest.md")) as f:
        header = f.read().split("\n")
    title = header[0].replace("# idempotency benchmark — ", "")
    machine = next((line for line in header if line.startswith("Machine:")), "")
    return on, runs, title, machine.replace("Machine: ", "")


def rows_of(on, ids):
    lines = ["| scenario | round trips | ops/s | p99 ms | WAL B/op | CPU µs/op |",
             "|---|---|---:|---:|---:|---:|"]
    names = dict(ROWS)
    for sid in ids:
        r = on.get(sid)
        if r is not None:
            lines.append(f"| {names[sid]} | {r['round_trips']} | {number(r['rate'])} "
                         f"| {number(r['p99_ms'], 1)} | {number(r['wal_b_op'])} "
                         f"| {number(r['cpu_us_op'])} |")
    return lines


def headline(run):
    on, _, title, machine = run
    return [f"Latest run ({title}, `test/bench/run`): {machine} synchronous_commit = on; "
            "medians of the rounds, full tables in "
            "[`latest.md`](../test/bench/results/latest.md).", ""] + \
        rows_of(on, [sid for sid, _ in ROWS])


def secure_ratios(runs):
    """The secure rows' in-round ratios (issue 34), as README.md quotes them."""
    r = {(a, b): ratio_between(runs, "on", a, b)
         for a, b in (("2t", "2n"), ("2t", "1bt"), ("7at", "7bt"))}
    if None in r.values():
        return []
    return [f"With tenant isolation on, as the application role of "
            f"[docs/privileges.md](docs/privileges.md): {r[('2t', '2n')]:.2f}× the same role "
            f"without isolation, {r[('2t', '1bt')]:.2f}× the same statements written by hand "
            f"under the same policy; a replay (BEGIN, set_config, `idem_claim`, COMMIT) "
            f"{r[('7at', '7bt')]:.2f}× the primary-key SELECT under the policy (in-round "
            "ratios; targets 0.97×, 1.1×, 0.9×)."]


def summary(run):
    on, runs, title, machine = run
    secure = secure_ratios(runs)
    return rows_of(on, SUMMARY_ROWS) + ([""] + secure if secure else []) + \
        ["", f"`test/bench/run`, {title}: {machine} 16 clients, synchronous_commit = on. "
         "Every scenario, the per-operation costs and the method: "
         "[docs/benchmarks.md](docs/benchmarks.md)."]


BLOCKS = {"headline": headline, "summary": summary}


def rewrite(path, run):
    with open(path) as f:
        text = f.read()
    written = []
    for name, make in BLOCKS.items():
        begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
        if begin in text and end in text:
            head, rest = text.split(begin, 1)
            _, tail = rest.split(end, 1)
            text = head + begin + "\n" + "\n".join(make(run)) + "\n" + end + tail
            written.append(name)
    with open(path, "w") as f:
        f.write(text)
    return written


def main(results, paths):
    run = read_run(results)
    status = 0
    for path in paths:
        written = rewrite(path, run)
        if written:
            print(f"docs_table: {path}: the {' and '.join(written)} table now shows this run")
        else:
            print(f"docs_table: {path} has no bench:headline or bench:summary block",
                  file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
