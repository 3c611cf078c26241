"""Medians over the alternating rounds, the targets of issues 5, 15 and 34
beside the figures, and the outputs: Markdown, CSV (summary and every run) and a PNG
bar chart drawn by gnuplot."""

import csv
import os
import statistics
import subprocess
from collections import defaultdict

from scenarios import BY_ID

TABLE_TITLES = {"on": "synchronous_commit = on (headline)",
                "off": "synchronous_commit = off"}


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def aggregate(runs):
    """One summary per (table, scenario): medians over rounds, and the ratio
    to the scenario's reference taken within each round, then the median."""
    by_key = defaultdict(list)
    units = {}
    for r in runs:
        by_key[(r["table"], r["id"])].append(r)
        units[(r["table"], r["id"], r["round"])] = r["tps"] * BY_ID[r["id"]].per_op

    out = {}
    for (table, sid), rs in by_key.items():
        s = BY_ID[sid]
        per = s.per_op
        rate = [r["tps"] * per for r in rs]
        ratios = []
        for r in rs:
            ref = units.get((table, s.ref, r["round"]))
            if ref:
                ratios.append(r["tps"] * per / ref)
        summ = {
            "table": table, "id": sid, "rounds": len(rs),
            "rate": med(rate),
            "ratio": med(ratios),
            "spread": (max(rate) - min(rate)) / med(rate) if len(rate) > 1 else 0.0,
            "p50_ms": med([r["p50_ms"] for r in rs]),
            "p99_ms": med([r["p99_ms"] for r in rs]),
        }
        for k in ("wal_b_op", "fpi_op", "cpu_us_op", "pg_cpu_us_op",
                  "redis_cpu_us_op", "exec_us_op"):
            summ[k] = med([r[k] / per for r in rs])
        if sid == "8":
            # executions happen in the same proportion inside the counted window
            summ["exec_rate"] = med([r["tps"] * r["executions"] / r["total_ops"] for r in rs])
            summ["exactly_once"] = all(r["exactly_once"] for r in rs)
            summ["deliveries_per_key"] = med([r["total_ops"] / max(r["keys"], 1) for r in rs])
        out[(table, sid)] = summ
    return out


def ratio_between(runs, table, a, b):
    """Median over rounds of rate(a) / rate(b), both from the same round."""
    rate = {(r["id"], r["round"]): r["tps"] * BY_ID[r["id"]].per_op
            for r in runs if r["table"] == table}
    rounds = sorted({r["round"] for r in runs})
    vals = [rate[(a, n)] / rate[(b, n)] for n in rounds
            if (a, n) in rate and (b, n) in rate]
    return med(vals)


def fmt(v, digits=0, suffix=""):
    if v is None:
        return "–"
    return f"{v:,.{digits}f}{suffix}"


def verdict(ok):
    return "PASS" if ok else "MISS"


def targets(summary, runs, sweep, storage):
    """(target, figure, PASS/MISS) rows for the targets of issues 5, 15, 34 and 48."""
    rows = []
    S = summary.get
    on = lambda sid: S(("on", sid))  # noqa: E731

    if on("0x") and on("0b"):
        r = on("0x")["ratio"]
        p99 = on("0x")["p99_ms"] / on("0b")["p99_ms"]
        redis = on("0r")["ratio"] if on("0r") else None
        rows.append(("0: articles' set-up, extension >= 0.97x without idempotency",
                     f"{r:.3f}x (Redis pattern here: {fmt(redis, 3, 'x')}; articles: "
                     "PostgreSQL 0.77x, Redis 0.975x)", verdict(r >= 0.97)))
        rows.append(("0: p99 <= 1.1x without idempotency",
                     f"{p99:.3f}x ({on('0x')['p99_ms']:.1f} vs {on('0b')['p99_ms']:.1f} ms)",
                     verdict(p99 <= 1.1)))
    if on("0f") and on("0cp"):
        r = ratio_between(runs, "on", "0f", "0cp")
        p99 = on("0f")["p99_ms"] / on("0cp")["p99_ms"]
        rows.append(("0, the recommended pattern (BEGIN + claim | work | INSERT + complete + "
                     "COMMIT) >= 0.97x the same transaction without idempotency (C driver)",
                     f"{r:.3f}x ({fmt(on('0f')['rate'])} vs {fmt(on('0cp')['rate'])} ops/s)",
                     verdict(r >= 0.97)))
        rows.append(("0, the recommended pattern: p99 <= 1.1x without idempotency",
                     f"{p99:.3f}x ({on('0f')['p99_ms']:.1f} vs {on('0cp')['p99_ms']:.1f} ms)",
                     verdict(p99 <= 1.1)))

    def vs(a, b, goal, stretch=None, label=""):
        r = ratio_between(runs, "on", a, b)
        if r is None:
            return
        status = verdict(r >= goal)
        if stretch is not None:
            status += f" (stretch {stretch}x: {verdict(r >= stretch)})"
        rows.append((label, f"{r:.3f}x ({fmt(on(a)['rate'])} vs {fmt(on(b)['rate'])} "
                            f"{BY_ID[a].unit}; CPU {fmt(on(a)['cpu_us_op'])} vs "
                            f"{fmt(on(b)['cpu_us_op'])} µs/op)",
                     status))

    def bound(a, b, label):
        r = ratio_between(runs, "on", a, b)
        if r is not None:
            rows.append((label, f"{r:.3f}x ({fmt(on(a)['rate'])} vs {fmt(on(b)['rate'])} "
                                f"{BY_ID[a].unit}; CPU {fmt(on(a)['cpu_us_op'])} vs "
                                f"{fmt(on(b)['cpu_us_op'])} µs/op)", "bound, not a target"))

    vs("2", "1b", 1.0, 1.1, "2 >= 1.0x 1b, the lean hand-written SQL")
    vs("2", "4", 1.0, 1.2, "2 >= 1.0x 4, the articles' SQL")
    vs("2", "5", 1.5, None, "2 >= 1.5x 5, the PL/pgSQL implementation")
    if on("2") and on("1b"):
        w2, w1b = on("2")["wal_b_op"], on("1b")["wal_b_op"]
        rows.append(("2: WAL bytes per operation <= 1b's",
                     f"{w2:.0f} vs {w1b:.0f} B/op", verdict(w2 <= w1b)))
    if on("2") and on("6"):
        r = on("2")["rate"] / on("6")["rate"]
        same = ratio_between(runs, "on", "2c", "6")
        rows.append(("2 >= 6 (Redis pattern) in business operations/s",
                     f"pgbench 2 vs C-driver 6: {r:.2f}x ({fmt(on('2')['rate'])} vs "
                     f"{fmt(on('6')['rate'])}); same C driver (2c vs 6): {fmt(same, 2, 'x')}",
                     verdict(r >= 1.0 and (same is None or same >= 1.0))))
    vs("7a", "7b", 0.8, 0.9, "7: replay >= 0.8x a plain primary-key SELECT (issue 15: 0.9x)")
    vs("11c", "11d", 20.0, None, "11, issues 15 and 39: one idem_claim_many of 500 keys >= 20x "
       "500 idem_claim calls from a client")
    vs("11a", "11b", 10.0, None, "11, issue 39: the same with 16 clients >= 10x")
    # not targets: what bounds the two above, the same rows by a plain INSERT
    bound("11e", "11d", "11, issue 39's bound: a plain INSERT of the same 500 rows (11e) / "
          "500 idem_claim calls, one client")
    bound("11f", "11b", "11, issue 39's bound: the same, 16 clients (11f / 11b)")
    vs("11c", "11e", 0.85, None, "11, issue 48: idem_claim_many of 500 keys (11c) >= 0.85x a plain "
       "INSERT of the same rows (11e), one client")
    vs("11a", "11f", 0.85, None, "11, issue 48: the same with 16 clients (11a / 11f) >= 0.85x")
    vs("2f", "6", 1.3, None, "issue 15: fewest round trips (2f) >= 1.3x the Redis pattern (6), "
       "same C driver")
    vs("2t", "2n", 0.97, None, "issue 34: secure in-transaction (2t, tenant isolation on) >= 0.97x "
       "the same role and statements with isolation off (2n)")
    vs("2t", "1bt", 1.1, None, "issue 34: secure in-transaction (2t) >= 1.1x the same statements "
       "written by hand under the same policy (1bt)")
    vs("7at", "7bt", 0.9, None, "issue 34: replay under isolation, per request (7at) >= 0.9x the "
       "primary-key SELECT under the same policy (7bt)")
    vs("7as", "7bs", 0.9, None, "issue 34: the same with the tenant set for the session, one "
       "statement each (7as / 7bs)")
    if sweep:
        r = sweep["sweep_rows_s"] / sweep["delete_rows_s"]
        rows.append(("9: sweep >= 0.8x a raw batched DELETE",
                     f"{r:.2f}x ({sweep['sweep_rows_s']:,.0f} vs "
                     f"{sweep['delete_rows_s']:,.0f} rows/s; {sweep['how']})",
                     verdict(r >= 0.8)))
        p = sweep["during_sweep"]["p99_ms"] / sweep["idle"]["p99_ms"]
        rows.append(("9, issue 39: claim p99 during the sweep <= 1.3x idle",
                     f"{p:.2f}x ({sweep['during_sweep']['p99_ms']:.2f} vs "
                     f"{sweep['idle']['p99_ms']:.2f} ms)", verdict(p <= 1.3)))
    if storage:
        e, o, t = storage["ext"], storage["once"], storage["two"]
        r = e["bytes_per_record"] / o["bytes_per_record"]
        rows.append(("10, issue 39: bytes per record <= 1.05x the plain table written once",
                     f"{r:.2f}x ({e['bytes_per_record']:.0f} vs {o['bytes_per_record']:.0f} B;"
                     f" plain table written like 1b: {t['bytes_per_record']:.0f} B)",
                     verdict(r <= 1.05)))
        R = storage["rounds"]
        rows.append((f"10: no growth over {R} fill-and-sweep rounds",
                     f"{e['growth'] * 100:+.1f}% total size from round 2 to round {R} "
                     f"(plain table written once: {o['growth'] * 100:+.1f}%; round 1 to 2: "
                     f"{e['growth_first'] * 100:+.1f}% vs {o['growth_first'] * 100:+.1f}%)",
                     verdict(e["growth"] <= 0.05)))
    return rows


def throughput_table(summary, table, ids, title):
    lines = [f"### {title}", "",
             "| # | scenario | round trips | throughput | × ref | p50 ms | p99 ms "
             "| WAL B/op | FPI/op | CPU µs/op | spread |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for sid in ids:
        s = summary.get((table, sid))
        if not s:
            continue
        sc = BY_ID[sid]
        ref = "" if sc.ref == sid else f" {sc.ref}"
        lines.append(
            f"| {sid} | {sc.title} | {sc.round_trips} | {fmt(s['rate'])} {sc.unit} "
            f"| {fmt(s['ratio'], 2)}{ref} | {fmt(s['p50_ms'], 2)} | {fmt(s['p99_ms'], 2)} "
            f"| {fmt(s['wal_b_op'])} | {fmt(s['fpi_op'], 3)} | {fmt(s['cpu_us_op'])} "
            f"| {fmt(s['spread'] * 100)}% |")
    return lines


ON_IDS = ["1", "1b", "2", "3", "4", "5", "8", "1c", "1cp", "2c", "2f", "6", "6a"]
READ_IDS = ["7a", "7b", "7c", "7d"]
S0_IDS = ["0b", "0x", "0c", "0r", "0cp", "0f"]
S11_IDS = ["11c", "11d", "11e", "11a", "11b", "11f"]
SECURE_IDS = ["2t", "2n", "1bt", "7at", "7bt", "7as", "7bs"]


def p99_rounds(latency):
    return ", ".join(f"{v:.2f}" for v in latency.get("p99_rounds", []))


def markdown(meta, summary, runs, sweep, storage, s11_note):
    L = [f"# idempotency benchmark — {meta['date']}", "",
         f"Machine: {meta['machine']}. PostgreSQL {meta['pg']}, Redis {meta['redis']}, "
         f"extension {meta['ext']} ({meta['git']}).", "",
         f"Command: `{meta['command']}` — {meta['rounds']} alternating rounds "
         f"(every scenario once per round, in the same order), {meta['durations']}; "
         f"16 clients unless said; medians over rounds. "
         f"Ratios (× ref) are taken inside each round, then the median. "
         f"Load average before/after: {meta['load_before']} / {meta['load_after']}"
         f"{meta['noise']}.", ""]
    L += ["Columns: throughput in business operations per second; × ref = ratio to the "
          "scenario named after it (1 = bare business transaction in pgbench, 1c = the same "
          "in the C driver, 7b = plain primary-key SELECT; in the secure rows 2n = the same "
          "role and statements without tenant isolation, 7bt and 7bs = the primary-key "
          "SELECT under the same policy); p50/p99 = latency of one "
          "operation; WAL B/op, FPI/op = WAL bytes and full-page images per operation; "
          "CPU µs/op = backend CPU (+ redis-server CPU for Redis rows) per operation; "
          "spread = (max − min)/median of throughput over rounds.", ""]
    L += throughput_table(summary, "on", ON_IDS, "Throughput, " + TABLE_TITLES["on"])
    L += [""]
    L += throughput_table(summary, "on", READ_IDS, "Replay (scenario 7), read-only")
    L += [""]
    if any(summary.get(("on", sid)) for sid in SECURE_IDS):
        L += throughput_table(summary, "on", SECURE_IDS,
                              "The secure rows (issue 34): tenant isolation on, as the "
                              "application role of docs/privileges.md")
        L += ["", "2t, 2n and 1bt set the tenant with set_config('app.tenant', 'bench', true) "
              "in every transaction, as the packages' tenant_setting does; 2t and 1bt run "
              "where isolation is on (idem_set_tenant_isolation(true, 'app.tenant'); 1bt's "
              "table has the extension's policy copied), 2n where it is off. 7at and 7bt serve "
              "a replay per request as the packages do (BEGIN, set_config, the read, COMMIT); "
              "7as and 7bs set the tenant for the session (app.tenant in the connection's "
              "options) and make the one statement.", ""]
    L += throughput_table(summary, "off", ON_IDS, "Throughput, " + TABLE_TITLES["off"])
    L += [""]
    L += throughput_table(summary, "on", S0_IDS,
                          "Scenario 0: the seed articles' set-up (50 clients, 50 ms of work "
                          "inside the transaction)")
    L += [""]
    st = summary.get(("on", "8"))
    if st:
        L += ["### Scenario 8: duplicate storm", "",
              f"Every key delivered {st['deliveries_per_key']:.1f} times by concurrent clients "
              f"(extension, in-transaction, no retries of in_progress deliveries): "
              f"{fmt(st['rate'])} deliveries/s, {fmt(st['exec_rate'])} executions/s "
              f"(sync commit on); executions = completed records, i.e. exactly once: "
              f"{'yes' if st['exactly_once'] else 'NO'}.", ""]
    if sweep:
        L += ["### Scenario 9: sweeping an expired backlog", "",
              f"{sweep['rows']:,} expired completed records (36-byte keys, ~100-byte "
              f"responses), batches of {sweep['batch']}; claim latency from a light load "
              "(4 clients, 10 ms pause between requests, scenario 2's transaction) idle, "
              "during the sweep, during the DELETE; each figure the median of "
              f"{sweep.get('rounds', 1)} rounds (the p99 of each round in the last column).", "",
              "| cleaner | rows/s | seconds | claim p50 ms | claim p99 ms | p99 by round |",
              "|---|---:|---:|---:|---:|---|",
              f"| idle (no cleaner) | – | – | {sweep['idle']['p50_ms']:.2f} "
              f"| {sweep['idle']['p99_ms']:.2f} | {p99_rounds(sweep['idle'])} |",
              f"| extension: {sweep['how']} | {sweep['sweep_rows_s']:,.0f} "
              f"| {sweep['sweep_s']:.2f} | {sweep['during_sweep']['p50_ms']:.2f} "
              f"| {sweep['during_sweep']['p99_ms']:.2f} | {p99_rounds(sweep['during_sweep'])} |",
              f"| raw batched DELETE (same batches, keyset on expires_at) "
              f"| {sweep['delete_rows_s']:,.0f} | {sweep['delete_s']:.2f} "
              f"| {sweep['during_delete']['p50_ms']:.2f} "
              f"| {sweep['during_delete']['p99_ms']:.2f} | {p99_rounds(sweep['during_delete'])} |", ""]
    if storage:
        n, R = storage["rows"], storage["rounds"]
        L += ["### Scenario 10: storage", "",
              f"{n:,} records per round (36-byte keys, ~100-byte response), {R} rounds of "
              "fill → sweep/DELETE → VACUUM; sizes right after each fill. Growth is from "
              "round 2 to the last round: from round 1 to 2 every table grows alike, because "
              "VACUUM can recycle the B-tree pages it empties only in a later VACUUM.", "",
              "| table | B/record (round 1) | heap | indexes | B/record (round "
              f"{R}) | growth | total per round (kB) |",
              "|---|---:|---:|---:|---:|---:|---|"]
        names = {"ext": "idempotency_records via idem_claim + idem_complete",
                 "two": "plain table, same columns, INSERT + UPDATE (as 1b)",
                 "once": "plain table, same columns, final rows written once"}
        for k in ("ext", "two", "once"):
            e = storage[k]
            series = " ".join(f"{h['full']['total'] // 1024}" for h in storage["history"][k])
            L.append(f"| {names[k]} | {e['bytes_per_record']:.0f} "
                     f"| {e['first']['heap'] / n:.0f} | {e['first']['indexes'] / n:.0f} "
                     f"| {e['bytes_per_record_last']:.0f} | {e['growth'] * 100:+.1f}% "
                     f"| {series} |")
        L += [""]
    L += ["### Scenario 11: batch claims", ""]
    if s11_note:
        L += [s11_note, ""]
    else:
        L += throughput_table(summary, "on", S11_IDS, "one idem_claim_many(500 keys) vs "
                              "500 idem_claim calls (keys/s)")
        L += ["", "With one client (11c, 11d) the figure is the time a consumer waits for its "
              "batch; with 16 clients (11a, 11b) both sides compete for the same 2 cores as the "
              "server, so the ratio approaches the ratio of server CPU per key. 11e and 11f bound both: "
              "the same rows written by one plain INSERT into a table of the same shape, with "
              "nothing checked and nothing returned; issue 48 asks idem_claim_many for at least 0.85x "
              "of it (11c / 11e, 11a / 11f).", ""]
    L += ["### Targets (issues 5, 15, 34 and 48; printed, not asserted)", "",
          "| target | figure | result |", "|---|---|---|"]
    for t, f, v in targets(summary, runs, sweep, storage):
        L.append(f"| {t} | {f} | {v} |")
    L += ["", "### How it is measured", ""] + [f"- {n}" for n in meta["notes"]] + [""]
    return "\n".join(L)


CSV_FIELDS = ["table", "id", "scenario", "unit", "round_trips", "rounds", "rate", "ratio",
              "ref", "p50_ms", "p99_ms", "wal_b_op", "fpi_op", "cpu_us_op", "pg_cpu_us_op",
              "redis_cpu_us_op", "exec_us_op", "spread"]


def write_csv(path, summary, sweep, storage):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for (table, sid), s in sorted(summary.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            sc = BY_ID[sid]
            w.writerow([table, sid, sc.title, sc.unit, sc.round_trips, s["rounds"],
                        round(s["rate"], 1), round(s["ratio"], 4) if s["ratio"] else "",
                        sc.ref, round(s["p50_ms"], 3), round(s["p99_ms"], 3),
                        round(s["wal_b_op"], 1), round(s["fpi_op"], 4),
                        round(s["cpu_us_op"], 1), round(s["pg_cpu_us_op"], 1),
                        round(s["redis_cpu_us_op"], 1), round(s["exec_us_op"], 1),
                        round(s["spread"], 4)])
        if sweep:
            w.writerow(["sweep", "9", "sweeper: " + sweep["how"], "rows/s", "", 1,
                        round(sweep["sweep_rows_s"]), round(sweep["sweep_rows_s"]
                                                           / sweep["delete_rows_s"], 4),
                        "9-delete", sweep["during_sweep"]["p50_ms"],
                        sweep["during_sweep"]["p99_ms"]] + [""] * 7)
            w.writerow(["sweep", "9-delete", "raw batched DELETE", "rows/s", "", 1,
                        round(sweep["delete_rows_s"]), 1.0, "9-delete",
                        sweep["during_delete"]["p50_ms"], sweep["during_delete"]["p99_ms"]]
                       + [""] * 7)
            w.writerow(["sweep", "9-idle", "claims with no cleaner", "", "", 1, "", "", "",
                        sweep["idle"]["p50_ms"], sweep["idle"]["p99_ms"]] + [""] * 7)
        if storage:
            for k in ("ext", "two", "once"):
                e = storage[k]
                w.writerow(["storage", f"10-{k}", k, "bytes/record", "", storage["rounds"],
                            round(e["bytes_per_record"], 1),
                            round(e["bytes_per_record"]
                                  / storage["once"]["bytes_per_record"], 4),
                            "10-once", "", "", "", "", "", "", "", "",
                            round(e["growth"], 4)])


def write_runs_csv(path, runs):
    keys = ["table", "id", "round", "run_id", "ops", "total_ops", "tps", "p50_ms", "p99_ms",
            "wal_b_op", "fpi_op", "cpu_us_op", "pg_cpu_us_op", "redis_cpu_us_op",
            "exec_us_op", "executions", "keys", "load1"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for r in runs:
            w.writerow(r)


CHART_ROWS = [("1b", "1", "1b lean SQL"), ("2", "1", "2 extension in-tx"),
              ("3", "1", "3 extension two-phase"),
              ("4", "1", "4 articles' SQL"), ("5", "1", "5 PL/pgSQL"),
              ("8", "1", "8 dup storm (deliveries)"),
              ("2c", "1c", "2c extension in-tx (C driver)"),
              ("2f", "1c", "2f extension, 2 round trips (C)"),
              ("6", "1c", "6 Redis + PG (C driver)"), ("6a", "1c", "6a Redis AOF + PG (C)"),
              ("0x", "0b", "0 extension, 50 ms work"), ("0r", "0c", "0 Redis, 50 ms work"),
              ("0f", "0cp", "0 extension, 2 round trips, 50 ms"),
              ("7a", "7b", "7a replay vs PK SELECT"),
              ("2t", "2n", "2t secure in-tx vs isolation off"),
              ("2t", "1bt", "2t secure in-tx vs 1bt, same policy"),
              ("7at", "7bt", "7at secure replay vs PK SELECT")]


def gnuplot_terminal():
    res = subprocess.run(["gnuplot", "-e", "set terminal"], capture_output=True, text=True)
    return "pngcairo" if "pngcairo" in (res.stdout + res.stderr) else "png"


def write_chart(path, summary, runs, bench_dir, subtitle):
    """The PNG bar chart of the ratios; False (and no file) when the runs
    have none of them (an --only run)."""
    rows = []
    for sid, ref, label in CHART_ROWS:
        vals = []
        for table in ("on", "off"):
            r = ratio_between(runs, table, sid, ref)
            vals.append("?" if r is None else f"{r:.3f}")
        rows.append(f"{label}\t{vals[0]}\t{vals[1]}\n")
    if all(row.endswith("\t?\t?\n") for row in rows):
        return False
    data = path + ".dat"
    with open(data, "w") as f:
        f.writelines(rows)
    term = gnuplot_terminal()
    res = subprocess.run(
        ["gnuplot", "-e",
         f"datafile='{data}'; outfile='{path}'; term='{term}'; subtitle='{subtitle}'",
         os.path.join(bench_dir, "chart.gnuplot")],
        capture_output=True, text=True)
    os.remove(data)
    if res.returncode != 0:
        raise RuntimeError("gnuplot failed: " + res.stderr)
    return True
