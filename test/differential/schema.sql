-- The business schema of the differential suite, loaded into both databases
-- after CREATE EXTENSION idempotency.  Every case starts from reset_case():
-- empty tables, then the ledger rows the case asks for.

CREATE TABLE ledger (id bigint PRIMARY KEY, amount int NOT NULL, note text);

-- what triggers and data-modifying CTEs record; n orders the rows
CREATE TABLE audit (n bigserial PRIMARY KEY, what text NOT NULL, info text);

-- a business table whose triggers claim: BEFORE INSERT claims (tenant, key)
-- and stores the outcome; AFTER INSERT notifies and counts the records
CREATE TABLE inbox (
    id      bigint PRIMARY KEY,
    tenant  text NOT NULL,
    key     text NOT NULL,
    amount  int NOT NULL,
    outcome text,
    token   bigint,
    seen    bigint);

-- a row here names a held claim; its deferred trigger completes the claim
-- at COMMIT (or PREPARE TRANSACTION, or SET CONSTRAINTS ... IMMEDIATE)
CREATE TABLE outbox (id bigserial PRIMARY KEY, tenant text NOT NULL, key text NOT NULL, token bigint);

-- Readers hidden in constraints, defaults, domains and operators: the
-- statement names none of them, PostgreSQL runs them for it.
CREATE FUNCTION rec_key_exists(k text) RETURNS boolean
    LANGUAGE sql STABLE AS $$SELECT EXISTS (SELECT 1 FROM idempotency_records WHERE key = k)$$;
CREATE FUNCTION rec_count_all() RETURNS bigint
    LANGUAGE sql VOLATILE AS $$SELECT count(*) FROM idempotency_records$$;
CREATE DOMAIN recorded_key AS text CHECK (VALUE IS NULL OR rec_key_exists(VALUE));
CREATE TABLE checked (
    id   int PRIMARY KEY,
    k    recorded_key,
    k2   text CHECK (k2 IS NULL OR rec_key_exists(k2)),
    seen bigint DEFAULT rec_count_all());
CREATE FUNCTION rec_has(k text, t text) RETURNS boolean
    LANGUAGE sql STABLE AS $$SELECT EXISTS (SELECT 1 FROM idempotency_records WHERE tenant_id = t AND key = k)$$;
CREATE OPERATOR @@@ (LEFTARG = text, RIGHTARG = text, FUNCTION = rec_has);
-- a case may add a foreign key from here to idempotency_records (see
-- harness.REC_TRIGGERS['fk'])
CREATE TABLE orders (id int PRIMARY KEY, tenant text NOT NULL, key text NOT NULL, amount int);

-- Empty every table (records included) and fill the ledger with rows 1..n.
-- TRUNCATE gives both sides the same physical start (scan order); a table
-- whose file is still empty never held a row since, so it is skipped (a
-- TRUNCATE costs a few ms).
CREATE FUNCTION reset_case(n int) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    t text;
    tables text := 'ledger, idempotency_records';
BEGIN
    FOREACH t IN ARRAY ARRAY['audit', 'inbox', 'outbox', 'checked', 'orders'] LOOP
        IF pg_relation_size(t::regclass) > 0 THEN
            tables := tables || ', ' || t;
        END IF;
    END LOOP;
    EXECUTE 'TRUNCATE ' || tables;
    -- a failed INSERT may have taken a number without writing a row
    PERFORM setval('audit_n_seq', 1, false), setval('outbox_id_seq', 1, false);
    PERFORM idem_stats_reset();
    INSERT INTO ledger SELECT g, (g * 7919) % 1000, NULL FROM generate_series(1, n) g;
END $$;

-- Readers of the records table, in every flavour a user might write.
CREATE FUNCTION rec_count_sql_stable(t text) RETURNS bigint
    LANGUAGE sql STABLE AS $$SELECT count(*) FROM idempotency_records WHERE tenant_id = t$$;
CREATE FUNCTION rec_count_sql_volatile(t text) RETURNS bigint
    LANGUAGE sql VOLATILE AS $$SELECT count(*) FROM idempotency_records WHERE tenant_id = t$$;
CREATE FUNCTION rec_count_plpgsql_stable(t text) RETURNS bigint
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT count(*) FROM idempotency_records WHERE tenant_id = t);
END $$;
CREATE FUNCTION rec_count_plpgsql_volatile(t text) RETURNS bigint
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN (SELECT count(*) FROM idempotency_records WHERE tenant_id = t);
END $$;
-- run by parallel workers under a forced parallel plan
CREATE FUNCTION rec_count_parallel(t text) RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE AS $$SELECT count(*) FROM idempotency_records WHERE tenant_id = t$$;
CREATE FUNCTION rec_status_parallel(t text, k text) RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE AS
    $$SELECT status FROM idempotency_records WHERE tenant_id = t AND key = k$$;
-- idem_lookup wrapped
CREATE FUNCTION lookup_status_sql(t text, k text) RETURNS text
    LANGUAGE sql STABLE AS $$SELECT status FROM idem_lookup(t, k)$$;
CREATE FUNCTION lookup_status_plpgsql(t text, k text) RETURNS text
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE s text;
BEGIN
    SELECT status INTO s FROM idem_lookup(t, k);
    RETURN coalesce(s, 'none');
END $$;
-- dynamic SQL and SECURITY DEFINER: readers a plan does not show
CREATE FUNCTION rec_count_dynamic(t text) RETURNS bigint
    LANGUAGE plpgsql STABLE AS $$
DECLARE n bigint;
BEGIN
    EXECUTE 'SELECT count(*) FROM idempotency_records WHERE tenant_id = $1' INTO n USING t;
    RETURN n;
END $$;
CREATE FUNCTION rec_count_definer(t text) RETURNS bigint
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public
    AS $$SELECT count(*) FROM idempotency_records WHERE tenant_id = t$$;
CREATE VIEW rec_view AS SELECT tenant_id, key, status, token FROM idempotency_records;
CREATE FUNCTION ledger_count_stable() RETURNS bigint
    LANGUAGE sql STABLE AS $$SELECT count(*) FROM ledger$$;
CREATE FUNCTION ledger_count_volatile() RETURNS bigint
    LANGUAGE plpgsql VOLATILE AS $$BEGIN RETURN (SELECT count(*) FROM ledger); END $$;

-- Claimers inside functions.
CREATE FUNCTION claim_sql(t text, k text) RETURNS text
    LANGUAGE sql VOLATILE AS $$SELECT (idem_claim(t, k)).outcome$$;
-- claim, business write, complete: the whole handler in PL/pgSQL
CREATE FUNCTION handle(t text, k text, amt int, do_complete boolean) RETURNS text
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE r idem_claim_result;
BEGIN
    r := idem_claim(t, k);
    IF r.outcome = 'claimed' THEN
        INSERT INTO audit (what, info) VALUES ('handled', k || ' ' || amt);
        IF do_complete THEN
            PERFORM idem_complete(t, k, r.token, jsonb_build_object('amt', amt));
        END IF;
    END IF;
    RETURN r.outcome || ' seen=' || (SELECT count(*) FROM idempotency_records WHERE tenant_id = t);
END $$;
-- the same inside an exception block (a subtransaction) whose business write
-- may fail
CREATE FUNCTION handle_guarded(t text, k text, amt int) RETURNS text
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE r idem_claim_result;
BEGIN
    BEGIN
        r := idem_claim(t, k);
        INSERT INTO audit (what, info) VALUES ('guarded', k || ' ' || (100 / amt));
        IF r.outcome = 'claimed' THEN
            PERFORM idem_complete(t, k, r.token, jsonb_build_object('amt', amt));
        END IF;
        RETURN r.outcome;
    EXCEPTION WHEN division_by_zero THEN
        RETURN 'caught ' || coalesce(r.outcome, '?');
    END;
END $$;

-- inbox triggers: a claim per inserted row
CREATE FUNCTION inbox_claim() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE r idem_claim_result;
BEGIN
    r := idem_claim(NEW.tenant, NEW.key);
    NEW.outcome := r.outcome;
    NEW.token := r.token;
    IF r.outcome = 'claimed' AND NEW.amount % 3 = 0 THEN
        PERFORM idem_complete(NEW.tenant, NEW.key, r.token, jsonb_build_object('amount', NEW.amount));
        NEW.outcome := 'completed';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER inbox_claim BEFORE INSERT ON inbox FOR EACH ROW EXECUTE FUNCTION inbox_claim();

CREATE FUNCTION inbox_after() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('inbox', NEW.key || ' ' || NEW.outcome);
    UPDATE inbox SET seen = (SELECT count(*) FROM idempotency_records WHERE tenant_id = NEW.tenant)
        WHERE id = NEW.id;
    RETURN NULL;
END $$;
CREATE TRIGGER inbox_after AFTER INSERT ON inbox FOR EACH ROW EXECUTE FUNCTION inbox_after();

-- deferred to COMMIT: what the records say about the row's key then
CREATE FUNCTION inbox_deferred() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO audit (what, info)
        SELECT 'inbox-deferred', NEW.key || ' ' || coalesce((SELECT status FROM idem_lookup(NEW.tenant, NEW.key)), 'none')
            || ' ' || (SELECT count(*) FROM idempotency_records WHERE tenant_id = NEW.tenant);
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER inbox_deferred AFTER INSERT ON inbox
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION inbox_deferred();

-- Trigger functions for idempotency_records.  A case creates the triggers it
-- wants before it starts and drops them afterwards (rec_triggers()).
CREATE FUNCTION rec_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('rec', TG_OP || ' ' || OLD.key || ' ' || OLD.status);
    ELSE
        PERFORM pg_notify('rec', TG_OP || ' ' || NEW.key || ' ' || NEW.status);
    END IF;
    RETURN NULL;
END $$;
-- the NOTIFY statement (a utility command) rather than pg_notify()
CREATE FUNCTION rec_notify_stmt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('NOTIFY rec, %L', TG_OP || ' ' || NEW.key || ' ' || NEW.status);
    RETURN NULL;
END $$;
CREATE FUNCTION rec_count_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO audit (what, info)
        SELECT 'rec-count', TG_OP || ' ' || NEW.key || ' ' || count(*) || ' '
                 || count(*) FILTER (WHERE status = 'processing')
            FROM idempotency_records;
    RETURN NULL;
END $$;
CREATE FUNCTION rec_deferred() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO audit (what, info) VALUES ('rec-deferred', TG_OP || ' ' || NEW.key || ' ' || NEW.status);
    RETURN NULL;
END $$;
CREATE FUNCTION rec_statement() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO audit (what, info)
        SELECT 'rec-statement', TG_OP || ' ' || count(*) FROM new_rows;
    RETURN NULL;
END $$;
CREATE FUNCTION rec_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.key LIKE '%boom%' THEN
        RAISE EXCEPTION 'refused key %', NEW.key USING ERRCODE = 'P0001';
    END IF;
    RETURN NEW;
END $$;
-- a claim made while a record is being written (nested claim)
CREATE FUNCTION rec_shadow_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.key NOT LIKE 'shadow-%' THEN
        INSERT INTO audit (what, info)
            VALUES ('shadow', NEW.key || ' ' || (idem_claim(NEW.tenant_id, 'shadow-' || NEW.key)).outcome);
    END IF;
    RETURN NULL;
END $$;
CREATE FUNCTION rec_touch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.fingerprint := coalesce(NEW.fingerprint, 'set-by-trigger');
    RETURN NEW;
END $$;

CREATE FUNCTION outbox_settle() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM idem_complete(NEW.tenant, NEW.key, NEW.token, jsonb_build_object('outbox', NEW.id));
    INSERT INTO audit (what, info)
        SELECT 'outbox-settled', NEW.key || ' ' || count(*) FROM idempotency_records
            WHERE tenant_id = NEW.tenant AND status = 'completed';
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER outbox_settle AFTER INSERT ON outbox
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION outbox_settle();

-- transaction control inside a procedure: claims on both sides of a COMMIT
CREATE PROCEDURE claim_batches(t text, n int, per int, fail_at int DEFAULT 0) LANGUAGE plpgsql AS $$
DECLARE r idem_claim_result;
BEGIN
    FOR i IN 1..n LOOP
        r := idem_claim(t, 'p' || i);
        INSERT INTO audit (what, info) VALUES ('proc', 'p' || i || ' ' || r.outcome);
        IF r.outcome = 'claimed' AND i % 2 = 0 THEN
            PERFORM idem_complete(t, 'p' || i, r.token, '{"proc": true}');
        END IF;
        IF i = fail_at THEN
            RAISE EXCEPTION 'procedure fails at %', i;
        END IF;
        IF i % per = 0 THEN
            COMMIT;
        END IF;
    END LOOP;
END $$;

-- complete a held claim, then fail: the block's work (the completion) is undone
CREATE FUNCTION complete_then_fail(t text, k text, tok bigint) RETURNS text
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    BEGIN
        PERFORM idem_complete(t, k, tok, '{"inner": true}');
        PERFORM 1 / 0;
    EXCEPTION WHEN division_by_zero THEN
        RETURN 'undone ' || coalesce((SELECT status FROM idem_lookup(t, k)), 'none');
    END;
    RETURN 'not reached';
END $$;

-- Roles (cluster-wide, created by run.py): diff_app has the documented
-- application grants; diff_noinsert may not insert records (claims by it are
-- written at once, so both sides fail at the claim).
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_records, ledger, audit, inbox, outbox, checked, orders
    TO diff_app;
GRANT SELECT ON rec_view TO diff_app, diff_noinsert;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO diff_app, diff_noinsert;
GRANT SELECT, UPDATE, DELETE ON idempotency_records TO diff_noinsert;
GRANT SELECT, INSERT, UPDATE, DELETE ON ledger, audit, inbox, outbox, checked, orders TO diff_noinsert;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO diff_app, diff_noinsert;
