-- A cast to one of information_schema's domains, as in the issue.
-- Crashed a backend (SIGSEGV, then "terminating any other active server
-- processes") at commit 6450117, as issue 19 reports it.
-- Backtrace: MemoryContextReset <- PostgresMain calling a reset callback
-- that domain_is_loud() (then in src/readers.c, now gone) registered with its
-- DomainConstraintRef on the stack (issue 19, item 1).  test/sqlsmith/run
-- runs every file here, in a transaction it rolls back, before SQLsmith.
-- The first statement loads the library where it is not preloaded.
SELECT count(*) FROM idem_lookup('sqlsmith', 'reproducer');
SELECT 1::information_schema.cardinal_number;
