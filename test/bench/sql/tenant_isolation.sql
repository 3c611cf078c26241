-- The secure rows (issue 34): tenant isolation as README.md sets it up, in
-- databases of their own (isolation is a property of the table), after
-- schema.sql.  Run by the owner; bench.py has already given :role exactly
-- the application role's GRANT lines of docs/privileges.md (read from the
-- page) and checks afterwards that the role is held by the policy.
--
-- psql variables: :isolation (on: bench_tenant and bench_tenant_replay;
-- off: bench_tenant_off, the same tables without it), :role.

\if :isolation
SELECT idem_set_tenant_isolation(true, 'app.tenant');

-- The hand-written references read and write tables of the same shape under
-- the same policy: the extension's own expression, copied word for word.
DO $$
DECLARE
    qual text;
    tbl  text;
BEGIN
    SELECT pg_get_expr(p.polqual, p.polrelid) INTO STRICT qual
      FROM pg_policy p
     WHERE p.polrelid = 'idempotency_records'::regclass AND p.polname = 'idem_tenant_isolation';
    FOREACH tbl IN ARRAY ARRAY['lean_records', 'replay_plain'] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', tbl);
        EXECUTE format('CREATE POLICY idem_tenant_isolation ON %I USING (%s)', tbl, qual);
    END LOOP;
END
$$;
\endif

-- What the application needs of the business and hand-written tables.
GRANT INSERT ON payments TO :role;
GRANT SELECT, INSERT, UPDATE ON lean_records TO :role;
GRANT SELECT ON replay_plain TO :role;
