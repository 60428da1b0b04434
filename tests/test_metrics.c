/* test_metrics: common/metrics — exposition format (checked by a strict parser), label escaping,
 * histogram invariants, registration errors, concurrent updates, and /metrics over HTTP. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "metrics.h"
#include "prom_parse.h"

static char *render(struct met_reg *r)
{
	char *t = NULL;
	size_t n = 0;
	assert_int_equal(met_render(r, &t, &n), 0);
	assert_int_equal(strlen(t), n);
	return t;
}

static void parse_ok(const char *t, struct prom_doc *d)
{
	int rc = prom_parse(t, d);
	if (rc)
		fprintf(stderr, "parse error: %s\n--- text ---\n%s", d->err, t);
	assert_int_equal(rc, 0);
}

static void collect(void *ctx, struct met_out *o)
{
	int *calls = ctx;
	(*calls)++;
	met_out_family(o, "t_nodes_up", "gauge", "per node: 1 up, 0 down");
	const char *a[] = {"node", "1", "addr", "127.0.0.1:1", NULL};
	const char *b[] = {"node", "2", "addr", "127.0.0.1:2", NULL};
	met_out_sample(o, "t_nodes_up", a, 1);
	met_out_sample(o, "t_nodes_up", b, 0);
}

static double seven(void *ctx)
{
	(void)ctx;
	return 7.5;
}

static void test_exposition(void **st)
{
	(void)st;
	struct met_reg *r;
	assert_int_equal(met_reg_create(&r), 0);
	struct met_counter *c = met_counter_new(r, "t_puts_total", "PUTs\nwith \\ newline", NULL);
	const char *weird[] = {"path", "a\"b\\c\nd", NULL};
	struct met_counter *cw = met_counter_new(r, "t_puts_total", "x", weird);
	struct met_gauge *g = met_gauge_new(r, "t_used_bytes", "bytes used", NULL);
	assert_non_null(met_gauge_fn_new(r, "t_fn", "from a callback", NULL, seven, NULL));
	const double b[] = {1, 2, 5};
	const char *op[] = {"op", "get", NULL};
	struct met_hist *h = met_hist_new(r, "t_size", "sizes", op, b, 3);
	struct met_hist *hl = met_hist_new(r, "t_lat_seconds", "latency", NULL, NULL, 0);
	assert_non_null(c);
	assert_non_null(cw);
	assert_non_null(g);
	assert_non_null(h);
	assert_non_null(hl);
	int calls = 0;
	assert_int_equal(met_collector_add(r, collect, &calls), 0);

	met_counter_add(c, 3);
	met_counter_add(cw, 1);
	met_gauge_set(g, 100);
	met_gauge_add(g, -30);
	met_hist_observe(h, 0.5); /* le 1 */
	met_hist_observe(h, 1);	  /* le 1 (upper bound inclusive) */
	met_hist_observe(h, 4);	  /* le 5 */
	met_hist_observe(h, 99);  /* +Inf */
	met_hist_observe_ns(hl, 3000000);
	assert_int_equal(met_hist_count(h), 4);

	char *t = render(r);
	struct prom_doc d;
	parse_ok(t, &d);
	assert_int_equal(calls, 1);
	assert_non_null(strstr(t, "# HELP t_puts_total PUTs\\nwith \\\\ newline\n"));
	assert_non_null(strstr(t, "# TYPE t_puts_total counter\n"));
	assert_non_null(strstr(t, "t_puts_total{path=\"a\\\"b\\\\c\\nd\"} 1\n"));
	double v;
	assert_int_equal(prom_get(&d, "t_puts_total", "", &v), 0);
	assert_true(v == 3);
	assert_int_equal(prom_get(&d, "t_used_bytes", "", &v), 0);
	assert_true(v == 70);
	assert_int_equal(prom_get(&d, "t_fn", "", &v), 0);
	assert_true(v == 7.5);
	assert_int_equal(prom_get(&d, "t_size_bucket", "op=\"get\",le=\"1\"", &v), 0);
	assert_true(v == 2);
	assert_int_equal(prom_get(&d, "t_size_bucket", "op=\"get\",le=\"2\"", &v), 0);
	assert_true(v == 2);
	assert_int_equal(prom_get(&d, "t_size_bucket", "op=\"get\",le=\"5\"", &v), 0);
	assert_true(v == 3);
	assert_int_equal(prom_get(&d, "t_size_bucket", "op=\"get\",le=\"+Inf\"", &v), 0);
	assert_true(v == 4);
	assert_int_equal(prom_get(&d, "t_size_count", "op=\"get\"", &v), 0);
	assert_true(v == 4);
	assert_int_equal(prom_get(&d, "t_size_sum", "op=\"get\"", &v), 0);
	assert_true(v == 104.5);
	assert_int_equal(prom_get(&d, "t_lat_seconds_bucket", "le=\"0.0025\"", &v), 0);
	assert_true(v == 0);
	assert_int_equal(prom_get(&d, "t_lat_seconds_bucket", "le=\"0.005\"", &v), 0);
	assert_true(v == 1);
	assert_int_equal(prom_get(&d, "t_nodes_up", "node=\"2\",addr=\"127.0.0.1:2\"", &v), 0);
	assert_true(v == 0);
	int n;
	assert_true(prom_sum(&d, "t_nodes_up", NULL, &n) == 1);
	assert_int_equal(n, 2);
	prom_free(&d);
	free(t);
	met_reg_destroy(r);
}

static void test_registration_errors(void **st)
{
	(void)st;
	struct met_reg *r;
	assert_int_equal(met_reg_create(&r), 0);
	assert_null(met_counter_new(r, "9bad", "", NULL));
	assert_null(met_counter_new(r, "bad-name", "", NULL));
	const char *badl[] = {"bad-label", "x", NULL};
	assert_null(met_counter_new(r, "ok_total", "", badl));
	const char *resv[] = {"__name__", "x", NULL};
	assert_null(met_counter_new(r, "ok_total", "", resv));
	assert_non_null(met_counter_new(r, "ok_total", "", NULL));
	assert_null(met_counter_new(r, "ok_total", "", NULL)); /* same series twice */
	assert_null(met_gauge_new(r, "ok_total", "", NULL));   /* another type */
	const double desc[] = {2, 1};
	assert_null(met_hist_new(r, "h", "", NULL, desc, 2));
	assert_null(met_hist_new(r, "h", "", NULL, desc, 0));
	/* updates on NULL handles are no-ops */
	met_counter_add(NULL, 1);
	met_gauge_set(NULL, 1);
	met_hist_observe(NULL, 1);
	met_ops_observe(NULL, 0, 0, 1);
	assert_int_equal(met_counter_get(NULL), 0);
	char *t = render(r);
	struct prom_doc d;
	parse_ok(t, &d);
	prom_free(&d);
	free(t);
	met_reg_destroy(r);
}

/* The parser must be able to fail: each document breaks one rule. */
static void test_parser_rejects(void **st)
{
	(void)st;
#define HIST_NOT_MONOTONE                                                                          \
	("# HELP x h\n# TYPE x histogram\nx_bucket{le=\"1\"} 2\nx_bucket{le=\"+Inf\"} 1\n"         \
	 "x_sum 1\nx_count 1\n")
	static const char *bad[] = {
	    "x 1\n",							  /* no TYPE */
	    "# HELP x h\n# TYPE x counter\nx 1",			  /* no final newline */
	    "# HELP x h\n# TYPE x counter\nx -1\n",			  /* negative counter */
	    "# HELP x h\n# TYPE x counter\ny 1\n",			  /* outside family */
	    "# HELP x h\n# TYPE x counter\nx 1 123\n",			  /* timestamp */
	    "# HELP x h\n# TYPE x counter\nx{a=\"\\q\"} 1\n",		  /* bad escape */
	    "# HELP x h\n# TYPE x counter\nx{a=\"1\"} 1\nx{a=\"1\"} 2\n", /* duplicate */
	    "# HELP x h\n# TYPE x gauge\nx abc\n",			  /* bad value */
	    "# TYPE x gauge\nx 1\n",					  /* no HELP */
	    "# HELP x h\n# TYPE x histogram\nx_bucket{le=\"1\"} 1\nx_sum 1\nx_count 1\n",
	    HIST_NOT_MONOTONE,
	    "# HELP x h\n# TYPE x histogram\nx_bucket{le=\"+Inf\"} 2\nx_sum 1\nx_count 1\n",
	    "# HELP x h\n# TYPE x histogram\nx_bucket{le=\"+Inf\"} 1\nx_count 1\n",
	    "# HELP x h\n# TYPE x gauge\nx 1\n# HELP x h\n# TYPE x gauge\n",
	    "# just a comment\n",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct prom_doc d;
		if (prom_parse(bad[i], &d) == 0)
			fail_msg("accepted bad document %zu:\n%s", i, bad[i]);
		assert_true(d.err[0] != 0);
		prom_free(&d);
	}
	struct prom_doc d;
	assert_int_equal(prom_parse("# HELP x h\n# TYPE x histogram\nx_bucket{le=\"1\"} 1\n"
				    "x_bucket{le=\"+Inf\"} 2\nx_sum 3.5\nx_count 2\n",
				    &d),
			 0);
	prom_free(&d);
}

struct worker {
	struct met_counter *c;
	struct met_hist *h;
	struct met_ops *ops;
};

#define THREADS 4
#define ITERS	100000

static void *work(void *arg)
{
	struct worker *w = arg;
	for (int i = 0; i < ITERS; i++) {
		met_counter_add(w->c, 1);
		met_hist_observe(w->h, 1.0);
		met_ops_observe(w->ops, i % 2, i % 4 == 0, 1000);
	}
	return NULL;
}

static void test_concurrency(void **st)
{
	(void)st;
	struct met_reg *r;
	assert_int_equal(met_reg_create(&r), 0);
	struct worker w = {.c = met_counter_new(r, "c_total", "c", NULL),
			   .h = met_hist_new(r, "h", "h", NULL, (const double[]){0.5, 2}, 2)};
	const char *names[] = {"put", "get"};
	assert_int_equal(met_ops_new(r, "t", names, 2, &w.ops), 0);
	pthread_t th[THREADS];
	for (int i = 0; i < THREADS; i++)
		assert_int_equal(pthread_create(&th[i], NULL, work, &w), 0);
	for (int i = 0; i < 20; i++) { /* scrapes while updates run must still parse */
		char *t = render(r);
		struct prom_doc d;
		parse_ok(t, &d);
		prom_free(&d);
		free(t);
	}
	for (int i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	char *t = render(r);
	struct prom_doc d;
	parse_ok(t, &d);
	double v;
	assert_int_equal(prom_get(&d, "c_total", "", &v), 0);
	assert_true(v == (double)THREADS * ITERS);
	assert_int_equal(prom_get(&d, "h_count", "", &v), 0);
	assert_true(v == (double)THREADS * ITERS);
	assert_int_equal(prom_get(&d, "h_sum", "", &v), 0);
	assert_true(v == (double)THREADS * ITERS);
	assert_int_equal(prom_get(&d, "h_bucket", "le=\"0.5\"", &v), 0);
	assert_true(v == 0);
	assert_int_equal(prom_get(&d, "t_requests_total", "op=\"get\"", &v), 0);
	assert_true(v == (double)THREADS * ITERS / 2);
	assert_int_equal(prom_get(&d, "t_request_errors_total", "op=\"put\"", &v), 0);
	assert_true(v == (double)THREADS * ITERS / 4);
	assert_int_equal(prom_get(&d, "t_request_duration_seconds_count", "op=\"put\"", &v), 0);
	assert_true(v == (double)THREADS * ITERS / 2);
	prom_free(&d);
	free(t);
	met_reg_destroy(r);
}

static void test_http(void **st)
{
	(void)st;
	struct met_reg *r;
	assert_int_equal(met_reg_create(&r), 0);
	struct met_counter *c = met_counter_new(r, "http_test_total", "t", NULL);
	struct met_http *h = NULL;
	assert_int_equal(met_http_start(r, "nohost", &h), -EINVAL);
	assert_int_equal(met_http_start(r, "127.0.0.1:99999", &h), -EINVAL);
	char dir[] = "/tmp/kvfs-metrics-XXXXXX", file[64];
	assert_non_null(mkdtemp(dir));
	snprintf(file, sizeof(file), "%s/addr", dir);
	assert_int_equal(met_http_serve(r, "", file, &h), 0); /* off */
	assert_null(h);
	assert_int_equal(met_http_serve(r, "127.0.0.1:0", file, &h), 0);
	assert_non_null(h);
	assert_true(met_http_port(h) > 0);
	char addr[64] = "", want[64];
	FILE *f = fopen(file, "r");
	assert_non_null(f);
	assert_non_null(fgets(addr, sizeof(addr), f));
	fclose(f);
	addr[strcspn(addr, "\n")] = 0;
	snprintf(want, sizeof(want), "127.0.0.1:%u", met_http_port(h));
	assert_string_equal(addr, want);

	for (int i = 1; i <= 3; i++) {
		met_counter_add(c, 1);
		char *body = NULL;
		assert_int_equal(prom_http_get(addr, "/metrics", &body), 200);
		struct prom_doc d;
		parse_ok(body, &d);
		double v;
		assert_int_equal(prom_get(&d, "http_test_total", "", &v), 0);
		assert_true(v == i);
		prom_free(&d);
		free(body);
	}
	char *body = NULL;
	assert_int_equal(prom_http_get(addr, "/nope", &body), 404);
	free(body);
	/* a second server on the same port fails cleanly */
	struct met_http *h2 = NULL;
	assert_true(met_http_start(r, addr, &h2) < 0);
	met_http_stop(h);
	assert_true(prom_http_get(addr, "/metrics", &body) < 0);
	unlink(file);
	rmdir(dir);
	met_reg_destroy(r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_exposition),	   cmocka_unit_test(test_registration_errors),
	    cmocka_unit_test(test_parser_rejects), cmocka_unit_test(test_concurrency),
	    cmocka_unit_test(test_http),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
