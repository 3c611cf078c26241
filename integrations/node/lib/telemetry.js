'use strict';
/*
 * OpenTelemetry, where the application uses it: @opentelemetry/api is an
 * optional peer dependency, loaded once if it is installed. Without it,
 * traced() only runs the statement (one test of a constant); with it and no
 * SDK registered, the API's no-op tracer and meter.
 *
 * A span (kind client) per statement calling an idempotency SQL function,
 * named after the function, with the stable database conventions'
 * attributes and the package's own:
 *   db.system.name          'postgresql'
 *   db.operation.name       'idem_claim', 'idem_complete' or 'idem_release'
 *   db.namespace            the database, when the client knows it
 *   idempotency.outcome     on idem_claim's span, its outcome: claimed, replay, failed,
 *                           in_progress, mismatch (as the Go package's spans)
 *   idempotency.replayed    on idem_claim's span, true when the answer is a stored one
 *                           (replay, failed): the handler did not run
 *   db.response.status_code, error.type   the SQLSTATE when the statement fails (status ERROR)
 * and a counter, idempotency.claims ({claim}), one per idem_claim answered, by
 * idempotency.outcome and idempotency.replayed.
 */
const { name: NAME, version: VERSION } = require('../package.json');

let api = null;
try {
  api = require('@opentelemetry/api');  // eslint-disable-line global-require
} catch (e) {
  if (e.code !== 'MODULE_NOT_FOUND') throw e;
}
// a proxy: spans go to whichever tracer provider the application registers, also later
const tracer = api && api.trace.getTracer(NAME, VERSION);
const REPLAYED = new Set(['replay', 'failed']);
let meterProvider = null;
let claims = null;

/** The claims counter of the global meter provider (it may be registered after this module loads). */
function claimsCounter() {
  const provider = api.metrics.getMeterProvider();
  if (provider !== meterProvider) {
    meterProvider = provider;
    claims = provider.getMeter(NAME, VERSION).createCounter('idempotency.claims', {
      description: 'Calls of idem_claim by their outcome', unit: '{claim}',
    });
  }
  return claims;
}

/**
 * Run call(), one statement on client calling the SQL function operation, in its span;
 * outcomeOf(its result) is the claim's outcome the span carries (idem_claim only).
 */
function traced(operation, client, call, outcomeOf) {
  return api ? inSpan(operation, client, call, outcomeOf) : call();
}

async function inSpan(operation, client, call, outcomeOf) {
  const attributes = { 'db.system.name': 'postgresql', 'db.operation.name': operation };
  if (typeof client?.database === 'string') attributes['db.namespace'] = client.database;
  const span = tracer.startSpan(operation, { kind: api.SpanKind.CLIENT, attributes });
  try {
    const result = await api.context.with(api.trace.setSpan(api.context.active(), span), call);
    if (outcomeOf) {
      const outcome = outcomeOf(result);
      const replayed = REPLAYED.has(outcome);
      span.setAttributes({ 'idempotency.outcome': outcome, 'idempotency.replayed': replayed });
      claimsCounter().add(1, { 'db.system.name': 'postgresql', 'idempotency.outcome': outcome, 'idempotency.replayed': replayed });
    }
    return result;
  } catch (e) {
    if (typeof e?.code === 'string') span.setAttributes({ 'db.response.status_code': e.code, 'error.type': e.code });
    else span.setAttribute('error.type', e?.name ?? 'Error');
    span.recordException(e);
    span.setStatus({ code: api.SpanStatusCode.ERROR, message: e?.message });
    throw e;
  } finally {
    span.end();
  }
}

module.exports = { traced, enabled: api !== null };
