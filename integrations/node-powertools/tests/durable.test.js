'use strict';
// Durable execution (extension 1.4's re-entrant claims) under the real
// @aws-lambda-powertools/idempotency and the real durable execution SDK:
// the handler is withDurableExecution(makeIdempotent(...)) from
// @aws/durable-execution-sdk-js, run by LocalDurableTestRunner of
// @aws/durable-execution-sdk-js-testing (a local checkpoint server, no AWS).
// The function suspends at a waitForCallback; sending the callback makes the
// runner invoke it again in ReplayMode.  The layer's holder option names the
// execution; a replay of that execution re-enters the claim it committed
// before suspending, any other execution is in progress.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const {
  makeIdempotent, IdempotencyConfig, IdempotencyAlreadyInProgressError, IdempotencyPersistenceLayerError,
} = require('@aws-lambda-powertools/idempotency');
const { withDurableExecution } = require('@aws/durable-execution-sdk-js');
const { LocalDurableTestRunner, WaitingOperationStatus } = require('@aws/durable-execution-sdk-js-testing');
const { PostgresPersistenceLayer, PostgresIdempotencyError } = require('idempotency-pg-powertools');
const {
  RUN, TENANT_SETTING, skipReason, pools, orders, records, gate, sleep, committedClaimOf,
} = require('./helpers');

const db = pools();
const opts = { skip: skipReason };

before(() => LocalDurableTestRunner.setupTestEnvironment({ skipTime: false }));
after(() => LocalDurableTestRunner.teardownTestEnvironment());

/** A layer whose holder is the execution id the durable execution's input carries. */
const layerFor = (tenant, options = {}) => new PostgresPersistenceLayer({
  pool: db.app, tenant, tenantSetting: TENANT_SETTING, holder: (event) => event.executionId ?? null, ...options,
});

/** The durable function: withDurableExecution(makeIdempotent(...)).  It books the order through the
 *  claim's client, then, when the input says suspend, waits for the callback 'resume': the first
 *  invocation suspends there (the SDK ends the invocation as pending and leaves its promise unsettled);
 *  suspend.opened then makes that invocation's function end by throwing, as a suspended run's late end.
 *  With thenSuspend the durable function waits for a callback 'later' after the idempotent function
 *  returned, so that a later replay runs makeIdempotent again.  calls holds every invocation's
 *  makeIdempotent promise and the mode it was invoked in; runs the function's runs. */
function durableHandler(layer, suspend) {
  const runs = [];
  const calls = [];
  const modes = new WeakMap();         // the mode each invocation's durable context was invoked in
  const idempotent = makeIdempotent(async (event, context) => {
    runs.push({ mode: modes.get(context), token: layer.token });
    await layer.client.query('INSERT INTO pt_orders (tenant, order_id, note) VALUES ($1, $2, $3)',
      ['durable', event.orderId, modes.get(context)]);
    if (event.suspend) {
      await Promise.race([
        context.waitForCallback('resume', async () => {}),
        suspend.opened.then(() => { throw new Error('the suspended invocation ended'); }),
      ]);
    }
    return { orderId: event.orderId, by: event.executionId };
  }, { persistenceStore: layer, config: new IdempotencyConfig({ eventKeyJmesPath: 'orderId' }) });
  const handler = withDurableExecution(async (event, context) => {
    const call = { mode: context.durableExecutionMode };
    modes.set(context, call.mode);
    calls.push(call);
    call.promise = idempotent(event, context);
    call.promise.catch(() => {});
    const result = await call.promise;
    if (event.thenSuspend) await context.waitForCallback('later', async () => {});
    return result;
  });
  const run = (payload) => {
    const runner = new LocalDurableTestRunner({ handlerFunction: handler });
    return { runner, execution: runner.run({ payload }) };
  };
  return { run, runs, calls };
}

/** Waits until the execution is suspended at the callback name, and returns its operation. */
async function suspendedAt(runner, name) {
  const operation = runner.getOperation(name);
  await operation.waitForData(WaitingOperationStatus.SUBMITTED);
  return operation;
}

const committedClaim = (tenant) => committedClaimOf(db.admin, tenant);

const fenced = (error) => error instanceof IdempotencyPersistenceLayerError
  && error.cause instanceof PostgresIdempotencyError && error.cause.code === 'fenced';

test('durable: the replay re-enters its own claim (same token, the client) and completes once; another execution is in progress', opts, async () => {
  const tenant = `pt-durable-${RUN}`;
  const orderId = `d1-${RUN}`;
  const layer = layerFor(tenant);
  const suspend = gate();
  const { run, runs, calls } = durableHandler(layer, suspend);
  const exec1 = run({ orderId, executionId: 'exec-1', suspend: true, thenSuspend: true });
  const resume = await suspendedAt(exec1.runner, 'resume');
  const first = calls[0].promise;
  assert.equal(calls[0].mode, 'ExecutionMode');
  const claim = await committedClaim(tenant);
  const { rows: [{ holder }] } = await db.admin.query(
    'SELECT holder FROM idem_lookup($1, $2)', [tenant, (await records(db.admin, tenant))[0].key]);
  assert.equal(holder, 'exec-1', 'the claim carries the execution as its holder');

  // another execution meets exec-1's live claim
  const exec2 = await run({ orderId, executionId: 'exec-2' }).execution;
  assert.equal(exec2.getStatus(), 'FAILED');
  await assert.rejects(calls[1].promise, (e) => e instanceof IdempotencyAlreadyInProgressError);

  // exec-1 is replayed (the callback arrives): it re-enters, with its token and a client, and completes the record
  await resume.sendCallbackSuccess('"resumed"');
  const laterCallback = await suspendedAt(exec1.runner, 'later');
  assert.equal(calls[2].mode, 'ReplayMode');
  const result = await calls[2].promise;
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
  const later = await run({ orderId, executionId: 'exec-2' }).execution;
  assert.equal(later.getStatus(), 'SUCCEEDED');
  assert.deepEqual(later.getResult(), result);
  assert.equal(runs.length, 2);
  // a later replay of exec-1 (after its suspend at 'later'): Powertools' replay mode runs the function
  // although the record is completed; it holds no claim, so its client is not there, and the record stays
  await laterCallback.sendCallbackSuccess('"later"');
  assert.equal((await exec1.execution).getStatus(), 'FAILED');
  assert.equal(calls[4].mode, 'ReplayMode');
  await assert.rejects(calls[4].promise,
    (e) => e instanceof PostgresIdempotencyError && e.code === 'no_invocation');
  assert.deepEqual((await records(db.admin, tenant))[0].response, result);
  assert.equal(await orders(db.admin, orderId), 1);
});

test('durable: after the lease another execution takes over (a new token), and the old one is fenced', opts, async () => {
  const tenant = `pt-durable-lease-${RUN}`;
  const orderId = `d2-${RUN}`;
  const layer = layerFor(tenant, { lease: 1 });
  const suspend = gate();
  const { run, runs, calls } = durableHandler(layer, suspend);
  const exec1 = run({ orderId, executionId: 'exec-1', suspend: true });
  const resume = await suspendedAt(exec1.runner, 'resume');
  const first = calls[0].promise;
  const claim = await committedClaim(tenant);
  await sleep(1300);                       // exec-1's 1-second lease ends while it is suspended
  const exec2 = await run({ orderId, executionId: 'exec-2' }).execution;
  assert.equal(exec2.getStatus(), 'SUCCEEDED');
  const taken = exec2.getResult();
  assert.deepEqual(taken, { orderId, by: 'exec-2' });
  const [stored] = await records(db.admin, tenant);
  assert.equal(stored.status, 'completed');
  assert.ok(BigInt(stored.token) > BigInt(claim.token), 'the takeover has a larger token');
  // exec-1's replay runs without a claim (Powertools' replay mode): no client, exec-2's record stays
  await resume.sendCallbackSuccess('"resumed"');
  assert.equal((await exec1.execution).getStatus(), 'FAILED');
  assert.equal(calls[2].mode, 'ReplayMode');
  await assert.rejects(calls[2].promise,
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
  const { run } = durableHandler(layer, null);
  const execution = await run({ orderId: `d3-${RUN}`, executionId: 'exec-1' }).execution;
  assert.equal(execution.getStatus(), 'SUCCEEDED');
  assert.equal(execution.getResult().by, 'exec-1');
  const [stored] = await records(db.admin, tenant);
  const { rows: [{ holder }] } = await db.admin.query('SELECT holder FROM idem_lookup($1, $2)', [tenant, stored.key]);
  assert.equal(holder, null);
  assert.throws(() => layerFor(tenant, { holder: 'exec-1' }), TypeError);
});
