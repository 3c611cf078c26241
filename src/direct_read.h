/*
 * direct_read.h
 *		A record read by primary key without SPI: the replay fast path
 *		(direct_read.c).
 */
#ifndef IDEM_DIRECT_READ_H
#define IDEM_DIRECT_READ_H

#include "idempotency.h"

extern void idem_direct_read_attach(Oid table, Oid key_index,
									bool distributed,
									const char *isolation_setting);
extern bool idem_direct_read(const IdemKey *k, IdemRecord *rec,
							 bool fresh_snapshot, bool *found);
extern bool idem_direct_probe_available(void);
extern TransactionId idem_direct_inserter(const IdemKey *k);
extern bool idem_direct_key_taken(const IdemKey *k, TransactionId *inserter);

typedef struct IdemKeyProbe IdemKeyProbe;
extern IdemKeyProbe *idem_direct_probe_begin(void);
extern bool idem_direct_probe_key(IdemKeyProbe *p, const IdemKey *k,
								  TransactionId *inserter);
extern void idem_direct_probe_keys(IdemKeyProbe *p, text *tenant_id,
								   text **keys, int n,
								   void (*taken) (void *arg, text *key,
												  TransactionId inserter),
								   void *arg);
extern void idem_direct_probe_end(IdemKeyProbe *p);

#endif							/* IDEM_DIRECT_READ_H */
