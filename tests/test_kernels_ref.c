/* Tests for the CPU reference kernels of kernels/kvk_ops.h against obviously-correct formulas:
 * double-precision math on contiguous arrays, paged vs contiguous layouts, pack -> unpack
 * round trips, exhaustive half-float conversions. Runs everywhere (no GPU needed). */
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

static uint32_t rng(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(*s >> 33);
}

static float frand(uint64_t *s) /* [-1, 1) */
{
	return (float)rng(s) / 2147483648.0f - 1.0f;
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	assert_non_null(p);
	return p;
}

/* ---- number formats ---------------------------------------------------------------------- */

static void test_f16_exhaustive(void **state)
{
	(void)state;
	for (uint32_t h = 0; h < 65536; h++) {
		float f = kvk_ops_f16_to_f32((uint16_t)h);
		uint16_t back = kvk_ops_f32_to_f16(f);
		if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
			assert_true(isnan(f));
			assert_true((back & 0x7c00) == 0x7c00 && (back & 0x3ff));
			continue;
		}
		assert_int_equal(back, h);
#ifdef __FLT16_MAX__
		_Float16 ref;
		uint16_t hh = (uint16_t)h;
		memcpy(&ref, &hh, 2);
		assert_true(f == (float)ref);
#endif
	}
	/* Rounding: halfway cases go to even; overflow to inf; tiny to zero. */
	assert_int_equal(kvk_ops_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);   /* tie, even down */
	assert_int_equal(kvk_ops_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);   /* tie, even up */
	assert_int_equal(kvk_ops_f32_to_f16(65520.0f), 0x7c00);		    /* rounds to inf */
	assert_int_equal(kvk_ops_f32_to_f16(65519.0f), 0x7bff);		    /* max half */
	assert_int_equal(kvk_ops_f32_to_f16(-1e-10f), 0x8000);		    /* -0 */
	assert_int_equal(kvk_ops_f32_to_f16(ldexpf(1.5f, -24)), 0x0002);    /* subnormal tie */
	assert_int_equal(kvk_ops_f32_to_f16(ldexpf(1.0f, -25) * 1.01f), 1); /* above half ulp */
#ifdef __FLT16_MAX__
	uint64_t s = 42;
	for (int i = 0; i < 200000; i++) {
		uint32_t bits = rng(&s);
		float f;
		memcpy(&f, &bits, 4);
		if (isnan(f))
			continue;
		_Float16 r = (_Float16)f;
		uint16_t rb;
		memcpy(&rb, &r, 2);
		assert_int_equal(kvk_ops_f32_to_f16(f), rb);
	}
#endif
}

static void test_bf16(void **state)
{
	(void)state;
	assert_int_equal(kvk_ops_f32_to_bf16(1.0f), 0x3f80);
	assert_true(kvk_ops_bf16_to_f32(0x3f80) == 1.0f);
	assert_true(kvk_ops_bf16_to_f32(0xc040) == -3.0f);
	/* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1). */
	assert_int_equal(kvk_ops_f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
	assert_int_equal(kvk_ops_f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
	assert_true(isnan(kvk_ops_bf16_to_f32(kvk_ops_f32_to_bf16(NAN))));
	for (uint32_t h = 0; h < 65536; h++) {
		float f = kvk_ops_bf16_to_f32((uint16_t)h);
		if (!isnan(f))
			assert_int_equal(kvk_ops_f32_to_bf16(f), h);
	}
}

/* ---- embedding, RoPE, SwiGLU ----------------------------------------------------------- */

static void test_embed(void **state)
{
	(void)state;
	enum { ROWS = 7, DIM = 64, T = 5 };
	uint64_t s = 1;
	float tf[ROWS * DIM];
	uint16_t th[ROWS * DIM], tb[ROWS * DIM];
	uint8_t tq[ROWS * (DIM / 32) * KVK_Q8_0_BYTES];
	for (int i = 0; i < ROWS * DIM; i++) {
		tf[i] = frand(&s);
		th[i] = kvk_ops_f32_to_f16(tf[i]);
		tb[i] = kvk_ops_f32_to_bf16(tf[i]);
	}
	for (size_t b = 0; b < sizeof(tq) / KVK_Q8_0_BYTES; b++) {
		uint16_t d = kvk_ops_f32_to_f16(0.01f * (float)(b + 1));
		memcpy(tq + b * KVK_Q8_0_BYTES, &d, 2);
		for (int i = 0; i < 32; i++)
			tq[b * KVK_Q8_0_BYTES + 2 + i] = (uint8_t)(int8_t)(rng(&s) % 255 - 127);
	}
	int32_t ids[T] = {3, 0, 6, -1, 7}; /* -1 and 7 are out of range */
	float out[T * DIM];
	const void *tabs[4] = {tf, th, tb, tq};
	enum kvk_dtype dts[4] = {KVK_DT_F32, KVK_DT_F16, KVK_DT_BF16, KVK_DT_Q8_0};
	for (int k = 0; k < 4; k++) {
		memset(out, 0x7f, sizeof(out));
		assert_int_equal(kvk_ref_embed(out, tabs[k], dts[k], ROWS, DIM, ids, T), 0);
		for (int t = 0; t < T; t++)
			for (int i = 0; i < DIM; i++) {
				float want = 0.f;
				if (ids[t] >= 0 && ids[t] < ROWS) {
					size_t e = (size_t)ids[t] * DIM + i;
					if (k == 0)
						want = tf[e];
					else if (k == 1)
						want = kvk_ops_f16_to_f32(th[e]);
					else if (k == 2)
						want = kvk_ops_bf16_to_f32(tb[e]);
					else {
						const uint8_t *blk = tq + (e / 32) * KVK_Q8_0_BYTES;
						uint16_t d;
						memcpy(&d, blk, 2);
						want =
						    kvk_ops_f16_to_f32(d) * (int8_t)blk[2 + e % 32];
					}
				}
				assert_true(out[t * DIM + i] == want);
			}
	}
	assert_int_equal(kvk_ref_embed(out, tq, KVK_DT_Q8_0, ROWS, 33, ids, T), -EINVAL);
}

static void test_rope(void **state)
{
	(void)state;
	enum { T = 4, H = 3, HD = 10, RD = 8 };
	uint64_t s = 5;
	float x[T * H * HD], y[T * H * HD];
	int32_t pos[T] = {0, 1, 17, 4000};
	for (int style = 0; style < 2; style++) {
		for (int i = 0; i < T * H * HD; i++)
			x[i] = y[i] = frand(&s);
		assert_int_equal(kvk_ref_rope(y, T, H, HD, RD, pos, 10000.f, style), 0);
		for (int t = 0; t < T; t++)
			for (int h = 0; h < H; h++) {
				const float *a = x + (t * H + h) * HD;
				const float *b = y + (t * H + h) * HD;
				for (int i = 0; i < RD / 2; i++) {
					int ia = style ? i : 2 * i,
					    ib = style ? i + RD / 2 : 2 * i + 1;
					double th = pos[t] * pow(10000.0, -2.0 * i / RD);
					double ra = a[ia] * cos(th) - a[ib] * sin(th);
					double rb = a[ia] * sin(th) + a[ib] * cos(th);
					/* The angle is a float product: up to pos * 2^-24 rad off.
					 */
					double tol = 1e-5 + pos[t] * 1.2e-7;
					assert_float_equal(b[ia], ra, tol);
					assert_float_equal(b[ib], rb, tol);
				}
				for (int i = RD; i < HD; i++) /* past rope_dim: untouched */
					assert_true(a[i] == b[i]);
			}
	}
	assert_int_equal(kvk_ref_rope(y, T, H, HD, 7, pos, 10000.f, 0), -EINVAL);
	assert_int_equal(kvk_ref_rope(y, T, H, HD, 12, pos, 10000.f, 0), -EINVAL);
	assert_int_equal(kvk_ref_rope(y, T, H, HD, RD, pos, 10000.f, 2), -EINVAL);
}

static void test_swiglu(void **state)
{
	(void)state;
	float g[] = {0.f, 1.f, -1.f, 20.f, -100.f, -1000.f, 3.5f};
	float u[] = {1.f, 2.f, 3.f, 0.5f, 1.f, 1.f, -2.f};
	float o[7];
	assert_int_equal(kvk_ref_swiglu(o, g, u, 7), 0);
	for (int i = 0; i < 7; i++) {
		double want = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
		assert_false(isnan(o[i]));
		assert_float_equal(o[i], want, 1e-6 * (fabs(want) + 1));
	}
	/* In place. */
	assert_int_equal(kvk_ref_swiglu(g, g, u, 7), 0);
	assert_memory_equal(g, o, sizeof(o));
}

/* ---- vision tower ops: LayerNorm, GELU, unmasked dense attention, against double math ---- */

static void test_vit_ops(void **state)
{
	(void)state;
	uint64_t s = 11;
	/* LayerNorm: rows with a large mean (the two-pass variance must keep their spread), with
	 * and without a bias, in place */
	enum { N = 37, R = 4 };
	float x[N * R], w[N], b[N], o[N * R], o2[N * R];
	for (int i = 0; i < N * R; i++)
		x[i] = frand(&s) + (float)(i / N) * 100.f;
	for (int i = 0; i < N; i++)
		w[i] = frand(&s), b[i] = frand(&s);
	for (int nb = 0; nb < 2; nb++) {
		assert_int_equal(kvk_ref_layernorm(o, x, w, nb ? NULL : b, N, R, 1e-5f), 0);
		for (int r = 0; r < R; r++) {
			double m = 0, v = 0;
			for (int i = 0; i < N; i++)
				m += x[r * N + i];
			m /= N;
			for (int i = 0; i < N; i++)
				v += (x[r * N + i] - m) * (x[r * N + i] - m);
			double rs = 1.0 / sqrt(v / N + 1e-5);
			for (int i = 0; i < N; i++) {
				double want = (x[r * N + i] - m) * rs * w[i] + (nb ? 0 : b[i]);
				assert_float_equal(o[r * N + i], want, 2e-4);
			}
		}
	}
	memcpy(o2, x, sizeof(x));
	assert_int_equal(kvk_ref_layernorm(o2, o2, w, NULL, N, R, 1e-5f), 0);
	assert_memory_equal(o2, o, sizeof(o));
	assert_int_equal(kvk_ref_layernorm(o, x, NULL, b, N, R, 1e-5f), -EINVAL);
	assert_int_equal(kvk_ref_layernorm(o, x, w, b, 0, R, 1e-5f), -EINVAL);
	/* GELU, both forms */
	float g[] = {0.f, 1.f, -1.f, 5.f, -5.f, 30.f, -30.f, 0.3f};
	float go[8];
	for (int quick = 0; quick < 2; quick++) {
		assert_int_equal(kvk_ref_gelu(go, g, 8, quick), 0);
		for (int i = 0; i < 8; i++) {
			double v = g[i];
			double want = quick ? v / (1.0 + exp(-1.702 * v))
					    : 0.5 * v *
						  (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) *
							      (v + 0.044715 * v * v * v)));
			assert_float_equal(go[i], want, 1e-6 * (fabs(want) + 1));
		}
	}
	/* attention: every query sees every key of its head (no causal limit) */
	static const int shapes[][3] = {{1, 1, 1}, {7, 3, 8}, {40, 2, 5}};
	for (size_t c = 0; c < 3; c++) {
		int T = shapes[c][0], H = shapes[c][1], D = shapes[c][2];
		size_t n = (size_t)T * H * D;
		float *q = xmalloc(n * 4), *k = xmalloc(n * 4), *v = xmalloc(n * 4);
		float *out = xmalloc(n * 4);
		for (size_t i = 0; i < n; i++)
			q[i] = frand(&s) * 2, k[i] = frand(&s) * 2, v[i] = frand(&s);
		float sc = 1.0f / sqrtf((float)D);
		assert_int_equal(kvk_ref_attn_dense(out, q, k, v, T, H, D, sc), 0);
		double *p = calloc((size_t)T, sizeof(double));
		assert_non_null(p);
		for (int h = 0; h < H; h++)
			for (int t = 0; t < T; t++) {
				double mx = -INFINITY, sum = 0;
				for (int j = 0; j < T; j++) {
					double d = 0;
					for (int e = 0; e < D; e++)
						d += (double)q[((size_t)t * H + h) * D + e] *
						     k[((size_t)j * H + h) * D + e];
					p[j] = d * sc;
					mx = fmax(mx, p[j]);
				}
				for (int j = 0; j < T; j++)
					sum += (p[j] = exp(p[j] - mx));
				for (int e = 0; e < D; e++) {
					double want = 0;
					for (int j = 0; j < T; j++)
						want += p[j] * v[((size_t)j * H + h) * D + e];
					assert_float_equal(out[((size_t)t * H + h) * D + e],
							   want / sum, 1e-5);
				}
			}
		free(p), free(q), free(k), free(v), free(out);
	}
	assert_int_equal(kvk_ref_attn_dense(NULL, NULL, NULL, NULL, 0, 1, 8, 1.f), 0);
	assert_int_equal(kvk_ref_attn_dense(NULL, NULL, NULL, NULL, 1, 1, 257, 1.f), -EINVAL);
	assert_int_equal(kvk_ref_attn_dense(NULL, NULL, NULL, NULL, 1, 0, 8, 1.f), -EINVAL);
}

/* ---- attention ----------------------------------------------------------------------------
 * A sequence's K/V are generated contiguously (pos, kv_head, head_dim), then scattered into a
 * paged pool at shuffled block ids; the reference must equal softmax(QK^T)V on the contiguous
 * arrays in double. */

struct seqkv {
	int len;
	uint16_t *k, *v; /* (len, nkv, hd) */
	int32_t *table;
};

struct pool {
	uint16_t *k, *v;
	struct kvk_kv_pages pages;
};

/* A pool with num_blocks blocks, block_stride = dense + pad halves. */
static void pool_init(struct pool *p, int num_blocks, int B, int nkv, int hd, size_t pad)
{
	size_t stride = (size_t)B * nkv * hd + pad;
	p->k = xmalloc(stride * num_blocks * 2);
	p->v = xmalloc(stride * num_blocks * 2);
	memset(p->k, 0xff, stride * num_blocks * 2); /* NaN garbage where nothing was put */
	memset(p->v, 0xff, stride * num_blocks * 2);
	p->pages = (struct kvk_kv_pages){p->k, p->v, stride, num_blocks, B, nkv, hd};
}

static void pool_free(struct pool *p)
{
	free(p->k);
	free(p->v);
}

/* Generates a sequence and places it in the pool at free blocks picked from *next_free (a
 * permutation of block ids). */
static void seq_make(struct seqkv *q, struct pool *p, int len, const int32_t *perm, int *next,
		     uint64_t *s)
{
	const struct kvk_kv_pages *g = &p->pages;
	int nkv = g->n_kv_heads, hd = g->head_dim, B = g->block_tokens;
	int nb = (len + B - 1) / B;
	q->len = len;
	q->k = xmalloc((size_t)len * nkv * hd * 2 + 2);
	q->v = xmalloc((size_t)len * nkv * hd * 2 + 2);
	q->table = xmalloc((size_t)(nb + 1) * 4);
	for (int b = 0; b < nb; b++)
		q->table[b] = perm[(*next)++];
	for (size_t i = 0; i < (size_t)len * nkv * hd; i++) {
		q->k[i] = kvk_ops_f32_to_f16(frand(s));
		q->v[i] = kvk_ops_f32_to_f16(frand(s));
	}
	for (int t = 0; t < len; t++) {
		size_t off = (size_t)q->table[t / B] * g->block_stride + (size_t)(t % B) * nkv * hd;
		memcpy(p->k + off, q->k + (size_t)t * nkv * hd, (size_t)nkv * hd * 2);
		memcpy(p->v + off, q->v + (size_t)t * nkv * hd, (size_t)nkv * hd * 2);
	}
}

static void seq_free(struct seqkv *q)
{
	free(q->k);
	free(q->v);
	free(q->table);
}

/* Naive: out (hd) for query q (hd) of head h seeing keys 0 .. n_keys-1. */
static void naive_row(double *out, const float *q, const struct seqkv *sq, int nkv, int hd, int kvh,
		      int n_keys, float scale)
{
	double *sc = xmalloc((size_t)n_keys * sizeof(double)), mx = -INFINITY, sum = 0;
	for (int t = 0; t < n_keys; t++) {
		double d = 0;
		for (int i = 0; i < hd; i++)
			d += (double)q[i] *
			     kvk_ops_f16_to_f32(sq->k[((size_t)t * nkv + kvh) * hd + i]);
		sc[t] = d * scale;
		mx = sc[t] > mx ? sc[t] : mx;
	}
	for (int t = 0; t < n_keys; t++)
		sum += (sc[t] = exp(sc[t] - mx));
	for (int i = 0; i < hd; i++) {
		double o = 0;
		for (int t = 0; t < n_keys; t++)
			o += sc[t] * kvk_ops_f16_to_f32(sq->v[((size_t)t * nkv + kvh) * hd + i]);
		out[i] = o / sum;
	}
	free(sc);
}

static int32_t *perm_make(int n, uint64_t *s)
{
	int32_t *p = xmalloc((size_t)n * 4);
	for (int i = 0; i < n; i++)
		p[i] = i;
	for (int i = n - 1; i > 0; i--) {
		int j = (int)(rng(s) % (uint32_t)(i + 1));
		int32_t t = p[i];
		p[i] = p[j];
		p[j] = t;
	}
	return p;
}

/* Shapes: (n_heads, n_kv_heads, head_dim, block_tokens, n_q, q_start, pad). */
static const int attn_shapes[][7] = {
    {1, 1, 2, 1, 1, 0, 0},    {4, 4, 8, 4, 9, 0, 0},	 {8, 2, 16, 5, 37, 0, 3},
    {6, 3, 10, 7, 13, 20, 1}, {4, 1, 64, 16, 33, 64, 0}, {2, 2, 6, 3, 1, 40, 2},
};

static void test_attn_prefill(void **state)
{
	(void)state;
	uint64_t s = 11;
	for (size_t c = 0; c < sizeof(attn_shapes) / sizeof(attn_shapes[0]); c++) {
		int H = attn_shapes[c][0], NKV = attn_shapes[c][1], HD = attn_shapes[c][2];
		int B = attn_shapes[c][3], NQ = attn_shapes[c][4], Q0 = attn_shapes[c][5];
		int len = Q0 + NQ, nb = (len + B - 1) / B + 3;
		struct pool p;
		pool_init(&p, nb, B, NKV, HD, (size_t)attn_shapes[c][6]);
		int32_t *perm = perm_make(nb, &s);
		int next = 0;
		struct seqkv sq;
		seq_make(&sq, &p, len, perm, &next, &s);
		float *q = xmalloc((size_t)NQ * H * HD * 4), *o = xmalloc((size_t)NQ * H * HD * 4);
		for (int i = 0; i < NQ * H * HD; i++)
			q[i] = frand(&s) * 2;
		float scale = 1.0f / sqrtf((float)HD);
		assert_int_equal(kvk_ref_attn_prefill(o, q, &p.pages, sq.table, NQ, Q0, H, scale),
				 0);
		double ref[256];
		for (int i = 0; i < NQ; i++)
			for (int h = 0; h < H; h++) {
				size_t off = ((size_t)i * H + h) * HD;
				naive_row(ref, q + off, &sq, NKV, HD, h / (H / NKV), Q0 + i + 1,
					  scale);
				for (int d = 0; d < HD; d++)
					assert_float_equal(o[off + d], ref[d], 1e-5);
			}
		/* A block id outside the pool is refused. */
		int32_t saved = sq.table[0];
		sq.table[0] = nb;
		assert_int_equal(kvk_ref_attn_prefill(o, q, &p.pages, sq.table, NQ, Q0, H, scale),
				 -EINVAL);
		sq.table[0] = saved;
		free(q), free(o), free(perm);
		seq_free(&sq);
		pool_free(&p);
	}
}

/* Chunked prefill (two calls with q_start) equals one call; decode equals the last row. */
static void test_attn_chunked_and_decode(void **state)
{
	(void)state;
	enum { H = 8, NKV = 2, HD = 12, B = 4, NSEQ = 5 };
	uint64_t s = 12;
	int lens[NSEQ] = {1, 4, 5, 17, 30}, maxb = (30 + B - 1) / B, total = 0;
	for (int i = 0; i < NSEQ; i++)
		total += (lens[i] + B - 1) / B;
	struct pool p;
	pool_init(&p, total + 2, B, NKV, HD, 0);
	int32_t *perm = perm_make(total + 2, &s);
	int next = 0;
	struct seqkv sq[NSEQ];
	int32_t *tables = xmalloc((size_t)NSEQ * maxb * 4);
	for (int i = 0; i < NSEQ; i++) {
		seq_make(&sq[i], &p, lens[i], perm, &next, &s);
		for (int b = 0; b < maxb; b++)
			tables[i * maxb + b] = b * B < lens[i] ? sq[i].table[b] : -7;
	}
	float scale = 0.3f;
	/* Decode: the last token of each sequence, all in one call. */
	float *q = xmalloc((size_t)NSEQ * H * HD * 4), *o = xmalloc((size_t)NSEQ * H * HD * 4);
	for (int i = 0; i < NSEQ * H * HD; i++)
		q[i] = frand(&s);
	assert_int_equal(kvk_ref_attn_decode(o, q, &p.pages, tables, maxb, lens, NSEQ, H, scale),
			 0);
	for (int i = 0; i < NSEQ; i++) {
		float one[H * HD];
		assert_int_equal(kvk_ref_attn_prefill(one, q + (size_t)i * H * HD, &p.pages,
						      sq[i].table, 1, lens[i] - 1, H, scale),
				 0);
		assert_memory_equal(one, o + (size_t)i * H * HD, sizeof(one));
	}
	/* Length 0: zeros. Length past the table: refused. */
	int zl[NSEQ] = {0, 4, 5, 17, 30};
	assert_int_equal(kvk_ref_attn_decode(o, q, &p.pages, tables, maxb, zl, NSEQ, H, scale), 0);
	for (int i = 0; i < H * HD; i++)
		assert_true(o[i] == 0.f);
	zl[0] = maxb * B + 1;
	assert_int_equal(kvk_ref_attn_decode(o, q, &p.pages, tables, maxb, zl, NSEQ, H, scale),
			 -EINVAL);

	/* Chunked prefill of sequence 4: rows 0..9 then 10..29 equal one call of 30. */
	int L = lens[4];
	float *qq = xmalloc((size_t)L * H * HD * 4), *full = xmalloc((size_t)L * H * HD * 4);
	float *part = xmalloc((size_t)L * H * HD * 4);
	for (int i = 0; i < L * H * HD; i++)
		qq[i] = frand(&s);
	assert_int_equal(kvk_ref_attn_prefill(full, qq, &p.pages, sq[4].table, L, 0, H, scale), 0);
	assert_int_equal(kvk_ref_attn_prefill(part, qq, &p.pages, sq[4].table, 10, 0, H, scale), 0);
	assert_int_equal(kvk_ref_attn_prefill(part + 10 * H * HD, qq + 10 * H * HD, &p.pages,
					      sq[4].table, L - 10, 10, H, scale),
			 0);
	assert_memory_equal(full, part, (size_t)L * H * HD * 4);
	/* Bad geometry. */
	struct kvk_kv_pages bad = p.pages;
	bad.head_dim = 7;
	assert_int_equal(kvk_ref_attn_prefill(full, qq, &bad, sq[4].table, L, 0, H, scale),
			 -EINVAL);
	assert_int_equal(kvk_ref_attn_prefill(full, qq, &p.pages, sq[4].table, L, 0, 7, scale),
			 -EINVAL);
	free(qq), free(full), free(part), free(q), free(o), free(tables), free(perm);
	for (int i = 0; i < NSEQ; i++)
		seq_free(&sq[i]);
	pool_free(&p);
}

/* The engine's layout (all layers of a block together) through block_stride. */
static void test_attn_engine_layout(void **state)
{
	(void)state;
	enum { L = 3, H = 4, NKV = 2, HD = 8, B = 4, NB = 5, LEN = 18 };
	size_t slab = (size_t)B * NKV * HD, bstride = (size_t)L * 2 * slab;
	uint16_t *mem = xmalloc(bstride * NB * 2);
	uint64_t s = 13;
	for (size_t i = 0; i < bstride * NB; i++)
		mem[i] = kvk_ops_f32_to_f16(frand(&s));
	int32_t table[NB] = {4, 2, 0, 3, 1};
	float q[H * HD], o1[H * HD], o2[H * HD];
	for (int i = 0; i < H * HD; i++)
		q[i] = frand(&s);
	int layer = 1;
	struct kvk_kv_pages eng = {
	    mem + layer * 2 * slab, mem + layer * 2 * slab + slab, bstride, NB, B, NKV, HD};
	assert_int_equal(kvk_ref_attn_prefill(o1, q, &eng, table, 1, LEN - 1, H, 0.5f), 0);
	/* The same data copied into a dense per-layer pool. */
	uint16_t *kd = xmalloc(slab * NB * 2), *vd = xmalloc(slab * NB * 2);
	for (int b = 0; b < NB; b++) {
		memcpy(kd + b * slab, eng.k + b * bstride, slab * 2);
		memcpy(vd + b * slab, eng.v + b * bstride, slab * 2);
	}
	struct kvk_kv_pages dense = {kd, vd, slab, NB, B, NKV, HD};
	assert_int_equal(kvk_ref_attn_prefill(o2, q, &dense, table, 1, LEN - 1, H, 0.5f), 0);
	assert_memory_equal(o1, o2, sizeof(o1));
	free(mem), free(kd), free(vd);
}

/* ---- flash attention (kvk_flash_attn_f16, the engine's CPU attention) ------------------- */

/* All heads of n_q queries at q_start by kvk_flash_attn_f16: per KV head, the group's heads
 * in parts of G (the engine's decode split), the tokens in calls of `call` (a prefill chunk;
 * 1 = decode). out and q (n_q, H, HD) as kvk_ref_attn_prefill's. */
static void flash_all(enum kvk_isa isa, float *out, const float *q, const struct kvk_kv_pages *kv,
		      const int32_t *table, int n_q, int q_start, int H, int G, int call,
		      float scale)
{
	int hd = kv->head_dim, grp = H / kv->n_kv_heads;
	float *scr = aligned_alloc(64, (kvk_flash_scratch_floats(hd, G) * 4 + 63) & ~(size_t)63);
	assert_non_null(scr);
	size_t ld = (size_t)H * hd;
	for (int h0 = 0; h0 < H; h0 += G)
		for (int t0 = 0; t0 < n_q; t0 += call) {
			int nt = n_q - t0 < call ? n_q - t0 : call;
			size_t off = (size_t)t0 * ld + (size_t)h0 * hd;
			assert_int_equal(kvk_flash_attn_f16(isa, out + off, ld, q + off, ld, nt,
							    q_start + t0, G, h0 / grp, kv, table,
							    scale, scr),
					 0);
		}
	free(scr);
}

/* Shapes: (n_heads, n_kv_heads, head_dim, block_tokens, n_q, q_start). Prompt lengths on and
 * off the 64-key and 16-query tiles, blocks smaller and larger than a key tile, GQA groups of
 * 1..7, head sizes on the x86 path (multiples of 8) and off it (14: the portable loop). */
static const int flash_shapes[][6] = {
    {14, 2, 64, 16, 1, 0},   {14, 2, 64, 256, 63, 0}, {8, 2, 64, 256, 65, 0},
    {4, 2, 64, 128, 700, 0}, {4, 1, 64, 16, 37, 300}, {8, 4, 128, 64, 65, 130},
    {6, 3, 16, 7, 63, 5},    {2, 1, 14, 5, 9, 3},     {4, 4, 8, 4, 17, 0},
};

/* The tiled attention against kvk_ref_attn_prefill on every ISA this CPU has, and batch
 * invariance: each row's bits are the same whether it ran in a tile of 16 tokens x the whole
 * group, alone (decode), in calls of 9 tokens or head by head; AVX2 and AVX-512 agree bit for
 * bit (kvk.h). Tolerance: both compute in f32 from the same f16 K/V; a score differs by at
 * most gamma_hd * scale * sum|q_i k_i| <= 64 * 2^-24 * 2 * 64 / 8 ~ 6e-5 (|q| < 2, |k| < 1:
 * hd = 128 gives the same bound, its scale being smaller), which moves each softmax weight by
 * that relative amount; the exp (1 ulp each) and the sums of up to 1000 terms (gamma_1000 ~
 * 6e-5 worst case, in either order) add as much again, so with |v| < 1 the outputs stay within
 * ~2e-4 of each other; 2e-4 would pass a slightly wrong rescale only if it changed nothing,
 * and a row seeing one key too many or too few is off by ~1e-2 (tested: see the report). */
static void test_flash_attn(void **state)
{
	(void)state;
	uint64_t s = 41;
	enum kvk_isa isas[3] = {KVK_ISA_SCALAR, KVK_ISA_AVX2, KVK_ISA_AVX512};
	for (size_t c = 0; c < sizeof(flash_shapes) / sizeof(flash_shapes[0]); c++) {
		int H = flash_shapes[c][0], NKV = flash_shapes[c][1], HD = flash_shapes[c][2];
		int B = flash_shapes[c][3], NQ = flash_shapes[c][4], Q0 = flash_shapes[c][5];
		int len = Q0 + NQ, nb = (len + B - 1) / B + 2, grp = H / NKV;
		struct pool p;
		pool_init(&p, nb, B, NKV, HD, 5);
		int32_t *perm = perm_make(nb, &s);
		int next = 0;
		struct seqkv sq;
		seq_make(&sq, &p, len, perm, &next, &s);
		size_t n = (size_t)NQ * H * HD;
		float *q = xmalloc(n * 4), *ref = xmalloc(n * 4), *o = xmalloc(n * 4);
		float *o2 = xmalloc(n * 4), *x86 = xmalloc(n * 4);
		for (size_t i = 0; i < n; i++)
			q[i] = frand(&s) * 2;
		float scale = 1.0f / sqrtf((float)HD);
		assert_int_equal(kvk_ref_attn_prefill(ref, q, &p.pages, sq.table, NQ, Q0, H, scale),
				 0);
		int have_x86 = 0;
		for (int ii = 0; ii < 3; ii++) {
			if (isas[ii] != KVK_ISA_SCALAR && isas[ii] > kvk_isa_best())
				continue;
			flash_all(isas[ii], o, q, &p.pages, sq.table, NQ, Q0, H, grp, KVK_FLASH_QT,
				  scale);
			double worst = 0;
			for (size_t i = 0; i < n; i++)
				worst = fmax(worst, fabs((double)o[i] - ref[i]));
			printf("  flash %-6s H %2d/%d hd %3d B %3d n_q %3d q_start %3d: max err "
			       "%.1e\n",
			       kvk_isa_name(isas[ii]), H, NKV, HD, B, NQ, Q0, worst);
			assert_true(worst <= 2e-4);
			/* decode: one token per call, one head per call */
			flash_all(isas[ii], o2, q, &p.pages, sq.table, NQ, Q0, H, 1, 1, scale);
			assert_memory_equal(o, o2, n * 4);
			/* prefill chunks of 9 tokens, the whole group */
			flash_all(isas[ii], o2, q, &p.pages, sq.table, NQ, Q0, H, grp, 9, scale);
			assert_memory_equal(o, o2, n * 4);
			if (isas[ii] == KVK_ISA_SCALAR)
				continue;
			if (have_x86)
				assert_memory_equal(o, x86, n * 4);
			memcpy(x86, o, n * 4);
			have_x86 = 1;
		}
		free(q), free(ref), free(o), free(o2), free(x86), free(perm);
		seq_free(&sq);
		pool_free(&p);
	}
}

/* ---- GEMM, Q8_0 GEMV --------------------------------------------------------------------- */

static void test_gemm(void **state)
{
	(void)state;
	enum { M = 5, N = 7, K = 19 };
	uint64_t s = 21;
	uint16_t a[M * K], b[N * K];
	float c[M * N];
	for (int dt = 0; dt < 2; dt++) {
		enum kvk_dtype t = dt ? KVK_DT_BF16 : KVK_DT_F16;
		float (*to)(uint16_t) = dt ? kvk_ops_bf16_to_f32 : kvk_ops_f16_to_f32;
		uint16_t (*from)(float) = dt ? kvk_ops_f32_to_bf16 : kvk_ops_f32_to_f16;
		for (int i = 0; i < M * K; i++)
			a[i] = from(frand(&s));
		for (int i = 0; i < N * K; i++)
			b[i] = from(frand(&s));
		assert_int_equal(kvk_ref_gemm(c, a, b, t, M, N, K), 0);
		for (int i = 0; i < M; i++)
			for (int j = 0; j < N; j++) {
				double r = 0;
				for (int p = 0; p < K; p++)
					r += (double)to(a[i * K + p]) * to(b[j * K + p]);
				assert_float_equal(c[i * N + j], r, 1e-5);
			}
	}
	assert_int_equal(kvk_ref_gemm(c, a, b, KVK_DT_Q8_0, M, N, K), -EINVAL);
	assert_int_equal(kvk_ref_gemm(c, a, b, KVK_DT_F16, M, N, 0), -EINVAL);
	/* F32 (models stored in f32): the same product in f32 */
	float fa[M * K], fb[N * K];
	for (int i = 0; i < M * K; i++)
		fa[i] = frand(&s);
	for (int i = 0; i < N * K; i++)
		fb[i] = frand(&s);
	assert_int_equal(kvk_ref_gemm(c, fa, fb, KVK_DT_F32, M, N, K), 0);
	for (int i = 0; i < M; i++)
		for (int j = 0; j < N; j++) {
			double r = 0;
			for (int p = 0; p < K; p++)
				r += (double)fa[i * K + p] * fb[j * K + p];
			assert_float_equal(c[i * N + j], r, 1e-5);
		}
}

/* ---- forward-pass glue: add, bias, K/V rows into pages ---------------------------------- */

static void test_add_bias(void **state)
{
	(void)state;
	enum { N = 13, R = 4 };
	uint64_t s = 41;
	float y[N * R], y0[N * R], x[N * R], b[N];
	for (int i = 0; i < N * R; i++)
		y0[i] = y[i] = frand(&s), x[i] = frand(&s);
	for (int i = 0; i < N; i++)
		b[i] = frand(&s);
	assert_int_equal(kvk_ref_add(y, x, N * R), 0);
	for (int i = 0; i < N * R; i++)
		assert_true(y[i] == y0[i] + x[i]);
	memcpy(y, y0, sizeof(y));
	assert_int_equal(kvk_ref_add_bias(y, b, N, R), 0);
	for (int i = 0; i < N * R; i++)
		assert_true(y[i] == y0[i] + b[i % N]);
}

/* Rows land at block slots[t] / B, token slots[t] % B of the right layer, as f16 (the
 * engine's layout: all layers of a block together); nothing else is touched; a slot outside
 * the pool is refused before anything is written. */
static void test_kv_store(void **state)
{
	(void)state;
	enum { L = 3, NB = 5, B = 4, NKV = 2, HD = 6, ROW = NKV * HD, T = 7 };
	size_t slab = (size_t)B * ROW, bstride = (size_t)L * 2 * slab;
	uint16_t *mem = xmalloc(bstride * NB * 2), *before = xmalloc(bstride * NB * 2);
	uint64_t s = 42;
	for (size_t i = 0; i < bstride * NB; i++)
		mem[i] = (uint16_t)rng(&s);
	memcpy(before, mem, bstride * NB * 2);
	uint16_t *kp[L], *vp[L];
	for (int l = 0; l < L; l++) {
		kp[l] = mem + (size_t)l * 2 * slab;
		vp[l] = kp[l] + slab;
	}
	struct kvk_kv_layers kv = {L, NB, B, NKV, HD, bstride, kp, vp};
	float k[T * ROW], v[T * ROW];
	for (int i = 0; i < T * ROW; i++)
		k[i] = frand(&s) * 100, v[i] = frand(&s);
	int32_t slots[T] = {0, 5, 19, 8, 9, 3, 12};
	assert_int_equal(kvk_ref_kv_store(&kv, 1, k, v, slots, T), 0);
	for (int t = 0; t < T; t++) {
		int b = slots[t] / B, tok = slots[t] % B;
		for (int i = 0; i < ROW; i++) {
			size_t off = (size_t)b * bstride + (size_t)1 * 2 * slab +
				     (size_t)tok * ROW + (size_t)i;
			assert_int_equal(mem[off], kvk_ops_f32_to_f16(k[t * ROW + i]));
			assert_int_equal(mem[off + slab], kvk_ops_f32_to_f16(v[t * ROW + i]));
			mem[off] = before[off];
			mem[off + slab] = before[off + slab];
		}
	}
	assert_memory_equal(mem, before, bstride * NB * 2); /* nothing else changed */
	int32_t bad[2] = {3, NB * B};
	assert_int_equal(kvk_ref_kv_store(&kv, 0, k, v, bad, 2), -EINVAL);
	assert_memory_equal(mem, before, bstride * NB * 2);
	assert_int_equal(kvk_ref_kv_store(&kv, L, k, v, slots, 1), -EINVAL);
	free(mem), free(before);
}

static void test_q8_0_gemv(void **state)
{
	(void)state;
	enum { R = 9, N = 96, T = 3, NB = N / 32 };
	uint64_t s = 22;
	uint8_t *w = xmalloc((size_t)R * NB * KVK_Q8_0_BYTES);
	for (int b = 0; b < R * NB; b++) {
		uint16_t d = kvk_ops_f32_to_f16(0.001f + 0.02f * (float)(rng(&s) % 100) / 100);
		memcpy(w + (size_t)b * KVK_Q8_0_BYTES, &d, 2);
		for (int i = 0; i < 32; i++)
			w[(size_t)b * KVK_Q8_0_BYTES + 2 + i] = (uint8_t)(rng(&s) & 0xff);
	}
	float x[T * N], y[T * R];
	for (int i = 0; i < T * N; i++)
		x[i] = frand(&s);
	assert_int_equal(kvk_ref_q8_0_gemv(y, w, x, R, N, T), 0);
	for (int t = 0; t < T; t++)
		for (int r = 0; r < R; r++) {
			double ref = 0;
			for (int i = 0; i < N; i++) {
				const uint8_t *blk = w + ((size_t)r * NB + i / 32) * KVK_Q8_0_BYTES;
				uint16_t d;
				memcpy(&d, blk, 2);
				ref += (double)kvk_ops_f16_to_f32(d) * (int8_t)blk[2 + i % 32] *
				       x[t * N + i];
			}
			assert_float_equal(y[t * R + r], ref, 1e-4);
		}
	assert_int_equal(kvk_ref_q8_0_gemv(y, w, x, R, 48, T), -EINVAL);
	free(w);
}

/* ---- sampling ------------------------------------------------------------------------------ */

static void test_argmax(void **state)
{
	(void)state;
	float l[3 * 6] = {
	    1,	       5,	  2,	     5,		0,	   -1, /* tie: lowest index 1 */
	    NAN,       -INFINITY, 0,	     0,		0,	   0,  /* NaN is -inf: index 2 */
	    -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
	int32_t out[3];
	assert_int_equal(kvk_ref_argmax(out, l, 3, 6), 0);
	assert_int_equal(out[0], 1);
	assert_int_equal(out[1], 2);
	assert_int_equal(out[2], 0);
	assert_int_equal(kvk_ref_argmax(out, l, 3, 0), -EINVAL);
}

static void test_topk(void **state)
{
	(void)state;
	enum { V = 50 };
	float l[V];
	uint64_t s = 31;
	for (int i = 0; i < V; i++)
		l[i] = frand(&s) * 4;
	l[7] = 10.f, l[8] = 9.f, l[20] = 9.f, l[3] = 8.f; /* top 4: 7, 8, 20 (tie), 3 */
	int32_t out;
	float u = 0.5f;
	assert_int_equal(kvk_ref_sample_topk(&out, l, 1, V, 1, 1.0f, &u), 0);
	assert_int_equal(out, 7);
	assert_int_equal(kvk_ref_sample_topk(&out, l, 1, V, 4, 0.0f, &u), 0);
	assert_int_equal(out, 7);
	/* u sweeps the distribution of the top 4: exact boundaries from the formula. */
	double p[4] = {1, exp(-1.0), exp(-1.0), exp(-2.0)}, S = p[0] + p[1] + p[2] + p[3];
	int order[4] = {7, 8, 20, 3}, counts[4] = {0};
	for (int i = 0; i < 10000; i++) {
		u = ((float)i + 0.5f) / 10000;
		assert_int_equal(kvk_ref_sample_topk(&out, l, 1, V, 4, 1.0f, &u), 0);
		int j = 0;
		while (j < 4 && order[j] != out)
			j++;
		assert_true(j < 4);
		counts[j]++;
	}
	for (int j = 0; j < 4; j++)
		assert_float_equal(counts[j] / 10000.0, p[j] / S, 2e-4);
	/* Higher temperature flattens: the top pick gets a smaller share at u in the middle. */
	u = 0.45f;
	assert_int_equal(kvk_ref_sample_topk(&out, l, 1, V, 4, 1.0f, &u), 0);
	assert_int_equal(out, 7); /* 0.45 < p0/S = 0.54 */
	assert_int_equal(kvk_ref_sample_topk(&out, l, 1, V, 4, 100.0f, &u), 0);
	assert_int_equal(out, 8); /* nearly uniform: second quarter */
	/* Several rows at once; a fully masked row samples uniformly over the first k indices. */
	float rows[2 * V];
	memcpy(rows, l, sizeof(l));
	for (int i = 0; i < V; i++)
		rows[V + i] = -INFINITY;
	float us[2] = {0.999f, 0.6f};
	int32_t o2[2];
	assert_int_equal(kvk_ref_sample_topk(o2, rows, 2, V, 4, 1.0f, us), 0);
	assert_int_equal(o2[0], 3);
	assert_int_equal(o2[1], 2);
	assert_int_equal(kvk_ref_sample_topk(&out, l, 1, V, KVK_TOPK_MAX + 1, 1.f, &u), -EINVAL);
	assert_int_equal(kvk_ref_sample_topk(&out, l, 1, 3, 4, 1.f, &u), -EINVAL);
}

/* ---- pack / unpack ------------------------------------------------------------------------- */

static void test_pack_unpack(void **state)
{
	(void)state;
	enum { L = 3, B = 5, NKV = 2, HD = 6, NB = 9, PAD = 4 };
	size_t slab = (size_t)B * NKV * HD, stride = slab + PAD;
	uint64_t s = 41;
	uint16_t *pools[2][2 * L]; /* [src/dst][2l + kv] */
	for (int w = 0; w < 2; w++)
		for (int i = 0; i < 2 * L; i++) {
			pools[w][i] = xmalloc(stride * NB * 2);
			for (size_t e = 0; e < stride * NB; e++)
				pools[w][i][e] = w ? 0 : (uint16_t)rng(&s);
		}
	uint16_t *ks[2][L], *vs[2][L];
	for (int w = 0; w < 2; w++)
		for (int l = 0; l < L; l++) {
			ks[w][l] = pools[w][2 * l];
			vs[w][l] = pools[w][2 * l + 1];
		}
	struct kvk_kv_layers src = {L, NB, B, NKV, HD, stride, ks[0], vs[0]};
	struct kvk_kv_layers dst = {L, NB, B, NKV, HD, stride, ks[1], vs[1]};
	size_t pb = kvk_kv_payload_bytes(&src);
	assert_int_equal(pb, (size_t)L * 2 * slab * 2);
	int32_t from[4] = {6, 0, 3, 8}, to[4] = {1, 2, 7, 5};
	uint16_t *buf = xmalloc(4 * pb);
	assert_int_equal(kvk_ref_kv_pack(buf, &src, from, 4), 0);
	/* Payload layout: [block][layer][K,V][token][kv_head][head_dim]. */
	for (int i = 0; i < 4; i++)
		for (int l = 0; l < L; l++)
			for (int kv = 0; kv < 2; kv++)
				for (int t = 0; t < B; t++)
					for (int h = 0; h < NKV; h++)
						for (int d = 0; d < HD; d++) {
							size_t pe =
							    ((((size_t)i * L + l) * 2 + kv) * B +
							     t) *
								NKV * HD +
							    (size_t)h * HD + d;
							const uint16_t *pool =
							    kv ? vs[0][l] : ks[0][l];
							size_t se = from[i] * stride +
								    ((size_t)t * NKV + h) * HD + d;
							assert_int_equal(buf[pe], pool[se]);
						}
	assert_int_equal(kvk_ref_kv_unpack(&dst, buf, to, 4), 0);
	for (int i = 0; i < 4; i++)
		for (int p = 0; p < 2 * L; p++) {
			assert_memory_equal(pools[1][p] + to[i] * stride,
					    pools[0][p] + from[i] * stride, slab * 2);
			/* The pad past the slab is not written. */
			for (int e = 0; e < PAD; e++)
				assert_int_equal(pools[1][p][to[i] * stride + slab + e], 0);
		}
	/* Blocks not named stay untouched. */
	for (int p = 0; p < 2 * L; p++)
		for (size_t e = 0; e < stride; e++)
			assert_int_equal(pools[1][p][0 * stride + e], 0);
	/* Round trip: pack what was unpacked gives the same bytes. */
	uint16_t *buf2 = xmalloc(4 * pb);
	assert_int_equal(kvk_ref_kv_pack(buf2, &dst, to, 4), 0);
	assert_memory_equal(buf, buf2, 4 * pb);
	int32_t bad[1] = {NB};
	assert_int_equal(kvk_ref_kv_pack(buf, &src, bad, 1), -EINVAL);
	struct kvk_kv_layers g = src;
	g.block_stride = slab - 1;
	assert_int_equal(kvk_ref_kv_unpack(&g, buf, from, 1), -EINVAL);
	g = src;
	g.n_layer = 0;
	assert_int_equal(kvk_kv_payload_bytes(&g), 0);
	free(buf), free(buf2);
	for (int w = 0; w < 2; w++)
		for (int i = 0; i < 2 * L; i++)
			free(pools[w][i]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_f16_exhaustive),
	    cmocka_unit_test(test_bf16),
	    cmocka_unit_test(test_embed),
	    cmocka_unit_test(test_rope),
	    cmocka_unit_test(test_swiglu),
	    cmocka_unit_test(test_vit_ops),
	    cmocka_unit_test(test_attn_prefill),
	    cmocka_unit_test(test_attn_chunked_and_decode),
	    cmocka_unit_test(test_attn_engine_layout),
	    cmocka_unit_test(test_flash_attn),
	    cmocka_unit_test(test_gemm),
	    cmocka_unit_test(test_add_bias),
	    cmocka_unit_test(test_kv_store),
	    cmocka_unit_test(test_q8_0_gemv),
	    cmocka_unit_test(test_argmax),
	    cmocka_unit_test(test_topk),
	    cmocka_unit_test(test_pack_unpack),
	};
	return cmocka_run_group_tests_name("kernels_ref", tests, NULL, NULL);
}
