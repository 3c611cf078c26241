/*
 * citus.c
 *		What the extension needs to know about a Citus cluster: whether the
 *		records table is distributed, and which of its shards live on this
 *		node.
 *
 * Nothing here links against Citus or calls it while a claim runs: the
 * answers come from Citus's catalog tables, which exist only where Citus
 * is installed, so every function answers "not distributed" / "no shards"
 * on a plain server.  One call shape that crashes Citus is refused here
 * before Citus sees it.  The hot path asks only idem_citus_manages_table(),
 * once per (re)attach of the table (store_attach.c caches the answer until the
 * table's relcache entry is invalidated, which distributing it does).
 * Running a key's statements on its shard of this node is shard_route.c's
 * job, and that file does call Citus's own functions.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/table.h"
#include "catalog/namespace.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_language.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_proc.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/parsenodes.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "citus.h"
#include "citus_compat.h"
#include "compat.h"
#include "idempotency.h"

PG_FUNCTION_INFO_V1(idem_current_tenant);

/* Does Citus's catalog table catalog have a row whose column att is oid? */
static bool
citus_catalog_lists(const char *catalog_name, AttrNumber att, Oid oid)
{
	Oid			catalog = get_relname_relid(catalog_name, PG_CATALOG_NAMESPACE);
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData key;
	bool		listed;

	if (!OidIsValid(catalog))
		return false;

	rel = table_open(catalog, AccessShareLock);
	ScanKeyInit(&key, att, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(oid));
	scan = systable_beginscan(rel, InvalidOid, false, NULL, 1, &key);
	listed = HeapTupleIsValid(systable_getnext(scan));
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return listed;
}

/*
 * Is table a Citus table: listed in Citus's pg_dist_partition, whether
 * distributed, a reference table or a Citus local table?  Every statement
 * on any of them goes through Citus.  A coordinator and, with metadata
 * synced (Citus's default), every worker list it.
 */
bool
idem_citus_manages_table(Oid table)
{
	return citus_catalog_lists("pg_dist_partition", CITUS_DIST_PARTITION_LOGICALRELID, table);
}

/* this node's shards of a distributed table, by schema-qualified name */
#define LOCAL_SHARDS_QUERY \
	"SELECT pg_catalog.shard_name(s.logicalrelid, s.shardid, false)" \
	" FROM pg_catalog.pg_dist_shard s" \
	" JOIN pg_catalog.pg_dist_placement p ON p.shardid OPERATOR(pg_catalog.=) s.shardid" \
	" WHERE s.logicalrelid OPERATOR(pg_catalog.=) $1" \
	" AND p.groupid OPERATOR(pg_catalog.=) (SELECT groupid FROM pg_catalog.pg_dist_local_group)" \
	" ORDER BY s.shardid"

/*
 * Column col of row tup as text, where the query cannot give a NULL (an
 * internal error if it does): what names the value in that error.
 */
static char *
spi_text_not_null(HeapTuple tup, TupleDesc desc, int col, const char *what)
{
	char	   *value = SPI_getvalue(tup, desc, col);

	if (value == NULL)
		elog(ERROR, "%s is null", what);
	return value;
}

/*
 * The placements of distributed table that this node holds, as a List of
 * RangeVar allocated in the caller's memory context.  Empty on a node that
 * holds none (a coordinator without shards).  The caller is connected to
 * SPI.  A shard can move away or be dropped after this list is made; the
 * caller looks each one up again, under a lock, before touching it.
 */
List *
idem_citus_local_shards(Oid table)
{
	MemoryContext caller = CurrentMemoryContext;
	Oid			argtypes[1] = {REGCLASSOID};
	Datum		values[1] = {ObjectIdGetDatum(table)};
	List	   *shards = NIL;
	int			rc;

	rc = SPI_execute_with_args(LOCAL_SHARDS_QUERY, 1, argtypes, values, NULL,
							   true, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "could not list the local shards of idempotency_records: %s",
			 SPI_result_code_string(rc));

	for (uint64 i = 0; i < SPI_processed; i++)
	{
		char	   *name = spi_text_not_null(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1,
											 "the name of a local shard of idempotency_records");
		MemoryContext old = MemoryContextSwitchTo(caller);

		shards = lappend(shards,
						 makeRangeVarFromNameList(idem_qualified_name_list(name)));
		MemoryContextSwitchTo(old);
	}
	return shards;
}

/*
 * The C symbol of fn_oid when it is one of this extension's functions
 * (C language, $libdir/idempotency), or NULL.
 */
static char *
own_function_symbol(Oid fn_oid)
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


/* Is fn_oid one of this extension's functions, distributed by Citus? */
static bool
distributed_function_of_ours(Oid fn_oid)
{
	return own_function_symbol(fn_oid) != NULL &&
		citus_catalog_lists("pg_dist_object", CITUS_DIST_OBJECT_OBJID, fn_oid);
}

/*
 * Could PostgreSQL pull subquery q up into the query above it, leaving
 * that query without a WHERE clause (Citus delegates only a call without
 * one)?  The conditions of is_simple_subquery() that a SELECT can fail,
 * roughly: a subquery this answers true for and PostgreSQL keeps is
 * refused needlessly, never the other way round.
 */
static bool
may_be_pulled_up(Query *q)
{
	return q->commandType == CMD_SELECT && q->setOperations == NULL &&
		q->jointree != NULL && q->jointree->quals == NULL &&
		!q->hasAggs && !q->hasWindowFuncs && !q->hasTargetSRFs &&
		q->groupClause == NIL && q->groupingSets == NIL &&
		q->havingQual == NULL && q->sortClause == NIL &&
		q->distinctClause == NIL && q->limitOffset == NULL &&
		q->limitCount == NULL && !q->hasForUpdate && q->cteList == NIL;
}

/*
 * The first of our distributed functions called in the FROM clause of a
 * subquery in the FROM clause of q, or of a subquery nested in that one,
 * that would be pulled up; InvalidOid if none.
 */
static Oid
pulled_up_call(Query *q)
{
	ListCell   *lc;

	foreach(lc, q->rtable)
	{
		RangeTblEntry *rte = lfirst(lc);
		ListCell   *fc;
		Oid			found;

		if (rte->rtekind != RTE_SUBQUERY || rte->subquery == NULL ||
			!may_be_pulled_up(rte->subquery))
			continue;
		found = pulled_up_call(rte->subquery);
		if (OidIsValid(found))
			return found;
		foreach(fc, rte->subquery->rtable)
		{
			RangeTblEntry *inner = lfirst(fc);
			ListCell   *f;

			if (inner->rtekind != RTE_FUNCTION)
				continue;
			foreach(f, inner->functions)
			{
				Node	   *expr = ((RangeTblFunction *) lfirst(f))->funcexpr;

				if (IsA(expr, FuncExpr) &&
					distributed_function_of_ours(((FuncExpr *) expr)->funcid))
					return ((FuncExpr *) expr)->funcid;
			}
		}
	}
	return InvalidOid;
}

/*
 * Refuse, before Citus plans it, a call shape that Citus 13.2 cannot plan:
 * its function-call delegation crashes the backend (a null pointer in its
 * query deparser) on a SELECT whose FROM holds a subquery that calls a
 * distributed function in its own FROM and is pulled up, such as
 * SELECT outcome FROM (SELECT * FROM idem_claim(...)) s.  Called by the
 * planner hook (hooks.c) for every statement; costs a look at its range
 * table unless such a subquery is there.
 */
void
idem_citus_refuse_crashing_call(Query *parse)
{
	Oid			fn_oid;

	if (parse->commandType != CMD_SELECT || parse->jointree == NULL ||
		parse->jointree->quals != NULL)
		return;
	fn_oid = pulled_up_call(parse);
	if (OidIsValid(fn_oid))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("%s cannot be called in a subquery in FROM on a Citus cluster",
						get_func_name(fn_oid)),
				 errdetail("Citus cannot plan a distributed function called there."),
				 errhint("Call it directly, as in SELECT ... FROM %s(...), or in the select list of the subquery.",
						 get_func_name(fn_oid))));
}

/*
 * idem_current_tenant(setting text) RETURNS text
 *
 * The tenant that tenant isolation confines this session to: the value of
 * the custom setting named.  The policy of a distributed idempotency_records
 * (idem_apply_tenant_isolation) calls it instead of current_setting().  A
 * call runs on the node that holds the tenant's shard, in a session Citus
 * opened there; a plain SET or set_config() of the client's session never
 * reaches it, and current_setting() would answer NULL: the tenant's own
 * claim would end in a row-level security violation and its reads would
 * come back empty, which looks like data loss.  So an unset (or reset,
 * empty) setting is an error saying which ways of naming the tenant do
 * reach that node.  On a single server the policy keeps current_setting(),
 * where a session without a tenant simply sees nothing.
 */
Datum
idem_current_tenant(PG_FUNCTION_ARGS)
{
	char	   *setting = text_to_cstring(PG_GETARG_TEXT_PP(0));
	const char *value = GetConfigOption(setting, true, true);

	if (value == NULL || value[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("tenant isolation is on, but \"%s\" is not set in this session on this node",
						setting),
				 errdetail("On a Citus cluster a call runs on the node that holds the tenant's shard, "
						   "which sees neither a plain SET nor set_config() of the client's session."),
				 errhint("Name the tenant with SET LOCAL %s = '...' in the transaction block, "
						 "with citus.propagate_set_commands = 'local', or give each tenant's role "
						 "its tenant with ALTER ROLE ... SET %s.",
						 setting, setting)));
	PG_RETURN_TEXT_P(cstring_to_text(value));
}

/*
 * The shards of a distributed idempotency_records, dropped on the
 * coordinator before DROP EXTENSION idempotency.  Citus 13.2 removes the
 * table's metadata when the extension drops the table but leaves every
 * shard on the workers, records included; Citus 14 drops them itself, and
 * then finds none.  citus_drop_all_shards() is what Citus's own drop
 * trigger calls for a dropped distributed table.  It runs in the DROP's
 * transaction: if the DROP fails, the shards stay.  On a worker (where
 * Citus sends the DROP EXTENSION too) and without Citus, nothing is done.
 */
#define DROP_SHARDS_QUERY \
	"SELECT pg_catalog.citus_drop_all_shards(p.logicalrelid, n.nspname, c.relname)" \
	" FROM pg_catalog.pg_dist_partition p" \
	" JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) p.logicalrelid" \
	" JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace" \
	" JOIN pg_catalog.pg_extension e ON e.extnamespace OPERATOR(pg_catalog.=) n.oid" \
	" WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency'" \
	" AND c.relname OPERATOR(pg_catalog.=) 'idempotency_records'" \
	" AND (SELECT l.groupid FROM pg_catalog.pg_dist_local_group l) OPERATOR(pg_catalog.=) 0"

static void
drop_distributed_shards(void)
{
	bool		snapshot_pushed = false;
	int			rc;

	if (!OidIsValid(get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE)) ||
		!OidIsValid(get_relname_relid("pg_dist_local_group", PG_CATALOG_NAMESPACE)))
		return;
	if (!ActiveSnapshotSet())
	{
		PushActiveSnapshot(GetTransactionSnapshot());
		snapshot_pushed = true;
	}
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	rc = SPI_execute(DROP_SHARDS_QUERY, false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "could not drop the shards of idempotency_records: %s",
			 SPI_result_code_string(rc));
	SPI_finish();
	if (snapshot_pushed)
		PopActiveSnapshot();
}

/*
 * Called by the utility hook (hooks.c) before every DROP statement: a
 * DROP EXTENSION naming this extension drops the shards first.
 */
void
idem_citus_before_drop(DropStmt *drop)
{
	ListCell   *lc;

	if (drop->removeType != OBJECT_EXTENSION)
		return;
	foreach(lc, drop->objects)
	{
		Node	   *name = lfirst(lc);

		if (IsA(name, String) && strcmp(strVal(name), "idempotency") == 0)
		{
			Oid			ext = get_extension_oid("idempotency", true);

			/* only for a role the DROP will let through: another is refused
			 * by the DROP itself, before anything was touched */
			if (OidIsValid(ext) && idem_extension_ownercheck(ext, GetUserId()))
				drop_distributed_shards();
			return;
		}
	}
}

/*
 * The workers that do not answer now, as "host:port" strings (NIL when all
 * do).  A multi-shard statement fails as a whole while one of its nodes is
 * down (08006); a cluster sweep asks first.  Needs an SPI connection.
 */
List *
idem_citus_unreachable_workers(void)
{
	List	   *down = NIL;

	if (SPI_execute("SELECT r.nodename OPERATOR(pg_catalog.||) ':'"
					" OPERATOR(pg_catalog.||) r.nodeport::pg_catalog.text"
					" FROM pg_catalog.run_command_on_workers('SELECT 1') r"
					" WHERE NOT r.success", false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not ask the workers whether they answer");
	for (uint64 i = 0; i < SPI_processed; i++)
		down = lappend(down, spi_text_not_null(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1,
											   "the node of a worker"));
	return down;
}

/*
 * Run command (a query returning one count, "%s" standing for the shard)
 * on every placement of table, each in a transaction of its own on its
 * node, and return the sum of the counts of the placements that answered.
 * A node whose placements failed is reported as a WARNING, once for the
 * nodes in *warned (which it is added to): the rest of the cluster is
 * swept all the same.  Needs an SPI connection.
 */
uint64
idem_citus_count_on_placements(Oid table, const char *command, List **warned)
{
	Oid			argtypes[2] = {REGCLASSOID, TEXTOID};
	Datum		values[2] = {ObjectIdGetDatum(table), CStringGetTextDatum(command)};
	uint64		total = 0;

	if (SPI_execute_with_args("SELECT r.nodename OPERATOR(pg_catalog.||) ':'"
							  " OPERATOR(pg_catalog.||) r.nodeport::pg_catalog.text,"
							  " r.success, r.result"
							  " FROM pg_catalog.run_command_on_placements($1, $2) r",
							  2, argtypes, values, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not run a sweep statement on the placements");
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		char	   *node = spi_text_not_null(tup, desc, 1, "the node of a placement");
		char	   *result = SPI_getvalue(tup, desc, 3);
		bool		isnull;

		if (DatumGetBool(SPI_getbinval(tup, desc, 2, &isnull)))
		{
			if (result == NULL)
				elog(ERROR, "a placement on node %s answered no count", node);
			total += strtou64(result, NULL, 10);
		}
		else if (!list_member(*warned, makeString(node)))
		{
			*warned = lappend(*warned, makeString(node));
			ereport(WARNING,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("could not sweep the shards on node %s", node),
					 errdetail("%s", result ? result : "The node gave no answer."),
					 errhint("The node's own sweeper sweeps them once it is back; idem_sweep() can also be run again then.")));
		}
	}
	return total;
}
