#!/usr/bin/env python3
"""The SQL edition's dbdev package, installed the way `dbdev add` leaves it (issue 47, item 3).

Supabase users install SQL extensions from the dbdev registry: `dbdev add -o
DIR -v VER -s SCHEMA package -n HANDLE@NAME` writes a migration file that
registers every version and update path of the package with pg_tle
(pgtle.install_extension for the first, install_extension_version_sql for
the others, install_update_path), then runs `drop extension if exists`,
`create extension ... schema ... version ...` and
pgtle.set_default_version.  With `-c CONNECTION` it leaves out the versions
and update paths the database has registered already: that is how it writes
an update.  The dbdev CLI cannot be installed here (it is a Rust program
fetched from outside), so add_migration() below writes that file from the
package folder (--package, as sql-edition/dbdev/generate makes it) in the
same layout, read as the CLI reads a folder: the control file's comment,
default_version and requires; the files in directory order; a file whose
version is not major.minor.patch skipped.

On a server preloading pg_tle (--port), as a provider sets it up: pg_tle
created in each database by a superuser, the migrations run with psql -1
(one transaction) by --owner, a role that is not a superuser, is a member of
pgtle_admin and has CREATE on the database (Supabase's `postgres`), which
first makes the schema --schema.  The application role gets
docs/privileges.md's and docs/managed.md's grants and tenant isolation is
switched on.  The checks:

  the package folder is what sql-edition/dbdev/generate makes (--check);
  the package as dbdev reads it: every file taken, a requires dbdev allows;
  a fresh install (HANDLE@NAME, -v the default version): the extension at
    the package's default version in --schema, owned by --owner, every
    function a member and none in C, registered with both versions, the
    update path and the requires; its objects those of the pg_tle route
    (the wrapper sql-edition/NAME--VER-pgtle.sql that sql-edition/build
    makes, in a database of its own); the contract (claim, in_progress,
    complete, replay, mismatch, release and a new claim, tenant isolation
    confining the application role, no right without the grants); the
    same migration run again fails before its drop and changes nothing;
  from the folder (`path` source: the name NAME), -v the previous version
    and the files in the other order, then ALTER EXTENSION ... UPDATE: the
    package's own update path keeps every function (but the three 1.4
    creates again: idem_claim, idem_lookup, idem_sql_claim_one) and record;
  an update as users meet it: the previous version's package migration
    first (the folder as the registry held it then: that version only),
    completed, failed and in-flight records of two tenants, then the
    migration `dbdev add -c` writes.  As
    written it drops the extension and the records with it (checked, so
    that docs/managed.md's warning stays true); with docs/managed.md's edit
    (its drop and create replaced by ALTER EXTENSION ... UPDATE TO) every
    function (but those three), grant and record is kept, the claim in flight completes with
    its token, and the objects are a fresh install's;
  Supabase's default privileges in schema public (ALL on the tables,
    functions and sequences --owner makes, to anon and authenticated): with
    -s SCHEMA they get nothing, with -s public the records and the API.

The last line is DBDEV-RESULT passed=N failed=M.
"""
import datetime
import os
import random
import re
import shutil
import string
import subprocess
import sys
import tempfile

import psycopg2

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'upgrade'))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
import common  # noqa: E402
from common import check, one, rows, run, sqlstate  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
args = None
APP = 'dbdev_app'
STRANGER = 'dbdev_stranger'
ANON = ('dbdev_anon', 'dbdev_authenticated')       # Supabase's anon and authenticated
# the `requires` dbdev's registry accepts include these (its allowed_extensions)
ALLOWED_REQUIRES = {'plpgsql', 'pg_cron'}
HELPERS = ('idem_sql_fresh_tokens(integer)', 'idem_sql_successor_token(bigint)', 'idem_sql_isolation_setting()',
           'idem_sql_tenant_keylock(text, text)')
# idem_claim as the installed version has it (1.4 added holder) comes first
APP_FUNCTIONS = ('idem_claim_many(text, text[], text[], interval, interval), idem_complete(text, text, bigint, jsonb), '
                 'idem_release(text, text, bigint, jsonb), idem_heartbeat(text, text, bigint, interval), '
                 'idem_checkpoint(text, text, bigint, text, jsonb, interval), idem_child_key(text, text, text), '
                 'idem_lookup(text, text)')
CLAIM_SIGNATURES = ('idem_claim(text, text, text, interval, interval, interval, text)',
                    'idem_claim(text, text, text, interval, interval, interval)')
# the functions the update 1.3 -> 1.4 drops and creates again (new OIDs, the
# grants given back): idem_claim's new argument, idem_lookup's new column,
# and the helper that takes the holder
RECREATED = ('idem_claim', 'idem_lookup', 'idem_sql_claim_one')


# --------------------------------------------------------------------------
# the package as dbdev's CLI reads a folder, and the migration `dbdev add` writes

class Package:
    pass


def dbdev_version(v):
    """dbdev takes major.minor.patch, each a number below 32768."""
    parts = v.split('.')
    return len(parts) == 3 and all(p.isdigit() and int(p) < 32768 for p in parts)


def control_value(text, key):
    """The first line starting with key: its value after the one '=', with
    one pair of single quotes stripped (dbdev does not unescape)."""
    for line in text.splitlines():
        if line.startswith(key):
            parts = line.split('=')
            if len(parts) != 2:
                raise ValueError('dbdev cannot read the control line %r' % line)
            v = parts[1].strip()
            v = v[1:] if v.startswith("'") else v
            return v[:-1] if v.endswith("'") else v
    return None


def read_package(folder, order=None):
    """The folder as dbdev reads it.  Files in directory order (os.listdir
    and Rust's read_dir both give readdir's), or as order sorts them."""
    p = Package()
    names = os.listdir(folder)
    if order:
        names = order(names)
    controls = [n for n in names if n.endswith('.control')]
    if len(controls) != 1:
        raise ValueError('%d control files in %s' % (len(controls), folder))
    p.name = controls[0][:-len('.control')]
    with open(os.path.join(folder, controls[0]), encoding='utf-8') as f:
        ctl = f.read()
    p.default = control_value(ctl, 'default_version')
    p.comment = control_value(ctl, 'comment')
    p.schema = control_value(ctl, 'schema')
    req = control_value(ctl, 'requires')
    p.requires = [r.strip() for r in req.split(',')] if req is not None else []
    p.readme = 'README.md' in names
    p.installs, p.updates, p.skipped = [], [], []
    for n in names:
        if not n.endswith('.sql') or not os.path.isfile(os.path.join(folder, n)):
            continue
        parts = n[:-len('.sql')].split('--')
        with open(os.path.join(folder, n), encoding='utf-8') as f:
            body = f.read()
        if len(parts) not in (2, 3):
            continue
        if parts[0] != p.name or not all(dbdev_version(v) for v in parts[1:]):
            p.skipped.append(n)
        elif len(parts) == 2:
            p.installs.append((parts[1], body))
        else:
            p.updates.append((parts[1], parts[2], body))
    return p


def add_migration(pkg, outdir, version=None, schema=None, handle=None, registered=(), paths=()):
    """Write the migration file `dbdev add` writes for pkg into outdir and
    return its path.  handle: the registry's `package -n HANDLE@NAME` (the
    extension is then named HANDLE@NAME); registered and paths: the versions
    and update paths a -c connection finds registered (left out)."""
    name = '%s@%s' % (handle, pkg.name) if handle else pkg.name
    now = datetime.datetime.now(datetime.timezone.utc)
    version = version or pkg.default
    tag = ''.join(random.choice(string.ascii_letters + string.digits) for _ in range(16))
    sq, cq = '$sql_%s$' % tag, '$comment_%s$' % tag
    out = ['-- Migration generated by dbdev add at: %s\n' % now.strftime('%Y-%m-%d %H:%M:%S'),
           '-- Extension: %s\n' % name, '-- Default version: %s\n' % pkg.default]
    if pkg.comment is not None:
        out.append('-- Comment: %s\n' % pkg.comment)
    out.append('-' * 36)                    # no line break after it, as dbdev writes it
    if pkg.requires:
        out.append('-- Install prerequisites\n')
        out += ['create extension if not exists %s;\n' % r for r in pkg.requires]
        out.append('\n')
    first = not registered
    for v, body in pkg.installs:
        if v in registered:
            continue
        if first:
            out.append('-- Initial installation of version: %s\n' % v)
            out.append("select pgtle.install_extension('%s', '%s', %s%s%s, %s%s%s, array[%s]::text[] );\n\n" % (
                name, v, cq, pkg.comment or '', cq, sq, body, sq, ','.join("'%s'" % r for r in pkg.requires)))
            first = False
        else:
            out.append('-- Install version %s\n' % v)
            out.append("select pgtle.install_extension_version_sql('%s', '%s', %s%s%s);\n\n" % (name, v, sq, body, sq))
    for a, b, body in pkg.updates:
        if (a, b) not in paths:
            out.append("select pgtle.install_update_path('%s', '%s', '%s', %s%s%s);\n\n" % (name, a, b, sq, body, sq))
    out.append('\n-- Delete existing extension if installed\n')
    out.append('drop extension if exists "%s";\n' % name)
    out.append('-- Create the extension\n')
    schema = schema or pkg.schema
    out.append('create extension "%s"%s version \'%s\';\n' % (name, ' schema "%s"' % schema if schema else '', version))
    out.append('-- Setting default version to:%s\n' % pkg.default)
    out.append("select pgtle.set_default_version('%s', '%s');\n" % (name, pkg.default))
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, '%s_%s_%s_install.sql' % (now.strftime('%Y%m%d%H%M%S'), name, version))
    with open(path, 'w', encoding='utf-8') as f:
        f.write(''.join(out))
    return path


def registered_in(conn, name):
    """What `dbdev add -c` asks the database: the versions and update paths
    of name that pg_tle has."""
    versions = {r[0] for r in rows(conn, 'SELECT version FROM pgtle.available_extension_versions() WHERE name = %s',
                                   (name,))}
    paths = set(rows(conn, 'SELECT source, target FROM pgtle.extension_update_paths(%s) WHERE path IS NOT NULL',
                     (name,))) if versions else set()
    return versions, paths


def as_update(path, name, version):
    """docs/managed.md's edit of an update migration: its `drop extension
    if exists` and `create extension` replaced by ALTER EXTENSION ... UPDATE TO."""
    with open(path, encoding='utf-8') as f:
        text = f.read()
    pair = re.compile(r'^drop extension if exists "%s";\n(--[^\n]*\n)*create extension "%s"[^\n]*;\n'
                      % (re.escape(name), re.escape(name)), re.M)
    text, n = pair.subn("alter extension \"%s\" update to '%s';\n" % (name, version), text)
    edited = path[:-len('.sql')] + '_edited.sql'
    with open(edited, 'w', encoding='utf-8') as f:
        f.write(text)
    return edited, n


# --------------------------------------------------------------------------
# the server

def connect(user, db, schema=None, tenant=None):
    options = '-c search_path=%s' % (schema or args.schema)
    if tenant:
        options += ' -c app.tenant=%s' % tenant
    c = psycopg2.connect(host=args.host, port=args.port, dbname=db, user=user, options=options,
                         application_name='idem-dbdev-test')
    c.autocommit = True
    return c


def psql_file(db, path, user=None, single=True):
    """psql -f as user (--owner): (exit code, output)."""
    cmd = ['psql', '-X', '-q', '-h', args.host, '-p', str(args.port), '-U', user or args.owner, '-d', db,
           '-v', 'ON_ERROR_STOP=1'] + (['--single-transaction'] if single else []) + ['-f', path]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, (r.stdout + r.stderr).strip()


def new_database(su, db, public_defaults=False):
    """What the provider does: the database, pg_tle in it, CREATE on it for
    --owner (who makes its schema); Supabase's default privileges in public."""
    run(su, 'DROP DATABASE IF EXISTS %s WITH (FORCE)' % db)
    run(su, 'CREATE DATABASE %s' % db)
    c = connect('postgres', db)
    run(c, 'CREATE EXTENSION pg_tle')
    run(c, 'GRANT pgtle_admin TO %s' % args.owner)
    run(c, 'GRANT CREATE ON DATABASE %s TO %s' % (db, args.owner))
    run(c, 'REVOKE CREATE ON SCHEMA public FROM PUBLIC')
    if public_defaults:
        run(c, 'GRANT ALL ON SCHEMA public TO %s' % args.owner)
        for kind in ('TABLES', 'FUNCTIONS', 'SEQUENCES'):
            run(c, 'ALTER DEFAULT PRIVILEGES FOR ROLE %s IN SCHEMA public GRANT ALL ON %s TO %s'
                % (args.owner, kind, ', '.join(ANON)))
    c.close()
    if args.schema != 'public':
        o = connect(args.owner, db)
        run(o, 'CREATE SCHEMA %s' % args.schema)
        o.close()


def roles(su):
    for r in (APP, STRANGER) + ANON:
        if not one(su, 'SELECT 1 FROM pg_roles WHERE rolname = %s', (r,)):
            run(su, 'CREATE ROLE %s LOGIN' % r)
    if not one(su, 'SELECT 1 FROM pg_roles WHERE rolname = %s', (args.owner,)):
        run(su, 'CREATE ROLE %s LOGIN NOSUPERUSER' % args.owner)


def extension(conn, name):
    """(version, owner, schema) of the extension name, or None."""
    return one(conn, 'SELECT extversion, extowner::regrole::text, extnamespace::regnamespace::text'
                     ' FROM pg_extension WHERE extname = %s', (name,))


# every object of the schema, for comparing two installs (no OIDs, no data)
SNAPSHOT = (
    ("SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')', md5(pg_get_functiondef(p.oid)),"
     " p.proconfig::text, obj_description(p.oid, 'pg_proc'),"
     " (SELECT string_agg(a.grantee::regrole::text || ':' || a.privilege_type, ',' ORDER BY 1)"
     "    FROM aclexplode(coalesce(p.proacl, acldefault('f'::\"char\", p.proowner))) a)"
     " FROM pg_proc p WHERE p.pronamespace = %(s)s::regnamespace ORDER BY 1, 2"),
    ("SELECT c.relname, c.relkind, c.relrowsecurity, c.relforcerowsecurity, obj_description(c.oid, 'pg_class'),"
     " (SELECT string_agg(a.grantee::regrole::text || ':' || a.privilege_type, ',' ORDER BY 1)"
     "    FROM aclexplode(coalesce(c.relacl, acldefault(CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END::\"char\", c.relowner))) a)"
     " FROM pg_class c WHERE c.relnamespace = %(s)s::regnamespace AND c.relkind <> 'i' ORDER BY 1"),
    ("SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,"
     " pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
     " LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
     " WHERE c.relnamespace = %(s)s::regnamespace AND a.attnum > 0 AND NOT a.attisdropped ORDER BY 1, 2"),
    ("SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index i JOIN pg_class c"
     " ON c.oid = i.indrelid WHERE c.relnamespace = %(s)s::regnamespace ORDER BY 1"),
    ("SELECT c.relname, p.polname, p.polcmd, p.polroles::regrole[]::text, pg_get_expr(p.polqual, p.polrelid),"
     " pg_get_expr(p.polwithcheck, p.polrelid) FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid"
     " WHERE c.relnamespace = %(s)s::regnamespace ORDER BY 1, 2"),
    ("SELECT t.typname, t.typtype FROM pg_type t WHERE t.typnamespace = %(s)s::regnamespace"
     " AND t.typtype IN ('c', 'd', 'e') AND NOT EXISTS (SELECT FROM pg_class c WHERE c.reltype = t.oid) ORDER BY 1"),
)


def snapshot(conn, schema=None):
    return [rows(conn, q, {'s': schema or args.schema}) for q in SNAPSHOT]


def members(conn, name):
    return one(conn, "SELECT count(*) FILTER (WHERE d.classid = 'pg_proc'::regclass), count(*)"
                     " FROM pg_depend d JOIN pg_extension e ON d.refclassid = 'pg_extension'::regclass"
                     " AND d.refobjid = e.oid WHERE e.extname = %s AND d.deptype = 'e'", (name,))


def function_oids(conn):
    """{signature: OID} of the schema's functions but those the update
    creates again (RECREATED)."""
    return dict(rows(conn, "SELECT p.oid::regprocedure::text, p.oid::int FROM pg_proc p"
                           " WHERE p.pronamespace = %s::regnamespace AND p.proname <> ALL (%s)",
                     (args.schema, list(RECREATED))))


def records(conn, schema=None):
    """Every record, its column holder (1.4) named only when it is set, so
    that a record written by 1.3 compares equal after the update."""
    return rows(conn, "SELECT (to_jsonb(r) - 'holder')::text || COALESCE(' holder=' || (to_jsonb(r) ->> 'holder'), '')"
                      " FROM %s.idempotency_records r ORDER BY tenant_id, key" % (schema or args.schema))


# --------------------------------------------------------------------------
# the SQL edition's contract through the package

def claim(conn, tenant, key, fp=None, lease=None):
    return one(conn, 'SELECT outcome, token, response FROM idem_claim(%s, %s, %s, %s::interval)',
               (tenant, key, fp, lease))


def grant_app(db, schema=None):
    """docs/privileges.md's grants for the application role, docs/managed.md's
    helpers (those the installed version has), then tenant isolation on."""
    o = connect(args.owner, db, schema)
    s = schema or args.schema
    run(o, 'GRANT USAGE ON SCHEMA %s TO %s' % (s, APP))
    sig = next(f for f in CLAIM_SIGNATURES if one(o, 'SELECT to_regprocedure(%s)', (s + '.' + f,))[0])
    run(o, 'GRANT EXECUTE ON FUNCTION %s, %s TO %s' % (sig, APP_FUNCTIONS, APP))
    run(o, 'GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_records TO %s' % APP)
    have = [h for h in HELPERS if one(o, 'SELECT to_regprocedure(%s)', (s + '.' + h,))[0]]
    run(o, 'GRANT EXECUTE ON FUNCTION %s TO %s' % (', '.join(have), APP))
    run(o, 'SELECT idem_set_tenant_isolation(true)')
    o.close()


def contract(db, label, schema=None):
    """A claim, in_progress, complete, replay, mismatch, release and a new
    claim as the application role confined to tenant shop; another tenant,
    no tenant set and no grant refused."""
    shop = connect(APP, db, schema, tenant='shop')
    other = connect(APP, db, schema, tenant='other')
    unset = connect(APP, db, schema)
    key, pay = label + '-order', label + '-pay'
    o1, t1, _ = claim(shop, 'shop', key, 'sha256:a', '1 hour')
    check(o1 == 'claimed' and t1 > 0, '%s: a claim by the application role: claimed, token %s' % (label, t1))
    check(claim(shop, 'shop', key, 'sha256:a')[0] == 'in_progress', '%s: its duplicate while it is held: in_progress'
          % label)
    run(shop, """SELECT idem_complete('shop', %s, %s, '{"status": 201}')""", (key, t1))
    o, t, resp = claim(shop, 'shop', key, 'sha256:a')
    check((o, t, resp) == ('replay', None, {'status': 201}),
          '%s: complete, then the replay answers the stored response' % label, (o, t, resp))
    check(claim(shop, 'shop', key, 'sha256:b')[0] == 'mismatch', '%s: another fingerprint: mismatch' % label)
    o2, t2, _ = claim(shop, 'shop', pay)
    run(shop, 'SELECT idem_release(\'shop\', %s, %s)', (pay, t2))
    o3, t3, _ = claim(shop, 'shop', pay)
    check(o2 == 'claimed' and o3 == 'claimed' and t1 < t2 < t3,
          '%s: release, then the key claimed again with a larger token' % label, (o2, o3, t1, t2, t3))
    e = sqlstate(other, 'SELECT idem_claim(%s, %s)', ('shop', key))
    seen = one(other, "SELECT count(*) FROM idempotency_records WHERE tenant_id = 'shop'")[0]
    mine = claim(other, 'other', key)[0]
    check(e == '42501' and seen == 0 and mine == 'claimed',
          "%s: tenant isolation: a session of tenant other is refused shop's key (42501), sees none of its"
          " records and claims its own key of the same name" % label, (e, seen, mine))
    e = sqlstate(unset, 'SELECT idem_claim(%s, %s)', ('shop', label + '-unset'))
    check(e == '55000', '%s: no tenant set: 55000' % label, e)
    stranger = connect(STRANGER, db, schema)
    e = sqlstate(stranger, 'SELECT %s.idem_claim(%%s, %%s)' % (schema or args.schema), ('shop', label + '-x'))
    check(e == '42501', '%s: a role without the grants: 42501' % label, e)
    for c in (shop, other, unset, stranger):
        c.close()


# --------------------------------------------------------------------------

def run_checks():
    su = connect('postgres', 'postgres')
    roles(su)
    gen = subprocess.run([os.path.join(ROOT, 'sql-edition', 'dbdev', 'generate'), '--check', '--out', args.package],
                         capture_output=True, text=True)
    check(gen.returncode == 0, 'the package folder is what sql-edition/dbdev/generate makes (--check)',
          gen.stdout + gen.stderr)
    pkg = read_package(args.package)
    name = pkg.name
    versions = [v for v, _ in pkg.installs]
    check(pkg.readme and not pkg.skipped and pkg.default in versions and len(pkg.installs) == 2
          and len(pkg.updates) == 1,
          'the package as dbdev reads it: a control file, README.md, two versions (%s), one update path, no file'
          ' skipped' % ', '.join(sorted(versions)), (pkg.skipped, versions, pkg.updates and pkg.updates[0][:2]))
    prev = [v for v in versions if v != pkg.default][0] if len(versions) == 2 else None
    check(pkg.updates and pkg.updates[0][:2] == (prev, pkg.default),
          'its update path goes from the previous version to the default (%s -> %s)' % (prev, pkg.default))
    check(pkg.requires == ['plpgsql'] and set(pkg.requires) <= ALLOWED_REQUIRES,
          'requires = plpgsql, which dbdev allows', pkg.requires)
    pattern = re.compile(r'^[ \t]*(BEGIN|COMMIT|ROLLBACK|START[ \t]+TRANSACTION)\b[^;\n]*;[ \t]*$', re.I | re.M)
    bad = [v for v, body in pkg.installs if pattern.search(body)] + \
          ['%s--%s' % u[:2] for u in pkg.updates if pattern.search(u[2])]
    check(not bad, 'no script has BEGIN, COMMIT or ROLLBACK', bad)
    wrapper = [os.path.join(ROOT, 'sql-edition', '%s--%s-pgtle.sql' % (name, v))
               for v in (re.sub(r'\.0$', '', pkg.default), pkg.default)]
    wrapper = ([w for w in wrapper if os.path.isfile(w)] or [None])[0]
    work = tempfile.mkdtemp(prefix='idem-dbdev-', dir=args.workdir)
    s = args.schema
    ext = '%s@%s' % (args.handle, name)
    db = args.dbname

    # ---- 1. a fresh install from the registry
    new_database(su, db, public_defaults=True)
    mig = add_migration(pkg, os.path.join(work, db), pkg.default, s, args.handle)
    text = open(mig, encoding='utf-8').read()
    check(text.count('select pgtle.install_extension(') == 1 and text.count('install_extension_version_sql(') == 1
          and text.count('install_update_path(') == 1 and 'drop extension if exists "%s";' % ext in text
          and 'create extension "%s" schema "%s" version \'%s\';' % (ext, s, pkg.default) in text,
          'dbdev add -v %s -s %s package -n %s: one install_extension, one install_extension_version_sql, the'
          ' update path, drop extension, create extension (versions in the order %s)'
          % (pkg.default, s, ext, ', '.join(versions)))
    o = connect(args.owner, db)
    check(one(o, "SELECT NOT rolsuper AND pg_has_role(current_user, 'pgtle_admin', 'MEMBER') FROM pg_roles"
                 " WHERE rolname = current_user")[0], '%s is not a superuser and is a member of pgtle_admin' % args.owner)
    rc, out = psql_file(db, mig)
    check(rc == 0, 'the migration runs (psql -1 -f) as %s' % args.owner, out)
    check(extension(o, ext) == (pkg.default, args.owner, s),
          'extension "%s" %s, owned by %s, in %s' % (ext, pkg.default, args.owner, s), extension(o, ext))
    reg = rows(o, 'SELECT version, requires::text FROM pgtle.available_extension_versions() WHERE name = %s'
                  ' ORDER BY 1', (ext,))
    dflt = one(o, 'SELECT default_version FROM pgtle.available_extensions() WHERE name = %s', (ext,))
    check(reg == [(v, '{plpgsql,pg_tle}') for v in sorted(versions)] and dflt == (pkg.default,),
          'pg_tle has both versions, requiring plpgsql (and pg_tle, which it adds), default %s' % pkg.default,
          (reg, dflt))
    nfun = sum(len(re.findall(r'^CREATE FUNCTION ', b, re.M)) for v, b in pkg.installs if v == pkg.default)
    funs, _ = members(o, ext)
    inc = one(o, "SELECT count(*) FROM pg_proc WHERE pronamespace = %s::regnamespace"
                 " AND prolang = (SELECT oid FROM pg_language WHERE lanname = 'c')", (s,))[0]
    allf = one(o, 'SELECT count(*) FROM pg_proc WHERE pronamespace = %s::regnamespace', (s,))[0]
    check(funs == nfun == allf and inc == 0, 'every function of the schema is a member (%d), none in C' % nfun,
          (funs, nfun, allf, inc))
    fresh = snapshot(o)
    if wrapper:
        ref = db + '_ref'
        new_database(su, ref)
        rc1, out1 = psql_file(ref, wrapper, single=False)
        c = connect(args.owner, ref)
        e = sqlstate(c, 'CREATE EXTENSION %s SCHEMA %s' % (name, s))
        check(rc1 == 0 and e is None and snapshot(c) == fresh,
              "its objects are the pg_tle route's (%s, CREATE EXTENSION %s)" % (os.path.relpath(wrapper, ROOT), name),
              (out1, e, [i for i, (a, b) in enumerate(zip(snapshot(c), fresh)) if a != b]))
        c.close()
    else:
        check(False, 'the pg_tle wrapper of %s is in sql-edition/' % pkg.default)
    # what anon and authenticated may do in the schema beyond what PUBLIC may (a role with no grant)
    beyond = rows(o, """
        SELECT r, c.relname FROM unnest(%(roles)s::text[]) r, pg_class c
         WHERE c.relnamespace = %(s)s::regnamespace AND c.relkind IN ('r', 'S', 'v')
           AND (has_table_privilege(r, c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE')
                OR c.relkind = 'S' AND has_sequence_privilege(r, c.oid, 'USAGE, UPDATE'))
           AND NOT (has_table_privilege(%(none)s, c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE')
                    OR c.relkind = 'S' AND has_sequence_privilege(%(none)s, c.oid, 'USAGE, UPDATE'))
        UNION ALL
        SELECT r, p.proname FROM unnest(%(roles)s::text[]) r, pg_proc p
         WHERE p.pronamespace = %(s)s::regnamespace AND has_function_privilege(r, p.oid, 'EXECUTE')
           AND NOT has_function_privilege(%(none)s, p.oid, 'EXECUTE')
        UNION ALL
        SELECT r, 'USAGE on the schema' FROM unnest(%(roles)s::text[]) r WHERE has_schema_privilege(r, %(s)s, 'USAGE')""",
                  {'roles': list(ANON), 's': s, 'none': STRANGER})
    check(not beyond, "in %s, with Supabase's default privileges in public, anon and authenticated get no USAGE on"
          " the schema and no right on its objects beyond PUBLIC's" % s, beyond)
    # the package README's example, as written (psql runs it, as the owner
    # before any application grant): the claim and its completion commit
    readme = open(os.path.join(args.package, 'README.md'), encoding='utf-8').read()
    example = os.path.join(work, 'readme.sql')
    with open(example, 'w', encoding='utf-8') as f:
        f.write('\n'.join(re.findall(r'^```sql\n(.*?)^```', readme, re.S | re.M)))
    rc, out = psql_file(db, example, single=False)
    done = one(o, "SELECT status FROM %s.idempotency_records WHERE tenant_id = 'shop' AND key = 'order-1'" % s)
    check(rc == 0 and done == ('completed',), "the README's example runs as written and completes its claim",
          (rc, out, done))
    run(o, "SELECT %s.idem_forget('shop', 'order-1')" % s)
    grant_app(db)
    granted = snapshot(o)
    contract(db, 'fresh')
    before = records(o)
    rc, out = psql_file(db, mig)
    # psql names the statement's last line: that of pgtle.install_extension, before the drop
    start = text.index('select pgtle.install_extension(')
    at = 1 + text[:text.index('::text[] );', start)].count('\n')
    check(rc != 0 and re.search(r':%d: ERROR:  extension "%s" already installed' % (at, re.escape(ext)), out)
          and extension(o, ext) == (pkg.default, args.owner, s) and records(o) == before,
          'the same migration run again fails at pgtle.install_extension, before its drop: the extension and its'
          ' %d records are kept' % len(before), out)
    o.close()

    # ---- 2. from the folder (`path` source), the previous version, the files in the other order, then UPDATE
    pdb = db + '_path'
    new_database(su, pdb)
    rev = read_package(args.package, order=lambda ns: list(reversed(ns)))
    mig = add_migration(rev, os.path.join(work, pdb), prev, s)
    rc, out = psql_file(pdb, mig)
    o = connect(args.owner, pdb)
    check(rc == 0 and extension(o, name) == (prev, args.owner, s),
          'dbdev add -v %s path --directory: extension %s %s (the versions registered in the order %s)'
          % (prev, name, prev, ', '.join(v for v, _ in rev.installs)),
          (out, extension(o, name)))
    grant_app(pdb)
    contract(pdb, 'path-%s' % prev)
    oids, before = function_oids(o), records(o)
    e = sqlstate(o, 'ALTER EXTENSION %s UPDATE' % name)
    after = function_oids(o)
    check(e is None and extension(o, name)[0] == pkg.default and all(after.get(f) == i for f, i in oids.items())
          and records(o) == before,
          "ALTER EXTENSION %s UPDATE through the package's path: %s, every function kept (same OID) but the"
          " three it creates again (%s), the %d records unchanged" % (name, pkg.default, ', '.join(RECREATED),
                                                                     len(before)), (e, extension(o, name)))
    check(snapshot(o) == granted, "the objects are then a fresh install's, grants included",
          [i for i, (x, y) in enumerate(zip(snapshot(o), granted)) if x != y])
    contract(pdb, 'path-%s' % pkg.default)
    o.close()

    # ---- 3. an update: the previous version's package migration first, then `dbdev add -c`'s
    udb, adb = db + '_upd', db + '_asis'
    new_database(su, udb)
    old = os.path.join(work, 'package-%s' % prev)
    os.makedirs(old)
    for f in os.listdir(args.package):
        if f == 'README.md' or f == '%s--%s.sql' % (name, prev):
            shutil.copy(os.path.join(args.package, f), old)
        elif f.endswith('.control'):
            with open(os.path.join(args.package, f), encoding='utf-8') as fh:
                ctl = fh.read()
            with open(os.path.join(old, f), 'w', encoding='utf-8') as fh:
                fh.write(re.sub(r"^default_version = .*$", "default_version = '%s'" % prev, ctl, flags=re.M))
    oldpkg = read_package(old)
    mig = add_migration(oldpkg, os.path.join(work, udb), prev, s, args.handle)
    rc, out = psql_file(udb, mig)
    o = connect(args.owner, udb)
    check(rc == 0 and extension(o, ext) == (prev, args.owner, s),
          "the previous version's package (%s only) migrated: extension %s %s" % (prev, ext, prev),
          (out, extension(o, ext)))
    grant_app(udb)
    shop = connect(APP, udb, tenant='shop')
    done = claim(shop, 'shop', 'done', 'sha256:d')[1]
    check(done is not None, 'claims at %s' % prev)
    run(shop, """SELECT idem_complete('shop', 'done', %s, '{"n": 1}')""", (done,))
    failed = claim(shop, 'shop', 'failed')[1]
    run(shop, """SELECT idem_release('shop', 'failed', %s, '{"error": "declined"}')""", (failed,))
    flying = claim(shop, 'shop', 'in-flight', None, '1 hour')[1]
    other = connect(APP, udb, tenant='other')
    otok = claim(other, 'other', 'done')[1]
    run(other, "SELECT idem_complete('other', 'done', %s)", (otok,))
    for c in (shop, other):
        c.close()
    before, oids = records(o), function_oids(o)
    o.close()
    run(su, 'DROP DATABASE IF EXISTS %s WITH (FORCE)' % adb)
    run(su, 'CREATE DATABASE %s TEMPLATE %s' % (adb, udb))
    c = connect('postgres', udb)
    versions_reg, paths_reg = registered_in(c, ext)
    c.close()
    mig = add_migration(pkg, os.path.join(work, udb + '-update'), None, s, args.handle, versions_reg, paths_reg)
    text = open(mig, encoding='utf-8').read()
    check(versions_reg == {prev} and 'select pgtle.install_extension(' not in text
          and text.count('install_extension_version_sql(') == 1 and text.count('install_update_path(') == 1,
          'dbdev add -c (%s registered): the update migration registers %s and the path, no install_extension'
          % (prev, pkg.default), (versions_reg, paths_reg))
    rc, out = psql_file(adb, mig)
    a = connect(args.owner, adb)
    left = records(a)
    check(rc == 0 and extension(a, ext)[0] == pkg.default and len(before) == 4 and left == [],
          'as dbdev writes it, the update migration drops the extension and creates %s: the %d records are'
          ' gone (docs/managed.md: replace the drop and create)' % (pkg.default, len(before)), (out, len(left)))
    a.close()
    edited, n = as_update(mig, ext, pkg.default)
    rc, out = psql_file(udb, edited)
    o = connect(args.owner, udb)
    after = function_oids(o)
    check(n == 1 and rc == 0 and extension(o, ext) == (pkg.default, args.owner, s),
          'with docs/managed.md\'s edit (alter extension "%s" update to \'%s\') the migration updates it'
          % (ext, pkg.default), (n, out, extension(o, ext)))
    check(records(o) == before and all(after.get(f) == i for f, i in oids.items()),
          'every record and every function (same OID) kept but the three the update creates again',
          (len(records(o)), len(before)))
    check(snapshot(o) == granted, "the objects are a fresh install's, the grants too: %s got"
          " idem_sql_tenant_keylock" % APP,
          [i for i, (x, y) in enumerate(zip(snapshot(o), granted)) if x != y])
    shop = connect(APP, udb, tenant='shop')
    e = sqlstate(shop, "SELECT idem_complete('shop', 'in-flight', %s)", (flying,))
    r1 = claim(shop, 'shop', 'in-flight')
    r2 = claim(shop, 'shop', 'done', 'sha256:d')
    r3 = claim(shop, 'shop', 'failed')
    check(e is None and r1 == ('replay', None, None) and r2 == ('replay', None, {'n': 1})
          and r3 == ('failed', None, {'error': 'declined'}),
          'the claim in flight completes with its token after the update; the completed record replays, the'
          ' failed one answers failed with its failure', (e, r1, r2, r3))
    shop.close()
    contract(udb, 'updated')
    o.close()

    # ---- 4. -s public on Supabase: its default privileges give anon the records
    pub = db + '_pub'
    new_database(su, pub, public_defaults=True)
    mig = add_migration(pkg, os.path.join(work, pub), pkg.default, 'public', args.handle)
    rc, out = psql_file(pub, mig)
    c = connect('postgres', pub, 'public')
    hazard = one(c, "SELECT has_table_privilege(%s, 'public.idempotency_records', 'SELECT, INSERT, DELETE'),"
                    " has_function_privilege(%s, 'public.idem_forget(text, text)', 'EXECUTE')", (ANON[0], ANON[0]))
    check(rc == 0 and hazard == (True, True),
          "-s public with Supabase's default privileges: anon may read and delete the records and run"
          " idem_forget (docs/managed.md: a schema of its own)", (out, hazard))
    c.close()

    for d in (db, db + '_ref', pdb, udb, adb, pub) if not args.keep else ():
        run(su, 'DROP DATABASE IF EXISTS %s WITH (FORCE)' % d)
    su.close()
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    common.result_line('DBDEV-RESULT')


def main():
    global args
    p = cli.parser(__doc__.splitlines()[0])
    p.add_argument('--package', default=os.path.join(ROOT, 'sql-edition', 'dbdev', 'idempotency_sql'),
                   help='the package folder (default: sql-edition/dbdev/idempotency_sql)')
    p.add_argument('--handle', default='idem_test', help='the registry handle: the extension is HANDLE@NAME')
    p.add_argument('--workdir', default=None, help='where the migration files are written (a folder of its own in it)')
    p.add_argument('--keep', action='store_true', help='keep the databases and migration files')
    args = p.parse_args()
    cli.finish(run_checks, 'DBDEV-RESULT')


if __name__ == '__main__':
    main()
