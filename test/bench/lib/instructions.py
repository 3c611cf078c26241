"""Instructions per transaction, node by node, for test/bench/citus
--instructions.

TPS and CPU time on a shared 2-core machine move with its load, and a
statement's CPU time on a worker that shares the cores with two other
servers and the clients is not what the same statement costs alone.  The
number of instructions a backend executes does not move with the load.
Every node's postmaster is restarted under valgrind --tool=callgrind
(--trace-children=yes: each backend writes its own count when it exits).
One pgbench client then runs each script twice, N transactions and 2N,
and the counts of the backends that exited after each run are added up per
node.  (count after 2N - count after N) / N is what one transaction costs
on that node once its backends are warm: what a backend does once cancels
out, its start-up (for a Citus node, loading Citus alone is about 130
million instructions) and its first calls on each shard (the extension
prepares its statements per shard, and PostgreSQL plans a prepared
statement afresh at its first five executions).  N must be large enough for
the first run to reach every shard that often: 500 is.

Citus's own background connections would start backends of their own
during a run, so the nodes run with them off (BACKGROUND_OFF); each run's
report says how many backends exited on each node, one per node the
client reached.
"""
import os
import re
import signal
import subprocess
import time

# Settings for the counted runs (appended to every node's configuration
# before the restart): no connection that Citus's maintenance daemon would
# open between the nodes, so that only the run's backends exit.
BACKGROUND_OFF = {
    "citus.distributed_deadlock_detection_factor": "-1",
    "citus.recover_2pc_interval": "-1",
    "citus.defer_shard_delete_interval": "-1",
}


class CountedNode:
    """One node's postmaster, restarted under callgrind."""

    def __init__(self, name, datadir, port, outdir):
        self.name, self.datadir, self.port = name, datadir, port
        self.outdir = os.path.join(outdir, name)
        os.makedirs(self.outdir, exist_ok=True)
        self.proc = None

    def start(self, citus):
        subprocess.run(["pg_ctl", "-D", self.datadir, "-m", "fast", "-w", "-t", "60", "stop"],
                       check=True, capture_output=True)
        if citus:
            with open(os.path.join(self.datadir, "postgresql.conf"), "a") as f:
                f.write("".join(f"{k} = {v}\n" for k, v in BACKGROUND_OFF.items()))
        with open(self.datadir + ".callgrind.log", "w") as log:
            self.proc = subprocess.Popen(
                ["valgrind", "--tool=callgrind", "--trace-children=yes", "--dump-instr=no",
                 f"--callgrind-out-file={self.outdir}/callgrind.%p",
                 "postgres", "-D", self.datadir], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 180
        while subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port)]
                             ).returncode != 0:
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} did not start under callgrind "
                                   f"(log: {self.datadir}.callgrind.log)")
            time.sleep(0.5)

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)      # fast shutdown
            try:
                self.proc.wait(timeout=180)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def files(self):
        return set(os.listdir(self.outdir))

    def exited(self, since):
        """The files, not in since, of the processes that have exited
        (a live process may have its file already, without its totals)."""
        return sorted(f for f in self.files() - since
                      if not os.path.exists(f"/proc/{f.rsplit('.', 1)[-1]}"))


def instructions(path):
    """The file's total, or None while callgrind is still writing it."""
    with open(path) as f:
        for line in f:
            m = re.match(r"^(?:summary|totals):\s+(\d+)", line)
            if m:
                return int(m.group(1))
    return None


def exited_since(nodes, before, timeout=300, expect_any=True):
    """{node name: [instructions of each backend that exited since before]},
    once no backend has exited for 3 s and every file is complete (and,
    with expect_any, at least one backend has exited)."""
    deadline = time.time() + timeout
    last, same = None, 0
    while True:
        new = {n.name: n.exited(before[n.name]) for n in nodes}
        counts = {n.name: [instructions(os.path.join(n.outdir, f)) for f in new[n.name]]
                  for n in nodes}
        complete = all(c is not None for cs in counts.values() for c in cs)
        key = tuple(len(v) for v in new.values())
        same = same + 1 if key == last and complete and (any(key) or not expect_any) else 0
        last = key
        if same >= 3:
            return counts
        if time.time() > deadline:
            raise RuntimeError("backends did not exit under callgrind within "
                               f"{timeout} s: {counts}")
        time.sleep(1)


def per_transaction(nodes, run_pgbench, transactions):
    """{node name: instructions per transaction}, {node name: (backends
    that exited after the first run, after the second)}: run_pgbench(n)
    runs n transactions in one client.  The two numbers of a node must be
    equal for the start-up to cancel out."""
    totals = {}
    # backends of earlier connections (the caller's psql) exit first
    exited_since(nodes, {n.name: set() for n in nodes}, expect_any=False)
    for n_tx in (transactions, 2 * transactions):
        before = {n.name: n.files() for n in nodes}
        run_pgbench(n_tx)
        totals[n_tx] = exited_since(nodes, before)
    first, second = totals[transactions], totals[2 * transactions]
    per_tx = {n.name: (sum(second[n.name]) - sum(first[n.name])) / transactions
              for n in nodes}
    return per_tx, {n.name: (len(first[n.name]), len(second[n.name])) for n in nodes}
