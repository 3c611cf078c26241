'use strict';
/*
 * What the Express middleware and the consumer wrapper share: checking an
 * identifier the extension accepts, canonical JSON for fingerprints, and
 * the error a caller can tell apart by its code.
 */
const crypto = require('node:crypto');

const MAX_IDENTIFIER_BYTES = 255;   // the extension's limit on tenant_id and key
// a custom setting as idem_set_tenant_isolation accepts it: two or more dot-separated identifiers
const SETTING_NAME = /^[A-Za-z_][A-Za-z0-9_$]*(?:\.[A-Za-z_][A-Za-z0-9_$]*)+$/;
// run in the claim's transaction before the claim: transaction-local (is_local true),
// so it ends with the transaction, also through PgBouncer's transaction pooling
const SET_TENANT_SQL = 'SELECT pg_catalog.set_config($1, $2, true)';

// The same in the Python, Node.js and Go packages (docs/integrations.md, "One behaviour in
// three packages"): the titles of the problem documents...
const TITLES = {
  keyRequired: 'An Idempotency-Key header is required',
  keyInvalid: 'The Idempotency-Key header is invalid',
  tenantInvalid: 'The tenant is invalid',
  inProgress: 'A request with this Idempotency-Key is still being processed',
  mismatch: 'This Idempotency-Key was used for a different request',
  internal: 'Internal error',
};
// ...the headers a stored answer keeps and replays (an allow-list, lower case)...
const DEFAULT_REPLAYED_HEADERS = ['location', 'content-location', 'link'];
// ...and Retry-After of a 409 (seconds, RETRY_AFTER_MIN..RETRY_AFTER_MAX): the seconds left of the
// holder's lease when its end is known (a committed claim, the two-phase pattern); while the holder
// has not committed its claim (claim and handler in one transaction: the usual case) its answer
// comes with its commit, so the call's wait (a duplicate that waited that long tries again after
// as long), else 1.  $n is the call's wait.
const RETRY_AFTER_MIN = 1;
const RETRY_AFTER_MAX = 60;
const retryAfterSql = (waitParam) => `greatest(${RETRY_AFTER_MIN}, least(${RETRY_AFTER_MAX}, ceil(extract(epoch FROM
  coalesce(expires_at - clock_timestamp(), ${waitParam}::interval, interval '1 second')))))::int`;

/** Which answers are stored and replayed by default: 2xx, 3xx and the deterministic 4xx
 *  (not 408, 409, 425, 429); never a 5xx. An answer not stored rolls back with the claim. */
function defaultStoreStatus(status) {
  return (status >= 200 && status < 400) || (status >= 400 && status < 500 && ![408, 409, 425, 429].includes(status));
}

/** An interval option: null, interval text ('5 minutes'), or a function of the request or
 *  message returning one (per call). Returns a function of the request or message. */
/** The holder option (extension 1.4): null (none: holder => is not sent, so 1.3 servers still
 *  answer), a non-empty string, or a function of the message/request returning one or null. */
function holderOption(value) {
  const checked = (holder) => {
    if (holder === null || holder === undefined) return null;
    if (typeof holder !== 'string' || holder === '') {
      throw new TypeError('The holder option must be a non-empty string, null, or a function returning one.');
    }
    return holder;
  };
  if (typeof value === 'function') return async (arg) => checked(await value(arg));
  const fixed = checked(value);
  return () => fixed;
}

function perCall(value, name) {
  if (typeof value === 'function') return value;
  if (value === null || value === undefined) return () => null;
  if (typeof value !== 'string' || value === '') {
    throw new TypeError(`The ${name} option must be an interval such as '5 minutes', or a function returning one.`);
  }
  return () => value;
}

/** A refusal of the caller's input (HTTP 400), raised before anything is claimed. */
class Refused extends Error {
  constructor(title, detail) {
    super(detail ? `${title}: ${detail}` : title);
    this.title = title;
    this.detail = detail;
  }
}

/**
 * An outcome of idempotent() that is not a result:
 *   code 'in_progress'  another transaction holds the key now (requeue with a delay)
 *   code 'mismatch'     the key was used with another fingerprint (a bug upstream)
 *   code 'failed'       the key was released earlier with a stored failure (error.response)
 *   code 'invalid_key'  the message gave no usable key or tenant
 */
class IdempotencyError extends Error {
  constructor(code, message, response, retryAfter) {
    super(message);
    this.name = 'IdempotencyError';
    this.code = code;
    if (response !== undefined) this.response = response;
    // for 'in_progress': seconds to wait before delivering again, as an HTTP 409's Retry-After
    if (retryAfter !== undefined) this.retryAfter = retryAfter;
  }
}

/** A printable-ASCII identifier of 1..255 bytes (so bytes == characters). */
function parseIdentifier(value, name) {
  if (typeof value !== 'string' || value === '') throw new Refused(`${name} must not be empty`);
  if (value.length > MAX_IDENTIFIER_BYTES) {
    throw new Refused(`${name} is too long`,
      `${value.length} characters; the limit is ${MAX_IDENTIFIER_BYTES}.`);
  }
  if (!/^[\x20-\x7e]+$/.test(value)) throw new Refused(`${name} must be printable ASCII`);
  return value;
}

/** The tenantSetting option: null, or the custom setting the isolation policy reads ('app.tenant'). */
function checkTenantSetting(name) {
  if (name === null || name === undefined) return null;
  if (typeof name !== 'string' || !SETTING_NAME.test(name)) {
    throw new TypeError("The tenantSetting option must name a custom setting such as 'app.tenant'"
      + ' (two or more dot-separated identifiers).');
  }
  return name;
}

// The server's refusal of a claim when tenant isolation is on and its setting is unset (SQLSTATE
// 55000).  Its hint says to run set_config by hand: with this package, the tenantSetting option does.
const TENANT_UNSET = /^tenant isolation is on, but "([^"]+)" is not set$/;

/**
 * The error to pass on for an error of the claim: the server's refusal for an unset tenant setting
 * becomes one naming this package's tenantSetting option (where: 'idempotency()' or 'idempotent()',
 * whose: "request's" or "message's"), with the SQLSTATE kept as its code and the server's error as
 * its cause; any other error is returned as it is.
 */
function tenantSettingError(e, setting, where, whose) {
  const m = e && e.code === '55000' && typeof e.message === 'string' ? TENANT_UNSET.exec(e.message) : null;
  if (!m) return e;
  const wanted = m[1];
  const text = setting
    ? `Tenant isolation is on and its policy reads "${wanted}", but ${where} was given tenantSetting: '${setting}'`
      + ` (SQLSTATE 55000). Give tenantSetting: '${wanted}'.`
    : `Tenant isolation is on, but "${wanted}" is not set (SQLSTATE 55000): give ${where} the tenantSetting option,`
      + ` tenantSetting: '${wanted}', and it sets "${wanted}" to each ${whose} tenant in the claim's transaction.`;
  const error = new Error(text, { cause: e });
  error.name = 'TenantSettingError';
  error.code = e.code;                      // the SQLSTATE, as on node-postgres' own errors
  error.setting = wanted;
  return error;
}

/** Order of code points (as Python sorts str), not of UTF-16 units: a character above U+FFFF
 *  (a surrogate pair) sorts after U+E000..U+FFFF. */
function byCodePoint(a, b) {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i += 1) {
    const x = a.charCodeAt(i);
    const y = b.charCodeAt(i);
    if (x !== y) {
      const rank = (c) => (c >= 0xd800 && c <= 0xdfff ? c + 0x2000 : c >= 0xe000 ? c - 0x800 : c);
      return rank(x) - rank(y);
    }
  }
  return a.length - b.length;
}

/** A number as Python's json.dumps writes a float that is not whole: an exponent below 1e-4
 *  (1e-05, 1.5e-07); whole numbers as JavaScript writes them (JSON does not tell 2 from 2.0). */
function numberJson(n) {
  if (!Number.isFinite(n) || Number.isInteger(n) || Math.abs(n) >= 1e-4) return JSON.stringify(n);
  const [mantissa, exponent] = n.toExponential().split('e');
  return `${mantissa}e${exponent[0]}${exponent.slice(1).padStart(2, '0')}`;
}

/** JSON with sorted keys and no spacing, as the Python package's canonical_json writes it: the same
 *  value gives the same text whatever the key order or spacing. */
function canonicalJson(value) {
  if (value === undefined) return 'null';
  if (typeof value === 'number') return numberJson(value);
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  if (value !== null && typeof value === 'object' && typeof value.toJSON !== 'function') {
    return `{${Object.keys(value).filter((k) => value[k] !== undefined).sort(byCodePoint)
      .map((k) => `${JSON.stringify(k)}:${canonicalJson(value[k])}`).join(',')}}`;
  }
  return JSON.stringify(value);
}

const sha256 = (...parts) => {
  const hash = crypto.createHash('sha256');
  for (const part of parts) hash.update(part);
  return hash.digest('hex');
};

module.exports = {
  MAX_IDENTIFIER_BYTES, SET_TENANT_SQL, TITLES, DEFAULT_REPLAYED_HEADERS, Refused, IdempotencyError, parseIdentifier,
  checkTenantSetting, tenantSettingError, canonicalJson, sha256, retryAfterSql, defaultStoreStatus, perCall, holderOption,
  RETRY_AFTER_MIN, RETRY_AFTER_MAX,
};
