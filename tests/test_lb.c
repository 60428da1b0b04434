/* The disaggregated gateway's request pool (engine/serve/lb.c behind engine/serve/gw.c): a
 * fixed number of workers run requests, a bounded queue holds the rest, and a request past the
 * queue is refused at once with 503 "overloaded" — never a thread per request; a client that
 * leaves while queued frees its place. lb_stop with requests in flight returns without
 * waiting out their RPC timeout.
 *
 * The replicas are kvp servers in this process speaking just enough of kvw.h: both answer
 * STATUS (so they read up); the prefill replica holds every PREFILL without answering, as a
 * worker computing a very long prompt would, so each admitted request occupies a worker. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "gw.h"
#include "http_tutil.h"
#include "ktime.h"
#include "kvp.h"
#include "kvw.h"
#include "lb.h"
#include "prom_parse.h"

#define WORKERS	 2
#define QUEUE	 2
#define CLIENTS	 6			 /* WORKERS running + QUEUE waiting + 2 refused */
#define WAIT_MS	 20000			 /* liveness bound for what should happen at once */
#define HELD_MAX (WORKERS + CLIENTS + 4) /* room to see what an unbounded pool would send */

/* A fake replica; the prefill one holds its PREFILLs (guarded by mu). */
struct fake {
	struct kvp_server *srv;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct kvp_conn *held[HELD_MAX];
	struct kvp_hdr hdr[HELD_MAX];
	int nheld;
};

static struct fake pf_fake, dc_fake;
static struct kvp_secret secret;
static struct lb *lb;
static struct gw *gw;

static int fake_handler(void *ctx, struct kvp_conn *c, const struct kvp_hdr *h, uint8_t *body)
{
	struct fake *f = ctx;
	free(body);
	if (h->op == KVW_OP_STATUS) {
		struct kvw_status st = {.kv_free = 100, .kv_total = 100};
		struct kvp_wbuf b;
		kvp_w_init(&b);
		int rc = kvw_status_enc(&b, &st);
		kvp_reply(c, h, rc, rc ? NULL : b.p, rc ? 0 : b.len, NULL, 0);
		kvp_w_free(&b);
		return 0;
	}
	pthread_mutex_lock(&f->mu);
	if (h->op == KVW_OP_PREFILL && f->nheld < HELD_MAX) {
		kvp_conn_ref(c); /* answered at teardown */
		f->held[f->nheld] = c;
		f->hdr[f->nheld++] = *h;
		pthread_cond_broadcast(&f->cv);
		pthread_mutex_unlock(&f->mu);
		return 0;
	}
	pthread_mutex_unlock(&f->mu);
	kvp_reply(c, h, -EOPNOTSUPP, NULL, 0, NULL, 0);
	return 0;
}

static void fake_start(struct fake *f)
{
	memset(f, 0, sizeof(*f));
	pthread_mutex_init(&f->mu, NULL);
	pthread_cond_init(&f->cv, NULL);
	struct kvp_server_opts o = {.name = "fake-replica",
				    .host = "127.0.0.1",
				    .secret = &secret,
				    .handler = fake_handler,
				    .ctx = f};
	assert_int_equal(kvp_server_start(&o, &f->srv), 0);
}

static void fake_stop(struct fake *f)
{
	pthread_mutex_lock(&f->mu);
	for (int i = 0; i < f->nheld; i++) {
		kvp_reply(f->held[i], &f->hdr[i], -ECANCELED, NULL, 0, NULL, 0);
		kvp_conn_unref(f->held[i]);
	}
	f->nheld = 0;
	pthread_mutex_unlock(&f->mu);
	kvp_server_stop(f->srv);
	pthread_mutex_destroy(&f->mu);
	pthread_cond_destroy(&f->cv);
}

static int fake_held(struct fake *f)
{
	pthread_mutex_lock(&f->mu);
	int n = f->nheld;
	pthread_mutex_unlock(&f->mu);
	return n;
}

static int setup(void **state)
{
	(void)state;
	assert_int_equal(kvp_secret_from_string("test-lb-pool-secret-0123", &secret), 0);
	fake_start(&pf_fake);
	fake_start(&dc_fake);
	char pf[32], dc[32];
	snprintf(pf, sizeof(pf), "127.0.0.1:%u", kvp_server_port(pf_fake.srv));
	snprintf(dc, sizeof(dc), "127.0.0.1:%u", kvp_server_port(dc_fake.srv));
	struct lb_opts lo = {.prefill = pf,
			     .decode = dc,
			     .secret = &secret,
			     .policy = LB_LEAST,
			     .workers = WORKERS,
			     .queue = QUEUE};
	assert_int_equal(lb_create(&lo, &lb), 0);
	struct gw_backend be;
	lb_backend(lb, &be);
	struct gw_opts o = {.model_id = "test-model"};
	assert_int_equal(gw_start(&o, &be, &gw), 0);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	lb_stop(lb);
	gw_stop(gw);
	lb_destroy(lb);
	fake_stop(&pf_fake);
	fake_stop(&dc_fake);
	return 0;
}

/* The HTTP clients: each sends one completion and records its status. */
static pthread_mutex_t cmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ccv = PTHREAD_COND_INITIALIZER;
static int cstatus[CLIENTS];

static int64_t mono_ms_(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
static int cdone, crefused;

static void *client_main(void *arg)
{
	int i = (int)(intptr_t)arg;
	char *out = NULL;
	int st = htu_request(
	    gw_port(gw), 0, "POST", "/v1/completions",
	    "{\"prompt\":\"a prompt the replica never finishes\",\"max_tokens\":1}", &out);
	pthread_mutex_lock(&cmu);
	cstatus[i] = st;
	if (st == 503 && out && strstr(out, "overloaded"))
		crefused++;
	cdone++;
	pthread_cond_broadcast(&ccv);
	pthread_mutex_unlock(&cmu);
	free(out);
	return NULL;
}

/* The gateway's lb_requests_queued gauge, read until it equals want (WAIT_MS at most). */
static int queued_becomes(int want)
{
	int64_t end = mono_ms_() + WAIT_MS;
	double v = -1;
	while (mono_ms_() < end) {
		char *b = NULL;
		struct prom_doc d;
		assert_int_equal(htu_request(gw_port(gw), 1, "GET", "/metrics", NULL, &b), 200);
		assert_int_equal(prom_parse(b, &d), 0);
		assert_int_equal(prom_get(&d, "lb_requests_queued", "", &v), 0);
		prom_free(&d);
		free(b);
		if ((int)v == want)
			return want;
		usleep(20 * 1000);
	}
	return (int)v;
}

/* A request whose client leaves: sent on a socket the caller closes. */
static int send_raw(void)
{
	int fd = htu_connect(gw_port(gw));
	assert_true(fd >= 0);
	assert_int_equal(htu_send(fd, 1, "POST", "/v1/completions",
				  "{\"prompt\":\"a client that leaves\",\"max_tokens\":1}"),
			 0);
	return fd;
}

/* Waits until *n reaches want (guarded by mu, signalled on cv), WAIT_MS at most. */
static int wait_count(pthread_mutex_t *mu, pthread_cond_t *cv, const int *n, int want)
{
	struct timespec ts;
	kvfs_deadline(&ts, CLOCK_REALTIME, WAIT_MS);
	pthread_mutex_lock(mu);
	int rc = 0;
	while (*n < want && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(cv, mu, &ts);
	int got = *n;
	pthread_mutex_unlock(mu);
	return got;
}

static void *stop_main(void *arg)
{
	(void)arg;
	lb_stop(lb);
	pthread_mutex_lock(&cmu);
	cdone += 1000; /* lb_stop returned */
	pthread_cond_broadcast(&ccv);
	pthread_mutex_unlock(&cmu);
	return NULL;
}

static void test_pool_bounds_requests_and_stop_is_prompt(void **state)
{
	(void)state;
	pthread_t t[CLIENTS];
	for (int i = 0; i < WORKERS; i++)
		assert_int_equal(pthread_create(&t[i], NULL, client_main, (void *)(intptr_t)i), 0);
	/* WORKERS PREFILLs reach the replica */
	assert_int_equal(wait_count(&pf_fake.mu, &pf_fake.cv, &pf_fake.nheld, WORKERS), WORKERS);
	/* a queued request whose client leaves gives its place back */
	int fd = send_raw();
	assert_int_equal(queued_becomes(1), 1);
	close(fd);
	assert_int_equal(queued_becomes(0), 0);
	/* the rest: QUEUE wait, the two past the queue are refused at once */
	for (int i = WORKERS; i < CLIENTS; i++)
		assert_int_equal(pthread_create(&t[i], NULL, client_main, (void *)(intptr_t)i), 0);
	assert_int_equal(wait_count(&cmu, &ccv, &crefused, CLIENTS - WORKERS - QUEUE),
			 CLIENTS - WORKERS - QUEUE);
	/* the queued requests stay queued: no further PREFILL while the workers are busy (with a
	 * thread per request all CLIENTS would be here) */
	usleep(300 * 1000);
	assert_int_equal(fake_held(&pf_fake), WORKERS);
	pthread_mutex_lock(&cmu);
	assert_int_equal(cdone, CLIENTS - WORKERS - QUEUE);
	pthread_mutex_unlock(&cmu);

	/* lb_stop with 2 PREFILLs held (RPC timeout: 10 min) and 2 queued: returns at once, and
	 * every client gets its answer, none a 200 */
	pthread_t st;
	assert_int_equal(pthread_create(&st, NULL, stop_main, NULL), 0);
	int got = wait_count(&cmu, &ccv, &cdone, 1000 + CLIENTS);
	if (got != 1000 + CLIENTS)
		fail_msg("lb_stop %s, %d of %d clients answered",
			 got >= 1000 ? "returned" : "hangs", got % 1000, CLIENTS);
	pthread_join(st, NULL);
	for (int i = 0; i < CLIENTS; i++) {
		pthread_join(t[i], NULL);
		assert_true(cstatus[i] >= 500);
	}
	assert_int_equal(fake_held(&pf_fake), WORKERS);
	/* a request after the stop is refused, not queued */
	char *out = NULL;
	assert_int_equal(htu_request(gw_port(gw), 0, "POST", "/v1/completions",
				     "{\"prompt\":\"late\",\"max_tokens\":1}", &out),
			 503);
	free(out);
}

static void test_bad_pool_options(void **state)
{
	(void)state;
	struct lb_opts lo = {.prefill = "127.0.0.1:1", .decode = "127.0.0.1:2", .secret = &secret};
	struct lb *l = NULL;
	lo.workers = -1;
	assert_int_equal(lb_create(&lo, &l), -EINVAL);
	lo.workers = LB_WORKERS_MAX + 1;
	assert_int_equal(lb_create(&lo, &l), -EINVAL);
	lo.workers = 1;
	lo.queue = LB_QUEUE_MAX + 1;
	assert_int_equal(lb_create(&lo, &l), -EINVAL);
	assert_null(l);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_pool_bounds_requests_and_stop_is_prompt),
	    cmocka_unit_test(test_bad_pool_options),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
