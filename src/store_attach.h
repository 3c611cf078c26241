/*
 * store_attach.h
 *		Running the statement catalogue on the attached records table
 *		(store_attach.c), for the files that hold its statements: store.c
 *		(one key) and store_sweep.c (sweeps); and the start of one of our
 *		statements, for the executor hook (hooks.c).
 */
#ifndef IDEM_STORE_ATTACH_H
#define IDEM_STORE_ATTACH_H

#include "postgres.h"

#include "executor/execdesc.h"

#include "statements.h"

extern uint64 idem_store_run(IdemQuery q, Datum *values, const char *nulls,
							 bool read_only, long tcount);

/* set while one of our statements is being planned and started */
extern PGDLLIMPORT bool idem_store_statement_starting;
extern bool idem_store_take_statement_start(void);
extern void idem_store_statement_started(QueryDesc *queryDesc);

#endif							/* IDEM_STORE_ATTACH_H */
