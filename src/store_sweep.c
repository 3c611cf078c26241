/*
 * store_sweep.c
 *		The sweep statements on idempotency_records: batches of expired
 *		records deleted (or stale claims failed), on the table, on one shard
 *		of it, or on every shard of a distributed table at once, placement
 *		by placement while a worker does not answer.
 *
 * sweep.c runs the batches; the sweeper's worker (database_sweeper.c)
 * directs them to each shard of this node (idem_store_direct_sweeps_to) on
 * a Citus node.
 */
#include "postgres.h"

#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/jsonb.h"

#include "citus.h"
#include "idempotency.h"
#include "record.h"
#include "statements.h"
#include "store_attach.h"
#include "store_sweep.h"
#include "subxact.h"

/*
 * Count the stale claims among the n rows a sweep statement returned
 * (status = 'processing', expires_at) into *stale_released and advance
 * *from to the latest expiry.
 */
static void
read_swept_rows(uint64 n, TimestampTz *from, uint64 *stale_released)
{
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
	/* the rows are counted: a pass of a thousand batches keeps none of them */
	SPI_freetuptable(SPI_tuptable);
}

/*
 * How long a batch that deletes rows without locking them may wait for a
 * claim that locked one of them after the batch read it, before the batch
 * is run with the locking statement instead (which skips that row).  Such
 * a claim holds the row until its transaction ends; the batch holds the
 * rows it deleted meanwhile, and claims of those expired keys wait for it.
 */
#define UNLOCKED_BATCH_WAIT_MS 10

typedef struct UnlockedBatch
{
	IdemQuery	query;
	Datum	   *values;
	uint64		deleted;
} UnlockedBatch;

static void
delete_unlocked_batch(void *arg)
{
	UnlockedBatch *batch = (UnlockedBatch *) arg;

	idem_step_lock_timeout(UNLOCKED_BATCH_WAIT_MS);
	batch->deleted = idem_store_run(batch->query, batch->values, "   ", false, 0);
}

/*
 * Delete one batch of expired records, those expiring at or after *from
 * (each batch starts where the previous one ended, so a pass never walks
 * the index entries of rows it already deleted).  With
 * include_stale_claims, expired claims go too (stale_action = release) and
 * are counted in *stale_released.  Returns the number of rows deleted,
 * sets *full when the batch found batch_size rows to delete (the pass goes
 * on), and advances *from.
 *
 * The batch first deletes the rows never locked or changed since they
 * were written, without locking them (Q_SWEEP_ALL_UNLOCKED, statements.c):
 * it writes half as much.  When that leaves the batch short (the end of
 * the backlog, or rows it left to the lock), or it met a row a claim had
 * just locked (it waits UNLOCKED_BATCH_WAIT_MS at most, or loses a
 * deadlock, and its deletes are undone), the locking statement takes the
 * same range, skipping rows that live claims hold: a sweep never waits on
 * a claim.  Without try_unlocked (idem_sweep's batches past its first
 * few, sweep.c) the locking statement runs alone: it needs no
 * subtransaction.
 */
uint64
idem_store_sweep_expired(TimestampTz now, int batch_size,
						 bool include_stale_claims, bool try_unlocked,
						 TimestampTz *from, uint64 *stale_released, bool *full)
{
	static const int wait_ended[] = {ERRCODE_LOCK_NOT_AVAILABLE,
	ERRCODE_T_R_DEADLOCK_DETECTED};
	Datum		values[3];
	UnlockedBatch batch;
	TimestampTz last = *from;
	uint64		n = 0;
	uint64		m;

	values[0] = TimestampTzGetDatum(now);
	values[1] = Int32GetDatum(batch_size);
	values[2] = TimestampTzGetDatum(*from);
	*stale_released = 0;

	batch.query = include_stale_claims ? Q_SWEEP_ALL_UNLOCKED : Q_SWEEP_TERMINAL_UNLOCKED;
	batch.values = values;
	if (try_unlocked &&
		idem_try_in_subtransaction(delete_unlocked_batch, &batch,
								   wait_ended, lengthof(wait_ended)))
	{
		n = batch.deleted;
		read_swept_rows(n, &last, stale_released);
		if (n >= (uint64) batch_size)
		{
			*from = last;
			*full = true;
			return n;
		}
	}

	m = idem_store_run(include_stale_claims ? Q_SWEEP_ALL : Q_SWEEP_TERMINAL,
					   values, "   ", false, 0);
	read_swept_rows(m, &last, stale_released);
	*from = last;
	*full = m >= (uint64) batch_size;
	return n + m;
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

	n = idem_store_run(include_stale_claims ? Q_SWEEP_GROUP_ALL : Q_SWEEP_GROUP_TERMINAL,
				  values, " ", false, 0);
	*stale_released = 0;
	read_swept_rows(n, &last, stale_released);
	return n;
}

/*
 * Turn one batch of expired claims into failed records.
 */
uint64
idem_store_sweep_fail_stale(TimestampTz now, int batch_size)
{
	Datum		values[3];
	uint64		n;

	values[0] = TimestampTzGetDatum(now);
	values[1] = Int32GetDatum(batch_size);
	values[2] = idem_stale_failure_response();
	n = idem_store_run(Q_SWEEP_FAIL_STALE, values, "   ", false, 0);
	SPI_freetuptable(SPI_tuptable);
	return n;
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
	text = idem_statement_text(q, "%s", idem_store_has_checkpoints(),
							   idem_store_has_holder());
	text = idem_replace_all(text, "$2",
					   psprintf("%s::pg_catalog.jsonb",
								quote_literal_cstr(DatumGetCString(DirectFunctionCall1(jsonb_out,
																					   idem_stale_failure_response())))));
	text = idem_replace_all(text, "$1", now_literal);
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
		*stale_failed = idem_citus_count_on_placements(idem_store_table(),
													   placement_command(Q_CLUSTER_SWEEP_FAIL_STALE, now),
													   &warned);
	else
		*stale_released = idem_citus_count_on_placements(idem_store_table(),
														 placement_command(Q_CLUSTER_SWEEP_STALE, now),
														 &warned);
	return idem_citus_count_on_placements(idem_store_table(),
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
		*stale_failed = idem_store_run(Q_CLUSTER_SWEEP_FAIL_STALE, values, "  ", false, 0);
	else
		*stale_released = idem_store_run(Q_CLUSTER_SWEEP_STALE, values, " ", false, 0);
	return idem_store_run(Q_CLUSTER_SWEEP_TERMINAL, values, " ", false, 0);
}
