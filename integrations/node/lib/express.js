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
 *     in_progress  409 + Retry-After: 1
 *     mismatch     422 (the key was used for another request)
 *
 * A route that fails (Express 5 turns a rejected promise into a 500) or
 * answers 5xx is rolled back: its writes and the claim go together, nothing
 * is stored, and a retry runs again.
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
  SET_TENANT_SQL, Refused, parseIdentifier, checkTenantSetting, canonicalJson, sha256,
} = require('./common');

const SF_STRING = /^"((?:[^"\\]|\\["\\])*)"$/;           // RFC 8941 sf-string
const NOT_STORED_HEADERS = new Set(['content-length', 'content-type', 'etag', 'date', 'connection',
  'keep-alive', 'transfer-encoding', 'x-powered-by']);
// the body to send, as PostgreSQL prints the stored jsonb (the whole document if it is not ours)
const bodyText = (expr) => `coalesce(${expr}->'body', ${expr})::text`;

/** An RFC 7807 problem document, as the IETF Idempotency-Key draft recommends. */
function problem(res, status, title, detail, headers = {}) {
  const doc = { type: 'about:blank', title, status };
  if (detail) doc.detail = detail;
  res.status(status).set(headers).type('application/problem+json').send(JSON.stringify(doc));
}

/** The key: an sf-string ("abc") per the IETF draft, or bare (abc) as Stripe sends it. */
function parseIdempotencyKey(values) {
  if (!values || values.length === 0) {
    throw new Refused('Idempotency-Key header is required', 'Send a unique key per operation, e.g. a UUID v4.');
  }
  if (values.length > 1) throw new Refused('only one Idempotency-Key header is allowed');
  let raw = values[0].trim();
  if (raw.startsWith('"')) {
    const quoted = SF_STRING.exec(raw);
    if (!quoted) throw new Refused('Idempotency-Key is not a valid structured-field string');
    raw = quoted[1].replace(/\\(["\\])/g, '$1');
  }
  return parseIdentifier(raw, 'Idempotency-Key');
}

/** What makes two requests "the same": method, path with query, and the body
 *  (canonical JSON once parsed by express.json(), or the raw bytes). */
function requestFingerprint(req) {
  let body = req.body ?? '';
  if (!Buffer.isBuffer(body) && typeof body !== 'string') body = canonicalJson(body);
  return sha256(`${req.method} ${req.originalUrl}\n`, body);
}

/** The route's answer as the document kept in idempotency_records.response. */
function storedDocument(res, body) {
  const doc = { status: res.statusCode };
  const headers = Object.fromEntries(Object.entries(res.getHeaders())
    .filter(([name]) => !NOT_STORED_HEADERS.has(name)));
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

/** Send a stored document; `body` is its body as PostgreSQL printed it. */
function sendStored(res, doc, body, replayed) {
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
  res.end(bytes);
}

/**
 * idempotency({ pool, tenant, lease, ttl, optionalKey, tenantSetting }) -> middleware
 *   pool:        a pg.Pool
 *   tenant:      (req) => tenant id, may be async; default the X-Client-Id header.
 *                Return the authenticated principal's id in a real service.
 *   lease, ttl:  intervals for idem_claim ('30 seconds'); default the server's.
 *   optionalKey: true lets a request without an Idempotency-Key header through
 *                untouched (no claim, no transaction, req.idempotency unset);
 *                default false: such a request is answered 400.
 *   tenantSetting: with tenant isolation on (idem_set_tenant_isolation(true, 'app.tenant')),
 *                the setting its policy reads: the transaction runs
 *                set_config(tenantSetting, tenant, true) before the claim, so the
 *                claim, the route and the stored answer run as that tenant.
 *                Default null: nothing is set.
 * Put it after the body parser (express.json()) so the fingerprint sees the body.
 */
function idempotency({ pool, tenant = (req) => req.get('X-Client-Id'), lease = null, ttl = null,
  optionalKey = false, tenantSetting = null } = {}) {
  if (!pool || typeof pool.connect !== 'function') {
    throw new TypeError('idempotency() needs a pg.Pool as its pool option.');
  }
  if (typeof tenant !== 'function') throw new TypeError('The tenant option must be a function of the request.');
  const setting = checkTenantSetting(tenantSetting);
  return async function idempotencyMiddleware(req, res, next) {
    const keyHeaders = req.headersDistinct['idempotency-key'];
    if (optionalKey && (!keyHeaders || keyHeaders.length === 0)) return next();
    let tenantId, key;
    try {
      tenantId = parseIdentifier(await tenant(req), 'the tenant');
      key = parseIdempotencyKey(keyHeaders);
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
      ({ rows: [claim] } = await db.query(
        `SELECT outcome, token, response, ${bodyText('response')} AS body
           FROM idem_claim($1, $2, $3, lease => $4::interval, ttl => $5::interval)`,
        [tenantId, key, requestFingerprint(req), lease, ttl]));
      if (claim.outcome !== 'claimed') await db.query('COMMIT');
    } catch (e) {
      await finish(db, 'ROLLBACK');
      return next(e);
    }
    if (claim.outcome !== 'claimed') {
      db.release();
      switch (claim.outcome) {
        case 'replay':
        case 'failed':
          return sendStored(res, claim.response, claim.body, true);
        case 'in_progress':
          return problem(res, 409, 'a request with this Idempotency-Key is still being processed',
            'Retry later with the same key.', { 'Retry-After': '1' });
        default: // mismatch
          return problem(res, 422, 'this Idempotency-Key was used for a different request',
            'A key must not be reused with another payload.');
      }
    }

    // claimed: this request, and only this one, runs the route
    req.idempotency = { tenant: tenantId, key, token: claim.token, db };  // token: a string
    holdAnswer(res, async (body) => settle(db, req.idempotency, res, body),
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
  problem(res, 500, 'internal error', 'Nothing was stored; retrying with the same key is safe.');
}

/** Store the route's answer and COMMIT, then send it; a 5xx rolls everything back. */
async function settle(db, { tenant, key, token }, res, body) {
  if (res.statusCode >= 500) {
    await finish(db, 'ROLLBACK');
    res.end(body);
    return;
  }
  const fn = res.statusCode < 400 ? 'idem_complete($1, $2, $3::bigint, response => d.r)'
    : 'idem_release($1, $2, $3::bigint, failure => d.r)';
  let stored;
  try {
    // store it, and read back what was stored: the answer is rendered from that
    ({ rows: [stored] } = await db.query(
      `SELECT d.r AS response, ${bodyText('d.r')} AS body, ${fn} FROM (SELECT $4::jsonb) AS d(r)`,
      [tenant, key, token, JSON.stringify(storedDocument(res, body))]));
    await db.query('COMMIT');
  } catch (e) {
    await finish(db, 'ROLLBACK');
    throw e;
  }
  db.release();
  sendStored(res, stored.response, stored.body, false);
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
