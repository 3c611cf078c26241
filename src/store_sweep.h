/*
 * store_sweep.h
 *		The sweep statements on idempotency_records (store_sweep.c).
 */
#ifndef IDEM_STORE_SWEEP_H
#define IDEM_STORE_SWEEP_H

#include "idempotency.h"

/* sweep batches: returns rows affected */
extern uint64 idem_store_sweep_expired(TimestampTz now, int batch_size,
									   bool include_stale_claims,
									   bool try_unlocked,
									   TimestampTz *from,
									   uint64 *stale_released,
									   bool *full);

extern uint64 idem_store_sweep_group(TimestampTz at, bool include_stale_claims,
									 uint64 *stale_released);
extern uint64 idem_store_sweep_fail_stale(TimestampTz now, int batch_size);
extern uint64 idem_store_sweep_cluster(TimestampTz now, bool fail_stale,
									   uint64 *stale_released,
									   uint64 *stale_failed);

#endif							/* IDEM_STORE_SWEEP_H */
