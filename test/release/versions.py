#!/usr/bin/python3
"""One version and one licence everywhere a release names them.

Used by test/suites/05-release.  Reads, from the root of a tree:
  idempotency.control   default_version             (the SQL version, e.g. 1.1)
  META.json             version, provides.*.version (the same with a third digit, 1.1.0)
  debian/changelog      the newest entry's version
  CHANGELOG.md          the newest released entry ("## 1.1 — 2026-11-23"), or the version an
                        unreleased entry is for ("## Unreleased (1.4)": SQL objects changed and
                        their update script written, not yet released); a plain
                        "## Unreleased" (library changes only) is skipped
and reports every disagreement.  Also: CHANGELOG.md's releases are dated and
newest first, debian/changelog lists the same releases, every release after
the first has its update script idempotency--<previous>--<version>.sql, and
LICENSE, META.json and debian/copyright name the same licence.

  versions.py [ROOT]              one line per problem; exit 1 if any
  versions.py --self-test [ROOT]  plants each fault in a scratch copy and
                                  fails if one goes unreported
  versions.py --placeholders [ROOT]  lists the placeholder addresses left
"""
import json
import os
import re
import shutil
import sys
import tempfile

PLACEHOLDER = 'to-fill-in.example'
RELEASE_HEADING = re.compile(r'^## (\d+(?:\.\d+){1,2})\s+—\s+(\d{4}-\d{2}-\d{2})\s*$')
UPCOMING_HEADING = re.compile(r'^## Unreleased \((\d+(?:\.\d+){1,2})\)\s*$')
FILES = ('idempotency.control', 'META.json', 'debian/changelog', 'debian/copyright', 'CHANGELOG.md', 'LICENSE')


def norm(v):
    """'1.1' and '1.1.0' are the same version: (1, 1, 0)."""
    parts = [int(x) for x in v.split('.')]
    return tuple(parts + [0] * (3 - len(parts)))


def read(root, rel):
    with open(os.path.join(root, rel), encoding='utf-8') as f:
        return f.read()


def changelog_releases(text):
    """[(version, date)] of CHANGELOG.md's release headings, in file order
    (an upcoming version, "## Unreleased (X.Y)", with the date None), and
    the headings that look like a release but do not parse."""
    releases, bad = [], []
    for line in text.split('\n'):
        if line.startswith('## ') and line.strip() != '## Unreleased':
            m = RELEASE_HEADING.match(line)
            up = UPCOMING_HEADING.match(line)
            if m:
                releases.append((m.group(1), m.group(2)))
            elif up and not releases:
                releases.append((up.group(1), None))
            else:
                bad.append(line)
    return releases, bad


def debian_versions(text):
    return re.findall(r'^idempotency \(([^)]+)\) ', text, re.M)


def problems(root):
    out = []
    try:
        texts = {rel: read(root, rel) for rel in FILES}
    except OSError as e:
        return ['cannot read %s' % e.filename]

    m = re.search(r"^default_version\s*=\s*'([0-9.]+)'", texts['idempotency.control'], re.M)
    if not m:
        return ['idempotency.control has no default_version']
    control = m.group(1)
    versions = {'idempotency.control default_version': control}

    meta = json.loads(texts['META.json'])
    versions['META.json version'] = meta.get('version', '?')
    for ext, p in meta.get('provides', {}).items():
        versions['META.json provides.%s.version' % ext] = p.get('version', '?')

    deb = debian_versions(texts['debian/changelog'])
    if not deb:
        out.append('debian/changelog has no entry')
    else:
        versions["debian/changelog's newest entry"] = deb[0]

    releases, bad = changelog_releases(texts['CHANGELOG.md'])
    for line in bad:
        out.append('CHANGELOG.md: a heading that is neither "## Unreleased", "## Unreleased (X.Y)" (first) nor "## X.Y — YYYY-MM-DD": %s' % line)
    if not releases:
        out.append('CHANGELOG.md has no released entry')
    else:
        versions["CHANGELOG.md's newest release"] = releases[0][0]

    for where, v in versions.items():
        if not re.match(r'^\d+(\.\d+){1,2}$', v) or norm(v) != norm(control):
            out.append('%s is %s, idempotency.control says %s' % (where, v, control))

    # the release history itself
    order = [norm(v) for v, _ in releases]
    if order != sorted(order, reverse=True) or len(set(order)) != len(order):
        out.append('CHANGELOG.md: releases not newest first, or one listed twice: %s'
                   % ', '.join(v for v, _ in releases))
    dates = [d for _, d in releases if d is not None]
    if dates != sorted(dates, reverse=True):
        out.append('CHANGELOG.md: release dates not newest first: %s' % ', '.join(dates))
    if sorted(norm(v) for v in deb) != sorted(order):
        out.append('debian/changelog lists %s, CHANGELOG.md releases %s' % (
            ', '.join(deb), ', '.join(v for v, _ in releases)))
    chain = [v for v, _ in reversed(releases)]
    for previous, version in zip(chain, chain[1:]):
        script = 'idempotency--%s--%s.sql' % (previous, version)
        if not os.path.isfile(os.path.join(root, script)):
            out.append('release %s has no update script %s' % (version, script))
    if chain and not os.path.isfile(os.path.join(root, 'idempotency--%s.sql' % chain[0])):
        out.append('the first release %s has no install script idempotency--%s.sql' % (chain[0], chain[0]))

    # one licence
    if not texts['LICENSE'].startswith('PostgreSQL License'):
        out.append('LICENSE is not the PostgreSQL License')
    if meta.get('license') != 'postgresql':
        out.append("META.json license is %r, LICENSE is the PostgreSQL License ('postgresql')"
                   % meta.get('license'))
    files_star = re.search(r'^Files: \*\n(?:[^\n]+\n)*?License: (\S+)', texts['debian/copyright'], re.M)
    if not files_star or files_star.group(1) != 'PostgreSQL':
        out.append('debian/copyright: "Files: *" is not under "License: PostgreSQL"')
    body = re.search(r'^License: PostgreSQL\n((?: .*\n?)+)', texts['debian/copyright'], re.M)
    licence_words = re.findall(r'[A-Za-z]+', texts['LICENSE'].split('\n', 3)[-1])
    if not body or re.findall(r'[A-Za-z]+', body.group(1)) != licence_words:
        out.append("debian/copyright's License: PostgreSQL paragraph is not LICENSE's text")
    return out


def placeholders(root):
    found = []
    for rel in ('META.json', 'debian/control', 'debian/control.in', 'debian/changelog', 'debian/copyright'):
        path = os.path.join(root, rel)
        if not os.path.isfile(path):
            continue
        for no, line in enumerate(read(root, rel).split('\n'), 1):
            if PLACEHOLDER in line and 'reserved domain' not in line:        # not the notes about it
                found.append('%s:%d' % (rel, no))
    return found


def sub(pattern, repl, count=1):
    def plant(text):
        new = re.sub(pattern, repl, text, count=count, flags=re.M)
        assert new != text, 'the fault %r could not be planted' % pattern
        return new
    return plant


# each fault: (name, file, how to change it)
FAULTS = [
    ('control default_version 9.9', 'idempotency.control', sub(r"^default_version = '[^']*'", "default_version = '9.9'")),
    ('META.json version', 'META.json', sub(r'^   "version": "[^"]*"', '   "version": "9.9.0"')),
    ('META.json provides version', 'META.json', sub(r'^         "version": "[^"]*"', '         "version": "9.9.0"')),
    ('debian/changelog newest entry', 'debian/changelog', sub(r'^idempotency \([^)]*\)', 'idempotency (9.9)')),
    ('CHANGELOG.md newest release', 'CHANGELOG.md', sub(r'^## (\d+\.\d+) —', r'## 9.9 —')),
    ('CHANGELOG.md undated release', 'CHANGELOG.md', sub(r'^(## \d+\.\d+) — \S+', r'\1')),
    ('CHANGELOG.md releases out of order', 'CHANGELOG.md', sub(r'^## 1\.0 — ', '## 1.5 — ')),
    ('CHANGELOG.md upcoming version below a release', 'CHANGELOG.md',
     sub(r'^## 1\.0 — ', '## Unreleased (1.0.1)\n\n## 1.0 — ')),
    ('META.json licence', 'META.json', sub(r'"license": "postgresql"', '"license": "mit"')),
    ('debian/copyright licence', 'debian/copyright', sub(r'^License: PostgreSQL$', 'License: Expat')),
    ('debian/copyright licence text', 'debian/copyright', sub(r'without fee', 'for a fee')),
    ('LICENSE not the PostgreSQL License', 'LICENSE', sub(r'^PostgreSQL License', 'MIT License')),
]


def self_test(root):
    """Copy the files to a scratch tree, plant each fault, expect a report.
    Returns (missed fault names, number of faults)."""
    missed = []
    with tempfile.TemporaryDirectory() as tmp:
        def fresh():
            shutil.rmtree(os.path.join(tmp, 't'), ignore_errors=True)
            t = os.path.join(tmp, 't')
            os.makedirs(os.path.join(t, 'debian'))
            for rel in FILES:
                shutil.copy(os.path.join(root, rel), os.path.join(t, rel))
            for name in os.listdir(root):
                if re.match(r'^idempotency--.*\.sql$', name):
                    shutil.copy(os.path.join(root, name), os.path.join(t, name))
            return t
        t = fresh()
        if problems(t):
            return ['the unchanged scratch copy already has problems: %s' % problems(t)], len(FAULTS)
        for name, rel, plant in FAULTS:
            t = fresh()
            path = os.path.join(t, rel)
            with open(path, encoding='utf-8') as f:
                text = f.read()
            try:
                planted = plant(text)
            except AssertionError as e:
                missed.append('%s (%s)' % (name, e))
                continue
            with open(path, 'w', encoding='utf-8') as f:
                f.write(planted)
            if not problems(t):
                missed.append(name)
        # a release whose update script is missing
        t = fresh()
        scripts = sorted(n for n in os.listdir(t) if re.match(r'^idempotency--[^-]+--[^-]+\.sql$', n))
        if scripts:
            os.remove(os.path.join(t, scripts[-1]))
            if not problems(t):
                missed.append('update script removed')
    return missed, len(FAULTS) + 1


def main(argv):
    args = [a for a in argv if not a.startswith('--')]
    root = os.path.abspath(args[0] if args else '.')
    if '--placeholders' in argv:
        for p in placeholders(root):
            print(p)
        return 0
    if '--self-test' in argv:
        missed, n = self_test(root)
        for name in missed:
            print('self-test: planted fault not reported: %s' % name)
        print('self-test: %d of %d planted faults reported' % (n - len(missed), n))
        return 1 if missed else 0
    found = problems(root)
    for p in found:
        print(p)
    return 1 if found else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
