/*
 * pending.c
 *		Claims whose record is written once, at the end, rather than twice.
 *
 * In the usual pattern (claim, business writes, complete, COMMIT in one
 * transaction) the processing row a claim inserts is never seen by anyone
 * but its own transaction: other transactions learn that the key is taken
 * from the key lock (keylock.c), not from the uncommitted row.  So a fresh
 * claim at the top level of a READ COMMITTED transaction only takes the key
 * lock and remembers the claim here; idem_complete (or idem_release with a
 * failure) then inserts the finished record in one INSERT, instead of an
 * INSERT followed by an UPDATE that writes a second row version and new
 * index entries.
 *
 * Nothing else may be able to tell the difference, so a remembered claim is
 * written as its processing row before anything could look for it:
 *	- before COMMIT or PREPARE TRANSACTION (the two-phase pattern);
 *	- before any statement of this transaction that reads or writes the
 *	  table (ExecutorStart), and before utility statements (COPY, TRUNCATE,
 *	  DROP EXTENSION, ...);
 *	- before our own functions that scan or change other keys (lookup,
 *	  forget, heartbeat in a subtransaction, batch claims, sweep).
 * The primary key still decides who wins: each write is INSERT ... ON
 * CONFLICT DO NOTHING, and if a record appeared anyway (one written around
 * the functions, or by a node that does not share our locks) the write
 * raises an error, so the transaction that did the work rolls back rather
 * than commit a second outcome.
 *
 * Claims are remembered only where writing them later cannot change what
 * the caller sees: READ COMMITTED, no subtransaction, a read-write
 * transaction, a user who may INSERT into the table and no row-level
 * security on it (so privilege and policy errors still come from the
 * claim).  Everywhere else the claim writes its row at once.
 */
#include "postgres.h"

#include "access/xact.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"

#include "idempotency.h"

/*
 * More unwritten claims than this in one transaction are written out
 * before the next is remembered: lookups stay a short scan, and a
 * transaction claiming many keys one by one loses nothing but the saving.
 */
#define IDEM_MAX_PENDING	32

/*
 * The claims remembered by this transaction, in TopTransactionContext.
 * An entry whose record was written or dropped inside a subtransaction
 * stays (settled_in) until that subtransaction ends: if it rolls back, the
 * claim is unwritten again.
 */
static IdemPendingClaim *pending = NULL;
static int	pending_used = 0;
static bool flushing = false;

static ExecutorStart_hook_type prev_executor_start = NULL;
static ProcessUtility_hook_type prev_process_utility = NULL;

static int
count_unsettled(void)
{
	int			n = 0;

	for (int i = 0; i < pending_used; i++)
		if (pending[i].settled_in == InvalidSubTransactionId)
			n++;
	return n;
}

/* Drop entry i (order does not matter). */
static void
remove_entry(int i)
{
	pending[i] = pending[--pending_used];
}

/*
 * The claim is settled: its record is written (or, for a release, there is
 * none to write).  At the top level that is final; in a subtransaction it
 * is undone if the subtransaction rolls back.
 */
void
idem_pending_settle(IdemPendingClaim *p)
{
	SubTransactionId sub = GetCurrentSubTransactionId();

	if (sub == TopSubTransactionId)
		remove_entry(p - pending);
	else
		p->settled_in = sub;
}

/*
 * May a fresh claim of table be remembered instead of written now?
 */
bool
idem_pending_allowed(Oid table)
{
	if (!idem_defer_writes ||
		IsolationUsesXactSnapshot() || XactReadOnly || IsInParallelMode() ||
		GetCurrentTransactionNestLevel() != 1)
		return false;
	if (pg_class_aclcheck(table, GetUserId(), ACL_INSERT) != ACLCHECK_OK)
		return false;
	return check_enable_rls(table, InvalidOid, true) == RLS_NONE;
}

/* The unwritten claim of k in this transaction, or NULL. */
IdemPendingClaim *
idem_pending_find(const IdemKey *k)
{
	for (int i = 0; i < pending_used; i++)
	{
		IdemPendingClaim *p = &pending[i];

		if (p->settled_in == InvalidSubTransactionId &&
			idem_text_equal(p->key, k->key) &&
			idem_text_equal(p->tenant_id, k->tenant_id))
			return p;
	}
	return NULL;
}

/*
 * Remember a fresh claim.  The caller holds the key lock and has read,
 * after taking it, that the key has no record.
 */
void
idem_pending_add(const IdemKey *k, text *fingerprint, int64 token,
				 TimestampTz now, TimestampTz lease_expires_at, int64 ttl_us)
{
	MemoryContext old;
	IdemPendingClaim *p;

	if (count_unsettled() >= IDEM_MAX_PENDING)
		idem_pending_flush();

	old = MemoryContextSwitchTo(TopTransactionContext);
	if (pending == NULL)
		pending = palloc(sizeof(IdemPendingClaim) * IDEM_MAX_PENDING * 2);
	else if (pending_used >= IDEM_MAX_PENDING * 2)
	{
		/* only entries settled in open subtransactions can pile up */
		pending = repalloc(pending, sizeof(IdemPendingClaim) * pending_used * 2);
	}
	p = &pending[pending_used++];
	p->tenant_id = (text *) PG_DETOAST_DATUM_COPY(PointerGetDatum(k->tenant_id));
	p->key = (text *) PG_DETOAST_DATUM_COPY(PointerGetDatum(k->key));
	p->fingerprint = fingerprint ?
		(text *) PG_DETOAST_DATUM_COPY(PointerGetDatum(fingerprint)) : NULL;
	MemoryContextSwitchTo(old);

	p->schema = idem_store_schema();
	p->userid = GetUserId();
	p->token = token;
	p->created_at = now;
	p->updated_at = now;
	p->lease_expires_at = lease_expires_at;
	p->ttl_us = ttl_us;
	p->settled_in = InvalidSubTransactionId;
}

/* A record for the key exists although this transaction holds its lock. */
static void
report_lost_claim(const IdemPendingClaim *p)
{
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_TOKEN_MISMATCH),
			 errmsg("claim of key \"%s\" lost: another transaction stored a record for it",
					text_to_cstring(p->key)),
			 errdetail("The record was written without taking the key's lock (directly into the table, or on another node)."),
			 errhint("This transaction is rolled back; the key's outcome belongs to the other record.")));
}

/*
 * Write one remembered claim as a record: processing (status
 * IDEM_PROCESSING, response ignored, the updated_at of its last heartbeat)
 * or finished now.  Runs as the user who claimed.
 *
 * The INSERT has no ON CONFLICT (it skips the speculative insertion's
 * extra index probe and WAL record): the key lock is held and the key was
 * read free after taking it, so a conflict means a record written around
 * the lock.  Its unique violation never reaches the caller: it becomes the
 * lost-claim error, and the transaction rolls back either way.
 */
void
idem_pending_write(IdemPendingClaim *p, IdemStatus status, Datum response,
				   bool response_isnull, TimestampTz now)
{
	MemoryContext caller_context = CurrentMemoryContext;
	Oid			save_userid;
	int			save_sec_context;
	IdemKey		k = {p->tenant_id, p->key};

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	if (save_userid != p->userid)
		SetUserIdAndSecContext(p->userid,
							   save_sec_context | SECURITY_LOCAL_USERID_CHANGE);
	PG_TRY();
	{
		idem_store_begin_in_schema(p->schema);
		if (status == IDEM_PROCESSING)
			idem_store_write_once(&k, p->fingerprint, p->token, p->created_at,
								  p->updated_at, p->lease_expires_at, p->ttl_us,
								  status, (Datum) 0, true);
		else
			idem_store_write_once(&k, p->fingerprint, p->token, p->created_at,
								  now, p->lease_expires_at, p->ttl_us,
								  status, response, response_isnull);
		idem_store_end();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		SetUserIdAndSecContext(save_userid, save_sec_context);
		MemoryContextSwitchTo(caller_context);
		edata = CopyErrorData();
		if (edata->sqlerrcode != ERRCODE_UNIQUE_VIOLATION)
			PG_RE_THROW();
		/* the transaction is aborting: only the error it reports changes */
		FlushErrorState();
		report_lost_claim(p);
	}
	PG_END_TRY();
	SetUserIdAndSecContext(save_userid, save_sec_context);

	idem_pending_settle(p);
}

/* Write every remembered claim as its processing row. */
static void
flush_all(void)
{
	if (flushing)
		return;

	flushing = true;
	PG_TRY();
	{
		for (int i = pending_used - 1; i >= 0; i--)
			if (pending[i].settled_in == InvalidSubTransactionId)
				idem_pending_write(&pending[i], IDEM_PROCESSING, (Datum) 0, true, 0);
	}
	PG_FINALLY();
	{
		flushing = false;
	}
	PG_END_TRY();
}

/*
 * Write the remembered claims before a snapshot taken earlier looks at the
 * table, and let it see them, exactly as if the claims had been written by
 * the earlier commands that made them: the snapshot of the statement about
 * to start (if any), and the active one, which the running statement or a
 * read-only statement of the running function uses.
 */
static void
flush_for_snapshot(Snapshot snapshot)
{
	if (flushing || count_unsettled() == 0)
		return;
	flush_all();
	CommandCounterIncrement();
	if (snapshot != NULL)
		snapshot->curcid = GetCurrentCommandId(false);
	if (ActiveSnapshotSet())
		GetActiveSnapshot()->curcid = GetCurrentCommandId(false);
}

/*
 * Write every remembered claim now: for our functions that look at other
 * keys or at the whole table.
 */
void
idem_pending_flush(void)
{
	flush_for_snapshot(NULL);
}

static bool
plan_uses_table(PlannedStmt *stmt)
{
	ListCell   *lc;

	foreach(lc, stmt->rtable)
	{
		RangeTblEntry *rte = lfirst_node(RangeTblEntry, lc);

		if (rte->rtekind == RTE_RELATION && idem_store_is_table(rte->relid))
			return true;
	}
	return false;
}

static void
pending_executor_start(QueryDesc *queryDesc, int eflags)
{
	if (pending_used > 0 && !idem_store_running() &&
		plan_uses_table(queryDesc->plannedstmt))
		flush_for_snapshot(queryDesc->snapshot);

	if (prev_executor_start)
		prev_executor_start(queryDesc, eflags);
	else
		standard_ExecutorStart(queryDesc, eflags);
}

static void
pending_process_utility(PlannedStmt *pstmt, const char *queryString,
						bool readOnlyTree, ProcessUtilityContext context,
						ParamListInfo params, QueryEnvironment *queryEnv,
						DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *stmt = pstmt->utilityStmt;

	/* transaction control and settings cannot look at the table */
	if (pending_used > 0 && !IsA(stmt, TransactionStmt) &&
		!IsA(stmt, VariableSetStmt) && !IsA(stmt, VariableShowStmt))
		flush_for_snapshot(NULL);

	if (prev_process_utility)
		prev_process_utility(pstmt, queryString, readOnlyTree, context,
							 params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);
}

static void
pending_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			if (count_unsettled() > 0)
			{
				/* no statement is running: give the writes a snapshot */
				PushActiveSnapshot(GetTransactionSnapshot());
				flush_all();
				PopActiveSnapshot();
			}
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			/* the memory goes with TopTransactionContext */
			pending = NULL;
			pending_used = 0;
			flushing = false;
			break;
		default:
			break;
	}
}

static void
pending_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						 SubTransactionId parentSubid, void *arg)
{
	for (int i = pending_used - 1; i >= 0; i--)
	{
		IdemPendingClaim *p = &pending[i];

		if (p->settled_in != mySubid)
			continue;
		if (event == SUBXACT_EVENT_ABORT_SUB)
			p->settled_in = InvalidSubTransactionId;	/* the write is undone */
		else if (event == SUBXACT_EVENT_COMMIT_SUB)
		{
			if (parentSubid == TopSubTransactionId)
				remove_entry(i);
			else
				p->settled_in = parentSubid;
		}
	}
}

/*
 * Install the hooks and callbacks.  Called from _PG_init.
 */
void
idem_pending_init(void)
{
	prev_executor_start = ExecutorStart_hook;
	ExecutorStart_hook = pending_executor_start;
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = pending_process_utility;
	RegisterXactCallback(pending_xact_callback, NULL);
	RegisterSubXactCallback(pending_subxact_callback, NULL);
}
