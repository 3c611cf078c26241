-- The fuzz driver: runs a batch of generated calls in one round trip and
-- reports, for each call, what it returned or which error it raised, and how
-- many rows of idempotency_records it wrote.
--
-- Created by the fuzz role in its own pg_temp (it owns nothing else), so the
-- fuzz needs no privilege beyond the documented grants plus TEMP.
--
-- Each call runs in its own subtransaction (a BEGIN ... EXCEPTION block), so a
-- failing call is attributable and rolled back on its own.  The write count
-- comes from the backend's per-transaction tuple counters, which keep the
-- inserts, updates and deletes of aborted subtransactions too: a call that
-- wrote anything before it failed shows a non-zero count even though the
-- rollback has undone the rows.
--
-- Every generated statement returns exactly one row (a text, b bigint,
-- c bigint).  query_canceled is deliberately not caught: a statement_timeout
-- on the whole batch is how the fuzz notices a call that hangs.

CREATE FUNCTION pg_temp.fuzz_batch(stmts text[], rel regclass)
RETURNS TABLE (n integer, state text, message text, a text, b bigint, c bigint, writes bigint,
               us bigint)
LANGUAGE plpgsql
AS $fuzz$
DECLARE
    r       record;
    before  bigint;
    t0      timestamptz;
BEGIN
    FOR i IN 1 .. coalesce(pg_catalog.array_length(stmts, 1), 0) LOOP
        n := i;
        before := pg_catalog.pg_stat_get_xact_tuples_inserted(rel)
                + pg_catalog.pg_stat_get_xact_tuples_updated(rel)
                + pg_catalog.pg_stat_get_xact_tuples_deleted(rel);
        t0 := pg_catalog.clock_timestamp();
        BEGIN
            EXECUTE stmts[i] INTO STRICT r;
            state := NULL;
            message := NULL;
            a := r.a;
            b := r.b;
            c := r.c;
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT;
            a := NULL;
            b := NULL;
            c := NULL;
        END;
        writes := pg_catalog.pg_stat_get_xact_tuples_inserted(rel)
                + pg_catalog.pg_stat_get_xact_tuples_updated(rel)
                + pg_catalog.pg_stat_get_xact_tuples_deleted(rel)
                - before;
        us := pg_catalog.date_part('epoch', pg_catalog.clock_timestamp() - t0) * 1000000;
        RETURN NEXT;
    END LOOP;
END
$fuzz$;

-- Arguments a statement literal cannot carry cheaply: large values stored in
-- a table, so they reach the functions compressed (and, for the largest,
-- toasted), the way a value read from another table would.
CREATE TABLE pg_temp.fuzz_blobs (id integer PRIMARY KEY, t text, j jsonb);
INSERT INTO pg_temp.fuzz_blobs VALUES
    (1, pg_catalog.repeat('k', 1048576), NULL),                            -- 1 MB key, compresses to ~12 kB
    (2, NULL, pg_catalog.jsonb_build_object('p', pg_catalog.repeat('x', 2097152))),  -- 2 MB response, compressed
    (3, NULL, pg_catalog.jsonb_build_object('p', pg_catalog.repeat('y', 600000))),   -- 600 kB response, compressed
    (4, pg_catalog.repeat('k', 255), NULL),                                -- exactly 255 bytes, from a table
    (5, pg_catalog.repeat('k', 4000), NULL);                               -- 4000 bytes, compressed inline
