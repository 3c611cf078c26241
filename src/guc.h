/*
 * guc.h
 *		The idempotency.* settings (guc.c).
 */
#ifndef IDEM_GUC_H
#define IDEM_GUC_H

#include "idempotency.h"

typedef enum IdemStaleAction
{
	IDEM_STALE_RELEASE,			/* an expired claim is deleted */
	IDEM_STALE_FAIL				/* an expired claim becomes 'failed' */
} IdemStaleAction;

typedef enum IdemDurabilityCheck
{
	IDEM_DURABILITY_OFF,
	IDEM_DURABILITY_WARNING,
	IDEM_DURABILITY_ERROR
} IdemDurabilityCheck;

extern int	idem_default_lease_ms;
extern int	idem_default_ttl_s;
extern int	idem_min_ttl_s;
extern int	idem_stale_action;
extern int	idem_max_response_size;
extern int	idem_sweep_interval_ms;
extern int	idem_sweep_batch_size;
extern bool idem_track_stats;
extern bool idem_defer_writes;
extern bool idem_direct_reads;
extern int	idem_durability_check;
extern int	idem_claim_sweep;

extern void idem_define_settings(void);
extern void idem_reload_config_if_asked(void);

#endif							/* IDEM_GUC_H */
