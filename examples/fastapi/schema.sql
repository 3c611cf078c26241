-- Schema of the ledger example service: examples/fastapi/app.py and examples/express/app.js.
-- Run once as a superuser in the service's database:  psql -d ledger -f examples/fastapi/schema.sql

CREATE EXTENSION IF NOT EXISTS idempotency;

-- The business table: one row per booked entry.  Deliberately no UNIQUE
-- (client_id, idempotency_key): the extension is what keeps a retried request
-- from booking twice, and the end-to-end test counts rows here to prove it.
CREATE TABLE ledger_entries (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    client_id       text   NOT NULL,
    idempotency_key text   NOT NULL,
    account         text   NOT NULL,
    amount          bigint NOT NULL CHECK (amount > 0),  -- minor units (cents)
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- The service runs as an unprivileged role: the extension's application
-- grants plus its own table.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ledger_app') THEN
        CREATE ROLE ledger_app LOGIN;
    END IF;
END
$$;

GRANT USAGE ON SCHEMA public TO ledger_app;
GRANT EXECUTE ON FUNCTION idem_claim, idem_complete, idem_release, idem_heartbeat, idem_lookup
    TO ledger_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_records TO ledger_app;
GRANT SELECT, INSERT ON ledger_entries TO ledger_app;
