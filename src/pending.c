/*
 * pending.c
 *		Fresh claims held in memory and written once, when they settle.
 *
 * In the usual pattern (BEGIN, claim, business writes, complete, COMMIT)
 * the processing row a claim inserts is never seen by anyone but its own
 * transaction: other transactions learn that the key is taken from the key
 * lock (keylock.c), not from the uncommitted row.  So a fresh claim may only
 * take the key lock and be held here; idem_complete (or idem_release with a
 * failure) then inserts the finished record in one INSERT, instead of an
 * INSERT followed by an UPDATE that writes a second row version and new
 * index entries.  idem_release without a failure writes nothing (unless the
 * claim has a recovery point: then it is handed on, see idem_pending_release).
 *
 * The rule is that no statement can tell: what any statement sees equals
 * what it would see had the claim been written at once.  readers.c decides
 * when held claims must be written (before a statement that could look at
 * the table, before COMMIT) and when a claim may be held at all.  A claim
 * is also written at once wherever a later write could change what the
 * caller sees: idempotency.defer_writes off, REPEATABLE READ or
 * SERIALIZABLE, a subtransaction, a read-only transaction, a user who may
 * not INSERT into the table, row-level security, triggers or rules on the
 * table (they must fire when the claim is made), and past IDEM_MAX_PENDING
 * held claims.
 *
 * Held claims and their copies of tenant, key and fingerprint live in a
 * context of their own, freed claim by claim as they settle.
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"

#include "idempotency.h"

/*
 * At most this many claims are held at once; further ones are written at
 * once.  A lookup among held claims stays a short scan, and a transaction
 * claiming many keys one by one loses nothing but the saving.
 */
#define IDEM_MAX_PENDING	32

/*
 * The claims held by this transaction.  An entry whose record was written
 * or dropped inside a subtransaction stays (settled_in) until that
 * subtransaction ends: if it rolls back, the claim is held again.  Room
 * beyond IDEM_MAX_PENDING is only ever needed for such entries.
 */
static MemoryContext pending_context = NULL;
static IdemPendingClaim *pending = NULL;
static int	pending_allocated = 0;
static int	pending_used = 0;
static bool writing_all = false;

static int
count_unsettled(void)
{
	int			n = 0;

	for (int i = 0; i < pending_used; i++)
		if (pending[i].settled_in == InvalidSubTransactionId)
			n++;
	return n;
}

/* Drop entry i and its copies (order does not matter). */
static void
remove_entry(int i)
{
	IdemPendingClaim *p = &pending[i];

	pfree(p->tenant_id);
	pfree(p->key);
	if (p->fingerprint != NULL)
		pfree(p->fingerprint);
	if (p->recovery_point != NULL)
		pfree(p->recovery_point);
	if (p->state != (Datum) 0)
		pfree(DatumGetPointer(p->state));
	pending[i] = pending[--pending_used];
}

/*
 * The claim is settled: its record is written (or, for a release, there is
 * none to write).  At the top level that is final; in a subtransaction it
 * is undone if the subtransaction rolls back.
 */
void
idem_pending_settle(IdemPendingClaim *p)
{
	SubTransactionId sub = GetCurrentSubTransactionId();

	if (sub == TopSubTransactionId)
		remove_entry(p - pending);
	else
		p->settled_in = sub;
}

/* Triggers or rules on the table must fire when the claim is made. */
static bool
table_has_triggers_or_rules(Oid table)
{
	Relation	rel = RelationIdGetRelation(table);
	bool		has;

	if (!RelationIsValid(rel))
		return true;
	has = rel->rd_rel->relhastriggers || rel->rd_rel->relhasrules;
	RelationClose(rel);
	return has;
}

/*
 * May a fresh claim of table be held instead of written now?
 *
 * Never on a table distributed by Citus: the claim may run in a task
 * backend on a worker, which Citus lets run no more SQL once the delegated
 * call has returned, and a statement reading the shards would not be
 * recognised as a reader of the table (readers.c knows its OID only).
 */
bool
idem_pending_allowed(Oid table)
{
	if (!idem_defer_writes || idem_store_distributed() ||
		!idem_readers_allow_holding() ||
		IsolationUsesXactSnapshot() || XactReadOnly || IsInParallelMode() ||
		GetCurrentTransactionNestLevel() != 1 ||
		count_unsettled() >= IDEM_MAX_PENDING)
		return false;
	if (pg_class_aclcheck(table, GetUserId(), ACL_INSERT) != ACLCHECK_OK)
		return false;
	if (check_enable_rls(table, InvalidOid, true) != RLS_NONE)
		return false;
	return !table_has_triggers_or_rules(table);
}

/* The unwritten claim of k in this transaction, or NULL. */
IdemPendingClaim *
idem_pending_find(const IdemKey *k)
{
	for (int i = 0; i < pending_used; i++)
	{
		IdemPendingClaim *p = &pending[i];

		if (p->settled_in == InvalidSubTransactionId &&
			idem_text_equal(p->key, k->key) &&
			idem_text_equal(p->tenant_id, k->tenant_id))
			return p;
	}
	return NULL;
}

/*
 * Remember a fresh claim.  The caller holds the key lock and has read,
 * after taking it, that the key has no record.
 */
void
idem_pending_add(const IdemKey *k, text *fingerprint, int64 token,
				 TimestampTz now, TimestampTz lease_expires_at, int64 ttl_us)
{
	MemoryContext old;
	IdemPendingClaim *p;

	if (pending_context == NULL)
	{
		pending_context = AllocSetContextCreate(TopTransactionContext,
												"idempotency held claims",
												ALLOCSET_SMALL_SIZES);
		pending_allocated = IDEM_MAX_PENDING;
		pending = MemoryContextAlloc(pending_context,
									 sizeof(IdemPendingClaim) * pending_allocated);
	}
	else if (pending_used >= pending_allocated)
	{
		pending_allocated *= 2;
		pending = repalloc(pending, sizeof(IdemPendingClaim) * pending_allocated);
	}
	old = MemoryContextSwitchTo(pending_context);
	p = &pending[pending_used++];
	p->tenant_id = (text *) PG_DETOAST_DATUM_COPY(PointerGetDatum(k->tenant_id));
	p->key = (text *) PG_DETOAST_DATUM_COPY(PointerGetDatum(k->key));
	p->fingerprint = fingerprint ?
		(text *) PG_DETOAST_DATUM_COPY(PointerGetDatum(fingerprint)) : NULL;
	MemoryContextSwitchTo(old);

	p->schema = idem_store_schema();
	p->userid = GetUserId();
	p->token = token;
	p->created_at = now;
	p->updated_at = now;
	p->lease_expires_at = lease_expires_at;
	p->ttl_us = ttl_us;
	p->recovery_point = NULL;
	p->state = (Datum) 0;
	p->settled_in = InvalidSubTransactionId;
}

/* A record for the key exists although this transaction holds its lock. */
static void
report_lost_claim(const IdemPendingClaim *p)
{
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_TOKEN_MISMATCH),
			 errmsg("claim of key \"%s\" lost: another transaction stored a record for it",
					text_to_cstring(p->key)),
			 errdetail("The record was written without taking the key's lock (directly into the table, or on another node)."),
			 errhint("This transaction is rolled back; the key's outcome belongs to the other record.")));
}

/* The values a held claim's record is written with. */
typedef struct RecordValues
{
	int64		token;
	TimestampTz updated_at;
	TimestampTz lease_expires_at;
	text	   *recovery_point;
	Datum		state;
} RecordValues;

static void
values_of(const IdemPendingClaim *p, RecordValues *v)
{
	v->token = p->token;
	v->updated_at = p->updated_at;
	v->lease_expires_at = p->lease_expires_at;
	v->recovery_point = p->recovery_point;
	v->state = p->state;
}

/*
 * Write a held claim's record with values v: processing (status
 * IDEM_PROCESSING, response ignored) or finished now.  Runs as the user who
 * claimed.  The claim is then settled: for good at the top level, until its
 * subtransaction ends otherwise (a rollback makes it held again, with its
 * own values).
 *
 * The INSERT has no ON CONFLICT (it skips the speculative insertion's
 * extra index probe and WAL record): the key lock is held and the key was
 * read free after taking it, so a conflict means a record written around
 * the lock.  Its unique violation never reaches the caller: it becomes the
 * lost-claim error, and the transaction rolls back either way.
 */
static void
write_record(IdemPendingClaim *p, const RecordValues *v, IdemStatus status,
			 Datum response, bool response_isnull, TimestampTz now)
{
	MemoryContext caller_context = CurrentMemoryContext;
	Oid			save_userid;
	int			save_sec_context;
	IdemKey		k = {p->tenant_id, p->key};
	bool		processing = status == IDEM_PROCESSING;

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	if (save_userid != p->userid)
		SetUserIdAndSecContext(p->userid,
							   save_sec_context | SECURITY_LOCAL_USERID_CHANGE);
	PG_TRY();
	{
		idem_store_begin_in_schema(p->schema);
		idem_store_write_once(&k, p->fingerprint, v->token, p->created_at,
							  processing ? v->updated_at : now,
							  v->lease_expires_at, p->ttl_us, status,
							  processing ? (Datum) 0 : response,
							  processing ? true : response_isnull,
							  v->recovery_point, v->state);
		idem_store_end();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		SetUserIdAndSecContext(save_userid, save_sec_context);
		MemoryContextSwitchTo(caller_context);
		edata = CopyErrorData();
		if (edata->sqlerrcode != ERRCODE_UNIQUE_VIOLATION)
			PG_RE_THROW();
		/* the transaction is aborting: only the error it reports changes */
		FlushErrorState();
		report_lost_claim(p);
	}
	PG_END_TRY();
	SetUserIdAndSecContext(save_userid, save_sec_context);

	idem_pending_settle(p);
}

/* Write a held claim's record as it stands, processing or finished now. */
void
idem_pending_write(IdemPendingClaim *p, IdemStatus status, Datum response,
				   bool response_isnull, TimestampTz now)
{
	RecordValues v;

	values_of(p, &v);
	write_record(p, &v, status, response, response_isnull, now);
}

/*
 * Extend a held claim's lease: in memory at the top level; written as
 * processing with the new lease in a subtransaction, which could roll the
 * new lease back.
 */
void
idem_pending_heartbeat(IdemPendingClaim *p, TimestampTz now,
					   TimestampTz lease_expires_at)
{
	RecordValues v;

	if (GetCurrentSubTransactionId() == TopSubTransactionId)
	{
		p->lease_expires_at = lease_expires_at;
		p->updated_at = now;
		return;
	}
	values_of(p, &v);
	v.lease_expires_at = lease_expires_at;
	v.updated_at = now;
	write_record(p, &v, IDEM_PROCESSING, (Datum) 0, true, now);
}

/* A copy of a varlena in the held claims' context. */
static Datum
held_copy(Datum value)
{
	MemoryContext old = MemoryContextSwitchTo(pending_context);
	Datum		copy = PointerGetDatum(PG_DETOAST_DATUM_COPY(value));

	MemoryContextSwitchTo(old);
	return copy;
}

/*
 * Store a recovery point (and state, 0 for none) on a held claim: in
 * memory at the top level, written as processing in a subtransaction.
 */
void
idem_pending_checkpoint(IdemPendingClaim *p, text *point, Datum state,
						TimestampTz now)
{
	RecordValues v;

	if (GetCurrentSubTransactionId() == TopSubTransactionId)
	{
		if (p->recovery_point != NULL)
			pfree(p->recovery_point);
		if (p->state != (Datum) 0)
			pfree(DatumGetPointer(p->state));
		p->recovery_point = (text *) DatumGetPointer(held_copy(PointerGetDatum(point)));
		p->state = state ? held_copy(state) : (Datum) 0;
		p->updated_at = now;
		return;
	}
	values_of(p, &v);
	v.recovery_point = point;
	v.state = state;
	v.updated_at = now;
	write_record(p, &v, IDEM_PROCESSING, (Datum) 0, true, now);
}

/*
 * Release a held claim without a failure.  Without a recovery point there
 * is nothing to write.  With one, the record is written to be handed on,
 * as a written claim's is (store.c): its lease ends now, under a new token.
 */
void
idem_pending_release(IdemPendingClaim *p, TimestampTz now)
{
	RecordValues v;

	if (p->recovery_point == NULL)
	{
		idem_pending_settle(p);
		return;
	}
	values_of(p, &v);
	v.token = idem_successor_token(now, p->token);
	v.lease_expires_at = now;
	v.updated_at = now;
	write_record(p, &v, IDEM_PROCESSING, (Datum) 0, true, now);
}

/*
 * Write every held claim as its processing row, before a statement that
 * could look at the table (readers.c) or COMMIT.  snapshot, if any, is the
 * starting statement's own snapshot, not used yet: it is advanced past the
 * writes, as is the active snapshot when advance_active says it belongs to
 * no running statement.  Exactly as if the claims had been written before.
 */
void
idem_pending_write_all(Snapshot snapshot, bool advance_active)
{
	volatile bool pushed = false;

	if (writing_all || count_unsettled() == 0)
		return;

	writing_all = true;
	PG_TRY();
	{
		if (!ActiveSnapshotSet())
		{
			PushActiveSnapshot(GetTransactionSnapshot());
			pushed = true;
		}
		for (int i = pending_used - 1; i >= 0; i--)
			if (pending[i].settled_in == InvalidSubTransactionId)
				idem_pending_write(&pending[i], IDEM_PROCESSING, (Datum) 0, true, 0);
		if (pushed)
			PopActiveSnapshot();
	}
	PG_FINALLY();
	{
		writing_all = false;
	}
	PG_END_TRY();

	CommandCounterIncrement();
	if (snapshot != NULL)
		snapshot->curcid = GetCurrentCommandId(false);
	if (advance_active && ActiveSnapshotSet())
		GetActiveSnapshot()->curcid = GetCurrentCommandId(false);
}

static void
pending_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			/* COMMIT wrote them already (readers.c); this is a safety net */
			idem_pending_write_all(NULL, false);
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			/* the memory goes with TopTransactionContext */
			pending_context = NULL;
			pending = NULL;
			pending_allocated = 0;
			pending_used = 0;
			writing_all = false;
			break;
		default:
			break;
	}
}

static void
pending_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						 SubTransactionId parentSubid, void *arg)
{
	for (int i = pending_used - 1; i >= 0; i--)
	{
		IdemPendingClaim *p = &pending[i];

		if (p->settled_in != mySubid)
			continue;
		if (event == SUBXACT_EVENT_ABORT_SUB)
			p->settled_in = InvalidSubTransactionId;	/* the write is undone */
		else if (event == SUBXACT_EVENT_COMMIT_SUB)
		{
			if (parentSubid == TopSubTransactionId)
				remove_entry(i);
			else
				p->settled_in = parentSubid;
		}
	}
}

/*
 * Register the transaction callbacks.  Called from _PG_init.
 */
void
idem_pending_init(void)
{
	RegisterXactCallback(pending_xact_callback, NULL);
	RegisterSubXactCallback(pending_subxact_callback, NULL);
}
