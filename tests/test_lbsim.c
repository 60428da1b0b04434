/* The balancer policies (engine/serve/lbp.c) and the simulator that measures them
 * (tools/lbsim): trace files round-trip and refuse bad lines, every simulated request
 * finishes, the hit measures are ordered as they must be, and the policies decide as their
 * header says. The gateway's own decisions are checked against lb-sim in test_serve. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "lbp.h"
#include "lbsim.h"

static struct lbsim_trace gen(size_t n, double rate)
{
	struct lbsim_gen g;
	lbsim_gen_defaults(&g);
	g.requests = n;
	g.rate = rate;
	struct lbsim_trace t;
	assert_int_equal(lbsim_generate(&g, &t), 0);
	assert_int_equal(t.n, n);
	return t;
}

static void test_trace_round_trip(void **state)
{
	(void)state;
	struct lbsim_trace t = gen(500, 50), u;
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	assert_int_equal(lbsim_trace_write(f, &t), 0);
	fclose(f);
	f = fmemopen(buf, len, "r");
	assert_int_equal(lbsim_trace_read(f, &u), 0);
	fclose(f);
	assert_int_equal(u.n, t.n);
	for (size_t i = 0; i < t.n; i++) {
		assert_true(u.r[i].t > t.r[i].t - 1e-6 && u.r[i].t < t.r[i].t + 1e-6);
		assert_int_equal(u.r[i].ptok, t.r[i].ptok);
		assert_int_equal(u.r[i].otok, t.r[i].otok);
		assert_true(u.r[i].key == t.r[i].key);
		assert_int_equal(u.r[i].nblk, t.r[i].nblk);
		assert_memory_equal(u.blocks + u.r[i].blk, t.blocks + t.r[i].blk,
				    (size_t)t.r[i].nblk * sizeof(uint64_t));
	}
	free(buf);
	lbsim_trace_free(&t);
	lbsim_trace_free(&u);
}

static int read_str(const char *s)
{
	FILE *f = fmemopen((void *)s, strlen(s), "r");
	struct lbsim_trace t;
	int rc = lbsim_trace_read(f, &t);
	fclose(f);
	if (!rc)
		lbsim_trace_free(&t);
	return rc;
}

static void test_trace_bad_lines(void **state)
{
	(void)state;
	assert_int_equal(read_str("# c\n0 128 4 ab 1,2\n10 64 1 0 -\n"), 0);
	assert_int_equal(read_str("0 128 4 ab 1,2,3\n"), -EINVAL); /* 3 blocks > 128 tokens */
	assert_int_equal(read_str("0 0 4 ab -\n"), -EINVAL);	   /* no prompt */
	assert_int_equal(read_str("0 10 0 ab -\n"), -EINVAL);	   /* no output */
	assert_int_equal(read_str("-1 10 1 ab -\n"), -EINVAL);	   /* before time 0 */
	assert_int_equal(read_str("0 10 1 ab - x\n"), -EINVAL);	   /* trailing junk */
	assert_int_equal(read_str("0 10 1 zz -\n"), -EINVAL);	   /* no key */
	assert_int_equal(read_str("0 128 1 ab 1,\n"), -EINVAL);	   /* empty hash */
	assert_int_equal(read_str("5 10 1 ab -\n4 10 1 ab -\n"), -EDOM);
	assert_int_equal(read_str("nan 10 1 ab -\n"), -EINVAL);
}

static void test_sim_finishes_and_hits_ordered(void **state)
{
	(void)state;
	struct lbsim_trace t = gen(3000, 40);
	for (int p = LB_RR; p <= LB_PREFIX + 1; p++) {
		struct lbsim_cfg c;
		lbsim_cfg_defaults(&c);
		c.prefill = c.decode = 4;
		c.oracle = p == LB_PREFIX + 1;
		c.pf_policy = c.dc_policy = c.oracle ? LB_PREFIX : (enum lb_policy)p;
		struct lbsim_report r;
		assert_int_equal(lbsim_run(&c, &t, &r), 0);
		assert_int_equal(r.requests, t.n);
		assert_true(r.hit_local >= 0 && r.hit_local <= r.hit_total + 1e-9);
		/* kvfs holds what was computed: never more than every earlier block */
		assert_true(r.hit_total <= r.hit_oracle + 1e-9);
		assert_true(r.hit_oracle > 0.2); /* the trace shares prefixes */
		assert_true(r.ttft_p50 > 0 && r.ttft_p50 <= r.ttft_p99);
		assert_true(r.pf_balance > 0 && r.pf_balance <= 1 + 1e-9);
		assert_true(r.decode_tps > 0);
	}
	lbsim_trace_free(&t);
}

/* Identical requests far apart (replicas idle): rr goes round, least rotates its ties, for
 * prefill and for decode. */
static void test_sim_rr_and_least_spread(void **state)
{
	(void)state;
	struct lbsim_trace t = {0};
	for (int i = 0; i < 40; i++)
		assert_int_equal(lbsim_trace_add(&t, i * 100.0, 100, 4, 7, NULL, 0), 0);
	for (int p = LB_RR; p <= LB_LEAST; p++) {
		struct lbsim_cfg c;
		lbsim_cfg_defaults(&c);
		c.prefill = c.decode = 4;
		c.pf_policy = c.dc_policy = (enum lb_policy)p;
		char *buf = NULL;
		size_t len = 0;
		c.decisions = open_memstream(&buf, &len);
		struct lbsim_report r;
		assert_int_equal(lbsim_run(&c, &t, &r), 0);
		fclose(c.decisions);
		int count[4] = {0}, dcount[4] = {0}, req, pf, dc;
		FILE *f = fmemopen(buf, len, "r");
		while (fscanf(f, "%d %d %d", &req, &pf, &dc) == 3) {
			assert_true(pf >= 0 && pf < 4 && dc >= 0 && dc < 4);
			count[pf]++;
			dcount[dc]++;
		}
		fclose(f);
		free(buf);
		for (int i = 0; i < 4; i++) { /* both stages spread their ties */
			assert_int_equal(count[i], 10);
			assert_int_equal(dcount[i], 10);
		}
	}
	lbsim_trace_free(&t);
}

/* A trace that pauses for years simulates (the periodic events skip the idle pause rather
 * than ticking through ~10^7 windows) and its percentiles are ordered. */
static void test_sim_idle_gap(void **state)
{
	(void)state;
	struct lbsim_trace t = {0};
	assert_int_equal(lbsim_trace_add(&t, 0, 4000, 4, 1, NULL, 0), 0);
	assert_int_equal(lbsim_trace_add(&t, 1e8, 100, 4, 2, NULL, 0), 0);
	struct lbsim_cfg c;
	lbsim_cfg_defaults(&c);
	c.prefill = c.decode = 2;
	struct lbsim_report r;
	assert_int_equal(lbsim_run(&c, &t, &r), 0);
	assert_int_equal(r.requests, 2);
	assert_true(r.ttft_p50 <= r.ttft_p99);
	assert_true(r.ttft_p99 > 0.4); /* 4000 tokens at 8000/s */
	lbsim_trace_free(&t);
}

/* prefix: the replica holding a prompt's leading blocks wins while its queue is shorter than
 * what it saves; a longer queue sends the request elsewhere. */
static void test_prefix_policy(void **state)
{
	(void)state;
	struct lbp_index ix;
	assert_int_equal(lbp_index_init(&ix, 12), 0);
	char text[2048];
	memset(text, 'a', sizeof(text));
	uint64_t blk[8];
	int nb = lbp_text_blocks(text, sizeof(text), blk, 8);
	assert_int_equal(nb, 8);
	struct lbp_req q = {.key = 1, .est_tokens = 512, .block = blk, .nblocks = nb};
	struct lbp_load r[3] = {{.up = 1}, {.up = 1}, {.up = 1}};
	struct lbp_set s = {.r = r, .n = 3};
	int who;
	assert_int_equal(lbp_index_match(&ix, &q, &who), 0);
	lbp_index_note(&ix, &q, 2);
	assert_int_equal(lbp_index_match(&ix, &q, &who), 8);
	assert_int_equal(who, 2);
	r[2].queued_tokens = 300; /* < the 512 tokens it saves */
	assert_int_equal(lbp_pick_prefill(LB_PREFIX, &s, &q, &ix, NULL), 2);
	r[2].queued_tokens = 600;
	assert_int_not_equal(lbp_pick_prefill(LB_PREFIX, &s, &q, &ix, NULL), 2);
	unsigned char skip[3] = {0, 0, 1};
	r[2].queued_tokens = 0;
	assert_int_not_equal(lbp_pick_prefill(LB_PREFIX, &s, &q, &ix, skip), 2);
	r[2].up = 0;
	assert_int_not_equal(lbp_pick_prefill(LB_PREFIX, &s, &q, &ix, NULL), 2);
	lbp_index_drop(&ix, 2);
	assert_int_equal(lbp_index_match(&ix, &q, &who), 0);
	/* a shorter prompt sharing the first blocks matches those */
	lbp_index_note(&ix, &q, 1);
	struct lbp_req q2 = {.key = 2, .est_tokens = 200, .block = blk, .nblocks = 3};
	assert_int_equal(lbp_index_match(&ix, &q2, &who), 3);
	assert_int_equal(who, 1);
	lbp_index_free(&ix);
	/* decode: a replica whose free KV cannot hold the request loses to one that can */
	struct lbp_load d[2] = {{.up = 1, .inflight = 0, .kv_free = 5},
				{.up = 1, .inflight = 3, .kv_free = 100}};
	struct lbp_set ds = {.r = d, .n = 2};
	struct lbp_req dq = {.kv_blocks = 10};
	assert_int_equal(lbp_pick_decode(LB_PREFIX, &ds, &dq, NULL), 1);
	assert_int_equal(lbp_pick_decode(LB_LEAST, &ds, &dq, NULL), 0);
	/* chash: the rendezvous owner of the prefix while its load is within the bound */
	struct lbp_load c[4] = {
	    {.id = 11, .up = 1}, {.id = 22, .up = 1}, {.id = 33, .up = 1}, {.id = 44, .up = 1}};
	struct lbp_set cs = {.r = c, .n = 4};
	struct lbp_req cq = {.key = 5, .est_tokens = 100, .block = blk, .nblocks = 8};
	int own = lbp_pick_prefill(LB_CHASH, &cs, &cq, NULL, NULL);
	assert_true(own >= 0);
	for (int k = 0; k < 5; k++) /* the same prefix, the same owner */
		assert_int_equal(lbp_pick_prefill(LB_CHASH, &cs, &cq, NULL, NULL), own);
	c[own].queued_tokens = 10000; /* far over (1 + eps) x mean + the prompt */
	int next = lbp_pick_prefill(LB_CHASH, &cs, &cq, NULL, NULL);
	assert_true(next >= 0 && next != own);
	c[own].queued_tokens = 50; /* within the bound */
	assert_int_equal(lbp_pick_prefill(LB_CHASH, &cs, &cq, NULL, NULL), own);
	assert_int_equal(lb_policy_parse("chash"), LB_CHASH);
	assert_int_equal(lb_policy_parse("prefix"), LB_PREFIX);
	assert_int_equal(lb_policy_parse("nope"), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_trace_round_trip),
	    cmocka_unit_test(test_trace_bad_lines),
	    cmocka_unit_test(test_sim_finishes_and_hits_ordered),
	    cmocka_unit_test(test_sim_rr_and_least_spread),
	    cmocka_unit_test(test_sim_idle_gap),
	    cmocka_unit_test(test_prefix_policy),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
