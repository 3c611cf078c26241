'use strict';
// The Express middleware against a real server: node --test, PG* from the environment.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const express = require('express');
const { idempotency } = require('..');
const {
  RUN, TENANT_SETTING, skipReason, database, closeAdmin, writes, record, listen, request,
} = require('./helpers');

const SHOP = `shop-${RUN}`;
let pool;
let strict;     // Idempotency-Key required
let optional;   // raiseOnMissingKey: false
const executions = new Map();   // key -> how many times the route ran
const seenTokens = [];

function app(options) {
  const a = express();
  a.post('/things', express.json(), idempotency({ pool, tenantSetting: TENANT_SETTING, ...options }), async (req, res) => {
    const claim = req.idempotency;
    const key = claim?.key ?? '(none)';
    executions.set(key, (executions.get(key) ?? 0) + 1);
    if (claim) seenTokens.push(claim.token);
    const db = claim?.db ?? pool;   // without a claim the route uses the pool itself
    const { rows: [row] } = await db.query(
      'INSERT INTO test_writes (tenant, key, note) VALUES ($1, $2, $3) RETURNING id',
      [claim?.tenant ?? `nobody-${RUN}`, key, JSON.stringify(req.body)]);
    const wait = Number(req.get('X-Delay-Ms') ?? 0);
    if (wait) await new Promise((r) => { setTimeout(r, wait); });
    if (req.get('X-Throw')) throw new Error('the route failed after its write');
    if (req.get('X-Answer-503')) return res.status(503).json({ error: 'try later' });
    if (req.body.refuse) return res.status(403).json({ error: 'refused', id: Number(row.id) });
    // key order and spacing jsonb will not keep: the answer sent is what PostgreSQL stored
    return res.status(201).json({ zeta: 1, id: Number(row.id), alpha: [1, 2, { b: 2, a: 1 }] });
  });
  a.use((err, req, res, next) => {  // eslint-disable-line no-unused-vars
    res.status(500).type('application/problem+json').send(JSON.stringify({ title: 'internal error', status: 500 }));
  });
  return a;
}

const post = (server, key, body, headers = {}) => request(server.port, {
  path: '/things', body, headers: { 'X-Client-Id': SHOP, ...(key === undefined ? {} : { 'Idempotency-Key': key }), ...headers },
});

before(async () => {
  if (skipReason) return;
  pool = await database();
  strict = await listen(app({}));
  optional = await listen(app({ raiseOnMissingKey: false }));
});

after(async () => {
  if (skipReason) return;
  await strict.close();
  await optional.close();
  await pool.end();
  await closeAdmin();
});

test('a request runs once; the replay is byte-identical with Idempotent-Replayed: true', { skip: skipReason }, async () => {
  const first = await post(strict, 'e-once', { n: 1 });
  const again = await post(strict, 'e-once', { n: 1 });
  assert.equal(first.status, 201);
  assert.equal(first.headers['idempotent-replayed'], undefined);
  assert.equal(again.status, 201);
  assert.equal(again.headers['idempotent-replayed'], 'true');
  assert.deepEqual(again.body, first.body);
  assert.equal(first.headers['content-type'], again.headers['content-type']);
  assert.equal(executions.get('e-once'), 1);
  assert.equal(await writes(SHOP, 'e-once'), 1);
  const rec = await record(SHOP, 'e-once');
  assert.equal(rec.status, 'completed');
  // the first answer is the stored jsonb as PostgreSQL prints it, not the route's own JSON text
  assert.equal(first.body.toString(), JSON.stringify(rec.response.body).replace(/([,:])/g, '$1 '));
});

test('20 concurrent duplicates of 5 keys: one execution per key, the rest 409 or replays', { skip: skipReason }, async () => {
  const keys = ['c-0', 'c-1', 'c-2', 'c-3', 'c-4'];
  const replies = await Promise.all(keys.flatMap((key) => Array.from({ length: 20 },
    () => post(strict, key, { n: key }, { 'X-Delay-Ms': '200' }).then((r) => ({ key, ...r })))));
  for (const key of keys) {
    const mine = replies.filter((r) => r.key === key);
    const originals = mine.filter((r) => r.status === 201 && !r.headers['idempotent-replayed']);
    assert.equal(originals.length, 1, `one original for ${key}`);
    assert.equal(executions.get(key), 1, `the route ran once for ${key}`);
    assert.equal(await writes(SHOP, key), 1);
    for (const r of mine) {
      if (r.status === 409) {
        // the holder has not committed its claim and there is no wait: 1 (not the server's 5-minute lease)
        assert.equal(r.headers['retry-after'], '1');
        assert.match(r.headers['content-type'], /^application\/problem\+json/);
      } else {
        assert.equal(r.status, 201);
        assert.deepEqual(r.body, originals[0].body);
      }
    }
  }
  assert.ok(replies.some((r) => r.status === 409), 'some duplicates met the original in flight');
});

test('a reused key with another body: 422, not run again', { skip: skipReason }, async () => {
  assert.equal((await post(strict, 'e-mismatch', { n: 1 })).status, 201);
  const other = await post(strict, 'e-mismatch', { n: 2 });
  assert.equal(other.status, 422);
  assert.match(other.headers['content-type'], /^application\/problem\+json/);
  const reordered = await post(strict, 'e-mismatch', '{ "n" : 1 }');
  assert.equal(reordered.status, 201, 'the same JSON with other spacing is the same request');
  assert.equal(executions.get('e-mismatch'), 1);
});

test('bad keys: 400 before any claim', { skip: skipReason }, async () => {
  assert.equal((await post(strict, undefined, { n: 1 })).status, 400);
  assert.equal((await post(strict, '', { n: 1 })).status, 400);
  assert.equal((await post(strict, 'k'.repeat(256), { n: 1 })).status, 400);
  assert.equal((await post(strict, 'caf\u00e9', { n: 1 })).status, 400);
  assert.equal((await post(strict, '"unterminated', { n: 1 })).status, 400);
  assert.equal((await post(strict, ['two-a', 'two-b'], { n: 1 })).status, 400);
  assert.equal((await post(strict, 'k'.repeat(255), { n: 1 })).status, 201);
  assert.equal(await writes(SHOP, 'two-a'), 0);
  const noTenant = await request(strict.port, { path: '/things', body: { n: 1 }, headers: { 'Idempotency-Key': 'no-tenant' } });
  assert.equal(noTenant.status, 400, 'no tenant (X-Client-Id) is refused too');
});

test('raiseOnMissingKey: false: a request without the header passes through untouched, each time', { skip: skipReason }, async () => {
  const before = executions.get('(none)') ?? 0;
  const a = await post(optional, undefined, { n: 'no key' });
  const b = await post(optional, undefined, { n: 'no key' });
  assert.equal(a.status, 201);
  assert.equal(b.status, 201);
  assert.equal(b.headers['idempotent-replayed'], undefined);
  assert.notDeepEqual(a.body, b.body, 'two executions, two rows');
  assert.equal(executions.get('(none)'), before + 2);
  // with a key it is still idempotent, and a present but empty key is still refused
  const k1 = await post(optional, 'o-keyed', { n: 1 });
  const k2 = await post(optional, 'o-keyed', { n: 1 });
  assert.equal(k2.headers['idempotent-replayed'], 'true');
  assert.deepEqual(k2.body, k1.body);
  assert.equal(executions.get('o-keyed'), 1);
  assert.equal((await post(optional, '', { n: 1 })).status, 400);
});

test('a route that throws: 500, its write and the claim roll back, the retry runs', { skip: skipReason }, async () => {
  const failed = await post(strict, 'e-throw', { n: 1 }, { 'X-Throw': '1' });
  assert.equal(failed.status, 500);
  assert.equal(await writes(SHOP, 'e-throw'), 0);
  assert.equal(await record(SHOP, 'e-throw'), null);
  const retry = await post(strict, 'e-throw', { n: 1 });
  assert.equal(retry.status, 201);
  assert.equal(retry.headers['idempotent-replayed'], undefined);
  assert.equal(executions.get('e-throw'), 2);
  assert.equal(await writes(SHOP, 'e-throw'), 1);
});

test('a route answering 503 rolls back too; the retry runs', { skip: skipReason }, async () => {
  const first = await post(strict, 'e-503', { n: 1 }, { 'X-Answer-503': '1' });
  assert.equal(first.status, 503);
  assert.equal(await writes(SHOP, 'e-503'), 0);
  assert.equal(await record(SHOP, 'e-503'), null);
  const retry = await post(strict, 'e-503', { n: 1 });
  assert.equal(retry.status, 201);
  assert.equal(await writes(SHOP, 'e-503'), 1);
});

test('a 4xx answer is stored as a failure and replayed', { skip: skipReason }, async () => {
  const first = await post(strict, 'e-403', { refuse: true });
  const again = await post(strict, 'e-403', { refuse: true });
  assert.equal(first.status, 403);
  assert.equal(again.status, 403);
  assert.equal(again.headers['idempotent-replayed'], 'true');
  assert.deepEqual(again.body, first.body);
  assert.equal((await record(SHOP, 'e-403')).status, 'failed');
  assert.equal(executions.get('e-403'), 1);
});

test('the token reaches the route as a string, exact above 2^53', { skip: skipReason }, async () => {
  assert.ok(seenTokens.length > 0);
  for (const token of seenTokens) {
    assert.equal(typeof token, 'string');
    assert.ok(BigInt(token) > 2n ** 53n, `token ${token} is beyond 2^53`);
  }
  const rec = await record(SHOP, 'e-once');
  assert.ok(seenTokens.includes(rec.token), 'the stored token is one the route saw, digit for digit');
});

test('holder (extension 1.4): the same holder re-enters its committed claim with its token; others get 409', { skip: skipReason }, async () => {
  const { requestFingerprint } = require('../lib/express');   // eslint-disable-line global-require
  const held = await listen(app({ holder: (req) => req.get('X-Execution') ?? null }));
  try {
    // execution exec-1 claimed this request and committed, then was suspended mid-way
    const fingerprint = requestFingerprint({ method: 'POST', originalUrl: '/things', body: { n: 1 } });
    const db = await pool.connect();
    await db.query('BEGIN');
    if (TENANT_SETTING) await db.query('SELECT set_config($1, $2, true)', [TENANT_SETTING, SHOP]);
    const { rows: [{ token }] } = await db.query(
      "SELECT token::text AS token FROM idem_claim($1, 'e-held', $2, lease => '10 minutes', holder => 'exec-1')",
      [SHOP, fingerprint]);
    await db.query('COMMIT');
    db.release();
    for (const headers of [{ 'X-Execution': 'exec-2' }, {}]) {
      const busy = await post(held, 'e-held', { n: 1 }, headers);
      assert.equal(busy.status, 409, JSON.stringify(headers));
    }
    assert.equal(executions.get('e-held'), undefined);
    const mine = await post(held, 'e-held', { n: 1 }, { 'X-Execution': 'exec-1' });
    assert.equal(mine.status, 201);
    assert.equal(mine.headers['idempotent-replayed'], undefined);
    assert.equal(seenTokens.at(-1), token);
    assert.equal(executions.get('e-held'), 1);
    const rec = await record(SHOP, 'e-held');
    assert.equal(rec.status, 'completed');
    assert.equal(rec.token, token);
    const replay = await post(held, 'e-held', { n: 1 }, { 'X-Execution': 'exec-2' });
    assert.equal(replay.headers['idempotent-replayed'], 'true');
  } finally {
    await held.close();
  }
});
