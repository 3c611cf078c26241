/*
 * launcher.c
 *		The sweeper's launcher: visits every database in turn, starting for
 *		each a short-lived worker (database_sweeper.c) that sweeps it and
 *		leaves.
 *
 * Why two kinds of process.  A backend is bound to one database for life,
 * and a process connected to a database makes DROP DATABASE and CREATE
 * DATABASE ... TEMPLATE fail ("being accessed by other users").  So the
 * launcher connects to no database: every idempotency.sweep_interval it
 * reads the shared catalog pg_database and, one database after another,
 * starts a dynamic worker for it and waits for it to finish.
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

#include "guc.h"
#include "idempotency.h"
#include "launcher.h"

/* Seconds before the postmaster restarts a launcher that died. */
#define IDEM_LAUNCHER_RESTART_S	5

/* Repeat the "no free worker slot" warning at most this often. */
#define IDEM_NO_SLOT_WARNING_MS	(5 * 60 * 1000)

/* pg_database.datconnlimit of a database left behind by an interrupted DROP */
#ifndef DATCONNLIMIT_INVALID_DB
#define DATCONNLIMIT_INVALID_DB	-2
#endif

PGDLLEXPORT void idem_sweeper_launcher_main(Datum main_arg);

/* A database the launcher will visit this round. */
typedef struct SweepTarget
{
	Oid			dboid;
	char	   *datname;		/* for pg_stat_activity only */
} SweepTarget;

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
		idem_reload_config_if_asked();
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
		idem_reload_config_if_asked();

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
