-- Held claims equal written ones in every class of issue 34 that differed:
-- transaction ends that are rollbacks, cursors WITH HOLD, inheritance
-- children, an owner without rights, a settle without UPDATE or DELETE,
-- TOAST-sized responses, EXPLAIN.  The cases (sql/include/
-- held_equal_cases.sql) run with idempotency.defer_writes off, then on: the
-- two halves of the output must be the same.  Each case failed before
-- (the first hung a backend that could not be cancelled).
SET idempotency.durability_check = off;
\set VERBOSITY sqlstate
SELECT current_user AS superuser \gset
CREATE EXTENSION dblink;
CREATE ROLE held_equal_owner;
CREATE ROLE held_equal_app;
GRANT USAGE ON SCHEMA public TO held_equal_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_records TO held_equal_app;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO held_equal_app;
DELETE FROM idempotency_records;

SET idempotency.defer_writes = off;
\i sql/include/held_equal_cases.sql
SET idempotency.defer_writes = on;
\i sql/include/held_equal_cases.sql

RESET idempotency.defer_writes;
REVOKE ALL ON idempotency_records FROM held_equal_app, held_equal_owner;
REVOKE ALL ON SCHEMA public FROM held_equal_app;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA public FROM held_equal_app;
DROP ROLE held_equal_app;
DROP ROLE held_equal_owner;
DROP EXTENSION dblink;
SELECT 'backend alive' AS still;
