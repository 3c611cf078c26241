/*
 * hooks.h
 *		Every hook the module installs (hooks.c).
 */
#ifndef IDEM_HOOKS_H
#define IDEM_HOOKS_H

#include "idempotency.h"

extern void idem_hooks_init(void);

#endif							/* IDEM_HOOKS_H */
