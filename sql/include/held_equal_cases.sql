-- The cases of sql/18_held_claims_equal.sql, run once with held claims off
-- (each claim written at once: the reference) and once on; the caller sets
-- idempotency.defer_writes.  Each case starts and ends with an empty
-- records table.  (In sql/include/ so that it travels with sql/, as
-- 85-package copies it; pg_regress runs only sql/*.sql.)
SHOW idempotency.defer_writes;

-- 1. A COMMIT, COMMIT AND CHAIN or PREPARE TRANSACTION of a failed block
-- is a rollback: the claim is gone, the key is free, nothing waits.
BEGIN;
SELECT outcome FROM idem_claim('eq', 'rollback-1');
SAVEPOINT s;
SELECT 1/0;
COMMIT;
BEGIN;
SELECT outcome FROM idem_claim('eq', 'rollback-2');
SELECT 1/0;
COMMIT AND CHAIN;
SELECT outcome FROM idem_claim('eq', 'rollback-2');
ROLLBACK;
BEGIN;
SELECT outcome FROM idem_claim('eq', 'rollback-3');
SAVEPOINT a;
SAVEPOINT b;
SELECT 1/0;
PREPARE TRANSACTION 'held-equal-rollback';
SELECT count(*) AS prepared FROM pg_prepared_xacts WHERE gid = 'held-equal-rollback';
SET statement_timeout = '5s';
SELECT key, outcome FROM (VALUES ('rollback-1'), ('rollback-2'), ('rollback-3')) v(key),
       LATERAL idem_claim('eq', v.key) ORDER BY key;
SELECT key, status FROM idempotency_records ORDER BY key;
SELECT count(*) AS settled FROM (VALUES ('rollback-1'), ('rollback-2'), ('rollback-3')) v(key),
       LATERAL idem_lookup('eq', v.key) r, LATERAL idem_complete('eq', v.key, r.token, '{}');
RESET statement_timeout;
DELETE FROM idempotency_records;

-- 2. A cursor WITH HOLD declared after a claim is run to its end at
-- COMMIT with its DECLARE's snapshot: it sees the claim.  One cursor a
-- transaction, over each kind of reader.
CREATE FUNCTION held_equal_count() RETURNS bigint LANGUAGE sql STABLE
  AS $$ SELECT count(*) FROM idempotency_records WHERE tenant_id = 'eq' $$;
BEGIN;
SELECT outcome FROM idem_claim('eq', 'hold-1');
DECLARE c1 CURSOR WITH HOLD FOR SELECT status FROM idem_lookup('eq', 'hold-1');
COMMIT;
BEGIN;
SELECT outcome FROM idem_claim('eq', 'hold-2');
DECLARE c2 CURSOR WITH HOLD FOR SELECT state, records FROM idem_record_states() WHERE records > 0;
COMMIT;
BEGIN;
SELECT token AS hold_token FROM idem_claim('eq', 'hold-3') \gset
DECLARE c3 CURSOR WITH HOLD FOR SELECT held_equal_count() AS records;
SELECT idem_complete('eq', 'hold-3', :hold_token, '{"held": 3}');
COMMIT;
FETCH ALL c1;
FETCH ALL c2;
FETCH ALL c3;
CLOSE ALL;
DROP FUNCTION held_equal_count();
DELETE FROM idempotency_records;

-- 3. A record in an inheritance child: the SQL read of the table reads
-- the child too, so the key replays.
CREATE TABLE held_equal_archive () INHERITS (idempotency_records);
INSERT INTO held_equal_archive (tenant_id, key, token, status, response, expires_at,
                                created_at, updated_at, ttl)
VALUES ('eq', 'archived', 1, 'completed', '{"archived": true}', now() + interval '1 day',
        now(), now(), interval '1 day');
SELECT outcome, response FROM idem_claim('eq', 'archived');
BEGIN;
SELECT outcome, response FROM idem_claim('eq', 'archived');
COMMIT;
SELECT * FROM idem_lookup('eq', 'archived') \gset lookup_
SELECT :'lookup_status' AS status;
DROP TABLE held_equal_archive;

-- 4. A table owner without rights of its own: the caller's claim commits.
ALTER TABLE idempotency_records OWNER TO held_equal_owner;
REVOKE INSERT ON idempotency_records FROM held_equal_owner;
SET ROLE held_equal_app;
BEGIN;
SELECT idem_complete('eq', 'owner-1', c.token, '{"owner": 1}') FROM idem_claim('eq', 'owner-1') c;
COMMIT;
RESET ROLE;
GRANT INSERT ON idempotency_records TO held_equal_owner;
REVOKE USAGE ON SCHEMA public FROM held_equal_owner;
REVOKE USAGE ON SCHEMA public FROM PUBLIC;
SET ROLE held_equal_app;
BEGIN;
SELECT idem_complete('eq', 'owner-2', c.token, '{"owner": 2}') FROM idem_claim('eq', 'owner-2') c;
COMMIT;
RESET ROLE;
GRANT USAGE ON SCHEMA public TO PUBLIC;
ALTER TABLE idempotency_records OWNER TO :"superuser";
SELECT key, status, response FROM idempotency_records ORDER BY key;
DELETE FROM idempotency_records;

-- 5. A settle by a role without UPDATE (or DELETE) meets the statement's
-- privilege error first, whatever the token.
REVOKE UPDATE, DELETE ON idempotency_records FROM held_equal_app;
SET ROLE held_equal_app;
BEGIN;
SELECT outcome FROM idem_claim('eq', 'rights-1');
SELECT idem_complete('eq', 'rights-1', 1, '{}');
ROLLBACK;
BEGIN;
SELECT outcome FROM idem_claim('eq', 'rights-2');
SELECT idem_release('eq', 'rights-2', 1);
ROLLBACK;
BEGIN;
SELECT outcome FROM idem_claim('eq', 'rights-3');
SELECT idem_release('eq', 'rights-3', 1, '{"failed": true}');
ROLLBACK;
BEGIN;
SELECT outcome FROM idem_claim('eq', 'rights-4');
SELECT idem_heartbeat('eq', 'rights-4', 1) IS NOT NULL AS extended;
ROLLBACK;
RESET ROLE;
GRANT UPDATE, DELETE ON idempotency_records TO held_equal_app;

-- 6. A settle whose response is stored in the TOAST table takes that
-- table's lock when it is made.  (The lock is looked for by the table's
-- name: a regclass constant would make the statement depend on the table,
-- and held claims would be written before it.)
BEGIN;
SELECT token AS toast_token FROM idem_claim('eq', 'toast-1') \gset
SELECT idem_complete('eq', 'toast-1', :toast_token,
                     (SELECT jsonb_agg(md5(i::text)) FROM generate_series(1, 200) i));
SELECT l.mode FROM pg_locks l
 WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation'
   AND l.relation = (SELECT reltoastrelid FROM pg_class
                      WHERE relname = 'idempotency_records' AND relkind = 'r');
COMMIT;
SELECT jsonb_array_length(response) AS stored FROM idem_lookup('eq', 'toast-1');

-- 7. EXPLAIN plans with the claims written: the estimates see them.  The
-- table is emptied by TRUNCATE, not DELETE and VACUUM: a VACUUM cannot
-- remove rows that another session's snapshot may still see, and the
-- estimate then counts them.
TRUNCATE idempotency_records;
ANALYZE idempotency_records;
BEGIN;
SELECT count(*) AS claimed FROM generate_series(1, 5) i,
       LATERAL idem_claim('eq', 'explain-' || i) WHERE outcome = 'claimed';
EXPLAIN (COSTS ON) SELECT * FROM idempotency_records WHERE status = 'processing';
ROLLBACK;

-- 8. Another session settles the key during the claim's statement: the
-- claim reads with the statement's snapshot, as the SQL would.
SELECT format('host=%s port=%s dbname=%s',
              split_part(current_setting('unix_socket_directories'), ',', 1),
              current_setting('port'), current_database()) AS here \gset
-- the other session's statement runs before the claim, in its FROM item
PREPARE claim_during(text, text, text) AS
  SELECT v.outcome FROM (SELECT dblink_exec($1, $2)) d,
         LATERAL (SELECT outcome FROM idem_claim('eq', $3)) v;
SELECT outcome AS pre_outcome, token AS pre_token FROM idem_claim('eq', 'during-1') \gset
BEGIN;
EXECUTE claim_during(:'here', format('DO $$BEGIN PERFORM idem_complete(%L, %L, %s, %L); END$$',
                                     'eq', 'during-1', :pre_token, '{"during": 1}'), 'during-1');
ROLLBACK;
BEGIN;
EXECUTE claim_during(:'here', format('DO $$BEGIN PERFORM idem_forget(%L, %L); END$$',
                                     'eq', 'during-1'), 'during-1');
ROLLBACK;
BEGIN;
EXECUTE claim_during(:'here', format('DO $$BEGIN PERFORM idem_claim(%L, %L); END$$',
                                     'eq', 'during-2'), 'during-2');
ROLLBACK;
DEALLOCATE claim_during;
SELECT key, status FROM idempotency_records ORDER BY key;
DELETE FROM idempotency_records;
