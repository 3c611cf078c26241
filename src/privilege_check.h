/*
 * privilege_check.h
 *		A missing privilege, reported by the call that needs it
 *		(privilege_check.c).
 */
#ifndef IDEM_PRIVILEGE_CHECK_H
#define IDEM_PRIVILEGE_CHECK_H

#include "nodes/parsenodes.h"

extern bool idem_table_privileges_missing(Oid table, Oid role, AclMode needed);
extern void idem_require_table_privileges(Oid table, Oid role, AclMode needed,
										  const char *function);

#endif							/* IDEM_PRIVILEGE_CHECK_H */
