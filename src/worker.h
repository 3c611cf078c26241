/*
 * worker.h
 *		The background sweeper (worker.c).
 */
#ifndef IDEM_WORKER_H
#define IDEM_WORKER_H

#include "idempotency.h"

extern void idem_worker_register(void);

#endif							/* IDEM_WORKER_H */
