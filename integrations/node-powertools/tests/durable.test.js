'use strict';
// Durable execution (extension 1.4's re-entrant claims) under the real
// @aws-lambda-powertools/idempotency: makeIdempotent called with a durable
// context ({ step, lambdaContext, durableExecutionMode }) as Lambda's durable
// functions pass it.  The layer's holder option names the execution; a
// replay of that execution (ReplayMode) re-enters the claim it committed
// before suspending, any other execution is in progress.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const {
  makeIdempotent, IdempotencyConfig, IdempotencyAlreadyInProgressError, IdempotencyPersistenceLayerError,
} = require('@aws-lambda-powertools/idempotency');
const { PostgresPersistenceLayer, PostgresIdempotencyError } = require('idempotency-pg-powertools');
const {
  RUN, TENANT_SETTING, skipReason, pools, orders, records, gate, lambdaContext, sleep, committedClaimOf,
} = require('./helpers');

const db = pools();
const opts = { skip: skipReason };

/** A durable context as makeIdempotent reads it: step marks it durable, lambdaContext is registered,
 *  durableExecutionMode 'ReplayMode' is a replay. */
const durableContext = (mode) => ({
  step: async (name, fn) => fn(), lambdaContext: lambdaContext(60000), durableExecutionMode: mode,
});

/** A layer whose holder is the execution id the durable execution's input carries. */
const layerFor = (tenant, options = {}) => new PostgresPersistenceLayer({
  pool: db.app, tenant, tenantSetting: TENANT_SETTING, holder: (event) => event.executionId ?? null, ...options,
});

/** The durable function: books the order through the claim's client, then (on a first run, when told)
 *  suspends at a wait that never returns in this invocation, as the durable SDK leaves a suspended
 *  invocation's promise; suspend.opened then makes it end by throwing. */
function durableHandler(layer, suspend) {
  const runs = [];
  const handler = makeIdempotent(async (event, context) => {
    runs.push({ mode: context.durableExecutionMode, token: layer.token });
    await layer.client.query('INSERT INTO pt_orders (tenant, order_id, note) VALUES ($1, $2, $3)',
      ['durable', event.orderId, context.durableExecutionMode]);
    if (suspend && context.durableExecutionMode === 'ExecutionMode' && event.executionId === 'exec-1') {
      await suspend.opened;
      throw new Error('the suspended invocation ended');
    }
    return { orderId: event.orderId, by: event.executionId };
  }, { persistenceStore: layer, config: new IdempotencyConfig({ eventKeyJmesPath: 'orderId' }) });
  return { handler, runs };
}

const committedClaim = (tenant) => committedClaimOf(db.admin, tenant);

const fenced = (error) => error instanceof IdempotencyPersistenceLayerError
  && error.cause instanceof PostgresIdempotencyError && error.cause.code === 'fenced';

test('durable: the replay re-enters its own claim (same token, the client) and completes once; another execution is in progress', opts, async () => {
  const tenant = `pt-durable-${RUN}`;
  const orderId = `d1-${RUN}`;
  const layer = layerFor(tenant);
  const suspend = gate();
  const { handler, runs } = durableHandler(layer, suspend);
  const first = handler({ orderId, executionId: 'exec-1' }, durableContext('ExecutionMode'));
  const claim = await committedClaim(tenant);
  const { rows: [{ holder }] } = await db.admin.query(
    'SELECT holder FROM idem_lookup($1, $2)', [tenant, (await records(db.admin, tenant))[0].key]);
  assert.equal(holder, 'exec-1', 'the claim carries the execution as its holder');

  // another execution, first run or replay of its own, meets exec-1's live claim
  await assert.rejects(handler({ orderId, executionId: 'exec-2' }, durableContext('ExecutionMode')),
    (e) => e instanceof IdempotencyAlreadyInProgressError);

  // exec-1 replays: it re-enters, with its token and a client, and completes the record
  const result = await handler({ orderId, executionId: 'exec-1' }, durableContext('ReplayMode'));
  assert.deepEqual(result, { orderId, by: 'exec-1' });
  assert.deepEqual(runs.map((r) => r.mode), ['ExecutionMode', 'ReplayMode']);
  assert.equal(runs[1].token, claim.token, 'the replay holds the same token');
  const [stored] = await records(db.admin, tenant);
  assert.equal(stored.status, 'completed');
  assert.equal(stored.token, claim.token);
  assert.deepEqual(stored.response, result);
  assert.equal(await orders(db.admin, orderId), 1, 'one booking: the replay\'s, committed with the record');

  // the suspended invocation ends (here: throws): its release is fenced, its booking rolled back
  suspend.open();
  await assert.rejects(first, fenced);
  assert.equal((await records(db.admin, tenant))[0].status, 'completed');
  assert.equal(await orders(db.admin, orderId), 1);

  // a later call, any execution: the stored result
  assert.deepEqual(await handler({ orderId, executionId: 'exec-2' }, durableContext('ExecutionMode')), result);
  assert.equal(runs.length, 2);
  // a later replay of exec-1 (after a suspend further on): Powertools' replay mode runs the function
  // although the record is completed; it holds no claim, so its client is not there, and the record stays
  await assert.rejects(handler({ orderId, executionId: 'exec-1' }, durableContext('ReplayMode')),
    (e) => e instanceof PostgresIdempotencyError && e.code === 'no_invocation');
  assert.deepEqual((await records(db.admin, tenant))[0].response, result);
  assert.equal(await orders(db.admin, orderId), 1);
});

test('durable: after the lease another execution takes over (a new token), and the old one is fenced', opts, async () => {
  const tenant = `pt-durable-lease-${RUN}`;
  const orderId = `d2-${RUN}`;
  const layer = layerFor(tenant, { lease: 1 });
  const suspend = gate();
  const { handler, runs } = durableHandler(layer, suspend);
  const first = handler({ orderId, executionId: 'exec-1' }, durableContext('ExecutionMode'));
  const claim = await committedClaim(tenant);
  await sleep(1300);                       // exec-1's 1-second lease ends while it is suspended
  const taken = await handler({ orderId, executionId: 'exec-2' }, durableContext('ExecutionMode'));
  assert.deepEqual(taken, { orderId, by: 'exec-2' });
  const [stored] = await records(db.admin, tenant);
  assert.equal(stored.status, 'completed');
  assert.ok(BigInt(stored.token) > BigInt(claim.token), 'the takeover has a larger token');
  // exec-1's replay runs without a claim (Powertools' replay mode): no client, exec-2's record stays
  await assert.rejects(handler({ orderId, executionId: 'exec-1' }, durableContext('ReplayMode')),
    (e) => e instanceof PostgresIdempotencyError && e.code === 'no_invocation');
  assert.deepEqual((await records(db.admin, tenant))[0].response, taken);
  // and the suspended invocation, when it ends, is fenced
  suspend.open();
  await assert.rejects(first, fenced);
  assert.equal(runs.length, 2);
  assert.equal(await orders(db.admin, orderId), 1);
});

test('durable: without a holder the layer claims as before (holder => not sent); a bad holder is refused', opts, async () => {
  const tenant = `pt-durable-none-${RUN}`;
  const layer = layerFor(tenant, { holder: null });
  const { handler } = durableHandler(layer, null);
  const result = await handler({ orderId: `d3-${RUN}`, executionId: 'exec-1' }, durableContext('ExecutionMode'));
  assert.equal(result.by, 'exec-1');
  const [stored] = await records(db.admin, tenant);
  const { rows: [{ holder }] } = await db.admin.query('SELECT holder FROM idem_lookup($1, $2)', [tenant, stored.key]);
  assert.equal(holder, null);
  assert.throws(() => layerFor(tenant, { holder: 'exec-1' }), TypeError);
});
