/*
 * statements.h
 *		The statement catalogue (statements.c): every SQL statement on
 *		idempotency_records, by name.
 */
#ifndef IDEM_STATEMENTS_H
#define IDEM_STATEMENTS_H

#include "postgres.h"

/* the statements of one key (or of a batch of one tenant's keys) come first: their $1 is tenant_id */
typedef enum IdemQuery
{
	Q_READ,
	Q_INSERT,
	Q_INSERT_MANY,
	Q_INSERT_MANY_PLAIN,
	Q_TAKE_OVER,
	Q_FAIL_STALE,
	Q_FINISH,
	Q_DELETE_CLAIM,
	Q_HAND_ON,
	Q_CHECKPOINT,
	Q_EXTEND_LEASE,
	Q_FORGET,
	Q_SWEEP_ALL,
	Q_SWEEP_TERMINAL,
	Q_SWEEP_ALL_UNLOCKED,
	Q_SWEEP_TERMINAL_UNLOCKED,
	Q_SWEEP_GROUP_ALL,
	Q_SWEEP_GROUP_TERMINAL,
	Q_SWEEP_FAIL_STALE,
	Q_CLUSTER_SWEEP_STALE,
	Q_CLUSTER_SWEEP_TERMINAL,
	Q_CLUSTER_SWEEP_FAIL_STALE,
	Q_CLAIM_SWEEP_LOOK,
	Q_CLAIM_SWEEP_DELETE,
	NUM_QUERIES
} IdemQuery;

/* Is q one of those (routed to the tenant's shard, shard_route.c)? */
#define IDEM_QUERY_OF_ONE_KEY(q)	((q) < Q_SWEEP_ALL)

/*
 * One entry per statement: its text, its argument types and, for a
 * statement that returns rows, the column types of its result (table_shape.c
 * checks them before anything is read).
 */
typedef struct IdemStatement
{
	const char *text;
	int			nargs;
	Oid			argtypes[13];
	int			ncolumns;
	Oid			columns[12];
} IdemStatement;

extern const IdemStatement idem_statements[NUM_QUERIES];

extern char *idem_statement_text(IdemQuery q, const char *relation,
								 bool has_checkpoints, bool has_holder);
extern char *idem_replace_all(const char *text, const char *from,
							  const char *to);

#endif							/* IDEM_STATEMENTS_H */
