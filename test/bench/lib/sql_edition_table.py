#!/usr/bin/python3
"""Write README.md's SQL edition table (issue 48) from the last runs of
test/bench/sql-edition and test/bench/sql-edition-profile.

    sql_edition_table.py RESULTS_DIR FILE...

In each FILE, replaces what stands between <!-- bench:sql-edition --> and
<!-- /bench:sql-edition --> with the SQL edition's two paths (a claim,
INSERT and complete in one transaction; a replay) against issue 48's
targets: throughput from RESULTS_DIR/sql-edition.json (in-round ratios to
the lean hand-written SQL or the primary-key SELECT, and to the floor of
test/bench/sql/sql_edition_floor.sql), instructions from
RESULTS_DIR/sql-edition-profile.md when it is there.  sql-edition calls it
after a run of at least 5 rounds of 3 s on PostgreSQL 15, sql-edition-profile
after one of at least 300 transactions a row, so the table always shows the
latest of each."""

import json
import os
import re
import sys

BEGIN, END = "<!-- bench:sql-edition -->", "<!-- /bench:sql-edition -->"
# (path, its row in sql-edition.json's targets against the reference and
# the floor, the profile's ids of the SQL edition, reference and floor)
PATHS = [("claim, INSERT, complete in one transaction (2)", "2 / 1b", "2 / 2p", "2", "1b", "2p",
          "the lean hand-written SQL"),
         ("a replay, `idem_claim` on a completed key (7a)", "7a / 7b", "7a / 7p", "7a", "7b", "7p",
          "the primary-key SELECT")]
FLOOR_INSTRUCTIONS = 1.1


def read_profile(path):
    """The profile's instructions per transaction by row id, and its first
    line (what ran), or ({}, None) when there is no profile."""
    if not os.path.exists(path):
        return {}, None
    with open(path) as f:
        lines = f.read().split("\n")
    counts = {}
    for line in lines:
        m = re.match(r"^\| ([\w-]+) \| .* \| (\d+) \|$", line)
        if m:
            counts[m.group(1)] = int(m.group(2))
    head = re.search(r"callgrind, (\d+) transactions a row, PostgreSQL ([\d.]+), commit (\w+)", lines[0])
    return counts, head


def block(results):
    with open(os.path.join(results, "sql-edition.json")) as f:
        run = json.load(f)
    goals = {t["ratio"]: t for t in run["targets"]}
    counts, head = read_profile(os.path.join(results, "sql-edition-profile.md"))
    major = run["major"]
    lines = [f"The SQL edition ([managed PostgreSQL](docs/managed.md)) against issue 48's targets on "
             f"PostgreSQL {major}: its throughput against the same statements written by hand, and "
             "within 10 % of its floor, a PL/pgSQL function with the same pinned `search_path` that runs "
             "only those statements ([docs/benchmarks.md](docs/benchmarks.md#speed-next-to-its-bounds-issue-48)):",
             "",
             "| SQL edition | tx/s | × hand-written | × floor | instructions | hand-written / it "
             "| it / floor | issue 48 |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, ref_row, floor_row, sid, ref, floor, ref_name in PATHS:
        r, fl = goals[ref_row], goals[floor_row]
        tps = run["tps"][f"sql/{sid}"]
        verdict = "PASS" if r["pass"] and fl["pass"] else "MISS"
        instr = ["–", "–", "–"]
        goal_text = f"≥ {r['goal']:.2f}× {ref_name}, ≥ {fl['goal']:.2f}× floor: {verdict}"
        if sid in counts and ref in counts and floor in counts:
            a, b, c = counts[sid], counts[ref], counts[floor]
            instr = [f"{a:,}", f"{b / a:.2f}", f"{a / c:.2f}"]
            ok = b / a >= r["goal"] and a / c <= FLOOR_INSTRUCTIONS
            goal_text += f"; instructions (≤ {FLOOR_INSTRUCTIONS}× floor): {'PASS' if ok else 'MISS'}"
        lines.append(f"| {name} | {tps:,.0f} | {r['value']:.2f} | {fl['value']:.2f} | "
                     f"{' | '.join(instr)} | {goal_text} |")
    source = (f"`{run['command']}`, {run['date']}, commit {run['commit']}: 16 clients, "
              f"medians of in-round ratios (the floors themselves {run['floors']['2p']:.2f}× the "
              f"hand-written SQL, {run['floors']['7p']:.2f}× the SELECT)")
    if head:
        source += (f"; `test/bench/sql-edition-profile {head.group(1)}` (callgrind, without the business "
                   f"INSERT), PostgreSQL {head.group(2)}, commit {head.group(3)}")
    lines += ["", source + "."]
    return lines


def rewrite(path, lines):
    with open(path) as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        return False
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(path, "w") as f:
        f.write(head + BEGIN + "\n" + "\n".join(lines) + "\n" + END + tail)
    return True


def main(results, paths):
    if not os.path.exists(os.path.join(results, "sql-edition.json")):
        print(f"sql_edition_table: no {results}/sql-edition.json: run test/bench/sql-edition first",
              file=sys.stderr)
        return 1
    lines = block(results)
    status = 0
    for path in paths:
        if rewrite(path, lines):
            print(f"sql_edition_table: {path}: the SQL edition's table now shows the latest runs")
        else:
            print(f"sql_edition_table: {path} has no bench:sql-edition block", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
