-- Fencing tokens at the top of bigint (src/tokens.c): every token step is
-- overflow-checked; a claim, takeover or release whose token would pass
-- 9223372036854775807 fails with 22003 (numeric_value_out_of_range) and
-- changes nothing, instead of wrapping to a negative or lower token.
-- A database of its own: its token slot (shared memory, one per database)
-- is used up here and must not touch the other tests'.
\set regdb :DBNAME
CREATE DATABASE idem_token_limits;
\c idem_token_limits
CREATE EXTENSION idempotency;
\set VERBOSITY default

-- The mark five below the largest bigint, before this database's first
-- token (its slot starts above the mark).
SELECT setval('idempotency_tokens', 9223372036854775807 - 5) AS mark;

-- A record written around the functions, holding the largest bigint as
-- its token, with its lease over (while processing, expires_at is the
-- lease's end) and a recovery point.
INSERT INTO idempotency_records (tenant_id, key, status, token, ttl, expires_at,
                                 lease_expires_at, created_at, updated_at, recovery_point)
VALUES ('t', 'top', 'processing', 9223372036854775807, '1 day',
        now() - interval '1 minute', now() - interval '1 minute', now(), now(), 'p1');
CREATE TEMP TABLE top_before AS SELECT * FROM idempotency_records WHERE key = 'top';

-- Its takeover would need token + 1: refused, the record as it was.
SELECT outcome, token FROM idem_claim('t', 'top');
\echo :LAST_ERROR_SQLSTATE
-- Its release would hand it on (it has a recovery point) with token + 1:
-- refused too.
SELECT idem_release('t', 'top', 9223372036854775807);
\echo :LAST_ERROR_SQLSTATE
SELECT (SELECT r FROM idempotency_records r WHERE key = 'top')
     = (SELECT b FROM top_before b) AS top_unchanged;
-- Its holder can still finish it: completing needs no new token.
SELECT idem_complete('t', 'top', 9223372036854775807, '{"done": true}');
SELECT outcome, response FROM idem_claim('t', 'top');

-- Two single fresh tokens still fit: mark + 2 and mark + 4.  The mark
-- cannot move its usual ten seconds ahead; it stops at the largest bigint.
SELECT token = 9223372036854775807 - 3 AS first_fits FROM idem_claim('t', 'f1');
SELECT last_value = 9223372036854775807 AS mark_at_top FROM idempotency_tokens;
SELECT token = 9223372036854775807 - 1 AS second_fits
FROM idem_claim('t', 'f2', lease => '1 ms');

-- The next fresh token would pass the top: refused, nothing written, the
-- mark where it was.
SELECT outcome, token FROM idem_claim('t', 'f3');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS f3_records FROM idempotency_records WHERE key = 'f3';
SELECT last_value = 9223372036854775807 AS mark_at_top FROM idempotency_tokens;
-- So does a batch: refused as a whole, nothing written.
SELECT key, token FROM idem_claim_many('t', ARRAY['m1', 'm2', 'm3']);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS batch_records FROM idempotency_records WHERE key LIKE 'm%';

-- f2's lease ends: its takeover gets exactly the largest bigint ...
SELECT pg_sleep(0.02);
SELECT outcome, token = 9223372036854775807 AS token_at_top
FROM idem_claim('t', 'f2', lease => '1 ms');
-- ... and the one after that has none left.
SELECT pg_sleep(0.02);
CREATE TEMP TABLE f2_before AS SELECT * FROM idempotency_records WHERE key = 'f2';
SELECT outcome, token FROM idem_claim('t', 'f2');
\echo :LAST_ERROR_SQLSTATE
SELECT (SELECT r FROM idempotency_records r WHERE key = 'f2')
     = (SELECT b FROM f2_before b) AS f2_unchanged;
-- Its release without a recovery point needs no new token: the record goes.
SELECT idem_release('t', 'f2', 9223372036854775807);
SELECT count(*) AS f2_records FROM idempotency_records WHERE key = 'f2';
-- A wrong token at the top is refused as a wrong token (ID001: no record).
SELECT idem_release('t', 'f2', 9223372036854775807);
\echo :LAST_ERROR_SQLSTATE

-- In a transaction (held claims), the refusal is the same.
BEGIN;
SELECT outcome, token FROM idem_claim('t', 'f4');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE

-- No token anywhere is negative or wrapped.
SELECT key, token = 9223372036854775807 AS at_top, token > 0 AS positive
FROM idempotency_records ORDER BY key;

\c :regdb
DROP DATABASE idem_token_limits;
