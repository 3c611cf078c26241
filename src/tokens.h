/*
 * tokens.h
 *		Fencing tokens that never go backwards (tokens.c).
 */
#ifndef IDEM_TOKENS_H
#define IDEM_TOKENS_H

#include "idempotency.h"

extern void idem_tokens_request_shmem(void);
extern int64 idem_fresh_token(Oid sequence, TimestampTz now);
extern int64 idem_fresh_tokens(Oid sequence, TimestampTz now, int n);
extern int64 idem_successor_token(Oid sequence, TimestampTz now, int64 old);

#endif							/* IDEM_TOKENS_H */
