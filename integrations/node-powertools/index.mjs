/*
 * idempotency-pg-powertools, the ES module entry: the layer extends
 * Powertools' ES module build, so that the errors it throws are the classes
 * an ES module application imports from '@aws-lambda-powertools/idempotency'.
 */
import { BasePersistenceLayer, IdempotencyRecord } from '@aws-lambda-powertools/idempotency/persistence';
import {
  IdempotencyRecordStatus, IdempotencyItemAlreadyExistsError, IdempotencyItemNotFoundError,
} from '@aws-lambda-powertools/idempotency';
import layer from './lib/layer.js';

export const { PostgresIdempotencyError } = layer;
export const PostgresPersistenceLayer = layer.define({
  BasePersistenceLayer, IdempotencyRecord, IdempotencyRecordStatus, IdempotencyItemAlreadyExistsError,
  IdempotencyItemNotFoundError,
});
