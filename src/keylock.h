/*
 * keylock.h
 *		The per-key advisory lock that makes in_progress non-blocking
 *		(keylock.c).
 */
#ifndef IDEM_KEYLOCK_H
#define IDEM_KEYLOCK_H

#include "idempotency.h"

typedef enum IdemKeyLockResult
{
	IDEM_KEYLOCK_ACQUIRED,		/* at once */
	IDEM_KEYLOCK_ACQUIRED_AFTER_WAIT,	/* after another holder let go */
	IDEM_KEYLOCK_BUSY			/* held elsewhere (and the wait, if any, ran out) */
} IdemKeyLockResult;

extern IdemKeyLockResult idem_keylock_try(const IdemKey *k, int64 wait_us);

/* Which transaction still in flight has inserted k (direct_read.c)? */
typedef TransactionId (*IdemInserterProbe) (const IdemKey *k);

extern void idem_keylock_take(const IdemKey *k, IdemInserterProbe inserter_of);
extern void idem_keylock_release(const IdemKey *k);
extern bool idem_keylock_wait_for_inserter(TransactionId xid, int64 wait_us);

#endif							/* IDEM_KEYLOCK_H */
