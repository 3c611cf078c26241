#!/usr/bin/env python3
"""src/citus_compat.h held against an installed Citus.

citus_compat.h copies names and numbers of Citus's internals (enum values,
lock tag layouts, symbol names looked up in its library, catalog columns).
This compares each with the Citus installed into a PostgreSQL: the headers
Citus installs under includedir-server/distributed and the dynamic symbols
of its library.  The catalog columns and the version are compared by
test/suites/90-citus (case v), which has a server to ask.

  test/citus/compat_check.py [--pg-config PG_CONFIG] [--header FILE]

Prints "ok ..." or "FAIL ..." a line; exit status 1 on any FAIL.  Used as a
module by 90-citus.
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = os.path.normpath(os.path.join(HERE, "..", "..", "src", "citus_compat.h"))

# our name -> (Citus header under distributed/, enum type, Citus's enumerator)
ENUM_VALUES = {
    "CITUS_LOCAL_EXECUTION_REQUIRED": ("local_executor.h", "LocalExecutionStatus",
                                       "LOCAL_EXECUTION_REQUIRED"),
    "CITUS_LOCAL_EXECUTION_OPTIONAL": ("local_executor.h", "LocalExecutionStatus",
                                       "LOCAL_EXECUTION_OPTIONAL"),
    "CITUS_LOCAL_EXECUTION_DISABLED": ("local_executor.h", "LocalExecutionStatus",
                                       "LOCAL_EXECUTION_DISABLED"),
    "CITUS_LOCKTAG_SHARD_METADATA": ("resource_lock.h", "AdvisoryLocktagClass",
                                     "ADV_LOCKTAG_CLASS_CITUS_SHARD_METADATA"),
    "CITUS_LOCKTAG_COLOCATED_SHARDS_METADATA": ("resource_lock.h", "AdvisoryLocktagClass",
                                                "ADV_LOCKTAG_CLASS_CITUS_COLOCATED_SHARDS_METADATA"),
}

# our lock tag macro -> Citus's (resource_lock.h), the same but for the class names
LOCKTAG_MACROS = {
    "CITUS_SET_LOCKTAG_SHARD_METADATA": "SET_LOCKTAG_SHARD_METADATA_RESOURCE",
    "CITUS_SET_LOCKTAG_COLOCATED_SHARDS_METADATA": "SET_LOCKTAG_COLOCATED_SHARDS_METADATA_RESOURCE",
}

# our symbol name -> the declaration Citus's header must have (local_executor.h)
SYMBOLS = {
    "CITUS_GET_LOCAL_EXECUTION_STATUS_SYMBOL":
        r"\bLocalExecutionStatus\s+{symbol}\s*\(\s*void\s*\)",
    "CITUS_SET_LOCAL_EXECUTION_STATUS_SYMBOL":
        r"\bvoid\s+{symbol}\s*\(\s*LocalExecutionStatus\b",
}


def strip_comments(text):
    return re.sub(r"/\*.*?\*/", " ", text, flags=re.S)


def macros(text):
    """#define NAME[(params)] body, continuation lines joined: name -> (params, body)."""
    out = {}
    text = strip_comments(text).replace("\\\n", " ")
    for m in re.finditer(r"^#define\s+(\w+)(\([^)]*\))?[ \t]*(.*)$", text, flags=re.M):
        out[m.group(1)] = (m.group(2) or "", m.group(3).strip())
    return out


def enum_values(text, enum):
    """The enumerators of typedef enum ENUM { ... } with their values."""
    m = re.search(r"typedef\s+enum\s+%s\s*\{(.*?)\}" % re.escape(enum), strip_comments(text), re.S)
    if not m:
        return None
    values, nxt = {}, 0
    for item in (i.strip() for i in m.group(1).split(",")):
        if not item:
            continue
        name, _, value = (p.strip() for p in item.partition("="))
        nxt = int(value, 0) if value else nxt
        values[name] = nxt
        nxt += 1
    return values


def squeeze(s):
    return re.sub(r"\s+", "", s)


def pg_config(pg_config_bin, what):
    return subprocess.check_output([pg_config_bin, what], text=True).strip()


def problems(pg_config_bin="pg_config", header=HEADER):
    """[(ok, what, detail)] for every value of header against the installed Citus."""
    ours = macros(open(header).read())
    include = os.path.join(pg_config(pg_config_bin, "--includedir-server"), "distributed")
    results = []
    texts = {}
    for f in ("local_executor.h", "resource_lock.h"):
        path = os.path.join(include, f)
        texts[f] = open(path).read() if os.path.exists(path) else None
        results.append((texts[f] is not None, "Citus's header %s is installed" % f, path))

    for name, (f, enum, theirs) in ENUM_VALUES.items():
        got = enum_values(texts[f], enum) if texts[f] else None
        mine = int(ours[name][1]) if name in ours else None
        want = got.get(theirs) if got else None
        results.append((mine is not None and mine == want,
                        "%s = %s, Citus's %s.%s" % (name, mine, enum, theirs),
                        "the installed %s gives %s" % (f, want)))

    citus_macros = macros(texts["resource_lock.h"] or "")
    for name, theirs in LOCKTAG_MACROS.items():
        mine = ours.get(name)
        got = citus_macros.get(theirs)
        same = mine is not None and got is not None and \
            squeeze(mine[0]) == squeeze(got[0]) and \
            squeeze(mine[1]) == squeeze(got[1].replace("ADV_LOCKTAG_CLASS_CITUS_", "CITUS_LOCKTAG_"))
        results.append((same, "%s lays the tag out as Citus's %s" % (name, theirs),
                        "Citus's: %s%s" % got if got else "not in the installed resource_lock.h"))

    lib = os.path.join(pg_config(pg_config_bin, "--pkglibdir"), "citus.so")
    major = int(re.search(r"(\d+)", pg_config(pg_config_bin, "--version")).group(1))
    nm = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True)
    exported = {line.split()[-1] for line in nm.stdout.splitlines() if line.strip()}
    results.append((nm.returncode == 0, "the symbols of %s can be read" % lib, nm.stderr.strip()))
    library = macros(open(header).read()).get("CITUS_LIBRARY", ("", ""))[1]
    results.append((library == '"$libdir/citus"', "CITUS_LIBRARY names Citus's library",
                    library))
    for name, declaration in SYMBOLS.items():
        symbol = ours.get(name, ("", '""'))[1].strip('"')
        declared = bool(symbol and texts["local_executor.h"] and
                        re.search(declaration.replace("{symbol}", re.escape(symbol)),
                                  texts["local_executor.h"]))
        results.append((declared, "%s (%s) is declared in Citus's local_executor.h as used"
                        % (name, symbol), ""))
        # PGXS hides a module's symbols from PostgreSQL 16 on; 15 exports them
        results.append((symbol in exported or major >= 16,
                        ("%s is exported by %s" % (symbol, lib)) if symbol in exported else
                        ("%s is hidden in %s, as builds for PostgreSQL %d hide it"
                         % (symbol, lib, major)),
                        "PostgreSQL %d builds export it, and shard_route.c expects it" % major))
    return results


def main(argv):
    pg_config_bin, header = "pg_config", HEADER
    while argv:
        if argv[0] == "--pg-config":
            pg_config_bin, argv = argv[1], argv[2:]
        elif argv[0] == "--header":
            header, argv = argv[1], argv[2:]
        else:
            sys.exit(__doc__)
    bad = 0
    for ok, what, detail in problems(pg_config_bin, header):
        print("%s %s" % ("ok  " if ok else "FAIL", what))
        if not ok:
            bad += 1
            if detail:
                print("     %s" % detail)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
