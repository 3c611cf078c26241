#!/usr/bin/python3
"""Search-path and CREATE OR REPLACE review of extension SQL (a pgspot stand-in).

pgspot (timescale/pgspot) is not packaged for Debian and PyPI is out of reach
here, so this is the manual check the security guidance asks for, written as
code so that it runs on every test run.  It tokenizes SQL (comments, string
and dollar-quoted literals, quoted identifiers are understood) and reports:

  R1  CREATE OR REPLACE in an install script (CVE-2022-2625: it would adopt an
      object an attacker created first)
  R2  IF NOT EXISTS (same hazard: the object may already belong to someone else)
  R3  SECURITY DEFINER without SET search_path in the same CREATE FUNCTION
  R4  a LANGUAGE sql / plpgsql function without SET search_path (its body is
      parsed at run time with the caller's search_path)
  R5  the script sets search_path itself
  R6  an operator not written OPERATOR(schema.op) (resolved through search_path)
  R7  IN (...), which compares with an unqualified "="
  R8  a simple CASE x WHEN ..., which compares with an unqualified "="
  R9  LIKE / ILIKE / SIMILAR TO / BETWEEN / NULLIF / IS [NOT] DISTINCT FROM
      (operators chosen through search_path)
  R10 a function call that is not schema-qualified
  R11 a relation that is not schema-qualified (FROM, JOIN, INTO, UPDATE, ...)
  R12 @extschema@ (or @extowner@) inside a quoted construct (CVE-2023-39417)
  R13 a GRANT ... TO PUBLIC
  R14 a function the script creates but never revokes from PUBLIC (new
      functions are executable by PUBLIC by default)

Usage: sql_lint.py [--query] FILE...   (exit 1 if anything is found)
  --query: the files hold single statements run by the C code (R6-R11 only)
"""

import os
import re
import sys

OP_CHARS = set('+-*/<>=~!@#%^&|`?')

# Identifiers that may be followed by "(" without being a function call.
NOT_CALLS = {
    'table', 'check', 'key', 'unique', 'array', 'any', 'all', 'some', 'values', 'in',
    'exists', 'on', 'references', 'primary', 'foreign', 'constraint', 'returns',
    'using', 'with', 'as', 'over', 'filter', 'coalesce', 'greatest', 'least', 'row',
    'cast', 'grouping', 'and', 'or', 'not', 'where', 'select', 'from', 'when',
    'then', 'else', 'by', 'into', 'include', 'partition', 'default', 'setof',
    'numeric', 'decimal', 'varchar', 'char', 'character', 'bit', 'varbit', 'time',
    'timestamp', 'timestamptz', 'interval', 'float', 'function', 'procedure',
    'aggregate', 'index', 'view', 'revoke', 'grant', 'execute', 'is', 'distinct',
    'set', 'return', 'returning', 'limit', 'offset', 'join', 'lateral', 'only',
    'conflict', 'do', 'nothing', 'update', 'for', 'skip', 'locked', 'nowait',
    'tablesample', 'generated', 'always', 'stored', 'identity', 'exclude', 'like',
    'type', 'enum', 'range', 'domain', 'sequence', 'owned', 'operator', 'class',
    'family', 'storage', 'language', 'immutable', 'stable', 'volatile', 'strict',
    'parallel', 'cost', 'rows', 'support', 'leakproof', 'security', 'invoker',
    'definer', 'out', 'inout', 'variadic', 'record', 'trigger', 'comment',
}
RELATION_AFTER = {'from', 'join', 'into', 'update', 'table', 'references'}
NOT_RELATIONS = {'only', 'lateral', 'select', 'unnest', 'rows', 'values', 'each', 'public',
                 'function', 'functions', 'if', 'not', 'exists', 'all', 'tables', 'sequences'}


class Tok:
    __slots__ = ('kind', 'text', 'line')

    def __init__(self, kind, text, line):
        self.kind = kind          # ident, qident, string, number, param, op, punct, dollar
        self.text = text
        self.line = line

    @property
    def low(self):
        return self.text.lower()

    def __repr__(self):
        return '%s:%r' % (self.kind, self.text)


def tokenize(sql, findings):
    toks = []
    i = 0
    n = len(sql)
    line = 1
    while i < n:
        c = sql[i]
        if c == '\n':
            line += 1
            i += 1
            continue
        if c.isspace():
            i += 1
            continue
        if c == '\\' and (i == 0 or sql[i - 1] == '\n'):          # psql meta-command line
            j = sql.find('\n', i)
            i = n if j < 0 else j
            continue
        if sql.startswith('--', i):
            j = sql.find('\n', i)
            i = n if j < 0 else j
            continue
        if sql.startswith('/*', i):
            depth = 0
            while i < n:
                if sql.startswith('/*', i):
                    depth += 1
                    i += 2
                elif sql.startswith('*/', i):
                    depth -= 1
                    i += 2
                    if depth == 0:
                        break
                else:
                    line += sql[i] == '\n'
                    i += 1
            continue
        if c == "'" or (c in 'eE' and i + 1 < n and sql[i + 1] == "'"):
            start = i
            esc = c in 'eE'
            i += 2 if esc else 1
            while i < n:
                if esc and sql[i] == '\\':
                    i += 2
                    continue
                if sql[i] == "'":
                    if i + 1 < n and sql[i + 1] == "'":
                        i += 2
                        continue
                    i += 1
                    break
                i += 1
            text = sql[start:i]
            toks.append(Tok('string', text, line))
            line += text.count('\n')
            continue
        if c == '"':
            j = i + 1
            while j < n:
                if sql[j] == '"':
                    if j + 1 < n and sql[j + 1] == '"':
                        j += 2
                        continue
                    break
                j += 1
            toks.append(Tok('qident', sql[i:j + 1], line))
            i = j + 1
            continue
        m = re.match(r'\$([A-Za-z_][A-Za-z0-9_]*)?\$', sql[i:])
        if m:
            tag = m.group(0)
            j = sql.find(tag, i + len(tag))
            j = n if j < 0 else j + len(tag)
            text = sql[i:j]
            toks.append(Tok('dollar', text, line))
            line += text.count('\n')
            i = j
            continue
        m = re.match(r'\$[0-9]+', sql[i:])
        if m:
            toks.append(Tok('param', m.group(0), line))
            i += len(m.group(0))
            continue
        m = re.match(r'@ext(schema|owner)(:[A-Za-z0-9_]+)?@', sql[i:])
        if m:
            toks.append(Tok('ident', m.group(0), line))
            i += len(m.group(0))
            continue
        m = re.match(r'[A-Za-z_\u0080-\uffff][A-Za-z0-9_$\u0080-\uffff]*', sql[i:])
        if m:
            toks.append(Tok('ident', m.group(0), line))
            i += len(m.group(0))
            continue
        m = re.match(r'[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?|\.[0-9]+', sql[i:])
        if m:
            toks.append(Tok('number', m.group(0), line))
            i += len(m.group(0))
            continue
        if sql.startswith('::', i):
            toks.append(Tok('punct', '::', line))
            i += 2
            continue
        if c in OP_CHARS:
            j = i
            while j < n and sql[j] in OP_CHARS and not sql.startswith('--', j) and not sql.startswith('/*', j):
                j += 1
            toks.append(Tok('op', sql[i:j], line))
            i = j
            continue
        toks.append(Tok('punct', c, line))
        i += 1
    return toks


def statements(toks):
    cur = []
    for t in toks:
        if t.kind == 'punct' and t.text == ';':
            if cur:
                yield cur
            cur = []
        else:
            cur.append(t)
    if cur:
        yield cur


def lint(sql, query_mode=False, name='<sql>'):
    findings = []

    def find(rule, tok, what):
        findings.append('%s:%d: %s %s' % (name, tok.line if tok else 0, rule, what))

    toks = tokenize(sql, findings)

    # R12: substitutions inside quoted constructs
    if not query_mode:
        for t in toks:
            if t.kind in ('string', 'qident', 'dollar') and re.search(r'@ext(schema|owner)', t.text):
                find('R12', t, '@extschema@/@extowner@ inside a quoted construct: %s' % t.text[:60])

    created_functions = []
    revoked = set()
    for st in statements(toks):
        words = [t.low for t in st if t.kind == 'ident']
        text = ' '.join(words[:6])
        head = st[0]
        if not query_mode:
            if re.match(r'create (or replace|or  replace)', ' '.join(words[:3])):
                find('R1', head, 'CREATE OR REPLACE: %s' % text)
            for k in range(len(words) - 2):
                if words[k:k + 3] == ['if', 'not', 'exists']:
                    find('R2', head, 'IF NOT EXISTS: %s' % text)
            is_fn = len(words) > 1 and words[0] == 'create' and (
                'function' in words[:5] or 'procedure' in words[:5])
            if is_fn:
                has_path = any(words[k] == 'set' and k + 1 < len(words) and words[k + 1] == 'search_path'
                               for k in range(len(words)))
                if 'definer' in words and not has_path:
                    find('R3', head, 'SECURITY DEFINER without SET search_path: %s' % text)
                lang = words[words.index('language') + 1] if 'language' in words[:-1] else ''
                if lang in ('sql', 'plpgsql') and not has_path:
                    find('R4', head, 'LANGUAGE %s function without SET search_path: %s' % (lang, text))
                # the function's name: first (qualified) identifier after FUNCTION
                idx = next(k for k, t in enumerate(st) if t.low in ('function', 'procedure'))
                fname = st[idx + 1].text
                if idx + 3 < len(st) and st[idx + 2].text == '.':
                    fname = st[idx + 3].text
                created_functions.append((fname.lower(), head))
                continue                     # its parameter list is not an expression
            if words[:1] == ['set'] and 'search_path' in words[:3] or \
                    any(t.kind == 'string' and 'search_path' in t.text for t in st) and \
                    'set_config' in words:
                find('R5', head, 'the script sets search_path: %s' % text)
            if words[:1] == ['grant'] and 'to' in words and 'public' in words[words.index('to') + 1:]:
                find('R13', head, 'GRANT to PUBLIC: %s' % text)
            if words[:1] == ['revoke'] and 'public' in words and 'function' in words:
                for k in range(len(st) - 1):
                    if st[k].kind in ('ident', 'qident') and st[k + 1].text == '(':
                        revoked.add(st[k].text.strip('"').lower())
            if words[:1] in (['revoke'], ['grant'], ['comment']):
                continue                     # no expressions in these
        lint_expressions(st, find, query_mode)

    for fname, tok in created_functions:
        if fname not in revoked:
            find('R14', tok, 'function %s is created but EXECUTE is never revoked from PUBLIC' % fname)
    return findings


def lint_expressions(st, find, query_mode):
    n = len(st)
    in_set = False          # inside UPDATE ... SET a = ..., b = ...
    set_depth = 0
    depth = 0
    with_opts_depth = None  # inside WITH ( name = value ) storage options
    skip_until = -1
    for k, t in enumerate(st):
        prev = st[k - 1] if k else None
        nxt = st[k + 1] if k + 1 < n else None
        if t.text == '(':
            depth += 1
            if prev is not None and prev.low == 'with' and (k < 2 or st[k - 2].low != 'as'):
                with_opts_depth = depth
        elif t.text == ')':
            if with_opts_depth == depth:
                with_opts_depth = None
            depth -= 1
        if t.low == 'set' and t.kind == 'ident':
            in_set, set_depth = True, depth
        elif t.low in ('where', 'from', 'returning') and t.kind == 'ident' and depth == set_depth:
            in_set = False
        if k <= skip_until:
            continue

        # OPERATOR(schema.op): qualified, skip it whole
        if t.low == 'operator' and nxt is not None and nxt.text == '(':
            j = k + 2
            qualified = j + 1 < n and st[j + 1].text == '.'
            while j < n and st[j].text != ')':
                j += 1
            if not qualified:
                find('R6', t, 'OPERATOR() without a schema')
            skip_until = j
            continue

        if t.kind == 'op':
            op = t.text
            if op == '=>':
                continue
            if op == '*' and prev is not None and (prev.text in ('(', ',', '.') or prev.low == 'select') \
                    and nxt is not None and (nxt.text in (')', ',') or nxt.low == 'from'):
                continue                                      # SELECT *, count(*), t.*
            if op in ('-', '+') and nxt is not None and nxt.kind == 'number' and (
                    prev is None or prev.kind in ('op',) or prev.text in ('(', ',', '[')
                    or prev.low in ('default', 'select', 'then', 'else', 'when', 'and', 'or', 'by')):
                continue                                      # a signed number
            if op == '=' and prev is not None and prev.kind in ('ident', 'qident') and k >= 2 and (
                    (in_set and st[k - 2].text in (',',) + ('set',) or st[k - 2].low == 'set')
                    or with_opts_depth is not None):
                continue                                      # assignment / option
            find('R6', t, 'unqualified operator %s' % op)
            continue

        if t.kind != 'ident':
            continue
        low = t.low
        if low == 'in' and nxt is not None and nxt.text == '(':
            find('R7', t, 'IN (...) compares with an unqualified =')
        elif low == 'case' and nxt is not None and nxt.low != 'when':
            find('R8', t, 'simple CASE compares with an unqualified =')
        elif low in ('like', 'ilike', 'similar', 'between', 'nullif'):
            if not (low == 'like' and prev is not None and prev.text == '('):    # CREATE TABLE (LIKE t)
                find('R9', t, '%s resolves its operator through search_path' % low.upper())
        elif low == 'distinct' and prev is not None and prev.low in ('is', 'not') and nxt is not None \
                and nxt.low == 'from':
            find('R9', t, 'IS DISTINCT FROM resolves its operator through search_path')
        elif nxt is not None and nxt.text == '(' and low not in NOT_CALLS and \
                (prev is None or prev.text not in ('.', ')')) and not (prev is not None and prev.low in (
                    'table', 'function', 'procedure', 'index', 'view', 'type', 'constraint', 'references',
                    'as')):
            # (after AS or a closing parenthesis, "name(" is an alias with a column list)
            find('R10', t, 'unqualified function call %s(...)' % t.text)
        elif low in RELATION_AFTER and nxt is not None and nxt.kind in ('ident', 'qident') \
                and nxt.low not in NOT_RELATIONS and nxt.low not in NOT_CALLS:
            after = st[k + 2] if k + 2 < n else None
            if after is None or after.text != '.':
                find('R11', nxt, 'unqualified relation %s after %s' % (nxt.text, low.upper()))


def load_allow(path):
    """Accepted findings: rule <TAB> text the finding contains <TAB> why it is safe."""
    allow = []
    if os.path.exists(path):
        with open(path, encoding='utf-8') as f:
            for line in f:
                if line.strip() and not line.startswith('#'):
                    rule, text, why = line.rstrip('\n').split('\t', 2)
                    allow.append((rule, text, why))
    return allow


def apply_allow(findings, allow):
    kept, allowed = [], []
    for f in findings:
        hit = next((why for rule, text, why in allow if (' %s ' % rule) in f and text in f), None)
        if hit:
            allowed.append('%s  [%s]' % (f, hit))
        else:
            kept.append(f)
    return kept, allowed


def main(argv):
    query_mode = '--query' in argv
    files = [a for a in argv if not a.startswith('--')]
    allow = load_allow(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'lint-allow.txt'))
    total = 0
    for path in files:
        with open(path, encoding='utf-8') as f:
            sql = f.read()
        kept, allowed = apply_allow(lint(sql, query_mode=query_mode, name=path), allow)
        for line in allowed:
            print('allowed: ' + line)
        for line in kept:
            print(line)
        total += len(kept)
    return 1 if total else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
