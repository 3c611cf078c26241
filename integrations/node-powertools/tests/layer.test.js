'use strict';
// PostgresPersistenceLayer under the real @aws-lambda-powertools/idempotency
// (makeIdempotent, IdempotencyConfig) against a real server, as the
// application role, tenant isolation off or on (helpers.js).  Each test has
// a tenant of its own, so it reads the records it made.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const {
  makeIdempotent, IdempotencyConfig, IdempotencyAlreadyInProgressError, IdempotencyValidationError,
  IdempotencyPersistenceLayerError,
} = require('@aws-lambda-powertools/idempotency');
const { PostgresPersistenceLayer, PostgresIdempotencyError } = require('idempotency-pg-powertools');
const {
  RUN, TENANT_SETTING, skipReason, pools, orders, record, records, gate, lambdaContext, sleep, committedClaimOf,
} = require('./helpers');

const db = pools();
const opts = { skip: skipReason };

/** A layer on the application role's pool for tenant, given the isolation setting of this run. */
const layerFor = (tenant, options = {}) => new PostgresPersistenceLayer({
  pool: db.app, tenant, tenantSetting: TENANT_SETTING, ...options,
});

/** An order handler: books event.orderId through the layer's client and returns what it booked. */
function ordersHandler(layer, { config = new IdempotencyConfig({ eventKeyJmesPath: 'orderId' }), before } = {}) {
  const calls = [];
  const handler = makeIdempotent(async (event, context) => {
    calls.push(event);
    if (before) await before(event, calls.length);
    const { rows: [row] } = await layer.client.query(
      'INSERT INTO pt_orders (tenant, order_id, note) VALUES ($1, $2, $3) RETURNING id::text',
      [event.tenant ?? 'fixed', event.orderId, event.note ?? null]);
    if (event.fail) throw new Error(`the function failed for ${event.orderId}`);
    return { orderId: event.orderId, amount: event.amount, row: row.id, request: context.awsRequestId };
  }, { persistenceStore: layer, config });
  return { handler, calls };
}

/** Waits until the record of tenant is committed as processing; returns it. */
const committedClaim = (tenant) => committedClaimOf(db.admin, tenant);

const fencedCause = (error) => error instanceof IdempotencyPersistenceLayerError
  && error.cause instanceof PostgresIdempotencyError && error.cause.code === 'fenced'
  && error.cause.sqlstate === 'ID002';

test('first call runs the function; its writes and the record commit together, as the tenant', opts, async () => {
  const tenant = `pt-first-${RUN}`;
  const layer = layerFor(tenant);
  const { handler, calls } = ordersHandler(layer);
  const result = await handler({ orderId: `o1-${RUN}`, amount: 10 }, lambdaContext(30000));
  assert.equal(calls.length, 1);
  assert.equal(result.orderId, `o1-${RUN}`);
  assert.equal(await orders(db.admin, `o1-${RUN}`), 1);
  const [stored] = await records(db.admin, tenant);
  assert.equal(stored.status, 'completed');
  assert.deepEqual(stored.response, result, 'the stored response is the result, as JSON, no envelope');
  assert.match(stored.key, /^#[A-Za-z0-9+/]{22}==$/, "Powertools' key: its prefix (none outside Lambda), '#', the MD5 of the selection");
  assert.equal(stored.fingerprint, null, 'no payload validation: no fingerprint');
  await assert.throws(() => layer.client, (e) => e instanceof PostgresIdempotencyError && e.code === 'no_invocation',
    'outside an invocation there is no client');
});

test('replay: the stored result comes back without running the function; responseHook sees the record', opts, async () => {
  const tenant = `pt-replay-${RUN}`;
  const layer = layerFor(tenant);
  const hooked = [];
  const config = new IdempotencyConfig({
    eventKeyJmesPath: 'orderId',
    responseHook: (response, rec) => {
      hooked.push(rec.getStatus());
      return { ...response, replayed: true, expires: rec.expiryTimestamp > Date.now() / 1000 };
    },
  });
  const { handler, calls } = ordersHandler(layer, { config });
  const event = { orderId: `o2-${RUN}`, amount: 10 };
  const first = await handler(event, lambdaContext(30000));
  const second = await handler({ ...event, note: 'not part of the key' }, lambdaContext(30000));
  const third = await handler(event, lambdaContext(30000));
  assert.equal(calls.length, 1, 'the function ran once');
  assert.equal(await orders(db.admin, `o2-${RUN}`), 1);
  assert.deepEqual(second, { ...first, replayed: true, expires: true });
  assert.deepEqual(third, second);
  assert.deepEqual(hooked, ['COMPLETED', 'COMPLETED'], 'the hook runs on replays only, with a COMPLETED record');
});

test("concurrent duplicates: one runs, the others get Powertools' IdempotencyAlreadyInProgressError", opts, async () => {
  const tenant = `pt-concurrent-${RUN}`;
  const layer = layerFor(tenant);
  const hold = gate();
  const { handler, calls } = ordersHandler(layer, { before: () => hold.opened });
  const event = { orderId: `o3-${RUN}`, amount: 10 };
  const burst = Array.from({ length: 10 }, () => handler(event, lambdaContext(30000)));
  const settled = [];
  // every call but the one running has answered before the holder goes on
  const others = Promise.allSettled(burst.map((p) => p.then((v) => ({ v }), (e) => { settled.push(e); throw e; })));
  for (let i = 0; i < 400 && settled.length < 9; i += 1) await sleep(25);
  assert.equal(settled.length, 9, 'nine calls answered while the first holds the key');
  assert.ok(settled.every((e) => e instanceof IdempotencyAlreadyInProgressError), settled.map(String).join('\n'));
  const late = await handler(event, lambdaContext(30000)).catch((e) => e);
  assert.ok(late instanceof IdempotencyAlreadyInProgressError, 'a committed claim with a live lease: in progress');
  hold.open();
  const outcomes = await others;
  const results = outcomes.filter((o) => o.status === 'fulfilled').map((o) => o.value.v);
  assert.equal(results.length, 1);
  assert.equal(calls.length, 1);
  assert.deepEqual(await handler(event, lambdaContext(30000)), results[0], 'then a replay of its result');
  assert.equal(await orders(db.admin, `o3-${RUN}`), 1);
});

test("payload mismatch: Powertools' IdempotencyValidationError with the stored record; same payload replays", opts, async () => {
  const tenant = `pt-mismatch-${RUN}`;
  const layer = layerFor(tenant);
  const config = new IdempotencyConfig({ eventKeyJmesPath: 'orderId', payloadValidationJmesPath: '[amount, currency]' });
  const { handler, calls } = ordersHandler(layer, { config });
  const event = { orderId: `o4-${RUN}`, amount: 10, currency: 'EUR' };
  const first = await handler(event, lambdaContext(30000));
  const [stored] = await records(db.admin, tenant);
  assert.match(stored.fingerprint, /^[A-Za-z0-9+/]{22}==$/, "the fingerprint is Powertools' payload hash");
  const error = await handler({ ...event, amount: 20 }, lambdaContext(30000)).catch((e) => e);
  assert.ok(error instanceof IdempotencyValidationError, String(error));
  assert.equal(error.existingRecord.payloadHash, stored.fingerprint, 'the error carries the stored record');
  assert.deepEqual(error.existingRecord.getResponse(), first);
  assert.deepEqual(await handler({ ...event, note: 'x' }, lambdaContext(30000)), first, 'the same payload replays');
  assert.equal(calls.length, 1);
  assert.equal((await record(db.admin, tenant, stored.key)).fingerprint, stored.fingerprint, 'nothing changed');
});

test('the function throws: its writes roll back, the record is released, and a retry runs', opts, async () => {
  const tenant = `pt-error-${RUN}`;
  const layer = layerFor(tenant);
  const { handler, calls } = ordersHandler(layer);
  const orderId = `o5-${RUN}`;
  await assert.rejects(handler({ orderId, amount: 10, fail: true }, lambdaContext(30000)),
    { message: `the function failed for ${orderId}` }, "the function's own error comes through");
  assert.deepEqual(await records(db.admin, tenant), [], 'no record is left');
  assert.equal(await orders(db.admin, orderId), 0, 'the write made through the client was rolled back');
  const result = await handler({ orderId, amount: 10 }, lambdaContext(30000));
  assert.equal(calls.length, 2, 'the retry ran the function');
  assert.equal(result.orderId, orderId);
  assert.equal(await orders(db.admin, orderId), 1);
  assert.equal((await records(db.admin, tenant))[0].status, 'completed');
});

test('expired in progress: after the lease (the Lambda\'s remaining time) a new invocation takes over;'
  + ' the late one can neither overwrite the record nor commit its writes', opts, async () => {
  const tenant = `pt-takeover-${RUN}`;
  const layer = layerFor(tenant);
  const hold = gate();
  const tokens = [];
  const { handler, calls } = ordersHandler(layer, {
    before: async (event, n) => {
      tokens.push(layer.token);
      if (n === 1) await hold.opened;
    },
  });
  const orderId = `o6-${RUN}`;
  const started = Date.now();
  const stalled = handler({ orderId, amount: 10, note: 'stalled' }, lambdaContext(1000)).catch((e) => e);
  const claim = await committedClaim(tenant);
  const stored = await record(db.admin, tenant, claim.key);
  const lease = stored.lease_expires_at.getTime() - started;
  assert.ok(lease > 0 && lease <= 1500, `the lease is the remaining time Powertools read (1 s): ${lease} ms`);
  assert.ok(await handler({ orderId, amount: 10 }, lambdaContext(30000)).catch((e) => e)
    instanceof IdempotencyAlreadyInProgressError, 'in progress while the lease lasts');
  await sleep(Math.max(0, stored.lease_expires_at.getTime() - Date.now()) + 200);
  const taken = await handler({ orderId, amount: 10, note: 'took over' }, lambdaContext(30000));
  assert.equal(calls.length, 2, 'the new invocation ran the function');
  assert.ok(BigInt(tokens[1]) > BigInt(tokens[0]), `a larger token: ${tokens[1]} > ${tokens[0]}`);
  hold.open();
  const late = await stalled;
  assert.ok(fencedCause(late), `the late completion is refused (ID002): ${late?.cause ?? late}`);
  const after = await record(db.admin, tenant, claim.key);
  assert.equal(after.status, 'completed');
  assert.deepEqual(after.response, taken, "the record holds the new invocation's result");
  assert.equal(after.token, tokens[1]);
  const { rows } = await db.admin.query('SELECT note FROM pt_orders WHERE order_id = $1 ORDER BY id', [orderId]);
  assert.deepEqual(rows, [{ note: 'took over' }], "the late invocation's write was rolled back with its refusal");
  assert.deepEqual(await handler({ orderId, amount: 10 }, lambdaContext(30000)), taken, 'and it replays');
});

test('fencing: a late invocation whose function throws cannot release the record of the one that took over', opts, async () => {
  const tenant = `pt-fence-${RUN}`;
  const layer = layerFor(tenant, { lease: 1 });       // the layer's lease wins over the Lambda's remaining time
  const holdLate = gate();
  const holdNew = gate();
  const { handler, calls } = ordersHandler(layer, {
    before: (event, n) => (n === 1 ? holdLate.opened : holdNew.opened),
  });
  const orderId = `o7-${RUN}`;
  const late = handler({ orderId, amount: 10, fail: true }, lambdaContext(600000)).catch((e) => e);
  const claim = await committedClaim(tenant);
  const stored = await record(db.admin, tenant, claim.key);
  assert.ok(stored.lease_expires_at.getTime() - Date.now() < 1500, 'the lease option: 1 second, not 10 minutes');
  await sleep(Math.max(0, stored.lease_expires_at.getTime() - Date.now()) + 200);
  const current = handler({ orderId, amount: 10, note: 'current' }, lambdaContext(30000));
  for (let i = 0; i < 200; i += 1) {                 // until the second invocation runs on its own claim
    if (calls.length >= 2 && (await record(db.admin, tenant, claim.key))?.token !== stored.token) break;
    await sleep(25);
  }
  assert.equal(calls.length, 2, 'the second invocation took over and runs');
  holdLate.open();                              // the late one's function throws now
  const error = await late;
  assert.ok(fencedCause(error), `its release is refused (ID002): ${error?.cause ?? error}`);
  const kept = await record(db.admin, tenant, claim.key);
  assert.equal(kept.status, 'processing', "the current holder's claim is still there");
  assert.ok(BigInt(kept.token) > BigInt(stored.token));
  assert.ok(await handler({ orderId, amount: 10 }, lambdaContext(30000)).catch((e) => e)
    instanceof IdempotencyAlreadyInProgressError, 'so a third delivery is still told it is in progress');
  holdNew.open();
  const result = await current;
  assert.equal(result.orderId, orderId);
  assert.equal((await record(db.admin, tenant, claim.key)).status, 'completed');
  assert.equal(await orders(db.admin, orderId), 1, 'one order: the current holder\'s');
});

test('heartbeat(): a long function extends its lease, and no one takes over meanwhile', opts, async () => {
  const tenant = `pt-heartbeat-${RUN}`;
  const layer = layerFor(tenant, { lease: '1 second' });
  const hold = gate();
  let extended;
  const { handler, calls } = ordersHandler(layer, {
    before: async () => {
      extended = await layer.heartbeat(60);
      await hold.opened;
    },
  });
  const orderId = `o8-${RUN}`;
  const running = handler({ orderId, amount: 10 }, lambdaContext(30000));
  const claim = await committedClaim(tenant);
  for (let i = 0; i < 200 && !extended; i += 1) await sleep(25);
  assert.ok(extended instanceof Date && extended.getTime() - Date.now() > 50000, `the new lease end: ${extended}`);
  await sleep(1300);
  assert.ok(await handler({ orderId, amount: 10 }, lambdaContext(30000)).catch((e) => e)
    instanceof IdempotencyAlreadyInProgressError, 'past the first lease, still in progress');
  hold.open();
  await running;
  assert.equal(calls.length, 1);
  assert.equal((await record(db.admin, tenant, claim.key)).status, 'completed');
});

test("useLocalCache: Powertools' cache answers a replay without the database", opts, async () => {
  const tenant = `pt-cache-${RUN}`;
  const config = new IdempotencyConfig({ eventKeyJmesPath: 'orderId', useLocalCache: true });
  const layer = layerFor(tenant);
  const { handler, calls } = ordersHandler(layer, { config });
  const event = { orderId: `o9-${RUN}`, amount: 10 };
  const first = await handler(event, lambdaContext(30000));
  await db.admin.query('DELETE FROM idempotency_records WHERE tenant_id = $1', [tenant]);
  assert.deepEqual(await handler(event, lambdaContext(30000)), first, 'answered from the cache');
  assert.equal(calls.length, 1);
  const fresh = ordersHandler(layerFor(tenant), { config: new IdempotencyConfig({ eventKeyJmesPath: 'orderId' }) });
  await fresh.handler(event, lambdaContext(30000));
  assert.equal(fresh.calls.length, 1, 'a layer without that cache finds no record and runs');
  const perEvent = ordersHandler(layerFor((e) => e.tenant), { config });
  await assert.rejects(async () => perEvent.handler({ ...event, tenant }, lambdaContext(30000)),
    (e) => e instanceof TypeError && /useLocalCache with a tenant per event/.test(e.message));
});

test('the options are checked when the layer is made', opts, () => {
  assert.throws(() => new PostgresPersistenceLayer({ tenant: 't' }), /needs pool/);
  assert.throws(() => new PostgresPersistenceLayer({ pool: db.app, tenant: '' }), { code: 'invalid_tenant' });
  assert.throws(() => new PostgresPersistenceLayer({ pool: db.app, tenant: 't', tenantSetting: 'tenant' }),
    /tenantSetting/);
  assert.throws(() => new PostgresPersistenceLayer({ pool: db.app, tenant: 't', lease: -1 }), /lease/);
});
