/*
 * claim.c
 *		idem_claim: decide, for one delivery of a (tenant_id, key), whether
 *		the caller runs the work, replays a stored answer, or backs off.
 *
 * The fast paths cost one statement: a replay is a single primary-key read
 * (no write), a fresh key is a read that misses, plus one INSERT unless the
 * claim is only held until it settles (held.c).
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
#include "utils/lsyscache.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"
#include "utils/wait_event.h"

#include "claim.h"
#include "claim_sweep.h"
#include "direct_read.h"
#include "guc.h"
#include "held.h"
#include "idempotency.h"
#include "keylock.h"
#include "record.h"
#include "stats.h"
#include "store.h"
#include "store_attach.h"
#include "tokens.h"
#include "validate.h"

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

/*
 * May a claim with holder given re-enter a live claim held by stored?  Only
 * when both are set and equal, byte for byte: a claim made without a holder
 * can never be re-entered, and a claim without one never re-enters.
 */
static bool
holder_reenters(text *stored, text *given)
{
	return stored != NULL && given != NULL && idem_text_equal(stored, given);
}

/*
 * The answer to a re-entry of rec, a processing record whose lease is live:
 * claimed, with its own token and lease end (the lease is not extended: a
 * heartbeat does that), and its recovery point as a takeover would give it.
 * Nothing is written.
 */
static void
answer_reentered(IdemClaimResult *res, const IdemRecord *rec)
{
	res->outcome = IDEM_OUTCOME_CLAIMED;
	res->token = rec->token;
	res->token_isnull = false;
	res->expires_at = rec->lease_expires_at;
	res->expires_at_isnull = false;
	res->recovery_point = rec->recovery_point;
	res->state = rec->state;
	res->reentered = true;
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
 * (replay, failed, mismatch, in_progress, or claimed again by the holder of
 * a live claim); false when the claim must write: the key is absent, or its
 * record expired and may be taken over.
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

	if (idem_record_live_until(rec) > now)
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
		else if (holder_reenters(rec->holder, args->holder))
			answer_reentered(res, rec);
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
 * A claim of one key, as it goes through its steps: read the record,
 * decide from it, take the key lock, write.  Each step returns what comes
 * next.
 */
typedef enum ClaimNext
{
	CLAIM_DONE,					/* res holds the answer */
	CLAIM_WRITE,				/* go on to the next step */
	CLAIM_AGAIN,				/* read again: a wait went by, or the lock was
								 * just taken */
	CLAIM_CONFLICT				/* read again: the row changed under a write */
} ClaimNext;

typedef struct ClaimState
{
	const IdemKey *k;
	const IdemClaimArgs *args;
	IdemClaimResult *res;
	TimestampTz now;
	TimestampTz deadline;
	bool		have_lock;		/* the key lock is ours */
	bool		fresh;			/* read with a fresh snapshot */
	int			sleep_ms;		/* next poll while a lease runs */
	bool		found;
	IdemRecord	rec;
	FunctionCallInfo connect_for;	/* not yet connected to SPI: connect
									 * for this call before a statement */
} ClaimState;

/* An answer with no token, response or expiry yet. */
static void
clear_result(IdemClaimResult *res)
{
	memset(res, 0, sizeof(*res));
	res->token_isnull = true;
	res->response_isnull = true;
	res->expires_at_isnull = true;
}

/* The key is claimed by this call: token and lease end. */
static void
answer_claimed(IdemClaimResult *res, int64 token, TimestampTz lease_end)
{
	res->outcome = IDEM_OUTCOME_CLAIMED;
	res->token = token;
	res->token_isnull = false;
	res->expires_at = lease_end;
	res->expires_at_isnull = false;
}

/*
 * Start a claim.  Returns true when it is answered already: this
 * transaction holds an unwritten claim of the key, which answers as its
 * processing row would (idem_claim_decide: in progress while its lease
 * lasts, to its own holder claimed again).  Otherwise the claim reads first with the
 * statement's snapshot, as the SQL would, whether it will be held or not.
 */
static bool
claim_begin(ClaimState *st, const IdemKey *k, const IdemClaimArgs *args,
			IdemClaimResult *res)
{
	const IdemHeldClaim *held = idem_held_get(idem_held_find(k, 0));

	st->k = k;
	st->args = args;
	st->res = res;
	st->now = GetCurrentTimestamp();
	st->deadline = idem_add_duration(st->now, args->wait_us, "wait");
	st->have_lock = false;
	st->fresh = false;
	st->sleep_ms = IDEM_POLL_MIN_MS;

	if (held != NULL)
	{
		clear_result(res);
		if (fingerprint_differs(held->fingerprint, args->fingerprint))
			res->outcome = IDEM_OUTCOME_MISMATCH;
		else if (holder_reenters(held->holder, args->holder) &&
				 held->lease_expires_at > st->now)
		{
			/* as its processing row would answer: no recovery point yet */
			res->outcome = IDEM_OUTCOME_CLAIMED;
			res->token = held->token;
			res->token_isnull = false;
			res->expires_at = held->lease_expires_at;
			res->expires_at_isnull = false;
			res->reentered = true;
		}
		else
		{
			res->outcome = IDEM_OUTCOME_IN_PROGRESS;
			res->expires_at = held->lease_expires_at;
			res->expires_at_isnull = false;
		}
		return true;
	}
	return false;
}

/*
 * Connect to SPI for the call, if not yet (idem_claim_one_connecting): before
 * a statement is run, or a record written.
 */
static void
claim_connect(ClaimState *st)
{
	if (st->connect_for == NULL)
		return;
	idem_store_begin_attached(st->connect_for);
	st->connect_for = NULL;
}

/*
 * Read the record.  The first look uses the statement's snapshot; every
 * later one (the row changed, or a wait went by) needs what has committed
 * since.
 */
static void
claim_read(ClaimState *st)
{
	if (st->connect_for == NULL)
		st->found = idem_store_read(st->k, &st->rec, st->fresh);
	else if (!idem_direct_read(st->k, &st->rec, st->fresh, &st->found))
	{
		claim_connect(st);
		st->found = idem_store_read_statement(st->k, &st->rec, st->fresh);
	}
	st->fresh = true;
}

/*
 * Decide from the record, when that needs no write.  A live lease of
 * someone else's committed claim is waited out while the caller's wait
 * lasts.
 */
static ClaimNext
claim_decide(ClaimState *st)
{
	IdemRecord *rec = &st->rec;

	if (!idem_claim_decide(st->found ? rec : NULL, st->args, st->now, st->res))
		return CLAIM_WRITE;
	if (st->res->outcome == IDEM_OUTCOME_IN_PROGRESS && st->now < st->deadline &&
		idem_record_live_until(rec) > st->now &&
		!TransactionIdIsCurrentTransactionId(rec->xmin))
	{
		poll_sleep(&st->sleep_ms, st->deadline);
		return CLAIM_AGAIN;
	}
	return CLAIM_DONE;
}

/*
 * About to write: make sure no other transaction is mid-claim.  A lock
 * taken after a wait (the holder finished) means reading again.
 */
static ClaimNext
claim_lock(ClaimState *st)
{
	IdemKeyLockResult lr;

	if (st->have_lock)
		return CLAIM_WRITE;
	lr = idem_keylock_try(st->k, Max(st->deadline - st->now, 0));
	if (lr == IDEM_KEYLOCK_BUSY)
	{
		st->res->outcome = IDEM_OUTCOME_IN_PROGRESS;
		return CLAIM_DONE;
	}
	st->have_lock = true;
	return lr == IDEM_KEYLOCK_ACQUIRED_AFTER_WAIT ? CLAIM_AGAIN : CLAIM_WRITE;
}

/*
 * Write a fresh record (or hold it).  An idem_claim_many still in flight
 * inserted the key and gave its key lock back: in progress, as if its lock
 * were held.  A wait lets the key lock go first, so that the batch's own
 * settling of the key never waits on this claim.
 *
 * Whether the claim is held is decided here, when the key is known to be
 * free: a replay never pays for the checks.  A claim that will be held
 * writes nothing that could meet a record the statement's snapshot does
 * not show (one committed since), so it asks the key index what the
 * INSERT's unique check would find: a row there is the conflict the INSERT
 * would have met, and the claim reads again.
 */
static ClaimNext
claim_write_fresh(ClaimState *st)
{
	TransactionId inserter;
	bool		taken = idem_direct_key_taken(st->k, &inserter);
	bool		defer;
	int64		token;
	TimestampTz lease_end;

	if (TransactionIdIsValid(inserter))
	{
		idem_keylock_release(st->k);
		st->have_lock = false;
		if (st->now < st->deadline &&
			idem_keylock_wait_for_inserter(inserter, st->deadline - st->now))
			return CLAIM_AGAIN;
		st->res->outcome = IDEM_OUTCOME_IN_PROGRESS;
		return CLAIM_DONE;
	}
	defer = st->args->may_defer && idem_direct_probe_available() &&
		idem_held_allowed(idem_store_table());
	if (taken && defer)
		return CLAIM_CONFLICT;
	token = idem_fresh_token(idem_store_token_sequence(), st->now);
	lease_end = idem_add_duration(st->now, st->args->lease_us, "lease");
	if (!(defer &&
		  idem_held_add(st->k, st->args->fingerprint, st->args->holder, token,
						st->now, lease_end, st->args->ttl_us)) &&
		!idem_store_insert(st->k, st->args->fingerprint, st->args->holder, token,
						   st->now, lease_end, st->args->ttl_us))
		return CLAIM_CONFLICT;
	answer_claimed(st->res, token, lease_end);
	st->res->fresh = true;
	return CLAIM_DONE;
}

/* Turn a stale claim into a failed record (idempotency.stale_action). */
static ClaimNext
claim_write_failed(ClaimState *st)
{
	IdemRecord	failed;
	IdemClaimResult *res = st->res;

	if (!idem_store_fail_stale(st->k, st->rec.token, st->now, &failed))
		return CLAIM_CONFLICT;
	res->outcome = IDEM_OUTCOME_FAILED;
	res->response = failed.response;
	res->response_isnull = failed.response_isnull;
	res->expires_at = failed.expires_at;
	res->expires_at_isnull = false;
	res->stale_failed = true;
	return CLAIM_DONE;
}

/*
 * Take an expired record over: a new lifetime after retention, or a stale
 * claim's key, resumed where the last holder's checkpoint says.  The new
 * claimant's holder replaces the old one (NULL if it gave none), whoever
 * it is: the old token stays fenced even when the same holder takes over.
 */
static ClaimNext
claim_write_takeover(ClaimState *st)
{
	IdemRecord *rec = &st->rec;
	bool		new_lifetime = rec->status != IDEM_PROCESSING;
	TimestampTz lease_end = idem_add_duration(st->now, st->args->lease_us, "lease");
	int64		token = idem_successor_token(idem_store_token_sequence(),
											 st->now, rec->token);

	if (!idem_store_take_over(st->k, rec->token, token, st->args->fingerprint,
							  st->args->holder, new_lifetime, st->now,
							  lease_end, st->args->ttl_us))
		return CLAIM_CONFLICT;
	answer_claimed(st->res, token, lease_end);
	st->res->took_over = !new_lifetime;
	if (!new_lifetime)
	{
		st->res->recovery_point = rec->recovery_point;
		st->res->state = rec->state;
	}
	return CLAIM_DONE;
}

static ClaimNext
claim_write(ClaimState *st)
{
	if (!st->found)
		return claim_write_fresh(st);
	/* a recovery point is resumed, whatever stale_action says */
	if (st->rec.status == IDEM_PROCESSING && st->rec.recovery_point == NULL &&
		idem_stale_action == IDEM_STALE_FAIL)
		return claim_write_failed(st);
	return claim_write_takeover(st);
}

/*
 * A claim that wrote nothing gives the key lock back at once, so that it
 * does not make later claims report in_progress.  One that wrote (a claim,
 * or a stale claim turned into failed) keeps it until its transaction ends:
 * its row is uncommitted, and a later claim must see the lock and answer
 * in_progress rather than wait on that row.  A re-entry wrote nothing,
 * though it answers claimed (it can hold the lock after a wait).
 */
static void
claim_end(ClaimState *st)
{
	if (st->have_lock &&
		(st->res->outcome != IDEM_OUTCOME_CLAIMED || st->res->reentered) &&
		!st->res->stale_failed)
		idem_keylock_release(st->k);
}

/*
 * Claim one key: read, decide, lock, write, until one of them answers.
 * Only a write that finds the row changed counts as a conflict; a wait that
 * went by, or the lock just taken, reads again for free.  The caller has
 * validated the arguments.  connect_for: NULL when the caller is
 * connected to SPI; else the call to connect for when a statement must be
 * run (claim_connect).  Returns whether it is connected.
 */
static bool
claim_run(const IdemKey *k, const IdemClaimArgs *args, IdemClaimResult *res,
		  FunctionCallInfo connect_for)
{
	ClaimState	st;
	int			conflicts = 0;

	st.connect_for = connect_for;
	if (claim_begin(&st, k, args, res))
	{
		/* our own held claim: in progress or mismatch, a conflict */
		if (!res->reentered)
			idem_stats_count_tenant_conflict(k->tenant_id);
		return st.connect_for == NULL;
	}
	for (;;)
	{
		ClaimNext	next;

		CHECK_FOR_INTERRUPTS();
		if (conflicts >= IDEM_CLAIM_MAX_ATTEMPTS)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not claim key because its record keeps changing"),
					 errhint("Retry the transaction.")));
		claim_read(&st);
		next = claim_decide(&st);
		if (next == CLAIM_WRITE)
			next = claim_lock(&st);
		if (next == CLAIM_WRITE)
		{
			claim_connect(&st);
			next = claim_write(&st);
		}
		if (next == CLAIM_DONE)
			break;
		if (next == CLAIM_CONFLICT)
			conflicts++;
		st.now = GetCurrentTimestamp();
	}
	claim_end(&st);
	/* per tenant, the answers that tell of a conflict (stats.c) */
	if (res->outcome == IDEM_OUTCOME_IN_PROGRESS || res->outcome == IDEM_OUTCOME_MISMATCH)
		idem_stats_count_tenant_conflict(k->tenant_id);
	return st.connect_for == NULL;
}

/*
 * Claim one key, for a caller connected through idem_store_begin().
 * Shared with idem_claim_many.
 */
void
idem_claim_one(const IdemKey *k, const IdemClaimArgs *args, IdemClaimResult *res)
{
	(void) claim_run(k, args, res, NULL);
}

/*
 * Claim one key for idem_claim's call fcinfo, whose table
 * idem_store_check_tenant has attached: it connects to SPI
 * (idem_store_begin_attached) only when it runs a statement or writes.  A
 * replay that the direct read answers never does, and saves the connection
 * (SPI_connect and SPI_finish: 470 instructions).  Until then what it
 * allocates (the record read) is in the caller's memory, where the result
 * row is made.  Returns whether it connected: then the caller ends the call
 * with idem_store_end().
 */
bool
idem_claim_one_connecting(FunctionCallInfo fcinfo, const IdemKey *k,
						  const IdemClaimArgs *args, IdemClaimResult *res)
{
	return claim_run(k, args, res, fcinfo);
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
	args->holder = NULL;
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

	/*
	 * A call planned before ALTER EXTENSION idempotency UPDATE dropped and
	 * created idem_claim again (1.4) can run after that commits, when its
	 * function is gone: the row type is the one the call expression names.
	 */
	if (!SearchSysCacheExists1(PROCOID, ObjectIdGetDatum(fcinfo->flinfo->fn_oid)) &&
		OidIsValid(desc_type = get_fn_expr_rettype(fcinfo->flinfo)) &&
		type_is_rowtype(desc_type) && desc_type != RECORDOID)
		built = lookup_rowtype_tupdesc_copy(desc_type, -1);
	else if (get_call_result_type(fcinfo, &desc_type, &built) != TYPEFUNC_COMPOSITE)
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
 * A holder was given, and the table has no holder column: the objects are
 * those of 1.3 or older (the 1.4 library before ALTER EXTENSION UPDATE
 * offers no holder argument), or the column was dropped.
 */
static void
check_holder_column(const IdemClaimArgs *args)
{
	if (args->holder != NULL && !idem_store_has_holder())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"idempotency_records\" has no column \"holder\""),
				 errdetail("A claim with a holder stores it in that column, which version 1.4 of the extension adds."),
				 errhint("Run ALTER EXTENSION idempotency UPDATE, or restore the column if it was dropped.")));
}

/*
 * idem_claim(tenant_id, key, fingerprint, lease, ttl, wait, holder)
 *		RETURNS (outcome, token, response, expires_at, recovery_point, state)
 *
 * holder from 1.4 on (a 1.3 function passes six arguments).
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
	bool		connected;

	k.tenant_id = idem_arg_identifier(fcinfo, 0, "tenant_id", true);
	k.key = idem_arg_identifier(fcinfo, 1, "key", true);
	args.fingerprint = idem_arg_identifier(fcinfo, 2, "fingerprint", false);
	idem_claim_args(fcinfo, 3, 4, 5, &args);
	args.may_defer = true;
	if (PG_NARGS() > 6)
		args.holder = idem_arg_identifier(fcinfo, 6, "holder", false);

	idem_store_check_tenant(fcinfo, k.tenant_id);	/* attaches the table */
	check_holder_column(&args);
	connected = idem_claim_one_connecting(fcinfo, &k, &args, &res);
	/* one test of an integer when off (idem_claim_many never sweeps) */
	if (idem_claim_sweep > 0 && res.fresh)
	{
		Assert(connected);		/* it wrote */
		idem_claim_sweep_neighbours(&k, idem_claim_sweep);
	}
	idem_stats_count_claim(&res);

	/*
	 * The row type now, not when the call began: the claim may have waited
	 * for ALTER EXTENSION idempotency UPDATE to commit a new one.
	 */
	desc = row_expected_by_caller(fcinfo, claim_result_desc(fcinfo));

	/* the response may point into SPI memory: build the row before letting go */
	old = MemoryContextSwitchTo(caller);
	idem_claim_result_columns(&res, values, nulls, Min(desc->natts, 6));
	result = HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
	MemoryContextSwitchTo(old);
	if (connected)
		idem_store_end();

	PG_RETURN_DATUM(result);
}
