-- The schema SQLsmith runs against (test/sqlsmith/run): tables whose
-- columns exercise what the library's hooks look at when a statement is classified: domains (with
-- CHECK constraints, over domains, arrays, composites, ranges and jsonb, and
-- information_schema's own), arrays, composites, ranges and multiranges,
-- jsonb, enums, collations (C and, when the server has ICU, a
-- nondeterministic one), a partitioned table, views, a materialized view,
-- PL/pgSQL and SQL functions and a trigger, then the extension with records
-- in every status and a view over them.  A few rows each: SQLsmith picks
-- tables and columns, and needs values to compare with.
\set ON_ERROR_STOP on
SET client_min_messages = warning;

CREATE SCHEMA shop;

-- a nondeterministic collation where the server has ICU, "C" otherwise
-- (the suite prints which)
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_collation WHERE collprovider = 'i') THEN
        CREATE COLLATION shop.ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
    ELSE
        CREATE COLLATION shop.ci FROM "C";
    END IF;
END $$;

CREATE DOMAIN shop.positive_int AS integer CHECK (VALUE > 0);
CREATE DOMAIN shop.small_positive AS shop.positive_int CHECK (VALUE < 1000000);
CREATE DOMAIN shop.sku AS text COLLATE "C" NOT NULL CHECK (VALUE ~ '^[A-Z]{3}-[0-9]+$');
CREATE DOMAIN shop.email AS text COLLATE shop.ci CHECK (position('@' IN VALUE) > 1);
CREATE DOMAIN shop.amount AS numeric(12, 2) DEFAULT 0 CHECK (VALUE >= 0);
CREATE DOMAIN shop.int_list AS integer[] CHECK (cardinality(VALUE) <= 10);
CREATE DOMAIN shop.doc AS jsonb CHECK (jsonb_typeof(VALUE) = 'object');
CREATE DOMAIN shop.open_window AS tstzrange CHECK (NOT isempty(VALUE));
CREATE TYPE shop.mood AS ENUM ('sad', 'ok', 'happy');
CREATE TYPE shop.address AS (street text, city text COLLATE shop.ci, zip shop.positive_int);
CREATE DOMAIN shop.shipping_address AS shop.address CHECK (VALUE IS NULL OR (VALUE).city IS NOT NULL);
CREATE TYPE shop.float_range AS RANGE (subtype = float8);

CREATE TABLE shop.customers (
    id        serial PRIMARY KEY,
    name      text COLLATE shop.ci NOT NULL,
    email     shop.email,
    home      shop.address,
    tags      text[],
    mood      shop.mood,
    -- information_schema's domains, as every schema-introspection query returns them
    rank      information_schema.cardinal_number,
    ident     information_schema.sql_identifier,
    active    information_schema.yes_or_no,
    seen_at   information_schema.time_stamp,
    notes     information_schema.character_data
);
CREATE UNIQUE INDEX ON shop.customers (email);

CREATE TABLE shop.orders (
    id          serial PRIMARY KEY,
    customer_id integer REFERENCES shop.customers,
    sku         shop.sku,
    qty         shop.small_positive,
    total       shop.amount,
    items       shop.int_list,
    delivery    shop.open_window,
    details     shop.doc,
    ship_to     shop.shipping_address,
    weights     float8[],
    period      daterange,
    slots       int4multirange,
    tolerance   shop.float_range,
    placed_at   timestamptz DEFAULT now(),
    CHECK (qty < 500)
);
CREATE INDEX ON shop.orders (sku);
CREATE INDEX ON shop.orders USING gin (details);
CREATE INDEX ON shop.orders USING gist (delivery);
CREATE INDEX ON shop.orders ((lower(sku)));

CREATE TABLE shop.events (
    id        bigserial PRIMARY KEY,
    at        timestamptz NOT NULL,
    payload   jsonb,
    note      text COLLATE "C",
    note_ci   text COLLATE shop.ci,
    grid      integer[][],
    stops     shop.address[],
    amounts   shop.amount[]
);

CREATE TABLE shop.ledger (
    booked_on date NOT NULL,
    account   shop.positive_int,
    amount    numeric,
    memo      text
) PARTITION BY RANGE (booked_on);
CREATE TABLE shop.ledger_2025 PARTITION OF shop.ledger FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
CREATE TABLE shop.ledger_rest PARTITION OF shop.ledger DEFAULT;

INSERT INTO shop.customers (name, email, home, tags, mood, rank, ident, active, seen_at, notes) VALUES
    ('Ada', 'ada@example.org', ('1 Main St', 'Springfield', 12345), '{vip,early}', 'happy', 1, 'ada', 'YES', now(), 'first'),
    ('ADA', 'Ada2@example.org', ('2 Main St', 'SPRINGFIELD', 12346), '{}', 'ok', 2, 'ada2', 'NO', now() - interval '1 day', NULL),
    ('Bob', 'bob@example.org', NULL, NULL, 'sad', NULL, NULL, NULL, NULL, 'no address'),
    ('Éva', 'eva@example.org', ('3 Rue', 'Paris', 75001), '{fr}', NULL, 0, 'eva', 'YES', now(), 'accented');

INSERT INTO shop.orders (customer_id, sku, qty, total, items, delivery, details, ship_to, weights, period, slots, tolerance) VALUES
    (1, 'ABC-1', 2, 19.90, '{1,2,3}', tstzrange(now(), now() + interval '2 days'), '{"gift": true, "lines": [1, 2]}',
     ('1 Main St', 'Springfield', 12345), '{0.5,1.25}', daterange('2025-01-01', '2025-02-01'), '{[1,3),[5,9)}', '[0.1,0.9]'),
    (2, 'XYZ-22', 1, 5.00, '{}', tstzrange(now() - interval '1 day', NULL), '{"gift": false}',
     ('2 Main St', 'Springfield', 1), NULL, NULL, '{}', NULL),
    (4, 'EUR-7', 3, 0, NULL, NULL, '{}', NULL, '{}', 'empty', NULL, 'empty'),
    (NULL, 'NUL-0', 1, NULL, '{7}', NULL, NULL, NULL, NULL, NULL, NULL, NULL);

INSERT INTO shop.events (at, payload, note, note_ci, grid, stops, amounts) VALUES
    (now(), '{"kind": "created", "n": 1}', 'a', 'A', '{{1,2},{3,4}}', ARRAY[('x', 'Oslo', 1)::shop.address], '{1.5,2}'),
    (now() - interval '1 hour', '[1, "two", null]', 'B', 'b', NULL, '{}', NULL),
    (now() - interval '2 days', 'null', NULL, NULL, '{}', NULL, '{0}');

INSERT INTO shop.ledger VALUES
    ('2025-03-01', 1, 10.5, 'in 2025'), ('2024-12-31', 2, -3, 'default partition'), ('2026-06-01', 3, 0, NULL);

CREATE VIEW shop.order_totals AS
    SELECT c.id, c.name, c.email, count(o.id) AS orders, sum(o.total) AS spent, max(o.placed_at) AS last_order
    FROM shop.customers c LEFT JOIN shop.orders o ON o.customer_id = c.id
    GROUP BY c.id, c.name, c.email;
CREATE VIEW shop.addresses AS
    SELECT id, (home).city AS city, (home).zip AS zip, home::text AS label FROM shop.customers WHERE home IS NOT NULL;
CREATE MATERIALIZED VIEW shop.sku_counts AS
    SELECT sku, sum(qty) AS qty FROM shop.orders GROUP BY sku;

CREATE FUNCTION shop.order_total(order_id integer) RETURNS shop.amount
LANGUAGE plpgsql STABLE AS $$
DECLARE
    result shop.amount;
BEGIN
    SELECT coalesce(total, 0) * qty INTO result FROM shop.orders WHERE id = order_id;
    RETURN result;
END $$;

CREATE FUNCTION shop.normalize_sku(raw text) RETURNS shop.sku
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN upper(split_part(raw, '-', 1)) || '-' || coalesce(nullif(regexp_replace(split_part(raw, '-', 2), '[^0-9]', '', 'g'), ''), '0');
END $$;

CREATE FUNCTION shop.city_of(a shop.address) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT (a).city $$;

CREATE FUNCTION shop.touch_order() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.placed_at := now();
    NEW.sku := shop.normalize_sku(NEW.sku);
    RETURN NEW;
END $$;
CREATE TRIGGER orders_touch BEFORE UPDATE ON shop.orders FOR EACH ROW EXECUTE FUNCTION shop.touch_order();

-- The extension last: the run loads this file on a server that does not
-- preload the library, and the first call of one of our functions installs
-- its hooks in this session; everything before is plain PostgreSQL.
CREATE EXTENSION idempotency;
CREATE VIEW shop.record_summary AS
    SELECT tenant_id, status, count(*) AS records, max(token) AS top_token
    FROM idempotency_records GROUP BY tenant_id, status;

-- records in every status: completed, failed, processing (a committed claim
-- with a long lease) and expired processing (a 1 ms lease)
SELECT idem_complete('fill', 'done-' || i, (idem_claim('fill', 'done-' || i, 'fp-' || i)).token,
                     jsonb_build_object('status', 201, 'i', i))
FROM generate_series(1, 20) i;
SELECT idem_release('fill', 'failed-' || i, (idem_claim('fill', 'failed-' || i)).token,
                    jsonb_build_object('error', 'card declined', 'i', i))
FROM generate_series(1, 10) i;
SELECT idem_claim('fill', 'open-' || i, lease => interval '1 day') FROM generate_series(1, 10) i;
SELECT idem_claim('fill', 'expired-' || i, lease => interval '1 millisecond') FROM generate_series(1, 10) i;
SELECT idem_release('fill', 'released-' || i, (idem_claim('fill', 'released-' || i)).token)
FROM generate_series(1, 5) i;

ANALYZE;
