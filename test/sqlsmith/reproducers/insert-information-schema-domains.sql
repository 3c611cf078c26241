-- Casts to information_schema's domains in an INSERT.
-- Crashed a backend (SIGSEGV, then "terminating any other active server
-- processes") at commit 6450117, found by test/sqlsmith/run (lazy mode, seed 1, query 4320).
-- Backtrace: MemoryContextReset <- PostgresMain calling a reset callback
-- that domain_is_loud() (then in src/readers.c, now gone) registered with its
-- DomainConstraintRef on the stack (issue 19, item 1).  test/sqlsmith/run
-- runs every file here, in a transaction it rolls back, before SQLsmith.
-- The first statement loads the library where it is not preloaded.
SELECT count(*) FROM idem_lookup('sqlsmith', 'reproducer');
insert into information_schema.sql_parts values (
cast(null as information_schema.character_data), 
default, 
cast(null as information_schema.yes_or_no), 
cast(null as information_schema.character_data), 
cast(null as information_schema.character_data));
