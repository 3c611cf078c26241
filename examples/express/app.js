'use strict';
/*
 * Example service: POST /entries books a batch of ledger entries (a JSON
 * array) at most once per (client, Idempotency-Key).
 *
 *   PGHOST=127.0.0.1 PGDATABASE=ledger PGUSER=ledger_app PORT=8080 node app.js
 *
 * The database comes from the standard PG* environment variables (or
 * DATABASE_URL); LEDGER_POOL_SIZE (default 10) sets the connections;
 * LEDGER_TEST_HOOKS=1 (tests only) honours X-Test-Delay-Ms (a slow booking)
 * and X-Test-Fail-After-Write (an exception after the inserts).
 */
const express = require('express');
const pg = require('pg');
const { idempotency } = require('idempotency-pg');

const TEST_HOOKS = process.env.LEDGER_TEST_HOOKS === '1';
const pool = new pg.Pool({
  connectionString: process.env.DATABASE_URL,
  max: Number(process.env.LEDGER_POOL_SIZE ?? 10),
});

/** Whose keys these are.  A stand-in for authentication: a real service
 *  returns the authenticated principal's id here (e.g. req.user.id). */
const authenticatedClient = (req) => req.get('X-Client-Id') ?? 'default';

/** 400 before the claim: nothing is stored, the key may be reused with a corrected body. */
function validateEntries(req, res, next) {
  const entries = req.body;
  const valid = Array.isArray(entries) && entries.length >= 1 && entries.length <= 100
    && entries.every((e) => e !== null && typeof e === 'object'
      && typeof e.account === 'string' && /^[a-z0-9-]{1,64}$/.test(e.account)
      && Number.isSafeInteger(e.amount) && e.amount > 0);
  if (valid) return next();
  const err = new Error('the body must be an array of 1 to 100 {"account": "a-z0-9-", "amount": cents > 0}');
  err.status = 400;
  return next(err);
}

const app = express();
app.disable('x-powered-by');

app.post('/entries', express.json(), validateEntries, idempotency({ pool, tenant: authenticatedClient }),
  async (req, res) => {
    const { db, tenant, key } = req.idempotency;   // db: the claim's transaction
    const frozen = req.body.filter((e) => e.account.startsWith('frozen-')).map((e) => e.account);
    if (frozen.length > 0) {  // a business failure: stored (idem_release with the failure) and replayed
      return res.status(403).json({ error: { code: 'account_frozen', accounts: frozen } });
    }
    const booked = [];
    for (const e of req.body) {
      const { rows: [row] } = await db.query(
        `INSERT INTO ledger_entries (client_id, idempotency_key, account, amount)
         VALUES ($1, $2, $3, $4) RETURNING id`, [tenant, key, e.account, e.amount]);
      booked.push({ id: `le_${row.id}`, account: e.account, amount: e.amount });
    }
    if (TEST_HOOKS) {
      await new Promise((resolve) => { setTimeout(resolve, Number(req.get('X-Test-Delay-Ms') ?? 0)); });
      if (req.get('X-Test-Fail-After-Write')) throw new Error('test hook: failing after the inserts');
    }
    return res.status(201).json(booked);
  });

// errors as RFC 7807 problems: a bad body (400) and anything a route throws (500;
// the idempotency middleware rolls the route's transaction back before it is sent)
app.use((err, req, res, next) => {  // eslint-disable-line no-unused-vars
  const status = err.status >= 400 && err.status < 500 ? err.status : 500;
  if (status === 500) console.error(err);
  res.status(status).type('application/problem+json').send(JSON.stringify({
    type: 'about:blank',
    title: status === 500 ? 'internal error' : 'the request is invalid',
    status,
    detail: status === 500 ? 'Nothing was stored; retrying with the same key is safe.' : err.message,
  }));
});

const server = app.listen(Number(process.env.PORT ?? 8080), process.env.HOST ?? '127.0.0.1', () => {
  const { address, port } = server.address();
  console.log(`listening on http://${address}:${port}/entries`);
});
process.on('SIGTERM', () => server.close(() => pool.end()));
