-- Schema of the multi-step example (examples/multistep/flow.py).
-- Run once as a superuser in the shop's database:  psql -d shop -f schema.sql

CREATE EXTENSION IF NOT EXISTS idempotency;

-- One table per phase.  Deliberately no UNIQUE constraint on the key: the
-- recovery points are what keep a resumed order from running a phase twice,
-- and test/suites/78-multistep counts the rows here to prove it.

-- phase 1, recovery point 'order_created'
CREATE TABLE orders (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id    text    NOT NULL,
    idem_key     text    NOT NULL,
    amount_cents integer NOT NULL CHECK (amount_cents > 0),
    email        text    NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- phase 2, recovery point 'charged': what the card processor answered
CREATE TABLE charges (
    order_id     bigint NOT NULL REFERENCES orders,
    charge_id    text   NOT NULL,      -- the processor's id of the charge
    child_key    text   NOT NULL,      -- the Idempotency-Key sent to the processor
    amount_cents integer NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- phase 3: the receipt goes to an outbox (a relay mails it), in the
-- transaction that completes the key
CREATE TABLE receipt_outbox (
    order_id   bigint NOT NULL REFERENCES orders,
    email      text   NOT NULL,
    body       text   NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
