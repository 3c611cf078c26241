'use strict';
// The consumer wrapper against a real server: node --test, PG* from the environment.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const pg = require('pg');
const { idempotent: wrap, IdempotencyError } = require('..');
const {
  RUN, APP_USER, TENANT_SETTING, skipReason, providePool, asTenant, writes, record,
} = require('./helpers');

/** idempotent() as the tests use it: with this run's tenantSetting (null: isolation off). */
const idempotent = (fn, options) => wrap(fn, { tenantSetting: TENANT_SETTING, ...options });

const ORDERS = `orders-${RUN}`;
const MISC = `misc-${RUN}`;
let pool;
const runs = new Map();

/** A consumer: books the message and returns what it booked. */
async function book(db, message) {
  runs.set(message.id, (runs.get(message.id) ?? 0) + 1);
  const { rows: [row] } = await db.query(
    'INSERT INTO test_writes (tenant, key, note) VALUES ($1, $2, $3) RETURNING id',
    [ORDERS, String(message.id), JSON.stringify(message.body)]);
  if (message.delayMs) await new Promise((r) => { setTimeout(r, message.delayMs); });
  if (message.fail) throw new Error('the consumer failed after its write');
  return { booked: Number(row.id), amount: message.body?.amount, at: new Date(0) };
}

providePool((p) => { pool = p; });

const handle = idempotent(book, { key: 'id', tenant: ORDERS, fingerprintFields: ['body.amount'] });

test('runs once; a duplicate gets the stored result without running', { skip: skipReason }, async () => {
  const message = { id: 'm-1', body: { amount: 500 } };
  const first = await handle(pool, message);
  const again = await handle(pool, { ...message, deliveryCount: 2 });
  assert.equal(runs.get('m-1'), 1);
  assert.equal(await writes(ORDERS, 'm-1'), 1);
  assert.deepEqual(again, first);
  // what every delivery gets is the stored JSON read back: a Date comes back as its JSON string
  assert.equal(first.at, '1970-01-01T00:00:00.000Z');
  assert.equal((await record(ORDERS, 'm-1')).status, 'completed');
});

test('the function throws: its writes and the claim roll back; the next delivery runs', { skip: skipReason }, async () => {
  const message = { id: 'm-fail', body: { amount: 7 } };
  await assert.rejects(handle(pool, { ...message, fail: true }), /failed after its write/);
  assert.equal(await writes(ORDERS, 'm-fail'), 0);
  assert.equal(await record(ORDERS, 'm-fail'), null);
  const result = await handle(pool, message);
  assert.equal(result.amount, 7);
  assert.equal(runs.get('m-fail'), 2);
  assert.equal(await writes(ORDERS, 'm-fail'), 1);
});

test('other fingerprint fields under a used key: mismatch; other fields outside them: a duplicate', { skip: skipReason }, async () => {
  await handle(pool, { id: 'm-fp', body: { amount: 1, note: 'a' } });
  await assert.rejects(handle(pool, { id: 'm-fp', body: { amount: 2, note: 'a' } }),
    (e) => e instanceof IdempotencyError && e.code === 'mismatch');
  const dup = await handle(pool, { id: 'm-fp', body: { amount: 1, note: 'other' } });
  assert.equal(dup.amount, 1);
  assert.equal(runs.get('m-fp'), 1);
});

test('10 concurrent deliveries: one runs, the others are in_progress; with wait all get its result', { skip: skipReason }, async () => {
  const message = { id: 'm-race', body: { amount: 3 }, delayMs: 300 };
  const settled = await Promise.allSettled(Array.from({ length: 10 }, () => handle(pool, message)));
  const ok = settled.filter((s) => s.status === 'fulfilled');
  const busy = settled.filter((s) => s.status === 'rejected');
  assert.equal(runs.get('m-race'), 1);
  assert.ok(ok.length >= 1);
  assert.ok(busy.length >= 1, 'some deliveries met the first one in flight');
  for (const s of busy) assert.ok(s.reason instanceof IdempotencyError && s.reason.code === 'in_progress', String(s.reason));
  assert.equal(await writes(ORDERS, 'm-race'), 1);

  const waiting = idempotent(book, { key: 'id', tenant: ORDERS, wait: '10 seconds' });
  const msg2 = { id: 'm-wait', body: { amount: 4 }, delayMs: 300 };
  const results = await Promise.all(Array.from({ length: 10 }, () => waiting(pool, msg2)));
  assert.equal(runs.get('m-wait'), 1);
  for (const r of results) assert.deepEqual(r, results[0]);
  assert.equal(await writes(ORDERS, 'm-wait'), 1);
});

test('a key from a function; a pg.Client and a pool client work as the database', { skip: skipReason }, async () => {
  const byFunction = idempotent(book, { key: (m) => `fn-${m.ref}`, tenant: (m) => m.queue });
  const client = new pg.Client({ user: APP_USER });
  await client.connect();
  try {
    const first = await byFunction(client, { id: 'fn-1', ref: 1, queue: ORDERS, body: { amount: 9 } });
    const again = await byFunction(client, { id: 'fn-1', ref: 1, queue: ORDERS, body: { amount: 9 } });
    assert.deepEqual(again, first);
    assert.equal(runs.get('fn-1'), 1);
    const { rows: [tx] } = await client.query('SELECT now() = statement_timestamp() AS idle');
    assert.equal(tx.idle, true, 'the client is out of the transaction afterwards');
  } finally {
    await client.end();
  }
  const lent = await pool.connect();
  try {
    await byFunction(lent, { id: 'fn-2', ref: 2, queue: ORDERS, body: { amount: 1 } });
    await byFunction(lent, { id: 'fn-2', ref: 2, queue: ORDERS, body: { amount: 1 } });
    assert.equal(runs.get('fn-2'), 1);
  } finally {
    lent.release();
  }
  assert.equal((await record(ORDERS, 'fn-1')).status, 'completed');
});

test('no usable key: invalid_key before anything is claimed', { skip: skipReason }, async () => {
  const before = runs.get(undefined) ?? 0;
  await assert.rejects(handle(pool, { body: { amount: 1 } }), (e) => e.code === 'invalid_key' && /has no idempotency key/.test(e.message));
  await assert.rejects(handle(pool, { id: '', body: {} }), (e) => e.code === 'invalid_key' && /must not be empty/.test(e.message));
  await assert.rejects(handle(pool, { id: 'x'.repeat(256), body: {} }), (e) => e.code === 'invalid_key');
  assert.equal(runs.get(undefined) ?? 0, before);
  assert.throws(() => idempotent(book, { key: 'id' }), TypeError);
  assert.throws(() => idempotent(book, { tenant: ORDERS }), TypeError);
});

test('a key released with a failure: the stored failure, as an IdempotencyError', { skip: skipReason }, async () => {
  const db = await asTenant(pool, ORDERS);
  try {
    const { rows: [claim] } = await db.query("SELECT token FROM idem_claim($1, 'm-declined')", [ORDERS]);
    await db.query(`SELECT idem_release($1, 'm-declined', $2::bigint, failure => '{"reason": "declined"}')`, [ORDERS, claim.token]);
    await db.query('COMMIT');
  } finally {
    db.release();
  }
  const plain = idempotent(book, { key: 'id', tenant: ORDERS });
  await assert.rejects(plain(pool, { id: 'm-declined', body: {} }),
    (e) => e.code === 'failed' && e.response.reason === 'declined');
  assert.equal(runs.get('m-declined'), undefined);
});

test('a result of undefined is stored as null; numbers and arrays round-trip', { skip: skipReason }, async () => {
  const nothing = idempotent(async () => undefined, { key: 'id', tenant: MISC });
  assert.equal(await nothing(pool, { id: 'u-1' }), null);
  assert.equal(await nothing(pool, { id: 'u-1' }), null);
  const list = idempotent(async () => [1, 'two', { three: 3 }], { key: 'id', tenant: MISC });
  assert.deepEqual(await list(pool, { id: 'l-1' }), [1, 'two', { three: 3 }]);
  assert.deepEqual(await list(pool, { id: 'l-1' }), [1, 'two', { three: 3 }]);
  assert.deepEqual((await record(MISC, 'l-1')).response, [1, 'two', { three: 3 }]);
});

test('holder (extension 1.4): the same holder re-enters its committed claim with its token; others are in_progress', { skip: skipReason }, async () => {
  const tenant = `durable-${RUN}`;
  // execution exec-1 claimed and committed, then was suspended mid-way: its claim is live
  const first = await asTenant(pool, tenant);
  const { rows: [{ token }] } = await first.query(
    "SELECT token::text AS token FROM idem_claim($1, 'h-1', lease => '10 minutes', holder => 'exec-1')", [tenant]);
  await first.query('COMMIT');
  first.release();
  const seen = [];
  const step = idempotent(async (db, message) => {
    const { rows: [row] } = await db.query('SELECT token::text AS token, holder FROM idem_lookup($1, $2)',
      [tenant, message.id]);
    seen.push(row);
    return { by: message.execution ?? null };
  }, { key: 'id', tenant, holder: (message) => message.execution ?? null });
  for (const execution of ['exec-2', undefined]) {
    await assert.rejects(step(pool, { id: 'h-1', execution }),
      (e) => e instanceof IdempotencyError && e.code === 'in_progress', `holder ${execution}`);
  }
  assert.equal(seen.length, 0);
  assert.deepEqual(await step(pool, { id: 'h-1', execution: 'exec-1' }), { by: 'exec-1' });
  assert.deepEqual(seen, [{ token, holder: 'exec-1' }]);
  assert.equal((await record(tenant, 'h-1')).status, 'completed');
  assert.deepEqual(await step(pool, { id: 'h-1', execution: 'exec-2' }), { by: 'exec-1' });   // a replay
  // no holder: the call is 1.3's (holder => not sent), nothing stored
  assert.deepEqual(await step(pool, { id: 'h-2' }), { by: null });
  assert.deepEqual(seen.at(-1), { token: (await record(tenant, 'h-2')).token, holder: null });
  // a fixed holder; '' is refused when wrapping
  const fixed = idempotent(async () => 'fixed', { key: 'id', tenant, holder: 'exec-3' });
  assert.equal(await fixed(pool, { id: 'h-3' }), 'fixed');
  assert.throws(() => idempotent(async () => null, { key: 'id', tenant, holder: '' }), TypeError);
});
