/* Tests for kernels/: CPU kernels against plain formulas; CUDA kernels against the CPU
 * reference when a GPU answers (otherwise this binary exits 77: CTest reports it skipped). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvk.h"

static float frand(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return ((*s >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}

static void test_rmsnorm_cpu(void **state)
{
	(void)state;
	enum { N = 67, R = 3 };
	float x[N * R], w[N], out[N * R];
	unsigned s = 1;
	for (int i = 0; i < N * R; i++)
		x[i] = frand(&s) * 3;
	for (int i = 0; i < N; i++)
		w[i] = frand(&s);
	kvk_rmsnorm_f32(out, x, w, N, R, 1e-5f);
	for (int r = 0; r < R; r++) {
		float ss = 0;
		for (int i = 0; i < N; i++)
			ss += x[r * N + i] * x[r * N + i];
		float sc = 1.0f / sqrtf(ss / N + 1e-5f);
		for (int i = 0; i < N; i++)
			assert_float_equal(out[r * N + i], x[r * N + i] * sc * w[i], 1e-5);
	}
	/* In place gives the same answer. */
	kvk_rmsnorm_f32(x, x, w, N, R, 1e-5f);
	assert_memory_equal(x, out, sizeof(out));
}

static void test_rmsnorm_cuda(void **state)
{
	(void)state;
	enum { N = 4096, R = 8 };
	float *x = malloc(sizeof(float) * N * R), *w = malloc(sizeof(float) * N);
	float *ref = malloc(sizeof(float) * N * R), *got = malloc(sizeof(float) * N * R);
	unsigned s = 7;
	for (int i = 0; i < N * R; i++)
		x[i] = frand(&s);
	for (int i = 0; i < N; i++)
		w[i] = frand(&s);
	kvk_rmsnorm_f32(ref, x, w, N, R, 1e-6f);
	assert_int_equal(kvk_cuda_rmsnorm_f32(got, x, w, N, R, 1e-6f), 0);
	/* Tolerance: float32 reduction in a different order, relative 1e-5. */
	for (int i = 0; i < N * R; i++)
		assert_float_equal(got[i], ref[i], 1e-5 * (fabsf(ref[i]) + 1e-3));
	free(x), free(w), free(ref), free(got);
}

/* kvk_exp (the engine's softmax / SiLU exponential) against libm's double exp: within 2.5e-7
 * relative over the range it computes, exact at 0, 0 below it and inf above it (as expf
 * underflows and overflows; no subnormals); the same bits from the loop the compiler vectorizes as
 * from single calls. */
static void test_exp(void **state)
{
	(void)state;
	double worst = 0;
	for (float x = -87.0f; x < 88.0f; x += 0.000731f) {
		double want = exp((double)x), got = kvk_exp(x);
		double rel = fabs(got - want) / want;
		worst = rel > worst ? rel : worst;
	}
	printf("  kvk_exp: worst relative error %.2e over [-87, 88]\n", worst);
	assert_true(worst < 2.5e-7);
	assert_true(kvk_exp(0.0f) == 1.0f);
	assert_true(kvk_exp(-87.3f) >= 0x1p-126f && kvk_exp(-87.4f) == 0.0f);
	assert_true(kvk_exp(-1000.0f) == 0.0f && isinf(kvk_exp(1000.0f)) && kvk_exp(1000.0f) > 0);
	assert_true(isfinite(kvk_exp(88.3f)) && isinf(kvk_exp(88.4f)));
	assert_true(isnan(kvk_exp(NAN)));
	enum { N = 1003 };
	float x[N], y[N];
	for (int i = 0; i < N; i++)
		x[i] = -90.0f + 180.0f * (float)i / N;
	for (int i = 0; i < N; i++) /* a loop as the engine's */
		y[i] = kvk_exp(x[i]);
	for (int i = 0; i < N; i++) {
		volatile float xi = x[i];
		float one = kvk_exp(xi);
		assert_memory_equal(&one, &y[i], 4);
	}
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "--gpu") == 0) {
		if (!kvk_cuda_available()) {
			printf("skipped: no GPU (or no CUDA in this build)\n");
			return 77;
		}
		const struct CMUnitTest gpu[] = {cmocka_unit_test(test_rmsnorm_cuda)};
		return cmocka_run_group_tests_name("kernels_gpu", gpu, NULL, NULL);
	}
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_rmsnorm_cpu),
					   cmocka_unit_test(test_exp)};
	return cmocka_run_group_tests_name("kernels_cpu", tests, NULL, NULL);
}
