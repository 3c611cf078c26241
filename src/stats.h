/*
 * stats.h
 *		Counters and last sweeps in shared memory (stats.c).
 */
#ifndef IDEM_STATS_H
#define IDEM_STATS_H

#include "idempotency.h"

typedef enum IdemCounter
{
	IDEM_STAT_CLAIMS,
	IDEM_STAT_CLAIMED,
	IDEM_STAT_REPLAYS,
	IDEM_STAT_IN_PROGRESS,
	IDEM_STAT_MISMATCHES,
	IDEM_STAT_FAILED_REPLAYS,
	IDEM_STAT_TAKEOVERS,
	IDEM_STAT_COMPLETES,
	IDEM_STAT_RELEASES,
	IDEM_STAT_HEARTBEATS,
	IDEM_STAT_SWEPT_STALE,
	IDEM_STAT_SWEPT_EXPIRED,
	IDEM_NUM_COUNTERS
} IdemCounter;

/* Tenants whose conflicts are counted, server-wide (stats.c). */
#define IDEM_TENANT_SLOTS		128

/* One database's counters and last sweep, read at once (idem_metrics). */
typedef struct IdemStatsSnapshot
{
	uint64		counters[IDEM_NUM_COUNTERS];
	TimestampTz stats_reset;
	TimestampTz last_sweep_at;	/* 0: no pass yet */
	double		last_sweep_ms;
	uint64		last_sweep_removed;
	uint64		sweeps;
	uint64		sweep_errors;
} IdemStatsSnapshot;

/* A tenant of the conflict table (idem_metrics_tenants). */
typedef struct IdemTenantConflicts
{
	char		tenant[IDEM_MAX_IDENTIFIER_BYTES + 1];
	uint64		conflicts;		/* exact since the tenant entered the table */
	uint64		weight;			/* with the weight it inherited: the order */
} IdemTenantConflicts;

extern bool idem_stats_available(void);
extern void idem_stats_request_shmem(void);
extern void idem_stats_add(IdemCounter counter, uint64 n);
extern void idem_stats_count_claim(const IdemClaimResult *res);
extern void idem_stats_sweep_finished(TimestampTz started, TimestampTz finished,
									  const IdemSweepCounts *counts,
									  const char *error);
extern void idem_stats_count_tenant_conflict(const text *tenant_id);
extern bool idem_stats_snapshot(IdemStatsSnapshot *snap);
extern int	idem_stats_tenant_conflicts(IdemTenantConflicts *out);

#endif							/* IDEM_STATS_H */
