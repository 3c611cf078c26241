-- Cached plans follow the extension when it is dropped and created again,
-- in the same session, even in another schema.
SELECT outcome FROM idem_claim('r', 'before');
DROP EXTENSION idempotency;
CREATE SCHEMA idem;
CREATE EXTENSION idempotency SCHEMA idem;
SELECT outcome FROM idem.idem_claim('r', 'before');
SELECT key FROM idem.idempotency_records;
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
SELECT outcome FROM idem_claim('r', 'after');
SELECT key FROM idempotency_records;
DROP SCHEMA idem;
