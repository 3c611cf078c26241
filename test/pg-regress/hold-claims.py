#!/usr/bin/env python3
"""Hold claims while PostgreSQL's regression suite runs (12-pg-regress, mode
"extension"): one session that, until STOPFILE exists, claims a few fresh
keys in a transaction (held in memory: idempotency.defer_writes is on),
keeps them a moment, completes some and releases the others, and commits;
every few rounds a transaction is rolled back with its claims held.

    hold-claims.py CONNINFO STOPFILE

It prints one line of figures at the end and exits non-zero if any answer
was not the one expected (a fresh key must be 'claimed'; a completed key
must replay), so the suite can check the load really ran and behaved.
"""
import os
import sys
import time

import psycopg2

conninfo, stopfile = sys.argv[1], sys.argv[2]
conn = psycopg2.connect(conninfo)
cur = conn.cursor()
cur.execute("SHOW idempotency.defer_writes")
defer_writes = cur.fetchone()[0]
conn.commit()

rounds = claims = completed = released = rolled_back = 0
wrong = []
n = 0
while not os.path.exists(stopfile):
    rounds += 1
    keys = []
    for _ in range(4):
        n += 1
        key = "regress-load-%d" % n
        cur.execute("SELECT outcome, token FROM idem_claim('regress', %s)", (key,))
        outcome, token = cur.fetchone()
        claims += 1
        if outcome != "claimed":
            wrong.append("%s: %s" % (key, outcome))
        keys.append((key, token))
    time.sleep(0.05)
    if rounds % 10 == 0:
        conn.rollback()
        rolled_back += len(keys)
        continue
    for i, (key, token) in enumerate(keys):
        if i % 2 == 0:
            cur.execute("SELECT idem_complete('regress', %s, %s, %s::jsonb)",
                        (key, token, '{"round": %d}' % rounds))
            completed += 1
        else:
            cur.execute("SELECT idem_release('regress', %s, %s)", (key, token))
            released += 1
    conn.commit()
    # a completed key answers with its response from now on
    cur.execute("SELECT outcome, response->>'round' FROM idem_claim('regress', %s)", (keys[0][0],))
    outcome, response = cur.fetchone()
    if (outcome, response) != ("replay", str(rounds)):
        wrong.append("%s after completion: %s %s" % (keys[0][0], outcome, response))
    conn.commit()

print("hold-claims: defer_writes=%s rounds=%d claims=%d completed=%d released=%d rolled_back=%d wrong=%d"
      % (defer_writes, rounds, claims, completed, released, rolled_back, len(wrong)))
for w in wrong[:20]:
    print("hold-claims: unexpected answer: " + w)
sys.exit(1 if wrong or rounds == 0 else 0)
