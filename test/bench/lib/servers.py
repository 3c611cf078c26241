"""Throwaway servers for the benchmark: one PostgreSQL cluster and Redis
instances, all on 127.0.0.1 in a temporary directory, stopped at exit.

CPU accounting reads /proc: the postmaster's cutime/cstime grow by the CPU
time of every child it has reaped, so around a run whose client connections
all end, the delta is the CPU those backends spent (plus the connection
start/exit of each, a fixed cost that is small per operation)."""

import os
import subprocess
import time

import psycopg2

# test/lib/pg-env exports PG_MAJOR (default 15, the host's) and PG_BINDIR
PG_MAJOR = os.environ.get("PG_MAJOR") or "15"
PG_BIN = os.environ.get("PG_BINDIR") or f"/usr/lib/postgresql/{PG_MAJOR}/bin"
# results of another major go to files of their own: quick-pg17.md, ...
RESULTS_SUFFIX = "" if PG_MAJOR == "15" else f"-pg{PG_MAJOR}"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid, children=True):
    """utime+stime (and the reaped children's, when asked) of pid, in s."""
    with open(f"/proc/{pid}/stat") as f:
        # the command name may contain spaces: split after its closing paren
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is state (field 3); utime is field 14 -> index 11
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    ticks = utime + stime + ((cutime + cstime) if children else 0)
    return ticks / CLK_TCK


def run(cmd, **kw):
    """Run a command, fail loudly with its output."""
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n"
                           f"{res.stdout}\n{res.stderr}")
    return res.stdout


class PgCluster:
    """A PostgreSQL cluster (PG_BIN's major) made by initdb in workdir, on 127.0.0.1:port."""

    def __init__(self, workdir, port, settings):
        self.datadir = os.path.join(workdir, "pgdata")
        self.sockdir = workdir
        self.logfile = os.path.join(workdir, "postgres.log")
        self.port = port
        self.settings = settings
        self.started = False

    def bin(self, name):
        return os.path.join(PG_BIN, name)

    def start(self):
        run([self.bin("initdb"), "-D", self.datadir, "-A", "trust", "-N",
             "-E", "UTF8", "--locale=C"])
        with open(os.path.join(self.datadir, "postgresql.conf"), "a") as f:
            f.write("\n# idempotency benchmark\n")
            f.write(f"port = {self.port}\n")
            f.write("listen_addresses = '127.0.0.1'\n")
            f.write(f"unix_socket_directories = '{self.sockdir}'\n")
            for k, v in self.settings.items():
                f.write(f"{k} = {v}\n")
        run([self.bin("pg_ctl"), "-D", self.datadir, "-l", self.logfile,
             "-w", "-t", "120", "start"])
        self.started = True

    def stop(self):
        if self.started:
            subprocess.run([self.bin("pg_ctl"), "-D", self.datadir, "-m",
                            "immediate", "-w", "stop"], capture_output=True)
            self.started = False

    def postmaster_pid(self):
        with open(os.path.join(self.datadir, "postmaster.pid")) as f:
            return int(f.readline())

    def children_cpu_s(self):
        """CPU of every backend the postmaster has reaped so far."""
        with open(f"/proc/{self.postmaster_pid()}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[13]) + int(fields[14])) / CLK_TCK

    def conninfo(self, db):
        return f"host=127.0.0.1 port={self.port} dbname={db}"

    def connect(self, db):
        conn = psycopg2.connect(host="127.0.0.1", port=self.port, dbname=db)
        conn.autocommit = True
        return conn

    def psql_file(self, db, path, variables=None):
        cmd = [self.bin("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
               "-h", "127.0.0.1", "-p", str(self.port), "-d", db, "-f", path]
        for k, v in (variables or {}).items():
            cmd += ["-v", f"{k}={v}"]
        run(cmd)


class Redis:
    """A redis-server on 127.0.0.1:port: Debian's build with its compiled-in
    default persistence (RDB snapshots: save 3600 1 300 100 60 10000), or
    with AOF appendfsync everysec on top."""

    def __init__(self, workdir, port, aof):
        self.dir = os.path.join(workdir, f"redis-{port}")
        self.port = port
        self.aof = aof
        self.proc = None

    def start(self):
        os.makedirs(self.dir, exist_ok=True)
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
               "--dir", self.dir, "--logfile", os.path.join(self.dir, "redis.log"),
               "--daemonize", "no"]
        if self.aof:
            cmd += ["--appendonly", "yes", "--appendfsync", "everysec"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        for _ in range(100):
            if self.cli("PING").strip() == "PONG":
                return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def cli(self, *args):
        res = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p",
                              str(self.port), *args],
                             capture_output=True, text=True)
        return res.stdout

    def cpu_s(self):
        return _proc_cpu_s(self.proc.pid)

    def wait_idle(self, timeout=120):
        """Wait for a background save or AOF rewrite to end, so that it
        does not run into the next scenario."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            info = self.cli("INFO", "persistence")
            if ("rdb_bgsave_in_progress:1" not in info
                    and "aof_rewrite_in_progress:1" not in info):
                return
            time.sleep(0.1)

    def version(self):
        info = self.cli("INFO", "server")
        for line in info.splitlines():
            if line.startswith("redis_version:"):
                return line.split(":", 1)[1].strip()
        return "?"

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None
