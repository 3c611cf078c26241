/*
 * validate.h
 *		Argument checks shared by every SQL function (validate.c).
 */
#ifndef IDEM_VALIDATE_H
#define IDEM_VALIDATE_H

#include "fmgr.h"

#include "idempotency.h"

extern text *idem_arg_identifier(FunctionCallInfo fcinfo, int argno,
								 const char *name, bool required);
extern int64 idem_arg_token(FunctionCallInfo fcinfo, int argno);
extern int64 idem_arg_duration(FunctionCallInfo fcinfo, int argno,
							   const char *name, int64 default_us,
							   bool zero_allowed);
extern Datum idem_arg_jsonb(FunctionCallInfo fcinfo, int argno,
							const char *name, bool *isnull);
extern TimestampTz idem_add_duration(TimestampTz at, int64 duration_us,
									 const char *name);
extern void idem_check_ttl_floor(int64 ttl_us);
extern bool idem_text_equal(const text *a, const text *b);

#endif							/* IDEM_VALIDATE_H */
