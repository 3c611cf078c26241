#!/usr/bin/env python3
"""The layers of src/, checked from the build.

Every object file src/X.o is given one layer below (the only place the
layers are written down; docs/design.md draws the same map).  A file may
call only files of a lower layer: an undefined symbol of X.o that another
object defines is a call from X to that file.  The check fails on a call to
a file of the same or a higher layer and on any cycle, and names the
symbols.  The includes show the same: each file's functions are declared
in its own header (src/Y.h for src/Y.c), so a file that calls Y must
include Y.h, and a file or header may include only headers of lower layers
(and the shared ones: idempotency.h, compat.h, citus_compat.h).  Hooks PostgreSQL calls back (executor, utility, planner,
transaction callbacks) are entry points: the files that install them sit
where their callers put them.

  test/layers/check.py [SRC_DIR]          check SRC_DIR (default src) *.o
  test/layers/check.py --self-test        plant an upward call and a cycle in
                                          a scratch copy; each must be reported
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

# Higher calls lower.  8: module entry; 7: the hooks, idem_claim_many and
# the sweeper worker; 6: the other SQL-callable functions and the sweep;
# 5: held claims; 4: the statements of one key and the sweep statements
# (a fresh claim's sweep of its neighbours too);
# 3: attaching the table and running a statement (SPI); 2: the direct read
# and Citus (its catalogs, the tenant's shard); 1 and 0: the statement
# catalogue, key locks, tokens, table shape, statistics, argument checks,
# settings, subtransactions, record values.
LAYERS = {
    "module": 8,
    "hooks": 7, "claim_many": 7, "launcher": 7, "database_sweeper": 7,
    "claim": 6, "settle": 6, "lookup": 6, "sweep": 6, "child_key": 6, "metrics": 6,
    "update_guard": 6,
    "held": 5,
    "store": 4, "store_sweep": 4, "store_direct": 4, "claim_sweep": 4,
    "store_attach": 3,
    "direct_read": 2, "citus": 2, "shard_route": 2,
    "statements": 1, "keylock": 1, "tokens": 1, "table_shape": 1, "stats": 1, "validate": 1,
    "privilege_check": 1,
    "guc": 0, "subxact": 0, "record": 0,
}


def symbols(obj, *flags):
    out = subprocess.run(["nm", *flags, obj], capture_output=True, text=True, check=True).stdout
    return [line.split()[-1] for line in out.splitlines() if line.strip()]


def call_graph(src):
    objs = sorted(glob.glob(os.path.join(src, "*.o")))
    if not objs:
        raise SystemExit(f"no object files in {src}: build first (make)")
    defined = {}
    for obj in objs:
        for sym in symbols(obj, "-g", "--defined-only"):
            defined[sym] = os.path.basename(obj)[:-2]
    edges = {}
    for obj in objs:
        name = os.path.basename(obj)[:-2]
        for sym in symbols(obj, "-u"):
            target = defined.get(sym)
            if target and target != name:
                edges.setdefault((name, target), []).append(sym)
    return [os.path.basename(o)[:-2] for o in objs], edges


def cycles(names, edges):
    """Strongly connected components of more than one file (Tarjan)."""
    succ = {n: [b for (a, b) in edges if a == n] for n in names}
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for n in names:
        if n not in index:
            visit(n)
    return found


# headers every layer may include: not any one file's functions
SHARED_HEADERS = {"idempotency", "compat", "citus_compat"}


def includes(path):
    """The src/ headers that path includes, by module name."""
    with open(path) as f:
        return re.findall(r'^#include "(\w+)\.h"', f.read(), flags=re.M)


def include_problems(src, edges):
    found = []
    headers = {os.path.basename(h)[:-2] for h in glob.glob(os.path.join(src, "*.h"))}
    for path in sorted(glob.glob(os.path.join(src, "*.[ch]"))):
        name, kind = os.path.basename(path)[:-2], path[-1]
        if name not in LAYERS or (kind == "h" and name in SHARED_HEADERS):
            continue
        for h in includes(path):
            if h == name or h in SHARED_HEADERS or h not in LAYERS:
                continue
            if LAYERS[h] >= LAYERS[name]:
                found.append(f"include not downward: src/{name}.{kind} (layer {LAYERS[name]}) "
                             f"includes src/{h}.h (layer {LAYERS[h]})")
    for (a, b), syms in sorted(edges.items()):
        path = os.path.join(src, a + ".c")
        if b in headers and b not in SHARED_HEADERS and os.path.exists(path) and \
                b not in includes(path):
            found.append(f"call without include: src/{a}.c calls src/{b}.c "
                         f"({', '.join(sorted(set(syms)))}) but does not include src/{b}.h")
    return found


def problems(src):
    names, edges = call_graph(src)
    found = include_problems(src, edges)
    for n in names:
        if n not in LAYERS:
            found.append(f"src/{n}.c has no layer: give it one in test/layers/check.py and docs/design.md")
    for n in LAYERS:
        if n not in names:
            found.append(f"src/{n}.c is listed in test/layers/check.py but was not built")
    for (a, b), syms in sorted(edges.items()):
        if a in LAYERS and b in LAYERS and LAYERS[a] <= LAYERS[b]:
            found.append(f"call not downward: src/{a}.c (layer {LAYERS[a]}) -> src/{b}.c "
                         f"(layer {LAYERS[b]}): {', '.join(sorted(set(syms)))}")
    for comp in cycles(names, edges):
        found.append("cycle: " + " <-> ".join(f"src/{c}.c" for c in comp))
    return names, edges, found


def check(src):
    names, edges, found = problems(src)
    for p in found:
        print("FAIL", p)
    if not found:
        print(f"ok   {len(names)} files, {len(edges)} calls between them, all downward, no cycle;"
              " each call's header included, every include downward")
    return not found


PLANTS = {
    "upward call": {"guc.c": "\n#include \"claim.h\"\nextern void idem_planted_up(void);\n"
                             "void idem_planted_up(void)\n"
                             "{\n\tidem_claim_one(NULL, NULL, NULL);\n}\n"},
    "upward include": {"guc.c": "\n#include \"held.h\"\n"},
    "cycle": {"record.c": "\nextern void idem_planted_a(void);\nextern void idem_planted_b(void);\n"
                          "void idem_planted_a(void)\n{\n\tidem_planted_b();\n}\n",
              "subxact.c": "\nextern void idem_planted_a(void);\nextern void idem_planted_b(void);\n"
                           "void idem_planted_b(void)\n{\n\tidem_planted_a();\n}\n"},
}


def self_test(repo):
    ok = True
    for what, plant in PLANTS.items():
        with tempfile.TemporaryDirectory(prefix="idem-layers-") as scratch:
            for part in ("Makefile", "src"):
                src = os.path.join(repo, part)
                (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, os.path.join(scratch, part))
            for f in glob.glob(os.path.join(repo, "*.control")):
                shutil.copy(f, scratch)
            for f, code in plant.items():
                with open(os.path.join(scratch, "src", f), "a") as out:
                    out.write(code)
            objs = [f"src/{f[:-2]}.o" for f in plant]
            build = subprocess.run(["make", "-s", "with_llvm=no", *objs], cwd=scratch,
                                   capture_output=True, text=True)
            if build.returncode != 0:
                print(f"FAIL self-test ({what}): the planted file does not compile:\n{build.stderr}")
                ok = False
                continue
            _, _, found = problems(os.path.join(scratch, "src"))
            expect = {"cycle": "cycle:", "upward include": "include not downward:"}.get(
                what, "call not downward:")
            if any(p.startswith(expect) for p in found):
                print(f"ok   self-test: a planted {what} is reported")
            else:
                print(f"FAIL self-test: a planted {what} is not reported")
                ok = False
    return ok


if __name__ == "__main__":
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(0 if self_test(repo) else 1)
    sys.exit(0 if check(sys.argv[1] if len(sys.argv) > 1 else os.path.join(repo, "src")) else 1)
