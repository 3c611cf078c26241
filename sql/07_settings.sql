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
