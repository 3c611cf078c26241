/*
 * claim.c
 *		idem_claim: decide, for one delivery of a (tenant_id, key), whether
 *		the caller runs the work, replays a stored answer, or backs off.
 *
 * The fast paths cost one statement: a replay is a single primary-key read
 * (no write), a fresh key is a read that misses, plus one INSERT unless the
 * claim is only held until it settles (pending.c).
 * Only a conflict or an expired record takes more, through a loop that
 * re-reads with a fresh snapshot until the row settles.
 *
 * Who wins is decided by the primary key alone: INSERT ... ON CONFLICT DO
 * NOTHING for a fresh key, an UPDATE guarded by the old token and expiry for
 * a takeover.  Neither can raise a unique violation into the caller's
 * transaction.  The per-key advisory lock (keylock.c) only lets a claim see
 * an uncommitted claim of another transaction without waiting for it.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"
#include "utils/wait_event.h"

#include "idempotency.h"

PG_FUNCTION_INFO_V1(idem_claim);

/*
 * A claim loops only when the row changed under it; each turn sees a newer
 * committed state.  Far more turns than this means something is rewriting
 * the key continuously, and the caller should retry the transaction.
 */
#define IDEM_CLAIM_MAX_ATTEMPTS	100

/* Polling bounds while waiting for a committed lease to end. */
#define IDEM_POLL_MIN_MS	1
#define IDEM_POLL_MAX_MS	50

static const char *const outcome_names[] = {
	[IDEM_OUTCOME_CLAIMED] = "claimed",
	[IDEM_OUTCOME_REPLAY] = "replay",
	[IDEM_OUTCOME_FAILED] = "failed",
	[IDEM_OUTCOME_IN_PROGRESS] = "in_progress",
	[IDEM_OUTCOME_MISMATCH] = "mismatch",
};

const char *
idem_outcome_name(IdemOutcome outcome)
{
	return outcome_names[outcome];
}

/* A different non-NULL fingerprint on both sides. */
static bool
fingerprint_differs(text *stored, text *given)
{
	return stored != NULL && given != NULL && !idem_text_equal(stored, given);
}

/* Sleep a little while waiting for a committed lease; cancellable. */
static void
poll_sleep(int *sleep_ms, TimestampTz deadline)
{
	long		left_ms = TimestampDifferenceMilliseconds(GetCurrentTimestamp(),
														  deadline);
	long		ms = Min((long) *sleep_ms, left_ms);

	if (ms > 0)
	{
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
	CHECK_FOR_INTERRUPTS();
	*sleep_ms = Min(*sleep_ms * 2, IDEM_POLL_MAX_MS);
}

/*
 * Decide a claim from what is read, when that needs no write: rec is the
 * record as read (NULL when there is none).  Returns true with res set
 * (replay, failed, mismatch, in_progress); false when the claim must write:
 * the key is absent, or its record expired and may be taken over.
 */
bool
idem_claim_decide(const IdemRecord *rec, const IdemClaimArgs *args,
				  TimestampTz now, IdemClaimResult *res)
{
	memset(res, 0, sizeof(*res));
	res->token_isnull = true;
	res->response_isnull = true;
	res->expires_at_isnull = true;

	if (rec == NULL)
		return false;

	if (rec->expires_at > now)
	{
		if (fingerprint_differs(rec->fingerprint, args->fingerprint))
			res->outcome = IDEM_OUTCOME_MISMATCH;
		else if (rec->status != IDEM_PROCESSING)
		{
			res->outcome = rec->status == IDEM_COMPLETED ?
				IDEM_OUTCOME_REPLAY : IDEM_OUTCOME_FAILED;
			res->response = rec->response;
			res->response_isnull = rec->response_isnull;
			res->expires_at = rec->expires_at;
			res->expires_at_isnull = false;
		}
		else
		{
			/* a committed claim (or our own) holds a live lease */
			res->outcome = IDEM_OUTCOME_IN_PROGRESS;
			res->expires_at = rec->lease_expires_at;
			res->expires_at_isnull = false;
		}
		return true;
	}

	if (rec->status == IDEM_PROCESSING)
	{
		/* a stale claim still belongs to its request */
		if (fingerprint_differs(rec->fingerprint, args->fingerprint))
		{
			res->outcome = IDEM_OUTCOME_MISMATCH;
			return true;
		}
		/* our own transaction outlived its lease: still ours, not a new claim */
		if (TransactionIdIsCurrentTransactionId(rec->xmin))
		{
			res->outcome = IDEM_OUTCOME_IN_PROGRESS;
			res->expires_at = rec->lease_expires_at;
			res->expires_at_isnull = false;
			return true;
		}
	}
	return false;
}

/*
 * Claim one key.  The caller has validated the arguments and is connected
 * through idem_store_begin().  Shared with idem_claim_many.
 */
void
idem_claim_one(const IdemKey *k, const IdemClaimArgs *args, IdemClaimResult *res)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz deadline = idem_add_duration(now, args->wait_us, "wait");
	IdemPendingClaim *pending = idem_pending_find(k);
	bool		defer;
	bool		have_lock = false;
	bool		fresh = false;
	int			sleep_ms = IDEM_POLL_MIN_MS;

	/* this transaction claimed the key already and has not written it yet */
	if (pending != NULL)
	{
		memset(res, 0, sizeof(*res));
		res->token_isnull = true;
		res->response_isnull = true;
		if (fingerprint_differs(pending->fingerprint, args->fingerprint))
		{
			res->outcome = IDEM_OUTCOME_MISMATCH;
			res->expires_at_isnull = true;
		}
		else
		{
			res->outcome = IDEM_OUTCOME_IN_PROGRESS;
			res->expires_at = pending->lease_expires_at;
		}
		return;
	}

	/*
	 * A fresh claim that will only be held (pending.c) writes nothing
	 * that could collide with a concurrent claim, so it must know there is
	 * none: it takes the key lock first, then reads with a snapshot taken
	 * after the lock, which sees every record whose writer has let go.
	 */
	defer = args->may_defer && idem_pending_allowed(idem_store_table());
	if (defer)
	{
		have_lock = idem_keylock_acquire(k, 0) == IDEM_KEYLOCK_ACQUIRED;
		fresh = true;
	}

	for (int conflicts = 0;; conflicts++)
	{
		IdemRecord	rec;
		bool		found;

		if (conflicts >= IDEM_CLAIM_MAX_ATTEMPTS)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not claim key because its record keeps changing"),
					 errhint("Retry the transaction.")));

		/*
		 * The first look uses the statement's snapshot; every later one (the
		 * row changed, or a wait went by) needs what has committed since.
		 */
		found = idem_store_read(k, &rec, fresh);
		fresh = true;

		if (idem_claim_decide(found ? &rec : NULL, args, now, res))
		{
			/* a committed claim of someone else holds a live lease: wait? */
			if (res->outcome == IDEM_OUTCOME_IN_PROGRESS && now < deadline &&
				rec.expires_at > now &&
				!TransactionIdIsCurrentTransactionId(rec.xmin))
			{
				poll_sleep(&sleep_ms, deadline);
				now = GetCurrentTimestamp();
				conflicts--;
				continue;
			}
			break;
		}

		/* About to write: make sure no other transaction is mid-claim. */
		if (!have_lock)
		{
			int64		wait_left = Max(deadline - now, 0);
			IdemKeyLockResult lr = idem_keylock_acquire(k, wait_left);

			if (lr == IDEM_KEYLOCK_BUSY)
			{
				res->outcome = IDEM_OUTCOME_IN_PROGRESS;
				break;
			}
			have_lock = true;
			if (lr == IDEM_KEYLOCK_ACQUIRED_AFTER_WAIT || defer)
			{
				/*
				 * The holder finished while we waited, or (a claim that will
				 * be held) since we read: look again.
				 */
				now = GetCurrentTimestamp();
				conflicts--;
				continue;
			}
		}

		if (!found)
		{
			TransactionId inserter = idem_direct_inserter(k);
			int64		token;
			TimestampTz lease_end;

			/*
			 * An idem_claim_many still in flight inserted the key and gave
			 * its key lock back: in progress, as if its lock were held.  A
			 * wait lets the key lock go first, so that the batch's own
			 * settling of the key never waits on this claim.
			 */
			if (TransactionIdIsValid(inserter))
			{
				idem_keylock_release(k);
				have_lock = false;
				if (now < deadline &&
					idem_keylock_wait_for_inserter(inserter, deadline - now))
				{
					now = GetCurrentTimestamp();
					conflicts--;
					continue;
				}
				res->outcome = IDEM_OUTCOME_IN_PROGRESS;
				break;
			}
			token = idem_fresh_token(idem_store_token_sequence(), now);
			lease_end = idem_add_duration(now, args->lease_us, "lease");

			if (defer)
				idem_pending_add(k, args->fingerprint, token, now, lease_end,
								 args->ttl_us);
			if (defer ||
				idem_store_insert(k, args->fingerprint, token, now, lease_end,
								  args->ttl_us))
			{
				res->outcome = IDEM_OUTCOME_CLAIMED;
				res->token = token;
				res->token_isnull = false;
				res->expires_at = lease_end;
				res->expires_at_isnull = false;
				break;
			}
		}
		else if (rec.status == IDEM_PROCESSING &&
				 idem_stale_action == IDEM_STALE_FAIL)
		{
			IdemRecord	failed;

			if (idem_store_fail_stale(k, rec.token, now, &failed))
			{
				res->outcome = IDEM_OUTCOME_FAILED;
				res->response = failed.response;
				res->response_isnull = failed.response_isnull;
				res->expires_at = failed.expires_at;
				res->expires_at_isnull = false;
				res->stale_failed = true;
				break;
			}
		}
		else
		{
			bool		new_lifetime = rec.status != IDEM_PROCESSING;
			TimestampTz lease_end = idem_add_duration(now, args->lease_us, "lease");
			int64		token = idem_successor_token(idem_store_token_sequence(),
													 now, rec.token);

			if (idem_store_take_over(k, rec.token, token, args->fingerprint,
									 new_lifetime, now, lease_end, args->ttl_us))
			{
				res->outcome = IDEM_OUTCOME_CLAIMED;
				res->token = token;
				res->token_isnull = false;
				res->expires_at = lease_end;
				res->expires_at_isnull = false;
				res->took_over = !new_lifetime;
				/* resume where the last holder's checkpoint says */
				if (!new_lifetime)
				{
					res->recovery_point = rec.recovery_point;
					res->state = rec.state;
				}
				break;
			}
		}

		/* the row changed since we read it: read again with a new snapshot */
		now = GetCurrentTimestamp();
	}

	/*
	 * A claim that wrote nothing gives the key lock back at once, so that it
	 * does not make later claims report in_progress.  One that wrote (a
	 * claim, or a stale claim turned into failed) keeps it until its
	 * transaction ends: its row is uncommitted, and a later claim must see
	 * the lock and answer in_progress rather than wait on that row.
	 */
	if (have_lock && res->outcome != IDEM_OUTCOME_CLAIMED && !res->stale_failed)
		idem_keylock_release(k);
}

/*
 * The (outcome, token, response, expires_at, recovery_point, state)
 * columns of a claim's result, shared by idem_claim and idem_claim_many:
 * the first four with the 1.0 objects, all six from 1.1 on.
 */
void
idem_claim_result_columns(const IdemClaimResult *res, Datum *values, bool *nulls,
						  int ncolumns)
{
	values[0] = CStringGetTextDatum(idem_outcome_name(res->outcome));
	nulls[0] = false;
	values[1] = Int64GetDatum(res->token);
	nulls[1] = res->token_isnull;
	values[2] = res->response;
	nulls[2] = res->response_isnull;
	values[3] = TimestampTzGetDatum(res->expires_at);
	nulls[3] = res->expires_at_isnull;
	if (ncolumns < 6)
		return;
	values[4] = PointerGetDatum(res->recovery_point);
	nulls[4] = res->recovery_point == NULL;
	values[5] = res->state;
	nulls[5] = res->state == (Datum) 0;
}

/*
 * Read and check idem_claim's arguments (shared with idem_claim_many for
 * lease, ttl and wait).
 */
void
idem_claim_args(FunctionCallInfo fcinfo, int lease_arg, int ttl_arg,
				int wait_arg, IdemClaimArgs *args)
{
	args->lease_us = idem_arg_duration(fcinfo, lease_arg, "lease",
									   (int64) idem_default_lease_ms * 1000, false);
	args->ttl_us = idem_arg_duration(fcinfo, ttl_arg, "ttl",
									 (int64) idem_default_ttl_s * USECS_PER_SEC, false);
	args->wait_us = wait_arg < 0 ? 0 :
		idem_arg_duration(fcinfo, wait_arg, "wait", 0, true);
	idem_check_ttl_floor(args->ttl_us);
	args->may_defer = false;
}

/*
 * The descriptor of idem_claim's result row, built once per backend (an
 * FmgrInfo, and so fn_extra, lasts only one execution of a prepared
 * statement), and again if the function is created anew or its row type
 * changes (ALTER EXTENSION idempotency UPDATE adds two columns).
 */
static TupleDesc
claim_result_desc(FunctionCallInfo fcinfo)
{
	static TupleDesc desc = NULL;
	static Oid	desc_fn_oid = InvalidOid;
	static Oid	desc_type = InvalidOid;
	static uint64 desc_identifier = 0;
	TypeCacheEntry *type;
	TupleDesc	built;
	MemoryContext old;

	if (desc != NULL && desc_fn_oid == fcinfo->flinfo->fn_oid)
	{
		type = lookup_type_cache(desc_type, TYPECACHE_TUPDESC);
		if (type->tupDesc_identifier == desc_identifier)
			return desc;
	}

	if (get_call_result_type(fcinfo, &desc_type, &built) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "idem_claim must return a composite type");
	type = lookup_type_cache(desc_type, TYPECACHE_TUPDESC);
	old = MemoryContextSwitchTo(TopMemoryContext);
	if (desc != NULL)
		FreeTupleDesc(desc);
	desc = BlessTupleDesc(CreateTupleDescCopy(built));
	desc_fn_oid = fcinfo->flinfo->fn_oid;
	desc_identifier = type->tupDesc_identifier;
	MemoryContextSwitchTo(old);
	return desc;
}

/*
 * A query planned before ALTER EXTENSION idempotency UPDATE added the two
 * recovery point columns to idem_claim's row type still expects the four of
 * 1.0 (in FROM, where it says so): give it those, as an anonymous record
 * (a row of the named type would be read with the type's new columns).
 */
static TupleDesc
row_expected_by_caller(FunctionCallInfo fcinfo, TupleDesc desc)
{
	static TupleDesc four_columns = NULL;
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	MemoryContext old;

	if (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo) ||
		rsinfo->expectedDesc == NULL ||
		rsinfo->expectedDesc->natts >= desc->natts || desc->natts < 4)
		return desc;
	if (four_columns == NULL)
	{
		old = MemoryContextSwitchTo(TopMemoryContext);
		four_columns = CreateTemplateTupleDesc(4);
		for (int i = 0; i < 4; i++)
			TupleDescCopyEntry(four_columns, i + 1, desc, i + 1);
		four_columns = BlessTupleDesc(four_columns);
		MemoryContextSwitchTo(old);
	}
	return four_columns;
}

/*
 * idem_claim(tenant_id, key, fingerprint, lease, ttl, wait)
 *		RETURNS (outcome, token, response, expires_at)
 */
Datum
idem_claim(PG_FUNCTION_ARGS)
{
	IdemKey		k;
	IdemClaimArgs args;
	IdemClaimResult res;
	TupleDesc	desc;
	Datum		values[6];
	bool		nulls[6];
	MemoryContext caller = CurrentMemoryContext;
	MemoryContext old;
	Datum		result;

	k.tenant_id = idem_arg_identifier(fcinfo, 0, "tenant_id", true);
	k.key = idem_arg_identifier(fcinfo, 1, "key", true);
	args.fingerprint = idem_arg_identifier(fcinfo, 2, "fingerprint", false);
	idem_claim_args(fcinfo, 3, 4, 5, &args);
	args.may_defer = true;


	idem_store_begin(fcinfo);
	idem_claim_one(&k, &args, &res);
	idem_stats_count_claim(&res);

	/*
	 * The row type now, not when the call began: the claim may have waited
	 * for ALTER EXTENSION idempotency UPDATE to commit a new one.
	 */
	desc = row_expected_by_caller(fcinfo, claim_result_desc(fcinfo));

	/* the response points into SPI memory: build the row before letting go */
	old = MemoryContextSwitchTo(caller);
	idem_claim_result_columns(&res, values, nulls, Min(desc->natts, 6));
	result = HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
	MemoryContextSwitchTo(old);
	idem_store_end();

	PG_RETURN_DATUM(result);
}
