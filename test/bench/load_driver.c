/*
 * load_driver.c
 *		Closed-loop load generator for the benchmark scenarios pgbench cannot
 *		drive: the seed articles' Redis pattern (scenario 6), and the same
 *		business transaction without idempotency or with the extension, so
 *		that the Redis rows are compared inside one harness.
 *
 * One thread per client, each with its own libpq connection (statements
 * prepared once, as pgbench -M prepared does) and, for the Redis pattern,
 * its own hiredis connection.  Every operation is timed end to end.
 *
 * Modes, per operation (k = a key unique to the run):
 *	 bare	BEGIN; INSERT INTO payments; COMMIT
 *	 redis	SET idem:k '{"state":"STARTED"}' NX EX 60;
 *			BEGIN; INSERT INTO payments; COMMIT;
 *			SET idem:k '{"state":"COMPLETED","response":...}' EX 86400
 *			(the articles' middleware: claim, business transaction in
 *			PostgreSQL, result stored in Redis)
 *	 claim	BEGIN; SELECT token FROM idem_claim(t, k); INSERT INTO payments;
 *			SELECT idem_complete(t, k, token, response); COMMIT
 *	 bare-pipelined
 *			the bare transaction in one round trip (libpq pipeline mode)
 *	 claim-pipelined
 *			the claim mode in the fewest round trips: BEGIN + claim in one
 *			(pipeline flushed without a sync), then INSERT + complete +
 *			COMMIT in a second (pipeline sync): 2 round trips
 * --work-ms sleeps inside the transaction (before COMMIT), the articles'
 * simulated work.  --pace-ms sleeps between operations (light load).
 *
 * Runs for --seconds, or with --until-signal until SIGTERM/SIGINT; SIGUSR1
 * forgets the latencies recorded so far (to time only a window).
 * --warmup S: operations ending in the first S seconds are done but not
 * counted (connection warm-up: caches, plans), like pgbench's log window.
 *
 * Prints one line: ops=N seconds=S tps=X p50_us=A p99_us=B max_us=C errors=E
 * total_ops=T, where ops, seconds and the percentiles cover the counted
 * window and total_ops every operation (for costs per operation).
 *
 * Build: cc -O2 -o load_driver load_driver.c -I$(pg_config --includedir)
 *		  -lpq -lhiredis -lpthread
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <libpq-fe.h>

enum mode
{
	MODE_BARE,
	MODE_REDIS,
	MODE_CLAIM,
	MODE_BARE_PIPELINED,
	MODE_CLAIM_PIPELINED
};

static struct
{
	enum mode	mode;
	const char *conninfo;
	const char *redis_host;
	int			redis_port;
	int			threads;
	double		seconds;
	double		warmup;
	int			until_signal;
	int			work_ms;
	int			pace_ms;
	long long	run;
	const char *tenant;
	const char *response;
} opt = {
	.mode = MODE_BARE,
	.conninfo = "",
	.redis_host = "127.0.0.1",
	.redis_port = 6379,
	.threads = 16,
	.seconds = 10,
	.tenant = "bench",
	.response = "{}",
};

static volatile sig_atomic_t stop_requested = 0;
static volatile sig_atomic_t window_generation = 0;
static atomic_int errors;
static atomic_long total_ops;
static pthread_barrier_t start_barrier;
static double counted_from;		/* start + warmup, set before the threads run */

typedef struct thread_state
{
	int			id;
	PGconn	   *pg;
	redisContext *redis;
	uint32_t   *lat_us;			/* per-operation latency, microseconds */
	size_t		n;
	size_t		cap;
	int			failed;
} thread_state;

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void
sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long) (ms % 1000) * 1000000L};

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !stop_requested)
		;
}

static void
on_stop(int sig)
{
	(void) sig;
	stop_requested = 1;
}

static void
on_window(int sig)
{
	(void) sig;
	window_generation++;
}

/* Run a prepared statement; returns 0 on success, counts and reports errors. */
static int
pg_exec(thread_state *t, const char *stmt, int nparams, const char *const *params,
		char *out, size_t outlen)
{
	PGresult   *res = PQexecPrepared(t->pg, stmt, nparams, params, NULL, NULL, 0);
	ExecStatusType st = PQresultStatus(res);
	int			rc = 0;

	if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
	{
		if (atomic_fetch_add(&errors, 1) < 5)
			fprintf(stderr, "load_driver: thread %d: %s: %s", t->id, stmt,
					PQerrorMessage(t->pg));
		rc = -1;
	}
	else if (out != NULL && PQntuples(res) > 0)
		snprintf(out, outlen, "%s", PQgetvalue(res, 0, 0));
	PQclear(res);
	return rc;
}

static int
pg_prepare(thread_state *t, const char *name, const char *sql)
{
	PGresult   *res = PQprepare(t->pg, name, sql, 0, NULL);
	int			ok = PQresultStatus(res) == PGRES_COMMAND_OK;

	if (!ok)
		fprintf(stderr, "load_driver: prepare %s: %s", name, PQerrorMessage(t->pg));
	PQclear(res);
	return ok ? 0 : -1;
}

/* A redis command that must succeed; returns 1 when the reply is OK. */
static int
redis_set(thread_state *t, const char *fmt, const char *key, const char *value, int ex)
{
	redisReply *r = redisCommand(t->redis, fmt, key, value, ex);
	int			ok;

	if (r == NULL)
	{
		if (atomic_fetch_add(&errors, 1) < 5)
			fprintf(stderr, "load_driver: thread %d: redis: %s\n", t->id, t->redis->errstr);
		t->failed = 1;
		return 0;
	}
	ok = r->type == REDIS_REPLY_STATUS && strcmp(r->str, "OK") == 0;
	if (r->type == REDIS_REPLY_ERROR && atomic_fetch_add(&errors, 1) < 5)
		fprintf(stderr, "load_driver: thread %d: redis: %s\n", t->id, r->str);
	freeReplyObject(r);
	return ok;
}

/* The business transaction; optional claim/complete of the extension. */
static int
business_tx(thread_state *t, const char *key, const char *account, const char *amount)
{
	const char *ins[2] = {account, amount};
	char		token[32] = "";

	if (pg_exec(t, "begin", 0, NULL, NULL, 0) != 0)
		return -1;
	if (opt.mode == MODE_CLAIM)
	{
		const char *claim[2] = {opt.tenant, key};

		if (pg_exec(t, "claim", 2, claim, token, sizeof(token)) != 0 || token[0] == '\0')
			goto fail;
	}
	if (pg_exec(t, "insert", 2, ins, NULL, 0) != 0)
		goto fail;
	if (opt.work_ms > 0)
		sleep_ms(opt.work_ms);
	if (opt.mode == MODE_CLAIM)
	{
		const char *complete[4] = {opt.tenant, key, token, opt.response};

		if (pg_exec(t, "complete", 4, complete, NULL, 0) != 0)
			goto fail;
	}
	return pg_exec(t, "commit", 0, NULL, NULL, 0);

fail:
	pg_exec(t, "rollback", 0, NULL, NULL, 0);
	return -1;
}

/*
 * Pipeline mode: queue a prepared statement without waiting for it.
 */
static int
pipe_send(thread_state *t, const char *stmt, int nparams, const char *const *params)
{
	if (PQsendQueryPrepared(t->pg, stmt, nparams, params, NULL, NULL, 0))
		return 0;
	if (atomic_fetch_add(&errors, 1) < 5)
		fprintf(stderr, "load_driver: thread %d: send %s: %s", t->id, stmt,
				PQerrorMessage(t->pg));
	t->failed = 1;
	return -1;
}

/*
 * Pipeline mode: read the result of the next queued statement (and the
 * NULL that ends it); copy the first value out when asked.
 */
static int
pipe_result(thread_state *t, char *out, size_t outlen)
{
	PGresult   *res = PQgetResult(t->pg);
	ExecStatusType st = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
	int			rc = 0;

	if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
	{
		if (atomic_fetch_add(&errors, 1) < 5)
			fprintf(stderr, "load_driver: thread %d: pipeline: %s%s", t->id,
					PQresStatus(st), res ? PQresultErrorMessage(res) : "\n");
		t->failed = 1;			/* an aborted pipeline is not worth recovering */
		rc = -1;
	}
	else if (out != NULL && PQntuples(res) > 0)
		snprintf(out, outlen, "%s", PQgetvalue(res, 0, 0));
	PQclear(res);
	if (rc == 0 && (res = PQgetResult(t->pg)) != NULL)
	{
		PQclear(res);
		t->failed = 1;
		rc = -1;
	}
	return rc;
}

/* Pipeline mode: read the sync that closes a pipeline. */
static int
pipe_sync_result(thread_state *t)
{
	PGresult   *res = PQgetResult(t->pg);
	int			ok = res && PQresultStatus(res) == PGRES_PIPELINE_SYNC;

	PQclear(res);
	if (!ok)
		t->failed = 1;
	return ok ? 0 : -1;
}

/*
 * BEGIN; INSERT; COMMIT in one round trip.  With --work-ms the work happens
 * inside the transaction: BEGIN + INSERT in one round trip (flushed without
 * a sync), the work, then COMMIT and the sync: 2 round trips.
 */
static int
bare_pipelined(thread_state *t, const char *account, const char *amount)
{
	const char *ins[2] = {account, amount};

	if (pipe_send(t, "begin", 0, NULL) || pipe_send(t, "insert", 2, ins))
		return -1;
	if (opt.work_ms > 0)
	{
		if (!PQsendFlushRequest(t->pg) || PQflush(t->pg) != 0 ||
			pipe_result(t, NULL, 0) || pipe_result(t, NULL, 0))
			return -1;
		sleep_ms(opt.work_ms);
		if (pipe_send(t, "commit", 0, NULL) || !PQpipelineSync(t->pg) ||
			pipe_result(t, NULL, 0))
			return -1;
		return pipe_sync_result(t);
	}
	if (pipe_send(t, "commit", 0, NULL) || !PQpipelineSync(t->pg))
		return -1;
	if (pipe_result(t, NULL, 0) || pipe_result(t, NULL, 0) || pipe_result(t, NULL, 0))
		return -1;
	return pipe_sync_result(t);
}

/*
 * Round trip 1: BEGIN + claim, flushed without a sync (the transaction stays
 * open).  Then the work (--work-ms), inside the transaction.  Round trip 2:
 * INSERT + complete + COMMIT, then the sync.
 */
static int
claim_pipelined(thread_state *t, const char *key, const char *account, const char *amount)
{
	const char *claim[2] = {opt.tenant, key};
	const char *ins[2] = {account, amount};
	char		token[32] = "";
	const char *complete[4] = {opt.tenant, key, token, opt.response};

	if (pipe_send(t, "begin", 0, NULL) || pipe_send(t, "claim", 2, claim) ||
		!PQsendFlushRequest(t->pg) || PQflush(t->pg) != 0)
		return -1;
	if (pipe_result(t, NULL, 0) || pipe_result(t, token, sizeof(token)) || token[0] == '\0')
		return -1;
	if (opt.work_ms > 0)
		sleep_ms(opt.work_ms);
	if (pipe_send(t, "insert", 2, ins) || pipe_send(t, "complete", 4, complete) ||
		pipe_send(t, "commit", 0, NULL) || !PQpipelineSync(t->pg))
		return -1;
	if (pipe_result(t, NULL, 0) || pipe_result(t, NULL, 0) || pipe_result(t, NULL, 0))
		return -1;
	return pipe_sync_result(t);
}

/* Keep one operation's latency (a SIGUSR1 since the last one restarts the list). */
static void
record_latency(thread_state *t, int *generation, double seconds)
{
	if (*generation != window_generation)
	{
		*generation = window_generation;
		t->n = 0;
	}
	if (t->n == t->cap)
	{
		t->cap = t->cap ? t->cap * 2 : 65536;
		t->lat_us = realloc(t->lat_us, t->cap * sizeof(uint32_t));
		if (t->lat_us == NULL)
		{
			perror("realloc");
			exit(2);
		}
	}
	t->lat_us[t->n++] = (uint32_t) (seconds * 1e6);
}

static void *
worker(void *arg)
{
	thread_state *t = arg;
	char		key[96];
	char		rkey[128];
	char		account[16];
	char		amount[16];
	char		completed[4096];
	int			generation = window_generation;
	double		deadline;
	unsigned int seed = 12345u + (unsigned int) t->id;

	snprintf(account, sizeof(account), "%d", t->id);
	snprintf(completed, sizeof(completed),
			 "{\"state\":\"COMPLETED\",\"response\":%s}", opt.response);

	pthread_barrier_wait(&start_barrier);
	deadline = now_s() + opt.seconds;

	for (long long ctr = 1; !stop_requested && !t->failed; ctr++)
	{
		double		t0;
		int			ok = 1;

		if (!opt.until_signal && now_s() >= deadline)
			break;
		snprintf(key, sizeof(key), "%lld-%d-%lld", opt.run, t->id, ctr);
		snprintf(amount, sizeof(amount), "%d", 1 + (int) (rand_r(&seed) % 100000));

		t0 = now_s();
		if (opt.mode == MODE_REDIS)
		{
			snprintf(rkey, sizeof(rkey), "idem:%s", key);
			/* unique keys: the claim always wins */
			ok = redis_set(t, "SET %s %s NX EX %d", rkey, "{\"state\":\"STARTED\"}", 60);
			if (ok)
				ok = business_tx(t, key, account, amount) == 0;
			if (ok)
				ok = redis_set(t, "SET %s %s EX %d", rkey, completed, 86400);
		}
		else if (opt.mode == MODE_BARE_PIPELINED)
			ok = bare_pipelined(t, account, amount) == 0;
		else if (opt.mode == MODE_CLAIM_PIPELINED)
			ok = claim_pipelined(t, key, account, amount) == 0;
		else
			ok = business_tx(t, key, account, amount) == 0;

		if (!ok)
		{
			if (PQstatus(t->pg) != CONNECTION_OK)
				t->failed = 1;
			continue;
		}
		atomic_fetch_add(&total_ops, 1);
		if (now_s() >= counted_from)
			record_latency(t, &generation, now_s() - t0);
		if (opt.pace_ms > 0)
			sleep_ms(opt.pace_ms);
	}
	return NULL;
}

static int
cmp_u32(const void *a, const void *b)
{
	uint32_t	x = *(const uint32_t *) a;
	uint32_t	y = *(const uint32_t *) b;

	return (x > y) - (x < y);
}

static void
usage(void)
{
	fprintf(stderr,
			"usage: load_driver --mode bare|redis|claim|bare-pipelined|claim-pipelined\n"
			"       --pg CONNINFO [--redis-port N]\n"
			"       [--threads N] [--seconds S [--warmup S] | --until-signal] [--work-ms MS]\n"
			"       [--pace-ms MS] [--run N] [--tenant T] [--response JSON]\n");
	exit(2);
}

static int
connect_thread(thread_state *t)
{
	t->pg = PQconnectdb(opt.conninfo);
	if (PQstatus(t->pg) != CONNECTION_OK)
	{
		fprintf(stderr, "load_driver: connect: %s", PQerrorMessage(t->pg));
		return -1;
	}
	if (pg_prepare(t, "begin", "BEGIN") || pg_prepare(t, "commit", "COMMIT") ||
		pg_prepare(t, "rollback", "ROLLBACK") ||
		pg_prepare(t, "insert", "INSERT INTO payments (account, amount) VALUES ($1, $2)"))
		return -1;
	if ((opt.mode == MODE_CLAIM || opt.mode == MODE_CLAIM_PIPELINED) &&
		(pg_prepare(t, "claim", "SELECT token FROM idem_claim($1, $2)") ||
		 pg_prepare(t, "complete", "SELECT idem_complete($1, $2, $3, $4)")))
		return -1;
	if ((opt.mode == MODE_BARE_PIPELINED || opt.mode == MODE_CLAIM_PIPELINED) &&
		!PQenterPipelineMode(t->pg))
	{
		fprintf(stderr, "load_driver: cannot enter pipeline mode\n");
		return -1;
	}
	if (opt.mode == MODE_REDIS)
	{
		t->redis = redisConnect(opt.redis_host, opt.redis_port);
		if (t->redis == NULL || t->redis->err)
		{
			fprintf(stderr, "load_driver: redis connect: %s\n",
					t->redis ? t->redis->errstr : "out of memory");
			return -1;
		}
	}
	return 0;
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"mode", required_argument, NULL, 'm'},
		{"pg", required_argument, NULL, 'p'},
		{"redis-port", required_argument, NULL, 'r'},
		{"threads", required_argument, NULL, 'c'},
		{"seconds", required_argument, NULL, 'T'},
		{"warmup", required_argument, NULL, 'W'},
		{"until-signal", no_argument, NULL, 'U'},
		{"work-ms", required_argument, NULL, 'w'},
		{"pace-ms", required_argument, NULL, 'P'},
		{"run", required_argument, NULL, 'R'},
		{"tenant", required_argument, NULL, 't'},
		{"response", required_argument, NULL, 'j'},
		{NULL, 0, NULL, 0}
	};
	thread_state *ts;
	pthread_t  *th;
	uint32_t   *all;
	size_t		total = 0;
	double		t0,
				elapsed;
	int			c;

	while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1)
	{
		switch (c)
		{
			case 'm':
				if (strcmp(optarg, "bare") == 0)
					opt.mode = MODE_BARE;
				else if (strcmp(optarg, "redis") == 0)
					opt.mode = MODE_REDIS;
				else if (strcmp(optarg, "claim") == 0)
					opt.mode = MODE_CLAIM;
				else if (strcmp(optarg, "bare-pipelined") == 0)
					opt.mode = MODE_BARE_PIPELINED;
				else if (strcmp(optarg, "claim-pipelined") == 0)
					opt.mode = MODE_CLAIM_PIPELINED;
				else
					usage();
				break;
			case 'p':
				opt.conninfo = optarg;
				break;
			case 'r':
				opt.redis_port = atoi(optarg);
				break;
			case 'c':
				opt.threads = atoi(optarg);
				break;
			case 'T':
				opt.seconds = atof(optarg);
				break;
			case 'W':
				opt.warmup = atof(optarg);
				break;
			case 'U':
				opt.until_signal = 1;
				break;
			case 'w':
				opt.work_ms = atoi(optarg);
				break;
			case 'P':
				opt.pace_ms = atoi(optarg);
				break;
			case 'R':
				opt.run = atoll(optarg);
				break;
			case 't':
				opt.tenant = optarg;
				break;
			case 'j':
				opt.response = optarg;
				break;
			default:
				usage();
		}
	}
	if (opt.threads < 1)
		usage();

	signal(SIGTERM, on_stop);
	signal(SIGINT, on_stop);
	signal(SIGUSR1, on_window);

	ts = calloc(opt.threads, sizeof(*ts));
	th = calloc(opt.threads, sizeof(*th));
	pthread_barrier_init(&start_barrier, NULL, opt.threads + 1);
	for (int i = 0; i < opt.threads; i++)
	{
		ts[i].id = i;
		if (connect_thread(&ts[i]) != 0)
			return 1;
	}
	for (int i = 0; i < opt.threads; i++)
		pthread_create(&th[i], NULL, worker, &ts[i]);

	counted_from = now_s() + opt.warmup;
	pthread_barrier_wait(&start_barrier);
	t0 = now_s();
	for (int i = 0; i < opt.threads; i++)
		pthread_join(th[i], NULL);
	elapsed = now_s() - t0 - opt.warmup;
	if (elapsed <= 0)
		elapsed = 1e-9;

	for (int i = 0; i < opt.threads; i++)
		total += ts[i].n;
	all = malloc((total ? total : 1) * sizeof(uint32_t));
	total = 0;
	for (int i = 0; i < opt.threads; i++)
	{
		memcpy(all + total, ts[i].lat_us, ts[i].n * sizeof(uint32_t));
		total += ts[i].n;
		if (ts[i].failed)
			fprintf(stderr, "load_driver: thread %d stopped on an error\n", i);
		PQfinish(ts[i].pg);
		if (ts[i].redis)
			redisFree(ts[i].redis);
	}
	qsort(all, total, sizeof(uint32_t), cmp_u32);

	printf("ops=%zu seconds=%.3f tps=%.1f p50_us=%u p99_us=%u max_us=%u errors=%d "
		   "total_ops=%ld\n",
		   total, elapsed, total / elapsed,
		   total ? all[(size_t) (total * 0.50)] : 0,
		   total ? all[(size_t) (total * 0.99)] : 0,
		   total ? all[total - 1] : 0,
		   atomic_load(&errors), atomic_load(&total_ops));
	return atomic_load(&errors) > 0 ? 1 : 0;
}
