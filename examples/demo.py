"""The payments scenario of the demo (examples/demo.sh starts the server).

A payment service receives the same request several times: a broker
redelivers, an HTTP client retries.  Every delivery runs

    BEGIN;
    SELECT * FROM idem_claim(tenant_id, key, fingerprint);
      claimed     -> INSERT the payment; idem_complete(..., response); COMMIT
      replay      -> answer with the stored response
      in_progress -> someone else is on it: answer 409 / retry later
      mismatch    -> the key was used for another request: 422
      failed      -> answer with the stored failure

and the database guarantees that each payment is charged once.
"""
import collections
import hashlib
import json
import random
import threading
import time

import psycopg2
import psycopg2.extras

TENANT = "shop-42"


def connect():
    conn = psycopg2.connect("")
    conn.autocommit = False
    return conn


def fingerprint(body):
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def deliver(conn, key, body, crash_before_commit=False):
    """One delivery of a payment request; returns the outcome."""
    with conn.cursor() as cur:
        cur.execute("SELECT outcome, token, response FROM idem_claim(%s, %s, %s, wait => '2 s')",
                    (TENANT, key, fingerprint(body)))
        outcome, token, response = cur.fetchone()
        if outcome == "claimed":
            cur.execute("INSERT INTO payments (key, amount_cents) VALUES (%s, %s) RETURNING id",
                        (key, body["amount_cents"]))
            payment_id = cur.fetchone()[0]
            time.sleep(random.uniform(0.001, 0.01))  # the card network
            if crash_before_commit:
                conn.rollback()  # the process dies: nothing of this delivery survives
                return "crashed"
            cur.execute("SELECT idem_complete(%s, %s, %s, %s)",
                        (TENANT, key, token,
                         psycopg2.extras.Json({"status": 201, "body": {"payment_id": payment_id}})))
        conn.commit()
        return outcome


def section(title):
    print(f"\n== {title}")


def main():
    setup = connect()
    setup.autocommit = True
    with setup.cursor() as cur:
        cur.execute("CREATE EXTENSION IF NOT EXISTS idempotency")
        cur.execute("CREATE TABLE payments (id bigserial PRIMARY KEY, key text, amount_cents int)")

    section("1. 40 payments, each delivered 5 times by 10 concurrent consumers")
    requests = [(f"pay-{i:03d}", {"amount_cents": 100 * (i + 1)}) for i in range(40)]
    deliveries = [r for r in requests for _ in range(5)]
    random.shuffle(deliveries)
    outcomes = collections.Counter()
    lock = threading.Lock()

    def consumer(batch):
        conn = connect()
        for key, body in batch:
            o = deliver(conn, key, body)
            with lock:
                outcomes[o] += 1
        conn.close()

    threads = [threading.Thread(target=consumer, args=(deliveries[i::10],)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with setup.cursor() as cur:
        cur.execute("SELECT count(*), count(DISTINCT key) FROM payments")
        executions, distinct = cur.fetchone()
    print(f"   deliveries: {sum(outcomes.values())}   outcomes: {dict(outcomes)}")
    print(f"   payments charged: {executions} for {distinct} distinct keys "
          f"-> {'exactly once' if executions == distinct == 40 else 'DUPLICATES!'}")

    section("2. a consumer crashes after charging, before COMMIT; the broker redelivers")
    conn = connect()
    print(f"   first delivery:  {deliver(conn, 'pay-crash', {'amount_cents': 999}, crash_before_commit=True)}")
    print(f"   redelivery:      {deliver(conn, 'pay-crash', {'amount_cents': 999})}")
    print(f"   another retry:   {deliver(conn, 'pay-crash', {'amount_cents': 999})}")
    with setup.cursor() as cur:
        cur.execute("SELECT count(*) FROM payments WHERE key = 'pay-crash'")
        print(f"   payments for pay-crash: {cur.fetchone()[0]} (the rolled-back charge left no trace)")

    section("3. two-phase work outside the database: a lease, a stalled worker, a takeover")
    setup_cur = setup.cursor()
    setup_cur.execute("SELECT outcome, token FROM idem_claim(%s, 'export-7', lease => '300 ms')", (TENANT,))
    outcome, zombie_token = setup_cur.fetchone()
    print(f"   worker A claims with a 300 ms lease: {outcome}")
    setup_cur.execute("SELECT outcome FROM idem_claim(%s, 'export-7')", (TENANT,))
    print(f"   worker B while A's lease is live:    {setup_cur.fetchone()[0]}")
    time.sleep(0.4)
    setup_cur.execute("SELECT outcome, token FROM idem_claim(%s, 'export-7')", (TENANT,))
    outcome, owner_token = setup_cur.fetchone()
    print(f"   worker B after the lease expired:    {outcome} (token {owner_token} = A's + {owner_token - zombie_token})")
    setup_cur.execute("SELECT idem_complete(%s, 'export-7', %s, '{\"by\": \"B\"}')", (TENANT, owner_token))
    try:
        setup_cur.execute("SELECT idem_complete(%s, 'export-7', %s, '{\"by\": \"A\"}')", (TENANT, zombie_token))
        print("   worker A's late complete: accepted (WRONG)")
    except psycopg2.Error as e:
        print(f"   worker A's late complete is fenced:   SQLSTATE {e.pgcode}: {e.pgerror.splitlines()[0]}")
    setup_cur.execute("SELECT outcome, response FROM idem_claim(%s, 'export-7')", (TENANT,))
    print(f"   a later delivery replays:            {setup_cur.fetchone()}")

    section("4. the same key reused for a different request")
    print(f"   pay-001 with another amount: {deliver(conn, 'pay-001', {'amount_cents': 1})} (HTTP 422)")

    section("5. cleanup: records past their retention are swept")
    setup_cur.execute("SELECT token FROM idem_claim(%s, 'short-lived', ttl => '1 s')", (TENANT,))
    setup_cur.execute("SELECT idem_complete(%s, 'short-lived', %s)", (TENANT, setup_cur.fetchone()[0]))
    time.sleep(1.2)
    setup_cur.execute("SELECT * FROM idem_sweep()")
    print(f"   idem_sweep(): expired_removed, stale_released, stale_failed = {setup_cur.fetchone()}")
    # the background sweeper (every 2 s here) may have removed it first
    setup_cur.execute("SELECT count(*) FROM idempotency_records WHERE tenant_id = %s AND key = 'short-lived'",
                      (TENANT,))
    print(f"   'short-lived' records left: {setup_cur.fetchone()[0]}"
          " (removed by this sweep or by the background sweeper)")
    setup_cur.execute("SELECT claims, claimed, replays, in_progress, mismatches, takeovers, completes"
                      " FROM idem_stats WHERE datname = current_database()")
    cols = [d[0] for d in setup_cur.description]
    print(f"   idem_stats: {dict(zip(cols, setup_cur.fetchone()))}")
    conn.close()
    setup.close()


if __name__ == "__main__":
    main()
