"""The idempotency benchmark (issue 5): every scenario side by side on one
machine, in alternating rounds, against throwaway servers.

Run through test/bench/run (as a user that may run PostgreSQL).  Outline:
  1. initdb a PostgreSQL cluster (PG_MAJOR, default 15) in a temporary directory, preloading
     idempotency and pg_stat_statements; start two redis-servers (default
     persistence, AOF everysec); build the C load driver.
  2. Throughput rounds: every scenario once per round, in the same order
     (A B C ... A B C ...), synchronous_commit on then off; medians.
     The secure rows (issue 34) run in databases of their own with tenant
     isolation on or off, as an application role (lib/tenant_isolation.py).
  3. Scenario 9 (sweep backlog) and 10 (storage), each in its own database.
  4. Markdown, CSV and a PNG chart under test/bench/results/."""

import argparse
import datetime
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import report                      # noqa: E402
import scenario_storage            # noqa: E402
import scenario_sweep              # noqa: E402
import tenant_isolation            # noqa: E402
from measure import Meter, driver_cmd, run_driver, run_pgbench   # noqa: E402
from scenarios import APP_ROLE, BY_ID, claim_single_script      # noqa: E402
from servers import PG_BIN, PG_MAJOR, RESULTS_SUFFIX, PgCluster, Redis, run  # noqa: E402

BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_DIR = os.path.dirname(os.path.dirname(BENCH_DIR))
# the tree's docs/privileges.md (test/bench/run, as root, runs a copy of
# test/bench alone and says where the tree is)
SOURCE_DIR = os.environ.get("IDEM_BENCH_REPO") or REPO_DIR

# ~100 bytes, the stored response of every scenario that stores one
RESPONSE = ('{"status": "succeeded", "amount_charged": 4200, "currency": "EUR", '
            '"transaction_id": "txn_5f1d7c2a9b"}')

PROFILES = {
    # seconds per run (pgbench -T): write scenarios with synchronous_commit on,
    # read-only and batch scenarios, scenario 0, every run with it off.  The
    # first `warm` seconds of each run are left out of throughput and latency.
    # default: more, shorter rounds rather than fewer long ones, so that a
    # burst of outside load hits every scenario of a round alike
    "default": dict(rounds=4, durations={"write": 4, "read": 2, "s0": 5, "off": 3},
                    warm=1.0, seed_rows=20_000, replay_keys=100_000, sweep_rows=1_000_000,
                    idle_s=4, sweep_rounds=3, storage_rows=10_000, storage_rounds=10,
                    shared_buffers="2GB"),
    # quick: the synchronous_commit=off table only for the main rows
    "quick": dict(rounds=2, durations={"write": 1, "read": 1, "s0": 2, "off": 1},
                  warm=0.3, seed_rows=5_000, replay_keys=20_000, sweep_rows=100_000, idle_s=2,
                  sweep_rounds=1, storage_rows=2_000, storage_rounds=3, shared_buffers="1GB",
                  off_only=["1", "1b", "2", "1c", "2c", "6"]),
}

ORDER_ON = ["1", "1b", "2", "3", "4", "5", "8", "1c", "1cp", "2c", "2f", "6", "6a",
            "7a", "7b", "7c", "7d", "2t", "2n", "1bt", "7at", "7bt", "7as", "7bs",
            "11a", "11b", "11c", "11d", "11e", "11f"]
ORDER_OFF = ["1", "1b", "2", "3", "4", "5", "8", "1c", "1cp", "2c", "2f", "6", "6a"]
ORDER_S0 = ["0b", "0x", "0c", "0r", "0cp", "0f"]


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Bench:
    def __init__(self, args):
        self.args = args
        self.profile = dict(PROFILES["quick" if args.quick else "default"])
        if args.rounds:
            self.profile["rounds"] = args.rounds
        self.work = tempfile.mkdtemp(prefix="idem-bench-")
        self.logdir = os.path.join(self.work, "pgbench-logs")
        os.makedirs(self.logdir)
        self.run_id = 0
        self.runs = []
        self.redis = {}
        self.pg = None
        self.meter = None
        self.driver = None

    def next_run_id(self):
        self.run_id += 1
        return self.run_id

    # ---------------------------------------------------------------- setup
    def start(self):
        base = self.args.port_base
        self.pg = PgCluster(self.work, base, {
            "shared_preload_libraries": "'idempotency,pg_stat_statements'",
            "max_connections": 120,
            "shared_buffers": self.profile["shared_buffers"],
            "max_locks_per_transaction": 256,    # 16 clients x 500-key batches
            "synchronous_commit": "on",          # per run via PGOPTIONS
            # one CHECKPOINT before the tables are filled, none after it:
            # full-page images would otherwise land on whichever scenario runs
            "checkpoint_timeout": "'1d'",
            "max_wal_size": "'64GB'",
            # nothing in the background: a run measures only its own work
            "autovacuum": "off",
            "idempotency.sweep_interval": 0,
            "jit": "off",
            "log_checkpoints": "on",
            "pg_stat_statements.track": "top",
        })
        log(f"starting PostgreSQL on 127.0.0.1:{base} in {self.work}")
        self.pg.start()
        if not self.runs_rounds():
            # --only 9 and/or 10: none of the rounds' servers, tables or roles
            if self.special("9"):
                self.build_driver()
            admin = self.pg.connect("postgres")
            admin.cursor().execute("CREATE DATABASE bench")
            admin.close()
            self.meter = Meter(self.pg, "bench")
            self.meter.q("CREATE EXTENSION idempotency")
            self.has_claim_many = False
            return
        for name, port, aof in (("default", base + 10, False), ("aof", base + 11, True)):
            self.redis[name] = Redis(self.work, port, aof)
            self.redis[name].start()
        log(f"redis-server on 127.0.0.1:{base + 10} (default persistence) and "
            f":{base + 11} (AOF everysec)")

        self.build_driver()

        admin = self.pg.connect("postgres")
        for db in ("bench", "bench_replay") + tenant_isolation.DATABASES:
            admin.cursor().execute(f"CREATE DATABASE {db}")
            self.pg.psql_file(db, os.path.join(BENCH_DIR, "sql", "schema.sql"))
            if db not in tenant_isolation.DATABASES:
                self.pg.psql_file(db, os.path.join(BENCH_DIR, "sql", "plpgsql_contract.sql"))
        admin.close()
        tenant_isolation.create_role(self.pg)
        for db in tenant_isolation.DATABASES:
            tenant_isolation.prepare(self.pg, db, BENCH_DIR, SOURCE_DIR)
        # The one checkpoint: every page written from here on was created
        # after it, so no run pays (or is charged) full-page images for pages
        # another scenario or the setup left behind.
        admin = self.pg.connect("postgres")
        admin.cursor().execute("CHECKPOINT")
        admin.close()
        for db in ("bench", "bench_tenant", "bench_tenant_off"):
            self.pg.psql_file(db, os.path.join(BENCH_DIR, "sql", "seed_rows.sql"),
                              {"rows": self.profile["seed_rows"]})

        # scenario 7's stored responses, in their own databases
        for db in ("bench_replay", "bench_tenant_replay"):
            self.store_replays(db)
        tenant_isolation.check(self.pg)

        self.meter = Meter(self.pg, "bench")
        m = self.meter
        self.has_claim_many = m.q1("SELECT to_regproc('idem_claim_many') IS NOT NULL")
        claim_single_script(os.path.join(self.work, "11-claim-single.pgbench"))

    def build_driver(self):
        self.driver = os.path.join(self.work, "load_driver")
        incdir = run([os.path.join(PG_BIN, "pg_config"), "--includedir"]).strip()
        run(["cc", "-O2", "-Wall", "-o", self.driver,
             os.path.join(BENCH_DIR, "load_driver.c"), f"-I{incdir}",
             "-lpq", "-lhiredis", "-lpthread"])

    def store_replays(self, db):
        replay = self.pg.connect(db)
        with replay.cursor() as cur:
            cur.execute(
                "INSERT INTO idempotency_records (tenant_id, key, token, expires_at, "
                "lease_expires_at, created_at, updated_at, ttl, status, response) "
                "SELECT 'replay', g::text, g, now() + interval '1 day', NULL, now(), now(), "
                "interval '1 day', 'completed', %s::jsonb FROM generate_series(1, %s) g",
                (RESPONSE, self.profile["replay_keys"]))
            for table in ("replay_plain", "plpg_records"):
                cur.execute(f"INSERT INTO {table} SELECT * FROM idempotency_records")
            cur.execute("VACUUM ANALYZE")
        replay.close()

    def stop(self):
        if self.meter:
            try:
                self.meter.conn.close()
            except Exception:
                pass
        for r in self.redis.values():
            r.stop()
        if self.pg:
            self.pg.stop()
        if self.args.keep:
            log(f"kept {self.work}")
        else:
            shutil.rmtree(self.work, ignore_errors=True)

    # ------------------------------------------------------------- one run
    def script_path(self, name):
        generated = os.path.join(self.work, name)
        if os.path.exists(generated):
            return generated
        return os.path.join(BENCH_DIR, "pgbench", name)

    def run_one(self, table, sid, round_no, seconds=None, warm=None, record=True):
        s = BY_ID[sid]
        if seconds is None:
            seconds = self.profile["durations"]["off" if table == "off" else s.duration]
        run_id = self.next_run_id()
        options = "-c synchronous_commit=off" if table == "off" else ""
        if s.tenant:
            options += f" -c app.tenant={s.tenant}"
        redis = self.redis.get(s.redis) if s.redis else None
        tenant = f"storm-{run_id}"
        m = self.meter
        if sid == "8":
            m.q("TRUNCATE storm_payments")
        load1 = os.getloadavg()[0]
        m.begin(redis)
        db = s.db or ("bench_replay" if sid.startswith("7") else "bench")
        warm = self.profile["warm"] if warm is None else warm
        if s.kind == "pgbench":
            variables = {"run": run_id, "ctr": 0, "resp": RESPONSE,
                         "nreplay": self.profile["replay_keys"], "tenant": tenant}
            r = run_pgbench(self.pg, db, self.script_path(s.script), s.clients,
                            int(seconds), variables, self.logdir, f"{table}-{sid}",
                            options=options, warmup=warm, user=s.role or None)
        else:
            cmd = driver_cmd(self.driver, self.pg, db, s.mode, s.clients, run_id,
                             RESPONSE, redis_port=redis.port if redis else None,
                             seconds=seconds, work_ms=s.work_ms, warmup=warm)
            r = run_driver(cmd, options)
        r.update(m.end(r["total_ops"]))
        r.update(table=table, id=sid, round=round_no, run_id=run_id, load1=load1)
        if sid == "8":
            r["executions"] = m.q1("SELECT count(*) FROM storm_payments")
            r["keys"] = m.q1("SELECT count(*) FROM idempotency_records "
                             "WHERE tenant_id = %s", (tenant,))
            completed = m.q1("SELECT count(*) FROM idempotency_records "
                             "WHERE tenant_id = %s AND status = 'completed'", (tenant,))
            r["exactly_once"] = r["executions"] == completed == r["keys"]
        if record:
            self.runs.append(r)
        return r

    # --------------------------------------------------------------- rounds
    def order(self):
        skip = set()
        if not self.has_claim_many:
            skip |= {"11a", "11b", "11c", "11d", "11e", "11f"}
        only = set(self.args.only.split(",")) if self.args.only else None

        def sel(ids):
            return [i for i in ids if i not in skip and (only is None or i in only)]

        off = [i for i in ORDER_OFF if i in self.profile.get("off_only", ORDER_OFF)]
        return ([("on", i) for i in sel(ORDER_ON)] + [("off", i) for i in sel(off)]
                + [("on", i) for i in sel(ORDER_S0)])

    def runs_rounds(self):
        """Do any throughput rounds run (not with --only 9, 10 or 9,10)?"""
        return self.args.only is None or any(
            i not in ("9", "10") for i in self.args.only.split(","))

    def special(self, sid):
        """Does scenario 9 or 10 run?  Not with --skip-special; with --only,
        when it is named (with --only 10 alone no round runs either)."""
        if self.args.skip_special:
            return False
        return self.args.only is None or sid in self.args.only.split(",")

    def rounds(self):
        order = self.order()
        if not order:
            return
        for n in range(1, self.profile["rounds"] + 1):
            log(f"round {n}/{self.profile['rounds']}: {len(order)} runs")
            for table, sid in order:
                r = self.run_one(table, sid, n)
                unit = BY_ID[sid].unit
                log(f"  {table:3} {sid:4} {r['tps'] * BY_ID[sid].per_op:10,.0f} {unit:13} "
                    f"p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  "
                    f"WAL {r['wal_b_op']:6.0f} B/op  CPU {r['cpu_us_op']:6.0f} µs/op")


def machine():
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    osname = platform.system()
    if os.environ.get("IDEM_BENCH_SYSTEM"):          # run inside a chroot (test/bench/run)
        return f"{os.cpu_count()} cores ({cpu}), {mem_kb / 1048576:.0f} GiB RAM, " \
               + os.environ["IDEM_BENCH_SYSTEM"]
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    osname = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({cpu}), {mem_kb / 1048576:.0f} GiB RAM, {osname}"


def git_describe():
    if os.environ.get("IDEM_BENCH_GIT"):
        return os.environ["IDEM_BENCH_GIT"]
    res = subprocess.run(["git", "-C", REPO_DIR, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    if res.returncode != 0:
        return "not a git checkout"
    dirty = subprocess.run(["git", "-C", REPO_DIR, "status", "--porcelain", "--", "src"],
                           capture_output=True, text=True).stdout.strip()
    return f"commit {res.stdout.strip()}" + (" + uncommitted changes in src/" if dirty else "")


def main():
    ap = argparse.ArgumentParser(
        description="idempotency benchmark (issue 5)",
        epilog="test/bench/run also takes --pg NN (PostgreSQL NN; 17 and 18 run in a Debian "
               "chroot, results in quick-pgNN.* or latest-pgNN.*) and --all-versions (15, 17 "
               "and 18 in turn, key ratios side by side in quick-versions.md or "
               "latest-versions.md).")
    ap.add_argument("--quick", action="store_true", help="fewer, shorter rounds (< 3 min)")
    ap.add_argument("--port-base", type=int,
                    default=int(os.environ.get("IDEM_BENCH_PORT_BASE", "55500")),
                    help="PostgreSQL on this port, Redis on +10 and +11")
    ap.add_argument("--results", default=os.path.join(BENCH_DIR, "results"))
    ap.add_argument("--rounds", type=int, help="override the number of rounds")
    ap.add_argument("--only", help="comma-separated scenario ids, 9 (sweep) and 10 (storage) "
                    "included: only these run (for debugging; --only 10 measures storage alone)")
    ap.add_argument("--skip-special", action="store_true", help="skip scenarios 9 and 10")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.time()
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    bench = Bench(args)
    sweep = storage = None
    errors = []
    try:
        bench.start()
        bench.rounds()
        if bench.special("9"):
            try:
                sweep = scenario_sweep.run(bench.pg, BENCH_DIR, bench.driver, RESPONSE,
                                           bench.profile["sweep_rows"],
                                           bench.profile["idle_s"], bench.next_run_id, log,
                                           bench.profile["sweep_rounds"])
            except Exception as e:                   # report, keep the rest
                errors.append(f"scenario 9 failed: {e}")
                traceback.print_exc()
        if bench.special("10"):
            try:
                storage = scenario_storage.run(bench.pg, BENCH_DIR, RESPONSE,
                                               bench.profile["storage_rows"],
                                               bench.profile["storage_rounds"], log)
            except Exception as e:
                errors.append(f"scenario 10 failed: {e}")
                traceback.print_exc()
        pg_version = bench.meter.q1("SHOW server_version")
        ext_version = bench.meter.q1(
            "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")
        redis_version = (bench.redis["default"].version() if bench.redis
                         else "not started")
    finally:
        bench.stop()

    p = bench.profile
    d = p["durations"]
    mode = "quick" if args.quick else "default"
    meta = {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "machine": machine(),
        "pg": pg_version, "redis": redis_version, "ext": ext_version, "git": git_describe(),
        "command": "test/bench/run" + (" --quick" if args.quick else "")
                   + (f" --pg {PG_MAJOR}" if RESULTS_SUFFIX else "")
                   + (f" --only {args.only}" if args.only else ""),
        "rounds": p["rounds"],
        "durations": (f"{d['write']} s per write run with synchronous_commit on, {d['off']} s "
                      f"with it off, {d['read']} s per read-only or batch run, {d['s0']} s "
                      f"per scenario-0 run, of which the first {p['warm']} s are left out "
                      "(connection warm-up)"),
        "load_before": load_before,
        "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "noise": "; the machine was shared with other work during the run, so absolute "
                 "figures move between runs and the in-round ratios are the ones to quote"
                 if max((r["load1"] for r in bench.runs), default=0) > (os.cpu_count() or 2) + 1
                 else "",
        "notes": notes(p),
    }
    s11_note = (None if bench.has_claim_many else
                "skipped: idem_claim_many not installed" if bench.runs_rounds() else
                f"not run (--only {args.only})")
    if s11_note:
        print(s11_note)
    summary = report.aggregate(bench.runs)
    md = report.markdown(meta, summary, bench.runs, sweep, storage, s11_note)
    if errors:
        md += "\n### Errors\n\n" + "\n".join(f"- {e}" for e in errors) + "\n"

    os.makedirs(args.results, exist_ok=True)
    # a run of some scenarios (--only) never replaces a full run's results
    stem = ("latest" if mode == "default" else "quick") + RESULTS_SUFFIX \
        + ("-only" if args.only else "")
    out = {ext: os.path.join(args.results, f"{stem}.{ext}") for ext in ("md", "csv", "png")}

    with open(out["md"], "w") as f:
        f.write(md + "\n")
    report.write_csv(out["csv"], summary, sweep, storage)
    report.write_runs_csv(os.path.join(args.results, f"{stem}-runs.csv"), bench.runs)
    if not report.write_chart(out["png"], summary, bench.runs, BENCH_DIR,
                              f"{meta['machine']}; PostgreSQL {pg_version}; {meta['command']}"):
        del out["png"]             # an --only run without a ratio of the chart
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for ext, path in out.items():
        shutil.copy(path, os.path.join(args.results, f"{stamp}-{mode}{RESULTS_SUFFIX}"
                                       f"{'-only' if args.only else ''}.{ext}"))

    print()
    print(md)
    print()
    shown = os.environ.get("IDEM_BENCH_RESULTS_SHOWN", args.results)
    print(f"results: " + ", ".join(os.path.join(shown, os.path.basename(out[e]))
                                   for e in out)
          + f" ({(time.time() - started) / 60:.1f} min)")
    return 1 if errors else 0


def notes(p):
    return [
        f"Servers: a throwaway PostgreSQL {PG_MAJOR} cluster (initdb in a temporary directory, "
        "shared_preload_libraries = 'idempotency,pg_stat_statements', shared_buffers = "
        f"{p['shared_buffers']}, autovacuum off, one CHECKPOINT before the tables are filled "
        "and none during the rounds) and "
        "two throwaway redis-servers (Debian package; default RDB persistence, and AOF "
        "appendfsync everysec), all on 127.0.0.1 over TCP. After a Redis run the bench waits "
        "for any background save to end before the next scenario.",
        "Load: pgbench -M prepared (-j 2) with the scripts in test/bench/pgbench/; the Redis "
        "pattern and its twins (1c, 1cp, 2c, 2f, 0c, 0r) by test/bench/load_driver.c (libpq + "
        "hiredis, one thread and connection per client). Keys are unique per transaction: "
        "run id × 10^12 + client id × 10^9 + a per-client counter, so nothing collides. "
        "Every stored response is the same ~100-byte JSON, sent as a parameter.",
        "Fair tables: the hand-written alternatives (1b, 4, 5, 7b) use tables made with "
        "LIKE idempotency_records INCLUDING ALL — the same columns, CHECK constraints, "
        "primary key (tenant_id, key) and expires_at index as the extension's table.",
        f"Starting state: every records table of the write scenarios holds {p['seed_rows']:,} "
        "completed records (payments as many rows), analyzed (test/bench/sql/seed_rows.sql). "
        "A statement prepared on an empty, analyzed table gets a sequential-scan plan that "
        "the backend keeps while the table grows; that would hit pgbench's statements, "
        "PL/pgSQL and the extension's SPI plans alike.",
        "Latency: p50/p99 of single operations, from pgbench's per-transaction log "
        "(--log) or timed by the C driver; the median over rounds.",
        "Server cost per operation: WAL bytes = pg_current_wal_lsn() delta over the run; "
        "FPI = pg_stat_wal.wal_fpi delta; CPU = CPU time of the run's backends (read from "
        "/proc as the postmaster's reaped-children time, which includes connection start-up) "
        "plus redis-server's CPU for Redis rows; pg_stat_statements execution time per "
        "operation is in the CSV (exec_us_op).",
        "2f (fewest round trips) is driven by the C load driver in libpq pipeline mode: "
        "BEGIN + idem_claim flushed together (one round trip, transaction left open), then "
        "INSERT + idem_complete + COMMIT + sync (a second round trip). pgbench cannot do "
        "this: it refuses \\gset inside a pipeline.",
        "The secure rows (issue 34: 2t, 2n, 1bt, 7at, 7bt, 7as, 7bs) run in databases of their "
        "own, made like bench and bench_replay and seeded alike: bench_tenant and "
        "bench_tenant_replay with idem_set_tenant_isolation(true, 'app.tenant') and the "
        "extension's policy copied onto lean_records and replay_plain, bench_tenant_off without "
        f"isolation. They connect as {APP_ROLE}, which holds exactly the application role's "
        "GRANT lines of docs/privileges.md (read from the page) and what the business and "
        "hand-written tables need; before the rounds the bench checks that it bypasses nothing "
        "(no superuser, not the owner, no BYPASSRLS; without the tenant a call is refused with "
        "55000 and no seeded row is visible).",
        "Scenario 8 counts executions (business rows written) and checks they equal the "
        "completed records: each key executed exactly once.",
        "Scenario 9 loads the backlog directly (final rows, VACUUM ANALYZE, CHECKPOINT) "
        "before each cleaner, so both start alike; the raw DELETE uses the same batch size "
        "and a keyset on expires_at, committing per batch. The sweeper's span runs from the "
        "first moment its worker reports a batch in pg_stat_activity to its exit (read every "
        "10 ms from shared memory; an earlier probe of the table's expires_at index walked the "
        "entries the sweep had just deleted, 50 times a second, and cost the claims more than "
        "the sweep did). Idle, sweep and DELETE run in each of 3 rounds (1 in --quick), each "
        "figure the median.",
        "This is a 2-core machine: pgbench, the C driver and redis-server share the cores "
        "with PostgreSQL, so absolute numbers are bounded by the client side too. The server "
        "cost columns (WAL, CPU per operation) are the figures that carry over to a big server.",
    ]


if __name__ == "__main__":
    sys.exit(main())
