#!/usr/bin/env python3
"""Compare the results of two runs of PostgreSQL's regression schedule, test
file by test file, for test/suites/12-pg-regress.

    compare.py [--accepted=EXPECTED_DIR] SCHEDULE REFERENCE_RESULTS OTHER_RESULTS MODE MAJOR EXPLAINED [DIFFS]
    compare.py --self-test

REFERENCE_RESULTS is results/ of the run without the library (mode plain),
OTHER_RESULTS that of MODE (preload or extension) on the same server.  Every
test the schedule lists is one check: it passes when the two .out files are
identical, or when every line that differs is explained by an entry of the
file EXPLAINED (test/pg-regress/explained-differences: its format is
described there) that applies to MODE, MAJOR and that test.  PostgreSQL's own
expected/ files are never used: they depend on build options, locale and
minor version, while two runs on one server differ only by what the library
does.  The one use of them: with --accepted, a test whose PostgreSQL has
several accepted outputs (EXPECTED_DIR/TEST.out, TEST_1.out, ...: the
isolation suite's fk-deadlock, nowait-4 ... end one way or another by
timing) passes when each run's output is, byte for byte, one of them.
Tests the schedule marks `ignore:` (their output may differ between
any two runs) are compared and shown, never counted.

Prints one line per test (ok / FAIL / ignored), the unexplained lines of
the first failures (a crash fails dozens of tests at once), and last
`compared: N passed, M failed`; DIFFS, if given, gets the unified diff of
every failing test.  Exit status 1 when M > 0.  --self-test plants
differences in made-up results and checks that each is reported (and that
explained ones are not).
"""
import difflib
import os
import re
import sys

SHOW = 40          # unexplained lines shown per failing test
SHOW_TESTS = 8     # failing tests shown with their lines


def schedule_tests(path):
    tests, ignored = [], set()
    with open(path) as f:
        for line in f:
            line = line.split("#")[0].strip()
            if line.startswith("test:"):
                tests.extend(line[5:].split())
            elif line.startswith("ignore:"):
                ignored.update(line[7:].split())
    return tests, ignored


def parse_explained(path):
    """Entries: (modes, majors, tests, [(sign, kind, text)], where)."""
    entries, cur = [], None
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            line = raw.rstrip("\n")
            if line.startswith("#") or not line.strip():
                continue
            m = re.match(r"^\[(.*)\]$", line)
            if m:
                fields = dict(kv.split("=", 1) for kv in m.group(1).split())
                unknown = set(fields) - {"mode", "major", "test"}
                if unknown or "mode" not in fields or "test" not in fields:
                    sys.exit("%s:%d: a header needs mode= and test= (and may have major=)" % (path, n))
                cur = (set(fields["mode"].split(",")),
                       set(fields.get("major", "*").split(",")),
                       set(fields["test"].split(",")), [], "%s:%d" % (path, n))
                entries.append(cur)
                continue
            if cur is None:
                sys.exit("%s:%d: a difference line before any [header]" % (path, n))
            m = re.match(r"^(~?)([-+])(.*)$", line)
            if not m:
                sys.exit("%s:%d: a difference line must start with -, +, ~- or ~+" % (path, n))
            kind, sign, text = m.groups()
            cur[3].append((sign, "regex" if kind else "exact",
                           re.compile(text) if kind else text))
    return entries


def differing_lines(ref, other):
    """The lines only in ref ('-') and only in other ('+'), in diff order."""
    out = []
    sm = difflib.SequenceMatcher(None, ref, other, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            continue
        out.extend(("-", l) for l in ref[i1:i2])
        out.extend(("+", l) for l in other[j1:j2])
    return out


def explain(diff, patterns):
    """Remove from diff the lines the patterns explain; each pattern line
    explains exactly one differing line.  Returns the unexplained ones."""
    left = list(diff)
    for sign, kind, pat in patterns:
        for k, (s, l) in enumerate(left):
            if s == sign and (l == pat if kind == "exact" else pat.fullmatch(l)):
                del left[k]
                break
    return left


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read().split("\n")


def accepted_outputs(expected_dir, test):
    """PostgreSQL's accepted outputs of test when it has more than one."""
    if not expected_dir:
        return []
    paths = [os.path.join(expected_dir, test + ".out")]
    paths += sorted(os.path.join(expected_dir, f) for f in os.listdir(expected_dir)
                    if re.fullmatch(re.escape(test) + r"_[0-9]+\.out", f))
    paths = [p for p in paths if os.path.exists(p)]
    return [read(p) for p in paths] if len(paths) > 1 else []


def compare(schedule, ref_dir, other_dir, mode, major, explained, diffs=None, expected_dir=None):
    tests, ignored = schedule_tests(schedule)
    entries = parse_explained(explained)
    passed = failed = 0
    diff_file = open(diffs, "w") if diffs else None
    for test in tests:
        ref_path = os.path.join(ref_dir, test + ".out")
        other_path = os.path.join(other_dir, test + ".out")
        if not os.path.exists(ref_path):
            problem = ["the reference run has no results/%s.out" % test]
            left = None
        elif not os.path.exists(other_path):
            problem = ["the %s run has no results/%s.out" % (mode, test)]
            left = None
        else:
            problem = []
            diff = differing_lines(read(ref_path), read(other_path))
            patterns = []
            for modes, majors, etests, pats, where in entries:
                if mode in modes and ("*" in majors or major in majors) and test in etests:
                    patterns.extend(pats)
            left = explain(diff, patterns)
            accepted = accepted_outputs(expected_dir, test) if left else []
            if left and read(ref_path) in accepted and read(other_path) in accepted:
                print("ok   %s@%s %s (the runs end differently, each in one of the %d outputs PostgreSQL accepts)"
                      % (mode, major, test, len(accepted)))
                left = []
            elif diff and not left:
                print("ok   %s@%s %s (%d differing lines, all explained)" % (mode, major, test, len(diff)))
            elif not diff:
                print("ok   %s@%s %s" % (mode, major, test))
        if problem or left:
            if test in ignored:
                print("ignored %s@%s %s: differs, and the schedule marks it ignore:" % (mode, major, test))
                continue
            failed += 1
            if problem:
                print("FAIL %s@%s %s: %s" % (mode, major, test, problem[0]))
                continue
            print("FAIL %s@%s %s: %d differing lines not explained in %s%s"
                  % (mode, major, test, len(left), os.path.basename(explained),
                     "; the first:" if failed <= SHOW_TESTS else ""))
            if failed <= SHOW_TESTS:
                for s, l in left[:SHOW]:
                    print("       %s%s" % (s, l))
            if diff_file:
                diff_file.writelines(difflib.unified_diff(
                    [l + "\n" for l in read(ref_path)], [l + "\n" for l in read(other_path)],
                    "plain/" + test + ".out", mode + "/" + test + ".out"))
        elif test in ignored:
            print("       (%s is marked ignore: in the schedule; not counted)" % test)
        else:
            passed += 1
    if diff_file:
        diff_file.close()
    print("compared: %d passed, %d failed" % (passed, failed))
    return passed, failed


def self_test():
    """Made-up results with planted differences: each must be reported,
    the explained ones must not."""
    import contextlib
    import io
    import tempfile
    d = tempfile.mkdtemp()
    ref, other = os.path.join(d, "ref"), os.path.join(d, "other")
    os.makedirs(ref)
    os.makedirs(other)
    base = ["SELECT 1;", " ?column? ", "----------", "        1", "(1 row)", ""]
    cases = {   # test: (its other output, expected verdict)
        "same": (base, "ok"),
        "changed": (base[:3] + ["        2"] + base[4:], "FAIL"),
        "extra": (base + ["NOTICE:  something new"], "FAIL"),
        "missing": (base[:1], "FAIL"),
        "explained": (base[:4] + ["        7", "(2 rows)", ""], "ok"),
        "regex": (base[:3] + ["    16384"] + base[4:], "ok"),
        "twice": (base + ["WARNING:  once", "WARNING:  once"], "FAIL"),
        "otherversion": (base + ["only on 99"], "FAIL"),
        "noresult": (None, "FAIL"),
        "jitter": (base + ["random"], "ignored"),
        "timing": (base[:3] + ["        0"] + base[4:], "ok"),      # TEST_1.out
        "timing2": (base[:3] + ["        9"] + base[4:], "FAIL"),    # neither
    }
    expected = os.path.join(d, "expected")
    os.makedirs(expected)
    for t in ("timing", "timing2"):
        for suffix, lines in (("", base), ("_1", base[:3] + ["        0"] + base[4:])):
            with open(os.path.join(expected, t + suffix + ".out"), "w") as f:
                f.write("\n".join(lines))
    for t, (lines, _) in cases.items():
        with open(os.path.join(ref, t + ".out"), "w") as f:
            f.write("\n".join(base))
        if lines is not None:
            with open(os.path.join(other, t + ".out"), "w") as f:
                f.write("\n".join(lines))
    with open(os.path.join(d, "schedule"), "w") as f:
        f.write("# made up\ntest: " + " ".join(t for t in cases if t != "jitter") + "\nignore: jitter\ntest: jitter\n")
    with open(os.path.join(d, "explained"), "w") as f:
        f.write("# made up\n[mode=extension test=explained]\n+        7\n-(1 row)\n+(2 rows)\n"
                "[mode=extension test=regex,twice major=15]\n~-        1\n~+    [0-9]+\n+WARNING:  once\n"
                "[mode=extension test=otherversion major=99]\n+only on 99\n"
                "[mode=preload test=changed]\n-        1\n+        2\n")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        passed, failed = compare(os.path.join(d, "schedule"), ref, other, "extension", "15",
                                 os.path.join(d, "explained"), os.path.join(d, "diffs"), expected)
    out = buf.getvalue()
    wrong = []
    for t, (_, verdict) in cases.items():
        got = re.search(r"^(ok  |FAIL|ignored) extension@15 %s\b" % t, out, re.M)
        if not got or got.group(1).strip() != verdict:
            wrong.append("%s: expected %s, got %s" % (t, verdict, got.group(1) if got else "nothing"))
    want_failed = sum(v == "FAIL" for _, v in cases.values())
    if (passed, failed) != (len(cases) - 1 - want_failed, want_failed):
        wrong.append("counts %d passed, %d failed" % (passed, failed))
    with open(os.path.join(d, "diffs")) as f:
        if not re.search(r"^-        1\n\+        2\n", f.read(), re.M):
            wrong.append("the diff file does not show the changed line")
    for w in wrong:
        print("self-test: " + w)
    if wrong:
        print(out)
    import shutil
    shutil.rmtree(d)
    print("self-test: %d planted cases, %s" % (len(cases), "all judged right" if not wrong else "%d judged wrong" % len(wrong)))
    return 1 if wrong else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    args, expected_dir = sys.argv[1:], None
    if args and args[0].startswith("--accepted="):
        expected_dir = args.pop(0).split("=", 1)[1]
    passed, failed = compare(*args[:7], expected_dir=expected_dir)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
