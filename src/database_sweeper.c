/*
 * database_sweeper.c
 *		The sweeper's per-database worker: started by the launcher
 *		(launcher.c) for one database, it sweeps it once and exits, so that
 *		the database is free again.
 *
 * It connects, returns at once if the extension is not installed there,
 * takes the database's sweep lock without waiting (skipping the database
 * if idem_sweep() is running there), and runs sweep batches of
 * idempotency.sweep_batch_size rows, each in its own short transaction and
 * as the table's owner in a security-restricted operation, until a batch
 * comes back short.  It records the outcome (rows, duration, error) in the
 * shared statistics and exits.  Between batches it probes, without
 * waiting, the lock that DROP DATABASE, CREATE DATABASE ... TEMPLATE and
 * ALTER DATABASE take on the database, and gives way at once if one of
 * them is waiting for it.
 */
#include "postgres.h"
#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_database.h"
#include "catalog/pg_extension.h"
#include "commands/dbcommands.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "citus.h"
#include "guc.h"
#include "idempotency.h"
#include "stats.h"
#include "store_attach.h"
#include "sweep.h"
#include "database_sweeper.h"

/* How one batch transaction of the per-database worker ended. */
typedef enum BatchResult
{
	BATCH_FULL,					/* more expired rows may be waiting */
	BATCH_LAST,					/* the pass is complete */
	BATCH_DATABASE_DDL,			/* DROP/CREATE ... TEMPLATE/ALTER DATABASE waits */
	BATCH_EXTENSION_GONE		/* the extension was dropped meanwhile */
} BatchResult;

/*
 * Is a command waiting to get this database to itself?  DROP DATABASE and
 * ALTER DATABASE hold AccessExclusiveLock on it, CREATE DATABASE ...
 * TEMPLATE holds ShareLock on its template, while they wait (up to 5 s) for
 * the other sessions to leave; the RowExclusiveLock every new session takes
 * conflicts with both.  So try that lock, without waiting.
 */
static bool
database_command_waiting(void)
{
	LOCKTAG		tag;

	SET_LOCKTAG_OBJECT(tag, InvalidOid, DatabaseRelationId, MyDatabaseId, 0);
	if (LockAcquire(&tag, RowExclusiveLock, false, true) == LOCKACQUIRE_NOT_AVAIL)
		return true;
	LockRelease(&tag, RowExclusiveLock, false);
	return false;
}

/*
 * What list_sweep_targets() last saw of the table: its OID, whether Citus
 * distributes it, its relfilenode and the shards listed.  After an error in
 * a pass, a different picture means the table was distributed, rewritten,
 * moved or dropped under the pass (table_changed_under_pass).
 */
static char *pass_picture = NULL;

/*
 * What one pass sweeps: the records table itself (a NULL entry), or, when
 * Citus distributes it, the shards this node holds (none on a coordinator
 * without shards: the pass is then idle).  Each node's sweeper sweeps its
 * own shards, so the cluster is swept without any node reaching another.
 * Runs in a transaction of its own; the list lives in cxt.
 */
static List *
list_sweep_targets(MemoryContext cxt)
{
	MemoryContext old;
	IdemOwnerCall owner_call;
	List	   *targets = NIL;
	Oid			nsp;
	HeapTuple	tup;
	StringInfoData picture;
	ListCell   *lc;

	/* the last picture lived in the previous round's memory, reset since */
	pass_picture = NULL;
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	nsp = idem_store_extension_schema();
	if (!OidIsValid(nsp))
	{
		CommitTransactionCommand();
		return NIL;				/* dropped since the pass began */
	}
	PushActiveSnapshot(GetTransactionSnapshot());
	idem_store_begin_as_owner(nsp, AccessShareLock, &owner_call);
	old = MemoryContextSwitchTo(cxt);
	if (idem_store_distributed())
		targets = idem_citus_local_shards(idem_store_table());
	else
		targets = list_make1(NULL);

	initStringInfo(&picture);
	appendStringInfo(&picture, "%u %c", idem_store_table(),
					 idem_store_distributed() ? 'd' : 'l');
	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(idem_store_table()));
	if (HeapTupleIsValid(tup))
	{
		appendStringInfo(&picture, " %u", ((Form_pg_class) GETSTRUCT(tup))->relfilenode);
		ReleaseSysCache(tup);
	}
	foreach(lc, targets)
	{
		RangeVar   *shard = lfirst(lc);

		if (shard != NULL)
			appendStringInfo(&picture, " %s.%s", shard->schemaname, shard->relname);
	}
	pass_picture = picture.data;
	MemoryContextSwitchTo(old);
	idem_store_end_as_owner(&owner_call);
	PopActiveSnapshot();
	CommitTransactionCommand();
	return targets;
}

/*
 * Lock shard (NULL: the table itself) for this batch, so that it cannot be
 * moved or dropped under its statements; its OID, or InvalidOid when it is
 * no longer on this node.  Taken before the table's lock, in the order
 * DROP EXTENSION takes them on a Citus node (citus_drop_all_shards() locks
 * the shards, then the table goes): a batch that waits for its shard then
 * holds nothing on the table, and the two cannot deadlock.
 */
static Oid
lock_shard(RangeVar *shard)
{
	return RangeVarGetRelid(shard, RowExclusiveLock, true);
}

/*
 * One sweep batch in a transaction of its own.
 *
 * The batch runs as the owner of idempotency_records in a security-
 * restricted operation (as autovacuum and REFRESH MATERIALIZED VIEW do),
 * from the moment the table is found and locked: the shape check, the
 * planning and the statements all run as the owner, so nothing the owner
 * planted on the table (an index expression, a trigger, a policy) ever runs
 * with the superuser rights of the worker unless the owner has them anyway.
 */
static BatchResult
sweep_one_batch(RangeVar *shard, IdemSweepCursor *cursor,
				IdemSweepCounts *counts, int batchno)
{
	BatchResult result;
	Oid			nsp;
	IdemOwnerCall owner_call;
	Oid			shard_relid;
	char		activity[128];

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();

	if (database_command_waiting())
	{
		CommitTransactionCommand();
		return BATCH_DATABASE_DDL;
	}
	nsp = idem_store_extension_schema();
	if (!OidIsValid(nsp))
	{
		CommitTransactionCommand();
		return BATCH_EXTENSION_GONE;
	}

	snprintf(activity, sizeof(activity),
			 "sweeping idempotency_records: batch %d, " UINT64_FORMAT " rows removed so far",
			 batchno, counts->expired_removed + counts->stale_released);
	pgstat_report_activity(STATE_RUNNING, activity);

	PushActiveSnapshot(GetTransactionSnapshot());
	shard_relid = shard ? lock_shard(shard) : InvalidOid;
	if (shard != NULL && !OidIsValid(shard_relid))
	{
		PopActiveSnapshot();
		CommitTransactionCommand();
		return BATCH_LAST;		/* the shard moved away or was dropped */
	}
	/*
	 * A batch on a shard of a Citus node takes no lock on the table's shell:
	 * Citus's DDL locks the shell before the shards and DROP EXTENSION the
	 * shards before the shell, so a batch holding either while waiting for
	 * the other deadlocks with one of them (90-citus r., u.).  The shard's
	 * lock keeps the batch's statements safe, as at ca51e34.
	 */
	idem_store_begin_as_owner(nsp, OidIsValid(shard_relid) ? NoLock : RowExclusiveLock,
							  &owner_call);
	idem_store_require_whole_table();
	if (OidIsValid(shard_relid))
		idem_store_direct_sweeps_to(shard_relid);
	result = idem_sweep_batch(idem_sweep_batch_size, cursor, counts)
		? BATCH_FULL : BATCH_LAST;
	idem_store_end_as_owner(&owner_call);
	PopActiveSnapshot();
	CommitTransactionCommand();

	/* let autovacuum hear about the dead rows during a long pass */
	pgstat_report_stat(false);
	return result;
}

/* Error context: which database the sweep was working on. */
static void
sweep_error_context(void *arg)
{
	errcontext("idempotency sweep of database \"%s\"", (const char *) arg);
}

/*
 * Is the extension still installed?  After an error, to tell a broken
 * table from a DROP EXTENSION that raced with the batch.
 */
static bool
extension_still_installed(void)
{
	bool		installed;

	StartTransactionCommand();
	installed = OidIsValid(idem_store_extension_schema());
	CommitTransactionCommand();
	return installed;
}

/*
 * Did the table change under the pass that just failed?  idem_distribute()
 * (the table becomes distributed and its indexes are rebuilt), a shard move
 * or a DROP commits while a batch waits for its lock, and the batch then
 * meets a table it did not plan for: "could not open relation with OID",
 * or Citus refusing the plain table's statement.  Looks again, in a
 * transaction of its own; an error while looking counts as no change.
 */
static bool
table_changed_under_pass(MemoryContext cxt)
{
	char	   *before = pass_picture;
	volatile bool changed = false;

	if (before == NULL)
		return false;
	PG_TRY();
	{
		pass_picture = NULL;
		(void) list_sweep_targets(cxt);
		changed = pass_picture == NULL || strcmp(before, pass_picture) != 0;
	}
	PG_CATCH();
	{
		FlushErrorState();
		AbortCurrentTransaction();
	}
	PG_END_TRY();
	return changed;
}

/*
 * Log an error caught earlier (copied, the error state flushed) as it
 * would have been logged when raised.
 */
static void
log_caught_error(ErrorData *edata)
{
	PG_TRY();
	{
		ThrowErrorData(edata);
	}
	PG_CATCH();
	{
		EmitErrorReport();
		FlushErrorState();
	}
	PG_END_TRY();
}

/*
 * Take this database's sweep lock for a pass, a session lock that must
 * outlive the batch transactions.  False when there is nothing to do here:
 * the extension is not installed, or another sweep is running.  *datname:
 * the database's name, in cxt.
 */
static bool
begin_pass(MemoryContext cxt, char **datname)
{
	bool		installed;
	bool		locked = false;

	StartTransactionCommand();
	*datname = MemoryContextStrdup(cxt, get_database_name(MyDatabaseId));
	installed = OidIsValid(idem_store_extension_schema());
	if (installed)
		locked = idem_sweep_lock(true, false);
	CommitTransactionCommand();

	if (installed && !locked)
		elog(DEBUG1, "idempotency sweeper skips database \"%s\": another sweep is running there",
			 *datname);
	return installed && locked;
}

/*
 * The batches of one pass over every target (the table, or each of its
 * shards on this node), each batch in a transaction of its own, until a
 * target's batch comes back not full.  Returns the last batch's result.
 */
static BatchResult
sweep_targets(MemoryContext worker_context, IdemSweepCounts *counts)
{
	int			batchno = 0;
	BatchResult result = BATCH_LAST;
	IdemSweepCursor cursor;
	ListCell   *lc;

	foreach(lc, list_sweep_targets(worker_context))
	{
		idem_sweep_cursor_init(&cursor, false);
		do
		{
			CHECK_FOR_INTERRUPTS();
			idem_reload_config_if_asked();
			if (idem_sweep_interval_ms == 0)
				break;			/* switched off in the middle of a pass */
			result = sweep_one_batch(lfirst(lc), &cursor, counts, ++batchno);
		} while (result == BATCH_FULL);
		if (result != BATCH_LAST)
			break;
	}
	return result;
}

/*
 * A pass ended in error edata: is it a sweep failure, to be recorded with
 * its message (*error)?  An error caused by DROP EXTENSION in mid-pass is
 * not, nor is one caused by the table changing under the pass: the next
 * round starts from the table as it is then.
 */
static bool
failure_to_record(ErrorData *edata, MemoryContext worker_context,
				  const char *datname, char **error)
{
	if (!extension_still_installed())
		return false;
	if (table_changed_under_pass(worker_context))
	{
		ereport(NOTICE,
				(errmsg("idempotency sweeper: idempotency_records of database \"%s\" changed during the sweep; it is swept again next round",
						datname),
				 errdetail_internal("%s", edata->message)));
		return false;
	}
	log_caught_error(edata);
	*error = edata->message;
	return true;
}

/*
 * Sweep the database this worker is connected to, one pass.
 */
static void
sweep_this_database(void)
{
	MemoryContext worker_context = CurrentMemoryContext;
	ErrorContextCallback errcallback;
	IdemSweepCounts counts = {0};
	TimestampTz started;
	char	   *datname;
	char	   *volatile error = NULL;
	ErrorData  *volatile edata = NULL;
	volatile bool record = true;

	if (RecoveryInProgress() || !begin_pass(worker_context, &datname))
		return;

	errcallback.callback = sweep_error_context;
	errcallback.arg = datname;
	errcallback.previous = error_context_stack;
	error_context_stack = &errcallback;

	started = GetCurrentTimestamp();

	PG_TRY();
	{
		BatchResult result = sweep_targets(worker_context, &counts);

		if (result == BATCH_EXTENSION_GONE)
			record = false;
		else if (result == BATCH_DATABASE_DDL)
			elog(DEBUG1, "idempotency sweeper leaves database \"%s\" to a waiting DROP, CREATE or ALTER DATABASE",
				 datname);
	}
	PG_CATCH();
	{
		HOLD_INTERRUPTS();
		MemoryContextSwitchTo(worker_context);
		edata = CopyErrorData();
		FlushErrorState();
		AbortCurrentTransaction();
		RESUME_INTERRUPTS();
	}
	PG_END_TRY();

	error_context_stack = errcallback.previous;

	if (edata != NULL)
	{
		char	   *message = NULL;

		record = failure_to_record(edata, worker_context, datname, &message);
		error = message;
	}

	idem_sweep_unlock(true);
	if (record)
		idem_stats_sweep_finished(started, GetCurrentTimestamp(), &counts, error);
	pgstat_report_activity(STATE_IDLE, NULL);
}

/*
 * Main of the per-database worker: sweep once, then exit so that the
 * database is free again.  Exits with 0 even after an error: the error has
 * been logged and recorded, and a non-restarting worker has nothing to gain
 * from a non-zero exit code but a second log line.
 */
void
idem_sweeper_worker_main(Datum main_arg)
{
	Oid			dboid = DatumGetObjectId(main_arg);

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);
	pgstat_report_appname(IDEM_WORKER_TYPE);

	/*
	 * Batch commits wait for their WAL flush (the session's
	 * synchronous_commit), which paces the sweep to what the disk takes.
	 * Committing them asynchronously swept faster but flooded the WAL that
	 * claims committing meanwhile must flush: in the benchmark, claim p99
	 * during a 1,000,000-row sweep was 8.6-64.6 ms asynchronous against
	 * 4.9-5.5 ms synchronous (2-3 ms idle).
	 */
	sweep_this_database();
	proc_exit(0);
}
