"""The throughput scenarios run in alternating rounds.

Each is driven by pgbench -M prepared with a script in pgbench/, or by the
C load driver (load_driver.c) for the Redis pattern and its twins.  `ref`
names the scenario each one's ratio is taken against, within the same
round: the bare business transaction of the same harness, or for the
replay rows the plain primary-key SELECT.  bench.py decides which scenarios
also run with synchronous_commit off, and skips scenario 11 when idem_claim_many
is not installed.

The secure rows (issue 34) run in databases of their own with tenant
isolation on (bench_tenant, bench_tenant_replay) or off (bench_tenant_off),
as the application role APP_ROLE, which holds exactly docs/privileges.md's
application grants: the table's owner and superusers bypass row-level
security, so measured as them isolation would cost nothing."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Scenario:
    id: str
    title: str
    kind: str                 # "pgbench" or "driver"
    script: str = ""          # pgbench script file
    mode: str = ""            # load driver mode: bare, redis, claim
    redis: str = ""           # "", "default" or "aof"
    clients: int = 16
    work_ms: int = 0
    ref: str = "1"
    round_trips: str = ""     # client round trips per operation
    unit: str = "ops/s"
    duration: str = "write"   # which duration setting applies (bench.PROFILES)
    per_op: int = 1           # units per transaction (keys per batch)
    db: str = ""              # database, when not bench (bench_replay for 7*)
    role: str = ""            # connect as this role, when not the owner
    tenant: str = ""          # app.tenant set for the session (PGOPTIONS)


APP_ROLE = "bench_app"


SCENARIOS = [
    Scenario("1", "bare business transaction (BEGIN; INSERT; COMMIT)", "pgbench",
             "1-bare.pgbench", round_trips="3"),
    Scenario("1b", "lean hand-written SQL (INSERT ON CONFLICT RETURNING, write, UPDATE)",
             "pgbench", "1b-lean-sql.pgbench", round_trips="5"),
    Scenario("2", "extension in-transaction (claim, write, complete)", "pgbench",
             "2-ext-in-tx.pgbench", round_trips="5"),
    Scenario("3", "extension two-phase (claim+commit, then write+complete)", "pgbench",
             "3-ext-two-phase.pgbench", round_trips="4"),
    Scenario("4", "seed articles' SQL (SELECT FOR UPDATE, INSERT, write, UPDATE)",
             "pgbench", "4-article-sql.pgbench", round_trips="6"),
    Scenario("5", "PL/pgSQL implementation of the same contract", "pgbench",
             "5-plpgsql.pgbench", round_trips="5"),
    Scenario("8", "duplicate storm, extension (each key delivered 5x)", "pgbench",
             "8-storm.pgbench", round_trips="3 or 5", unit="deliveries/s"),
    # the C load driver: the Redis pattern and its twins in the same harness
    Scenario("1c", "C driver: bare business transaction", "driver", mode="bare",
             ref="1c", round_trips="3"),
    Scenario("1cp", "C driver: bare business transaction in one pipelined round trip",
             "driver", mode="bare-pipelined", ref="1c", round_trips="1"),
    Scenario("2c", "C driver: extension in-transaction (scenario 2)", "driver",
             mode="claim", ref="1c", round_trips="5"),
    Scenario("2f", "C driver: extension, fewest round trips (BEGIN+claim | write+complete+COMMIT)",
             "driver", mode="claim-pipelined", ref="1c", round_trips="2"),
    Scenario("6", "C driver: Redis SET NX EX + PG transaction + Redis SET (default persistence)",
             "driver", mode="redis", redis="default", ref="1c", round_trips="2 Redis + 3 PG"),
    Scenario("6a", "C driver: the same with Redis AOF appendfsync everysec", "driver",
             mode="redis", redis="aof", ref="1c", round_trips="2 Redis + 3 PG"),
    Scenario("7a", "replay: idem_claim on a completed key", "pgbench",
             "7a-replay-ext.pgbench", ref="7b", round_trips="1", duration="read"),
    Scenario("7b", "replay: plain primary-key SELECT of the stored response", "pgbench",
             "7b-replay-pk-select.pgbench", ref="7b", round_trips="1", duration="read"),
    Scenario("7c", "SELECT 1 (a round trip alone)", "pgbench", "7c-select-1.pgbench",
             ref="7b", round_trips="1", duration="read"),
    Scenario("7d", "replay through the PL/pgSQL implementation", "pgbench",
             "7d-replay-plpgsql.pgbench", ref="7b", round_trips="1", duration="read"),
    # issue 34, the secure rows: tenant isolation on, as the application role,
    # the tenant set per transaction with set_config(..., true)
    Scenario("2t", "secure in-transaction: extension with tenant isolation on, app role, "
             "set_config per transaction", "pgbench", "2t-ext-in-tx-tenant.pgbench", ref="2n",
             round_trips="6", db="bench_tenant", role=APP_ROLE),
    Scenario("2n", "the same role and statements with tenant isolation off", "pgbench",
             "2t-ext-in-tx-tenant.pgbench", ref="2n", round_trips="6", db="bench_tenant_off",
             role=APP_ROLE),
    Scenario("1bt", "lean hand-written SQL + set_config on a table under the same policy",
             "pgbench", "1bt-lean-sql-tenant.pgbench", ref="2n", round_trips="6",
             db="bench_tenant", role=APP_ROLE),
    Scenario("7at", "replay under isolation, per request: BEGIN, set_config, idem_claim, COMMIT",
             "pgbench", "7at-replay-ext-tenant.pgbench", ref="7bt", round_trips="4",
             duration="read", db="bench_tenant_replay", role=APP_ROLE),
    Scenario("7bt", "the same request with the primary-key SELECT under the same policy",
             "pgbench", "7bt-replay-pk-select-tenant.pgbench", ref="7bt", round_trips="4",
             duration="read", db="bench_tenant_replay", role=APP_ROLE),
    Scenario("7as", "replay under isolation, tenant set for the session: idem_claim alone",
             "pgbench", "7a-replay-ext.pgbench", ref="7bs", round_trips="1", duration="read",
             db="bench_tenant_replay", role=APP_ROLE, tenant="replay"),
    Scenario("7bs", "the primary-key SELECT alone under the same policy, tenant set for the "
             "session", "pgbench", "7b-replay-pk-select.pgbench", ref="7bs", round_trips="1",
             duration="read", db="bench_tenant_replay", role=APP_ROLE, tenant="replay"),
    # issue 15's concurrent measure: 16 clients
    Scenario("11a", "idem_claim_many of 500 keys in one transaction, 16 clients", "pgbench",
             "11-claim-many.pgbench", ref="11b", round_trips="3", unit="keys/s", per_op=500,
             clients=16, duration="read"),
    Scenario("11b", "500 idem_claim calls in one transaction, 16 clients", "pgbench",
             "11-claim-single.pgbench", ref="11b", round_trips="502", unit="keys/s", per_op=500,
             clients=16, duration="read"),
    # the measure: one client, one batch against 500 calls (latency)
    Scenario("11c", "idem_claim_many of 500 keys in one transaction, one client", "pgbench",
             "11-claim-many.pgbench", ref="11d", round_trips="3", unit="keys/s", per_op=500,
             clients=1, duration="write"),
    Scenario("11d", "500 idem_claim calls in one transaction, one client", "pgbench",
             "11-claim-single.pgbench", ref="11d", round_trips="502", unit="keys/s", per_op=500,
             clients=1, duration="write"),
    # issue 39: what bounds 11a and 11c, the same rows by a plain INSERT
    Scenario("11e", "bound: a plain INSERT of the same 500 rows, nothing checked, one client",
             "pgbench", "11-insert-plain.pgbench", ref="11d", round_trips="3", unit="keys/s",
             per_op=500, clients=1, duration="write"),
    Scenario("11f", "bound: the same plain INSERT, 16 clients", "pgbench",
             "11-insert-plain.pgbench", ref="11b", round_trips="3", unit="keys/s", per_op=500,
             clients=16, duration="read"),
    # scenario 0: the seed articles' own set-up
    Scenario("0b", "articles' set-up: 50 clients, 50 ms work, no idempotency", "pgbench",
             "0-bare-50ms.pgbench", clients=50, work_ms=50, ref="0b", round_trips="3",
             duration="s0"),
    Scenario("0x", "articles' set-up with the extension in the transaction", "pgbench",
             "0-ext-50ms.pgbench", clients=50, work_ms=50, ref="0b", round_trips="5",
             duration="s0"),
    Scenario("0c", "articles' set-up, C driver, no idempotency", "driver", mode="bare",
             clients=50, work_ms=50, ref="0c", round_trips="3",
             duration="s0"),
    # the pattern the README recommends, with the work inside the transaction:
    # BEGIN + claim | work | INSERT + complete + COMMIT, against the same
    # business transaction in as few round trips (BEGIN + INSERT | work | COMMIT)
    Scenario("0cp", "articles' set-up, C driver, no idempotency, fewest round trips",
             "driver", mode="bare-pipelined", clients=50, work_ms=50, ref="0cp",
             round_trips="2", duration="s0"),
    Scenario("0f", "articles' set-up, C driver, extension, fewest round trips",
             "driver", mode="claim-pipelined", clients=50, work_ms=50, ref="0cp",
             round_trips="2", duration="s0"),
    Scenario("0r", "articles' set-up, C driver, Redis pattern (default persistence)",
             "driver", mode="redis", redis="default", clients=50, work_ms=50, ref="0c",
             round_trips="2 Redis + 3 PG", duration="s0"),
]

BY_ID = {s.id: s for s in SCENARIOS}


def claim_single_script(path, n=500):
    """Scenario 11b: n idem_claim calls, one round trip each, in a transaction
    (pgbench has no loops, so the script is written out)."""
    lines = ["-- 11b: 500 idem_claim calls in one transaction (generated by the bench).",
             r"\set ctr :ctr + 1",
             r"\set k :run * 1000000000000 + :client_id * 1000000000 + :ctr * 1000",
             "BEGIN;"]
    for _ in range(n):
        lines.append(r"\set k :k + 1")
        lines.append("SELECT outcome FROM idem_claim('many', :k);")
    lines.append("COMMIT;")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
