/*
 * citus.c
 *		What the extension needs to know about a Citus cluster: whether the
 *		records table is distributed, and which of its shards live on this
 *		node.
 *
 * Nothing here links against Citus or calls it while a claim runs: the
 * answers come from Citus's catalog tables, which exist only where Citus
 * is installed, so every function answers "not distributed" / "no shards"
 * on a plain server.  The hot path asks only idem_citus_is_distributed(),
 * once per (re)attach of the table (store.c caches the answer until the
 * table's relcache entry is invalidated, which distributing it does).
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/table.h"
#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "executor/spi.h"
#include "nodes/makefuncs.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/rel.h"

#include "compat.h"
#include "idempotency.h"

/* pg_dist_partition.logicalrelid, its first column */
#define DIST_PARTITION_LOGICALRELID	1

/*
 * Is table listed in Citus's pg_dist_partition (distributed, or a Citus
 * reference or local table)?  A coordinator and, with metadata synced
 * (Citus's default), every worker list it.
 */
bool
idem_citus_is_distributed(Oid table)
{
	Oid			catalog = get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE);
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData key;
	bool		listed;

	if (!OidIsValid(catalog))
		return false;

	rel = table_open(catalog, AccessShareLock);
	ScanKeyInit(&key, DIST_PARTITION_LOGICALRELID, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(table));
	scan = systable_beginscan(rel, InvalidOid, false, NULL, 1, &key);
	listed = HeapTupleIsValid(systable_getnext(scan));
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return listed;
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
		char	   *name = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
		MemoryContext old = MemoryContextSwitchTo(caller);

		shards = lappend(shards,
						 makeRangeVarFromNameList(idem_qualified_name_list(name)));
		MemoryContextSwitchTo(old);
	}
	return shards;
}
