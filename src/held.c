/*
 * held.c
 *		Fresh claims held in memory, and written exactly as they would have
 *		been written at once.
 *
 * In the usual pattern (BEGIN, claim, business writes, complete, COMMIT)
 * nobody but the claiming transaction ever sees the processing row a claim
 * inserts: other transactions learn that the key is taken from the key lock
 * (keylock.c).  So a fresh claim may be held here, and COMMIT writes the
 * record in its final form with one INSERT, instead of an INSERT followed
 * by an UPDATE (or, for a release without failure, by a DELETE).
 *
 * The rule is that nothing a user can observe differs from writing each
 * claim at once.  It holds by construction:
 *
 *	- When a claim is held, everything the INSERT would have done to the
 *	  rest of the system is done: the privilege checks (table and schema),
 *	  the table's and its indexes' RowExclusiveLock, the transaction ID, and
 *	  the command ID the INSERT would have been stamped with.  A claim is
 *	  held only while the table is exactly as the extension made it
 *	  (table_shape.c), so the INSERT would have run no code of anyone else,
 *	  and no one can change that while the lock is held.
 *
 *	- A settle of a held claim (complete, release) is recorded with its own
 *	  command ID, after the privilege checks its UPDATE or DELETE would have
 *	  made.  Anything else (a heartbeat, a checkpoint, a settle whose checks
 *	  fail, any call inside a subtransaction) first writes the claim, then
 *	  runs exactly as for a written claim.
 *
 *	- Before anything could read the table (hooks.c: a statement whose
 *	  plan names it, a utility command, one of our own reading functions),
 *	  held claims are written as their history: the processing row stamped
 *	  with the claim's command ID, then the settle stamped with its own.
 *	  Visibility of a transaction's own rows depends only on those command
 *	  IDs, so every snapshot, older or newer, running or to come, sees
 *	  exactly what it would have seen.
 *
 *	- At COMMIT nothing in this transaction can read any more, and other
 *	  transactions only see the final state: one INSERT of the record as it
 *	  ends (none for a release without failure).
 *
 * The caller's privileges are checked when the claim and its settle
 * happen, as the INSERT and UPDATE would have checked them then; the rows
 * are written later without those checks (store_direct.c), as the table's
 * owner in a security-restricted operation, so a REVOKE committed in
 * between does not reach back, as it does not for a written claim
 * (test/isolation/specs/held-claim-revoke.spec).
 *
 * Held claims and their copies live in a context of their own, under
 * TopTransactionContext, freed claim by claim as they are written.
 */
#include "postgres.h"

#include "access/detoast.h"
#include "access/heaptoast.h"
#include "access/relation.h"
#include "access/xact.h"
#include "catalog/pg_class.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "compat.h"
#include "guc.h"
#include "held.h"
#include "idempotency.h"
#include "store.h"
#include "store_attach.h"
#include "store_direct.h"
#include "table_shape.h"
#include "validate.h"

/*
 * At most this many claims are held at once, open or settled: a settled
 * claim stays held until it is written (before a reader, or at COMMIT), so
 * it counts as much as an open one.  Further claims are written at once: a
 * transaction claiming more keys loses nothing but the saving on those
 * (at 32, a loop claiming and completing 100 keys per transaction wrote 68
 * of them as an INSERT and an UPDATE, 1.44 times the bytes).  The bound
 * keeps a lookup among held claims a short scan and their memory small
 * (their copies of keys and responses: tens of kilobytes, at most a few
 * hundred, as a response that could be toasted is never held).
 */
#define IDEM_MAX_HELD	128

/*
 * The claims held by this transaction.  An entry written inside a
 * subtransaction stays (written_in) until that subtransaction ends: if it
 * rolls back, so does the write, and the claim is held again.
 */
static MemoryContext held_context = NULL;
static IdemHeldClaim *held = NULL;
static int	held_allocated = 0;
static int	held_used = 0;
static bool writing_all = false;
static IdemHeldRef last_ref = IDEM_HELD_NONE;	/* the ref given last */

/*
 * Some claim is held and not written: the executor and utility hooks
 * (hooks.c) do nothing else unless this is set.
 */
bool		idem_claims_held = false;

static CommandId act_as_statement(void);
static void materialize(IdemHeldClaim *p);

static bool
is_held(const IdemHeldClaim *p)
{
	return p->written_in == InvalidSubTransactionId;
}

static int
count_held(void)
{
	int			n = 0;

	for (int i = 0; i < held_used; i++)
		if (is_held(&held[i]))
			n++;
	return n;
}

static void
update_held_flag(void)
{
	idem_claims_held = count_held() > 0;
}

/* Drop entry i and its copies (order does not matter). */
static void
remove_entry(int i)
{
	IdemHeldClaim *p = &held[i];

	pfree(p->tenant_id);
	pfree(p->key);
	if (p->fingerprint != NULL)
		pfree(p->fingerprint);
	if (p->holder != NULL)
		pfree(p->holder);
	if (p->response != (Datum) 0)
		pfree(DatumGetPointer(p->response));
	held[i] = held[--held_used];
}

/*
 * The claim's record is written (or, released without failure at COMMIT,
 * never will be).  At the top level that is final; in a subtransaction it
 * is undone if the subtransaction rolls back.
 */
static void
mark_written(IdemHeldClaim *p)
{
	SubTransactionId sub = GetCurrentSubTransactionId();

	if (sub == TopSubTransactionId)
		remove_entry(p - held);
	else
		p->written_in = sub;
	update_held_flag();
}

/* May role do all of mode on table, in a schema it may use? */
static bool
role_may_use_table(Oid role, Oid schema, Oid table, AclMode mode)
{
	AclMode		each[] = {ACL_SELECT, ACL_INSERT, ACL_UPDATE, ACL_DELETE};

	if (idem_namespace_aclcheck(schema, role, ACL_USAGE) != ACLCHECK_OK)
		return false;
	for (size_t i = 0; i < lengthof(each); i++)
		if ((mode & each[i]) &&
			pg_class_aclcheck(table, role, each[i]) != ACLCHECK_OK)
			return false;
	return true;
}

/* May the current user do all of mode on table, in a schema it may use? */
static bool
may_use_table(Oid schema, Oid table, AclMode mode)
{
	return role_may_use_table(GetUserId(), schema, table, mode);
}

/*
 * May a fresh claim of table be held instead of written now?
 *
 * Only in a transaction block at the top level under READ COMMITTED, in a
 * read-write transaction, when the caller may read and insert (what the
 * claim's SELECT and INSERT check), and when the table is exactly as the
 * extension made it.  Never on a table distributed by Citus: the claim may
 * run in a task backend on a worker, which Citus lets run no more SQL once
 * the delegated call has returned.
 */
bool
idem_held_allowed(Oid table)
{
	if (!idem_defer_writes || idem_store_distributed() ||
		!IsTransactionBlock() ||
		IsolationUsesXactSnapshot() || XactReadOnly || IsInParallelMode() ||
		GetCurrentTransactionNestLevel() != 1 ||
		count_held() >= IDEM_MAX_HELD)
		return false;
	if (!idem_store_table_as_made())
		return false;
	/*
	 * The caller's checks, made now as the INSERT would make them.  The
	 * owner's rights do not matter: the held claim's rows are written
	 * without privilege checks (store_direct.c).
	 */
	return may_use_table(idem_store_schema(), table, ACL_SELECT | ACL_INSERT);
}

/*
 * The held claim of ref, or NULL when it is no longer held (written since,
 * or its transaction is over).  Entries move in the array (remove_entry,
 * repalloc): a pointer to one is good only until the next write.
 */
static IdemHeldClaim *
entry_of(IdemHeldRef ref)
{
	for (int i = 0; i < held_used; i++)
		if (held[i].ref == ref && is_held(&held[i]))
			return &held[i];
	return NULL;
}

/*
 * The held claim of ref as it is now, or NULL when it is no longer held.
 * The pointer is good until the next call into this file.
 */
const IdemHeldClaim *
idem_held_get(IdemHeldRef ref)
{
	return entry_of(ref);
}

/*
 * The held, unsettled claim of k in this transaction, or IDEM_HELD_NONE.  A held
 * claim of k that was settled already (completed, failed or released) is
 * written first, so that the caller reads and writes the key as it would
 * have been written; so is one whose record the caller may not read, or
 * may not change as mode says (the UPDATE or DELETE of a settle): the
 * caller's statement then meets its own privilege error, before anything
 * looks at the token, exactly as it would on a written claim.
 */
IdemHeldRef
idem_held_find(const IdemKey *k, AclMode mode)
{
	for (int i = 0; i < held_used; i++)
	{
		IdemHeldClaim *p = &held[i];

		if (!is_held(p) || !idem_text_equal(p->key, k->key) ||
			!idem_text_equal(p->tenant_id, k->tenant_id))
			continue;
		if (p->settle == IDEM_HELD_OPEN &&
			may_use_table(p->schema, p->table, ACL_SELECT | mode))
			return p->ref;
		materialize(p);
		return IDEM_HELD_NONE;
	}
	return IDEM_HELD_NONE;
}

/*
 * The locks and the transaction ID the INSERT of a processing row would
 * take, as the executor takes them: the table's RowExclusiveLock until the
 * transaction ends, and each index's for the statement only (its
 * ExecCloseIndices gives them back), so the claim waits for whatever holds
 * an index as the INSERT would, and keeps nothing of it.  (Its command ID
 * is act_as_statement's.  Planning an INSERT keeps locks on the indexes
 * too, but whether a statement is planned follows the plan cache, not the
 * claim: docs/held-claims.md lists it.)
 */
static void
lock_as_insert(Oid table)
{
	Relation	rel;
	List	   *indexes;
	ListCell   *lc;

	LockRelationOid(table, RowExclusiveLock);
	rel = relation_open(table, NoLock);
	indexes = RelationGetIndexList(rel);
	relation_close(rel, NoLock);
	foreach(lc, indexes)
	{
		LockRelationOid(lfirst_oid(lc), RowExclusiveLock);
		UnlockRelationOid(lfirst_oid(lc), RowExclusiveLock);
	}
	list_free(indexes);

	(void) GetCurrentTransactionId();
}

/*
 * The command ID a statement run through SPI now would write with: SPI
 * increments the command counter before every statement that may write.
 */
static CommandId
act_as_statement(void)
{
	CommandCounterIncrement();
	return GetCurrentCommandId(true);
}

/*
 * Hold a fresh claim.  The caller holds the key lock and has read, after
 * taking it, that the key has no record; idem_held_allowed() said yes.
 * Returns false when the claim must be written at once after all: taking
 * the INSERT's lock let in a change to the table that another session
 * committed meanwhile (a trigger, say), so it is no longer as made.
 */
bool
idem_held_add(const IdemKey *k, text *fingerprint, text *holder, int64 token,
			  TimestampTz now, TimestampTz lease_expires_at, int64 ttl_us)
{
	Oid			table = idem_store_table();
	CommandId	cid;
	MemoryContext old;
	IdemHeldClaim *p;

	lock_as_insert(table);
	if (!idem_store_table_as_made() || idem_store_table() != table)
		return false;
	cid = act_as_statement();

	if (held_context == NULL)
	{
		held_context = AllocSetContextCreate(TopTransactionContext,
												"idempotency held claims",
												ALLOCSET_SMALL_SIZES);
		held_allocated = 8;		/* most transactions hold one claim */
		held = MemoryContextAlloc(held_context,
									 sizeof(IdemHeldClaim) * held_allocated);
	}
	else if (held_used >= held_allocated)
	{
		held_allocated *= 2;
		held = repalloc(held, sizeof(IdemHeldClaim) * held_allocated);
	}
	old = MemoryContextSwitchTo(held_context);
	p = &held[held_used++];
	if (++last_ref == IDEM_HELD_NONE)
		++last_ref;
	p->ref = last_ref;
	p->tenant_id = (text *) PG_DETOAST_DATUM_COPY(PointerGetDatum(k->tenant_id));
	p->key = (text *) PG_DETOAST_DATUM_COPY(PointerGetDatum(k->key));
	p->fingerprint = fingerprint ?
		(text *) PG_DETOAST_DATUM_COPY(PointerGetDatum(fingerprint)) : NULL;
	p->holder = holder ?
		(text *) PG_DETOAST_DATUM_COPY(PointerGetDatum(holder)) : NULL;
	MemoryContextSwitchTo(old);

	p->schema = idem_store_schema();
	p->table = table;
	p->owner = idem_table_owner(table);
	p->token = token;
	p->created_at = now;
	p->lease_expires_at = lease_expires_at;
	p->ttl_us = ttl_us;
	p->claim_cid = cid;
	p->settle = IDEM_HELD_OPEN;
	p->settle_cid = InvalidCommandId;
	p->status = IDEM_PROCESSING;
	p->response = (Datum) 0;
	p->response_isnull = true;
	p->settled_at = 0;
	p->written_in = InvalidSubTransactionId;
	idem_claims_held = true;
	return true;
}

/* A record for the key exists although this transaction holds its lock. */
static void
report_lost_claim(const IdemHeldClaim *p)
{
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_TOKEN_MISMATCH),
			 errmsg("claim of key \"%s\" lost: another transaction stored a record for it",
					text_to_cstring(p->key)),
			 errdetail("The record was written without taking the key's lock (directly into the table, or on another node)."),
			 errhint("This transaction is rolled back; the key's outcome belongs to the other record.")));
}

/* The pieces of a write of a held claim (write_as_owner). */
typedef enum HeldWrite
{
	WRITE_HISTORY,				/* the processing row, then the settle */
	WRITE_FINAL					/* only the record as it ends */
} HeldWrite;

static void
write_steps(IdemHeldClaim *p, HeldWrite what)
{
	IdemKey		k = {p->tenant_id, p->key};
	bool		final_only = what == WRITE_FINAL;
	bool		finished = p->settle == IDEM_HELD_FINISHED;
	Oid			table = idem_store_table();
	IdemDirectRow row = {
		.key = &k,
		.token = p->token,
		.created_at = p->created_at,
		.lease_expires_at = p->lease_expires_at,
		.ttl_us = p->ttl_us,
		.fingerprint = p->fingerprint,
		.holder = p->holder,
	};
	ItemPointerData tid;

	if (final_only && p->settle == IDEM_HELD_RELEASED)
		return;

	/* the row as the claim inserted it, or as the settle left it */
	row.status = final_only ? p->status : IDEM_PROCESSING;
	row.updated_at = final_only && finished ? p->settled_at : p->created_at;
	row.response = final_only ? p->response : (Datum) 0;
	row.response_isnull = final_only ? p->response_isnull : true;
	tid = idem_direct_insert(table, &row,
							 final_only ? GetCurrentCommandId(true) : p->claim_cid);
	if (final_only || p->settle == IDEM_HELD_OPEN)
		return;

	if (finished)
	{
		row.status = p->status;
		row.updated_at = p->settled_at;
		row.response = p->response;
		row.response_isnull = p->response_isnull;
		idem_direct_update(table, &tid, &row, p->settle_cid);
	}
	else
		idem_direct_delete(table, &tid, p->settle_cid);
}

/*
 * Write a held claim, as its table's owner, with the transaction's
 * read-only flag as it was when the claim was held (a write that, logically,
 * already happened).  The rows are written without the executor's privilege
 * checks (store_direct.c): the caller's were made when the claim and its
 * settle happened, as the written claim's statements made them, so a REVOKE
 * committed since cannot fail the write (or the COMMIT) that the written
 * claim had long done.  The insert has no ON CONFLICT: the key lock is held
 * and the key was read free after taking it, so a conflict means a record
 * written around the lock, and the key index's unique violation never
 * reaches the caller: it becomes the lost-claim error.
 */
static void
write_as_owner(IdemHeldClaim *p, HeldWrite what)
{
	MemoryContext caller_context = CurrentMemoryContext;
	Oid			save_userid;
	int			save_sec_context;
	bool		save_read_only = XactReadOnly;

	/*
	 * Security-restricted, as every path that works with rights other than
	 * the caller's.  No GUC nest level: the table is as made, so the writes
	 * run no code that could set one (and on 15 AtEOXact_GUC walks every
	 * setting, at each COMMIT that writes a held claim).
	 */
	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(p->owner, save_sec_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	XactReadOnly = false;
	PG_TRY();
	{
		idem_store_attach_schema(p->schema);
		write_steps(p, what);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		XactReadOnly = save_read_only;
		SetUserIdAndSecContext(save_userid, save_sec_context);
		MemoryContextSwitchTo(caller_context);
		edata = CopyErrorData();
		if (edata->sqlerrcode != ERRCODE_UNIQUE_VIOLATION)
			PG_RE_THROW();
		/* the transaction is aborting: only the error it reports changes */
		FlushErrorState();
		report_lost_claim(p);
	}
	PG_END_TRY();
	XactReadOnly = save_read_only;
	SetUserIdAndSecContext(save_userid, save_sec_context);
	mark_written(p);
}

/*
 * Write a held claim as its history, so that from now on it is a written
 * claim in every respect.
 */
static void
materialize(IdemHeldClaim *p)
{
	volatile bool pushed = false;

	if (!ActiveSnapshotSet())
	{
		PushActiveSnapshot(GetTransactionSnapshot());
		pushed = true;
	}
	write_as_owner(p, WRITE_HISTORY);
	if (pushed)
		PopActiveSnapshot();
}

/*
 * Could the settle of a held claim be recorded rather than run?  Only at
 * the top level (a subtransaction could roll it back), in a read-write
 * transaction, when the caller passes the checks its statement would make
 * (mode on the table, usage of the schema).  Otherwise the claim is
 * written first and the caller settles it as a written claim.
 */
static bool
may_record_settle(IdemHeldClaim *p, AclMode mode)
{
	if (GetCurrentTransactionNestLevel() == 1 && !XactReadOnly &&
		may_use_table(p->schema, p->table, mode))
		return true;
	materialize(p);
	return false;
}

/*
 * Could the row a settle with this response writes be toasted?  Its UPDATE
 * would then store the response in the TOAST table, taking that table's
 * and its index's RowExclusiveLock at the settle, and a held settle cannot
 * take them as the UPDATE would: whether a value goes out of line is
 * decided while the row is formed.  So a settle that might toast is not
 * recorded; the claim is written and settled at once.  The bound is the
 * one heap_update toasts above, less the most the row's other columns can
 * take (four identifiers of at most IDEM_MAX_IDENTIFIER_BYTES: tenant_id,
 * key, fingerprint, holder; and 256 bytes for the tuple header and the
 * fixed-width columns), so a row that might cross it is never held.
 */
#define ROW_ALLOWANCE_BYTES \
	(4 * (IDEM_MAX_IDENTIFIER_BYTES + VARHDRSZ) + 256)

static bool
may_be_toasted(Datum response)
{
	return toast_raw_datum_size(response) + ROW_ALLOWANCE_BYTES > TOAST_TUPLE_THRESHOLD;
}

/*
 * Write the held claim of ref as its history, if it is still held.
 */
void
idem_held_materialize(IdemHeldRef ref)
{
	IdemHeldClaim *p = entry_of(ref);

	if (p != NULL)
		materialize(p);
}

/*
 * Complete (IDEM_COMPLETED) or fail (IDEM_FAILED) the held claim of ref.
 * Returns false when the claim was written instead (or had been) and the
 * caller must settle it as a written claim.
 */
bool
idem_held_finish(IdemHeldRef ref, IdemStatus status, Datum response,
				 bool response_isnull, TimestampTz now)
{
	IdemHeldClaim *p = entry_of(ref);
	MemoryContext old;

	if (p == NULL)
		return false;
	if (!response_isnull && may_be_toasted(response))
	{
		materialize(p);
		return false;
	}
	if (!may_record_settle(p, ACL_SELECT | ACL_UPDATE))
		return false;
	p->settle_cid = act_as_statement();
	p->settle = IDEM_HELD_FINISHED;
	p->status = status;
	p->settled_at = now;
	p->response_isnull = response_isnull;
	if (!response_isnull)
	{
		old = MemoryContextSwitchTo(held_context);
		p->response = PointerGetDatum(PG_DETOAST_DATUM_COPY(response));
		MemoryContextSwitchTo(old);
	}
	return true;
}

/*
 * Release the held claim of ref without a failure: its DELETE is recorded
 * (a held claim has no recovery point: a checkpoint writes it).  Returns
 * false when the claim was written instead (or had been).
 */
bool
idem_held_release(IdemHeldRef ref, TimestampTz now)
{
	IdemHeldClaim *p = entry_of(ref);

	if (p == NULL || !may_record_settle(p, ACL_SELECT | ACL_DELETE))
		return false;
	p->settle_cid = act_as_statement();
	p->settle = IDEM_HELD_RELEASED;
	p->settled_at = now;
	return true;
}

/*
 * The held claim made first.  Histories are written in the order they
 * happened: a key released without failure may be claimed again, and its
 * second claim's row must follow the first one's DELETE.
 */
static IdemHeldClaim *
oldest_held(void)
{
	IdemHeldClaim *oldest = NULL;

	for (int i = 0; i < held_used; i++)
		if (is_held(&held[i]) &&
			(oldest == NULL || held[i].claim_cid < oldest->claim_cid))
			oldest = &held[i];
	return oldest;
}

/*
 * Write every held claim as its history, before something that could read
 * the table: a statement whose plan names it, a utility command, or one of
 * our functions that reads more than its own key (hooks.c, lookup.c).
 */
void
idem_held_write_all(void)
{
	if (writing_all || !idem_claims_held)
		return;

	writing_all = true;
	PG_TRY();
	{
		IdemHeldClaim *p;

		while ((p = oldest_held()) != NULL)
			materialize(p);
	}
	PG_FINALLY();
	{
		writing_all = false;
	}
	PG_END_TRY();
}

/*
 * Does a plan that depends on these relations read a table held claims
 * belong to?
 */
bool
idem_held_table_in(List *relation_oids)
{
	ListCell   *lc;
	Oid			looked_at = InvalidOid;

	/* held claims are nearly always of one table: look at each table once */
	for (int i = 0; i < held_used; i++)
	{
		if (!is_held(&held[i]) || held[i].table == looked_at)
			continue;
		looked_at = held[i].table;
		foreach(lc, relation_oids)
			if (lfirst_oid(lc) == looked_at)
				return true;
	}
	return false;
}

/*
 * Write every held claim in its final form: at COMMIT or PREPARE
 * TRANSACTION, when nothing in this transaction reads any more.
 */
void
idem_held_write_final(void)
{
	volatile bool pushed = false;

	if (writing_all || !idem_claims_held)
		return;

	writing_all = true;
	PG_TRY();
	{
		IdemHeldClaim *p;

		if (!ActiveSnapshotSet())
		{
			PushActiveSnapshot(GetTransactionSnapshot());
			pushed = true;
		}
		while ((p = oldest_held()) != NULL)
			write_as_owner(p, WRITE_FINAL);
		if (pushed)
			PopActiveSnapshot();
	}
	PG_FINALLY();
	{
		writing_all = false;
	}
	PG_END_TRY();
}

/*
 * The transaction has ended (committed, aborted or prepared): held claims
 * and their memory go with TopTransactionContext.  hooks.c calls this at
 * every end; COMMIT and pre-commit wrote what had to be written.
 */
void
idem_held_xact_ended(void)
{
	held_context = NULL;
	held = NULL;
	held_allocated = 0;
	held_used = 0;
	writing_all = false;
	idem_claims_held = false;
}

/*
 * Subtransaction sub has ended (committed into parent, or rolled back): a
 * claim written in it is held again if the write was rolled back, and
 * belongs to the parent if it committed.
 */
void
idem_held_subxact_ended(SubTransactionId sub, SubTransactionId parent,
						bool committed)
{
	for (int i = held_used - 1; i >= 0; i--)
	{
		IdemHeldClaim *p = &held[i];

		if (p->written_in != sub)
			continue;
		if (!committed)
			p->written_in = InvalidSubTransactionId;	/* the write is undone */
		else if (parent == TopSubTransactionId)
			remove_entry(i);
		else
			p->written_in = parent;
	}
	update_held_flag();
}
