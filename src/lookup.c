/*
 * lookup.c
 *		Operator tools: idem_lookup (read one record) and idem_forget
 *		(remove one record in any state).
 */
#include "postgres.h"

#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "direct_read.h"
#include "held.h"
#include "idempotency.h"
#include "keylock.h"
#include "record.h"
#include "store.h"
#include "store_attach.h"
#include "validate.h"

PG_FUNCTION_INFO_V1(idem_lookup);
PG_FUNCTION_INFO_V1(idem_forget);

/*
 * idem_lookup(tenant_id, key) RETURNS SETOF (status, token, response,
 *		fingerprint, lease_expires_at, expires_at, created_at, updated_at,
 *		recovery_point, state, holder); recovery_point and state from 1.1
 *		on, holder from 1.4 on (the row has the columns the function's
 *		OUT parameters name)
 *
 * Zero or one row, as stored, except that a processing record whose lease
 * ended and that keeps a recovery point for the next delivery shows the
 * status "resumable".  An expired record is shown until the sweeper removes
 * it (compare expires_at with now()).  Read-only.
 */
Datum
idem_lookup(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	IdemKey		k;
	IdemRecord	rec;

	k.tenant_id = idem_arg_identifier(fcinfo, 0, "tenant_id", true);
	k.key = idem_arg_identifier(fcinfo, 1, "key", true);
	idem_store_check_tenant(fcinfo, k.tenant_id);

	/*
	 * A call planned before ALTER EXTENSION idempotency UPDATE dropped and
	 * created idem_lookup again (1.4) can run after that commits, when its
	 * function is gone: it returns the columns its query expects.
	 */
	InitMaterializedSRF(fcinfo,
						SearchSysCacheExists1(PROCOID,
											  ObjectIdGetDatum(fcinfo->flinfo->fn_oid)) ?
						0 : MAT_SRF_USE_EXPECTED_DESC);

	/* held claims: written before this statement started (hooks.c), or
	 * now, when it is called outside any statement (a PL/pgSQL expression) */
	idem_held_write_all();
	idem_store_begin(fcinfo);
	if (idem_store_read(&k, &rec, false))
	{
		Datum		values[11];
		bool		nulls[11] = {false};

		values[0] = CStringGetTextDatum(idem_record_resumable(&rec, GetCurrentTimestamp()) ?
										"resumable" : idem_status_name(rec.status));
		values[1] = Int64GetDatum(rec.token);
		values[2] = rec.response;
		nulls[2] = rec.response_isnull;
		values[3] = PointerGetDatum(rec.fingerprint);
		nulls[3] = rec.fingerprint == NULL;
		values[4] = TimestampTzGetDatum(rec.lease_expires_at);
		nulls[4] = rec.lease_isnull;
		values[5] = TimestampTzGetDatum(rec.expires_at);
		values[6] = TimestampTzGetDatum(rec.created_at);
		values[7] = TimestampTzGetDatum(rec.updated_at);
		/* from 1.1 on: the last recovery point and its state */
		values[8] = PointerGetDatum(rec.recovery_point);
		nulls[8] = rec.recovery_point == NULL;
		values[9] = rec.state;
		nulls[9] = rec.state == (Datum) 0;
		/* from 1.4 on: who claimed it */
		values[10] = PointerGetDatum(rec.holder);
		nulls[10] = rec.holder == NULL;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	idem_store_end();

	return (Datum) 0;
}

/*
 * idem_forget(tenant_id, key) RETURNS boolean
 *
 * Remove the record whatever its state; true if there was one.  A holder
 * that later completes or releases gets "no record" (fencing), and the key
 * can be claimed afresh.  Waits for a claim of the key in flight.
 */
Datum
idem_forget(PG_FUNCTION_ARGS)
{
	IdemKey		k;
	bool		removed;

	k.tenant_id = idem_arg_identifier(fcinfo, 0, "tenant_id", true);
	k.key = idem_arg_identifier(fcinfo, 1, "key", true);
	idem_store_check_tenant(fcinfo, k.tenant_id);

	/* held claims: written before this statement started (hooks.c), or
	 * now, when it is called outside any statement (a PL/pgSQL expression) */
	idem_held_write_all();
	idem_store_begin(fcinfo);
	idem_keylock_take(&k, idem_direct_inserter);
	removed = idem_store_forget(&k);
	idem_store_end();

	PG_RETURN_BOOL(removed);
}
