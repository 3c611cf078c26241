'use strict';
// The options the three packages share (docs/integrations.md, "One behaviour in three
// packages"): titles, tenant as a header name, wait, Retry-After from the lease,
// storeStatus, replayedHeaders, responseHook, per-call ttl; the consumer's
// raiseOnMissingKey, responseHook and per-call ttl.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const express = require('express');
const { idempotency, idempotent, defaultStoreStatus } = require('..');
const {
  RUN, TENANT_SETTING, skipReason, database, closeAdmin, asTenant, writes, record, adminQuery, listen, request,
} = require('./helpers');

const SHOP = `opt-${RUN}`;
const TITLES = {
  400: 'An Idempotency-Key header is required', badKey: 'The Idempotency-Key header is invalid',
  409: 'A request with this Idempotency-Key is still being processed',
  422: 'This Idempotency-Key was used for a different request',
};
let pool;
let server;
const hooks = [];

function app() {
  const a = express();
  const base = {
    pool, tenant: 'X-Shop', tenantSetting: TENANT_SETTING,
    responseHook: (res, replayed) => { hooks.push(replayed); res.setHeader('X-Hook', replayed ? 'replay' : 'first'); },
  };
  const route = async (req, res) => {
    const { db, tenant, key } = req.idempotency;
    await db.query('INSERT INTO test_writes (tenant, key) VALUES ($1, $2)', [tenant, key]);
    res.set({ Location: `/things/${key}`, 'X-Trace': `trace-${key}` });
    res.status(Number(req.params.status)).json({ key });
  };
  a.post('/plain/:status', express.json(), idempotency({ ...base, lease: '40 seconds', ttl: (req) => req.get('X-Ttl') }), route);
  a.post('/waiting/:status', express.json(), idempotency({ ...base, wait: '5 seconds' }), route);
  a.post('/brief-wait/:status', express.json(), idempotency({ ...base, wait: '1.2 seconds' }), route);
  a.post('/only-2xx/:status', express.json(), idempotency({
    ...base, storeStatus: (status) => status >= 200 && status < 300, replayedHeaders: ['X-Trace'],
  }), route);
  return a;
}

const post = (path, key, headers = {}) => request(server.port, {
  path, body: { n: 1 }, headers: { 'X-Shop': SHOP, ...(key === undefined ? {} : { 'Idempotency-Key': key }), ...headers },
});
const title = (r) => JSON.parse(r.body.toString()).title;

before(async () => {
  if (skipReason) return;
  pool = await database();
  server = await listen(app());
});

after(async () => {
  if (skipReason) return;
  await server.close();
  await pool.end();
  await closeAdmin();
});

test('the problem titles are the three packages\'; tenant may be a header name', { skip: skipReason }, async () => {
  const none = await post('/plain/201', undefined);
  const bad = await post('/plain/201', 'k'.repeat(256));
  assert.equal(none.status, 400);
  assert.equal(title(none), TITLES[400]);
  assert.equal(bad.status, 400);
  assert.equal(title(bad), TITLES.badKey);
  const noShop = await request(server.port, { path: '/plain/201', body: { n: 1 }, headers: { 'Idempotency-Key': 'x' } });
  assert.equal(title(noShop), 'The tenant is invalid', 'the tenant comes from the X-Shop header named by the option');
  assert.equal((await post('/plain/201', 'opt-mm')).status, 201);
  const other = await request(server.port, {
    path: '/plain/201', body: { n: 2 }, headers: { 'X-Shop': SHOP, 'Idempotency-Key': 'opt-mm' },
  });
  assert.equal(other.status, 422);
  assert.equal(title(other), TITLES[422]);
});

test('per-call ttl, the replayed-headers allow-list, responseHook', { skip: skipReason }, async () => {
  const first = await post('/plain/201', 'opt-1', { 'X-Ttl': '3 days' });
  const again = await post('/plain/201', 'opt-1', { 'X-Ttl': '3 days' });
  assert.equal(again.headers['idempotent-replayed'], 'true');
  assert.deepEqual(again.body, first.body);
  const stored = await record(SHOP, 'opt-1');
  assert.equal(stored.status, 'completed');
  const { rows: [ttl] } = await adminQuery(
    'SELECT extract(epoch FROM ttl)::int AS ttl FROM idempotency_records WHERE tenant_id = $1 AND key = $2', [SHOP, 'opt-1']);
  assert.equal(ttl.ttl, 3 * 86400, 'ttl as a function of the request sets this call\'s retention');
  for (const r of [first, again]) {
    assert.equal(r.headers.location, '/things/opt-1', 'Location is allow-listed by default');
    assert.equal(r.headers['x-trace'], undefined, 'X-Trace is not: neither the first answer nor the replay has it');
  }
  assert.deepEqual(hooks.slice(-2), [false, true]);
  assert.equal(first.headers['x-hook'], 'first');
  assert.equal(again.headers['x-hook'], 'replay');
});

test('storeStatus by default stores a deterministic 4xx, not a 409 or a 5xx', { skip: skipReason }, async () => {
  assert.equal(defaultStoreStatus(422), true);
  assert.equal(defaultStoreStatus(429), false);
  for (const [status, stored] of [[422, 'failed'], [409, null], [503, null]]) {
    const key = `opt-${status}`;
    const hooked = hooks.length;
    const r1 = await post(`/plain/${status}`, key);
    const r2 = await post(`/plain/${status}`, key);
    assert.equal(r1.status, status);
    assert.equal(r2.status, status);
    assert.equal((await record(SHOP, key))?.status ?? null, stored, `${status}`);
    assert.deepEqual(hooks.slice(hooked), stored ? [false, true] : [], 'responseHook: not for an answer not stored');
    if (stored) {
      assert.equal(r2.headers['idempotent-replayed'], 'true');
    } else {
      assert.equal(r2.headers['idempotent-replayed'], undefined);
      assert.equal(await writes(SHOP, key), 0, `a ${status} rolls back the route's write`);
    }
  }
});

test('storeStatus and replayedHeaders given', { skip: skipReason }, async () => {
  const refused = await post('/only-2xx/422', 'opt-only-422');
  assert.equal(refused.status, 422);
  assert.equal(await record(SHOP, 'opt-only-422'), null);
  assert.equal(await writes(SHOP, 'opt-only-422'), 0);
  await post('/only-2xx/201', 'opt-only-201');
  const again = await post('/only-2xx/201', 'opt-only-201');
  assert.equal(again.headers['idempotent-replayed'], 'true');
  assert.equal(again.headers['x-trace'], 'trace-opt-only-201');
  assert.equal(again.headers.location, undefined);
});

// Retry-After (docs/integrations.md): the lease left of a committed claim, else the call's wait or 1;
// between 1 and 60
test('409: Retry-After is the lease left, capped; with wait a duplicate gets the answer', { skip: skipReason }, async () => {
  const holder = await asTenant(pool, SHOP);
  try {
    await holder.query("SELECT idem_claim($1, 'opt-busy', lease => '20 seconds')", [SHOP]);
    await holder.query("SELECT idem_claim($1, 'opt-busy-long', lease => '10 minutes')", [SHOP]);
    await holder.query('COMMIT');                 // committed claims: their lease ends are known
    const busy = await post('/plain/201', 'opt-busy');
    assert.equal(busy.status, 409);
    assert.equal(title(busy), TITLES[409]);
    const after = Number(busy.headers['retry-after']);
    assert.ok(after >= 18 && after <= 20, `Retry-After ${busy.headers['retry-after']} is the lease left (<= 20 s)`);
    const long = await post('/plain/201', 'opt-busy-long');
    assert.equal(long.status, 409);
    assert.equal(long.headers['retry-after'], '60', 'a 10-minute lease left: Retry-After capped at 60');

    await holder.query('BEGIN');
    if (TENANT_SETTING) await holder.query('SELECT set_config($1, $2, true)', [TENANT_SETTING, SHOP]);
    await holder.query("SELECT idem_claim($1, 'opt-busy-2')", [SHOP]);   // uncommitted: its lease end unknown
    const busy2 = await post('/plain/201', 'opt-busy-2');
    assert.equal(busy2.status, 409);
    assert.equal(busy2.headers['retry-after'], '1', 'an uncommitted holder, no wait: 1 (not the lease, 40 s)');
    const started = Date.now();
    const busy3 = await post('/brief-wait/201', 'opt-busy-2');
    const waitedS = (Date.now() - started) / 1000;
    assert.equal(busy3.status, 409);
    assert.equal(busy3.headers['retry-after'], '2', 'after waiting 1.2 s: the wait, rounded up');
    assert.ok(waitedS >= 1.15, `the duplicate waited 1.2 s (${waitedS} s)`);
    await holder.query('ROLLBACK');

    await holder.query('BEGIN');
    if (TENANT_SETTING) await holder.query('SELECT set_config($1, $2, true)', [TENANT_SETTING, SHOP]);
    const { rows: [{ token }] } = await holder.query("SELECT token FROM idem_claim($1, 'opt-wait')", [SHOP]);
    const done = new Promise((resolve) => { setTimeout(resolve, 300); }).then(async () => {
      await holder.query(`SELECT idem_complete($1, 'opt-wait', $2::bigint, '{"status": 201, "body": {"by": "holder"}}')`,
        [SHOP, token]);
      await holder.query('COMMIT');
    });
    const waited = await post('/waiting/201', 'opt-wait');
    await done;
    assert.equal(waited.status, 201);
    assert.equal(waited.headers['idempotent-replayed'], 'true');
    assert.deepEqual(JSON.parse(waited.body.toString()), { by: 'holder' });
  } finally {
    holder.release();
  }
});

test('consumer: raiseOnMissingKey, responseHook, per-call ttl', { skip: skipReason }, async () => {
  const seen = [];
  let runs = 0;
  const handle = idempotent(async (db, message) => {
    runs += 1;
    await db.query('INSERT INTO test_writes (tenant, key) VALUES ($1, $2)', [SHOP, String(message.id)]);
    return { id: message.id, at: new Date(0) };
  }, {
    key: 'id', tenant: SHOP, tenantSetting: TENANT_SETTING, raiseOnMissingKey: false, ttl: (m) => `${m.days} days`,
    responseHook: (result, replayed) => { seen.push(replayed); return { ...result, replayed }; },
  });
  const first = await handle(pool, { id: 'c-1', days: 2 });
  const again = await handle(pool, { id: 'c-1', days: 2 });
  assert.deepEqual(first, { id: 'c-1', at: '1970-01-01T00:00:00.000Z', replayed: false },
    'the first call returns the stored JSON (a Date comes back as its string), as a replay does');
  assert.deepEqual(again, { ...first, replayed: true });
  assert.deepEqual(seen, [false, true]);
  const { rows: [ttl] } = await adminQuery(
    'SELECT extract(epoch FROM ttl)::int AS ttl FROM idempotency_records WHERE tenant_id = $1 AND key = $2', [SHOP, 'c-1']);
  assert.equal(ttl.ttl, 2 * 86400, 'ttl as a function of the message sets this call\'s retention');
  const before = runs;
  await handle(pool, { days: 1 });
  await handle(pool, { days: 1 });
  assert.equal(runs, before + 2, 'raiseOnMissingKey: false runs a message without a key each time');
  assert.equal(await writes(SHOP, 'undefined'), 2);
  const strict = idempotent(async () => 1, {
    key: 'id', tenant: SHOP, tenantSetting: TENANT_SETTING, lease: '45 seconds', wait: (m) => m.wait ?? null,
  });
  await assert.rejects(strict(pool, {}), (e) => e.code === 'invalid_key');
  const holder = await asTenant(pool, SHOP);
  try {
    await holder.query("SELECT idem_claim($1, 'c-busy-long', lease => '10 minutes')", [SHOP]);
    await holder.query('COMMIT');                                        // its lease end is known
    await assert.rejects(strict(pool, { id: 'c-busy-long' }), (e) => e.code === 'in_progress' && e.retryAfter === 60,
      'in_progress carries retryAfter: a committed claim\'s 10-minute lease left, capped at 60');
    await holder.query('BEGIN');
    if (TENANT_SETTING) await holder.query('SELECT set_config($1, $2, true)', [TENANT_SETTING, SHOP]);
    await holder.query("SELECT idem_claim($1, 'c-busy')", [SHOP]);       // uncommitted
    await assert.rejects(strict(pool, { id: 'c-busy' }), (e) => e.code === 'in_progress' && e.retryAfter === 1,
      'in_progress carries retryAfter 1 while the holder is uncommitted and there is no wait (not the lease, 45 s)');
    await assert.rejects(strict(pool, { id: 'c-busy', wait: '1.2 seconds' }),
      (e) => e.code === 'in_progress' && e.retryAfter === 2, 'after waiting 1.2 s: retryAfter is the wait, rounded up');
  } finally {
    await holder.query('ROLLBACK');
    holder.release();
  }
});

test('consumer: eventKeyJmesPath and payloadValidationJmesPath (Powertools\' names)', { skip: skipReason }, async () => {
  const runs = [];
  const consume = idempotent(async (db, event) => { runs.push(event); return { n: runs.length }; }, {
    eventKeyJmesPath: "Records[?source=='orders'] | [0].messageId",
    payloadValidationJmesPath: 'Records[0].body.[orderId, amount]',
    tenant: `${SHOP}-jmespath`, tenantSetting: TENANT_SETTING,
  });
  const event = (amount, note) => ({ Records: [{ source: 'orders', messageId: 'jm-1', body: { orderId: 'o-7', amount, note } }] });
  assert.deepEqual(await consume(pool, event(5, 'first')), { n: 1 });
  assert.deepEqual(await consume(pool, event(5, 'redelivered')), { n: 1 }, 'another note: a replay');
  await assert.rejects(consume(pool, event(6, 'first')), (e) => e.code === 'mismatch', 'another amount: a mismatch');
  assert.equal(runs.length, 1);
  assert.equal((await adminQuery('SELECT count(*)::int AS n FROM idempotency_records WHERE tenant_id = $1 AND key = $2',
    [`${SHOP}-jmespath`, 'jm-1'])).rows[0].n, 1, 'the key the expression gave');
  assert.throws(() => idempotent(async () => 1, { tenant: 't', eventKeyJmesPath: 'Records[' }), /Syntax|Unexpected|Expected/i,
    'a bad expression is refused when the wrapper is made');
  assert.throws(() => idempotent(async () => 1, { tenant: 't', key: 'id', eventKeyJmesPath: 'id' }), TypeError);
});
