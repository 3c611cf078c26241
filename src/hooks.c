/*
 * hooks.c
 *		Every hook the module installs: the planner, ExecutorStart and
 *		ProcessUtility hooks and the transaction callbacks.
 *
 * Each hook has pg_stat_statements' shape: it does its own part, and calls
 * the hook that was installed before it (or the standard function) in
 * every case.  In a backend that holds no claim and runs none of its own
 * statements, each is one test of a flag (the utility hook also tests for
 * a DROP and an ALTER EXTENSION, the planner hook for Citus) and that call; the transaction
 * callbacks reset a few variables.  No statement is classified and nothing
 * is tracked.
 *
 * Held claims.  A fresh claim may be held in memory (held.c), stamped with
 * the command ID its INSERT would have had.  Visibility of a transaction's
 * own rows depends only on command IDs, so a held claim written at any
 * moment before the first read of the table is seen by every snapshot
 * exactly as if it had been written at once.  What must never happen is a
 * read of the table while a claim is still held.  Everything that reads a
 * table goes through one of three doors, and each writes held claims first:
 *
 *	- the executor: at ExecutorStart of any statement, at any nesting depth
 *	  (a trigger's, a function's, a domain check's, an operator's: whatever
 *	  runs it), whose plan depends on the table, or that will enter
 *	  parallel mode (where nothing can be written any more);
 *	- utility commands (COPY, CLUSTER, ALTER TABLE, ...): all but the few
 *	  that cannot look at a table;
 *	- this extension's own C code (the direct read and the functions that
 *	  read more than their own key write them, or the claim, first).
 *
 * COMMIT and PREPARE TRANSACTION write held claims in their final form
 * within their statement, so statement_timeout and lock_timeout apply;
 * a transaction that ends otherwise (an implicit block of several
 * statements sent as one string) writes them at pre-commit.
 *
 * Our own statements (store_attach.c) are planned with sequential scans
 * discouraged.  On
 * a Citus server the planner hook refuses a call shape Citus crashes on
 * (citus.c), DROP EXTENSION drops a distributed table's shards first, and
 * ALTER EXTENSION idempotency UPDATE is refused while the table carries an
 * ordinary owner's code (update_guard.c).
 */
#include "postgres.h"

#include "access/xact.h"
#include "executor/executor.h"
#include "jit/jit.h"
#include "miscadmin.h"
#include "optimizer/cost.h"
#include "optimizer/planner.h"
#include "tcop/utility.h"
#include "utils/guc.h"

#include "citus.h"
#include "compat.h"
#include "held.h"
#include "hooks.h"
#include "idempotency.h"
#include "shard_route.h"
#include "store_attach.h"
#include "update_guard.h"

static planner_hook_type prev_planner = NULL;
static ExecutorStart_hook_type prev_ExecutorStart = NULL;
static ProcessUtility_hook_type prev_ProcessUtility = NULL;

/* Is citus among shared_preload_libraries?  Read once, in _PG_init. */
static bool citus_preloaded = false;

/* ---------- planner ---------- */

static PlannedStmt *
run_planner(Query *parse, const char *query_string, int cursorOptions,
			ParamListInfo boundParams)
{
	if (prev_planner)
		return prev_planner(parse, query_string, cursorOptions, boundParams);
	return standard_planner(parse, query_string, cursorOptions, boundParams);
}

/*
 * Plan one of our statements with sequential scans discouraged.  They are
 * point lookups and index-ordered scans, and a plan made while the table is
 * empty and analyzed (after a sweep emptied it) would be a sequential scan
 * that the plan cache keeps until the next invalidation, however large the
 * table grows.
 *
 * And never compiled by JIT: each reads or writes a few rows, and compiling
 * costs a fifth of a second.  A sequential scan that stays in the plan (a
 * child table by inheritance has no index) carries the disable cost until
 * PostgreSQL 18, far past jit_above_cost, so every claim paid that.
 */
static PlannedStmt *
plan_own_statement(Query *parse, const char *query_string, int cursorOptions,
				   ParamListInfo boundParams)
{
	PlannedStmt *result;
	bool		save_enable_seqscan = enable_seqscan;

	enable_seqscan = false;
	PG_TRY();
	{
		result = run_planner(parse, query_string, cursorOptions, boundParams);
	}
	PG_FINALLY();
	{
		enable_seqscan = save_enable_seqscan;
	}
	PG_END_TRY();
	result->jitFlags = PGJIT_NONE;
	return result;
}

static PlannedStmt *
idem_planner(Query *parse, const char *query_string, int cursorOptions,
			 ParamListInfo boundParams)
{
	if (likely(!idem_store_statement_starting && !citus_preloaded))
		return run_planner(parse, query_string, cursorOptions, boundParams);
	if (idem_store_statement_starting)
		return plan_own_statement(parse, query_string, cursorOptions, boundParams);
	idem_citus_refuse_crashing_call(parse);
	return run_planner(parse, query_string, cursorOptions, boundParams);
}

/* ---------- ExecutorStart ---------- */

static void
run_ExecutorStart(QueryDesc *queryDesc, int eflags)
{
	if (prev_ExecutorStart)
		prev_ExecutorStart(queryDesc, eflags);
	else
		standard_ExecutorStart(queryDesc, eflags);
}

/*
 * A statement is starting while claims are held, or one of our own is:
 * write held claims if it could read them (ours never do).
 */
static void
armed_ExecutorStart(QueryDesc *queryDesc, int eflags)
{
	bool		ours = idem_store_take_statement_start();
	PlannedStmt *plan = queryDesc->plannedstmt;

	if (!ours && idem_claims_held && !(eflags & EXEC_FLAG_EXPLAIN_ONLY) &&
		(plan->parallelModeNeeded || idem_held_table_in(plan->relationOids)))
		idem_held_write_all();
	run_ExecutorStart(queryDesc, eflags);
}

static void
idem_ExecutorStart(QueryDesc *queryDesc, int eflags)
{
	if (unlikely(idem_claims_held || idem_store_statement_starting))
		armed_ExecutorStart(queryDesc, eflags);
	else
		run_ExecutorStart(queryDesc, eflags);
}

/* ---------- ProcessUtility ---------- */

typedef enum UtilityKind
{
	UTILITY_QUIET,				/* cannot look at a table */
	UTILITY_COMMIT,				/* ends the transaction */
	UTILITY_READER				/* may look at a table, or change what a
								 * later write may do */
} UtilityKind;

/* SET commands that change whether the transaction may still write. */
static bool
set_changes_writability(VariableSetStmt *stmt)
{
	if (stmt->kind == VAR_RESET_ALL)
		return true;
	return stmt->name != NULL &&
		(strcmp(stmt->name, "transaction_read_only") == 0 ||
		 strcmp(stmt->name, "TRANSACTION") == 0);
}

static UtilityKind
classify_utility(Node *stmt)
{
	switch (nodeTag(stmt))
	{
		case T_TransactionStmt:
			switch (((TransactionStmt *) stmt)->kind)
			{
				case TRANS_STMT_COMMIT:
				case TRANS_STMT_PREPARE:
					return UTILITY_COMMIT;
				default:
					return UTILITY_QUIET;
			}
		case T_VariableSetStmt:
			return set_changes_writability((VariableSetStmt *) stmt) ?
				UTILITY_READER : UTILITY_QUIET;
		case T_DeclareCursorStmt:

			/*
			 * A cursor WITH HOLD is run to its end at COMMIT, with the
			 * snapshot of its DECLARE: held claims are written as their
			 * history before it, so that snapshot sees them.
			 */
			return (((DeclareCursorStmt *) stmt)->options & CURSOR_OPT_HOLD) ?
				UTILITY_READER : UTILITY_QUIET;
		case T_ExplainStmt:
			/* planning reads the table's size and its indexes' ranges */
			return UTILITY_READER;
		case T_VariableShowStmt:
		case T_FetchStmt:
		case T_ClosePortalStmt:
		case T_PrepareStmt:
		case T_ExecuteStmt:
		case T_DeallocateStmt:
		case T_ListenStmt:
		case T_UnlistenStmt:
		case T_NotifyStmt:
		case T_LockStmt:
			/* their queries, if any, go through ExecutorStart */
			return UTILITY_QUIET;
		default:
			return UTILITY_READER;
	}
}

/*
 * Is the transaction block failed, so that its end is a rollback whatever
 * the statement that ends it says?  ('E' is what the protocol reports for
 * a failed block, in every state of ending one.)
 */
static bool
transaction_block_failed(void)
{
	return TransactionBlockStatusCode() == 'E';
}

static void
run_ProcessUtility(PlannedStmt *pstmt, const char *queryString,
				   bool readOnlyTree, ProcessUtilityContext context,
				   ParamListInfo params, QueryEnvironment *queryEnv,
				   DestReceiver *dest, QueryCompletion *qc)
{
	if (prev_ProcessUtility)
		prev_ProcessUtility(pstmt, queryString, readOnlyTree, context,
							params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);
}

static void
armed_ProcessUtility(PlannedStmt *pstmt, const char *queryString,
					  bool readOnlyTree, ProcessUtilityContext context,
					  ParamListInfo params, QueryEnvironment *queryEnv,
					  DestReceiver *dest, QueryCompletion *qc)
{
	UtilityKind kind = classify_utility(pstmt->utilityStmt);

	if (kind == UTILITY_READER)
		idem_held_write_all();

	run_ProcessUtility(pstmt, queryString, readOnlyTree, context, params,
					   queryEnv, dest, qc);

	/*
	 * COMMIT and PREPARE TRANSACTION have now only marked the block as
	 * ending; the commit itself, and deferred triggers, run when the
	 * statement is over.  Writing held claims here is still inside the
	 * statement (statement_timeout and lock_timeout apply), and an error
	 * here ends the transaction block just as a failing deferred
	 * constraint does.  In a failed block (an error, in the block or in a
	 * savepoint not rolled back to) the COMMIT has become a ROLLBACK:
	 * nothing is written, as the claims' INSERTs would be rolled back.
	 */
	if (kind == UTILITY_COMMIT && !transaction_block_failed())
		idem_held_write_final();
}

static void
idem_ProcessUtility(PlannedStmt *pstmt, const char *queryString,
					bool readOnlyTree, ProcessUtilityContext context,
					ParamListInfo params, QueryEnvironment *queryEnv,
					DestReceiver *dest, QueryCompletion *qc)
{
	/* DROP EXTENSION idempotency drops a distributed table's shards first */
	if (unlikely(IsA(pstmt->utilityStmt, DropStmt)))
		idem_citus_before_drop((DropStmt *) pstmt->utilityStmt);
	/* ALTER EXTENSION idempotency UPDATE runs no owner's code as the updater */
	if (unlikely(IsA(pstmt->utilityStmt, AlterExtensionStmt)))
		idem_guard_extension_update((AlterExtensionStmt *) pstmt->utilityStmt);
	if (unlikely(idem_claims_held))
		armed_ProcessUtility(pstmt, queryString, readOnlyTree, context,
							 params, queryEnv, dest, qc);
	else
		run_ProcessUtility(pstmt, queryString, readOnlyTree, context, params,
						   queryEnv, dest, qc);
}

/* ---------- transaction callbacks ---------- */

static void
idem_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			/* COMMIT wrote them already (ProcessUtility): this covers the rest */
			idem_held_write_final();
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			/* a call of ours that was running ended in the error */
			idem_store_call_aborted();
			idem_held_xact_ended();
			idem_shard_route_xact_ended();
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
			idem_held_xact_ended();
			idem_shard_route_xact_ended();
			break;
		default:
			break;
	}
}

static void
idem_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					  SubTransactionId parentSubid, void *arg)
{
	if (event == SUBXACT_EVENT_COMMIT_SUB || event == SUBXACT_EVENT_ABORT_SUB)
		idem_held_subxact_ended(mySubid, parentSubid,
								event == SUBXACT_EVENT_COMMIT_SUB);
}

/*
 * Install the hooks and register the transaction callbacks.  Called from
 * _PG_init.
 */
void
idem_hooks_init(void)
{
	prev_planner = planner_hook;
	planner_hook = idem_planner;
	prev_ExecutorStart = ExecutorStart_hook;
	ExecutorStart_hook = idem_ExecutorStart;
	prev_ProcessUtility = ProcessUtility_hook;
	ProcessUtility_hook = idem_ProcessUtility;
	RegisterXactCallback(idem_xact_callback, NULL);
	RegisterSubXactCallback(idem_subxact_callback, NULL);
	citus_preloaded = shared_preload_libraries_string != NULL &&
		strstr(shared_preload_libraries_string, "citus") != NULL;
}
