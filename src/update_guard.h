/*
 * update_guard.h
 *		ALTER EXTENSION idempotency UPDATE never runs the table owner's code
 *		with the updater's rights (update_guard.c).
 */
#ifndef IDEM_UPDATE_GUARD_H
#define IDEM_UPDATE_GUARD_H

#include "nodes/parsenodes.h"

extern void idem_guard_extension_update(AlterExtensionStmt *stmt);

#endif							/* IDEM_UPDATE_GUARD_H */
