/*
 * store_direct.h
 *		A held claim's writes, without the executor's privilege checks
 *		(store_direct.c).
 */
#ifndef IDEM_STORE_DIRECT_H
#define IDEM_STORE_DIRECT_H

#include "storage/itemptr.h"

#include "idempotency.h"

/* a record's row as a held claim writes it */
typedef struct IdemDirectRow
{
	const IdemKey *key;
	int64		token;
	IdemStatus	status;			/* processing: expires at the lease's end;
								 * else ttl after updated_at, no lease */
	TimestampTz created_at;
	TimestampTz updated_at;
	TimestampTz lease_expires_at;
	int64		ttl_us;
	text	   *fingerprint;	/* or NULL */
	text	   *holder;			/* or NULL (and none before 1.4) */
	Datum		response;
	bool		response_isnull;
} IdemDirectRow;

extern ItemPointerData idem_direct_insert(Oid table, const IdemDirectRow *row, CommandId cid);
extern void idem_direct_update(Oid table, ItemPointer tid, const IdemDirectRow *row,
							   CommandId cid);
extern void idem_direct_delete(Oid table, ItemPointer tid, CommandId cid);

#endif							/* IDEM_STORE_DIRECT_H */
