-- Settings: defaults, units, validation, reserved prefix.
SELECT name, setting, unit, context, vartype
FROM pg_settings WHERE name LIKE 'idempotency.%' ORDER BY name;

SET idempotency.lease = '30s';
SHOW idempotency.lease;
SET idempotency.lease = 0;
SET idempotency.lease = 'soon';
SET idempotency.ttl = '-1';
SET idempotency.stale_action = 'explode';
SET idempotency.no_such_setting = 1;
RESET ALL;

-- min_ttl: claims asking for a shorter retention are refused
SET idempotency.min_ttl = '1h';
SELECT * FROM idem_claim('m', 'short', ttl => '5 min');
SELECT outcome FROM idem_claim('m', 'long', ttl => '2 hours');
SET idempotency.ttl = '10min';
SELECT * FROM idem_claim('m', 'default-too-short');
RESET idempotency.ttl;
RESET idempotency.min_ttl;
SELECT count(*) FROM idempotency_records WHERE tenant_id = 'm';

-- durability_check: completing under asynchronous commit is reported, or refused
SET synchronous_commit = off;
SELECT idem_complete('m', 'long', token, '{"ok": 1}') FROM idempotency_records WHERE key = 'long';
SELECT token AS t FROM idem_claim('m', 'async-2') \gset
SET idempotency.durability_check = 'error';
SELECT idem_release('m', 'async-2', :t, '{"e": 1}');
SELECT status FROM idempotency_records WHERE key = 'async-2';
-- a release without a failure stores nothing, so it is not checked
SELECT idem_release('m', 'async-2', :t);
SET idempotency.durability_check = 'off';
SELECT token AS t FROM idem_claim('m', 'async-3') \gset
SELECT idem_complete('m', 'async-3', :t);
RESET idempotency.durability_check;
RESET synchronous_commit;
SELECT token AS t FROM idem_claim('m', 'sync-1') \gset
SELECT idem_complete('m', 'sync-1', :t);

-- a sweep interval is 0 (off) or at least 100 ms
ALTER SYSTEM SET idempotency.sweep_interval = 1;
ALTER SYSTEM SET idempotency.sweep_interval = '100ms';
ALTER SYSTEM RESET idempotency.sweep_interval;
