-- Installing the extension: objects, privileges, pg_dump registration.
CREATE EXTENSION idempotency;

SELECT e.extname, n.nspname AS schema, e.extrelocatable
FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
WHERE e.extname = 'idempotency';

-- the records table is registered so that pg_dump keeps its rows
SELECT c.relname
FROM pg_extension e, unnest(e.extconfig) AS cfg(oid) JOIN pg_class c ON c.oid = cfg.oid
WHERE e.extname = 'idempotency'
ORDER BY c.relname;

-- the table's shape
SELECT attname, format_type(atttypid, atttypmod) AS type, attnotnull,
       (SELECT collname FROM pg_collation WHERE oid = attcollation) AS collation
FROM pg_attribute
WHERE attrelid = 'idempotency_records'::regclass AND attnum > 0
ORDER BY attnum;

-- every unique index contains tenant_id (scale-out by tenant); no triggers
SELECT indexrelid::regclass AS index, indisunique, indisprimary,
       pg_get_indexdef(indexrelid) AS definition
FROM pg_index WHERE indrelid = 'idempotency_records'::regclass ORDER BY 1;
SELECT count(*) AS triggers FROM pg_trigger WHERE tgrelid = 'idempotency_records'::regclass;

-- PUBLIC has no privilege on the table and can execute no function
SELECT relname, relacl IS NULL OR NOT EXISTS (
         SELECT 1 FROM aclexplode(relacl) a WHERE a.grantee = 0) AS no_public_access
FROM pg_class WHERE relname = 'idempotency_records';
SELECT p.oid::regprocedure AS function,
       p.prosecdef AS security_definer,
       NOT EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
                   WHERE a.grantee = 0) AS no_public_execute
FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.classid = 'pg_proc'::regclass
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
ORDER BY 1;
