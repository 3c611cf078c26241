// Types of idempotency-pg-powertools (index.d.mts is the same text, read for ES module imports).
import type { Pool, PoolClient } from 'pg';
import { BasePersistenceLayer, IdempotencyRecord } from '@aws-lambda-powertools/idempotency/persistence';
import type { JSONValue } from '@aws-lambda-powertools/commons/types';
import type { Context } from 'aws-lambda';

/** An interval the server takes ('30 seconds', '15 minutes'), or a positive number of seconds. */
export type Interval = string | number;

export interface PostgresPersistenceLayerOptions {
  /** Each invocation holding a claim borrows one connection until its record is completed or released. */
  pool: Pool;
  /** Whose records these are: a string (the service, the consumer), or the tenant of each event
   *  (then Powertools' useLocalCache is refused). */
  tenant: string | ((event: JSONValue) => string);
  /** With tenant isolation on, the setting its policy reads ('app.tenant'); default null: nothing is set. */
  tenantSetting?: string | null;
  /** How long a claim stays in progress if its invocation never settles it. Default: the Lambda's
   *  remaining time when Powertools has the context, else the server's idempotency.lease (5 minutes). */
  lease?: Interval | null;
  /** Who claims (extension 1.4): for a durable execution its id, the same on each of its replays. A claim
   *  this holder committed and still holds (a live lease) is claimed again by the same holder, with its
   *  token; any other holder or none is in progress. Default null: no holder is sent. */
  holder?: ((event: JSONValue, lambdaContext?: Context) => string | null | undefined
    | Promise<string | null | undefined>) | null;
}

/** 'fenced': the invocation's claim no longer holds the key (sqlstate ID001, ID002, ID003), nothing changed;
 *  'failed': the key holds a failure another client stored (in response); 'no_invocation': client, token or
 *  heartbeat() outside the function made idempotent; 'invalid_tenant'. */
export type PostgresIdempotencyErrorCode = 'fenced' | 'failed' | 'no_invocation' | 'invalid_tenant';

export declare class PostgresIdempotencyError extends Error {
  readonly name: 'PostgresIdempotencyError';
  readonly code: PostgresIdempotencyErrorCode;
  readonly sqlstate?: string;
  readonly response?: unknown;
}

export declare class PostgresPersistenceLayer extends BasePersistenceLayer {
  constructor(options: PostgresPersistenceLayerOptions);
  /** The connection of this invocation's claim, in the transaction its writes commit in with the record
   *  (or roll back in when the function throws). Only inside the function made idempotent; do not
   *  COMMIT or ROLLBACK it yourself. */
  get client(): PoolClient;
  /** The fencing token of this invocation's claim, a bigint as a string. */
  get token(): string;
  /** Extends this invocation's lease to now + lease; resolves to the new end. */
  heartbeat(lease?: Interval | null): Promise<Date>;
  protected _deleteRecord(record: IdempotencyRecord): Promise<void>;
  protected _getRecord(idempotencyKey: string): Promise<IdempotencyRecord>;
  protected _putRecord(record: IdempotencyRecord): Promise<void>;
  protected _updateRecord(record: IdempotencyRecord): Promise<void>;
}
