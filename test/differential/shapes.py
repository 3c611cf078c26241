"""The statement shapes of the differential suite.

Each shape is a generator: given a seeded random.Random and the case, it
writes the case's steps (SQL sent one round trip at a time, see harness.py).
Keys carry the case number; tokens a step needs are written {tok:KEY} and
taken from that side's own earlier results (a claim step stores its token
under the key it claimed).
"""

import random

from harness import REC_TRIGGERS, Step

# PostgreSQL renamed force_parallel_mode to debug_parallel_query in 16: the
# one place that knows.
def force_parallel_setting(server_version_num):
    return 'force_parallel_mode' if server_version_num < 160000 else 'debug_parallel_query'


PARALLEL_GUC = 'force_parallel_mode'     # set by run.py from the server's version


def q(s):
    return "'" + str(s).replace("'", "''") + "'"


class G:
    """What a generator needs: the random source and the case's names."""

    def __init__(self, rng, case):
        self.r = rng
        # holders (1.4) are drawn from a source of their own, so that every
        # case is the one it was before, with holders added to its claims
        self.holder_rng = random.Random('holder/%d' % case.num)
        self.case = case
        self.t = 't%d' % case.num
        self.steps = []
        self.rows = 50
        self.triggers = []
        self.note = ''
        self.n_keys = 0
        self.claimed = []
        self.observe_locks = False  # the lock set after each step (harness.LOCKS_SQL)
        self.isolation = False      # tenant isolation on: begin() sets the tenant
        self.sync = 0               # the sync_N tables used (peer_change)

    # -- plumbing ------------------------------------------------------------
    def add(self, sql, **kw):
        self.steps.append(Step(sql, **kw))

    def key(self, prefix='k'):
        self.n_keys += 1
        return '%s%d' % (prefix, self.n_keys)

    def chance(self, p):
        return self.r.random() < p

    # -- the functions ------------------------------------------------------
    def claim_args(self, k):
        args = [q(self.t), q(k)]
        r = self.r.random()
        if r < 0.2:
            args.append('fingerprint => %s' % q(self.r.choice(['fa', 'fb'])))
        elif r < 0.3:
            args.append('lease => %s' % q(self.r.choice(['10 min', '1 h'])))
        elif r < 0.35:
            args.append('ttl => %s' % q('2 h'))
        # 1.4: a holder, so that the same holder re-enters its claims (held
        # or written) and another one meets them
        if self.holder_rng.random() < 0.3:
            args.append('holder => %s' % q(self.holder_rng.choice(['run-1', 'run-2'])))
        return ', '.join(args)

    def claim(self, k):
        if k not in self.claimed:
            self.claimed.append(k)
        self.add('SELECT outcome, token, response, expires_at FROM idem_claim(%s)' % self.claim_args(k),
                 cap=k)

    def complete(self, k, resp=None):
        resp = resp or '{"n": %d}' % self.r.randint(1, 99)
        self.add('SELECT idem_complete(%s, %s, {tok:%s}, %s)' % (q(self.t), q(k), k, q(resp)))

    def release(self, k, failure=None):
        if failure:
            self.add('SELECT idem_release(%s, %s, {tok:%s}, %s)' % (q(self.t), q(k), k, q(failure)))
        else:
            self.add('SELECT idem_release(%s, %s, {tok:%s})' % (q(self.t), q(k), k))

    def heartbeat(self, k):
        self.add("SELECT idem_heartbeat(%s, %s, {tok:%s}, '20 min')" % (q(self.t), q(k), k))

    def lookup(self, k):
        self.add('SELECT status, token, response, fingerprint, lease_expires_at, expires_at, created_at, '
                 'updated_at, holder FROM idem_lookup(%s, %s)' % (q(self.t), q(k)))

    def forget(self, k):
        self.add('SELECT idem_forget(%s, %s)' % (q(self.t), q(k)))

    def claim_many(self, keys):
        self.add('SELECT key, outcome, token, response, expires_at FROM idem_claim_many(%s, ARRAY[%s])'
                 % (q(self.t), ', '.join(q(k) for k in keys)))

    def read_records(self):
        self.add('SELECT key, status, token, lease_expires_at, response FROM idempotency_records '
                 'WHERE tenant_id = %s ORDER BY key' % q(self.t))

    def biz_write(self):
        r = self.r.random()
        if r < 0.5:
            self.add('INSERT INTO ledger VALUES (%d, %d, %s)'
                     % (self.r.randint(500000, 599999), self.r.randint(1, 999), q('w')))
        elif r < 0.8:
            self.add('UPDATE ledger SET amount = amount + 1 WHERE id <= %d' % self.r.randint(1, 10))
        else:
            self.add("INSERT INTO audit (what, info) VALUES ('biz', %s)" % q(self.t))

    def settle_any(self, k):
        r = self.r.random()
        if r < 0.6:
            self.complete(k)
        elif r < 0.75:
            self.release(k)
        elif r < 0.9:
            self.release(k, '{"error": "bad"}')
        else:
            self.heartbeat(k)

    def begin(self):
        self.add(self.r.choice(['BEGIN', 'BEGIN', 'START TRANSACTION', 'BEGIN ISOLATION LEVEL READ COMMITTED']))
        if self.isolation:
            self.set_tenant()

    def set_tenant(self):
        """With tenant isolation on: the transaction's tenant, mostly this
        case's, sometimes unset or another one (the error paths)."""
        r = self.r.random()
        if r < 0.8:
            self.add("SELECT set_config('app.tenant', %s, true)" % q(self.t))
        elif r < 0.9:
            self.add("SELECT set_config('app.tenant', 'another', true)")
        elif r < 0.95:
            self.add("SELECT set_config('app.tenant', '', true)")

    def isolation_maybe(self, p=0.25):
        """Issue 34's classes also run with tenant isolation on, as the
        non-owner diff_app (harness.ALTERATIONS['alt_tenant_isolation'])."""
        if not self.chance(p):
            return False
        self.isolation = True
        self.triggers.append('alt_tenant_isolation')
        self.note = (self.note + '; ' if self.note else '') + 'tenant isolation as diff_app'
        self.add('SET ROLE diff_app')
        if self.chance(0.5):
            self.add('SET app.tenant = %s' % q(self.t))     # for statements outside a block
        return True

    def end(self, allow_2pc=True):
        r = self.r.random()
        if r < 0.66:
            self.add('COMMIT')
        elif r < 0.69:
            self.add('COMMIT AND CHAIN')
            self.read_records()
            self.add('COMMIT')
        elif r < 0.72:
            self.add('ROLLBACK AND CHAIN')
            self.read_records()
            self.add('COMMIT')
        elif r < 0.86:
            self.add('ROLLBACK')
        elif r < 0.92 and allow_2pc:
            self.add('PREPARE TRANSACTION {gid}')
            self.add('COMMIT PREPARED {gid}' if self.chance(0.7) else 'ROLLBACK PREPARED {gid}')
        elif r < 0.96:
            self.add('SELECT 1 / 0')        # an error: COMMIT then rolls back
            self.add('COMMIT')
        else:
            self.add('SET transaction_read_only = on')
            self.add('COMMIT')

    def prior(self, keys):
        """Committed history for some keys: completed, failed, processing with
        a live lease, or processing with an expired lease (set in the table)."""
        for k in keys:
            r = self.r.random()
            if r < 0.3:
                self.add('SELECT idem_complete(%s, %s, token, %s) FROM idem_claim(%s, %s)'
                         % (q(self.t), q(k), q('{"prior": 1}'), q(self.t), q(k)))
            elif r < 0.45:
                self.add('SELECT idem_release(%s, %s, token, %s) FROM idem_claim(%s, %s)'
                         % (q(self.t), q(k), q('{"prior": "failed"}'), q(self.t), q(k)))
            elif r < 0.7:
                self.claim(k)               # autocommit: a committed live claim
            else:
                self.claim(k)
                self.add("UPDATE idempotency_records SET expires_at = now() - interval '1 min', "
                         "lease_expires_at = now() - interval '1 min' WHERE tenant_id = %s AND key = %s"
                         % (q(self.t), q(k)))

    def ops(self, keys, n, claimed_ok=True):
        """n random calls on keys: claims, settles, lookups, reads, writes."""
        for _ in range(n):
            k = self.r.choice(keys)
            r = self.r.random()
            if r < 0.35:
                self.claim(k)
            elif r < 0.55:
                if self.claimed and self.chance(0.85):
                    k = self.r.choice(self.claimed)
                self.settle_any(k)
            elif r < 0.63:
                self.lookup(k)
            elif r < 0.70:
                self.read_records()
            elif r < 0.80:
                self.biz_write()
            elif r < 0.85:
                self.forget(k)
            elif r < 0.90:
                self.claim_many(self.r.sample(keys, min(len(keys), self.r.randint(1, 4))))
            else:
                self.add('SELECT %s(%s)' % (self.r.choice(
                    ['rec_count_sql_stable', 'rec_count_sql_volatile', 'rec_count_plpgsql_stable',
                     'rec_count_plpgsql_volatile', 'rec_count_dynamic', 'rec_count_definer']), q(self.t)))

    def claim_each(self, keys, p_claim=0.85, p_write=0.3, p_settle=0.3):
        """Most keys claimed, each maybe followed by a business write and
        a settle."""
        for k in keys:
            if self.chance(p_claim):
                self.claim(k)
            if self.chance(p_write):
                self.biz_write()
            if self.chance(p_settle):
                self.settle_any(k)

    def txn(self, keys, n):
        self.begin()
        self.ops(keys, n)
        self.end()


# ---------------------------------------------------------------------------
# shapes

def rows_small(g):
    return g.r.choice([5, 10, 20, 40, 60])


def rows_big(g):
    return g.r.choice([10, 30, 33, 40, 80, 150, 300, 1000])


def shape_where_insert_select(g):
    """Issue case 1: claims in WHERE of INSERT ... SELECT over the ledger."""
    g.rows = 1000 if g.chance(0.15) else rows_big(g)
    if g.chance(0.4):
        g.prior(['m-%d' % i for i in g.r.sample(range(1, g.rows + 1), min(5, g.rows))])
    g.begin()
    if g.chance(0.3):
        g.claim(g.key())
    off = g.r.choice([100000, 200000])
    flt = g.r.choice(['', ' AND id % 2 = 0', ' AND amount > 300'])
    g.add("INSERT INTO ledger SELECT id + %d, amount FROM ledger WHERE (idem_claim(%s, 'm-' || id)).outcome "
          "= 'claimed'%s" % (off, q(g.t), flt))
    g.add('SELECT count(*), sum(amount) FROM ledger')
    if g.chance(0.5):
        g.add("SELECT count(*) FILTER (WHERE status = 'processing'), count(*) FROM idempotency_records")
    g.end()
    g.add('SELECT count(*) FROM ledger')


def shape_where_update_delete(g):
    """Claims in WHERE of UPDATE and DELETE, with RETURNING."""
    g.rows = rows_big(g)
    g.begin()
    if g.chance(0.5):
        g.add("UPDATE ledger SET amount = amount + 1, note = 'u' WHERE (idem_claim(%s, 'u-' || id)).outcome "
              "= 'claimed' RETURNING id, amount" % q(g.t))
    if g.chance(0.6):
        g.add("DELETE FROM ledger WHERE id %% 3 = 0 AND (idem_claim(%s, 'd-' || id)).outcome = 'claimed' "
              "RETURNING id" % q(g.t))
    g.add("UPDATE ledger SET note = coalesce(note, '') || 'x' WHERE id <= 5 RETURNING id, note")
    g.add('SELECT count(*), count(note) FROM ledger')
    g.end()


def shape_target_list(g):
    """Claims in target lists, with STABLE/VOLATILE readers beside them."""
    g.rows = rows_big(g)
    n = g.r.randint(1, min(g.rows, 80))
    reader = g.r.choice(['rec_count_sql_stable(%s)', 'rec_count_sql_volatile(%s)',
                         'rec_count_plpgsql_stable(%s)', 'rec_count_plpgsql_volatile(%s)',
                         'rec_count_dynamic(%s)', 'rec_count_definer(%s)',
                         "(SELECT count(*) FROM rec_view WHERE tenant_id = %s)",
                         'ledger_count_stable()', 'ledger_count_volatile()'])
    reader = reader % q(g.t) if '%s' in reader else reader
    autocommit = g.chance(0.25)
    if not autocommit:
        g.begin()
    r = g.r.random()
    if r < 0.4:
        g.add("SELECT id, (idem_claim(%s, 'k' || id)).outcome, %s AS seen FROM ledger WHERE id <= %d "
              "ORDER BY id" % (q(g.t), reader, n))
    elif r < 0.7:
        g.add("SELECT 'k' || id AS key, (c).outcome, (c).token, %s AS seen FROM "
              "(SELECT id, idem_claim(%s, 'k' || id) AS c FROM ledger WHERE id <= %d OFFSET 0) s ORDER BY id"
              % (reader, q(g.t), n))
    elif r < 0.85:
        # (f()).* runs the function once per column
        g.add("SELECT (idem_claim(%s, 'k1')).*" % q(g.t))
    else:
        g.add("SELECT claim_sql(%s, 'k' || g), %s FROM generate_series(1, %d) g"
              % (q(g.t), reader, n))
    g.add('SELECT %s' % reader)
    if not autocommit:
        if g.chance(0.5):
            g.add("SELECT key, idem_complete(tenant_id, key, token, '{}') FROM idempotency_records "
                  "WHERE tenant_id = %s AND key LIKE 'k1%%' ORDER BY key" % q(g.t))
        g.end()


def shape_cte_dml(g):
    """Claims in CTEs with INSERT/UPDATE/DELETE."""
    g.rows = rows_big(g)
    n = g.r.randint(1, min(g.rows, 70))
    g.begin()
    dml = g.r.choice(['ins', 'upd', 'del', 'all'])
    parts = ["c AS (SELECT id, idem_claim(%s, 'c' || id) AS r FROM ledger WHERE id <= %d)" % (q(g.t), n)]
    outs = []
    if dml in ('ins', 'all'):
        parts.append("ins AS (INSERT INTO ledger SELECT id + 300000, amount FROM c WHERE (r).outcome = "
                     "'claimed' RETURNING id)")
        outs.append('(SELECT count(*) FROM ins) AS inserted')
    if dml in ('upd', 'all'):
        parts.append("upd AS (UPDATE ledger SET note = (SELECT (r).outcome FROM c WHERE c.id = ledger.id) "
                     "WHERE id IN (SELECT id FROM c) RETURNING id)")
        outs.append('(SELECT count(*) FROM upd) AS updated')
    if dml in ('del', 'all'):
        parts.append("del AS (DELETE FROM audit WHERE n > 0 RETURNING n)")
        outs.append('(SELECT count(*) FROM del) AS deleted')
    parts.append("a AS (INSERT INTO audit (what, info) SELECT 'cte', (r).outcome FROM c RETURNING n)")
    outs.append('(SELECT count(*) FROM a) AS audited')
    outs.append('(SELECT count(*) FROM ledger) AS ledger_rows')
    outs.append('%s(%s) AS seen' % (g.r.choice(['rec_count_sql_stable', 'rec_count_plpgsql_volatile']),
                                    q(g.t)))
    g.add('WITH ' + ',\n     '.join(parts) + '\nSELECT ' + ', '.join(outs))
    if g.chance(0.5):
        g.add("WITH m AS (SELECT * FROM idem_claim_many(%s, ARRAY['c1', 'x1', 'x2'])) "
              "INSERT INTO audit (what, info) SELECT 'many', key || ' ' || outcome FROM m RETURNING info"
              % q(g.t))
    g.add('SELECT count(*) FROM ledger')
    g.end()


def shape_cursor(g):
    """Cursors over claims and over the ledger, fetched after more claims."""
    g.rows = rows_big(g)
    hold = g.chance(0.4)
    n = g.r.randint(5, min(g.rows, 90))
    g.begin()
    if g.chance(0.5):
        g.add("DECLARE c1 NO SCROLL CURSOR%s FOR SELECT id, (idem_claim(%s, 'c' || id)).outcome FROM ledger "
              "WHERE id <= %d OR id > 400000" % (' WITH HOLD' if hold else '', q(g.t), n))
    else:
        g.add("DECLARE c1 NO SCROLL CURSOR%s FOR SELECT id, amount, rec_count_sql_stable(%s) FROM ledger"
              % (' WITH HOLD' if hold else '', q(g.t)))
    g.add('FETCH %d FROM c1' % g.r.randint(1, 5))
    for i in range(g.r.randint(1, 40)):
        if g.chance(0.3):
            g.add('INSERT INTO ledger VALUES (%d, 1, %s)' % (400000 + i, q('late')))
        else:
            g.claim(g.key('x'))
    if g.chance(0.3):
        g.add("SELECT count(*) FROM ledger WHERE (idem_claim(%s, 'y' || id)).outcome = 'claimed' AND id <= 40"
              % q(g.t))
    g.add('FETCH %d FROM c1' % g.r.randint(1, 30))
    if hold:
        g.end(allow_2pc=False)
    g.add('FETCH ALL FROM c1')
    g.add('CLOSE c1')
    if not hold:
        g.end()


def shape_function_reader(g):
    """PL/pgSQL and SQL functions (STABLE, VOLATILE) that read the records or
    call idem_lookup, after claims in the same transaction and statement."""
    g.rows = rows_small(g)
    keys = [g.key() for _ in range(g.r.randint(1, 40))]
    g.begin()
    for k in keys:
        if g.chance(0.8):
            g.claim(k)
    k = g.r.choice(keys)
    for _ in range(g.r.randint(1, 4)):
        r = g.r.random()
        if r < 0.3:
            g.add('SELECT rec_count_sql_stable(%s), rec_count_sql_volatile(%s), rec_count_plpgsql_stable(%s), '
                  'rec_count_plpgsql_volatile(%s)' % ((q(g.t),) * 4))
        elif r < 0.5:
            g.add('SELECT lookup_status_sql(%s, %s), lookup_status_plpgsql(%s, %s)'
                  % (q(g.t), q(k), q(g.t), q(k)))
        elif r < 0.7:
            k2 = g.key()
            g.add('SELECT (idem_claim(%s, %s)).outcome, rec_count_sql_stable(%s), rec_count_plpgsql_volatile(%s), '
                  'lookup_status_sql(%s, %s)' % (q(g.t), q(k2), q(g.t), q(g.t), q(g.t), q(k2)))
        elif r < 0.85:
            g.add("SELECT g, rec_count_sql_stable(%s) FROM generate_series(1, 3) g "
                  "WHERE (idem_claim(%s, 'f' || g)).outcome IS NOT NULL" % (q(g.t), q(g.t)))
        else:
            g.add("SELECT id, lookup_status_plpgsql(%s, 'k' || id) FROM ledger WHERE id <= 5 ORDER BY id"
                  % q(g.t))
    if g.chance(0.5):
        g.settle_any(g.r.choice(keys))
        g.add('SELECT rec_count_sql_stable(%s), lookup_status_sql(%s, %s)' % (q(g.t), q(g.t), q(k)))
    g.end()


def shape_function_claimer(g):
    """Claims inside functions: the handler in PL/pgSQL, an exception block
    (subtransaction), a SQL function, called per row."""
    g.rows = rows_small(g)
    g.begin()
    n = g.r.randint(1, 40)
    r = g.r.random()
    if r < 0.4:
        g.add("SELECT id, handle(%s, 'h' || (id %% %d), amount, %s) FROM ledger WHERE id <= %d ORDER BY id"
              % (q(g.t), g.r.randint(2, 50), 'true' if g.chance(0.6) else 'false', min(n, g.rows)))
    elif r < 0.7:
        g.add("SELECT g, handle_guarded(%s, 'g' || g, g %% 4) FROM generate_series(1, %d) g"
              % (q(g.t), n))
    else:
        g.add("UPDATE ledger SET note = claim_sql(%s, 's' || (id %% 7)) WHERE id <= %d RETURNING id, note"
              % (q(g.t), min(n, g.rows)))
    g.add('SELECT rec_count_sql_stable(%s)' % q(g.t))
    g.read_records()
    g.end()
    g.add("SELECT handle(%s, 'h1', 5, true)" % q(g.t))


def shape_trigger_business(g):
    """Triggers on a business table claim per row (inbox), notify, read the
    records, and a deferred constraint trigger looks at COMMIT."""
    g.rows = 5
    n = g.r.randint(1, 60)
    dup = g.r.randint(2, 70)
    autocommit = g.chance(0.2)
    if not autocommit:
        g.begin()
        if g.chance(0.3):
            g.claim('i1')
    r = g.r.random()
    if r < 0.5:
        g.add("INSERT INTO inbox (id, tenant, key, amount) SELECT g, %s, 'i' || (g %% %d), g FROM "
              "generate_series(1, %d) g" % (q(g.t), dup, n))
    elif r < 0.8:
        lines = ''.join('%d\t%s\ti%d\t%d\n' % (i, g.t, i % dup, i) for i in range(1, n + 1))
        g.add('COPY inbox (id, tenant, key, amount) FROM STDIN', kind='copy_in', data=lines)
    else:
        for i in range(1, min(n, 15) + 1):
            g.add("INSERT INTO inbox (id, tenant, key, amount) VALUES (%d, %s, 'i%d', %d) RETURNING outcome, seen"
                  % (i, q(g.t), i % dup, i))
    g.add('SELECT id, key, outcome, token, seen FROM inbox ORDER BY id')
    if not autocommit:
        if g.chance(0.3):
            g.add('SET CONSTRAINTS ALL IMMEDIATE')
        g.end()


def shape_trigger_records(g):
    """Triggers on idempotency_records itself: NOTIFY, a row count, deferred
    constraint triggers, a statement trigger with a transition table, a
    BEFORE trigger that refuses or changes rows."""
    g.rows = rows_small(g)
    g.triggers = sorted(g.r.sample(['notify', 'notify_stmt', 'count', 'deferred', 'statement', 'refuse', 'touch',
                                    'shadow'],
                                   g.r.randint(1, 3)))
    g.note = 'triggers ' + ','.join(g.triggers)
    keys = [g.key() for _ in range(g.r.randint(2, 6))]
    if 'refuse' in g.triggers and g.chance(0.6):
        keys.append('boom%d' % g.r.randint(1, 9))
    if g.chance(0.3):
        g.prior(keys[:1])
    for _ in range(g.r.randint(1, 3)):
        if g.chance(0.15):
            g.claim(g.r.choice(keys))        # autocommit
            continue
        g.begin()
        for k in g.r.sample(keys, g.r.randint(1, len(keys))):
            g.claim(k)
            if g.chance(0.3):
                g.biz_write()
            if g.chance(0.6):
                g.settle_any(k)
        if g.chance(0.3):
            g.claim_many(g.r.sample(keys, min(3, len(keys))))
        if g.chance(0.3):
            g.read_records()
        g.end()


def shape_update_lookup(g):
    """UPDATE with an idem_lookup subquery after claims of the same keys."""
    g.rows = rows_big(g)
    n = g.r.randint(1, min(g.rows, 60))
    g.begin()
    if g.chance(0.5):
        g.add("SELECT count(*) FROM ledger WHERE id <= %d AND (idem_claim(%s, 'k' || id)).outcome = 'claimed'"
              % (n, q(g.t)))
    else:
        for i in range(1, min(n, 12) + 1):
            g.claim('k%d' % i)
    g.add("UPDATE ledger SET note = (SELECT status FROM idem_lookup(%s, 'k' || id)) WHERE id <= %d "
          "RETURNING id, note" % (q(g.t), n + g.r.randint(0, 5)))
    if g.chance(0.5):
        g.add("UPDATE ledger SET amount = amount + 1 WHERE id IN (SELECT id FROM ledger WHERE "
              "lookup_status_sql(%s, 'k' || id) = 'processing') RETURNING id" % q(g.t))
    if g.chance(0.5):
        g.add("UPDATE ledger SET note = 'again' WHERE (idem_claim(%s, 'k' || id)).outcome = 'in_progress' "
              "AND id <= %d RETURNING id" % (q(g.t), n))
    g.add("SELECT count(*), count(note) FROM ledger")
    g.end()


def shape_parallel(g):
    """Forced parallel plans with a PARALLEL SAFE function reading the table."""
    g.rows = g.r.choice([50, 200, 1000])
    g.begin()
    g.add('; '.join('SET LOCAL ' + s for s in [
        'max_parallel_workers_per_gather = 2', 'parallel_setup_cost = 0', 'parallel_tuple_cost = 0',
        'min_parallel_table_scan_size = 0', '%s = %s' % (PARALLEL_GUC, g.r.choice(['on', 'regress'])),
        'parallel_leader_participation = %s' % g.r.choice(['on', 'off'])]))
    keys = [g.key() for _ in range(g.r.randint(1, 40))]
    if g.chance(0.5):
        for k in keys:
            g.claim(k)
    else:
        g.add("SELECT k AS key, (c).outcome, (c).token FROM (SELECT k, idem_claim(%s, k) AS c FROM "
              "unnest(ARRAY[%s]) k OFFSET 0) s ORDER BY k" % (q(g.t), ', '.join(q(k) for k in keys)))
        g.claimed.extend(keys)
    if g.chance(0.3):
        g.complete(keys[0])
    for _ in range(g.r.randint(1, 3)):
        r = g.r.random()
        if r < 0.4:
            g.add('SELECT rec_count_parallel(%s)' % q(g.t))
        elif r < 0.7:
            g.add('SELECT count(*), min(rec_count_parallel(%s)), max(rec_count_parallel(%s)) FROM ledger'
                  % (q(g.t), q(g.t)))
        elif r < 0.85:
            g.add('SELECT count(*) FROM ledger WHERE rec_status_parallel(%s, %s) IS NOT NULL'
                  % (q(g.t), q(g.r.choice(keys))))
        else:
            g.add('SELECT count(*) FROM idempotency_records WHERE tenant_id = %s' % q(g.t))
    g.end()


def shape_savepoint(g):
    """Savepoints around claims and completions (ROLLBACK TO, RELEASE)."""
    g.rows = rows_small(g)
    keys = [g.key() for _ in range(g.r.randint(1, 5))]
    if g.chance(0.3):
        g.prior(keys[:1])
    g.begin()
    depth = 0
    for _ in range(g.r.randint(3, 14)):
        r = g.r.random()
        if r < 0.2:
            depth += 1
            g.add('SAVEPOINT s%d' % depth)
        elif r < 0.3 and depth:
            g.add('ROLLBACK TO SAVEPOINT s%d' % depth)
            if g.chance(0.5):
                g.add('RELEASE SAVEPOINT s%d' % depth)
                depth -= 1
        elif r < 0.38 and depth:
            g.add('RELEASE SAVEPOINT s%d' % depth)
            depth -= 1
        else:
            g.ops(keys, 1)
    g.read_records()
    g.end()


def shape_prepared(g):
    """PREPARE/EXECUTE of claims and of set-based claims (generic plans after
    five executions)."""
    g.rows = rows_big(g)
    g.add('PREPARE pc(text, text) AS SELECT outcome, token FROM idem_claim($1, $2)')
    g.add("PREPARE pw(text, int) AS INSERT INTO ledger SELECT id + 700000 + $2 * 1000, amount FROM ledger "
          "WHERE id < 200 AND (idem_claim($1, 'p' || $2 || '-' || id)).outcome = 'claimed'")
    g.add('PREPARE pr(text) AS SELECT count(*) FROM idempotency_records WHERE tenant_id = $1')
    g.begin()
    for i in range(g.r.randint(1, 12)):
        r = g.r.random()
        if r < 0.55:
            g.add('EXECUTE pc(%s, %s)' % (q(g.t), q('e%d' % g.r.randint(1, 8))))
        elif r < 0.7:
            g.add('EXECUTE pw(%s, %d)' % (q(g.t), i))
        else:
            g.add('EXECUTE pr(%s)' % q(g.t))
    g.add('SELECT count(*) FROM ledger')
    g.end()
    g.add('EXECUTE pr(%s)' % q(g.t))
    g.add('DEALLOCATE ALL')


def shape_over_cap(g):
    """More claims in one transaction than the in-memory cap (128, open or
    settled), one per statement or in one statement, then settles and
    readers."""
    g.rows = rows_small(g)
    n = g.r.randint(100, 200)
    g.begin()
    keys = ['o%d' % i for i in range(1, n + 1)]
    if g.chance(0.5):
        for k in keys:
            g.claim(k)
    else:
        g.add("SELECT 'o' || g AS key, (c).outcome, (c).token FROM (SELECT g, idem_claim(%s, 'o' || g) AS c "
              "FROM generate_series(1, %d) g OFFSET 0) s ORDER BY g" % (q(g.t), n))
    for k in g.r.sample(keys, g.r.randint(0, min(10, n))):
        g.settle_any(k)
    if g.chance(0.5):
        g.add('SELECT status, count(*) FROM idempotency_records WHERE tenant_id = %s GROUP BY 1 ORDER BY 1'
              % q(g.t))
    if g.chance(0.4):
        g.lookup(g.r.choice(keys))
    g.add("SELECT count(*) FROM ledger WHERE (idem_claim(%s, 'o' || id)).outcome = 'claimed'" % q(g.t))
    g.end()


def shape_claim_many_mix(g):
    """idem_claim_many with repeats and recorded keys, then single claims of
    the same keys, settles and lookups."""
    g.rows = rows_small(g)
    keys = [g.key() for _ in range(g.r.randint(2, 12))]
    g.prior(g.r.sample(keys, g.r.randint(0, min(3, len(keys)))))
    g.begin()
    if g.chance(0.5):
        g.claim(keys[0])
    batch = [g.r.choice(keys) for _ in range(g.r.randint(1, 15))]
    g.claim_many(batch)
    g.ops(keys, g.r.randint(1, 8))
    g.end()
    if g.chance(0.5):
        g.claim_many(keys)


def shape_settle_mix(g):
    """Random programs of claim, complete, release (with and without a
    failure), heartbeat, forget, lookup over a few keys, in and out of
    transactions, including fenced-off calls that fail."""
    g.rows = rows_small(g)
    keys = [g.key() for _ in range(g.r.randint(1, 5))]
    g.prior(g.r.sample(keys, g.r.randint(0, len(keys))))
    for _ in range(g.r.randint(1, 4)):
        if g.chance(0.25):
            g.ops(keys, 1)
        else:
            g.txn(keys, g.r.randint(1, 10))


def shape_copy(g):
    """COPY of the table (out, after claims) and COPY into a business table."""
    g.rows = rows_small(g)
    keys = [g.key() for _ in range(g.r.randint(1, 35))]
    g.begin()
    for k in keys:
        g.claim(k)
    if g.chance(0.5):
        g.complete(keys[0])
    r = g.r.random()
    if r < 0.4:
        g.add('COPY idempotency_records (tenant_id, key, status, token, response, lease_expires_at, expires_at, '
              'created_at, updated_at) TO STDOUT', kind='copy_out')
    elif r < 0.7:
        g.add('COPY (SELECT key, status FROM idempotency_records WHERE tenant_id = %s ORDER BY key) TO STDOUT'
              % q(g.t), kind='copy_out')
    else:
        data = ''.join('%d\t%d\tc\n' % (800000 + i, i) for i in range(g.r.randint(1, 20)))
        g.add('COPY ledger FROM STDIN', kind='copy_in', data=data)
    g.add('SELECT count(*) FROM idempotency_records')
    g.end()


def shape_two_phase(g):
    """PREPARE TRANSACTION / COMMIT PREPARED around claims and completions."""
    g.rows = rows_small(g)
    keys = [g.key() for _ in range(g.r.randint(1, 6))]
    g.begin()
    for k in keys:
        g.claim(k)
        if g.chance(0.5):
            g.settle_any(k)
    g.biz_write()
    g.add('PREPARE TRANSACTION {gid}')
    g.claim(g.r.choice(keys))       # the prepared transaction holds the key
    g.read_records()
    g.add('COMMIT PREPARED {gid}' if g.chance(0.75) else 'ROLLBACK PREPARED {gid}')
    g.claim(g.r.choice(keys))
    g.read_records()


def shape_read_only_commit(g):
    """SET transaction_read_only = on after business writes, before COMMIT;
    and claims in read-only transactions."""
    g.rows = rows_small(g)
    keys = [g.key() for _ in range(g.r.randint(1, 5))]
    if g.chance(0.7):
        g.begin()
        for k in keys:
            g.claim(k)
            g.biz_write()
            if g.chance(0.4):
                g.settle_any(k)
        g.add(g.r.choice(['SET transaction_read_only = on', 'SET LOCAL transaction_read_only = on',
                          'SET TRANSACTION READ ONLY']))
        if g.chance(0.3):
            g.claim(g.key())
        g.add('COMMIT')
    else:
        g.add(g.r.choice(['BEGIN READ ONLY', 'START TRANSACTION READ ONLY']))
        g.claim(keys[0])
        g.add('COMMIT')
    g.read_records()


def shape_isolation(g):
    """REPEATABLE READ and SERIALIZABLE transactions (claims written at once
    on both sides) mixed with READ COMMITTED ones."""
    g.rows = rows_small(g)
    keys = [g.key() for _ in range(g.r.randint(1, 6))]
    g.prior(g.r.sample(keys, g.r.randint(0, min(2, len(keys)))))
    for _ in range(g.r.randint(1, 3)):
        g.add(g.r.choice(['BEGIN ISOLATION LEVEL REPEATABLE READ', 'BEGIN ISOLATION LEVEL SERIALIZABLE',
                          'BEGIN']))
        g.ops(keys, g.r.randint(1, 8))
        g.end()


def shape_autocommit(g):
    """Claims and settles as implicit transactions, and multi-statement query
    strings (one implicit transaction for the whole string)."""
    g.rows = rows_small(g)
    keys = [g.key() for _ in range(g.r.randint(1, 5))]
    for _ in range(g.r.randint(2, 8)):
        k = g.r.choice(keys)
        r = g.r.random()
        if r < 0.5:
            g.ops(keys, 1)
        else:
            tail = g.r.choice([
                "SELECT idem_complete(%s, %s, (SELECT token FROM idem_lookup(%s, %s)), '{}')",
                "SELECT idem_release(%s, %s, (SELECT token FROM idem_lookup(%s, %s)))",
                "SELECT count(*) FROM idempotency_records WHERE tenant_id = %s AND key = %s AND %s <> %s",
            ]) % (q(g.t), q(k), q(g.t), q(k))
            g.add("SELECT (idem_claim(%s, %s)).outcome; INSERT INTO audit (what, info) VALUES ('multi', %s); %s"
                  % (q(g.t), q(k), q(k), tail))


def shape_sweep(g):
    """idem_sweep() in a transaction that holds claims, over expired records."""
    g.rows = rows_small(g)
    keys = [g.key() for _ in range(g.r.randint(2, 8))]
    g.prior(keys)
    g.add("UPDATE idempotency_records SET expires_at = now() - interval '1 s' WHERE tenant_id = %s "
          "AND status <> 'processing' AND key <= %s" % (q(g.t), q(g.r.choice(keys))))
    autocommit = g.chance(0.2)
    if not autocommit:
        g.begin()
    for k in g.r.sample(keys, g.r.randint(1, len(keys))):
        g.claim(k)
        if g.chance(0.3):
            g.settle_any(k)
    g.add('SELECT * FROM idem_sweep(%s)' % g.r.choice(['', '1', '100']))
    g.read_records()
    if g.chance(0.5):
        g.claim(g.r.choice(keys))
    if not autocommit:
        g.end()


def shape_same_key(g):
    """One key, many calls in one transaction: claim after release (claimed
    again), a different fingerprint, wait on one's own claim, forget then
    complete, heartbeat then lookup, an inner block that completes and fails."""
    g.rows = rows_small(g)
    k = g.key()
    if g.chance(0.3):
        g.prior([k])
    g.begin()
    if g.chance(0.2):
        g.add('SET LOCAL idempotency.defer_writes = off')
    g.claim(k)
    for _ in range(g.r.randint(2, 9)):
        r = g.r.random()
        if r < 0.2:
            g.release(k)
            g.claim(k)
        elif r < 0.3:
            g.add("SELECT outcome, token FROM idem_claim(%s, %s, fingerprint => 'other')" % (q(g.t), q(k)))
        elif r < 0.38:
            g.add("SELECT outcome, token FROM idem_claim(%s, %s, wait => '10 ms')" % (q(g.t), q(k)))
        elif r < 0.45:
            g.forget(k)
        elif r < 0.55:
            g.heartbeat(k)
            g.lookup(k)
        elif r < 0.65:
            g.add('SELECT complete_then_fail(%s, %s, {tok:%s})' % (q(g.t), q(k), k))
        elif r < 0.72:
            g.add('SET LOCAL idempotency.defer_writes = off')
        elif r < 0.8:
            g.claim(k)
        elif r < 0.9:
            g.settle_any(k)
        else:
            g.lookup(k)
    g.read_records()
    g.end()
    g.claim(k)


def shape_procedure(g):
    """CALL of a procedure that claims and COMMITs inside; DO blocks."""
    g.rows = rows_small(g)
    n = g.r.randint(1, 50)
    fail_at = g.r.choice([0, 0, g.r.randint(1, n)])
    if g.chance(0.8):
        g.add('CALL claim_batches(%s, %d, %d, %d)' % (q(g.t), n, g.r.randint(1, 40), fail_at))
    else:
        g.begin()
        g.add('CALL claim_batches(%s, %d, %d, %d)' % (q(g.t), n, n + 1, fail_at))
        g.end()
    g.add("DO $$DECLARE r idem_claim_result; BEGIN FOR i IN 1..%d LOOP r := idem_claim(%s, 'd' || i); "
          "IF r.outcome = 'claimed' AND i %% 3 = 0 THEN PERFORM idem_release(%s, 'd' || i, r.token); END IF; "
          "END LOOP; RAISE NOTICE 'seen %%', (SELECT count(*) FROM idempotency_records WHERE tenant_id = %s); "
          "END$$" % (g.r.randint(1, 40), q(g.t), q(g.t), q(g.t)))
    g.read_records()
    g.add("SELECT what, count(*) FROM audit GROUP BY 1 ORDER BY 1")


def shape_deferred_settle(g):
    """Claims completed by a deferred constraint trigger at COMMIT, PREPARE
    TRANSACTION or SET CONSTRAINTS ... IMMEDIATE."""
    g.rows = rows_small(g)
    keys = [g.key() for _ in range(g.r.randint(1, 40))]
    g.begin()
    for k in keys:
        g.claim(k)
        if g.chance(0.5):
            g.add('INSERT INTO outbox (tenant, key, token) VALUES (%s, %s, {tok:%s})' % (q(g.t), q(k), k))
    if g.chance(0.3):
        g.add('SET CONSTRAINTS ALL IMMEDIATE')
        g.read_records()
    if g.chance(0.3):
        g.add("INSERT INTO inbox (id, tenant, key, amount) VALUES (1, %s, %s, 4)" % (q(g.t), q(keys[0])))
    r = g.r.random()
    if r < 0.7:
        g.add('COMMIT')
    elif r < 0.85:
        g.add('PREPARE TRANSACTION {gid}')
        g.add('COMMIT PREPARED {gid}')
    else:
        g.add('SET transaction_read_only = on')
        g.add('COMMIT')
    g.read_records()


def shape_roles(g):
    """Claims as an application role with the documented grants, and as a
    role that may not insert records."""
    g.rows = rows_small(g)
    role = g.r.choice(['diff_app', 'diff_app', 'diff_noinsert'])
    keys = [g.key() for _ in range(g.r.randint(1, 5))]
    g.prior(g.r.sample(keys, g.r.randint(0, len(keys))))
    g.add('SET ROLE %s' % role)
    g.txn(keys, g.r.randint(1, 8))
    if g.chance(0.5):
        g.txn(keys, g.r.randint(1, 5))
    g.add('RESET ROLE')


def shape_exotic_sql(g):
    """Claims in LATERAL, MERGE, INSERT ... ON CONFLICT DO UPDATE, ORDER BY,
    aggregates with FILTER, recursive CTEs, VALUES, COPY (query) TO, EXPLAIN
    ANALYZE."""
    g.rows = rows_big(g)
    n = g.r.randint(1, min(g.rows, 60))
    T = q(g.t)
    g.begin()
    for _ in range(g.r.randint(1, 3)):
        r = g.r.random()
        if r < 0.12:
            g.add("SELECT l.id, c.outcome, rec_count_sql_stable(%s) FROM ledger l, "
                  "LATERAL idem_claim(%s, 'l' || l.id) c WHERE l.id <= %d ORDER BY l.id" % (T, T, n))
        elif r < 0.24:
            g.add("MERGE INTO ledger l USING (SELECT g AS id FROM generate_series(1, %d) g) s ON l.id = s.id "
                  "WHEN MATCHED AND (idem_claim(%s, 'm' || s.id)).outcome = 'claimed' THEN UPDATE SET note = 'merged' "
                  "WHEN NOT MATCHED THEN INSERT VALUES (s.id, 0, (idem_claim(%s, 'n' || s.id)).outcome)"
                  % (n + 5, T, T))
        elif r < 0.36:
            g.add("INSERT INTO ledger SELECT g, 1, NULL FROM generate_series(1, %d) g ON CONFLICT (id) DO UPDATE "
                  "SET note = (idem_claim(%s, 'u' || excluded.id)).outcome RETURNING id, note" % (n, T))
        elif r < 0.46:
            g.add("SELECT id FROM ledger WHERE id <= %d ORDER BY (idem_claim(%s, 'o' || id)).outcome, id"
                  % (n, T))
        elif r < 0.56:
            g.add("SELECT count(*) FILTER (WHERE (idem_claim(%s, 'a' || id)).outcome = 'claimed'), "
                  "count(*), max(rec_count_sql_stable(%s)) FROM ledger WHERE id <= %d" % (T, T, n))
        elif r < 0.66:
            g.add("WITH RECURSIVE r(i, o) AS (SELECT 1, (idem_claim(%s, 'r1')).outcome UNION ALL "
                  "SELECT i + 1, (idem_claim(%s, 'r' || (i + 1) / 2)).outcome FROM r WHERE i < %d) "
                  "SELECT i, o FROM r ORDER BY i" % (T, T, n))
        elif r < 0.76:
            g.add("SELECT v.k, (idem_claim(%s, v.k)).outcome FROM (VALUES ('v1'), ('v2'), ('v1'), ('v3')) v(k)"
                  % T)
        elif r < 0.88:
            g.add("COPY (SELECT g, (idem_claim(%s, 'y' || g)).outcome, rec_count_sql_stable(%s) FROM "
                  "generate_series(1, %d) g) TO STDOUT" % (T, T, n), kind='copy_out')
        elif r < 0.92:
            # BUFFERS OFF: PostgreSQL 18 counts buffers by default, and a
            # held claim touches none (I/O accounting, not what is stored)
            g.add("EXPLAIN (ANALYZE, BUFFERS OFF, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT count(*) FROM ledger "
                  "WHERE id <= %d AND (idem_claim(%s, 'e' || id)).outcome = 'claimed'" % (n, T))
        else:
            # the statement claims and reads the table directly
            g.add("WITH c AS (SELECT g, idem_claim(%s, 'w' || g) AS r FROM generate_series(1, %d) g) "
                  "SELECT (SELECT count(*) FROM c WHERE (r).outcome = 'claimed'), "
                  "(SELECT count(*) FROM idempotency_records WHERE tenant_id = %s)" % (T, n, T))
    g.add('SELECT count(*), count(note) FROM ledger')
    g.end()


def shape_two_sessions(g):
    """A second session of the same side looks while the first holds claims:
    its claims (no wait, or a short wait) meet the holder, its lookups and
    reads see what is committed; it may hold claims the first then meets."""
    g.rows = rows_small(g)
    keys = [g.key() for _ in range(g.r.randint(1, 6))]
    g.prior(g.r.sample(keys, g.r.randint(0, min(2, len(keys)))))
    T = q(g.t)

    def peer(sql, **kw):
        g.steps.append(Step(sql, peer=True, **kw))

    def peer_look(k):
        r = g.r.random()
        if r < 0.35:
            peer('SELECT outcome, token FROM idem_claim(%s, %s)' % (T, q(k)))
        elif r < 0.45:
            peer("SELECT outcome, token FROM idem_claim(%s, %s, wait => '20 ms')" % (T, q(k)))
        elif r < 0.6:
            peer('SELECT status, token, response FROM idem_lookup(%s, %s)' % (T, q(k)))
        elif r < 0.75:
            peer('SELECT key, status, token FROM idempotency_records WHERE tenant_id = %s ORDER BY key' % T)
        elif r < 0.85:
            peer('SELECT key, outcome, token FROM idem_claim_many(%s, ARRAY[%s])'
                 % (T, ', '.join(q(x) for x in g.r.sample(keys, min(2, len(keys))))))
        else:
            peer('SELECT rec_count_sql_stable(%s)' % T)

    mine = keys
    if g.chance(0.3) and len(keys) > 1:
        # the second session holds a claim first; the first session only
        # claims that key (settling it would wait for the second session)
        peer('BEGIN')
        peer('SELECT outcome, token FROM idem_claim(%s, %s)' % (T, q(keys[0])))
        mine = keys[1:]
        g.claim(keys[0])
    g.begin()
    for _ in range(g.r.randint(2, 10)):
        k = g.r.choice(keys)
        if g.chance(0.45):
            peer_look(k)
        else:
            g.ops(mine, 1)
    g.end()
    peer('COMMIT')
    for k in keys:
        if g.chance(0.5):
            peer_look(k)
    g.read_records()


def shape_table_direct(g):
    """Held claims, then the transaction touches the table itself: SELECT ...
    FOR UPDATE, DELETE, UPDATE, LOCK, CREATE TEMP TABLE AS, a view, a cursor
    declared before the claims; then settles of the same keys."""
    g.rows = rows_small(g)
    T = q(g.t)
    keys = [g.key() for _ in range(g.r.randint(1, 6))]
    g.prior(g.r.sample(keys, g.r.randint(0, min(2, len(keys)))))
    autocommit_many = g.chance(0.15)
    if autocommit_many:
        g.add("SELECT count(*) FROM generate_series(1, %d) g WHERE (idem_claim(%s, 'a' || g)).outcome = 'claimed'"
              % (g.r.randint(20, 90), T))
    g.begin()
    cursor = g.chance(0.3)
    if cursor:
        g.add('DECLARE rc CURSOR FOR SELECT key, status FROM idempotency_records WHERE tenant_id = %s' % T)
    for k in keys:
        g.claim(k)
    for _ in range(g.r.randint(1, 4)):
        k = g.r.choice(keys)
        r = g.r.random()
        if r < 0.2:
            g.add('SELECT key, status, token FROM idempotency_records WHERE tenant_id = %s AND key = %s FOR UPDATE'
                  % (T, q(k)))
        elif r < 0.3:
            g.add('DELETE FROM idempotency_records WHERE tenant_id = %s AND key = %s RETURNING key, status'
                  % (T, q(k)))
        elif r < 0.4:
            g.add("UPDATE idempotency_records SET fingerprint = 'direct' WHERE tenant_id = %s AND key = %s "
                  "RETURNING key, status" % (T, q(k)))
        elif r < 0.5:
            g.add('LOCK TABLE idempotency_records IN SHARE MODE')
        elif r < 0.6:
            g.add('CREATE TEMP TABLE snap ON COMMIT DROP AS SELECT key, status FROM idempotency_records '
                  'WHERE tenant_id = %s' % T)
            g.add('SELECT key, status FROM snap ORDER BY key')
        elif r < 0.7:
            g.add('SELECT key, status FROM rec_view WHERE tenant_id = %s ORDER BY key' % T)
        elif r < 0.8 and cursor:
            g.add('FETCH ALL FROM rc')
        else:
            g.settle_any(k)
    for k in g.r.sample(keys, g.r.randint(0, len(keys))):
        g.settle_any(k)
    g.end()
    g.read_records()


def shape_hidden_readers(g):
    """Held claims, then statements whose readers the SQL does not name: a
    domain CHECK, a table CHECK, a column DEFAULT, a user operator, a foreign
    key to idempotency_records (its check queries the table), then settles
    (a release without failure deletes a referenced record)."""
    g.rows = rows_small(g)
    T = q(g.t)
    fk = g.chance(0.5)
    g.triggers = ['fk'] if fk else []
    g.note = 'foreign key to the records' if fk else ''
    keys = [g.key() for _ in range(g.r.randint(1, 5))]
    g.prior(g.r.sample(keys, g.r.randint(0, min(2, len(keys)))))
    g.begin()
    for k in keys:
        if g.chance(0.8):
            g.claim(k)
    n = 0
    for _ in range(g.r.randint(1, 5)):
        k = g.r.choice(keys + ['nokey'])
        n += 1
        r = g.r.random()
        if r < 0.25:
            g.add('INSERT INTO checked (id, k) VALUES (%d, %s) RETURNING id, seen' % (n, q(k)))
        elif r < 0.4:
            g.add('INSERT INTO checked (id, k2) VALUES (%d, %s) RETURNING id, seen' % (n, q(k)))
        elif r < 0.5:
            g.add('INSERT INTO checked (id) SELECT g FROM generate_series(%d, %d) g RETURNING id, seen'
                  % (100 + n * 10, 100 + n * 10 + 3))
        elif r < 0.65:
            g.add('SELECT k FROM unnest(ARRAY[%s]) k WHERE k @@@ %s ORDER BY k'
                  % (', '.join(q(x) for x in keys + ['nokey']), T))
        else:
            g.add('INSERT INTO orders VALUES (%d, %s, %s, %d) RETURNING id' % (n, T, q(k), n))
    for k in g.r.sample(keys, g.r.randint(0, len(keys))):
        g.settle_any(k)
    g.end()
    g.read_records()


# ---------------------------------------------------------------------------
# issue 19: what another session does while a claim is held, privileges
# changed midway, a table that is not as the extension made it, domain
# checks run inside record-input built-ins and operator-class support
# functions, a nondeterministic collation on key

def peer_step(g, sql, **kw):
    g.steps.append(Step(sql, peer=True, **kw))


# What the other session tries while the first may hold claims (its
# lock_timeout is short): the table lock a written claim holds must make each
# of these wait, and fail, exactly as it does for a held claim.
PEER_DDL = [
    ('txn', 'LOCK idempotency_records IN SHARE MODE NOWAIT'),
    ('txn', 'LOCK idempotency_records IN SHARE ROW EXCLUSIVE MODE NOWAIT'),
    ('txn', 'LOCK idempotency_records IN ROW EXCLUSIVE MODE NOWAIT'),
    ('txn', 'LOCK idempotency_records IN ACCESS EXCLUSIVE MODE'),
    ('txn', 'LOCK idempotency_records IN SHARE MODE'),
    ('any', 'CREATE INDEX peer_idx ON idempotency_records (created_at)'),
    ('any', 'CREATE UNIQUE INDEX peer_unique ON idempotency_records (tenant_id, fingerprint)'),
    ('any', 'CREATE INDEX peer_expr ON idempotency_records (lower(key))'),
    ('any', 'CREATE TRIGGER peer_trg AFTER INSERT OR UPDATE ON idempotency_records '
            'FOR EACH ROW EXECUTE FUNCTION rec_deferred()'),
    ('any', 'CREATE TRIGGER peer_trg_notify AFTER INSERT OR UPDATE OR DELETE ON idempotency_records '
            'FOR EACH ROW EXECUTE FUNCTION rec_notify()'),
    ('any', "SELECT idem_create_index(ARRAY['created_at'], 'peer_extra_idx')"),
    ('any', 'ALTER TABLE idempotency_records ADD COLUMN alt_peer_col int'),
    ('any', 'TRUNCATE idempotency_records'),
    ('txn', 'SELECT key, status FROM idempotency_records WHERE tenant_id = {T} ORDER BY key FOR SHARE NOWAIT'),
]


def shape_other_session_ddl(g):
    """Between claim and complete, a second session takes table locks and
    runs DDL on the records (LOCK ... NOWAIT, CREATE INDEX, CREATE TRIGGER,
    idem_create_index(), ALTER TABLE, TRUNCATE) under a short lock_timeout:
    whether it got its lock or timed out (55P03), what a granted trigger
    then sees, and the holder's own fate must be the same on both sides.
    Sometimes the second session holds SHARE first and the claim waits."""
    g.rows = rows_small(g)
    T = q(g.t)
    g.triggers = ['restore']        # undo a CREATE INDEX/TRIGGER that was granted
    keys = [g.key() for _ in range(g.r.randint(1, 4))]
    g.prior(g.r.sample(keys, g.r.randint(0, min(2, len(keys)))))
    peer_step(g, "SET lock_timeout = '%dms'" % g.r.choice([20, 40]))
    first = g.chance(0.15)
    if first:
        peer_step(g, 'BEGIN')
        peer_step(g, 'LOCK idempotency_records IN SHARE MODE')
        g.add("SET lock_timeout = '40ms'")
    autocommit = g.chance(0.15)
    if not autocommit:
        g.begin()

    def peer_ddl(choices=PEER_DDL):
        how, sql = g.r.choice(choices)
        sql = sql.replace('{T}', T)
        if how == 'txn' or g.chance(0.3):
            peer_step(g, 'BEGIN')
            peer_step(g, sql)
            peer_step(g, g.r.choice(['COMMIT', 'ROLLBACK']))
        else:
            peer_step(g, sql)

    if not first and g.chance(0.4):
        # only read so far (AccessShareLock): DDL that takes a lock compatible
        # with it is granted, then the claims must see what it made (a
        # trigger fires, a unique index refuses, an index is filled)
        g.lookup(g.r.choice(keys))
        peer_ddl([d for d in PEER_DDL if d[1].startswith(('CREATE', 'SELECT idem_create_index'))])
    g.claim_each(keys)
    if first:
        peer_step(g, 'COMMIT')
    for _ in range(g.r.randint(1, 3)):
        peer_ddl()
        if g.chance(0.5):
            g.ops(keys, g.r.randint(1, 3))
    for k in g.r.sample(keys, g.r.randint(0, len(keys))):
        g.settle_any(k)
    if not autocommit:
        g.end()
    peer_step(g, "SELECT tgname FROM pg_trigger WHERE tgrelid = 'idempotency_records'::regclass "
                 "AND NOT tgisinternal ORDER BY 1")
    peer_step(g, "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                 "WHERE i.indrelid = 'idempotency_records'::regclass ORDER BY 1")
    g.read_records()


PRIVILEGE_CHANGES = [
    'REVOKE INSERT ON idempotency_records FROM {R}',
    'REVOKE UPDATE ON idempotency_records FROM {R}',
    'REVOKE DELETE ON idempotency_records FROM {R}',
    'REVOKE SELECT ON idempotency_records FROM {R}',
    'REVOKE INSERT, UPDATE, DELETE ON idempotency_records FROM {R}',
    'GRANT INSERT ON idempotency_records TO {R}',
    'GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_records TO {R}',
    'REVOKE USAGE ON SCHEMA public FROM PUBLIC',
]


def peer_change(g, sql):
    """The second session changes privileges (or the owner); then a lock
    this transaction does not hold yet: both sides read the change there
    (schema.sql, sync_1 .. sync_4)."""
    g.sync += 1
    peer_step(g, sql)
    g.add('SELECT count(*) FROM sync_%d' % g.sync)


def shape_privileges_midway(g):
    """As a non-owner role, a second session REVOKEs INSERT/UPDATE/DELETE
    /SELECT on the records (or GRANTs them back, or GRANTs INSERT to the role
    that had none) between claim and settle: every call's outcome or
    SQLSTATE, and COMMIT's, must be the same on both sides."""
    g.rows = rows_small(g)
    g.triggers = ['restore']        # the grants schema.sql gives, again
    role = g.r.choice(['diff_app', 'diff_app', 'diff_app', 'diff_noinsert'])
    keys = [g.key() for _ in range(g.r.randint(1, 4))]
    g.prior(g.r.sample(keys, g.r.randint(0, min(2, len(keys)))))
    g.add('SET ROLE %s' % role)
    g.begin()
    for k in keys:
        if g.chance(0.85):
            g.claim(k)
        if g.chance(0.25):
            g.biz_write()
    for _ in range(g.r.randint(1, 3)):
        peer_change(g, g.r.choice(PRIVILEGE_CHANGES).replace('{R}', role))
        g.ops(keys, g.r.randint(1, 4))
    if g.chance(0.3):
        peer_change(g, 'GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_records TO %s' % role)
    for k in g.r.sample(keys, g.r.randint(0, len(keys))):
        g.settle_any(k)
    g.end()
    g.add('RESET ROLE')
    g.read_records()


# the alterations altered_table picks from (harness.ALTERATIONS, and the
# row-count trigger of harness.REC_TRIGGERS), with the keys that make each
# one matter
ALTERED = ['alt_check', 'alt_unique', 'alt_unique_lower', 'alt_column_count', 'alt_column_seq',
           'alt_default', 'alt_rls', 'alt_tenant_isolation', 'alt_collation', 'alt_index_collation',
           'alt_partial', 'alt_notnull_status', 'alt_notnull_token', 'alt_rule', 'alt_child', 'count']


def shape_altered_table(g):
    """The table altered before the transaction (a CHECK constraint, an extra
    unique index, a column with a volatile default, a default, a trigger, a
    rule, row-level security with a policy or the extension's tenant
    isolation, a nondeterministic collation on key, an index with a
    collation of its own, a partial index, NOT NULL dropped with a NULL in
    the column, a child table), by this session or by another one: then
    claims, settles and reads.  Claims are written at once on both sides,
    and whatever was added acts the same way."""
    g.rows = rows_small(g)
    T = q(g.t)
    alt = g.r.choice(ALTERED)
    by_peer = alt != 'count' and g.chance(0.3)
    if by_peer:
        g.triggers = ['restore']
        peer_step(g, REC_TRIGGERS[alt])
    else:
        g.triggers = [alt]
    g.note = 'table altered: %s%s' % (alt, ' by the other session' if by_peer else '')
    keys = [g.key() for _ in range(g.r.randint(1, 4))]
    special = {'alt_check': ['bad1'], 'alt_rls': ['hidden1', 'deny1'], 'alt_unique_lower': ['K1', 'k1'],
               'alt_collation': ['K1', 'k1'], 'alt_index_collation': ['K1']}.get(alt, [])
    keys += special
    if alt in ('alt_notnull_status', 'alt_notnull_token'):
        col = 'status' if alt == 'alt_notnull_status' else 'token'
        vals = {'status': "NULL, 1", 'token': "'completed', NULL"}[col]
        g.add("INSERT INTO idempotency_records (tenant_id, key, status, token, expires_at, lease_expires_at, "
              "created_at, updated_at, ttl) VALUES (%s, 'nul1', %s, now() + interval '1 h', NULL, now(), now(), "
              "interval '1 h')" % (T, vals))
        keys.append('nul1')
    g.prior(g.r.sample([k for k in keys if k != 'nul1'], g.r.randint(0, min(2, len(keys) - 1))))
    if alt in ('alt_rls', 'alt_tenant_isolation') or g.chance(0.25):
        g.add('SET ROLE diff_app')
    if alt == 'alt_tenant_isolation' and g.chance(0.8):
        g.add('SET app.tenant = %s' % T)

    def claim_fp(k):
        if alt == 'alt_unique' and g.chance(0.7):
            fp = g.r.choice(['fa', 'fb'])
            if k not in g.claimed:
                g.claimed.append(k)
            g.add("SELECT outcome, token, response FROM idem_claim(%s, %s, fingerprint => %s)"
                  % (T, q(k), q(fp)), cap=k)
        else:
            g.claim(k)

    for _ in range(g.r.randint(1, 2)):
        autocommit = g.chance(0.15)
        if not autocommit:
            g.begin()
        for k in g.r.sample(keys, g.r.randint(1, len(keys))):
            claim_fp(k)
            if g.chance(0.3):
                g.biz_write()
            r = g.r.random()
            if r < 0.15 and alt == 'alt_check':
                g.complete(k, '{"reject": 1}')
            elif r < 0.6:
                g.settle_any(k)
        if g.chance(0.4):
            g.ops(keys, g.r.randint(1, 3))
        if g.chance(0.3):
            g.add("SELECT key, status, token FROM idempotency_records WHERE tenant_id = %s "
                  "ORDER BY key COLLATE \"C\"" % T)
        if not autocommit:
            g.end()
    if alt in ('alt_column_count', 'alt_column_seq'):
        g.add('SELECT key, %s FROM idempotency_records WHERE tenant_id = %s ORDER BY key'
              % ('alt_seen' if alt == 'alt_column_count' else 'alt_n', T))
    g.add('RESET ROLE')
    g.add("SELECT key, status, token, response FROM idempotency_records WHERE tenant_id = %s "
          "ORDER BY key COLLATE \"C\"" % T)


RECORD_INPUTS = [
    "SELECT (jsonb_populate_record(NULL::rec_ref, jsonb_build_object('k', {K}))).k",
    "SELECT * FROM json_populate_recordset(NULL::rec_ref, json_build_array(json_build_object('k', {K}), "
    "json_build_object('k', {K2})))",
    "SELECT * FROM jsonb_populate_recordset(NULL::noisy_ref, jsonb_build_array(jsonb_build_object('k', {K}, "
    "'n', 1)))",
    "SELECT * FROM jsonb_to_record(jsonb_build_object('k', {K})) AS r(k recorded_key)",
    "SELECT * FROM json_to_recordset(json_build_array(json_build_object('k', {K}, 'n', 2))) AS r(k noisy_key, n int)",
    "SELECT ('(' || {K} || ')')::text::rec_ref",
    "SELECT {KROW}::text::rec_ref",         # a constant: the planner may fold the cast
    "SELECT ('(' || {K} || ',3)')::text::noisy_ref",
    "SELECT {K}::recorded_key",
    "SELECT {K}::text::noisy_key",
    "INSERT INTO refs (id, k) SELECT {N}, (jsonb_populate_record(NULL::rec_ref, jsonb_build_object('k', {K}))).k "
    "RETURNING id, k",
    "INSERT INTO refs (id, nk) VALUES ({N}, {K}) RETURNING id, nk",
    "INSERT INTO noisy VALUES ({K}, {N}) RETURNING k, n",
    "INSERT INTO noisy SELECT {K} || g, g FROM generate_series(1, 3) g RETURNING k",
    "SELECT k, n FROM noisy WHERE k >= {K} ORDER BY k",
]


def shape_record_input(g):
    """Held claims, then domain checks that read the records run inside
    record-input built-ins (jsonb_populate_record, json_populate_recordset,
    jsonb_to_record ... AS r(k recorded_key), '(k1)'::text::rec_ref), domain
    casts, and a btree operator class whose PL/pgSQL support function reads
    the records and says so (RAISE NOTICE) while a business INSERT's unique
    index compares keys."""
    g.rows = rows_small(g)
    keys = [g.key() for _ in range(g.r.randint(1, 4))]
    g.prior(g.r.sample(keys, g.r.randint(0, min(2, len(keys)))))
    if g.chance(0.7):
        g.add("INSERT INTO noisy VALUES ('k1', 1), ('k3', 3)")
    autocommit = g.chance(0.15)
    if not autocommit:
        g.begin()
    for k in keys:
        if g.chance(0.85):
            g.claim(k)
        if g.chance(0.2):
            g.settle_any(k)
    n = 0
    for _ in range(g.r.randint(1, 4)):
        n += 1
        sql = g.r.choice(RECORD_INPUTS)
        sql = sql.replace('{K2}', q(g.r.choice(keys + ['nokey']))).replace(
            '{KROW}', q('(%s)' % g.r.choice(keys + ['nokey']))).replace(
            '{K}', q(g.r.choice(keys + ['nokey']))).replace('{N}', str(n))
        g.add(sql)
        if g.chance(0.3):
            g.ops(keys, 1)
    for k in g.r.sample(keys, g.r.randint(0, len(keys))):
        g.settle_any(k)
    if not autocommit:
        g.end()
    g.add('SELECT id, k, nk FROM refs ORDER BY id')
    g.read_records()


def shape_collation_case(g):
    """key under a case-insensitive nondeterministic collation: claims of
    keys that differ only in case (or in ß/ss) meet each other, settles and
    lookups with the other spelling, claim_many of both, a second session
    claiming the other spelling."""
    g.rows = rows_small(g)
    T = q(g.t)
    base = g.r.choice(['order-a', 'Key-X', 'strasse'])
    spellings = {'order-a': ['order-a', 'ORDER-A', 'Order-A'], 'Key-X': ['Key-X', 'key-x', 'KEY-X'],
                 'strasse': ['strasse', 'STRASSE', 'stra\u00dfe']}[base]
    by_peer = g.chance(0.25)
    if by_peer:
        g.triggers = ['restore']
        peer_step(g, REC_TRIGGERS['alt_collation'])
    else:
        g.triggers = ['alt_collation']
    g.note = 'key COLLATE alt_ci%s' % (' (by the other session)' if by_peer else '')
    if g.chance(0.3):
        g.prior([g.r.choice(spellings)])
    g.begin()
    for _ in range(g.r.randint(2, 6)):
        a, b = g.r.choice(spellings), g.r.choice(spellings)
        r = g.r.random()
        if r < 0.35:
            g.claim(a)
        elif r < 0.5 and a in g.claimed:
            g.add("SELECT idem_complete(%s, %s, {tok:%s}, '{\"by\": %d}')" % (T, q(b), a, len(g.steps)))
        elif r < 0.55 and a in g.claimed:
            g.add('SELECT idem_release(%s, %s, {tok:%s})' % (T, q(b), a))
        elif r < 0.65:
            g.lookup(b)
        elif r < 0.75:
            g.claim_many([a, b])
        elif r < 0.8:
            g.forget(b)
        elif r < 0.9:
            g.add('SELECT key, status FROM idempotency_records WHERE tenant_id = %s AND key = %s' % (T, q(b)))
        else:
            peer_step(g, "SET lock_timeout = '30ms'")
            peer_step(g, 'SELECT outcome, token FROM idem_claim(%s, %s)' % (T, q(b)))
    g.end()
    for s_ in spellings:
        if g.chance(0.5):
            g.claim(s_)
    g.add("SELECT key, status, token FROM idempotency_records WHERE tenant_id = %s ORDER BY key COLLATE \"C\""
          % T)


# ---------------------------------------------------------------------------
# issue 34: classes of shape where held claims differed from claims written
# at once; each also runs with tenant isolation on (G.isolation_maybe)

def insert_record_sql(t, k, status='completed'):
    """A record INSERTed by hand (another session's direct write)."""
    return ("INSERT INTO idempotency_records (tenant_id, key, status, token, response, expires_at, "
            "lease_expires_at, created_at, updated_at, ttl) VALUES (%s, %s, %s, 1, '{\"by\": \"hand\"}', "
            "now() + interval '1 h', %s, now(), now(), interval '1 h')"
            % (q(t), q(k), q(status), "now() + interval '1 h'" if status == 'processing' else 'NULL'))


def follow_up(g, k):
    """One later call on a key: any of the extension's calls on it, or the
    second session claiming or inserting it."""
    T = q(g.t)
    r = g.r.random()
    if r < 0.25:
        g.claim(k)
    elif r < 0.33:
        g.add("SELECT outcome, token FROM idem_claim(%s, %s, wait => '20 ms')" % (T, q(k)), cap=k)
    elif r < 0.45:
        g.complete(k)
    elif r < 0.52:
        g.release(k, '{"error": "later"}' if g.chance(0.5) else None)
    elif r < 0.58:
        g.heartbeat(k)
    elif r < 0.64:
        g.add("SELECT idem_checkpoint(%s, %s, {tok:%s}, 'step-1')" % (T, q(k), k))
    elif r < 0.7:
        g.forget(k)
    elif r < 0.78:
        g.lookup(k)
    elif r < 0.9:
        peer_step(g, 'SELECT outcome, token FROM idem_claim(%s, %s)' % (T, q(k)))
    else:
        peer_step(g, insert_record_sql(g.t, k) + ' RETURNING key, status')


def shape_rollback_end(g):
    """Class 1: held claims, then an error that aborts the block (at top
    level, in a savepoint not rolled back to, in nested savepoints), then
    COMMIT, COMMIT AND CHAIN or PREPARE TRANSACTION, which the server turns
    into a rollback; then later transactions claim, complete, release,
    heartbeat, checkpoint and forget the same keys, and a second session
    claims or inserts them."""
    g.rows = rows_small(g)
    T = q(g.t)
    keys = [g.key('h') for _ in range(g.r.randint(1, 4))]
    g.prior(g.r.sample(keys, g.r.randint(0, min(1, len(keys) - 1))))
    g.isolation_maybe()
    g.begin()
    g.claim_each(keys, p_write=0.2, p_settle=0.25)
    fail = g.r.choice(['SELECT 1 / 0', 'INSERT INTO ledger VALUES (1, 1, NULL)',
                       "SELECT (idem_claim(%s, 'h-in-failing')).outcome, 1 / 0" % T])
    where = g.r.choice(['top', 'savepoint', 'savepoint', 'nested', 'nested_back'])
    if where == 'top':
        g.add(fail)
    else:
        g.add('SAVEPOINT s1')
        if g.chance(0.6):
            g.claim(g.key('h'))
        if where in ('nested', 'nested_back'):
            g.add('SAVEPOINT s2')
            if g.chance(0.5):
                g.claim(g.key('h'))
        g.add(fail)
        if where == 'nested_back':
            # back to s2 (alive again), then an error in s1 that stays
            g.add('ROLLBACK TO SAVEPOINT s2')
            if g.chance(0.5):
                g.settle_any(g.r.choice(keys))
            g.add(fail)
    if g.chance(0.3):
        g.add('SELECT 1')           # 25P02
    r = g.r.random()
    if r < 0.45:
        g.add('COMMIT')
    elif r < 0.7:
        g.add('COMMIT AND CHAIN')
        if g.isolation:
            g.set_tenant()
        if g.chance(0.5):
            g.claim(g.r.choice(keys))
        g.read_records()
        g.add(g.r.choice(['COMMIT', 'ROLLBACK']))
    else:
        g.add('PREPARE TRANSACTION {gid}')
        g.add(g.r.choice(['COMMIT PREPARED {gid}', 'ROLLBACK PREPARED {gid}']))
    keys = keys + [k for k in g.claimed if k not in keys]
    for _ in range(g.r.randint(1, 3)):
        block = g.chance(0.6)
        if block:
            g.begin()
        for _ in range(g.r.randint(1, 4)):
            follow_up(g, g.r.choice(keys))
        if block:
            g.end()
    g.read_records()


HOLD_READERS = [
    'SELECT status, token, response FROM idem_lookup({T}, {K})',
    'SELECT state, records, oldest_updated_at, next_expires_at FROM idem_record_states()',
    'SELECT key, status, token, response FROM idempotency_records WHERE tenant_id = {T} ORDER BY key',
    'SELECT rec_count_sql_stable({T}), rec_count_plpgsql_volatile({T}), lookup_status_plpgsql({T}, {K})',
    'SELECT k, lookup_status_sql({T}, k) FROM unnest(ARRAY[{KS}]) k ORDER BY k',
    "SELECT g, (idem_claim({T}, 'cur' || g)).outcome FROM generate_series(1, 3) g ORDER BY g",
]


def shape_hold_cursor(g):
    """Class 2: cursors WITH HOLD (and portals that outlive the transaction)
    declared before and after claims and settles, over idem_lookup,
    idem_record_states(), the table, user functions that read it, or claims
    themselves; moved or fetched partly before COMMIT, fetched after COMMIT
    or ROLLBACK and from a later transaction."""
    g.rows = rows_small(g)
    keys = [g.key() for _ in range(g.r.randint(1, 5))]
    g.prior(g.r.sample(keys, g.r.randint(0, min(2, len(keys)))))
    g.isolation_maybe()
    T = q(g.t)

    def declare(name):
        sql = g.r.choice(HOLD_READERS).replace('{T}', T).replace('{K}', q(g.r.choice(keys))).replace(
            '{KS}', ', '.join(q(k) for k in keys))
        g.add('DECLARE %s %sCURSOR WITH HOLD FOR %s' % (name, g.r.choice(['', 'SCROLL ', 'NO SCROLL ']), sql))
        if g.chance(0.4):
            g.add(g.r.choice(['FETCH 1 FROM %s', 'MOVE 1 IN %s', 'FETCH NEXT FROM %s']) % name)

    cursors = []
    g.begin()
    if g.chance(0.4):
        declare('hc0')
        cursors.append('hc0')
    g.claim_each(keys, p_write=0)
    declare('hc1')
    cursors.append('hc1')
    if g.chance(0.4):
        g.settle_any(g.r.choice(keys))
        declare('hc2')
        cursors.append('hc2')
    for sql in g.r.choice([['COMMIT'], ['COMMIT'], ['COMMIT'], ['ROLLBACK'], ['SELECT 1 / 0', 'COMMIT'],
                           ['COMMIT AND CHAIN', 'COMMIT']]):
        g.add(sql)
    for c in cursors:
        g.add('FETCH ALL FROM %s' % c)
    if g.chance(0.4):
        g.begin()
        g.claim(g.r.choice(keys))
        g.add('FETCH ABSOLUTE 1 FROM %s' % cursors[-1])
        g.end(allow_2pc=False)
    g.add('CLOSE ALL')
    g.read_records()


def shape_inherited(g):
    """Class 3: tables that change what the SQL read of the records returns:
    a child by inheritance holding a completed, failed or processing
    (live or expired) record of the keys, made before the case or by the
    second session midway, or a parent; then claims and settles of the keys,
    reads of the table and of ONLY the table."""
    g.rows = rows_small(g)
    T = q(g.t)
    keys = [g.key() for _ in range(g.r.randint(1, 3))]
    g.prior(g.r.sample(keys, g.r.randint(0, min(1, len(keys)))))
    kind = g.r.choice(['archive', 'archive', 'archive_by_peer', 'parent'])
    g.triggers = ['restore'] if kind == 'archive_by_peer' else ['alt_archive' if kind == 'archive' else 'alt_parent']
    g.note = 'inheritance: %s' % kind

    def fill(table, k):
        status = g.r.choice(['completed', 'failed', 'processing', 'expired'])
        ends = "now() - interval '1 min'" if status == 'expired' else "now() + interval '1 h'"
        return ("INSERT INTO %s (tenant_id, key, status, token, response, expires_at, lease_expires_at, "
                "created_at, updated_at, ttl) VALUES (%s, %s, %s, 7, '{\"archived\": true}', %s, %s, now(), "
                "now(), interval '1 h')"
                % (table, T, q(k), q('processing' if status == 'expired' else status), ends,
                   ends if status in ('processing', 'expired') else 'NULL'))

    table = 'alt_parent' if kind == 'parent' else 'alt_archive'
    if kind != 'archive_by_peer':
        for k in g.r.sample(keys, g.r.randint(1, len(keys))):
            g.add(fill(table, k))
    g.isolation_maybe()
    g.begin()
    for i, k in enumerate(keys):
        if kind == 'archive_by_peer' and i == len(keys) // 2:
            peer_step(g, REC_TRIGGERS['alt_archive'])
            peer_step(g, fill('alt_archive', g.r.choice(keys)))
        if g.chance(0.85):
            g.claim(k)
        if g.chance(0.4):
            g.settle_any(k)
    for _ in range(g.r.randint(0, 3)):
        r = g.r.random()
        if r < 0.3:
            g.read_records()
        elif r < 0.5:
            g.add('SELECT key, status, token FROM ONLY idempotency_records WHERE tenant_id = %s ORDER BY key' % T)
        elif r < 0.7:
            g.lookup(g.r.choice(keys))
        else:
            g.ops(keys, 1)
    g.end()
    g.add('RESET ROLE')
    for k in keys:
        if g.chance(0.5):
            g.claim(k)
    g.add('SELECT tableoid::regclass::text AS tbl, key, status FROM idempotency_records WHERE tenant_id = %s '
          'ORDER BY key, tbl' % T)


OWNER_SETUPS = ['own_owner', 'own_nousage', 'own_noinsert', 'own_noupdate', 'own_noselect']
OWNER_CHANGES = [
    'ALTER TABLE idempotency_records OWNER TO diff_owner',
    'REVOKE INSERT ON idempotency_records FROM diff_owner',
    'REVOKE UPDATE, DELETE ON idempotency_records FROM diff_owner',
    'REVOKE USAGE ON SCHEMA public FROM PUBLIC',
]


def shape_owner_rights(g):
    """Class 4: the records table owned by a non-superuser role (diff_owner)
    that lacks USAGE on the extension's schema, or its own INSERT, UPDATE,
    DELETE or SELECT, set before the case or changed by the second session
    while claims are held (with privileges_midway's sync); callers: the
    superuser, diff_app, the owner itself."""
    g.rows = rows_small(g)
    keys = [g.key() for _ in range(g.r.randint(1, 4))]
    g.prior(g.r.sample(keys, g.r.randint(0, min(2, len(keys)))))
    midway = g.chance(0.3)
    if midway:
        g.triggers = ['restore']
        g.note = 'owner changed midway'
    else:
        g.triggers = [g.r.choice(OWNER_SETUPS)]
        g.note = 'owner: %s' % g.triggers[0]
    if not g.isolation_maybe():
        role = g.r.choice([None, None, 'diff_app', 'diff_owner'])
        if role:
            g.add('SET ROLE %s' % role)
    g.begin()
    g.claim_each(keys, p_settle=0)
    if midway:
        peer_step(g, "SET lock_timeout = '30ms'")
        for sql in g.r.sample(OWNER_CHANGES, g.r.randint(1, 3)):
            peer_change(g, sql)
            if g.chance(0.4):
                g.ops(keys, 1)
    for k in g.r.sample(keys, g.r.randint(0, len(keys))):
        g.settle_any(k)
    g.end()
    g.add('RESET ROLE')
    for k in keys:
        if g.chance(0.4):
            g.claim(k)
    g.read_records()


def peer_action(g, keys):
    """What the other session does inside one of this session's statements
    (schema.sql peer_sql): one text column."""
    T = g.t
    k = g.r.choice(keys)
    r = g.r.random()
    if r < 0.3:
        sql = 'SELECT idem_complete(%s, %s, {tok:%s}, \'{"peer": 1}\')::text' % (q(T), q(k), k)
    elif r < 0.45:
        sql = 'SELECT idem_release(%s, %s, {tok:%s})::text' % (q(T), q(k), k)
    elif r < 0.6:
        sql = 'SELECT idem_forget(%s, %s)::text' % (q(T), q(k))
    elif r < 0.8:
        sql = 'SELECT (idem_claim(%s, %s)).outcome' % (q(T), q(g.r.choice(keys + ['pz'])))
    else:
        sql = "SELECT key || ' ' || status FROM idempotency_records WHERE tenant_id = %s ORDER BY key" % q(T)
    return q(sql), k


def shape_peer_in_statement(g):
    """Class 5: another session commits a completion, release, idem_forget
    or claim of a key (through dblink, schema.sql peer_sql) inside one
    statement of this session, between two claims: in a target list, in a
    PL/pgSQL function (between_claims), in and out of a transaction block."""
    g.rows = rows_small(g)
    T = q(g.t)
    keys = [g.key() for _ in range(g.r.randint(2, 4))]
    # committed history: claims in flight (tokens known), completed records
    for k in keys:
        r = g.r.random()
        if r < 0.5:
            g.claim(k)
        elif r < 0.75:
            g.prior([k])
    g.isolation_maybe()
    block = g.chance(0.75)
    if block:
        g.begin()
        if g.chance(0.4):
            g.claim(g.key())
    for _ in range(g.r.randint(1, 3)):
        sql, k = peer_action(g, keys)
        k2 = g.r.choice([k, k, g.r.choice(keys)])
        r = g.r.random()
        if r < 0.4:
            g.add('SELECT (idem_claim(%s, %s)).outcome AS first, peer_sql(%s) AS peer, '
                  '(SELECT outcome FROM idem_claim(%s, %s)) AS second'
                  % (T, q(g.key('n')), sql, T, q(k2)))
        elif r < 0.7:
            g.add('SELECT between_claims(%s, %s, %s, %s)' % (T, q(g.key('n')), sql, q(k2)))
        elif r < 0.85:
            g.add('SELECT peer_sql(%s) AS peer, (SELECT status FROM idem_lookup(%s, %s)) AS status'
                  % (sql, T, q(k2)))
        else:
            g.add('SELECT peer_sql(%s) AS peer, rec_count_sql_volatile(%s) AS seen' % (sql, T))
        if g.chance(0.3):
            g.lookup(k2)
    if block:
        g.end()
    g.add('RESET ROLE')
    g.read_records()


def shape_settle_no_rights(g):
    """Class 6: settles by an application role without UPDATE or DELETE on
    the records, with the right token and with a wrong one, of held claims
    and of written ones (claimed earlier, or in a savepoint): the SQLSTATE
    must be the same."""
    g.rows = rows_small(g)
    T = q(g.t)
    g.triggers = [g.r.choice(['app_noupdate', 'app_nodelete', 'app_noupdate_nodelete'])]
    g.note = g.triggers[0]
    keys = [g.key() for _ in range(g.r.randint(1, 3))]
    written = [g.key('w') for _ in range(g.r.randint(0, 2))]
    for k in written:
        g.claim(k)                  # committed, processing, token known
    if not g.isolation_maybe():
        g.add('SET ROLE diff_app')
    g.begin()
    for k in keys:
        if g.chance(0.3):
            g.add('SAVEPOINT w_%s' % k)
            g.claim(k)
            g.add('RELEASE SAVEPOINT w_%s' % k)
        else:
            g.claim(k)
    targets = keys + written
    for _ in range(g.r.randint(1, 3)):
        k = g.r.choice(targets)
        tok = g.r.choice(['{tok:%s}' % k, '{tok:%s}' % k, '{tok:%s} + 1' % k, '42'])
        sp = g.chance(0.6)
        if sp:
            g.add('SAVEPOINT s')
        g.add(g.r.choice([
            "SELECT idem_complete(%s, %s, %s, '{\"done\": 1}')",
            'SELECT idem_release(%s, %s, %s)',
            "SELECT idem_release(%s, %s, %s, '{\"error\": 1}')",
            "SELECT idem_heartbeat(%s, %s, %s, '20 min')",
            "SELECT idem_checkpoint(%s, %s, %s, 'p1')",
        ]) % (T, q(k), tok))
        if sp:
            g.add('ROLLBACK TO SAVEPOINT s')
    g.end()
    g.add('RESET ROLE')
    g.read_records()


def shape_toast_locks(g):
    """Class 7: responses too big to stay in the row (about 3.8 kB, stored in
    the TOAST table), and the lock set of every statement observed (the
    harness's 'locks', harness.LOCKS_SQL); a second session REINDEXes the
    TOAST table under a short lock_timeout."""
    g.rows = rows_small(g)
    g.observe_locks = True
    T = q(g.t)
    keys = [g.key() for _ in range(g.r.randint(1, 3))]
    if g.chance(0.3):
        k = keys[0]
        g.add('SELECT idem_complete(%s, %s, token, big_response(%s)) FROM idem_claim(%s, %s)'
              % (T, q(k), q(k), T, q(k)))
    g.isolation_maybe()
    g.begin()
    for k in keys:
        g.claim(k)
        if g.chance(0.3):
            g.biz_write()
        r = g.r.random()
        if r < 0.55:
            g.add('SELECT idem_complete(%s, %s, {tok:%s}, big_response(%s))' % (T, q(k), k, q(k)))
        elif r < 0.75:
            g.add('SELECT idem_release(%s, %s, {tok:%s}, big_response(%s))' % (T, q(k), k, q(k)))
        elif r < 0.85:
            g.add("SELECT idem_checkpoint(%s, %s, {tok:%s}, 'p1', big_response(%s))" % (T, q(k), k, q(k)))
        else:
            g.settle_any(k)
        if g.chance(0.3):
            peer_step(g, "SET lock_timeout = '30ms'")
            peer_step(g, "DO $$BEGIN EXECUTE format('REINDEX TABLE %s', (SELECT reltoastrelid::regclass "
                         "FROM pg_class WHERE oid = 'idempotency_records'::regclass)); END$$")
    if g.chance(0.3):
        g.lookup(g.r.choice(keys))
    g.end()
    for k in keys:
        if g.chance(0.5):
            g.begin()
            g.claim(k)
            g.end()
    g.add("SELECT key, status, length(response::text) FROM idempotency_records WHERE tenant_id = %s ORDER BY key"
          % T)


EXPLAINS = [
    'EXPLAIN (COSTS ON) SELECT * FROM idempotency_records WHERE tenant_id = {T}',
    'EXPLAIN SELECT key, status FROM idempotency_records WHERE tenant_id = {T} AND key = {K}',
    'EXPLAIN (COSTS OFF) SELECT count(*) FROM idempotency_records',
    'EXPLAIN (COSTS ON, VERBOSE) SELECT rec_count_sql_stable({T})',
    'EXPLAIN SELECT * FROM idem_claim({T}, {K})',
    'EXPLAIN (FORMAT JSON, COSTS ON) UPDATE idempotency_records SET fingerprint = {T} WHERE tenant_id = {T}',
    "EXPLAIN (COSTS ON) SELECT l.id FROM ledger l JOIN idempotency_records r ON r.key = 'k' || l.id "
    "WHERE r.tenant_id = {T}",
    "EXPLAIN (COSTS ON) SELECT * FROM idempotency_records WHERE status = 'processing' ORDER BY expires_at",
]


def shape_explain(g):
    """Class 8: EXPLAIN (without ANALYZE; with and without costs, of queries
    on idempotency_records and of claims) while claims are held, then after
    settles and after COMMIT: the plan text is an observation."""
    g.rows = rows_small(g)
    T = q(g.t)
    keys = [g.key() for _ in range(g.r.randint(1, 40))]
    g.prior(g.r.sample(keys, g.r.randint(0, min(2, len(keys)))))
    g.isolation_maybe()

    def explain():
        g.add(g.r.choice(EXPLAINS).replace('{T}', T).replace('{K}', q(g.r.choice(keys))))

    g.begin()
    for k in keys:
        g.claim(k)
    for _ in range(g.r.randint(1, 3)):
        explain()
    for k in g.r.sample(keys, g.r.randint(0, min(3, len(keys)))):
        g.settle_any(k)
        if g.chance(0.5):
            explain()
    g.end()
    explain()


SHAPES = [
    ('where_insert_select', shape_where_insert_select, 6),
    ('where_update_delete', shape_where_update_delete, 3),
    ('target_list', shape_target_list, 4),
    ('cte_dml', shape_cte_dml, 4),
    ('cursor', shape_cursor, 4),
    ('function_reader', shape_function_reader, 4),
    ('function_claimer', shape_function_claimer, 3),
    ('trigger_business', shape_trigger_business, 4),
    ('trigger_records', shape_trigger_records, 4),
    ('update_lookup', shape_update_lookup, 3),
    ('parallel', shape_parallel, 3),
    ('savepoint', shape_savepoint, 5),
    ('prepared', shape_prepared, 3),
    ('over_cap', shape_over_cap, 3),
    ('claim_many_mix', shape_claim_many_mix, 4),
    ('settle_mix', shape_settle_mix, 8),
    ('copy', shape_copy, 3),
    ('two_phase', shape_two_phase, 3),
    ('read_only_commit', shape_read_only_commit, 3),
    ('isolation', shape_isolation, 4),
    ('autocommit', shape_autocommit, 4),
    ('sweep', shape_sweep, 2),
    ('same_key', shape_same_key, 4),
    ('procedure', shape_procedure, 3),
    ('deferred_settle', shape_deferred_settle, 3),
    ('roles', shape_roles, 2),
    ('exotic_sql', shape_exotic_sql, 5),
    ('two_sessions', shape_two_sessions, 4),
    ('table_direct', shape_table_direct, 4),
    ('hidden_readers', shape_hidden_readers, 4),
    ('other_session_ddl', shape_other_session_ddl, 4),
    ('privileges_midway', shape_privileges_midway, 3),
    ('altered_table', shape_altered_table, 6),
    ('record_input', shape_record_input, 4),
    ('collation_case', shape_collation_case, 3),
    ('rollback_end', shape_rollback_end, 3),
    ('hold_cursor', shape_hold_cursor, 3),
    ('inherited', shape_inherited, 1),
    ('owner_rights', shape_owner_rights, 3),
    ('peer_in_statement', shape_peer_in_statement, 2),
    ('settle_no_rights', shape_settle_no_rights, 2),
    ('toast_locks', shape_toast_locks, 2),
    ('explain', shape_explain, 2),
]
