-- idempotency.claim_sweep: sweeping without a scheduler.  A fresh claim
-- deletes, as its caller, the expired records among the next N records of
-- its tenant after its key (docs/operations.md).
\set SHOW_CONTEXT never
TRUNCATE idempotency_records;

-- tenant a: k11 .. k19, all past their expiry except k13; k15 is a stale
-- claim, k16 a claim with a recovery point past its retention.  Tenant b:
-- expired records whose keys fall between tenant a's.
CREATE FUNCTION claim_sweep_fixture() RETURNS void LANGUAGE sql AS $$
  DELETE FROM idempotency_records WHERE tenant_id IN ('a', 'b');
  INSERT INTO idempotency_records (tenant_id, key, status, token, ttl, expires_at,
                                   lease_expires_at, recovery_point, created_at, updated_at)
  SELECT 'a', 'k' || i, CASE WHEN i IN (15, 16) THEN 'processing' ELSE 'completed' END, i,
         '1 s', now() + CASE WHEN i = 13 THEN interval '1 hour' ELSE interval '-1 hour' END,
         CASE WHEN i IN (15, 16) THEN now() - interval '2 hours' END,
         CASE WHEN i = 16 THEN 'step-1' END, now() - interval '3 hours', now() - interval '3 hours'
  FROM generate_series(11, 19) i;
  INSERT INTO idempotency_records (tenant_id, key, status, token, ttl, expires_at, created_at, updated_at)
  SELECT 'b', 'k' || i || '5', 'completed', i, '1 s', now() - interval '1 hour',
         now() - interval '3 hours', now() - interval '3 hours'
  FROM generate_series(10, 19) i;
$$;
CREATE FUNCTION claim_sweep_left(tenant text) RETURNS text LANGUAGE sql AS $$
  SELECT string_agg(key, ' ' ORDER BY key) FROM idempotency_records WHERE tenant_id = tenant
$$;

-- off by default: a fresh claim removes nothing (unset in the SQL
-- edition, whose settings are placeholders)
SELECT coalesce(current_setting('idempotency.claim_sweep', true), '0') AS claim_sweep;
SELECT claim_sweep_fixture();
SELECT outcome FROM idem_claim('a', 'k1');
SELECT claim_sweep_left('a') AS a, claim_sweep_left('b') AS b;

-- 4: the next four records of tenant a after k10 (k11 .. k14) are looked
-- at, and the expired ones among them go; k13 is live, k15 and later are
-- outside the window, tenant b is another tenant
SET idempotency.claim_sweep = 4;
SELECT claim_sweep_fixture();
SELECT outcome FROM idem_claim('a', 'k10');
SELECT claim_sweep_left('a') AS a, claim_sweep_left('b') AS b;
-- a claim that wrote nothing fresh (in progress, replay, takeover) sweeps nothing
SELECT outcome FROM idem_claim('a', 'k10');
SELECT outcome FROM idem_claim('a', 'k13');
SELECT claim_sweep_left('a') AS a;

-- the stale claim k15 and the expired recovery point k16 go with
-- stale_action = release ...
SET idempotency.claim_sweep = 3;
SELECT claim_sweep_fixture();
SELECT outcome FROM idem_claim('a', 'k145');
SELECT claim_sweep_left('a') AS a;
-- ... with stale_action = fail the stale claim stays, for idem_sweep() to fail
SET idempotency.stale_action = 'fail';
SELECT claim_sweep_fixture();
SELECT outcome FROM idem_claim('a', 'k145');
SELECT claim_sweep_left('a') AS a;
SELECT key, status FROM idempotency_records WHERE tenant_id = 'a' AND key = 'k15';
RESET idempotency.stale_action;

-- after the tenant's last key the window wraps to its first keys (k11,
-- k12, k13: increasing keys have no neighbour after them); tenant b's
-- records, next in the primary key, are not looked at
SELECT claim_sweep_fixture();
SELECT outcome FROM idem_claim('a', 'k2');
SELECT claim_sweep_left('a') AS a, claim_sweep_left('b') AS b;
-- tenant b's own claim sweeps tenant b
SELECT outcome FROM idem_claim('b', 'k1');
SELECT claim_sweep_left('b') AS b;

-- the deletes are the claim's transaction's: in a transaction block (the
-- C edition holds the claim until COMMIT) they are undone with it
SET idempotency.claim_sweep = 1000;
SELECT claim_sweep_fixture();
BEGIN;
SELECT outcome FROM idem_claim('a', 'k0');
SELECT claim_sweep_left('a') AS a;
ROLLBACK;
SELECT claim_sweep_left('a') AS a;

-- under REPEATABLE READ (or SERIALIZABLE) nothing is removed: locking a
-- row settled since the snapshot would fail the claim
SELECT claim_sweep_fixture();
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT outcome FROM idem_claim('a', 'k0');
SELECT claim_sweep_left('a') AS a;
COMMIT;

-- a record this transaction wrote is its own, even as a stale claim: it is
-- not removed, and its holder completes it
SELECT claim_sweep_fixture();
BEGIN;
SET LOCAL idempotency.defer_writes = off;
SELECT token AS t FROM idem_claim('a', 'k111', lease => '1 ms') \gset
SELECT pg_sleep(0.01);
SELECT outcome FROM idem_claim('a', 'k110');
SELECT claim_sweep_left('a') AS a;
SELECT idem_complete('a', 'k111', :t, '{}');
COMMIT;

-- under tenant isolation, as a role confined to its tenant
CREATE ROLE claim_sweep_app LOGIN;
GRANT USAGE ON SCHEMA public TO claim_sweep_app;
GRANT EXECUTE ON FUNCTION idem_claim TO claim_sweep_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_records TO claim_sweep_app;
SELECT idem_set_tenant_isolation(true, 'app.tenant');
SELECT claim_sweep_fixture();
SET ROLE claim_sweep_app;
SET app.tenant = 'a';
SET idempotency.claim_sweep = 8;
SELECT outcome FROM idem_claim('a', 'k10');
RESET ROLE;
RESET app.tenant;
SELECT claim_sweep_left('a') AS a, claim_sweep_left('b') AS b;
SELECT idem_set_tenant_isolation(false);

-- without DELETE: refused, naming the setting and the grant; with the
-- setting off the same role claims as before
REVOKE DELETE ON idempotency_records FROM claim_sweep_app;
SET ROLE claim_sweep_app;
SELECT outcome FROM idem_claim('a', 'k20');
SET idempotency.claim_sweep = 0;
SELECT outcome FROM idem_claim('a', 'k20');
RESET ROLE;

-- bad values are refused (the SQL edition, whose settings are
-- placeholders, at the claim that reads it)
DO $$
DECLARE
  v text;
BEGIN
  FOREACH v IN ARRAY ARRAY['-1', '1001', 'many'] LOOP
    BEGIN
      PERFORM set_config('idempotency.claim_sweep', v, true);
      PERFORM idem_claim('a', 'bad-' || v);
      RAISE NOTICE 'accepted %', v;
    EXCEPTION WHEN OTHERS THEN
      RAISE NOTICE '%: %', SQLSTATE, SQLERRM;
    END;
  END LOOP;
END
$$;
SET idempotency.claim_sweep = 1000;
SHOW idempotency.claim_sweep;
RESET idempotency.claim_sweep;

DELETE FROM idempotency_records WHERE tenant_id IN ('a', 'b');
DROP FUNCTION claim_sweep_fixture();
DROP FUNCTION claim_sweep_left(text);
DROP OWNED BY claim_sweep_app;
DROP ROLE claim_sweep_app;
