// The ES module entry: an application that imports Powertools as ES modules
// gets errors of the classes it imports (index.mjs extends Powertools' ES
// module build), and the CommonJS entry those of the CommonJS build.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { makeIdempotent, IdempotencyConfig, IdempotencyValidationError } from '@aws-lambda-powertools/idempotency';
import { PostgresPersistenceLayer, PostgresIdempotencyError } from 'idempotency-pg-powertools';
import helpers from './helpers.js';

const { RUN, TENANT_SETTING, skipReason, pools, lambdaContext } = helpers;
const require = createRequire(import.meta.url);
const db = pools();

test('ES modules: a mismatch is the IdempotencyValidationError the application imported', { skip: skipReason }, async () => {
  const layer = new PostgresPersistenceLayer({ pool: db.app, tenant: `pt-esm-${RUN}`, tenantSetting: TENANT_SETTING });
  const handler = makeIdempotent(async (event) => ({ amount: event.amount }), {
    persistenceStore: layer,
    config: new IdempotencyConfig({ eventKeyJmesPath: 'id', payloadValidationJmesPath: 'amount' }),
  });
  assert.deepEqual(await handler({ id: 'e1', amount: 1 }, lambdaContext(30000)), { amount: 1 });
  const error = await handler({ id: 'e1', amount: 2 }, lambdaContext(30000)).catch((e) => e);
  assert.ok(error instanceof IdempotencyValidationError, String(error));
  const cjs = require('idempotency-pg-powertools');
  assert.notEqual(cjs.PostgresPersistenceLayer, PostgresPersistenceLayer, 'two entries, one per Powertools build');
  assert.equal(cjs.PostgresIdempotencyError, PostgresIdempotencyError, 'one error class of its own');
});
