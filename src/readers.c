/*
 * readers.c
 *		Writing held claims before anything could read them.
 *
 * A fresh claim may be held in memory (held.c), stamped with the
 * command ID its INSERT would have had.  Visibility of a transaction's own
 * rows depends only on command IDs, so a held claim written at any moment
 * before the first read of the table is seen by every snapshot exactly as
 * if it had been written at once.  What must never happen is a read of the
 * table while a claim is still held.  Everything that reads a table goes
 * through one of three doors, and each writes held claims first:
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
 * Zero footprint: in a backend holding no claim, each hook is one test of
 * a flag and a call of the next hook.  No statement is classified and
 * nothing is tracked.  The planner hook (store.c) likewise only acts for
 * our own statements, and on a Citus server.
 */
#include "postgres.h"

#include "access/xact.h"
#include "executor/executor.h"
#include "tcop/utility.h"

#include "compat.h"
#include "idempotency.h"

static ExecutorStart_hook_type prev_executor_start = NULL;
static ProcessUtility_hook_type prev_process_utility = NULL;

/*
 * A statement is starting while claims are held, or one of our own is:
 * write held claims if it could read them; stamp our own writes.
 */
static void
armed_executor_start(QueryDesc *queryDesc, int eflags)
{
	bool		ours = idem_store_statement_starting;
	PlannedStmt *plan = queryDesc->plannedstmt;

	idem_store_statement_starting = false;
	if (!ours && idem_claims_held && !(eflags & EXEC_FLAG_EXPLAIN_ONLY) &&
		(plan->parallelModeNeeded || idem_held_table_in(plan->relationOids)))
		idem_held_write_all();

	if (prev_executor_start)
		prev_executor_start(queryDesc, eflags);
	else
		standard_ExecutorStart(queryDesc, eflags);

	if (ours)
		idem_store_statement_started(queryDesc);
}

static void
readers_executor_start(QueryDesc *queryDesc, int eflags)
{
	if (unlikely(idem_claims_held || idem_store_statement_starting))
		armed_executor_start(queryDesc, eflags);
	else if (prev_executor_start)
		prev_executor_start(queryDesc, eflags);
	else
		standard_ExecutorStart(queryDesc, eflags);
}

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
run_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
			ProcessUtilityContext context, ParamListInfo params,
			QueryEnvironment *queryEnv, DestReceiver *dest,
			QueryCompletion *qc)
{
	if (prev_process_utility)
		prev_process_utility(pstmt, queryString, readOnlyTree, context,
							 params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);
}

static void
armed_process_utility(PlannedStmt *pstmt, const char *queryString,
					  bool readOnlyTree, ProcessUtilityContext context,
					  ParamListInfo params, QueryEnvironment *queryEnv,
					  DestReceiver *dest, QueryCompletion *qc)
{
	UtilityKind kind = classify_utility(pstmt->utilityStmt);

	if (kind == UTILITY_READER)
		idem_held_write_all();

	run_utility(pstmt, queryString, readOnlyTree, context, params, queryEnv,
				dest, qc);

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
readers_process_utility(PlannedStmt *pstmt, const char *queryString,
						bool readOnlyTree, ProcessUtilityContext context,
						ParamListInfo params, QueryEnvironment *queryEnv,
						DestReceiver *dest, QueryCompletion *qc)
{
	/* DROP EXTENSION idempotency drops a distributed table's shards first */
	if (unlikely(IsA(pstmt->utilityStmt, DropStmt)))
		idem_citus_before_drop((DropStmt *) pstmt->utilityStmt);
	if (unlikely(idem_claims_held))
		armed_process_utility(pstmt, queryString, readOnlyTree, context,
							  params, queryEnv, dest, qc);
	else
		run_utility(pstmt, queryString, readOnlyTree, context, params,
					queryEnv, dest, qc);
}

/*
 * Install the hooks.  Called from _PG_init.
 */
void
idem_readers_init(void)
{
	prev_executor_start = ExecutorStart_hook;
	ExecutorStart_hook = readers_executor_start;
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = readers_process_utility;
}
