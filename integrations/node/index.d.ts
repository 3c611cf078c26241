// Types of idempotency-pg, written by hand (the package is plain JavaScript).
// Only the shapes used here are declared, so neither express's nor pg's types
// need to be installed; with @types/express, req.idempotency is typed on
// Express's Request (the augmentation at the end).

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

/** An interval ('30 seconds'), or a function of the request or message returning one (per call). */
export type PerCall<T> = string | null | ((input: T) => string | null | undefined | Promise<string | null | undefined>);

export interface MiddlewareOptions {
  pool: PoolLike;
  /** Whose key this is: a header name, or a function returning the authenticated principal.
   *  Default: the X-Client-Id header. */
  tenant?: string | ((req: any) => string | Promise<string>);
  /** idem_claim's lease; default the server's setting. A 409's Retry-After is the lease left of a committed claim. */
  lease?: PerCall<any>;
  /** How long the record is kept ('1 day'); default the server's setting. */
  ttl?: PerCall<any>;
  /** How long a duplicate waits for the original's answer, replayed if it comes; default: 409 at once. */
  wait?: PerCall<any>;
  /** Who claims (extension 1.4): a claim this holder committed and still holds (live lease) is
   *  claimed again by the same holder; any other holder or none gets 409. Default: not sent. */
  holder?: PerCall<any>;
  /** true (default): a request without an Idempotency-Key header is answered 400; false lets it through. */
  raiseOnMissingKey?: boolean;
  /** @deprecated the older spelling of raiseOnMissingKey: false. */
  optionalKey?: boolean;
  /** Which answers are stored and replayed; default defaultStoreStatus (2xx, 3xx, deterministic 4xx). */
  storeStatus?: (status: number) => boolean;
  /** The response headers stored and replayed, an allow-list; default ['location', 'content-location', 'link']. */
  replayedHeaders?: string[];
  /** Called before every stored answer (the first) and every replay is sent; may set headers. */
  responseHook?: ((res: any, replayed: boolean) => void) | null;
  /** With tenant isolation on: the setting its policy reads ('app.tenant'), set to the tenant
   *  (set_config(…, true)) in the transaction before the claim. Default null: nothing is set. */
  tenantSetting?: string | null;
}

export type Middleware = (req: any, res: any, next: (err?: unknown) => void) => Promise<void>;

/** Express middleware: a route runs at most once per (tenant, Idempotency-Key). */
export function idempotency(options: MiddlewareOptions): Middleware;

/** A field path: 'id', 'body.order.id', 'Records[0].messageId', 'items[-1]', 'headers["x.y"]'
 *  (the Python package's subset of JMESPath, no dependency). */
export type FieldPath = string;
export type PayloadValidation<M> = '*' | FieldPath | readonly FieldPath[] | ((message: M) => unknown);

export interface IdempotentOptionsBase<M> {
  /** Whose keys these are (the consumer group, the queue): a string or a function of the message. */
  tenant: string | ((message: M) => string | number | bigint);
  /** What makes the fingerprint, compared when a key comes again (another one is refused,
   *  'mismatch'): '*' (the whole message), a field path, field paths (a missing one counts as
   *  null) or a function of the message. Default: none, the key alone decides. */
  payloadValidation?: PayloadValidation<M> | null;
  /** The older name of payloadValidation. */
  fingerprintFields?: PayloadValidation<M> | null;
  /** How long the record is kept ('7 days'); default the server's setting. */
  ttl?: PerCall<M>;
  /** idem_claim's lease; default the server's setting. */
  lease?: PerCall<M>;
  /** How long to wait for a delivery in progress elsewhere; default: do not wait. */
  wait?: PerCall<M>;
  /** Who claims (extension 1.4): a durable execution's ARN, a workflow run id. A claim this holder
   *  committed and still holds (live lease) is claimed again by the same holder (fn runs with the
   *  record's token); any other holder or none gets 'in_progress'. Default: not sent. */
  holder?: PerCall<M>;
  /** true (default): a message without a key throws 'invalid_key'; false runs fn without a claim. */
  raiseOnMissingKey?: boolean;
  /** With tenant isolation on: the setting its policy reads ('app.tenant'), set to the tenant
   *  (set_config(…, true)) in the transaction before the claim. Default null: nothing is set. */
  tenantSetting?: string | null;
}

/**
 * Wrap fn so it runs at most once per (tenant, key): the claim, fn's writes through `db`
 * and the stored result are one transaction. Call the result with a pg.Pool, pg.Client
 * or pool client (idle, not inside a transaction) and the message.
 */
/** The key: `key` (a function of the message, or a field path into it: 'id', 'Records[0].messageId'),
 *  or `eventKeyJmesPath` (a JMESPath expression; needs the jmespath package), one of them.
 *  `payloadValidationJmesPath`: what makes the fingerprint, as a JMESPath expression. */
export type IdempotentOptions<M> = IdempotentOptionsBase<M> & { payloadValidationJmesPath?: string | null } & (
  | { key: FieldPath | ((message: M) => string | number | bigint | null | undefined); eventKeyJmesPath?: null }
  | { eventKeyJmesPath: string; key?: undefined });

export function idempotent<M, R, A extends unknown[]>(
  fn: (db: PoolClientLike, message: M, ...rest: A) => R | Promise<R>,
  options: IdempotentOptions<M> & { responseHook?: null },
): (db: PoolLike | Queryable, message: M, ...rest: A) => Promise<R>;
/** With responseHook: (result, replayed) => what the call returns, on the first delivery and every duplicate. */
export function idempotent<M, R, A extends unknown[], H>(
  fn: (db: PoolClientLike, message: M, ...rest: A) => R | Promise<R>,
  options: IdempotentOptions<M> & { responseHook: (result: R, replayed: boolean) => H },
): (db: PoolLike | Queryable, message: M, ...rest: A) => Promise<H>;

/** The default storeStatus: 2xx, 3xx and the deterministic 4xx; never 5xx, 408, 409, 425, 429. */
export function defaultStoreStatus(status: number): boolean;
/** The bounds of a 409's Retry-After and of IdempotencyError.retryAfter, in seconds (1 and 60). */
export const RETRY_AFTER_MIN: number;
export const RETRY_AFTER_MAX: number;

export type IdempotencyErrorCode = 'in_progress' | 'mismatch' | 'failed' | 'invalid_key';

/** A delivery idempotent() did not run: tell the cases apart by code. */
export class IdempotencyError extends Error {
  code: IdempotencyErrorCode;
  /** For code 'failed': the stored failure document. */
  response?: unknown;
  /** For code 'in_progress': seconds to wait before delivering again, as an HTTP 409's
   *  Retry-After: the holder's lease left if its claim is committed, else the call's wait or 1;
   *  between RETRY_AFTER_MIN and RETRY_AFTER_MAX (1, 60). */
  retryAfter?: number;
}

/** JSON with sorted keys, as the fingerprints use it. */
export function canonicalJson(value: unknown): string;

/** The key of an Idempotency-Key header's values (sf-string or bare); throws when invalid. */
export function parseIdempotencyKey(values: string[] | undefined): string;

/** The fingerprint the middleware stores: sha256 of method, path with query and canonical body. */
export function requestFingerprint(req: { method: string; originalUrl: string; body?: unknown }): string;


declare global {
  namespace Express {
    interface Request {
      /** Set by idempotency() for the one request that runs the route; undefined for a
       *  request let through without a key (raiseOnMissingKey: false). */
      idempotency?: IdempotencyClaim;
    }
  }
}
