'use strict';
/*
 * Preloaded (node --require) into examples/express/app.js by the contract's
 * isolation pass (contract.py, test/suites/77-node): every idempotency()
 * middleware the app makes gets tenantSetting: LEDGER_TENANT_SETTING (e.g.
 * app.tenant), checked by the package as the app's own option would be.
 * Nothing else of the app changes.  The package is the one the app itself
 * resolves (its node_modules).
 */
const path = require('node:path');
const { createRequire } = require('node:module');

const pkg = createRequire(path.resolve(process.argv[1]))('idempotency-pg');
const { idempotency } = pkg;
pkg.idempotency = (options) => idempotency({ tenantSetting: process.env.LEDGER_TENANT_SETTING, ...options });
