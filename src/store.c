/*
 * store.c
 *		The statements of one key on idempotency_records: read, insert,
 *		take over, settle, checkpoint, forget.
 *
 * Each runs one statement of the catalogue (statements.c) through
 * store_attach.c, which has attached the table, with "now" passed in by
 * the caller; each targets one (tenant_id, key), on the key's shard when
 * shard_route.c says it is on this node.  A read goes the replay fast path
 * first (direct_read.c).  Held claims (held.c) and the entry points call
 * this file.
 */
#include "postgres.h"

#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"

#include "direct_read.h"
#include "idempotency.h"
#include "record.h"
#include "statements.h"
#include "store.h"
#include "store_attach.h"
#include "validate.h"

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
	d = SPI_getbinval(tup, desc, c + 11, &isnull);
	rec->holder = isnull ? NULL : (text *) DatumGetPointer(varlena_in_place(d));
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
 * Read by primary key directly where that sees what the statement would
 * (direct_read.c), else through the statement.
 */
bool
idem_store_read(const IdemKey *k, IdemRecord *rec, bool fresh_snapshot)
{
	bool		found;

	if (idem_direct_read(k, rec, fresh_snapshot, &found))
		return found;
	return idem_store_read_statement(k, rec, fresh_snapshot);
}

/*
 * idem_store_read through the statement (Q_READ), for a caller connected to
 * SPI.
 *
 * The tuple table is freed at once, its values copied out first: a claim
 * that waits reads again on every poll, and the tables would otherwise pile
 * up until idem_store_end() (about 8 kB a poll, 20 polls a second).
 */
bool
idem_store_read_statement(const IdemKey *k, IdemRecord *rec, bool fresh_snapshot)
{
	Datum		values[2] = {PointerGetDatum(k->tenant_id), PointerGetDatum(k->key)};
	bool		found;

	found = idem_store_run(Q_READ, values, "  ", !fresh_snapshot, 1) > 0;
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
		rec->holder = copy_out_of_tuple(tup, rec->holder);
	}
	SPI_freetuptable(SPI_tuptable);
	return found;
}

/*
 * Insert fresh processing records for a batch of keys (keys text[],
 * tokens bigint[], fingerprints text[] of the same length).  With
 * speculative insertion, inserted(arg, key) is called with each key that
 * went in; the others exist already.  Without it every key goes in, or an
 * existing key raises a unique violation (claim_many.c makes it the
 * lost-claim error, ID002), and inserted is not called: the INSERT returns
 * nothing, which saves a row per key.  Returns how many went in.
 */
uint64
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
	n = idem_store_run(speculative ? Q_INSERT_MANY : Q_INSERT_MANY_PLAIN, values,
				  "       ", false, 0);
	if (!speculative)
		return n;

	for (uint64 i = 0; i < n; i++)
	{
		bool		isnull;
		Datum		key = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
										1, &isnull);

		inserted(arg, (text *) DatumGetPointer(key));
	}
	return n;
}

/*
 * Insert a fresh processing record.  Returns false when the key exists (a
 * conflict never raises a unique violation into the caller's transaction).
 * holder (or NULL) is stored where the table has the column (1.4).
 */
bool
idem_store_insert(const IdemKey *k, text *fingerprint, text *holder,
				  int64 token, TimestampTz now, TimestampTz lease_expires_at,
				  int64 ttl_us)
{
	Datum		values[8];
	char		nulls[9] = "        ";

	values[0] = PointerGetDatum(k->tenant_id);
	values[1] = PointerGetDatum(k->key);
	values[2] = Int64GetDatum(token);
	values[3] = TimestampTzGetDatum(lease_expires_at);
	values[4] = TimestampTzGetDatum(now);
	values[5] = interval_datum(ttl_us);
	values[6] = PointerGetDatum(fingerprint);
	nulls[6] = fingerprint ? ' ' : 'n';
	values[7] = PointerGetDatum(holder);
	nulls[7] = holder ? ' ' : 'n';

	return idem_store_run(Q_INSERT, values, nulls, false, 0) == 1;
}

/*
 * Give an expired record (stale claim, or retention over) to a new claim
 * with token new_token and holder (or NULL): processing, new lease.  Fails
 * (returns false) if the record changed since it was read.
 */
bool
idem_store_take_over(const IdemKey *k, int64 old_token, int64 new_token,
					 text *fingerprint, text *holder, bool new_lifetime,
					 TimestampTz now, TimestampTz lease_expires_at, int64 ttl_us)
{
	Datum		values[10];
	char		nulls[11] = "          ";

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
	values[9] = PointerGetDatum(holder);
	nulls[9] = holder ? ' ' : 'n';

	return idem_store_run(Q_TAKE_OVER, values, nulls, false, 0) == 1;
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

	if (idem_store_run(Q_FAIL_STALE, values, "     ", false, 0) != 1)
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

	return idem_store_run(Q_FINISH, values, nulls, false, 0) == 1;
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
	return idem_store_run(Q_DELETE_CLAIM, values, "   ", false, 0) == 1;
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

	if (!idem_store_has_checkpoints())
		return false;
	values[0] = PointerGetDatum(k->tenant_id);
	values[1] = PointerGetDatum(k->key);
	values[2] = Int64GetDatum(token);
	values[3] = Int64GetDatum(new_token);
	values[4] = TimestampTzGetDatum(now);
	return idem_store_run(Q_HAND_ON, values, "     ", false, 0) == 1;
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

	return idem_store_run(Q_CHECKPOINT, values, nulls, false, 0) == 1;
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

	return idem_store_run(Q_EXTEND_LEASE, values, "     ", false, 0) == 1;
}

bool
idem_store_forget(const IdemKey *k)
{
	Datum		values[2] = {PointerGetDatum(k->tenant_id), PointerGetDatum(k->key)};

	return idem_store_run(Q_FORGET, values, "  ", false, 0) == 1;
}
