'use strict';
// Shared by the tests: a database from the PG* environment variables (a
// superuser there, as test/suites/77-node gives one on a throwaway
// cluster), the extension created, and an Express app on a free port.
//
// IDEM_TEST_APP_USER: the role the code under test connects as (default
// PGUSER); test/suites/77-node gives it exactly the application role's
// grants of docs/privileges.md.  The checks read what was written as PGUSER.
// IDEM_TEST_TENANT_SETTING (e.g. app.tenant): tenant isolation is switched
// on with it, and every middleware and wrapper under test gets it as
// tenantSetting; unset, isolation is switched off.
const http = require('node:http');
const crypto = require('node:crypto');
const pg = require('pg');

// tenants of this run: the tests can run again on the same database
const RUN = crypto.randomBytes(4).toString('hex');
const APP_USER = process.env.IDEM_TEST_APP_USER || undefined;
const TENANT_SETTING = process.env.IDEM_TEST_TENANT_SETTING || null;
let admin;        // PGUSER: what the checks read the tables with

const configured = Boolean(process.env.PGDATABASE && process.env.PGPORT);
const skipReason = configured ? false
  : 'set PGHOST, PGPORT, PGDATABASE and PGUSER to a database where this user may CREATE EXTENSION idempotency';

let prepared;
/** A pool on the test database as the application role, with the extension and the tests' table there. */
async function database() {
  const pool = new pg.Pool({ max: 30, user: APP_USER });
  admin ??= new pg.Pool({ max: 4 });
  prepared ??= (async () => {
    const setup = new pg.Client();
    await setup.connect();
    try {
      // one file at a time: node --test runs the files as concurrent processes
      await setup.query('SELECT pg_advisory_lock(77)');
      // the C extension, unless the API is there already (the SQL edition's plain script: 36-sql-edition)
      await setup.query(`DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_proc WHERE proname = 'idem_claim' AND pg_function_is_visible(oid)) THEN CREATE EXTENSION IF NOT EXISTS idempotency; END IF; END$$`);
      await setup.query(`CREATE TABLE IF NOT EXISTS test_writes (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        tenant text NOT NULL, key text NOT NULL, note text)`);
      // tokens beyond 2^53, where Number() would round them (extension 1.1 hands them out from this sequence)
      await setup.query(`SELECT setval(seq, greatest(nextval(seq), 9223372032559808512))
                           FROM (SELECT to_regclass('idempotency_tokens') AS seq) s WHERE seq IS NOT NULL`);
      if (APP_USER) await setup.query(`GRANT SELECT, INSERT ON test_writes TO "${APP_USER.replace(/"/g, '""')}"`);
      if (TENANT_SETTING) await setup.query('SELECT idem_set_tenant_isolation(true, $1)', [TENANT_SETTING]);
      else await setup.query('SELECT idem_set_tenant_isolation(false)');
    } finally {
      await setup.end();
    }
  })();
  await prepared;
  return pool;
}

/** The pool the checks read with (PGUSER); ended by closeAdmin(). */
const closeAdmin = async () => { await admin?.end(); admin = undefined; };

/** A test file's pool: set(database()) before its tests; it and the checks' pool end after them. */
function providePool(set) {
  const { before, after } = require('node:test');  // eslint-disable-line global-require
  let pool;
  before(async () => {
    if (!skipReason) set(pool = await database());
  });
  after(async () => {
    if (skipReason) return;
    await pool.end();
    await closeAdmin();
  });
}

/** A client of the application role's pool, in a transaction as tenant when isolation is on. */
async function asTenant(pool, tenant) {
  const db = await pool.connect();
  await db.query('BEGIN');
  if (TENANT_SETTING) await db.query('SELECT set_config($1, $2, true)', [TENANT_SETTING, tenant]);
  return db;
}

/** Rows the code under test wrote for (tenant, key). */
async function writes(tenant, key) {
  const { rows: [row] } = await admin.query(
    'SELECT count(*)::int AS n FROM test_writes WHERE tenant = $1 AND key = $2', [tenant, key]);
  return row.n;
}

/** A query as PGUSER (what the checks read with). */
const adminQuery = (text, values) => admin.query(text, values);

async function record(tenant, key) {
  const { rows } = await admin.query(
    'SELECT status, token::text AS token, response FROM idempotency_records WHERE tenant_id = $1 AND key = $2',
    [tenant, key]);
  return rows[0] ?? null;
}

/** Start app on 127.0.0.1 (a port the kernel picks); resolves to its base URL and a close(). */
function listen(app) {
  return new Promise((resolve) => {
    const server = app.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      resolve({ port, close: () => new Promise((done) => { server.closeAllConnections?.(); server.close(done); }) });
    });
  });
}

/** A request with raw headers (an array value sends the header twice); resolves to status, headers, body bytes. */
function request(port, { method = 'POST', path = '/', headers = {}, body } = {}) {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
    const req = http.request({
      host: '127.0.0.1', port, method, path, agent: false,
      headers: { ...(payload ? { 'Content-Type': 'application/json', 'Content-Length': payload.length } : {}), ...headers },
    }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }));
    });
    req.on('error', reject);
    req.end(payload);
  });
}

module.exports = {
  RUN, APP_USER, TENANT_SETTING, skipReason, database, closeAdmin, providePool, asTenant, writes, record, adminQuery, listen,
  request,
};
