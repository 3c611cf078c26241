-- A cast to a domain of the schema (shop.positive_int) in an INSERT into a partition.
-- Crashed a backend (SIGSEGV, then "terminating any other active server
-- processes") at commit 6450117, found by test/sqlsmith/run (lazy mode, seed 1, query 1218).
-- Backtrace: MemoryContextReset <- PostgresMain calling a reset callback
-- that domain_is_loud() (then in src/readers.c, now gone) registered with its
-- DomainConstraintRef on the stack (issue 19, item 1).  test/sqlsmith/run
-- runs every file here, in a transaction it rolls back, before SQLsmith.
-- The first statement loads the library where it is not preloaded.
SELECT count(*) FROM idem_lookup('sqlsmith', 'reproducer');
insert into shop.ledger_rest values (
default, 
case when cast(null as int8) <> (select sourceline from pg_catalog.pg_settings limit 1 offset 3)
       then cast(null as shop.positive_int) else cast(null as shop.positive_int) end
  , 
default, 
cast(coalesce(pg_catalog.pg_export_snapshot(),
  cast(null as text)) as text));
