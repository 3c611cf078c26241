/*
 * readers.c
 *		Which statements could see a held claim, and writing held claims
 *		before such a statement starts.
 *
 * A fresh claim may be held in memory and written once, when it settles
 * (pending.c).  The rule is that nobody can tell: every statement must see
 * exactly what it would see had each claim been written at once.  A claim
 * written at once is visible to every snapshot taken after it, so a held
 * claim must be written before any later statement that could look at the
 * records table takes effect, and that must happen before the statement
 * reads anything, because a running statement's snapshot is never changed.
 *
 * So every statement is classified when it is planned: it is a *reader* if
 * it could look at idempotency_records in any way, directly (the table, a
 * view over it, a regclass naming it) or through code that PostgreSQL runs
 * for it: a function that is not a known-quiet built-in (any user function
 * may query the table), a domain check, a sort operator, or a write to a
 * relation with triggers other than plain foreign-key checks, CHECK
 * constraints calling such functions, or partitions and children (whose
 * triggers and constraints the plan does not name).  A reader plan carries
 * an InvalidOid in its relationOids, the list of relations a plan depends
 * on (PostgreSQL's plan cache ignores it; it only ever matches real
 * relation OIDs).
 *
 * At ExecutorStart of a reader, held claims are written and the statement's
 * own snapshot, taken a moment ago and not yet used, is advanced past the
 * writes: exactly as if the claims had been written before it.  That is
 * done only for a statement that no running executor is part of (nesting
 * depth 0, as pg_stat_statements counts it); a statement nested in a
 * running one may share that one's snapshot.  While any reader is open (a
 * cursor, a portal suspended part-way), new claims are not held at all,
 * since its later fetches may look at the table again.
 *
 * Utility statements are readers unless they are known not to look at the
 * table (transaction control, most SET, SHOW, cursor and prepared-statement
 * handling whose queries go through ExecutorStart themselves, LISTEN,
 * NOTIFY).  COMMIT and PREPARE TRANSACTION write held claims as part of
 * their statement, before the commit, so deferred triggers still fire on
 * them and the
 * session's statement_timeout and lock_timeout still apply.  Claims are
 * held only in explicit transaction blocks, where COMMIT is a statement of
 * its own.
 *
 * What is taken at its word, as PostgreSQL itself does: functions declared
 * IMMUTABLE where PostgreSQL requires it (index expressions, generated
 * columns, partition keys) and the support functions of types and operator
 * classes (comparison, hashing, input and output written in C).
 */
#include "postgres.h"

#include "access/parallel.h"
#include "access/relation.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/pg_class.h"
#include "catalog/pg_language.h"
#include "catalog/pg_proc.h"
#include "executor/executor.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/optimizer.h"
#include "optimizer/planner.h"
#include "parser/parsetree.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/typcache.h"

#include "compat.h"
#include "idempotency.h"

/*
 * Built-in functions that run SQL of their own (the XML export family,
 * ts_stat, ts_rewrite with a query), or that could tell whether a claim was
 * written (whether the transaction has an XID yet), or that may change what
 * a later write may do (set_config, unless set_config_is_quiet says it
 * names another setting).
 */
static const Oid loud_builtins[] = {
	F_TABLE_TO_XML, F_QUERY_TO_XML, F_CURSOR_TO_XML,
	F_TABLE_TO_XMLSCHEMA, F_QUERY_TO_XMLSCHEMA, F_CURSOR_TO_XMLSCHEMA,
	F_TABLE_TO_XML_AND_XMLSCHEMA, F_QUERY_TO_XML_AND_XMLSCHEMA,
	F_SCHEMA_TO_XML, F_SCHEMA_TO_XMLSCHEMA, F_SCHEMA_TO_XML_AND_XMLSCHEMA,
	F_DATABASE_TO_XML, F_DATABASE_TO_XMLSCHEMA, F_DATABASE_TO_XML_AND_XMLSCHEMA,
	F_TS_STAT_TEXT, F_TS_STAT_TEXT_TEXT, F_TS_REWRITE_TSQUERY_TEXT,
	F_CURRTID2, F_TXID_CURRENT_IF_ASSIGNED, F_PG_CURRENT_XACT_ID_IF_ASSIGNED,
	F_SET_CONFIG,
};

/* Foreign-key triggers that only check a row of another table. */
static const Oid quiet_triggers[] = {
	F_RI_FKEY_CHECK_INS, F_RI_FKEY_CHECK_UPD,
	F_RI_FKEY_NOACTION_DEL, F_RI_FKEY_NOACTION_UPD,
	F_RI_FKEY_RESTRICT_DEL, F_RI_FKEY_RESTRICT_UPD,
};

/* Our functions that touch only the key they are given. */
static const char *const quiet_own_functions[] = {
	"idem_claim", "idem_complete", "idem_release", "idem_heartbeat",
	"idem_checkpoint", "idem_child_key",
};

/*
 * Verdicts on functions that are not built in, a handful per backend,
 * cleared by any change to pg_proc.
 */
#define FUNCTION_VERDICT_SLOTS 16
typedef struct FunctionVerdict
{
	Oid			fn_oid;
	bool		quiet;
} FunctionVerdict;
static FunctionVerdict verdicts[FUNCTION_VERDICT_SLOTS];
static int	verdicts_used = 0;
static bool verdict_callback_registered = false;

/* How many executors are starting, running or finishing (nesting depth). */
static int	executor_depth = 0;

/* Reader statements whose executor has started and not ended. */
static List *open_readers = NIL;

/* The transaction began with BEGIN or START TRANSACTION. */
static bool explicit_block = false;

static planner_hook_type prev_planner_hook = NULL;
static ExecutorStart_hook_type prev_executor_start = NULL;
static ExecutorRun_hook_type prev_executor_run = NULL;
static ExecutorFinish_hook_type prev_executor_finish = NULL;
static ExecutorEnd_hook_type prev_executor_end = NULL;
static ProcessUtility_hook_type prev_process_utility = NULL;

static bool
oid_in(Oid oid, const Oid *list, int n)
{
	for (int i = 0; i < n; i++)
		if (list[i] == oid)
			return true;
	return false;
}

static void
verdict_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	verdicts_used = 0;
}

/*
 * The C symbol of fn_oid when it is one of this extension's functions
 * (C language, $libdir/idempotency), or NULL.
 */
char *
idem_own_function_symbol(Oid fn_oid)
{
	HeapTuple	tup;
	char	   *symbol = NULL;

	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn_oid));
	if (!HeapTupleIsValid(tup))
		return NULL;
	if (((Form_pg_proc) GETSTRUCT(tup))->prolang == ClanguageId)
	{
		bool		isnull;
		Datum		bin = SysCacheGetAttr(PROCOID, tup, Anum_pg_proc_probin, &isnull);

		if (!isnull && strcmp(TextDatumGetCString(bin), "$libdir/idempotency") == 0)
			symbol = TextDatumGetCString(SysCacheGetAttr(PROCOID, tup,
														 Anum_pg_proc_prosrc, &isnull));
	}
	ReleaseSysCache(tup);
	return symbol;
}

/* Is fn_oid one of our functions that touch only their own key? */
static bool
own_quiet_function(Oid fn_oid)
{
	char	   *symbol = idem_own_function_symbol(fn_oid);

	if (symbol != NULL)
		for (size_t i = 0; i < lengthof(quiet_own_functions); i++)
			if (strcmp(symbol, quiet_own_functions[i]) == 0)
				return true;
	return false;
}

/* Can calling fn_oid never look at the records table? */
static bool
function_is_quiet(Oid fn_oid)
{
	FunctionVerdict *slot;

	if (fn_oid < FirstGenbkiObjectId)
		return !oid_in(fn_oid, loud_builtins, lengthof(loud_builtins));

	for (int i = 0; i < verdicts_used; i++)
		if (verdicts[i].fn_oid == fn_oid)
			return verdicts[i].quiet;

	if (!verdict_callback_registered)
	{
		CacheRegisterSyscacheCallback(PROCOID, verdict_callback, (Datum) 0);
		verdict_callback_registered = true;
	}
	slot = verdicts_used < FUNCTION_VERDICT_SLOTS ?
		&verdicts[verdicts_used++] : &verdicts[fn_oid % FUNCTION_VERDICT_SLOTS];
	slot->fn_oid = fn_oid;
	slot->quiet = own_quiet_function(fn_oid);
	return slot->quiet;
}

/* check_functions_in_node() callback: true stops the walk (a reader). */
static bool
function_is_loud(Oid fn_oid, void *context)
{
	return !function_is_quiet(fn_oid);
}

static bool reader_walker(Node *node, void *context);

/* Could the checks of domain typid call a loud function? */
static bool
domain_is_loud(Oid typid)
{
	DomainConstraintRef ref;
	ListCell   *lc;

	InitDomainConstraintRef(typid, &ref, CurrentMemoryContext, false);
	foreach(lc, ref.constraints)
	{
		DomainConstraintState *c = (DomainConstraintState *) lfirst(lc);

		if (c->check_expr != NULL && reader_walker((Node *) c->check_expr, NULL))
			return true;
	}
	return false;
}

/* Could sorting or grouping by these clauses call a loud function? */
static bool
clauses_are_loud(List *clauses)
{
	ListCell   *lc;

	foreach(lc, clauses)
	{
		SortGroupClause *sgc = lfirst_node(SortGroupClause, lc);

		if ((OidIsValid(sgc->sortop) && !function_is_quiet(get_opcode(sgc->sortop))) ||
			(OidIsValid(sgc->eqop) && !function_is_quiet(get_opcode(sgc->eqop))))
			return true;
	}
	return false;
}

/*
 * Could writing to relid run code the plan does not name: triggers other
 * than foreign-key checks, CHECK constraints calling loud functions, or a
 * partition's or child's own triggers and constraints?
 */
static bool
write_target_is_loud(Oid relid)
{
	Relation	rel = relation_open(relid, NoLock);
	bool		loud = false;

	if (rel->rd_rel->relkind == RELKIND_PARTITIONED_TABLE ||
		rel->rd_rel->relhassubclass)
		loud = true;
	if (!loud && rel->trigdesc != NULL)
	{
		for (int i = 0; i < rel->trigdesc->numtriggers && !loud; i++)
			loud = !oid_in(rel->trigdesc->triggers[i].tgfoid,
						   quiet_triggers, lengthof(quiet_triggers));
	}
	if (!loud && rel->rd_att->constr != NULL)
	{
		TupleConstr *constr = rel->rd_att->constr;

		for (int i = 0; i < constr->num_check && !loud; i++)
			loud = reader_walker(stringToNode(constr->check[i].ccbin), NULL);
	}
	relation_close(rel, NoLock);
	return loud;
}

static bool
query_is_loud(Query *q)
{
	ListCell   *lc;

	if (q->resultRelation > 0)
	{
		RangeTblEntry *rte = rt_fetch(q->resultRelation, q->rtable);

		if (rte->rtekind == RTE_RELATION && write_target_is_loud(rte->relid))
			return true;
	}
	if (clauses_are_loud(q->sortClause) || clauses_are_loud(q->groupClause) ||
		clauses_are_loud(q->distinctClause))
		return true;
	foreach(lc, q->windowClause)
	{
		WindowClause *wc = lfirst_node(WindowClause, lc);

		if (clauses_are_loud(wc->partitionClause) || clauses_are_loud(wc->orderClause))
			return true;
	}
	return query_tree_walker(q, reader_walker, NULL, 0);
}

/*
 * set_config() of a setting named by a constant, other than
 * transaction_read_only: a common way to keep a token for later statements.
 */
static bool
set_config_is_quiet(FuncExpr *expr)
{
	Const	   *name = linitial(expr->args);

	if (!IsA(name, Const) || name->constisnull)
		return false;
	return pg_strcasecmp(TextDatumGetCString(name->constvalue),
						 "transaction_read_only") != 0;
}

static bool
reader_walker(Node *node, void *context)
{
	if (node == NULL)
		return false;
	if (IsA(node, Query))
		return query_is_loud((Query *) node);
	if (IsA(node, FuncExpr) && ((FuncExpr *) node)->funcid == F_SET_CONFIG &&
		set_config_is_quiet((FuncExpr *) node))
		return expression_tree_walker(node, reader_walker, NULL);
	if (check_functions_in_node(node, function_is_loud, NULL))
		return true;
	if (IsA(node, CoerceToDomain) &&
		domain_is_loud(((CoerceToDomain *) node)->resulttype))
		return true;
	return expression_tree_walker(node, reader_walker, NULL);
}

/* Does the plan name a relation called idempotency_records? */
static bool
plan_names_records_table(PlannedStmt *stmt)
{
	ListCell   *lc;

	foreach(lc, stmt->relationOids)
	{
		HeapTuple	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(lfirst_oid(lc)));
		bool		named;

		if (!HeapTupleIsValid(tup))
			continue;
		named = strcmp(NameStr(((Form_pg_class) GETSTRUCT(tup))->relname),
					   "idempotency_records") == 0;
		ReleaseSysCache(tup);
		if (named)
			return true;
	}
	return false;
}

/*
 * Plan the statement, and mark it if it is a reader.  The query tree is
 * walked before planning, since the planner scribbles on it.
 */
static PlannedStmt *
readers_planner(Query *parse, const char *query_string, int cursorOptions,
				ParamListInfo boundParams)
{
	bool		classify = !idem_store_running() && !IsParallelWorker();
	bool		reader = classify && reader_walker((Node *) parse, NULL);
	PlannedStmt *result;

	idem_citus_refuse_crashing_call(parse);

	if (prev_planner_hook)
		result = prev_planner_hook(parse, query_string, cursorOptions, boundParams);
	else
		result = standard_planner(parse, query_string, cursorOptions, boundParams);

	if (classify && (reader || plan_names_records_table(result)))
		result->relationOids = lappend_oid(result->relationOids, InvalidOid);
	return result;
}

static bool
plan_is_reader(PlannedStmt *stmt)
{
	Oid			table = idem_store_table();
	ListCell   *lc;

	foreach(lc, stmt->relationOids)
	{
		Oid			relid = lfirst_oid(lc);

		if (relid == InvalidOid || relid == table)
			return true;
	}
	return false;
}

/*
 * May a fresh claim be held now?  Only in an explicit transaction block
 * (COMMIT is then a statement, see above) and while no reader is open.
 */
bool
idem_readers_allow_holding(void)
{
	return explicit_block && open_readers == NIL;
}

/*
 * Is no statement running?  Then the active snapshot, if any, belongs to no
 * statement that has read anything (a PL/pgSQL simple expression's, or a
 * utility command's), and may be advanced past held claims written now.
 */
bool
idem_readers_outside_statement(void)
{
	return executor_depth == 0;
}

/* How many executors are starting, running or finishing now (store.c). */
int
idem_readers_depth(void)
{
	return executor_depth;
}

static void
readers_executor_start(QueryDesc *queryDesc, int eflags)
{
	if (!idem_store_running() && !IsParallelWorker() &&
		!(eflags & EXEC_FLAG_EXPLAIN_ONLY) &&
		plan_is_reader(queryDesc->plannedstmt))
	{
		MemoryContext old;

		/* a nested statement may share a running one's snapshot */
		if (executor_depth == 0)
			idem_pending_write_all(queryDesc->snapshot, true);
		else
			idem_pending_write_all(NULL, false);

		old = MemoryContextSwitchTo(TopTransactionContext);
		open_readers = lappend(open_readers, queryDesc);
		MemoryContextSwitchTo(old);
	}

	executor_depth++;
	PG_TRY();
	{
		if (prev_executor_start)
			prev_executor_start(queryDesc, eflags);
		else
			standard_ExecutorStart(queryDesc, eflags);
	}
	PG_FINALLY();
	{
		executor_depth--;
	}
	PG_END_TRY();
}

static void
readers_executor_run(IDEM_EXECUTOR_RUN_PARAMS)
{
	executor_depth++;
	PG_TRY();
	{
		if (prev_executor_run)
			prev_executor_run(IDEM_EXECUTOR_RUN_ARGS);
		else
			standard_ExecutorRun(IDEM_EXECUTOR_RUN_ARGS);
	}
	PG_FINALLY();
	{
		executor_depth--;
	}
	PG_END_TRY();
}

static void
readers_executor_finish(QueryDesc *queryDesc)
{
	executor_depth++;
	PG_TRY();
	{
		if (prev_executor_finish)
			prev_executor_finish(queryDesc);
		else
			standard_ExecutorFinish(queryDesc);
	}
	PG_FINALLY();
	{
		executor_depth--;
	}
	PG_END_TRY();
}

/*
 * A reader whose executor never ends (its subtransaction failed) stays in
 * the list until the transaction ends: that only stops claims from being
 * held, which is always safe.
 */
static void
readers_executor_end(QueryDesc *queryDesc)
{
	if (open_readers != NIL)
		open_readers = list_delete_ptr(open_readers, queryDesc);

	if (prev_executor_end)
		prev_executor_end(queryDesc);
	else
		standard_ExecutorEnd(queryDesc);
}

typedef enum UtilityKind
{
	UTILITY_QUIET,				/* cannot look at the table */
	UTILITY_COMMIT,				/* ends the transaction */
	UTILITY_READER				/* may look at the table, or change what a
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
		case T_VariableShowStmt:
		case T_FetchStmt:
		case T_ClosePortalStmt:
		case T_DeclareCursorStmt:
		case T_PrepareStmt:
		case T_ExecuteStmt:
		case T_DeallocateStmt:
		case T_ExplainStmt:
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

static void
readers_process_utility(PlannedStmt *pstmt, const char *queryString,
						bool readOnlyTree, ProcessUtilityContext context,
						ParamListInfo params, QueryEnvironment *queryEnv,
						DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *stmt = pstmt->utilityStmt;
	UtilityKind kind = idem_store_running() ? UTILITY_QUIET : classify_utility(stmt);

	if (kind == UTILITY_READER)
		idem_pending_write_all(NULL, executor_depth == 0);

	if (prev_process_utility)
		prev_process_utility(pstmt, queryString, readOnlyTree, context,
							 params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);

	/*
	 * COMMIT and PREPARE TRANSACTION have now only marked the block as
	 * ending; the commit itself, and deferred triggers, run when the
	 * statement is over.  Writing held claims here is still inside the
	 * statement (statement_timeout and lock_timeout apply) and before the
	 * deferred triggers, and an error here ends the transaction block just
	 * as a failing deferred constraint does.
	 */
	if (kind == UTILITY_COMMIT)
		idem_pending_write_all(NULL, false);

	if (IsA(stmt, TransactionStmt))
	{
		TransactionStmtKind tkind = ((TransactionStmt *) stmt)->kind;

		if (tkind == TRANS_STMT_BEGIN || tkind == TRANS_STMT_START)
			explicit_block = true;
	}
}

static void
readers_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
			/* the list lived in TopTransactionContext */
			open_readers = NIL;
			explicit_block = false;
			break;
		default:
			break;
	}
}

/*
 * Install the hooks.  Called from _PG_init.
 */
void
idem_readers_init(void)
{
	prev_planner_hook = planner_hook;
	planner_hook = readers_planner;
	prev_executor_start = ExecutorStart_hook;
	ExecutorStart_hook = readers_executor_start;
	prev_executor_run = ExecutorRun_hook;
	ExecutorRun_hook = readers_executor_run;
	prev_executor_finish = ExecutorFinish_hook;
	ExecutorFinish_hook = readers_executor_finish;
	prev_executor_end = ExecutorEnd_hook;
	ExecutorEnd_hook = readers_executor_end;
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = readers_process_utility;
	RegisterXactCallback(readers_xact_callback, NULL);
}
