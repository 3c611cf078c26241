#!/usr/bin/env python3
"""Write the full text of every query that crashed a backend during one
SQLsmith run (test/sqlsmith/run).

    crashes.py SERVERLOG QUERIES PROGRESS OUTPREFIX

SERVERLOG is the server log of the run, QUERIES SQLsmith's
--dump-all-queries output (each query ends with a line ending in ';'),
PROGRESS its --verbose output (one character per query; 'C' where the
connection was lost).  The postmaster logs a crashed backend's query as
"Failed process was running: ..." cut to 1023 bytes, so the full query is
looked up in QUERIES: the one at a 'C' whose text starts with the logged
prefix (whitespace ignored), else any query that does.  Writes
OUTPREFIX-<n>.sql per crash and prints one line per file.
"""
import re
import sys

serverlog, queries_path, progress_path, outprefix = sys.argv[1:5]

log_line = re.compile(r'^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d')
activities = []
current = None
signal = None
with open(serverlog, errors='replace') as f:
    for line in f:
        if current is not None:
            if log_line.match(line):
                activities.append((signal, ''.join(current)))
                current = None
            else:
                current.append(line)
                continue
        m = re.search(r'LOG:  (server process \(PID \d+\) (was terminated by .*|exited with exit code \d+))', line)
        if m:
            signal = m.group(1)
        m = re.search(r'DETAIL:  Failed process was running: (.*)', line, re.S)
        if m:
            current = [m.group(1)]
if current is not None:
    activities.append((signal, ''.join(current)))

queries = []
text = []
with open(queries_path, errors='replace') as f:
    for line in f:
        text.append(line)
        if line.rstrip('\n').endswith(';'):
            queries.append(''.join(text))
            text = []
progress = ''
with open(progress_path, errors='replace') as f:
    progress = ''.join(l.strip() for l in f if re.fullmatch(r'[.eStC]+\n?', l))
lost_at = {i for i, c in enumerate(progress) if c == 'C'}


def squash(s):
    return re.sub(r'\s+', '', s)


squashed = [squash(q) for q in queries]
for n, (signal, activity) in enumerate(activities, 1):
    prefix = squash(activity)
    # the logged text is cut at 1023 bytes; compare a little less
    prefix = prefix[:900]
    found = [i for i, q in enumerate(squashed) if prefix and q.startswith(prefix)]
    at_c = [i for i in found if i in lost_at]
    pick = (at_c or found or [None])[0]
    if pick is not None:
        body = queries[pick]
        where = f'query {pick + 1} of the run'
    else:
        body = activity.rstrip('\n') + '\n;\n'
        where = 'not found in the dump; the text the postmaster logged (at most 1023 bytes)'
    path = f'{outprefix}-{n}.sql'
    with open(path, 'w') as out:
        out.write(f'-- crashed a backend: {signal or "?"}\n-- {where}\n')
        out.write(body if body.endswith('\n') else body + '\n')
    first = ' '.join(body.split())[:160]
    print(f'{path}: {first}')
