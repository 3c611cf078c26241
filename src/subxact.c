/*
 * subxact.c
 *		Run one step in a subtransaction, and treat the errors the caller
 *		expects from it as "it did not happen".
 *
 * A claim's bounded wait for a key lock needs this (keylock.c:
 * lock_timeout or a deadlock ends the wait).  Any other error is raised
 * again, unchanged.
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "storage/proc.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/resowner.h"

#include "idempotency.h"
#include "subxact.h"

/*
 * Run step(arg) in a subtransaction.  Returns true when it finished (its
 * work is now part of the caller's transaction), false when it raised one
 * of the ncodes SQLSTATEs in codes (its work is rolled back).  Either way
 * the caller's memory context and resource owner are current again.
 */
bool
idem_try_in_subtransaction(void (*step) (void *arg), void *arg,
						   const int *codes, int ncodes)
{
	MemoryContext caller_context = CurrentMemoryContext;
	ResourceOwner caller_owner = CurrentResourceOwner;
	volatile bool finished = false;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(caller_context);
	PG_TRY();
	{
		step(arg);

		/*
		 * A lock_timeout that fired just as the lock was granted leaves its
		 * cancel pending (PostgreSQL keeps it, to report it as a lock
		 * timeout).  Raised after the release, it would fail the caller's
		 * statement with the very error this step was to contain: raise it
		 * here, where it is one of the expected outcomes and undoes the
		 * step.  A user's cancel pending here is raised again unchanged.
		 */
		CHECK_FOR_INTERRUPTS();
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(caller_context);
		CurrentResourceOwner = caller_owner;
		finished = true;
	}
	PG_CATCH();
	{
		ErrorData  *edata;
		bool		expected = false;

		MemoryContextSwitchTo(caller_context);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(caller_context);
		CurrentResourceOwner = caller_owner;

		for (int i = 0; i < ncodes; i++)
			expected |= edata->sqlerrcode == codes[i];
		if (!expected)
			ReThrowError(edata);
		FreeErrorData(edata);
	}
	PG_END_TRY();

	return finished;
}

/*
 * Within a step: set lock_timeout to timeout_ms (the session's own, if
 * that is shorter) for the rest of the step.  The subtransaction's end
 * puts the session's value back, whether the step finished or failed.
 */
void
idem_step_lock_timeout(int timeout_ms)
{
	char		value[32];

	if (LockTimeout > 0 && LockTimeout < timeout_ms)
		timeout_ms = LockTimeout;
	snprintf(value, sizeof(value), "%d", timeout_ms);
	(void) NewGUCNestLevel();
	(void) set_config_option("lock_timeout", value, PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
}
