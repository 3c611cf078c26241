#!/usr/bin/python3
"""The SQL objects of a release, against the snapshot committed for it.

Used by test/suites/05-release, against a throwaway server.  In a fresh
database, CREATE EXTENSION idempotency (the installed scripts: the suite
checks they are the tree's), then describe every member of the extension
with test/upgrade/catalog.py (pg_describe_object of each pg_depend 'e'
member; each function's signature, arguments, result, language, volatility,
settings, C symbol and a hash of its SQL body; each table's columns,
indexes, constraints, triggers, policies; sequences, types, views; every
ACL and the initial privileges; the extension's config tables) as one sorted
line per property.  test/release/objects-<default_version>.txt is that text
as the version was released: any difference means a released script changed,
which a database already at that version would never see.

  objects.py compare --host H --port P --repo DIR
      prints ok/FAIL lines and RELEASE-RESULT passed=N failed=M; the
      self-test plants a new member, a changed function and a new grant in a
      scratch database and expects the comparison to report each
  objects.py refresh --host H --port P --repo DIR [--force]
      writes test/release/objects-<default_version>.txt; refuses to replace
      an existing snapshot that differs unless --force (only for a change of
      this file's format, never to hide a changed object)
"""
import argparse
import hashlib
import os
import re
import sys

import psycopg2

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..', 'upgrade'))
import catalog  # noqa: E402  (test/upgrade/catalog.py: the generic member description)

passed = 0
failed = 0
DB = 'release_objects'
SCRATCH_DB = 'release_objects_planted'


def check(ok, what, detail=''):
    global passed, failed
    passed += bool(ok)
    failed += not ok
    print('%s %s' % ('ok  ' if ok else 'FAIL', what), flush=True)
    if detail and not ok:
        for line in str(detail).rstrip().splitlines():
            print('       ' + line)
    return ok


def default_version(repo):
    with open(os.path.join(repo, 'idempotency.control'), encoding='utf-8') as f:
        return re.search(r"^default_version\s*=\s*'([^']+)'", f.read(), re.M).group(1)


def snapshot_path(repo, version):
    return os.path.join(repo, 'test', 'release', 'objects-%s.txt' % version)


def render(value):
    """One line per property: long or multi-line values (SQL bodies, view
    definitions) as a hash, so the file stays readable and diffs name the
    property that changed."""
    if value is None:
        return 'NULL'
    value = str(value)
    if '\n' in value or len(value) > 400:
        return 'sha256:%s (%d lines)' % (hashlib.sha256(value.encode()).hexdigest()[:24], value.count('\n') + 1)
    return value


def describe(conn):
    snap = catalog.snapshot(conn)
    lines = []
    for obj in sorted(snap):
        for prop in sorted(snap[obj]):
            lines.append('%s | %s = %s' % (obj, prop, render(snap[obj][prop])))
    return lines


def server_major(conn):
    with conn.cursor() as cur:
        cur.execute('SHOW server_version_num')
        return int(cur.fetchone()[0]) // 10000


def header(version, major):
    return ['# idempotency %s: the SQL objects a fresh CREATE EXTENSION makes, on PostgreSQL %d.' % (version, major),
            '# Written by `test/suites/05-release --refresh` when the version was added; never edit it by hand.',
            '# test/suites/05-release fails when a fresh install differs from it.']


def connect(args, db):
    conn = psycopg2.connect(host=args.host, port=args.port, dbname=db, user='postgres')
    conn.autocommit = True
    return conn


def fresh_database(args, db):
    root = connect(args, 'postgres')
    root.cursor().execute('DROP DATABASE IF EXISTS %s' % db)
    root.cursor().execute('CREATE DATABASE %s' % db)
    root.close()
    conn = connect(args, db)
    conn.cursor().execute('CREATE EXTENSION idempotency')
    return conn


def read_snapshot(path):
    """(major the snapshot was made on, its object lines)."""
    with open(path, encoding='utf-8') as f:
        text = f.read().split('\n')
    m = re.search(r'on PostgreSQL (\d+)\.', text[0]) if text else None
    return (int(m.group(1)) if m else None), [l for l in text if l and not l.startswith('#')]


def differences(want, got):
    """Lines only in the snapshot ('-') and only in the fresh install ('+')."""
    w, g = set(want), set(got)
    return ['- ' + l for l in want if l not in g] + ['+ ' + l for l in got if l not in w]


def installed_scripts_match(repo):
    """The installed control file and scripts are the tree's, byte for byte
    (else the comparison would check stale files)."""
    import subprocess
    share = subprocess.run(['pg_config', '--sharedir'], capture_output=True, text=True).stdout.strip()
    ext = os.path.join(share, 'extension')
    names = sorted(n for n in os.listdir(repo) if re.match(r'^idempotency(--.*\.sql|\.control)$', n))
    wrong = []
    for n in names:
        installed = os.path.join(ext, n)
        if not os.path.isfile(installed):
            wrong.append('%s: not installed in %s' % (n, ext))
            continue
        with open(installed, 'rb') as a, open(os.path.join(repo, n), 'rb') as b:
            if a.read() != b.read():
                wrong.append('%s: the installed file differs from the tree\'s' % n)
    return names, wrong


def compare(args):
    version = default_version(args.repo)
    names, wrong = installed_scripts_match(args.repo)
    check(not wrong, 'the installed control file and scripts are the tree\'s (%s)' % ', '.join(names),
          '\n'.join(wrong + ['run make install (test/run-all does) before this suite']))
    path = snapshot_path(args.repo, version)
    if not os.path.isfile(path):
        check(False, 'test/release/objects-%s.txt exists for default_version %s' % (version, version),
              'a new version needs its snapshot: after adding the update script and bumping '
              'default_version, run test/suites/05-release --refresh and commit the file')
        return
    conn = fresh_database(args, DB)
    major = server_major(conn)
    got = describe(conn)
    conn.close()
    snap_major, want = read_snapshot(path)
    if snap_major != major:
        print('note: not compared: the snapshot of %s was made on PostgreSQL %s, this server is %d '
              '(catalog deparsing differs between majors)' % (version, snap_major, major))
    else:
        diff = differences(want, got)
        check(not diff, 'a fresh CREATE EXTENSION makes exactly the %d object properties of '
              'test/release/objects-%s.txt' % (len(want), version),
              'the SQL objects of version %s changed (- snapshot, + fresh install):\n%s\n'
              'A released version never changes: add an update script '
              '(idempotency--%s--<next>.sql) and bump the version (idempotency.control, META.json, '
              'debian/changelog, CHANGELOG.md), then run test/suites/05-release --refresh.'
              % (version, '\n'.join(diff[:60]) + ('\n… %d more' % (len(diff) - 60) if len(diff) > 60 else ''),
                 version))
    self_test(args, got)


def self_test(args, baseline):
    """Plant changes a changed script would make, in a scratch database, and
    expect the comparison to report each of them."""
    conn = fresh_database(args, SCRATCH_DB)
    plants = [
        ('a new function in the extension', 'idem_planted',
         """CREATE FUNCTION public.idem_planted() RETURNS integer LANGUAGE sql SET search_path = pg_catalog
                RETURN 1;
            ALTER EXTENSION idempotency ADD FUNCTION public.idem_planted()"""),
        ('a changed function property', 'idem_child_key(text,text,text) | cost',
         'ALTER FUNCTION public.idem_child_key(text, text, text) COST 7'),
        ('a new grant', 'idem_lookup(text,text) | acl',
         'GRANT EXECUTE ON FUNCTION public.idem_lookup(text, text) TO PUBLIC'),
        ('a new column', 'idempotency_records.planted',
         'ALTER TABLE public.idempotency_records ADD COLUMN planted integer'),
    ]
    missed = []
    for what, marker, sql in plants:
        conn.cursor().execute(sql)
        diff = differences(baseline, describe(conn))
        if not any(marker in l for l in diff):
            missed.append('%s (looked for %r in the difference: %r)' % (what, marker, diff[:5]))
    conn.close()
    root = connect(args, 'postgres')
    root.cursor().execute('DROP DATABASE %s' % SCRATCH_DB)
    root.close()
    check(not missed, 'self-test: the comparison reports each planted change (%s)'
          % ', '.join(p[0] for p in plants), '\n'.join(missed))


def refresh(args):
    version = default_version(args.repo)
    names, wrong = installed_scripts_match(args.repo)
    if wrong:
        print('refusing: %s; run make install first' % '; '.join(wrong))
        return 1
    conn = fresh_database(args, DB)
    major = server_major(conn)
    got = describe(conn)
    conn.close()
    path = snapshot_path(args.repo, version)
    if os.path.isfile(path):
        _, want = read_snapshot(path)
        if want == got:
            print('test/release/objects-%s.txt is current (%d lines)' % (version, len(got)))
            return 0
        if not args.force:
            print('refusing: test/release/objects-%s.txt exists and differs from a fresh install; version %s '
                  'was released with it. Add an update script and bump the version instead '
                  '(--force only for a change of the snapshot format).' % (version, version))
            for l in differences(want, got)[:40]:
                print('  ' + l)
            return 1
    with open(path, 'w', encoding='utf-8') as f:
        f.write('\n'.join(header(version, major) + got) + '\n')
    print('wrote test/release/objects-%s.txt (%d object properties); commit it with the new version' % (
        version, len(got)))
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('mode', choices=['compare', 'refresh'])
    ap.add_argument('--host', default='127.0.0.1')
    ap.add_argument('--port', type=int, required=True)
    ap.add_argument('--repo', required=True)
    ap.add_argument('--force', action='store_true')
    args = ap.parse_args()
    args.repo = os.path.abspath(args.repo)
    if args.mode == 'refresh':
        return refresh(args)
    try:
        compare(args)
    except (psycopg2.Error, OSError) as e:
        check(False, 'the comparison ran (%s: %s)' % (type(e).__name__, str(e).strip()[:400]))
    print('RELEASE-RESULT passed=%d failed=%d' % (passed, failed))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
