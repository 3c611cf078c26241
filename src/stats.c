/*
 * stats.c
 *		Live counters and the last sweep of each database, in shared memory.
 *
 * Only when the library is preloaded: shared memory can be reserved only
 * at server start.  Without it counting is a no-op and idem_stats raises a
 * clear error.  Counters are atomics, so they are exact under concurrency
 * and cost one uncontended atomic add per event; a slot per database is
 * found once per backend and cached.  Counters count calls as they return,
 * whether or not the caller's transaction later commits.  A reader sees
 * only its own database's row unless it has the privileges of
 * pg_read_all_stats, as with pg_stat_activity: database names and activity
 * of other databases are not everyone's business.
 *
 * Conflicts by tenant (idem_metrics_tenants, metrics.c): a fixed table of
 * IDEM_TENANT_SLOTS entries shared by the server's databases, kept by the
 * Space-Saving rule (Metwally, Agrawal, El Abbadi, 2005): a tenant not in
 * a full table takes the place of the entry of least weight and inherits
 * that weight plus one, so that every tenant with more than 1/128 of the
 * conflicts counted since the start or reset is sure to be in the table.
 * conflicts_total is exact since the tenant entered the table (its weight,
 * which may include its predecessor's, only orders and evicts).  A
 * conflict answer takes the table's lock shared and adds to two atomics;
 * only a tenant not yet in the table takes it exclusive.  A claimed or
 * replayed answer never reaches this table.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_authid.h"
#include "commands/dbcommands.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/acl.h"
#include "common/hashfn.h"
#include "utils/builtins.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "guc.h"
#include "idempotency.h"
#include "stats.h"

PG_FUNCTION_INFO_V1(idem_stats_read);
PG_FUNCTION_INFO_V1(idem_stats_reset);

/* Databases tracked at once; a database past this limit is not counted. */
#define IDEM_STATS_MAX_DATABASES	128
#define IDEM_STATS_ERROR_LEN		256

typedef struct IdemDatabaseStats
{
	Oid			dboid;			/* InvalidOid: free slot */
	pg_atomic_uint64 counters[IDEM_NUM_COUNTERS];
	TimestampTz stats_reset;
	/* the last sweep, written under the lock */
	TimestampTz last_sweep_at;
	double		last_sweep_ms;
	uint64		last_sweep_removed;
	uint64		sweeps;
	uint64		sweep_errors;	/* passes that ended in an error */
	char		last_sweep_error[IDEM_STATS_ERROR_LEN];
} IdemDatabaseStats;

/* One tenant's conflicts; its key is in tenant_keys, 0 for a free entry. */
typedef struct IdemTenantEntry
{
	pg_atomic_uint64 conflicts; /* exact, since the tenant took the entry */
	pg_atomic_uint64 weight;	/* conflicts + the weight inherited */
	Oid			dboid;
	char		tenant[IDEM_MAX_IDENTIFIER_BYTES + 1];
} IdemTenantEntry;

typedef struct IdemSharedStats
{
	LWLock	   *lock;			/* slot assignment and last-sweep fields */
	LWLock	   *tenant_lock;	/* the tenant table: shared to count,
								 * exclusive to add or evict a tenant */
	IdemDatabaseStats dbs[IDEM_STATS_MAX_DATABASES];
	/* hash of (database, tenant) of each entry, never 0: one kilobyte to
	 * scan for a tenant, apart from the entries' names */
	pg_atomic_uint64 tenant_keys[IDEM_TENANT_SLOTS];
	IdemTenantEntry tenants[IDEM_TENANT_SLOTS];
} IdemSharedStats;

static IdemSharedStats *shared = NULL;
static IdemDatabaseStats *my_slot = NULL;

static void require_shared(void);

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static void
stats_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(IdemSharedStats)));
	RequestNamedLWLockTranche("idempotency", 2);
}

static void
stats_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	shared = ShmemInitStruct("idempotency", sizeof(IdemSharedStats), &found);
	if (!found)
	{
		memset(shared, 0, sizeof(IdemSharedStats));
		shared->lock = &(GetNamedLWLockTranche("idempotency"))[0].lock;
		shared->tenant_lock = &(GetNamedLWLockTranche("idempotency"))[1].lock;
		for (int i = 0; i < IDEM_STATS_MAX_DATABASES; i++)
			for (int c = 0; c < IDEM_NUM_COUNTERS; c++)
				pg_atomic_init_u64(&shared->dbs[i].counters[c], 0);
		for (int i = 0; i < IDEM_TENANT_SLOTS; i++)
		{
			pg_atomic_init_u64(&shared->tenant_keys[i], 0);
			pg_atomic_init_u64(&shared->tenants[i].conflicts, 0);
			pg_atomic_init_u64(&shared->tenants[i].weight, 0);
		}
	}
	LWLockRelease(AddinShmemInitLock);
}

/*
 * Reserve shared memory.  Called from _PG_init while preloading.
 */
void
idem_stats_request_shmem(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = stats_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = stats_shmem_startup;
}

/* Forget the tenants of a database (reset, or its slot taken anew). */
static void
forget_tenants(Oid dboid)
{
	LWLockAcquire(shared->tenant_lock, LW_EXCLUSIVE);
	for (int i = 0; i < IDEM_TENANT_SLOTS; i++)
	{
		IdemTenantEntry *e = &shared->tenants[i];

		if (e->dboid == dboid && pg_atomic_read_u64(&shared->tenant_keys[i]) != 0)
		{
			pg_atomic_write_u64(&shared->tenant_keys[i], 0);
			pg_atomic_write_u64(&e->conflicts, 0);
			pg_atomic_write_u64(&e->weight, 0);
		}
	}
	LWLockRelease(shared->tenant_lock);
}

/* Zero the counters of a slot; the caller holds the lock (or owns the slot). */
static void
reset_slot(IdemDatabaseStats *slot)
{
	for (int c = 0; c < IDEM_NUM_COUNTERS; c++)
		pg_atomic_write_u64(&slot->counters[c], 0);
	slot->sweeps = 0;
	slot->sweep_errors = 0;
	slot->stats_reset = GetCurrentTimestamp();
}

/*
 * Free the slots of databases that were dropped, so that the table does not
 * fill up with them.  Existence is checked in the catalog without holding
 * the lock; a dropped database has no backend that could still use its slot.
 */
static void
reclaim_dropped_database_slots(void)
{
	Oid			dboids[IDEM_STATS_MAX_DATABASES];
	bool		gone[IDEM_STATS_MAX_DATABASES] = {false};

	if (!IsTransactionState())
		return;

	LWLockAcquire(shared->lock, LW_SHARED);
	for (int i = 0; i < IDEM_STATS_MAX_DATABASES; i++)
		dboids[i] = shared->dbs[i].dboid;
	LWLockRelease(shared->lock);

	for (int i = 0; i < IDEM_STATS_MAX_DATABASES; i++)
		gone[i] = OidIsValid(dboids[i]) && dboids[i] != MyDatabaseId &&
			!SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(dboids[i]));

	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	for (int i = 0; i < IDEM_STATS_MAX_DATABASES; i++)
		if (gone[i] && shared->dbs[i].dboid == dboids[i])
			shared->dbs[i].dboid = InvalidOid;
	LWLockRelease(shared->lock);
	for (int i = 0; i < IDEM_STATS_MAX_DATABASES; i++)
		if (gone[i])
			forget_tenants(dboids[i]);
}

/*
 * This database's slot, claimed on first use; NULL if none is free (then
 * the search is retried at most every 10 seconds, not on every call).
 */
static IdemDatabaseStats *
database_slot(void)
{
	static TimestampTz no_slot_since = 0;

	if (shared == NULL || !idem_track_stats || !OidIsValid(MyDatabaseId))
		return NULL;
	if (my_slot != NULL)
		return my_slot;
	if (no_slot_since != 0 &&
		!TimestampDifferenceExceeds(no_slot_since, GetCurrentTimestamp(), 10 * 1000))
		return NULL;

	for (int attempt = 0; attempt < 2 && my_slot == NULL; attempt++)
	{
		IdemDatabaseStats *free_slot = NULL;
		bool		taken = false;

		if (attempt > 0)
			reclaim_dropped_database_slots();

		/* find and claim under one lock hold: one slot per database */
		LWLockAcquire(shared->lock, LW_EXCLUSIVE);
		for (int i = 0; i < IDEM_STATS_MAX_DATABASES; i++)
		{
			IdemDatabaseStats *slot = &shared->dbs[i];

			if (slot->dboid == MyDatabaseId)
			{
				my_slot = slot;
				break;
			}
			if (slot->dboid == InvalidOid && free_slot == NULL)
				free_slot = slot;
		}
		if (my_slot == NULL && free_slot != NULL)
		{
			free_slot->dboid = MyDatabaseId;
			reset_slot(free_slot);
			free_slot->last_sweep_at = 0;
			free_slot->last_sweep_error[0] = '\0';
			my_slot = free_slot;
			taken = true;
		}
		LWLockRelease(shared->lock);
		if (taken)
			forget_tenants(MyDatabaseId);
	}

	no_slot_since = my_slot == NULL ? GetCurrentTimestamp() : 0;
	return my_slot;
}

void
idem_stats_add(IdemCounter counter, uint64 n)
{
	IdemDatabaseStats *slot;

	if (n == 0 || (slot = database_slot()) == NULL)
		return;
	pg_atomic_fetch_add_u64(&slot->counters[counter], n);
}

/* Count one idem_claim outcome. */
void
idem_stats_count_claim(const IdemClaimResult *res)
{
	static const IdemCounter by_outcome[] = {
		[IDEM_OUTCOME_CLAIMED] = IDEM_STAT_CLAIMED,
		[IDEM_OUTCOME_REPLAY] = IDEM_STAT_REPLAYS,
		[IDEM_OUTCOME_FAILED] = IDEM_STAT_FAILED_REPLAYS,
		[IDEM_OUTCOME_IN_PROGRESS] = IDEM_STAT_IN_PROGRESS,
		[IDEM_OUTCOME_MISMATCH] = IDEM_STAT_MISMATCHES,
	};
	IdemDatabaseStats *slot = database_slot();

	if (slot == NULL)
		return;
	pg_atomic_fetch_add_u64(&slot->counters[IDEM_STAT_CLAIMS], 1);
	pg_atomic_fetch_add_u64(&slot->counters[by_outcome[res->outcome]], 1);
	if (res->took_over)
		pg_atomic_fetch_add_u64(&slot->counters[IDEM_STAT_TAKEOVERS], 1);
	if (res->stale_failed)
		pg_atomic_fetch_add_u64(&slot->counters[IDEM_STAT_SWEPT_STALE], 1);
}

/* The entry of a tenant's key, or -1; the caller holds tenant_lock. */
static int
find_tenant(uint64 key, Oid dboid, const char *tenant, int len)
{
	for (int i = 0; i < IDEM_TENANT_SLOTS; i++)
	{
		IdemTenantEntry *e = &shared->tenants[i];

		if (pg_atomic_read_u64(&shared->tenant_keys[i]) == key && e->dboid == dboid &&
			strncmp(e->tenant, tenant, len) == 0 && e->tenant[len] == '\0')
			return i;
	}
	return -1;
}

/*
 * Count one conflict answer (in progress or mismatch) for a tenant of this
 * database.  Called by idem_claim_one (claim.c) for those answers only.
 */
void
idem_stats_count_tenant_conflict(const text *tenant_id)
{
	const char *tenant = VARDATA_ANY(tenant_id);
	int			len = Min(VARSIZE_ANY_EXHDR(tenant_id), IDEM_MAX_IDENTIFIER_BYTES);
	uint64		key;
	int			i;

	if (database_slot() == NULL)
		return;
	key = hash_bytes_extended((const unsigned char *) tenant, len, MyDatabaseId) | 1;

	LWLockAcquire(shared->tenant_lock, LW_SHARED);
	i = find_tenant(key, MyDatabaseId, tenant, len);
	if (i >= 0)
	{
		pg_atomic_fetch_add_u64(&shared->tenants[i].conflicts, 1);
		pg_atomic_fetch_add_u64(&shared->tenants[i].weight, 1);
	}
	LWLockRelease(shared->tenant_lock);
	if (i >= 0)
		return;

	/* a tenant not in the table: a free entry, or the lightest one's */
	LWLockAcquire(shared->tenant_lock, LW_EXCLUSIVE);
	i = find_tenant(key, MyDatabaseId, tenant, len);
	if (i >= 0)
	{
		pg_atomic_fetch_add_u64(&shared->tenants[i].conflicts, 1);
		pg_atomic_fetch_add_u64(&shared->tenants[i].weight, 1);
	}
	else
	{
		uint64		least = PG_UINT64_MAX;
		IdemTenantEntry *e;

		for (int j = 0; j < IDEM_TENANT_SLOTS && least > 0; j++)
		{
			uint64		w = pg_atomic_read_u64(&shared->tenant_keys[j]) == 0 ? 0 :
				pg_atomic_read_u64(&shared->tenants[j].weight);

			if (w < least)
			{
				least = w;
				i = j;
			}
		}
		e = &shared->tenants[i];
		pg_atomic_write_u64(&shared->tenant_keys[i], key);
		pg_atomic_write_u64(&e->conflicts, 1);
		pg_atomic_write_u64(&e->weight, least + 1);
		e->dboid = MyDatabaseId;
		memcpy(e->tenant, tenant, len);
		e->tenant[len] = '\0';
	}
	LWLockRelease(shared->tenant_lock);
}

/*
 * This database's tenants in the conflict table, heaviest first: at most
 * IDEM_TENANT_SLOTS; returns how many were filled in.
 */
int
idem_stats_tenant_conflicts(IdemTenantConflicts *out)
{
	int			n = 0;

	require_shared();
	LWLockAcquire(shared->tenant_lock, LW_SHARED);
	for (int i = 0; i < IDEM_TENANT_SLOTS; i++)
	{
		IdemTenantEntry *e = &shared->tenants[i];

		if (pg_atomic_read_u64(&shared->tenant_keys[i]) == 0 || e->dboid != MyDatabaseId)
			continue;
		strlcpy(out[n].tenant, e->tenant, sizeof(out[n].tenant));
		out[n].conflicts = pg_atomic_read_u64(&e->conflicts);
		out[n].weight = pg_atomic_read_u64(&e->weight);
		n++;
	}
	LWLockRelease(shared->tenant_lock);
	return n;
}

/*
 * This database's counters and last sweep, for idem_metrics (metrics.c);
 * false when nothing was counted in it yet.
 */
bool
idem_stats_snapshot(IdemStatsSnapshot *snap)
{
	IdemDatabaseStats *slot;

	require_shared();
	memset(snap, 0, sizeof(*snap));
	slot = database_slot();
	if (slot == NULL)
		return false;
	for (int c = 0; c < IDEM_NUM_COUNTERS; c++)
		snap->counters[c] = pg_atomic_read_u64(&slot->counters[c]);
	LWLockAcquire(shared->lock, LW_SHARED);
	snap->stats_reset = slot->stats_reset;
	snap->last_sweep_at = slot->last_sweep_at;
	snap->last_sweep_ms = slot->last_sweep_ms;
	snap->last_sweep_removed = slot->last_sweep_removed;
	snap->sweeps = slot->sweeps;
	snap->sweep_errors = slot->sweep_errors;
	LWLockRelease(shared->lock);
	return true;
}

/*
 * Record the end of a sweep pass over this database (error NULL when it
 * succeeded).
 */
void
idem_stats_sweep_finished(TimestampTz started, TimestampTz finished,
						  const IdemSweepCounts *counts, const char *error)
{
	IdemDatabaseStats *slot = database_slot();

	if (slot == NULL)
		return;
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	slot->last_sweep_at = finished;
	slot->last_sweep_ms = (double) (finished - started) / 1000.0;
	slot->last_sweep_removed = counts->expired_removed + counts->stale_released;
	slot->sweeps++;
	if (error != NULL)
		slot->sweep_errors++;
	strlcpy(slot->last_sweep_error, error ? error : "", IDEM_STATS_ERROR_LEN);
	LWLockRelease(shared->lock);
}

/* Is the statistics' shared memory there (the library preloaded)? */
bool
idem_stats_available(void)
{
	return shared != NULL;
}

static void
require_shared(void)
{
	if (shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency statistics need the library in shared_preload_libraries"),
				 errhint("Add 'idempotency' to shared_preload_libraries and restart the server.")));
}

/*
 * idem_stats_read() RETURNS SETOF record: one row per database counted
 * since the server started, or only the current database's row for a
 * caller without the privileges of pg_read_all_stats.  Wrapped by the view
 * idem_stats (a function in a view runs as the querying role, so the check
 * applies to readers of the view too).
 */
Datum
idem_stats_read(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	bool		all_databases;

	require_shared();
	all_databases = has_privs_of_role(GetUserId(), ROLE_PG_READ_ALL_STATS);
	reclaim_dropped_database_slots();
	InitMaterializedSRF(fcinfo, 0);

	for (int i = 0; i < IDEM_STATS_MAX_DATABASES; i++)
	{
		IdemDatabaseStats *slot = &shared->dbs[i];
		Datum		values[IDEM_NUM_COUNTERS + 8];
		bool		nulls[IDEM_NUM_COUNTERS + 8] = {false};
		char	   *datname;
		int			col = 0;
		Oid			dboid;

		LWLockAcquire(shared->lock, LW_SHARED);
		dboid = slot->dboid;
		LWLockRelease(shared->lock);
		if (!OidIsValid(dboid) || (!all_databases && dboid != MyDatabaseId))
			continue;

		values[col++] = ObjectIdGetDatum(dboid);
		datname = get_database_name(dboid);
		nulls[col] = datname == NULL;
		values[col++] = datname ? CStringGetTextDatum(datname) : (Datum) 0;
		for (int c = 0; c < IDEM_NUM_COUNTERS; c++)
			values[col++] = Int64GetDatum((int64) pg_atomic_read_u64(&slot->counters[c]));

		LWLockAcquire(shared->lock, LW_SHARED);
		nulls[col] = slot->last_sweep_at == 0;
		values[col++] = TimestampTzGetDatum(slot->last_sweep_at);
		nulls[col] = slot->last_sweep_at == 0;
		values[col++] = Float8GetDatum(slot->last_sweep_ms);
		nulls[col] = slot->last_sweep_at == 0;
		values[col++] = Int64GetDatum((int64) slot->last_sweep_removed);
		nulls[col] = slot->last_sweep_error[0] == '\0';
		values[col++] = CStringGetTextDatum(slot->last_sweep_error);
		values[col++] = Int64GetDatum((int64) slot->sweeps);
		values[col++] = TimestampTzGetDatum(slot->stats_reset);
		LWLockRelease(shared->lock);

		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/*
 * idem_stats_reset() RETURNS void: zero this database's counters.
 */
Datum
idem_stats_reset(PG_FUNCTION_ARGS)
{
	IdemDatabaseStats *slot;

	require_shared();
	slot = database_slot();
	if (slot != NULL)
	{
		LWLockAcquire(shared->lock, LW_EXCLUSIVE);
		reset_slot(slot);
		LWLockRelease(shared->lock);
		forget_tenants(MyDatabaseId);
	}
	PG_RETURN_VOID();
}
