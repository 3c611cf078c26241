/*
 * statements.c
 *		The statement catalogue: every SQL statement the extension runs on
 *		idempotency_records, with its argument and result types.
 *
 * Each statement is written once, here, as text with the table left open
 * ("%1$s") and the recovery point columns (1.1) and the holder column
 * (1.4) as placeholders: a table still at an older version has none.  store_attach.c prepares them on the table or on one of its
 * shards; store_sweep.c also sends the cluster sweeps as text to each
 * placement.  Each statement of one key targets one (tenant_id, key), and
 * "now" is computed in C and passed as a parameter.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "lib/stringinfo.h"

#include "idempotency.h"
#include "statements.h"


/*
 * Statement texts.  "%1$s" is the quoted, schema-qualified table name.
 * Operators are qualified so that nothing in search_path can capture them.
 */
#define EQ " OPERATOR(pg_catalog.=) "
#define BY_KEY " WHERE tenant_id" EQ "$1 AND key" EQ "$2 "

/*
 * now + ttl, where now is parameter n.  timestamptz + interval is STABLE
 * (it depends on TimeZone), and Citus refuses a STABLE function over a
 * column in an UPDATE of a distributed table.  Adding in UTC is IMMUTABLE
 * and gives the same instant for the intervals the functions store (whole
 * microseconds, no days or months).
 */
#define EXPIRY(n) EXPIRY_AFTER("$" #n)
#define EXPIRY_AFTER(t) \
	" pg_catalog.timezone('UTC', pg_catalog.timezone('UTC', " t ")" \
	" OPERATOR(pg_catalog.+) ttl) "

/*
 * An expired row that is a stale claim: the sweeper releases it, or fails
 * it with stale_action = 'fail'.  An expired processing row with a
 * recovery point is past its retention, not a stale claim: it is deleted
 * like an expired completed or failed record, in either case.
 */
#define STALE_CLAIM " (status" EQ "'processing' AND @NO_POINT@) "

/*
 * Until when a record answers claims as it is (idem_record_live_until):
 * a claim's lease while it is processing, its expiry otherwise.  A
 * processing record with a recovery point expires only when its retention
 * after the lease ends, so that the next holder can resume it.
 */
#define LIVE_UNTIL \
	" CASE WHEN status" EQ "'processing'" \
	" THEN COALESCE(lease_expires_at, expires_at) ELSE expires_at END "

/* a batch of fresh processing records: keys $2, tokens $3, fingerprints $7 */
#define INSERT_MANY \
	"INSERT INTO %1$s (tenant_id, key, token, expires_at, lease_expires_at," \
	" created_at, updated_at, ttl, status, fingerprint)" \
	" SELECT $1, u.key, u.token, $4, $4, $5, $5, $6, 'processing', u.fingerprint" \
	" FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.text[])," \
	" pg_catalog.unnest($3::pg_catalog.int8[]), pg_catalog.unnest($7::pg_catalog.text[]))" \
	" AS u(key, token, fingerprint)"

/*
 * What a sweep at $3 removes of a neighbour (claim_sweep.c): an expired
 * record, but not a stale claim when $4 (stale_action = 'fail': the sweep
 * fails those, the claim leaves them to it).
 */
#define SWEEPABLE_AT_3 \
	" expires_at OPERATOR(pg_catalog.<=) $3 AND NOT ($4 AND" STALE_CLAIM ") "

/*
 * The entries (IdemStatement, statements.h).  ARGS and RESULT count what
 * they are given, so a statement is added or changed in this one place.
 */
#define ARGS(...) \
	.argtypes = {__VA_ARGS__}, .nargs = lengthof(((Oid[]) {__VA_ARGS__}))
#define RESULT(...) \
	.columns = {__VA_ARGS__}, .ncolumns = lengthof(((Oid[]) {__VA_ARGS__}))
#define RECORD_COLUMNS TEXTOID, INT8OID, TEXTOID, JSONBOID, TIMESTAMPTZOID, \
	TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID, XIDOID, TEXTOID, JSONBOID, \
	TEXTOID
#define SWEPT_COLUMNS BOOLOID, TIMESTAMPTZOID

/*
 * One sweep batch: up to $2 rows expired at $1 whose expiry is $3 or later,
 * in expiry order (filter: which of them), taken with lock; the DELETE
 * keeps those that pass recheck.  Returns SWEPT_COLUMNS: returned (a stale
 * claim?) and the expiry.
 */
#define SWEEP_BATCH(filter, lock, recheck, returned) \
	"DELETE FROM %1$s WHERE ctid" EQ "ANY (ARRAY(" \
	" SELECT ctid FROM %1$s WHERE expires_at OPERATOR(pg_catalog.<=) $1" \
	" AND expires_at OPERATOR(pg_catalog.>=) $3" filter \
	" ORDER BY expires_at LIMIT $2" lock "))" recheck \
	" RETURNING" returned ", expires_at"
/*
 * The expiry is rechecked as a function call, not an operator: the planner
 * cannot take it for an index condition.  With statistics that predate a
 * backlog (expiries all in the future), an operator looked selective
 * enough that the DELETE walked the whole backlog in the expires_at index,
 * testing each entry against the batch's ctids, instead of fetching the
 * batch by ctid: 12 s and more for one batch of a 3,000,000-row backlog.
 */
#define UNLOCKED_RECHECK(filter) \
	" AND xmax" EQ "'0'::pg_catalog.xid" \
	" AND pg_catalog.timestamptz_le(expires_at, $1)" filter

const IdemStatement idem_statements[NUM_QUERIES] = {
	[Q_READ] = {
		.text =
		"SELECT status, token, fingerprint, response, expires_at, lease_expires_at,"
		" created_at, updated_at, xmin, @POINT@, @STATE@, @HOLDER@ FROM %1$s" BY_KEY,
		ARGS(TEXTOID, TEXTOID),
		RESULT(RECORD_COLUMNS),
	},

	/* one row per fresh key; RETURNING says which went in */
	[Q_INSERT_MANY] = {
		.text = INSERT_MANY " ON CONFLICT (tenant_id, key) DO NOTHING RETURNING key",
		ARGS(TEXTOID, TEXTARRAYOID, INT8ARRAYOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
			INTERVALOID, TEXTARRAYOID),
		RESULT(TEXTOID),
	},

	/*
	 * the same without speculative insertion: any existing key is an error,
	 * so every key goes in and none needs returning
	 */
	[Q_INSERT_MANY_PLAIN] = {
		.text = INSERT_MANY,
		ARGS(TEXTOID, TEXTARRAYOID, INT8ARRAYOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
			INTERVALOID, TEXTARRAYOID),
	},

	/* $8: the holder (not named before 1.4: the claim has none then) */
	[Q_INSERT] = {
		.text =
		"INSERT INTO %1$s (tenant_id, key, token, expires_at, lease_expires_at,"
		" created_at, updated_at, ttl, status, fingerprint@HOLDER_COLUMN@)"
		" VALUES ($1, $2, $3, $4, $4, $5, $5, $6, 'processing', $7@HOLDER_VALUE@)"
		" ON CONFLICT (tenant_id, key) DO NOTHING",
		ARGS(TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID, INTERVALOID,
			TEXTOID, TEXTOID),
	},

	/*
	 * $8: a new lifetime (expired record reused) rather than a takeover;
	 * $10: the new claimant's holder, which replaces the old one
	 */
	[Q_TAKE_OVER] = {
		.text =
		"UPDATE %1$s SET status = 'processing', token = $9,"
		" fingerprint = CASE WHEN $8 THEN $4 ELSE COALESCE($4, fingerprint) END,"
		" created_at = CASE WHEN $8 THEN $5 ELSE created_at END,"
		" response = NULL, lease_expires_at = $6, ttl = $7, updated_at = $5,"
		" expires_at = CASE WHEN NOT $8 AND @HAS_POINT@"
		" THEN pg_catalog.timezone('UTC', pg_catalog.timezone('UTC', $6) OPERATOR(pg_catalog.+) $7)"
		" ELSE $6 END"
		" @CHECKPOINT_RESET@@HOLDER_SET@"
		BY_KEY "AND token" EQ "$3 AND" LIVE_UNTIL "OPERATOR(pg_catalog.<=) $5"
		" RETURNING token",
		ARGS(TEXTOID, TEXTOID, INT8OID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
			INTERVALOID, BOOLOID, INT8OID, TEXTOID),
		RESULT(INT8OID),
	},

	[Q_FAIL_STALE] = {
		.text =
		"UPDATE %1$s SET status = 'failed', response = $4, lease_expires_at = NULL,"
		" expires_at =" EXPIRY(5) ", updated_at = $5"
		BY_KEY "AND token" EQ "$3 AND status" EQ "'processing' AND @NO_POINT@"
		" AND" LIVE_UNTIL "OPERATOR(pg_catalog.<=) $5"
		" RETURNING status, token, fingerprint, response, expires_at, lease_expires_at,"
		" created_at, updated_at, xmin, @POINT@, @STATE@, @HOLDER@",
		ARGS(TEXTOID, TEXTOID, INT8OID, JSONBOID, TIMESTAMPTZOID),
		RESULT(RECORD_COLUMNS),
	},

	[Q_FINISH] = {
		.text =
		"UPDATE %1$s SET status = $4, response = $5, lease_expires_at = NULL,"
		" expires_at =" EXPIRY(6) ", updated_at = $6"
		BY_KEY "AND token" EQ "$3 AND status" EQ "'processing'",
		ARGS(TEXTOID, TEXTOID, INT8OID, TEXTOID, JSONBOID, TIMESTAMPTZOID),
	},

	/* a release without failure: a record with a recovery point is kept */
	[Q_DELETE_CLAIM] = {
		.text =
		"DELETE FROM %1$s" BY_KEY "AND token" EQ "$3 AND status" EQ "'processing'"
		" @NO_CHECKPOINT@",
		ARGS(TEXTOID, TEXTOID, INT8OID),
	},

	/*
	 * ... and is handed on instead: its lease ends now and it gets a new
	 * token (the releasing holder's is refused from now on), so the next
	 * claim takes it over and resumes from its recovery point, while its
	 * retention lasts.
	 */
	[Q_HAND_ON] = {
		.text =
		"UPDATE %1$s SET token = $4, lease_expires_at = $5, expires_at =" EXPIRY(5) ","
		" updated_at = $5"
		BY_KEY "AND token" EQ "$3 AND status" EQ "'processing'"
		" AND recovery_point IS NOT NULL",
		ARGS(TEXTOID, TEXTOID, INT8OID, INT8OID, TIMESTAMPTZOID),
	},

	/* $7: a new lease end, or NULL to keep the lease */
	[Q_CHECKPOINT] = {
		.text =
		"UPDATE %1$s SET recovery_point = $4, state = $5, updated_at = $6,"
		" lease_expires_at = COALESCE($7, lease_expires_at),"
		" expires_at =" EXPIRY_AFTER("COALESCE($7, lease_expires_at, expires_at)")
		BY_KEY "AND token" EQ "$3 AND status" EQ "'processing'",
		ARGS(TEXTOID, TEXTOID, INT8OID, TEXTOID, JSONBOID, TIMESTAMPTZOID,
			TIMESTAMPTZOID),
	},

	[Q_EXTEND_LEASE] = {
		.text =
		"UPDATE %1$s SET lease_expires_at = $4, updated_at = $5,"
		" expires_at = CASE WHEN @HAS_POINT@ THEN" EXPIRY(4) "ELSE $4 END"
		BY_KEY "AND token" EQ "$3 AND status" EQ "'processing'",
		ARGS(TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID),
	},

	[Q_FORGET] = {
		.text = "DELETE FROM %1$s" BY_KEY,
		ARGS(TEXTOID, TEXTOID),
	},

	/*
	 * Sweep batches lock their rows with SKIP LOCKED, so they never wait on
	 * a live claim, and re-check the expiry on the newest row version.
	 */
	[Q_SWEEP_ALL] = {
		.text = SWEEP_BATCH("", " FOR UPDATE SKIP LOCKED", "", STALE_CLAIM),
		ARGS(TIMESTAMPTZOID, INT4OID, TIMESTAMPTZOID),
		RESULT(SWEPT_COLUMNS),
	},

	[Q_SWEEP_TERMINAL] = {
		.text = SWEEP_BATCH(" AND NOT" STALE_CLAIM, " FOR UPDATE SKIP LOCKED", "", " false"),
		ARGS(TIMESTAMPTZOID, INT4OID, TIMESTAMPTZOID),
		RESULT(SWEPT_COLUMNS),
	},

	/*
	 * The same batches without the row locks, for the rows that were neither
	 * locked nor changed since they were written (xmax 0): nearly every
	 * expired row.  Locking a row before deleting it writes its page and a
	 * WAL record twice.  A row whose xmax is set is left to the locking
	 * statement above (idem_store_sweep_expired, store_sweep.c), so this
	 * one meets a live claim only when the claim locked the row after the
	 * batch read it, a race its caller bounds with lock_timeout.  The
	 * DELETE checks the expiry again on whichever row version it deletes.
	 */
	[Q_SWEEP_ALL_UNLOCKED] = {
		.text = SWEEP_BATCH("", "", UNLOCKED_RECHECK(""), STALE_CLAIM),
		ARGS(TIMESTAMPTZOID, INT4OID, TIMESTAMPTZOID),
		RESULT(SWEPT_COLUMNS),
	},

	[Q_SWEEP_TERMINAL_UNLOCKED] = {
		.text = SWEEP_BATCH(" AND NOT" STALE_CLAIM, "",
							UNLOCKED_RECHECK(" AND NOT" STALE_CLAIM), " false"),
		ARGS(TIMESTAMPTZOID, INT4OID, TIMESTAMPTZOID),
		RESULT(SWEPT_COLUMNS),
	},

	/* every expired row with one given expiry (see idem_store_sweep_group, store_sweep.c) */
	[Q_SWEEP_GROUP_ALL] = {
		.text =
		"DELETE FROM %1$s WHERE ctid" EQ "ANY (ARRAY("
		" SELECT ctid FROM %1$s WHERE expires_at" EQ "$1 FOR UPDATE SKIP LOCKED))"
		" RETURNING" STALE_CLAIM ", expires_at",
		ARGS(TIMESTAMPTZOID),
		RESULT(SWEPT_COLUMNS),
	},

	[Q_SWEEP_GROUP_TERMINAL] = {
		.text =
		"DELETE FROM %1$s WHERE ctid" EQ "ANY (ARRAY("
		" SELECT ctid FROM %1$s WHERE expires_at" EQ "$1"
		" AND NOT" STALE_CLAIM "FOR UPDATE SKIP LOCKED))"
		" RETURNING false, expires_at",
		ARGS(TIMESTAMPTZOID),
		RESULT(SWEPT_COLUMNS),
	},

	[Q_SWEEP_FAIL_STALE] = {
		.text =
		"UPDATE %1$s SET status = 'failed', response = $3, lease_expires_at = NULL,"
		" expires_at =" EXPIRY(1) ", updated_at = $1"
		" WHERE ctid" EQ "ANY (ARRAY("
		" SELECT ctid FROM %1$s WHERE expires_at OPERATOR(pg_catalog.<=) $1"
		" AND" STALE_CLAIM
		" ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED))",
		ARGS(TIMESTAMPTZOID, INT4OID, JSONBOID),
	},

	/*
	 * A sweep of a distributed table from one node: Citus runs these on
	 * every shard in parallel, and refuses ctid, LIMIT and FOR UPDATE in a
	 * multi-shard statement.  A row being settled is waited for, then
	 * checked again in its new version, as an UPDATE or DELETE does under
	 * READ COMMITTED.
	 */
	[Q_CLUSTER_SWEEP_STALE] = {
		.text =
		"DELETE FROM %1$s WHERE expires_at OPERATOR(pg_catalog.<=) $1"
		" AND" STALE_CLAIM,
		ARGS(TIMESTAMPTZOID),
	},

	[Q_CLUSTER_SWEEP_TERMINAL] = {
		.text =
		"DELETE FROM %1$s WHERE expires_at OPERATOR(pg_catalog.<=) $1"
		" AND NOT" STALE_CLAIM,
		ARGS(TIMESTAMPTZOID),
	},

	[Q_CLUSTER_SWEEP_FAIL_STALE] = {
		.text =
		"UPDATE %1$s SET status = 'failed', response = $2, lease_expires_at = NULL,"
		" expires_at =" EXPIRY(1) ", updated_at = $1"
		" WHERE expires_at OPERATOR(pg_catalog.<=) $1 AND" STALE_CLAIM,
		ARGS(TIMESTAMPTZOID, JSONBOID),
	},
	/*
	 * A fresh claim's neighbours (claim_sweep.c): the next $5 records of
	 * tenant $1 after key $2 in key order, through the primary key, then,
	 * when fewer follow, the tenant's first ones (the window wraps), and
	 * whether a sweep at $3 would delete each.  The LIMITs are the window:
	 * at most $5 rows are read however few of them expired (the second
	 * branch runs only when the first gave fewer); which to delete is
	 * decided by the caller.
	 */
	[Q_CLAIM_SWEEP_LOOK] = {
		.text =
		"(SELECT ctid, xmin," SWEEPABLE_AT_3 "FROM %1$s WHERE tenant_id" EQ "$1"
		" AND key OPERATOR(pg_catalog.>) $2 ORDER BY key LIMIT $5)"
		" UNION ALL"
		" (SELECT ctid, xmin," SWEEPABLE_AT_3 "FROM %1$s WHERE tenant_id" EQ "$1"
		" AND key OPERATOR(pg_catalog.<) $2 ORDER BY key LIMIT $5)"
		" LIMIT $5",
		ARGS(TEXTOID, TEXTOID, TIMESTAMPTZOID, BOOLOID, INT4OID),
		RESULT(TIDOID, XIDOID, BOOLOID),
	},

	/*
	 * ... and those of them ($1) still so, on their newest version, locked
	 * with SKIP LOCKED (a claim never waits for them), deleted.  Returns
	 * whether each was a stale claim.
	 */
	[Q_CLAIM_SWEEP_DELETE] = {
		.text =
		"DELETE FROM %1$s WHERE ctid" EQ "ANY (ARRAY("
		" SELECT ctid FROM %1$s WHERE ctid" EQ "ANY ($1) AND tenant_id" EQ "$2"
		" AND" SWEEPABLE_AT_3 "FOR UPDATE SKIP LOCKED))"
		" RETURNING" STALE_CLAIM,
		ARGS(TIDARRAYOID, TEXTOID, TIMESTAMPTZOID, BOOLOID),
		RESULT(BOOLOID),
	},
};

/*
 * The parts of a statement that name the recovery point columns, and what
 * stands in for them while the 1.0 objects are installed.
 */
static const char *const checkpoint_parts[][3] = {
	{"@POINT@", "recovery_point", "NULL::pg_catalog.text"},
	{"@STATE@", "state", "NULL::pg_catalog.jsonb"},
	{"@CHECKPOINT_RESET@",
		", recovery_point = CASE WHEN $8 THEN NULL ELSE recovery_point END,"
		" state = CASE WHEN $8 THEN NULL ELSE state END", ""},
	{"@NO_CHECKPOINT@", "AND recovery_point IS NULL", ""},
	{"@NO_POINT@", "recovery_point IS NULL", "true"},
	{"@HAS_POINT@", "recovery_point IS NOT NULL", "false"},
};

/*
 * The parts of a statement that name the holder column, and what stands in
 * for them before 1.4.  An unused parameter ($8 of Q_INSERT, $10 of
 * Q_TAKE_OVER) is allowed: the statements are prepared with their types.
 */
static const char *const holder_parts[][3] = {
	{"@HOLDER@", "holder", "NULL::pg_catalog.text"},
	{"@HOLDER_COLUMN@", ", holder", ""},
	{"@HOLDER_VALUE@", ", $8", ""},
	{"@HOLDER_SET@", ", holder = $10", ""},
};

/* Every "from" in text replaced by "to", in a new string. */
char *
idem_replace_all(const char *text, const char *from, const char *to)
{
	StringInfoData out;
	const char *at;

	initStringInfo(&out);
	while ((at = strstr(text, from)) != NULL)
	{
		appendBinaryStringInfo(&out, text, at - text);
		appendStringInfoString(&out, to);
		text = at + strlen(from);
	}
	appendStringInfoString(&out, text);
	return out.data;
}

/*
 * Replace every placeholder of parts (n of them) in text, which is freed:
 * the columns, or (present false) what stands in for them.
 */
static char *
expand_parts(char *text, const char *const (*parts)[3], size_t n, bool present)
{
	for (size_t i = 0; i < n; i++)
	{
		char	   *expanded = idem_replace_all(text, parts[i][0],
										   present ? parts[i][1] : parts[i][2]);

		pfree(text);
		text = expanded;
	}
	return text;
}


/*
 * The text of statement q on relation (quoted and schema-qualified, or
 * "%s" for a command run on each placement), for a table with the recovery
 * point columns or without them, and with the holder column or without it;
 * palloc'd.
 */
char *
idem_statement_text(IdemQuery q, const char *relation, bool has_checkpoints,
					bool has_holder)
{
	StringInfoData sql;
	char	   *text;

	initStringInfo(&sql);
	appendStringInfo(&sql, idem_statements[q].text, relation);
	text = expand_parts(sql.data, checkpoint_parts, lengthof(checkpoint_parts),
						has_checkpoints);
	return expand_parts(text, holder_parts, lengthof(holder_parts), has_holder);
}
