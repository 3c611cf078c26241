'use strict';
// Tenants: the layer's tenant per event, tenantSetting, and what the
// application role sees, with tenant isolation on (IDEM_TEST_TENANT_SETTING)
// or off.  Each test asserts in both runs what that run must show, so a run
// without isolation cannot pass as one with it.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const {
  makeIdempotent, IdempotencyConfig, IdempotencyPersistenceLayerError,
} = require('@aws-lambda-powertools/idempotency');
const { PostgresPersistenceLayer } = require('idempotency-pg-powertools');
const {
  RUN, APP_USER, TENANT_SETTING, skipReason, pools, records, lambdaContext,
} = require('./helpers');

const db = pools();
const opts = { skip: skipReason };
const REFUSED = ['55000', '42501'];   // the setting unset (the extension's error), or row-level security

function shopHandler(layer) {
  const calls = [];
  const handler = makeIdempotent(async (event) => {
    calls.push(event);
    await layer.client.query('INSERT INTO pt_orders (tenant, order_id) VALUES ($1, $2)', [event.shop, event.orderId]);
    return { shop: event.shop, orderId: event.orderId };
  }, { persistenceStore: layer, config: new IdempotencyConfig({ eventKeyJmesPath: 'orderId' }) });
  return { handler, calls };
}

test('the application role cannot bypass row-level security', {
  skip: skipReason || (!APP_USER && 'IDEM_TEST_APP_USER is not set'),
}, async () => {
  const { rows: [role] } = await db.app.query(`SELECT r.rolsuper, r.rolbypassrls,
      pg_has_role(current_user, c.relowner, 'MEMBER') AS owner, c.relrowsecurity AS rls
    FROM pg_roles r, pg_class c WHERE r.rolname = current_user AND c.oid = 'idempotency_records'::regclass`);
  assert.deepEqual(role, { rolsuper: false, rolbypassrls: false, owner: false, rls: TENANT_SETTING !== null });
});

test('a tenant per event: the same order id in two shops is two records, each seen by its own tenant', opts, async () => {
  const shops = [`pt-shop-a-${RUN}`, `pt-shop-b-${RUN}`];
  const layer = new PostgresPersistenceLayer({ pool: db.app, tenant: (event) => event.shop, tenantSetting: TENANT_SETTING });
  const { handler, calls } = shopHandler(layer);
  const orderId = `iso-${RUN}`;
  const results = await Promise.all(shops.map((shop) => handler({ shop, orderId }, lambdaContext(30000))));
  assert.deepEqual(results.map((r) => r.shop), shops);
  assert.deepEqual(await handler({ shop: shops[0], orderId }, lambdaContext(30000)), results[0], 'a replay per shop');
  assert.equal(calls.length, 2);
  const [a] = await records(db.admin, shops[0]);
  const [b] = await records(db.admin, shops[1]);
  assert.equal(a.key, b.key, 'one key, two tenants');
  // as the application role: a session of shop a, of shop b, of a shop without records
  const seen = {};
  for (const shop of [...shops, `pt-shop-none-${RUN}`]) {
    const client = await db.app.connect();
    try {
      await client.query('BEGIN');
      await client.query("SELECT set_config('app.tenant', $1, true)", [shop]);
      const { rows } = await client.query('SELECT tenant_id FROM idempotency_records WHERE key = $1 ORDER BY 1', [a.key]);
      seen[shop] = rows.map((r) => r.tenant_id);
      await client.query('ROLLBACK');
    } finally {
      client.release();
    }
  }
  const want = TENANT_SETTING
    ? { [shops[0]]: [shops[0]], [shops[1]]: [shops[1]], [`pt-shop-none-${RUN}`]: [] }
    : { [shops[0]]: shops, [shops[1]]: shops, [`pt-shop-none-${RUN}`]: shops };
  assert.deepEqual(seen, want);
});

test('without tenantSetting the claim is refused when isolation is on (nothing stored), and runs when off', opts, async () => {
  const tenant = `pt-unset-${RUN}`;
  const layer = new PostgresPersistenceLayer({ pool: db.app, tenant });
  const { handler, calls } = shopHandler(layer);
  const outcome = await handler({ shop: tenant, orderId: `unset-${RUN}` }, lambdaContext(30000)).catch((e) => e);
  if (TENANT_SETTING) {
    assert.ok(outcome instanceof IdempotencyPersistenceLayerError && REFUSED.includes(outcome.cause?.code),
      `refused: ${outcome} (${outcome?.cause?.code})`);
    assert.equal(calls.length, 0);
    assert.deepEqual(await records(db.admin, tenant), []);
  } else {
    assert.equal(outcome.orderId, `unset-${RUN}`);
    assert.equal((await records(db.admin, tenant))[0].status, 'completed');
  }
});
