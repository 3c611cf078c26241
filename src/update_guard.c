/*
 * update_guard.c
 *		ALTER EXTENSION idempotency UPDATE never runs the table owner's code
 *		with the updater's rights.
 *
 * The update scripts run as the role that runs ALTER EXTENSION UPDATE, a
 * superuser (the extension has C functions), and the released scripts
 * 1.0--1.1 and 1.1--1.2 read and update idempotency_records.  When the
 * table belongs to an ordinary role, whatever that role attached to the
 * table (a trigger, a rule, a column default, a policy, an index or
 * statistics over an expression calling its own functions) would then run
 * with superuser rights: PostgreSQL evaluates them for whoever plans or
 * writes the table.  A released script never changes, so the update is
 * refused instead, before any script runs, naming what to remove.  A table
 * owned by the updater, or by another superuser, or carrying nothing but
 * what the extension makes, updates as before.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_statistic_ext.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/syscache.h"

#include "store_attach.h"
#include "table_shape.h"
#include "update_guard.h"

/* Has table extended statistics over an expression? */
static bool
has_expression_statistics(Oid table)
{
	Relation	rel = RelationIdGetRelation(table);
	List	   *stats;
	ListCell   *lc;
	bool		found = false;

	if (!RelationIsValid(rel))
		return false;
	stats = RelationGetStatExtList(rel);
	RelationClose(rel);
	foreach(lc, stats)
	{
		HeapTuple	tup = SearchSysCache1(STATEXTOID, ObjectIdGetDatum(lfirst_oid(lc)));

		if (!HeapTupleIsValid(tup))
			continue;
		found |= !heap_attisnull(tup, Anum_pg_statistic_ext_stxexprs, NULL);
		ReleaseSysCache(tup);
	}
	list_free(stats);
	return found;
}

/*
 * Called by the utility hook (hooks.c) before any ALTER EXTENSION ...
 * UPDATE: refuses the update of this extension while the records table
 * carries code an ordinary role controls.  Decided once the table is
 * locked, on the catalog in force.
 */
void
idem_guard_extension_update(AlterExtensionStmt *stmt)
{
	Oid			nsp;
	Oid			table;
	Oid			owner;

	if (strcmp(stmt->extname, "idempotency") != 0)
		return;
	nsp = idem_store_extension_schema();
	if (!OidIsValid(nsp))
		return;
	table = get_relname_relid("idempotency_records", nsp);
	if (!OidIsValid(table))
		return;
	LockRelationOid(table, AccessShareLock);
	if (get_relname_relid("idempotency_records", nsp) != table)
		return;					/* replaced meanwhile: the scripts will say */

	owner = idem_table_owner(table);
	if (owner == GetUserId() || superuser_arg(owner))
		return;
	if (idem_table_is_as_made(table) && !has_expression_statistics(table))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("cannot update extension \"idempotency\" while table %s carries code of its owner \"%s\"",
					quote_qualified_identifier(get_namespace_name(nsp), "idempotency_records"),
					GetUserNameFromId(owner, false)),
			 errdetail("The update scripts read and write the table with your rights, and the "
					   "table has triggers, rules, policies, column defaults, or indexes or "
					   "statistics over expressions, which would run with them."),
			 errhint("Have the owner drop what it added to the table, or review it and make "
					 "yourself the owner of the table and of every function it calls, then update.")));
}
