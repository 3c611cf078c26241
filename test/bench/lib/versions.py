"""test/bench/run --all-versions: after one run per PostgreSQL major, the key
in-round ratios of each side by side, so that a regression on one version
shows.  Reads each version's <stem>-runs.csv and <stem>.md (stem quick or
latest, with -pgNN for a major other than 15) and writes
<mode>-versions.md, printed too.

    versions.py --results DIR --mode quick|default  15:0:140 17:0:170 18:3:2

Each argument is VERSION:EXIT_STATUS:SECONDS of that version's run (3: it
could not be set up here)."""

import argparse
import csv
import datetime
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from report import ratio_between   # noqa: E402

# (scenario, its reference, column title, target from issue 15 or 34, or None)
KEY_RATIOS = [
    ("2", "1b", "in-transaction / lean SQL (2 / 1b)", None),
    ("7a", "7b", "replay / PK SELECT (7a / 7b)", 0.9),
    ("11c", "11d", "claim_many(500) / 500 claims, 1 client (11c / 11d)", 20.0),
    ("11a", "11b", "the same, 16 clients (11a / 11b)", None),
    # issue 34: tenant isolation on, as the application role
    ("2t", "2n", "secure in-transaction / isolation off (2t / 2n)", 0.97),
    ("2t", "1bt", "secure in-transaction / lean SQL under the policy (2t / 1bt)", 1.1),
    ("7at", "7bt", "secure replay / PK SELECT under the policy (7at / 7bt)", 0.9),
]


def stem(mode, version):
    return ("latest" if mode == "default" else "quick") + ("" if version == "15" else f"-pg{version}")


def load_runs(path):
    with open(path, newline="") as f:
        return [{"table": r["table"], "id": r["id"], "round": int(r["round"]),
                 "tps": float(r["tps"])} for r in csv.DictReader(f)]


def header_facts(path):
    """PostgreSQL's version and the run's date from the head of <stem>.md."""
    try:
        with open(path) as f:
            head = f.read(2000)
    except OSError:
        return "?", "?"
    pg = re.search(r"PostgreSQL ([0-9][^\s,]*)", head)
    date = re.search(r"^# idempotency benchmark — (.+)$", head, re.M)
    return (pg.group(1) if pg else "?"), (date.group(1) if date else "?")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--mode", choices=("quick", "default"), default="quick")
    ap.add_argument("runs", nargs="+", help="VERSION:EXIT_STATUS:SECONDS")
    args = ap.parse_args()

    flag = " --quick" if args.mode == "quick" else ""
    lines = [f"# Key ratios by PostgreSQL version — "
             f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}", "",
             f"`test/bench/run{flag} --all-versions`: one run per major, one after another "
             "(15 on the host, 17 and 18 in Debian chroots); each ratio is taken inside each "
             "round, then the median over rounds (synchronous_commit on, 16 clients unless "
             "said). Full tables: "
             + ", ".join(f"[{stem(args.mode, v)}.md]({stem(args.mode, v)}.md)"
                         for v in ("15", "17", "18")) + ".", "",
             "| PostgreSQL | " + " | ".join(t for _, _, t, _ in KEY_RATIOS) + " | run |",
             "|---|" + "---:|" * len(KEY_RATIOS) + "---:|"]
    for spec in args.runs:
        version, rc, seconds = spec.split(":")
        s = stem(args.mode, version)
        if rc != "0":
            why = "skipped: cannot be set up here" if rc == "3" else f"failed (exit {rc})"
            lines.append(f"| {version} | " + " | ".join("–" for _ in KEY_RATIOS)
                         + f" | {why} |")
            continue
        try:
            runs = load_runs(os.path.join(args.results, f"{s}-runs.csv"))
        except OSError as e:
            lines.append(f"| {version} | " + " | ".join("–" for _ in KEY_RATIOS)
                         + f" | no results ({e.strerror}: {s}-runs.csv) |")
            continue
        pg, date = header_facts(os.path.join(args.results, f"{s}.md"))
        cells = []
        for a, b, _, target in KEY_RATIOS:
            r = ratio_between(runs, "on", a, b)
            cell = "–" if r is None else f"{r:.2f}×"
            if r is not None and target is not None and r < target:
                cell += f" (target {target:g}×)"
            cells.append(cell)
        lines.append(f"| {version} ({pg}) | " + " | ".join(cells)
                     + f" | {int(seconds) / 60:.1f} min |")
    lines += ["", "Throughput figures of a quick run move a lot on a shared 2-core machine; "
              "a ratio that differs between versions by more than the spread of the "
              "version's own rounds (in its full table) is the one to look into. The "
              "chroots bring their suite's Redis, which only the Redis rows of the full "
              "tables feel, none of these ratios.", ""]
    md = "\n".join(lines)
    out = os.path.join(args.results, f"{'quick' if args.mode == 'quick' else 'latest'}-versions.md")
    os.makedirs(args.results, exist_ok=True)
    with open(out, "w") as f:
        f.write(md)
    print()
    print(md)
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
