"""A generic description of everything the idempotency extension installs.

snapshot(conn) returns {object description: {property: value}} for every
member of the extension (pg_depend deptype 'e', named by
pg_describe_object) and for what hangs off its member tables (columns,
indexes, constraints, triggers, policies, row-level security).  Nothing here
names an object of the extension: an object added to the update script is
compared without changing this file, and an update script that forgets
something a fresh install has shows up as a difference.

diff(a, b) lists the differences as readable lines.
"""

MEMBERS = """
    SELECT d.classid::pg_catalog.regclass::text AS catalog, d.objid, d.objsubid,
           pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid) AS name
    FROM pg_catalog.pg_depend d
    JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid
    WHERE d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
      AND d.deptype = 'e' AND e.extname = %s
"""

# One query per catalog a member can live in; each returns (objid, property, value).
PER_CATALOG = {
    'pg_proc': """
        SELECT p.oid, k, v FROM pg_catalog.pg_proc p, LATERAL (VALUES
            ('signature', p.oid::pg_catalog.regprocedure::text),
            ('arguments', pg_catalog.pg_get_function_arguments(p.oid)),
            ('result', pg_catalog.pg_get_function_result(p.oid)),
            ('kind', p.prokind::text),
            ('language', (SELECT l.lanname::text FROM pg_catalog.pg_language l WHERE l.oid = p.prolang)),
            ('volatility', p.provolatile::text),
            ('parallel', p.proparallel::text),
            ('strict', p.proisstrict::text),
            ('security_definer', p.prosecdef::text),
            ('leakproof', p.proleakproof::text),
            ('returns_set', p.proretset::text),
            ('cost', p.procost::text),
            ('rows', p.prorows::text),
            ('config', p.proconfig::text),
            ('symbol_or_source', p.prosrc),
            ('library', p.probin),
            ('sql_body', CASE WHEN p.prosqlbody IS NULL THEN NULL
                              ELSE pg_catalog.pg_get_functiondef(p.oid) END),
            ('owner', p.proowner::pg_catalog.regrole::text),
            ('acl', (SELECT pg_catalog.string_agg(a.x, ' ' ORDER BY a.x) FROM (
                SELECT pg_catalog.concat(a.grantee::pg_catalog.regrole::text, ':', a.privilege_type,
                                         CASE WHEN a.is_grantable THEN '*' END) AS x
                FROM pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a) a)),
            ('comment', pg_catalog.obj_description(p.oid, 'pg_proc'))
        ) AS t(k, v) WHERE p.oid = ANY(%s)""",
    'pg_class': """
        SELECT c.oid, k, v FROM pg_catalog.pg_class c, LATERAL (VALUES
            ('kind', c.relkind::text),
            ('persistence', c.relpersistence::text),
            ('options', c.reloptions::text),
            ('row_security', c.relrowsecurity::text),
            ('force_row_security', c.relforcerowsecurity::text),
            ('access_method', (SELECT a.amname::text FROM pg_catalog.pg_am a WHERE a.oid = c.relam)),
            ('owner', c.relowner::pg_catalog.regrole::text),
            ('view', CASE WHEN c.relkind IN ('v', 'm') THEN pg_catalog.pg_get_viewdef(c.oid) END),
            ('acl', (SELECT pg_catalog.string_agg(a.x, ' ' ORDER BY a.x) FROM (
                SELECT pg_catalog.concat(a.grantee::pg_catalog.regrole::text, ':', a.privilege_type,
                                         CASE WHEN a.is_grantable THEN '*' END) AS x
                FROM pg_catalog.aclexplode(coalesce(c.relacl,
                     pg_catalog.acldefault((CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END)::"char", c.relowner))) a) a)),
            ('comment', pg_catalog.obj_description(c.oid, 'pg_class')),
            ('sequence', (SELECT pg_catalog.concat_ws(' ', s.seqtypid::pg_catalog.regtype::text, s.seqstart,
                                  s.seqincrement, s.seqmin, s.seqmax, s.seqcache, s.seqcycle)
                          FROM pg_catalog.pg_sequence s WHERE s.seqrelid = c.oid))
        ) AS t(k, v) WHERE c.oid = ANY(%s)""",
    'pg_type': """
        SELECT t.oid, k, v FROM pg_catalog.pg_type t, LATERAL (VALUES
            ('type', t.typtype::text),
            ('base', CASE WHEN t.typtype = 'd' THEN pg_catalog.format_type(t.typbasetype, t.typtypmod) END),
            ('not_null', t.typnotnull::text),
            ('default', t.typdefault),
            ('enum', (SELECT pg_catalog.string_agg(e.enumlabel::text, ',' ORDER BY e.enumsortorder)
                      FROM pg_catalog.pg_enum e WHERE e.enumtypid = t.oid)),
            ('domain_checks', (SELECT pg_catalog.string_agg(pg_catalog.pg_get_constraintdef(k.oid), ' ; '
                                                           ORDER BY k.conname)
                               FROM pg_catalog.pg_constraint k WHERE k.contypid = t.oid)),
            ('owner', t.typowner::pg_catalog.regrole::text),
            ('acl', t.typacl::text),
            ('comment', pg_catalog.obj_description(t.oid, 'pg_type'))
        ) AS x(k, v) WHERE t.oid = ANY(%s)""",
}

# What hangs off a member relation without being a member itself.
RELATION_PARTS = """
    SELECT pg_catalog.concat('column ', c.relname, '.', a.attname) AS obj, k, v
    FROM pg_catalog.pg_class c
    JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped,
    LATERAL (VALUES
        ('position', (SELECT pg_catalog.count(*) FROM pg_catalog.pg_attribute b
                      WHERE b.attrelid = c.oid AND b.attnum > 0 AND NOT b.attisdropped
                        AND b.attnum <= a.attnum)::text),
        ('type', pg_catalog.format_type(a.atttypid, a.atttypmod)),
        ('collation', (SELECT co.collname::text FROM pg_catalog.pg_collation co
                       WHERE co.oid = a.attcollation AND a.attcollation <> 0)),
        ('not_null', a.attnotnull::text),
        ('default', (SELECT pg_catalog.pg_get_expr(d.adbin, d.adrelid) FROM pg_catalog.pg_attrdef d
                     WHERE d.adrelid = c.oid AND d.adnum = a.attnum)),
        ('identity', a.attidentity::text),
        ('generated', a.attgenerated::text),
        ('storage', a.attstorage::text),
        ('statistics', a.attstattarget::text),
        ('acl', a.attacl::text),
        ('comment', pg_catalog.col_description(c.oid, a.attnum))
    ) AS t(k, v)
    WHERE c.oid = ANY(%(rels)s)
    UNION ALL
    SELECT pg_catalog.concat('index ', i.relname), 'definition', pg_catalog.pg_get_indexdef(i.oid)
    FROM pg_catalog.pg_index x JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid
    WHERE x.indrelid = ANY(%(rels)s)
    UNION ALL
    SELECT pg_catalog.concat('index ', i.relname), 'valid/ready/clustered/replident',
           pg_catalog.concat_ws(' ', x.indisvalid, x.indisready, x.indisclustered, x.indisreplident)
    FROM pg_catalog.pg_index x JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid
    WHERE x.indrelid = ANY(%(rels)s)
    UNION ALL
    SELECT pg_catalog.concat('constraint ', k.conname, ' on ', c.relname), 'definition',
           pg_catalog.concat_ws(' ', k.contype, pg_catalog.pg_get_constraintdef(k.oid),
                                k.condeferrable, k.condeferred, k.convalidated)
    FROM pg_catalog.pg_constraint k JOIN pg_catalog.pg_class c ON c.oid = k.conrelid
    WHERE k.conrelid = ANY(%(rels)s)
    UNION ALL
    SELECT pg_catalog.concat('trigger ', g.tgname, ' on ', c.relname), 'definition',
           pg_catalog.concat_ws(' ', pg_catalog.pg_get_triggerdef(g.oid), g.tgenabled)
    FROM pg_catalog.pg_trigger g JOIN pg_catalog.pg_class c ON c.oid = g.tgrelid
    WHERE g.tgrelid = ANY(%(rels)s) AND NOT g.tgisinternal
    UNION ALL
    SELECT pg_catalog.concat('policy ', p.polname, ' on ', c.relname), 'definition',
           pg_catalog.concat_ws(' | ', p.polcmd, p.polpermissive,
               (SELECT pg_catalog.string_agg(CASE WHEN r = 0 THEN 'public' ELSE r::pg_catalog.regrole::text END, ',')
                FROM pg_catalog.unnest(p.polroles) r),
               pg_catalog.pg_get_expr(p.polqual, p.polrelid), pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid))
    FROM pg_catalog.pg_policy p JOIN pg_catalog.pg_class c ON c.oid = p.polrelid
    WHERE p.polrelid = ANY(%(rels)s)
    UNION ALL
    SELECT pg_catalog.concat('rule ', r.rulename, ' on ', c.relname), 'definition', pg_catalog.pg_get_ruledef(r.oid)
    FROM pg_catalog.pg_rewrite r JOIN pg_catalog.pg_class c ON c.oid = r.ev_class
    WHERE r.ev_class = ANY(%(rels)s) AND r.rulename <> '_RETURN'
"""

EXTENSION = """
    SELECT pg_catalog.concat_ws(' ', e.extversion, e.extrelocatable,
                                e.extnamespace::pg_catalog.regnamespace::text,
                                e.extowner::pg_catalog.regrole::text),
           (SELECT pg_catalog.string_agg(pg_catalog.concat(c.oid::pg_catalog.regclass::text, ' WHERE ',
                                         e.extcondition[s.i]), ' ; ' ORDER BY 1)
            FROM pg_catalog.generate_subscripts(e.extconfig, 1) s(i)
            JOIN pg_catalog.pg_class c ON c.oid = e.extconfig[s.i]),
           (SELECT pg_catalog.string_agg(r.extname::text, ',' ORDER BY 1)
            FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_extension r ON r.oid = d.refobjid
            WHERE d.classid = 'pg_catalog.pg_extension'::pg_catalog.regclass AND d.objid = e.oid
              AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass)
    FROM pg_catalog.pg_extension e WHERE e.extname = %s
"""

# Initial privileges recorded for members (what pg_dump compares grants with).
INIT_PRIVS = """
    SELECT pg_catalog.pg_describe_object(i.classoid, i.objoid, i.objsubid), i.privtype::text,
           i.initprivs::text
    FROM pg_catalog.pg_init_privs i
    JOIN pg_catalog.pg_depend d ON d.classid = i.classoid AND d.objid = i.objoid AND d.deptype = 'e'
    JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid AND e.extname = %s
"""


def snapshot(conn, extname='idempotency'):
    cur = conn.cursor()
    cur.execute(MEMBERS, (extname,))
    members = cur.fetchall()
    snap = {}
    by_catalog = {}
    for catalog, objid, subid, name in members:
        snap[name] = {'member': 'yes'}
        by_catalog.setdefault(catalog, {})[objid] = name
    for catalog, objs in by_catalog.items():
        query = PER_CATALOG.get(catalog)
        if query is None:
            # a member of a kind this module does not inspect: its presence
            # is still compared; say so, so nobody believes more was compared
            for name in objs.values():
                snap[name]['uninspected catalog'] = catalog
            continue
        cur.execute(query, (list(objs),))
        for objid, k, v in cur.fetchall():
            snap[objs[objid]][k] = v
    rels = list(by_catalog.get('pg_class', {}))
    # a composite type's columns live in its pg_class row, which is not a member itself
    cur.execute("SELECT t.typrelid FROM pg_catalog.pg_type t WHERE t.oid = ANY(%s) AND t.typrelid <> 0",
                (list(by_catalog.get('pg_type', {})),))
    rels += [r[0] for r in cur.fetchall()]
    cur.execute(RELATION_PARTS, {'rels': rels})
    for obj, k, v in cur.fetchall():
        snap.setdefault(obj, {})[k] = v
    cur.execute(EXTENSION, (extname,))
    row = cur.fetchone()
    snap['extension ' + extname] = {'version/relocatable/schema/owner': row[0], 'config_dump': row[1],
                                    'requires': row[2]}
    cur.execute(INIT_PRIVS, (extname,))
    for obj, kind, privs in cur.fetchall():
        snap.setdefault(obj, {})['initial privileges (%s)' % kind] = privs
    cur.close()
    return snap


def diff(a, b, a_name='upgraded', b_name='fresh'):
    out = []
    for obj in sorted(set(a) | set(b)):
        if obj not in a:
            out.append('only in %s: %s' % (b_name, obj))
        elif obj not in b:
            out.append('only in %s: %s' % (a_name, obj))
        else:
            for k in sorted(set(a[obj]) | set(b[obj])):
                va, vb = a[obj].get(k), b[obj].get(k)
                if va != vb:
                    out.append('%s / %s: %s=%r, %s=%r' % (obj, k, a_name, va, b_name, vb))
    return out


def count_properties(snap):
    return sum(len(v) for v in snap.values())
