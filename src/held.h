/*
 * held.h
 *		Claims held in memory until they are written (held.c).
 */
#ifndef IDEM_HELD_H
#define IDEM_HELD_H

#include "nodes/parsenodes.h"
#include "nodes/pg_list.h"

#include "idempotency.h"

/* What happened to a held claim since it was made. */
typedef enum IdemHeldSettle
{
	IDEM_HELD_OPEN,				/* claimed */
	IDEM_HELD_FINISHED,			/* completed or failed (status) */
	IDEM_HELD_RELEASED			/* released without failure */
} IdemHeldSettle;

/*
 * A held claim is addressed by its ref, which stays the same while it is
 * held (the entries themselves move); IDEM_HELD_NONE: none.
 */
typedef uint32 IdemHeldRef;

#define IDEM_HELD_NONE	((IdemHeldRef) 0)

/* A fresh claim of this transaction whose record is not written yet. */
typedef struct IdemHeldClaim
{
	IdemHeldRef ref;
	text	   *tenant_id;
	text	   *key;
	text	   *fingerprint;	/* NULL: none */
	text	   *holder;			/* NULL: none */
	Oid			schema;			/* where the table is */
	Oid			table;
	Oid			owner;			/* the table's owner, who writes it */
	int64		token;
	TimestampTz created_at;
	TimestampTz lease_expires_at;
	int64		ttl_us;
	CommandId	claim_cid;		/* the command ID its INSERT would have had */
	IdemHeldSettle settle;
	CommandId	settle_cid;		/* ... and its UPDATE or DELETE */
	IdemStatus	status;			/* IDEM_HELD_FINISHED: completed or failed */
	Datum		response;		/* 0: none */
	bool		response_isnull;
	TimestampTz settled_at;
	SubTransactionId written_in;	/* written in this subxact (rolls back) */
} IdemHeldClaim;

extern PGDLLIMPORT bool idem_claims_held;
extern bool idem_held_allowed(Oid table);
extern IdemHeldRef idem_held_find(const IdemKey *k, AclMode mode);
extern const IdemHeldClaim *idem_held_get(IdemHeldRef ref);
extern bool idem_held_add(const IdemKey *k, text *fingerprint, text *holder,
						  int64 token, TimestampTz now,
						  TimestampTz lease_expires_at, int64 ttl_us);
extern bool idem_held_finish(IdemHeldRef ref, IdemStatus status,
								Datum response, bool response_isnull,
								TimestampTz now);
extern bool idem_held_release(IdemHeldRef ref, TimestampTz now);
extern void idem_held_materialize(IdemHeldRef ref);
extern void idem_held_write_all(void);
extern void idem_held_write_final(void);
extern bool idem_held_table_in(List *relation_oids);
extern void idem_held_xact_ended(void);
extern void idem_held_subxact_ended(SubTransactionId sub,
									SubTransactionId parent, bool committed);

#endif							/* IDEM_HELD_H */
