-- idempotency 1.0 -> 1.1.
--
-- `CREATE EXTENSION idempotency` installs idempotency--1.0.sql (frozen as
-- shipped, never edited) and then runs this script, so a fresh install and
-- an upgraded one execute the same statements: this file is the only
-- definition of what 1.1 adds.  test/suites/80-upgrade compares an upgraded
-- database (with live claims) against a fresh install.
--
-- Conventions (see docs/upgrading.md):
--   - every name is schema-qualified with @extschema@. and every operator
--     and function from pg_catalog is written pg_catalog.xxx, because the
--     script runs with the extension's schema first in search_path;
--   - no CREATE OR REPLACE of anything a user could have pre-created, no
--     SET search_path; ALTER FUNCTION ... only on our own members;
--   - every new function, table, sequence or view: REVOKE ALL ... FROM PUBLIC;
--   - anything whose content must survive pg_dump (a table holding a
--     choice or state): SELECT pg_catalog.pg_extension_config_dump(...);
--   - each engineer appends one section with a clear header below; the
--     statements must work both on an empty 1.0 table and on a live one
--     (short locks only: this runs while applications claim keys).

\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.1'" to load this file. \quit

-- ===========================================================================
-- Section 1: tenant isolation and operator indexes survive pg_dump (issue 12)
-- ===========================================================================
-- (filled in by the upgrade/backup work of issue 12)
