'use strict';
/*
 * PostgresPersistenceLayer: a persistence store for Powertools for AWS Lambda
 * (TypeScript) idempotency, backed by the idempotency PostgreSQL extension.
 *
 * Powertools drives the store through four calls per invocation: _putRecord
 * (the INPROGRESS record), then _updateRecord (COMPLETED, with the result) or
 * _deleteRecord (the function threw), and _getRecord when it needs to read a
 * record.  Here:
 *
 *   _putRecord     BEGIN; set_config(tenantSetting); idem_claim(tenant, key,
 *                  fingerprint, lease, ttl[, holder]); COMMIT: a committed claim with a
 *                  lease (Powertools' in-progress expiry) and a fencing token.
 *                  Then BEGIN on the same connection: the transaction the
 *                  function may write through (persistenceStore.client).
 *                  Any other outcome is IdempotencyItemAlreadyExistsError
 *                  with the existing record, which Powertools turns into a
 *                  replay, IdempotencyAlreadyInProgressError or
 *                  IdempotencyValidationError itself.
 *   _updateRecord  idem_complete(token, result) in that transaction, COMMIT:
 *                  the function's writes and the record commit together.
 *   _deleteRecord  ROLLBACK of that transaction (the function's writes), then
 *                  idem_release(token) in a transaction of its own.
 *
 * complete and release take the invocation's token: one whose claim was
 * taken over after its lease (a late, "zombie" invocation) is refused
 * (SQLSTATE ID002) and changes nothing, its writes rolled back with it.
 *
 * A layer instance serves every invocation of a function, one after the
 * other or at once, and Powertools hands the store no invocation: the
 * invocation's claim (connection, token, tenant) is kept in an
 * AsyncLocalStorage store entered when Powertools configures the layer for
 * the call (synchronously, in the function makeIdempotent returns, before
 * anything else runs), so each invocation's later calls, and the function it
 * runs, find their own claim and no other.
 *
 * Durable execution (extension 1.4): with the holder option, every claim
 * carries the holder it returns for the invocation (the durable execution's
 * id), so a replay of the same execution, while the claim it made before
 * suspending is in progress with a live lease, gets `claimed` again with the
 * same token: it runs with its own client and completes the record once.
 * Any other execution is still in progress to Powertools.  Powertools hands
 * the store neither the durable context nor its mode, so the holder is the
 * application's to name (docs/powertools.md, "Durable functions").
 *
 * The class is made by define() from the Powertools module it extends:
 * index.js passes the CommonJS build, index.mjs the ES module build, so an
 * application's instanceof checks and types match the Powertools it imports.
 */
const { AsyncLocalStorage } = require('node:async_hooks');

// a custom setting as idem_set_tenant_isolation accepts it: two or more dot-separated identifiers
const SETTING_NAME = /^[A-Za-z_][A-Za-z0-9_$]*(?:\.[A-Za-z_][A-Za-z0-9_$]*)+$/;
const SET_TENANT_SQL = 'SELECT pg_catalog.set_config($1, $2, true)';
const MAX_IDENTIFIER_BYTES = 255;
// SQLSTATEs of complete, release and heartbeat for a token that does not hold the key:
// no record (ID001), another token holds it (ID002), already completed or failed (ID003)
const NOT_HELD = new Set(['ID001', 'ID002', 'ID003']);

/**
 * What the layer itself refuses or reports; Powertools wraps it in its
 * IdempotencyPersistenceLayerError (as `cause`) when it comes from a store call.
 *   code 'fenced'         the invocation's claim is no longer its own (sqlstate ID001, ID002 or ID003):
 *                         it was taken over after its lease, or settled, or removed; nothing was changed
 *   code 'failed'         the key holds a failure stored by another client (idem_release with a failure),
 *                         in error.response
 *   code 'no_invocation'  client, token or heartbeat() used outside an invocation holding a claim
 *   code 'invalid_tenant' the tenant is not 1 to 255 UTF-8 bytes of text without NUL
 */
class PostgresIdempotencyError extends Error {
  constructor(code, message, { sqlstate, response, cause } = {}) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = 'PostgresIdempotencyError';
    this.code = code;
    if (sqlstate !== undefined) this.sqlstate = sqlstate;
    if (response !== undefined) this.response = response;
  }
}

/** A lease option: null, interval text ('30 seconds'), or seconds (a positive number). */
function intervalText(value, name) {
  if (value === null || value === undefined) return null;
  if (typeof value === 'number' && Number.isFinite(value) && value > 0) return `${value} seconds`;
  if (typeof value === 'string' && value.trim() !== '') return value;
  throw new TypeError(`The ${name} option must be an interval such as '30 seconds', or a positive number of seconds.`);
}

function checkTenant(value) {
  if (typeof value !== 'string' || value === '' || value.includes('\0')
      || Buffer.byteLength(value, 'utf8') > MAX_IDENTIFIER_BYTES) {
    throw new PostgresIdempotencyError('invalid_tenant',
      `The tenant must be text of 1 to ${MAX_IDENTIFIER_BYTES} UTF-8 bytes without NUL, not ${JSON.stringify(value)}.`);
  }
  return value;
}

/** Seconds since the epoch (Powertools' expiryTimestamp) from a timestamptz node-postgres read. */
const epochSeconds = (date) => (date instanceof Date ? date.getTime() / 1000 : undefined);

function define({
  BasePersistenceLayer, IdempotencyRecord, IdempotencyRecordStatus, IdempotencyItemAlreadyExistsError,
  IdempotencyItemNotFoundError,
}) {
  /** Our states as Powertools' (it knows INPROGRESS, COMPLETED, EXPIRED). */
  const statusOf = (status) => (status === 'processing' || status === 'resumable'
    ? IdempotencyRecordStatus.INPROGRESS : IdempotencyRecordStatus.COMPLETED);

  class PostgresPersistenceLayer extends BasePersistenceLayer {
    #pool;
    #tenant;
    #tenantSetting;
    #lease;
    #holder;
    #invocations = new AsyncLocalStorage();

    /**
     * options:
     *   pool           a pg.Pool (node-postgres); each invocation holding a claim borrows one
     *                  connection until its record is completed or released
     *   tenant         whose records these are: a string (the service, the consumer), or
     *                  (event) => string, the tenant of each event (then useLocalCache is refused:
     *                  Powertools' cache is keyed by the idempotency key alone)
     *   tenantSetting  with tenant isolation on, the setting its policy reads ('app.tenant'):
     *                  set_config(tenantSetting, tenant, true) runs in every transaction before
     *                  the extension's functions; default null: nothing is set
     *   lease          how long a claim stays in progress if its invocation never settles it
     *                  ('15 minutes' or seconds); default: the Lambda's remaining time when
     *                  Powertools has the context (its in-progress expiry), else the server's
     *                  idempotency.lease (5 minutes)
     *   holder         (event, lambdaContext) => string | null (may be async): who claims, for a
     *                  durable execution its id, stable across its replays (extension 1.4). A claim
     *                  this holder committed and still holds (a live lease) is claimed again by the
     *                  same holder, with its token; any other holder or none is in progress.
     *                  Default null: no holder is sent (1.3 servers too)
     */
    constructor({ pool, tenant, tenantSetting = null, lease = null, holder = null } = {}) {
      super();
      if (!pool || typeof pool.connect !== 'function') {
        throw new TypeError('PostgresPersistenceLayer needs pool: a pg.Pool.');
      }
      if (typeof tenant !== 'function') checkTenant(tenant);
      if (tenantSetting !== null && (typeof tenantSetting !== 'string' || !SETTING_NAME.test(tenantSetting))) {
        throw new TypeError("The tenantSetting option must name a custom setting such as 'app.tenant'"
          + ' (two or more dot-separated identifiers).');
      }
      this.#pool = pool;
      this.#tenant = tenant;
      this.#tenantSetting = tenantSetting;
      this.#lease = intervalText(lease, 'lease');
      if (holder !== null && typeof holder !== 'function') {
        throw new TypeError('The holder option must be a function (event, lambdaContext) => string | null: the'
          + ' durable execution\'s id, the same on each of its replays.');
      }
      this.#holder = holder;
    }

    /** Powertools calls this for every invocation, synchronously, before any other call of the
     *  store for it: the invocation's own store of its claim starts here. */
    configure(options) {
      if (typeof this.#tenant === 'function' && options?.config?.useLocalCache) {
        throw new TypeError('useLocalCache with a tenant per event: Powertools keys its local cache by the'
          + ' idempotency key alone, so one tenant could be answered from another\'s record. Give the layer'
          + ' one tenant (a layer per tenant), or leave the local cache off.');
      }
      super.configure(options);
      this.#invocations.enterWith({
        tenant: null, key: null, token: null, client: null, holder: null,
        lambdaContext: options?.config?.lambdaContext ?? null,   // this call's (Powertools registers it first)
      });
    }

    /** The connection of this invocation's claim, in the transaction the function's writes commit in
     *  with the record (at idem_complete) or roll back in (when the function throws). Do not COMMIT
     *  or ROLLBACK it yourself. */
    get client() {
      return this.#held('client').client;
    }

    /** The fencing token of this invocation's claim (a string: a bigint, exact). */
    get token() {
      return this.#held('token').token;
    }

    /** Extends this invocation's lease to now + lease (default: the layer's lease, else the server's
     *  idempotency.lease), in a transaction of its own; resolves to the new end. 'fenced' when the
     *  claim was taken over. */
    async heartbeat(lease = null) {
      const claim = this.#held('heartbeat()');
      const text = intervalText(lease, 'lease') ?? this.#lease;
      const { rows: [row] } = await this.#inOwnTransaction(claim.tenant, (client) => client.query(
        'SELECT idem_heartbeat($1, $2, $3::bigint, lease => $4::interval) AS lease_end',
        [claim.tenant, claim.key, claim.token, text]));
      return row.lease_end;
    }

    async saveInProgress(data, remainingTimeInMillis) {
      this.#tenantFor(data);
      await this.#holderFor(data);
      return super.saveInProgress(data, remainingTimeInMillis);
    }

    async getRecord(data) {
      this.#tenantFor(data);
      return super.getRecord(data);
    }

    async _putRecord(record) {
      const invocation = this.#invocation();
      if (!invocation) throw this.#outsideInvocation('a claim');
      const tenant = invocation.tenant ?? this.#fixedTenant();
      const key = record.idempotencyKey;
      const client = await this.#pool.connect();
      let kept = false;
      let broken;
      try {
        let claim;
        let stored;
        await client.query('BEGIN');
        try {
          await this.#setTenant(client, tenant);
          // holder => only with a holder (1.4): without one the call is 1.3's
          const { holder } = invocation;
          ({ rows: [claim] } = await client.query(
            `SELECT outcome, token, response, expires_at
               FROM idem_claim($1, $2, $3, lease => $4::interval, ttl => $5::interval${
  holder === null ? '' : ', holder => $6::text'})`,
            [tenant, key, record.payloadHash || null, this.#leaseFor(record),
              `${this.getExpiresAfterSeconds()} seconds`, ...(holder === null ? [] : [holder])]));
          if (claim.outcome === 'mismatch') {
            // the stored record, for Powertools' IdempotencyValidationError (its existingRecord)
            ({ rows: [stored] } = await client.query(
              'SELECT status, fingerprint, response, expires_at FROM idem_lookup($1, $2)', [tenant, key]));
          }
          await client.query('COMMIT');
        } catch (e) {
          broken = await rollback(client);
          throw e;
        }
        if (claim.outcome === 'claimed') {
          // the function's transaction, on the connection that held the claim
          try {
            await client.query('BEGIN');
            await this.#setTenant(client, tenant);
          } catch (e) {
            broken = (await rollback(client)) ?? e;   // the claim stays, until its lease ends
            throw e;
          }
          Object.assign(invocation, { tenant, key, token: claim.token, client });
          kept = true;
          return;
        }
        throw this.#existing(record, claim, stored);
      } finally {
        if (!kept) client.release(broken);
      }
    }

    async _updateRecord(record) {
      const claim = this.#settling(record);
      if (!claim) return;   // Powertools' replay mode ran the function without a claim: not ours to store
      let broken;
      try {
        await claim.client.query(
          'SELECT idem_complete($1, $2, $3::bigint, response => $4::jsonb)',
          [claim.tenant, claim.key, claim.token, JSON.stringify(record.responseData ?? null)]);
        await claim.client.query('COMMIT');
      } catch (e) {
        broken = await rollback(claim.client);
        throw fenced(e, 'complete');
      } finally {
        claim.client.release(broken);
        claim.client = null;
      }
    }

    async _deleteRecord(record) {
      const claim = this.#settling(record);
      if (!claim) return;   // Powertools' replay mode ran the function without a claim: not ours to release
      // the function's writes go first, with its transaction
      const broken = await rollback(claim.client);
      claim.client.release(broken);
      claim.client = null;
      try {
        await this.#inOwnTransaction(claim.tenant, (client) => client.query(
          'SELECT idem_release($1, $2, $3::bigint)', [claim.tenant, claim.key, claim.token]));
      } catch (e) {
        throw fenced(e, 'release');
      }
    }

    async _getRecord(idempotencyKey) {
      const tenant = this.#invocation()?.tenant ?? this.#fixedTenant();
      const { rows: [stored] } = await this.#inOwnTransaction(tenant, (client) => client.query(
        'SELECT status, fingerprint, response, expires_at, lease_expires_at FROM idem_lookup($1, $2)',
        [tenant, idempotencyKey]));
      if (!stored) throw new IdempotencyItemNotFoundError(`No record for the idempotency key ${idempotencyKey}.`);
      return new IdempotencyRecord({
        idempotencyKey,
        status: statusOf(stored.status),
        expiryTimestamp: stored.status === 'processing' ? undefined : epochSeconds(stored.expires_at),
        inProgressExpiryTimestamp: stored.lease_expires_at ? stored.lease_expires_at.getTime() : undefined,
        responseData: stored.response ?? undefined,
        payloadHash: stored.fingerprint ?? undefined,
      });
    }

    /** The record Powertools is told already exists, from idem_claim's answer. */
    #existing(record, claim, stored) {
      const idempotencyKey = record.idempotencyKey;
      const exists = (existingRecord) => new IdempotencyItemAlreadyExistsError(
        `Failed to put record for already existing idempotency key: ${idempotencyKey}`, existingRecord);
      switch (claim.outcome) {
        case 'replay':
          // the extension compared the fingerprints (a NULL on either side is no check): it is this call's
          return exists(new IdempotencyRecord({
            idempotencyKey, status: IdempotencyRecordStatus.COMPLETED, expiryTimestamp: epochSeconds(claim.expires_at),
            responseData: claim.response ?? undefined, payloadHash: record.payloadHash,
          }));
        case 'in_progress':
          return exists(new IdempotencyRecord({
            idempotencyKey, status: IdempotencyRecordStatus.INPROGRESS, payloadHash: record.payloadHash,
            inProgressExpiryTimestamp: claim.expires_at ? claim.expires_at.getTime() : undefined,
          }));
        case 'mismatch':
          // another fingerprint is stored: Powertools compares and throws IdempotencyValidationError
          return exists(new IdempotencyRecord({
            idempotencyKey, status: statusOf(stored?.status), responseData: stored?.response ?? undefined,
            expiryTimestamp: stored?.status === 'processing' ? undefined : epochSeconds(stored?.expires_at),
            payloadHash: stored?.fingerprint ?? `(another payload than ${record.payloadHash})`,
          }));
        case 'failed':
          return new PostgresIdempotencyError('failed',
            `The idempotency key ${idempotencyKey} holds a stored failure (in error.response).`,
            { response: claim.response });
        default:
          return new Error(`idem_claim answered an unknown outcome: ${claim.outcome}`);
      }
    }

    #invocation() {
      return this.#invocations.getStore() ?? null;
    }

    #held(what) {
      const invocation = this.#invocation();
      if (!invocation?.client) {
        throw new PostgresIdempotencyError('no_invocation', `persistenceStore.${what} is there only inside the`
          + ' function made idempotent (makeIdempotent, the idempotent decorator), while its claim is held.');
      }
      return invocation;
    }

    /** The invocation's claim for _updateRecord / _deleteRecord: the record's key, with its connection;
     *  null when the invocation never held one (Powertools' durable replay mode runs the function when
     *  the claim answers that the record exists: completed, or another execution's). */
    #settling(record) {
      const invocation = this.#invocation();
      if (invocation && invocation.key === null && !invocation.client) return null;
      if (!invocation?.client || invocation.key !== record.idempotencyKey) {
        throw this.#outsideInvocation('the record of this key');
      }
      return invocation;
    }

    #outsideInvocation(what) {
      return new PostgresIdempotencyError('no_invocation', `This invocation holds no claim on ${what}:`
        + ' PostgresPersistenceLayer is driven by makeIdempotent or the idempotent decorator, which configure it'
        + ' for each call before the call runs.');
    }

    #tenantFor(data) {
      const invocation = this.#invocation();
      if (invocation && typeof this.#tenant === 'function') invocation.tenant = checkTenant(this.#tenant(data));
    }

    /** The invocation's holder, from the holder option (null without one). */
    async #holderFor(data) {
      const invocation = this.#invocation();
      if (!invocation || !this.#holder) return;
      const holder = await this.#holder(data, invocation.lambdaContext ?? undefined);
      if (holder !== null && holder !== undefined && (typeof holder !== 'string' || holder === ''
          || Buffer.byteLength(holder, 'utf8') > MAX_IDENTIFIER_BYTES)) {
        throw new TypeError(`The holder function must return text of 1 to ${MAX_IDENTIFIER_BYTES} UTF-8 bytes or`
          + ` null, not ${JSON.stringify(holder)}.`);
      }
      invocation.holder = holder ?? null;
    }

    #fixedTenant() {
      if (typeof this.#tenant === 'function') throw this.#outsideInvocation('a tenant of an event');
      return this.#tenant;
    }

    /** The claim's lease: the layer's option, else what Powertools computed from the Lambda context
     *  (its in-progress expiry: now + the remaining time), else the server's idempotency.lease. */
    #leaseFor(record) {
      if (this.#lease !== null) return this.#lease;
      if (record.inProgressExpiryTimestamp) {
        return `${Math.max(1, Math.round(record.inProgressExpiryTimestamp - Date.now()))} milliseconds`;
      }
      return null;
    }

    async #setTenant(client, tenant) {
      if (this.#tenantSetting) await client.query(SET_TENANT_SQL, [this.#tenantSetting, tenant]);
    }

    /** fn(client) in a transaction of its own (tenant set), committed; its result. */
    async #inOwnTransaction(tenant, fn) {
      const client = await this.#pool.connect();
      let broken;
      try {
        await client.query('BEGIN');
        try {
          await this.#setTenant(client, tenant);
          const result = await fn(client);
          await client.query('COMMIT');
          return result;
        } catch (e) {
          broken = await rollback(client);
          throw e;
        }
      } finally {
        client.release(broken);
      }
    }
  }

  return PostgresPersistenceLayer;
}

/** ROLLBACK; the error when the connection cannot even do that (the pool must then drop it). */
async function rollback(client) {
  try {
    await client.query('ROLLBACK');
    return undefined;
  } catch (e) {
    return e;
  }
}

/** A refusal of complete or release for a token that does not hold the key, as 'fenced'. */
function fenced(e, what) {
  if (!NOT_HELD.has(e?.code)) return e;
  return new PostgresIdempotencyError('fenced', `Cannot ${what} the record: this invocation's claim no longer holds`
    + ` the key (SQLSTATE ${e.code}: ${e.message}). Nothing was changed; its writes were rolled back.`,
  { sqlstate: e.code, cause: e });
}

module.exports = { define, PostgresIdempotencyError };
