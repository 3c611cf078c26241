// Compiled by test/suites/77-node with `tsc --noEmit --strict` against @types/express and
// @types/pg: the hand-written index.d.ts describes the package as its users call it, with
// Express's Request augmented by req.idempotency.  Never run.
import express = require('express');
import { Pool } from 'pg';
import {
  idempotency, idempotent, IdempotencyError, canonicalJson, parseIdempotencyKey, defaultStoreStatus,
} from 'idempotency-pg';
import type { PoolLike, PoolClientLike, IdempotencyClaim } from 'idempotency-pg';

declare const pool: PoolLike;

const middleware = idempotency({ pool, tenant: async (req) => String(req.user.id), raiseOnMissingKey: false, ttl: '1 day',
  tenantSetting: 'app.tenant' });
void middleware;

// an Express app on a real pg.Pool: the route reads req.idempotency from Express's own Request type
const app = express();
const pgPool = new Pool();
app.post('/orders', express.json(), idempotency({
  pool: pgPool, tenant: 'X-Client-Id', lease: (req: express.Request) => (req.path === '/slow' ? '2 minutes' : null),
  wait: '2 seconds', storeStatus: (status) => defaultStoreStatus(status) && status !== 404, replayedHeaders: ['Location'],
  responseHook: (res: express.Response, replayed: boolean) => { res.setHeader('X-Replayed', String(replayed)); },
}), async (req: express.Request, res: express.Response) => {
  const claim: IdempotencyClaim | undefined = req.idempotency;
  if (!claim) return res.status(400).end();
  const { rows } = await claim.db.query('INSERT INTO orders (key) VALUES ($1) RETURNING id', [claim.key]);
  const token: string = claim.token;
  return res.status(201).json({ id: rows[0].id, token });
});

interface OrderMessage { messageId: string; body: { orderId: number; amount: number } }

const handle = idempotent(async (db: PoolClientLike, message: OrderMessage, attempt: number) => {
  await db.query('INSERT INTO orders (id, amount) VALUES ($1, $2)', [message.body.orderId, message.body.amount]);
  return { booked: message.body.orderId, attempt };
}, { key: 'messageId', tenant: (m) => `orders-${m.body.orderId % 4}`, fingerprintFields: ['body.amount'], wait: '2 seconds',
  tenantSetting: 'app.tenant', ttl: (m) => (m.body.amount > 1000 ? '30 days' : null) });

// payloadValidation: the whole message, a field path, field paths or a function
for (const payloadValidation of ['*', 'body.amount', ['body.orderId', 'body["amount"]'], (m: OrderMessage) => m.body.amount] as const) {
  void idempotent(async () => 1, { key: 'messageId', tenant: 'orders', payloadValidation });
}

// Powertools' names: the key and the fingerprint as JMESPath expressions
const byExpression = idempotent(async (db: PoolClientLike, message: OrderMessage) => message.body.amount,
  { eventKeyJmesPath: 'messageId', payloadValidationJmesPath: 'body.[orderId, amount]', tenant: 'orders' });
void byExpression;

// responseHook: what the call returns, on the first delivery as on a duplicate
const flagged = idempotent(async (db: PoolClientLike, message: OrderMessage) => message.body.orderId,
  { key: 'messageId', tenant: 'orders', raiseOnMissingKey: false,
    responseHook: (orderId: number, replayed: boolean) => ({ orderId, replayed }) });
async function consumeFlagged(message: OrderMessage): Promise<boolean> {
  return (await flagged(pgPool, message)).replayed;
}
void consumeFlagged;

async function consume(message: OrderMessage): Promise<number> {
  try {
    const result = await handle(pool, message, 1);
    return result.booked;                      // the result's type comes through
  } catch (e) {
    if (e instanceof IdempotencyError && (e.code === 'in_progress' || e.code === 'mismatch')) return -1;
    throw e;
  }
}
void consume;

function tokenOf(claim: IdempotencyClaim | undefined): string | undefined {
  return claim?.token;                        // a string: node-postgres hands bigints over as strings
}
const token = tokenOf(undefined);
const text: string = canonicalJson({ b: 1, a: [token] });
const key: string = parseIdempotencyKey(['"abc"']);
void text; void key;

// @ts-expect-error: the key option is required
idempotent(async () => 1, { tenant: 'x' });
// @ts-expect-error: raiseOnMissingKey is a boolean
idempotency({ pool, raiseOnMissingKey: 'yes' });
// @ts-expect-error: req.idempotency's token is a string, never a number
const wrongToken: number | undefined = ({} as express.Request).idempotency?.token;
void wrongToken;
// @ts-expect-error: tenantSetting is the setting's name
idempotency({ pool, tenantSetting: true });
// @ts-expect-error: payloadValidation is no number
idempotent(async () => 1, { tenant: 'x', key: 'id', payloadValidation: 5 });
// @ts-expect-error: the key option or eventKeyJmesPath, not both
idempotent(async () => 1, { tenant: 'x', key: 'id', eventKeyJmesPath: 'id' });
