'use strict';
// tenantSetting against a real server, with tenant isolation on
// (IDEM_TEST_TENANT_SETTING) or off: helpers.js says how.  Each test asserts
// in both runs; what it expects differs, so a run that is not isolated
// cannot pass as one that is.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const express = require('express');
const { idempotency, idempotent } = require('..');
const {
  RUN, APP_USER, TENANT_SETTING, skipReason, providePool, asTenant, writes, record, listen, request,
} = require('./helpers');

const SHOP = `iso-shop-${RUN}`;
const OTHER = `iso-other-${RUN}`;
const REFUSED = ['55000', '42501'];   // the setting unset (the extension's error), or row-level security
let pool;

providePool((p) => { pool = p; });

/** An app whose route books through the claim's transaction; errors handed to next() are kept. */
function app(options, errors) {
  const a = express();
  a.post('/things', express.json(), idempotency({ pool, ...options }), async (req, res) => {
    const { db, tenant, key } = req.idempotency;
    await db.query('INSERT INTO test_writes (tenant, key, note) VALUES ($1, $2, $3)', [tenant, key, 'iso']);
    res.status(201).json({ booked: key });
  });
  a.use((err, req, res, next) => {  // eslint-disable-line no-unused-vars
    errors.push(err);
    res.status(500).json({ error: 'internal' });
  });
  return a;
}

async function post(options, tenant, key) {
  const errors = [];
  const server = await listen(app(options, errors));
  try {
    const reply = await request(server.port, {
      path: '/things', body: { n: 1 }, headers: { 'X-Client-Id': tenant, 'Idempotency-Key': key },
    });
    return { ...reply, errors };
  } finally {
    await server.close();
  }
}

test('the application role cannot bypass row-level security', {
  skip: skipReason || (!APP_USER && 'IDEM_TEST_APP_USER is not set'),
}, async () => {
  const { rows: [role] } = await pool.query(`SELECT r.rolsuper, r.rolbypassrls,
      pg_has_role(current_user, c.relowner, 'MEMBER') AS owner, c.relrowsecurity AS rls
    FROM pg_roles r, pg_class c WHERE r.rolname = current_user AND c.oid = 'idempotency_records'::regclass`);
  assert.deepEqual(role, { rolsuper: false, rolbypassrls: false, owner: false, rls: TENANT_SETTING !== null },
    `${APP_USER}: a role with the application grants of docs/privileges.md`);
});

test('tenantSetting: the record carries its tenant; another tenant sees it only with isolation off', { skip: skipReason }, async () => {
  const reply = await post({ tenantSetting: TENANT_SETTING }, SHOP, 'iso-1');
  assert.equal(reply.status, 201, String(reply.errors[0]));
  assert.equal(await writes(SHOP, 'iso-1'), 1);
  assert.equal((await record(SHOP, 'iso-1')).status, 'completed');
  const seen = {};
  for (const tenant of [SHOP, OTHER]) {
    const db = await asTenant(pool, tenant);
    try {
      // without isolation asTenant sets nothing: every session sees every record
      ({ rows: [{ n: seen[tenant] }] } = await db.query(
        "SELECT count(*)::int AS n FROM idempotency_records WHERE key = 'iso-1' AND tenant_id = $1", [SHOP]));
    } finally {
      await db.query('ROLLBACK');
      db.release();
    }
  }
  assert.deepEqual(seen, { [SHOP]: 1, [OTHER]: TENANT_SETTING ? 0 : 1 });
});

test('without tenantSetting: with isolation on the claim is refused (500, nothing stored); off it runs', { skip: skipReason }, async () => {
  const reply = await post({}, SHOP, 'iso-unset');
  const handle = idempotent(async () => 'ran', { key: 'id', tenant: SHOP });
  const consumed = await handle(pool, { id: 'iso-unset-msg' }).catch((e) => e);
  if (TENANT_SETTING) {
    assert.equal(reply.status, 500);
    assert.ok(REFUSED.includes(reply.errors[0]?.code), `middleware: ${reply.errors[0]?.code} ${reply.errors[0]}`);
    assert.ok(REFUSED.includes(consumed?.code), `idempotent(): ${consumed?.code} ${consumed}`);
    assert.equal(await writes(SHOP, 'iso-unset'), 0);
    assert.equal(await record(SHOP, 'iso-unset'), null);
    assert.equal(await record(SHOP, 'iso-unset-msg'), null);
  } else {
    assert.equal(reply.status, 201);
    assert.equal(consumed, 'ran');
  }
});

test('tenantSetting must name a custom setting: refused when the middleware or wrapper is made', async () => {
  for (const bad of ['tenant', "app.x'); DROP TABLE test_writes; --", 42]) {
    assert.throws(() => idempotency({ pool: { connect() {} }, tenantSetting: bad }), TypeError);
    assert.throws(() => idempotent(async () => 1, { key: 'id', tenant: 't', tenantSetting: bad }), TypeError);
  }
  assert.doesNotThrow(() => idempotency({ pool: { connect() {} }, tenantSetting: 'app.tenant' }));
});

test('without tenantSetting under isolation, the error names the tenantSetting option, SQLSTATE 55000 kept', { skip: skipReason }, async () => {
  const reply = await post({}, SHOP, 'iso-named');
  const unset = await idempotent(async () => 'ran', { key: 'id', tenant: SHOP })(pool, { id: 'iso-named-msg' })
    .catch((e) => e);
  const other = await idempotent(async () => 'ran', { key: 'id', tenant: SHOP, tenantSetting: 'app.other_tenant' })(
    pool, { id: 'iso-named-other' }).catch((e) => e);
  if (!TENANT_SETTING) {
    assert.deepEqual([reply.status, unset, other], [201, 'ran', 'ran']);
    return;
  }
  // the server's hint says set_config by hand: the package names its own option instead
  for (const [e, where] of [[reply.errors[0], 'idempotency()'], [unset, 'idempotent()']]) {
    assert.equal(e?.code, '55000', `${where}: ${e}`);
    assert.equal(e.cause?.code, '55000', `${where}: the server's error is its cause`);
    assert.ok(e.message.includes(`give ${where} the tenantSetting option, tenantSetting: '${TENANT_SETTING}'`), e.message);
    assert.doesNotMatch(e.message, /set_config/);
  }
  assert.equal(other?.code, '55000', String(other));
  assert.ok(other.message.includes(`its policy reads "${TENANT_SETTING}", but idempotent() was given tenantSetting:`
    + " 'app.other_tenant'"), other.message);
});
