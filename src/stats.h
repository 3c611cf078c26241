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

extern void idem_stats_request_shmem(void);
extern void idem_stats_add(IdemCounter counter, uint64 n);
extern void idem_stats_count_claim(const IdemClaimResult *res);
extern void idem_stats_sweep_finished(TimestampTz started, TimestampTz finished,
									  const IdemSweepCounts *counts,
									  const char *error);

#endif							/* IDEM_STATS_H */
