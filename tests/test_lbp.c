/* Tests for the encoder stage's pick (engine/serve/lbp.c, lbp_pick_encode): distinct images
 * spread over two encoders within the 40-60 % band, a repeated image goes back to the
 * encoder that had it, an owner over the load bound is passed over, and a replica that is down
 * or skipped is never picked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "lbp.h"

enum { IMG_TOKENS = 196 };

static void two(struct lbp_load r[2], struct lbp_set *s)
{
	r[0] = (struct lbp_load){.id = lbp_id("127.0.0.1:7001"), .up = 1};
	r[1] = (struct lbp_load){.id = lbp_id("127.0.0.1:7002"), .up = 1};
	*s = (struct lbp_set){.r = r, .n = 2};
}

static uint64_t img_key(int i)
{
	char b[32];
	int n = snprintf(b, sizeof(b), "image-%d", i);
	return lbp_hash(b, (size_t)n, LBP_SEED);
}

/* A stream of distinct images, each encoded while the next arrive (up to 4 in flight). */
static void test_distinct_images_spread(void **state)
{
	(void)state;
	struct lbp_load r[2];
	struct lbp_set s;
	two(r, &s);
	enum { N = 1000, DEPTH = 4 };
	int got[2] = {0, 0}, ring[DEPTH], head = 0;
	for (int i = 0; i < N; i++) {
		if (i >= DEPTH) { /* the oldest finishes */
			int done = ring[head];
			r[done].inflight_tokens -= IMG_TOKENS;
			r[done].inflight--;
		}
		int k = lbp_pick_encode(&s, img_key(i), IMG_TOKENS, NULL);
		assert_true(k == 0 || k == 1);
		got[k]++;
		r[k].inflight_tokens += IMG_TOKENS;
		r[k].inflight++;
		ring[head] = k;
		head = (head + 1) % DEPTH;
	}
	print_message("distinct images: %d / %d\n", got[0], got[1]);
	assert_true(got[0] >= N * 40 / 100 && got[0] <= N * 60 / 100);
}

static void test_repeat_goes_home(void **state)
{
	(void)state;
	struct lbp_load r[2];
	struct lbp_set s;
	two(r, &s);
	for (int i = 0; i < 50; i++) {
		int a = lbp_pick_encode(&s, img_key(i), IMG_TOKENS, NULL);
		r[a].inflight_tokens += IMG_TOKENS; /* still encoding: within the bound */
		int b = lbp_pick_encode(&s, img_key(i), IMG_TOKENS, NULL);
		assert_int_equal(a, b);
		r[a].inflight_tokens -= IMG_TOKENS;
	}
}

static void test_overloaded_owner_passed(void **state)
{
	(void)state;
	struct lbp_load r[2];
	struct lbp_set s;
	two(r, &s);
	int own = lbp_pick_encode(&s, img_key(7), IMG_TOKENS, NULL);
	r[own].queued_tokens = 20 * IMG_TOKENS; /* a backlog far over the mean + one image */
	assert_int_equal(lbp_pick_encode(&s, img_key(7), IMG_TOKENS, NULL), 1 - own);
	r[own].queued_tokens = 0;
	unsigned char skip[2] = {0, 0};
	skip[own] = 1;
	assert_int_equal(lbp_pick_encode(&s, img_key(7), IMG_TOKENS, skip), 1 - own);
	r[1 - own].up = 0;
	assert_int_equal(lbp_pick_encode(&s, img_key(7), IMG_TOKENS, skip), -1);
	s.n = 0;
	assert_int_equal(lbp_pick_encode(&s, img_key(7), IMG_TOKENS, NULL), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_distinct_images_spread),
	    cmocka_unit_test(test_repeat_goes_home),
	    cmocka_unit_test(test_overloaded_owner_passed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
