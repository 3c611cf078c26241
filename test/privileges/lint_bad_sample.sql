-- Known-bad extension SQL: every rule of sql_lint.py must fire on this file
-- (the 55-privileges suite checks that, so the review can fail).
-- Each statement is tagged with the rule it must trigger.

CREATE OR REPLACE FUNCTION @extschema@.r1() RETURNS int LANGUAGE c AS 'x', 'y';           -- R1
CREATE TABLE IF NOT EXISTS @extschema@.r2 (a int);                                        -- R2
CREATE FUNCTION @extschema@.r3() RETURNS int LANGUAGE c SECURITY DEFINER AS 'x', 'y';     -- R3
CREATE FUNCTION @extschema@.r4() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;               -- R4
SET search_path = public;                                                                  -- R5
CREATE VIEW @extschema@.r6 AS SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = 1;         -- R6
CREATE VIEW @extschema@.r7 AS SELECT 1 FROM pg_catalog.pg_class c WHERE c.relkind IN ('r'); -- R7
CREATE VIEW @extschema@.r8 AS SELECT CASE c.relkind WHEN 'r' THEN 1 END FROM pg_catalog.pg_class c; -- R8
CREATE VIEW @extschema@.r9 AS SELECT 1 FROM pg_catalog.pg_class c WHERE c.relname LIKE 'x%'; -- R9
CREATE VIEW @extschema@.r10 AS SELECT now();                                               -- R10
CREATE VIEW @extschema@.r11 AS SELECT 1 FROM pg_class;                                     -- R11
COMMENT ON TABLE @extschema@.r2 IS 'R12 lives in: @extschema@';                            -- R12
GRANT SELECT ON @extschema@.r2 TO PUBLIC;                                                  -- R13
CREATE FUNCTION @extschema@.r14() RETURNS int LANGUAGE c AS 'x', 'y';                      -- R14
REVOKE ALL ON FUNCTION @extschema@.r1(), @extschema@.r3(), @extschema@.r4() FROM PUBLIC;
