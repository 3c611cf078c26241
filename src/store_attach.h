/*
 * store_attach.h
 *		Attaching the records table, and running the statement catalogue on
 *		it (store_attach.c).
 */
#ifndef IDEM_STORE_ATTACH_H
#define IDEM_STORE_ATTACH_H

#include "fmgr.h"
#include "storage/lockdefs.h"
#include "nodes/parsenodes.h"

#include "idempotency.h"
#include "statements.h"

/* a call: attach the table and connect to SPI, then end */
extern void idem_store_begin(FunctionCallInfo fcinfo);
extern void idem_store_begin_attached(FunctionCallInfo fcinfo);
extern void idem_store_begin_in_schema(Oid nsp);
extern void idem_store_attach_schema(Oid nsp);
extern Oid	idem_store_function_schema(FunctionCallInfo fcinfo);
extern Oid	idem_store_extension_schema(void);
extern void idem_store_check_tenant(FunctionCallInfo fcinfo, const text *tenant);
extern void idem_store_end(void);

/* a call that works on the table as its owner, security-restricted */
typedef struct IdemOwnerCall
{
	Oid			save_userid;
	int			save_sec_context;
	int			save_nestlevel;
	bool		switched;		/* false: the caller was the owner */
} IdemOwnerCall;

extern void idem_store_begin_as_owner(Oid nsp, LOCKMODE mode, IdemOwnerCall *oc);
extern void idem_store_begin_maintenance(FunctionCallInfo fcinfo, AclMode needed,
										 const char *function, IdemOwnerCall *oc);
extern void idem_store_end_as_owner(IdemOwnerCall *oc);
extern void idem_store_require_whole_table(void);
extern void idem_store_call_aborted(void);

/* the attached table */
extern Oid	idem_store_table(void);
extern Oid	idem_store_schema(void);
extern Oid	idem_store_token_sequence(void);
extern bool idem_store_table_as_made(void);
extern bool idem_store_has_checkpoints(void);
extern bool idem_store_has_holder(void);
extern bool idem_store_distributed(void);

/* what the call's statements do: where sweeps go */
extern void idem_store_direct_sweeps_to(Oid shard);

/* running a statement (store.c, store_sweep.c) */
extern uint64 idem_store_run(IdemQuery q, Datum *values, const char *nulls,
							 bool read_only, long tcount);

/* set while one of our statements is being planned and started (hooks.c) */
extern PGDLLIMPORT bool idem_store_statement_starting;
extern bool idem_store_take_statement_start(void);

#endif							/* IDEM_STORE_ATTACH_H */
