/*
 * shard_route.h
 *		The tenant's shard on this node, and the plans run on it
 *		(shard_route.c).
 */
#ifndef IDEM_SHARD_ROUTE_H
#define IDEM_SHARD_ROUTE_H

#include "executor/spi.h"

#include "idempotency.h"

extern Oid	idem_shard_route(Oid table, Datum tenant);
extern void idem_shard_route_invalidate(Oid relid);
extern SPIPlanPtr *idem_shard_route_plan_slot(Oid shard, int q);
extern void idem_shard_route_forget_plans(void);
extern void idem_shard_route_xact_ended(void);

#endif							/* IDEM_SHARD_ROUTE_H */
