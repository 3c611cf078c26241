/*
 * table_shape.c
 *		Refuse to work on an idempotency_records table whose shape changed.
 *
 * The C code reads the table's columns as the types it created them with.
 * A user who owns the table can alter it (change a column's type, drop or
 * rename it, drop the primary key), and reading a "char" as text would
 * crash the backend.  So the table's shape is checked whenever this backend
 * (re)attaches to it (store_attach.c: after any invalidation of the table, which
 * every ALTER TABLE sends), and every result row our statements return is
 * checked against the types expected, in case the table changed between
 * the check and the statement.  A changed table gets one clear error, with
 * SQLSTATE 55000, and nothing is written.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/relation.h"
#include "access/table.h"
#include "catalog/pg_am.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_constraint.h"
#include "catalog/pg_index.h"
#include "catalog/pg_inherits.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_type.h"
#include "nodes/primnodes.h"
#include "rewrite/rowsecurity.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/fmgroids.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/syscache.h"

#include "idempotency.h"
#include "table_shape.h"

typedef struct ExpectedColumn
{
	const char *name;
	Oid			type;
} ExpectedColumn;

static const ExpectedColumn expected_columns[] = {
	{"token", INT8OID},
	{"expires_at", TIMESTAMPTZOID},
	{"lease_expires_at", TIMESTAMPTZOID},
	{"created_at", TIMESTAMPTZOID},
	{"updated_at", TIMESTAMPTZOID},
	{"ttl", INTERVALOID},
	{"tenant_id", TEXTOID},
	{"key", TEXTOID},
	{"status", TEXTOID},
	{"fingerprint", TEXTOID},
	{"response", JSONBOID},
};

static void
report_changed_table(Oid table, const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("table \"%s\" no longer has the shape the idempotency extension needs",
					get_rel_name(table)),
			 errdetail_internal("%s", detail),
			 errhint("Undo the change to the table, or drop and create the extension again.")));
}

/* Is indexoid a valid unique index on exactly (tenant_id, key)? */
static bool
is_key_index(Oid indexoid, AttrNumber tenant_att, AttrNumber key_att)
{
	HeapTuple	tup = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(indexoid));
	Form_pg_index index;
	bool		matches;

	if (!HeapTupleIsValid(tup))
		return false;
	index = (Form_pg_index) GETSTRUCT(tup);
	matches = index->indisunique && index->indisvalid && index->indnatts == 2 &&
		index->indnkeyatts == 2 &&
		index->indkey.values[0] == tenant_att && index->indkey.values[1] == key_att &&
		heap_attisnull(tup, Anum_pg_index_indpred, NULL) &&
		heap_attisnull(tup, Anum_pg_index_indexprs, NULL);
	ReleaseSysCache(tup);
	return matches;
}

static Oid
check_key_index(Oid table)
{
	AttrNumber	tenant_att = get_attnum(table, "tenant_id");
	AttrNumber	key_att = get_attnum(table, "key");
	Relation	rel = RelationIdGetRelation(table);
	List	   *indexes;
	ListCell   *lc;
	Oid			found = InvalidOid;

	if (!RelationIsValid(rel))
		elog(ERROR, "could not open relation with OID %u", table);
	indexes = RelationGetIndexList(rel);
	RelationClose(rel);
	foreach(lc, indexes)
		if (is_key_index(lfirst_oid(lc), tenant_att, key_att))
			found = lfirst_oid(lc);
	list_free(indexes);
	if (!OidIsValid(found))
		report_changed_table(table,
							 "It has no valid unique index on exactly (tenant_id, key).");
	return found;
}

/* The recovery point columns (1.1); both or neither. */
static const ExpectedColumn checkpoint_columns[] = {
	{"recovery_point", TEXTOID},
	{"state", JSONBOID},
};

/* The holder column (1.4), nullable, compared byte for byte (COLLATE "C"). */
static const ExpectedColumn holder_column = {"holder", TEXTOID};

/* Is column c present with its type?  Absent: false; other type: error. */
static bool
check_column(Oid table, const ExpectedColumn *c, bool required)
{
	AttrNumber	attnum = get_attnum(table, c->name);
	Oid			type;

	if (attnum == InvalidAttrNumber)
	{
		if (required)
			report_changed_table(table,
								 psprintf("Column \"%s\" is missing.", c->name));
		return false;
	}
	type = get_atttype(table, attnum);
	if (type != c->type)
		report_changed_table(table,
							 psprintf("Column \"%s\" has type %s instead of %s.",
									  c->name, format_type_be(type),
									  format_type_be(c->type)));
	return true;
}

/*
 * Has the table the recovery point columns?  Not while the 1.0 objects are
 * installed; one without the other is a changed table.
 */
static bool
table_has_checkpoints(Oid table)
{
	bool		point = check_column(table, &checkpoint_columns[0], false);
	bool		state = check_column(table, &checkpoint_columns[1], false);

	if (point != state)
		report_changed_table(table,
							 psprintf("Column \"%s\" is missing.",
									  checkpoint_columns[point ? 1 : 0].name));
	return point;
}

/*
 * Check the columns and the key index of the records table; returns the
 * key index, in *has_checkpoints whether the recovery point columns are
 * there, and in *has_holder whether the holder column is (absent until
 * ALTER EXTENSION idempotency UPDATE to 1.4).
 */
Oid
idem_check_table_shape(Oid table, bool *has_checkpoints, bool *has_holder)
{
	for (size_t i = 0; i < lengthof(expected_columns); i++)
		(void) check_column(table, &expected_columns[i], true);
	*has_checkpoints = table_has_checkpoints(table);
	*has_holder = check_column(table, &holder_column, false);
	return check_key_index(table);
}

/*
 * Check the column types of a result our statement returned (n expected
 * types), before any value is read from it.
 */
void
idem_check_result_shape(Oid table, TupleDesc desc, const Oid *types, int n)
{
	if (desc->natts != n)
		report_changed_table(table, "A statement on it returned an unexpected number of columns.");
	for (int i = 0; i < n; i++)
	{
		Oid			type = TupleDescAttr(desc, i)->atttypid;

		if (type != types[i])
			report_changed_table(table,
								 psprintf("A statement on it returned type %s where %s was expected.",
										  format_type_be(type), format_type_be(types[i])));
	}
}

/*
 * Has the table no constraint but its key (and, from PostgreSQL 18, its
 * NOT NULL constraints, which pg_constraint lists too)?
 */
static bool
only_key_constraint(Oid table)
{
	Relation	catalog = table_open(ConstraintRelationId, AccessShareLock);
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	bool		only_key = true;

	ScanKeyInit(&key, Anum_pg_constraint_conrelid, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(table));
	scan = systable_beginscan(catalog, ConstraintRelidTypidNameIndexId, true,
							  NULL, 1, &key);
	while (only_key && HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		char		type = ((Form_pg_constraint) GETSTRUCT(tup))->contype;

		only_key = type == CONSTRAINT_PRIMARY || type == 'n';
	}
	systable_endscan(scan);
	table_close(catalog, AccessShareLock);
	return only_key;
}

/* The collation each column was made with (text columns only). */
static Oid
collation_as_made(const char *column)
{
	if (strcmp(column, "tenant_id") == 0 || strcmp(column, "key") == 0 ||
		strcmp(column, holder_column.name) == 0)
		return C_COLLATION_OID;
	return DEFAULT_COLLATION_OID;
}

/* Is the column attr (not dropped) one the extension made, as it made it? */
static bool
column_is_as_made(Form_pg_attribute attr)
{
	const char *name = NameStr(attr->attname);
	bool		known = false;
	bool		not_null = true;

	for (size_t i = 0; i < lengthof(expected_columns) && !known; i++)
		if (strcmp(name, expected_columns[i].name) == 0)
		{
			known = attr->atttypid == expected_columns[i].type;
			not_null = strcmp(name, "lease_expires_at") != 0 &&
				strcmp(name, "fingerprint") != 0 &&
				strcmp(name, "response") != 0;
		}
	for (size_t i = 0; i < lengthof(checkpoint_columns) && !known; i++)
		if (strcmp(name, checkpoint_columns[i].name) == 0)
		{
			known = attr->atttypid == checkpoint_columns[i].type;
			not_null = false;
		}
	if (!known && strcmp(name, holder_column.name) == 0)
	{
		known = attr->atttypid == holder_column.type;
		not_null = false;
	}
	if (!known || attr->atthasdef || attr->attgenerated != '\0' ||
		attr->attidentity != '\0' || attr->attnotnull != not_null)
		return false;
	return !OidIsValid(attr->attcollation) ||
		attr->attcollation == collation_as_made(name);
}

/*
 * Is indexoid one the extension makes: the key index, or a plain btree
 * over columns with their default operator classes and collations (the
 * expires_at index, and those of idem_create_index)?  Such an index runs no
 * code but PostgreSQL's own, and only the key index can refuse a row.
 *
 * Whether the index has expressions or a predicate is read from its
 * pg_index row, never through RelationGetIndexExpressions() or
 * RelationGetIndexPredicate(): those run the expressions through
 * eval_const_expressions(), which calls any IMMUTABLE function in them, as
 * whoever asks (the worker before it has switched to the owner, a
 * superuser calling idem_sweep()).
 */
static bool
index_is_as_made(Oid indexoid, Oid key_index)
{
	Relation	index = index_open(indexoid, AccessShareLock);
	Form_pg_index form = index->rd_index;
	bool		plain = index->rd_rel->relam == BTREE_AM_OID &&
		(indexoid == key_index || !form->indisunique) &&
		!form->indisexclusion && form->indimmediate &&
		heap_attisnull(index->rd_indextuple, Anum_pg_index_indexprs, NULL) &&
		heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL);

	for (int i = 0; i < form->indnatts && plain; i++)
		plain = index->rd_opcintype[i] != InvalidOid &&
			index->rd_opfamily[i] < FirstNormalObjectId &&
			(!OidIsValid(index->rd_indcollation[i]) ||
			 index->rd_indcollation[i] < FirstNormalObjectId);
	index_close(index, AccessShareLock);
	return plain;
}

/*
 * Is expr "tenant_id = pg_catalog.current_setting(<name>, true)", compared
 * byte for byte (a deterministic collation)?  Returns the name, or NULL.
 */
static const char *
tenant_comparison_setting(Relation rel, Expr *expr)
{
	OpExpr	   *op = (OpExpr *) expr;
	Var		   *column;
	FuncExpr   *setting;
	Const	   *name;
	Const	   *missing_ok;

	if (expr == NULL || !IsA(expr, OpExpr) || op->opno != TextEqualOperator ||
		list_length(op->args) != 2 || !OidIsValid(op->inputcollid) ||
		!get_collation_isdeterministic(op->inputcollid))
		return NULL;
	column = linitial(op->args);
	setting = lsecond(op->args);
	if (!IsA(column, Var) || column->varlevelsup != 0 ||
		column->varattno != get_attnum(RelationGetRelid(rel), "tenant_id") ||
		!IsA(setting, FuncExpr) || setting->funcid != F_CURRENT_SETTING_TEXT_BOOL ||
		list_length(setting->args) != 2)
		return NULL;
	name = linitial(setting->args);
	missing_ok = lsecond(setting->args);
	if (!IsA(name, Const) || name->consttype != TEXTOID || name->constisnull ||
		!IsA(missing_ok, Const) || missing_ok->consttype != BOOLOID ||
		missing_ok->constisnull || !DatumGetBool(missing_ok->constvalue))
		return NULL;
	return TextDatumGetCString(name->constvalue);
}

/*
 * The custom setting that confines sessions to one tenant, when row-level
 * security on rel is exactly the extension's own tenant isolation
 * (idem_set_tenant_isolation on a single server): row-level security on
 * and not forced, and one policy, idem_tenant_isolation, permissive, for
 * every command and role, with no WITH CHECK of its own and the qual
 * "tenant_id = current_setting(<setting>, true)".  NULL for anything else
 * (no row-level security at all included).  Recognised by what the policy
 * is, not by its name alone: whatever else a user made is read through SQL.
 */
static const char *
own_isolation_setting(Relation rel)
{
	RowSecurityPolicy *policy;
	ArrayType  *roles;

	if (!rel->rd_rel->relrowsecurity || rel->rd_rel->relforcerowsecurity ||
		rel->rd_rsdesc == NULL || list_length(rel->rd_rsdesc->policies) != 1)
		return NULL;
	policy = linitial(rel->rd_rsdesc->policies);
	roles = policy->roles;
	if (strcmp(policy->policy_name, "idem_tenant_isolation") != 0 ||
		policy->polcmd != '*' || !policy->permissive || policy->hassublinks ||
		policy->with_check_qual != NULL || roles == NULL ||
		ARR_NDIM(roles) != 1 || ARR_DIMS(roles)[0] != 1 || ARR_HASNULL(roles) ||
		*(Oid *) ((char *) roles + ARR_OVERHEAD_NONULLS(1)) != ACL_ID_PUBLIC)
		return NULL;
	return tenant_comparison_setting(rel, policy->qual);
}

/*
 * The setting of the extension's own tenant isolation on table (see
 * own_isolation_setting), allocated in the caller's memory context, or
 * NULL.
 */
char *
idem_table_isolation_setting(Oid table)
{
	Relation	rel = relation_open(table, AccessShareLock);
	const char *setting = own_isolation_setting(rel);
	char	   *copy = setting ? pstrdup(setting) : NULL;

	relation_close(rel, AccessShareLock);
	return copy;
}

/*
 * Does the policy "tenant_id = current_setting(setting, true)" let the
 * current session see tenant's rows?  Evaluated as the policy evaluates
 * it: current_setting()'s own lookup (NULL when the setting does not
 * exist), compared byte for byte.
 */
bool
idem_isolation_admits(const char *setting, const text *tenant)
{
	const char *value = GetConfigOptionByName(setting, NULL, true);

	return value != NULL && strlen(value) == VARSIZE_ANY_EXHDR(tenant) &&
		memcmp(value, VARDATA_ANY(tenant), VARSIZE_ANY_EXHDR(tenant)) == 0;
}

/*
 * Is the table exactly as the extension made it: a plain heap table with
 * only its own columns (types, collations, NOT NULL, no defaults), only the
 * key constraint, indexes as index_is_as_made() says, and no triggers,
 * rules, children or parent, and no row-level security but the
 * extension's own tenant isolation?  Then an INSERT, UPDATE
 * or DELETE of a record runs no code but PostgreSQL's own and can fail only
 * on the key, so a claim may be held (held.c).  Anything else and
 * claims are written at once, where whatever was added takes effect.
 */
bool
idem_table_is_as_made(Oid table)
{
	Relation	rel = relation_open(table, AccessShareLock);
	Form_pg_class form = rel->rd_rel;
	TupleDesc	desc = RelationGetDescr(rel);
	Oid			key_index = InvalidOid;
	bool		as_made;
	List	   *indexes;
	ListCell   *lc;

	/*
	 * relhastriggers and relhassubclass may stay set after the last trigger
	 * or child is gone (until VACUUM): look at what there is.
	 */
	as_made = form->relkind == RELKIND_RELATION && form->relam == HEAP_TABLE_AM_OID &&
		rel->trigdesc == NULL && rel->rd_rules == NULL &&
		(!form->relrowsecurity || own_isolation_setting(rel) != NULL) &&
		!form->relforcerowsecurity && !form->relispartition &&
		(!form->relhassubclass || find_inheritance_children(table, NoLock) == NIL) &&
		(desc->constr == NULL || (desc->constr->num_check == 0 &&
								  desc->constr->num_defval == 0));
	for (int i = 0; i < desc->natts && as_made; i++)
	{
		Form_pg_attribute attr = TupleDescAttr(desc, i);

		if (!attr->attisdropped)
			as_made = column_is_as_made(attr);
	}
	if (as_made)
	{
		indexes = RelationGetIndexList(rel);
		key_index = rel->rd_pkindex;
		foreach(lc, indexes)
			if (as_made)
				as_made = index_is_as_made(lfirst_oid(lc), key_index);
		list_free(indexes);
	}
	relation_close(rel, AccessShareLock);
	return as_made && OidIsValid(key_index) && only_key_constraint(table);
}

/* The owner of table: who writes held claims, and as whom the sweeper works. */
Oid
idem_table_owner(Oid table)
{
	HeapTuple	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(table));
	Oid			owner;

	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for relation %u", table);
	owner = ((Form_pg_class) GETSTRUCT(tup))->relowner;
	ReleaseSysCache(tup);
	return owner;
}
