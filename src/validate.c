/*
 * validate.c
 *		Argument checks shared by every SQL function.
 *
 * All checks run before anything is read or written, so a rejected call
 * changes nothing.  Sizes are taken from the datum header, never by
 * detoasting, so an oversized argument costs nothing to reject.
 */
#include "postgres.h"

#include "access/detoast.h"
#include "common/int.h"
#include "utils/jsonb.h"

#include "guc.h"
#include "idempotency.h"
#include "validate.h"

/*
 * A tenant_id, key or fingerprint argument: NULL is refused when required
 * (and returned as NULL otherwise), empty strings are refused, and the
 * length is capped at IDEM_MAX_IDENTIFIER_BYTES.
 */
text *
idem_arg_identifier(FunctionCallInfo fcinfo, int argno, const char *name,
					bool required)
{
	Datum		d;
	Size		bytes;

	if (PG_ARGISNULL(argno))
	{
		if (required)
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not be null", name)));
		return NULL;
	}

	d = PG_GETARG_DATUM(argno);
	bytes = toast_raw_datum_size(d) - VARHDRSZ;

	if (bytes == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", name)));
	if (bytes > IDEM_MAX_IDENTIFIER_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("%s is too long", name),
				 errdetail("%s has %zu bytes; the limit is %d.",
						   name, bytes, IDEM_MAX_IDENTIFIER_BYTES)));

	return DatumGetTextPP(d);
}

/*
 * The token of a claim: required and positive (tokens start above zero).
 */
int64
idem_arg_token(FunctionCallInfo fcinfo, int argno)
{
	int64		token;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("token must not be null")));
	token = PG_GETARG_INT64(argno);
	if (token <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("token must be positive"),
				 errdetail("Tokens returned by idem_claim are always greater than zero.")));
	return token;
}

/*
 * An interval argument converted to microseconds, with a month counted as
 * 30 days and a day as 24 hours (the convention of interval comparison).
 * Fixed-length arithmetic keeps expiries independent of the session's time
 * zone, so every node computes the same instant.
 *
 * NULL gives default_us.  Negative values are refused; zero only when
 * zero_allowed (a wait of zero means "do not wait").
 */
int64
idem_arg_duration(FunctionCallInfo fcinfo, int argno, const char *name,
				  int64 default_us, bool zero_allowed)
{
	Interval   *span;
	int64		us;
	int64		days_us;
	int64		months_us;

	if (PG_ARGISNULL(argno))
		return default_us;

	span = PG_GETARG_INTERVAL_P(argno);
	if (pg_mul_s64_overflow((int64) span->day, USECS_PER_DAY, &days_us) ||
		pg_mul_s64_overflow((int64) span->month, DAYS_PER_MONTH * USECS_PER_DAY, &months_us) ||
		pg_add_s64_overflow(span->time, days_us, &us) ||
		pg_add_s64_overflow(us, months_us, &us))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is out of range", name)));

	/*
	 * The longest duration keeps every expiry computed from it, now or when
	 * the claim is settled later, far inside the timestamp range.
	 */
	if (us > IDEM_MAX_DURATION_US)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is out of range", name),
				 errdetail("The longest %s is %d years.", name, IDEM_MAX_DURATION_YEARS)));

	if (us < 0 || (us == 0 && !zero_allowed))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be %s", name,
						zero_allowed ? "zero or positive" : "positive"),
				 errdetail("The value given is %s microseconds.",
						   psprintf(INT64_FORMAT, us))));
	return us;
}

/*
 * at + duration, refusing results past the end of the timestamp range.
 */
TimestampTz
idem_add_duration(TimestampTz at, int64 duration_us, const char *name)
{
	TimestampTz result;

	if (pg_add_s64_overflow(at, duration_us, &result) ||
		!IS_VALID_TIMESTAMP(result))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is out of range", name),
				 errdetail("The resulting expiry is past the largest timestamp.")));
	return result;
}

/*
 * A jsonb response or failure argument, checked against
 * idempotency.max_response_size before it is detoasted.
 */
Datum
idem_arg_jsonb(FunctionCallInfo fcinfo, int argno, const char *name,
			   bool *isnull)
{
	Datum		d;
	Size		bytes;

	*isnull = PG_ARGISNULL(argno);
	if (*isnull)
		return (Datum) 0;

	d = PG_GETARG_DATUM(argno);
	bytes = toast_raw_datum_size(d) - VARHDRSZ;
	if (bytes > (Size) idem_max_response_size)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("%s is too large", name),
				 errdetail("The %s takes %zu bytes; idempotency.max_response_size is %d bytes.",
						   name, bytes, idem_max_response_size)));
	return d;
}

/*
 * Refuse a retention below idempotency.min_ttl: a broker may still
 * redeliver a message whose record has already gone.
 */
void
idem_check_ttl_floor(int64 ttl_us)
{
	if (idem_min_ttl_s > 0 && ttl_us < (int64) idem_min_ttl_s * USECS_PER_SEC)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl is shorter than idempotency.min_ttl"),
				 errdetail("The ttl asked for is %s seconds; the floor is %d seconds.",
						   psprintf("%.3f", (double) ttl_us / USECS_PER_SEC),
						   idem_min_ttl_s),
				 errhint("Ask for a longer ttl, or have an administrator lower idempotency.min_ttl.")));
}

/* Byte-for-byte equality of two texts (keys, tenants, fingerprints). */
bool
idem_text_equal(const text *a, const text *b)
{
	return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}
