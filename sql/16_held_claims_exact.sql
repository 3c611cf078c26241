-- Never the reason a server goes down, and held claims equal to written
-- ones (src/held.c, src/hooks.c).  Every case that compares runs twice:
-- with idempotency.defer_writes off (each claim written at once) and on;
-- the two outputs must be the same.  Each failed before this release: a
-- crash, or on/off answers that differed.
SET idempotency.durability_check = off;
\set VERBOSITY sqlstate

-- 1. A domain cast with the library loaded: every information_schema query
-- (each ORM's schema introspection) crashed the server.
SELECT 1::information_schema.cardinal_number AS cardinal;
SELECT count(*) > 0 AS has_columns FROM information_schema.columns
 WHERE table_name = 'idempotency_records';
CREATE DOMAIN positive AS int CHECK (VALUE > 0);
SELECT 5::positive AS five;
SELECT (-1)::positive AS refused;
SELECT 'backend alive' AS still;

-- 2. A column the extension made NOT NULL, dropped and filled with NULL:
-- a clear error (55000) on every read path, never a crash.
ALTER TABLE idempotency_records ALTER COLUMN status DROP NOT NULL;
ALTER TABLE idempotency_records ALTER COLUMN token DROP NOT NULL;
INSERT INTO idempotency_records (tenant_id, key, token, status, expires_at,
                                 created_at, updated_at, ttl)
VALUES ('nul', 'status', 1, NULL, now() + interval '1 hour', now(), now(), interval '1 hour'),
       ('nul', 'token', NULL, 'completed', now() + interval '1 hour', now(), now(), interval '1 hour');
SELECT * FROM idem_lookup('nul', 'status');
SELECT outcome FROM idem_claim('nul', 'status');
SELECT outcome FROM idem_claim('nul', 'token');
SET idempotency.direct_reads = off;
SELECT * FROM idem_lookup('nul', 'status');
SELECT outcome FROM idem_claim('nul', 'status');
SELECT outcome FROM idem_claim('nul', 'token');
RESET idempotency.direct_reads;
\set VERBOSITY default
SELECT outcome FROM idem_claim('nul', 'status');
\set VERBOSITY sqlstate
DELETE FROM idempotency_records WHERE tenant_id = 'nul';
ALTER TABLE idempotency_records ALTER COLUMN status SET NOT NULL;
ALTER TABLE idempotency_records ALTER COLUMN token SET NOT NULL;
SELECT 'backend alive' AS still;

-- 3. Domain checks that read the table, run inside built-in functions
-- (record input, jsonb/json population): they see the claim.
CREATE FUNCTION key_is_claimed(k text) RETURNS boolean VOLATILE LANGUAGE plpgsql
  AS $$ BEGIN RETURN EXISTS (SELECT 1 FROM idempotency_records
                             WHERE tenant_id = 'dom' AND key = k); END $$;
CREATE DOMAIN claimed_key AS text CHECK (key_is_claimed(VALUE));
CREATE TYPE keyed AS (k claimed_key);
SET idempotency.defer_writes = off;
BEGIN;
SELECT outcome FROM idem_claim('dom', 'k1');
SELECT (jsonb_populate_record(NULL::keyed, '{"k": "k1"}')).k AS populate;
SELECT r.k AS to_record FROM jsonb_to_record('{"k": "k1"}') AS r(k claimed_key);
SELECT count(*) AS populate_set FROM json_populate_recordset(NULL::keyed, '[{"k": "k1"}]');
SELECT ('(k1)'::text::keyed).k AS record_in;
ROLLBACK;
RESET idempotency.defer_writes;
BEGIN;
SELECT outcome FROM idem_claim('dom', 'k1');
SELECT (jsonb_populate_record(NULL::keyed, '{"k": "k1"}')).k AS populate;
SELECT r.k AS to_record FROM jsonb_to_record('{"k": "k1"}') AS r(k claimed_key);
SELECT count(*) AS populate_set FROM json_populate_recordset(NULL::keyed, '[{"k": "k1"}]');
SELECT ('(k1)'::text::keyed).k AS record_in;
ROLLBACK;

-- 4. A btree operator class whose PL/pgSQL support function reads the
-- table, run by an index insertion of a business INSERT.
CREATE FUNCTION seen_cmp(a text, b text) RETURNS int IMMUTABLE LANGUAGE plpgsql AS $$
BEGIN
  RAISE NOTICE 'comparator sees % record(s)',
    (SELECT count(*) FROM idempotency_records WHERE tenant_id = 'opc');
  RETURN bttextcmp(a, b);
END $$;
CREATE FUNCTION seen_lt(text, text) RETURNS bool IMMUTABLE LANGUAGE sql AS 'SELECT bttextcmp($1, $2) < 0';
CREATE FUNCTION seen_le(text, text) RETURNS bool IMMUTABLE LANGUAGE sql AS 'SELECT bttextcmp($1, $2) <= 0';
CREATE FUNCTION seen_eq(text, text) RETURNS bool IMMUTABLE LANGUAGE sql AS 'SELECT bttextcmp($1, $2) = 0';
CREATE FUNCTION seen_ge(text, text) RETURNS bool IMMUTABLE LANGUAGE sql AS 'SELECT bttextcmp($1, $2) >= 0';
CREATE FUNCTION seen_gt(text, text) RETURNS bool IMMUTABLE LANGUAGE sql AS 'SELECT bttextcmp($1, $2) > 0';
CREATE OPERATOR <~< (LEFTARG = text, RIGHTARG = text, FUNCTION = seen_lt);
CREATE OPERATOR <~= (LEFTARG = text, RIGHTARG = text, FUNCTION = seen_le);
CREATE OPERATOR =~= (LEFTARG = text, RIGHTARG = text, FUNCTION = seen_eq);
CREATE OPERATOR >~= (LEFTARG = text, RIGHTARG = text, FUNCTION = seen_ge);
CREATE OPERATOR >~> (LEFTARG = text, RIGHTARG = text, FUNCTION = seen_gt);
CREATE OPERATOR CLASS seen_ops FOR TYPE text USING btree AS
  OPERATOR 1 <~<, OPERATOR 2 <~=, OPERATOR 3 =~=, OPERATOR 4 >~=, OPERATOR 5 >~>,
  FUNCTION 1 seen_cmp(text, text);
CREATE TABLE seen_orders (v text);
CREATE INDEX ON seen_orders (v seen_ops);
INSERT INTO seen_orders VALUES ('a');
\set VERBOSITY terse
SET idempotency.defer_writes = off;
BEGIN;
SELECT outcome FROM idem_claim('opc', 'k1');
INSERT INTO seen_orders VALUES ('b');
ROLLBACK;
RESET idempotency.defer_writes;
BEGIN;
SELECT outcome FROM idem_claim('opc', 'k1');
INSERT INTO seen_orders VALUES ('b');
ROLLBACK;
\set VERBOSITY sqlstate

-- 5. A nondeterministic collation on key: claims match with the table's
-- own equality ('order-a' and 'ORDER-A' are one key).
CREATE COLLATION case_blind (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
ALTER TABLE idempotency_records ALTER COLUMN key TYPE text COLLATE case_blind;
SET idempotency.defer_writes = off;
BEGIN;
SELECT outcome FROM idem_claim('coll', 'order-a');
SELECT outcome FROM idem_claim('coll', 'ORDER-A');
ROLLBACK;
RESET idempotency.defer_writes;
BEGIN;
SELECT outcome FROM idem_claim('coll', 'order-a');
SELECT outcome FROM idem_claim('coll', 'ORDER-A');
ROLLBACK;
ALTER TABLE idempotency_records ALTER COLUMN key TYPE text COLLATE "C";

-- 6. A CHECK constraint added to the table refuses the claim itself.
ALTER TABLE idempotency_records ADD CONSTRAINT no_bad_keys CHECK (key <> 'bad');
SET idempotency.defer_writes = off;
BEGIN;
SELECT outcome FROM idem_claim('chk', 'bad');
ROLLBACK;
RESET idempotency.defer_writes;
BEGIN;
SELECT outcome FROM idem_claim('chk', 'bad');
ROLLBACK;
ALTER TABLE idempotency_records DROP CONSTRAINT no_bad_keys;

-- 7. An extra unique index refuses the claim itself (the user's index;
-- ON CONFLICT names only the key).
CREATE UNIQUE INDEX key_alone ON idempotency_records (key);
SELECT outcome FROM idem_claim('u1', 'uk');
SET idempotency.defer_writes = off;
BEGIN;
SELECT outcome FROM idem_claim('u2', 'uk');
ROLLBACK;
RESET idempotency.defer_writes;
BEGIN;
SELECT outcome FROM idem_claim('u2', 'uk');
ROLLBACK;
DROP INDEX key_alone;
DELETE FROM idempotency_records WHERE tenant_id = 'u1';

-- 8. The direct read is refused wherever the SQL read would be: a role
-- without USAGE on the extension's schema, through a view in a schema it
-- may use, in a fresh session (no statement of ours prepared yet).
SELECT current_user AS superuser \gset
SELECT outcome FROM idem_claim('usage', 'k1');
SELECT idem_complete('usage', 'k1', (SELECT token FROM idempotency_records
                                      WHERE tenant_id = 'usage' AND key = 'k1'), '"done"');
CREATE ROLE held_no_usage LOGIN;
GRANT SELECT ON idempotency_records TO held_no_usage;
GRANT EXECUTE ON FUNCTION idem_claim TO held_no_usage;
CREATE SCHEMA held_views;
GRANT USAGE ON SCHEMA held_views TO held_no_usage;
CREATE VIEW held_views.replay AS SELECT outcome FROM public.idem_claim('usage', 'k1');
GRANT SELECT ON held_views.replay TO held_no_usage;
REVOKE USAGE ON SCHEMA public FROM PUBLIC;
\c - held_no_usage
SET idempotency.direct_reads = off;
SELECT * FROM held_views.replay;
\c - held_no_usage
SELECT * FROM held_views.replay;
\c - :superuser
GRANT USAGE ON SCHEMA public TO PUBLIC;
DROP VIEW held_views.replay;
DROP SCHEMA held_views;
REVOKE ALL ON idempotency_records FROM held_no_usage;
REVOKE ALL ON FUNCTION idem_claim FROM held_no_usage;
DROP ROLE held_no_usage;
DELETE FROM idempotency_records;
SELECT 'backend alive' AS still;
