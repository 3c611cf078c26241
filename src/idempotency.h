/*
 * idempotency.h
 *		Declarations shared by the modules of the idempotency extension.
 *
 * The modules, one concern each, by layer (a file calls only files of a
 * lower layer: test/layers/check.py, docs/design.md):
 *	8 idempotency.c	module magic and _PG_init (registration only)
 *	7 hooks.c		every hook: planner, ExecutorStart, ProcessUtility,
 *					transaction callbacks
 *	7 claim_many.c	idem_claim_many (a consumer's batch in one statement)
 *	7 worker.c		the sweeper: a launcher and short-lived per-database workers
 *	6 claim.c		idem_claim: read, decide, lock, write
 *	6 settle.c		idem_complete, idem_release, idem_heartbeat, idem_checkpoint
 *	6 lookup.c		idem_lookup, idem_forget
 *	6 sweep.c		idem_sweep and the batch the background worker reuses
 *	6 child_key.c	idem_child_key, stable keys for downstream calls
 *	5 held.c		held claims: fresh claims kept in memory, written as they would
 *					have been (the setting keeps its first name, defer_writes)
 *	4 store.c		the statements of one key (SPI)
 *	4 store_sweep.c	the sweep statements, and the Citus placement fallback
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
 *	0 guc.c			the idempotency.* settings
 *	0 subxact.c		one step in a subtransaction, expected errors swallowed
 *	0 record.c		a record's values: status, columns that are never NULL
 */
#ifndef IDEMPOTENCY_H
#define IDEMPOTENCY_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "access/tupdesc.h"
#include "executor/execdesc.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "nodes/parsenodes.h"
#include "nodes/pg_list.h"
#include "utils/snapshot.h"
#include "utils/timestamp.h"

/* ---------- SQLSTATEs of our own (class ID, documented in README) ---------- */

/* complete/release/heartbeat named a key that has no record */
#define ERRCODE_IDEM_KEY_NOT_FOUND		MAKE_SQLSTATE('I','D','0','0','1')
/* the token is not the record's current token: a newer claim owns the key */
#define ERRCODE_IDEM_TOKEN_MISMATCH		MAKE_SQLSTATE('I','D','0','0','2')
/* the record is already completed or failed */
#define ERRCODE_IDEM_NOT_PROCESSING		MAKE_SQLSTATE('I','D','0','0','3')

/* Longest tenant_id, key and fingerprint, in bytes (Stripe's limit). */
#define IDEM_MAX_IDENTIFIER_BYTES	255

/* Longest lease, ttl or wait (a year is 12 months of 30 days, as in intervals). */
#define IDEM_MAX_DURATION_YEARS		1000
#define IDEM_MAX_DURATION_US \
	((int64) IDEM_MAX_DURATION_YEARS * MONTHS_PER_YEAR * DAYS_PER_MONTH * USECS_PER_DAY)

/* ---------- settings (guc.c) ---------- */

typedef enum IdemStaleAction
{
	IDEM_STALE_RELEASE,			/* an expired claim is deleted */
	IDEM_STALE_FAIL				/* an expired claim becomes 'failed' */
} IdemStaleAction;

typedef enum IdemDurabilityCheck
{
	IDEM_DURABILITY_OFF,
	IDEM_DURABILITY_WARNING,
	IDEM_DURABILITY_ERROR
} IdemDurabilityCheck;

extern int	idem_default_lease_ms;
extern int	idem_default_ttl_s;
extern int	idem_min_ttl_s;
extern int	idem_stale_action;
extern int	idem_max_response_size;
extern int	idem_sweep_interval_ms;
extern int	idem_sweep_batch_size;
extern bool idem_track_stats;
extern bool idem_defer_writes;
extern bool idem_direct_reads;
extern int	idem_durability_check;

extern void idem_define_settings(void);

/* ---------- argument checks (validate.c) ---------- */

extern text *idem_arg_identifier(FunctionCallInfo fcinfo, int argno,
								 const char *name, bool required);
extern int64 idem_arg_token(FunctionCallInfo fcinfo, int argno);
extern int64 idem_arg_duration(FunctionCallInfo fcinfo, int argno,
							   const char *name, int64 default_us,
							   bool zero_allowed);
extern Datum idem_arg_jsonb(FunctionCallInfo fcinfo, int argno,
							const char *name, bool *isnull);
extern TimestampTz idem_add_duration(TimestampTz at, int64 duration_us,
									 const char *name);
extern void idem_check_ttl_floor(int64 ttl_us);
extern bool idem_text_equal(const text *a, const text *b);

/* ---------- the records table (store.c) ---------- */

typedef enum IdemStatus
{
	IDEM_PROCESSING,
	IDEM_COMPLETED,
	IDEM_FAILED
} IdemStatus;

/*
 * One record as the caller's snapshot sees it.  Its varlena values
 * (fingerprint, response, recovery_point, state) are in the memory of the
 * call's SPI connection: valid until idem_store_end().
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
} IdemRecord;

/* What a fenced write (complete/release/heartbeat) needs. */
typedef struct IdemKey
{
	text	   *tenant_id;
	text	   *key;
} IdemKey;

extern void idem_store_begin(FunctionCallInfo fcinfo);
extern void idem_store_begin_in_schema(Oid nsp);
extern void idem_store_check_tenant(FunctionCallInfo fcinfo, const text *tenant);
extern void idem_store_end(void);
extern void idem_store_call_aborted(void);
extern Oid	idem_store_table(void);
extern Oid	idem_store_schema(void);
extern Oid	idem_store_token_sequence(void);
extern bool idem_store_table_as_made(void);
extern void idem_store_stamp_writes(CommandId cid);

extern bool idem_store_read(const IdemKey *k, IdemRecord *rec,
							bool fresh_snapshot);
extern void idem_store_insert_many(text *tenant_id, Datum keys, Datum tokens,
								   Datum fingerprints, TimestampTz now,
								   TimestampTz lease_expires_at, int64 ttl_us,
								   bool speculative,
								   void (*inserted) (void *arg, text *key),
								   void *arg);
extern bool idem_store_insert(const IdemKey *k, text *fingerprint, int64 token,
							  TimestampTz now, TimestampTz lease_expires_at,
							  int64 ttl_us);
extern void idem_store_write_once(const IdemKey *k, text *fingerprint,
								  int64 token, TimestampTz created_at,
								  TimestampTz now,
								  TimestampTz lease_expires_at, int64 ttl_us,
								  IdemStatus status, Datum response,
								  bool response_isnull, text *recovery_point,
								  Datum state);
extern bool idem_store_take_over(const IdemKey *k, int64 old_token,
								 int64 new_token, text *fingerprint,
								 bool new_lifetime, TimestampTz now,
								 TimestampTz lease_expires_at, int64 ttl_us);
extern bool idem_store_fail_stale(const IdemKey *k, int64 old_token,
								  TimestampTz now, IdemRecord *rec);
extern bool idem_store_finish(const IdemKey *k, int64 token, IdemStatus status,
							  Datum response, bool response_isnull,
							  TimestampTz now);
extern bool idem_store_delete_claim(const IdemKey *k, int64 token);
extern bool idem_store_hand_on(const IdemKey *k, int64 token, int64 new_token,
							   TimestampTz now);
extern bool idem_store_checkpoint(const IdemKey *k, int64 token, text *point,
								  Datum state, TimestampTz now,
								  TimestampTz lease_end);
extern bool idem_store_has_checkpoints(void);
extern bool idem_store_extend_lease(const IdemKey *k, int64 token,
									TimestampTz now,
									TimestampTz lease_expires_at);
extern bool idem_store_forget(const IdemKey *k);

/* the table's shape (table_shape.c) */
extern Oid	idem_check_table_shape(Oid table, bool *has_checkpoints);
extern bool idem_table_is_as_made(Oid table);
extern char *idem_table_isolation_setting(Oid table);
extern bool idem_isolation_admits(const char *setting, const text *tenant);
extern Oid	idem_table_owner(Oid table);
extern void idem_check_result_shape(Oid table, TupleDesc desc,
									const Oid *types, int n);

/* sweep batches: one statement each, returns rows affected */
extern uint64 idem_store_sweep_expired(TimestampTz now, int batch_size,
									   bool include_stale_claims,
									   TimestampTz *from,
									   uint64 *stale_released);
extern uint64 idem_store_sweep_group(TimestampTz at, bool include_stale_claims,
									 uint64 *stale_released);
extern uint64 idem_store_sweep_fail_stale(TimestampTz now, int batch_size);
extern uint64 idem_store_sweep_cluster(TimestampTz now, bool fail_stale,
									   uint64 *stale_released,
									   uint64 *stale_failed);
extern void idem_store_direct_sweeps_to(Oid shard);
extern bool idem_store_distributed(void);

extern Datum idem_stale_failure_response(void);
extern const char *idem_status_name(IdemStatus status);
extern IdemStatus idem_status_from_text(text *t);
extern TimestampTz idem_record_live_until(const IdemRecord *rec);
extern bool idem_record_resumable(const IdemRecord *rec, TimestampTz now);
extern void idem_check_not_null(bool isnull, const char *column);

/* ---------- the replay fast path (direct_read.c) ---------- */

extern void idem_direct_read_attach(Oid table, Oid key_index,
									bool distributed,
									const char *isolation_setting);
extern bool idem_direct_read(const IdemKey *k, IdemRecord *rec,
							 bool fresh_snapshot, bool *found);
extern bool idem_direct_probe_available(void);
extern TransactionId idem_direct_inserter(const IdemKey *k);
extern bool idem_direct_key_taken(const IdemKey *k, TransactionId *inserter);

/* ---------- a Citus cluster (citus.c) ---------- */

extern bool idem_citus_manages_table(Oid table);
extern List *idem_citus_local_shards(Oid table);
extern void idem_citus_refuse_crashing_call(Query *parse);
extern List *idem_citus_unreachable_workers(void);
extern uint64 idem_citus_count_on_placements(Oid table, const char *command,
											 List **warned);
extern void idem_citus_before_drop(DropStmt *drop);

/* ---------- the tenant's shard on this node (shard_route.c) ---------- */

extern Oid	idem_shard_route(Oid table, Datum tenant);
extern void idem_shard_route_invalidate(Oid relid);
extern SPIPlanPtr *idem_shard_route_plan_slot(Oid shard, int q);
extern void idem_shard_route_forget_plans(void);
extern void idem_shard_route_xact_ended(void);

/* ---------- sweeping (sweep.c) ---------- */

typedef struct IdemSweepCounts
{
	uint64		expired_removed;
	uint64		stale_released;
	uint64		stale_failed;
} IdemSweepCounts;

/* Where a pass has got to: batches resume at the last expiry seen. */
typedef struct IdemSweepCursor
{
	TimestampTz expired_from;
	bool		one_transaction;	/* all batches in one transaction */
} IdemSweepCursor;

extern void idem_sweep_cursor_init(IdemSweepCursor *cursor,
								   bool one_transaction);
extern bool idem_sweep_batch(int batch_size, IdemSweepCursor *cursor,
							 IdemSweepCounts *counts);
extern bool idem_sweep_lock(bool session_lock, bool wait);
extern void idem_sweep_unlock(bool session_lock);

/* ---------- a step in a subtransaction (subxact.c) ---------- */

extern bool idem_try_in_subtransaction(void (*step) (void *arg), void *arg,
									   const int *codes, int ncodes);
extern void idem_step_lock_timeout(int timeout_ms);

/* ---------- per-key advisory lock (keylock.c) ---------- */

typedef enum IdemKeyLockResult
{
	IDEM_KEYLOCK_ACQUIRED,		/* at once */
	IDEM_KEYLOCK_ACQUIRED_AFTER_WAIT,	/* after another holder let go */
	IDEM_KEYLOCK_BUSY			/* held elsewhere (and the wait, if any, ran out) */
} IdemKeyLockResult;

extern IdemKeyLockResult idem_keylock_try(const IdemKey *k, int64 wait_us);
/* Which transaction still in flight has inserted k (direct_read.c)? */
typedef TransactionId (*IdemInserterProbe) (const IdemKey *k);

extern void idem_keylock_take(const IdemKey *k, IdemInserterProbe inserter_of);
extern void idem_keylock_release(const IdemKey *k);
extern bool idem_keylock_wait_for_inserter(TransactionId xid, int64 wait_us);

/* ---------- claims held until they are written (held.c) ---------- */

/* What happened to a held claim since it was made. */
typedef enum IdemHeldSettle
{
	IDEM_HELD_OPEN,				/* claimed */
	IDEM_HELD_FINISHED,			/* completed or failed (status) */
	IDEM_HELD_RELEASED			/* released without failure */
} IdemHeldSettle;

/*
 * A held claim is addressed by its ref, which stays the same while it is
 * held (the entries themselves move); IDEM_HELD_NONE: none.
 */
typedef uint32 IdemHeldRef;
#define IDEM_HELD_NONE	((IdemHeldRef) 0)

/* A fresh claim of this transaction whose record is not written yet. */
typedef struct IdemHeldClaim
{
	IdemHeldRef ref;
	text	   *tenant_id;
	text	   *key;
	text	   *fingerprint;	/* NULL: none */
	Oid			schema;			/* where the table is */
	Oid			table;
	Oid			owner;			/* the table's owner, who writes it */
	int64		token;
	TimestampTz created_at;
	TimestampTz lease_expires_at;
	int64		ttl_us;
	CommandId	claim_cid;		/* the command ID its INSERT would have had */
	IdemHeldSettle settle;
	CommandId	settle_cid;		/* ... and its UPDATE or DELETE */
	IdemStatus	status;			/* IDEM_HELD_FINISHED: completed or failed */
	Datum		response;		/* 0: none */
	bool		response_isnull;
	TimestampTz settled_at;
	SubTransactionId written_in;	/* written in this subxact (rolls back) */
} IdemHeldClaim;

extern PGDLLIMPORT bool idem_claims_held;
extern bool idem_held_allowed(Oid table);
extern IdemHeldRef idem_held_find(const IdemKey *k, AclMode mode);
extern const IdemHeldClaim *idem_held_get(IdemHeldRef ref);
extern bool idem_held_add(const IdemKey *k, text *fingerprint, int64 token,
							 TimestampTz now, TimestampTz lease_expires_at,
							 int64 ttl_us);
extern bool idem_held_finish(IdemHeldRef ref, IdemStatus status,
								Datum response, bool response_isnull,
								TimestampTz now);
extern bool idem_held_release(IdemHeldRef ref, TimestampTz now);
extern void idem_held_materialize(IdemHeldRef ref);
extern void idem_held_write_all(void);
extern void idem_held_write_final(void);
extern bool idem_held_table_in(List *relation_oids);
extern void idem_held_xact_ended(void);
extern void idem_held_subxact_ended(SubTransactionId sub,
									SubTransactionId parent, bool committed);

/* ---------- every hook the module installs (hooks.c) ---------- */

extern void idem_hooks_init(void);

/* ---------- claiming (claim.c) ---------- */

typedef enum IdemOutcome
{
	IDEM_OUTCOME_CLAIMED,
	IDEM_OUTCOME_REPLAY,
	IDEM_OUTCOME_FAILED,
	IDEM_OUTCOME_IN_PROGRESS,
	IDEM_OUTCOME_MISMATCH
} IdemOutcome;

typedef struct IdemClaimArgs
{
	text	   *fingerprint;	/* NULL: no check */
	int64		lease_us;
	int64		ttl_us;
	int64		wait_us;		/* 0: never wait */
	bool		may_defer;		/* a fresh claim may be held (held.c) */
} IdemClaimArgs;

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
	bool		stale_failed;	/* turned a stale claim into failed */
} IdemClaimResult;

extern void idem_claim_args(FunctionCallInfo fcinfo, int lease_arg,
							int ttl_arg, int wait_arg, IdemClaimArgs *args);
extern void idem_claim_one(const IdemKey *k, const IdemClaimArgs *args,
						   IdemClaimResult *res);
extern bool idem_claim_decide(const IdemRecord *rec, const IdemClaimArgs *args,
							  TimestampTz now, IdemClaimResult *res);
extern const char *idem_outcome_name(IdemOutcome outcome);
extern void idem_claim_result_columns(const IdemClaimResult *res,
									  Datum *values, bool *nulls, int ncolumns);

/* ---------- fencing tokens (tokens.c) ---------- */

extern void idem_tokens_request_shmem(void);
extern int64 idem_fresh_token(Oid sequence, TimestampTz now);
extern int64 idem_successor_token(Oid sequence, TimestampTz now, int64 old);

/* ---------- statistics in shared memory (stats.c) ---------- */

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

/* ---------- background worker (worker.c) ---------- */

extern void idem_worker_register(void);

#endif							/* IDEMPOTENCY_H */
