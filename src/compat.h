/*
 * compat.h
 *		The differences between the PostgreSQL versions the extension
 *		supports (15, 17 and 18), in one place.
 */
#ifndef IDEM_COMPAT_H
#define IDEM_COMPAT_H

#include "access/tableam.h"
#include "catalog/pg_namespace.h"
#include "executor/executor.h"
#include "utils/acl.h"
#include "utils/guc.h"

/* PostgreSQL 16 moved the varlena macros out of postgres.h. */
#if PG_VERSION_NUM >= 160000
#include "varatt.h"
#endif

/* PostgreSQL 18 gave index_beginscan an instrumentation argument. */
#if PG_VERSION_NUM >= 180000
#define idem_index_beginscan(heap, index, snapshot, nkeys) \
	index_beginscan(heap, index, snapshot, NULL, nkeys, 0)
#else
#define idem_index_beginscan(heap, index, snapshot, nkeys) \
	index_beginscan(heap, index, snapshot, nkeys, 0)
#endif

/* PostgreSQL 16 replaced pg_namespace_aclcheck by object_aclcheck. */
#if PG_VERSION_NUM >= 160000
#define idem_namespace_aclcheck(nsp, role, mode) \
	object_aclcheck(NamespaceRelationId, nsp, role, mode)
#else
#define idem_namespace_aclcheck(nsp, role, mode) \
	pg_namespace_aclcheck(nsp, role, mode)
#endif

/* PostgreSQL 16 replaced pg_extension_ownercheck by object_ownercheck. */
#if PG_VERSION_NUM >= 160000
#define idem_extension_ownercheck(ext, role) \
	object_ownercheck(ExtensionRelationId, ext, role)
#else
#define idem_extension_ownercheck(ext, role) \
	pg_extension_ownercheck(ext, role)
#endif

/* PostgreSQL 16 gave stringToQualifiedNameList a soft-error context. */
#if PG_VERSION_NUM >= 160000
#define idem_qualified_name_list(name) stringToQualifiedNameList(name, NULL)
#else
#define idem_qualified_name_list(name) stringToQualifiedNameList(name)
#endif

/* PostgreSQL 17 gave LockHeldByMe an "or a stronger mode" argument. */
#if PG_VERSION_NUM >= 170000
#define idem_lock_held_by_me(tag, mode) LockHeldByMe(tag, mode, false)
#else
#define idem_lock_held_by_me(tag, mode) LockHeldByMe(tag, mode)
#endif

/*
 * PostgreSQL 16 told an UPDATE which indexes to insert into (TU_None,
 * TU_Summarizing, TU_All) instead of a bool, and gave
 * ExecInsertIndexTuples an "only summarizing indexes" argument.
 *
 * Its "update" argument is passed false for the new version of an updated
 * row too: it only decides whether btree is hinted that the key is
 * unchanged (bottom-up deletion), and asking that reads the updated
 * columns from the EState's range table, which a write without a
 * statement (store_direct.c) has none of.  The entries are the same.
 */
#if PG_VERSION_NUM >= 160000
typedef TU_UpdateIndexes IdemUpdateIndexes;
#define idem_update_needs_indexes(u) ((u) != TU_None)
#define idem_insert_index_tuples(rri, slot, estate) \
	ExecInsertIndexTuples(rri, slot, estate, false, false, NULL, NIL, false)
#define idem_insert_index_tuples_for_update(rri, slot, estate, u) \
	ExecInsertIndexTuples(rri, slot, estate, false, false, NULL, NIL, (u) == TU_Summarizing)
#else
typedef bool IdemUpdateIndexes;
#define idem_update_needs_indexes(u) (u)
#define idem_insert_index_tuples(rri, slot, estate) \
	ExecInsertIndexTuples(rri, slot, estate, false, false, NULL, NIL)
#define idem_insert_index_tuples_for_update(rri, slot, estate, u) \
	ExecInsertIndexTuples(rri, slot, estate, false, false, NULL, NIL)
#endif

/*
 * search_path "pg_catalog, pg_temp" until the GUC nest level ends, as
 * PostgreSQL's maintenance commands set it for a table's owner since 17
 * (RestrictSearchPath); done the same way before it.
 */
#if PG_VERSION_NUM >= 170000
#define idem_restrict_search_path() RestrictSearchPath()
#else
#define idem_restrict_search_path() \
	((void) set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, \
							  PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false))
#endif

#endif							/* IDEM_COMPAT_H */
