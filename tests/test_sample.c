/* Tests for engine/sample: greedy, top-k, top-p, temperature, seeds, stop and max tokens. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sample.h"

static struct kvi_sampler *mk(float temp, int k, float p, uint64_t seed, int V)
{
	struct kvi_sample_params sp;
	kvi_sample_params_default(&sp);
	sp.temp = temp;
	sp.top_k = k;
	sp.top_p = p;
	sp.seed = seed;
	struct kvi_sampler *s = NULL;
	assert_int_equal(kvi_sampler_create(&sp, V, &s), 0);
	return s;
}

static void test_greedy(void **st)
{
	(void)st;
	float l[6] = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f, 0};
	struct kvi_sampler *s = mk(0, 40, 0.9f, 1, 6);
	assert_int_equal(kvi_sampler_sample(s, l), 1); /* first of the tied maxima */
	kvi_sampler_destroy(s);
	/* top_k 1 at any temperature is greedy too */
	s = mk(5.0f, 1, 1.0f, 7, 6);
	for (int i = 0; i < 50; i++)
		assert_int_equal(kvi_sampler_sample(s, l), 1);
	kvi_sampler_destroy(s);
}

static void test_seeded_deterministic(void **st)
{
	(void)st;
	enum { V = 1000 };
	float *l = malloc(V * sizeof(float));
	for (int i = 0; i < V; i++)
		l[i] = sinf((float)i) * 3;
	struct kvi_sampler *a = mk(1.0f, 0, 1.0f, 42, V), *b = mk(1.0f, 0, 1.0f, 42, V);
	struct kvi_sampler *c = mk(1.0f, 0, 1.0f, 43, V);
	int differ = 0;
	for (int i = 0; i < 200; i++) {
		int32_t x = kvi_sampler_sample(a, l), y = kvi_sampler_sample(b, l);
		assert_int_equal(x, y);
		differ += x != kvi_sampler_sample(c, l);
	}
	assert_true(differ > 50);
	kvi_sampler_destroy(a);
	kvi_sampler_destroy(b);
	kvi_sampler_destroy(c);
	free(l);
}

/* Two tokens with logits ln 3 and 0 at temp 1: frequencies 3/4 and 1/4. */
static void test_temperature_distribution(void **st)
{
	(void)st;
	float l[3] = {logf(3.0f), 0.0f, -INFINITY};
	struct kvi_sampler *s = mk(1.0f, 0, 1.0f, 5, 3);
	int n0 = 0, N = 20000;
	for (int i = 0; i < N; i++) {
		int32_t t = kvi_sampler_sample(s, l);
		assert_true(t == 0 || t == 1);
		n0 += t == 0;
	}
	assert_true(fabs((double)n0 / N - 0.75) < 0.02);
	kvi_sampler_destroy(s);
	/* a high temperature flattens it */
	s = mk(100.0f, 0, 1.0f, 5, 3);
	n0 = 0;
	for (int i = 0; i < N; i++)
		n0 += kvi_sampler_sample(s, l) == 0;
	assert_true(fabs((double)n0 / N - 0.5) < 0.03);
	kvi_sampler_destroy(s);
}

static void test_top_k_top_p(void **st)
{
	(void)st;
	/* probabilities at temp 1 about 0.5, 0.3, 0.15, 0.05 */
	float l[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
	struct kvi_sampler *s = mk(1.0f, 2, 1.0f, 9, 4);
	int seen[4] = {0};
	for (int i = 0; i < 2000; i++)
		seen[kvi_sampler_sample(s, l)]++;
	assert_true(seen[0] > 0 && seen[1] > 0);
	assert_int_equal(seen[2] + seen[3], 0);
	kvi_sampler_destroy(s);
	/* top_p 0.85: 0.5 + 0.3 < 0.85 <= 0.95, so tokens 0, 1, 2 */
	s = mk(1.0f, 0, 0.85f, 9, 4);
	memset(seen, 0, sizeof(seen));
	for (int i = 0; i < 4000; i++)
		seen[kvi_sampler_sample(s, l)]++;
	assert_true(seen[0] > 0 && seen[1] > 0 && seen[2] > 0);
	assert_int_equal(seen[3], 0);
	kvi_sampler_destroy(s);
}

/* OpenAI's adjustments: logit_bias is added before anything else (greedy included); each
 * token generated c times loses c * frequency_penalty + presence_penalty; a bad bias id is
 * refused at creation. */
static void test_bias_and_penalties(void **st)
{
	(void)st;
	float l[4] = {1.0f, 3.0f, 2.5f, 0};
	struct kvi_sample_params sp;
	kvi_sample_params_default(&sp);
	sp.n_bias = 1;
	sp.bias[0] = (struct kvi_logit_bias){3, 100};
	struct kvi_sampler *s = NULL;
	assert_int_equal(kvi_sampler_create(&sp, 4, &s), 0);
	assert_int_equal(kvi_sampler_sample(s, l), 3);
	kvi_sampler_destroy(s);
	sp.bias[0] = (struct kvi_logit_bias){1, -100}; /* the best is banned: the next wins */
	assert_int_equal(kvi_sampler_create(&sp, 4, &s), 0);
	assert_int_equal(kvi_sampler_sample(s, l), 2);
	kvi_sampler_destroy(s);
	sp.bias[0].id = 4; /* outside the vocabulary */
	assert_int_equal(kvi_sampler_create(&sp, 4, &s), -EINVAL);

	/* frequency 0.3: token 1 (3.0) after one use is 2.7 > 2.5, after two 2.4 < 2.5 */
	kvi_sample_params_default(&sp);
	sp.frequency_penalty = 0.3f;
	assert_int_equal(kvi_sampler_create(&sp, 4, &s), 0);
	int32_t seq[3];
	for (int i = 0; i < 3; i++)
		kvi_sampler_accept(s, seq[i] = kvi_sampler_sample(s, l));
	assert_int_equal(seq[0], 1);
	assert_int_equal(seq[1], 1);
	assert_int_equal(seq[2], 2);
	kvi_sampler_destroy(s);
	/* presence 0.6: once is enough to lose to token 2 */
	kvi_sample_params_default(&sp);
	sp.presence_penalty = 0.6f;
	assert_int_equal(kvi_sampler_create(&sp, 4, &s), 0);
	kvi_sampler_accept(s, kvi_sampler_sample(s, l));
	assert_int_equal(kvi_sampler_sample(s, l), 2);
	kvi_sampler_destroy(s);
}

/* Log-probabilities: log_softmax of the adjusted logits, the best n first. */
static void test_logprobs(void **st)
{
	(void)st;
	float l[5] = {1.0f, 3.0f, 2.5f, 0, -1};
	struct kvi_sampler *s = mk(0.7f, 40, 0.9f, 1, 5);
	double z = 0;
	for (int i = 0; i < 5; i++)
		z += exp(l[i]);
	int32_t id[5];
	float lp[5];
	float own = kvi_sampler_logprobs(s, l, 2, 5, id, lp);
	assert_true(fabs(own - (2.5 - log(z))) < 1e-5);
	static const int32_t order[5] = {1, 2, 0, 3, 4};
	double sum = 0;
	for (int i = 0; i < 5; i++) {
		assert_int_equal(id[i], order[i]);
		assert_true(fabs(lp[i] - (l[order[i]] - log(z))) < 1e-5);
		sum += exp(lp[i]);
	}
	assert_true(fabs(sum - 1) < 1e-5);
	kvi_sampler_destroy(s);
}

static void test_stop_and_max(void **st)
{
	(void)st;
	struct kvi_sample_params sp;
	kvi_sample_params_default(&sp);
	sp.max_tokens = 3;
	sp.n_stop = 2;
	sp.stop[0] = 7;
	sp.stop[1] = 9;
	struct kvi_sampler *s;
	assert_int_equal(kvi_sampler_create(&sp, 10, &s), 0);
	assert_int_equal(kvi_sampler_accept(s, 1), 0);
	assert_true(kvi_sampler_is_stop(s, 9));
	assert_false(kvi_sampler_is_stop(s, 8));
	assert_int_equal(kvi_sampler_accept(s, 9), 1);
	kvi_sampler_destroy(s);
	assert_int_equal(kvi_sampler_create(&sp, 10, &s), 0);
	assert_int_equal(kvi_sampler_accept(s, 1), 0);
	assert_int_equal(kvi_sampler_accept(s, 2), 0);
	assert_int_equal(kvi_sampler_accept(s, 3), 1); /* third token: budget spent */
	assert_int_equal(kvi_sampler_count(s), 3);
	kvi_sampler_destroy(s);
	sp.n_stop = KVI_SAMPLE_MAX_STOP + 1;
	assert_int_equal(kvi_sampler_create(&sp, 10, &s), -EINVAL);
	sp.n_stop = 0;
	assert_int_equal(kvi_sampler_create(&sp, 0, &s), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_greedy),
	    cmocka_unit_test(test_seeded_deterministic),
	    cmocka_unit_test(test_temperature_distribution),
	    cmocka_unit_test(test_top_k_top_p),
	    cmocka_unit_test(test_stop_and_max),
	    cmocka_unit_test(test_bias_and_penalties),
	    cmocka_unit_test(test_logprobs),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
