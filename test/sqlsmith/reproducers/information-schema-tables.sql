-- SQLsmith's own first query (it loads the tables of the schema).
-- Crashed a backend (SIGSEGV, then "terminating any other active server
-- processes") at commit 6450117, found by test/sqlsmith/run (library mode: every seed, before any generated query).
-- Backtrace: MemoryContextReset <- PostgresMain calling a reset callback
-- that domain_is_loud() (then in src/readers.c, now gone) registered with its
-- DomainConstraintRef on the stack (issue 19, item 1).  test/sqlsmith/run
-- runs every file here, in a transaction it rolls back, before SQLsmith.
-- The first statement loads the library where it is not preloaded.
SELECT count(*) FROM idem_lookup('sqlsmith', 'reproducer');
select table_name, table_schema, is_insertable_into, table_type from information_schema.tables;
