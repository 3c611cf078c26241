/*
 * privilege_check.c
 *		A missing privilege, reported by the call that needs it.
 *
 * PostgreSQL's own error for a statement the role may not run ("permission
 * denied for table idempotency_records") names neither the call that ran
 * the statement nor the grant that is missing.  A call that works on the
 * table with rights other than its caller's (idem_sweep() done as the
 * owner) checks first what its caller must hold, and says which function
 * needed which privilege and the GRANT that gives it.
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "compat.h"
#include "privilege_check.h"

static const struct
{
	AclMode		mode;
	const char *name;
}			table_privileges[] =
{
	{ACL_SELECT, "SELECT"},
	{ACL_INSERT, "INSERT"},
	{ACL_UPDATE, "UPDATE"},
	{ACL_DELETE, "DELETE"},
};

/* Does role lack USAGE on table's schema, or a privilege of needed on table? */
bool
idem_table_privileges_missing(Oid table, Oid role, AclMode needed)
{
	if (idem_namespace_aclcheck(get_rel_namespace(table), role, ACL_USAGE) != ACLCHECK_OK)
		return true;
	for (size_t i = 0; i < lengthof(table_privileges); i++)
		if ((needed & table_privileges[i].mode) &&
			pg_class_aclcheck(table, role, table_privileges[i].mode) != ACLCHECK_OK)
			return true;
	return false;
}

/*
 * Raise 42501 unless role holds USAGE on table's schema and every privilege
 * of needed on table.  The error names function, the first privilege
 * missing, and the GRANT line that gives every privilege needed.
 */
void
idem_require_table_privileges(Oid table, Oid role, AclMode needed,
							  const char *function)
{
	Oid			nsp = get_rel_namespace(table);
	char	   *nspname = get_namespace_name(nsp);
	char	   *qualified = quote_qualified_identifier(nspname, get_rel_name(table));
	const char *rolename = quote_identifier(GetUserNameFromId(role, false));
	StringInfoData all;

	if (idem_namespace_aclcheck(nsp, role, ACL_USAGE) != ACLCHECK_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("%s needs the USAGE privilege on schema %s",
						function, quote_identifier(nspname)),
				 errhint("GRANT USAGE ON SCHEMA %s TO %s;",
						 quote_identifier(nspname), rolename)));

	initStringInfo(&all);
	for (size_t i = 0; i < lengthof(table_privileges); i++)
		if (needed & table_privileges[i].mode)
			appendStringInfo(&all, "%s%s", all.len > 0 ? ", " : "",
							 table_privileges[i].name);
	for (size_t i = 0; i < lengthof(table_privileges); i++)
		if ((needed & table_privileges[i].mode) &&
			pg_class_aclcheck(table, role, table_privileges[i].mode) != ACLCHECK_OK)
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("%s needs the %s privilege on table %s",
							function, table_privileges[i].name, qualified),
					 errhint("GRANT %s ON %s TO %s;", all.data, qualified, rolename)));
	pfree(all.data);
}
