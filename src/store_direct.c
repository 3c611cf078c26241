/*
 * store_direct.c
 *		A held claim's writes, done as the executor does them but without
 *		its privilege checks.
 *
 * A held claim (held.c) is written after the fact: at COMMIT in its final
 * form, or as its history before anything reads the table.  The caller's
 * privileges were checked when the claim and its settle happened, exactly
 * as the INSERT and the UPDATE or DELETE would have checked them then, and
 * the written claim would have used them then.  Written through SQL later,
 * the statements would check privileges again, and a REVOKE committed in
 * between (of the owner's own INSERT, of USAGE on the schema) would fail a
 * COMMIT whose written claim had long been written.  So the rows are
 * written here, with the table AM and the executor's own index insertion,
 * the way ExecInsert, ExecUpdate and ExecDelete write them: the same heap
 * tuples, TOAST, index entries (a unique violation raised by the key
 * index, as the INSERT would raise it), WAL and statistics.
 *
 * What the executor would do besides (triggers, rules, CHECK and NOT NULL
 * constraints, column defaults, row-level security, foreign keys) does not
 * apply: a claim is held only while the table is exactly as the extension
 * made it (table_shape.c), and the RowExclusiveLock taken when it was held
 * keeps every such change out until the transaction ends.  An index built
 * concurrently meanwhile is kept up to date as the executor keeps it
 * (ExecOpenIndices, ExecInsertIndexTuples).
 */
#include "postgres.h"

#include "access/table.h"
#include "access/tableam.h"
#include "executor/executor.h"
#include "nodes/execnodes.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "idempotency.h"
#include "record.h"
#include "store_direct.h"
#include "validate.h"

/* The table opened for one write, with what the executor needs for it. */
typedef struct DirectWrite
{
	Relation	rel;
	EState	   *estate;
	ResultRelInfo *rri;
	TupleTableSlot *slot;
} DirectWrite;

static void
direct_begin(DirectWrite *w, Oid table)
{
	/* the RowExclusiveLock the claim took when it was held */
	w->rel = table_open(table, RowExclusiveLock);
	w->estate = CreateExecutorState();
	w->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(w->rri, w->rel, 1, NULL, 0);
	ExecOpenIndices(w->rri, false);
	w->slot = table_slot_create(w->rel, NULL);
}

static void
direct_end(DirectWrite *w)
{
	ExecDropSingleTupleTableSlot(w->slot);
	ExecCloseIndices(w->rri);
	FreeExecutorState(w->estate);
	table_close(w->rel, NoLock);
}

static void
set_column(DirectWrite *w, const char *name, Datum value, bool isnull)
{
	AttrNumber	att = get_attnum(RelationGetRelid(w->rel), name);

	if (att == InvalidAttrNumber)
		elog(ERROR, "column \"%s\" of the records table not found", name);
	w->slot->tts_values[att - 1] = value;
	w->slot->tts_isnull[att - 1] = isnull;
}

/*
 * The holder column, when the table has it: a claim with a holder is
 * refused before 1.4 (claim.c), so a table without the column gets NULL,
 * which is what it would read there.
 */
static void
set_holder(DirectWrite *w, text *holder)
{
	AttrNumber	att = get_attnum(RelationGetRelid(w->rel), "holder");

	if (att == InvalidAttrNumber)
	{
		Assert(holder == NULL);
		return;
	}
	w->slot->tts_values[att - 1] = PointerGetDatum(holder);
	w->slot->tts_isnull[att - 1] = holder == NULL;
}

/* The record of row in the slot, every other column NULL. */
static void
fill_slot(DirectWrite *w, const IdemDirectRow *row)
{
	Interval   *ttl = palloc0(sizeof(Interval));
	bool		processing = row->status == IDEM_PROCESSING;

	ExecClearTuple(w->slot);
	for (int i = 0; i < w->slot->tts_tupleDescriptor->natts; i++)
	{
		w->slot->tts_values[i] = (Datum) 0;
		w->slot->tts_isnull[i] = true;
	}
	ttl->time = row->ttl_us;
	set_column(w, "tenant_id", PointerGetDatum(row->key->tenant_id), false);
	set_column(w, "key", PointerGetDatum(row->key->key), false);
	set_column(w, "token", Int64GetDatum(row->token), false);
	set_column(w, "expires_at",
			   TimestampTzGetDatum(processing ? row->lease_expires_at :
								   idem_add_duration(row->updated_at, row->ttl_us, "ttl")),
			   false);
	set_column(w, "lease_expires_at", TimestampTzGetDatum(row->lease_expires_at),
			   !processing);
	set_column(w, "created_at", TimestampTzGetDatum(row->created_at), false);
	set_column(w, "updated_at", TimestampTzGetDatum(row->updated_at), false);
	set_column(w, "ttl", IntervalPGetDatum(ttl), false);
	set_column(w, "status", CStringGetTextDatum(idem_status_name(row->status)), false);
	set_column(w, "fingerprint", PointerGetDatum(row->fingerprint), row->fingerprint == NULL);
	set_column(w, "response", row->response, row->response_isnull);
	set_holder(w, row->holder);
	ExecStoreVirtualTuple(w->slot);
}

/*
 * Insert row into table with command ID cid, as an INSERT of every column
 * would; returns its TID.
 */
ItemPointerData
idem_direct_insert(Oid table, const IdemDirectRow *row, CommandId cid)
{
	DirectWrite w;
	ItemPointerData tid;

	direct_begin(&w, table);
	fill_slot(&w, row);
	table_tuple_insert(w.rel, w.slot, cid, 0, NULL);
	tid = w.slot->tts_tid;
	if (w.rri->ri_NumIndices > 0)
		list_free(idem_insert_index_tuples(w.rri, w.slot, w.estate));
	direct_end(&w);
	return tid;
}

/*
 * Replace the row at tid, which this transaction inserted, with row, with
 * command ID cid, as the UPDATE of a settle would.
 */
void
idem_direct_update(Oid table, ItemPointer tid, const IdemDirectRow *row,
				   CommandId cid)
{
	DirectWrite w;
	TM_FailureData tmfd;
	LockTupleMode lockmode;
	IdemUpdateIndexes update_indexes;
	TM_Result	result;

	direct_begin(&w, table);
	fill_slot(&w, row);
	result = table_tuple_update(w.rel, tid, w.slot, cid, InvalidSnapshot, InvalidSnapshot,
								true, &tmfd, &lockmode, &update_indexes);
	if (result != TM_Ok)
		elog(ERROR, "held claim's row could not be updated (%d)", (int) result);
	if (w.rri->ri_NumIndices > 0 && idem_update_needs_indexes(update_indexes))
		list_free(idem_insert_index_tuples_for_update(w.rri, w.slot, w.estate,
													   update_indexes));
	direct_end(&w);
}

/* Delete the row at tid, which this transaction inserted, with command ID cid. */
void
idem_direct_delete(Oid table, ItemPointer tid, CommandId cid)
{
	DirectWrite w;
	TM_FailureData tmfd;
	TM_Result	result;

	direct_begin(&w, table);
	result = table_tuple_delete(w.rel, tid, cid, InvalidSnapshot, InvalidSnapshot,
								true, &tmfd, false);
	if (result != TM_Ok)
		elog(ERROR, "held claim's row could not be deleted (%d)", (int) result);
	direct_end(&w);
}
