-- Look-alike objects a hostile role plants in a schema it can write (public).
-- Run as that role (idem_evil) with psql variables: none.
--
-- Every operator of pg_catalog over the types the extension's statements
-- use, and every plain pg_catalog function over those types, gets an exact
-- twin in public.  A session whose search_path lists public (or pg_temp, or
-- evil) before pg_catalog resolves an unqualified name to the twin.  Each
-- twin calls evil.trap, which bumps a sequence (not rolled back with the
-- caller's transaction), logs a row and raises a WARNING, and then behaves
-- like the original (operators) or returns NULL (functions), so a capture
-- is both recorded and, usually, visible in the results.

CREATE SEQUENCE evil.captures;
CREATE TABLE evil.capture_log (at timestamptz DEFAULT pg_catalog.clock_timestamp(), what text);
GRANT USAGE ON SCHEMA evil TO PUBLIC;

CREATE FUNCTION evil.trap(what text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    PERFORM pg_catalog.nextval('evil.captures');
    INSERT INTO evil.capture_log (what) VALUES (what);
    RAISE WARNING 'CAPTURED by %', what;
END
$$;
GRANT EXECUTE ON FUNCTION evil.trap(text) TO PUBLIC;

-- A look-alike of the records table, for sessions that put evil first.
CREATE TABLE evil.idempotency_records (LIKE public.idempotency_records);
GRANT ALL ON evil.idempotency_records TO PUBLIC;

CREATE TEMP TABLE hostile_types (t regtype);
INSERT INTO hostile_types VALUES
    ('text'), ('bigint'), ('integer'), ('smallint'), ('boolean'), ('timestamptz'),
    ('timestamp'), ('interval'), ('jsonb'), ('json'), ('tid'), ('xid'), ('xid8'),
    ('"char"'), ('name'), ('numeric'), ('oid'), ('bytea'), ('date'), ('double precision'),
    ('text[]'), ('bigint[]'), ('tid[]'), ('jsonb[]'), ('regclass'), ('regproc');

DO $gen$
DECLARE
    r       record;
    fn      text;
    n_ops   integer := 0;
    n_fns   integer := 0;
BEGIN
    -- operators: exact twins that trap and then do the real thing
    FOR r IN
        SELECT o.oid, o.oprname, o.oprleft, o.oprright, o.oprresult
        FROM pg_catalog.pg_operator o
        WHERE o.oprnamespace = 'pg_catalog'::regnamespace
          AND (o.oprleft = 0 OR o.oprleft IN (SELECT t FROM hostile_types))
          AND o.oprright IN (SELECT t FROM hostile_types)
          AND o.oprresult IN (SELECT t FROM hostile_types)
    LOOP
        fn := 'evil_op_' || r.oid;
        IF r.oprleft = 0 THEN
            EXECUTE format($f$CREATE FUNCTION public.%I(%s) RETURNS %s LANGUAGE plpgsql
                SECURITY DEFINER SET search_path = pg_catalog AS $b$
                BEGIN PERFORM evil.trap(%L); RETURN OPERATOR(pg_catalog.%s) $1; END $b$$f$,
                fn, r.oprright::regtype, r.oprresult::regtype,
                format('operator %s(none, %s)', r.oprname, r.oprright::regtype), r.oprname);
            EXECUTE format('CREATE OPERATOR public.%s (FUNCTION = public.%I, RIGHTARG = %s)',
                           r.oprname, fn, r.oprright::regtype);
        ELSE
            EXECUTE format($f$CREATE FUNCTION public.%I(%s, %s) RETURNS %s LANGUAGE plpgsql
                SECURITY DEFINER SET search_path = pg_catalog AS $b$
                BEGIN PERFORM evil.trap(%L); RETURN $1 OPERATOR(pg_catalog.%s) $2; END $b$$f$,
                fn, r.oprleft::regtype, r.oprright::regtype, r.oprresult::regtype,
                format('operator %s(%s, %s)', r.oprname, r.oprleft::regtype, r.oprright::regtype),
                r.oprname);
            EXECUTE format('CREATE OPERATOR public.%s (FUNCTION = public.%I, LEFTARG = %s, RIGHTARG = %s)',
                           r.oprname, fn, r.oprleft::regtype, r.oprright::regtype);
        END IF;
        n_ops := n_ops + 1;
    END LOOP;

    -- functions: exact twins of plain pg_catalog functions over those types
    FOR r IN
        SELECT p.proname, p.prorettype,
               pg_catalog.pg_get_function_identity_arguments(p.oid) AS args
        FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = 'pg_catalog'::regnamespace
          AND p.prokind = 'f' AND NOT p.proretset AND p.provariadic = 0
          AND p.pronargs <= 4
          AND (p.prorettype = 'void'::regtype OR p.prorettype IN (SELECT t FROM hostile_types))
          AND NOT EXISTS (SELECT 1 FROM pg_catalog.unnest(p.proargtypes::oid[]) a
                          WHERE a NOT IN (SELECT t FROM hostile_types))
    LOOP
        BEGIN
            EXECUTE format($f$CREATE FUNCTION public.%I(%s) RETURNS %s LANGUAGE plpgsql
                SECURITY DEFINER SET search_path = pg_catalog AS $b$
                BEGIN PERFORM evil.trap(%L); RETURN%s; END $b$$f$,
                r.proname, r.args, r.prorettype::regtype,
                format('function %s(%s)', r.proname, r.args),
                CASE WHEN r.prorettype = 'void'::regtype THEN '' ELSE ' NULL' END);
            n_fns := n_fns + 1;
        EXCEPTION WHEN OTHERS THEN
            NULL;       -- a signature that cannot be twinned this way (e.g. a reserved name)
        END;
    END LOOP;

    -- and look-alikes of the extension's own functions, by overloading
    CREATE FUNCTION public.idem_claim_one(text, text) RETURNS void LANGUAGE plpgsql
        SECURITY DEFINER SET search_path = pg_catalog AS $b$
        BEGIN PERFORM evil.trap('function idem_claim_one(text, text)'); END $b$;
    n_fns := n_fns + 1;

    RAISE NOTICE 'HOSTILE operators=% functions=%', n_ops, n_fns;
END
$gen$;
