/*
 * table_shape.h
 *		The records table's shape: refused when it changed; is it as made?
 *		(table_shape.c).
 */
#ifndef IDEM_TABLE_SHAPE_H
#define IDEM_TABLE_SHAPE_H

#include "access/tupdesc.h"

#include "idempotency.h"

/* the table's shape (table_shape.c) */
extern Oid	idem_check_table_shape(Oid table, bool *has_checkpoints,
								   bool *has_holder);

extern bool idem_table_is_as_made(Oid table);
extern char *idem_table_isolation_setting(Oid table);
extern bool idem_isolation_admits(const char *setting, const text *tenant);
extern Oid	idem_table_owner(Oid table);
extern void idem_check_result_shape(Oid table, TupleDesc desc,
									const Oid *types, int n);

#endif							/* IDEM_TABLE_SHAPE_H */
