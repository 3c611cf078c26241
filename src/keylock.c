/*
 * keylock.c
 *		The per-key advisory lock that lets a claim answer in_progress
 *		without waiting on another transaction.
 *
 * An uncommitted claim is invisible to other snapshots, and an INSERT that
 * conflicts with it would wait for that transaction to end.  So every claim
 * first takes a transaction-level advisory lock on a 64-bit hash of
 * (tenant_id, key): if someone else holds it, a claim in flight exists and
 * the answer is in_progress at once.  The lock is only this hint: the
 * primary key decides who wins, so a hash collision or a claim made on
 * another node costs a wait, never a second winner.
 *
 * The lock uses its own advisory-lock class (locktag_field4), so it never
 * collides with the application's pg_advisory_lock() calls; in pg_locks it
 * shows as locktype 'advisory' with objsubid IDEM_KEYLOCK_CLASS.
 */
#include "postgres.h"

#include "access/xact.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/wait_event.h"

#include "idempotency.h"
#include "keylock.h"
#include "subxact.h"

#define IDEM_KEYLOCK_CLASS	0x4944		/* "ID" */

static void
keylock_tag(const IdemKey *k, LOCKTAG *tag)
{
	uint64		h;

	/* tenant_id seeds the hash of key: the same key in two tenants differs */
	h = hash_bytes_extended((const unsigned char *) VARDATA_ANY(k->tenant_id),
							VARSIZE_ANY_EXHDR(k->tenant_id), 0);
	h = hash_bytes_extended((const unsigned char *) VARDATA_ANY(k->key),
							VARSIZE_ANY_EXHDR(k->key), h);

	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (h >> 32), (uint32) h,
						 IDEM_KEYLOCK_CLASS);
}

/* The lock_timeout for a wait of wait_us, in whole milliseconds. */
static int
wait_timeout_ms(int64 wait_us)
{
	return (int) Min((wait_us + 999) / 1000, (int64) INT_MAX);
}

/*
 * Wait up to wait_us for the lock, as a genuine lock wait: it shows in
 * pg_locks, takes part in deadlock detection, and is cancellable.  The
 * wait is bounded by running it in a subtransaction with lock_timeout set;
 * a timeout (or a deadlock) ends the wait and the caller reports
 * in_progress.  Only claims that meet a holder and asked to wait get here.
 */
typedef struct KeylockWait
{
	const LOCKTAG *tag;
	LOCKMODE	mode;
	int			timeout_ms;
} KeylockWait;

/* The wait itself, with lock_timeout set for it alone. */
static void
keylock_wait_step(void *arg)
{
	KeylockWait *w = arg;

	idem_step_lock_timeout(w->timeout_ms);
	(void) LockAcquire(w->tag, w->mode, false, false);
}

/*
 * Wait up to wait_us for lock tag in mode; returns false when the wait ran
 * out.  The lock is then held by the transaction's resource owner.
 */
static bool
lock_wait(const LOCKTAG *tag, LOCKMODE mode, int64 wait_us)
{
	static const int ends_wait[] = {ERRCODE_LOCK_NOT_AVAILABLE,
	ERRCODE_T_R_DEADLOCK_DETECTED};
	KeylockWait w = {tag, mode, wait_timeout_ms(wait_us)};

	return idem_try_in_subtransaction(keylock_wait_step, &w, ends_wait,
									  lengthof(ends_wait));
}

static bool
keylock_wait(const LOCKTAG *tag, int64 wait_us)
{
	ResourceOwner caller_owner = CurrentResourceOwner;

	if (!lock_wait(tag, ExclusiveLock, wait_us))
		return false;

	/*
	 * Ending the subtransaction handed the lock to the transaction's
	 * resource owner, not the caller's.  Take it once more as the caller (it
	 * is ours, so this cannot wait) and drop the transaction's copy, so that
	 * idem_keylock_release finds it where every other claim keeps it.
	 */
	(void) LockAcquire(tag, ExclusiveLock, false, true);
	CurrentResourceOwner = CurTransactionResourceOwner;
	LockRelease(tag, ExclusiveLock, false);
	CurrentResourceOwner = caller_owner;
	return true;
}

/*
 * Try to take the key lock for the rest of the transaction, waiting at most
 * wait_us for another holder to let go (wait_us = 0: never blocks).  Taking
 * it again in the same transaction succeeds.  Used by claims, which answer
 * in_progress when the lock stays busy.
 */
IdemKeyLockResult
idem_keylock_try(const IdemKey *k, int64 wait_us)
{
	LOCKTAG		tag;

	keylock_tag(k, &tag);
	if (LockAcquire(&tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL)
		return IDEM_KEYLOCK_ACQUIRED;
	if (wait_us > 0 && keylock_wait(&tag, wait_us))
		return IDEM_KEYLOCK_ACQUIRED_AFTER_WAIT;
	return IDEM_KEYLOCK_BUSY;
}

/*
 * Wait up to wait_us for transaction xid to end (a claim_many that inserted
 * a key and gave its key lock back).  A genuine lock wait on the
 * transaction, like the key lock's.  Returns false when the wait ran out.
 */
bool
idem_keylock_wait_for_inserter(TransactionId xid, int64 wait_us)
{
	LOCKTAG		tag;
	ResourceOwner caller_owner = CurrentResourceOwner;

	if (wait_us <= 0)
		return false;
	SET_LOCKTAG_TRANSACTION(tag, xid);
	if (!lock_wait(&tag, ShareLock, wait_us))
		return false;
	/* only the wait was wanted: drop the lock the subtransaction handed on */
	CurrentResourceOwner = CurTransactionResourceOwner;
	LockRelease(&tag, ShareLock, false);
	CurrentResourceOwner = caller_owner;
	return true;
}

/*
 * Wait for transaction xid to end, as a lock wait on it (lock_timeout
 * applies).  Not XactLockTableWait(): when the lock is free but the
 * transaction still looks in progress (a row whose transaction ended
 * without an abort record, issue 34), that one polls with no look at
 * interrupts; here the caller's loop probes again, and sleeps on the latch
 * between probes, so a cancel or statement_timeout ends the wait at once.
 */
static void
inserter_wait(TransactionId xid)
{
	LOCKTAG		tag;

	SET_LOCKTAG_TRANSACTION(tag, xid);
	(void) LockAcquire(&tag, ShareLock, false, false);
	LockRelease(&tag, ShareLock, false);
}

/*
 * Take the key lock, waiting as long as it takes (lock_timeout applies).
 * Used by the fenced writes: they wait for a claim in flight rather than
 * meet its uncommitted row, so a claim never waits on them in turn.  A
 * key inserted by an idem_claim_many still in flight has no lock holder:
 * wait for that transaction first, without the key lock, so that its own
 * settling of the key never waits on this one.  inserter_of(k) names such
 * a transaction (direct_read.c's probe of the key index, passed in by the
 * caller: the lock knows nothing of the table).  Every turn answers a
 * cancel; a turn that finds the inserter it has just waited for still
 * there sleeps a millisecond first.
 */
void
idem_keylock_take(const IdemKey *k, IdemInserterProbe inserter_of)
{
	LOCKTAG		tag;
	TransactionId waited_for = InvalidTransactionId;

	keylock_tag(k, &tag);
	for (;;)
	{
		TransactionId inserter;

		CHECK_FOR_INTERRUPTS();
		/* held already: this transaction claimed the key, no one else can insert it */
		if (LockAcquire(&tag, ExclusiveLock, false, false) == LOCKACQUIRE_ALREADY_HELD)
			return;
		inserter = inserter_of(k);
		if (!TransactionIdIsValid(inserter))
			return;
		LockRelease(&tag, ExclusiveLock, false);
		if (TransactionIdEquals(inserter, waited_for))
		{
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 1L, PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
			CHECK_FOR_INTERRUPTS();
		}
		inserter_wait(inserter);
		waited_for = inserter;
	}
}

/*
 * Give the lock back before the transaction ends: a claim that did not win
 * (replay, mismatch, ...) must not make later claims report in_progress.
 */
void
idem_keylock_release(const IdemKey *k)
{
	LOCKTAG		tag;

	keylock_tag(k, &tag);
	LockRelease(&tag, ExclusiveLock, false);
}
