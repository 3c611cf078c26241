/*
 * citus.h
 *		A Citus cluster: is the table a Citus table, this node's shards, the
 *		placement sweep, a call shape refused (citus.c).
 */
#ifndef IDEM_CITUS_H
#define IDEM_CITUS_H

#include "nodes/parsenodes.h"
#include "nodes/pg_list.h"

#include "idempotency.h"

extern bool idem_citus_manages_table(Oid table);
extern List *idem_citus_local_shards(Oid table);
extern void idem_citus_refuse_crashing_call(Query *parse);
extern List *idem_citus_unreachable_workers(void);
extern uint64 idem_citus_count_on_placements(Oid table, const char *command,
											 List **warned);
extern void idem_citus_before_drop(DropStmt *drop);

#endif							/* IDEM_CITUS_H */
