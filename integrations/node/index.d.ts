// Types of idempotency-pg, written by hand (the package is plain JavaScript).
// Only the shapes used here are declared, so neither express's nor pg's types
// need to be installed.

/** The part of a pg.Pool, pg.Client or pool client the package uses. */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: any[] }>;
}

/** A pg.Pool: lends a client for one transaction. */
export interface PoolLike extends Queryable {
  connect(): Promise<PoolClientLike>;
}

/** A client lent by a pg.Pool. */
export interface PoolClientLike extends Queryable {
  release(err?: Error | boolean): void;
}

/** What the middleware puts on req.idempotency for the one request that runs the route. */
export interface IdempotencyClaim {
  tenant: string;
  key: string;
  /** The fencing token: a bigint, kept as a string (node-postgres); never Number() it. */
  token: string;
  /** The transaction's client: the route's writes commit or roll back with the claim. */
  db: PoolClientLike;
}

export interface MiddlewareOptions {
  pool: PoolLike;
  /** Whose key this is: the authenticated principal. Default: the X-Client-Id header. */
  tenant?: (req: any) => string | Promise<string>;
  /** idem_claim's lease, an interval ('30 seconds'); default the server's setting. */
  lease?: string | null;
  /** How long the record is kept, an interval ('1 day'); default the server's setting. */
  ttl?: string | null;
  /** true: a request without an Idempotency-Key header passes through untouched. Default false (400). */
  optionalKey?: boolean;
  /** With tenant isolation on: the setting its policy reads ('app.tenant'), set to the tenant
   *  (set_config(…, true)) in the transaction before the claim. Default null: nothing is set. */
  tenantSetting?: string | null;
}

export type Middleware = (req: any, res: any, next: (err?: unknown) => void) => Promise<void>;

/** Express middleware: a route runs at most once per (tenant, Idempotency-Key). */
export function idempotency(options: MiddlewareOptions): Middleware;

export interface IdempotentOptions<M> {
  /** The message's key: a function of the message, or a dotted path into it ('id', 'attributes.messageId'). */
  key: string | ((message: M) => string | number | bigint);
  /** Whose keys these are (the consumer group, the queue): a string or a function of the message. */
  tenant: string | ((message: M) => string);
  /** Dotted paths whose values make the fingerprint; a duplicate with other values is refused. Default: none. */
  fingerprintFields?: string[] | null;
  /** How long the record is kept, an interval ('7 days'); default the server's setting. */
  ttl?: string | null;
  /** idem_claim's lease, an interval; default the server's setting. */
  lease?: string | null;
  /** How long to wait for a delivery in progress elsewhere, an interval; default: do not wait. */
  wait?: string | null;
  /** With tenant isolation on: the setting its policy reads ('app.tenant'), set to the tenant
   *  (set_config(…, true)) in the transaction before the claim. Default null: nothing is set. */
  tenantSetting?: string | null;
}

/**
 * Wrap fn so it runs at most once per (tenant, key): the claim, fn's writes through `db`
 * and the stored result are one transaction. Call the result with a pg.Pool, pg.Client
 * or pool client (idle, not inside a transaction) and the message.
 */
export function idempotent<M, R, A extends unknown[]>(
  fn: (db: PoolClientLike, message: M, ...rest: A) => R | Promise<R>,
  options: IdempotentOptions<M>,
): (db: PoolLike | Queryable, message: M, ...rest: A) => Promise<R>;

export type IdempotencyErrorCode = 'in_progress' | 'mismatch' | 'failed' | 'invalid_key';

/** A delivery idempotent() did not run: tell the cases apart by code. */
export class IdempotencyError extends Error {
  code: IdempotencyErrorCode;
  /** For code 'failed': the stored failure document. */
  response?: unknown;
}

/** JSON with sorted keys, as the fingerprints use it. */
export function canonicalJson(value: unknown): string;

/** The key of an Idempotency-Key header's values (sf-string or bare); throws when invalid. */
export function parseIdempotencyKey(values: string[] | undefined): string;

/** The fingerprint the middleware stores: sha256 of method, path with query and canonical body. */
export function requestFingerprint(req: { method: string; originalUrl: string; body?: unknown }): string;

