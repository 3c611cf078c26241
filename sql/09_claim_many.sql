-- idem_claim_many: a consumer's batch in one statement, same rules per key.
TRUNCATE idempotency_records;
SELECT idem_complete('q', 'm-2', token, '{"done": 2}') FROM idem_claim('q', 'm-2', 'fp-2');
SELECT outcome FROM idem_claim('q', 'm-3', lease => '1 hour');

-- one row per element, in input order: fresh, replay, in progress, repeated
-- in the batch, mismatch
SELECT key, outcome, token IS NOT NULL AS has_token, response
FROM idem_claim_many('q', ARRAY['m-1', 'm-2', 'm-3', 'm-1', 'm-2'],
                     fingerprints => ARRAY['fp-1', 'fp-2', NULL, 'fp-1', 'fp-other']);
SELECT key, status FROM idempotency_records WHERE tenant_id = 'q' ORDER BY key;

-- the claimed keys are settled one by one with their tokens
SELECT idem_complete('q', key, token, jsonb_build_object('k', key))
FROM idem_claim_many('q', ARRAY['b-1', 'b-2', 'b-3']) WHERE outcome = 'claimed';
SELECT key, outcome, response FROM idem_claim_many('q', ARRAY['b-3', 'b-1']);

-- lease and ttl apply to every key
SELECT count(*) FILTER (WHERE expires_at BETWEEN now() + interval '50 s' AND now() + interval '70 s') AS one_minute_leases
FROM idem_claim_many('q', ARRAY['l-1', 'l-2'], lease => '1 min', ttl => '2 hours');
SELECT DISTINCT ttl FROM idempotency_records WHERE key LIKE 'l-%';

-- an empty batch returns nothing
SELECT count(*) FROM idem_claim_many('q', ARRAY[]::text[]);

-- bad batches are refused before any key is claimed
\set VERBOSITY terse
SELECT * FROM idem_claim_many('q', ARRAY['x-1', NULL]);
SELECT * FROM idem_claim_many('q', ARRAY['x-1', '']);
SELECT * FROM idem_claim_many('q', ARRAY['x-1', repeat('k', 256)]);
SELECT * FROM idem_claim_many('q', ARRAY['x-1', 'x-2'], fingerprints => ARRAY['f']);
SELECT * FROM idem_claim_many('q', ARRAY['x-1'], fingerprints => ARRAY['']);
SELECT * FROM idem_claim_many('q', NULL);
SELECT * FROM idem_claim_many(NULL, ARRAY['x-1']);
SELECT * FROM idem_claim_many('q', ARRAY[['x-1'], ['x-2']]);
SELECT * FROM idem_claim_many('q', (SELECT array_agg('k' || i) FROM generate_series(1, 1001) i));
SELECT * FROM idem_claim_many('q', ARRAY['x-1'], lease => '0');
\set VERBOSITY default
SELECT count(*) AS x_rows FROM idempotency_records WHERE key LIKE 'x-%' OR key LIKE 'k%';
-- the maximum batch is accepted
SELECT count(*) FILTER (WHERE outcome = 'claimed') AS claimed
FROM idem_claim_many('q', (SELECT array_agg('max-' || i) FROM generate_series(1, 1000) i));

-- fresh batches: the first ones still on the speculative path (an earlier
-- batch here met existing keys, which holds the plain INSERT back for 16
-- batches), the later ones on the one-statement plain INSERT again
SELECT count(*) FILTER (WHERE c.outcome = 'claimed') AS claimed, count(*) AS keys
FROM generate_series(1, 20) g, LATERAL idem_claim_many('q', ARRAY['mixb-' || g, 'mixc-' || g]) c;
SELECT count(*) AS records FROM idempotency_records WHERE tenant_id = 'q' AND key ~ '^mix[bc]-';
-- then a batch mixing fresh keys with one that has a record: the plain
-- INSERT meets the record, its subtransaction rolls back, and every key is
-- still decided as idem_claim would (no unique violation reaches us)
SELECT idem_complete('q', 'mix-1', token, '"done"') FROM idem_claim('q', 'mix-1');
SELECT key, outcome, token IS NOT NULL AS has_token, response
FROM idem_claim_many('q', ARRAY['mix-0', 'mix-1', 'mix-2']);
SELECT key, status FROM idempotency_records WHERE tenant_id = 'q' AND key LIKE 'mix-%' ORDER BY key;
