/*
 * database_sweeper.h
 *		The sweeper's per-database worker (database_sweeper.c), started by
 *		the launcher by its function's name.
 */
#ifndef IDEM_DATABASE_SWEEPER_H
#define IDEM_DATABASE_SWEEPER_H

#include "idempotency.h"

extern PGDLLEXPORT void idem_sweeper_worker_main(Datum main_arg);

#endif							/* IDEM_DATABASE_SWEEPER_H */
