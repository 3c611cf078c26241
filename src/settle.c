/*
 * settle.c
 *		The fenced writes of a claim holder: idem_complete, idem_release,
 *		idem_heartbeat and idem_checkpoint.
 *
 * Each one names the token its claim returned and succeeds only while that
 * token is the record's current token and the record is still processing.
 * A holder whose lease was taken over (a "zombie") therefore gets an error
 * and changes nothing; the new owner's outcome stands.
 */
#include "postgres.h"

#include "access/xact.h"
#include "replication/syncrep.h"
#include "utils/timestamp.h"

#include "direct_read.h"
#include "guc.h"
#include "held.h"
#include "idempotency.h"
#include "keylock.h"
#include "record.h"
#include "stats.h"
#include "store.h"
#include "store_attach.h"
#include "tokens.h"
#include "validate.h"

PG_FUNCTION_INFO_V1(idem_complete);
PG_FUNCTION_INFO_V1(idem_release);
PG_FUNCTION_INFO_V1(idem_heartbeat);
PG_FUNCTION_INFO_V1(idem_checkpoint);

/* A token that is not the key's current token. */
static void
refuse_token(int64 token, const char *action)
{
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_TOKEN_MISMATCH),
			 errmsg("cannot %s: token " INT64_FORMAT " does not hold this key", action, token),
			 errdetail("The claim's lease expired and a newer claim took the key over, or the token is wrong."),
			 errhint("Stop working on this key: its outcome belongs to the newer claim.")));
}

/*
 * A fenced write matched no row: say why, in the order that helps a caller
 * most (unknown key, then a newer owner, then already settled).
 */
static void
report_refused(const IdemKey *k, int64 token, const char *action)
{
	IdemRecord	rec;

	if (!idem_store_read(k, &rec, true))
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_KEY_NOT_FOUND),
				 errmsg("cannot %s: no record exists for this key", action),
				 errdetail("The key was never claimed, or it was released, forgotten or swept.")));
	if (rec.token != token)
		refuse_token(token, action);
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_NOT_PROCESSING),
			 errmsg("cannot %s: the key is already %s", action, idem_status_name(rec.status))));
}

/*
 * A stored outcome is the promise that the key never runs again.  If the
 * commit that stores it can be acknowledged and then lost (asynchronous
 * commit, or a local-only commit where a synchronous standby is expected),
 * a crash or failover re-opens the key and the work runs twice.  (fsync =
 * off is a server-wide choice that risks far more than this, and test
 * servers use it; it is documented rather than checked.)
 * idempotency.durability_check decides whether that is reported or refused.
 */
static void
check_durability(const char *action)
{
	const char *weakness = NULL;

	if (idem_durability_check == IDEM_DURABILITY_OFF)
		return;
	if (synchronous_commit == SYNCHRONOUS_COMMIT_OFF)
		weakness = "synchronous_commit is off";
	else if (synchronous_commit == SYNCHRONOUS_COMMIT_LOCAL_FLUSH &&
			 SyncRepStandbyNames != NULL && SyncRepStandbyNames[0] != '\0')
		weakness = "synchronous_commit is local while synchronous_standby_names is set";
	if (weakness == NULL)
		return;

	ereport(idem_durability_check == IDEM_DURABILITY_ERROR ? ERROR : WARNING,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("%s stores an outcome that a crash or failover can lose: %s", action, weakness),
			 errdetail("If the commit is lost after it was acknowledged, the key can be claimed and the work run again."),
			 errhint("Use synchronous_commit = on (or remote_apply with a synchronous standby) for transactions that settle claims, or set idempotency.durability_check = off to accept the risk.")));
}

/*
 * The held claim of k in this transaction (held.c), if any, when the
 * caller may do what the settle's statement does (mode: ACL_UPDATE or
 * ACL_DELETE); otherwise the claim is written and the statement meets its
 * privilege error first, as on a written claim.  A held claim's token is
 * the key's current token, so any other token is refused here exactly as
 * the record would refuse it.
 */
static IdemHeldRef
held_claim(const IdemKey *k, int64 token, const char *action, AclMode mode)
{
	IdemHeldRef ref = idem_held_find(k, mode);

	if (ref != IDEM_HELD_NONE && idem_held_get(ref)->token != token)
		refuse_token(token, action);
	return ref;
}

/*
 * Read the (tenant_id, key, token) arguments every fenced write starts
 * with, and refuse a tenant the session may not see (store_attach.c).
 */
static void
fenced_args(FunctionCallInfo fcinfo, IdemKey *k, int64 *token)
{
	k->tenant_id = idem_arg_identifier(fcinfo, 0, "tenant_id", true);
	k->key = idem_arg_identifier(fcinfo, 1, "key", true);
	*token = idem_arg_token(fcinfo, 2);
	idem_store_check_tenant(fcinfo, k->tenant_id);
}

/*
 * idem_complete(tenant_id, key, token, response) RETURNS void
 *
 * Store the response; the record is kept for the claim's ttl.
 */
Datum
idem_complete(PG_FUNCTION_ARGS)
{
	IdemKey		k;
	int64		token;
	Datum		response;
	bool		response_isnull;
	IdemHeldRef held;

	fenced_args(fcinfo, &k, &token);
	response = idem_arg_jsonb(fcinfo, 3, "response", &response_isnull);
	check_durability("idem_complete");

	held = held_claim(&k, token, "complete", ACL_UPDATE);
	if (held == IDEM_HELD_NONE ||
		!idem_held_finish(held, IDEM_COMPLETED, response, response_isnull,
							 GetCurrentTimestamp()))
	{
		idem_store_begin(fcinfo);
		idem_keylock_take(&k, idem_direct_inserter);
		if (!idem_store_finish(&k, token, IDEM_COMPLETED, response,
							   response_isnull, GetCurrentTimestamp()))
			report_refused(&k, token, "complete");
		idem_store_end();
	}
	idem_stats_add(IDEM_STAT_COMPLETES, 1);

	PG_RETURN_VOID();
}

/*
 * Release a written claim without a failure: delete its record, or hand a
 * record with a recovery point on under the successor of token.  The
 * successor is taken only for a record token holds, so a wrong token is
 * refused for what it is (ID001/ID002/ID003), not for having no successor.
 */
static bool
release_claim(const IdemKey *k, int64 token, TimestampTz now)
{
	IdemRecord	rec;

	if (idem_store_delete_claim(k, token))
		return true;
	if (!idem_store_has_checkpoints() || !idem_store_read(k, &rec, true) ||
		rec.token != token || rec.status != IDEM_PROCESSING ||
		rec.recovery_point == NULL)
		return false;
	return idem_store_hand_on(k, token,
							  idem_successor_token(idem_store_token_sequence(), now, token),
							  now);
}

/*
 * idem_release(tenant_id, key, token, failure) RETURNS void
 *
 * Without failure the record is deleted and the key can be claimed again;
 * with it the record becomes 'failed' and later claims replay the failure.
 */
Datum
idem_release(PG_FUNCTION_ARGS)
{
	IdemKey		k;
	int64		token;
	Datum		failure;
	bool		failure_isnull;
	bool		done;
	IdemHeldRef held;

	fenced_args(fcinfo, &k, &token);
	failure = idem_arg_jsonb(fcinfo, 3, "failure", &failure_isnull);
	if (!failure_isnull)
		check_durability("idem_release");

	held = held_claim(&k, token, "release",
					  failure_isnull ? ACL_DELETE : ACL_UPDATE);
	if (held == IDEM_HELD_NONE ||
		!(failure_isnull ?
		  idem_held_release(held, GetCurrentTimestamp()) :
		  idem_held_finish(held, IDEM_FAILED, failure, false,
							  GetCurrentTimestamp())))
	{
		TimestampTz now = GetCurrentTimestamp();

		idem_store_begin(fcinfo);
		idem_keylock_take(&k, idem_direct_inserter);
		if (failure_isnull)
			done = release_claim(&k, token, now);
		else
			done = idem_store_finish(&k, token, IDEM_FAILED, failure, false,
									 GetCurrentTimestamp());
		if (!done)
			report_refused(&k, token, "release");
		idem_store_end();
	}
	idem_stats_add(IDEM_STAT_RELEASES, 1);

	PG_RETURN_VOID();
}

/*
 * idem_heartbeat(tenant_id, key, token, lease) RETURNS timestamptz
 *
 * Extend a claim's lease to now + lease and return the new expiry.  A
 * claim whose lease ran out but that nobody took over may still extend it:
 * the token, not the clock, decides who owns the key.
 */
Datum
idem_heartbeat(PG_FUNCTION_ARGS)
{
	IdemKey		k;
	int64		token;
	int64		lease_us;
	TimestampTz now;
	TimestampTz lease_end;
	IdemHeldRef held;

	fenced_args(fcinfo, &k, &token);
	lease_us = idem_arg_duration(fcinfo, 3, "lease",
								 (int64) idem_default_lease_ms * 1000, false);
	now = GetCurrentTimestamp();
	lease_end = idem_add_duration(now, lease_us, "lease");

	/* a held claim is written first, then extended as a written one */
	held = held_claim(&k, token, "heartbeat", ACL_UPDATE);
	if (held != IDEM_HELD_NONE)
		idem_held_materialize(held);
	idem_store_begin(fcinfo);
	idem_keylock_take(&k, idem_direct_inserter);
	if (!idem_store_extend_lease(&k, token, now, lease_end))
		report_refused(&k, token, "heartbeat");
	idem_store_end();
	idem_stats_add(IDEM_STAT_HEARTBEATS, 1);

	PG_RETURN_TIMESTAMPTZ(lease_end);
}

/*
 * idem_checkpoint(tenant_id, key, token, point, state, lease) RETURNS void
 *
 * Store a recovery point, and optional state, on the claim held by token,
 * in the caller's transaction: a phase's business writes and its
 * checkpoint commit or roll back together.  A later owner of the key (after
 * a takeover, or a release without failure) receives the last committed
 * point from idem_claim and resumes after it; the record is kept for that
 * until its retention (the claim's ttl) after the lease ends.  With lease
 * (1.2; the 1.1 function has five arguments), the lease is also extended
 * to now + lease: a phase that checkpoints proves its holder is alive.
 */
Datum
idem_checkpoint(PG_FUNCTION_ARGS)
{
	IdemKey		k;
	int64		token;
	text	   *point;
	Datum		state;
	bool		state_isnull;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz lease_end = 0;	/* 0: the lease stays as it is */
	IdemHeldRef held;

	fenced_args(fcinfo, &k, &token);
	point = idem_arg_identifier(fcinfo, 3, "point", true);
	state = idem_arg_jsonb(fcinfo, 4, "state", &state_isnull);
	if (state_isnull)
		state = (Datum) 0;
	if (PG_NARGS() > 5 && !PG_ARGISNULL(5))
		lease_end = idem_add_duration(now, idem_arg_duration(fcinfo, 5, "lease", 0, false),
									  "lease");

	/* a held claim is written first, then checkpointed as a written one */
	held = held_claim(&k, token, "checkpoint", ACL_UPDATE);
	if (held != IDEM_HELD_NONE)
		idem_held_materialize(held);
	idem_store_begin(fcinfo);
	if (!idem_store_has_checkpoints())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("recovery points need version 1.1 of the idempotency extension"),
				 errhint("Run ALTER EXTENSION idempotency UPDATE.")));
	idem_keylock_take(&k, idem_direct_inserter);
	if (!idem_store_checkpoint(&k, token, point, state, now, lease_end))
		report_refused(&k, token, "checkpoint");
	idem_store_end();

	PG_RETURN_VOID();
}
