'use strict';
/*
 * Express middleware: a route runs at most once per (tenant, Idempotency-Key),
 * and its writes, the claim and the stored response are ONE database
 * transaction.
 *
 *   BEGIN; idem_claim(tenant, key, fingerprint)
 *     claimed      next(): the route runs with req.idempotency.db (the
 *                  transaction's client); when it answers, the answer is
 *                  stored (idem_complete, or idem_release with the failure
 *                  for a 4xx) and COMMITted before a byte is sent
 *     replay       the stored status and body, Idempotent-Replayed: true
 *     failed       the stored failure,          Idempotent-Replayed: true
 *     in_progress  409 + Retry-After: the seconds left of the original's lease
 *                  if its claim is committed, else the wait or 1; at most 60
 *                  (with wait, after waiting that long for its answer)
 *     mismatch     422 (the key was used for another request)
 *
 * A route that fails (Express 5 turns a rejected promise into a 500) or
 * answers a status storeStatus refuses (by default a 5xx, 408, 409, 425 or
 * 429) is rolled back: its writes and the claim go together, nothing is
 * stored, and a retry runs again.
 *
 * Two node-postgres points this handles:
 *  - bigint (the token) arrives as a string; it goes back as that string
 *    into a ::bigint parameter.  Number() would round tokens above 2^53.
 *  - a JavaScript array given as a query parameter is sent as a PostgreSQL
 *    array literal ({...}), which a jsonb parameter rejects (22P02).  The
 *    stored document is always passed through JSON.stringify.
 *
 * Byte-identical replays: the body sent is the stored jsonb as PostgreSQL
 * prints it, read back by the statement that stores it, for the first
 * answer as for every replay (and numbers beyond 2^53 are not rounded by
 * JSON.parse on the way).
 */
const {
  SET_TENANT_SQL, TITLES, DEFAULT_REPLAYED_HEADERS, Refused, parseIdentifier, checkTenantSetting, tenantSettingError,
  canonicalJson, sha256, retryAfterSql, defaultStoreStatus, perCall, holderOption,
} = require('./common');
const { traced } = require('./telemetry');

const SF_STRING = /^"((?:[^"\\]|\\["\\])*)"$/;           // RFC 8941 sf-string
// the body to send, as PostgreSQL prints the stored jsonb (the whole document if it is not ours)
const bodyText = (expr) => `coalesce(${expr}->'body', ${expr})::text`;

/** An RFC 7807 problem document, as the IETF Idempotency-Key draft recommends. */
function problem(res, status, title, detail, headers = {}) {
  const doc = { type: 'about:blank', title, status };
  if (detail) doc.detail = detail;
  res.status(status).set(headers).type('application/problem+json').send(JSON.stringify(doc));
}

/** A refusal of parseIdentifier as the detail of a problem titled title. */
function refusedAs(title, e) {
  if (!(e instanceof Refused)) throw e;
  const reason = e.detail ? `${e.title}: ${e.detail}` : `${e.title}.`;
  return new Refused(title, reason[0].toUpperCase() + reason.slice(1));
}

/** The key: an sf-string ("abc") per the IETF draft, or bare (abc) as Stripe sends it. */
function parseIdempotencyKey(values) {
  if (!values || values.length === 0) {
    throw new Refused(TITLES.keyRequired, 'Send a unique key per operation, e.g. a UUID v4.');
  }
  if (values.length > 1) throw new Refused(TITLES.keyInvalid, 'Only one Idempotency-Key header is allowed.');
  let raw = values[0].trim();
  if (raw.startsWith('"')) {
    const quoted = SF_STRING.exec(raw);
    if (!quoted) throw new Refused(TITLES.keyInvalid, 'The Idempotency-Key is not a valid structured-field string.');
    raw = quoted[1].replace(/\\(["\\])/g, '$1');
  }
  try {
    return parseIdentifier(raw, 'the Idempotency-Key');
  } catch (e) {
    throw refusedAs(TITLES.keyInvalid, e);
  }
}

/** What makes two requests "the same": method, path with query, and the body
 *  (canonical JSON once parsed by express.json(), or the raw bytes). */
function requestFingerprint(req) {
  let body = req.body ?? '';
  if (!Buffer.isBuffer(body) && typeof body !== 'string') body = canonicalJson(body);
  return sha256(`${req.method} ${req.originalUrl}\n`, body);
}

/** The route's answer as the document kept in idempotency_records.response; of its
 *  headers, those in the replayedHeaders allow-list (a Set of lower-case names). */
function storedDocument(res, body, replayed) {
  const doc = { status: res.statusCode };
  const headers = Object.fromEntries(Object.entries(res.getHeaders())
    .filter(([name]) => replayed.has(name)));
  if (Object.keys(headers).length > 0) doc.headers = headers;
  const contentType = String(res.getHeader('content-type') ?? '');
  try {
    if (!contentType.includes('json')) throw new SyntaxError('not JSON');
    doc.body = JSON.parse(body.toString('utf8'));
    if (!contentType.startsWith('application/json')) doc.content_type = contentType;
  } catch {
    doc.body_base64 = body.toString('base64');          // not JSON: keep the exact bytes
    doc.content_type = contentType || 'application/octet-stream';
  }
  return doc;
}

/** Send a stored document; `body` is its body as PostgreSQL printed it; hook(res, replayed) runs
 *  before it is sent. */
function sendStored(res, doc, body, replayed, hook) {
  if (!(doc !== null && typeof doc === 'object' && Number.isInteger(doc.status))) {
    // not one of ours, e.g. the extension's {"error": "lease_expired"} under stale_action = 'fail'
    doc = { status: 500 };
  }
  const bytes = doc.body_base64 !== undefined ? Buffer.from(doc.body_base64, 'base64') : Buffer.from(body, 'utf8');
  res.status(doc.status);
  for (const [name, value] of Object.entries(doc.headers ?? {})) res.setHeader(name, value);
  if (replayed) res.setHeader('Idempotent-Replayed', 'true');
  res.removeHeader('ETag');
  res.setHeader('Content-Type', doc.content_type ?? 'application/json');
  res.setHeader('Content-Length', bytes.length);
  if (hook) hook(res, replayed);
  res.end(bytes);
}

/**
 * idempotency({ pool, tenant, lease, ttl, wait, holder, raiseOnMissingKey, tenantSetting, storeStatus,
 *               replayedHeaders, responseHook }) -> middleware
 *   pool:        a pg.Pool
 *   tenant:      a header name (default 'X-Client-Id'), or (req) => tenant id, may be
 *                async: return the authenticated principal's id in a real service.
 *   lease, ttl:  intervals for idem_claim ('30 seconds'), or (req) => interval (per call);
 *                default the server's.
 *   wait:        how long a duplicate waits for the original's answer (same forms); an
 *                answer within the wait is replayed, else 409. Default: answer 409 at once.
 *   holder:      who claims (extension 1.4): a string, or (req) => string|null, may be async.
 *                A claim this holder committed and still holds (a live lease) is claimed
 *                again by the same holder; any other holder or none gets 409. Default null:
 *                holder => is not sent (1.3 servers).
 *   raiseOnMissingKey: true (default): a request without an Idempotency-Key header is
 *                answered 400; false lets it through untouched (no claim, no transaction,
 *                req.idempotency unset). optionalKey: true is the older spelling of false.
 *   storeStatus: (status) => boolean, which answers are stored and replayed; default
 *                defaultStoreStatus (2xx, 3xx, deterministic 4xx; never 5xx, 408, 409, 425,
 *                429). An answer not stored is sent once, its writes rolled back with the claim.
 *   replayedHeaders: the headers stored and replayed (an allow-list, any case); default
 *                ['location', 'content-location', 'link']. Content-Type is always kept.
 *   responseHook: (res, replayed) => void, called before every stored answer (the first)
 *                and every replay is sent; it may set headers.
 *   tenantSetting: with tenant isolation on (idem_set_tenant_isolation(true, 'app.tenant')),
 *                the setting its policy reads: the transaction runs
 *                set_config(tenantSetting, tenant, true) before the claim, so the
 *                claim, the route and the stored answer run as that tenant.
 *                Default null: nothing is set.
 * Put it after the body parser (express.json()) so the fingerprint sees the body.
 */
function idempotency({ pool, tenant = 'X-Client-Id', lease = null, ttl = null, wait = null, holder = null,
  raiseOnMissingKey = true, optionalKey, tenantSetting = null, storeStatus = defaultStoreStatus,
  replayedHeaders = DEFAULT_REPLAYED_HEADERS, responseHook = null } = {}) {
  if (!pool || typeof pool.connect !== 'function') {
    throw new TypeError('idempotency() needs a pg.Pool as its pool option.');
  }
  if (typeof tenant === 'string' && tenant !== '') {
    const header = tenant;
    tenant = (req) => req.get(header);
  }
  if (typeof tenant !== 'function') {
    throw new TypeError('The tenant option must be a header name or a function of the request.');
  }
  if (typeof storeStatus !== 'function') throw new TypeError('The storeStatus option must be a function of the status.');
  if (!Array.isArray(replayedHeaders) || !replayedHeaders.every((h) => typeof h === 'string' && h !== '')) {
    throw new TypeError('The replayedHeaders option must be an array of header names.');
  }
  if (responseHook !== null && typeof responseHook !== 'function') {
    throw new TypeError('The responseHook option must be a function (res, replayed).');
  }
  const replayed = new Set(replayedHeaders.map((h) => h.toLowerCase()));
  const keyOptional = optionalKey === undefined ? !raiseOnMissingKey : Boolean(optionalKey);
  const intervals = [perCall(lease, 'lease'), perCall(ttl, 'ttl'), perCall(wait, 'wait')];
  const holderOf = holderOption(holder);
  const setting = checkTenantSetting(tenantSetting);
  return async function idempotencyMiddleware(req, res, next) {
    const keyHeaders = req.headersDistinct['idempotency-key'];
    if (keyOptional && (!keyHeaders || keyHeaders.length === 0)) return next();
    let tenantId, key, callLease, callTtl, callWait, callHolder;
    try {
      key = parseIdempotencyKey(keyHeaders);
      try {
        tenantId = parseIdentifier(await tenant(req), 'the tenant');
      } catch (e) {
        throw refusedAs(TITLES.tenantInvalid, e);
      }
      [callLease, callTtl, callWait, callHolder] = await Promise.all([...intervals, holderOf].map((f) => f(req)));
    } catch (e) {
      return e instanceof Refused ? problem(res, 400, e.title, e.detail) : next(e);
    }

    let db;
    try {
      db = await pool.connect();
    } catch (e) {
      return next(e);
    }
    let claim;
    try {
      await db.query('BEGIN');
      if (setting) await db.query(SET_TENANT_SQL, [setting, tenantId]);
      ({ rows: [claim] } = await traced('idem_claim', db, () => db.query(
        `SELECT outcome, token, response, ${bodyText('response')} AS body, ${retryAfterSql('$6')} AS retry_after
           FROM idem_claim($1, $2, $3, lease => $4::interval, ttl => $5::interval, wait => $6::interval${
          callHolder === null ? '' : ', holder => $7::text'})`,   // 1.4; unset: 1.3's call
        [tenantId, key, requestFingerprint(req), callLease ?? null, callTtl ?? null, callWait ?? null,
          ...(callHolder === null ? [] : [callHolder])]),
      (result) => result.rows[0].outcome));
      if (claim.outcome !== 'claimed') await db.query('COMMIT');
    } catch (e) {
      await finish(db, 'ROLLBACK');
      return next(tenantSettingError(e, setting, 'idempotency()', "request's"));
    }
    if (claim.outcome !== 'claimed') {
      db.release();
      switch (claim.outcome) {
        case 'replay':
        case 'failed':
          return sendStored(res, claim.response, claim.body, true, responseHook);
        case 'in_progress':
          return problem(res, 409, TITLES.inProgress, 'Retry later with the same key.',
            { 'Retry-After': String(claim.retry_after) });
        default: // mismatch
          return problem(res, 422, TITLES.mismatch, 'A key must not be reused with another payload.');
      }
    }

    // claimed: this request, and only this one, runs the route
    req.idempotency = { tenant: tenantId, key, token: claim.token, db };  // token: a string
    // headers set before the route (by earlier middleware) stay on the first answer, as on a replay
    const store = { storeStatus, replayed, responseHook, earlier: new Set(res.getHeaderNames()) };
    holdAnswer(res, async (body) => settle(db, req.idempotency, res, body, store),
      // the client went away before the route answered: close the connection, which
      // rolls back, so a route still running cannot write through a reused client
      () => db.release(new Error('the client went away before the answer')));
    return next();
  };
}

/**
 * Hold the route's answer (res.write/res.end) until onAnswer has run with the
 * whole body; onAbandon runs if the client goes away before any answer.
 */
function holdAnswer(res, onAnswer, onAbandon) {
  const { write, end } = res;
  const chunks = [];
  let answered = false;
  const toBuffer = (chunk, encoding) =>
    (Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk, typeof encoding === 'string' ? encoding : 'utf8'));
  res.write = function holdWrite(chunk, encoding, callback) {
    chunks.push(toBuffer(chunk, encoding));
    if (typeof encoding === 'function') encoding();
    else if (typeof callback === 'function') callback();
    return true;
  };
  res.end = function holdEnd(chunk, encoding, callback) {
    if (answered) return res;
    answered = true;
    if (chunk != null && typeof chunk !== 'function') chunks.push(toBuffer(chunk, encoding));
    res.write = write;
    res.end = end;
    onAnswer(Buffer.concat(chunks)).catch((e) => {
      console.error('idempotency: storing the answer failed:', e);
      if (!res.headersSent) problemAfterFailure(res);
      else res.end();
    });
    return res;
  };
  res.on('close', () => {
    if (!answered) {
      answered = true;
      onAbandon();
    }
  });
}

function problemAfterFailure(res) {
  for (const name of res.getHeaderNames()) res.removeHeader(name);
  problem(res, 500, TITLES.internal, 'Nothing was stored; retrying with the same key is safe.');
}

/** Store the route's answer and COMMIT, then send it; an answer storeStatus refuses (a 5xx by
 *  default) rolls everything back. */
async function settle(db, { tenant, key, token }, res, body, { storeStatus, replayed, responseHook, earlier }) {
  if (!storeStatus(res.statusCode)) {
    await finish(db, 'ROLLBACK');
    res.end(body);
    return;
  }
  const operation = res.statusCode < 400 ? 'idem_complete' : 'idem_release';
  const call = operation === 'idem_complete' ? 'idem_complete($1, $2, $3::bigint, response => d.r)'
    : 'idem_release($1, $2, $3::bigint, failure => d.r)';
  let stored;
  try {
    // store it, and read back what was stored: the answer is rendered from that
    ({ rows: [stored] } = await traced(operation, db, () => db.query(
      `SELECT d.r AS response, ${bodyText('d.r')} AS body, ${call} FROM (SELECT $4::jsonb) AS d(r)`,
      [tenant, key, token, JSON.stringify(storedDocument(res, body, replayed))])));
    await db.query('COMMIT');
  } catch (e) {
    await finish(db, 'ROLLBACK');
    throw e;
  }
  db.release();
  // the first answer carries the headers a replay will: the route's own only when allow-listed
  for (const name of res.getHeaderNames()) if (!earlier.has(name) && !replayed.has(name)) res.removeHeader(name);
  sendStored(res, stored.response, stored.body, false, responseHook);
}

/** End the transaction and give the client back (destroyed if the connection is broken). */
async function finish(db, command) {
  try {
    await db.query(command);
    db.release();
  } catch (e) {
    db.release(e);
  }
}

module.exports = { idempotency, parseIdempotencyKey, requestFingerprint };
