-- Casts to a composite, a domain with a nondeterministic collation and information_schema's domains.
-- Crashed a backend (SIGSEGV, then "terminating any other active server
-- processes") at commit 6450117, found by test/sqlsmith/run (lazy mode, seed 1, query 1896).
-- Backtrace: MemoryContextReset <- PostgresMain calling a reset callback
-- that domain_is_loud() (then in src/readers.c, now gone) registered with its
-- DomainConstraintRef on the stack (issue 19, item 1).  test/sqlsmith/run
-- runs every file here, in a transaction it rolls back, before SQLsmith.
-- The first statement loads the library where it is not preloaded.
SELECT count(*) FROM idem_lookup('sqlsmith', 'reproducer');
insert into shop.customers values (
33, 
case when (select schemaname from pg_catalog.pg_rules limit 1 offset 3)
       is NULL then cast(null as text) else cast(null as text) end
  , 
cast(null as shop.email), 
cast(null as shop.address), 
default, 
default, 
default, 
cast(null as information_schema.sql_identifier), 
cast(nullif(cast(null as information_schema.yes_or_no),
  cast(null as information_schema.yes_or_no)) as information_schema.yes_or_no), 
cast(null as information_schema.time_stamp), 
cast(null as information_schema.character_data));
