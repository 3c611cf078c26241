/*
 * idempotency.c
 *		Module entry point: registration only.
 *
 * Loaded on first use (CREATE EXTENSION, a function call) the library only
 * defines its settings and installs its hooks: the planner hook (store.c)
 * and the executor and utility hooks that write held claims in time
 * (readers.c).  Each is one test of a flag (the utility hook also tests
 * for a DROP) until this backend holds a claim or runs one of its own
 * statements; the transaction callbacks of
 * held claims are registered when the first claim is held (held.c).
 * Preloaded (shared_preload_libraries) it also reserves shared memory for
 * statistics and the last tokens, and registers the sweeper worker.
 * Nothing here may fail: the SQL functions must work without preloading.
 */
#include "postgres.h"

#include "miscadmin.h"

#include "idempotency.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	idem_define_settings();
	idem_store_init();
	idem_readers_init();

	if (!process_shared_preload_libraries_in_progress)
		return;

	idem_stats_request_shmem();
	idem_tokens_request_shmem();
	idem_worker_register();
}
