/* GPU tests for kernels/kvk_cuda.h: every CUDA kernel against its CPU reference (kvk_ops.h)
 * at several shapes, odd ones included, within the tolerances stated at each comparison.
 *
 *   test_kernels_cuda          all kernels; exits 77 ("skipped: no GPU") without a GPU
 *   test_kernels_cuda --nccl   NCCL KV transfer between GPUs 0 and 1; 77 with fewer than 2 GPUs
 *
 * Exit 77 is CTest's "skipped": a machine without a GPU never counts these as passed. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "kvk.h"
#include "kvk_cuda.h"
#include "kvk_nccl.h"
#include "kvk_ops.h"

static uint32_t rng(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(*s >> 33);
}

static float frand(uint64_t *s)
{
	return (float)rng(s) / 2147483648.0f - 1.0f;
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	assert_non_null(p);
	return p;
}

static void *up(struct kvk_cuda_ctx *c, const void *h, size_t bytes)
{
	void *d;
	assert_int_equal(kvk_cuda_malloc(c, &d, bytes), 0);
	if (h && bytes)
		assert_int_equal(kvk_cuda_h2d(c, d, h, bytes), 0);
	return d;
}

static void down(struct kvk_cuda_ctx *c, void *h, const void *d, size_t bytes)
{
	assert_int_equal(kvk_cuda_sync(c), 0);
	assert_int_equal(kvk_cuda_d2h(c, h, d, bytes), 0);
}

/* |got - ref| <= atol + rtol * |ref| everywhere, reporting the worst element. */
static void close_enough(const char *what, const float *got, const float *ref, size_t n,
			 double atol, double rtol)
{
	double worst = 0;
	size_t wi = 0;
	int bad = 0;
	for (size_t i = 0; i < n; i++) {
		double err = fabs((double)got[i] - ref[i]), lim = atol + rtol * fabs(ref[i]);
		if (!(err <= lim) && !(isnan(got[i]) && isnan(ref[i]))) {
			if (!bad || err > worst) {
				worst = err;
				wi = i;
			}
			bad = 1;
		}
	}
	if (bad)
		fail_msg("%s: element %zu got %.9g want %.9g (|err| %.3g)", what, wi, got[wi],
			 ref[wi], worst);
}

/* Shapes to run from a list of n: all, or the first 3 with KVK_TEST_QUICK set (for the
 * compute-sanitizer runs of gpu-check.sh; each list starts with small but varied shapes). */
static size_t ncases(size_t n)
{
	const char *q = getenv("KVK_TEST_QUICK");
	return q && *q && n > 3 ? 3 : n;
}

/* Byte equality, reporting the first difference. */
static void same_bytes(const char *what, const void *got, const void *want, size_t n)
{
	const uint8_t *g = got, *w = want;
	for (size_t i = 0; i < n; i++)
		if (g[i] != w[i])
			fail_msg("%s: byte %zu of %zu got 0x%02x want 0x%02x", what, i, n, g[i],
				 w[i]);
}

static int setup(void **state)
{
	struct kvk_cuda_ctx *c;
	if (kvk_cuda_ctx_create(0, &c))
		return -1;
	*state = c;
	return 0;
}

static int teardown(void **state)
{
	kvk_cuda_ctx_destroy(*state);
	return 0;
}

/* ---- memory helpers ------------------------------------------------------------------------
 * What the device engine builds on (uploads, memset of its tables, the copy on write of a
 * block): first in the run, so a broken basic path shows here rather than as a kernel error. */

static void test_memory(void **state)
{
	struct kvk_cuda_ctx *c = *state;
	char info[256];
	assert_int_equal(kvk_cuda_device_info(c, info, sizeof(info)), 0);
	printf("  device: %s\n", info);
	enum { N = 1 << 20 };
	uint8_t *h = xmalloc(N), *got = xmalloc(N), *pin;
	uint64_t s = 12;
	for (size_t i = 0; i < N; i++)
		h[i] = (uint8_t)rng(&s);
	uint8_t *a = up(c, h, N), *b = up(c, NULL, N);
	/* memset, then an unaligned device-to-device copy over part of it */
	assert_int_equal(kvk_cuda_memset(c, b, 0x5a, N), 0);
	assert_int_equal(kvk_cuda_d2d(c, b + 3, a + 1, N - 100), 0);
	down(c, got, b, N);
	for (size_t i = 0; i < N; i++) {
		uint8_t want = i >= 3 && i < 3 + (size_t)N - 100 ? h[i - 2] : 0x5a;
		if (got[i] != want)
			fail_msg("memset + d2d: byte %zu got 0x%02x want 0x%02x", i, got[i], want);
	}
	/* pinned host memory both ways */
	assert_int_equal(kvk_cuda_host_alloc(c, (void **)&pin, N), 0);
	assert_int_equal(kvk_cuda_d2h(c, pin, a, N), 0);
	same_bytes("d2h into pinned memory", pin, h, N);
	assert_int_equal(kvk_cuda_h2d(c, b, pin, N), 0);
	down(c, got, b, N);
	same_bytes("h2d from pinned memory", got, h, N);
	kvk_cuda_host_free(c, pin);
	kvk_cuda_free(c, a), kvk_cuda_free(c, b);
	free(h), free(got);
	/* no context: -EINVAL, nothing enqueued */
	assert_int_equal(kvk_cuda_sync(NULL), -EINVAL);
	assert_int_equal(kvk_cu_add(NULL, NULL, NULL, 1), -EINVAL);
}

/* ---- elementwise ------------------------------------------------------------------------- */

static void test_embed(void **state)
{
	struct kvk_cuda_ctx *c = *state;
	static const size_t dims[] = {32, 96, 2048};
	enum kvk_dtype dts[] = {KVK_DT_F32, KVK_DT_F16, KVK_DT_BF16, KVK_DT_Q8_0};
	uint64_t s = 1;
	for (size_t di = 0; di < ncases(3); di++)
		for (int k = 0; k < 4; k++) {
			size_t rows = 301, dim = dims[di], T = 37;
			size_t rb = k == 0 ? dim * 4 : k < 3 ? dim * 2 : dim / 32 * 34;
			uint8_t *tab = xmalloc(rows * rb);
			/* Finite values only: a NaN's payload may differ between conversions. */
			for (size_t i = 0; i < rows * dim; i++) {
				float f = frand(&s);
				if (k == 0)
					((float *)tab)[i] = f;
				else if (k == 1)
					((uint16_t *)tab)[i] = kvk_ops_f32_to_f16(f);
				else if (k == 2)
					((uint16_t *)tab)[i] = kvk_ops_f32_to_bf16(f);
			}
			if (k == 3)
				for (size_t b = 0; b < rows * dim / 32; b++) {
					uint16_t d = kvk_ops_f32_to_f16(frand(&s) / 64);
					memcpy(tab + b * 34, &d, 2);
					for (int j = 0; j < 32; j++)
						tab[b * 34 + 2 + j] = (uint8_t)rng(&s);
				}
			int32_t ids[37];
			for (size_t t = 0; t < T; t++)
				ids[t] =
				    (int32_t)(rng(&s) % (rows + 4)) - 2; /* some out of range */
			float *ref = xmalloc(T * dim * 4), *got = xmalloc(T * dim * 4);
			assert_int_equal(kvk_ref_embed(ref, tab, dts[k], rows, dim, ids, T), 0);
			void *dt = up(c, tab, rows * rb), *di_ = up(c, ids, sizeof(ids));
			float *dout = up(c, NULL, T * dim * 4);
			assert_int_equal(kvk_cu_embed(c, dout, dt, dts[k], rows, dim, di_, T), 0);
			down(c, got, dout, T * dim * 4);
			/* Tolerance: exact (the same conversions and one product). */
			char lbl[96];
			snprintf(lbl, sizeof(lbl), "embed type %d dim %zu", (int)dts[k], dim);
			same_bytes(lbl, got, ref, T * dim * 4);
			kvk_cuda_free(c, dt), kvk_cuda_free(c, di_), kvk_cuda_free(c, dout);
			free(tab), free(ref), free(got);
		}
}

static void test_rmsnorm(void **state)
{
	struct kvk_cuda_ctx *c = *state;
	static const size_t shapes[][2] = {{1, 1}, {67, 3}, {2048, 9}, {5000, 2}};
	uint64_t s = 2;
	for (size_t i = 0; i < ncases(4); i++) {
		size_t n = shapes[i][0], r = shapes[i][1];
		float *x = xmalloc(n * r * 4), *w = xmalloc(n * 4), *ref = xmalloc(n * r * 4);
		float *got = xmalloc(n * r * 4);
		for (size_t j = 0; j < n * r; j++)
			x[j] = frand(&s) * 4;
		for (size_t j = 0; j < n; j++)
			w[j] = frand(&s);
		kvk_rmsnorm_f32(ref, x, w, n, r, 1e-5f);
		float *dx = up(c, x, n * r * 4), *dw = up(c, w, n * 4),
		      *dy = up(c, NULL, n * r * 4);
		assert_int_equal(kvk_cu_rmsnorm(c, dy, dx, dw, n, r, 1e-5f), 0);
		down(c, got, dy, n * r * 4);
		/* f32 sum of squares in another order: relative 1e-5. */
		char lbl[96];
		snprintf(lbl, sizeof(lbl), "rmsnorm n %zu rows %zu", n, r);
		close_enough(lbl, got, ref, n * r, 1e-6, 1e-5);
		kvk_cuda_free(c, dx), kvk_cuda_free(c, dw), kvk_cuda_free(c, dy);
		free(x), free(w), free(ref), free(got);
	}
}

static void test_rope(void **state)
{
	struct kvk_cuda_ctx *c = *state;
	/* (n_tok, n_heads, head_dim, rope_dim) */
	static const size_t shapes[][4] = {
	    {1, 1, 2, 2}, {7, 3, 10, 8}, {130, 32, 64, 64}, {33, 8, 128, 96}};
	uint64_t s = 3;
	for (size_t i = 0; i < ncases(4); i++)
		for (int style = 0; style < 2; style++) {
			size_t T = shapes[i][0], H = shapes[i][1], HD = shapes[i][2];
			size_t RD = shapes[i][3], n = T * H * HD;
			float *x = xmalloc(n * 4), *got = xmalloc(n * 4);
			int32_t *pos = xmalloc(T * 4);
			for (size_t j = 0; j < n; j++)
				x[j] = frand(&s);
			for (size_t t = 0; t < T; t++)
				pos[t] = (int32_t)(rng(&s) % 32768);
			float *dx = up(c, x, n * 4);
			int32_t *dp = up(c, pos, T * 4);
			assert_int_equal(kvk_cu_rope(c, dx, T, H, HD, RD, dp, 500000.f, style), 0);
			assert_int_equal(kvk_ref_rope(x, T, H, HD, RD, pos, 500000.f, style), 0);
			down(c, got, dx, n * 4);
			/* Same float angle; sinf/cosf differ by a few ulp: absolute 1e-5. */
			char lbl[96];
			snprintf(lbl, sizeof(lbl), "rope T %zu H %zu HD %zu RD %zu style %d", T, H,
				 HD, RD, style);
			close_enough(lbl, got, x, n, 1e-5, 0);
			kvk_cuda_free(c, dx), kvk_cuda_free(c, dp);
			free(x), free(got), free(pos);
		}
}

static void test_swiglu_convert(void **state)
{
	struct kvk_cuda_ctx *c = *state;
	static const size_t ns[] = {1, 1000, 1000003};
	uint64_t s = 4;
	for (size_t i = 0; i < ncases(3); i++) {
		size_t n = ns[i];
		float *g = xmalloc(n * 4), *u = xmalloc(n * 4), *ref = xmalloc(n * 4);
		float *got = xmalloc(n * 4);
		for (size_t j = 0; j < n; j++) {
			g[j] = frand(&s) * 30;
			u[j] = frand(&s);
		}
		kvk_ref_swiglu(ref, g, u, n);
		float *dg = up(c, g, n * 4), *du = up(c, u, n * 4), *dy = up(c, NULL, n * 4);
		assert_int_equal(kvk_cu_swiglu(c, dy, dg, du, n), 0);
		down(c, got, dy, n * 4);
		/* expf differs by an ulp or two: relative 1e-5. */
		char lbl[96];
		snprintf(lbl, sizeof(lbl), "swiglu n %zu", n);
		close_enough(lbl, got, ref, n, 1e-7, 1e-5);
		/* Conversion to f16 / bf16: bit-exact (round to nearest even on both). */
		uint16_t *hr = xmalloc(n * 2), *hg = xmalloc(n * 2);
		void *dh = up(c, NULL, n * 2);
		for (int bf = 0; bf < 2; bf++) {
			for (size_t j = 0; j < n; j++)
				hr[j] = bf ? kvk_ops_f32_to_bf16(g[j]) : kvk_ops_f32_to_f16(g[j]);
			assert_int_equal(
			    kvk_cu_convert(c, dh, bf ? KVK_DT_BF16 : KVK_DT_F16, dg, n), 0);
			down(c, hg, dh, n * 2);
			snprintf(lbl, sizeof(lbl), "convert %s n %zu", bf ? "bf16" : "f16", n);
			same_bytes(lbl, hg, hr, n * 2);
		}
		kvk_cuda_free(c, dg), kvk_cuda_free(c, du), kvk_cuda_free(c, dy);
		kvk_cuda_free(c, dh);
		free(g), free(u), free(ref), free(got), free(hr), free(hg);
	}
}

/* ---- the vision tower's ops (LayerNorm with bias, GELU, unmasked dense attention) ---------- */

static void test_vit_ops(void **state)
{
	struct kvk_cuda_ctx *c = *state;
	static const size_t ln_shapes[][2] = {{1, 1}, {37, 3}, {768, 5}, {5000, 2}};
	uint64_t s = 12;
	for (size_t i = 0; i < ncases(4); i++) {
		size_t n = ln_shapes[i][0], r = ln_shapes[i][1], nr = n * r;
		float *x = xmalloc(nr * 4), *w = xmalloc(n * 4), *b = xmalloc(n * 4);
		float *ref = xmalloc(nr * 4), *got = xmalloc(nr * 4);
		for (size_t j = 0; j < nr; j++)
			x[j] = frand(&s) * 4 + (float)(j / n) * 50.f; /* rows with a mean */
		for (size_t j = 0; j < n; j++)
			w[j] = frand(&s), b[j] = frand(&s);
		float *dx = up(c, x, nr * 4), *dw = up(c, w, n * 4), *db = up(c, b, n * 4);
		float *dy = up(c, NULL, nr * 4);
		for (int nb = 0; nb < 2; nb++) {
			assert_int_equal(kvk_ref_layernorm(ref, x, w, nb ? NULL : b, n, r, 1e-5f),
					 0);
			assert_int_equal(
			    kvk_cu_layernorm(c, dy, dx, dw, nb ? NULL : db, n, r, 1e-5f), 0);
			down(c, got, dy, nr * 4);
			/* sums in another order; the mean's rounding scales with it: 1e-4 */
			char lbl[96];
			snprintf(lbl, sizeof(lbl), "layernorm n %zu rows %zu bias %d", n, r, !nb);
			close_enough(lbl, got, ref, nr, 1e-4, 1e-4);
		}
		/* in place (the tower normalises its residual stream in place for pre-LN) */
		assert_int_equal(kvk_cu_layernorm(c, dx, dx, dw, db, n, r, 1e-5f), 0);
		assert_int_equal(kvk_ref_layernorm(ref, x, w, b, n, r, 1e-5f), 0);
		down(c, got, dx, nr * 4);
		close_enough("layernorm in place", got, ref, nr, 1e-4, 1e-4);
		/* GELU, both forms, out of place and in place */
		for (int quick = 0; quick < 2; quick++) {
			for (size_t j = 0; j < nr; j++)
				x[j] = frand(&s) * 8;
			assert_int_equal(kvk_cuda_h2d(c, dx, x, nr * 4), 0);
			kvk_ref_gelu(ref, x, nr, quick);
			assert_int_equal(kvk_cu_gelu(c, dy, dx, nr, quick), 0);
			down(c, got, dy, nr * 4);
			close_enough(quick ? "gelu quick" : "gelu tanh", got, ref, nr, 1e-6, 1e-5);
			assert_int_equal(kvk_cu_gelu(c, dx, dx, nr, quick), 0);
			down(c, got, dx, nr * 4);
			close_enough("gelu in place", got, ref, nr, 1e-6, 1e-5);
		}
		kvk_cuda_free(c, dx), kvk_cuda_free(c, dw), kvk_cuda_free(c, db);
		kvk_cuda_free(c, dy);
		free(x), free(w), free(b), free(ref), free(got);
	}
	/* attention: tokens, heads, head_dim; a partial last tile, one token, odd head_dim, the
	 * largest head_dim (dynamic shared memory over 48 KiB), a ViT-B/16 head (197 tokens) */
	static const int at_shapes[][3] = {{1, 1, 1},	 {7, 3, 8},    {40, 2, 5},
					   {33, 1, 256}, {197, 2, 64}, {70, 4, 96}};
	for (size_t i = 0; i < ncases(6); i++) {
		int T = at_shapes[i][0], H = at_shapes[i][1], D = at_shapes[i][2];
		size_t n = (size_t)T * H * D;
		float *q = xmalloc(n * 4), *k = xmalloc(n * 4), *v = xmalloc(n * 4);
		float *ref = xmalloc(n * 4), *got = xmalloc(n * 4);
		for (size_t j = 0; j < n; j++)
			q[j] = frand(&s) * 3, k[j] = frand(&s) * 3, v[j] = frand(&s);
		float sc = 1.0f / sqrtf((float)D);
		assert_int_equal(kvk_ref_attn_dense(ref, q, k, v, T, H, D, sc), 0);
		float *dq = up(c, q, n * 4), *dk = up(c, k, n * 4), *dv = up(c, v, n * 4);
		float *dy = up(c, NULL, n * 4);
		assert_int_equal(kvk_cu_attn_dense(c, dy, dq, dk, dv, T, H, D, sc), 0);
		down(c, got, dy, n * 4);
		char lbl[96];
		snprintf(lbl, sizeof(lbl), "attn_dense T %d H %d D %d", T, H, D);
		/* online softmax and fma: another rounding order than the reference's */
		close_enough(lbl, got, ref, n, 2e-6, 1e-4);
		kvk_cuda_free(c, dq), kvk_cuda_free(c, dk), kvk_cuda_free(c, dv);
		kvk_cuda_free(c, dy);
		free(q), free(k), free(v), free(ref), free(got);
	}
	assert_int_equal(kvk_cu_attn_dense(c, NULL, NULL, NULL, NULL, 1, 1, 257, 1.f), -EINVAL);
	assert_int_equal(kvk_cu_layernorm(c, NULL, NULL, NULL, NULL, 0, 1, 1e-5f), -EINVAL);
}

/* ---- attention ------------------------------------------------------------------------------
 * A random pool (every block filled) and random block tables; the CPU reference reads the
 * host copy, the kernel the device copy. */

struct dpool {
	uint16_t *hk, *hv; /* host */
	void *dk, *dv;	   /* device */
	struct kvk_kv_pages host, dev;
};

static void dpool_make(struct kvk_cuda_ctx *c, struct dpool *p, int nb, int B, int nkv, int hd,
		       size_t pad, uint64_t *s)
{
	size_t stride = (size_t)B * nkv * hd + pad, n = stride * nb;
	p->hk = xmalloc(n * 2);
	p->hv = xmalloc(n * 2);
	for (size_t i = 0; i < n; i++) {
		p->hk[i] = kvk_ops_f32_to_f16(frand(s));
		p->hv[i] = kvk_ops_f32_to_f16(frand(s));
	}
	p->dk = up(c, p->hk, n * 2);
	p->dv = up(c, p->hv, n * 2);
	p->host = (struct kvk_kv_pages){p->hk, p->hv, stride, nb, B, nkv, hd};
	p->dev = (struct kvk_kv_pages){p->dk, p->dv, stride, nb, B, nkv, hd};
}

static void dpool_free(struct kvk_cuda_ctx *c, struct dpool *p)
{
	kvk_cuda_free(c, p->dk), kvk_cuda_free(c, p->dv);
	free(p->hk), free(p->hv);
}

/* (n_heads, n_kv_heads, head_dim, block_tokens, n_q, q_start, pad) */
static const int prefill_shapes[][7] = {
    {1, 1, 2, 1, 1, 0, 0},	{8, 2, 16, 5, 37, 0, 2},     {4, 2, 256, 16, 40, 10, 0},
    {32, 8, 64, 64, 300, 0, 0}, {32, 8, 64, 64, 77, 200, 0}, {8, 8, 128, 16, 65, 3, 0},
    {4, 4, 8, 4, 9, 0, 0},	{10, 2, 80, 7, 33, 5, 4},    {64, 4, 128, 32, 17, 1000, 0},
};

/* One prefill case of a shape (n_heads, n_kv_heads, head_dim, block_tokens, n_q, q_start, pad):
 * a pool of the blocks the keys need plus spare, a random block table (repeats are fine),
 * queries, the reference output, their device copies, a device output and a host one (got). */
struct pcase {
	int H, NQ, Q0;
	size_t n; /* floats of q and of the output */
	float scale;
	struct dpool p;
	int32_t *table, *dt;
	float *q, *ref, *got, *dq, *dout;
	char lbl[128];
};

static void pcase_make(struct kvk_cuda_ctx *c, struct pcase *k, const char *name, const int *sh,
		       int spare, uint64_t *s)
{
	int NKV = sh[1], HD = sh[2], B = sh[3];
	k->H = sh[0], k->NQ = sh[4], k->Q0 = sh[5];
	int nbt = (k->Q0 + k->NQ + B - 1) / B, nb = nbt + spare;
	dpool_make(c, &k->p, nb, B, NKV, HD, (size_t)sh[6], s);
	k->table = xmalloc((size_t)nbt * 4);
	for (int b = 0; b < nbt; b++)
		k->table[b] = (int32_t)(rng(s) % (uint32_t)nb);
	k->n = (size_t)k->NQ * k->H * HD;
	k->q = xmalloc(k->n * 4), k->ref = xmalloc(k->n * 4), k->got = xmalloc(k->n * 4);
	for (size_t j = 0; j < k->n; j++)
		k->q[j] = frand(s) * 3;
	k->scale = 1.0f / sqrtf((float)HD);
	assert_int_equal(
	    kvk_ref_attn_prefill(k->ref, k->q, &k->p.host, k->table, k->NQ, k->Q0, k->H, k->scale),
	    0);
	k->dq = up(c, k->q, k->n * 4), k->dout = up(c, NULL, k->n * 4);
	k->dt = up(c, k->table, (size_t)nbt * 4);
	snprintf(k->lbl, sizeof(k->lbl), "%s H %d NKV %d HD %d B %d NQ %d Q0 %d pad %d", name, k->H,
		 NKV, HD, B, k->NQ, k->Q0, sh[6]);
}

static void pcase_free(struct kvk_cuda_ctx *c, struct pcase *k)
{
	kvk_cuda_free(c, k->dq), kvk_cuda_free(c, k->dout), kvk_cuda_free(c, k->dt);
	free(k->q), free(k->ref), free(k->got), free(k->table);
	dpool_free(c, &k->p);
}

static void test_attn_prefill(void **state)
{
	struct kvk_cuda_ctx *c = *state;
	uint64_t s = 5;
	for (size_t i = 0; i < ncases(sizeof(prefill_shapes) / sizeof(prefill_shapes[0])); i++) {
		struct pcase k;
		pcase_make(c, &k, "attn_prefill", prefill_shapes[i], 5, &s);
		assert_int_equal(kvk_cu_attn_prefill_fp32(c, k.dout, k.dq, &k.p.dev, k.dt, k.NQ,
							  k.Q0, k.H, k.scale),
				 0);
		down(c, k.got, k.dout, k.n * 4);
		/* Online vs two-pass softmax in f32, outputs are means of values in [-1, 1]:
		 * absolute 1e-4. */
		close_enough(k.lbl, k.got, k.ref, k.n, 1e-4, 1e-4);
		pcase_free(c, &k);
	}
}

/* The tensor-core prefill (kvk_cu_attn_prefill_mma) and what kvk_cu_attn_prefill picks. Shapes
 * (n_heads, n_kv_heads, head_dim, block_tokens, n_q, q_start, pad): GQA groups of 2, 4 and 6
 * and MHA; rows (n_q x group) and keys that are not multiples of the 64-row block or the
 * 32-key tile; a prefix already cached (q_start > 0); head_dim 16 to 256. The emulation runs
 * each lane's wmma on the whole tile, so the shapes stay small. */
static const int mma_shapes[][7] = {
    {2, 1, 16, 5, 37, 0, 2},	{4, 4, 64, 16, 20, 45, 0}, {8, 2, 128, 7, 33, 5, 4},
    {4, 2, 256, 16, 17, 10, 0}, {6, 1, 32, 3, 70, 100, 0},
};

static double max_abs_err(const float *got, const float *ref, size_t n)
{
	double w = 0;
	for (size_t i = 0; i < n; i++) {
		double e = fabs((double)got[i] - ref[i]);
		if (!(e <= w)) /* NaN counts as the worst */
			w = isnan(e) ? INFINITY : e;
	}
	return w;
}

static void test_attn_prefill_mma(void **state)
{
	struct kvk_cuda_ctx *c = *state;
	uint64_t s = 15;
	double worst = 0;
	for (size_t i = 0; i < ncases(sizeof(mma_shapes) / sizeof(mma_shapes[0])); i++) {
		struct pcase k;
		pcase_make(c, &k, "attn_prefill_mma", mma_shapes[i], 3, &s);
		int rc = kvk_cu_attn_prefill_mma(c, k.dout, k.dq, &k.p.dev, k.dt, k.NQ, k.Q0, k.H,
						 k.scale);
		if (rc == -ENOTSUP) { /* a GPU below sm_80: the FP32 kernel is tested above */
			pcase_free(c, &k);
			skip();
		}
		assert_int_equal(rc, 0);
		size_t n = k.n;
		float *got = k.got, *ref = k.ref, *got2 = xmalloc(n * 4);
		down(c, got, k.dout, n * 4);
		/* Q rounded to f16 (2^-11 relative), P rounded to f16, f32 sums: outputs are
		 * weighted means of values in [-1, 1]; the worst seen on the emulation is 8.4e-5
		 * (printed below), the bound 5e-4. A causal mask one key too long is off by 0.4,
		 * a row given the next head of its GQA group by 0.1. */
		close_enough(k.lbl, got, ref, n, 5e-4, 0);
		double e = max_abs_err(got, ref, n);
		worst = e > worst ? e : worst;
		/* the engine's entry point takes the same kernel here */
		assert_int_equal(
		    kvk_cu_attn_prefill(c, k.dout, k.dq, &k.p.dev, k.dt, k.NQ, k.Q0, k.H, k.scale),
		    0);
		down(c, got2, k.dout, n * 4);
		same_bytes(k.lbl, got2, got, n * 4);
		free(got2);
		pcase_free(c, &k);
	}
	print_message("attn_prefill_mma: worst |err| %.3g\n", worst);
	/* head_dim not a multiple of 16: not the tensor-core kernel's; the dispatcher falls back */
	struct kvk_kv_pages pg = {(void *)16, (void *)16, 8, 1, 1, 1, 8};
	assert_int_equal(kvk_cu_attn_prefill_mma(c, NULL, NULL, &pg, NULL, 0, 0, 1, 1.f), -ENOTSUP);
	assert_int_equal(kvk_cu_attn_prefill(c, NULL, NULL, &pg, NULL, 0, 0, 1, 1.f), 0);
}

/* (n_seqs, n_heads, n_kv_heads, head_dim, block_tokens, max_len) */
static const int decode_shapes[][6] = {
    {3, 4, 2, 8, 5, 40},      {5, 12, 4, 256, 32, 90}, {3, 32, 1, 64, 8, 100},
    {7, 8, 1, 128, 16, 300},  {1, 1, 1, 2, 1, 1},      {64, 32, 8, 64, 16, 2100},
    {33, 32, 8, 64, 64, 700}, {65537, 2, 1, 2, 1, 3},
};
/* {3, 32, 1, ...} is MQA: the group of 32 rows spans two thread blocks. {65537, ...}: more
 * sequences than grid.z holds (65535), as a decode batch of the engine's 65536 tokens can be. */

static void test_attn_decode(void **state)
{
	struct kvk_cuda_ctx *c = *state;
	uint64_t s = 6;
	for (size_t i = 0; i < ncases(sizeof(decode_shapes) / sizeof(decode_shapes[0])); i++) {
		const int *sh = decode_shapes[i];
		int NS = sh[0], H = sh[1], NKV = sh[2], HD = sh[3], B = sh[4], ML = sh[5];
		int maxb = (ML + B - 1) / B, nb = maxb * 2 + 1;
		struct dpool p;
		dpool_make(c, &p, nb, B, NKV, HD, 0, &s);
		int32_t *tables = xmalloc((size_t)NS * maxb * 4), *lens = xmalloc((size_t)NS * 4);
		for (int j = 0; j < NS * maxb; j++)
			tables[j] = (int32_t)(rng(&s) % (uint32_t)nb);
		for (int j = 0; j < NS; j++)
			lens[j] = 1 + (int32_t)(rng(&s) % (uint32_t)ML);
		if (NS > 2)
			lens[1] = 0; /* an empty slot in the batch: zeros */
		size_t n = (size_t)NS * H * HD;
		float *q = xmalloc(n * 4), *ref = xmalloc(n * 4), *got = xmalloc(n * 4);
		for (size_t j = 0; j < n; j++)
			q[j] = frand(&s) * 3;
		float scale = 1.0f / sqrtf((float)HD);
		assert_int_equal(
		    kvk_ref_attn_decode(ref, q, &p.host, tables, maxb, lens, NS, H, scale), 0);
		float *dq = up(c, q, n * 4), *dout = up(c, NULL, n * 4);
		int32_t *dt = up(c, tables, (size_t)NS * maxb * 4), *dl = up(c, lens, NS * 4);
		assert_int_equal(
		    kvk_cu_attn_decode(c, dout, dq, &p.dev, dt, maxb, dl, NS, H, scale), 0);
		down(c, got, dout, n * 4);
		char lbl[128];
		snprintf(lbl, sizeof(lbl), "attn_decode S %d H %d NKV %d HD %d B %d maxlen %d", NS,
			 H, NKV, HD, B, ML);
		close_enough(lbl, got, ref, n, 1e-4, 1e-4); /* as prefill */
		kvk_cuda_free(c, dq), kvk_cuda_free(c, dout), kvk_cuda_free(c, dt);
		kvk_cuda_free(c, dl);
		free(q), free(ref), free(got), free(tables), free(lens);
		dpool_free(c, &p);
	}
	/* Bad geometry is refused before anything is enqueued. */
	struct kvk_kv_pages bad = {(void *)16, (void *)16, 64, 1, 4, 2, 7};
	assert_int_equal(kvk_cu_attn_decode(c, NULL, NULL, &bad, NULL, 1, NULL, 1, 2, 1.f),
			 -EINVAL);
}

/* ---- GEMM, Q8_0 ------------------------------------------------------------------------------ */

/* n values random in [-1, 1] from s, stored as dt (F32, F16 or BF16). */
static void fill_dt(void *p, size_t n, enum kvk_dtype dt, uint64_t *s)
{
	for (size_t j = 0; j < n; j++) {
		float f = frand(s);
		if (dt == KVK_DT_F32)
			((float *)p)[j] = f;
		else
			((uint16_t *)p)[j] =
			    dt == KVK_DT_BF16 ? kvk_ops_f32_to_bf16(f) : kvk_ops_f32_to_f16(f);
	}
}

/* One GEMM of shape M x N x K against kvk_ref_gemm: A (M, K) then B (N, K) filled from s,
 * |err| <= atol everywhere. */
static void check_gemm(struct kvk_cuda_ctx *c, enum kvk_dtype dt, int M, int N, int K, uint64_t *s,
		       double atol)
{
	size_t es = dt == KVK_DT_F32 ? 4 : 2, na = (size_t)M * K, nb = (size_t)N * K;
	const char *name = dt == KVK_DT_F32 ? "f32" : dt == KVK_DT_BF16 ? "bf16" : "f16";
	void *a = xmalloc(na * es), *b = xmalloc(nb * es);
	fill_dt(a, na, dt, s);
	fill_dt(b, nb, dt, s);
	float *ref = xmalloc((size_t)M * N * 4), *got = xmalloc((size_t)M * N * 4);
	assert_int_equal(kvk_ref_gemm(ref, a, b, dt, M, N, K), 0);
	void *da = up(c, a, na * es), *db = up(c, b, nb * es);
	float *dc = up(c, NULL, (size_t)M * N * 4);
	assert_int_equal(kvk_cu_gemm(c, dc, da, db, dt, M, N, K), 0);
	down(c, got, dc, (size_t)M * N * 4);
	char lbl[96];
	snprintf(lbl, sizeof(lbl), "gemm %s %d x %d x %d", name, M, N, K);
	close_enough(lbl, got, ref, (size_t)M * N, atol, 0);
	kvk_cuda_free(c, da), kvk_cuda_free(c, db), kvk_cuda_free(c, dc);
	free(a), free(b), free(ref), free(got);
}

static void test_gemm(void **state)
{
	struct kvk_cuda_ctx *c = *state;
	static const int shapes[][3] = {{1, 1, 1}, {17, 33, 65}, {128, 256, 512}, {300, 257, 1000}};
	uint64_t s = 7;
	/* Tensor-core f32 accumulation in another order: inputs in [-1, 1], so |err| <= 1e-3 *
	 * sqrt(K) covers it with a wide margin. */
	for (size_t i = 0; i < ncases(4); i++)
		for (int bf = 0; bf < 2; bf++)
			check_gemm(c, bf ? KVK_DT_BF16 : KVK_DT_F16, shapes[i][0], shapes[i][1],
				   shapes[i][2], &s, 1e-3 * sqrt((double)shapes[i][2]));
}

/* F32 GEMM (models stored in f32): CUBLAS_COMPUTE_32F, no TF32, so the same f32 products in
 * another order: |err| <= 1e-5 * K for inputs in [-1, 1]. */
static void test_gemm_f32(void **state)
{
	struct kvk_cuda_ctx *c = *state;
	static const int shapes[][3] = {{1, 1, 1}, {17, 33, 65}, {64, 2048, 2048}, {3, 257, 1000}};
	uint64_t s = 8;
	for (size_t i = 0; i < ncases(4); i++)
		check_gemm(c, KVK_DT_F32, shapes[i][0], shapes[i][1], shapes[i][2], &s,
			   1e-5 * shapes[i][2]);
}

/* add, add_bias: exact (one f32 addition per element); kv_store: exact (f16 rounding to
 * nearest even on both), including the untouched rest of the pool and a skipped bad slot. */
static void test_fwd_glue(void **state)
{
	struct kvk_cuda_ctx *c = *state;
	uint64_t s = 9;
	static const size_t sizes[][2] = {{1, 1}, {13, 4}, {2048, 64}, {896, 7}};
	for (size_t i = 0; i < ncases(4); i++) {
		size_t n = sizes[i][0], r = sizes[i][1];
		float *y = xmalloc(n * r * 4), *x = xmalloc(n * r * 4), *b = xmalloc(n * 4);
		float *got = xmalloc(n * r * 4);
		for (size_t j = 0; j < n * r; j++)
			y[j] = frand(&s), x[j] = frand(&s);
		for (size_t j = 0; j < n; j++)
			b[j] = frand(&s);
		float *dy = up(c, y, n * r * 4), *dx = up(c, x, n * r * 4), *db = up(c, b, n * 4);
		assert_int_equal(kvk_cu_add(c, dy, dx, n * r), 0);
		assert_int_equal(kvk_cu_add_bias(c, dy, db, n, r), 0);
		down(c, got, dy, n * r * 4);
		assert_int_equal(kvk_ref_add(y, x, n * r), 0);
		assert_int_equal(kvk_ref_add_bias(y, b, n, r), 0);
		same_bytes("add + add_bias", got, y, n * r * 4);
		kvk_cuda_free(c, dy), kvk_cuda_free(c, dx), kvk_cuda_free(c, db);
		free(y), free(x), free(b), free(got);
	}
	/* kv_store into the engine layout (all layers of a block together), 1B-like rows */
	static const int kshapes[][5] = {{2, 6, 4, 1, 2}, {3, 9, 16, 2, 64}, {16, 8, 64, 8, 64}};
	for (size_t i = 0; i < ncases(3); i++) {
		int L = kshapes[i][0], NB = kshapes[i][1], B = kshapes[i][2], NKV = kshapes[i][3];
		int HD = kshapes[i][4], ROW = NKV * HD, T = B + 3;
		size_t slab = (size_t)B * ROW, bstride = (size_t)L * 2 * slab, tot = bstride * NB;
		uint16_t *mem = xmalloc(tot * 2), *got = xmalloc(tot * 2);
		for (size_t j = 0; j < tot; j++)
			mem[j] = (uint16_t)rng(&s);
		uint16_t *dmem = up(c, mem, tot * 2);
		uint16_t *hk[64], *hv[64], *dk[64], *dv[64];
		for (int l = 0; l < L; l++) {
			hk[l] = mem + (size_t)l * 2 * slab, hv[l] = hk[l] + slab;
			dk[l] = dmem + (size_t)l * 2 * slab, dv[l] = dk[l] + slab;
		}
		struct kvk_kv_layers hkv = {L, NB, B, NKV, HD, bstride, hk, hv};
		struct kvk_kv_layers dkv = {L, NB, B, NKV, HD, bstride, dk, dv};
		float *k = xmalloc((size_t)T * ROW * 4), *v = xmalloc((size_t)T * ROW * 4);
		for (size_t j = 0; j < (size_t)T * ROW; j++)
			k[j] = frand(&s) * 70000, v[j] = frand(&s);
		int32_t *slots = xmalloc((size_t)T * 4);
		for (int t = 0; t < T; t++)
			slots[t] = (int32_t)((7 * t + 3) % (NB * B));
		float *dkk = up(c, k, (size_t)T * ROW * 4), *dvv = up(c, v, (size_t)T * ROW * 4);
		int32_t *dsl = up(c, slots, (size_t)T * 4);
		for (int l = 0; l<L; l += L> 2 ? L - 1 : 1) {
			assert_int_equal(kvk_cu_kv_store(c, &dkv, l, dkk, dvv, dsl, T), 0);
			assert_int_equal(kvk_ref_kv_store(&hkv, l, k, v, slots, T), 0);
		}
		int32_t bad = NB * B; /* skipped by the kernel */
		int32_t *dbad = up(c, &bad, 4);
		assert_int_equal(kvk_cu_kv_store(c, &dkv, 0, dkk, dvv, dbad, 1), 0);
		down(c, got, dmem, tot * 2);
		same_bytes("kv_store", got, mem, tot * 2);
		kvk_cuda_free(c, dmem), kvk_cuda_free(c, dkk), kvk_cuda_free(c, dvv);
		kvk_cuda_free(c, dsl), kvk_cuda_free(c, dbad);
		free(mem), free(got), free(k), free(v), free(slots);
	}
}

static void test_q8_0_gemv(void **state)
{
	struct kvk_cuda_ctx *c = *state;
	static const int shapes[][3] = {{1, 32, 1}, {37, 96, 3}, {4096, 2048, 8}, {513, 4096, 11}};
	uint64_t s = 8;
	for (size_t i = 0; i < ncases(4); i++) {
		int R = shapes[i][0], N = shapes[i][1], T = shapes[i][2], NB = N / 32;
		size_t wb = (size_t)R * NB * KVK_Q8_0_BYTES;
		uint8_t *w = xmalloc(wb);
		for (size_t b = 0; b < (size_t)R * NB; b++) {
			uint16_t d = kvk_ops_f32_to_f16(0.02f * (float)(rng(&s) % 100 + 1) / 100);
			memcpy(w + b * KVK_Q8_0_BYTES, &d, 2);
			for (int j = 0; j < 32; j++)
				w[b * KVK_Q8_0_BYTES + 2 + j] = (uint8_t)rng(&s);
		}
		float *x = xmalloc((size_t)T * N * 4), *ref = xmalloc((size_t)T * R * 4);
		float *got = xmalloc((size_t)T * R * 4);
		for (size_t j = 0; j < (size_t)T * N; j++)
			x[j] = frand(&s);
		assert_int_equal(kvk_ref_q8_0_gemv(ref, w, x, R, N, T), 0);
		void *dw = up(c, w, wb);
		float *dx = up(c, x, (size_t)T * N * 4), *dy = up(c, NULL, (size_t)T * R * 4);
		assert_int_equal(kvk_cu_q8_0_gemv(c, dy, dw, dx, R, N, T), 0);
		down(c, got, dy, (size_t)T * R * 4);
		/* f32 sums in another block order; |w| <= 0.02 * 127, |x| <= 1: absolute
		 * 1e-5 * N. */
		char lbl[96];
		snprintf(lbl, sizeof(lbl), "q8_0_gemv rows %d n %d tokens %d", R, N, T);
		close_enough(lbl, got, ref, (size_t)T * R, 1e-5 * N, 0);
		kvk_cuda_free(c, dw), kvk_cuda_free(c, dx), kvk_cuda_free(c, dy);
		free(w), free(x), free(ref), free(got);
	}
}

/* Q4_0 / K-quant weights from the host quantizer (random rows): the device's dequantization
 * gathered by embed (to 1 ulp: the device may fuse d * q - m into one FMA) and the GEMV against
 * kvk_ref_kq_gemv. */
static const enum kvk_dtype KQ_DTS[] = {KVK_DT_Q4_0, KVK_DT_Q4_K, KVK_DT_Q5_K,
					KVK_DT_Q6_K, KVK_DT_Q5_0, KVK_DT_Q5_1};

static uint8_t *kq_rows(enum kvk_dtype dt, int rows, int n, uint64_t *s, size_t *bytes)
{
	size_t rb = kvk_row_bytes((enum kvk_wtype)dt, (size_t)n);
	uint8_t *w = xmalloc(rb * (size_t)rows);
	float *x = xmalloc((size_t)n * 4);
	for (int r = 0; r < rows; r++) {
		for (int i = 0; i < n; i++)
			x[i] = frand(s) * 0.05f + (r % 3 ? 0.f : 0.01f);
		assert_int_equal(
		    kvk_quantize_row((enum kvk_wtype)dt, w + rb * (size_t)r, x, (size_t)n), 0);
	}
	free(x);
	*bytes = rb * (size_t)rows;
	return w;
}

static void test_kq_embed(void **state)
{
	struct kvk_cuda_ctx *c = *state;
	uint64_t s = 21;
	for (int k = 0; k < 6; k++) {
		size_t rows = 37, dim = 512, T = 9, wb;
		uint8_t *tab = kq_rows(KQ_DTS[k], (int)rows, (int)dim, &s, &wb);
		int32_t ids[9];
		for (size_t t = 0; t < T; t++)
			ids[t] = (int32_t)(rng(&s) % (rows + 4)) - 2;
		float *ref = xmalloc(T * dim * 4), *got = xmalloc(T * dim * 4);
		assert_int_equal(kvk_ref_embed(ref, tab, KQ_DTS[k], rows, dim, ids, T), 0);
		void *dt = up(c, tab, wb), *di_ = up(c, ids, sizeof(ids));
		float *dout = up(c, NULL, T * dim * 4);
		assert_int_equal(kvk_cu_embed(c, dout, dt, KQ_DTS[k], rows, dim, di_, T), 0);
		down(c, got, dout, T * dim * 4);
		char lbl[96];
		snprintf(lbl, sizeof(lbl), "embed type %d", (int)KQ_DTS[k]);
		close_enough(lbl, got, ref, T * dim, 1e-7, 2e-7);
		kvk_cuda_free(c, dt), kvk_cuda_free(c, di_), kvk_cuda_free(c, dout);
		free(tab), free(ref), free(got);
	}
}

static void test_kq_gemv(void **state)
{
	struct kvk_cuda_ctx *c = *state;
	static const int shapes[][3] = {{1, 256, 1}, {37, 768, 3}, {513, 2048, 11}, {64, 4096, 8}};
	uint64_t s = 22;
	for (int k = 0; k < 6; k++)
		for (size_t i = 0; i < ncases(4); i++) {
			int R = shapes[i][0], N = shapes[i][1], T = shapes[i][2];
			size_t wb;
			uint8_t *w = kq_rows(KQ_DTS[k], R, N, &s, &wb);
			float *x = xmalloc((size_t)T * N * 4), *ref = xmalloc((size_t)T * R * 4);
			float *got = xmalloc((size_t)T * R * 4);
			for (size_t j = 0; j < (size_t)T * N; j++)
				x[j] = frand(&s);
			assert_int_equal(kvk_ref_kq_gemv(ref, w, KQ_DTS[k], x, R, N, T), 0);
			void *dw = up(c, w, wb);
			float *dx = up(c, x, (size_t)T * N * 4),
			      *dy = up(c, NULL, (size_t)T * R * 4);
			assert_int_equal(kvk_cu_kq_gemv(c, dy, dw, KQ_DTS[k], dx, R, N, T), 0);
			down(c, got, dy, (size_t)T * R * 4);
			/* weights and activations rounded to f16 (the tensor-core GEMM's inputs,
			 * kvk_kq.cu), f32 sums in another block order; |w| <= 0.07, |x| <= 1: the
			 * bound of test_kq_gemm */
			char lbl[96];
			snprintf(lbl, sizeof(lbl), "kq_gemv type %d rows %d n %d tokens %d",
				 (int)KQ_DTS[k], R, N, T);
			close_enough(lbl, got, ref, (size_t)T * R, 1.2e-4 * sqrt((double)N), 0);
			kvk_cuda_free(c, dw), kvk_cuda_free(c, dx), kvk_cuda_free(c, dy);
			free(w), free(x), free(ref), free(got);
		}
	/* rows that are not whole blocks, a type it does not take */
	assert_int_equal(kvk_cu_kq_gemv(c, NULL, NULL, KVK_DT_Q4_K, NULL, 1, 96, 1), -EINVAL);
	assert_int_equal(kvk_cu_kq_gemv(c, NULL, NULL, KVK_DT_Q8_0, NULL, 1, 256, 1), -EINVAL);
}

/* The K-quant dequant-GEMM on tensor cores (kvk_cu_kq_gemm) against kvk_ref_kq_gemv, every
 * type, token counts around its 64-token tile and rows around its 64-row tile; and
 * kvk_cu_kq_gemv, which the engine calls, takes it from 16 tokens on. */
static void test_kq_gemm(void **state)
{
	struct kvk_cuda_ctx *c = *state;
	static const int shapes[][3] = {
	    {70, 256, 20}, {1, 256, 65}, {130, 256, 67}, {64, 1024, 16}};
	uint64_t s = 23;
	double worst = 0;
	for (int k = 0; k < 6; k++)
		for (size_t i = 0; i < ncases(4); i++) {
			int R = shapes[i][0], N = shapes[i][1], T = shapes[i][2];
			size_t wb, ny = (size_t)T * R;
			uint8_t *w = kq_rows(KQ_DTS[k], R, N, &s, &wb);
			float *x = xmalloc((size_t)T * N * 4), *ref = xmalloc(ny * 4);
			float *got = xmalloc(ny * 4), *got2 = xmalloc(ny * 4);
			for (size_t j = 0; j < (size_t)T * N; j++)
				x[j] = frand(&s);
			assert_int_equal(kvk_ref_kq_gemv(ref, w, KQ_DTS[k], x, R, N, T), 0);
			void *dw = up(c, w, wb);
			float *dx = up(c, x, (size_t)T * N * 4), *dy = up(c, NULL, ny * 4);
			int rc = kvk_cu_kq_gemm(c, dy, dw, KQ_DTS[k], dx, R, N, T);
			if (rc == -ENOTSUP) { /* below sm_80: the GEMV is tested above */
				kvk_cuda_free(c, dw), kvk_cuda_free(c, dx), kvk_cuda_free(c, dy);
				free(w), free(x), free(ref), free(got), free(got2);
				skip();
			}
			assert_int_equal(rc, 0);
			down(c, got, dy, ny * 4);
			/* weights (|w| <= 0.07) and activations (|x| <= 1) rounded to f16, 2^-11
			 * relative each, f32 sums: the worst seen on the emulation is 2.9e-5 *
			 * sqrt(n) (printed below), the bound 1.2e-4 * sqrt(n). A warp reading the
			 * wrong 16 weight rows is off by 1.9 at n 256. */
			char lbl[96];
			snprintf(lbl, sizeof(lbl), "kq_gemm type %d rows %d n %d tokens %d",
				 (int)KQ_DTS[k], R, N, T);
			close_enough(lbl, got, ref, ny, 1.2e-4 * sqrt((double)N), 0);
			double e = max_abs_err(got, ref, ny) / sqrt((double)N);
			worst = e > worst ? e : worst;
			assert_int_equal(kvk_cu_kq_gemv(c, dy, dw, KQ_DTS[k], dx, R, N, T), 0);
			down(c, got2, dy, ny * 4);
			same_bytes(lbl, got2, got, ny * 4);
			/* The GEMV (decode, chunks under 16 tokens) takes the same f16 inputs: only
			 * the order of f32 sums differs, so the engine's logits do not depend on
			 * the chunk size. */
			assert_int_equal(kvk_cu_kq_gemv_fp32(c, dy, dw, KQ_DTS[k], dx, R, N, T), 0);
			down(c, got2, dy, ny * 4);
			snprintf(lbl, sizeof(lbl), "kq_gemm vs gemv type %d rows %d n %d tokens %d",
				 (int)KQ_DTS[k], R, N, T);
			close_enough(lbl, got2, got, ny, 1e-6 * N, 0);
			kvk_cuda_free(c, dw), kvk_cuda_free(c, dx), kvk_cuda_free(c, dy);
			free(w), free(x), free(ref), free(got), free(got2);
		}
	print_message("kq_gemm: worst |err| / sqrt(n) %.3g\n", worst);
	assert_int_equal(kvk_cu_kq_gemm(c, NULL, NULL, KVK_DT_Q4_K, NULL, 1, 96, 16), -EINVAL);
}

/* ---- sampling ------------------------------------------------------------------------------ */

static void test_sampling(void **state)
{
	struct kvk_cuda_ctx *c = *state;
	static const int shapes[][2] = {{1, 1}, {3, 7}, {5, 1000}, {9, 128256}};
	static const int ks[] = {1, 5, 40, 64};
	uint64_t s = 9;
	for (size_t i = 0; i < ncases(4); i++) {
		int R = shapes[i][0], V = shapes[i][1];
		size_t n = (size_t)R * V;
		float *l = xmalloc(n * 4), *u = xmalloc((size_t)R * 4);
		for (size_t j = 0; j < n; j++) /* coarse values: many ties */
			l[j] = (float)(int)(frand(&s) * 50) / 10;
		if (n > 3) {
			l[1] = NAN;
			l[2] = INFINITY;
		}
		for (int r = 0; r < R; r++)
			u[r] = (float)rng(&s) / 4294967296.0f;
		int32_t *ref = xmalloc((size_t)R * 4), *got = xmalloc((size_t)R * 4);
		float *dl = up(c, l, n * 4), *du = up(c, u, (size_t)R * 4);
		int32_t *dout = up(c, NULL, (size_t)R * 4);
		assert_int_equal(kvk_ref_argmax(ref, l, R, V), 0);
		assert_int_equal(kvk_cu_argmax(c, dout, dl, R, V), 0);
		down(c, got, dout, (size_t)R * 4);
		char lbl[96];
		snprintf(lbl, sizeof(lbl), "argmax rows %d vocab %d", R, V);
		same_bytes(lbl, got, ref, (size_t)R * 4); /* exact */
		for (int ki = 0; ki < 4; ki++) {
			if (ks[ki] > V)
				continue;
			assert_int_equal(kvk_ref_sample_topk(ref, l, R, V, ks[ki], 0.7f, u), 0);
			assert_int_equal(kvk_cu_sample_topk(c, dout, dl, R, V, ks[ki], 0.7f, du),
					 0);
			down(c, got, dout, (size_t)R * 4);
			/* Same selection order and arithmetic; only expf may differ by an ulp,
			 * which can move a pick by one place when u sits on a boundary. Such a
			 * pick must then still have a logit within the top k. */
			for (int r = 0; r < R; r++) {
				if (got[r] == ref[r])
					continue;
				assert_true(got[r] >= 0 && got[r] < V);
				int better = 0;
				for (int j = 0; j < V; j++) {
					float a = l[(size_t)r * V + j],
					      b = l[(size_t)r * V + got[r]];
					a = isnan(a) ? -INFINITY : a;
					b = isnan(b) ? -INFINITY : b;
					better += a > b || (a == b && j < got[r]);
				}
				assert_true(better < ks[ki]);
			}
		}
		kvk_cuda_free(c, dl), kvk_cuda_free(c, du), kvk_cuda_free(c, dout);
		free(l), free(u), free(ref), free(got);
	}
}

/* ---- pack / unpack ------------------------------------------------------------------------- */

struct pool_set {
	int L;
	uint16_t **hk, **hv; /* host pools per layer */
	uint16_t **dk, **dv; /* device pools per layer */
	struct kvk_kv_layers host, dev;
};

static void pset_make(struct kvk_cuda_ctx *c, struct pool_set *p, int L, int nb, int B, int nkv,
		      int hd, size_t pad, uint64_t *s, int zero)
{
	size_t stride = (size_t)B * nkv * hd + pad, n = stride * nb;
	p->L = L;
	p->hk = xmalloc(L * sizeof(void *)), p->hv = xmalloc(L * sizeof(void *));
	p->dk = xmalloc(L * sizeof(void *)), p->dv = xmalloc(L * sizeof(void *));
	for (int l = 0; l < L; l++) {
		p->hk[l] = xmalloc(n * 2);
		p->hv[l] = xmalloc(n * 2);
		for (size_t i = 0; i < n; i++) {
			p->hk[l][i] = zero ? 0 : (uint16_t)rng(s);
			p->hv[l][i] = zero ? 0 : (uint16_t)rng(s);
		}
		p->dk[l] = up(c, p->hk[l], n * 2);
		p->dv[l] = up(c, p->hv[l], n * 2);
	}
	p->host = (struct kvk_kv_layers){L, nb, B, nkv, hd, stride, p->hk, p->hv};
	p->dev = (struct kvk_kv_layers){L, nb, B, nkv, hd, stride, p->dk, p->dv};
}

static void pset_download(struct kvk_cuda_ctx *c, struct pool_set *p, uint16_t *k_or_v_out, int l,
			  int v)
{
	size_t n = p->host.block_stride * p->host.num_blocks;
	down(c, k_or_v_out, v ? (void *)p->dv[l] : (void *)p->dk[l], n * 2);
}

static void pset_free(struct kvk_cuda_ctx *c, struct pool_set *p)
{
	for (int l = 0; l < p->L; l++) {
		free(p->hk[l]), free(p->hv[l]);
		kvk_cuda_free(c, p->dk[l]), kvk_cuda_free(c, p->dv[l]);
	}
	free(p->hk), free(p->hv), free(p->dk), free(p->dv);
}

struct cb_state {
	const uint8_t *want; /* the reference payload */
	uint8_t *buf;	     /* the host buffer of the transfer */
	size_t payload;
	int calls, next;
};

/* Pack: at the call, the chunk must already be complete on the host, in order. */
static int pack_cb(void *arg, int first, int n)
{
	struct cb_state *st = arg;
	st->calls++;
	if (first != st->next)
		return -EPROTO;
	st->next = first + n;
	size_t off = (size_t)first * st->payload, len = (size_t)n * st->payload;
	return memcmp(st->buf + off, st->want + off, len) ? -EBADMSG : 0;
}

/* Unpack: the host buffer starts empty and the callback fills each chunk just in time. */
static int unpack_cb(void *arg, int first, int n)
{
	struct cb_state *st = arg;
	st->calls++;
	if (first != st->next)
		return -EPROTO;
	st->next = first + n;
	size_t off = (size_t)first * st->payload;
	memcpy(st->buf + off, st->want + off, (size_t)n * st->payload);
	return 0;
}

/* (n_layer, block_tokens, n_kv_heads, head_dim, pad, n_blocks): 16-byte and 2-byte paths,
 * one to several 4 MiB chunks. */
static const int pack_shapes[][6] = {
    {1, 1, 1, 2, 0, 1}, {3, 5, 2, 6, 1, 13}, {16, 64, 8, 64, 0, 37}, {4, 16, 8, 128, 8, 70}};

static void test_pack_unpack(void **state)
{
	struct kvk_cuda_ctx *c = *state;
	uint64_t s = 10;
	for (size_t i = 0; i < ncases(sizeof(pack_shapes) / sizeof(pack_shapes[0])); i++) {
		const int *sh = pack_shapes[i];
		int L = sh[0], B = sh[1], NKV = sh[2], HD = sh[3], N = sh[5], NB = 2 * N + 3;
		struct pool_set src, dst;
		pset_make(c, &src, L, NB, B, NKV, HD, (size_t)sh[4], &s, 0);
		pset_make(c, &dst, L, NB, B, NKV, HD, (size_t)sh[4], &s, 1);
		int32_t *from = xmalloc((size_t)N * 4), *to = xmalloc((size_t)N * 4);
		for (int j = 0; j < N; j++) {
			from[j] = (int32_t)(rng(&s) % (uint32_t)NB);
			to[j] = 2 * j + 1; /* distinct destinations */
		}
		size_t pb = kvk_kv_payload_bytes(&src.host), total = pb * N;
		uint8_t *want = xmalloc(total), *hb;
		assert_int_equal(kvk_ref_kv_pack(want, &src.host, from, N), 0);
		assert_int_equal(kvk_cuda_host_alloc(c, (void **)&hb, total), 0);
		memset(hb, 0, total);
		struct cb_state st = {want, hb, pb, 0, 0};
		assert_int_equal(kvk_cu_kv_pack(c, hb, &src.dev, from, N, pack_cb, &st), 0);
		char lbl[128];
		snprintf(lbl, sizeof(lbl), "pack L %d B %d NKV %d HD %d pad %d blocks %d", L, B,
			 NKV, HD, sh[4], N);
		same_bytes(lbl, hb, want, total); /* exact: a byte copy */
		assert_int_equal(st.next, N);
		/* Unpack into other blocks; compare with the reference unpack on the host. */
		memset(hb, 0, total);
		st = (struct cb_state){want, hb, pb, 0, 0};
		assert_int_equal(kvk_cu_kv_unpack(c, &dst.dev, hb, to, N, unpack_cb, &st), 0);
		assert_int_equal(st.next, N);
		assert_int_equal(kvk_ref_kv_unpack(&dst.host, want, to, N), 0);
		size_t pn = dst.host.block_stride * NB;
		uint16_t *tmp = xmalloc(pn * 2);
		for (int l = 0; l < L; l++)
			for (int v = 0; v < 2; v++) {
				pset_download(c, &dst, tmp, l, v);
				same_bytes("unpack (pools after)", tmp, v ? dst.hv[l] : dst.hk[l],
					   pn * 2);
			}
		/* Without callbacks, and device-to-device gather == host pack. */
		memset(hb, 0, total);
		assert_int_equal(kvk_cu_kv_pack(c, hb, &src.dev, from, N, NULL, NULL), 0);
		same_bytes(lbl, hb, want, total);
		/* Pageable host memory (the device engine's host mirror is malloc'd): pack into it,
		 * unpack from it into the `to` blocks again, the pools unchanged. */
		uint8_t *pg = xmalloc(total);
		memset(pg, 0, total);
		assert_int_equal(kvk_cu_kv_pack(c, pg, &src.dev, from, N, NULL, NULL), 0);
		same_bytes("pack into pageable memory", pg, want, total);
		assert_int_equal(kvk_cu_kv_unpack(c, &dst.dev, pg, to, N, NULL, NULL), 0);
		for (int l = 0; l < L; l++)
			for (int v = 0; v < 2; v++) {
				pset_download(c, &dst, tmp, l, v);
				same_bytes("unpack from pageable memory", tmp,
					   v ? dst.hv[l] : dst.hk[l], pn * 2);
			}
		free(pg);
		void *dbuf = up(c, NULL, total);
		assert_int_equal(kvk_cu_kv_gather(c, dbuf, &src.dev, from, N), 0);
		down(c, hb, dbuf, total);
		same_bytes(lbl, hb, want, total);
		/* A callback's error stops the transfer and comes back. */
		st = (struct cb_state){want, hb, pb, 0, 1000};
		assert_int_equal(kvk_cu_kv_pack(c, hb, &src.dev, from, N, pack_cb, &st), -EPROTO);
		int32_t bad = NB;
		assert_int_equal(kvk_cu_kv_pack(c, hb, &src.dev, &bad, 1, NULL, NULL), -EINVAL);
		kvk_cuda_free(c, dbuf);
		kvk_cuda_host_free(c, hb);
		free(tmp), free(want), free(from), free(to);
		pset_free(c, &src);
		pset_free(c, &dst);
	}
}

/* ---- NCCL (2 GPUs) ----------------------------------------------------------------------- */

struct rank_arg {
	int rank;
	const uint8_t *id;
	struct pool_set *ps;
	const int32_t *blocks;
	int n;
	struct kvk_cuda_ctx *ctx;
	int rc;
};

static void *rank_main(void *p)
{
	struct rank_arg *a = p;
	struct kvk_nccl *comm = NULL;
	a->rc = kvk_nccl_comm_create(&comm, a->ctx, a->id, 2, a->rank);
	if (a->rc)
		return NULL;
	/* Rank 0 is the decode side (receives), rank 1 the prefill side (sends). */
	if (a->rank == 1)
		a->rc = kvk_nccl_send_kv(comm, &a->ps->dev, a->blocks, a->n, 0);
	else
		a->rc = kvk_nccl_recv_kv(comm, &a->ps->dev, a->blocks, a->n, 1);
	kvk_nccl_comm_destroy(comm);
	return NULL;
}

static void test_nccl(void **state)
{
	(void)state;
	enum { L = 4, B = 16, NKV = 8, HD = 64, N = 300, NB = 2 * N };
	struct kvk_cuda_ctx *c0, *c1;
	assert_int_equal(kvk_cuda_ctx_create(0, &c0), 0);
	assert_int_equal(kvk_cuda_ctx_create(1, &c1), 0);
	uint64_t s = 11;
	struct pool_set dec, pre;
	pset_make(c0, &dec, L, NB, B, NKV, HD, 0, &s, 1);
	pset_make(c1, &pre, L, NB, B, NKV, HD, 0, &s, 0);
	int32_t from[N], to[N];
	for (int j = 0; j < N; j++) {
		from[j] = (int32_t)(rng(&s) % NB);
		to[j] = NB - 1 - j;
	}
	uint8_t id[KVK_NCCL_ID_BYTES];
	assert_int_equal(kvk_nccl_id_create(id), 0);
	struct rank_arg a0 = {0, id, &dec, to, N, c0, -1}, a1 = {1, id, &pre, from, N, c1, -1};
	pthread_t t0, t1;
	assert_int_equal(pthread_create(&t0, NULL, rank_main, &a0), 0);
	assert_int_equal(pthread_create(&t1, NULL, rank_main, &a1), 0);
	pthread_join(t0, NULL);
	pthread_join(t1, NULL);
	assert_int_equal(a0.rc, 0);
	assert_int_equal(a1.rc, 0);
	/* The decode side's blocks `to` now hold the prefill side's blocks `from`. */
	size_t pb = kvk_kv_payload_bytes(&pre.host);
	uint8_t *want = xmalloc(pb * N), *got = xmalloc(pb * N);
	assert_int_equal(kvk_ref_kv_pack(want, &pre.host, from, N), 0);
	void *d = up(c0, NULL, pb * N);
	assert_int_equal(kvk_cu_kv_gather(c0, d, &dec.dev, to, N), 0);
	down(c0, got, d, pb * N);
	same_bytes("nccl: decode side's blocks", got, want, pb * N);
	kvk_cuda_free(c0, d);
	free(want), free(got);
	pset_free(c0, &dec);
	pset_free(c1, &pre);
	kvk_cuda_ctx_destroy(c0);
	kvk_cuda_ctx_destroy(c1);
}

/* kvk_nccl_abort from another thread releases a receive whose peer never sends, and the
 * receive reports -EIO (not 0: no data came); later transfers on it fail at once. */
struct abort_arg {
	struct kvk_nccl *c;
	int ms;
};

static void *abort_main(void *p)
{
	struct abort_arg *a = p;
	struct timespec t = {a->ms / 1000, (long)(a->ms % 1000) * 1000000};
	nanosleep(&t, NULL);
	kvk_nccl_abort(a->c);
	return NULL;
}

struct join_arg {
	int rank;
	const uint8_t *id;
	struct kvk_cuda_ctx *ctx;
	struct kvk_nccl *c;
	int rc;
};

static void *join_main(void *p)
{
	struct join_arg *a = p;
	a->rc = kvk_nccl_comm_create(&a->c, a->ctx, a->id, 2, a->rank);
	return NULL;
}

static void test_nccl_abort(void **state)
{
	(void)state;
	enum { L = 2, B = 4, NKV = 2, HD = 8, N = 3, NB = 8 };
	struct kvk_cuda_ctx *c0, *c1;
	assert_int_equal(kvk_cuda_ctx_create(0, &c0), 0);
	assert_int_equal(kvk_cuda_ctx_create(1, &c1), 0);
	uint64_t s = 12;
	struct pool_set dec;
	pset_make(c0, &dec, L, NB, B, NKV, HD, 0, &s, 1);
	uint8_t id[KVK_NCCL_ID_BYTES];
	assert_int_equal(kvk_nccl_id_create(id), 0);
	struct join_arg j0 = {0, id, c0, NULL, -1}, j1 = {1, id, c1, NULL, -1};
	pthread_t t0, t1;
	assert_int_equal(pthread_create(&t0, NULL, join_main, &j0), 0);
	assert_int_equal(pthread_create(&t1, NULL, join_main, &j1), 0);
	pthread_join(t0, NULL);
	pthread_join(t1, NULL);
	assert_int_equal(j0.rc, 0);
	assert_int_equal(j1.rc, 0);
	/* rank 1 never sends: rank 0's receive waits until the abort 300 ms later */
	struct abort_arg ab = {j0.c, 300};
	pthread_t ta;
	assert_int_equal(pthread_create(&ta, NULL, abort_main, &ab), 0);
	int32_t to[N] = {1, 4, 6};
	assert_int_equal(kvk_nccl_recv_kv(j0.c, &dec.dev, to, N, 1), -EIO);
	pthread_join(ta, NULL);
	assert_int_equal(kvk_nccl_recv_kv(j0.c, &dec.dev, to, N, 1), -EIO);
	/* the context is still usable after the abort */
	assert_int_equal(kvk_cuda_sync(c0), 0);
	kvk_nccl_comm_destroy(j0.c); /* aborted: only the wrapper is freed */
	kvk_nccl_comm_destroy(j1.c);
	pset_free(c0, &dec);
	kvk_cuda_ctx_destroy(c0);
	kvk_cuda_ctx_destroy(c1);
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "--nccl") == 0) {
		if (!kvk_nccl_available()) {
			printf("skipped: this build has no NCCL\n");
			return 77;
		}
		if (kvk_cuda_device_count() < 2) {
			printf("skipped: the NCCL test needs 2 GPUs, found %d\n",
			       kvk_cuda_device_count());
			return 77;
		}
		const struct CMUnitTest nccl[] = {cmocka_unit_test(test_nccl),
						  cmocka_unit_test(test_nccl_abort)};
		return cmocka_run_group_tests_name("kernels_nccl", nccl, NULL, NULL);
	}
	if (!kvk_cuda_available()) {
		printf("skipped: no GPU (or no CUDA in this build)\n");
		return 77;
	}
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_memory),	     cmocka_unit_test(test_embed),
	    cmocka_unit_test(test_rmsnorm),	     cmocka_unit_test(test_rope),
	    cmocka_unit_test(test_swiglu_convert),   cmocka_unit_test(test_attn_prefill),
	    cmocka_unit_test(test_attn_decode),	     cmocka_unit_test(test_gemm),
	    cmocka_unit_test(test_q8_0_gemv),	     cmocka_unit_test(test_kq_gemv),
	    cmocka_unit_test(test_attn_prefill_mma), cmocka_unit_test(test_kq_gemm),
	    cmocka_unit_test(test_kq_embed),	     cmocka_unit_test(test_gemm_f32),
	    cmocka_unit_test(test_fwd_glue),	     cmocka_unit_test(test_sampling),
	    cmocka_unit_test(test_pack_unpack),	     cmocka_unit_test(test_vit_ops),
	};
	return cmocka_run_group_tests_name("kernels_cuda", tests, setup, teardown);
}
