/*
 * claim_sweep.h
 *		Sweeping without a scheduler: a fresh claim removes its tenant's
 *		expired neighbours (claim_sweep.c).
 */
#ifndef IDEM_CLAIM_SWEEP_H
#define IDEM_CLAIM_SWEEP_H

#include "idempotency.h"

extern void idem_claim_sweep_neighbours(const IdemKey *k, int window);

#endif							/* IDEM_CLAIM_SWEEP_H */
