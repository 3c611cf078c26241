'use strict';
// The key and the fingerprint from an expression over the message, as the Python package reads
// them: tests/path-cases.json records the Python package's answers (test/suites/77-node checks
// that it still answers so), and the consumer cases of its tests
// (integrations/python/tests/function_checks.py: check_basic, check_paths_tenants_results,
// check_jmespath, the async payload_validation="amount") against a real server.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const Module = require('node:module');
const { idempotent: wrap, IdempotencyError } = require('..');
const { identifier } = require('../lib/consumer');
const { parsePath, lookup, MISSING, payloadFingerprint, jmesPath } = require('../lib/paths');
const cases = require('./path-cases.json');
const {
  RUN, TENANT_SETTING, skipReason, providePool, writes, record, adminQuery,
} = require('./helpers');

const idempotent = (fn, options) => wrap(fn, { tenantSetting: TENANT_SETTING, ...options });
const attempt = (fn) => {
  try {
    return fn();
  } catch (e) {
    return { error: e.message };
  }
};

test('field paths: the steps, the values and the errors the Python package gives', () => {
  for (const c of cases.paths) {
    const got = attempt(() => {
      const steps = parsePath(c.path);
      return {
        steps,
        values: cases.events.map((event) => {
          const value = lookup(event, steps);
          return value === MISSING ? { missing: true } : { value };
        }),
      };
    });
    const { path, ...want } = c;
    assert.deepEqual(got, want, `the field path ${JSON.stringify(path)}`);
  }
  assert.ok(cases.paths.length >= 40 && cases.paths.filter((c) => c.error).length >= 10);
});

test('payloadValidation: the fingerprints ("sha256:" and canonical JSON) and the errors of the Python package', () => {
  for (const c of cases.fingerprints) {
    const got = attempt(() => ({ fingerprint: payloadFingerprint(c.spec)(cases.events[c.event]) }));
    const { spec, event, ...want } = c;
    assert.deepEqual(got, want, `payloadValidation ${JSON.stringify(spec)} over event ${event}`);
  }
  // the form fingerprints take, whatever wrote them: 'sha256:' and the hash of canonical JSON
  const amount = payloadFingerprint(['order_id', 'amount'])({ amount: 1250, order_id: 'o-1', note: 'x' });
  assert.equal(amount, `sha256:${crypto.createHash('sha256').update('{"amount":1250,"order_id":"o-1"}').digest('hex')}`);
  assert.equal(payloadFingerprint(null), null);
  const byFunction = payloadFingerprint((m) => m.amount);
  assert.equal(byFunction({ amount: 5 }), `sha256:${crypto.createHash('sha256').update('5').digest('hex')}`);
  assert.throws(() => payloadFingerprint(5), TypeError);
});

test('a key as the Python package checks a consumer\'s: a string or an integer, 1..255 UTF-8 bytes, no NUL', () => {
  for (const c of cases.identifiers) {
    const got = attempt(() => ({ key: identifier(c.value, 'idempotency key') }));
    const { value, ...want } = c;
    assert.deepEqual(got, want, `the key ${JSON.stringify(value).slice(0, 40)}`);
  }
  // types JavaScript has and Python names otherwise (Python: "not bool", "not float", "not list")
  for (const [value, type] of [[true, 'boolean'], [1.5, 'a number that is not an integer'], [['a'], 'array'], [{}, 'object']]) {
    assert.throws(() => identifier(value, 'idempotency key'), (e) => e instanceof IdempotencyError && e.code === 'invalid_key'
      && e.message === `The idempotency key must be a string or an integer, not ${type}.`);
  }
  assert.equal(identifier(12345678901234567890n, 'idempotency key'), '12345678901234567890');
});

test('JMESPath: the values python3-jmespath gives, over the message\'s JSON', () => {
  for (const c of cases.jmespath) {
    assert.deepEqual(jmesPath(c.expression, 'eventKeyJmesPath')(cases.events[c.event]), c.value, c.expression);
  }
  assert.throws(() => jmesPath('Records[', 'eventKeyJmesPath'), (e) => !(e instanceof TypeError) && /Expected|Unexpected/.test(e.message),
    'a syntax error is jmespath\'s own, thrown when the wrapper is made (Python: jmespath\'s ParseError)');
  assert.throws(() => jmesPath('  ', 'eventKeyJmesPath'), { name: 'TypeError', message: 'eventKeyJmesPath must be a JMESPath expression.' });
});

test('the options refused when the wrapper is made, with the Python package\'s texts', () => {
  const fn = async () => 1;
  const refusals = [
    [{ tenant: 't' }, TypeError, /needs key \(a field path or a function of the message\) or eventKeyJmesPath, one of them/],
    [{ tenant: 't', key: 'id', eventKeyJmesPath: 'id' }, TypeError, /one of them/],
    [{ tenant: 't', key: 'a..b' }, TypeError, /^The field path "a\.\.b" has an empty field name at character 3\.$/],
    [{ tenant: 't', key: '' }, TypeError, /^A field path must be a non-empty string\.$/],
    [{ tenant: 't', key: 'id', payloadValidation: [] }, TypeError, /^payloadValidation needs at least one field path\.$/],
    [{ tenant: 't', key: 'id', payloadValidation: 'a[' }, TypeError, /is invalid at character 2/],
    [{ tenant: 't', key: 'id', payloadValidation: 'x', fingerprintFields: ['x'] }, TypeError, /give one/],
    [{ tenant: 't', key: 'id', payloadValidation: 'x', payloadValidationJmesPath: 'x' }, TypeError, /two ways of one option/],
    [{ key: 'id' }, TypeError, /needs tenant/],
    [{ key: 'id', tenant: '' }, IdempotencyError, /^The tenant must not be empty\.$/],
    [{ key: 'id', tenant: 'k'.repeat(256) }, IdempotencyError, /^The tenant is too long: 256 bytes; the limit is 255\.$/],
  ];
  for (const [options, type, message] of refusals) {
    assert.throws(() => wrap(fn, options), (e) => e instanceof type && message.test(e.message), JSON.stringify(options));
  }
});

test('JMESPath without the jmespath package: refused when the wrapper is made, naming npm install jmespath', () => {
  const resolve = Module._resolveFilename;
  const loaded = require.resolve('jmespath');
  const cached = require.cache[loaded];
  delete require.cache[loaded];        // as if it had never been installed
  Module._resolveFilename = function resolveWithoutJmespath(request, ...rest) {
    if (request === 'jmespath') throw Object.assign(new Error(`Cannot find module '${request}'`), { code: 'MODULE_NOT_FOUND' });
    return resolve.call(this, request, ...rest);
  };
  try {
    assert.throws(() => wrap(async () => 1, { tenant: 't', eventKeyJmesPath: 'id' }),
      (e) => e.code === 'MODULE_NOT_FOUND' && /eventKeyJmesPath needs the jmespath package \(npm install jmespath\)/.test(e.message));
    assert.throws(() => wrap(async () => 1, { tenant: 't', key: 'id', payloadValidationJmesPath: 'amount' }),
      (e) => e.code === 'MODULE_NOT_FOUND' && /payloadValidationJmesPath needs/.test(e.message));
    // a field path needs nothing
    assert.equal(typeof wrap(async () => 1, { tenant: 't', key: 'Records[0].id', payloadValidation: '*' }), 'function');
  } finally {
    Module._resolveFilename = resolve;
    if (cached) require.cache[loaded] = cached;
  }
});

// ---------------------------------------------------------------- Python's consumer cases, against the server

const BILLING = `billing-${RUN}`;
const calls = new Map();
const ran = (name) => calls.set(name, (calls.get(name) ?? 0) + 1);
let pool;
providePool((p) => { pool = p; });
const effect = (db, tenant, key) => db.query('INSERT INTO test_writes (tenant, key) VALUES ($1, $2)', [tenant, String(key)]);

test('payloadValidation paths: a redelivery with another field outside them replays; another amount is a mismatch', { skip: skipReason }, async () => {
  const charge = idempotent(async (db, event) => {
    ran('charge');
    await effect(db, BILLING, event.order_id);
    return { charged: event.amount, currency: 'EUR' };
  }, { key: 'order_id', payloadValidation: ['order_id', 'amount'], tenant: BILLING, ttl: '7 days' });
  const event = { order_id: 'o-1', amount: 1250, received_at: '2026-01-01T10:00:00Z' };
  const first = await charge(pool, event);
  assert.deepEqual(first, { charged: 1250, currency: 'EUR' });
  const again = await charge(pool, { ...event, received_at: '2026-01-01T10:05:00Z' });
  assert.deepEqual(again, first);
  await assert.rejects(charge(pool, { ...event, amount: 1300 }), (e) => e.code === 'mismatch');
  assert.equal(calls.get('charge'), 1);
  assert.equal(await writes(BILLING, 'o-1'), 1);
  const { rows: [stored] } = await adminQuery(
    'SELECT fingerprint FROM idempotency_records WHERE tenant_id = $1 AND key = $2', [BILLING, 'o-1']);
  assert.equal(stored.fingerprint, `sha256:${crypto.createHash('sha256').update('{"amount":1250,"order_id":"o-1"}').digest('hex')}`,
    'the fingerprint the Python package stores for the same event and paths');
});

test('a key path with an index, the tenant from the message, a result of null stored and replayed', { skip: skipReason }, async () => {
  const consume = idempotent(async (db, message) => {
    ran('consume');
    await effect(db, message.Records[0].queue, message.Records[0].body.message_id);
    return null;
  }, { key: 'Records[0].body.message_id', tenant: (m) => m.Records[0].queue });
  const queue = `orders-queue-${RUN}`;
  const message = { Records: [{ queue, body: { message_id: 'm-1' } }] };
  assert.equal(await consume(pool, message), null);
  assert.equal(await consume(pool, message), null);
  assert.equal(calls.get('consume'), 1);
  assert.equal((await record(queue, 'm-1')).response, null);
  const other = `refunds-queue-${RUN}`;
  await consume(pool, { Records: [{ queue: other, body: { message_id: 'm-1' } }] });
  assert.equal(calls.get('consume'), 2, 'the same key under another tenant is another operation');
});

test('a key function, payloadValidation "*" compares the whole message; no key and raiseOnMissingKey false runs untouched', { skip: skipReason }, async () => {
  const jobs = `jobs-${RUN}`;
  const runJob = idempotent(async (db, job) => {
    ran('runJob');
    await effect(db, jobs, job.jobId);
    return { job: job.jobId, payload: job.payload };
  }, { key: (job) => (job.jobId === null ? null : `job-${job.jobId}`), payloadValidation: '*', tenant: jobs, raiseOnMissingKey: false });
  const a = await runJob(pool, { jobId: 7, payload: { n: 1 } });
  const b = await runJob(pool, { jobId: 7, payload: { n: 1 } });
  assert.deepEqual(a, { job: 7, payload: { n: 1 } });
  assert.deepEqual(b, a);
  assert.equal(calls.get('runJob'), 1);
  await assert.rejects(runJob(pool, { jobId: 7, payload: { n: 2 } }), (e) => e.code === 'mismatch');
  await runJob(pool, { jobId: null, payload: {} });
  await runJob(pool, { jobId: null, payload: {} });
  assert.equal(calls.get('runJob'), 3);
  assert.equal(await writes(jobs, 'null'), 2);
  assert.equal(await record(jobs, 'job-null'), null);
});

test('a message without its key, or with one over 255 bytes: invalid_key, the function does not run', { skip: skipReason }, async () => {
  const strict = idempotent(async () => { ran('strict'); return 1; }, { key: 'id', tenant: `strict-${RUN}` });
  await assert.rejects(strict(pool, { no_id: 1 }),
    (e) => e instanceof IdempotencyError && e.code === 'invalid_key' && e.message === 'The message has no idempotency key.');
  await assert.rejects(strict(pool, { id: 'k'.repeat(256) }), (e) => e.code === 'invalid_key' && /256 bytes/.test(e.message));
  assert.equal(calls.get('strict'), undefined);
  // not only printable ASCII, as in Python: the key is the extension's text
  assert.equal(await strict(pool, { id: 'clé-✓' }), 1);
  assert.equal((await record(`strict-${RUN}`, 'clé-✓')).status, 'completed');
});

test('payloadValidation one path ("amount"): another amount under the key is a mismatch', { skip: skipReason }, async () => {
  const tenant = `async-${RUN}`;
  const charge = idempotent(async (db, event) => {
    ran('chargeAsync');
    await effect(db, tenant, event.id);
    return { charged: event.amount };
  }, { key: 'id', payloadValidation: 'amount', tenant });
  assert.deepEqual(await charge(pool, { id: 'a-1', amount: 40 }), { charged: 40 });
  assert.deepEqual(await charge(pool, { id: 'a-1', amount: 40, note: 'again' }), { charged: 40 });
  await assert.rejects(charge(pool, { id: 'a-1', amount: 41 }), (e) => e.code === 'mismatch');
  assert.equal(calls.get('chargeAsync'), 1);
});

test('eventKeyJmesPath (a filter) and payloadValidationJmesPath; an expression with no value is no key', { skip: skipReason }, async () => {
  const tenant = `jmespath-${RUN}`;
  const runs = [];
  const consume = idempotent(async (db, event) => { runs.push(event); return { n: runs.length }; }, {
    eventKeyJmesPath: "Records[?source=='orders'] | [0].messageId",
    payloadValidationJmesPath: 'Records[0].body.[order_id, amount]', tenant,
  });
  const event = (amount, note = 'first', source = 'orders') => ({
    Records: [{ source, messageId: 'jm-1', body: { order_id: 'o-7', amount, note } }],
  });
  assert.deepEqual(await consume(pool, event(5)), { n: 1 });
  assert.deepEqual(await consume(pool, event(5, 'redelivered')), { n: 1 });
  await assert.rejects(consume(pool, event(6)), (e) => e.code === 'mismatch');
  assert.equal(runs.length, 1);
  assert.equal((await record(tenant, 'jm-1')).status, 'completed');
  await assert.rejects(consume(pool, event(5, 'x', 'refunds')),
    (e) => e.code === 'invalid_key' && e.message === 'The message has no idempotency key.');
  const listKey = idempotent(async () => 1, { eventKeyJmesPath: 'Records[*].messageId', tenant });
  await assert.rejects(listKey(pool, event(5)), (e) => e.code === 'invalid_key' && /not array/.test(e.message));
});
