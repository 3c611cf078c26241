-- test/sql-edition/regress: docs/managed.md's "Grants" applied as the
-- regression files make their grants.  The files give their roles the
-- C edition's grants (docs/privileges.md); in the SQL edition a role that
-- calls the API also needs EXECUTE on the SECURITY DEFINER helpers.  This
-- event trigger (installed by the superuser running the files) grants each
-- helper to every role that may execute one of the API functions calling
-- it, and revokes it when that role no longer may: the same rule as
-- sql-edition/migrate to-sql.  It changes nothing a file prints.
CREATE FUNCTION public.regress_sql_helper_grants() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    r record;
BEGIN
    IF current_setting('regress_sql.busy', true) = 'on' THEN
        RETURN;
    END IF;
    PERFORM set_config('regress_sql.busy', 'on', true);
    FOR r IN
        WITH rule(helper, callers) AS (VALUES
            ('idem_sql_fresh_tokens(integer)', ARRAY['idem_claim', 'idem_claim_many', 'idem_release']),
            ('idem_sql_successor_token(bigint)', ARRAY['idem_claim', 'idem_claim_many', 'idem_release']),
            ('idem_sql_isolation_setting()', ARRAY['idem_claim', 'idem_claim_many', 'idem_complete', 'idem_release',
                                                   'idem_heartbeat', 'idem_checkpoint', 'idem_lookup', 'idem_forget']),
            ('idem_sql_tenant_keylock(text, text)', ARRAY['idem_claim', 'idem_claim_many', 'idem_complete', 'idem_release',
                                                     'idem_heartbeat', 'idem_checkpoint', 'idem_forget'])),
        should AS (
            SELECT DISTINCT rule.helper, a.grantee
              FROM rule, pg_proc p, aclexplode(p.proacl) a
             WHERE p.pronamespace = 'public'::regnamespace AND p.proname = ANY (rule.callers)
               AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner),
        has AS (
            SELECT rule.helper, a.grantee
              FROM rule, pg_proc p, aclexplode(p.proacl) a
             WHERE p.oid = ('public.' || rule.helper)::regprocedure AND a.grantee <> p.proowner)
        (SELECT 'GRANT' AS verb, s.helper, s.grantee FROM should s
         EXCEPT SELECT 'GRANT', h.helper, h.grantee FROM has h)
        UNION ALL
        (SELECT 'REVOKE', h.helper, h.grantee FROM has h
         EXCEPT SELECT 'REVOKE', s.helper, s.grantee FROM should s)
    LOOP
        EXECUTE format('%s EXECUTE ON FUNCTION public.%s %s %s', r.verb, r.helper,
                       CASE r.verb WHEN 'GRANT' THEN 'TO' ELSE 'FROM' END,
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE r.grantee::regrole::text END);
    END LOOP;
    PERFORM set_config('regress_sql.busy', 'off', true);
END
$fn$;
CREATE EVENT TRIGGER regress_sql_helper_grants ON ddl_command_end
    WHEN TAG IN ('GRANT', 'REVOKE') EXECUTE FUNCTION public.regress_sql_helper_grants();
