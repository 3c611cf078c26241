/*
 * store_attach.c
 *		Where the records table is, and running the statement catalogue
 *		(statements.c) on it: attach, plans, and the one place a statement
 *		is run.
 *
 * Every read but the replay fast path (direct_read.c), and every write but
 * a held claim's (store_direct.c, whose privileges were checked when the
 * claim was made), is a prepared SPI statement on the schema-qualified
 * table, never a direct heap or index scan: the caller's privileges and
 * row-level security apply to it, and the same statements work when the
 * table is a distributed shell on a scale-out cluster (citus.c).  The two
 * shortcuts decide as the statements would (direct_read.c, held.c), after
 * the table is locked.  A call attaches first (idem_store_begin): the table
 * is found through the schema of the function called, locked, its shape
 * checked (table_shape.c), and what the call needs to know about it cached
 * until the table's relcache entry is next invalidated; the lock is taken
 * again at every call, before the cache is trusted.  Paths that run with
 * more rights than their caller attach as the table's owner, in a
 * security-restricted operation (idem_store_begin_as_owner).
 *
 * Plans on the table are prepared once per backend and kept; they are
 * forgotten when an attach finds another table (the extension was dropped
 * and created again) or another shape.  Plans on the shards of a
 * distributed table (kept by shard_route.c) are forgotten at every attach
 * after an invalidation, as the shards may have moved; plans on the shard a
 * sweep is directed to live in the SPI connection and go with it.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rls.h"
#include "utils/syscache.h"

#include "citus.h"
#include "compat.h"
#include "direct_read.h"
#include "idempotency.h"
#include "privilege_check.h"
#include "shard_route.h"
#include "statements.h"
#include "store_attach.h"
#include "table_shape.h"

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
static bool has_holder = false; /* holder (1.4) */
static bool table_distributed = false;	/* a Citus table (citus.c) */
static bool table_as_made = false;	/* as the extension made it */
static char *isolation_setting = NULL;	/* the extension's own tenant
										 * isolation: its setting */
static SPIPlanPtr plans[NUM_QUERIES];

/*
 * What one call (idem_store_begin .. idem_store_end) has set for the
 * statements it runs.  Cleared when the call ends, and when the
 * transaction aborts (idem_store_call_aborted, from hooks.c): a call that
 * ended in an error leaves nothing behind for the next one, such as plans
 * in the memory of an SPI connection that is gone.
 */
typedef struct StoreCall
{
	Oid			sweep_shard;	/* sweeps go to this shard of the table (the
								 * sweeper on a Citus node), or InvalidOid */
	SPIPlanPtr	shard_plans[NUM_QUERIES];	/* the sweep statements on it,
											 * in the SPI connection */
	Oid			function;		/* the SQL function of the call, named when
								 * a statement is refused a privilege */
} StoreCall;

static StoreCall call = {.sweep_shard = InvalidOid};

static void
clear_call(void)
{
	memset(&call, 0, sizeof(call));
	call.sweep_shard = InvalidOid;
}

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
 * Our statements are point lookups and index-ordered scans, planned with
 * sequential scans discouraged (the planner hook, hooks.c).
 *
 * idem_store_statement_starting is set from just before one of our
 * statements is run until its ExecutorStart (hooks.c), which takes it
 * (idem_store_take_statement_start): whatever is planned in between is
 * our statement, and whatever starts after it (a user's trigger on the
 * table) is not.
 */
bool		idem_store_statement_starting = false;

static bool relcache_callback_registered = false;

/*
 * Is the statement whose ExecutorStart is running one of ours?  Answers
 * once: what starts after it (a trigger of the user's) is not.
 */
bool
idem_store_take_statement_start(void)
{
	bool		ours = idem_store_statement_starting;

	idem_store_statement_starting = false;
	return ours;
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

/*
 * The schema of function fn_oid, through the small cache above.  A call
 * planned before ALTER EXTENSION idempotency UPDATE dropped and created its
 * function again (idem_claim in 1.4) can run after that commits: its
 * function is gone, and the extension's schema, where the function was
 * (the extension is not relocatable), is used instead.
 */
static Oid
function_schema(Oid fn_oid)
{
	FunctionSchema *slot;
	Oid			nsp;

	for (int i = 0; i < function_schemas_used; i++)
		if (function_schemas[i].fn_oid == fn_oid)
			return function_schemas[i].nsp;

	if (!syscache_callback_registered)
	{
		CacheRegisterSyscacheCallback(PROCOID, store_syscache_callback, (Datum) 0);
		syscache_callback_registered = true;
	}
	nsp = get_func_namespace(fn_oid);
	if (!OidIsValid(nsp))
		return idem_store_extension_schema();
	slot = function_schemas_used < FUNCTION_SCHEMA_SLOTS ?
		&function_schemas[function_schemas_used++] :
		&function_schemas[fn_oid % FUNCTION_SCHEMA_SLOTS];
	slot->fn_oid = fn_oid;
	slot->nsp = nsp;
	return slot->nsp;
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
	idem_shard_route_forget_plans();
}

/*
 * The schema the extension is installed in, or InvalidOid when it is not
 * installed (as this transaction's catalog snapshot sees it: a CREATE
 * EXTENSION still in progress elsewhere is not visible, so it counts as
 * absent).  get_extension_schema() is static in PostgreSQL 15.
 */
Oid
idem_store_extension_schema(void)
{
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData key;
	HeapTuple	tup;
	Oid			nsp = InvalidOid;

	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber,
				F_NAMEEQ, CStringGetDatum(IDEM_EXTENSION_NAME));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup))
		nsp = ((Form_pg_extension) GETSTRUCT(tup))->extnamespace;
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return nsp;
}

/*
 * The records table in schema nsp (InvalidOid: none), locked in mode
 * before anything about it is read, as PostgreSQL opens a
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
lock_records_table(Oid nsp, LOCKMODE mode)
{
	Oid			table = get_relname_relid("idempotency_records", nsp);

	if (mode == NoLock)
		return table;			/* the caller holds what it needs (a shard) */
	while (OidIsValid(table))
	{
		Oid			again;

		LockRelationOid(table, mode);
		again = get_relname_relid("idempotency_records", nsp);
		if (again == table)
			break;
		UnlockRelationOid(table, mode);
		table = again;
	}
	return table;
}

/* There is no records table in schema nsp: the error says why. */
static void
report_no_table(Oid nsp)
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

/*
 * The setting the extension's own tenant isolation of table reads, kept
 * for the backend (NULL: none; not looked for on a Citus table).
 */
static void
read_isolation_setting(Oid table)
{
	if (isolation_setting != NULL)
		pfree(isolation_setting);
	isolation_setting = NULL;
	if (!table_distributed)
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

		isolation_setting = idem_table_isolation_setting(table);
		MemoryContextSwitchTo(old);
	}
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
	bool		holder;
	bool		distributed;

	/*
	 * Lock first, then decide.  Taking the lock (the first time in this
	 * transaction) takes in every catalog change committed before it, as
	 * opening the table for a statement would: a policy, a REVOKE, a role's
	 * BYPASSRLS, all committed after BEGIN and before this call.  Only then
	 * is the cache trusted, by the tenant check, the held-claim and
	 * direct-read shortcuts and the statements alike.  A table dropped
	 * meanwhile has cleared table_verified, and is looked up again below.
	 *
	 * Not on a Citus table: no shortcut is taken and no tenant check made
	 * there (citus.c), so a lock decides nothing, and on a node a lock on the
	 * table's shell before the shard's inverts the order Citus's DDL takes
	 * them in (the shards, then the shell): a claim then deadlocked with an
	 * ALTER TABLE of idem_set_tenant_isolation() (90-citus u.).  A table
	 * distributed since it was cached is seen here as not yet distributed:
	 * the lock takes in the change.
	 */
	if (nsp == cached_schema && OidIsValid(cached_table))
	{
		if (!table_distributed)
		{
			LockRelationOid(cached_table, AccessShareLock);

			/*
			 * A lock this transaction already holds takes nothing in, but a
			 * user's next statement would plan on the catalog as it is now:
			 * an inheritance child created by another session since the
			 * last call, say, is read by a new SELECT on the table.  Take
			 * in what was committed since, so that the cached statements
			 * are planned again when it touches the table (a quick check of
			 * a flag when nothing was).
			 */
			AcceptInvalidationMessages();
		}
		if (table_verified)
			return;
	}

	if (!relcache_callback_registered)
	{
		CacheRegisterRelcacheCallback(store_relcache_callback, (Datum) 0);
		relcache_callback_registered = true;
	}

	table = lock_records_table(nsp, AccessShareLock);
	if (!OidIsValid(table))
		report_no_table(nsp);

	key_index = idem_check_table_shape(table, &checkpoints, &holder);
	distributed = idem_citus_manages_table(table);
	if (nsp != cached_schema || table != cached_table ||
		checkpoints != has_checkpoints || holder != has_holder ||
		distributed != table_distributed)
		store_forget_plans();
	else
		idem_shard_route_forget_plans();	/* the shards may have moved */
	has_checkpoints = checkpoints;
	has_holder = holder;
	table_distributed = distributed;
	table_as_made = idem_table_is_as_made(table);
	read_isolation_setting(table);
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
	idem_store_begin_attached(fcinfo);
}

/*
 * idem_store_begin for a call whose table idem_store_check_tenant has
 * attached (idem_claim, which connects only when it must run a statement
 * or write): connect to SPI only.  Attaching again would take the lock this
 * transaction holds once more and look again for invalidations; what that
 * could take in can commit while the lock is held, so decides nothing the
 * lock guards, and is taken in as if it had committed a moment later (the
 * next attach, or the next new lock).  It cost a replay 490 instructions.
 */
void
idem_store_begin_attached(FunctionCallInfo fcinfo)
{
	call.function = fcinfo->flinfo->fn_oid;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

/*
 * Attach the table in schema nsp, without a statement to run (held.c's
 * writes go through store_direct.c).
 */
void
idem_store_attach_schema(Oid nsp)
{
	store_attach(nsp);
}

/* The schema of the function being called: the extension's. */
Oid
idem_store_function_schema(FunctionCallInfo fcinfo)
{
	return function_schema(fcinfo->flinfo->fn_oid);
}

/*
 * Refuse a call for a tenant the session may not see, when the extension's
 * own tenant isolation applies to the caller: our own error, naming the
 * setting and how to set it, before anything is read, held or written
 * (the policy alone would answer a claim with a bare row-level security
 * violation, and a lookup with nothing).  Callers the policy does not
 * apply to (the table's owner, BYPASSRLS roles) are not checked; nor is
 * any other policy, which the statements meet as the user wrote it.  With
 * row_security off, a caller the policy applies to gets PostgreSQL's own
 * error, as each statement on the table would give it.  Decided after the
 * table is locked (store_attach), on the catalog in force.
 */
void
idem_store_check_tenant(FunctionCallInfo fcinfo, const text *tenant)
{
	const char *value;

	store_attach(function_schema(fcinfo->flinfo->fn_oid));
	if (isolation_setting == NULL ||
		check_enable_rls(cached_table, InvalidOid, true) != RLS_ENABLED)
		return;

	/*
	 * row_security off, for a role the policy applies to: every statement on
	 * the table raises PostgreSQL's own error (42501), so the call does too,
	 * before a shortcut could answer without a statement.
	 */
	if (!row_security)
		(void) check_enable_rls(cached_table, InvalidOid, false);
	if (idem_isolation_admits(isolation_setting, tenant))
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

/*
 * Start work on the table in schema nsp as the table's owner, inside a
 * security-restricted operation with a GUC nest level and search_path of
 * its own, as VACUUM, ANALYZE and REINDEX work on a table: for every path
 * that runs with more rights than its caller (the monitoring definers, the
 * sweeper worker, idem_sweep() called by another role).  Code the owner
 * planted on the table (an index expression, a trigger, a policy) then runs
 * as the owner, never with the caller's rights, and can neither change the
 * session's role nor leave a setting behind.
 *
 * The table is found and locked before anything about it is read, and
 * its owner read after the lock, so that an ALTER TABLE ... OWNER TO
 * committed meanwhile is taken in; everything else (the shape check, the
 * plans) happens as the owner.  mode is the strongest lock the work's
 * statements take (RowExclusiveLock for a sweep), taken first: a sweep
 * that waits behind a lock (CREATE INDEX's, or a LOCK ... IN EXCLUSIVE MODE
 * that idem_distribute() follows) then waits holding nothing on the table,
 * as its DELETE alone would, instead of holding an AccessShareLock that the
 * waiting DDL's next lock would deadlock with.
 */
void
idem_store_begin_as_owner(Oid nsp, LOCKMODE mode, IdemOwnerCall *oc)
{
	Oid			table = lock_records_table(nsp, mode);

	if (!OidIsValid(table))
		report_no_table(nsp);
	GetUserIdAndSecContext(&oc->save_userid, &oc->save_sec_context);
	SetUserIdAndSecContext(idem_table_owner(table),
						   oc->save_sec_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	oc->save_nestlevel = NewGUCNestLevel();
	oc->switched = true;
	idem_restrict_search_path();
	idem_store_begin_in_schema(nsp);
}

/*
 * A maintenance call (idem_sweep): the table's owner works on it as
 * itself; any other caller must hold the privileges named by needed
 * (what the call's statements use) and USAGE on the schema, checked after
 * the table is locked, and the work is then done as the owner
 * (idem_store_begin_as_owner), as VACUUM works for a role that may
 * maintain a table it does not own.  function names the call in the error.
 */
void
idem_store_begin_maintenance(FunctionCallInfo fcinfo, AclMode needed,
							 const char *function, IdemOwnerCall *oc)
{
	Oid			nsp = function_schema(fcinfo->flinfo->fn_oid);
	Oid			table = lock_records_table(nsp, RowExclusiveLock);
	Oid			caller = GetUserId();

	if (!OidIsValid(table))
		report_no_table(nsp);
	if (idem_table_owner(table) == caller)
	{
		oc->switched = false;
		idem_store_begin(fcinfo);
		return;
	}
	idem_require_table_privileges(table, caller, needed, function);
	idem_store_begin_as_owner(nsp, RowExclusiveLock, oc);
}

/*
 * A sweep removes every tenant's expired records, so it must see them all:
 * refuse, naming the fix, when row-level security applies to the role it
 * runs as (the table's owner, under FORCE ROW LEVEL SECURITY), instead of
 * sweeping only what a policy shows that role, which under tenant
 * isolation is nothing.  Not on a Citus table, whose shards are swept on
 * each node.
 */
void
idem_store_require_whole_table(void)
{
	const char *name;

	if (table_distributed ||
		check_enable_rls(cached_table, InvalidOid, true) != RLS_ENABLED)
		return;
	name = quote_qualified_identifier(get_namespace_name(cached_schema),
									  get_rel_name(cached_table));
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("cannot sweep table %s: row-level security applies to role \"%s\"",
					name, GetUserNameFromId(GetUserId(), false)),
			 errdetail("A sweep runs as the table's owner and must see every tenant's expired "
					   "records; FORCE ROW LEVEL SECURITY subjects the owner to the table's policies."),
			 errhint("ALTER TABLE %s NO FORCE ROW LEVEL SECURITY, or give the owner BYPASSRLS.",
					 name)));
}

/* End what idem_store_begin_as_owner() or _maintenance() started. */
void
idem_store_end_as_owner(IdemOwnerCall *oc)
{
	idem_store_end();
	if (!oc->switched)
		return;
	AtEOXact_GUC(false, oc->save_nestlevel);
	SetUserIdAndSecContext(oc->save_userid, oc->save_sec_context);
}

void
idem_store_end(void)
{
	clear_call();
	SPI_finish();
}

/*
 * The transaction is aborting: a call that was running ended in the error
 * (PostgreSQL closes its SPI connection), so what it had set goes too.
 */
void
idem_store_call_aborted(void)
{
	clear_call();
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
 * Is the table a Citus table (distributed, or a reference or Citus local
 * table: idem_citus_manages_table)?  Then its rows live in shards, on this
 * node or others, every statement on it goes through Citus (or to the
 * tenant's shard here, shard_route.c), and nothing may be held in this
 * backend's memory (held.c).
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
idem_store_direct_sweeps_to(Oid shard)
{
	call.sweep_shard = shard;
}

/* Has the table the recovery point columns (not with the 1.0 objects)? */
bool
idem_store_has_checkpoints(void)
{
	return has_checkpoints;
}

/* Has the table the holder column (not before 1.4)? */
bool
idem_store_has_holder(void)
{
	return has_holder;
}

/*
 * Prepare statement q on relation rel (the table, or one of its shards),
 * kept past idem_store_end() when keep is set.
 */
static SPIPlanPtr
prepare_statement(IdemQuery q, Oid rel, bool keep, int cursor_options)
{
	char	   *nspname = get_namespace_name(get_rel_namespace(rel));
	char	   *relname = get_rel_name(rel);
	char	   *qualified;
	char	   *text;
	SPIPlanPtr	plan;

	/* the table, or a shard whose placement is locked: it cannot have gone */
	if (nspname == NULL || relname == NULL)
		elog(ERROR, "cache lookup failed for relation %u", rel);
	qualified = quote_qualified_identifier(nspname, relname);
	text = idem_statement_text(q, qualified, has_checkpoints, has_holder);
	plan = SPI_prepare_cursor(text, idem_statements[q].nargs,
							  (Oid *) idem_statements[q].argtypes, cursor_options);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s",
			 text, SPI_result_code_string(SPI_result));
	if (keep && SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");
	pfree(text);
	return plan;
}


/* Statement q on the shard that sweeps are directed to. */
static SPIPlanPtr
sweep_shard_plan(IdemQuery q)
{
	Assert(q >= Q_SWEEP_ALL && q <= Q_SWEEP_FAIL_STALE);
	if (call.shard_plans[q] == NULL)
		call.shard_plans[q] = prepare_statement(q, call.sweep_shard, false, 0);
	return call.shard_plans[q];
}

/*
 * Statement q of one key on the key's shard of this node: plans kept per
 * shard (shard_route.c keeps them), reused as on a plain table.
 */
static SPIPlanPtr
routed_plan(IdemQuery q, Oid shard)
{
	SPIPlanPtr *slot = idem_shard_route_plan_slot(shard, q);

	if (*slot == NULL)
		*slot = prepare_statement(q, shard, true, 0);
	return *slot;
}


/*
 * A statement of claim_sweep.c, planned once and kept generic: the window's
 * LIMIT is a parameter, and the plan cache, which estimates an unknown
 * LIMIT at a tenth of the rows, found the generic plan costlier than a
 * custom plan of LIMIT 8 and planned every call again (145,000 instructions
 * a claim, test/bench/profile).  Both are point lookups whatever the
 * values: the primary key's range from (tenant, key), and rows by address.
 */
static bool
claim_sweep_statement(IdemQuery q)
{
	return q == Q_CLAIM_SWEEP_LOOK || q == Q_CLAIM_SWEEP_DELETE;
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
									 table_distributed ? CURSOR_OPT_CUSTOM_PLAN :
									 claim_sweep_statement(q) ? CURSOR_OPT_GENERIC_PLAN : 0);
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
	if (OidIsValid(call.sweep_shard))
		return sweep_shard_plan(q);
	if (table_distributed && IDEM_QUERY_OF_ONE_KEY(q))
	{
		Oid			shard = idem_shard_route(cached_table, values[0]);

		if (OidIsValid(shard))
			return routed_plan(q, shard);
	}
	return table_plan(q);
}

/* The table privileges statement q uses, as the executor checks them. */
static AclMode
statement_privileges(IdemQuery q)
{
	const char *text = idem_statements[q].text;
	AclMode		needed = ACL_SELECT;	/* every statement reads a column */

	if (strncmp(text, "INSERT", 6) == 0)
		needed = ACL_INSERT | (strstr(text, "RETURNING") ? ACL_SELECT : 0);
	else if (strncmp(text, "UPDATE", 6) == 0)
		needed |= ACL_UPDATE;
	else if (strncmp(text, "DELETE", 6) == 0)
		needed |= ACL_DELETE;
	if (strstr(text, " FOR UPDATE") || strstr(text, " FOR NO KEY UPDATE"))
		needed |= ACL_UPDATE;
	return needed;
}

/*
 * A statement of the call just failed.  If it was refused a privilege on
 * the table (or USAGE on its schema) that the caller indeed lacks, replace
 * PostgreSQL's "permission denied for table idempotency_records", which
 * names neither the function nor the grant, with an error that names
 * both (privilege_check.c); any other error is left as it is.  Runs only
 * on the error path, inside the PG_TRY every statement already has.
 */
static void
report_refused_privilege(IdemQuery q, MemoryContext caller_context)
{
	AclMode		needed;
	char	   *function;

	if (!OidIsValid(call.function) || geterrcode() != ERRCODE_INSUFFICIENT_PRIVILEGE)
		return;
	MemoryContextSwitchTo(caller_context);
	needed = statement_privileges(q);
	if (!idem_table_privileges_missing(cached_table, GetUserId(), needed))
		return;
	function = psprintf("%s()", get_func_name(call.function));
	FlushErrorState();
	idem_require_table_privileges(cached_table, GetUserId(), needed, function);
}

/*
 * Run a prepared statement.  Reads that must see rows committed since the
 * statement began (the claim's retry loop) pass read_only = false, which
 * gives them a fresh snapshot under READ COMMITTED.
 */
uint64
idem_store_run(IdemQuery q, Datum *values, const char *nulls, bool read_only,
			   long tcount)
{
	SPIPlanPtr	plan = store_plan(q, values);
	MemoryContext caller_context = CurrentMemoryContext;
	int			rc;

	idem_store_statement_starting = true;
	PG_TRY();
	{
		rc = SPI_execute_plan(plan, values, nulls, read_only, tcount);
	}
	PG_CATCH();
	{
		idem_store_statement_starting = false;
		report_refused_privilege(q, caller_context);
		PG_RE_THROW();
	}
	PG_END_TRY();
	idem_store_statement_starting = false;
	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	if (SPI_tuptable != NULL && idem_statements[q].ncolumns > 0)
		idem_check_result_shape(cached_table, SPI_tuptable->tupdesc,
								idem_statements[q].columns, idem_statements[q].ncolumns);
	return SPI_processed;
}
