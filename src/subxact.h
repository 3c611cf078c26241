/*
 * subxact.h
 *		One step in a subtransaction, expected errors swallowed (subxact.c).
 */
#ifndef IDEM_SUBXACT_H
#define IDEM_SUBXACT_H

#include "idempotency.h"

extern bool idem_try_in_subtransaction(void (*step) (void *arg), void *arg,
									   const int *codes, int ncodes);
extern void idem_step_lock_timeout(int timeout_ms);

#endif							/* IDEM_SUBXACT_H */
