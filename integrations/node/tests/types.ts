// Compiled by test/suites/77-node with `tsc --noEmit --strict`: the hand-written
// index.d.ts describes the package as its users call it.  Never run.
import { idempotency, idempotent, IdempotencyError, canonicalJson, parseIdempotencyKey } from 'idempotency-pg';
import type { PoolLike, PoolClientLike, IdempotencyClaim } from 'idempotency-pg';

declare const pool: PoolLike;

const middleware = idempotency({ pool, tenant: async (req) => String(req.user.id), optionalKey: true, ttl: '1 day',
  tenantSetting: 'app.tenant' });
void middleware;

interface OrderMessage { messageId: string; body: { orderId: number; amount: number } }

const handle = idempotent(async (db: PoolClientLike, message: OrderMessage, attempt: number) => {
  await db.query('INSERT INTO orders (id, amount) VALUES ($1, $2)', [message.body.orderId, message.body.amount]);
  return { booked: message.body.orderId, attempt };
}, { key: 'messageId', tenant: (m) => `orders-${m.body.orderId % 4}`, fingerprintFields: ['body.amount'], wait: '2 seconds',
  tenantSetting: 'app.tenant' });

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
// @ts-expect-error: optionalKey is a boolean
idempotency({ pool, optionalKey: 'yes' });
// @ts-expect-error: tenantSetting is the setting's name
idempotency({ pool, tenantSetting: true });
