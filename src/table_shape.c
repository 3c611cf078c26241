/*
 * table_shape.c
 *		Refuse to work on an idempotency_records table whose shape changed.
 *
 * The C code reads the table's columns as the types it created them with.
 * A user who owns the table can alter it (change a column's type, drop or
 * rename it, drop the primary key), and reading a "char" as text would
 * crash the backend.  So the table's shape is checked whenever this backend
 * (re)attaches to it (store.c: after any invalidation of the table, which
 * every ALTER TABLE sends), and every result row our statements return is
 * checked against the types expected, in case the table changed between
 * the check and the statement.  A changed table gets one clear error, with
 * SQLSTATE 55000, and nothing is written.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/syscache.h"

#include "idempotency.h"

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
bool
idem_table_has_checkpoints(Oid table)
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
 * key index.
 */
Oid
idem_check_table_shape(Oid table)
{
	for (size_t i = 0; i < lengthof(expected_columns); i++)
		(void) check_column(table, &expected_columns[i], true);
	(void) idem_table_has_checkpoints(table);
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
