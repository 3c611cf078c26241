'use strict';
// The Node.js package as a peer of test/integrations/consumer_records.py: reads
// {"mode", "tenant", "cases": [[key, result], ...]} on stdin, runs idempotent()
// over each case (mode "write": the function returns the case's result; "replay":
// it throws if it runs) and prints {key: {"result", "replayed"}} as one JSON line.
// The package is required from IDEM_NODE_PACKAGE, pg from NODE_PATH; PG* variables.
const pg = require('pg');
const { idempotent } = require(process.env.IDEM_NODE_PACKAGE);   // eslint-disable-line import/no-dynamic-require

(async () => {
  let input = '';
  for await (const chunk of process.stdin) input += chunk;
  const { mode, tenant, cases } = JSON.parse(input);
  const pool = new pg.Pool({ max: 1 });
  const answers = {};
  try {
    for (const [key, result] of cases) {
      let replayed = null;
      const consume = idempotent(async (db, message) => {
        if (mode === 'replay') throw new Error(`the function ran for ${message.id}, which should replay`);
        return result;
      }, { key: 'id', tenant, responseHook: (value, r) => { replayed = r; return value; } });
      answers[key] = { result: await consume(pool, { id: key }), replayed };
    }
  } finally {
    await pool.end();
  }
  console.log(JSON.stringify(answers));
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
