#!/usr/bin/python3
"""Run the SQL examples of README.md and docs/**/*.md, and check their links.

Used by test/suites/15-docs.  The convention (see /work/notes/common.md and
docs/testing.md):
  - every fenced block opened with ```sql is executed, every ```sql-error
    block must fail (at least one of its statements raises an error);
    other fences (sh, text, none, ...) are not executed;
  - the blocks of one file run in order in one psql session, in a fresh
    database of their own where CREATE EXTENSION idempotency was already
    run, as a superuser, with ON_ERROR_STOP (psql variables set with \\gset
    carry from one block to the next);
  - files that create roles (CREATE ROLE in a sql block) run first, because
    other pages use those roles; then README.md, then docs/ in name order.
  - every relative link [text](target) or ![alt](target) outside code
    blocks must point to an existing file, and a #fragment to a heading of
    that file (GitHub's anchor rules).
One check per file for its SQL blocks and one per file for its links; a
failure names file:line.

Modes:
  run_docs.py plan --repo DIR       print "file database" lines, and the
                                    database that gets pg_cron
  run_docs.py run --repo DIR --host H --port P
"""

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

FENCE = re.compile(r'^(\s*)(`{3,}|~{3,})\s*([^`\s]*)')
LINK = re.compile(r'!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')

passed = 0
failed = 0


def check(ok, what, detail=''):
    global passed, failed
    passed += bool(ok)
    failed += not ok
    print('%s %s' % ('ok  ' if ok else 'FAIL', what), flush=True)
    if detail and not ok:
        for line in str(detail).rstrip().splitlines():
            print('       ' + line)
    return ok


def doc_files(repo):
    files = ['README.md'] + sorted(os.path.relpath(p, repo) for p in
                                   glob.glob(os.path.join(repo, 'docs', '**', '*.md'), recursive=True))
    return [f for f in files if os.path.isfile(os.path.join(repo, f))]


def parse(path):
    """Return (blocks, prose_lines): blocks are (kind, first_line_no, text)
    for every fenced block; prose_lines are (line_no, line) outside them."""
    blocks, prose = [], []
    fence = None
    with open(path, encoding='utf-8') as f:
        lines = f.read().split('\n')
    for no, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = (m.group(2), m.group(3).lower(), no + 1, [])
            else:
                prose.append((no, line))
        elif m and m.group(2)[0] == fence[0][0] and len(m.group(2)) >= len(fence[0]) and not m.group(3):
            blocks.append((fence[1], fence[2], '\n'.join(fence[3])))
            fence = None
        else:
            fence[3].append(line)
    if fence is not None:
        blocks.append(('unclosed', fence[2] - 1, ''))
    return blocks, prose


def sql_blocks(path):
    return [b for b in parse(path)[0] if b[0] in ('sql', 'sql-error', 'unclosed')]


def database_of(rel):
    name = re.sub(r'^docs/', '', rel.lower()).rsplit('.md', 1)[0]
    return ('docs_' + re.sub(r'[^a-z0-9]+', '_', name).strip('_'))[:63]


def run_order(repo):
    files = doc_files(repo)
    creates_roles = [f for f in files
                     if any(re.search(r'\bCREATE\s+ROLE\b', b[2], re.I) for b in sql_blocks(os.path.join(repo, f)))]
    return creates_roles + [f for f in files if f not in creates_roles]


def cron_database(repo):
    hits = [f for f in doc_files(repo)
            if any(re.search(r'\bCREATE\s+EXTENSION\s+(IF\s+NOT\s+EXISTS\s+)?pg_cron\b', b[2], re.I)
                   for b in sql_blocks(os.path.join(repo, f)))]
    return hits


# --------------------------------------------------------------------------
# SQL


def psql(args, db, *extra, **kw):
    cmd = ['psql', '-X', '-q', '-h', args.host, '-p', str(args.port), '-U', 'postgres', '-d', db] + list(extra)
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def run_file(args, rel, tmp):
    path = os.path.join(args.repo, rel)
    blocks = sql_blocks(path)
    if not blocks:
        return
    db = database_of(rel) + ('_fixture' if args.fixture else '')
    setup = psql(args, 'postgres', '-v', 'ON_ERROR_STOP=1', '-c', 'DROP DATABASE IF EXISTS "%s"' % db,
                 '-c', 'CREATE DATABASE "%s"' % db)
    if setup.returncode == 0:
        setup = psql(args, db, '-v', 'ON_ERROR_STOP=1', '-c', 'CREATE EXTENSION idempotency')
    if setup.returncode != 0:
        check(False, '%s: database %s could not be prepared' % (rel, db), setup.stderr)
        return

    script = os.path.join(tmp, db + '.sql')
    where = {}                          # script line -> doc line
    out = []

    def emit(text, doc_line=None):
        for i, line in enumerate(text.split('\n')):
            out.append(line)
            if doc_line is not None:
                where[len(out)] = doc_line + i

    unclosed = [b for b in blocks if b[0] == 'unclosed']
    if unclosed:
        check(False, '%s:%d: a code block is never closed' % (rel, unclosed[0][1]))
        return
    for kind, line, text in blocks:
        meaningful = [l for l in (re.sub(r'--.*$', '', x).strip() for x in text.split('\n')) if l]
        if meaningful and not (meaningful[-1].endswith(';') or meaningful[-1].startswith('\\')
                               or re.search(r'\\g\w*(\s+\S+)?$', meaningful[-1])):
            check(False, '%s:%d: the block ends inside a statement (no ; after its last statement)'
                  % (rel, line))
            return
    for i, (kind, line, text) in enumerate(blocks):
        emit('\\echo @@BEGIN %d' % i)
        if kind == 'sql-error':
            emit('\\set ON_ERROR_STOP 0')
            emit('\\set LAST_ERROR_SQLSTATE 00000')
        emit(text, line)
        emit(';' if kind == 'sql-error' and not text.rstrip().endswith(';') else '')
        if kind == 'sql-error':
            emit('\\echo @@ERRSTATE %d :LAST_ERROR_SQLSTATE' % i)
            emit('\\set ON_ERROR_STOP 1')
        emit('\\echo @@END %d' % i)
    with open(script, 'w', encoding='utf-8') as f:
        f.write('\n'.join(out) + '\n')

    r = psql(args, db, '-v', 'ON_ERROR_STOP=1', '-f', script, timeout=300)
    ended = set(int(x) for x in re.findall(r'^@@END (\d+)$', r.stdout, re.M))
    errstates = dict((int(a), b) for a, b in re.findall(r'^@@ERRSTATE (\d+) (\S+)$', r.stdout, re.M))
    problems = []
    for i, (kind, line, text) in enumerate(blocks):
        if i not in ended:
            problems.append('%s:%d: this ```%s block failed or did not run' % (rel, line, kind))
            break
        if kind == 'sql-error' and errstates.get(i, '00000') == '00000':
            problems.append('%s:%d: this ```sql-error block ran without an error' % (rel, line))
    if r.returncode != 0 or problems:
        for m in re.finditer(r'^psql:[^:]*:(\d+): (.*)$', r.stderr, re.M):
            n = int(m.group(1))
            doc = where.get(n)
            if doc is None:
                continue
            i = max(k for k, b in enumerate(blocks) if b[1] <= doc)
            if blocks[i][0] == 'sql-error':
                continue                  # expected errors
            problems.append('%s:%d: %s' % (rel, doc, m.group(2)))
        if r.returncode != 0 and not problems:
            problems.append('psql exited %d: %s' % (r.returncode, r.stderr.strip()[-500:]))
    n_err = sum(1 for b in blocks if b[0] == 'sql-error')
    check(not problems, '%s: %d sql blocks run as written (%d of them must fail and do), database %s'
          % (rel, len(blocks), n_err, db), '\n'.join(problems))


# --------------------------------------------------------------------------
# links


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r'[^\w\- ]', '', s)
    return s.replace(' ', '-')


def anchors(path):
    seen = {}
    result = set()
    for _, line in parse(path)[1]:
        m = re.match(r'^#{1,6}\s+(.*?)\s*#*\s*$', line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else '%s-%d' % (base, n))
    return result


def check_links(args, rel):
    path = os.path.join(args.repo, rel)
    problems = []
    count = 0
    for no, line in parse(path)[1]:
        line = re.sub(r'`[^`]*`', '', line)          # code spans are not links
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r'^[a-z][a-z0-9+.-]*:', target, re.I):
                continue                               # http:, https:, mailto:
            count += 1
            file_part, _, frag = target.partition('#')
            dest = path if not file_part else os.path.normpath(os.path.join(os.path.dirname(path), file_part))
            if not os.path.exists(dest):
                problems.append('%s:%d: %s: no such file' % (rel, no, target))
            elif frag and dest.endswith('.md') and frag not in anchors(dest):
                problems.append('%s:%d: %s: no heading with that anchor in %s'
                                % (rel, no, target, os.path.relpath(dest, args.repo)))
    check(not problems, '%s: %d relative links point to existing files and headings' % (rel, count),
          '\n'.join(problems))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('mode', choices=['plan', 'run'])
    ap.add_argument('--repo', required=True)
    ap.add_argument('--host', default='127.0.0.1')
    ap.add_argument('--port', type=int)
    ap.add_argument('--fixture', action='store_true',
                    help='the self-test: skip the README checks, number the databases apart')
    args = ap.parse_args()
    args.repo = os.path.abspath(args.repo)

    if args.mode == 'plan':
        cron = cron_database(args.repo)
        if len(cron) > 1:
            print('error: CREATE EXTENSION pg_cron appears in more than one file: %s' % ', '.join(cron))
            return 1
        print(database_of(cron[0]) if cron else 'postgres')
        return 0

    if args.fixture:
        return run_all(args)
    readme = os.path.join(args.repo, 'README.md')
    with open(readme, encoding='utf-8') as f:
        n_lines = len(f.read().rstrip('\n').split('\n'))
    check(n_lines <= 400, 'README.md has at most 400 lines (%d)' % n_lines)
    sh = '\n'.join(b[2] for b in parse(readme)[0] if b[0] in ('sh', 'bash', 'shell'))
    check(re.search(r'^examples/demo\.sh\b', sh, re.M) and re.search(r'^test/run-all\b', sh, re.M),
          'README.md gives the two quick-start commands (examples/demo.sh, test/run-all)')

    check_sqlstates(args)
    result = run_all(args)
    selftest(args)
    print('DOCS-RESULT passed=%d failed=%d' % (passed, failed))
    return 1 if failed else result


def check_sqlstates(args):
    """docs/reference.md's SQLSTATE table lists exactly the codes of
    test/fuzz/sqlstates.txt, the list the fuzz suite checks every error
    against."""
    ref = os.path.join(args.repo, 'docs', 'reference.md')
    listed = os.path.join(args.repo, 'test', 'fuzz', 'sqlstates.txt')
    if not (os.path.exists(ref) and os.path.exists(listed)):
        check(False, 'docs/reference.md and test/fuzz/sqlstates.txt exist')
        return
    with open(ref, encoding='utf-8') as f:
        text = f.read()
    section = text.split('## Errors', 1)[1].split('\n## ', 1)[0] if '## Errors' in text else ''
    documented = set(re.findall(r'^\| `([0-9A-Z]{5})` \|', section, re.M))
    with open(listed, encoding='utf-8') as f:
        fuzz = {l.split('\t', 1)[0] for l in f if l.strip() and not l.startswith('#')}
    check(documented and documented == fuzz,
          'docs/reference.md lists the %d SQLSTATEs of test/fuzz/sqlstates.txt, no more, no fewer' % len(fuzz),
          'only in the docs: %s; only in sqlstates.txt: %s' % (sorted(documented - fuzz), sorted(fuzz - documented)))


def run_all(args):
    with tempfile.TemporaryDirectory() as tmp:
        for rel in run_order(args.repo):
            run_file(args, rel, tmp)
    for rel in doc_files(args.repo):
        check_links(args, rel)
    return 1 if failed else 0


def selftest(args):
    """The checker itself can fail: run it on test/docs/fixture, where every
    block and link is wrong on purpose, and expect each to be reported."""
    fixture = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fixture')
    r = subprocess.run([sys.executable, os.path.abspath(__file__), 'run', '--fixture', '--repo', fixture,
                        '--host', args.host, '--port', str(args.port)], capture_output=True, text=True)
    expected = [
        r'README\.md:7: ERROR:\s+column "no_such_column" does not exist',
        r'docs/error\.md:4: this ```sql-error block ran without an error',
        r'README\.md:10: docs/missing\.md: no such file',
        r'README\.md:10: docs/page\.md#no-such-heading: no heading with that anchor',
        r'docs/page\.md:4: the block ends inside a statement',
    ]
    missing = [e for e in expected if not re.search(e, r.stdout)]
    wrongly_ok = re.findall(r'^ok  .*', r.stdout, re.M)
    check(not missing and wrongly_ok == ['ok   docs/error.md: 0 relative links point to existing files and headings',
                                         'ok   docs/page.md: 1 relative links point to existing files and headings'],
          'self-test: on test/docs/fixture the checker reports a failing block, an sql-error block '
          'that succeeds, an unterminated block, a missing file and a missing heading (and nothing else)',
          'missing reports: %s\noutput:\n%s' % (missing, r.stdout + r.stderr))


if __name__ == '__main__':
    sys.exit(main())
