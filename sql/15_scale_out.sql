-- Scale-out helpers on a server without Citus: each refuses with 55000
-- and changes nothing (test/suites/90-citus runs them on a real cluster).
\set VERBOSITY sqlstate
SELECT idem_distribute();
SELECT idem_distribute(8);
SELECT * FROM idem_node_stats();
SELECT * FROM idem_cluster_stats();
\set VERBOSITY default
-- the message a user sees
SELECT idem_distribute();
-- nothing changed: the table is still local with its "C" tenant_id
SELECT attname, collname FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation
 WHERE attrelid = 'idempotency_records'::regclass AND attname IN ('tenant_id', 'key')
 ORDER BY attname;
