-- Privileges: functions run with the caller's rights; the README's grants
-- are enough for an application role, and without them nothing is readable.
CREATE ROLE idem_app LOGIN;
CREATE ROLE idem_nobody LOGIN;
GRANT USAGE ON SCHEMA public TO idem_app, idem_nobody;
-- (idem_claim without its argument types: the name is unique, and its
-- signature grew in 1.4)
GRANT EXECUTE ON FUNCTION idem_claim,
                          idem_complete(text, text, bigint, jsonb),
                          idem_release(text, text, bigint, jsonb),
                          idem_heartbeat(text, text, bigint, interval),
                          idem_lookup(text, text)
    TO idem_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_records TO idem_app;

SELECT p.proname, p.prosecdef AS security_definer
FROM pg_proc p WHERE p.proname LIKE 'idem\_%' AND p.pronamespace = 'public'::regnamespace
ORDER BY 1;

SET ROLE idem_app;
SELECT token AS t FROM idem_claim('app', 'p-1') \gset
SELECT idem_heartbeat('app', 'p-1', :t) > now() AS heartbeat_ok;
SELECT idem_complete('app', 'p-1', :t, '{"ok": true}');
SELECT outcome, response FROM idem_claim('app', 'p-1');
SELECT status FROM idem_lookup('app', 'p-1');
SELECT token AS t FROM idem_claim('app', 'p-2') \gset
SELECT idem_release('app', 'p-2', :t);
-- the application role may not sweep or forget (admin functions)
SELECT idem_sweep();
SELECT idem_forget('app', 'p-1');
RESET ROLE;

-- a role without the grants can neither call the functions nor read the table
SET ROLE idem_nobody;
SELECT * FROM idem_claim('app', 'p-1');
SELECT * FROM idem_lookup('app', 'p-1');
SELECT count(*) FROM idempotency_records;
RESET ROLE;
-- EXECUTE alone is not enough: the functions run with the caller's rights
GRANT EXECUTE ON FUNCTION idem_lookup(text, text), idem_claim
    TO idem_nobody;
SET ROLE idem_nobody;
SELECT * FROM idem_lookup('app', 'p-1');
SELECT * FROM idem_claim('app', 'p-3');
RESET ROLE;

-- row-level security stays in force, because the functions run as the caller
ALTER TABLE idempotency_records ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_app ON idempotency_records TO idem_app
    USING (tenant_id = current_setting('app.tenant', true))
    WITH CHECK (tenant_id = current_setting('app.tenant', true));
SET ROLE idem_app;
SELECT set_config('app.tenant', 'app', false);
SELECT status FROM idem_lookup('app', 'p-1');
SELECT outcome FROM idem_claim('app', 'p-4');
SELECT * FROM idem_lookup('other', 'p-1');
SELECT * FROM idem_claim('other', 'p-1');
RESET ROLE;
DROP POLICY tenant_app ON idempotency_records;
ALTER TABLE idempotency_records DISABLE ROW LEVEL SECURITY;

-- A missing privilege is named by the function that needs it, with the
-- GRANT that gives it: without DELETE, a release without a failure (which
-- deletes the claim) is refused, written at once or held alike.
REVOKE DELETE ON idempotency_records FROM idem_app;
SET ROLE idem_app;
SELECT idem_release('app', 'p-5', token) FROM idem_claim('app', 'p-5');
SET idempotency.defer_writes = off;
SELECT idem_release('app', 'p-6', token) FROM idem_claim('app', 'p-6');
RESET idempotency.defer_writes;
RESET ROLE;

REVOKE ALL ON idempotency_records FROM idem_app;
REVOKE ALL ON FUNCTION idem_claim,
                       idem_complete(text, text, bigint, jsonb),
                       idem_release(text, text, bigint, jsonb),
                       idem_heartbeat(text, text, bigint, interval),
                       idem_lookup(text, text)
    FROM idem_app, idem_nobody;
REVOKE USAGE ON SCHEMA public FROM idem_app, idem_nobody;
DROP ROLE idem_app;
DROP ROLE idem_nobody;
