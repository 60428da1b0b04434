/* kvk-kq-bench: the quantized matmul kernels alone, one thread, every ISA this CPU has side by
 * side in one run (alternating passes, best of N by thread CPU time, so other processes on
 * the machine cost wall time, not the figure). A rows x n matrix of each type from random
 * weights, y = W x for a batch of tokens; prints G weights/s (rows * n * ntok / s) and the
 * ratio of each ISA to AVX2's.
 *
 *   kvk-kq-bench [rows n ntok passes]     defaults 8192 2048 1 7
 *
 * Exit 0, or 1 when out of memory. */
#include "kvk.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Q8_0 by hand (kvk_quantize_row takes the K-quant and 32-block types only). */
static void q8_row(uint8_t *out, const float *x, size_t n)
{
	for (size_t b = 0; b < n / 32; b++, out += 34) {
		float amax = 0;
		for (int i = 0; i < 32; i++)
			amax = fabsf(x[32 * b + i]) > amax ? fabsf(x[32 * b + i]) : amax;
		uint16_t h = kvk_f32_to_f16(amax / 127);
		memcpy(out, &h, 2);
		for (int i = 0; i < 32; i++)
			out[2 + i] =
			    (uint8_t)(int8_t)lrintf(amax > 0 ? x[32 * b + i] * 127 / amax : 0);
	}
}

static float frand(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((int64_t)(*s >> 11) - (1ll << 52)) / (float)(1ll << 52);
}

int main(int argc, char **argv)
{
	size_t rows = argc > 1 ? strtoull(argv[1], NULL, 10) : 8192;
	size_t n = argc > 2 ? strtoull(argv[2], NULL, 10) : 2048;
	size_t ntok = argc > 3 ? strtoull(argv[3], NULL, 10) : 1;
	int passes = argc > 4 ? atoi(argv[4]) : 7;
	static const enum kvk_wtype types[] = {KVK_W_Q8_0, KVK_W_Q4_K, KVK_W_Q5_K, KVK_W_Q6_K,
					       KVK_W_Q4_0, KVK_W_Q5_0, KVK_W_Q5_1};
	static const char *names[] = {"Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q5_0", "Q5_1"};
	enum kvk_isa best = kvk_isa_best();
	printf("kvk-kq-bench: %zu x %zu, %zu tokens, best of %d, 1 thread, G weights/s\n", rows, n,
	       ntok, passes);
	float *row = malloc(n * sizeof(float)), *x = malloc(n * ntok * sizeof(float));
	float *y = malloc(rows * ntok * sizeof(float));
	if (!row || !x || !y)
		return 1;
	uint64_t seed = 1;
	for (size_t i = 0; i < n * ntok; i++)
		x[i] = frand(&seed);
	for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
		enum kvk_wtype wt = types[ti];
		size_t rb = kvk_row_bytes(wt, n);
		uint8_t *w = malloc(rb * rows);
		void *act = malloc(kvk_act_bytes(wt, n, ntok));
		size_t sb = (kvk_matmul_scratch_floats(wt, n) * sizeof(float) + 127) & ~(size_t)63;
		float *scratch = aligned_alloc(64, sb);
		if (!w || !act || !scratch)
			return 1;
		for (size_t r = 0; r < rows; r++) {
			for (size_t i = 0; i < n; i++)
				row[i] = frand(&seed);
			if (wt == KVK_W_Q8_0)
				q8_row(w + r * rb, row, n);
			else if (kvk_quantize_row(wt, w + r * rb, row, n))
				return 1;
		}
		kvk_act_prepare(wt, act, ntok, x, n, n, 0, ntok);
		double bt[4] = {1e30, 1e30, 1e30, 1e30};
		for (int p = 0; p < passes; p++)
			for (int isa = KVK_ISA_AVX2; isa <= (int)best; isa++) {
				double t0 = cpu_now();
				kvk_matmul((enum kvk_isa)isa, wt, y, rows, w, n, 0, rows, act, ntok,
					   scratch);
				double t = cpu_now() - t0;
				bt[isa] = t < bt[isa] ? t : bt[isa];
			}
		printf("  %-5s", names[ti]);
		for (int isa = KVK_ISA_AVX2; isa <= (int)best; isa++)
			printf("  %s %6.1f", kvk_isa_name((enum kvk_isa)isa),
			       (double)rows * n * ntok / bt[isa] / 1e9);
		if (best > KVK_ISA_AVX2)
			printf("  (%.2fx)", bt[KVK_ISA_AVX2] / bt[best]);
		printf("\n");
		free(w), free(act), free(scratch);
	}
	free(row), free(x), free(y);
	return 0;
}
