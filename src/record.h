/*
 * record.h
 *		A record's values: its status, the columns that are never NULL, how
 *		long it lives (record.c).
 */
#ifndef IDEM_RECORD_H
#define IDEM_RECORD_H

#include "idempotency.h"

extern Datum idem_stale_failure_response(void);
extern const char *idem_status_name(IdemStatus status);
extern IdemStatus idem_status_from_text(text *t);
extern TimestampTz idem_record_live_until(const IdemRecord *rec);
extern bool idem_record_resumable(const IdemRecord *rec, TimestampTz now);
extern void idem_check_not_null(bool isnull, const char *column);

#endif							/* IDEM_RECORD_H */
