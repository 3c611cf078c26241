'use strict';
// The two node-postgres behaviours docs/integrations.md and integrations/node
// rely on, observed on a real server (PG* environment variables):
//  - a bigint arrives as a string (the token must not go through Number);
//  - a JavaScript array given as a jsonb parameter is sent as a PostgreSQL
//    array literal and rejected (22P02) unless JSON.stringify-ed.
// Prints one JSON line for test/suites/77-node to check.
const pg = require('pg');

(async () => {
  const client = new pg.Client();
  await client.connect();
  const out = {};
  const { rows: [big] } = await client.query('SELECT 9223372036854775807::bigint AS token');
  out.token_type = typeof big.token;
  out.token = big.token;
  out.token_as_number = String(Number(big.token));
  try {
    await client.query('SELECT $1::jsonb AS doc', [[1, { a: 2 }]]);
    out.raw_array = 'accepted';
  } catch (e) {
    out.raw_array = e.code;
  }
  const { rows: [doc] } = await client.query('SELECT $1::jsonb AS doc', [JSON.stringify([1, { a: 2 }])]);
  out.stringified_array = doc.doc;
  await client.end();
  console.log(JSON.stringify(out));
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
