"""Run one differential case on one side and capture everything it shows.

A side is one database of the throwaway cluster (idempotency.defer_writes on
in one, off in the other) and one autocommit connection to it: every step is
sent as written, so BEGIN/COMMIT in a step are the case's own transaction
control and a step outside them runs as an implicit transaction.

What a side records for a case (its "observation"):
  * per step: success or SQLSTATE + message, column names, rows, row count,
    the command tag, notices and notifications (channel, payload) received;
  * after the case: idempotency_records, the ledger rows that differ from the
    starting data, the audit and inbox tables.
Then normalise() replaces what legitimately differs between two runs: each
distinct token becomes T1, T2, ... in order of appearance, each distinct
timestamp becomes TS1, TS2, ... in order of appearance too (so the first
difference is reported where it happens) and the order of the timestamps'
values is compared at the end (timestamp_order); the side's own two-phase
transaction names become d-SIDE-... in error messages.
"""

import datetime
import io
import json
import re
import threading
import time

import psycopg2
import psycopg2.extensions

# Tokens are the clock in microseconds since 2000 (~8.5e14 today); nothing
# else a case shows is that large.
TOKEN_MIN = 10 ** 14
TOKEN_RE = re.compile(r'(?<![\d.])\d{15,17}(?![\d])')
TS_RE = re.compile(r'\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d(?::?\d\d)?)?')
TOK_REF_RE = re.compile(r'\{tok:([^}]+)\}')
GID_RE = re.compile(r'\{gid(?::(\w+))?\}')

STATE_SQL = """
SELECT json_build_object(
  'records', (SELECT coalesce(json_agg(json_build_array(tenant_id, key, status, token, fingerprint,
                response, lease_expires_at, expires_at, created_at, updated_at, ttl)
                ORDER BY tenant_id, key), '[]') FROM idempotency_records),
  'ledger_count', (SELECT count(*) FROM ledger),
  'ledger_changed', (SELECT coalesce(json_agg(json_build_array(id, amount, note) ORDER BY id), '[]')
                FROM ledger WHERE NOT (id BETWEEN 1 AND %(n)s AND amount = (id * 7919) %% 1000
                                       AND note IS NULL)),
  'audit', (SELECT coalesce(json_agg(json_build_array(n, what, info) ORDER BY n), '[]') FROM audit),
  'inbox', (SELECT coalesce(json_agg(json_build_array(id, tenant, key, amount, outcome, token, seen)
                ORDER BY id), '[]') FROM inbox),
  'outbox', (SELECT coalesce(json_agg(json_build_array(id, key, token) ORDER BY id), '[]') FROM outbox),
  'checked', (SELECT coalesce(json_agg(json_build_array(id, k, k2, seen) ORDER BY id), '[]') FROM checked),
  'orders', (SELECT coalesce(json_agg(json_build_array(id, key, amount) ORDER BY id), '[]') FROM orders),
  'stats', (SELECT json_build_array(claims, claimed, replays, in_progress, mismatches, failed_replays,
                takeovers, completes, releases, heartbeats, swept_stale, swept_expired, sweeps)
                FROM idem_stats WHERE datname = current_database()),
  'gids', (SELECT json_agg(gid) FROM pg_prepared_xacts WHERE gid LIKE 'd-%(side)s-%%'))::text
"""

REC_TRIGGERS = {
    'notify': "CREATE TRIGGER rec_notify AFTER INSERT OR UPDATE OR DELETE ON idempotency_records "
              "FOR EACH ROW EXECUTE FUNCTION rec_notify()",
    'notify_stmt': "CREATE TRIGGER rec_notify_stmt AFTER INSERT OR UPDATE ON idempotency_records "
                   "FOR EACH ROW EXECUTE FUNCTION rec_notify_stmt()",
    'count': "CREATE TRIGGER rec_count_rows AFTER INSERT ON idempotency_records "
             "FOR EACH ROW EXECUTE FUNCTION rec_count_rows()",
    'deferred': "CREATE CONSTRAINT TRIGGER rec_deferred AFTER INSERT OR UPDATE ON idempotency_records "
                "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION rec_deferred()",
    'statement': "CREATE TRIGGER rec_statement AFTER INSERT ON idempotency_records "
                 "REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION rec_statement()",
    'refuse': "CREATE TRIGGER rec_refuse BEFORE INSERT ON idempotency_records "
              "FOR EACH ROW EXECUTE FUNCTION rec_refuse()",
    'shadow': "CREATE TRIGGER rec_shadow_claim AFTER INSERT ON idempotency_records "
              "FOR EACH ROW EXECUTE FUNCTION rec_shadow_claim()",
    'touch': "CREATE TRIGGER rec_touch BEFORE INSERT ON idempotency_records "
             "FOR EACH ROW EXECUTE FUNCTION rec_touch()",
}
REC_TRIGGER_NAMES = {'notify': 'rec_notify', 'notify_stmt': 'rec_notify_stmt', 'count': 'rec_count_rows',
                     'deferred': 'rec_deferred', 'statement': 'rec_statement', 'refuse': 'rec_refuse',
                     'touch': 'rec_touch', 'shadow': 'rec_shadow_claim'}
# how each is removed again (before the next case's TRUNCATE)
REC_TRIGGER_DROPS = {t: 'DROP TRIGGER IF EXISTS %s ON idempotency_records' % n
                     for t, n in REC_TRIGGER_NAMES.items()}
REC_TRIGGERS['fk'] = ('ALTER TABLE orders ADD CONSTRAINT orders_record_fk FOREIGN KEY (tenant, key) '
                      'REFERENCES idempotency_records')
REC_TRIGGER_DROPS['fk'] = 'ALTER TABLE orders DROP CONSTRAINT IF EXISTS orders_record_fk'

# Alterations of idempotency_records made before a case starts (issue 19):
# with any of them the table is no longer exactly as the extension made it,
# so a claim must be written at once on both sides, and whatever was added
# (a CHECK, a unique index, a volatile default, a policy, a collation, ...)
# takes effect the same way.  Each is undone by restore_records_table()
# (schema.sql), which also undoes what another session did to the table in
# a case ('restore': nothing to set up).
ALTERATIONS = {
    'alt_check': "ALTER TABLE idempotency_records ADD CONSTRAINT alt_check CHECK "
                 "(key NOT LIKE '%bad%' AND (response IS NULL OR NOT response ? 'reject'))",
    'alt_unique': 'CREATE UNIQUE INDEX alt_unique ON idempotency_records (tenant_id, fingerprint)',
    'alt_unique_lower': 'CREATE UNIQUE INDEX alt_unique_lower ON idempotency_records (tenant_id, lower(key))',
    'alt_column_count': 'ALTER TABLE idempotency_records ADD COLUMN alt_seen bigint DEFAULT rec_count_all()',
    'alt_column_seq': "SELECT setval('alt_seq', 1, false); "
                      "ALTER TABLE idempotency_records ADD COLUMN alt_n bigint DEFAULT nextval('alt_seq')",
    'alt_default': "ALTER TABLE idempotency_records ALTER COLUMN fingerprint SET DEFAULT 'by-default'",
    'alt_rls': "ALTER TABLE idempotency_records ENABLE ROW LEVEL SECURITY; "
               "CREATE POLICY alt_policy ON idempotency_records USING (key NOT LIKE 'hidden%') "
               "WITH CHECK (key NOT LIKE 'deny%')",
    'alt_tenant_isolation': "SELECT idem_set_tenant_isolation(true, 'app.tenant')",
    # rec_view (schema.sql) names the column: it is made again around the change
    'alt_collation': 'DROP VIEW rec_view; '
                     'ALTER TABLE idempotency_records ALTER COLUMN key TYPE text COLLATE alt_ci; '
                     'CREATE VIEW rec_view AS SELECT tenant_id, key, status, token FROM idempotency_records; '
                     'GRANT SELECT ON rec_view TO diff_app, diff_noinsert',
    'alt_index_collation': 'CREATE INDEX alt_key_ci ON idempotency_records (key COLLATE alt_ci)',
    'alt_partial': "CREATE INDEX alt_partial ON idempotency_records (key) WHERE status = 'processing'",
    'alt_notnull_status': 'ALTER TABLE idempotency_records ALTER COLUMN status DROP NOT NULL',
    'alt_notnull_token': 'ALTER TABLE idempotency_records ALTER COLUMN token DROP NOT NULL',
    'alt_rule': "CREATE RULE alt_rule AS ON INSERT TO idempotency_records DO ALSO "
                "INSERT INTO audit (what, info) VALUES ('rule', NEW.key || ' ' || NEW.status)",
    'alt_child': 'CREATE TABLE alt_child () INHERITS (idempotency_records)',
    # issue 34 (shapes inherited, owner_rights, settle_no_rights): a child
    # holding records, a parent; a non-superuser owner lacking USAGE on the
    # schema or its own rights; an application role without UPDATE or DELETE
    'alt_archive': 'CREATE TABLE alt_archive () INHERITS (idempotency_records)',
    'alt_parent': 'CREATE TABLE alt_parent (LIKE idempotency_records); '
                  'ALTER TABLE idempotency_records INHERIT alt_parent',
    'own_owner': 'ALTER TABLE idempotency_records OWNER TO diff_owner',
    'own_nousage': 'ALTER TABLE idempotency_records OWNER TO diff_owner; '
                   'REVOKE USAGE ON SCHEMA public FROM PUBLIC; '
                   'GRANT USAGE ON SCHEMA public TO diff_app, diff_noinsert',
    'own_noinsert': 'ALTER TABLE idempotency_records OWNER TO diff_owner; '
                    'REVOKE INSERT ON idempotency_records FROM diff_owner',
    'own_noupdate': 'ALTER TABLE idempotency_records OWNER TO diff_owner; '
                    'REVOKE UPDATE, DELETE ON idempotency_records FROM diff_owner',
    'own_noselect': 'ALTER TABLE idempotency_records OWNER TO diff_owner; '
                    'REVOKE SELECT ON idempotency_records FROM diff_owner',
    'app_noupdate': 'REVOKE UPDATE ON idempotency_records FROM diff_app',
    'app_nodelete': 'REVOKE DELETE ON idempotency_records FROM diff_app',
    'app_noupdate_nodelete': 'REVOKE UPDATE, DELETE ON idempotency_records FROM diff_app',
    'restore': 'SELECT restore_records_table()',
}
for _name, _sql in ALTERATIONS.items():
    REC_TRIGGERS[_name] = _sql
    REC_TRIGGER_DROPS[_name] = 'SELECT restore_records_table()'

STATEMENT_TIMEOUT = '10s'
# A step that ignores statement_timeout (issue 34: a probe loop that no
# cancel reaches, which ends only when some other transaction with an XID
# ends) must not hang the run: the watchdog ends a step that has run
# WATCHDOG_SECONDS, or WATCHDOG_SPIN_SECONDS while its backend is seen on the
# CPU without a wait event twice in a row.  It cancels and terminates the
# backend and ends transactions with an XID until the step returns.  The step
# is observed as 'stuck' and the rest of the case is skipped on that side;
# the other side, which did not spin, shows the difference.
WATCHDOG_SECONDS = 12
WATCHDOG_SPIN_SECONDS = 2

# The lock set a case of the lock-set shapes observes after each of its steps
# inside a transaction (schema.sql lock_set()): (locktype, relation, mode,
# count), relations named so that both databases agree (a TOAST table as
# 'toast of TABLE').
LOCKS_SQL = 'SELECT * FROM lock_set()'


class Step:
    """One round trip.  kind: 'sql', 'copy_out' (sorted lines) or 'copy_in' (data)."""

    def __init__(self, sql, kind='sql', data=None, cap=None, peer=False):
        self.sql = sql
        self.kind = kind
        self.data = data
        self.cap = cap          # store the first row's token under this name
        self.peer = peer        # run by the side's second session

    def ordered(self):
        """Does the order of the rows mean anything?  Without ORDER BY it is
        the physical order of a scan, which page pruning (it depends on the
        oldest snapshot in the whole cluster) may change between the sides;
        a cursor's FETCH keeps its order (the cases fetch from tables that
        only had rows inserted), and so does a plan."""
        u = self.sql.upper()
        return 'ORDER BY' in u or u.startswith(('FETCH', 'EXPLAIN'))

    def text(self):
        who = '[session 2] ' if self.peer else ''
        if self.kind == 'copy_in':
            return who + self.sql + ';\n' + self.data + '\\.'
        return who + self.sql + ';'


class Case:
    def __init__(self, seed, num, shape, rows=50, rec_triggers=(), steps=None, note='', observe_locks=False):
        self.seed = seed
        self.observe_locks = observe_locks      # a 'locks' observation after each step in a transaction
        self.num = num
        self.shape = shape
        self.rows = rows
        self.rec_triggers = list(rec_triggers)
        self.steps = steps or []
        self.note = note

    @property
    def cid(self):
        return '%s:%d' % (self.seed, self.num)

    def sql_text(self):
        lines = ['-- case %s, shape %s%s' % (self.cid, self.shape, ' (' + self.note + ')' if self.note else ''),
                 '-- setup: SELECT reset_case(%d);' % self.rows]
        if self.observe_locks:
            lines.append('-- observed after each step in a transaction: %s;' % LOCKS_SQL)
        for t in self.rec_triggers:
            lines.append('-- setup: ' + REC_TRIGGERS[t] + ';')
        lines.append("-- {tok:NAME} is the token this side got earlier for NAME; "
                     "{gid} a two-phase name of this side ('d-DATABASE-SEED-CASE-a')")
        for i, s in enumerate(self.steps):
            lines.append('/* %d */ %s' % (i, s.text()))
        return '\n'.join(lines)


class Watchdog(threading.Thread):
    """Bounds each step's wall-clock time (WATCHDOG_SECONDS, see there): one
    per side, looking once a second at the step in flight."""

    def __init__(self, dsn):
        super().__init__(daemon=True)
        self.dsn = dsn
        self.lock = threading.Lock()
        self.step = None            # [backend pid, start time, fired]
        self.start()

    def begin(self, pid):
        with self.lock:
            self.step = [pid, time.time(), False]

    def end(self):
        """The step returned: did the watchdog have to end it?"""
        with self.lock:
            step, self.step = self.step, None
        return step is not None and step[2]

    def run(self):
        admin = None
        spinning = 0
        while True:
            time.sleep(1)
            with self.lock:
                step = self.step
            if step is None or step[2] or time.time() - step[1] < WATCHDOG_SPIN_SECONDS:
                spinning = 0
                continue
            try:
                if admin is None or admin.closed:
                    admin = psycopg2.connect(self.dsn)
                    admin.autocommit = True
                k = admin.cursor()
                k.execute("SELECT state = 'active' AND wait_event_type IS NULL FROM pg_stat_activity "
                          "WHERE pid = %s", (step[0],))
                row = k.fetchone()
                spinning = spinning + 1 if row and row[0] else 0
                if spinning < 2 and time.time() - step[1] < WATCHDOG_SECONDS:
                    continue
                with self.lock:
                    if self.step is not step:
                        continue
                    step[2] = True
                k.execute('SELECT pg_cancel_backend(%s), pg_terminate_backend(%s)', (step[0], step[0]))
                while self.step is step:
                    k.execute('SELECT txid_current()')
                    time.sleep(0.05)
            except psycopg2.Error:
                admin = None


class Side:
    """One database, its connection and, for the cases that want one, a
    second session (peer) that never waits long (lock_timeout)."""

    def __init__(self, name, dsn, options=None):
        self.name = name
        self.dsn = dsn
        self.options = options
        self.triggers = set()
        self.conn = None
        self.peer = None
        self.watchdog = Watchdog(dsn)
        self.connect()

    def peer_conn(self):
        if self.peer is None or self.peer.closed:
            # as startup options, so that RESET ALL keeps them
            opts = '-c statement_timeout=%s -c lock_timeout=2s %s' % (STATEMENT_TIMEOUT, self.options or '')
            self.peer = psycopg2.connect(self.dsn, options=opts)
            self.peer.autocommit = True
        return self.peer

    def connect(self):
        # a case that would wait for its own second session fails in 5 s
        self.conn = psycopg2.connect(self.dsn, options='-c lock_timeout=5s %s' % (self.options or ''))
        self.conn.autocommit = True
        cur = self.conn.cursor()
        cur.execute("SET statement_timeout = %s", (STATEMENT_TIMEOUT,))
        cur.execute("LISTEN rec; LISTEN inbox; LISTEN app")
        cur.execute("SHOW idempotency.defer_writes")
        self.defer_writes = cur.fetchone()[0]
        cur.close()
        # the first reset drops whatever triggers an earlier run left behind
        self.triggers = set(REC_TRIGGER_DROPS)

    def close(self):
        for c in (self.conn, self.peer):
            try:
                c.close()
            except Exception:
                pass
        self.peer = None

    @property
    def db(self):
        return self.dsn.split('dbname=')[1].split()[0]

    def gid(self, case, tag):
        return 'd-%s-%s-%d-%s' % (self.db, case.seed, case.num, tag or 'a')

    def substitute(self, sql, case, vars_):
        def tok(m):
            v = vars_.get(m.group(1))
            return 'NULL' if v is None else str(v)
        sql = TOK_REF_RE.sub(tok, sql)
        return GID_RE.sub(lambda m: "'%s'" % self.gid(case, m.group(1)), sql)

    def _simple(self, sql):
        cur = self.conn.cursor()
        cur.execute(sql)
        rows = cur.fetchall() if cur.description else None
        cur.close()
        return rows

    def reset(self, case):
        parts = []
        for t in sorted(self.triggers):
            if REC_TRIGGER_DROPS[t] not in parts:      # restore_records_table() once
                parts.append(REC_TRIGGER_DROPS[t])
        parts.append('SELECT reset_case(%d)' % case.rows)
        parts += [REC_TRIGGERS[t] for t in case.rec_triggers]
        self._simple(';\n'.join(parts))
        self.triggers = set(case.rec_triggers)
        del self.conn.notices[:]
        del self.conn.notifies[:]

    def finish(self, case, extra_step=None):
        """End whatever the case left open and read the final state; the
        self-test's extra step runs in between, unobserved."""
        end = ('ROLLBACK; CLOSE ALL; DEALLOCATE ALL; RESET ALL; SET statement_timeout = %r; '
               % STATEMENT_TIMEOUT)
        state_sql = STATE_SQL.replace('%(n)s', str(case.rows)).replace('%%', '%').replace(
            '%(side)s', self.db)
        if self.peer is not None:
            try:
                c = self.peer.cursor()
                c.execute('ROLLBACK; RESET ALL')
                c.close()
                del self.peer.notices[:]        # 'there is no transaction in progress'
            except psycopg2.Error:
                self.peer.close()
                self.peer = None
        try:
            if extra_step is None:
                state = self._simple(end + state_sql)[0][0]
            else:
                self._simple(end)
                self._simple(extra_step.sql)
                state = self._simple(state_sql)[0][0]
        except psycopg2.Error:
            self.close()
            self.connect()
            state = self._simple(state_sql)[0][0]
        state = json.loads(state)
        for g in state.pop('gids') or []:
            self._simple("ROLLBACK PREPARED '%s'" % g)
        del self.conn.notices[:]
        del self.conn.notifies[:]
        return state

    def run_step(self, step, case, vars_):
        sql = self.substitute(step.sql, case, vars_)
        obs = {}
        conn = self.peer_conn() if step.peer else self.conn
        cur = conn.cursor()
        self.watchdog.begin(conn.get_backend_pid())
        try:
            if step.kind == 'copy_out':
                buf = io.StringIO()
                cur.copy_expert(sql, buf)
                obs['copy'] = sorted(buf.getvalue().splitlines())
            elif step.kind == 'copy_in':
                cur.copy_expert(sql, io.StringIO(step.data))
            else:
                cur.execute(sql)
            obs['ok'] = True
            if cur.description is not None and step.kind == 'sql':
                obs['cols'] = [d.name for d in cur.description]
                rows = [list(r) for r in cur.fetchall()]
                if step.cap and 'token' in obs['cols'] and rows:
                    vars_[step.cap] = rows[0][obs['cols'].index('token')]
                if 'key' in obs['cols'] and 'token' in obs['cols']:
                    ki, ti = obs['cols'].index('key'), obs['cols'].index('token')
                    for r in rows:
                        if r[ti] is not None:
                            vars_[r[ki]] = r[ti]
                obs['rows'] = rows
            obs['rowcount'] = cur.rowcount
            obs['tag'] = cur.statusmessage
        except psycopg2.Error as e:
            obs['ok'] = False
            obs['sqlstate'] = e.pgcode
            msg = (e.diag.message_primary if e.diag and e.diag.message_primary else str(e)).strip()
            obs['error'] = msg.replace('d-%s-' % self.db, 'd-SIDE-')
            if conn.closed:
                obs['error'] += ' [connection lost]'
        finally:
            if self.watchdog.end():
                obs['stuck'] = ('ended by the watchdog: over %d s, or %d s on the CPU without a wait'
                                % (WATCHDOG_SECONDS, WATCHDOG_SPIN_SECONDS))
            try:
                cur.close()
            except Exception:
                pass
        if (case.observe_locks and not step.peer and not conn.closed
                and conn.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_INTRANS):
            try:
                obs['locks'] = self._simple(LOCKS_SQL)
            except psycopg2.Error as e:
                obs['locks'] = 'ERROR %s' % e.pgcode
        if conn.closed:
            if step.peer:
                self.peer_conn()
            else:
                self.connect()
            obs['reconnected'] = True
        if conn.notices:
            obs['notices'] = [n.strip() for n in conn.notices]
            del conn.notices[:]
        if conn.notifies:
            obs['notifies'] = [[n.channel, n.payload] for n in conn.notifies]
            del conn.notifies[:]
        return obs

    def run_case(self, case, extra_step=None):
        """Run the case and return its raw observation.  extra_step (self-test)
        is run on this side only, after the case, unobserved: only its effect
        on the final state can show it."""
        self.reset(case)
        vars_ = {}
        steps_obs = []
        for i, step in enumerate(case.steps):
            o = self.run_step(step, case, vars_)
            if 'rows' in o and not step.ordered():
                o['rows'] = sorted(o['rows'], key=_masked)
            steps_obs.append(o)
            if 'stuck' in o:
                steps_obs += [{'skipped': 'after the stuck step %d' % i}] * (len(case.steps) - i - 1)
                break
        return {'steps': steps_obs, 'state': self.finish(case, extra_step)}


# ---------------------------------------------------------------------------
# normalisation

def _masked(row):
    """A row's sort key with tokens and timestamps blurred (they differ
    between the sides)."""
    def m(v):
        if isinstance(v, bool) or v is None:
            return repr(v)
        if isinstance(v, int) and v >= TOKEN_MIN:
            return 'T'
        if isinstance(v, datetime.datetime):
            return 'TS'
        if isinstance(v, str):
            return TOKEN_RE.sub('T', TS_RE.sub('TS', v))
        return repr(v)
    return repr([m(v) for v in row])


def _canon_ts(s):
    try:
        s2 = s.replace(' ', 'T')
        if re.search(r'[+-]\d\d$', s2):
            s2 += ':00'
        return datetime.datetime.fromisoformat(s2)
    except ValueError:
        return s


def _walk(v, f_scalar):
    if isinstance(v, dict):
        return {k: _walk(x, f_scalar) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_walk(x, f_scalar) for x in v]
    return f_scalar(v)


def normalise(obs):
    """Replace tokens and timestamps by stable names (see the module doc)."""
    obs = dict(obs)
    stamps = {}
    tokens = {}

    def stamp(t):
        if t not in stamps:
            stamps[t] = 'TS%d' % (len(stamps) + 1)
        return stamps[t]

    def tok(n):
        if n not in tokens:
            tokens[n] = 'T%d' % (len(tokens) + 1)
        return tokens[n]

    def repl(v):
        if isinstance(v, bool) or v is None:
            return v
        if isinstance(v, int):
            return tok(v) if v >= TOKEN_MIN else v
        if isinstance(v, datetime.datetime):
            return stamp(v)
        if isinstance(v, (datetime.date, datetime.time, datetime.timedelta)):
            return str(v)
        if isinstance(v, str):
            def ts_sub(m):
                c = _canon_ts(m.group(0))
                return stamp(c) if isinstance(c, datetime.datetime) else m.group(0)
            v = TS_RE.sub(ts_sub, v)
            return TOKEN_RE.sub(lambda m: tok(int(m.group(0))), v)
        if isinstance(v, float):
            return v
        return repr(v)
    out = _walk(obs, repl)
    # names follow first appearance (so the first difference is where it
    # happens); the order of the values is compared once, at the end
    out['state']['timestamp_order'] = [stamps[t] for t in sorted(stamps)]
    return out


def diff(a, b):
    """The first place where two normalised observations differ, or None."""
    sa, sb = a['steps'], b['steps']
    for i in range(max(len(sa), len(sb))):
        x = sa[i] if i < len(sa) else None
        y = sb[i] if i < len(sb) else None
        if x != y:
            return 'step %d' % i
    for k in sorted(set(a['state']) | set(b['state'])):
        if a['state'].get(k) != b['state'].get(k):
            return 'final %s' % k
    return None
