-- Schema of the reference HTTP integration (examples/http/server.py).
-- Run once as a superuser in the service's database:  psql -d payments -f schema.sql

CREATE EXTENSION IF NOT EXISTS idempotency;

-- The business table.  Deliberately no UNIQUE (client_id, idempotency_key):
-- the extension is what keeps a retried request from charging twice, and the
-- end-to-end test counts rows here to prove it.
CREATE TABLE payments (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    client_id       text   NOT NULL,
    idempotency_key text   NOT NULL,
    amount          bigint NOT NULL CHECK (amount > 0),  -- minor units (cents)
    currency        text   NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- The service runs as an unprivileged role with exactly the grants the
-- extension needs (see README, "Privileges") plus its own table.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'payments_app') THEN
        CREATE ROLE payments_app LOGIN;
    END IF;
END
$$;

GRANT USAGE ON SCHEMA public TO payments_app;
GRANT EXECUTE ON FUNCTION idem_claim, idem_complete, idem_release, idem_heartbeat, idem_lookup
    TO payments_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_records TO payments_app;
GRANT SELECT, INSERT ON payments TO payments_app;
