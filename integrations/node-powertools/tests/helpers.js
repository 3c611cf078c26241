'use strict';
// Shared by the tests: a database from the PG* environment variables (a
// superuser there, as test/suites/77-node gives one on a throwaway cluster)
// with the extension, and the table the functions under test write to.
//
// IDEM_TEST_APP_USER: the role the layer connects as (default PGUSER);
// 77-node gives it exactly the application role's grants of
// docs/privileges.md.  IDEM_TEST_TENANT_SETTING (app.tenant): tenant
// isolation is switched on with it and every layer gets it as tenantSetting;
// unset, isolation is off.  The checks read as PGUSER.
const crypto = require('node:crypto');
const pg = require('pg');

const RUN = crypto.randomBytes(4).toString('hex');   // keys of this run: the tests can run again
const APP_USER = process.env.IDEM_TEST_APP_USER || undefined;
const TENANT_SETTING = process.env.IDEM_TEST_TENANT_SETTING || null;
const skipReason = process.env.PGDATABASE && process.env.PGPORT ? false
  : 'set PGHOST, PGPORT, PGDATABASE and PGUSER to a database where this user may CREATE EXTENSION idempotency';

let prepared;
async function prepare() {
  const setup = new pg.Client();
  await setup.connect();
  try {
    await setup.query('SELECT pg_advisory_lock(78)');   // node --test runs the files as concurrent processes
    // the C extension, unless the API is there already (the SQL edition's script: 36-sql-edition)
    await setup.query(`DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_proc WHERE proname = 'idem_claim'
      AND pg_function_is_visible(oid)) THEN CREATE EXTENSION IF NOT EXISTS idempotency; END IF; END$$`);
    await setup.query(`CREATE TABLE IF NOT EXISTS pt_orders (
      id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, tenant text NOT NULL, order_id text NOT NULL,
      note text)`);
    if (APP_USER) await setup.query(`GRANT SELECT, INSERT ON pt_orders TO "${APP_USER.replace(/"/g, '""')}"`);
    if (TENANT_SETTING) await setup.query('SELECT idem_set_tenant_isolation(true, $1)', [TENANT_SETTING]);
    else await setup.query('SELECT idem_set_tenant_isolation(false)');
  } finally {
    await setup.end();
  }
}

/** The application role's pool and the checks' pool (PGUSER), ended after the file's tests. */
function pools() {
  const { before, after } = require('node:test');  // eslint-disable-line global-require
  const held = {};
  before(async () => {
    if (skipReason) return;
    prepared ??= prepare();
    await prepared;
    held.app = new pg.Pool({ max: 20, user: APP_USER });
    held.admin = new pg.Pool({ max: 4 });
  });
  after(async () => {
    for (const g of gates) g.open();   // a test that failed while holding a function lets it end
    await held.app?.end();
    await held.admin?.end();
  });
  return held;
}

/** Orders the functions under test wrote for order_id (read as PGUSER). */
async function orders(admin, orderId) {
  const { rows: [row] } = await admin.query('SELECT count(*)::int AS n FROM pt_orders WHERE order_id = $1', [orderId]);
  return row.n;
}

/** The record of (tenant, key) as stored (read as PGUSER), or null. */
async function record(admin, tenant, key) {
  const { rows } = await admin.query(`SELECT status, token::text AS token, fingerprint, response,
      lease_expires_at, expires_at FROM idempotency_records WHERE tenant_id = $1 AND key = $2`, [tenant, key]);
  return rows[0] ?? null;
}

/** The records of a tenant whose key ends with suffix (Powertools prefixes the key). */
async function records(admin, tenant) {
  const { rows } = await admin.query(`SELECT key, status, token::text AS token, fingerprint, response
      FROM idempotency_records WHERE tenant_id = $1 ORDER BY created_at`, [tenant]);
  return rows;
}

const gates = [];
/** A promise and its resolve, to hold a function mid-run (opened after the file's tests at the latest). */
function gate() {
  let open;
  const opened = new Promise((resolve) => { open = resolve; });
  gates.push({ open });
  return { open, opened };
}

/** A Lambda context as Powertools reads it: only the remaining time matters to it. */
const lambdaContext = (remainingMs) => ({
  functionName: 'orders', awsRequestId: crypto.randomUUID(), getRemainingTimeInMillis: () => remainingMs,
});

const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

/** Waits until the record of tenant is committed as processing (read through admin); returns it. */
async function committedClaimOf(admin, tenant) {
  for (let i = 0; i < 200; i += 1) {
    const [found] = await records(admin, tenant);
    if (found?.status === 'processing') return found;
    await sleep(25);
  }
  throw new Error(`no committed claim for ${tenant}`);
}

module.exports = {
  RUN, APP_USER, TENANT_SETTING, skipReason, pools, orders, record, records, gate, lambdaContext, sleep,
  committedClaimOf,
};
