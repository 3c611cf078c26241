-- A user who owns idempotency_records may alter it.  The functions then
-- refuse with SQLSTATE 55000 and change nothing; the backend never crashes
-- (reading a "char" as text used to kill it and restart the cluster).
\set VERBOSITY default
SET idempotency.durability_check = off;
SELECT outcome FROM idem_claim('t', 'k1');

-- a column's type changed
ALTER TABLE idempotency_records ALTER COLUMN status TYPE "char" USING substr(status, 1, 1)::"char";
SELECT outcome FROM idem_claim('t', 'k1');
\set VERBOSITY sqlstate
SELECT outcome FROM idem_claim('t', 'k1');
\set VERBOSITY default
SELECT * FROM idem_lookup('t', 'k1');
SELECT * FROM idem_sweep();
SELECT 'backend alive' AS still;
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;

-- a column dropped
ALTER TABLE idempotency_records DROP COLUMN fingerprint;
SELECT outcome FROM idem_claim('t', 'k2');
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;

-- a column renamed
ALTER TABLE idempotency_records RENAME COLUMN response TO answer;
SELECT outcome FROM idem_claim('t', 'k3');
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;

-- the key index dropped
ALTER TABLE idempotency_records DROP CONSTRAINT idempotency_records_pkey;
SELECT outcome FROM idem_claim('t', 'k4');
SELECT count(*) AS records FROM idempotency_records;
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;

-- a column added is fine: the functions name the columns they use
ALTER TABLE idempotency_records ADD COLUMN note text;
BEGIN;
SELECT token AS t FROM idem_claim('t', 'k5') \gset
SELECT idem_complete('t', 'k5', :t, '{"ok": true}');
COMMIT;
SELECT outcome, response FROM idem_claim('t', 'k5');
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
