'use strict';
/*
 * idempotency-pg: exactly-once processing with the idempotency PostgreSQL
 * extension, for node-postgres.
 *   idempotency(options)      Express middleware for Idempotency-Key requests
 *   idempotent(fn, options)   a wrapper for queue consumers and jobs
 */
const { idempotency, parseIdempotencyKey, requestFingerprint } = require('./lib/express');
const { idempotent } = require('./lib/consumer');
const {
  IdempotencyError, canonicalJson, defaultStoreStatus, RETRY_AFTER_MIN, RETRY_AFTER_MAX,
} = require('./lib/common');

module.exports = {
  idempotency, idempotent, IdempotencyError, canonicalJson, parseIdempotencyKey, requestFingerprint, defaultStoreStatus,
  RETRY_AFTER_MIN, RETRY_AFTER_MAX,
};
