-- The floors of the SQL edition's targets (issue 48), made by
-- test/bench/sql-edition and sql-edition-profile in the SQL edition's
-- databases: PL/pgSQL functions that run only the statements each path
-- needs, with the SQL edition's SET search_path = pg_catalog, pg_temp, so
-- that what a PL/pgSQL function costs by itself (its set-up in each
-- transaction, SPI, the search_path saved and restored at each call) is in
-- the floor and only the edition's own work is above it.
--
--   bench_sql_floor_replay    the primary-key SELECT of 7b (the stored
--                             response in replay_plain) into an
--                             idem_claim_result, returned; called like 7a
--                             (7p)
--   bench_sql_floor_claim     1b's claim: INSERT ... ON CONFLICT DO NOTHING
--                             RETURNING on lean_records
--   bench_sql_floor_complete  1b's complete: the token-fenced UPDATE
--                             (both called in scenario 2's shape: 2p)
--
-- bench_sql_floor_replay has idem_claim's interface: its 7 arguments (the
-- 5 after the key defaulted) and its 6-column result type
-- public.idem_claim_result, which the SQL edition's script made.  The floor
-- is the least a PL/pgSQL function costs that answers a replay through the
-- interface the contract fixes, which both editions have.  The 2-argument
-- function returning 2 columns it replaces measured 134,000 instructions a
-- replay and this one about 146,000 on PostgreSQL 15
-- (test/bench/sql-edition-profile 300): those 12,000 are the interface's,
-- which any PL/pgSQL idem_claim pays, not the edition's own work, so they
-- belong in the floor.

CREATE FUNCTION bench_sql_floor_replay(
    tenant_id   text,
    key         text,
    fingerprint text     DEFAULT NULL,
    lease       interval DEFAULT NULL,
    ttl         interval DEFAULT NULL,
    wait        interval DEFAULT NULL,
    holder      text     DEFAULT NULL)
RETURNS public.idem_claim_result
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    r public.idem_claim_result;
BEGIN
    SELECT 'replay'::text, NULL::bigint, t.response, t.expires_at, NULL::text, NULL::jsonb INTO r
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
