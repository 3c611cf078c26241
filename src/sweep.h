/*
 * sweep.h
 *		A sweep pass over this database, batch by batch (sweep.c).
 */
#ifndef IDEM_SWEEP_H
#define IDEM_SWEEP_H

#include "idempotency.h"

/* Where a pass has got to: batches resume at the last expiry seen. */
typedef struct IdemSweepCursor
{
	TimestampTz expired_from;
	bool		one_transaction;	/* all batches in one transaction */
	int			unlocked_tries_left;	/* batches that may still try the
										 * unlocked delete (a subtransaction) */
} IdemSweepCursor;

extern void idem_sweep_cursor_init(IdemSweepCursor *cursor,
								   bool one_transaction);
extern bool idem_sweep_batch(int batch_size, IdemSweepCursor *cursor,
							 IdemSweepCounts *counts);
extern bool idem_sweep_lock(bool session_lock, bool wait);
extern void idem_sweep_unlock(bool session_lock);

#endif							/* IDEM_SWEEP_H */
