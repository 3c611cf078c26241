'use strict';
// OpenTelemetry (lib/telemetry.js) with the SDK's in-memory span exporter and a metric reader
// registered as the application would: the spans of a first request, its replay and a consumer
// call, the idempotency.claims counter; and the package without @opentelemetry/api.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const path = require('node:path');
const api = require('@opentelemetry/api');
const { AsyncLocalStorageContextManager } = require('@opentelemetry/context-async-hooks');
const { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } = require('@opentelemetry/sdk-trace-base');
const { MeterProvider, MetricReader } = require('@opentelemetry/sdk-metrics');
const express = require('express');
const { idempotency, idempotent } = require('..');
const {
  RUN, TENANT_SETTING, skipReason, database, closeAdmin, listen, request,
} = require('./helpers');

// registered after the package was loaded: its tracer is a proxy, its counter follows the provider
const exporter = new InMemorySpanExporter();
api.context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
api.trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
class Reader extends MetricReader {
  async onForceFlush() {}      // eslint-disable-line class-methods-use-this
  async onShutdown() {}        // eslint-disable-line class-methods-use-this
}
const reader = new Reader();
api.metrics.setGlobalMeterProvider(new MeterProvider({ readers: [reader] }));

const SHOP = `otel-${RUN}`;
let pool;
let server;
before(async () => {
  if (skipReason) return;
  pool = await database();
  const app = express();
  app.post('/orders/:status', express.json(), idempotency({ pool, tenant: 'X-Shop', tenantSetting: TENANT_SETTING }),
    (req, res) => res.status(Number(req.params.status)).json({ key: req.idempotency.key }));
  server = await listen(app);
});
after(async () => {
  if (skipReason) return;
  await server.close();
  await pool.end();
  await closeAdmin();
});

/** The spans ended since the last call, as [name, kind, attributes, status code]. */
function spans() {
  const ended = exporter.getFinishedSpans().map((s) => [s.name, s.kind, s.attributes, s.status.code]);
  exporter.reset();
  return ended;
}
const attributes = (operation, outcome, replayed) => ({
  'db.system.name': 'postgresql', 'db.operation.name': operation, 'db.namespace': process.env.PGDATABASE,
  ...(outcome === undefined ? {} : { 'idempotency.outcome': outcome, 'idempotency.replayed': replayed }),
});
const CLIENT = api.SpanKind.CLIENT;
const UNSET = api.SpanStatusCode.UNSET;
const post = (status, key) => request(server.port, {
  path: `/orders/${status}`, body: { n: 1 }, headers: { 'X-Shop': SHOP, 'Idempotency-Key': key },
});

test('middleware: a first request (idem_claim, idem_complete), its replay (idem_claim), a 4xx (idem_release)', { skip: skipReason }, async () => {
  spans();
  assert.equal((await post(201, 'k-1')).status, 201);
  assert.deepEqual(spans(), [
    ['idem_claim', CLIENT, attributes('idem_claim', 'claimed', false), UNSET],
    ['idem_complete', CLIENT, attributes('idem_complete'), UNSET],   // the outcome is the claim's span's
  ]);
  const replay = await post(201, 'k-1');
  assert.equal(replay.headers['idempotent-replayed'], 'true');
  assert.deepEqual(spans(), [['idem_claim', CLIENT, attributes('idem_claim', 'replay', true), UNSET]]);
  assert.equal((await post(404, 'k-404')).status, 404);
  assert.deepEqual(spans(), [
    ['idem_claim', CLIENT, attributes('idem_claim', 'claimed', false), UNSET],
    ['idem_release', CLIENT, attributes('idem_release'), UNSET],
  ]);
  assert.equal((await post(404, 'k-404')).status, 404);
  assert.deepEqual(spans(), [['idem_claim', CLIENT, attributes('idem_claim', 'failed', true), UNSET]],
    'a stored failure replayed: outcome failed, replayed');
  assert.equal((await post(201, 'k-1').then(() => request(server.port, {
    path: '/orders/201', body: { n: 2 }, headers: { 'X-Shop': SHOP, 'Idempotency-Key': 'k-1' },
  }))).status, 422);
  assert.deepEqual(spans().map(([, , a]) => [a['idempotency.outcome'], a['idempotency.replayed']]),
    [['replay', true], ['mismatch', false]]);
});

test('consumer: a first call (idem_claim, idem_complete), a duplicate (idem_claim replay), a failing statement', { skip: skipReason }, async () => {
  const handle = idempotent(async () => ({ ok: true }), {
    key: 'id', tenant: SHOP, tenantSetting: TENANT_SETTING, wait: (m) => m.wait ?? null,
  });
  spans();
  assert.deepEqual(await handle(pool, { id: 'c-1' }), { ok: true });
  assert.deepEqual(spans(), [
    ['idem_claim', CLIENT, attributes('idem_claim', 'claimed', false), UNSET],
    ['idem_complete', CLIENT, attributes('idem_complete'), UNSET],
  ]);
  // within the application's span (a job's, a message's): the package's spans are its children
  const job = await api.trace.getTracer('the-app').startActiveSpan('job', async (span) => {
    await handle(pool, { id: 'c-1' });
    span.end();
    return span.spanContext();
  });
  const [claim, parent] = exporter.getFinishedSpans();
  assert.equal(claim.name, 'idem_claim');
  assert.equal(parent.name, 'job');
  assert.equal(claim.parentSpanContext?.spanId, job.spanId, 'the claim\'s span is a child of the active span');
  assert.equal(claim.spanContext().traceId, job.traceId);
  assert.deepEqual(spans().slice(0, 1), [['idem_claim', CLIENT, attributes('idem_claim', 'replay', true), UNSET]]);
  // the statement fails (wait is no interval): the span says so, with the SQLSTATE
  await assert.rejects(handle(pool, { id: 'c-2', wait: 'soon' }), (e) => e.code === '22007');
  const [[name, , failed, status]] = spans();
  assert.equal(name, 'idem_claim');
  assert.equal(status, api.SpanStatusCode.ERROR);
  assert.equal(failed['db.response.status_code'], '22007');
  assert.equal(failed['error.type'], '22007');
  assert.equal(failed['idempotency.outcome'], undefined);
});

test('the idempotency.claims counter: one per idem_claim answered, by outcome and replayed', { skip: skipReason }, async () => {
  const { resourceMetrics } = await reader.collect();
  const metric = resourceMetrics.scopeMetrics.filter((s) => s.scope.name === 'idempotency-pg')
    .flatMap((s) => s.metrics).find((m) => m.descriptor.name === 'idempotency.claims');
  assert.ok(metric, 'the counter is exported');
  assert.equal(metric.descriptor.unit, '{claim}');
  const counts = Object.fromEntries(metric.dataPoints.map((p) => [
    `${p.attributes['idempotency.outcome']}/${p.attributes['idempotency.replayed']}`, p.value]));
  // the two tests above (the files run in processes of their own): 3 claimed, 3 replays (2 HTTP, 1
  // consumer), 1 failed replayed, 1 mismatch; the failing statement is not counted
  assert.deepEqual(counts, { 'claimed/false': 3, 'replay/true': 3, 'failed/true': 1, 'mismatch/false': 1 });
  assert.ok(metric.dataPoints.every((p) => p.attributes['db.system.name'] === 'postgresql'));
});

test('without @opentelemetry/api the package loads and runs, and nothing is traced', { skip: skipReason }, () => {
  // a process where @opentelemetry/api cannot be found, as in an application that does not install it
  const script = `
    const Module = require('node:module');
    const resolve = Module._resolveFilename;
    Module._resolveFilename = function (request, ...rest) {
      if (request.startsWith('@opentelemetry/')) throw Object.assign(new Error('not installed'), { code: 'MODULE_NOT_FOUND' });
      return resolve.call(this, request, ...rest);
    };
    const pg = require(${JSON.stringify(require.resolve('pg'))});
    const { idempotent } = require(${JSON.stringify(path.join(__dirname, '..'))});
    const telemetry = require(${JSON.stringify(path.join(__dirname, '../lib/telemetry'))});
    const pool = new pg.Pool({ user: process.env.IDEM_TEST_APP_USER || undefined });
    const handle = idempotent(async () => 'ran', {
      key: 'id', tenant: ${JSON.stringify(`${SHOP}-noapi`)}, tenantSetting: process.env.IDEM_TEST_TENANT_SETTING || null,
    });
    handle(pool, { id: 'n-1' }).then(async (first) => {
      const again = await handle(pool, { id: 'n-1' });
      console.log(JSON.stringify({ enabled: telemetry.enabled, first, again }));
      await pool.end();
    }).catch((e) => { console.error(e); process.exit(1); });`;
  const out = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 30000 });
  assert.equal(out.status, 0, out.stderr);
  assert.deepEqual(JSON.parse(out.stdout), { enabled: false, first: 'ran', again: 'ran' });
});
