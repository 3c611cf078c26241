/*
 * tokens.c
 *		Fencing tokens that never go backwards.
 *
 * A token is handed to every claim that wins a key (fresh, or taken over),
 * and idem_complete/release/heartbeat are accepted only with the key's
 * current token.  So a new holder's token must be greater than any token an
 * earlier holder of the key could still present, also after the key's
 * record was released or swept, after a crash or restart, when the clock
 * steps backwards, and on a promoted standby.
 *
 * The promise, per database: a fresh claim's token is greater than every
 * token handed out before it (plus one), and a takeover's is the old
 * record's token plus one, so per key tokens only grow.  A fresh token is
 * the clock in microseconds since 2000-01-01 when that is larger than the
 * last token plus two, and the last token plus two otherwise.  The last
 * token is kept in shared memory (one slot per database; the slots of
 * dropped databases are freed when none is left), and a high-water mark
 * at least as large is kept in the sequence idempotency_tokens, which is
 * WAL-logged: it survives a crash and reaches standbys before any record
 * carrying a token above the previous mark.  The mark is moved ahead by
 * IDEM_TOKEN_MARGIN at a time, so it is written about every ten seconds,
 * not for every claim.  After a restart the first token of a database
 * starts above the mark.
 *
 * No token leaves this file before the WAL record of the mark that covers
 * it is flushed: the claim's own commit may come later, be asynchronous or
 * never come (the token may already be in another system's hands), and a
 * crash that lost the mark would let a restart with the clock stepped back
 * hand out lower tokens.  A mark is published in the slot only once it is
 * flushed, so a token covered by the slot needs no flush of its own; the
 * flush happens when the mark moves, about every ten seconds per database.
 *
 * Token arithmetic never wraps: at the top of bigint tokens are refused
 * (22003, numeric_value_out_of_range) before anything is written.  Nor can
 * a record written around the functions (any role that may update its own
 * records can set its token) drag the mark up: a takeover of a token above
 * every token handed out here and more than an hour ahead of the clock is
 * refused (ID004), so a tenant moves the database's tokens no further than
 * its legitimate takeovers do, one at a time.
 *
 * Without shared memory (the library not preloaded) every token reads and
 * advances the mark itself.  With the 1.0 SQL objects (no sequence until
 * ALTER EXTENSION idempotency UPDATE) tokens follow the clock, forced to
 * increase within a backend, as 1.0 did.
 */
#include "postgres.h"

#include "access/relation.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "common/int.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/rel.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "idempotency.h"
#include "tokens.h"

/* How far ahead of the last token the durable mark is moved: 10 s. */
#define IDEM_TOKEN_MARGIN	((int64) 10 * USECS_PER_SEC)

/*
 * How far ahead of the clock a record's token may be and still count as
 * one a node of this database could have handed out (clocks of a cluster's
 * nodes differ by far less): 1 hour.
 */
#define IDEM_TOKEN_CLOCK_SLACK	((int64) 3600 * USECS_PER_SEC)

/* Databases with a slot; the others take the path without shared memory. */
#define IDEM_TOKEN_SLOTS	64

typedef struct TokenSlot
{
	Oid			dbid;			/* InvalidOid: free */
	Oid			sequence;		/* the mark this slot was loaded from */
	int64		last;			/* last token handed out */
	int64		mark;			/* durable (flushed): idempotency_tokens is at
								 * least this */
} TokenSlot;

typedef struct TokenShared
{
	LWLock	   *lock;
	TokenSlot	slots[IDEM_TOKEN_SLOTS];
} TokenShared;

static TokenShared *shared = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static void
tokens_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(TokenShared)));
	RequestNamedLWLockTranche("idempotency tokens", 1);
}

static void
tokens_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	shared = ShmemInitStruct("idempotency tokens", sizeof(TokenShared), &found);
	if (!found)
	{
		memset(shared, 0, sizeof(TokenShared));
		shared->lock = &(GetNamedLWLockTranche("idempotency tokens"))->lock;
	}
	LWLockRelease(AddinShmemInitLock);
}

/*
 * Reserve shared memory for the last tokens.  Called from _PG_init while
 * preloading.
 */
void
idem_tokens_request_shmem(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = tokens_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = tokens_shmem_startup;
}

/* The clock in microseconds, at least 1. */
static int64
clock_token(TimestampTz now)
{
	return Max((int64) now, 1);
}

/*
 * n fresh tokens do not fit above last: refuse before anything is written
 * (or, in shared memory, moved).
 */
static void
refuse_fresh_tokens(int64 last, int n)
{
	ereport(ERROR,
			(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
			 errmsg("no fresh fencing token is left in this database"),
			 n == 1 ?
			 errdetail("A fresh token must be at least the last token handed out, "
					   INT64_FORMAT ", plus two, and that is above the largest bigint, "
					   INT64_FORMAT ".", last, PG_INT64_MAX) :
			 errdetail("A batch's fresh tokens must start at least two above the last "
					   "token handed out, " INT64_FORMAT ", and %d tokens two apart "
					   "from there pass the largest bigint, " INT64_FORMAT ".",
					   last, n, PG_INT64_MAX)));
}

/*
 * A takeover asked for the successor of a token that was never handed out
 * here: refuse, leaving the mark where it is.
 */
static void
refuse_unissued_token(int64 old, int64 last)
{
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_TOKEN_NOT_ISSUED),
			 errmsg("fencing token " INT64_FORMAT " was never handed out in this database", old),
			 errdetail("It is more than an hour ahead of the clock and above the last token "
					   "handed out, " INT64_FORMAT ": its record was written around the "
					   "extension's functions.  Taking it over would move the next token of "
					   "every tenant past it.", last),
			 errhint("Remove the record with idem_forget(tenant_id, key), then claim the key again.")));
}

/* 1.0 objects: the clock, forced to increase within this backend. */
static int64
backend_clock_token(TimestampTz now)
{
	static int64 last_token = 0;
	int64		token = clock_token(now);

	if (token <= last_token &&
		pg_add_s64_overflow(last_token, 1, &token))
		refuse_fresh_tokens(last_token, 1);
	last_token = token;
	return token;
}

/*
 * The LSN of the sequence's last change.  Read after its value, it covers
 * the change that value came from: WAL flushed up to it makes the value
 * survive a crash.
 */
static XLogRecPtr
sequence_change_lsn(Relation rel)
{
	Buffer		buffer;
	XLogRecPtr	lsn;

	if (!RelationNeedsWAL(rel))
		return InvalidXLogRecPtr;
	buffer = ReadBuffer(rel, 0);
	LockBuffer(buffer, BUFFER_LOCK_SHARE);
	lsn = PageGetLSN(BufferGetPage(buffer));
	UnlockReleaseBuffer(buffer);
	return lsn;
}

/* Wait until the WAL up to lsn is on disk (at once if it already is). */
static void
make_durable(XLogRecPtr lsn)
{
	if (!XLogRecPtrIsInvalid(lsn))
		XLogFlush(lsn);
}

/*
 * Read or move the mark as the sequence's owner (the extension's owner):
 * callers of idem_claim need no privilege on it, and the caller's lastval()
 * is left alone (setval and pg_sequence_last_value do not change it).
 */
static int64
mark_read(Oid sequence)
{
	LOCAL_FCINFO(fcinfo, 1);
	Datum		value;

	InitFunctionCallInfoData(*fcinfo, NULL, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = ObjectIdGetDatum(sequence);
	fcinfo->args[0].isnull = false;
	value = pg_sequence_last_value(fcinfo);
	return fcinfo->isnull ? 0 : DatumGetInt64(value);
}

static void
mark_write(Oid sequence, int64 mark)
{
	(void) DirectFunctionCall2(setval_oid, ObjectIdGetDatum(sequence),
							   Int64GetDatum(mark));
}

/*
 * Read the mark (new_mark = 0) or move it to new_mark, as the sequence's
 * owner.  Returns the mark read, or new_mark, and sets *lsn to the WAL
 * position that must be flushed before a token it covers is handed out.
 */
static int64
mark_as_owner(Oid sequence, int64 new_mark, XLogRecPtr *lsn)
{
	Relation	rel = relation_open(sequence, AccessShareLock);
	Oid			owner = rel->rd_rel->relowner;
	Oid			save_userid;
	int			save_sec_context;
	volatile int64 mark = new_mark;

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(owner, save_sec_context |
						   SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION);
	PG_TRY();
	{
		if (new_mark > 0)
			mark_write(sequence, new_mark);
		else
			mark = mark_read(sequence);
	}
	PG_FINALLY();
	{
		SetUserIdAndSecContext(save_userid, save_sec_context);
	}
	PG_END_TRY();
	*lsn = sequence_change_lsn(rel);
	relation_close(rel, NoLock);
	return mark;
}

static int64
read_mark(Oid sequence, XLogRecPtr *lsn)
{
	return mark_as_owner(sequence, 0, lsn);
}

static void
write_mark(Oid sequence, int64 mark, XLogRecPtr *lsn)
{
	(void) mark_as_owner(sequence, mark, lsn);
}

/*
 * The next tokens after last: n fresh ones (exact = 0), or exactly the
 * successor a takeover asked for.  Sets *first and *new_last; false (and
 * nothing set) when fresh tokens would pass the top of bigint, or when the
 * successor's token was never handed out here.  Fresh
 * tokens are at least the clock and last + 2, and 2 apart, so that a fresh
 * token is never an earlier token plus one: that is a takeover's.
 */
static bool
next_after(int64 last, TimestampTz now, int n, int64 exact,
		   int64 *first, int64 *new_last)
{
	int64		floor;
	int64		start;
	int64		end;

	if (exact > 0)
	{
		/*
		 * Every token handed out here is at most last, or (on another node
		 * of a cluster, before a shard moved here) close to the clock.  A
		 * token beyond both was written around the functions, by any role
		 * that may update its own records: its successor would move every
		 * tenant's tokens with it, up to the top of bigint.
		 */
		int64		clock_bound;

		if (pg_add_s64_overflow(clock_token(now), IDEM_TOKEN_CLOCK_SLACK, &clock_bound))
			clock_bound = PG_INT64_MAX;
		if (exact - 1 > Max(last, clock_bound))
			return false;
		*first = exact;
		*new_last = Max(last, exact);
		return true;
	}
	if (pg_add_s64_overflow(last, 2, &floor))
		return false;
	start = Max(clock_token(now), floor);
	if (pg_add_s64_overflow(start, 2 * (int64) (n - 1), &end))
		return false;
	*first = start;
	*new_last = end;
	return true;
}

/*
 * Without shared memory: read the mark and move it to the last new token,
 * one writer at a time (a self-conflicting lock on the sequence).  The
 * flush comes after the lock is given back, so that concurrent claims
 * share it; a claim covered by a mark another one wrote flushes that
 * mark's WAL itself.
 */
static int64
reserve_without_slot(Oid sequence, TimestampTz now, int n, int64 exact)
{
	int64		mark;
	int64		first = 0;
	int64		last = 0;
	XLogRecPtr	lsn;
	bool		fits;

	LockRelationOid(sequence, ShareUpdateExclusiveLock);
	mark = read_mark(sequence, &lsn);
	fits = next_after(mark, now, n, exact, &first, &last);
	if (fits && last > mark)
		write_mark(sequence, last, &lsn);
	UnlockRelationOid(sequence, ShareUpdateExclusiveLock);
	if (!fits && exact > 0)
		refuse_unissued_token(exact - 1, mark);
	if (!fits)
		refuse_fresh_tokens(mark, n);
	make_durable(lsn);
	return first;
}

/* This database's slot, claimed if free; NULL if all are taken. */
static TokenSlot *
find_slot(void)
{
	TokenSlot  *free_slot = NULL;

	for (int i = 0; i < IDEM_TOKEN_SLOTS; i++)
	{
		TokenSlot  *slot = &shared->slots[i];

		if (slot->dbid == MyDatabaseId)
			return slot;
		if (slot->dbid == InvalidOid && free_slot == NULL)
			free_slot = slot;
	}
	if (free_slot != NULL)
	{
		free_slot->dbid = MyDatabaseId;
		free_slot->sequence = InvalidOid;
	}
	return free_slot;
}

/*
 * Free the slots of databases that were dropped; returns whether one was
 * freed.  Called when no slot is free, so that databases created and
 * dropped over time do not use the slots up.  Existence is looked up in
 * the catalog without holding the lock (a dropped database has no backend
 * left to use its slot; one that is being dropped still exists here).  A
 * freed slot starts afresh: the next database to take it loads its own
 * mark.
 *
 * A dropped database's OID can be reused by a new one before its slot is
 * freed (slots are freed only when none is free): the new database then
 * finds the old slot under its OID, with the old database's last token.
 * That is harmless for monotonicity: tokens only have to grow, and the new
 * database's first token is then larger than it needed to be.  The slot
 * names the sequence it was loaded from, so the new database loads its own
 * mark (load_slot) before relying on it, unless its sequence has the old
 * one's OID as well (both copied from one template, after the OID counter
 * wrapped around), the one case the slot cannot tell apart.
 */
static bool
free_slots_of_dropped_databases(void)
{
	Oid			dbids[IDEM_TOKEN_SLOTS];
	bool		dropped[IDEM_TOKEN_SLOTS];
	bool		freed = false;

	LWLockAcquire(shared->lock, LW_SHARED);
	for (int i = 0; i < IDEM_TOKEN_SLOTS; i++)
		dbids[i] = shared->slots[i].dbid;
	LWLockRelease(shared->lock);

	for (int i = 0; i < IDEM_TOKEN_SLOTS; i++)
		dropped[i] = OidIsValid(dbids[i]) && dbids[i] != MyDatabaseId &&
			!SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(dbids[i]));

	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	for (int i = 0; i < IDEM_TOKEN_SLOTS; i++)
	{
		if (dropped[i] && shared->slots[i].dbid == dbids[i])
		{
			memset(&shared->slots[i], 0, sizeof(TokenSlot));
			freed = true;
		}
	}
	LWLockRelease(shared->lock);
	return freed;
}

/*
 * Make sure the durable mark covers last: move it ahead by the margin,
 * one writer at a time, never backwards, and publish it in the slot only
 * once its WAL is flushed (tokens covered by the slot's mark are handed
 * out without a flush of their own).  At the top of bigint the mark stops
 * at the largest bigint, which still covers last.
 */
static void
cover_with_mark(TokenSlot *slot, Oid sequence, int64 last)
{
	int64		mark;
	int64		target;
	XLogRecPtr	lsn;

	LockRelationOid(sequence, ShareUpdateExclusiveLock);
	LWLockAcquire(shared->lock, LW_SHARED);
	mark = slot->mark;
	LWLockRelease(shared->lock);
	if (mark < last)
	{
		if (pg_add_s64_overflow(last, IDEM_TOKEN_MARGIN, &target))
			target = PG_INT64_MAX;
		mark = Max(read_mark(sequence, &lsn), target);
		write_mark(sequence, mark, &lsn);
		make_durable(lsn);
		LWLockAcquire(shared->lock, LW_EXCLUSIVE);
		if (slot->sequence == sequence && slot->mark < mark)
			slot->mark = mark;
		LWLockRelease(shared->lock);
	}
	UnlockRelationOid(sequence, ShareUpdateExclusiveLock);
}

/*
 * A slot not loaded from this sequence starts above its mark.  The mark is
 * flushed before it is published (whoever moved it last may not have
 * flushed it: an older library, or the owner's own setval).
 */
static void
load_slot(TokenSlot *slot, Oid sequence)
{
	int64		mark;
	XLogRecPtr	lsn;

	LockRelationOid(sequence, ShareUpdateExclusiveLock);
	mark = read_mark(sequence, &lsn);
	make_durable(lsn);
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	if (slot->dbid == MyDatabaseId && slot->sequence != sequence)
	{
		slot->sequence = sequence;
		slot->last = Max(slot->last, mark);
		slot->mark = mark;
	}
	LWLockRelease(shared->lock);
	UnlockRelationOid(sequence, ShareUpdateExclusiveLock);
}

/*
 * Reserve tokens (see next_after) and return the first, once the mark
 * covering them is durable.  The caller is about to write a record with
 * them, so a read-only transaction fails here exactly as that INSERT would.
 */
static int64
reserve(Oid sequence, TimestampTz now, int n, int64 exact)
{
	TokenSlot  *slot = NULL;
	int64		before;
	int64		first = 0;
	int64		last = 0;
	bool		loaded;
	bool		fits;
	bool		covered = true;

	Assert(n >= 1);
	if (!OidIsValid(sequence))
	{
		if (exact > 0)
			return exact;
		first = backend_clock_token(now);
		for (int i = 1; i < n; i++)
			(void) backend_clock_token(now);
		return first;
	}
	PreventCommandIfReadOnly("INSERT");
	if (shared == NULL)
		return reserve_without_slot(sequence, now, n, exact);

	for (int attempt = 0; attempt < 2; attempt++)
	{
		LWLockAcquire(shared->lock, LW_EXCLUSIVE);
		slot = find_slot();
		loaded = slot != NULL && slot->sequence == sequence;
		LWLockRelease(shared->lock);
		if (slot != NULL || !free_slots_of_dropped_databases())
			break;
	}
	if (slot == NULL)
		return reserve_without_slot(sequence, now, n, exact);
	if (!loaded)
		load_slot(slot, sequence);

	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	before = slot->last;
	fits = next_after(before, now, n, exact, &first, &last);
	if (fits)
	{
		slot->last = last;
		covered = slot->mark >= last;
	}
	LWLockRelease(shared->lock);
	if (!fits && exact > 0)
		refuse_unissued_token(exact - 1, before);
	if (!fits)
		refuse_fresh_tokens(before, n);

	if (!covered)
		cover_with_mark(slot, sequence, last);
	return first;
}

int64
idem_fresh_token(Oid sequence, TimestampTz now)
{
	return reserve(sequence, now, 1, 0);
}

/*
 * n fresh tokens at once (idem_claim_many's chunk of keys): the first is
 * returned, the others follow 2 apart.  Each is greater than every token
 * handed out before, plus one, as n calls of idem_fresh_token would give.
 */
int64
idem_fresh_tokens(Oid sequence, TimestampTz now, int n)
{
	return reserve(sequence, now, n, 0);
}

/*
 * The token after old, for a takeover (or a release without a failure):
 * old + 1, with every later fresh token kept above it, even when old was
 * never handed out here (a record written around the functions).  The
 * largest bigint has no successor: refused before anything is written.
 */
int64
idem_successor_token(Oid sequence, TimestampTz now, int64 old)
{
	int64		successor;

	if (pg_add_s64_overflow(old, 1, &successor))
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("fencing token " INT64_FORMAT " has no successor", old),
				 errdetail("A takeover, or a release that hands a record with a recovery point on, "
						   "needs the old token plus one, and " INT64_FORMAT " is the largest bigint.",
						   PG_INT64_MAX)));
	return reserve(sequence, now, 1, successor);
}
