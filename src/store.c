/*
 * store.c
 *		Every statement on idempotency_records: the record-access layer.
 *
 * Every write, and every read but the replay fast path (direct_read.c,
 * which this file calls), is a prepared SPI statement on the
 * schema-qualified table, never a direct heap or index scan: privileges and
 * row-level security stay in force, and the same statements work when the
 * table is a distributed shell on a scale-out cluster (citus.c).  Held
 * claims (held.c) and the entry points call this file; it calls only the
 * layers below it (test/layers/check.py).  Each hot-path statement targets one
 * (tenant_id, key); "now" is computed in C and passed as a parameter.
 *
 * Plans are prepared once per backend and kept.  A relcache callback on the
 * table forgets them when the extension is dropped and created again.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/guc.h"
#include "optimizer/cost.h"
#include "optimizer/planner.h"
#include "storage/lmgr.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rls.h"
#include "utils/syscache.h"

#include "idempotency.h"

typedef enum IdemQuery
{
	Q_READ,
	Q_INSERT,
	Q_WRITE_ONCE,
	Q_INSERT_MANY,
	Q_INSERT_MANY_PLAIN,
	Q_TAKE_OVER,
	Q_FAIL_STALE,
	Q_FINISH,
	Q_DELETE_CLAIM,
	Q_RELEASE_KEEP,
	Q_CHECKPOINT,
	Q_EXTEND_LEASE,
	Q_FORGET,
	Q_SWEEP_ALL,
	Q_SWEEP_TERMINAL,
	Q_SWEEP_GROUP_ALL,
	Q_SWEEP_GROUP_TERMINAL,
	Q_SWEEP_FAIL_STALE,
	Q_CLUSTER_SWEEP_STALE,
	Q_CLUSTER_SWEEP_TERMINAL,
	Q_CLUSTER_SWEEP_FAIL_STALE,
	NUM_QUERIES
} IdemQuery;

/*
 * Statement texts.  "%1$s" is the quoted, schema-qualified table name.
 * Operators are qualified so that nothing in search_path can capture them.
 */
#define EQ " OPERATOR(pg_catalog.=) "
#define BY_KEY " WHERE tenant_id" EQ "$1 AND key" EQ "$2 "

/*
 * now + ttl, where now is parameter n.  timestamptz + interval is STABLE
 * (it depends on TimeZone), and Citus refuses a STABLE function over a
 * column in an UPDATE of a distributed table.  Adding in UTC is IMMUTABLE
 * and gives the same instant for the intervals the functions store (whole
 * microseconds, no days or months).
 */
#define EXPIRY(n) EXPIRY_AFTER("$" #n)
#define EXPIRY_AFTER(t) \
	" pg_catalog.timezone('UTC', pg_catalog.timezone('UTC', " t ")" \
	" OPERATOR(pg_catalog.+) ttl) "

/*
 * Until when a record answers claims as it is (idem_record_live_until):
 * a claim's lease while it is processing, its expiry otherwise.  A
 * processing record with a recovery point expires only when its retention
 * after the lease ends, so that the next holder can resume it.
 */
/*
 * An expired row that is a stale claim: the sweeper releases it, or fails
 * it with stale_action = 'fail'.  An expired processing row with a
 * recovery point is past its retention, not a stale claim: it is deleted
 * like an expired completed or failed record, in either case.
 */
#define STALE_CLAIM " (status" EQ "'processing' AND @NO_POINT@) "

#define LIVE_UNTIL \
	" CASE WHEN status" EQ "'processing'" \
	" THEN COALESCE(lease_expires_at, expires_at) ELSE expires_at END "

/* a batch of fresh processing records: keys $2, tokens $3, fingerprints $7 */
#define INSERT_MANY \
	"INSERT INTO %1$s (tenant_id, key, token, expires_at, lease_expires_at," \
	" created_at, updated_at, ttl, status, fingerprint)" \
	" SELECT $1, u.key, u.token, $4, $4, $5, $5, $6, 'processing', u.fingerprint" \
	" FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.text[])," \
	" pg_catalog.unnest($3::pg_catalog.int8[]), pg_catalog.unnest($7::pg_catalog.text[]))" \
	" AS u(key, token, fingerprint)"

/*
 * One entry per statement: its text, its argument types and, for a
 * statement that returns rows, the column types of its result (table_shape.c
 * checks them before anything is read).  ARGS and RESULT count what they
 * are given, so a statement is added or changed in this one place.
 */
typedef struct IdemStatement
{
	const char *text;
	int			nargs;
	Oid			argtypes[13];
	int			ncolumns;
	Oid			columns[11];
} IdemStatement;

#define ARGS(...) \
	.argtypes = {__VA_ARGS__}, .nargs = lengthof(((Oid[]) {__VA_ARGS__}))
#define RESULT(...) \
	.columns = {__VA_ARGS__}, .ncolumns = lengthof(((Oid[]) {__VA_ARGS__}))
#define RECORD_COLUMNS TEXTOID, INT8OID, TEXTOID, JSONBOID, TIMESTAMPTZOID, \
	TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID, XIDOID, TEXTOID, JSONBOID
#define SWEPT_COLUMNS BOOLOID, TIMESTAMPTZOID

static const IdemStatement statements[NUM_QUERIES] = {
	[Q_READ] = {
		.text =
		"SELECT status, token, fingerprint, response, expires_at, lease_expires_at,"
		" created_at, updated_at, xmin, @POINT@, @STATE@ FROM %1$s" BY_KEY,
		ARGS(TEXTOID, TEXTOID),
		RESULT(RECORD_COLUMNS),
	},

	/* one row per fresh key; RETURNING says which went in */
	[Q_INSERT_MANY] = {
		.text = INSERT_MANY " ON CONFLICT (tenant_id, key) DO NOTHING RETURNING key",
		ARGS(TEXTOID, TEXTARRAYOID, INT8ARRAYOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
			INTERVALOID, TEXTARRAYOID),
		RESULT(TEXTOID),
	},

	/* the same without speculative insertion: any existing key is an error */
	[Q_INSERT_MANY_PLAIN] = {
		.text = INSERT_MANY " RETURNING key",
		ARGS(TEXTOID, TEXTARRAYOID, INT8ARRAYOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
			INTERVALOID, TEXTARRAYOID),
		RESULT(TEXTOID),
	},

	[Q_INSERT] = {
		.text =
		"INSERT INTO %1$s (tenant_id, key, token, expires_at, lease_expires_at,"
		" created_at, updated_at, ttl, status, fingerprint)"
		" VALUES ($1, $2, $3, $4, $4, $5, $5, $6, 'processing', $7)"
		" ON CONFLICT (tenant_id, key) DO NOTHING",
		ARGS(TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID, INTERVALOID,
			TEXTOID),
	},

	/*
	 * A held claim written in its final form (held.c).  No ON
	 * CONFLICT: the writer holds the key lock and read after taking it that
	 * the key is free, so only a record written around the lock can
	 * conflict, and held.c turns that error into its own.
	 */
	[Q_WRITE_ONCE] = {
		.text =
		"INSERT INTO %1$s (tenant_id, key, token, expires_at, lease_expires_at,"
		" created_at, updated_at, ttl, status, fingerprint, response @CHECKPOINT_COLUMNS@)"
		" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11 @CHECKPOINT_VALUES@)",
		ARGS(TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID,
			TIMESTAMPTZOID, TIMESTAMPTZOID, INTERVALOID, TEXTOID, TEXTOID, JSONBOID,
			TEXTOID, JSONBOID),
	},

	/* $8: a new lifetime (expired record reused) rather than a takeover */
	[Q_TAKE_OVER] = {
		.text =
		"UPDATE %1$s SET status = 'processing', token = $9,"
		" fingerprint = CASE WHEN $8 THEN $4 ELSE COALESCE($4, fingerprint) END,"
		" created_at = CASE WHEN $8 THEN $5 ELSE created_at END,"
		" response = NULL, lease_expires_at = $6, ttl = $7, updated_at = $5,"
		" expires_at = CASE WHEN NOT $8 AND @HAS_POINT@"
		" THEN pg_catalog.timezone('UTC', pg_catalog.timezone('UTC', $6) OPERATOR(pg_catalog.+) $7)"
		" ELSE $6 END"
		" @CHECKPOINT_RESET@"
		BY_KEY "AND token" EQ "$3 AND" LIVE_UNTIL "OPERATOR(pg_catalog.<=) $5"
		" RETURNING token",
		ARGS(TEXTOID, TEXTOID, INT8OID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
			INTERVALOID, BOOLOID, INT8OID),
		RESULT(INT8OID),
	},

	[Q_FAIL_STALE] = {
		.text =
		"UPDATE %1$s SET status = 'failed', response = $4, lease_expires_at = NULL,"
		" expires_at =" EXPIRY(5) ", updated_at = $5"
		BY_KEY "AND token" EQ "$3 AND status" EQ "'processing' AND @NO_POINT@"
		" AND" LIVE_UNTIL "OPERATOR(pg_catalog.<=) $5"
		" RETURNING status, token, fingerprint, response, expires_at, lease_expires_at,"
		" created_at, updated_at, xmin, @POINT@, @STATE@",
		ARGS(TEXTOID, TEXTOID, INT8OID, JSONBOID, TIMESTAMPTZOID),
		RESULT(RECORD_COLUMNS),
	},

	[Q_FINISH] = {
		.text =
		"UPDATE %1$s SET status = $4, response = $5, lease_expires_at = NULL,"
		" expires_at =" EXPIRY(6) ", updated_at = $6"
		BY_KEY "AND token" EQ "$3 AND status" EQ "'processing'",
		ARGS(TEXTOID, TEXTOID, INT8OID, TEXTOID, JSONBOID, TIMESTAMPTZOID),
	},

	/* a release without failure: a record with a recovery point is kept */
	[Q_DELETE_CLAIM] = {
		.text =
		"DELETE FROM %1$s" BY_KEY "AND token" EQ "$3 AND status" EQ "'processing'"
		" @NO_CHECKPOINT@",
		ARGS(TEXTOID, TEXTOID, INT8OID),
	},

	/*
	 * ... and is handed on instead: its lease ends now and it gets a new
	 * token (the releasing holder's is refused from now on), so the next
	 * claim takes it over and resumes from its recovery point, while its
	 * retention lasts.
	 */
	[Q_RELEASE_KEEP] = {
		.text =
		"UPDATE %1$s SET token = $4, lease_expires_at = $5, expires_at =" EXPIRY(5) ","
		" updated_at = $5"
		BY_KEY "AND token" EQ "$3 AND status" EQ "'processing'"
		" AND recovery_point IS NOT NULL",
		ARGS(TEXTOID, TEXTOID, INT8OID, INT8OID, TIMESTAMPTZOID),
	},

	/* $7: a new lease end, or NULL to keep the lease */
	[Q_CHECKPOINT] = {
		.text =
		"UPDATE %1$s SET recovery_point = $4, state = $5, updated_at = $6,"
		" lease_expires_at = COALESCE($7, lease_expires_at),"
		" expires_at =" EXPIRY_AFTER("COALESCE($7, lease_expires_at, expires_at)")
		BY_KEY "AND token" EQ "$3 AND status" EQ "'processing'",
		ARGS(TEXTOID, TEXTOID, INT8OID, TEXTOID, JSONBOID, TIMESTAMPTZOID,
			TIMESTAMPTZOID),
	},

	[Q_EXTEND_LEASE] = {
		.text =
		"UPDATE %1$s SET lease_expires_at = $4, updated_at = $5,"
		" expires_at = CASE WHEN @HAS_POINT@ THEN" EXPIRY(4) "ELSE $4 END"
		BY_KEY "AND token" EQ "$3 AND status" EQ "'processing'",
		ARGS(TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID),
	},

	[Q_FORGET] = {
		.text = "DELETE FROM %1$s" BY_KEY,
		ARGS(TEXTOID, TEXTOID),
	},

	/*
	 * Sweep batches lock their rows with SKIP LOCKED, so they never wait on
	 * a live claim, and re-check the expiry on the newest row version.
	 */
	[Q_SWEEP_ALL] = {
		.text =
		"DELETE FROM %1$s WHERE ctid" EQ "ANY (ARRAY("
		" SELECT ctid FROM %1$s WHERE expires_at OPERATOR(pg_catalog.<=) $1"
		" AND expires_at OPERATOR(pg_catalog.>=) $3"
		" ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED))"
		" RETURNING" STALE_CLAIM ", expires_at",
		ARGS(TIMESTAMPTZOID, INT4OID, TIMESTAMPTZOID),
		RESULT(SWEPT_COLUMNS),
	},

	[Q_SWEEP_TERMINAL] = {
		.text =
		"DELETE FROM %1$s WHERE ctid" EQ "ANY (ARRAY("
		" SELECT ctid FROM %1$s WHERE expires_at OPERATOR(pg_catalog.<=) $1"
		" AND expires_at OPERATOR(pg_catalog.>=) $3"
		" AND NOT" STALE_CLAIM
		" ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED))"
		" RETURNING false, expires_at",
		ARGS(TIMESTAMPTZOID, INT4OID, TIMESTAMPTZOID),
		RESULT(SWEPT_COLUMNS),
	},

	/* every expired row with one given expiry (see idem_store_sweep_group) */
	[Q_SWEEP_GROUP_ALL] = {
		.text =
		"DELETE FROM %1$s WHERE ctid" EQ "ANY (ARRAY("
		" SELECT ctid FROM %1$s WHERE expires_at" EQ "$1 FOR UPDATE SKIP LOCKED))"
		" RETURNING" STALE_CLAIM ", expires_at",
		ARGS(TIMESTAMPTZOID),
		RESULT(SWEPT_COLUMNS),
	},

	[Q_SWEEP_GROUP_TERMINAL] = {
		.text =
		"DELETE FROM %1$s WHERE ctid" EQ "ANY (ARRAY("
		" SELECT ctid FROM %1$s WHERE expires_at" EQ "$1"
		" AND NOT" STALE_CLAIM "FOR UPDATE SKIP LOCKED))"
		" RETURNING false, expires_at",
		ARGS(TIMESTAMPTZOID),
		RESULT(SWEPT_COLUMNS),
	},

	[Q_SWEEP_FAIL_STALE] = {
		.text =
		"UPDATE %1$s SET status = 'failed', response = $3, lease_expires_at = NULL,"
		" expires_at =" EXPIRY(1) ", updated_at = $1"
		" WHERE ctid" EQ "ANY (ARRAY("
		" SELECT ctid FROM %1$s WHERE expires_at OPERATOR(pg_catalog.<=) $1"
		" AND" STALE_CLAIM
		" ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED))",
		ARGS(TIMESTAMPTZOID, INT4OID, JSONBOID),
	},

	/*
	 * A sweep of a distributed table from one node: Citus runs these on
	 * every shard in parallel, and refuses ctid, LIMIT and FOR UPDATE in a
	 * multi-shard statement.  A row being settled is waited for, then
	 * checked again in its new version, as an UPDATE or DELETE does under
	 * READ COMMITTED.
	 */
	[Q_CLUSTER_SWEEP_STALE] = {
		.text =
		"DELETE FROM %1$s WHERE expires_at OPERATOR(pg_catalog.<=) $1"
		" AND" STALE_CLAIM,
		ARGS(TIMESTAMPTZOID),
	},

	[Q_CLUSTER_SWEEP_TERMINAL] = {
		.text =
		"DELETE FROM %1$s WHERE expires_at OPERATOR(pg_catalog.<=) $1"
		" AND NOT" STALE_CLAIM,
		ARGS(TIMESTAMPTZOID),
	},

	[Q_CLUSTER_SWEEP_FAIL_STALE] = {
		.text =
		"UPDATE %1$s SET status = 'failed', response = $2, lease_expires_at = NULL,"
		" expires_at =" EXPIRY(1) ", updated_at = $1"
		" WHERE expires_at OPERATOR(pg_catalog.<=) $1 AND" STALE_CLAIM,
		ARGS(TIMESTAMPTZOID, JSONBOID),
	},
};

/*
 * Backend-local cache: where the table is, and the plans that use it.
 * table_verified is cleared by any invalidation of the table (VACUUM and
 * ANALYZE send one too); the next call looks the table up again and keeps
 * the plans unless it is a different table (the extension was dropped and
 * created again).
 */
static Oid	cached_schema = InvalidOid;
static Oid	cached_table = InvalidOid;
static bool table_verified = false;
static bool has_checkpoints = false;	/* recovery_point and state (1.1) */
static bool table_distributed = false;	/* by Citus (citus.c) */
static bool table_as_made = false;	/* as the extension made it */
static char *isolation_setting = NULL;	/* the extension's own tenant
										 * isolation: its setting */
static SPIPlanPtr plans[NUM_QUERIES];

/*
 * The shard a sweep batch works on instead of the table (the sweeper on a
 * Citus node), or InvalidOid; and the sweep plans made for it, which live
 * in the SPI connection's memory and go with it at idem_store_end().
 */
static Oid	sweep_shard = InvalidOid;
static SPIPlanPtr shard_plans[NUM_QUERIES];

/*
 * The plans of each shard of this node that a key's statements went to
 * (shard_route.c), kept until the table's relcache entry is invalidated.
 */
typedef struct RoutedPlans
{
	Oid			shard;
	SPIPlanPtr	plans[NUM_QUERIES];
} RoutedPlans;
static RoutedPlans *routed_plans = NULL;
static int	routed_plans_used = 0;
static int	routed_plans_size = 0;
static bool relcache_callback_registered = false;

static Datum stale_failure_response = (Datum) 0;

/*
 * The schema of each of our functions called in this backend: a handful
 * of entries, cleared by any change to pg_proc.
 */
#define FUNCTION_SCHEMA_SLOTS 16
typedef struct FunctionSchema
{
	Oid			fn_oid;
	Oid			nsp;
} FunctionSchema;
static FunctionSchema function_schemas[FUNCTION_SCHEMA_SLOTS];
static int	function_schemas_used = 0;
static bool syscache_callback_registered = false;

/*
 * Our statements are point lookups and index-ordered scans.  A plan made
 * while the table is empty and analyzed (after a sweep emptied it) would
 * be a sequential scan, and the plan cache keeps it until the next
 * invalidation, however large the table grows.  So while one of our
 * statements is being planned, sequential scans are discouraged.
 *
 * idem_store_statement_starting is set from just before one of our
 * statements is run until its ExecutorStart (readers.c), which calls
 * idem_store_statement_started(): whatever is planned in between is our
 * statement, and whatever starts after it (a user's trigger on the table)
 * is not.  The command ID our writes are stamped with, when a held claim
 * is written (held.c), is applied there.
 */
static planner_hook_type prev_planner_hook = NULL;
bool		idem_store_statement_starting = false;
static CommandId stamp_cid = InvalidCommandId;

/* Is citus among shared_preload_libraries?  Read once, in _PG_init. */
static bool citus_preloaded = false;

static PlannedStmt *
plan_statement(Query *parse, const char *query_string, int cursorOptions,
			   ParamListInfo boundParams)
{
	if (prev_planner_hook)
		return prev_planner_hook(parse, query_string, cursorOptions, boundParams);
	return standard_planner(parse, query_string, cursorOptions, boundParams);
}

static PlannedStmt *
plan_own_statement(Query *parse, const char *query_string, int cursorOptions,
				   ParamListInfo boundParams)
{
	PlannedStmt *result;
	bool		save_enable_seqscan = enable_seqscan;

	enable_seqscan = false;
	PG_TRY();
	{
		result = plan_statement(parse, query_string, cursorOptions, boundParams);
	}
	PG_FINALLY();
	{
		enable_seqscan = save_enable_seqscan;
	}
	PG_END_TRY();
	return result;
}

static PlannedStmt *
store_planner(Query *parse, const char *query_string, int cursorOptions,
			  ParamListInfo boundParams)
{
	if (likely(!idem_store_statement_starting && !citus_preloaded))
		return plan_statement(parse, query_string, cursorOptions, boundParams);
	if (idem_store_statement_starting)
		return plan_own_statement(parse, query_string, cursorOptions, boundParams);
	idem_citus_refuse_crashing_call(parse);
	return plan_statement(parse, query_string, cursorOptions, boundParams);
}

/* One of our statements has started: stamp its writes if asked to. */
void
idem_store_statement_started(QueryDesc *queryDesc)
{
	if (stamp_cid != InvalidCommandId && queryDesc->estate != NULL)
		queryDesc->estate->es_output_cid = stamp_cid;
}

/*
 * Stamp the rows our next statements write with command ID cid, the one
 * they would have had had they run when a held claim was made or settled
 * (held.c); InvalidCommandId stops it.
 */
void
idem_store_stamp_writes(CommandId cid)
{
	stamp_cid = cid;
}

/*
 * Install the planner hook.  Called from _PG_init.
 */
void
idem_store_init(void)
{
	prev_planner_hook = planner_hook;
	planner_hook = store_planner;
	citus_preloaded = shared_preload_libraries_string != NULL &&
		strstr(shared_preload_libraries_string, "citus") != NULL;
}

/*
 * Plans are freed in store_attach, not here: an invalidation callback must
 * not free memory that a running statement may be using.
 */
static void
store_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == cached_table)
		table_verified = false;
	idem_shard_route_invalidate(relid);
}

static void
store_syscache_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	function_schemas_used = 0;
}

/* The schema of function fn_oid, through the small cache above. */
static Oid
function_schema(Oid fn_oid)
{
	FunctionSchema *slot;

	for (int i = 0; i < function_schemas_used; i++)
		if (function_schemas[i].fn_oid == fn_oid)
			return function_schemas[i].nsp;

	if (!syscache_callback_registered)
	{
		CacheRegisterSyscacheCallback(PROCOID, store_syscache_callback, (Datum) 0);
		syscache_callback_registered = true;
	}
	slot = function_schemas_used < FUNCTION_SCHEMA_SLOTS ?
		&function_schemas[function_schemas_used++] :
		&function_schemas[fn_oid % FUNCTION_SCHEMA_SLOTS];
	slot->fn_oid = fn_oid;
	slot->nsp = get_func_namespace(fn_oid);
	return slot->nsp;
}

static void
forget_routed_plans(void)
{
	for (int s = 0; s < routed_plans_used; s++)
		for (int i = 0; i < NUM_QUERIES; i++)
			if (routed_plans[s].plans[i] != NULL)
				SPI_freeplan(routed_plans[s].plans[i]);
	if (routed_plans != NULL)
		memset(routed_plans, 0, sizeof(RoutedPlans) * routed_plans_size);
	routed_plans_used = 0;
}

static void
store_forget_plans(void)
{
	for (int i = 0; i < NUM_QUERIES; i++)
	{
		if (plans[i] != NULL)
			SPI_freeplan(plans[i]);
		plans[i] = NULL;
	}
	forget_routed_plans();
}

/*
 * The records table in schema nsp (InvalidOid: none), locked in
 * AccessShareLock before anything about it is read, as PostgreSQL opens a
 * relation before reading its description.  An ALTER TABLE running on it
 * (idem_distribute() changes tenant_id's collation, which rebuilds the
 * indexes under new OIDs) has then ended, and what it changed is taken in:
 * read before the lock, the key index could be one the ALTER has dropped
 * meanwhile.  The name is looked up again after the lock, in case the
 * table was dropped or replaced while the lock was awaited.  (Not
 * RangeVarGetRelid, which does the same but also checks USAGE on the
 * schema, here, ahead of the checks that decide what a role without it
 * meets: held.c's and direct_read.c's, and the statements' own.)
 */
static Oid
lock_records_table(Oid nsp)
{
	Oid			table = get_relname_relid("idempotency_records", nsp);

	while (OidIsValid(table))
	{
		Oid			again;

		LockRelationOid(table, AccessShareLock);
		again = get_relname_relid("idempotency_records", nsp);
		if (again == table)
			break;
		UnlockRelationOid(table, AccessShareLock);
		table = again;
	}
	return table;
}

/*
 * Point the cache at the records table in schema nsp.
 */
static void
store_attach(Oid nsp)
{
	Oid			table;
	Oid			key_index;
	bool		checkpoints;
	bool		distributed;

	if (nsp == cached_schema && table_verified)
		return;

	if (!relcache_callback_registered)
	{
		CacheRegisterRelcacheCallback(store_relcache_callback, (Datum) 0);
		relcache_callback_registered = true;
	}

	table = lock_records_table(nsp);
	if (!OidIsValid(table))
	{
		char	   *nspname = get_namespace_name(nsp);

		/* the extension's schema was dropped since the function was found */
		if (nspname == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_SCHEMA),
					 errmsg("schema with OID %u does not exist", nsp)));
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table idempotency_records does not exist in schema \"%s\"",
						nspname),
				 errhint("Drop and create the idempotency extension again.")));
	}

	key_index = idem_check_table_shape(table, &checkpoints);
	distributed = idem_citus_is_distributed(table);
	if (nsp != cached_schema || table != cached_table ||
		checkpoints != has_checkpoints || distributed != table_distributed)
		store_forget_plans();
	else
		forget_routed_plans();	/* the shards may have moved */
	has_checkpoints = checkpoints;
	table_distributed = distributed;
	table_as_made = idem_table_is_as_made(table);
	if (isolation_setting != NULL)
		pfree(isolation_setting);
	isolation_setting = NULL;
	if (!table_distributed)
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

		isolation_setting = idem_table_isolation_setting(table);
		MemoryContextSwitchTo(old);
	}
	idem_direct_read_attach(table, key_index, table_distributed,
							isolation_setting);
	cached_schema = nsp;
	cached_table = table;
	table_verified = true;
}

/*
 * Start a call: find the table through the schema of the function being
 * called (the extension's schema) and connect to SPI.
 */
void
idem_store_begin(FunctionCallInfo fcinfo)
{
	store_attach(function_schema(fcinfo->flinfo->fn_oid));
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

/*
 * Refuse a call for a tenant the session may not see, when the extension's
 * own tenant isolation applies to the caller: our own error, naming the
 * setting and how to set it, before anything is read, held or written
 * (the policy alone would answer a claim with a bare row-level security
 * violation, and a lookup with nothing).  Callers the policy does not
 * apply to (the table's owner, BYPASSRLS roles) are not checked; nor is
 * any other policy, which the statements meet as the user wrote it.  With
 * row_security off the statements raise PostgreSQL's own error.
 */
void
idem_store_check_tenant(FunctionCallInfo fcinfo, const text *tenant)
{
	const char *value;

	store_attach(function_schema(fcinfo->flinfo->fn_oid));
	if (isolation_setting == NULL || !row_security ||
		check_enable_rls(cached_table, InvalidOid, true) != RLS_ENABLED ||
		idem_isolation_admits(isolation_setting, tenant))
		return;

	value = GetConfigOptionByName(isolation_setting, NULL, true);
	if (value == NULL || value[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("tenant isolation is on, but \"%s\" is not set", isolation_setting),
				 errdetail("Each session sees and writes only the records of the tenant that \"%s\" names.",
						   isolation_setting),
				 errhint("Name the tenant in the transaction before the call: SELECT set_config('%s', '%s', true).",
						 isolation_setting, text_to_cstring(tenant))));
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("tenant isolation confines this session to tenant \"%s\", not \"%s\"",
					value, text_to_cstring(tenant)),
			 errdetail("\"%s\" names the tenant whose records this session sees and writes.",
					   isolation_setting),
			 errhint("Set it to the call's tenant in the transaction: SELECT set_config('%s', '%s', true).",
					 isolation_setting, text_to_cstring(tenant))));
}

/*
 * Start work for a caller that is not a SQL function of ours (the sweeper
 * worker), given the extension's schema.
 */
void
idem_store_begin_in_schema(Oid nsp)
{
	store_attach(nsp);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

void
idem_store_end(void)
{
	sweep_shard = InvalidOid;
	memset(shard_plans, 0, sizeof(shard_plans));
	SPI_finish();
}

Oid
idem_store_table(void)
{
	return cached_table;
}

Oid
idem_store_schema(void)
{
	return cached_schema;
}

/*
 * The token high-water sequence (tokens.c), InvalidOid while the 1.0 SQL
 * objects are installed.  Looked up every time (a syscache probe), so that
 * ALTER EXTENSION idempotency UPDATE takes effect in running sessions.
 */
Oid
idem_store_token_sequence(void)
{
	return get_relname_relid("idempotency_tokens", cached_schema);
}

/*
 * Is the table exactly as the extension made it (table_shape.c)?  Only
 * then may a claim be held (held.c).  Kept with the shape check, and
 * looked at again after any invalidation of the table: a caller that has
 * just taken a new lock on it has seen every change committed before.
 */
bool
idem_store_table_as_made(void)
{
	if (!table_verified)
		store_attach(cached_schema);
	return table_as_made;
}

/*
 * Is the table distributed by Citus?  Then its rows live in shards on
 * other nodes, every statement on it is routed there, and nothing may be
 * held in this backend's memory (held.c).
 */
bool
idem_store_distributed(void)
{
	return table_distributed;
}

/*
 * Direct the sweep statements of this connection to one shard of the
 * distributed table (a relation on this node), until idem_store_end().
 */
void
idem_store_sweep_shard(Oid shard)
{
	sweep_shard = shard;
}

/* Has the table the recovery point columns (not with the 1.0 objects)? */
bool
idem_store_has_checkpoints(void)
{
	return has_checkpoints;
}

/*
 * The parts of a statement that name the recovery point columns, and what
 * stands in for them while the 1.0 objects are installed.
 */
static const char *const checkpoint_parts[][3] = {
	{"@POINT@", "recovery_point", "NULL::pg_catalog.text"},
	{"@STATE@", "state", "NULL::pg_catalog.jsonb"},
	{"@CHECKPOINT_COLUMNS@", ", recovery_point, state", ""},
	{"@CHECKPOINT_VALUES@", ", $12, $13", ""},
	{"@CHECKPOINT_RESET@",
		", recovery_point = CASE WHEN $8 THEN NULL ELSE recovery_point END,"
		" state = CASE WHEN $8 THEN NULL ELSE state END", ""},
	{"@NO_CHECKPOINT@", "AND recovery_point IS NULL", ""},
	{"@NO_POINT@", "recovery_point IS NULL", "true"},
	{"@HAS_POINT@", "recovery_point IS NOT NULL", "false"},
};

/* Every "from" in text replaced by "to", in a new string. */
static char *
replace_all(const char *text, const char *from, const char *to)
{
	StringInfoData out;
	const char *at;

	initStringInfo(&out);
	while ((at = strstr(text, from)) != NULL)
	{
		appendBinaryStringInfo(&out, text, at - text);
		appendStringInfoString(&out, to);
		text = at + strlen(from);
	}
	appendStringInfoString(&out, text);
	return out.data;
}

/* Replace every placeholder of checkpoint_parts in sql. */
static char *
expand_checkpoint_parts(const char *sql)
{
	char	   *text = pstrdup(sql);

	for (size_t i = 0; i < lengthof(checkpoint_parts); i++)
	{
		const char *const *part = checkpoint_parts[i];
		char	   *expanded = replace_all(text, part[0],
										   has_checkpoints ? part[1] : part[2]);

		pfree(text);
		text = expanded;
	}
	return text;
}

/*
 * Prepare statement q on relation rel (the table, or one of its shards),
 * kept past idem_store_end() when keep is set.
 */
static SPIPlanPtr
prepare_statement(IdemQuery q, Oid rel, bool keep, int cursor_options)
{
	StringInfoData sql;
	char	   *nspname = get_namespace_name(get_rel_namespace(rel));
	char	   *relname = get_rel_name(rel);
	char	   *qualified;
	char	   *text;
	SPIPlanPtr	plan;

	/* the table, or a shard whose placement is locked: it cannot have gone */
	if (nspname == NULL || relname == NULL)
		elog(ERROR, "cache lookup failed for relation %u", rel);
	qualified = quote_qualified_identifier(nspname, relname);
	initStringInfo(&sql);
	appendStringInfo(&sql, statements[q].text, qualified);
	text = expand_checkpoint_parts(sql.data);
	plan = SPI_prepare_cursor(text, statements[q].nargs, (Oid *) statements[q].argtypes,
							  cursor_options);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s",
			 text, SPI_result_code_string(SPI_result));
	if (keep && SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");
	pfree(text);
	pfree(sql.data);
	return plan;
}

/* Statement q on the shard that sweeps are directed to. */
static SPIPlanPtr
sweep_shard_plan(IdemQuery q)
{
	Assert(q >= Q_SWEEP_ALL && q <= Q_SWEEP_FAIL_STALE);
	if (shard_plans[q] == NULL)
		shard_plans[q] = prepare_statement(q, sweep_shard, false, 0);
	return shard_plans[q];
}

/*
 * Statement q of one key on the key's shard of this node (shard_route.c):
 * plans kept per shard, reused as on a plain table.
 */
static SPIPlanPtr
routed_plan(IdemQuery q, Oid shard)
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
	if (entry->plans[q] == NULL)
		entry->plans[q] = prepare_statement(q, shard, true, 0);
	return entry->plans[q];
}

/*
 * Our statements on a table that Citus distributes are planned afresh for
 * each call's values (custom plans), not reused.  A reused plan of a
 * statement that runs on a shard of this node makes Citus add one more copy
 * of that shard's plan to the reused plan at every execution, never finding
 * the copies it made before (Citus 13.2 and 14.0), so a node's backends grew
 * by tens of kilobytes a call without bound.  A custom plan is made and
 * freed per call.  (Where the key's shard is on this node and the shortcut
 * of shard_route.c applies, statements go to the shard instead.)
 */
static SPIPlanPtr
table_plan(IdemQuery q)
{
	if (plans[q] == NULL)
		plans[q] = prepare_statement(q, cached_table, true,
									 table_distributed ? CURSOR_OPT_CUSTOM_PLAN : 0);
	return plans[q];
}

/*
 * The plan that runs statement q: on the shard a sweep is directed to; for
 * a statement of one key (whose first parameter is the tenant) on a
 * distributed table, on the key's shard when it is on this node; else on
 * the table.
 */
static SPIPlanPtr
store_plan(IdemQuery q, Datum *values)
{
	if (OidIsValid(sweep_shard))
		return sweep_shard_plan(q);
	if (table_distributed && q < Q_SWEEP_ALL)
	{
		Oid			shard = idem_shard_route(cached_table, values[0]);

		if (OidIsValid(shard))
			return routed_plan(q, shard);
	}
	return table_plan(q);
}

/*
 * Run a prepared statement.  Reads that must see rows committed since the
 * statement began (the claim's retry loop) pass read_only = false, which
 * gives them a fresh snapshot under READ COMMITTED.
 */
static uint64
store_run(IdemQuery q, Datum *values, const char *nulls, bool read_only,
		  long tcount)
{
	SPIPlanPtr	plan = store_plan(q, values);
	int			rc;

	idem_store_statement_starting = true;
	PG_TRY();
	{
		rc = SPI_execute_plan(plan, values, nulls, read_only, tcount);
	}
	PG_FINALLY();
	{
		idem_store_statement_starting = false;
	}
	PG_END_TRY();
	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	if (SPI_tuptable != NULL && statements[q].ncolumns > 0)
		idem_check_result_shape(cached_table, SPI_tuptable->tupdesc,
								statements[q].columns, statements[q].ncolumns);
	return SPI_processed;
}

static Datum
interval_datum(int64 us)
{
	Interval   *span = palloc0(sizeof(Interval));

	span->time = us;
	return IntervalPGetDatum(span);
}

/*
 * A varlena from an SPI tuple that stays valid until idem_store_end():
 * inline values are used in place; a compressed or out-of-line value (a
 * big response) is expanded, so no TOAST pointer leaves this module.
 */
static Datum
varlena_in_place(Datum d)
{
	if (VARATT_IS_EXTENDED(DatumGetPointer(d)))
		return PointerGetDatum(PG_DETOAST_DATUM_PACKED(d));
	return d;
}

/*
 * Fill rec from row 0 of SPI_tuptable, laid out as Q_READ's select list.
 * The fingerprint and response point into SPI memory: valid until
 * idem_store_end(), so callers build their result before that.
 */
static void
record_from_tuple(IdemRecord *rec)
{
	HeapTuple	tup = SPI_tuptable->vals[0];
	TupleDesc	desc = SPI_tuptable->tupdesc;
	int			c = 1;
	bool		isnull;
	Datum		d;

	d = SPI_getbinval(tup, desc, c, &isnull);
	idem_check_not_null(isnull, "status");
	rec->status = idem_status_from_text((text *) DatumGetPointer(d));
	rec->token = DatumGetInt64(SPI_getbinval(tup, desc, c + 1, &isnull));
	idem_check_not_null(isnull, "token");

	d = SPI_getbinval(tup, desc, c + 2, &isnull);
	rec->fingerprint = isnull ? NULL : (text *) DatumGetPointer(varlena_in_place(d));

	d = SPI_getbinval(tup, desc, c + 3, &rec->response_isnull);
	rec->response = rec->response_isnull ? (Datum) 0 : varlena_in_place(d);

	rec->expires_at = DatumGetTimestampTz(SPI_getbinval(tup, desc, c + 4, &isnull));
	idem_check_not_null(isnull, "expires_at");
	rec->lease_expires_at = DatumGetTimestampTz(SPI_getbinval(tup, desc, c + 5,
															  &rec->lease_isnull));
	rec->created_at = DatumGetTimestampTz(SPI_getbinval(tup, desc, c + 6, &isnull));
	idem_check_not_null(isnull, "created_at");
	rec->updated_at = DatumGetTimestampTz(SPI_getbinval(tup, desc, c + 7, &isnull));
	idem_check_not_null(isnull, "updated_at");
	rec->xmin = DatumGetTransactionId(SPI_getbinval(tup, desc, c + 8, &isnull));

	d = SPI_getbinval(tup, desc, c + 9, &isnull);
	rec->recovery_point = isnull ? NULL : (text *) DatumGetPointer(varlena_in_place(d));
	d = SPI_getbinval(tup, desc, c + 10, &isnull);
	rec->state = isnull ? (Datum) 0 : varlena_in_place(d);
}

/* A copy of varlena p if it lies inside tup (else p: already a copy, or NULL). */
static void *
copy_out_of_tuple(HeapTuple tup, void *p)
{
	char	   *data = (char *) tup->t_data;

	if (p == NULL || (char *) p < data || (char *) p >= data + tup->t_len)
		return p;
	return memcpy(palloc(VARSIZE_ANY(p)), p, VARSIZE_ANY(p));
}

/*
 * Read the record of k.  Returns false when there is none.  fresh_snapshot
 * (for volatile callers) sees what was committed since the statement began.
 *
 * The tuple table is freed at once, its values copied out first: a claim
 * that waits reads again on every poll, and the tables would otherwise pile
 * up until idem_store_end() (about 8 kB a poll, 20 polls a second).
 */
bool
idem_store_read(const IdemKey *k, IdemRecord *rec, bool fresh_snapshot)
{
	Datum		values[2] = {PointerGetDatum(k->tenant_id), PointerGetDatum(k->key)};
	bool		found;

	if (idem_direct_read(k, rec, fresh_snapshot, &found))
		return found;
	found = store_run(Q_READ, values, "  ", !fresh_snapshot, 1) > 0;
	if (found)
	{
		HeapTuple	tup = SPI_tuptable->vals[0];

		record_from_tuple(rec);
		rec->fingerprint = copy_out_of_tuple(tup, rec->fingerprint);
		if (!rec->response_isnull)
			rec->response = PointerGetDatum(copy_out_of_tuple(tup,
															  DatumGetPointer(rec->response)));
		rec->recovery_point = copy_out_of_tuple(tup, rec->recovery_point);
		rec->state = PointerGetDatum(copy_out_of_tuple(tup,
													   DatumGetPointer(rec->state)));
	}
	SPI_freetuptable(SPI_tuptable);
	return found;
}

/*
 * Insert fresh processing records for a batch of keys (keys text[],
 * tokens bigint[], fingerprints text[] of the same length).  inserted(i) is
 * called with each key that went in; the others exist already.  Without
 * speculative insertion an existing key raises a unique violation instead
 * (claim_many.c makes it the lost-claim error, ID002).
 */
void
idem_store_insert_many(text *tenant_id, Datum keys, Datum tokens,
					   Datum fingerprints, TimestampTz now,
					   TimestampTz lease_expires_at, int64 ttl_us,
					   bool speculative,
					   void (*inserted) (void *arg, text *key), void *arg)
{
	Datum		values[7];
	uint64		n;

	values[0] = PointerGetDatum(tenant_id);
	values[1] = keys;
	values[2] = tokens;
	values[3] = TimestampTzGetDatum(lease_expires_at);
	values[4] = TimestampTzGetDatum(now);
	values[5] = interval_datum(ttl_us);
	values[6] = fingerprints;
	n = store_run(speculative ? Q_INSERT_MANY : Q_INSERT_MANY_PLAIN, values,
				  "       ", false, 0);

	for (uint64 i = 0; i < n; i++)
	{
		bool		isnull;
		Datum		key = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
										1, &isnull);

		inserted(arg, (text *) DatumGetPointer(key));
	}
}

/*
 * Insert a fresh processing record.  Returns false when the key exists (a
 * conflict never raises a unique violation into the caller's transaction).
 */
bool
idem_store_insert(const IdemKey *k, text *fingerprint, int64 token,
				  TimestampTz now, TimestampTz lease_expires_at, int64 ttl_us)
{
	Datum		values[7];
	char		nulls[8] = "       ";

	values[0] = PointerGetDatum(k->tenant_id);
	values[1] = PointerGetDatum(k->key);
	values[2] = Int64GetDatum(token);
	values[3] = TimestampTzGetDatum(lease_expires_at);
	values[4] = TimestampTzGetDatum(now);
	values[5] = interval_datum(ttl_us);
	values[6] = PointerGetDatum(fingerprint);
	nulls[6] = fingerprint ? ' ' : 'n';

	return store_run(Q_INSERT, values, nulls, false, 0) == 1;
}

/*
 * Write the record of a claim that was held rather than written
 * (held.c), as it stands: processing until lease_expires_at, or already
 * completed or failed and kept for ttl from now.  A plain INSERT: a record
 * that exists raises a unique violation, which the caller must catch.
 */
void
idem_store_write_once(const IdemKey *k, text *fingerprint, int64 token,
					  TimestampTz created_at, TimestampTz now,
					  TimestampTz lease_expires_at, int64 ttl_us,
					  IdemStatus status, Datum response, bool response_isnull,
					  text *recovery_point, Datum state)
{
	Datum		values[13];
	char		nulls[14] = "             ";
	bool		processing = status == IDEM_PROCESSING;

	values[0] = PointerGetDatum(k->tenant_id);
	values[1] = PointerGetDatum(k->key);
	values[2] = Int64GetDatum(token);
	values[3] = TimestampTzGetDatum(processing ? lease_expires_at :
									idem_add_duration(now, ttl_us, "ttl"));
	values[4] = TimestampTzGetDatum(lease_expires_at);
	nulls[4] = processing ? ' ' : 'n';
	values[5] = TimestampTzGetDatum(created_at);
	values[6] = TimestampTzGetDatum(now);
	values[7] = interval_datum(ttl_us);
	values[8] = CStringGetTextDatum(idem_status_name(status));
	values[9] = PointerGetDatum(fingerprint);
	nulls[9] = fingerprint ? ' ' : 'n';
	values[10] = response;
	nulls[10] = response_isnull ? 'n' : ' ';
	values[11] = PointerGetDatum(recovery_point);
	nulls[11] = recovery_point ? ' ' : 'n';
	values[12] = state;
	nulls[12] = state ? ' ' : 'n';

	(void) store_run(Q_WRITE_ONCE, values, nulls, false, 0);
}

/*
 * Give an expired record (stale claim, or retention over) to a new claim
 * with token new_token: processing, new lease.  Fails (returns false) if
 * the record changed since it was read.
 */
bool
idem_store_take_over(const IdemKey *k, int64 old_token, int64 new_token,
					 text *fingerprint, bool new_lifetime, TimestampTz now,
					 TimestampTz lease_expires_at, int64 ttl_us)
{
	Datum		values[9];
	char		nulls[10] = "         ";

	values[0] = PointerGetDatum(k->tenant_id);
	values[1] = PointerGetDatum(k->key);
	values[2] = Int64GetDatum(old_token);
	values[3] = PointerGetDatum(fingerprint);
	nulls[3] = fingerprint ? ' ' : 'n';
	values[4] = TimestampTzGetDatum(now);
	values[5] = TimestampTzGetDatum(lease_expires_at);
	values[6] = interval_datum(ttl_us);
	values[7] = BoolGetDatum(new_lifetime);
	values[8] = Int64GetDatum(new_token);

	return store_run(Q_TAKE_OVER, values, nulls, false, 0) == 1;
}

/*
 * Turn a stale claim into a failed record (idempotency.stale_action =
 * 'fail') and return the result in rec.
 */
bool
idem_store_fail_stale(const IdemKey *k, int64 old_token, TimestampTz now,
					  IdemRecord *rec)
{
	Datum		values[5];

	values[0] = PointerGetDatum(k->tenant_id);
	values[1] = PointerGetDatum(k->key);
	values[2] = Int64GetDatum(old_token);
	values[3] = idem_stale_failure_response();
	values[4] = TimestampTzGetDatum(now);

	if (store_run(Q_FAIL_STALE, values, "     ", false, 0) != 1)
		return false;
	record_from_tuple(rec);
	return true;
}

/*
 * Settle a claim as completed or failed, fenced by its token.
 */
bool
idem_store_finish(const IdemKey *k, int64 token, IdemStatus status,
				  Datum response, bool response_isnull, TimestampTz now)
{
	Datum		values[6];
	char		nulls[7] = "      ";

	Assert(status != IDEM_PROCESSING);
	values[0] = PointerGetDatum(k->tenant_id);
	values[1] = PointerGetDatum(k->key);
	values[2] = Int64GetDatum(token);
	values[3] = CStringGetTextDatum(idem_status_name(status));
	values[4] = response;
	nulls[4] = response_isnull ? 'n' : ' ';
	values[5] = TimestampTzGetDatum(now);

	return store_run(Q_FINISH, values, nulls, false, 0) == 1;
}

/*
 * Release a claim without a failure: delete its processing record, unless
 * it has a recovery point.  Returns false when token holds no processing
 * record without one.
 */
bool
idem_store_delete_claim(const IdemKey *k, int64 token)
{
	Datum		values[3];

	values[0] = PointerGetDatum(k->tenant_id);
	values[1] = PointerGetDatum(k->key);
	values[2] = Int64GetDatum(token);
	return store_run(Q_DELETE_CLAIM, values, "   ", false, 0) == 1;
}

/*
 * Release a claim with a recovery point: its lease ends now under
 * new_token, so that the next claim resumes from there.  Returns false when
 * token holds no such record.
 */
bool
idem_store_hand_on(const IdemKey *k, int64 token, int64 new_token,
				   TimestampTz now)
{
	Datum		values[5];

	if (!has_checkpoints)
		return false;
	values[0] = PointerGetDatum(k->tenant_id);
	values[1] = PointerGetDatum(k->key);
	values[2] = Int64GetDatum(token);
	values[3] = Int64GetDatum(new_token);
	values[4] = TimestampTzGetDatum(now);
	return store_run(Q_RELEASE_KEEP, values, "     ", false, 0) == 1;
}

/*
 * Store a recovery point (and state) on the processing record of token,
 * and, unless lease_end is 0, extend its lease to lease_end.  Its expiry
 * becomes the end of its retention after the lease (LIVE_UNTIL).
 */
bool
idem_store_checkpoint(const IdemKey *k, int64 token, text *point, Datum state,
					  TimestampTz now, TimestampTz lease_end)
{
	Datum		values[7];
	char		nulls[8] = "       ";

	values[0] = PointerGetDatum(k->tenant_id);
	values[1] = PointerGetDatum(k->key);
	values[2] = Int64GetDatum(token);
	values[3] = PointerGetDatum(point);
	values[4] = state;
	nulls[4] = state ? ' ' : 'n';
	values[5] = TimestampTzGetDatum(now);
	values[6] = TimestampTzGetDatum(lease_end);
	nulls[6] = lease_end == 0 ? 'n' : ' ';

	return store_run(Q_CHECKPOINT, values, nulls, false, 0) == 1;
}

bool
idem_store_extend_lease(const IdemKey *k, int64 token, TimestampTz now,
						TimestampTz lease_expires_at)
{
	Datum		values[5];

	values[0] = PointerGetDatum(k->tenant_id);
	values[1] = PointerGetDatum(k->key);
	values[2] = Int64GetDatum(token);
	values[3] = TimestampTzGetDatum(lease_expires_at);
	values[4] = TimestampTzGetDatum(now);

	return store_run(Q_EXTEND_LEASE, values, "     ", false, 0) == 1;
}

bool
idem_store_forget(const IdemKey *k)
{
	Datum		values[2] = {PointerGetDatum(k->tenant_id), PointerGetDatum(k->key)};

	return store_run(Q_FORGET, values, "  ", false, 0) == 1;
}

/*
 * Count the stale claims among the n rows a sweep statement returned
 * (status = 'processing', expires_at) and advance *from to the latest expiry.
 */
static void
count_swept(uint64 n, TimestampTz *from, uint64 *stale_released)
{
	*stale_released = 0;
	for (uint64 i = 0; i < n; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		TimestampTz expires_at;

		if (DatumGetBool(SPI_getbinval(tup, desc, 1, &isnull)))
			(*stale_released)++;
		expires_at = DatumGetTimestampTz(SPI_getbinval(tup, desc, 2, &isnull));
		if (expires_at > *from)
			*from = expires_at;
	}
}

/*
 * Delete one batch of expired records, those expiring at or after *from
 * (each batch starts where the previous one ended, so a pass never walks
 * the index entries of rows it already deleted).  With
 * include_stale_claims, expired claims go too (stale_action = release) and
 * are counted in *stale_released.  Returns the number of rows deleted and
 * advances *from.
 */
uint64
idem_store_sweep_expired(TimestampTz now, int batch_size,
						 bool include_stale_claims, TimestampTz *from,
						 uint64 *stale_released)
{
	Datum		values[3];
	uint64		n;

	values[0] = TimestampTzGetDatum(now);
	values[1] = Int32GetDatum(batch_size);
	values[2] = TimestampTzGetDatum(*from);
	n = store_run(include_stale_claims ? Q_SWEEP_ALL : Q_SWEEP_TERMINAL,
				  values, "   ", false, 0);
	count_swept(n, from, stale_released);
	return n;
}

/*
 * Delete every expired row whose expiry is exactly at (all the rows of one
 * group of equal expiries, without a LIMIT).  A pass that runs in a single
 * transaction uses it to get past such a group: its deleted index entries
 * cannot be marked dead before the transaction ends, so walking the group
 * again for every batch would be quadratic.
 */
uint64
idem_store_sweep_group(TimestampTz at, bool include_stale_claims,
					   uint64 *stale_released)
{
	Datum		values[1] = {TimestampTzGetDatum(at)};
	TimestampTz last = at;
	uint64		n;

	n = store_run(include_stale_claims ? Q_SWEEP_GROUP_ALL : Q_SWEEP_GROUP_TERMINAL,
				  values, " ", false, 0);
	count_swept(n, &last, stale_released);
	return n;
}

/*
 * Turn one batch of expired claims into failed records.
 */
uint64
idem_store_sweep_fail_stale(TimestampTz now, int batch_size)
{
	Datum		values[3];

	values[0] = TimestampTzGetDatum(now);
	values[1] = Int32GetDatum(batch_size);
	values[2] = idem_stale_failure_response();
	return store_run(Q_SWEEP_FAIL_STALE, values, "   ", false, 0);
}

/*
 * Statement q of a cluster sweep as one placement runs it: the shard
 * ("%s" for run_command_on_placements) in place of the table, the
 * parameters as literals (now in UTC, ISO: no setting of the node can read
 * it otherwise), counting the rows it swept.
 */
static char *
placement_command(IdemQuery q, TimestampTz now)
{
	StringInfoData sql;
	struct pg_tm tm;
	fsec_t		fsec;
	char		now_literal[64];
	char	   *text;

	if (timestamp2tm(now, NULL, &tm, &fsec, NULL, NULL) != 0)
		elog(ERROR, "timestamp out of range");
	snprintf(now_literal, sizeof(now_literal),
			 "'%04d-%02d-%02d %02d:%02d:%02d.%06d+00'::pg_catalog.timestamptz",
			 tm.tm_year, tm.tm_mon, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
			 (int) fsec);
	initStringInfo(&sql);
	appendStringInfo(&sql, statements[q].text, "%s");
	text = expand_checkpoint_parts(sql.data);
	text = replace_all(text, "$2",
					   psprintf("%s::pg_catalog.jsonb",
								quote_literal_cstr(DatumGetCString(DirectFunctionCall1(jsonb_out,
																					   idem_stale_failure_response())))));
	text = replace_all(text, "$1", now_literal);
	return psprintf("WITH swept AS (%s RETURNING 1) SELECT pg_catalog.count(*) FROM swept", text);
}

/*
 * A cluster sweep while a worker is down: each statement on every
 * placement in a transaction of its own (not the caller's), the
 * placements of the unreachable nodes reported, not swept.
 */
static uint64
sweep_placements(TimestampTz now, bool fail_stale, uint64 *stale_released,
				 uint64 *stale_failed)
{
	List	   *warned = NIL;	/* the nodes reported so far */

	if (fail_stale)
		*stale_failed = idem_citus_count_on_placements(cached_table,
													   placement_command(Q_CLUSTER_SWEEP_FAIL_STALE, now),
													   &warned);
	else
		*stale_released = idem_citus_count_on_placements(cached_table,
														 placement_command(Q_CLUSTER_SWEEP_STALE, now),
														 &warned);
	return idem_citus_count_on_placements(cached_table,
										  placement_command(Q_CLUSTER_SWEEP_TERMINAL, now),
										  &warned);
}

/*
 * Sweep a distributed table on every shard at once: expired claims are
 * deleted (*stale_released) or, with fail_stale, turned into failed
 * records (*stale_failed); then expired completed and failed records are
 * deleted.  Returns that last number.  One statement each, in the caller's
 * transaction; while a worker does not answer (Citus would fail such a
 * statement as a whole), shard by shard instead, the unreachable ones
 * reported.
 */
uint64
idem_store_sweep_cluster(TimestampTz now, bool fail_stale,
						 uint64 *stale_released, uint64 *stale_failed)
{
	Datum		values[2];

	*stale_released = 0;
	*stale_failed = 0;
	if (idem_citus_unreachable_workers() != NIL)
		return sweep_placements(now, fail_stale, stale_released, stale_failed);
	values[0] = TimestampTzGetDatum(now);
	values[1] = idem_stale_failure_response();
	if (fail_stale)
		*stale_failed = store_run(Q_CLUSTER_SWEEP_FAIL_STALE, values, "  ", false, 0);
	else
		*stale_released = store_run(Q_CLUSTER_SWEEP_STALE, values, " ", false, 0);
	return store_run(Q_CLUSTER_SWEEP_TERMINAL, values, " ", false, 0);
}

/*
 * The failure stored for a claim whose lease ran out under
 * stale_action = 'fail'.  Built once per backend.
 */
Datum
idem_stale_failure_response(void)
{
	if (stale_failure_response == (Datum) 0)
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

		stale_failure_response =
			DirectFunctionCall1(jsonb_in,
								CStringGetDatum("{\"error\": \"lease_expired\"}"));
		MemoryContextSwitchTo(old);
	}
	return stale_failure_response;
}
