'use strict';
/*
 * idempotent(fn, options): run fn at most once per (tenant, key) for the
 * messages of a queue consumer, a job or any other at-least-once delivery.
 *
 *   const handle = idempotent(async (db, message) => {
 *     await db.query('INSERT ...');          // same transaction as the claim
 *     return { orderId: 42 };                // stored, returned on every duplicate
 *   }, { key: 'messageId', tenant: 'orders-consumer', payloadValidation: ['body.amount'] });
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
  MAX_IDENTIFIER_BYTES, SET_TENANT_SQL, IdempotencyError, checkTenantSetting, tenantSettingError, perCall, retryAfterSql,
  holderOption,
} = require('./common');
const { valueGetter, payloadFingerprint, jmesPath } = require('./paths');
const { traced } = require('./telemetry');

/** A pg.Pool lends a client; a pg.Client or a pool's client is used as it is. */
async function borrow(db) {
  const isPool = db && typeof db.connect === 'function' && 'idleCount' in db && 'totalCount' in db;
  if (!isPool) return { client: db, giveBack: () => {} };
  const client = await db.connect();
  return { client, giveBack: (err) => client.release(err) };
}

const typeName = (value) => (value === null ? 'null' : Array.isArray(value) ? 'array'
  : typeof value === 'number' ? 'a number that is not an integer' : typeof value);

/** A tenant or key as the extension takes it, checked as the Python package checks a consumer's:
 *  a string or an integer, 1..255 UTF-8 bytes, no NUL (not only printable ASCII: that is for
 *  HTTP headers). */
function identifier(value, what) {
  const refuse = (text) => { throw new IdempotencyError('invalid_key', `The ${what} ${text}`); };
  if (typeof value === 'bigint' || (typeof value === 'number' && Number.isInteger(value))) value = String(value);
  if (typeof value !== 'string') refuse(`must be a string or an integer, not ${typeName(value)}.`);
  if (value === '') refuse('must not be empty.');
  const size = Buffer.byteLength(value, 'utf8');
  if (size > MAX_IDENTIFIER_BYTES) refuse(`is too long: ${size} bytes; the limit is ${MAX_IDENTIFIER_BYTES}.`);
  if (value.includes('\0')) refuse('must not contain a NUL character.');
  return value;
}

/**
 * options:
 *   key                (message) => key, or a field path into the message ('id', 'headers.messageId',
 *                      'Records[0].messageId', 'headers["x.y"]'; lib/paths.js)
 *   tenant             a string, or (message) => tenant (the consumer group, the queue)
 *   payloadValidation  what makes the fingerprint, compared when a key comes again (another one
 *                      is refused: 'mismatch'): '*' (the whole message), a field path, an array
 *                      of field paths (a missing one counts as null), or a function of the
 *                      message; default: no fingerprint. fingerprintFields is its older name.
 *   eventKeyJmesPath, payloadValidationJmesPath
 *                      AWS Powertools' names: the key, or what makes the fingerprint, as a
 *                      JMESPath expression over the message (its JSON), instead of key or
 *                      payloadValidation; needs the jmespath package
 *   ttl, lease, wait   intervals for idem_claim ('1 day', '30 seconds', '2 seconds'), or
 *                      (message) => interval (per call); default the server's settings
 *                      (wait: answer in_progress at once)
 *   holder             who claims (extension 1.4): a string naming the execution (a durable
 *                      execution's ARN, a workflow run id) or (message) => string|null. While
 *                      a claim this holder committed is in progress with a live lease, the same
 *                      holder claims it again (fn runs, with the record's token); any other
 *                      holder, or none, gets 'in_progress'. Default null: not sent (1.3 servers)
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
  key = null, tenant, payloadValidation = null, fingerprintFields = null, ttl = null, lease = null, wait = null,
  holder = null, tenantSetting = null, raiseOnMissingKey = true, responseHook = null, eventKeyJmesPath = null,
  payloadValidationJmesPath = null,
} = {}) {
  if (typeof fn !== 'function') throw new TypeError('idempotent() needs the function to wrap.');
  // the checks of the Python package's idempotent_function, in its order and with its texts
  if ((key === null) === (eventKeyJmesPath === null)) {
    throw new TypeError('idempotent() needs key (a field path or a function of the message) or eventKeyJmesPath,'
      + ' one of them.');
  }
  if (payloadValidation !== null && fingerprintFields !== null) {
    throw new TypeError('payloadValidation and fingerprintFields (its older name) are one option: give one.');
  }
  payloadValidation ??= fingerprintFields;
  if (payloadValidation !== null && payloadValidationJmesPath !== null) {
    throw new TypeError('payloadValidation and payloadValidationJmesPath are two ways of one option: give one.');
  }
  if (eventKeyJmesPath !== null) key = jmesPath(eventKeyJmesPath, 'eventKeyJmesPath');
  if (payloadValidationJmesPath !== null) {
    payloadValidation = jmesPath(payloadValidationJmesPath, 'payloadValidationJmesPath');
  }
  if (!(typeof tenant === 'function' || typeof tenant === 'string' || typeof tenant === 'number')) {
    throw new TypeError('idempotent() needs tenant: a string naming the consumer (its group, its queue) or a function'
      + ' of the message.');
  }
  const keyOf = valueGetter(key);
  const fingerprintOf = payloadFingerprint(payloadValidation);
  const tenantOf = typeof tenant === 'function' ? tenant : ((fixed) => () => fixed)(identifier(tenant, 'tenant'));
  if (responseHook !== null && typeof responseHook !== 'function') {
    throw new TypeError('The responseHook option must be a function (result, replayed).');
  }
  const setting = checkTenantSetting(tenantSetting);
  const intervals = [perCall(lease, 'lease'), perCall(ttl, 'ttl'), perCall(wait, 'wait')];
  const holderOf = holderOption(holder);
  const answer = (result, replayed) => (responseHook ? responseHook(result, replayed) : result);

  return async function idempotentCall(db, message, ...rest) {
    const rawKey = keyOf(message);
    if (rawKey === undefined || rawKey === null) {
      if (!raiseOnMissingKey) return runWithoutKey(fn, db, message, rest);
      throw new IdempotencyError('invalid_key', 'The message has no idempotency key.');
    }
    const keyValue = identifier(rawKey, 'idempotency key');
    const tenantValue = identifier(tenantOf(message), 'tenant');
    const fingerprint = fingerprintOf ? fingerprintOf(message) : null;
    const [callLease, callTtl, callWait] = intervals.map((f) => f(message) ?? null);
    const callHolder = await holderOf(message);
    const holderArg = callHolder === null ? '' : ', holder => $7::text';   // 1.4; unset: 1.3's call

    const { client, giveBack } = await borrow(db);
    let broken;
    try {
      await client.query('BEGIN');
      let outcome;
      try {
        if (setting) await client.query(SET_TENANT_SQL, [setting, tenantValue]);
        const { rows: [claim] } = await traced('idem_claim', client, () => client.query(
          `SELECT outcome, token, response, ${retryAfterSql('$6')} AS retry_after
             FROM idem_claim($1, $2, $3, lease => $4::interval, ttl => $5::interval, wait => $6::interval${holderArg})`,
          [tenantValue, keyValue, fingerprint, callLease, callTtl, callWait,
            ...(callHolder === null ? [] : [callHolder])]), (result) => result.rows[0].outcome)
          .catch((e) => { throw tenantSettingError(e, setting, 'idempotent()', "message's"); });
        outcome = claim;
        if (claim.outcome === 'claimed') {
          const result = await fn(client, message, ...rest);
          const document = JSON.stringify(result === undefined ? null : result);
          // store it and read back what was stored: the same value on every delivery
          const { rows: [stored] } = await traced('idem_complete', client, () => client.query(
            `SELECT d.r AS result FROM (SELECT $4::jsonb) AS d(r),
                    idem_complete($1, $2, $3::bigint, response => d.r)`,
            [tenantValue, keyValue, claim.token, document]));
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

module.exports = { idempotent, identifier };
