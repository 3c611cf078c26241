/*
 * sweep.c
 *		One sweep pass over this database: expired completed/failed records
 *		are deleted; claims whose lease expired are released (deleted) or,
 *		with idempotency.stale_action = 'fail', turned into failed records.
 *
 * idem_sweep() runs a pass in the caller's transaction (pg_cron, by hand);
 * the background worker runs the same batches, committing after each.
 * Batches lock their rows with SKIP LOCKED, so a sweep never waits on a live
 * claim and never takes a row a claim is settling.  A per-database advisory
 * lock keeps two sweeps (worker and idem_sweep) off the same database.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "guc.h"
#include "held.h"
#include "idempotency.h"
#include "stats.h"
#include "store_attach.h"
#include "store_sweep.h"
#include "sweep.h"

PG_FUNCTION_INFO_V1(idem_sweep);

#define IDEM_SWEEPLOCK_CLASS	0x4945		/* "IE" */

/*
 * How many batches of a pass in one transaction (idem_sweep) may try the
 * delete without row locks first.  Each try is a subtransaction that takes
 * an XID of its own when it deletes anything, and every snapshot in the
 * server pays once a transaction has more subtransaction XIDs than the 64
 * its PGPROC caches; the batches after these use the locking statement,
 * which needs no subtransaction.  A pass of the worker commits each batch.
 */
#define IDEM_SWEEP_UNLOCKED_TRIES	32

/*
 * Start a pass.  one_transaction: every batch runs in the same transaction
 * (idem_sweep), rather than one transaction per batch (the worker).
 */
void
idem_sweep_cursor_init(IdemSweepCursor *cursor, bool one_transaction)
{
	cursor->expired_from = DT_NOBEGIN;
	cursor->one_transaction = one_transaction;
	cursor->unlocked_tries_left = one_transaction ? IDEM_SWEEP_UNLOCKED_TRIES : INT_MAX;
}

/* Add what a sweep statement removed or failed to the pass and to idem_stats. */
static void
add_swept(IdemSweepCounts *counts, uint64 expired, uint64 released,
			uint64 failed)
{
	counts->expired_removed += expired;
	counts->stale_released += released;
	counts->stale_failed += failed;
	idem_stats_add(IDEM_STAT_SWEPT_EXPIRED, expired);
	idem_stats_add(IDEM_STAT_SWEPT_STALE, released + failed);
}

/*
 * Run one batch in the current transaction.  Returns true when a batch came
 * back full, so that more expired rows may be waiting.
 */
bool
idem_sweep_batch(int batch_size, IdemSweepCursor *cursor,
				 IdemSweepCounts *counts)
{
	TimestampTz now = GetCurrentTimestamp();
	bool		fail_stale = idem_stale_action == IDEM_STALE_FAIL;
	uint64		failed = 0;
	uint64		released;
	uint64		deleted;
	bool		full;

	bool		try_unlocked = cursor->unlocked_tries_left > 0;

	if (fail_stale)
		failed = idem_store_sweep_fail_stale(now, batch_size);
	if (try_unlocked && cursor->unlocked_tries_left != INT_MAX)
		cursor->unlocked_tries_left--;
	deleted = idem_store_sweep_expired(now, batch_size, !fail_stale, try_unlocked,
									   &cursor->expired_from, &released,
									   &full);

	/*
	 * Within one transaction the rows deleted so far stay in the index, and
	 * the next batch starts at the last expiry seen, so it would walk again
	 * every deleted row sharing that expiry.  Take the rest of that group
	 * of equal expiries at once and continue strictly after it.  (Batches
	 * that commit one by one let those entries be skipped instead, and keep
	 * their transactions short.)
	 */
	if (cursor->one_transaction && full)
	{
		uint64		group_released;

		deleted += idem_store_sweep_group(cursor->expired_from, !fail_stale,
										  &group_released);
		released += group_released;
		cursor->expired_from += 1;	/* timestamps are whole microseconds */
	}

	add_swept(counts, deleted - released, released, failed);
	return full || failed == (uint64) batch_size;
}

static void
sweeplock_tag(LOCKTAG *tag)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, 0, 0, IDEM_SWEEPLOCK_CLASS);
}

/*
 * Take this database's sweep lock, for the session (the worker, across its
 * batch transactions) or the transaction (idem_sweep).  Without wait,
 * returns false when another sweep holds it.
 */
bool
idem_sweep_lock(bool session_lock, bool wait)
{
	LOCKTAG		tag;

	sweeplock_tag(&tag);
	return LockAcquire(&tag, ExclusiveLock, session_lock, !wait) != LOCKACQUIRE_NOT_AVAIL;
}

void
idem_sweep_unlock(bool session_lock)
{
	LOCKTAG		tag;

	sweeplock_tag(&tag);
	LockRelease(&tag, ExclusiveLock, session_lock);
}

/*
 * Sweep a table distributed by Citus, on every node at once.  Citus runs
 * one statement per kind on all shards in parallel and refuses the
 * batches' LIMIT and SKIP LOCKED there, so batch_size does not apply.
 */
static void
sweep_cluster(IdemSweepCounts *counts)
{
	uint64		released;
	uint64		failed;
	uint64		deleted;

	deleted = idem_store_sweep_cluster(GetCurrentTimestamp(),
									   idem_stale_action == IDEM_STALE_FAIL,
									   &released, &failed);
	add_swept(counts, deleted, released, failed);
}

/* idem_sweep()'s batch_size, or the setting's when NULL. */
static int
requested_batch_size(FunctionCallInfo fcinfo)
{
	return PG_ARGISNULL(0) ? idem_sweep_batch_size : PG_GETARG_INT32(0);
}

/*
 * One pass of idem_sweep(), its counts added to *counts.
 */
static void
sweep_pass(FunctionCallInfo fcinfo, IdemSweepCounts *counts)
{
	int			batch_size = requested_batch_size(fcinfo);
	IdemSweepCursor cursor;
	IdemOwnerCall owner_call;

	/*
	 * A sweep is maintenance, as VACUUM is: called by a role other than the
	 * table's owner (a superuser, the operator, pg_cron's role), it runs as
	 * the owner in a security-restricted operation, once the caller is
	 * found to hold what its statements use.  So the owner's code on the
	 * table never runs with a superuser's rights, and every tenant's
	 * expired records are seen whatever tenant the caller is confined to.
	 */
	idem_store_begin_maintenance(fcinfo, ACL_SELECT | ACL_UPDATE | ACL_DELETE,
								 "idem_sweep()", &owner_call);
	idem_store_require_whole_table();
	(void) idem_sweep_lock(false, true);
	if (idem_store_distributed())
		sweep_cluster(counts);
	else
	{
		/* each batch's own memory goes when it ends: flat over any backlog */
		MemoryContext batch_context = AllocSetContextCreate(CurrentMemoryContext,
															"idempotency sweep batch",
															ALLOCSET_DEFAULT_SIZES);
		MemoryContext old = CurrentMemoryContext;
		bool		more;

		idem_sweep_cursor_init(&cursor, true);
		do
		{
			CHECK_FOR_INTERRUPTS();
			MemoryContextSwitchTo(batch_context);
			more = idem_sweep_batch(batch_size, &cursor, counts);
			MemoryContextSwitchTo(old);
			MemoryContextReset(batch_context);
		} while (more);
		MemoryContextDelete(batch_context);
	}
	idem_store_end_as_owner(&owner_call);
}

/*
 * idem_sweep() failed (a privilege it needs, row-level security forced on
 * the owner, a trigger that raised, a cancel): record the pass as failed,
 * as the worker records its own, so that sweep_errors_total and the last
 * error show what pg_cron's job history alone would.  Nothing it removed
 * stays removed.
 */
static void
record_failed_sweep(MemoryContext caller_context, TimestampTz started)
{
	IdemSweepCounts none = {0};
	ErrorData  *edata;

	MemoryContextSwitchTo(caller_context);
	edata = CopyErrorData();
	idem_stats_sweep_finished(started, GetCurrentTimestamp(), &none, edata->message);
	FreeErrorData(edata);
}

/*
 * idem_sweep(batch_size) RETURNS (expired_removed, stale_released, stale_failed)
 *
 * One pass in the caller's transaction, as the table's owner (see below).
 * Waits for a sweep already running on this database (the worker's) to
 * finish its pass.  On a table
 * distributed by Citus, the pass covers every shard on every node.
 */
Datum
idem_sweep(PG_FUNCTION_ARGS)
{
	IdemSweepCounts counts = {0};
	TimestampTz started = GetCurrentTimestamp();
	MemoryContext caller_context = CurrentMemoryContext;
	TupleDesc	desc;
	Datum		values[3];
	bool		nulls[3] = {false};

	if (requested_batch_size(fcinfo) <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch_size must be positive")));
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "idem_sweep must return a composite type");

	/* held claims: written before this statement started (hooks.c), or
	 * now, when it is called outside any statement (a PL/pgSQL expression) */
	idem_held_write_all();

	PG_TRY();
	{
		sweep_pass(fcinfo, &counts);
	}
	PG_CATCH();
	{
		record_failed_sweep(caller_context, started);
		PG_RE_THROW();
	}
	PG_END_TRY();
	idem_stats_sweep_finished(started, GetCurrentTimestamp(), &counts, NULL);

	values[0] = Int64GetDatum((int64) counts.expired_removed);
	values[1] = Int64GetDatum((int64) counts.stale_released);
	values[2] = Int64GetDatum((int64) counts.stale_failed);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc),
													  values, nulls)));
}
