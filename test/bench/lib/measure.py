"""One measured run: a load (pgbench or the C load driver) between two
readings of what the server spent.

Per run we record throughput, p50/p99 latency of single operations, and
the server cost per operation:
  - WAL bytes (pg_current_wal_lsn delta) and full-page images (pg_stat_wal);
  - backend CPU time (/proc: children the postmaster reaped, see servers.py),
    plus redis-server's CPU for the Redis rows;
  - statement execution time (pg_stat_statements total_exec_time).
Nothing else runs in the cluster during a run: autovacuum is off, the
sweeper is off, checkpoints are pushed out of the way (see bench.py)."""

import glob
import os
import re
import signal
import subprocess
import time

from servers import PG_BIN


def percentile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, int(len(sorted_values) * q))
    return sorted_values[i]


class Meter:
    """Readings of server-side cost around a run."""

    def __init__(self, pg, db):
        self.pg = pg
        self.conn = pg.connect(db)

    def q(self, sql, args=None):
        with self.conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall() if cur.description else None

    def q1(self, sql, args=None):
        rows = self.q(sql, args)
        return rows[0][0] if rows else None

    def wait_quiet(self, timeout=30):
        """Wait until every client backend but ours has gone (and so has been
        reaped by the postmaster, which is when its CPU time is counted)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            n = self.q1("SELECT count(*) FROM pg_stat_activity "
                        "WHERE backend_type = 'client backend' "
                        "AND pid <> pg_backend_pid()")
            if n == 0:
                break
            time.sleep(0.05)
        time.sleep(0.15)

    def begin(self, redis=None):
        self.wait_quiet()
        self.q("SELECT pg_stat_statements_reset()")
        self.lsn0 = self.q1("SELECT pg_current_wal_lsn()")
        self.fpi0 = self.q1("SELECT wal_fpi FROM pg_stat_wal")
        self.cpu0 = self.pg.children_cpu_s()
        self.redis = redis
        self.rcpu0 = redis.cpu_s() if redis else 0.0

    def end(self, ops):
        if self.redis:
            self.redis.wait_idle()
        self.wait_quiet()
        wal = float(self.q1("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)",
                            (self.lsn0,)))
        fpi = self.q1("SELECT wal_fpi FROM pg_stat_wal") - self.fpi0
        cpu = self.pg.children_cpu_s() - self.cpu0
        rcpu = (self.redis.cpu_s() - self.rcpu0) if self.redis else 0.0
        exec_ms = self.q1(
            "SELECT coalesce(sum(total_exec_time), 0) FROM pg_stat_statements "
            "WHERE query !~* 'pg_stat|pg_current_wal_lsn|pg_backend_pid'")
        ops = max(ops, 1)
        return {
            "wal_b_op": wal / ops,
            "fpi_op": fpi / ops,
            "cpu_us_op": (cpu + rcpu) * 1e6 / ops,
            "pg_cpu_us_op": cpu * 1e6 / ops,
            "redis_cpu_us_op": rcpu * 1e6 / ops,
            "exec_us_op": float(exec_ms) * 1e3 / ops,
        }


def run_pgbench(pg, db, script, clients, seconds, variables, logdir, tag,
                options="", threads=2, warmup=0.0, user=None):
    """pgbench -M prepared for `seconds`, as `user` (default: the cluster's
    owner).  Throughput and latency come from the per-transaction log,
    leaving out transactions that ended in the first `warmup` seconds (each
    new connection first fills its caches and plans); total_ops counts them
    all, for the costs per operation."""
    prefix = os.path.join(logdir, tag)
    for old in glob.glob(prefix + ".*"):
        os.remove(old)
    cmd = [os.path.join(PG_BIN, "pgbench"), "-h", "127.0.0.1",
           "-p", str(pg.port), "-n", "-M", "prepared",
           "-c", str(clients), "-j", str(min(threads, clients)),
           "-T", str(seconds), "-f", script,
           "--log", f"--log-prefix={prefix}"]
    if user:
        cmd += ["-U", user]
    for k, v in variables.items():
        cmd += ["-D", f"{k}={v}"]
    cmd.append(db)
    env = dict(os.environ, PGOPTIONS=options)
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    out = res.stdout + res.stderr
    m_ops = re.search(r"number of transactions actually processed: (\d+)", out)
    m_fail = re.search(r"number of failed transactions: (\d+)", out)
    if res.returncode != 0 or not m_ops or (m_fail and int(m_fail.group(1)) > 0):
        raise RuntimeError(f"pgbench {tag} failed:\n{out[-3000:]}")

    done = []          # (end time in s, latency in us)
    for path in glob.glob(prefix + ".*"):
        with open(path) as f:
            for line in f:
                p = line.split()
                if len(p) >= 6:
                    done.append((int(p[4]) + int(p[5]) / 1e6, int(p[2])))
        os.remove(path)
    if not done:
        raise RuntimeError(f"pgbench {tag} logged no transaction:\n{out[-3000:]}")
    first = min(t - lat / 1e6 for t, lat in done)      # when the first one began
    last = max(t for t, _ in done)
    start = first + warmup
    lat = sorted(lat for t, lat in done if t >= start)
    window = last - start
    if window <= 0 or not lat:
        raise RuntimeError(f"pgbench {tag}: nothing after the {warmup} s warm-up")
    return {"ops": len(lat), "total_ops": int(m_ops.group(1)),
            "tps": len(lat) / window, "seconds": window,
            "p50_ms": percentile(lat, 0.50) / 1000.0,
            "p99_ms": percentile(lat, 0.99) / 1000.0}


def parse_driver_line(out):
    m = re.search(r"ops=(\d+) seconds=([\d.]+) tps=([\d.]+) p50_us=(\d+) "
                  r"p99_us=(\d+) max_us=(\d+) errors=(\d+) total_ops=(\d+)", out)
    if not m:
        raise RuntimeError(f"load_driver printed no result:\n{out[-3000:]}")
    ops, secs, tps, p50, p99, mx, errs, total = m.groups()
    return {"ops": int(ops), "tps": float(tps), "seconds": float(secs),
            "p50_ms": int(p50) / 1000.0, "p99_ms": int(p99) / 1000.0,
            "max_ms": int(mx) / 1000.0, "errors": int(errs), "total_ops": int(total)}


def driver_cmd(driver, pg, db, mode, threads, run_id, response, redis_port=None,
               seconds=None, work_ms=0, pace_ms=0, tenant="bench", warmup=0.0):
    cmd = [driver, "--mode", mode, "--pg", pg.conninfo(db),
           "--threads", str(threads), "--run", str(run_id),
           "--tenant", tenant, "--response", response]
    if redis_port:
        cmd += ["--redis-port", str(redis_port)]
    if seconds is None:
        cmd.append("--until-signal")
    else:
        cmd += ["--seconds", str(seconds), "--warmup", str(warmup)]
    if work_ms:
        cmd += ["--work-ms", str(work_ms)]
    if pace_ms:
        cmd += ["--pace-ms", str(pace_ms)]
    return cmd


def run_driver(cmd, options=""):
    env = dict(os.environ, PGOPTIONS=options)
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    out = res.stdout + res.stderr
    r = parse_driver_line(out)
    if res.returncode != 0 or r["errors"]:
        raise RuntimeError(f"load_driver failed:\n{out[-3000:]}")
    return r


class BackgroundDriver:
    """The load driver running until told to stop; SIGUSR1 starts the
    latency window that is reported."""

    def __init__(self, cmd, options=""):
        env = dict(os.environ, PGOPTIONS=options)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)

    def start_window(self):
        self.proc.send_signal(signal.SIGUSR1)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=60)
        r = parse_driver_line(out + err)
        if r["errors"]:
            raise RuntimeError(f"load_driver failed:\n{err[-3000:]}")
        return r
