/*
 * idempotency.h
 *		What every module of the idempotency extension shares: our SQLSTATEs
 *		and limits, a key, a record, a claim's answer and a sweep's counts.
 *		Each module's functions are declared in its own header (store.h,
 *		held.h, keylock.h, ...), so that a file's includes show what it
 *		calls.
 *
 * The modules, one concern each, by layer (a file calls only files of a
 * lower layer: test/layers/check.py, docs/design.md):
 *	8 module.c		module magic and _PG_init (registration only)
 *	7 hooks.c		every hook: planner, ExecutorStart, ProcessUtility,
 *					transaction callbacks
 *	7 claim_many.c	idem_claim_many (a consumer's batch in one statement)
 *	7 launcher.c	the sweeper's launcher: every database in turn, a worker each
 *	7 database_sweeper.c	the sweeper's worker: one database swept, then exit
 *	6 claim.c		idem_claim: read, decide, lock, write
 *	6 settle.c		idem_complete, idem_release, idem_heartbeat, idem_checkpoint
 *	6 lookup.c		idem_lookup, idem_forget
 *	6 sweep.c		idem_sweep and the batch the background worker reuses
 *	6 child_key.c	idem_child_key, stable keys for downstream calls
 *	6 metrics.c		idem_metrics, idem_metrics_tenants: what a scraper reads
 *	6 update_guard.c	ALTER EXTENSION UPDATE runs no ordinary owner's code
 *	5 held.c		held claims: fresh claims kept in memory, written as they would
 *					have been (the setting keeps its first name, defer_writes)
 *	4 store.c		the statements of one key (SPI)
 *	4 store_sweep.c	the sweep statements, and the Citus placement fallback
 *	4 store_direct.c	a held claim's rows, without the executor's privilege checks
 *	3 store_attach.c	attaching the records table; preparing and running a statement
 *	2 direct_read.c	a record read by primary key without SPI (the replay fast path)
 *	2 citus.c		whether the table is distributed, and this node's shards
 *	2 shard_route.c	the tenant's shard on this node, and its plans
 *	1 statements.c	the statement catalogue: every SQL statement on the table
 *	1 keylock.c		the per-key advisory lock that makes in_progress non-blocking
 *	1 tokens.c		fencing tokens that never go backwards
 *	1 table_shape.c	refusing a records table whose shape changed; is it as made?
 *	1 stats.c		counters and last sweeps in shared memory (idem_stats)
 *	1 validate.c	argument checks shared by every SQL function
 *	1 privilege_check.c	a missing privilege, named by the call that needs it
 *	0 guc.c			the idempotency.* settings
 *	0 subxact.c		one step in a subtransaction, expected errors swallowed
 *	0 record.c		a record's values: status, columns that are never NULL
 */
#ifndef IDEMPOTENCY_H
#define IDEMPOTENCY_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "utils/timestamp.h"

/* ---------- SQLSTATEs of our own (class ID, documented in README) ---------- */

/* complete/release/heartbeat named a key that has no record */
#define ERRCODE_IDEM_KEY_NOT_FOUND		MAKE_SQLSTATE('I','D','0','0','1')

/* the token is not the record's current token: a newer claim owns the key */
#define ERRCODE_IDEM_TOKEN_MISMATCH		MAKE_SQLSTATE('I','D','0','0','2')

/* the record is already completed or failed */
#define ERRCODE_IDEM_NOT_PROCESSING		MAKE_SQLSTATE('I','D','0','0','3')

/* a takeover of a record whose token was never handed out in this database */
#define ERRCODE_IDEM_TOKEN_NOT_ISSUED	MAKE_SQLSTATE('I','D','0','0','4')

/* The extension's name in pg_extension, and its library's. */
#define IDEM_EXTENSION_NAME		"idempotency"
#define IDEM_LIBRARY_NAME		"idempotency"

/* The sweeper's processes, as pg_stat_activity names them (bgw_type). */
#define IDEM_LAUNCHER_TYPE		"idempotency sweeper launcher"
#define IDEM_WORKER_TYPE		"idempotency sweeper"

/* Longest tenant_id, key and fingerprint, in bytes (Stripe's limit). */
#define IDEM_MAX_IDENTIFIER_BYTES	255

/* Longest lease, ttl or wait (a year is 12 months of 30 days, as in intervals). */
#define IDEM_MAX_DURATION_YEARS		1000

#define IDEM_MAX_DURATION_US \
	((int64) IDEM_MAX_DURATION_YEARS * MONTHS_PER_YEAR * DAYS_PER_MONTH * USECS_PER_DAY)

/* ---------- a record, its key, a claim's answer, a sweep's counts ---------- */

typedef enum IdemStatus
{
	IDEM_PROCESSING,
	IDEM_COMPLETED,
	IDEM_FAILED
} IdemStatus;

/*
 * One record as the caller's snapshot sees it.  Its varlena values
 * (fingerprint, response, recovery_point, state, holder) are in the memory
 * of the call's SPI connection: valid until idem_store_end().
 */
typedef struct IdemRecord
{
	IdemStatus	status;
	int64		token;
	text	   *fingerprint;	/* NULL when the column is NULL */
	Datum		response;		/* valid when !response_isnull */
	bool		response_isnull;
	TimestampTz expires_at;
	bool		lease_isnull;
	TimestampTz lease_expires_at;
	TimestampTz created_at;
	TimestampTz updated_at;
	TransactionId xmin;			/* to recognise our own transaction's claim */
	text	   *recovery_point; /* NULL: no checkpoint (or the 1.0 objects) */
	Datum		state;			/* 0: none */
	text	   *holder;			/* who claimed it (1.4); NULL: none, or before 1.4 */
} IdemRecord;

/* What a fenced write (complete/release/heartbeat) needs. */
typedef struct IdemKey
{
	text	   *tenant_id;
	text	   *key;
} IdemKey;

/* What a sweep pass removed or failed (sweep.c, counted by stats.c). */
typedef struct IdemSweepCounts
{
	uint64		expired_removed;
	uint64		stale_released;
	uint64		stale_failed;
} IdemSweepCounts;

/* A claim's answer (claim.c, claim_many.c; counted by stats.c). */
typedef enum IdemOutcome
{
	IDEM_OUTCOME_CLAIMED,
	IDEM_OUTCOME_REPLAY,
	IDEM_OUTCOME_FAILED,
	IDEM_OUTCOME_IN_PROGRESS,
	IDEM_OUTCOME_MISMATCH
} IdemOutcome;

typedef struct IdemClaimResult
{
	IdemOutcome outcome;
	int64		token;			/* set only when claimed */
	bool		token_isnull;
	Datum		response;		/* replay and failed */
	bool		response_isnull;
	TimestampTz expires_at;		/* lease end, or retention end */
	bool		expires_at_isnull;
	text	   *recovery_point; /* claimed after a holder's checkpoint, else NULL */
	Datum		state;			/* its state, 0: none */
	bool		took_over;		/* claimed a stale claim (for statistics) */
	bool		fresh;			/* claimed a key that had no record */
	bool		reentered;		/* claimed again by its holder: nothing written */
	bool		stale_failed;	/* turned a stale claim into failed */
} IdemClaimResult;

#endif							/* IDEMPOTENCY_H */
