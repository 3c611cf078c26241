'use strict';
/*
 * idempotent(fn, options): run fn at most once per (tenant, key) for the
 * messages of a queue consumer, a job or any other at-least-once delivery.
 *
 *   const handle = idempotent(async (db, message) => {
 *     await db.query('INSERT ...');          // same transaction as the claim
 *     return { orderId: 42 };                // stored, returned on every duplicate
 *   }, { key: 'messageId', tenant: 'orders-consumer', fingerprintFields: ['body.amount'] });
 *   const result = await handle(pool, message);
 *
 * One transaction on the client (a pg.Pool lends one): BEGIN, idem_claim,
 * fn(client, message, ...), idem_complete with fn's result, COMMIT.  If fn
 * throws, everything rolls back (its writes and the claim) and the error
 * propagates: the next delivery runs fn again.  A duplicate gets the stored
 * result without running fn; the other outcomes are IdempotencyErrors.
 *
 * The result is stored as JSON (JSON.stringify; undefined is stored as
 * null) and what is returned, the first time as on every duplicate, is
 * that JSON read back, so every delivery sees the same value.
 */
const {
  SET_TENANT_SQL, Refused, IdempotencyError, parseIdentifier, checkTenantSetting, canonicalJson, sha256, perCall,
  retryAfterSql,
} = require('./common');

/** A dotted path ('body.order.id') into a message; undefined when any step is missing. */
function pathValue(message, path) {
  let value = message;
  for (const step of path.split('.')) {
    if (value === null || value === undefined) return undefined;
    value = value[step];
  }
  return value;
}

const valueOf = (spec, message) => (typeof spec === 'function' ? spec(message) : pathValue(message, spec));

/** A function of the message from a JMESPath expression (the optional peer dependency jmespath),
 *  checked when the wrapper is made; the message is read as its JSON. */
function jmesPath(expression, name) {
  let jmespath;
  try {
    jmespath = require('jmespath');  // eslint-disable-line global-require
  } catch {
    throw new TypeError(`The ${name} option needs the jmespath package (npm install jmespath);`
      + ' a dotted path (key, fingerprintFields) needs nothing.');
  }
  if (typeof expression !== 'string' || expression.trim() === '') {
    throw new TypeError(`The ${name} option must be a JMESPath expression.`);
  }
  jmespath.compile(expression);      // a syntax error is thrown now, not on the first message
  return (message) => jmespath.search(JSON.parse(JSON.stringify(message ?? null)), expression);
}

/** A pg.Pool lends a client; a pg.Client or a pool's client is used as it is. */
async function borrow(db) {
  const isPool = db && typeof db.connect === 'function' && 'idleCount' in db && 'totalCount' in db;
  if (!isPool) return { client: db, giveBack: () => {} };
  const client = await db.connect();
  return { client, giveBack: (err) => client.release(err) };
}

function identifier(value, what) {
  if (typeof value === 'number' || typeof value === 'bigint') value = String(value);
  try {
    return parseIdentifier(value, what);
  } catch (e) {
    if (!(e instanceof Refused)) throw e;
    const text = e.detail ? `${e.title}: ${e.detail}` : `${e.title}.`;
    throw new IdempotencyError('invalid_key', text[0].toUpperCase() + text.slice(1));
  }
}

/**
 * options:
 *   key                (message) => key, or a dotted path into the message ('id', 'headers.messageId')
 *   tenant             a string, or (message) => tenant (the consumer group, the queue)
 *   fingerprintFields  dotted paths whose values make the fingerprint; a duplicate whose
 *                      fields differ is refused ('mismatch'); default: no fingerprint
 *   eventKeyJmesPath, payloadValidationJmesPath
 *                      AWS Powertools' names: the key, or what makes the fingerprint, as a
 *                      JMESPath expression over the message (its JSON), instead of key or
 *                      fingerprintFields; needs the jmespath package
 *   ttl, lease, wait   intervals for idem_claim ('1 day', '30 seconds', '2 seconds'), or
 *                      (message) => interval (per call); default the server's settings
 *                      (wait: answer in_progress at once)
 *   raiseOnMissingKey  true (default): a message without a key (undefined or null) throws
 *                      IdempotencyError 'invalid_key'; false runs fn without a claim, in a
 *                      transaction of its own, storing nothing
 *   responseHook       (result, replayed) => value: called with every result, what it
 *                      returns is returned; replayed is true when fn did not run
 *   tenantSetting      with tenant isolation on, the setting its policy reads ('app.tenant'):
 *                      set_config(tenantSetting, tenant, true) runs in the transaction
 *                      before the claim; default null: nothing is set
 */
function idempotent(fn, {
  key, tenant, fingerprintFields = null, ttl = null, lease = null, wait = null, tenantSetting = null,
  raiseOnMissingKey = true, responseHook = null, eventKeyJmesPath = null, payloadValidationJmesPath = null,
} = {}) {
  if (typeof fn !== 'function') throw new TypeError('idempotent() needs the function to wrap.');
  if (eventKeyJmesPath !== null) {
    if (key !== undefined) throw new TypeError('Give the key option or eventKeyJmesPath, not both.');
    key = jmesPath(eventKeyJmesPath, 'eventKeyJmesPath');
  }
  if (payloadValidationJmesPath !== null && fingerprintFields !== null) {
    throw new TypeError('Give fingerprintFields or payloadValidationJmesPath, not both.');
  }
  const payload = payloadValidationJmesPath === null ? null : jmesPath(payloadValidationJmesPath, 'payloadValidationJmesPath');
  if (!(typeof key === 'function' || (typeof key === 'string' && key !== ''))) {
    throw new TypeError('The key option must be a function of the message or a dotted path into it.');
  }
  if (!(typeof tenant === 'function' || (typeof tenant === 'string' && tenant !== ''))) {
    throw new TypeError('The tenant option must be a non-empty string or a function of the message.');
  }
  if (fingerprintFields !== null
      && !(Array.isArray(fingerprintFields) && fingerprintFields.every((f) => typeof f === 'string' && f !== ''))) {
    throw new TypeError('The fingerprintFields option must be an array of dotted paths.');
  }
  if (responseHook !== null && typeof responseHook !== 'function') {
    throw new TypeError('The responseHook option must be a function (result, replayed).');
  }
  const setting = checkTenantSetting(tenantSetting);
  const intervals = [perCall(lease, 'lease'), perCall(ttl, 'ttl'), perCall(wait, 'wait')];
  const answer = (result, replayed) => (responseHook ? responseHook(result, replayed) : result);

  return async function idempotentCall(db, message, ...rest) {
    const rawKey = valueOf(key, message);
    if ((rawKey === undefined || rawKey === null) && !raiseOnMissingKey) return runWithoutKey(fn, db, message, rest);
    const keyValue = identifier(rawKey, 'the key');
    const tenantValue = identifier(typeof tenant === 'string' ? tenant : tenant(message), 'the tenant');
    let fingerprint = null;
    if (payload) fingerprint = sha256(canonicalJson(payload(message) ?? null));
    else if (fingerprintFields !== null) {
      fingerprint = sha256(canonicalJson(fingerprintFields.map((field) => [field, pathValue(message, field) ?? null])));
    }
    const [callLease, callTtl, callWait] = intervals.map((f) => f(message) ?? null);

    const { client, giveBack } = await borrow(db);
    let broken;
    try {
      await client.query('BEGIN');
      let outcome;
      try {
        if (setting) await client.query(SET_TENANT_SQL, [setting, tenantValue]);
        const { rows: [claim] } = await client.query(
          `SELECT outcome, token, response, ${retryAfterSql('$6')} AS retry_after
             FROM idem_claim($1, $2, $3, lease => $4::interval, ttl => $5::interval, wait => $6::interval)`,
          [tenantValue, keyValue, fingerprint, callLease, callTtl, callWait]);
        outcome = claim;
        if (claim.outcome === 'claimed') {
          const result = await fn(client, message, ...rest);
          const document = JSON.stringify(result === undefined ? null : result);
          // store it and read back what was stored: the same value on every delivery
          const { rows: [stored] } = await client.query(
            `SELECT d.r AS result FROM (SELECT $4::jsonb) AS d(r),
                    idem_complete($1, $2, $3::bigint, response => d.r)`,
            [tenantValue, keyValue, claim.token, document]);
          await client.query('COMMIT');
          outcome = { outcome: 'claimed', response: stored.result };
        } else {
          await client.query('COMMIT');
        }
      } catch (e) {
        try {
          await client.query('ROLLBACK');
        } catch (rollbackError) {
          broken = rollbackError;   // the connection is unusable: the pool must not lend it again
        }
        throw e;
      }
      switch (outcome.outcome) {
        case 'claimed':
        case 'replay':   // after the commit: a hook that throws cannot undo the stored result
          return answer(outcome.response, outcome.outcome === 'replay');
        case 'failed':
          throw new IdempotencyError('failed', 'This message was processed before and failed; the stored failure is in error.response.',
            outcome.response);
        case 'in_progress':
          throw new IdempotencyError('in_progress',
            'Another delivery of this message is being processed now; deliver it again later.', undefined,
            outcome.retry_after);
        default:
          throw new IdempotencyError('mismatch',
            'This key was used before for a message with other fingerprint fields.');
      }
    } finally {
      giveBack(broken);
    }
  };
}

/** A message without a key under raiseOnMissingKey: false: fn in a transaction of its own. */
async function runWithoutKey(fn, db, message, rest) {
  const { client, giveBack } = await borrow(db);
  let broken;
  try {
    await client.query('BEGIN');
    try {
      const result = await fn(client, message, ...rest);
      await client.query('COMMIT');
      return result;
    } catch (e) {
      try {
        await client.query('ROLLBACK');
      } catch (rollbackError) {
        broken = rollbackError;
      }
      throw e;
    }
  } finally {
    giveBack(broken);
  }
}

module.exports = { idempotent };
