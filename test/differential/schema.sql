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
    FOREACH t IN ARRAY ARRAY['audit', 'inbox', 'outbox', 'checked', 'orders', 'refs', 'noisy'] LOOP
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

-- Wait until the clock has moved on by at least a microsecond.  A held
-- claim's settle costs well under a microsecond, so in a tight loop the on
-- side can stamp one key's completion and the next key's claim with the same
-- microsecond where the off side, with an UPDATE in between, cannot: equal
-- timestamps by speed alone, which the normalisation would report.
CREATE FUNCTION next_microsecond() RETURNS void LANGUAGE plpgsql AS $$
DECLARE t timestamptz := clock_timestamp();
BEGIN
    WHILE clock_timestamp() = t LOOP
    END LOOP;
END $$;

-- transaction control inside a procedure: claims on both sides of a COMMIT
CREATE PROCEDURE claim_batches(t text, n int, per int, fail_at int DEFAULT 0) LANGUAGE plpgsql AS $$
DECLARE r idem_claim_result;
BEGIN
    FOR i IN 1..n LOOP
        PERFORM next_microsecond();
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

-- ---------------------------------------------------------------------------
-- Issue 19's shapes (shapes.py: other_session_ddl, privileges_midway,
-- altered_table, record_input, collation_case).

-- Record-input functions run domain checks inside a built-in
-- (jsonb_populate_record, json_populate_recordset, jsonb_to_record ... AS
-- r(k recorded_key), '(k1)'::text::rec_ref): rec_ref's field is checked by
-- recorded_key's CHECK, which reads the records.  noisy_key's check reads
-- them too and says what it saw in a NOTICE, so a passing check still shows
-- what it saw.
CREATE TYPE rec_ref AS (k recorded_key);
CREATE FUNCTION noisy_seen(v text) RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RAISE NOTICE 'domain check of %: % records, % processing', v,
        (SELECT count(*) FROM idempotency_records),
        (SELECT count(*) FROM idempotency_records WHERE status = 'processing');
    RETURN true;
END $$;
CREATE DOMAIN noisy_key AS text CHECK (noisy_seen(VALUE));
CREATE TYPE noisy_ref AS (k noisy_key, n int);
CREATE TABLE refs (id int PRIMARY KEY, k recorded_key, nk noisy_key);

-- A btree operator class whose support function is PL/pgSQL that reads the
-- records (and says so): a business INSERT into noisy runs it for every
-- comparison its unique index makes.  The operators are text's own.
CREATE FUNCTION noisy_cmp(a text, b text) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RAISE NOTICE 'compare % %: % records', a, b, (SELECT count(*) FROM idempotency_records);
    RETURN bttextcmp(a, b);
END $$;
CREATE OPERATOR CLASS noisy_ops FOR TYPE text USING btree AS
    OPERATOR 1 <, OPERATOR 2 <=, OPERATOR 3 =, OPERATOR 4 >=, OPERATOR 5 >,
    FUNCTION 1 noisy_cmp(text, text);
CREATE TABLE noisy (k text, n int);
CREATE UNIQUE INDEX noisy_k ON noisy (k noisy_ops);

-- A case-insensitive nondeterministic collation, for the key column
-- (altered_table, collation_case) and for an index of its own.
CREATE COLLATION alt_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
-- what a volatile column default draws from (altered_table)
CREATE SEQUENCE alt_seq;

-- Undo whatever a case did to idempotency_records (harness.ALTERATIONS) or
-- another session did to it (a CREATE INDEX or CREATE TRIGGER that was
-- granted its lock, a REVOKE): the table is again exactly as the extension
-- made it, so the next case holds claims again.  Each step only when needed:
-- an ALTER TABLE invalidates the table's cached shape in every session.
CREATE FUNCTION restore_records_table() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    r record;
    tbl regclass := 'idempotency_records'::regclass;
BEGIN
    IF EXISTS (SELECT FROM idem_tenant_isolation) THEN
        PERFORM idem_set_tenant_isolation(false);
    END IF;
    FOR r IN SELECT index_name FROM idem_extra_indexes LOOP
        PERFORM idem_drop_index(r.index_name);
    END LOOP;
    FOR r IN SELECT polname FROM pg_policy WHERE polrelid = tbl LOOP
        EXECUTE format('DROP POLICY %I ON idempotency_records', r.polname);
    END LOOP;
    IF (SELECT relrowsecurity OR relforcerowsecurity FROM pg_class WHERE oid = tbl) THEN
        ALTER TABLE idempotency_records DISABLE ROW LEVEL SECURITY, NO FORCE ROW LEVEL SECURITY;
    END IF;
    FOR r IN SELECT tgname FROM pg_trigger WHERE tgrelid = tbl AND NOT tgisinternal
               AND (tgname LIKE 'alt\_%' OR tgname LIKE 'peer\_%') LOOP
        EXECUTE format('DROP TRIGGER %I ON idempotency_records', r.tgname);
    END LOOP;
    FOR r IN SELECT rulename FROM pg_rewrite WHERE ev_class = tbl LOOP
        EXECUTE format('DROP RULE %I ON idempotency_records', r.rulename);
    END LOOP;
    -- a child (alt_child, alt_archive, ...) or a parent (alt_parent) by inheritance
    FOR r IN SELECT inhrelid::regclass AS rel FROM pg_inherits WHERE inhparent = tbl LOOP
        EXECUTE format('DROP TABLE %s', r.rel);
    END LOOP;
    FOR r IN SELECT inhparent::regclass AS rel FROM pg_inherits WHERE inhrelid = tbl LOOP
        EXECUTE format('ALTER TABLE idempotency_records NO INHERIT %s', r.rel);
        EXECUTE format('DROP TABLE %s', r.rel);
    END LOOP;
    FOR r IN SELECT conname FROM pg_constraint WHERE conrelid = tbl AND conname LIKE 'alt\_%' LOOP
        EXECUTE format('ALTER TABLE idempotency_records DROP CONSTRAINT %I', r.conname);
    END LOOP;
    FOR r IN SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               WHERE i.indrelid = tbl AND (c.relname LIKE 'alt\_%' OR c.relname LIKE 'peer\_%') LOOP
        EXECUTE format('DROP INDEX %I', r.relname);
    END LOOP;
    FOR r IN SELECT attname, attnotnull, atthasdef, attcollation FROM pg_attribute
               WHERE attrelid = tbl AND attnum > 0 AND NOT attisdropped LOOP
        IF r.attname LIKE 'alt\_%' THEN
            EXECUTE format('ALTER TABLE idempotency_records DROP COLUMN %I', r.attname);
            CONTINUE;
        END IF;
        IF r.atthasdef THEN
            EXECUTE format('ALTER TABLE idempotency_records ALTER COLUMN %I DROP DEFAULT', r.attname);
        END IF;
        IF NOT r.attnotnull AND r.attname IN ('token', 'expires_at', 'created_at', 'updated_at', 'ttl',
                                               'tenant_id', 'key', 'status') THEN
            EXECUTE format('DELETE FROM idempotency_records WHERE %I IS NULL', r.attname);
            EXECUTE format('ALTER TABLE idempotency_records ALTER COLUMN %I SET NOT NULL', r.attname);
        END IF;
        IF r.attname IN ('tenant_id', 'key') AND r.attcollation <> 'pg_catalog."C"'::regcollation THEN
            -- rec_view names the column: made again around the change
            DROP VIEW rec_view;
            EXECUTE format('ALTER TABLE idempotency_records ALTER COLUMN %I TYPE text COLLATE "C"', r.attname);
            CREATE VIEW rec_view AS SELECT tenant_id, key, status, token FROM idempotency_records;
            GRANT SELECT ON rec_view TO diff_app, diff_noinsert;
        END IF;
    END LOOP;
    -- the owner the extension gave it (owner_rights changes it), with the
    -- table's and the schema's privileges as schema.sql left them (pristine)
    IF (SELECT relowner FROM pg_class WHERE oid = tbl)
            <> (SELECT extowner FROM pg_extension WHERE extname = 'idempotency') THEN
        EXECUTE format('ALTER TABLE idempotency_records OWNER TO %s',
                       (SELECT extowner::regrole FROM pg_extension WHERE extname = 'idempotency'));
    END IF;
    IF (SELECT relacl::text FROM pg_class WHERE oid = tbl) IS DISTINCT FROM (SELECT records_acl FROM pristine) THEN
        REVOKE ALL ON idempotency_records FROM PUBLIC, diff_app, diff_noinsert, diff_owner;
        EXECUTE format('REVOKE ALL ON idempotency_records FROM %s',
                       (SELECT extowner::regrole FROM pg_extension WHERE extname = 'idempotency'));
        EXECUTE format('GRANT ALL ON idempotency_records TO %s',
                       (SELECT extowner::regrole FROM pg_extension WHERE extname = 'idempotency'));
    END IF;
    IF (SELECT nspacl::text FROM pg_namespace WHERE nspname = 'public')
            IS DISTINCT FROM (SELECT public_acl FROM pristine) THEN
        REVOKE ALL ON SCHEMA public FROM PUBLIC, diff_app, diff_noinsert, diff_owner;
        GRANT USAGE ON SCHEMA public TO PUBLIC;
    END IF;
    -- the grants schema.sql gives at the end of this file
    IF NOT (has_table_privilege('diff_app', tbl, 'SELECT') AND has_table_privilege('diff_app', tbl, 'INSERT')
            AND has_table_privilege('diff_app', tbl, 'UPDATE') AND has_table_privilege('diff_app', tbl, 'DELETE')) THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_records TO diff_app;
    END IF;
    IF has_table_privilege('diff_noinsert', tbl, 'INSERT') OR NOT (has_table_privilege('diff_noinsert', tbl, 'SELECT')
            AND has_table_privilege('diff_noinsert', tbl, 'UPDATE')
            AND has_table_privilege('diff_noinsert', tbl, 'DELETE')) THEN
        REVOKE INSERT ON idempotency_records FROM diff_noinsert;
        GRANT SELECT, UPDATE, DELETE ON idempotency_records TO diff_noinsert;
    END IF;
END $$;

-- PostgreSQL reads the catalog changes other sessions committed (a REVOKE)
-- only when it takes a lock it does not hold yet, or when signalled to catch
-- up, which depends on timing.  privileges_midway selects from a table of
-- these that its transaction has not touched yet right after each change, so
-- both sides see the change from the same statement on.
CREATE TABLE sync_1 (); CREATE TABLE sync_2 (); CREATE TABLE sync_3 (); CREATE TABLE sync_4 ();
GRANT SELECT ON sync_1, sync_2, sync_3, sync_4 TO diff_app, diff_noinsert;
GRANT SELECT, INSERT, UPDATE, DELETE ON refs, noisy TO diff_app, diff_noinsert;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO diff_app, diff_noinsert;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO diff_app, diff_noinsert;
REVOKE EXECUTE ON FUNCTION restore_records_table() FROM PUBLIC, diff_app, diff_noinsert;

-- ---------------------------------------------------------------------------
-- Issue 34's classes (shapes.py: rollback_end, hold_cursor, inherited,
-- owner_rights, peer_in_statement, settle_no_rights, toast_locks, explain).

-- Another session acting inside one statement of this one (peer_in_statement):
-- peer_sql runs a query returning one text column in a new session of the
-- same database, through dblink over loopback, and returns its rows joined
-- by spaces.  SECURITY DEFINER: dblink wants a password from a non-superuser.
CREATE EXTENSION dblink;
CREATE FUNCTION peer_sql(q text) RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
DECLARE r text;
BEGIN
    SELECT string_agg(coalesce(v, 'null'), ' ') INTO r
        FROM dblink(format('host=127.0.0.1 port=%s dbname=%s user=%s '
                           'options=''-c lock_timeout=300ms -c statement_timeout=5s''',
                           current_setting('port'), current_database(), current_user), q) AS t(v text);
    RETURN r;
END $$;
-- claim k1, let the other session act, claim k2: in one statement
CREATE FUNCTION between_claims(t text, k1 text, q text, k2 text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE a text; p text; b text;
BEGIN
    a := (idem_claim(t, k1)).outcome;
    p := peer_sql(q);
    b := (idem_claim(t, k2)).outcome;
    RETURN a || ' / ' || coalesce(p, '-') || ' / ' || b;
END $$;

-- A response of about 3.8 kB that pglz cannot shrink much (hex of md5s):
-- stored out of line, in the TOAST table.  The same on both sides.
CREATE FUNCTION big_response(seed text, n int DEFAULT 120) RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('seed', seed, 'blob', string_agg(md5(seed || i), '' ORDER BY i))
        FROM generate_series(1, n) i
$$;

-- The locks this backend holds (toast_locks observes it after each step in a
-- transaction): relations named so that both databases agree (a TOAST
-- table's name has its parent's OID), catalogs (this query's own) left out.
CREATE FUNCTION lock_set(OUT locktype text, OUT relation text, OUT mode text, OUT n bigint)
    RETURNS SETOF record LANGUAGE sql VOLATILE AS $$
SELECT l.locktype,
       CASE WHEN l.relation IS NULL THEN NULL
            WHEN l.database <> 0 AND l.database <> (SELECT oid FROM pg_database WHERE datname = current_database())
                THEN 'a relation of another database'
            WHEN c.oid IS NULL THEN 'a dropped relation'
            WHEN ns.nspname = 'pg_toast' THEN
                CASE c.relkind WHEN 'i' THEN 'toast index of ' ELSE 'toast of ' END
                || (SELECT o.relname FROM pg_class o WHERE o.reltoastrelid =
                        coalesce((SELECT i.indrelid FROM pg_index i WHERE i.indexrelid = c.oid), c.oid))
            WHEN c.relpersistence = 't' THEN 'temporary ' || c.relname
            ELSE c.oid::regclass::text END,
       l.mode, count(*)
  FROM pg_locks l
  LEFT JOIN pg_class c ON c.oid = l.relation
  LEFT JOIN pg_namespace ns ON ns.oid = c.relnamespace
 WHERE l.pid = pg_backend_pid() AND l.locktype NOT IN ('virtualxid', 'transactionid')
   AND ns.nspname IS DISTINCT FROM 'pg_catalog'
   -- planning a statement keeps locks on the indexes of the tables it
   -- reads or writes; running a cached plan, or the direct read, keeps one
   -- only on an index it reads: physical, and listed in docs/held-claims.md
   AND NOT (c.relkind = 'i' AND EXISTS
            (SELECT FROM pg_index i WHERE i.indexrelid = c.oid
                AND i.indrelid = 'idempotency_records'::regclass))
   -- the token mark moves when the clock passes it (about every ten
   -- seconds per database), whichever claim that happens in: timing
   AND c.relname IS DISTINCT FROM 'idempotency_tokens'
 GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
$$;

-- What restore_records_table() returns the table's and the schema's
-- privileges to (owner_rights and privileges_midway change them).
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO diff_app, diff_noinsert;
REVOKE EXECUTE ON FUNCTION restore_records_table() FROM PUBLIC, diff_app, diff_noinsert;
CREATE TABLE pristine AS
    SELECT (SELECT relacl::text FROM pg_class WHERE oid = 'idempotency_records'::regclass) AS records_acl,
           (SELECT nspacl::text FROM pg_namespace WHERE nspname = 'public') AS public_acl;
