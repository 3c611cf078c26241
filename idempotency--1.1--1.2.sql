-- idempotency 1.1 -> 1.2.
--
-- CREATE EXTENSION runs idempotency--1.0.sql, idempotency--1.0--1.1.sql and
-- this script, so a fresh install and an upgraded one execute the same
-- statements.  The conventions of idempotency--1.0--1.1.sql hold here too
-- (everything qualified with @extschema@. or pg_catalog., no CREATE OR
-- REPLACE of what a user could have made, REVOKE ALL ... FROM PUBLIC on
-- every new object, short locks only: it runs while applications claim
-- keys).  One section per change, each with its header.

\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.2'" to load this file. \quit

-- ===========================================================================
-- Section 1: recovery points that outlive the sweeper (docs/multistep.md)
-- ===========================================================================

-- ===========================================================================
-- Section 2: scale-out you can operate (docs/scale-out.md)
-- ===========================================================================
