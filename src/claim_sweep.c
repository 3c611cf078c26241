/*
 * claim_sweep.c
 *		Sweeping without a scheduler (idempotency.claim_sweep): a claim that
 *		wrote a fresh record looks at the next N records of its tenant after
 *		its key, in primary-key order (wrapping to the tenant's first keys
 *		when fewer follow), and deletes those among them that idem_sweep()
 *		would delete.
 *
 * For databases where neither the background worker nor pg_cron runs
 * (Neon, docs/operations.md "Sweeping without a scheduler").  Why the
 * neighbours and not the claim's own key: with fresh claims arriving at
 * rate r, a retention T and an expired fraction f among the records, a
 * claim that looks at k neighbours removes k*f of them on average, so the
 * expired records settle where the claims remove what expires, near
 * r*T/(k-1); keys never claimed again are cleaned too.  Increasing keys
 * have no record after a new one: the window wraps to the tenant's first
 * keys, its oldest records.
 *
 * It runs as the caller, through the claim's own SPI connection and the
 * statement catalogue, never as the table's owner: the caller's DELETE
 * privilege and row-level security apply, and "tenant_id = $1" keeps it to
 * the claim's tenant in any case.  The deletes belong to the caller's
 * transaction.  Rows are locked with SKIP LOCKED, so a claim never waits
 * for them; the window is read first, so at most N rows are read.
 *
 * A record this transaction wrote is never removed: its own stale claim is
 * still its own (claim.c treats it so), as a held claim (held.c), not in
 * the table, is never met; holding only changes how far the window reaches
 * (a written record of the transaction takes a place in it).  Which rows
 * are this transaction's is known in C only
 * (TransactionIdIsCurrentTransactionId covers its subtransactions), so the
 * window's candidates are read, filtered here, then deleted by row
 * address, checked again on the row the DELETE finds.
 */
#include "postgres.h"

#include "access/transam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/itemptr.h"
#include "utils/array.h"
#include "utils/timestamp.h"

#include "claim_sweep.h"
#include "guc.h"
#include "idempotency.h"
#include "privilege_check.h"
#include "stats.h"
#include "store_attach.h"

/*
 * The caller deletes the rows itself, after locking them (FOR UPDATE needs
 * UPDATE): refuse a role without those privileges at every sweeping claim,
 * not only on the first claim that meets an expired neighbour, naming the
 * setting and the GRANT.
 */
static void
check_privileges(int window)
{
	const AclMode needed = ACL_SELECT | ACL_UPDATE | ACL_DELETE;

	if (idem_table_privileges_missing(idem_store_table(), GetUserId(), needed))
		idem_require_table_privileges(idem_store_table(), GetUserId(), needed,
									  psprintf("idem_claim() with idempotency.claim_sweep = %d",
											   window));
}

/*
 * The addresses of the window's rows that a sweep would delete and another
 * transaction wrote, from Q_CLAIM_SWEEP_LOOK's result; *n set to how many.
 */
static Datum *
others_rows(uint64 found, int *n)
{
	Datum	   *tids = palloc(sizeof(Datum) * Max(found, 1));

	*n = 0;
	for (uint64 i = 0; i < found; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		Datum		sweepable = SPI_getbinval(tup, desc, 3, &isnull);
		ItemPointer tid;
		TransactionId xmin;

		if (isnull || !DatumGetBool(sweepable))
			continue;
		tid = (ItemPointer) DatumGetPointer(SPI_getbinval(tup, desc, 1, &isnull));
		xmin = DatumGetTransactionId(SPI_getbinval(tup, desc, 2, &isnull));
		if (TransactionIdIsCurrentTransactionId(xmin))
			continue;
		tids[*n] = PointerGetDatum(memcpy(palloc(sizeof(ItemPointerData)), tid,
										  sizeof(ItemPointerData)));
		(*n)++;
	}
	SPI_freetuptable(SPI_tuptable);
	return tids;
}

/*
 * Delete the expired records among the window records of k's tenant that
 * follow k->key, as the caller, in its transaction.  Counted in idem_stats
 * as a sweep's removals (swept_expired, swept_stale).  The caller is
 * connected through idem_store_begin(); not on a Citus table, whose nodes
 * the background worker sweeps, and not under REPEATABLE READ or
 * SERIALIZABLE.
 */
void
idem_claim_sweep_neighbours(const IdemKey *k, int window)
{
	TimestampTz now = GetCurrentTimestamp();
	bool		fail_stale = idem_stale_action == IDEM_STALE_FAIL;
	Datum		look[5];
	Datum		del[4];
	Datum	   *tids;
	int			n;
	uint64		deleted;
	uint64		stale = 0;

	/*
	 * Under REPEATABLE READ or SERIALIZABLE a row settled by another
	 * transaction since the snapshot would fail the caller's claim with a
	 * serialization error when locked, and the window's read would add to
	 * the caller's predicate locks: an optional sweep must not make a claim
	 * fail, so those transactions do not sweep.
	 */
	if (idem_store_distributed() || IsolationUsesXactSnapshot())
		return;
	check_privileges(window);

	look[0] = PointerGetDatum(k->tenant_id);
	look[1] = PointerGetDatum(k->key);
	look[2] = TimestampTzGetDatum(now);
	look[3] = BoolGetDatum(fail_stale);
	look[4] = Int32GetDatum(window);
	tids = others_rows(idem_store_run(Q_CLAIM_SWEEP_LOOK, look, "     ", true, 0), &n);
	if (n == 0)
		return;

	del[0] = PointerGetDatum(construct_array(tids, n, TIDOID, sizeof(ItemPointerData),
											 false, TYPALIGN_SHORT));
	del[1] = PointerGetDatum(k->tenant_id);
	del[2] = TimestampTzGetDatum(now);
	del[3] = BoolGetDatum(fail_stale);
	deleted = idem_store_run(Q_CLAIM_SWEEP_DELETE, del, "    ", false, 0);
	for (uint64 i = 0; i < deleted; i++)
	{
		bool		isnull;

		if (DatumGetBool(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
									   1, &isnull)))
			stale++;
	}
	SPI_freetuptable(SPI_tuptable);
	idem_stats_add(IDEM_STAT_SWEPT_EXPIRED, deleted - stale);
	idem_stats_add(IDEM_STAT_SWEPT_STALE, stale);
}
