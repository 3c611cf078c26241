-- The floors of the SQL edition's targets (issue 48), made by
-- test/bench/sql-edition and sql-edition-profile in the SQL edition's
-- databases: PL/pgSQL functions that run only the statements each path
-- needs, with the SQL edition's SET search_path = pg_catalog, pg_temp, so
-- that what a PL/pgSQL function costs by itself (its set-up in each
-- transaction, SPI, the search_path saved and restored at each call) is in
-- the floor and only the edition's own work is above it.
--
--   bench_sql_floor_replay    the primary-key SELECT of 7b (the stored
--                             response in replay_plain) into a record,
--                             returned; called like 7a (7p)
--   bench_sql_floor_claim     1b's claim: INSERT ... ON CONFLICT DO NOTHING
--                             RETURNING on lean_records
--   bench_sql_floor_complete  1b's complete: the token-fenced UPDATE
--                             (both called in scenario 2's shape: 2p)

CREATE TYPE bench_sql_floor_replay_result AS (outcome text, response jsonb);

CREATE FUNCTION bench_sql_floor_replay(tenant_id text, key text)
RETURNS public.bench_sql_floor_replay_result
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    r record;
BEGIN
    SELECT t.status, t.response INTO r
      FROM public.replay_plain t
     WHERE t.tenant_id = bench_sql_floor_replay.tenant_id AND t.key = bench_sql_floor_replay.key;
    RETURN r;
END
$fn$;

CREATE FUNCTION bench_sql_floor_claim(tenant_id text, key text, OUT token bigint)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    INSERT INTO public.lean_records AS r (tenant_id, key, token, expires_at, lease_expires_at,
                                          created_at, updated_at, ttl, status)
    VALUES (bench_sql_floor_claim.tenant_id, bench_sql_floor_claim.key, 1,
            now() + interval '5 min', now() + interval '5 min', now(), now(), interval '1 day',
            'processing')
    ON CONFLICT DO NOTHING RETURNING r.token INTO bench_sql_floor_claim.token;
END
$fn$;

CREATE FUNCTION bench_sql_floor_complete(tenant_id text, key text, token bigint, response jsonb)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    UPDATE public.lean_records r
       SET status = 'completed', response = bench_sql_floor_complete.response,
           lease_expires_at = NULL, expires_at = now() + r.ttl, updated_at = now()
     WHERE r.tenant_id = bench_sql_floor_complete.tenant_id AND r.key = bench_sql_floor_complete.key
       AND r.token = bench_sql_floor_complete.token AND r.status = 'processing';
END
$fn$;
