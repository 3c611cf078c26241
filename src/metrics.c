/*
 * metrics.c
 *		What a monitoring scraper reads (1.3): idem_metrics() and
 *		idem_metrics_tenants(top).
 *
 * Three sources, each read the cheapest way there is:
 *  - the counters and the last sweep of this database, from shared memory
 *    (stats.c): no table is read; NULL when the library is not preloaded
 *    (there is no shared memory then), the other columns as always, so that
 *    a scraper keeps its gauges on a server not restarted yet;
 *  - the gauges of the records table, through its expires_at index only
 *    (there is no index on status, and one would cost every claim an index
 *    insert): the rows already expired, and the rows that expire next, at
 *    most IDEM_METRICS_ROWS of each (see window_rows below);
 *  - the heavyweight lock table's fill, from the entry counts of the shared
 *    LOCK and PROCLOCK hash tables, read without taking any lock (pg_locks
 *    would take all 16 lock partitions and copy every lock).
 *
 * Both functions are SECURITY DEFINER (the extension's owner, a superuser),
 * so that a member of pg_monitor counts every tenant's records even under
 * tenant isolation; EXECUTE is granted to pg_monitor only.  They read the
 * table as its owner, in a security-restricted operation
 * (idem_store_begin_as_owner): code the owner planted on the table never
 * runs with the definer's superuser rights.  They run on the
 * node they are called on: they take no tenant and are never delegated by
 * Citus (idem_distribute() leaves them alone).
 */
#include "postgres.h"

#include "access/twophase.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "storage/shmem.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

#include "idempotency.h"
#include "stats.h"
#include "store_attach.h"

PG_FUNCTION_INFO_V1(idem_metrics);
PG_FUNCTION_INFO_V1(idem_metrics_tenants);

/* rows read at most on each side of now (expired; expiring next) */
#define IDEM_METRICS_ROWS		25000
/* idem_metrics_tenants(top): 1 .. this */
#define IDEM_METRICS_MAX_TOP	100

#define EQ " OPERATOR(pg_catalog.=) "
#define LE " OPERATOR(pg_catalog.<=) "
#define GT " OPERATOR(pg_catalog.>) "

/*
 * The rows the gauges are counted over, with what each one is.  $1 is now,
 * $2 IDEM_METRICS_ROWS.  The expired side is every row past its expiry
 * (the sweeper's backlog, stuck claims among it), up to $2 rows.  The other
 * side is the $2 rows that expire next, in the index's order: a claim's
 * record expires at its lease end, sooner than the completed records kept
 * for their retention (5 minutes against 24 hours by default), so the live
 * claims are among them as long as fewer than $2 records expire before the
 * longest lease ends.  A resumable record expires at the end of its
 * retention after the lease, so only those expiring soonest are seen.
 *
 *   claim      processing, not waiting to be resumed (live lease, or stuck)
 *   stuck      a claim whose lease ended (the sweeper or a retry takes it)
 *   resumable  processing with a recovery point, lease ended, retention not
 *   unswept    expired, not a stuck claim (the sweeper removes it)
 */
#define WINDOW_COLUMNS \
	"tenant_id, created_at, status, recovery_point IS NULL AS no_point," \
	" lease_expires_at, expires_at"
#define WINDOW_ROWS \
	"SELECT r.tenant_id, r.created_at," \
	"       r.status" EQ "'processing' AND (r.no_point" \
	"           OR COALESCE(r.lease_expires_at, r.expires_at)" GT "$1) AS claim," \
	"       r.status" EQ "'processing' AND COALESCE(r.lease_expires_at, r.expires_at)" LE "$1" \
	"           AND (r.no_point OR r.expires_at" GT "$1) AS lease_ended," \
	"       r.expires_at" LE "$1 AS expired" \
	"  FROM ((SELECT " WINDOW_COLUMNS " FROM %1$s WHERE expires_at" LE "$1 LIMIT $2)" \
	"        UNION ALL" \
	"        (SELECT " WINDOW_COLUMNS " FROM %1$s WHERE expires_at" GT "$1" \
	"          ORDER BY expires_at LIMIT $2)) r"

static const char *const metrics_query =
"SELECT pg_catalog.count(*) FILTER (WHERE w.claim),"
"       pg_catalog.min(w.created_at) FILTER (WHERE w.claim),"
"       pg_catalog.count(*) FILTER (WHERE w.claim AND w.lease_ended),"
"       pg_catalog.count(*) FILTER (WHERE NOT w.claim AND w.lease_ended),"
"       pg_catalog.count(*) FILTER (WHERE w.expired AND NOT (w.claim AND w.lease_ended))"
"  FROM (" WINDOW_ROWS ") w";

/*
 * Tenants: those with claims in progress in the window, and those of the
 * conflict table ($3 tenants, $4 conflicts, $5 weights).  A tenant's place
 * is the better of its rank by claims in progress and its rank by
 * conflicts (weight), so the busiest of either kind come first; $6 rows.
 */
static const char *const tenants_query =
"WITH w AS (" WINDOW_ROWS "),"
" ip AS (SELECT w.tenant_id AS tenant, pg_catalog.count(*) AS claims,"
"               pg_catalog.min(w.created_at) AS oldest"
"          FROM w WHERE w.claim GROUP BY w.tenant_id),"
" c AS (SELECT * FROM ROWS FROM (pg_catalog.unnest($3::pg_catalog.text[]),"
"                                  pg_catalog.unnest($4::pg_catalog.int8[]),"
"                                  pg_catalog.unnest($5::pg_catalog.int8[]))"
"                        AS c(tenant, conflicts, weight)),"
" j AS (SELECT COALESCE(ip.tenant, c.tenant) COLLATE pg_catalog.\"C\" AS tenant,"
"              COALESCE(ip.claims, 0) AS claims, ip.oldest,"
"              COALESCE(c.conflicts, 0) AS conflicts, COALESCE(c.weight, 0) AS weight"
"         FROM ip FULL JOIN c ON ip.tenant" EQ "c.tenant)"
"SELECT x.tenant, x.claims, x.oldest, x.conflicts"
"  FROM (SELECT j.*,"
"               CASE WHEN j.claims" GT "0 THEN pg_catalog.row_number() OVER"
"                    (ORDER BY j.claims DESC, j.tenant) END AS by_claims,"
"               CASE WHEN j.weight" GT "0 THEN pg_catalog.row_number() OVER"
"                    (ORDER BY j.weight DESC, j.tenant) END AS by_conflicts"
"          FROM j) x"
" ORDER BY LEAST(x.by_claims, x.by_conflicts), x.claims DESC, x.conflicts DESC, x.tenant"
" LIMIT $6";

static double
age_seconds(TimestampTz now, bool isnull, Datum oldest)
{
	if (isnull)
		return 0.0;
	return Max(0.0, (double) (now - DatumGetTimestampTz(oldest)) / USECS_PER_SEC);
}

/* the table's schema-qualified, quoted name (attached by idem_store_begin) */
static char *
table_name(void)
{
	Oid			rel = idem_store_table();

	return quote_qualified_identifier(get_namespace_name(get_rel_namespace(rel)),
									  get_rel_name(rel));
}

/*
 * How full the heavyweight lock table is: the larger of the LOCK hash's
 * entries over its planned size (max_locks_per_transaction x
 * (max_connections + the other backends + max_prepared_transactions)) and
 * the PROCLOCK hash's over twice that, as lock.c plans them.  "out of shared
 * memory" follows when one of them can grow no more; they may borrow the
 * server's spare shared memory first, so the ratio can pass 1 for a while.
 * The tables are attached once per backend (ShmemInitHash finds the
 * existing ones, with the sizes lock.c gave them); the counts are read
 * without a lock, so a reading may be a few entries off while locks are
 * taken and released.
 */
static double
lock_table_used_ratio(void)
{
	static HTAB *lock_hash = NULL;
	static HTAB *proclock_hash = NULL;
	long		max_entries = (long) max_locks_per_xact * (MaxBackends + max_prepared_xacts);

	if (lock_hash == NULL)
	{
		HASHCTL		info;

		memset(&info, 0, sizeof(info));
		info.keysize = sizeof(LOCKTAG);
		info.entrysize = sizeof(LOCK);
		info.num_partitions = NUM_LOCK_PARTITIONS;
		lock_hash = ShmemInitHash("LOCK hash", max_entries / 2, max_entries, &info,
								  HASH_ELEM | HASH_BLOBS | HASH_PARTITION);
		info.keysize = sizeof(PROCLOCKTAG);
		info.entrysize = sizeof(PROCLOCK);
		proclock_hash = ShmemInitHash("PROCLOCK hash", max_entries, max_entries * 2, &info,
									  HASH_ELEM | HASH_BLOBS | HASH_PARTITION);
	}
	if (max_entries <= 0)
		return 0.0;
	return Max((double) hash_get_num_entries(lock_hash) / max_entries,
			   (double) hash_get_num_entries(proclock_hash) / (max_entries * 2.0));
}

/* Run one of the queries above on the attached table; $1 now, $2 rows. */
static void
run_window_query(const char *text, TimestampTz now, int nargs, Oid *types,
				 Datum *values)
{
	int			rc;

	types[0] = TIMESTAMPTZOID;
	values[0] = TimestampTzGetDatum(now);
	types[1] = INT4OID;
	values[1] = Int32GetDatum(IDEM_METRICS_ROWS);
	rc = SPI_execute_with_args(psprintf(text, table_name()), nargs, types, values,
							   NULL, true, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "idempotency metrics query failed: %s", SPI_result_code_string(rc));
}

static int64
int8_column(int row, int col, bool *isnull)
{
	Datum		d = SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, col, isnull);

	return *isnull ? 0 : DatumGetInt64(d);
}

/*
 * idem_metrics() RETURNS one row: this database's counters (shared memory),
 * the table's gauges and the lock table's fill.  See docs/reference.md.
 */
Datum
idem_metrics(PG_FUNCTION_ARGS)
{
	IdemStatsSnapshot snap;
	TupleDesc	desc;
	Datum		values[19];
	bool		nulls[19] = {false};
	Oid			types[2];
	Datum		args[2];
	TimestampTz now = GetCurrentTimestamp();
	IdemOwnerCall owner_call;
	bool		shared;
	char	   *datname = get_database_name(MyDatabaseId);
	bool		isnull;
	int			col = 0;

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "idem_metrics must return a row");
	shared = idem_stats_available();
	if (!shared)
		memset(&snap, 0, sizeof(snap));
	else if (!idem_stats_snapshot(&snap))
		snap.stats_reset = 0;
	/* the counters (columns 2..7) live in shared memory */
	for (int c = 1; c <= 6; c++)
		nulls[c] = !shared;

	values[col++] = CStringGetTextDatum(datname ? datname : "");
	values[col++] = Int64GetDatum((int64) snap.counters[IDEM_STAT_CLAIMED]);
	values[col++] = Int64GetDatum((int64) snap.counters[IDEM_STAT_REPLAYS]);
	values[col++] = Int64GetDatum((int64) snap.counters[IDEM_STAT_IN_PROGRESS]);
	values[col++] = Int64GetDatum((int64) snap.counters[IDEM_STAT_MISMATCHES]);
	values[col++] = Int64GetDatum((int64) snap.counters[IDEM_STAT_FAILED_REPLAYS]);
	values[col++] = Int64GetDatum((int64) snap.counters[IDEM_STAT_TAKEOVERS]);

	idem_store_begin_as_owner(idem_store_function_schema(fcinfo), AccessShareLock,
							  &owner_call);
	run_window_query(metrics_query, now, 2, types, args);
	values[col++] = Int64GetDatum(int8_column(0, 1, &isnull));	/* claims_in_progress */
	{
		Datum		oldest = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);

		values[col++] = Float8GetDatum(age_seconds(now, isnull, oldest));
	}
	values[col++] = Int64GetDatum(int8_column(0, 3, &isnull));	/* stuck_claims */
	values[col++] = Int64GetDatum(int8_column(0, 4, &isnull));	/* resumable_records */
	values[col++] = Int64GetDatum(int8_column(0, 5, &isnull));	/* expired_unswept */
	idem_store_end_as_owner(&owner_call);

	nulls[col] = !shared;
	values[col++] = Int64GetDatum((int64) snap.sweeps);
	nulls[col] = !shared;
	values[col++] = Int64GetDatum((int64) snap.sweep_errors);
	nulls[col] = snap.last_sweep_at == 0;
	values[col++] = TimestampTzGetDatum(snap.last_sweep_at);
	nulls[col] = snap.last_sweep_at == 0;
	values[col++] = Float8GetDatum(snap.last_sweep_ms / 1000.0);
	nulls[col] = snap.last_sweep_at == 0;
	values[col++] = Int64GetDatum((int64) snap.last_sweep_removed);
	values[col++] = Float8GetDatum(lock_table_used_ratio());
	nulls[col] = snap.stats_reset == 0;
	values[col++] = TimestampTzGetDatum(snap.stats_reset);
	Assert(col == desc->natts);

	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

/*
 * idem_metrics_tenants(top integer DEFAULT 10) RETURNS SETOF (tenant,
 * claims_in_progress, oldest_claim_age_seconds, conflicts_total): at most
 * top rows, 1 <= top <= IDEM_METRICS_MAX_TOP.
 */
Datum
idem_metrics_tenants(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	IdemTenantConflicts *tenants;
	Datum	   *names;
	Datum	   *conflicts;
	Datum	   *weights;
	Oid			types[6];
	Datum		args[6];
	TimestampTz now = GetCurrentTimestamp();
	IdemOwnerCall owner_call;
	bool		shared;
	int32		top;
	int			n;

	if (PG_ARGISNULL(0) || PG_GETARG_INT32(0) < 1 || PG_GETARG_INT32(0) > IDEM_METRICS_MAX_TOP)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("top must be between 1 and %d", IDEM_METRICS_MAX_TOP),
				 errdetail("The number of tenants reported is bounded, so that a scraper's label set stays small.")));
	top = PG_GETARG_INT32(0);

	tenants = palloc(sizeof(IdemTenantConflicts) * IDEM_TENANT_SLOTS);
	shared = idem_stats_available();
	n = shared ? idem_stats_tenant_conflicts(tenants) : 0;
	names = palloc(sizeof(Datum) * (n + 1));
	conflicts = palloc(sizeof(Datum) * (n + 1));
	weights = palloc(sizeof(Datum) * (n + 1));
	for (int i = 0; i < n; i++)
	{
		names[i] = CStringGetTextDatum(tenants[i].tenant);
		conflicts[i] = Int64GetDatum((int64) tenants[i].conflicts);
		weights[i] = Int64GetDatum((int64) tenants[i].weight);
	}

	InitMaterializedSRF(fcinfo, 0);
	idem_store_begin_as_owner(idem_store_function_schema(fcinfo), AccessShareLock,
							  &owner_call);
	types[2] = TEXTARRAYOID;
	args[2] = PointerGetDatum(construct_array(names, n, TEXTOID, -1, false, TYPALIGN_INT));
	types[3] = INT8ARRAYOID;
	args[3] = PointerGetDatum(construct_array(conflicts, n, INT8OID, 8, FLOAT8PASSBYVAL,
											  TYPALIGN_DOUBLE));
	types[4] = INT8ARRAYOID;
	args[4] = PointerGetDatum(construct_array(weights, n, INT8OID, 8, FLOAT8PASSBYVAL,
											  TYPALIGN_DOUBLE));
	types[5] = INT4OID;
	args[5] = Int32GetDatum(top);
	run_window_query(tenants_query, now, 6, types, args);

	for (uint64 row = 0; row < SPI_processed; row++)
	{
		HeapTuple	tup = SPI_tuptable->vals[row];
		TupleDesc	td = SPI_tuptable->tupdesc;
		Datum		values[4];
		bool		nulls[4] = {false};
		bool		isnull;
		Datum		oldest;
		char	   *tenant = SPI_getvalue(tup, td, 1);

		values[0] = CStringGetTextDatum(tenant);
		values[1] = Int64GetDatum(int8_column(row, 2, &isnull));
		oldest = SPI_getbinval(tup, td, 3, &isnull);
		values[2] = Float8GetDatum(age_seconds(now, isnull, oldest));
		values[3] = Int64GetDatum(int8_column(row, 4, &isnull));
		nulls[3] = !shared;		/* conflicts are counted in shared memory */
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	idem_store_end_as_owner(&owner_call);
	return (Datum) 0;
}
