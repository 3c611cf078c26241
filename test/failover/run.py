#!/usr/bin/env python3
"""Exactly once through a failover, and through connections lost while a
COMMIT is in flight.  Prints "ok ..." / "FAIL ..." lines and figures; the
suites (test/suites/72-failover, 73-lost-commit) count them.

    run.py failover --mode remote_apply|on|async --port-base P --dir D
    run.py lost-commit --port-base P --dir D

failover: a primary (P) and a streaming standby (P+1, connected through a
proxy on P+2 so that the test can stall replication), the library preloaded
on both.  Concurrent clients deliver keys (claim + business row + complete
in one transaction), connecting with target_session_attrs=read-write to
both servers.  Mid-load the primary is stopped with `pg_ctl -m immediate`
(every process gets SIGQUIT and exits at once, as in a crash), the standby
promoted, and the clients carry on against the new primary; then every key
is delivered once more, as a broker redelivers after a failover.  With
asynchronous replication the replication stream is stalled for a moment
before the crash, which opens the loss window the test measures.

lost-commit: one server (P), PgBouncer in transaction pooling (P+1), a proxy
in front of each (P+2 to the server, P+3 to PgBouncer) that drops
connections around COMMIT, and a killer that runs pg_terminate_backend on
sessions whose COMMIT is held open by a deferred trigger.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import psycopg2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checker   # noqa: E402
import workload  # noqa: E402
from commit_faults import Killer, start_pgbouncer   # noqa: E402
from proxy import Proxy   # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
results = {"passed": 0, "failed": 0}


def ok(msg):
    results["passed"] += 1
    print("ok   " + msg, flush=True)


def fail(msg):
    results["failed"] += 1
    print("FAIL " + msg, flush=True)


def expect(cond, msg, detail=""):
    if cond:
        ok(msg)
    else:
        fail(msg + (": " + detail if detail else ""))
    return cond


def sh(*args, **kw):
    return subprocess.run(args, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, **kw).stdout


def dsn(port, db="app", **extra):
    parts = ["host=127.0.0.1", "port=%s" % port, "dbname=%s" % db, "user=postgres",
             "sslmode=disable", "connect_timeout=3"]
    parts += ["%s=%s" % kv for kv in extra.items()]
    return " ".join(parts)


def query(port, sql, db="app", args=None):
    conn = psycopg2.connect(dsn(port, db))
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute(sql, args)
    rows = cur.fetchall() if cur.description else None
    conn.close()
    return rows


def poll(port, sql, timeout, db="app"):
    """Wait until sql returns true; returns whether it did."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            if query(port, sql, db)[0][0]:
                return True
        except psycopg2.Error:
            pass
        time.sleep(0.1)
    return False


class Server:
    def __init__(self, root, name, port):
        self.data = os.path.join(root, name)
        self.log = os.path.join(root, name + ".log")
        self.port = port
        self.running = False

    def initdb(self, conf):
        sh("initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8",
           "--locale=C")
        self.append_conf(conf)

    def append_conf(self, conf):
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write(conf)

    def start(self):
        sh("pg_ctl", "-D", self.data, "-l", self.log, "-w", "start")
        self.running = True

    def stop(self, mode="fast"):
        if self.running:
            subprocess.run(["pg_ctl", "-D", self.data, "-m", mode, "-w", "stop"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.running = False


def base_conf(port, root):
    return """
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = '%s'
shared_preload_libraries = 'idempotency'
max_connections = 60
fsync = off
lc_messages = 'C'
log_min_messages = warning
""" % (port, root)


def settle_figures(stats):
    return {k: v for k, v in stats.items() if k != "lock"}


def run_checker(name, root, history, state, lost_port):
    hist_path = os.path.join(root, name + "-history.jsonl")
    state_path = os.path.join(root, name + "-state.json")
    workload.write_history(hist_path, history)
    with open(state_path, "w") as f:
        json.dump(state, f)
    violations, figures = checker.check(history, state, lost_port)
    for v in violations[:20]:
        print("  VIOLATION " + v)
    expect(not violations, "%s: the checker finds 0 violations over %d calls on %d keys"
           % (name, figures.get("calls", 0), figures.get("keys", 0)),
           "%d violations" % len(violations))
    args = [sys.executable, os.path.join(HERE, "selftest.py"), hist_path, state_path]
    if lost_port is not None:
        args += ["--allow-loss-before-port", str(lost_port)]
    out = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    for line in out.splitlines():
        if line.startswith("ok "):
            ok(name + ": " + line[5:])
        elif line.startswith("FAIL "):
            fail(name + ": " + line[5:])
        else:
            fail(name + ": checker self-test: " + line)
    return figures


# ---------------------------------------------------------------- failover

def failover(args):
    mode = args.mode
    root = args.dir
    primary = Server(root, "primary", args.port_base)
    standby = Server(root, "standby", args.port_base + 1)
    proxy = None
    started = time.time()
    try:
        sync_names = "'standby1'" if mode != "async" else "''"
        commit_level = mode if mode != "async" else "on"
        primary.initdb(base_conf(primary.port, root) + """
wal_level = replica
max_wal_senders = 4
synchronous_commit = %s
# the primary does not sweep: its stale claims must reach the promoted node
idempotency.sweep_interval = 0
""" % commit_level)
        primary.start()
        query(primary.port, "CREATE DATABASE app", db="postgres")
        conn = psycopg2.connect(dsn(primary.port))
        conn.autocommit = True
        conn.cursor().execute(workload.SETUP_SQL)
        conn.close()

        proxy = Proxy(args.port_base + 2, primary.port)
        sh("pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
           "-D", standby.data, "-X", "stream", "--no-sync", "--checkpoint=fast")
        standby.append_conf("""
port = %d
primary_conninfo = 'host=127.0.0.1 port=%d user=postgres application_name=standby1 sslmode=disable'
idempotency.sweep_interval = 1s
# once promoted it has no standby of its own: with the primary's setting
# every commit would wait for one forever
synchronous_standby_names = ''
""" % (standby.port, proxy_port(args)))
        open(os.path.join(standby.data, "standby.signal"), "w").close()
        standby.start()

        # only now that the standby exists: before, every commit would wait for it
        query(primary.port, "ALTER SYSTEM SET synchronous_standby_names = %s" % sync_names, db="postgres")
        query(primary.port, "SELECT pg_reload_conf()", db="postgres")
        state_sql = "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1'"
        want = "sync" if mode != "async" else "async"
        expect(poll(primary.port, state_sql.replace("SELECT sync_state", "SELECT sync_state = '%s'" % want),
                    30, db="postgres"),
               "%s: the standby streams from the primary as a %s standby" % (mode, want))

        # idempotency.durability_check agrees with docs/operations.md: it warns
        # for off, and for local while a synchronous standby is named
        warned = []
        for level in ("remote_apply", "on", "remote_write", "local", "off"):
            conn = psycopg2.connect(dsn(primary.port))
            cur = conn.cursor()
            cur.execute("SET synchronous_commit = %s" % level)
            cur.execute("SELECT token FROM idem_claim('durability', %s)", (level,))
            cur.execute("SELECT idem_complete('durability', %s, %s, '{}')", (level, cur.fetchone()[0]))
            conn.commit()
            if any("stores an outcome that a crash or failover can lose" in n for n in conn.notices):
                warned.append(level)
            conn.close()
        expected = ["local", "off"] if mode != "async" else ["off"]
        expect(warned == expected, "%s: idempotency.durability_check warns for synchronous_commit %s "
               "(with synchronous_standby_names %s), as documented"
               % (mode, " and ".join(expected), sync_names), "it warned for %s" % warned)

        # stale claims: committed, never completed, lease 1 s
        query(primary.port, "SELECT count(*) FROM (SELECT idem_claim('stale', 'stale-' || g, "
                            "lease => '1 s') FROM generate_series(1, 20) g) c")
        # completed keys whose replay must survive
        query(primary.port, "DO $$DECLARE t bigint; BEGIN FOR g IN 1..20 LOOP "
                            "SELECT token INTO t FROM idem_claim('kept', 'kept-' || g); "
                            "PERFORM idem_complete('kept', 'kept-' || g, t, jsonb_build_object('kept', g)); "
                            "END LOOP; END$$")
        if mode == "remote_apply":
            # remote_apply: visible on the standby as soon as acknowledged
            expect(query(standby.port, "SELECT count(*) FROM idempotency_records "
                               "WHERE tenant_id IN ('stale', 'kept')")[0][0] == 40,
                   "%s: the acknowledged claims and completions are on the standby at once" % mode)
        # the leases end and two of the standby's sweep intervals go by
        time.sleep(3)
        expect(query(standby.port, "SELECT count(*) FROM pg_stat_activity "
                                   "WHERE backend_type LIKE 'idempotency sweeper%%'", db="postgres")[0][0] == 0
               and query(standby.port, "SELECT count(*) FROM idempotency_records "
                                       "WHERE tenant_id = 'stale' AND lease_expires_at < now()")[0][0] == 20,
               "%s: no sweeper runs on the standby (sweep_interval = 1s there): the 20 expired stale "
               "claims stay" % mode)

        keys = ["k%05d" % i for i in range(args.keys)]
        history = []
        stats = workload.new_stats()
        client_dsn = ("host=127.0.0.1,127.0.0.1 port=%d,%d dbname=app user=postgres sslmode=disable "
                      "connect_timeout=2 target_session_attrs=read-write" % (primary.port, standby.port))
        deadline = time.time() + 150
        crash = {}

        def on_progress(done, total):
            if crash or done < total * 0.4:
                return
            crash["at_deliveries"] = done
            if mode == "async":
                # stall replication until 150 more completions are
                # acknowledged (at most 2 s): the window the crash will lose
                proxy.freeze()
                crash["freeze_t"] = time.time()
                acknowledged = stats.get("acknowledged", 0)
                while (stats.get("acknowledged", 0) < acknowledged + 150
                       and time.time() < crash["freeze_t"] + 2):
                    time.sleep(0.002)
            crash["kill_t"] = time.time()
            crash["at_kill"] = stats.get("deliveries", 0)
            primary.stop("immediate")
            crash["killed_t"] = time.time()
            proxy.cut()
            sh("pg_ctl", "-D", standby.data, "-w", "promote")
            crash["promoted_t"] = time.time()

        load_started = time.time()
        errors = workload.run_clients(client_dsn, keys, 2, args.clients, args.seed, deadline,
                                      history, stats, on_progress)
        print("  %s: load %.1f s (crash at %.1f s, promoted %.1f s later)"
              % (mode, time.time() - load_started, crash.get("kill_t", 0) - load_started,
                 crash.get("promoted_t", 0) - crash.get("kill_t", 0)))
        expect(not errors, "%s: every delivery settled during the failover" % mode, "; ".join(errors[:3]))
        expect(bool(crash) and crash["at_kill"] < 2 * len(keys),
               "%s: the primary was killed mid-load (after %s of %d deliveries)"
               % (mode, crash.get("at_kill"), 2 * len(keys)))
        # the broker redelivers every key once more after the failover
        errors = workload.run_clients(client_dsn, keys, 1, args.clients, args.seed + 1, deadline,
                                      history, stats)
        expect(not errors, "%s: every key redelivered once after the failover settled" % mode,
               "; ".join(errors[:3]))
        expect(all(e["ep"] == standby.port for e in history if e["t0"] > crash.get("killed_t", 0)),
               "%s: no answer came from the old primary after its crash" % mode)

        state = workload.final_state(dsn(standby.port))
        lost_port = primary.port if mode == "async" else None
        figures = run_checker("failover-" + mode, root, history, state, lost_port)
        lost = figures.get("lost_acknowledged", 0)
        if mode == "async":
            expect(lost > 0, "async: the replication stall before the crash lost %d acknowledged "
                             "completions (the loss window is real and measured)" % lost)
            expect(figures.get("lost_reexecuted", 0) == lost,
                   "async: each of the %d lost completions ran again exactly once after promotion" % lost)
            window = [e for e in history if e["ev"] == "commit" and e["res"] == "ok"
                      and e["ep"] == primary.port and e["t1"] >= crash["freeze_t"]]
            print("  async: %d completions acknowledged during the %.2f s stall, %d lost"
                  % (len(window), crash["kill_t"] - crash["freeze_t"], lost))
        else:
            expect(lost == 0, "%s: no acknowledged completion lost in the failover" % mode)

        # replays of keys completed before the failover, stale claims swept
        kept = query(standby.port, "SELECT count(*) FROM generate_series(1, 20) g, "
                                   "LATERAL idem_claim('kept', 'kept-' || g) c "
                                   "WHERE c.outcome = 'replay' AND c.response = jsonb_build_object('kept', g)")
        expect(kept[0][0] == 20,
               "%s: %d of 20 completions made before the load replay on the promoted node"
               % (mode, kept[0][0]))
        expect(poll(standby.port, "SELECT count(*) = 1 FROM pg_stat_activity "
                                  "WHERE backend_type = 'idempotency sweeper launcher'", 15, db="postgres"),
               "%s: the sweeper launcher runs on the promoted node without a restart" % mode)
        expect(poll(standby.port, "SELECT count(*) = 0 FROM idempotency_records WHERE tenant_id = 'stale'", 20),
               "%s: the promoted node swept the stale claims left by the old primary" % mode)
        fresh = query(standby.port, "SELECT outcome FROM idem_claim('stale', 'stale-1')")
        expect(fresh[0][0] == "claimed", "%s: a swept stale key is claimed afresh on the promoted node" % mode)

        figures.update(settle_figures(stats))
        figures["faults_injected"] = 1
        print("  figures %s: %s" % (mode, ", ".join("%s %s" % kv for kv in sorted(figures.items()))))
        print("  %s: %.0f s" % (mode, time.time() - started))
    finally:
        if proxy is not None:
            proxy.stop()
        standby.stop()
        primary.stop("immediate")


def proxy_port(args):
    return args.port_base + 2


# ---------------------------------------------------------------- lost commits

def lost_commit(args):
    root = args.dir
    server = Server(root, "server", args.port_base)
    bouncer_port = args.port_base + 1
    bouncer = None
    proxies = []
    started = time.time()
    totals = {"operations": 0, "faults": 0, "retries": 0}
    try:
        server.initdb(base_conf(server.port, root) + "idempotency.sweep_interval = 0\n")
        server.start()
        query(server.port, "CREATE DATABASE app", db="postgres")
        conn = psycopg2.connect(dsn(server.port))
        conn.autocommit = True
        conn.cursor().execute(workload.SETUP_SQL + workload.COMMIT_WINDOW_SQL)
        conn.close()

        bouncer = start_pgbouncer(root, bouncer_port, server.port)

        for phase, target, seed in (("direct", server.port, args.seed),
                                    ("pgbouncer", bouncer_port, args.seed + 100)):
            listen = args.port_base + (2 if phase == "direct" else 3)
            proxy = Proxy(listen, target, drop_after=0.15, drop_before=0.05, seed=seed)
            proxies.append(proxy)
            killer = Killer(server.port, seed)
            killer.start()
            keys = ["%s-%05d" % (phase, i) for i in range(args.keys)]
            history = []
            stats = workload.new_stats()
            phase_started = time.time()
            errors = workload.run_clients(dsn(listen), keys, 2, args.clients, seed,
                                          time.time() + 150, history, stats)
            killer.stop_flag = True
            killer.join()
            expect(not errors, "lost-commit %s: every delivery settled despite the cuts" % phase,
                   "; ".join(errors[:3]))
            state = workload.final_state(dsn(server.port))
            state["ledger"] = [r for r in state["ledger"] if r[0].startswith(phase + "-")]
            state["records"] = {k: v for k, v in state["records"].items() if k.startswith(phase + "-")}
            figures = run_checker("lost-commit-" + phase, root, history, state, None)
            swallowed = sum(v for k, v in proxy.counts.items() if k.startswith("drop_after"))
            committed_unanswered = proxy.counts.get("drop_after:COMMIT", 0)
            faults = swallowed + proxy.counts.get("drop_before", 0) + killer.terminated
            expect(committed_unanswered > 0 and figures.get("unknown_committed", 0) > 0,
                   "lost-commit %s: %d COMMITs committed with their answer lost; their retries got "
                   "the stored answer" % (phase, committed_unanswered))
            expect(killer.terminated > 0 and figures.get("unknown_not_committed", 0) > 0,
                   "lost-commit %s: %d sessions terminated with their COMMIT in flight; %d unanswered "
                   "COMMITs did not commit and their keys were claimed afresh"
                   % (phase, killer.terminated, figures.get("unknown_not_committed", 0)))
            figures.update(settle_figures(stats))
            print("  figures lost-commit %s: %s; proxy %s; terminated %d; %.0f s"
                  % (phase, ", ".join("%s %s" % kv for kv in sorted(figures.items())),
                     json.dumps(proxy.counts, sort_keys=True), killer.terminated,
                     time.time() - phase_started))
            totals["operations"] += figures.get("calls", 0)
            totals["faults"] += faults
            totals["retries"] += stats.get("retries", 0)
            proxy.stop()
        expect(totals["faults"] >= args.min_faults,
               "lost-commit: %d faults injected in all (at least %d asked)" % (totals["faults"], args.min_faults))
        print("  lost-commit totals: %d calls, %d faults injected, %d retries, %.0f s"
              % (totals["operations"], totals["faults"], totals["retries"], time.time() - started))
    finally:
        for p in proxies:
            p.stop()
        if bouncer is not None:
            bouncer.terminate()
            bouncer.wait()
        server.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenario", choices=["failover", "lost-commit"])
    ap.add_argument("--mode", default="remote_apply", choices=["remote_apply", "on", "remote_write", "async"])
    ap.add_argument("--port-base", type=int, required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--keys", type=int, default=1500)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--min-faults", type=int, default=2000)
    args = ap.parse_args()
    try:
        if args.scenario == "failover":
            os.makedirs(args.dir, exist_ok=True)
            failover(args)
        else:
            os.makedirs(args.dir, exist_ok=True)
            lost_commit(args)
    except Exception as e:   # a broken setup is a failure, with the reason
        fail("%s stopped: %s: %s" % (args.scenario, type(e).__name__, e))
    print("%s: %d passed, %d failed" % (args.scenario, results["passed"], results["failed"]))
    sys.exit(1 if results["failed"] else 0)


if __name__ == "__main__":
    main()
