/*
 * claim.h
 *		Claiming one key: read, decide, lock, write (claim.c).
 */
#ifndef IDEM_CLAIM_H
#define IDEM_CLAIM_H

#include "fmgr.h"

#include "idempotency.h"

typedef struct IdemClaimArgs
{
	text	   *fingerprint;	/* NULL: no check */
	int64		lease_us;
	int64		ttl_us;
	int64		wait_us;		/* 0: never wait */
	bool		may_defer;		/* a fresh claim may be held (held.c) */
	text	   *holder;			/* NULL: none; else may re-enter its claim */
} IdemClaimArgs;

extern void idem_claim_args(FunctionCallInfo fcinfo, int lease_arg,
							int ttl_arg, int wait_arg, IdemClaimArgs *args);
extern void idem_claim_one(const IdemKey *k, const IdemClaimArgs *args,
						   IdemClaimResult *res);
extern bool idem_claim_one_connecting(FunctionCallInfo fcinfo, const IdemKey *k,
									  const IdemClaimArgs *args,
									  IdemClaimResult *res);
extern bool idem_claim_decide(const IdemRecord *rec, const IdemClaimArgs *args,
							  TimestampTz now, IdemClaimResult *res);
extern const char *idem_outcome_name(IdemOutcome outcome);
extern void idem_claim_result_columns(const IdemClaimResult *res,
									  Datum *values, bool *nulls, int ncolumns);

#endif							/* IDEM_CLAIM_H */
