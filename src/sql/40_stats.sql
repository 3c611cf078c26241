-- Live statistics from shared memory (needs shared_preload_libraries).

CREATE FUNCTION @extschema@.idem_stats_read(
    OUT datid              oid,
    OUT datname            text,
    OUT claims             bigint,
    OUT claimed            bigint,
    OUT replays            bigint,
    OUT in_progress        bigint,
    OUT mismatches         bigint,
    OUT failed_replays     bigint,
    OUT takeovers          bigint,
    OUT completes          bigint,
    OUT releases           bigint,
    OUT heartbeats         bigint,
    OUT swept_stale        bigint,
    OUT swept_expired      bigint,
    OUT last_sweep_at      timestamptz,
    OUT last_sweep_ms      double precision,
    OUT last_sweep_removed bigint,
    OUT last_sweep_error   text,
    OUT sweeps             bigint,
    OUT stats_reset        timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_stats_read'
LANGUAGE C VOLATILE PARALLEL SAFE;

CREATE FUNCTION @extschema@.idem_stats_reset()
RETURNS void
AS 'MODULE_PATHNAME', 'idem_stats_reset'
LANGUAGE C VOLATILE PARALLEL SAFE;

-- One row per database since the server started (or the last reset).
CREATE VIEW @extschema@.idem_stats AS
    SELECT * FROM @extschema@.idem_stats_read();

REVOKE ALL ON FUNCTION @extschema@.idem_stats_read(), @extschema@.idem_stats_reset() FROM PUBLIC;
REVOKE ALL ON @extschema@.idem_stats FROM PUBLIC;
