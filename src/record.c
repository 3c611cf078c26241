/*
 * record.c
 *		The values of a record as the C code reads them: its status, and
 *		the columns that may never be NULL.
 *
 * Shared by the two ways a record is read (store.c through SPI,
 * direct_read.c from the key index), so that both refuse a row the same
 * way.  Calls nothing of the extension.
 */
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"

#include "idempotency.h"
#include "record.h"

static Datum stale_failure_response = (Datum) 0;

/* The status column's value; the first letter tells the three apart. */
IdemStatus
idem_status_from_text(text *t)
{
	const char *s = VARDATA_ANY(t);

	if (VARSIZE_ANY_EXHDR(t) > 0)
	{
		switch (s[0])
		{
			case 'p':
				return IDEM_PROCESSING;
			case 'c':
				return IDEM_COMPLETED;
			case 'f':
				return IDEM_FAILED;
		}
	}
	ereport(ERROR,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("idempotency record has unknown status \"%s\"", text_to_cstring(t))));
	return IDEM_FAILED;			/* keep compiler quiet */
}

const char *
idem_status_name(IdemStatus status)
{
	switch (status)
	{
		case IDEM_PROCESSING:
			return "processing";
		case IDEM_COMPLETED:
			return "completed";
		case IDEM_FAILED:
			return "failed";
	}
	return "unknown";
}

/*
 * Until when a record answers claims as it is: a processing record's
 * lease, any other record's expiry.  A processing record with a recovery
 * point outlives its lease: it expires when its retention after the lease
 * ends, and meanwhile the next claim resumes it (statements.c's LIVE_UNTIL is
 * the same rule in SQL).
 */
TimestampTz
idem_record_live_until(const IdemRecord *rec)
{
	if (rec->status == IDEM_PROCESSING && !rec->lease_isnull)
		return rec->lease_expires_at;
	return rec->expires_at;
}

/*
 * A processing record whose lease ended, kept for its recovery point: it
 * waits for the next delivery to resume it.  idem_lookup shows it as
 * "resumable".
 */
bool
idem_record_resumable(const IdemRecord *rec, TimestampTz now)
{
	return rec->status == IDEM_PROCESSING && rec->recovery_point != NULL &&
		idem_record_live_until(rec) <= now;
}

/*
 * A column the extension made NOT NULL was read as NULL: the constraint was
 * dropped and a row written around the functions.  Refuse, never read it.
 */
void
idem_check_not_null(bool isnull, const char *column)
{
	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("an idempotency record has a null value in column \"%s\"", column),
				 errdetail("The idempotency extension made the column NOT NULL, and its functions never store a null there."),
				 errhint("Correct or delete the record, and restore the column's NOT NULL constraint.")));
}

/*
 * The failure stored for a claim whose lease ran out under
 * stale_action = 'fail'.  Built once per backend.
 */
Datum
idem_stale_failure_response(void)
{
	if (stale_failure_response == (Datum) 0)
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

		stale_failure_response =
			DirectFunctionCall1(jsonb_in,
								CStringGetDatum("{\"error\": \"lease_expired\"}"));
		MemoryContextSwitchTo(old);
	}
	return stale_failure_response;
}
