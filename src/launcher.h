/*
 * launcher.h
 *		The sweeper's launcher (launcher.c).
 */
#ifndef IDEM_LAUNCHER_H
#define IDEM_LAUNCHER_H

#include "idempotency.h"

extern void idem_worker_register(void);

#endif							/* IDEM_LAUNCHER_H */
