-- One round of a claim holder (test/sqlsmith/run runs it over and over in
-- two sessions while SQLsmith runs, twenty times per connection): a
-- transaction claiming a key (mostly fresh, sometimes one of a small set
-- both holders use, so replays, failures and in_progress answers happen
-- too), holding it a moment, then completing, releasing with a failure or
-- rolling back.  The claim's outcome is printed; the run counts the
-- `outcome claimed` lines.
\set ON_ERROR_STOP off
SET statement_timeout = '5s';
SET lock_timeout = '2s';
SELECT CASE WHEN random() < 0.8 THEN :'holder' || '-' || md5(random()::text)
            ELSE 'shared-' || (floor(random() * 4))::int END AS key,
       random() AS pick \gset
\set outcome none
\set token NULL
BEGIN;
SELECT outcome, token FROM idem_claim('holders', :'key', lease => interval '30 seconds', ttl => interval '20 seconds') \gset
SELECT 'outcome ' || :'outcome';
SELECT pg_sleep(0.02 + random() * 0.05);
SELECT CASE WHEN :pick < 0.5 THEN 'complete' WHEN :pick < 0.7 THEN 'fail' ELSE 'rollback' END AS ending \gset
\if :{?token}
\else
\set token NULL
\endif
SELECT CASE :'ending' WHEN 'complete' THEN idem_complete('holders', :'key', :token, '{"ok": true}')::text
                      WHEN 'fail' THEN idem_release('holders', :'key', :token, '{"error": "declined"}')::text END
 WHERE :'outcome' = 'claimed';
SELECT CASE WHEN :'ending' = 'rollback' THEN 'ROLLBACK' ELSE 'COMMIT' END AS finish \gset
:finish;
