/*
 * claim_many.c
 *		idem_claim_many: claim a consumer's whole batch of keys (one tenant)
 *		in one statement.
 *
 * Each key goes through exactly the same decision as idem_claim
 * (claim.c), in input order, within one SPI connection; a key repeated in
 * the array is claimed once and is in_progress after that, as a second
 * idem_claim in the same transaction would be.  The saving is the client
 * round trips, not the per-key work.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "idempotency.h"

PG_FUNCTION_INFO_V1(idem_claim_many);

/*
 * The largest batch.  Every claimed key holds a key lock until the
 * transaction ends, and those come out of the shared lock table
 * (max_locks_per_transaction x max_connections slots).
 */
#define IDEM_CLAIM_MANY_MAX		1000

/* Deconstruct a one-dimensional text[] argument (NULL elements allowed). */
static int
text_array_arg(FunctionCallInfo fcinfo, int argno, const char *name,
			   Datum **elems, bool **nulls)
{
	ArrayType  *arr = PG_GETARG_ARRAYTYPE_P(argno);
	int			n;

	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a one-dimensional array", name)));
	n = ArrayGetNItems(ARR_NDIM(arr), ARR_DIMS(arr));
	if (n > IDEM_CLAIM_MANY_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("%s has too many elements", name),
				 errdetail("%s has %d elements; idem_claim_many takes at most %d.",
						   name, n, IDEM_CLAIM_MANY_MAX),
				 errhint("Split the batch.")));
	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, elems, nulls, &n);
	return n;
}

/*
 * Check one array element as an identifier, the way idem_arg_identifier
 * checks a scalar argument.
 */
static text *
element_identifier(Datum d, bool isnull, const char *name, int index,
				   bool required)
{
	Size		bytes;

	if (isnull)
	{
		if (required)
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s[%d] must not be null", name, index)));
		return NULL;
	}
	bytes = VARSIZE_ANY_EXHDR(DatumGetPointer(d));
	if (bytes == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s[%d] must not be empty", name, index)));
	if (bytes > IDEM_MAX_IDENTIFIER_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("%s[%d] is too long", name, index),
				 errdetail("It has %zu bytes; the limit is %d.",
						   bytes, IDEM_MAX_IDENTIFIER_BYTES)));
	return DatumGetTextPP(d);
}

/*
 * idem_claim_many(tenant_id, keys, fingerprints, lease, ttl)
 *		RETURNS SETOF (key, outcome, token, response, expires_at)
 *
 * One row per element of keys, in order.  All arguments are checked before
 * any key is claimed, so a bad element changes nothing.
 */
Datum
idem_claim_many(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	text	   *tenant_id;
	Datum	   *key_elems;
	bool	   *key_nulls;
	Datum	   *fp_elems = NULL;
	bool	   *fp_nulls = NULL;
	int			nkeys;
	IdemClaimArgs args;
	IdemKey    *keys;
	text	  **fingerprints;

	tenant_id = idem_arg_identifier(fcinfo, 0, "tenant_id", true);
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("keys must not be null")));
	nkeys = text_array_arg(fcinfo, 1, "keys", &key_elems, &key_nulls);
	if (!PG_ARGISNULL(2))
	{
		int			nfp = text_array_arg(fcinfo, 2, "fingerprints", &fp_elems, &fp_nulls);

		if (nfp != nkeys)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("fingerprints must have as many elements as keys"),
					 errdetail("keys has %d elements, fingerprints has %d.", nkeys, nfp)));
	}
	idem_claim_args(fcinfo, 3, 4, -1, &args);

	keys = palloc(sizeof(IdemKey) * Max(nkeys, 1));
	fingerprints = palloc(sizeof(text *) * Max(nkeys, 1));
	for (int i = 0; i < nkeys; i++)
	{
		keys[i].tenant_id = tenant_id;
		keys[i].key = element_identifier(key_elems[i], key_nulls[i], "keys", i + 1, true);
		fingerprints[i] = fp_elems == NULL ? NULL :
			element_identifier(fp_elems[i], fp_nulls[i], "fingerprints", i + 1, false);
	}

	InitMaterializedSRF(fcinfo, 0);

	idem_store_begin(fcinfo);
	for (int i = 0; i < nkeys; i++)
	{
		IdemClaimResult res;
		Datum		values[5];
		bool		nulls[5];

		args.fingerprint = fingerprints[i];
		idem_claim_one(&keys[i], &args, &res);
		idem_stats_count_claim(&res);

		values[0] = PointerGetDatum(keys[i].key);
		nulls[0] = false;
		idem_claim_result_columns(&res, values + 1, nulls + 1);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	idem_store_end();

	return (Datum) 0;
}
