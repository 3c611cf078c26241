/*
 * store.h
 *		The statements of one key on idempotency_records (store.c).
 */
#ifndef IDEM_STORE_H
#define IDEM_STORE_H

#include "idempotency.h"

extern bool idem_store_read(const IdemKey *k, IdemRecord *rec,
							bool fresh_snapshot);
extern bool idem_store_read_statement(const IdemKey *k, IdemRecord *rec,
									  bool fresh_snapshot);
extern uint64 idem_store_insert_many(text *tenant_id, Datum keys, Datum tokens,
									 Datum fingerprints, TimestampTz now,
									 TimestampTz lease_expires_at, int64 ttl_us,
									 bool speculative,
									 void (*inserted) (void *arg, text *key),
									 void *arg);
extern bool idem_store_insert(const IdemKey *k, text *fingerprint,
							  text *holder, int64 token, TimestampTz now,
							  TimestampTz lease_expires_at, int64 ttl_us);
extern bool idem_store_take_over(const IdemKey *k, int64 old_token,
								 int64 new_token, text *fingerprint,
								 text *holder, bool new_lifetime,
								 TimestampTz now,
								 TimestampTz lease_expires_at, int64 ttl_us);
extern bool idem_store_fail_stale(const IdemKey *k, int64 old_token,
								  TimestampTz now, IdemRecord *rec);
extern bool idem_store_finish(const IdemKey *k, int64 token, IdemStatus status,
							  Datum response, bool response_isnull,
							  TimestampTz now);
extern bool idem_store_delete_claim(const IdemKey *k, int64 token);
extern bool idem_store_hand_on(const IdemKey *k, int64 token, int64 new_token,
							   TimestampTz now);
extern bool idem_store_checkpoint(const IdemKey *k, int64 token, text *point,
								  Datum state, TimestampTz now,
								  TimestampTz lease_end);
extern bool idem_store_extend_lease(const IdemKey *k, int64 token,
									TimestampTz now,
									TimestampTz lease_expires_at);
extern bool idem_store_forget(const IdemKey *k);

#endif							/* IDEM_STORE_H */
