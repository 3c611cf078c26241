/*
 * worker.c
 *		The background sweeper: a launcher that visits every database in
 *		turn, and a short-lived worker that sweeps one database and leaves.
 *
 * Why two kinds of process.  A backend is bound to one database for life,
 * and a process connected to a database makes DROP DATABASE and CREATE
 * DATABASE ... TEMPLATE fail ("being accessed by other users").  So the
 * launcher connects to no database: every idempotency.sweep_interval it
 * reads the shared catalog pg_database and, one database after another,
 * starts a dynamic worker for it and waits for it to finish.  The worker
 * connects, returns at once if the extension is not installed there, takes
 * the database's sweep lock without waiting (skipping the database if
 * idem_sweep() is running there), and runs sweep batches of
 * idempotency.sweep_batch_size rows, each in its own short transaction,
 * until a batch comes back short.  It records the outcome (rows, duration,
 * error) in the shared statistics and exits.  Between batches it probes,
 * without waiting, the lock that DROP DATABASE, CREATE DATABASE ... TEMPLATE
 * and ALTER DATABASE take on the database, and gives way at once if one of
 * them is waiting for it.
 *
 * Worker slots: the launcher holds one max_worker_processes slot while the
 * server runs and the per-database worker one more while it runs, so the
 * sweeper needs two.  When no slot is free the launcher logs a warning (at
 * most every few minutes) and tries again at the next interval.
 *
 * Both start only once recovery has finished: a hot standby runs no
 * sweeper, and after promotion the postmaster starts the launcher without a
 * restart.  If the launcher dies the postmaster restarts it after
 * IDEM_LAUNCHER_RESTART_S; per-database workers are never restarted (the
 * next round starts a fresh one).
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
#include "table_shape.h"
#include "worker.h"

#define IDEM_LIBRARY_NAME		"idempotency"
#define IDEM_LAUNCHER_TYPE		"idempotency sweeper launcher"
#define IDEM_WORKER_TYPE		"idempotency sweeper"

/* Seconds before the postmaster restarts a launcher that died. */
#define IDEM_LAUNCHER_RESTART_S	5

/* Repeat the "no free worker slot" warning at most this often. */
#define IDEM_NO_SLOT_WARNING_MS	(5 * 60 * 1000)

/* pg_database.datconnlimit of a database left behind by an interrupted DROP */
#ifndef DATCONNLIMIT_INVALID_DB
#define DATCONNLIMIT_INVALID_DB	-2
#endif

PGDLLEXPORT void idem_sweeper_launcher_main(Datum main_arg);
PGDLLEXPORT void idem_sweeper_worker_main(Datum main_arg);

/* A database the launcher will visit this round. */
typedef struct SweepTarget
{
	Oid			dboid;
	char	   *datname;		/* for pg_stat_activity only */
} SweepTarget;

/* How one batch transaction of the per-database worker ended. */
typedef enum BatchResult
{
	BATCH_FULL,					/* more expired rows may be waiting */
	BATCH_LAST,					/* the pass is complete */
	BATCH_DATABASE_DDL,			/* DROP/CREATE ... TEMPLATE/ALTER DATABASE waits */
	BATCH_EXTENSION_GONE		/* the extension was dropped meanwhile */
} BatchResult;

/* When the launcher last warned that no worker slot was free; 0: not now. */
static TimestampTz no_slot_warned_at = 0;

/*
 * What the launcher and the per-database workers share: both connect (the
 * launcher to no database), write, and start only once recovery is over.
 */
static void
worker_entry(BackgroundWorker *worker, const char *function, const char *type,
			 int restart_time)
{
	memset(worker, 0, sizeof(*worker));
	worker->bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker->bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker->bgw_restart_time = restart_time;
	strlcpy(worker->bgw_library_name, IDEM_LIBRARY_NAME, BGW_MAXLEN);
	strlcpy(worker->bgw_function_name, function, BGW_MAXLEN);
	strlcpy(worker->bgw_type, type, BGW_MAXLEN);
}

/*
 * Register the launcher.  Called from _PG_init while the library is being
 * preloaded, and only then: static workers can only be registered at
 * postmaster start.  Not under pg_upgrade, which must not see writes.
 */
void
idem_worker_register(void)
{
	BackgroundWorker worker;

	if (IsBinaryUpgrade)
		return;

	/* a "database connection" to no database: shared catalogs only */
	worker_entry(&worker, "idem_sweeper_launcher_main", IDEM_LAUNCHER_TYPE,
				 IDEM_LAUNCHER_RESTART_S);
	strlcpy(worker.bgw_name, IDEM_LAUNCHER_TYPE, BGW_MAXLEN);
	RegisterBackgroundWorker(&worker);
}

static void
reload_config_if_asked(void)
{
	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
	}
}

/* ---------- the launcher ---------- */

/*
 * The databases a worker may connect to, read from pg_database (a shared
 * catalog, readable without being connected to a database).  Templates are
 * skipped (a connection would stop CREATE DATABASE from copying them), as
 * are databases that refuse connections and those a crashed DROP DATABASE
 * left invalid.  The list is allocated in the caller's memory context.
 */
static List *
list_databases(void)
{
	MemoryContext caller_context = CurrentMemoryContext;
	List	   *targets = NIL;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;

	StartTransactionCommand();
	(void) GetTransactionSnapshot();

	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while (HeapTupleIsValid(tup = heap_getnext(scan, ForwardScanDirection)))
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tup);
		MemoryContext old;
		SweepTarget *target;

		if (db->datistemplate || !db->datallowconn ||
			db->datconnlimit == DATCONNLIMIT_INVALID_DB)
			continue;

		old = MemoryContextSwitchTo(caller_context);
		target = palloc(sizeof(SweepTarget));
		target->dboid = db->oid;
		target->datname = pstrdup(NameStr(db->datname));
		targets = lappend(targets, target);
		MemoryContextSwitchTo(old);
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);

	CommitTransactionCommand();
	MemoryContextSwitchTo(caller_context);
	return targets;
}

static void
warn_no_free_slot(void)
{
	TimestampTz now = GetCurrentTimestamp();

	if (no_slot_warned_at != 0 &&
		!TimestampDifferenceExceeds(no_slot_warned_at, now, IDEM_NO_SLOT_WARNING_MS))
		return;
	no_slot_warned_at = now;
	ereport(WARNING,
			(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
			 errmsg("idempotency sweeper could not start a worker: no background worker slot is free"),
			 errdetail("Sweeping is postponed to the next idempotency.sweep_interval; this warning is repeated at most every %d minutes.",
					   IDEM_NO_SLOT_WARNING_MS / 60000),
			 errhint("The sweeper needs 2 of the max_worker_processes slots, which parallel query and logical replication share; raise max_worker_processes.")));
}

/*
 * Start the worker for one database and wait until it has finished.
 * Returns false when no worker slot was free.
 */
static bool
sweep_database(const SweepTarget *target)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;
	BgwHandleStatus status;
	pid_t		pid;
	char		activity[NAMEDATALEN + 64];

	worker_entry(&worker, "idem_sweeper_worker_main", IDEM_WORKER_TYPE,
				 BGW_NEVER_RESTART);
	snprintf(worker.bgw_name, BGW_MAXLEN, "idempotency sweeper for database %u",
			 target->dboid);
	/* only an OID crosses the process boundary, never a pointer */
	worker.bgw_main_arg = ObjectIdGetDatum(target->dboid);
	worker.bgw_notify_pid = MyProcPid;

	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
	{
		warn_no_free_slot();
		return false;
	}
	if (no_slot_warned_at != 0)
	{
		ereport(LOG,
				(errmsg("idempotency sweeper found a free background worker slot again")));
		no_slot_warned_at = 0;
	}

	snprintf(activity, sizeof(activity), "sweeping database \"%s\"", target->datname);
	pgstat_report_activity(STATE_RUNNING, activity);

	/* BGWH_STOPPED here: it could not be started, or has already finished */
	status = WaitForBackgroundWorkerStartup(handle, &pid);
	if (status == BGWH_STARTED)
		status = WaitForBackgroundWorkerShutdown(handle);
	if (status == BGWH_POSTMASTER_DIED)
		proc_exit(1);

	pfree(handle);
	return true;
}

/*
 * One round: every database once.  Stops early when no worker slot is free
 * or when sweeping has been switched off meanwhile.
 */
static void
run_round(void)
{
	List	   *targets;
	ListCell   *lc;

	if (RecoveryInProgress())
		return;

	targets = list_databases();
	foreach(lc, targets)
	{
		CHECK_FOR_INTERRUPTS();
		reload_config_if_asked();
		if (idem_sweep_interval_ms == 0)
			break;
		if (!sweep_database((SweepTarget *) lfirst(lc)))
			break;
	}
}

/*
 * Main of the launcher.  A round starts every sweep_interval, counted from
 * the start of the previous round, so the period does not drift; a round
 * longer than the interval is followed at once by the next.  With
 * sweep_interval = 0 it sleeps until a reload changes that.
 */
void
idem_sweeper_launcher_main(Datum main_arg)
{
	MemoryContext round_context;
	TimestampTz last_round = 0;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname(IDEM_LAUNCHER_TYPE);

	round_context = AllocSetContextCreate(TopMemoryContext,
										  "idempotency sweeper round",
										  ALLOCSET_DEFAULT_SIZES);

	ereport(LOG,
			(errmsg("idempotency sweeper launcher started"),
			 errdetail("idempotency.sweep_interval is %d ms.", idem_sweep_interval_ms)));

	for (;;)
	{
		int			events = WL_LATCH_SET | WL_EXIT_ON_PM_DEATH;
		long		timeout_ms = -1;

		CHECK_FOR_INTERRUPTS();
		reload_config_if_asked();

		if (idem_sweep_interval_ms > 0)
		{
			TimestampTz now = GetCurrentTimestamp();
			TimestampTz due = TimestampTzPlusMilliseconds(last_round,
														  (long) idem_sweep_interval_ms);

			if (last_round == 0 || now >= due)
			{
				MemoryContext old = MemoryContextSwitchTo(round_context);

				last_round = now;
				run_round();
				MemoryContextSwitchTo(old);
				MemoryContextReset(round_context);
				continue;
			}
			/* capped, in case the clock was set back */
			events |= WL_TIMEOUT;
			timeout_ms = Min(TimestampDifferenceMilliseconds(now, due),
							 (long) idem_sweep_interval_ms);
		}

		pgstat_report_activity(STATE_IDLE, idem_sweep_interval_ms > 0
							   ? "waiting for the next sweep round"
							   : "sweeping is off (idempotency.sweep_interval = 0)");
		(void) WaitLatch(MyLatch, events, timeout_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/* ---------- the per-database worker ---------- */

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
	idem_store_begin_as_owner(nsp, &owner_call);
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
 * Point this batch's sweep statements at shard (NULL: the table itself),
 * locked until the batch commits so that it cannot be moved or dropped
 * under them.  Returns false when the shard is no longer on this node.
 */
static bool
direct_to_shard(RangeVar *shard)
{
	Oid			relid;

	if (shard == NULL)
		return true;
	relid = RangeVarGetRelid(shard, RowExclusiveLock, true);
	if (!OidIsValid(relid))
		return false;
	idem_store_direct_sweeps_to(relid);
	return true;
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
	idem_store_begin_as_owner(nsp, &owner_call);
	idem_store_require_whole_table();

	if (!direct_to_shard(shard))
		result = BATCH_LAST;	/* the shard moved away or was dropped */
	else
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
			reload_config_if_asked();
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
