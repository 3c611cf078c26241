-- Give every table of the write scenarios the same starting content, then
-- ANALYZE, as in a database that has been running for a while.
--
-- This matters more than it looks: a statement prepared while its table is
-- empty and analyzed (reltuples = 0) gets a sequential-scan plan, and a
-- backend keeps that cached plan while the table grows, so every lookup
-- reads the whole table until the next ANALYZE.  That happens to pgbench's
-- prepared statements, to PL/pgSQL and to the extension's SPI plans alike;
-- starting from non-empty, analyzed tables keeps all scenarios on their
-- index plans.
--
-- psql variable :rows -- how many completed records per table.

INSERT INTO idempotency_records (tenant_id, key, token, expires_at, lease_expires_at,
                                 created_at, updated_at, ttl, status, response)
SELECT 'seed', md5(g::text)::uuid::text, g, now() + interval '1 day', NULL, now(), now(),
       interval '1 day', 'completed', '{"status": "succeeded"}'
  FROM generate_series(1, :rows) g;

INSERT INTO lean_records SELECT * FROM idempotency_records WHERE tenant_id = 'seed';
INSERT INTO article_records SELECT * FROM idempotency_records WHERE tenant_id = 'seed';
INSERT INTO plpg_records SELECT * FROM idempotency_records WHERE tenant_id = 'seed';

INSERT INTO payments (account, amount) SELECT g % 16, g FROM generate_series(1, :rows) g;

VACUUM ANALYZE;
