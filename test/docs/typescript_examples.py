#!/usr/bin/python3
"""Compile the TypeScript examples of the docs: every fenced block opened
with ```ts (or ```typescript) of the given Markdown files, each block a
module of its own, with `tsc --noEmit --strict` twice: as CommonJS
(`--module commonjs --moduleResolution node`, a .ts file) and as an ES
module (`--module nodenext`, a .mts file), so that both type entries of a
package (index.d.ts, index.d.mts) are checked.  The packages the examples
import come from a node_modules directory given by the caller, which also
holds typescript.

A block that does not compile is reported with its file:line and tsc's
messages (their line numbers are the block's own, from 1).  A Markdown file
with no ```ts block fails: the caller names the files that have them.

Used by test/suites/77-node for docs/powertools.md (where npm has installed
@aws-lambda-powertools/idempotency, pg and typescript); the docs suite
(15-docs) runs the SQL blocks of the same page.

    typescript_examples.py --repo DIR --node-modules DIR FILE.md...
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

FENCE = re.compile(r'^(\s*)(`{3,}|~{3,})\s*([^`\s]*)')
TS_KINDS = ('ts', 'typescript')


def ts_blocks(path):
    """(first line number, text) of every ```ts block of path."""
    blocks, fence = [], None
    with open(path, encoding='utf-8') as f:
        lines = f.read().split('\n')
    for no, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = (m.group(2), m.group(3).lower(), no + 1, [])
        elif m and m.group(2)[0] == fence[0][0] and len(m.group(2)) >= len(fence[0]) and not m.group(3):
            if fence[1] in TS_KINDS:
                blocks.append((fence[2], '\n'.join(fence[3])))
            fence = None
        else:
            fence[3].append(line)
    return blocks


def compile_modules(work, node_modules, sources, esm):
    """tsc over sources ({name: text}, each a module of its own) in one run; {name: its messages}
    for those that do not compile (tsc names the file on each message)."""
    files = []
    for name, text in sources.items():
        files.append(name + ('.mts' if esm else '.ts'))
        with open(os.path.join(work, files[-1]), 'w', encoding='utf-8') as f:
            f.write(text + '\n')
    module = ['--module', 'nodenext', '--moduleResolution', 'nodenext'] if esm else \
        ['--module', 'commonjs', '--moduleResolution', 'node']
    out = subprocess.run([os.path.join(node_modules, 'typescript', 'bin', 'tsc'), '--noEmit', '--strict',
                          '--target', 'es2022', '--pretty', 'false', *module, *files],
                         cwd=work, capture_output=True, text=True, timeout=600)
    messages = {}
    for line in (out.stdout + out.stderr).splitlines():
        source = line.split('(', 1)[0]
        name = source.rsplit('.', 1)[0] if source in files else None
        messages.setdefault(name, []).append(line)
    if out.returncode != 0 and not messages:
        messages[None] = ['tsc exited %d' % out.returncode]
    return {name: '\n'.join(lines) for name, lines in messages.items()}


def check_files(check, repo, node_modules, files, extra=None):
    """One check per file: its ```ts blocks compile both ways.  extra ({name: text}) is compiled in
    the same runs (a module that must not compile, say); returns {esm: {name: messages}} for the
    caller to judge it."""
    work = tempfile.mkdtemp(prefix='idem-ts-examples-')
    results = {}
    try:
        os.symlink(os.path.abspath(node_modules), os.path.join(work, 'node_modules'))
        sources, where = dict(extra or {}), {}
        for rel in files:
            for line, text in ts_blocks(os.path.join(repo, rel)):
                name = 'example_%d' % len(where)
                sources[name] = text
                where[name] = (rel, line)
        for esm in (False, True):
            results[esm] = compile_modules(work, node_modules, sources, esm)
        for rel in files:
            names = [n for n, (r, _) in where.items() if r == rel]
            problems = ['%s:%d: this ```ts block does not compile as %s:\n%s'
                        % (rel, where[n][1], 'an ES module' if esm else 'CommonJS', results[esm][n][-1500:])
                        for esm in (False, True) for n in names if n in results[esm]]
            problems += ['tsc: %s' % results[esm][None][-1500:] for esm in (False, True) if None in results[esm]]
            check(names and not problems, '%s: %d TypeScript blocks compile with tsc --strict, as CommonJS and as ES'
                  ' modules' % (rel, len(names)), '\n'.join(problems) or 'no ```ts block')
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--repo', required=True)
    ap.add_argument('--node-modules', required=True)
    ap.add_argument('files', nargs='+')
    args = ap.parse_args()
    failed = []

    def check(ok, what, detail=''):
        print('%s %s' % ('ok  ' if ok else 'FAIL', what), flush=True)
        if not ok:
            failed.append(what)
            for line in str(detail).rstrip().splitlines():
                print('       ' + line)
        return ok

    check_files(check, args.repo, args.node_modules, args.files)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
