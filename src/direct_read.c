/*
 * direct_read.c
 *		A record read by primary key without SPI: the replay fast path.
 *
 * A replay is one indexed read, and through SPI most of its cost is the
 * executor's start and end around that read.  This module does the read
 * itself: the key index probed with the statement's (or a fresh) MVCC
 * snapshot, exactly as the prepared SELECT would, and the same columns
 * returned.  It is used only where it sees what that SELECT would see and
 * is refused what that SELECT would be refused:
 *
 *	- the table is a local one (never distributed by Citus, whose table on
 *	  this node is an empty shell);
 *	- the caller has SELECT on the whole table (column privileges, and their
 *	  errors, are left to the executor) and USAGE on its schema;
 *	- no row-level security applies to the caller, or only the extension's
 *	  own tenant isolation, which admits the tenant read;
 *	- the table has no inheritance children (the SELECT reads them too);
 *	- a snapshot is active (it always is inside a statement).
 *
 * Otherwise store.c reads through SPI.  idempotency.direct_reads = off
 * turns this path off, so the differential suite can prove both give the
 * same answers.
 *
 * The same index probe, with a dirty snapshot, tells a claim that another
 * transaction is inserting its key (idem_direct_inserter).
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/subtrans.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_am.h"
#include "catalog/pg_opfamily.h"
#include "catalog/pg_type.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"

#include "compat.h"
#include "direct_read.h"
#include "guc.h"
#include "idempotency.h"
#include "record.h"
#include "table_shape.h"

/* Where each column the read returns is in the table (0: not there). */
typedef struct RecordColumns
{
	AttrNumber	key;
	AttrNumber	status;
	AttrNumber	token;
	AttrNumber	fingerprint;
	AttrNumber	response;
	AttrNumber	expires_at;
	AttrNumber	lease_expires_at;
	AttrNumber	created_at;
	AttrNumber	updated_at;
	AttrNumber	recovery_point;
	AttrNumber	state;
	AttrNumber	holder;			/* 1.4 */
} RecordColumns;

static Oid	read_table = InvalidOid;
static Oid	read_namespace = InvalidOid;	/* read_table's schema */
static Oid	read_index = InvalidOid;
static bool read_table_distributed = false;
static const char *read_isolation_setting = NULL;	/* store_attach.c's */
static RecordColumns columns;

/*
 * Does a probe of this index find exactly the rows "tenant_id = $1 AND
 * key = $2" finds?  It does for the extension's primary key: a btree with
 * the text operator families, whose equality is byte equality under any
 * deterministic collation.  A user could have replaced it with an index
 * that compares otherwise; then reads go through SPI.
 */
static bool
key_index_usable(Oid key_index)
{
	Relation	index = index_open(key_index, AccessShareLock);
	bool		usable = index->rd_rel->relam == BTREE_AM_OID;

	for (int i = 0; i < 2 && usable; i++)
		usable = (index->rd_opfamily[i] == TEXT_BTREE_FAM_OID ||
				  index->rd_opfamily[i] == TEXT_PATTERN_BTREE_FAM_OID) &&
			OidIsValid(index->rd_indcollation[i]) &&
			get_collation_isdeterministic(index->rd_indcollation[i]);
	index_close(index, AccessShareLock);
	return usable;
}

/*
 * Point the reader at table and its (tenant_id, key) index, and say
 * whether Citus distributes the table; called by store_attach.c whenever it
 * (re)attaches to the table, after the shape check.  The table's schema is
 * kept too: moving the table to another schema takes an AccessExclusiveLock,
 * so it cannot happen while a call holds the lock store_attach takes, and
 * the next attach, after the lock, finds no table in the old schema.
 */
void
idem_direct_read_attach(Oid table, Oid key_index, bool distributed,
						const char *isolation_setting)
{
	read_table = table;
	read_namespace = get_rel_namespace(table);
	read_isolation_setting = isolation_setting;
	read_table_distributed = distributed;
	read_index = key_index_usable(key_index) ? key_index : InvalidOid;
	columns.key = get_attnum(table, "key");
	columns.status = get_attnum(table, "status");
	columns.token = get_attnum(table, "token");
	columns.fingerprint = get_attnum(table, "fingerprint");
	columns.response = get_attnum(table, "response");
	columns.expires_at = get_attnum(table, "expires_at");
	columns.lease_expires_at = get_attnum(table, "lease_expires_at");
	columns.created_at = get_attnum(table, "created_at");
	columns.updated_at = get_attnum(table, "updated_at");
	columns.recovery_point = get_attnum(table, "recovery_point");
	columns.state = get_attnum(table, "state");
	columns.holder = get_attnum(table, "holder");
}

/*
 * Would the prepared SELECT see the rows of tenant as the index holds
 * them, and be allowed to name the table (usage of its schema)?  With no
 * policy applying to the caller, yes; with the extension's own tenant
 * isolation (store_attach.c recognises it), when the policy admits tenant: it is
 * one comparison of tenant_id with a setting, the same for every row of
 * the tenant, evaluated here as the policy would.  (With row_security off
 * the SELECT raises an error of its own.)  Any other policy: no.
 */
static bool
direct_read_allowed(const text *tenant)
{
	if (!idem_direct_reads || !idem_direct_probe_available() || !ActiveSnapshotSet() ||
		idem_namespace_aclcheck(read_namespace, GetUserId(),
								ACL_USAGE) != ACLCHECK_OK ||
		pg_class_aclcheck(read_table, GetUserId(), ACL_SELECT) != ACLCHECK_OK)
		return false;
	switch (check_enable_rls(read_table, InvalidOid, true))
	{
		case RLS_NONE:
		case RLS_NONE_ENV:
			return true;
		default:
			return read_isolation_setting != NULL && row_security &&
				idem_isolation_admits(read_isolation_setting, tenant);
	}
}

/* A varlena column, copied (and detoasted) into the current context. */
static Datum
copied_varlena(TupleTableSlot *slot, AttrNumber att, bool *isnull)
{
	Datum		d;

	if (att == InvalidAttrNumber)
	{
		*isnull = true;
		return (Datum) 0;
	}
	d = slot_getattr(slot, att, isnull);
	return *isnull ? (Datum) 0 : PointerGetDatum(PG_DETOAST_DATUM_COPY(d));
}

static TimestampTz
timestamp_column(TupleTableSlot *slot, AttrNumber att, bool *isnull)
{
	return DatumGetTimestampTz(slot_getattr(slot, att, isnull));
}

/* Fill rec from the row in slot, as store.c's record_from_tuple does. */
static void
record_from_slot(TupleTableSlot *slot, IdemRecord *rec)
{
	bool		isnull;
	Datum		d;
	HeapTuple	tuple;

	/* only read here: detoasted if it must be, not copied */
	d = slot_getattr(slot, columns.status, &isnull);
	idem_check_not_null(isnull, "status");
	rec->status = idem_status_from_text(DatumGetTextPP(d));
	rec->token = DatumGetInt64(slot_getattr(slot, columns.token, &isnull));
	idem_check_not_null(isnull, "token");
	d = copied_varlena(slot, columns.fingerprint, &isnull);
	rec->fingerprint = isnull ? NULL : (text *) DatumGetPointer(d);
	rec->response = copied_varlena(slot, columns.response, &rec->response_isnull);
	rec->expires_at = timestamp_column(slot, columns.expires_at, &isnull);
	idem_check_not_null(isnull, "expires_at");
	rec->lease_expires_at = timestamp_column(slot, columns.lease_expires_at,
											 &rec->lease_isnull);
	rec->created_at = timestamp_column(slot, columns.created_at, &isnull);
	idem_check_not_null(isnull, "created_at");
	rec->updated_at = timestamp_column(slot, columns.updated_at, &isnull);
	idem_check_not_null(isnull, "updated_at");
	d = copied_varlena(slot, columns.recovery_point, &isnull);
	rec->recovery_point = isnull ? NULL : (text *) DatumGetPointer(d);
	d = copied_varlena(slot, columns.state, &isnull);
	rec->state = isnull ? (Datum) 0 : d;
	d = copied_varlena(slot, columns.holder, &isnull);
	rec->holder = isnull ? NULL : (text *) DatumGetPointer(d);

	tuple = ExecFetchSlotHeapTuple(slot, false, NULL);
	rec->xmin = HeapTupleHeaderGetRawXmin(tuple->t_data);
}

/* "tenant_id = k->tenant_id AND key = k->key" as scan keys of the index */
static void
key_scan_keys(Relation index, const IdemKey *k, ScanKeyData *keys)
{
	ScanKeyEntryInitialize(&keys[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[0], F_TEXTEQ,
						   PointerGetDatum(k->tenant_id));
	ScanKeyEntryInitialize(&keys[1], 0, 2, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[1], F_TEXTEQ,
						   PointerGetDatum(k->key));
}

/*
 * Read the record of k, as Q_READ would with the same snapshot.  Returns
 * false when this path cannot be used (the caller reads through SPI), and
 * otherwise sets *found.  fresh_snapshot: what committed since the
 * statement began, after this transaction's own earlier writes (what SPI
 * gives a statement that is not read-only).
 */
bool
idem_direct_read(const IdemKey *k, IdemRecord *rec, bool fresh_snapshot,
				 bool *found)
{
	Relation	heap;
	Relation	index;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	ScanKeyData keys[2];
	Snapshot	snapshot;

	if (!direct_read_allowed(k->tenant_id))
		return false;

	if (fresh_snapshot)
	{
		CommandCounterIncrement();
		snapshot = RegisterSnapshot(GetTransactionSnapshot());
	}
	else
		snapshot = RegisterSnapshot(GetActiveSnapshot());

	/*
	 * store_attach took the table's AccessShareLock in this transaction
	 * before anything was decided (every caller of idem_store_read attaches
	 * first, and a Citus table, which it does not lock, is never read
	 * here): taking it again would only count it once more.  The index is
	 * locked as the executor locks it.
	 */
	heap = table_open(read_table, NoLock);

	/*
	 * The SELECT reads the table's inheritance children too.  A table
	 * that may have one is read through it (relhassubclass can stay set
	 * after the last child is gone, until VACUUM: only its absence is
	 * proof).  Opening the table has taken in every child committed
	 * before the lock.
	 */
	if (heap->rd_rel->relhassubclass)
	{
		table_close(heap, NoLock);
		UnregisterSnapshot(snapshot);
		return false;
	}
	index = index_open(read_index, AccessShareLock);
	key_scan_keys(index, k, keys);

	slot = table_slot_create(heap, NULL);
	scan = idem_index_beginscan(heap, index, snapshot, 2);
	index_rescan(scan, keys, 2, NULL, 0);
	*found = index_getnext_slot(scan, ForwardScanDirection, slot);
	if (*found)
		record_from_slot(slot, rec);
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);

	/* the locks stay until the transaction ends, as the executor's do */
	index_close(index, NoLock);
	table_close(heap, NoLock);
	UnregisterSnapshot(snapshot);
	return true;
}

/*
 * Can idem_direct_inserter() look at the key index?  On a local table
 * with the extension's key index.  Table properties only, the same for
 * every role: idem_claim_many lets its key locks go after its INSERT only
 * where every claimer can see that INSERT this way.
 */
bool
idem_direct_probe_available(void)
{
	return OidIsValid(read_index) && !read_table_distributed;
}

/* A probe of the key index, open for one key or many (idem_claim_many's). */
struct IdemKeyProbe
{
	SnapshotData dirty;
	Relation	heap;
	Relation	index;
	IndexScanDesc scan;
	TupleTableSlot *slot;
};

/*
 * Open a probe of the key index (see idem_direct_probe_key), or NULL where
 * none can be made (idem_direct_probe_available).  The table, its index
 * and a scan are opened once, and each key rescans.
 */
IdemKeyProbe *
idem_direct_probe_begin(void)
{
	IdemKeyProbe *p;

	if (!idem_direct_probe_available())
		return NULL;
	p = palloc(sizeof(IdemKeyProbe));
	InitDirtySnapshot(p->dirty);
	p->heap = table_open(read_table, AccessShareLock);
	p->index = index_open(read_index, AccessShareLock);
	p->slot = table_slot_create(p->heap, NULL);
	p->scan = idem_index_beginscan(p->heap, p->index, &p->dirty, 2);
	return p;
}

/*
 * Probe the key index for k with a dirty snapshot, as the unique check of
 * an INSERT does before it would wait or conflict: like that check, it
 * sees past privileges and row-level security.  Returns whether any row
 * of k is there that has not been deleted by a committed transaction: a
 * committed one (whatever the caller's snapshot shows), this
 * transaction's own, or one another transaction has inserted and not yet
 * ended; for the last, *inserter is set to that transaction's top-level
 * ID (otherwise InvalidTransactionId).  With no probe (NULL), false.
 */
bool
idem_direct_probe_key(IdemKeyProbe *p, const IdemKey *k, TransactionId *inserter)
{
	ScanKeyData keys[2];
	bool		taken = false;

	*inserter = InvalidTransactionId;
	if (p == NULL)
		return false;
	key_scan_keys(p->index, k, keys);
	index_rescan(p->scan, keys, 2, NULL, 0);
	while (!TransactionIdIsValid(*inserter) &&
		   index_getnext_slot(p->scan, ForwardScanDirection, p->slot))
	{
		taken = true;
		*inserter = p->dirty.xmin;	/* set when the inserter is still running */
	}

	/*
	 * The row may come from a subtransaction (a claim written after a
	 * SAVEPOINT or in a PL/pgSQL EXCEPTION block), whose own lock ends when
	 * it commits: name the transaction that is still running, the one to
	 * wait for.
	 */
	if (TransactionIdIsValid(*inserter))
		*inserter = SubTransGetTopmostTransaction(*inserter);
	return taken;
}

/*
 * idem_direct_probe_key for n keys of one tenant in one search of the
 * index ("tenant_id = $1 AND key = ANY ($2)"), which meets the keys in
 * index order: keys that sort near each other share the pages it reads
 * (on PostgreSQL 17 and later also its descents from the root).  For
 * every row it finds, taken(arg, key, inserter) is called, inserter set as
 * idem_direct_probe_key sets it; a key may have several rows.  With no
 * probe (NULL), nothing is called.
 */
void
idem_direct_probe_keys(IdemKeyProbe *p, text *tenant_id, text **keys, int n,
					   void (*taken) (void *arg, text *key, TransactionId inserter),
					   void *arg)
{
	ScanKeyData scankeys[2];
	ArrayType  *array;

	if (p == NULL || n == 0)
		return;
	array = construct_array((Datum *) keys, n, TEXTOID, -1, false, TYPALIGN_INT);
	ScanKeyEntryInitialize(&scankeys[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
						   p->index->rd_indcollation[0], F_TEXTEQ,
						   PointerGetDatum(tenant_id));
	ScanKeyEntryInitialize(&scankeys[1], SK_SEARCHARRAY, 2, BTEqualStrategyNumber,
						   InvalidOid, p->index->rd_indcollation[1], F_TEXTEQ,
						   PointerGetDatum(array));
	index_rescan(p->scan, scankeys, 2, NULL, 0);
	while (index_getnext_slot(p->scan, ForwardScanDirection, p->slot))
	{
		TransactionId inserter = p->dirty.xmin;
		bool		isnull;
		Datum		key = slot_getattr(p->slot, columns.key, &isnull);

		idem_check_not_null(isnull, "key");
		if (TransactionIdIsValid(inserter))
			inserter = SubTransGetTopmostTransaction(inserter);
		taken(arg, DatumGetTextPP(key), inserter);
	}
	pfree(array);
}

void
idem_direct_probe_end(IdemKeyProbe *p)
{
	if (p == NULL)
		return;
	index_endscan(p->scan);
	ExecDropSingleTupleTableSlot(p->slot);
	index_close(p->index, NoLock);
	table_close(p->heap, NoLock);
	pfree(p);
}

/* idem_direct_probe_key of one key. */
bool
idem_direct_key_taken(const IdemKey *k, TransactionId *inserter)
{
	IdemKeyProbe *p = idem_direct_probe_begin();
	bool		taken = idem_direct_probe_key(p, k, inserter);

	idem_direct_probe_end(p);
	return taken;
}

/*
 * Another transaction that has inserted the record of k and not yet ended
 * (an idem_claim_many that gave its key lock back once its INSERT was
 * done), as its top-level transaction, or InvalidTransactionId.  It tells
 * only that a transaction is writing this key.
 */
TransactionId
idem_direct_inserter(const IdemKey *k)
{
	TransactionId inserter;

	(void) idem_direct_key_taken(k, &inserter);
	return inserter;
}
