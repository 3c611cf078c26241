/*
 * module.c
 *		Module entry point: registration only.
 *
 * Loaded on first use (CREATE EXTENSION, a function call) the library only
 * defines its settings, installs its hooks and registers its transaction
 * callbacks (hooks.c: each hook is one test of a flag until this backend
 * holds a claim or runs one of its own statements).  Preloaded
 * (shared_preload_libraries) it also reserves shared memory for statistics
 * and the last tokens, and registers the sweeper worker.  Nothing here may
 * fail: the SQL functions must work without preloading.
 */
#include "postgres.h"

#include "miscadmin.h"

#include "guc.h"
#include "hooks.h"
#include "idempotency.h"
#include "stats.h"
#include "tokens.h"
#include "launcher.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	idem_define_settings();
	idem_hooks_init();

	if (!process_shared_preload_libraries_in_progress)
		return;

	idem_stats_request_shmem();
	idem_tokens_request_shmem();
	idem_worker_register();
}
