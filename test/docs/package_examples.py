#!/usr/bin/python3
"""Compile or run every code example of the package READMEs.

Used by test/suites/15-docs, after run_docs.py.  For each fenced block of
integrations/node/README.md, integrations/go/README.md and
integrations/python/README.md, by its language:

  ```js / ```ts   compiled with `tsc --strict --noEmit` (a ```js block with
                  --allowJs --checkJs, as a CommonJS module, the way its
                  require() lines run it) against the package in the tree and
                  @types/express and @types/pg: tsc, the types and the
                  package's dependencies come from `npm ci` of
                  integrations/node's package-lock.json, as 77-node installs
                  them;
  ```go           built with `go build`, then `go vet`, against the package
                  in the tree, offline (vendor-debian.sh, as 79-go): a block
                  is a fragment, so its import block (or, when it has none,
                  the imports of the packages it names), its top-level
                  functions and the rest as the body of a function of its own;
  ```python       run, the blocks of the README in order in one namespace
                  (as a reader runs them one after the other), against this
                  suite's PostgreSQL server with the package from the tree:
                  the consumer example consumes a queue with a duplicate
                  delivery through a real database (each message's charge
                  booked once, every message acknowledged), the FastAPI
                  example's app answers a POST and replays it.  Running
                  catches what compiling cannot: a wrong option name, a
                  decorator that refuses the function, a SQL error.

What a README leaves to its reader (an application's `validate`
middleware, the queue, the message, the authenticated user) is declared
once per language in test/docs/examples/ (context.d.ts, context.go,
context.py), typed as a real application's would be: only those names,
never the package's own, so the check is the README's code as written.
Other fences (sh, text, a go.mod excerpt without a language) are not code
examples and are not run here (79-go runs the README's "A new module,
offline" recipe).

One check per example, named README:line; a failure gives the compiler's or
the interpreter's message at the README's line.  A self-test runs the same
on test/docs/fixture/integrations/*/README.md, where one example per
language is wrong on purpose, and expects each to be reported.

  package_examples.py --repo DIR --host H --port P --scratch DIR
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True          # nothing left in the tree (run_docs.py is imported)
sys.path.insert(0, HERE)
import run_docs  # noqa: E402  (the fence parser the SQL examples use)

LANGUAGES = {'js': 'node', 'javascript': 'node', 'ts': 'node', 'typescript': 'node',
             'go': 'go', 'golang': 'go', 'python': 'python', 'py': 'python'}
PACKAGES = ('node', 'go', 'python')
GO_MODULE = 'github.com/idempotency-pg/idempotency/integrations/go'

passed = 0
failed = 0


def check(ok, what, detail=''):
    global passed, failed
    passed += bool(ok)
    failed += not ok
    print('%s %s' % ('ok  ' if ok else 'FAIL', what), flush=True)
    if detail and not ok:
        for line in str(detail).rstrip().splitlines()[:40]:
            print('       ' + line)
    return ok


class Example:
    def __init__(self, readme, line, fence, text, fixture):
        self.readme, self.line, self.fence, self.text, self.fixture = readme, line, fence, text, fixture
        self.language = LANGUAGES[fence]
        self.name = 'x%s_%d' % ('f' if fixture else '', line)      # a file or function name of its own
        self.problems = []         # 'README:line: message'
        self.ran = False           # the tool got as far as this example

    def where(self, offset):
        """README line of the example's line number offset (1-based)."""
        return '%s:%d' % (self.readme, self.line + offset - 1)


def examples(root, package, fixture):
    rel = 'integrations/%s/README.md' % package
    path = os.path.join(root, rel)
    if not os.path.exists(path):
        return []
    shown = ('test/docs/fixture/' + rel) if fixture else rel
    return [Example(shown, line, kind, text, fixture)
            for kind, line, text in run_docs.parse(path)[0] if kind in LANGUAGES and LANGUAGES[kind] == package]


def run(cmd, **kw):
    kw.setdefault('capture_output', True)
    kw.setdefault('text', True)
    return subprocess.run(cmd, **kw)


# --------------------------------------------------------------------------
# Node.js: tsc --strict


def node_examples(args, blocks):
    package = os.path.join(args.scratch, 'node')
    work = os.path.join(args.scratch, 'node-examples')
    shutil.copytree(os.path.join(args.repo, 'integrations/node'), package,
                    ignore=shutil.ignore_patterns('node_modules', '*.tgz'))
    out = run(['npm', 'ci', '--no-audit', '--no-fund', '--cache', os.path.join(args.scratch, 'npm-cache')],
              cwd=package, timeout=300)
    if not check(out.returncode == 0, 'npm ci of integrations/node/package-lock.json installs tsc, @types/express,'
                 ' @types/pg and the package\'s dependencies', out.stderr[-1500:]):
        return
    os.makedirs(os.path.join(work, 'node_modules'))
    os.symlink(package, os.path.join(work, 'node_modules/idempotency-pg'))
    for dep in os.listdir(os.path.join(package, 'node_modules')):
        if not dep.startswith('.'):
            os.symlink(os.path.join(package, 'node_modules', dep), os.path.join(work, 'node_modules', dep))
    shutil.copy(os.path.join(HERE, 'examples/context.d.ts'), work)
    files = {}
    for b in blocks:
        name = b.name + ('.ts' if b.fence in ('ts', 'typescript') else '.js')
        with open(os.path.join(work, name), 'w') as f:
            f.write(b.text + '\n')
        files[name] = b
    # one module per example (moduleDetection force), CommonJS as its require() lines run it
    config = {'compilerOptions': {'strict': True, 'noEmit': True, 'allowJs': True, 'checkJs': True,
                                  'target': 'es2022', 'module': 'commonjs', 'moduleResolution': 'node',
                                  'moduleDetection': 'force', 'esModuleInterop': True, 'skipLibCheck': True,
                                  'types': ['node']},
              'files': ['context.d.ts'] + sorted(files)}
    with open(os.path.join(work, 'tsconfig.json'), 'w') as f:
        json.dump(config, f, indent=1)
    tsc = os.path.join(package, 'node_modules/.bin/tsc')
    out = run([tsc, '-p', 'tsconfig.json', '--pretty', 'false'], cwd=work, timeout=300)
    seen = 0
    for m in re.finditer(r'^(\S+?)\((\d+),(\d+)\): (error TS\d+: .*)$', out.stdout, re.M):
        b = files.get(m.group(1))
        seen += 1
        if b is None:
            check(False, 'tsc: an error outside the examples (test/docs/examples/context.d.ts?)', m.group(0))
            continue
        b.problems.append('%s: %s' % (b.where(int(m.group(2))), m.group(4)))
    if out.returncode != 0 and not seen:
        check(False, 'tsc ran on the examples', (out.stdout + out.stderr)[-1500:])
        return
    for b in blocks:
        b.ran = True


# --------------------------------------------------------------------------
# Go: go build and go vet, offline

GO_IMPORTS = {'sql': 'database/sql', 'json': 'encoding/json', 'errors': 'errors', 'time': 'time',
              'http': 'net/http', 'log': 'log', 'fmt': 'fmt', 'context': 'context',
              'otel': 'go.opentelemetry.io/otel', 'idempotency': GO_MODULE}


def go_source(b):
    """The example as a Go file of package main: (text, {file line: example line})."""
    lines = b.text.split('\n')
    imports, decls, body = [], [], []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith('import ('):
            j = i
            while j < len(lines) and lines[j].strip() != ')':
                j += 1
            imports.extend((k, lines[k]) for k in range(i, j + 1))
            i = j + 1
        elif line.startswith('import '):
            imports.append((i, line))
            i += 1
        elif re.match(r'^(func|type|var|const) ', line):
            j = i
            if line.rstrip().endswith(('{', '(')):
                while j < len(lines) and not re.match(r'^[})]', lines[j]):
                    j += 1
            decls.extend((k, lines[k]) for k in range(i, min(j, len(lines) - 1) + 1))
            i = j + 1
        else:
            body.append((i, line))
            i += 1
    out, where = ['package main', ''], {}

    def emit(k, text):
        out.append(text)
        if k is not None:
            where[len(out)] = k + 1

    if imports:
        for k, text in imports:
            emit(k, text)
    else:   # a fragment without imports: those of the packages it names
        code = re.sub(r'"(?:[^"\\]|\\.)*"|`[^`]*`|//.*', '', b.text)
        used = sorted(set(re.findall(r'(?<![\w.])(%s)\.[A-Z]' % '|'.join(GO_IMPORTS), code)))
        if used:
            emit(None, 'import (')
            for p in used:
                emit(None, '\t%s"%s"' % ('idempotency ' if p == 'idempotency' else '', GO_IMPORTS[p]))
            emit(None, ')')
    emit(None, '')
    for k, text in decls:
        emit(k, text)
    if any(text.strip() for _, text in body):
        emit(None, 'func %s() {' % b.name)
        declared = []
        for k, text in body:
            emit(k, text)
            m = re.match(r'^([\w, ]+?)\s*:?=\s', text)       # names the fragment declares (used further on)
            if m and ':=' in text:
                declared += [n.strip() for n in m.group(1).split(',') if n.strip() not in ('', '_')]
        for n in dict.fromkeys(declared):
            emit(None, '\t_ = %s' % n)
        emit(None, '}')
    return '\n'.join(out) + '\n', where


def go_env(args):
    env = {**os.environ, 'GOFLAGS': '-mod=vendor', 'GOPROXY': 'off', 'GOSUMDB': 'off', 'GOTOOLCHAIN': 'local',
           'GOPATH': os.path.join(args.scratch, 'gopath'), 'CGO_ENABLED': '0'}
    env.setdefault('GOCACHE', os.path.join(args.scratch, 'go-build'))
    return env


def go_examples(args, blocks):
    if shutil.which('go') is None:
        check(False, 'go is installed (as root: test/lib/ensure-packages $(test/suites/79-go --packages);'
              ' test/run-all runs this suite as root)')
        return
    module = os.path.join(args.scratch, 'go')
    shutil.copytree(os.path.join(args.repo, 'integrations/go'), module,
                    ignore=shutil.ignore_patterns('vendor', 'example'))
    env = go_env(args)
    out = run(['./vendor-debian.sh'], cwd=module, env=env, timeout=300)
    if not check(out.returncode == 0, 'vendor-debian.sh makes vendor/ from /usr/share/gocode (offline)',
                 (out.stdout + out.stderr)[-1500:]):
        return
    files = {}
    for fixture in (False, True):
        group = [b for b in blocks if b.fixture == fixture]
        if not group:
            continue
        pkg = 'docexamples/fixture' if fixture else 'docexamples'
        os.makedirs(os.path.join(module, pkg), exist_ok=True)
        shutil.copy(os.path.join(HERE, 'examples/context.go'), os.path.join(module, pkg))
        for b in group:
            text, where = go_source(b)
            path = os.path.join(pkg, b.name + '.go')
            with open(os.path.join(module, path), 'w') as f:
                f.write(text)
            files[path] = (b, where)

    def collect(output, tool):
        n = 0
        for m in re.finditer(r'^(?:\./)?(docexamples/\S+?\.go):(\d+)(?::\d+)?: (.*)$', output, re.M):
            n += 1
            entry = files.get(m.group(1))
            if entry is None:
                check(False, '%s: an error outside the examples (test/docs/examples/context.go?)' % tool, m.group(0))
                continue
            b, where = entry
            line = where.get(int(m.group(2)))
            b.problems.append('%s: %s: %s' % (b.where(line) if line else '%s:%d (the harness\'s line %s)'
                                                % (b.readme, b.line, m.group(2)), tool, m.group(3)))
        return n

    # each package on its own, so that the fixture's errors do not hide the README's
    for pkg in ('./docexamples', './docexamples/fixture'):
        if not os.path.isdir(os.path.join(module, pkg)):
            continue
        out = run(['go', 'build', '-o', os.devnull, pkg], cwd=module, env=env, timeout=600)
        if collect(out.stderr, 'go build') == 0 and out.returncode != 0:
            check(False, 'go build %s' % pkg, out.stderr[-1500:])
        elif out.returncode == 0:
            out = run(['go', 'vet', pkg], cwd=module, env=env, timeout=600)
            if collect(out.stderr, 'go vet') == 0 and out.returncode != 0:
                check(False, 'go vet %s' % pkg, out.stderr[-1500:])
    for b in blocks:
        b.ran = True


# --------------------------------------------------------------------------
# Python: run them


def python_examples(args, blocks):
    readmes = {}
    for b in blocks:
        readmes.setdefault((b.readme, b.fixture), []).append(b)
    env = {**os.environ, 'PYTHONPATH': os.path.join(args.repo, 'integrations/python/src'),
           'PGHOST': args.host, 'PGPORT': str(args.port), 'PGUSER': 'postgres', 'PGDATABASE': 'postgres'}
    env.pop('PGPASSWORD', None)
    for (readme, fixture), group in readmes.items():
        job = {'examples': [{'name': b.name, 'line': b.line, 'text': b.text} for b in group],
               'repo': args.repo, 'fixture': fixture}
        out = run([sys.executable, os.path.join(HERE, 'examples/context.py')], input=json.dumps(job), env=env,
                  timeout=300)
        results = {}
        for line in out.stdout.splitlines():
            if line.startswith('EXAMPLE '):
                r = json.loads(line[len('EXAMPLE '):])
                results[r['name']] = r
        for b in group:
            r = results.get(b.name)
            if r is None:        # the runner ended before this example: say why at each one
                b.problems.append('%s: did not run: %s' % (b.where(1), (out.stderr or out.stdout)[-800:]))
                b.ran = True
                continue
            b.ran = True
            for line, message in r['problems']:
                b.problems.append('%s: %s' % (b.where(line) if line else b.where(1), message))


# --------------------------------------------------------------------------


TOOL = {'node': 'compiles with tsc --strict (test/docs/examples/context.d.ts)',
        'go': 'builds with go build and go vet (test/docs/examples/context.go)',
        'python': 'runs (test/docs/examples/context.py)'}

# the self-test: test/docs/fixture/integrations/*/README.md, each wrong example and what must be said of it
FIXTURE_EXPECTED = [
    (r'integrations/node/README\.md:7: error TS2339: Property .db. does not exist', 'node: a possibly undefined claim'),
    (r'integrations/go/README\.md:5: go build: unknown field .?TTL.? in struct literal', 'go: an unknown field'),
    (r'integrations/go/README\.md:14: go build: undefined: fmt', 'go: a missing import'),
    (r'integrations/python/README\.md:[67]: TypeError: .*no_such_option', 'python: an option the package does not take'),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--repo', required=True)
    ap.add_argument('--host', default='127.0.0.1')
    ap.add_argument('--port', type=int, required=True)
    ap.add_argument('--scratch', required=True)
    args = ap.parse_args()
    args.repo = os.path.abspath(args.repo)
    fixture_root = os.path.join(HERE, 'fixture')

    found = {p: examples(args.repo, p, False) + examples(fixture_root, p, True) for p in PACKAGES}
    for p in PACKAGES:
        real = [b for b in found[p] if not b.fixture]
        check(real, 'integrations/%s/README.md has code examples to check (%d)' % (p, len(real)))
    for p, runner in (('node', node_examples), ('go', go_examples), ('python', python_examples)):
        if found[p]:
            try:
                runner(args, found[p])
            except Exception as e:       # noqa: BLE001  (reported as a failure, the others still run)
                check(False, '%s examples: the harness ran' % p, repr(e))
    for p in PACKAGES:
        for b in (b for b in found[p] if not b.fixture):
            check(b.ran and not b.problems, '%s:%d: the ```%s example %s' % (b.readme, b.line, b.fence, TOOL[p]),
                  '\n'.join(b.problems))

    # self-test: every wrong example of the fixture is reported, at its line, and nothing else is
    said = '\n'.join(x for p in PACKAGES for b in found[p] if b.fixture for x in b.problems)
    missing = [what for pattern, what in FIXTURE_EXPECTED if not re.search(pattern, said, re.M)]
    clean = [b for p in PACKAGES for b in found[p] if b.fixture and b.ran and not b.problems]
    check(not missing and len(clean) == 3,
          'self-test: on test/docs/fixture/integrations the checker reports a wrong example per language (a'
          ' TypeScript error, an unknown Go field and a missing import, a Python option the package does not take)'
          ' and passes the right one of each',
          'not reported: %s\nreports:\n%s\nclean: %s' % (missing, said, [(b.readme, b.line) for b in clean]))
    print('EXAMPLES-RESULT passed=%d failed=%d' % (passed, failed))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
