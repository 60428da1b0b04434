/* The disaggregated gateway's /metrics (engine/serve/lb.c behind engine/serve/gw.c) is
 * well-formed Prometheus text: each family of the balancers has its own # HELP and # TYPE and
 * one block of samples, every replica of both roles in it. The replicas are loopback ports that
 * refuse connections (bound, never listening), so they read down and no worker is needed.
 * With promtool installed (Debian: prometheus), `promtool check metrics` must agree. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "gw.h"
#include "http_tutil.h"
#include "kvp.h"
#include "lb.h"
#include "prom_parse.h"

#define NREP 3 /* two prefill replicas, one decode */

static int socks[NREP];
static uint16_t ports[NREP];
static struct lb *lb;
static struct gw *gw;

/* A loopback port that refuses connections while sock stays open: bound, not listening. */
static uint16_t refusing_port(int *sock)
{
	*sock = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(*sock >= 0);
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t sl = sizeof(sa);
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	assert_int_equal(bind(*sock, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(getsockname(*sock, (struct sockaddr *)&sa, &sl), 0);
	return ntohs(sa.sin_port);
}

static int setup(void **state)
{
	(void)state;
	for (int i = 0; i < NREP; i++)
		ports[i] = refusing_port(&socks[i]);
	char pf[64], dc[32];
	snprintf(pf, sizeof(pf), "127.0.0.1:%u,127.0.0.1:%u", ports[0], ports[1]);
	snprintf(dc, sizeof(dc), "127.0.0.1:%u", ports[2]);
	struct kvp_secret secret;
	assert_int_equal(kvp_secret_from_string("test-lb-metrics-secret", &secret), 0);
	struct lb_opts lo = {.prefill = pf, .decode = dc, .secret = &secret, .policy = LB_LEAST};
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
	for (int i = 0; i < NREP; i++)
		close(socks[i]);
	return 0;
}

static void test_lb_metrics_well_formed(void **state)
{
	(void)state;
	/* Replicas count as up until their first STATUS poll fails (every 200 ms): wait for
	 * all three to read down, checking every page on the way. */
	char *b = NULL;
	struct prom_doc d;
	for (int tries = 0;; tries++) {
		assert_int_equal(htu_request(gw_port(gw), 1, "GET", "/metrics", NULL, &b), 200);
		if (prom_parse(b, &d))
			fail_msg("/metrics: %s\n%s", d.err, b);
		if (prom_sum(&d, "lb_replica_up", NULL, NULL) == 0 || tries == 200)
			break;
		prom_free(&d);
		free(b);
		usleep(50000);
	}
	static const char *const fams[] = {
	    /* per replica */
	    "lb_replica_up", "lb_replica_inflight", "lb_replica_queued_tokens",
	    "lb_replica_running", "lb_replica_kv_free_blocks", "lb_replica_picks_total",
	    "lb_replica_prompt_tokens_computed",
	    /* the balancers' and the gateway's own */
	    "lb_retries_total", "lb_kv_handoffs_total", "kvfs_requests_total"};
	enum { PER_REPLICA = 7 };
	char why[2048];
	int ran;
	if (prom_check_page(b, fams, (int)(sizeof(fams) / sizeof(fams[0])), &ran, why, sizeof(why)))
		fail_msg("/metrics: %s\n%s", why, b);
	if (!ran)
		print_message("promtool not installed: skipping `promtool check metrics`\n");
	for (int f = 0; f < PER_REPLICA; f++) {
		int n;
		prom_sum(&d, fams[f], NULL, &n);
		assert_int_equal(n, NREP);
		for (int i = 0; i < NREP; i++) {
			char lab[96];
			double v;
			snprintf(lab, sizeof(lab), "role=\"%s\",addr=\"127.0.0.1:%u\"",
				 i < 2 ? "prefill" : "decode", ports[i]);
			if (prom_get(&d, fams[f], lab, &v))
				fail_msg("no %s{%s}", fams[f], lab);
			assert_true(v == 0); /* down, nothing sent there */
		}
	}
	int n;
	prom_sum(&d, "lb_kv_handoffs_total", NULL, &n);
	assert_int_equal(n, 4); /* fs, direct, fallback, local */
	prom_free(&d);
	free(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_lb_metrics_well_formed),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
