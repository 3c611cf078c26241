"""Scenario 10: what a record costs on disk, and whether the table grows
when records keep coming and going.

Three tables with the same columns and indexes (LIKE idempotency_records
INCLUDING ALL), each filled with the same N records per round (36-byte
keys, the ~100-byte response), then emptied and vacuumed:
  ext     idempotency_records, filled through the API (idem_claim +
          idem_complete per key), emptied by idem_sweep();
  two     a plain table filled the way the lean SQL writes (INSERT the
          processing row, UPDATE it to completed), emptied by a batched DELETE;
  once    a plain table filled with the final rows in one INSERT (the least
          the data can take), emptied by a batched DELETE.
Each round ends with a plain VACUUM, which is what autovacuum would do (it
is off in the benchmark cluster).  Bytes per record are the total relation
size (heap + TOAST + indexes) after the fill, over N."""

DB = "bench_storage"
TABLES = {
    "ext": "idempotency_records",
    "two": "plain_two_writes",
    "once": "plain_written_once",
}


def sizes(cur, table):
    cur.execute(
        "SELECT pg_relation_size(c.oid), "
        "       coalesce(pg_total_relation_size(c.reltoastrelid), 0), "
        "       pg_indexes_size(c.oid), pg_total_relation_size(c.oid) "
        "  FROM pg_class c WHERE c.oid = %s::regclass", (table,))
    heap, toast, idx, total = cur.fetchone()
    return {"heap": heap, "toast": toast, "indexes": idx, "total": total}


def run(pg, bench_dir, response, rows, rounds, log):
    admin = pg.connect("postgres")
    admin.cursor().execute(f"CREATE DATABASE {DB}")
    admin.close()
    conn = pg.connect(DB)
    cur = conn.cursor()
    # The fills run in this one session while the tables go from empty to
    # full and back: keep the cached plans of the extension and of the
    # procedures on their indexes (see sql/seed_rows.sql).  Only the time
    # of a round depends on it, not the sizes measured.
    cur.execute("SET enable_seqscan = off")
    cur.execute("CREATE EXTENSION idempotency")
    for name in ("plain_two_writes", "plain_written_once"):
        cur.execute(f"CREATE TABLE {name} (LIKE idempotency_records INCLUDING ALL)")
    pg.psql_file(DB, f"{bench_dir}/sql/bench_procedures.sql")

    history = {k: [] for k in TABLES}
    for r in range(rounds):
        first = r * rows + 1
        for chunk in range(first, first + rows, 100):
            cur.execute("BEGIN; CALL fill_via_api('storage', %s, %s, %s); COMMIT",
                        (chunk, min(100, first + rows - chunk), response))
        cur.execute("CALL fill_plain_two_writes('plain_two_writes', 'storage', %s, %s, %s)",
                    (first, rows, response))
        cur.execute("CALL fill_final_rows('plain_written_once', 'storage', %s, %s, %s, "
                    "now() - interval '2 hours', now() - interval '1 hour')",
                    (first, rows, response))
        # the API's records carry a 1 ms retention: make sure it has passed
        cur.execute("SELECT pg_sleep(0.01)")
        for key, table in TABLES.items():
            cur.execute(f"SELECT count(*) FROM {table}")
            live = cur.fetchone()[0]
            if live != rows:
                raise RuntimeError(f"scenario 10: {table} holds {live} rows, expected {rows}")
            full = sizes(cur, table)
            if key == "ext":
                cur.execute("SELECT expired_removed FROM idem_sweep()")
                removed = cur.fetchone()[0]
            else:
                cur.execute(f"CALL raw_batched_delete('{table}', 1000)")
                removed = rows
            if removed != rows:
                raise RuntimeError(f"scenario 10: sweep removed {removed} of {rows}")
            cur.execute(f"VACUUM {table}")
            empty = sizes(cur, table)
            history[key].append({"round": r + 1, "full": full, "empty": empty})
        log(f"scenario 10: round {r + 1}/{rounds}: " + ", ".join(
            f"{k} {history[k][-1]['full']['total'] / rows:.0f} B/record "
            f"(heap {history[k][-1]['full']['heap'] // 1024} kB, "
            f"indexes {history[k][-1]['full']['indexes'] // 1024} kB)" for k in TABLES))
    conn.close()

    result = {"rows": rows, "rounds": rounds, "history": history}
    for key in TABLES:
        h = history[key]
        result[key] = {
            "bytes_per_record": h[0]["full"]["total"] / rows,
            "bytes_per_record_last": h[-1]["full"]["total"] / rows,
            # steady state: from the second round on (see the report's note)
            "growth": h[-1]["full"]["total"] / h[min(1, len(h) - 1)]["full"]["total"] - 1.0,
            "growth_first": h[min(1, len(h) - 1)]["full"]["total"] / h[0]["full"]["total"] - 1.0,
            "first": h[0]["full"],
            "last": h[-1]["full"],
        }
    return result
