-- A held claim (src/held.c, src/hooks.c) must be invisible in every
-- statement shape: each result below is what the same SQL gives with every
-- claim written at once.  Each case failed before the claims were written
-- only ahead of statements that could see them.
SET idempotency.durability_check = off;
CREATE TABLE ledger (id int, amount int);
INSERT INTO ledger SELECT g, g FROM generate_series(1, 1000) g;

-- set-based SQL: a claim per row in WHERE; the INSERT reads no row it wrote
BEGIN;
INSERT INTO ledger SELECT id + 100000, amount FROM ledger
 WHERE (idem_claim('set', 'm-' || id)).outcome = 'claimed';
SELECT count(*) AS ledger_rows FROM ledger;
SELECT count(*) AS records FROM idempotency_records WHERE tenant_id = 'set';
COMMIT;
SELECT count(*) AS committed_records FROM idempotency_records WHERE tenant_id = 'set';

-- a STABLE function reading the table, after a claim
CREATE FUNCTION count_tenant(t text) RETURNS bigint STABLE LANGUAGE sql
  AS $$ SELECT count(*) FROM idempotency_records WHERE tenant_id = t $$;
CREATE FUNCTION count_tenant_plpgsql(t text) RETURNS bigint STABLE LANGUAGE plpgsql
  AS $$ BEGIN RETURN (SELECT count(*) FROM idempotency_records WHERE tenant_id = t); END $$;
BEGIN;
SELECT outcome FROM idem_claim('fn', 'a');
SELECT count_tenant('fn') AS sql_fn, count_tenant_plpgsql('fn') AS plpgsql_fn;
ROLLBACK;

-- a data-modifying CTE beside a claim reads the table as it stood before
BEGIN;
SELECT outcome FROM idem_claim('cte', 'a');
WITH c AS (SELECT outcome FROM idem_claim('cte', 'b'))
SELECT (SELECT outcome FROM c) AS claim_b,
       (SELECT count(*) FROM idempotency_records WHERE tenant_id = 'cte') AS seen;
SELECT count(*) AS records FROM idempotency_records WHERE tenant_id = 'cte';
ROLLBACK;

-- a cursor declared after a claim, fetched after more claims
CREATE FUNCTION count_tenant_volatile(t text) RETURNS bigint VOLATILE LANGUAGE sql
  AS $$ SELECT count(*) FROM idempotency_records WHERE tenant_id = t $$;
BEGIN;
SELECT outcome FROM idem_claim('cur', 'a');
DECLARE c CURSOR FOR SELECT g, count_tenant_volatile('cur') FROM generate_series(1, 3) g;
FETCH 1 FROM c;
SELECT outcome FROM idem_claim('cur', 'b');
FETCH 2 FROM c;
CLOSE c;
ROLLBACK;

-- an UPDATE with an idem_lookup subquery
CREATE TABLE orders (key text, status text);
INSERT INTO orders VALUES ('o1', 'new'), ('o2', 'new');
BEGIN;
SELECT outcome FROM idem_claim('upd', 'o1');
UPDATE orders SET status = (SELECT status FROM idem_lookup('upd', orders.key)) WHERE key = 'o1';
SELECT * FROM orders ORDER BY key;
ROLLBACK;

-- a parallel plan with a PARALLEL SAFE function that reads the table
CREATE FUNCTION count_tenant_parallel(t text) RETURNS bigint STABLE PARALLEL SAFE LANGUAGE sql
  AS $$ SELECT count(*) FROM idempotency_records WHERE tenant_id = t $$;
BEGIN;
SET LOCAL parallel_setup_cost = 0;
SET LOCAL parallel_tuple_cost = 0;
SET LOCAL min_parallel_table_scan_size = 0;
SET LOCAL max_parallel_workers_per_gather = 2;
SET LOCAL parallel_leader_participation = off;
SELECT outcome FROM idem_claim('par', 'a');
SELECT outcome FROM idem_claim('par', 'b');
EXPLAIN (COSTS OFF)
SELECT count_tenant_parallel('par') AS seen_by_workers FROM ledger WHERE id <= 100;
SELECT DISTINCT count_tenant_parallel('par') AS seen_by_workers FROM ledger WHERE id <= 100;
ROLLBACK;

-- triggers on idempotency_records fire as for claims written at once
CREATE TABLE record_audit (tenant_id text, key text, op text, status text, others bigint);
CREATE FUNCTION audit_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO record_audit
  SELECT NEW.tenant_id, NEW.key, TG_OP, NEW.status,
         (SELECT count(*) FROM idempotency_records r
           WHERE r.tenant_id = NEW.tenant_id AND r.key <> NEW.key);
  PERFORM pg_notify('records', NEW.key);
  RETURN NULL;
END $$;
CREATE TRIGGER audit AFTER INSERT OR UPDATE ON idempotency_records
  FOR EACH ROW EXECUTE FUNCTION audit_record();
CREATE FUNCTION deferred_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO record_audit VALUES (NEW.tenant_id, NEW.key, 'deferred', NEW.status, NULL);
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER deferred AFTER INSERT ON idempotency_records
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION deferred_audit();
BEGIN;
SELECT token AS t1 FROM idem_claim('trg', 'a') \gset
SELECT token AS t2 FROM idem_claim('trg', 'b') \gset
SELECT idem_complete('trg', 'a', :t1, '{"ok": 1}');
SELECT idem_release('trg', 'b', :t2);
COMMIT;
SELECT key, op, status, others FROM record_audit ORDER BY key, op, status;
DROP TRIGGER audit ON idempotency_records;
DROP TRIGGER deferred ON idempotency_records;

-- COMMIT after the transaction was made read-only keeps the business writes
BEGIN;
SELECT outcome FROM idem_claim('ro', 'a');
INSERT INTO orders VALUES ('ro-a', 'paid');
SET transaction_read_only = on;
COMMIT;
SELECT status FROM idempotency_records WHERE tenant_id = 'ro';
SELECT status FROM orders WHERE key = 'ro-a';

-- more claims than are held in memory: every one is seen, none is lost
BEGIN;
SELECT count(*) FILTER (WHERE outcome = 'claimed') AS claimed
  FROM generate_series(1, 150) g, idem_claim('cap', 'k' || g);
SELECT count(*) AS records FROM idempotency_records WHERE tenant_id = 'cap';
COMMIT;
SELECT count(*) AS committed FROM idempotency_records WHERE tenant_id = 'cap';

-- the same key claimed again in the same statement, held or not
BEGIN;
SELECT g, outcome FROM generate_series(1, 2) g, LATERAL idem_claim('twice', 'k' || g / 3) ORDER BY g;
ROLLBACK;

-- held claims are freed as they settle: 5,000 claims and completions in
-- one transaction leave their context (if any) small
BEGIN;
DO $$
DECLARE t bigint;
BEGIN
  FOR i IN 1..5000 LOOP
    SELECT token INTO t FROM idem_claim('mem', 'k' || i);
    PERFORM idem_complete('mem', 'k' || i, t, '{}');
  END LOOP;
END $$;
SELECT coalesce(max(total_bytes), 0) < 65536 AS held_claims_context_small
  FROM pg_backend_memory_contexts WHERE name = 'idempotency held claims';
SELECT count(*) AS completed FROM idempotency_records WHERE tenant_id = 'mem' AND status = 'completed';
COMMIT;

DROP TABLE ledger, orders, record_audit;
DROP FUNCTION count_tenant(text), count_tenant_plpgsql(text), count_tenant_volatile(text),
  count_tenant_parallel(text), audit_record(), deferred_audit();
DELETE FROM idempotency_records;
