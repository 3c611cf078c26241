-- idempotency 1.2 -> 1.3.
--
-- CREATE EXTENSION runs idempotency--1.0.sql and the update scripts up to
-- this one, so a fresh install and an upgraded one execute the same
-- statements.  The conventions of idempotency--1.0--1.1.sql hold here too
-- (everything qualified with @extschema@. or pg_catalog., no CREATE OR
-- REPLACE of what a user could have made, REVOKE ALL ... FROM PUBLIC on
-- every new object, short locks only: it runs while applications claim
-- keys).  One section per change, each with its header.

\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.3'" to load this file. \quit

-- ===========================================================================
-- Section 1: monitoring (docs/reference.md#monitoring, docs/operations.md)
-- ===========================================================================
-- What a scraper (postgres_exporter, sql_exporter) reads every few seconds:
-- one row of counters and gauges for this database, and the busiest
-- tenants, at most 100.  The counters come from shared memory, the gauges
-- from the expires_at index of idempotency_records (src/metrics.c).
--
-- SECURITY DEFINER: they count every tenant's records, tenant isolation on
-- or not, for a monitoring role that may not read the table; they return
-- only counts and tenant names.  EXECUTE: pg_monitor (and superusers).
--
-- Citus: nothing to do.  They are new objects (no DROP and CREATE of a
-- distributed function), take no tenant, so idem_distribute() never
-- distributes them, and call nothing that must exist on the workers first:
-- the ALTER EXTENSION that Citus sends the workers after this script
-- creates them there.  A call runs on the node it is made on: the counters
-- are that node's; the gauges read idempotency_records as a query on that
-- node sees it.
CREATE FUNCTION @extschema@.idem_metrics(
    OUT datname                  text,
    OUT claimed_total            bigint,
    OUT replays_total            bigint,
    OUT in_progress_total        bigint,
    OUT mismatches_total         bigint,
    OUT failed_total             bigint,
    OUT takeovers_total          bigint,
    OUT claims_in_progress       bigint,
    OUT oldest_claim_age_seconds double precision,
    OUT stuck_claims             bigint,
    OUT resumable_records        bigint,
    OUT expired_unswept_records  bigint,
    OUT sweeps_total             bigint,
    OUT sweep_errors_total       bigint,
    OUT last_sweep_at            timestamptz,
    OUT last_sweep_seconds       double precision,
    OUT last_sweep_removed       bigint,
    OUT lock_table_used_ratio    double precision,
    OUT stats_reset              timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_metrics'
LANGUAGE C VOLATILE PARALLEL RESTRICTED
SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION @extschema@.idem_metrics() IS
    'monitoring: this database''s counters, the gauges of idempotency_records and the lock table''s fill, in one row';

CREATE FUNCTION @extschema@.idem_metrics_tenants(
    top integer DEFAULT 10,
    OUT tenant                   text,
    OUT claims_in_progress       bigint,
    OUT oldest_claim_age_seconds double precision,
    OUT conflicts_total          bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_metrics_tenants'
LANGUAGE C VOLATILE PARALLEL RESTRICTED ROWS 10
SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION @extschema@.idem_metrics_tenants(integer) IS
    'monitoring: the busiest tenants (claims in progress, conflicts), at most top rows, 1 <= top <= 100';

REVOKE ALL ON FUNCTION @extschema@.idem_metrics() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_metrics_tenants(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_metrics() TO pg_monitor;
GRANT EXECUTE ON FUNCTION @extschema@.idem_metrics_tenants(integer) TO pg_monitor;
