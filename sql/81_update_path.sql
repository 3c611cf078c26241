-- The update path on every supported PostgreSQL major (this suite also runs
-- on 17 and 18): 1.0 as shipped, records in it, ALTER EXTENSION UPDATE in
-- the same session, records and replays kept, the new objects work.
-- (test/suites/80-upgrade does the same with live holders in other sessions
-- and compares the result with a fresh install object by object.)
\set SHOW_CONTEXT never
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency VERSION '1.0';
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT token AS done_token FROM idem_claim('up', 'done') \gset
SELECT idem_complete('up', 'done', :done_token, '{"kept": [1, "two", null]}');
SELECT token AS failed_token FROM idem_claim('up', 'failed') \gset
SELECT idem_release('up', 'failed', :failed_token, '{"error": "declined"}');
SELECT token AS open_token FROM idem_claim('up', 'open', lease => '1 hour') \gset
CREATE TEMP TABLE before_update AS
    SELECT tenant_id, key, status, token, response, expires_at FROM idempotency_records;

ALTER EXTENSION idempotency UPDATE;
SELECT e.extversion = a.default_version AS at_default_version, e.extversion <> '1.0' AS updated
FROM pg_extension e JOIN pg_available_extensions a ON a.name = e.extname
WHERE e.extname = 'idempotency';

-- every record as it was, replays unchanged, the open claim completes with its token
SELECT count(*) AS changed FROM before_update b
LEFT JOIN idempotency_records r USING (tenant_id, key)
WHERE (r.status, r.token, r.response, r.expires_at) IS DISTINCT FROM (b.status, b.token, b.response, b.expires_at);
SELECT outcome, response FROM idem_claim('up', 'done');
SELECT outcome, response FROM idem_claim('up', 'failed');
SELECT outcome FROM idem_claim('up', 'open');
SELECT idem_complete('up', 'open', :open_token, '{"late": true}');
SELECT outcome, response FROM idem_claim('up', 'open');
SELECT token > :open_token AS newer_token FROM idem_claim('up', 'fresh');

-- what 1.1 adds works on the updated database
SELECT idem_set_tenant_isolation(true);
SELECT relrowsecurity FROM pg_class WHERE oid = 'idempotency_records'::regclass;
SELECT idem_create_index(ARRAY['tenant_id', 'created_at']);
SELECT idem_drop_index('idempotency_records_tenant_id_created_at_idx');
SELECT idem_set_tenant_isolation(false);

DROP TABLE before_update;
TRUNCATE idempotency_records;

-- 1.1 -> 1.2: a record checkpointed under 1.1 expired at its lease end; the
-- update gives it the retention after the lease that 1.2 keeps it for.
-- (The 1.2 library writes that form already, so the 1.1 form is made by
-- hand here.)
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency VERSION '1.1';
SELECT token AS cp_token FROM idem_claim('up', 'resume-me', lease => '1 hour', ttl => '2 hours') \gset
SELECT idem_checkpoint('up', 'resume-me', :cp_token, 'step-1');
SELECT token AS live_token FROM idem_claim('up', 'plain', lease => '1 hour') \gset
UPDATE idempotency_records SET expires_at = lease_expires_at;
CREATE ROLE idem_up_app;
GRANT EXECUTE ON FUNCTION idem_checkpoint(text, text, bigint, text, jsonb) TO idem_up_app;
ALTER EXTENSION idempotency UPDATE TO '1.2';
SELECT key, expires_at - lease_expires_at AS kept_after_lease
  FROM idempotency_records ORDER BY key;
-- the five-argument idem_checkpoint of 1.1 was replaced, with its grants
SELECT p.oid::regprocedure AS checkpoint_function,
       has_function_privilege('idem_up_app', p.oid, 'EXECUTE') AS granted,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public_granted
  FROM pg_proc p WHERE p.proname = 'idem_checkpoint';
-- (DROP OWNED: from PostgreSQL 17 on, a grant made by an extension script is
-- also an initial privilege that depends on the role)
DROP OWNED BY idem_up_app;
DROP ROLE idem_up_app;
SELECT idem_checkpoint('up', 'resume-me', :cp_token, 'step-2', lease => '3 hours');
SELECT recovery_point, lease_expires_at > now() + interval '179 min' AS extended
  FROM idem_lookup('up', 'resume-me');
TRUNCATE idempotency_records;

-- 1.3 -> 1.4: the 1.4 library with the 1.3 objects (no holder column, the
-- six-argument idem_claim, idem_lookup without holder) works as 1.3 did,
-- held claims included; the update keeps the grants, a 1.3 record has no
-- holder and is never re-entered, and claims with a holder re-enter.
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency VERSION '1.3';
SELECT count(*) AS holder_columns FROM pg_attribute
 WHERE attrelid = 'idempotency_records'::regclass AND attname = 'holder';
SELECT token AS old_token FROM idem_claim('up', 'old-open', lease => '1 hour') \gset
SELECT outcome FROM idem_claim('up', 'old-open');
BEGIN;
SELECT token AS held13_token FROM idem_claim('up', 'held-13') \gset
SELECT outcome FROM idem_claim('up', 'held-13');
SELECT idem_complete('up', 'held-13', :held13_token, '{"v": 13}');
COMMIT;
SELECT outcome, response FROM idem_claim('up', 'held-13');
SELECT status, token = :held13_token AS same_token, recovery_point FROM idem_lookup('up', 'held-13');
SET idempotency.direct_reads = off;
SELECT outcome, response FROM idem_claim('up', 'held-13');
RESET idempotency.direct_reads;
CREATE ROLE idem_up_app;
GRANT EXECUTE ON FUNCTION idem_claim(text, text, text, interval, interval, interval),
                          idem_lookup(text, text) TO idem_up_app WITH GRANT OPTION;
ALTER EXTENSION idempotency UPDATE TO '1.4';
SELECT p.oid::regprocedure AS function,
       has_function_privilege('idem_up_app', p.oid, 'EXECUTE WITH GRANT OPTION') AS granted,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public_granted
  FROM pg_proc p WHERE p.proname IN ('idem_claim', 'idem_lookup') ORDER BY 1;
DROP OWNED BY idem_up_app;
DROP ROLE idem_up_app;
SELECT attnum = (SELECT max(attnum) FROM pg_attribute WHERE attrelid = a.attrelid) AS last_column,
       attnotnull, (SELECT collname FROM pg_collation WHERE oid = attcollation) AS collation
  FROM pg_attribute a WHERE attrelid = 'idempotency_records'::regclass AND attname = 'holder';
SELECT status, holder IS NULL AS no_holder FROM idem_lookup('up', 'old-open');
SELECT outcome FROM idem_claim('up', 'old-open', holder => 'run-1');
SELECT idem_complete('up', 'old-open', :old_token, '{"late": 1}');
SELECT token AS new_token FROM idem_claim('up', 'new', holder => 'run-1') \gset
SELECT outcome, token = :new_token AS same_token FROM idem_claim('up', 'new', holder => 'run-1');
-- a table that lost its holder column: claims without a holder go on, one
-- with a holder is refused
ALTER TABLE idempotency_records DROP COLUMN holder;
SELECT outcome FROM idem_claim('up', 'no-column');
SELECT outcome FROM idem_claim('up', 'no-column', holder => 'run-1');
SELECT status, holder FROM idem_lookup('up', 'no-column');
ALTER TABLE idempotency_records ADD COLUMN holder text COLLATE "C";
TRUNCATE idempotency_records;
