/* Tests for the Q4_0 / Q4_K / Q5_K / Q6_K kernels (kernels/kvk_quant.c, kvk_matmul_kq_avx2.c):
 * dequantization of hand-built blocks in GGML's layouts, the quantizer's error, the scalar
 * reference against a double-precision dot of the dequantized operands, and every SIMD ISA
 * this CPU has against the scalar reference, with batch invariance. Runs everywhere. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvk.h"
#include "kvk_ops.h"

static const enum kvk_wtype TYPES[] = {KVK_W_Q4_0, KVK_W_Q4_K, KVK_W_Q5_K,
				       KVK_W_Q6_K, KVK_W_Q5_0, KVK_W_Q5_1};
static const char *TNAME[] = {"Q4_0", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1"};
#define NTYPES 6

static uint32_t rng(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(*s >> 33);
}

static float frand(uint64_t *s) /* [-1, 1) */
{
	return (float)rng(s) / 2147483648.0f - 1.0f;
}

static void put16(uint8_t *p, uint16_t h)
{
	memcpy(p, &h, 2);
}

/* ---- hand-built blocks ---- */

static void test_q4_0_block(void **st)
{
	(void)st;
	uint8_t b[18];
	put16(b, 0x3800); /* d = 0.5 */
	for (int i = 0; i < 16; i++)
		b[2 + i] = (uint8_t)(i | ((15 - i) << 4));
	float y[32];
	kvk_row_to_f32(KVK_W_Q4_0, b, 32, 0, y);
	for (int i = 0; i < 16; i++) {
		assert_true(y[i] == 0.5f * (float)(i - 8));
		assert_true(y[16 + i] == 0.5f * (float)(7 - i));
	}
	assert_int_equal(kvk_row_bytes(KVK_W_Q4_0, 64), 36);
	assert_int_equal(kvk_row_bytes(KVK_W_Q4_0, 48), 0);
}

/* Q5_0 and Q5_1: d = 0.5 (Q5_1: m = -2), nibbles as in the Q4_0 test, fifth bits 0xa5a5f00f
 * (bit i for value i, little-endian). */
static void test_q5_blocks(void **st)
{
	(void)st;
	const uint32_t h = 0xa5a5f00fu;
	for (int one = 0; one < 2; one++) {
		uint8_t b[24];
		put16(b, 0x3800);
		if (one)
			put16(b + 2, 0xc000); /* -2 */
		uint8_t *qh = b + (one ? 4 : 2);
		for (int k = 0; k < 4; k++)
			qh[k] = (uint8_t)(h >> (8 * k));
		for (int i = 0; i < 16; i++)
			qh[4 + i] = (uint8_t)(i | ((15 - i) << 4));
		float y[32];
		kvk_row_to_f32(one ? KVK_W_Q5_1 : KVK_W_Q5_0, b, 32, 0, y);
		for (int i = 0; i < 32; i++) {
			int q = (i < 16 ? i : 31 - i) | (int)((h >> i) & 1) << 4;
			float want = one ? 0.5f * (float)q - 2.0f : 0.5f * (float)(q - 16);
			assert_true(y[i] == want);
		}
	}
	assert_int_equal(kvk_row_bytes(KVK_W_Q5_0, 64), 44);
	assert_int_equal(kvk_row_bytes(KVK_W_Q5_1, 64), 48);
}

/* Q4_K with five == 0, Q5_K with five == 1: d = 1, dmin = 0.5, sub-block s has scale
 * 8s + 7 and min 63 - 8s (so s >= 4 exercises the split 6-bit packing), value (i + s) & 15
 * plus, for Q5_K, 16 * bit s of qh[i] = i * 37. */
static void kq45_block(int five, uint8_t *b)
{
	size_t bytes = five ? 176 : 144;
	memset(b, 0, bytes);
	put16(b, 0x3c00);
	put16(b + 2, 0x3800);
	uint8_t *sc = b + 4, *qh = five ? b + 16 : NULL, *qs = b + (five ? 48 : 16);
	for (int s = 0; s < 8; s++) {
		int d = 8 * s + 7, m = 63 - 8 * s;
		if (s < 4) {
			sc[s] |= (uint8_t)d;
			sc[s + 4] |= (uint8_t)m;
		} else {
			sc[s + 4] = (uint8_t)((d & 15) | ((m & 15) << 4));
			sc[s - 4] |= (uint8_t)((d >> 4) << 6);
			sc[s] |= (uint8_t)((m >> 4) << 6);
		}
		for (int i = 0; i < 32; i++)
			qs[32 * (s / 2) + i] |= (uint8_t)(((i + s) & 15) << (4 * (s % 2)));
	}
	if (qh)
		for (int i = 0; i < 32; i++)
			qh[i] = (uint8_t)(i * 37);
}

static void test_k45_block(void **st)
{
	(void)st;
	for (int five = 0; five < 2; five++) {
		uint8_t b[176];
		kq45_block(five, b);
		float y[256];
		kvk_row_to_f32(five ? KVK_W_Q5_K : KVK_W_Q4_K, b, 256, 0, y);
		for (int s = 0; s < 8; s++)
			for (int i = 0; i < 32; i++) {
				int q = (i + s) & 15;
				if (five)
					q |= (((uint8_t)(i * 37) >> s) & 1) << 4;
				float want =
				    (float)(8 * s + 7) * (float)q - 0.5f * (float)(63 - 8 * s);
				assert_true(y[32 * s + i] == want);
			}
		/* one value spelled out: sub-block 5 (scale 47 = 0xF | 2 << 4 from bytes 9 and
		 * 1, min 23 = 0x7 | 1 << 4 from bytes 9 and 5), element 3: q = 8, Q5_K bit 5 of
		 * 111 = 1 */
		assert_int_equal(b[4 + 9], 0x7f);
		assert_true(y[5 * 32 + 3] == (five ? 47.0f * 24 - 11.5f : 47.0f * 8 - 11.5f));
	}
	assert_int_equal(kvk_row_bytes(KVK_W_Q4_K, 512), 288);
	assert_int_equal(kvk_row_bytes(KVK_W_Q5_K, 256), 176);
	assert_int_equal(kvk_row_bytes(KVK_W_Q4_K, 224), 0);
}

/* Q6_K: d = 0.25, group g has scale g - 8, value e has q = (7e) % 64, written per GGML's
 * layout: element 128h + 32k + l has its low nibble in ql[64h + 32(k % 2) + l] (high half
 * for k >= 2) and its top two bits at bits 2k of qh[32h + l]. */
static void test_q6_k_block(void **st)
{
	(void)st;
	uint8_t b[210];
	memset(b, 0, sizeof(b));
	put16(b + 208, 0x3400);
	for (int g = 0; g < 16; g++)
		b[192 + g] = (uint8_t)(int8_t)(g - 8);
	for (int e = 0; e < 256; e++) {
		int q = (7 * e) % 64, h = e / 128, k = (e % 128) / 32, l = e % 32;
		b[64 * h + 32 * (k % 2) + l] |= (uint8_t)((q & 15) << (k >= 2 ? 4 : 0));
		b[128 + 32 * h + l] |= (uint8_t)((q >> 4) << (2 * k));
	}
	float y[256];
	kvk_row_to_f32(KVK_W_Q6_K, b, 256, 0, y);
	for (int e = 0; e < 256; e++)
		assert_true(y[e] == 0.25f * (float)(e / 16 - 8) * (float)((7 * e) % 64 - 32));
	/* element 70 (h 0, k 2, l 6): q = 490 % 64 = 42 = 0xA | 2 << 4; group 4, scale -4 */
	assert_int_equal(b[6] >> 4, 0xA);
	assert_int_equal((b[128 + 6] >> 4) & 3, 2);
	assert_true(y[70] == 0.25f * -4.0f * 10.0f);
	assert_int_equal(kvk_row_bytes(KVK_W_Q6_K, 768), 630);
}

/* ---- quantizer ---- */

static void test_quantize_error(void **st)
{
	(void)st;
	/* worst |error| / max |x| of a row: half a step of each type's grid, with the scale
	 * rounding of the 6-bit (K) and 8-bit (Q6_K) scales */
	const double bound[NTYPES] = {0.07, 0.06, 0.03, 0.02, 0.035, 0.035};
	enum { N = 1024 };
	float x[N], y[N];
	uint8_t q[N];
	uint64_t s = 11;
	for (int ti = 0; ti < NTYPES; ti++) {
		double worst = 0;
		for (int rep = 0; rep < 20; rep++) {
			float amax = 0;
			for (int i = 0; i < N; i++) {
				x[i] = frand(&s) * (rep % 3 ? 1.0f : 0.01f) + (rep % 2 ? 0.2f : 0);
				amax = fmaxf(amax, fabsf(x[i]));
			}
			assert_int_equal(kvk_quantize_row(TYPES[ti], q, x, N), 0);
			kvk_row_to_f32(TYPES[ti], q, N, 0, y);
			for (int i = 0; i < N; i++)
				worst = fmax(worst, fabs((double)y[i] - x[i]) / amax);
		}
		printf("  %s: worst |err| / amax %.4f (bound %.3f)\n", TNAME[ti], worst, bound[ti]);
		assert_true(worst <= bound[ti]);
	}
	assert_int_equal(kvk_quantize_row(KVK_W_Q4_K, q, x, 100), -EINVAL);
	assert_int_equal(kvk_quantize_row(KVK_W_Q8_0, q, x, 32), -EINVAL);
}

/* ---- matmul ---- */

struct mm {
	size_t n, rows, ntok;
	uint8_t *w;
	float *x;
	void *act;
};

static void mm_init(struct mm *m, enum kvk_wtype wt, size_t n, size_t rows, size_t ntok,
		    uint64_t seed)
{
	m->n = n, m->rows = rows, m->ntok = ntok;
	size_t rb = kvk_row_bytes(wt, n);
	m->w = malloc(rb * rows);
	m->x = malloc(n * ntok * sizeof(float));
	m->act = malloc(kvk_act_bytes(wt, n, ntok));
	float *row = malloc(n * sizeof(float));
	for (size_t r = 0; r < rows; r++) {
		for (size_t i = 0; i < n; i++)
			row[i] = frand(&seed) * (0.5f + (float)(r % 5)) + (r % 3 ? 0 : 0.3f);
		assert_int_equal(kvk_quantize_row(wt, m->w + r * rb, row, n), 0);
	}
	for (size_t i = 0; i < n * ntok; i++)
		m->x[i] = frand(&seed) * (i % 97 == 0 ? 8.0f : 1.0f);
	kvk_act_prepare(wt, m->act, ntok, m->x, n, n, 0, ntok);
	free(row);
}

static void mm_free(struct mm *m)
{
	free(m->w), free(m->x), free(m->act);
}

/* The scalar reference equals the double-precision dot of the dequantized weights and the
 * dequantized activations (each activation block: its int8 values times its scale) up to
 * float rounding. */
static void test_scalar_vs_exact(void **st)
{
	(void)st;
	enum { R = 9, T = 3 };
	for (int ti = 0; ti < NTYPES; ti++) {
		enum kvk_wtype wt = TYPES[ti];
		size_t n = 768;
		struct mm m;
		mm_init(&m, wt, n, R, T, 100 + ti);
		float y[R * T], wr[768];
		kvk_matmul(KVK_ISA_SCALAR, wt, y, R, m.w, n, 0, R, m.act, T, NULL);
		/* dequantized activations: quantize the same way, by value */
		for (size_t t = 0; t < T; t++) {
			double xq[768];
			for (size_t b = 0; b < n / 32; b++) {
				float amax = 0;
				for (int i = 0; i < 32; i++)
					amax = fmaxf(amax, fabsf(m.x[t * n + 32 * b + i]));
				float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0;
				for (int i = 0; i < 32; i++) {
					float v = m.x[t * n + 32 * b + i] * id;
					xq[32 * b + i] =
					    (double)d * (int)(v + (v < 0 ? -0.5f : 0.5f));
				}
			}
			for (size_t r = 0; r < R; r++) {
				kvk_row_to_f32(wt, m.w, n, r, wr);
				double s = 0, mag = 0;
				for (size_t i = 0; i < n; i++) {
					s += (double)wr[i] * xq[i];
					mag += fabs((double)wr[i] * xq[i]);
				}
				assert_float_equal(y[t * R + r], s, 1e-5 * mag + 1e-6);
			}
		}
		mm_free(&m);
	}
}

/* Every ISA this CPU has against scalar, within the tolerance kvk.h states (1e-5 of
 * sum |w x|); bit-identical per token whatever the batch size and row split. */
static void isa_vs_scalar(enum kvk_isa best)
{
	/* T = 70: AVX-512 passes of 64 tokens, tiles of 8 and single tokens */
	enum { R = 37, T = 70 };
	/* 864: 27 blocks of 32, a short last chunk of 8 blocks (not for the 256 types) */
	const size_t ns[3] = {256, 1280, 864};
	for (int ti = 0; ti < NTYPES; ti++)
		for (int ni = 0; ni < 3; ni++) {
			enum kvk_wtype wt = TYPES[ti];
			size_t n = ns[ni];
			if (n % 256 && (wt == KVK_W_Q4_K || wt == KVK_W_Q5_K || wt == KVK_W_Q6_K))
				continue;
			struct mm m;
			mm_init(&m, wt, n, R, T, 7 + ti * 3 + ni);
			float *yb = malloc(R * T * 4), *ys = malloc(R * T * 4), *y1 = malloc(R * 4);
			float *wr = malloc(n * 4);
			void *act1 = malloc(kvk_act_bytes(wt, n, 1));
			kvk_matmul(best, wt, yb, R, m.w, n, 0, 5, m.act, T, NULL);
			kvk_matmul(best, wt, yb, R, m.w, n, 5, R, m.act, T, NULL);
			kvk_matmul(KVK_ISA_SCALAR, wt, ys, R, m.w, n, 0, R, m.act, T, NULL);
			double worst = 0;
			for (size_t t = 0; t < T; t++) {
				kvk_act_prepare(wt, act1, 1, m.x + t * n, n, n, 0, 1);
				kvk_matmul(best, wt, y1, R, m.w, n, 0, R, act1, 1, NULL);
				assert_memory_equal(y1, yb + t * R, R * 4);
				for (size_t r = 0; r < R; r++) {
					kvk_row_to_f32(wt, m.w, n, r, wr);
					double mag = 0;
					for (size_t i = 0; i < n; i++)
						mag += fabs((double)wr[i] * m.x[t * n + i]);
					double e =
					    fabs((double)yb[t * R + r] - ys[t * R + r]) / mag;
					worst = fmax(worst, e);
				}
			}
			printf("  %s n %4zu %-6s vs scalar: worst |diff| / sum|wx| %.2e\n",
			       TNAME[ti], n, kvk_isa_name(best), worst);
			assert_true(worst <= 1e-5);
			/* batches of 2..12 tokens from the middle give the same bits */
			for (size_t b = 2; b <= 12; b++) {
				kvk_act_prepare(wt, m.act, b, m.x + 4 * n, n, n, 0, b);
				kvk_matmul(best, wt, ys, R, m.w, n, 0, R, m.act, b, NULL);
				assert_memory_equal(ys, yb + 4 * R, b * R * 4);
			}
			free(yb), free(ys), free(y1), free(wr), free(act1);
			mm_free(&m);
		}
}

static void test_isa_vs_scalar(void **st)
{
	(void)st;
	enum kvk_isa best = kvk_isa_best();
	if (best == KVK_ISA_SCALAR)
		print_message("only the scalar ISA on this CPU: comparing it with itself\n");
	/* each ISA below the best too: AVX-512 runs its own Q4_K / Q6_K kernels */
	for (int isa = KVK_ISA_SCALAR; isa <= (int)best; isa++)
		isa_vs_scalar((enum kvk_isa)isa);
}

/* The CUDA path's host references (kvk_ops.h): embed gathers the same values as the
 * dequantization (kvk_kq_value element by element), the f32 GEMV equals the double dot of the
 * dequantized weights with f32 activations within 1e-5 of sum |w x|. */
static void test_ops_refs(void **st)
{
	(void)st;
	enum { R = 5, T = 2, N = 512 };
	static const enum kvk_dtype DT[] = {KVK_DT_Q4_0, KVK_DT_Q4_K, KVK_DT_Q5_K,
					    KVK_DT_Q6_K, KVK_DT_Q5_0, KVK_DT_Q5_1};
	for (int ti = 0; ti < NTYPES; ti++) {
		struct mm m;
		mm_init(&m, TYPES[ti], N, R, T, 300 + ti);
		float emb[3 * N], wr[N], y[T * R];
		int32_t ids[3] = {4, 0, R}; /* R: out of range, gives zeros */
		assert_int_equal(kvk_ref_embed(emb, m.w, DT[ti], R, N, ids, 3), 0);
		for (int k = 0; k < 2; k++) {
			kvk_row_to_f32(TYPES[ti], m.w, N, (size_t)ids[k], wr);
			assert_memory_equal(emb + k * N, wr, sizeof(wr));
		}
		for (int i = 0; i < N; i++)
			assert_true(emb[2 * N + i] == 0);
		assert_int_equal(kvk_ref_kq_gemv(y, m.w, DT[ti], m.x, R, N, T), 0);
		for (int t = 0; t < T; t++)
			for (int r = 0; r < R; r++) {
				kvk_row_to_f32(TYPES[ti], m.w, N, (size_t)r, wr);
				double sdot = 0, mag = 0;
				for (int i = 0; i < N; i++) {
					sdot += (double)wr[i] * m.x[t * N + i];
					mag += fabs((double)wr[i] * m.x[t * N + i]);
				}
				assert_float_equal(y[t * R + r], sdot, 1e-5 * mag);
			}
		mm_free(&m);
	}
	float y1;
	assert_int_equal(kvk_ref_kq_gemv(&y1, NULL, KVK_DT_Q4_K, NULL, 1, 100, 1), -EINVAL);
	assert_int_equal(kvk_ref_kq_gemv(&y1, NULL, KVK_DT_Q8_0, NULL, 1, 256, 1), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_q4_0_block),	   cmocka_unit_test(test_q5_blocks),
	    cmocka_unit_test(test_k45_block),	   cmocka_unit_test(test_q6_k_block),
	    cmocka_unit_test(test_quantize_error), cmocka_unit_test(test_scalar_vs_exact),
	    cmocka_unit_test(test_isa_vs_scalar),  cmocka_unit_test(test_ops_refs),
	};
	return cmocka_run_group_tests_name("kernels_kq", tests, NULL, NULL);
}
