/*
 * claim_many.c
 *		idem_claim_many: claim a consumer's whole batch of keys (one tenant)
 *		in one statement.
 *
 * Each key gets exactly the decision idem_claim (claim.c) would give it, in
 * input order; a key repeated in the array is claimed once and is
 * in_progress after that, as a second idem_claim in the same transaction
 * would be.  The fresh keys are inserted in bulk, 100 at a time, and
 * hold their key locks only while they are being inserted.  No
 * subtransaction is used: each one that inserts keeps its XID in the
 * backend's cache of 64 until the transaction ends, and a consumer's
 * transaction of a few 1000-key batches would overflow it, which slows
 * every snapshot taken in the server.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "claim.h"
#include "direct_read.h"
#include "held.h"
#include "idempotency.h"
#include "keylock.h"
#include "stats.h"
#include "store.h"
#include "store_attach.h"
#include "tokens.h"
#include "validate.h"

PG_FUNCTION_INFO_V1(idem_claim_many);

/* The largest batch. */
#define IDEM_CLAIM_MANY_MAX		1000

/*
 * A batch takes the key locks of its fresh keys this many at a time, each
 * group for the span of its INSERT only (see let_keys_go), so that
 * consumers' batches hardly take room in the shared lock table.
 */
#define IDEM_CLAIM_MANY_LOCKED_AT_ONCE	100

/* Deconstruct a one-dimensional text[] argument (NULL elements allowed). */
static int
text_array_arg(FunctionCallInfo fcinfo, int argno, const char *name,
			   Datum **elems, bool **nulls)
{
	ArrayType  *arr = PG_GETARG_ARRAYTYPE_P(argno);
	int			n;

	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a one-dimensional array", name)));
	n = ArrayGetNItems(ARR_NDIM(arr), ARR_DIMS(arr));
	if (n > IDEM_CLAIM_MANY_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("%s has too many elements", name),
				 errdetail("%s has %d elements; idem_claim_many takes at most %d.",
						   name, n, IDEM_CLAIM_MANY_MAX),
				 errhint("Split the batch.")));
	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, elems, nulls, &n);
	return n;
}

/*
 * Check one array element as an identifier, the way idem_arg_identifier
 * checks a scalar argument.
 */
static text *
element_identifier(Datum d, bool isnull, const char *name, int index,
				   bool required)
{
	Size		bytes;

	if (isnull)
	{
		if (required)
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s[%d] must not be null", name, index)));
		return NULL;
	}
	bytes = VARSIZE_ANY_EXHDR(DatumGetPointer(d));
	if (bytes == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s[%d] must not be empty", name, index)));
	if (bytes > IDEM_MAX_IDENTIFIER_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("%s[%d] is too long", name, index),
				 errdetail("It has %zu bytes; the limit is %d.",
						   bytes, IDEM_MAX_IDENTIFIER_BYTES)));
	return DatumGetTextPP(d);
}

/* One element of the batch. */
typedef struct BatchKey
{
	IdemKey		k;
	text	   *fingerprint;
	int			first;			/* index of the first element with this key */
	bool		found;			/* its record was read */
	IdemRecord	rec;
	bool		locked;			/* we hold its key lock */
	bool		lock_given_back;	/* locked for the INSERT, which it missed */
	bool		inserted;		/* claimed by the bulk insert */
	bool		has_row;		/* the probe found a row of it */
	bool		row_in_flight;	/* ... inserted by a transaction still running */
	bool		decided;		/* outcome known from its record */
	int64		token;			/* fresh token, when it goes to the bulk insert */
	IdemClaimResult res;
} BatchKey;

typedef struct Batch
{
	text	   *tenant_id;
	BatchKey   *keys;
	int			nkeys;
	int		   *sorted;			/* element indexes, sorted by key */
	IdemClaimArgs args;			/* fingerprint: set per element */
	Oid			token_sequence;
	TimestampTz now;
	TimestampTz lease_end;
} Batch;

static int
compare_text(text *a, text *b)
{
	int			la = VARSIZE_ANY_EXHDR(a);
	int			lb = VARSIZE_ANY_EXHDR(b);
	int			c = memcmp(VARDATA_ANY(a), VARDATA_ANY(b), Min(la, lb));

	return c != 0 ? c : la - lb;
}

static Batch *sort_batch;

static int
compare_elements(const void *a, const void *b)
{
	int			ia = *(const int *) a;
	int			ib = *(const int *) b;
	int			c = compare_text(sort_batch->keys[ia].k.key, sort_batch->keys[ib].k.key);

	return c != 0 ? c : ia - ib;
}

/* The first element of the batch with this key (binary search), or -1. */
static int
find_element(Batch *batch, text *key)
{
	int			lo = 0;
	int			hi = batch->nkeys - 1;

	while (lo <= hi)
	{
		int			mid = (lo + hi) / 2;
		int			c = compare_text(batch->keys[batch->sorted[mid]].k.key, key);

		if (c == 0)
			return batch->keys[batch->sorted[mid]].first;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return -1;
}

static void
record_inserted(void *arg, text *key)
{
	Batch	   *batch = (Batch *) arg;
	int			i = find_element(batch, key);

	if (i >= 0)
		batch->keys[i].inserted = true;
}

/* A text[] of the given texts. */
static Datum
text_array(text **items, int n)
{
	return PointerGetDatum(construct_array((Datum *) items, n, TEXTOID, -1,
										   false, TYPALIGN_INT));
}

/* The INSERT of a batch's locked keys (idem_store_insert_many). */
typedef struct FreshInsert
{
	text	   *tenant_id;
	Datum		keys;
	Datum		tokens;
	Datum		fps;
	TimestampTz now;
	TimestampTz lease_end;
	int64		ttl_us;
	bool		speculative;	/* ON CONFLICT DO NOTHING, or a plain INSERT */
	Batch	   *batch;
	int			from;			/* the elements of batch it covers */
	int			to;
} FreshInsert;

static uint64
insert_fresh(FreshInsert *f)
{
	return idem_store_insert_many(f->tenant_id, f->keys, f->tokens, f->fps, f->now,
								  f->lease_end, f->ttl_us, f->speculative,
								  record_inserted, f->batch);
}

/* A row of a locked key, found by the probe (idem_direct_probe_keys). */
static void
record_taken(void *arg, text *key, TransactionId inserter)
{
	Batch	   *batch = (Batch *) arg;
	int			i = find_element(batch, key);

	if (i < 0 || !batch->keys[i].locked)
		return;
	batch->keys[i].has_row = true;
	if (TransactionIdIsValid(inserter))
		batch->keys[i].row_in_flight = true;
}

/*
 * Leave out the locked keys among elements [from, to) that have a row,
 * found by a probe of the key index (what the INSERT's unique check would
 * find), one search for them all.  A row another batch in flight
 * inserted (it has no lock holder) makes its key in_progress; any other
 * row is read and decided later, as a key the INSERT missed.  Their locks
 * are given back.  Returns how many stay locked: those the INSERT can take
 * without a conflict.
 */
static int
leave_out_keys_taken(Batch *batch, int from, int to)
{
	int			locked = 0;
	int			n = 0;
	text	  **keys = palloc(sizeof(text *) * (to - from));
	IdemKeyProbe *probe = idem_direct_probe_begin();

	for (int i = from; i < to; i++)
		if (batch->keys[i].locked)
			keys[n++] = batch->keys[i].k.key;
	idem_direct_probe_keys(probe, batch->tenant_id, keys, n, record_taken, batch);
	idem_direct_probe_end(probe);
	pfree(keys);

	for (int i = from; i < to; i++)
	{
		BatchKey   *bk = &batch->keys[i];

		if (!bk->locked)
			continue;
		if (bk->has_row)
		{
			idem_keylock_release(&bk->k);
			bk->locked = false;
			bk->lock_given_back = !bk->row_in_flight;
		}
		else
			locked++;
	}
	return locked;
}

/*
 * The plain INSERT of keys the probe found free, without a subtransaction
 * (see the top of this file).  Every claimer inserts a key only under its
 * lock, which this batch holds, so only a record written around the lock
 * (directly into the table) can meet it: its unique violation becomes the
 * error a held claim reports for the same (held.c), and the transaction
 * rolls back.  So all n go in, and the INSERT returns none of them.
 */
static void
insert_free_keys(FreshInsert *f, int n)
{
	MemoryContext caller_context = CurrentMemoryContext;
	volatile uint64 inserted = 0;

	f->speculative = false;
	PG_TRY();
	{
		inserted = insert_fresh(f);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(caller_context);
		edata = CopyErrorData();
		if (edata->sqlerrcode != ERRCODE_UNIQUE_VIOLATION)
			PG_RE_THROW();
		/* the transaction is aborting: only the error it reports changes */
		FlushErrorState();
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_TOKEN_MISMATCH),
				 errmsg("claim of a key of the batch lost: another transaction stored a record for it"),
				 errdetail("%s The record was written without taking the key's lock (directly into the table).",
						   edata->detail ? edata->detail : ""),
				 errhint("This transaction is rolled back; the key's outcome belongs to the other record.")));
	}
	PG_END_TRY();

	if (inserted != (uint64) n)
		elog(ERROR, "INSERT of a batch's keys wrote " UINT64_FORMAT " rows of %d",
			 inserted, n);
	for (int i = f->from; i < f->to; i++)
		if (f->batch->keys[i].locked)
			f->batch->keys[i].inserted = true;
}

/*
 * On a table distributed by Citus, one single-row INSERT per key: Citus
 * miscounts the rows an INSERT ... SELECT returns through SPI, and a
 * single-row INSERT is routed to the tenant's shard like idem_claim's.
 */
static void
insert_each_fresh(FreshInsert *f)
{
	for (int i = f->from; i < f->to; i++)
	{
		BatchKey   *bk = &f->batch->keys[i];

		if (bk->locked)
			bk->inserted = idem_store_insert(&bk->k, bk->fingerprint, NULL,
											 bk->token, f->now, f->lease_end,
											 f->ttl_us);
	}
}

/*
 * Take the key lock of each free key among elements [from, to), without
 * waiting (a busy key is decided later: in_progress).  Returns how many
 * were locked.
 */
static int
lock_free_keys(Batch *batch, int from, int to)
{
	int			locked = 0;

	for (int i = from; i < to; i++)
	{
		BatchKey   *bk = &batch->keys[i];

		if (bk->first != i ||
			idem_keylock_try(&bk->k, 0) == IDEM_KEYLOCK_BUSY)
			continue;
		bk->locked = true;
		locked++;
	}
	return locked;
}

/*
 * Give the n locked keys among f's elements of the batch their tokens,
 * reserved at once, and point f at them.
 */
static void
set_insert_arrays(FreshInsert *f, int n)
{
	int64		token = idem_fresh_tokens(f->batch->token_sequence, f->now, n);
	text	  **keys = palloc(sizeof(text *) * n);
	text	  **fps = palloc(sizeof(text *) * n);
	bool	   *fp_isnull = palloc(sizeof(bool) * n);
	Datum	   *tokens = palloc(sizeof(Datum) * n);
	int			dims[1] = {n};
	int			lbs[1] = {1};
	int			j = 0;

	for (int i = f->from; i < f->to; i++)
	{
		BatchKey   *bk = &f->batch->keys[i];

		if (!bk->locked)
			continue;
		bk->token = token;
		token += 2;
		keys[j] = bk->k.key;
		fps[j] = bk->fingerprint;
		fp_isnull[j] = bk->fingerprint == NULL;
		tokens[j] = Int64GetDatum(bk->token);
		j++;
	}
	Assert(j == n);
	f->keys = text_array(keys, n);
	f->tokens = PointerGetDatum(construct_array(tokens, n, INT8OID, 8,
												FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	f->fps = PointerGetDatum(construct_md_array((Datum *) fps, fp_isnull, 1, dims, lbs,
												TEXTOID, -1, false, TYPALIGN_INT));
}

/*
 * Insert the n locked keys among elements [from, to) in one statement
 * (on a Citus table, one per key); marks those that went in.
 *
 * With lets_locks_go, batches give their key locks back after their INSERT,
 * so a key locked here may still have a row that another batch in flight
 * inserted, and an INSERT meeting it would wait for that transaction: each
 * locked key is probed in the key index first, and those with a row are
 * left out, so the INSERT of the rest needs neither ON CONFLICT nor a
 * subtransaction.  (Trying the INSERT under a short lock_timeout instead,
 * and probing only when it gave up, saved the probes, but PostgreSQL can
 * then turn the timeout's signal into a "canceling statement due to user
 * request" error in a later lock wait of the same statement.)  Without the
 * probe (no key index of ours), the INSERT is speculative.
 */
static void
insert_locked_keys(FreshInsert *f, int n, bool lets_locks_go)
{
	if (lets_locks_go)
	{
		n = leave_out_keys_taken(f->batch, f->from, f->to);
		if (n == 0)
			return;
	}
	set_insert_arrays(f, n);
	if (idem_store_distributed())
		insert_each_fresh(f);
	else if (lets_locks_go)
		insert_free_keys(f, n);
	else
	{
		f->speculative = true;
		(void) insert_fresh(f);
	}
}

/*
 * Give back the key locks taken for the INSERT among elements [from, to),
 * so that a batch holds at most IDEM_CLAIM_MANY_LOCKED_AT_ONCE key locks,
 * and only during its INSERT.  The rows inserted keep other claimers out
 * from now on (idem_direct_inserter).  A key the INSERT missed has a
 * record: it is read and decided later, or, when that record has expired,
 * claimed as idem_claim would, which takes the lock again.
 */
static void
let_keys_go(Batch *batch, int from, int to)
{
	for (int i = from; i < to; i++)
	{
		BatchKey   *bk = &batch->keys[i];

		if (!bk->locked)
			continue;
		idem_keylock_release(&bk->k);
		bk->locked = false;
		bk->lock_given_back = !bk->inserted;
	}
}

/*
 * Read and check every argument, into batch: nothing is claimed before a
 * bad element is refused.
 */
static void
batch_read_args(FunctionCallInfo fcinfo, Batch *batch)
{
	Datum	   *key_elems;
	bool	   *key_nulls;
	Datum	   *fp_elems = NULL;
	bool	   *fp_nulls = NULL;
	int			nkeys;

	batch->tenant_id = idem_arg_identifier(fcinfo, 0, "tenant_id", true);
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("keys must not be null")));
	nkeys = text_array_arg(fcinfo, 1, "keys", &key_elems, &key_nulls);
	if (!PG_ARGISNULL(2))
	{
		int			nfp = text_array_arg(fcinfo, 2, "fingerprints", &fp_elems, &fp_nulls);

		if (nfp != nkeys)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("fingerprints must have as many elements as keys"),
					 errdetail("keys has %d elements, fingerprints has %d.", nkeys, nfp)));
	}
	idem_claim_args(fcinfo, 3, 4, -1, &batch->args);

	batch->nkeys = nkeys;
	batch->keys = palloc0(sizeof(BatchKey) * Max(nkeys, 1));
	batch->sorted = palloc(sizeof(int) * Max(nkeys, 1));
	for (int i = 0; i < nkeys; i++)
	{
		BatchKey   *bk = &batch->keys[i];

		bk->k.tenant_id = batch->tenant_id;
		bk->k.key = element_identifier(key_elems[i], key_nulls[i], "keys", i + 1, true);
		bk->fingerprint = fp_elems == NULL ? NULL :
			element_identifier(fp_elems[i], fp_nulls[i], "fingerprints", i + 1, false);
		batch->sorted[i] = i;
	}
}

/* Find repeated keys: each element points at the first with its key. */
static void
batch_mark_repeats(Batch *batch)
{
	sort_batch = batch;
	qsort(batch->sorted, batch->nkeys, sizeof(int), compare_elements);
	for (int j = 0; j < batch->nkeys; j++)
	{
		int			i = batch->sorted[j];
		int			prev = j > 0 ? batch->sorted[j - 1] : -1;

		batch->keys[i].first = (prev >= 0 &&
								compare_text(batch->keys[prev].k.key, batch->keys[i].k.key) == 0)
			? batch->keys[prev].first : i;
	}
}

/*
 * Steps 1 and 2: the free keys go straight to the INSERT, a chunk at a
 * time where their key locks can be given back after it (a local table).
 */
static void
batch_insert_free_keys(Batch *batch)
{
	bool		lets_locks_go = idem_direct_probe_available();
	int			chunk = lets_locks_go ? IDEM_CLAIM_MANY_LOCKED_AT_ONCE : Max(batch->nkeys, 1);

	for (int from = 0; from < batch->nkeys; from += chunk)
	{
		FreshInsert f = {.tenant_id = batch->tenant_id, .now = batch->now,
			.lease_end = batch->lease_end, .ttl_us = batch->args.ttl_us, .batch = batch,
		.from = from, .to = Min(from + chunk, batch->nkeys)};
		int			locked = lock_free_keys(batch, f.from, f.to);

		if (locked > 0)
			insert_locked_keys(&f, locked, lets_locks_go);
		if (lets_locks_go)
			let_keys_go(batch, f.from, f.to);
	}
}

/*
 * Step 3: the keys that have a record (or whose lock another transaction
 * holds): decide from the record, as idem_claim would without waiting.
 */
static void
batch_decide_recorded(Batch *batch)
{
	for (int i = 0; i < batch->nkeys; i++)
	{
		BatchKey   *bk = &batch->keys[i];

		if (bk->first != i || bk->inserted)
			continue;
		batch->args.fingerprint = bk->fingerprint;
		bk->found = idem_store_read(&bk->k, &bk->rec, true);
		if (idem_claim_decide(bk->found ? &bk->rec : NULL, &batch->args, batch->now,
							  &bk->res))
			bk->decided = true;
		else if (!bk->locked && !bk->lock_given_back)
		{
			/* no usable record, and another transaction is on the key */
			bk->res.outcome = IDEM_OUTCOME_IN_PROGRESS;
			bk->decided = true;
		}
		if (bk->decided && bk->locked)
		{
			idem_keylock_release(&bk->k);
			bk->locked = false;
		}
	}
}

/*
 * Step 4 for one element: the answer of a key the INSERT claimed, or of the
 * rest (an expired record to take over, a key repeated in the batch) one by
 * one, as idem_claim would.
 */
static void
batch_settle_element(Batch *batch, int i)
{
	BatchKey   *bk = &batch->keys[i];

	batch->args.fingerprint = bk->fingerprint;
	if (bk->first == i && bk->inserted)
	{
		memset(&bk->res, 0, sizeof(bk->res));
		bk->res.outcome = IDEM_OUTCOME_CLAIMED;
		bk->res.token = bk->token;
		bk->res.response_isnull = true;
		bk->res.expires_at = batch->lease_end;
	}
	else if (bk->first != i || !bk->decided)
	{
		idem_claim_one(&bk->k, &batch->args, &bk->res);
		if (bk->locked && bk->res.outcome != IDEM_OUTCOME_CLAIMED &&
			!bk->res.stale_failed)
			idem_keylock_release(&bk->k);
	}
	idem_stats_count_claim(&bk->res);
}

/* Step 4: every element's answer, as a row, in the order of keys. */
static void
batch_emit_rows(Batch *batch, ReturnSetInfo *rsinfo)
{
	for (int i = 0; i < batch->nkeys; i++)
	{
		BatchKey   *bk = &batch->keys[i];
		Datum		values[7];
		bool		nulls[7];

		batch_settle_element(batch, i);
		values[0] = PointerGetDatum(bk->k.key);
		nulls[0] = false;
		idem_claim_result_columns(&bk->res, values + 1, nulls + 1,
								  Min(rsinfo->setDesc->natts, 7) - 1);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
}

/*
 * idem_claim_many(tenant_id, keys, fingerprints, lease, ttl)
 *		RETURNS SETOF (key, outcome, token, response, expires_at)
 *
 * One row per element of keys, in order.  All arguments are checked before
 * any key is claimed, so a bad element changes nothing.
 *
 * A batch of new keys costs one statement per 100 keys: every free key's
 * lock, then one INSERT of them all, then the locks are given back.  Keys
 * that turn out to have a record are read by primary key and decided as
 * idem_claim decides; only the rare keys that need more (an expired record
 * to take over, a key repeated in the batch) go through idem_claim_one,
 * exactly as idem_claim would.
 */
Datum
idem_claim_many(PG_FUNCTION_ARGS)
{
	Batch		batch;

	batch_read_args(fcinfo, &batch);
	idem_store_check_tenant(fcinfo, batch.tenant_id);
	batch_mark_repeats(&batch);
	InitMaterializedSRF(fcinfo, 0);

	/* held claims are written first: this reads more than one key */
	idem_held_write_all();
	idem_store_begin(fcinfo);

	batch.token_sequence = idem_store_token_sequence();
	batch.now = GetCurrentTimestamp();
	batch.lease_end = idem_add_duration(batch.now, batch.args.lease_us, "lease");
	batch_insert_free_keys(&batch);
	batch_decide_recorded(&batch);
	batch_emit_rows(&batch, (ReturnSetInfo *) fcinfo->resultinfo);
	idem_store_end();

	return (Datum) 0;
}
