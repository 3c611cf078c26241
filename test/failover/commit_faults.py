"""The faults of the lost-COMMIT tests besides the proxy's (proxy.py): a
session terminated while its COMMIT is in flight, and PgBouncer in
transaction pooling in front of a server.  Used by run.py lost-commit and by
test/suites/90-citus case l.
"""
import os
import random
import subprocess
import threading
import time

import psycopg2


def conninfo(port, db="app"):
    return ("host=127.0.0.1 port=%d dbname=%s user=postgres sslmode=disable connect_timeout=3"
            % (port, db))


class Killer(threading.Thread):
    """Terminates sessions of database app whose COMMIT is in flight (held
    open by a deferred trigger), about one in `every` sightings, looking
    every `poll` seconds.  Set stop_flag to end it; `terminated` counts the
    sessions it ended.

    Each look is a query of pg_stat_activity: at the default 2 ms one killer
    keeps a core busy on an idle machine (and ends far more COMMITs there
    than on a loaded one, each a retry more), so a test running several
    killers at once looks less often."""

    def __init__(self, port, seed, every=3, poll=0.002):
        super().__init__(daemon=True)
        self.port = port
        self.rng = random.Random(seed)
        self.every = every
        self.poll = poll
        self.stop_flag = False
        self.terminated = 0

    def run(self):
        conn = psycopg2.connect(conninfo(self.port))
        conn.autocommit = True
        cur = conn.cursor()
        while not self.stop_flag:
            cur.execute("SELECT pid FROM pg_stat_activity WHERE datname = 'app' AND state = 'active' "
                        "AND query = 'COMMIT' AND pid <> pg_backend_pid()")
            for (pid,) in cur.fetchall():
                if self.rng.randrange(self.every) == 0:
                    cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    if cur.fetchone()[0]:
                        self.terminated += 1
            time.sleep(self.poll)
        conn.close()


def start_pgbouncer(root, listen_port, target_port):
    """PgBouncer in transaction pooling on listen_port, for database app of
    the server on target_port (6 server connections; postgres may use its
    admin console), its files in root.  Returns the process once it accepts
    connections; raises RuntimeError when it does not within 10 s."""
    users = os.path.join(root, "userlist.txt")
    ini = os.path.join(root, "pgbouncer.ini")
    with open(users, "w") as f:
        f.write('"postgres" ""\n')
    with open(ini, "w") as f:
        f.write("""[databases]
app = host=127.0.0.1 port=%d dbname=app
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
admin_users = postgres
pool_mode = transaction
default_pool_size = 6
max_client_conn = 200
query_wait_timeout = 30
logfile = %s
""" % (target_port, listen_port, users, os.path.join(root, "pgbouncer.log")))
    proc = subprocess.Popen(["/usr/sbin/pgbouncer", ini],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.time() + 10
    while time.time() < end:
        try:
            psycopg2.connect(conninfo(listen_port)).close()
            return proc
        except psycopg2.Error:
            time.sleep(0.1)
    proc.terminate()
    proc.wait()
    raise RuntimeError("PgBouncer did not accept connections on port %d within 10 s" % listen_port)
