/*
 * shard_route.c
 *		The shard of this node that holds a tenant's records, for the
 *		extension's statements to run on it directly.
 *
 * On a table that Citus distributes, a statement on the table is planned
 * by Citus at every call, and on the node holding the tenant's shard it is
 * then deparsed, parsed and planned again for that shard: most of a
 * worker's time in a delegated call.  When the tenant's shard is on this
 * node, store_attach.c instead runs its statements on the shard itself,
 * with plans kept per shard (here), doing what Citus's own local execution does
 * around such a statement:
 *
 *	- it takes Citus's lock on the shard's placement metadata in share
 *	  mode, which a shard move or split takes in exclusive mode before it
 *	  changes where the shard is; once held, no write of this transaction
 *	  can be left behind on a placement that is moving away;
 *	- it then takes in any change of the placements committed meanwhile
 *	  and, when the shard is no longer here, gives up the shortcut;
 *	- it makes sure the transaction's local execution is required, as Citus
 *	  does when it executes on a local shard, so that Citus runs later
 *	  statements of the transaction on this node's shards here too, seeing
 *	  these rows; and that it was not switched off before (when Citus has
 *	  reached this node through a connection in this transaction, the rows
 *	  that connection wrote are not ours to see).
 *
 * The lock is an advisory lock whose tag Citus 13 and 14 build from the
 * table's colocation group and the shard's index in it (resource_lock.h,
 * SetLocktagForShardDistributionMetadata); it is built here the same way,
 * from the copy of Citus's layout in citus_compat.h.
 * Where Citus's library exports its functions for the transaction's
 * local execution status (Citus built for PostgreSQL 15), they are called.
 * From PostgreSQL 16 on PGXS builds a module with its symbols hidden but
 * for its SQL functions, so the status cannot be read or set: instead,
 * once per transaction, a statement that reads nothing from the tenant's
 * shard is run through Citus.  Citus executes it here, marking local
 * execution as required, exactly when local execution is allowed; and only
 * then does this backend take a lock on the shard relation.  Taking that
 * lock is the proof: a lock the backend held before proves nothing (a
 * query may have named the shard table itself), and without the proof the
 * shortcut is not taken.  The status then lasts until the transaction
 * ends, a rolled-back subtransaction included, so one proof serves every
 * shard of the transaction.
 *
 * The shortcut is taken only where all of this is known to hold: a Citus
 * major that citus_compat.h was read from (13 or 14, the versions the tests
 * run), the table hash-distributed by
 * tenant_id, local execution on (citus.enable_local_execution) and not
 * switched off for this transaction, and the hash of a probe value placing
 * it in the shard Citus names for it.  Anywhere else store_attach.c runs the
 * statement on the table, through Citus.
 *
 * The map of shards is read from Citus's catalogs and kept until Citus
 * changes them: any change of a shard or placement invalidates the
 * distributed table's relcache entry, which store_attach.c passes on here.
 * The plans of the statements run on each shard are kept here too, and
 * freed when store_attach.c attaches the table again.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/lockdefs.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/typcache.h"

#include "citus_compat.h"
#include "compat.h"
#include "idempotency.h"
#include "shard_route.h"
#include "statements.h"

typedef int (*LocalExecutionStatusFn) (void);
typedef void (*SetLocalExecutionStatusFn) (int status);

/* One shard of the table: its hash range, and its relation if on this node. */
typedef struct RoutedShard
{
	int32		min_hash;
	int32		max_hash;
	int64		shard_id;
	uint32		index;			/* in the table's shards, ordered by hash */
	Oid			relation;		/* InvalidOid: the shard is on another node */
} RoutedShard;

typedef struct ShardMap
{
	Oid			table;			/* the distributed table it was read for */
	bool		built;			/* false: read it again before use */
	bool		usable;			/* every condition of the shortcut holds */
	Oid			collation;		/* of tenant_id */
	uint32		colocation_id;
	bool		status_exported;	/* Citus's status functions were found */
	int			nshards;
	RoutedShard *shards;		/* ordered by min_hash */
} ShardMap;

static ShardMap map = {InvalidOid, false, false, InvalidOid, 0, false, 0, NULL};

/*
 * The plans of each shard of this node that a key's statements went to,
 * prepared by store_attach.c, kept until it attaches the table again.
 */
typedef struct RoutedPlans
{
	Oid			shard;
	SPIPlanPtr	plans[NUM_QUERIES];
} RoutedPlans;
static RoutedPlans *routed_plans = NULL;
static int	routed_plans_used = 0;
static int	routed_plans_size = 0;

static LocalExecutionStatusFn local_execution_status = NULL;
static SetLocalExecutionStatusFn set_local_execution_status = NULL;

/* A read of nothing proved local execution required in this transaction. */
static bool local_execution_proven = false;

#define SHARD_PROBE_VALUE "idempotency shard probe"

/*
 * What the shortcut needs to know about the table, in one row: Citus's
 * version, how the table is distributed and by which column, the shard
 * Citus places the probe value in, and the table's colocation group.
 */
#define TABLE_QUERY \
	"SELECT (SELECT e.extversion FROM pg_catalog.pg_extension e" \
	"         WHERE e.extname OPERATOR(pg_catalog.=) 'citus')," \
	" p.partmethod::text," \
	" pg_catalog.column_to_column_name(p.logicalrelid, p.partkey)," \
	" pg_catalog.get_shard_id_for_distribution_column(p.logicalrelid, '" \
	SHARD_PROBE_VALUE "'::text)," \
	" p.colocationid" \
	" FROM pg_catalog.pg_dist_partition p" \
	" WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1"

/* Every shard of the table, with its name where it is placed on this node. */
#define SHARDS_QUERY \
	"SELECT s.shardid, s.shardminvalue::int4, s.shardmaxvalue::int4," \
	" CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_dist_placement p" \
	"   WHERE p.shardid OPERATOR(pg_catalog.=) s.shardid" \
	"   AND p.groupid OPERATOR(pg_catalog.=)" \
	"       (SELECT groupid FROM pg_catalog.pg_dist_local_group))" \
	" THEN pg_catalog.shard_name(s.logicalrelid, s.shardid, false) END" \
	" FROM pg_catalog.pg_dist_shard s" \
	" WHERE s.logicalrelid OPERATOR(pg_catalog.=) $1" \
	" ORDER BY s.shardminvalue::int4"

/*
 * Citus's functions for the local execution status, looked up in its
 * library when the map is read; false where Citus does not export them.
 */
static bool
find_status_functions(void)
{
	if (local_execution_status == NULL || set_local_execution_status == NULL)
	{
		local_execution_status = (LocalExecutionStatusFn)
			load_external_function(CITUS_LIBRARY,
								   CITUS_GET_LOCAL_EXECUTION_STATUS_SYMBOL,
								   false, NULL);
		set_local_execution_status = (SetLocalExecutionStatusFn)
			load_external_function(CITUS_LIBRARY,
								   CITUS_SET_LOCAL_EXECUTION_STATUS_SYMBOL,
								   false, NULL);
	}
	return local_execution_status != NULL && set_local_execution_status != NULL;
}

static int32
tenant_hash(Datum tenant)
{
	TypeCacheEntry *type = lookup_type_cache(TEXTOID, TYPECACHE_HASH_PROC_FINFO);

	return DatumGetInt32(FunctionCall1Coll(&type->hash_proc_finfo, map.collation, tenant));
}

/* The shard whose hash range holds tenant, or NULL. */
static RoutedShard *
shard_of(Datum tenant)
{
	int32		hash = tenant_hash(tenant);
	int			lo = 0;
	int			hi = map.nshards - 1;

	while (lo <= hi)
	{
		int			mid = lo + (hi - lo) / 2;
		RoutedShard *s = &map.shards[mid];

		if (hash < s->min_hash)
			hi = mid - 1;
		else if (hash > s->max_hash)
			lo = mid + 1;
		else
			return s;
	}
	return NULL;
}

/* Read the table's row of TABLE_QUERY; false when the shortcut cannot apply. */
static bool
table_allows_routing(Oid table, int64 *probe_shard)
{
	Oid			argtypes[1] = {REGCLASSOID};
	Datum		values[1] = {ObjectIdGetDatum(table)};
	HeapTuple	row;
	TupleDesc	desc;
	char	   *version;
	char	   *method;
	char	   *column;
	bool		isnull;
	int			major;

	if (SPI_execute_with_args(TABLE_QUERY, 1, argtypes, values, NULL, true, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		return false;
	row = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	version = SPI_getvalue(row, desc, 1);
	method = SPI_getvalue(row, desc, 2);
	column = SPI_getvalue(row, desc, 3);
	*probe_shard = DatumGetInt64(SPI_getbinval(row, desc, 4, &isnull));
	if (version == NULL || method == NULL || column == NULL || isnull)
		return false;
	map.colocation_id = DatumGetUInt32(SPI_getbinval(row, desc, 5, &isnull));
	if (isnull)
		return false;
	major = atoi(version);
	return major >= CITUS_MAJOR_FIRST && major <= CITUS_MAJOR_LAST &&
		strcmp(method, "h") == 0 &&
		strcmp(column, "tenant_id") == 0;
}

static Oid
tenant_collation(Oid table)
{
	Oid			type;
	int32		typmod;
	Oid			collation;

	get_atttypetypmodcoll(table, get_attnum(table, "tenant_id"), &type, &typmod, &collation);
	return collation;
}

/* Fill map.shards from SHARDS_QUERY, in TopMemoryContext. */
static void
read_shards(Oid table)
{
	Oid			argtypes[1] = {REGCLASSOID};
	Datum		values[1] = {ObjectIdGetDatum(table)};

	if (SPI_execute_with_args(SHARDS_QUERY, 1, argtypes, values, NULL, true, 0) != SPI_OK_SELECT)
		return;
	map.shards = MemoryContextAllocZero(TopMemoryContext,
										sizeof(RoutedShard) * Max(SPI_processed, 1));
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		RoutedShard *s = &map.shards[i];
		char	   *name = SPI_getvalue(row, desc, 4);
		bool		isnull;

		s->index = (uint32) i;
		s->shard_id = DatumGetInt64(SPI_getbinval(row, desc, 1, &isnull));
		s->min_hash = DatumGetInt32(SPI_getbinval(row, desc, 2, &isnull));
		s->max_hash = DatumGetInt32(SPI_getbinval(row, desc, 3, &isnull));
		s->relation = name == NULL ? InvalidOid :
			RangeVarGetRelid(makeRangeVarFromNameList(idem_qualified_name_list(name)),
							 NoLock, true);
	}
	map.nshards = (int) SPI_processed;
}

/*
 * Read the map of table's shards again.  It is usable only if every
 * condition in the header comment holds, the probe value's hash included.
 */
static void
build_map(Oid table)
{
	int64		probe_shard = 0;
	RoutedShard *probe;

	if (map.shards != NULL)
		pfree(map.shards);
	map.shards = NULL;
	map.nshards = 0;
	map.table = table;
	map.built = true;
	map.usable = false;
	map.collation = tenant_collation(table);
	map.status_exported = find_status_functions();

	if (!table_allows_routing(table, &probe_shard))
		return;
	read_shards(table);
	probe = shard_of(CStringGetTextDatum(SHARD_PROBE_VALUE));
	map.usable = probe != NULL && probe->shard_id == probe_shard;
}

/*
 * Is Citus's local execution on, and (where Citus lets us read it) not
 * switched off for this transaction?
 */
static bool
local_execution_allowed(void)
{
	const char *setting = GetConfigOption("citus.enable_local_execution", true, false);

	if (setting == NULL || strcmp(setting, "on") != 0)
		return false;
	return !map.status_exported ||
		local_execution_status() != CITUS_LOCAL_EXECUTION_DISABLED;
}

/*
 * Take Citus's lock on the shard's placement metadata, with the tag Citus
 * gives it: by colocation group and shard index for a hash-distributed
 * table in a colocation group, else by shard.
 */
static void
lock_placement_metadata(RoutedShard *shard, LOCKMODE mode)
{
	LOCKTAG		tag;

	if (map.colocation_id != 0)
		CITUS_SET_LOCKTAG_COLOCATED_SHARDS_METADATA(tag, MyDatabaseId,
													map.colocation_id, shard->index);
	else
		CITUS_SET_LOCKTAG_SHARD_METADATA(tag, MyDatabaseId, shard->shard_id);
	(void) LockAcquire(&tag, mode, false, false);
}

static bool
shard_read_locked_by_me(Oid relation)
{
	LOCKTAG		tag;

	SET_LOCKTAG_RELATION(tag, MyDatabaseId, relation);
	return idem_lock_held_by_me(&tag, AccessShareLock);
}

/*
 * The transaction has ended: Citus has reset its local execution status
 * (hooks.c calls this at every end).
 */
void
idem_shard_route_xact_ended(void)
{
	local_execution_proven = false;
}

/*
 * Have Citus execute, through its own planner and executor, a statement
 * that reads nothing from tenant's shard, unless that proved local
 * execution required earlier in this transaction.  True when running it
 * made this backend lock the shard relation: Citus executed the statement
 * here (which marks local execution as required), not through a
 * connection to this node (which it does when local execution was switched
 * off for the transaction).  When the backend held that lock already, the
 * statement cannot show which way Citus went, and the answer is false.
 * The tenant is written into the statement as a literal, which lets Citus
 * plan the shard's statement directly instead of deparsing and parsing it.
 */
static bool
local_execution_required_through_citus(Oid table, RoutedShard *shard, Datum tenant)
{
	char	   *sql;
	char	   *nspname;
	char	   *relname;

	if (local_execution_proven)
		return true;
	if (shard_read_locked_by_me(shard->relation))
		return false;
	/* the caller has the table locked: it cannot have gone */
	nspname = get_namespace_name(get_rel_namespace(table));
	relname = get_rel_name(table);
	if (nspname == NULL || relname == NULL)
		elog(ERROR, "cache lookup failed for relation %u", table);
	sql = psprintf("SELECT FROM %s WHERE tenant_id OPERATOR(pg_catalog.=) %s AND false",
				   quote_qualified_identifier(nspname, relname),
				   quote_literal_cstr(TextDatumGetCString(tenant)));
	if (SPI_execute(sql, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute failed for \"%s\"", sql);
	pfree(sql);
	local_execution_proven = shard_read_locked_by_me(shard->relation);
	return local_execution_proven;
}

/*
 * Make sure Citus's local execution is required for the rest of this
 * transaction; false when it cannot be (it was switched off).
 */
static bool
require_local_execution(Oid table, RoutedShard *shard, Datum tenant)
{
	if (!map.status_exported)
		return local_execution_required_through_citus(table, shard, tenant);
	set_local_execution_status(CITUS_LOCAL_EXECUTION_REQUIRED);
	return true;
}

/*
 * The shard relation on this node that holds tenant's rows of table, ready
 * for a statement of this transaction: its placement locked as Citus locks
 * it for a write, and local execution required.  InvalidOid when
 * the rows are on another node or the shortcut does not apply; the caller
 * then runs the statement on the table.  The caller is connected to SPI.
 */
Oid
idem_shard_route(Oid table, Datum tenant)
{
	for (int attempt = 0; attempt < 2; attempt++)
	{
		RoutedShard *shard;

		if (!map.built || map.table != table)
			build_map(table);
		if (!map.usable || !local_execution_allowed())
			return InvalidOid;

		/*
		 * Take in placement changes first, so that the map and Citus's own
		 * cache (which its lock function reads) agree on the shards.
		 */
		AcceptInvalidationMessages();
		if (!map.built)
			build_map(table);
		if (!map.usable)
			return InvalidOid;
		shard = shard_of(tenant);
		if (shard == NULL || !OidIsValid(shard->relation))
			return InvalidOid;

		lock_placement_metadata(shard, ShareLock);
		/* a move that committed while we waited has invalidated the map */
		AcceptInvalidationMessages();
		if (map.built)
			return require_local_execution(table, shard, tenant) ?
				shard->relation : InvalidOid;
	}
	return InvalidOid;
}

/*
 * Forget the map when the distributed table's relcache entry is
 * invalidated (InvalidOid: every entry).  Called from store_attach.c's
 * relcache callback: it only marks the map, which is read again when next used.
 */
void
idem_shard_route_invalidate(Oid relid)
{
	if (relid == InvalidOid || relid == map.table)
		map.built = false;
}

/*
 * Where the plan of statement q on shard is kept: NULL until the caller
 * (store_attach.c) has prepared it and put it there.
 */
SPIPlanPtr *
idem_shard_route_plan_slot(Oid shard, int q)
{
	RoutedPlans *entry = NULL;

	for (int i = 0; i < routed_plans_used; i++)
		if (routed_plans[i].shard == shard)
			entry = &routed_plans[i];
	if (entry == NULL)
	{
		if (routed_plans_used == routed_plans_size)
		{
			int			size = Max(16, routed_plans_size * 2);

			if (routed_plans == NULL)
				routed_plans = MemoryContextAlloc(TopMemoryContext, sizeof(RoutedPlans) * size);
			else
				routed_plans = repalloc(routed_plans, sizeof(RoutedPlans) * size);
			memset(routed_plans + routed_plans_size, 0,
				   sizeof(RoutedPlans) * (size - routed_plans_size));
			routed_plans_size = size;
		}
		entry = &routed_plans[routed_plans_used++];
		entry->shard = shard;
	}
	return &entry->plans[q];
}

/*
 * Free every shard's plans.  Called when the table is attached again, not
 * from the invalidation callback: a callback must not free memory that a
 * running statement may be using.
 */
void
idem_shard_route_forget_plans(void)
{
	for (int s = 0; s < routed_plans_used; s++)
		for (int i = 0; i < NUM_QUERIES; i++)
			if (routed_plans[s].plans[i] != NULL)
				SPI_freeplan(routed_plans[s].plans[i]);
	if (routed_plans != NULL)
		memset(routed_plans, 0, sizeof(RoutedPlans) * routed_plans_size);
	routed_plans_used = 0;
}
