'use strict';
/*
 * idempotency-pg-powertools: a persistence layer for Powertools for AWS Lambda
 * (TypeScript) idempotency on the idempotency PostgreSQL extension.
 *   new PostgresPersistenceLayer({ pool, tenant })   the persistenceStore of makeIdempotent
 * This is the CommonJS entry: the layer extends Powertools' CommonJS build
 * (index.mjs: its ES module build).
 */
const { BasePersistenceLayer, IdempotencyRecord } = require('@aws-lambda-powertools/idempotency/persistence');
const {
  IdempotencyRecordStatus, IdempotencyItemAlreadyExistsError, IdempotencyItemNotFoundError,
} = require('@aws-lambda-powertools/idempotency');
const { define, PostgresIdempotencyError } = require('./lib/layer');

const PostgresPersistenceLayer = define({
  BasePersistenceLayer, IdempotencyRecord, IdempotencyRecordStatus, IdempotencyItemAlreadyExistsError,
  IdempotencyItemNotFoundError,
});

module.exports = { PostgresPersistenceLayer, PostgresIdempotencyError };
