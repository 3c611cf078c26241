/*
 * guc.c
 *		The idempotency.* settings.
 *
 * Defined whenever the library is loaded (preloaded or on first call), so
 * the SQL functions work without shared_preload_libraries.  Durations are
 * integers with units, like statement_timeout, so "5min" and "24h" work.
 */
#include "postgres.h"

#include <limits.h>

#include "postmaster/interrupt.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "guc.h"
#include "idempotency.h"

int			idem_default_lease_ms = 5 * 60 * 1000;
int			idem_default_ttl_s = 24 * 60 * 60;
int			idem_min_ttl_s = 0;
int			idem_stale_action = IDEM_STALE_RELEASE;
int			idem_max_response_size = 1024 * 1024;
int			idem_sweep_interval_ms = 10 * 1000;
int			idem_sweep_batch_size = 1000;
bool		idem_track_stats = true;
bool		idem_defer_writes = true;
bool		idem_direct_reads = true;
int			idem_durability_check = IDEM_DURABILITY_WARNING;
int			idem_claim_sweep = 0;

/*
 * A sweep interval is 0 (off) or at least 100 ms: a smaller one would start
 * a worker per database continuously.
 */
static bool
check_sweep_interval(int *newval, void **extra, GucSource source)
{
	if (*newval > 0 && *newval < 100)
	{
		GUC_check_errdetail("idempotency.sweep_interval must be 0 (off) or at least 100 ms.");
		return false;
	}
	return true;
}

static const struct config_enum_entry durability_check_options[] = {
	{"error", IDEM_DURABILITY_ERROR, false},
	{"warning", IDEM_DURABILITY_WARNING, false},
	{"off", IDEM_DURABILITY_OFF, false},
	{NULL, 0, false}
};

static const struct config_enum_entry stale_action_options[] = {
	{"release", IDEM_STALE_RELEASE, false},
	{"fail", IDEM_STALE_FAIL, false},
	{NULL, 0, false}
};

/*
 * Register every setting.  Called from _PG_init only.
 */
void
idem_define_settings(void)
{
	DefineCustomIntVariable("idempotency.lease",
							"Default lease of a claim (idem_claim without lease).",
							"A processing record whose lease has expired can be taken over.",
							&idem_default_lease_ms,
							5 * 60 * 1000, 1, INT_MAX,
							PGC_USERSET, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.ttl",
							"Default retention of a completed or failed record (idem_claim without ttl).",
							NULL,
							&idem_default_ttl_s,
							24 * 60 * 60, 1, INT_MAX,
							PGC_USERSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	/*
	 * SUSET: the floor protects against clients that ask for a retention
	 * shorter than the broker's redelivery window, so clients must not be
	 * able to lower it themselves.
	 */
	DefineCustomIntVariable("idempotency.min_ttl",
							"Shortest retention a claim may ask for; 0 disables the check.",
							NULL,
							&idem_min_ttl_s,
							0, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomEnumVariable("idempotency.stale_action",
							 "What happens to a claim whose lease expired: release (delete) or fail.",
							 NULL,
							 &idem_stale_action,
							 IDEM_STALE_RELEASE, stale_action_options,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.max_response_size",
							"Largest response or failure document idem_complete and idem_release accept.",
							NULL,
							&idem_max_response_size,
							1024 * 1024, 0, MaxAllocSize / 2,
							PGC_SUSET, GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	/* milliseconds, so that a sub-second value is not rounded to 0 (= off) */
	DefineCustomIntVariable("idempotency.sweep_interval",
							"Time between sweeps of the background worker; 0 turns sweeping off.",
							NULL,
							&idem_sweep_interval_ms,
							10 * 1000, 0, 24 * 60 * 60 * 1000,
							PGC_SIGHUP, GUC_UNIT_MS,
							check_sweep_interval, NULL, NULL);

	DefineCustomIntVariable("idempotency.sweep_batch_size",
							"Records per sweep transaction (and idem_sweep's default batch).",
							NULL,
							&idem_sweep_batch_size,
							1000, 1, 1000000,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);

	/*
	 * A stored outcome that a crash can lose makes its key run again, so
	 * completing under settings that acknowledge before the commit is
	 * durable is reported.  SUSET: an administrator decides, not clients.
	 */
	DefineCustomEnumVariable("idempotency.durability_check",
							 "What idem_complete and idem_release do when a crash or failover could lose the outcome they store.",
							 "Checked: synchronous_commit = off, and synchronous_commit = local with synchronous_standby_names set.",
							 &idem_durability_check,
							 IDEM_DURABILITY_WARNING, durability_check_options,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);

	/*
	 * USERSET: the removal runs as the calling role, with its privileges
	 * and under its row-level security (claim_sweep.c), so a session may
	 * choose it for itself, as it may call idem_sweep()'s DELETE on the
	 * rows it can reach.  Bounded so that one claim's extra work stays
	 * small.
	 */
	DefineCustomIntVariable("idempotency.claim_sweep",
							"Records of its tenant after its key (or its first ones) that a fresh idem_claim examines, removing those expired; 0 turns this off.",
							"For databases without a scheduler for idem_sweep(): the claim's tenant only, as the calling role.",
							&idem_claim_sweep,
							0, 0, 1000,
							PGC_USERSET, 0,
							NULL, NULL, NULL);

	/* a switch so the benchmark can measure what the counters cost */
	DefineCustomBoolVariable("idempotency.track_stats",
							 "Count claims, replays, sweeps ... in shared memory (idem_stats).",
							 "Needs shared_preload_libraries = 'idempotency'.",
							 &idem_track_stats,
							 true,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);

	/*
	 * USERSET: writing every claim at once is always correct, only slower,
	 * so any session may choose it (see docs/held-claims.md).
	 */
	DefineCustomBoolVariable("idempotency.defer_writes",
							 "Hold a fresh claim in memory and write its record once, when it settles.",
							 "Off writes every claim's record at once.",
							 &idem_defer_writes,
							 true,
							 PGC_USERSET, 0,
							 NULL, NULL, NULL);

	/*
	 * A switch for the differential suite, which proves that reading a
	 * record without SPI (direct_read.c) answers as the SQL read does.
	 */
	DefineCustomBoolVariable("idempotency.direct_reads",
							 "Read a record by primary key without SPI where that sees exactly what SQL would.",
							 "Off reads every record through SQL (only slower).",
							 &idem_direct_reads,
							 true,
							 PGC_USERSET, GUC_NOT_IN_SAMPLE,
							 NULL, NULL, NULL);

	MarkGUCPrefixReserved("idempotency");
}

/*
 * In the sweeper's processes (launcher.c, database_sweeper.c): read the
 * configuration again if a SIGHUP asked for it, so that a changed
 * sweep_interval or batch size takes effect within a round.
 */
void
idem_reload_config_if_asked(void)
{
	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
	}
}
