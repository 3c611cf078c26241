-- Tenant isolation and extra indexes kept by the extension (1.1), so that
-- pg_dump keeps them (test/suites/82-dump-restore proves the restore).
\set SHOW_CONTEXT never
CREATE ROLE idem_tenant_app LOGIN;
GRANT USAGE ON SCHEMA public TO idem_tenant_app;
GRANT EXECUTE ON FUNCTION idem_claim,
                          idem_complete(text, text, bigint, jsonb),
                          idem_lookup(text, text)
    TO idem_tenant_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_records TO idem_tenant_app;
TRUNCATE idempotency_records;

-- off by default: nothing recorded, no row-level security
SELECT count(*) FROM idem_tenant_isolation;
SELECT relrowsecurity FROM pg_class WHERE oid = 'idempotency_records'::regclass;

-- on: row-level security and one policy reading the named setting
SELECT idem_set_tenant_isolation(true);
SELECT * FROM idem_tenant_isolation;
SELECT c.relrowsecurity, c.relforcerowsecurity, p.polname, p.polcmd, p.polpermissive,
       p.polroles = '{0}' AS to_public, pg_get_expr(p.polqual, p.polrelid) AS using_expr,
       p.polwithcheck IS NULL AS check_is_using
FROM pg_class c JOIN pg_policy p ON p.polrelid = c.oid
WHERE c.oid = 'idempotency_records'::regclass;

-- a tenant session claims and completes its own keys ...
SET ROLE idem_tenant_app;
SET app.tenant = 'shop-1';
SELECT token AS t FROM idem_claim('shop-1', 'order-1') \gset
SELECT idem_complete('shop-1', 'order-1', :t, '{"ok": true}');
SELECT outcome, response FROM idem_claim('shop-1', 'order-1');
-- ... and cannot write or read another tenant's
SELECT outcome FROM idem_claim('shop-2', 'order-1');
SET app.tenant = 'shop-2';
SELECT token AS t FROM idem_claim('shop-2', 'order-1') \gset
SELECT idem_complete('shop-2', 'order-1', :t, '{"ok": 2}');
SELECT tenant_id, key FROM idempotency_records ORDER BY 1, 2;
SELECT count(*) FROM idem_lookup('shop-1', 'order-1');
-- no tenant set: nothing visible, and the functions say what to set
RESET app.tenant;
SELECT count(*) FROM idempotency_records;
SELECT outcome FROM idem_claim('shop-2', 'order-2');
-- the extension's own isolation keeps the fast path: a claim in a
-- transaction is held until COMMIT (nothing written before it) ...
-- (pg_stat_xact_user_tables can hold earlier transactions' counts: the
-- difference is this transaction's rows)
BEGIN;
SELECT set_config('app.tenant', 'shop-3', true);
SELECT n_tup_ins + n_tup_upd AS rows_before FROM pg_stat_xact_user_tables
 WHERE relname = 'idempotency_records' \gset
SELECT token AS t FROM idem_claim('shop-3', 'order-1') \gset
SELECT idem_complete('shop-3', 'order-1', :t, '{"ok": 3}');
SELECT n_tup_ins + n_tup_upd - :rows_before AS rows_written FROM pg_stat_xact_user_tables
 WHERE relname = 'idempotency_records';
COMMIT;
SET app.tenant = 'shop-3';
SELECT outcome, response FROM idem_claim('shop-3', 'order-1');
RESET app.tenant;
RESET ROLE;
-- ... and any other policy beside it takes the SQL path: the claim is
-- written at once
CREATE POLICY users_too ON idempotency_records FOR SELECT USING (key <> 'hidden');
SET ROLE idem_tenant_app;
BEGIN;
SELECT set_config('app.tenant', 'shop-3', true);
SELECT n_tup_ins + n_tup_upd AS rows_before FROM pg_stat_xact_user_tables
 WHERE relname = 'idempotency_records' \gset
SELECT outcome FROM idem_claim('shop-3', 'order-2');
SELECT n_tup_ins + n_tup_upd - :rows_before AS rows_written FROM pg_stat_xact_user_tables
 WHERE relname = 'idempotency_records';
ROLLBACK;
RESET ROLE;
DROP POLICY users_too ON idempotency_records;
SET ROLE idem_tenant_app;
-- the application role cannot switch isolation
SELECT idem_set_tenant_isolation(false);
RESET ROLE;
SELECT tenant_id, key FROM idempotency_records ORDER BY 1, 2;

-- another setting name replaces the policy; a bad one is refused
SELECT idem_set_tenant_isolation(true, 'myapp.current_tenant');
SELECT pg_get_expr(polqual, polrelid) FROM pg_policy WHERE polrelid = 'idempotency_records'::regclass;
SELECT idem_set_tenant_isolation(true, 'tenant');
SELECT idem_set_tenant_isolation(true, 'app.x''); DROP TABLE idempotency_records; --');
SELECT idem_set_tenant_isolation(true, NULL);
SELECT setting FROM idem_tenant_isolation;

-- off: the policy goes, and row-level security with it unless another
-- policy of the user's remains on the table
CREATE POLICY users_own ON idempotency_records FOR SELECT USING (true);
SELECT idem_set_tenant_isolation(false);
SELECT relrowsecurity, (SELECT array_agg(polname) FROM pg_policy WHERE polrelid = c.oid)
FROM pg_class c WHERE oid = 'idempotency_records'::regclass;
DROP POLICY users_own ON idempotency_records;
SELECT idem_set_tenant_isolation(true);
SELECT idem_set_tenant_isolation(false);
SELECT relrowsecurity, (SELECT count(*) FROM pg_policy WHERE polrelid = c.oid)
FROM pg_class c WHERE oid = 'idempotency_records'::regclass;
SELECT count(*) FROM idem_tenant_isolation;

-- extra indexes: made, named, dropped
SELECT idem_create_index(ARRAY['tenant_id', 'created_at']);
SELECT idem_create_index(ARRAY['status'], 'records_by_status');
SELECT indexrelid::regclass, pg_get_indexdef(indexrelid) FROM pg_index
WHERE indrelid = 'idempotency_records'::regclass ORDER BY indexrelid::regclass::text;
SELECT * FROM idem_extra_indexes ORDER BY 1;
SELECT idem_drop_index('records_by_status');
SELECT idem_drop_index('records_by_status');
SELECT to_regclass('records_by_status');
-- refused: an unknown column, no column, a null column, a name in use,
-- a name too long, the same index twice, a change in place
SELECT idem_create_index(ARRAY['tenant', 'created_at']);
SELECT idem_create_index(ARRAY[]::text[]);
SELECT idem_create_index(ARRAY['status', NULL]);
SELECT idem_create_index(ARRAY['status'], 'idempotency_records_pkey');
SELECT idem_create_index(ARRAY['status'], repeat('x', 64));
SELECT idem_create_index(ARRAY['tenant_id', 'created_at']);
UPDATE idem_extra_indexes SET columns = ARRAY['key'];
TRUNCATE idem_extra_indexes;
TRUNCATE idem_tenant_isolation;
-- adopted: an index built beforehand (e.g. CONCURRENTLY) with exactly the
-- definition a restore would build; a different one is refused
CREATE INDEX by_status_desc ON idempotency_records (status DESC);
SELECT idem_create_index(ARRAY['status'], 'by_status_desc');
CREATE INDEX CONCURRENTLY by_status ON idempotency_records (status);
SELECT idem_create_index(ARRAY['status'], 'by_status');
SELECT * FROM idem_extra_indexes ORDER BY 1;
SELECT idem_drop_index('by_status');
SELECT idem_drop_index('idempotency_records_tenant_id_created_at_idx');
DROP INDEX by_status_desc;
SELECT count(*) FROM pg_index WHERE indrelid = 'idempotency_records'::regclass;

-- both choice tables are dumped with the records
SELECT c.relname, e.extcondition[s.i]
FROM pg_extension e, generate_subscripts(e.extconfig, 1) s(i)
JOIN pg_class c ON true
WHERE e.extname = 'idempotency' AND c.oid = e.extconfig[s.i]
  AND c.relname IN ('idem_tenant_isolation', 'idem_extra_indexes') ORDER BY 1;

TRUNCATE idempotency_records;
REVOKE ALL ON idempotency_records FROM idem_tenant_app;
REVOKE ALL ON SCHEMA public FROM idem_tenant_app;
REVOKE ALL ON FUNCTION idem_claim,
                       idem_complete(text, text, bigint, jsonb),
                       idem_lookup(text, text)
    FROM idem_tenant_app;
DROP ROLE idem_tenant_app;
