/* Tests for engine/fwd_dev (the device engine) against the CPU engine (engine/fwd.c), on small
 * random models of every weight type (tests/ref_fwd.c):
 *
 *   test_fwd_dev          the "host" backend (the kvk references): runs everywhere
 *   test_fwd_dev --cuda   the same checks on GPU 0; exits 77 ("skipped: no GPU") without one
 *
 * Tolerance (docs/cuda.md): every logits row of the device engine is within TOL * max(1,
 * max |cpu|) of the CPU engine's row (max abs difference), TOL = 2e-3 for F32, 6e-3 for F16
 * (the GEMM inputs are rounded to f16: 11 bits of mantissa), 3e-2 for BF16 (rounded to bf16:
 * 8 bits), 6e-2 for Q8_0 (the CPU engine quantizes activations to 8 bits per block of 32, the
 * device engine keeps them f32). Measured on the host backend: at most 2.3e-5, 2.7e-3, 1.3e-2,
 * 3.6e-2 (the CPU engine's own error against the scalar reference is up to 1.5e-3 for the float
 * types and 3.7e-2 for Q8_0, docs/engine.md). The device
 * engine against itself (other chunk sizes, batch vs alone, cached vs computed prefix):
 * bit-identical on the host backend, within 1e-3 relative on cuda (cuBLAS may pick another
 * algorithm for another batch size). Greedy tokens: the device engine, fed the CPU engine's
 * tokens, picks the CPU's token at every step where the CPU's top-2 logits are further apart
 * than twice the tolerance. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "fwd.h"
#include "fwd_checks.h"
#include "fwd_dev.h"
#include "kvk.h"
#include "kvk_cuda.h"
#include "kvk_dev.h"
#include "ref_fwd.h"
#ifndef KVFS_TEST_NO_KVX
#include "kvx.h"
#endif

static int BACKEND = KVK_DEV_HOST;
/* KVK_TEST_QUICK set (gpu-check.sh's compute-sanitizer run): F16 and Q8_0 only, fewer shapes. */
static int QUICK;
#define DT_FIRST (QUICK ? 1 : 0) /* dtypes[1] = F16 */
#define DT_END	 (QUICK ? 2 : 4)
/* The device engine against itself: the host backend is bit-identical (0); cuBLAS may choose
 * another algorithm for another batch size, and a 1-ulp change of an f16 GEMM input moves a
 * logit by far less than 1e-3 (an indexing bug moves it by O(1)). */
static double SELF_TOL = 0;

/* Real-model-like heads: head_dim 64, GQA group 4, partial rotary (rope_dim 32), halves. */
static struct kvi_config cfg_wide(void)
{
	struct kvi_config c = ref_cfg_tiny_llama(203);
	strcpy(c.arch, "wide");
	c.n_embd = 128;
	c.n_head = 8;
	c.n_head_kv = 2;
	c.head_dim = 64;
	c.rope_dim = 32;
	c.rope_style = KVI_ROPE_HALVES;
	c.n_ff = 160;
	c.n_vocab = 301;
	return c;
}

/* Rows of whole K-quant super-blocks (256, 512), for the Q4_0 / K-quant types. */
static struct kvi_config cfg_kq(void)
{
	struct kvi_config c = ref_cfg_tiny_llama(203);
	strcpy(c.arch, "kq");
	c.n_embd = 256;
	c.n_head = 4;
	c.n_head_kv = 2;
	c.head_dim = 64;
	c.rope_dim = 64;
	c.n_ff = 512;
	return c;
}

static const enum kvi_dtype dtypes[] = {KVI_F32, KVI_F16, KVI_BF16, KVI_Q8_0};

static double tol_of(enum kvi_dtype wt)
{
	switch (wt) {
	case KVI_F32:
		return 2e-3;
	case KVI_F16:
		return 6e-3;
	case KVI_BF16:
		return 3e-2;
	default:
		return 6e-2;
	}
}

static const char *tname(enum kvi_dtype wt)
{
	switch (wt) {
	case KVI_F32:
		return "f32";
	case KVI_F16:
		return "f16";
	case KVI_BF16:
		return "bf16";
	case KVI_Q8_0:
		return "q8_0";
	case KVI_Q4_0:
		return "q4_0";
	case KVI_Q5_0:
		return "q5_0";
	case KVI_Q5_1:
		return "q5_1";
	case KVI_Q4_K:
		return "q4_k";
	case KVI_Q5_K:
		return "q5_k";
	case KVI_Q6_K:
		return "q6_k";
	}
	return "?";
}

static void opts(struct kvi_engine_opts *o, int chunk, int B)
{
	kvi_engine_opts_default(o);
	o->threads = 1;
	o->max_batch_tokens = chunk;
	o->block_tokens = B;
	o->max_ctx = 256;
	o->kv_blocks = 64;
	o->isa = KVK_ISA_SCALAR;
}

static struct kvi_engine *cpu_engine(const struct kvi_model *m, int chunk, int B)
{
	struct kvi_engine_opts o;
	opts(&o, chunk, B);
	struct kvi_engine *e = NULL;
	assert_int_equal(kvi_engine_create(m, &o, &e), 0);
	return e;
}

static struct kvi_dev_engine *dev_engine(const struct kvi_model *m, int chunk, int B)
{
	struct kvi_engine_opts o;
	opts(&o, chunk, B);
	struct kvi_dev_engine *e = NULL;
	assert_int_equal(kvi_dev_engine_create(m, &o, BACKEND, 0, &e), 0);
	return e;
}

/* An engine of either kind (cpu: the CPU engine), for the checks that run the same steps on
 * both. */
static struct fwdc_engine make_engine(const struct kvi_model *m, int cpu, int chunk, int B)
{
	struct fwdc_engine e = {cpu ? NULL : dev_engine(m, chunk, B),
				cpu ? cpu_engine(m, chunk, B) : NULL};
	return e;
}

/* Limit for logits after a prefix loaded from blocks of engine kind `from` into an engine of
 * kind `into` (1: the CPU engine) against into's own cold run: the same kind and blocks give
 * the same logits (exactly on the CPU, within SELF_TOL on the device); across kinds tol. */
static double cross_tol(int into, int from, double tol)
{
	return into == from ? (into ? 0 : SELF_TOL) : tol;
}

/* Top-1 minus top-2 logit. */
static double margin(const float *l, int n)
{
	int b = ref_argmax(l, n);
	double second = -INFINITY;
	for (int i = 0; i < n; i++)
		if (i != b && l[i] > second)
			second = l[i];
	return l[b] - second;
}

/* ---- logits against the CPU engine --------------------------------------------------------- */

enum { P = 40, P0 = 29 };

/* CPU engine: prefill P0 (chunk 8), then decode to P greedily; rows (P - P0 + 1, V) of
 * logits and the tokens fed (prompt, then the greedy picks). */
static void cpu_run(const struct kvi_model *m, int32_t *tok, float *rows)
{
	int V = m->cfg.n_vocab;
	struct kvi_engine *e = cpu_engine(m, 8, 16);
	struct kvi_seq *s;
	assert_int_equal(kvi_seq_create(kvi_engine_kv(e), &s), 0);
	assert_int_equal(kvi_engine_prefill(e, s, tok, P0, rows), 0);
	for (int i = P0; i < P; i++) {
		tok[i] = ref_argmax(rows + (size_t)(i - P0) * V, V);
		assert_int_equal(
		    kvi_engine_decode(e, &s, &tok[i], 1, rows + (size_t)(i - P0 + 1) * V), 0);
	}
	kvi_seq_destroy(s);
	kvi_engine_destroy(e);
}

static void check_vs_cpu(enum kvi_dtype wt)
{
	struct kvi_config cfgs[3] = {ref_cfg_tiny_llama(203), ref_cfg_tiny_qwen(), cfg_wide()};
	const int chunks[] = {64, 1, 5, 7};
	double tol = tol_of(wt);
	int kq = wt == KVI_Q4_0 || wt == KVI_Q5_0 || wt == KVI_Q5_1 || wt == KVI_Q4_K ||
		 wt == KVI_Q5_K || wt == KVI_Q6_K;
	if (QUICK && wt != KVI_F16 && wt != KVI_Q8_0 && wt != KVI_Q4_K)
		return;
	if (kq)
		cfgs[0] = cfg_kq();
	for (int ci = 0; ci < (QUICK || kq ? 1 : 3); ci++) {
		struct kvi_model *m = ref_model_random(&cfgs[ci], wt, 11 + (uint64_t)wt);
		assert_non_null(m);
		int V = cfgs[ci].n_vocab, R = P - P0 + 1;
		int32_t tok[P];
		ref_tokens(tok, P0, V, 5);
		float *cpu = malloc(sizeof(float) * V * R), *got = malloc(sizeof(float) * V);
		float *first = malloc(sizeof(float) * V);
		cpu_run(m, tok, cpu);
		double worst = 0, self = 0;
		int compared = 0, agreed = 0;
		for (size_t k = 0; k < (QUICK ? 2 : sizeof(chunks) / sizeof(chunks[0])); k++) {
			struct kvi_dev_engine *e = dev_engine(m, chunks[k], 16);
			struct kvi_seq *s;
			assert_int_equal(kvi_seq_create(kvi_dev_engine_kv(e), &s), 0);
			assert_int_equal(kvi_dev_engine_prefill(e, s, tok, P0, got), 0);
			worst = fmax(worst, ref_rel_err(got, cpu, V));
			if (k == 0)
				memcpy(first, got, sizeof(float) * V);
			else
				self = fmax(self, ref_rel_err(got, first, V));
			for (int i = P0; i < P; i++) {
				const float *ref = cpu + (size_t)(i - P0) * V;
				if (k == 0 &&
				    margin(ref, V) >
					2 * tol * fmax(1, fabs(ref[ref_argmax(ref, V)]))) {
					compared++;
					agreed += ref_argmax(got, V) == tok[i];
				}
				assert_int_equal(kvi_dev_engine_decode(e, &s, &tok[i], 1, got), 0);
				worst = fmax(worst, ref_rel_err(got, ref + V, V));
			}
			assert_int_equal(kvi_seq_len(s), P);
			kvi_seq_destroy(s);
			assert_int_equal(kvi_kv_n_free(kvi_dev_engine_kv(e)),
					 kvi_kv_n_blocks(kvi_dev_engine_kv(e)));
			kvi_dev_engine_destroy(e);
		}
		printf("  %-5s %-4s vs CPU engine: rel err %.2e (tol %.0e); chunks 1/5/7 vs 64: "
		       "%.2e; greedy %d/%d steps compared agree\n",
		       cfgs[ci].arch, tname(wt), worst, tol, self, agreed, compared);
		assert_true(worst <= tol);
		assert_true(self <= SELF_TOL);
		assert_int_equal(agreed, compared);
		/* the 256-wide kq model's logits are flatter: fewer steps clear the margin */
		assert_true(compared >= (kq ? 2 : (P - P0) / 2));
		free(cpu), free(got), free(first);
		ref_model_free(m);
	}
}

static void test_vs_cpu_f32(void **st)
{
	(void)st;
	check_vs_cpu(KVI_F32);
}

static void test_vs_cpu_f16(void **st)
{
	(void)st;
	check_vs_cpu(KVI_F16);
}

static void test_vs_cpu_bf16(void **st)
{
	(void)st;
	check_vs_cpu(KVI_BF16);
}

static void test_vs_cpu_q8_0(void **st)
{
	(void)st;
	check_vs_cpu(KVI_Q8_0);
}

/* Q4_0 / K-quant weights: the device dequantizes on the fly with f32 activations, the CPU
 * engine quantizes activations to int8 blocks: within the Q8_0 tolerance. */
static void test_vs_cpu_kq(void **st)
{
	(void)st;
	const enum kvi_dtype kts[] = {KVI_Q4_K, KVI_Q6_K, KVI_Q5_K, KVI_Q4_0, KVI_Q5_0, KVI_Q5_1};
	for (size_t i = 0; i < sizeof(kts) / sizeof(kts[0]); i++)
		check_vs_cpu(kts[i]);
}

/* Three sequences of different lengths decoded in one batch: each row as when decoded alone
 * (a fork, so copy on write of the shared last block runs on the device too), and as the CPU
 * engine's batch. */
static void test_decode_batch(void **st)
{
	(void)st;
	struct kvi_config c = ref_cfg_tiny_qwen();
	for (size_t di = DT_FIRST; di < DT_END; di++) {
		struct kvi_model *m = ref_model_random(&c, dtypes[di], 21);
		int V = c.n_vocab;
		struct kvi_dev_engine *e = dev_engine(m, 64, 16);
		struct kvi_engine *ce = cpu_engine(m, 64, 16);
		struct kvi_seq *s[3], *f[3], *cs[3];
		int32_t tok[3][40], next[3] = {1, 2, 3};
		float *alone = malloc(3 * V * 4), *batch = malloc(3 * V * 4),
		      *cpu = malloc(3 * V * 4);
		for (int i = 0; i < 3; i++) {
			ref_tokens(tok[i], 40, V, 100 + i);
			assert_int_equal(kvi_seq_create(kvi_dev_engine_kv(e), &s[i]), 0);
			assert_int_equal(kvi_dev_engine_prefill(e, s[i], tok[i], 10 + 13 * i, NULL),
					 0);
			assert_int_equal(kvi_seq_create(kvi_engine_kv(ce), &cs[i]), 0);
			assert_int_equal(kvi_engine_prefill(ce, cs[i], tok[i], 10 + 13 * i, NULL),
					 0);
		}
		for (int i = 0; i < 3; i++) {
			assert_int_equal(kvi_seq_fork(s[i], &f[i]), 0);
			assert_int_equal(
			    kvi_dev_engine_decode(e, &f[i], &next[i], 1, alone + i * V), 0);
		}
		/* the same batch split into passes of 2 + 1 (max_batch_tokens 2), on forks */
		struct kvi_dev_engine *e2 = dev_engine(m, 2, 16);
		struct kvi_seq *s2[3];
		float *split = malloc(3 * V * 4);
		for (int i = 0; i < 3; i++) {
			assert_int_equal(kvi_seq_create(kvi_dev_engine_kv(e2), &s2[i]), 0);
			assert_int_equal(
			    kvi_dev_engine_prefill(e2, s2[i], tok[i], 10 + 13 * i, NULL), 0);
		}
		assert_int_equal(kvi_dev_engine_decode(e2, s2, next, 3, split), 0);
		for (int i = 0; i < 3; i++)
			kvi_seq_destroy(s2[i]);
		kvi_dev_engine_destroy(e2);
		assert_int_equal(kvi_dev_engine_decode(e, s, next, 3, batch), 0);
		assert_int_equal(kvi_engine_decode(ce, cs, next, 3, cpu), 0);
		for (int i = 0; i < 3; i++)
			assert_true(ref_rel_err(split + i * V, batch + i * V, V) <= SELF_TOL);
		free(split);
		for (int i = 0; i < 3; i++) {
			assert_true(ref_rel_err(batch + i * V, alone + i * V, V) <= SELF_TOL);
			assert_true(ref_rel_err(batch + i * V, cpu + i * V, V) <=
				    tol_of(dtypes[di]));
			assert_int_equal(kvi_seq_len(s[i]), 11 + 13 * i);
		}
		struct kvi_seq *dup[2] = {s[0], s[0]};
		assert_int_equal(kvi_dev_engine_decode(e, dup, next, 2, batch), -EINVAL);
		for (int i = 0; i < 3; i++) {
			kvi_seq_destroy(s[i]);
			kvi_seq_destroy(f[i]);
			kvi_seq_destroy(cs[i]);
		}
		kvi_dev_engine_destroy(e);
		kvi_engine_destroy(ce);
		free(alone), free(batch), free(cpu);
		ref_model_free(m);
	}
}

/* A forked sequence continues differently from its parent (copy on write of the partly filled
 * block, on the device); each matches a cold device run of its own tokens. */
static void test_fork_cow(void **st)
{
	(void)st;
	struct kvi_config c = ref_cfg_tiny_llama(203);
	struct kvi_model *m = ref_model_random(&c, KVI_F16, 41);
	struct kvi_dev_engine *e = dev_engine(m, 64, 16);
	fwdc_fork_cow((struct fwdc_engine){.de = e}, c.n_vocab, SELF_TOL);
	kvi_dev_engine_destroy(e);
	ref_model_free(m);
}

/* Export (download from the device) -> import into a fresh device engine and into a CPU engine
 * (upload) -> attach -> prefill the tail: logits as the cold runs. Blocks exported by the CPU
 * engine load into the device engine too. */
static void test_export_import(void **st)
{
	(void)st;
	enum { N = 75, B = 16, NFULL = N / B };
	struct kvi_config c = ref_cfg_tiny_qwen();
	for (size_t di = DT_FIRST; di < DT_END; di++) {
		struct kvi_model *m = ref_model_random(&c, dtypes[di], 31);
		int V = c.n_vocab;
		double tol = tol_of(dtypes[di]);
		int32_t tok[N];
		ref_tokens(tok, N, V, 77);
		float *dcold = malloc(V * 4), *ccold = malloc(V * 4), *got = malloc(V * 4);
		uint8_t *dbuf = NULL, *cbuf = NULL;
		for (int side = 0; side < 2; side++) { /* 0: device engine exports, 1: CPU */
			struct fwdc_engine e = make_engine(m, side, 7, B);
			struct kvi_kv *kv = fwdc_kv(e);
			struct kvi_seq *s;
			assert_int_equal(kvi_seq_create(kv, &s), 0);
			assert_int_equal(fwdc_prefill(e, s, tok, N, side ? ccold : dcold), 0);
			size_t bb = kvi_kv_block_bytes(kv);
			uint8_t *buf = malloc(bb * NFULL);
			for (int b = 0; b < NFULL; b++)
				assert_int_equal(
				    kvi_kv_block_export(kv, kvi_seq_blocks(s)[b], buf + b * bb, bb),
				    (long)bb);
			*(side ? &cbuf : &dbuf) = buf;
			kvi_seq_destroy(s);
			fwdc_destroy(e);
		}
		assert_true(ref_rel_err(dcold, ccold, V) <= tol);
		/* into: 0 a device engine, 1 a CPU engine; from: 0 device blocks, 1 CPU blocks */
		for (int into = 0; into < 2; into++)
			for (int from = 0; from < 2; from++) {
				struct fwdc_engine e = make_engine(m, into, 64, B);
				struct kvi_kv *kv = fwdc_kv(e);
				size_t bb = kvi_kv_block_bytes(kv);
				int junk = kvi_kv_block_alloc(kv), ids[NFULL];
				for (int b = 0; b < NFULL; b++) {
					ids[b] = kvi_kv_block_alloc(kv);
					assert_int_equal(
					    kvi_kv_block_import(kv, ids[b],
								(from ? cbuf : dbuf) + b * bb, bb),
					    0);
				}
				struct kvi_seq *s;
				assert_int_equal(kvi_seq_create(kv, &s), 0);
				assert_int_equal(kvi_seq_attach(s, ids, NFULL, NFULL * B), 0);
				for (int b = 0; b < NFULL; b++)
					assert_int_equal(kvi_kv_block_unref(kv, ids[b]), 0);
				assert_int_equal(
				    fwdc_prefill(e, s, tok + NFULL * B, N - NFULL * B, got), 0);
				const float *cold = into ? ccold : dcold;
				double lim = cross_tol(into, from, tol);
				assert_true(ref_rel_err(got, cold, V) <= lim);
				kvi_seq_destroy(s);
				assert_int_equal(kvi_kv_block_unref(kv, junk), 0);
				fwdc_destroy(e);
			}
		free(dbuf), free(cbuf), free(dcold), free(ccold), free(got);
		ref_model_free(m);
	}
}

/* Both backend tables are complete (a missing op would only show on a GPU), and opening cuda
 * without a GPU is a clean -ENODEV. */
static void test_backend_tables(void **st)
{
	(void)st;
	const struct kvk_dev_ops *t[2] = {&kvk_dev_host_ops, &kvk_dev_cuda_ops};
	for (int i = 0; i < 2; i++) {
		const struct kvk_dev_ops *o = t[i];
		assert_non_null(o->name);
		const void *fns[] = {
		    (const void *)o->alloc,	  (const void *)o->free,
		    (const void *)o->h2d,	  (const void *)o->d2h,
		    (const void *)o->d2d,	  (const void *)o->memset,
		    (const void *)o->sync,	  (const void *)o->embed,
		    (const void *)o->rmsnorm,	  (const void *)o->rope,
		    (const void *)o->swiglu,	  (const void *)o->add,
		    (const void *)o->add_bias,	  (const void *)o->convert,
		    (const void *)o->gemm,	  (const void *)o->q8_0_gemv,
		    (const void *)o->kq_gemv,	  (const void *)o->attn_prefill,
		    (const void *)o->attn_decode, (const void *)o->kv_store,
		    (const void *)o->argmax,	  (const void *)o->kv_pack,
		    (const void *)o->kv_unpack,
		};
		for (size_t k = 0; k < sizeof(fns) / sizeof(fns[0]); k++)
			assert_non_null(fns[k]);
	}
	assert_int_equal(kvk_dev_parse("host"), KVK_DEV_HOST);
	assert_int_equal(kvk_dev_parse("cuda"), KVK_DEV_CUDA);
	assert_int_equal(kvk_dev_parse("gpu"), -EINVAL);
	struct kvk_dev d;
	assert_int_equal(kvk_dev_open(&d, 7, 0), -EINVAL);
	if (kvk_cuda_device_count() == 0) {
		assert_int_equal(kvk_dev_open(&d, KVK_DEV_CUDA, 0), -ENODEV);
		assert_null(d.op);
		kvk_dev_close(&d);
	}
	assert_int_equal(kvk_dev_open(&d, KVK_DEV_CUDA, -1), -ENODEV);
	/* the host backend's memory ops round-trip */
	assert_int_equal(kvk_dev_open(&d, KVK_DEV_HOST, 0), 0);
	void *p;
	char in[300], out[300];
	for (int i = 0; i < 300; i++)
		in[i] = (char)i;
	assert_int_equal(d.op->alloc(&d, &p, sizeof(in)), 0);
	assert_int_equal(d.op->h2d(&d, p, in, sizeof(in)), 0);
	assert_int_equal(d.op->d2h(&d, out, p, sizeof(out)), 0);
	assert_memory_equal(in, out, sizeof(in));
	d.op->free(&d, p);
	kvk_dev_close(&d);
}

/* Injected input embeddings on the device (fwd_checks.h, fwdc_inject): the rows uploaded
 * over their positions across prefill chunks, within SELF_TOL (exact on the host backend). */
static void test_inject(void **st)
{
	(void)st;
	struct kvi_config c = ref_cfg_tiny_llama(203);
	struct kvi_model *m = ref_model_random(&c, KVI_F16, 31);
	struct fwdc_engine e = make_engine(m, 0, 7, 16);
	fwdc_inject(e, m, SELF_TOL);
	fwdc_destroy(e);
	ref_model_free(m);
}

static void test_errors(void **st)
{
	(void)st;
	struct kvi_config c = ref_cfg_tiny_llama(203);
	struct kvi_model *m = ref_model_random(&c, KVI_F32, 61);
	struct kvi_engine_opts o;
	opts(&o, 64, 16);
	o.max_ctx = 40;
	o.kv_blocks = 3;
	struct kvi_dev_engine *e;
	assert_int_equal(kvi_dev_engine_create(m, &o, BACKEND, 0, &e), 0);
	fwdc_limits((struct fwdc_engine){.de = e}, c.n_vocab);
	/* a sequence of another engine's kv */
	struct kvi_seq *s;
	int32_t t[5] = {0};
	struct kvi_engine *ce = cpu_engine(m, 64, 16);
	assert_int_equal(kvi_seq_create(kvi_engine_kv(ce), &s), 0);
	assert_int_equal(kvi_dev_engine_prefill(e, s, t, 5, NULL), -EINVAL);
	assert_int_equal(kvi_dev_engine_decode(e, &s, t, 1, NULL), -EINVAL);
	kvi_seq_destroy(s);
	kvi_engine_destroy(ce);
	kvi_dev_engine_destroy(e);

	/* a wrong shape, an odd head_dim, a bad backend are refused at create */
	struct kvi_tensor saved = m->layers[1].wk;
	m->layers[1].wk.ne[1] = 7;
	assert_int_equal(kvi_dev_engine_create(m, &o, BACKEND, 0, &e), -EINVAL);
	m->layers[1].wk = saved;
	assert_int_equal(kvi_dev_engine_create(m, &o, 99, 0, &e), -EINVAL);
	assert_null(e);
	ref_model_free(m);
	struct kvi_config odd = ref_cfg_odd();
	m = ref_model_random(&odd, KVI_F32, 62);
	assert_int_equal(kvi_dev_engine_create(m, &o, BACKEND, 0, &e), -EINVAL);
	ref_model_free(m);
	/* cuda without a GPU (or without CUDA in the build): -ENODEV, no crash */
	if (kvk_cuda_device_count() == 0) {
		m = ref_model_random(&c, KVI_F16, 63);
		assert_int_equal(kvi_dev_engine_create(m, &o, KVK_DEV_CUDA, 0, &e), -ENODEV);
		assert_null(e);
		ref_model_free(m);
	}
}

#ifndef KVFS_TEST_NO_KVX
/* ---- the KV connector on a local directory ---------------------------------------------- */

static char ROOT[256];

/* Engine e + kvx on dir: load the prefix, prefill the rest, save, flush. Returns the cached
 * token count; logits after the prompt into l. */
static int kvx_run(struct fwdc_engine e, const struct kvi_model *m, const char *dir,
		   const int32_t *prompt, int n, float *l, struct kvx_stats *st)
{
	struct kvi_kv *kv = fwdc_kv(e);
	struct kvx_opts xo;
	kvx_opts_default(&xo);
	xo.dir = dir;
	xo.queue_depth = 4;
	struct kvx *x = NULL;
	assert_int_equal(kvx_create_kv(kv, m, &xo, &x), 0);
	struct kvi_seq *s;
	assert_int_equal(kvi_seq_create(kv, &s), 0);
	int cached = 0;
	assert_int_equal(kvx_load_prefix(x, s, prompt, n, NULL, &cached), 0);
	assert_int_equal(kvi_seq_len(s), cached);
	assert_int_equal(fwdc_prefill(e, s, prompt + cached, n - cached, l), 0);
	assert_true(kvx_save(x, s, prompt, n, NULL) >= 0);
	kvx_flush(x);
	kvx_stats_get(x, st);
	kvi_seq_destroy(s);
	kvx_destroy(x);
	return cached;
}

/* Save with the device engine; load into a fresh device engine and into a CPU engine; and the
 * other way round: cached tokens > 0 and logits as the cold runs. */
static void test_kvx_roundtrip(void **st)
{
	(void)st;
	enum { B = 16, N = 100, HIT = (N - 1) / B * B };
	struct kvi_config c = ref_cfg_tiny_llama(203);
	for (size_t di = DT_FIRST; di < DT_END; di++) {
		struct kvi_model *m = ref_model_random(&c, dtypes[di], 71);
		int V = c.n_vocab;
		double tol = tol_of(dtypes[di]);
		int32_t tok[N];
		ref_tokens(tok, N, V, 9);
		float *dcold = malloc(V * 4), *ccold = malloc(V * 4), *got = malloc(V * 4);
		char ddir[300], cdir[300];
		snprintf(ddir, sizeof(ddir), "%s/dev%zu", ROOT, di);
		snprintf(cdir, sizeof(cdir), "%s/cpu%zu", ROOT, di);
		assert_int_equal(mkdir(ddir, 0755), 0);
		assert_int_equal(mkdir(cdir, 0755), 0);
		struct kvx_stats xs;

		struct fwdc_engine e = make_engine(m, 0, 8, B);
		assert_int_equal(kvx_run(e, m, ddir, tok, N, dcold, &xs), 0);
		assert_int_equal((int)xs.saved_blocks, N / B);
		assert_int_equal((int)xs.save_errors, 0);
		fwdc_destroy(e);
		e = make_engine(m, 1, 8, B);
		assert_int_equal(kvx_run(e, m, cdir, tok, N, ccold, &xs), 0);
		assert_int_equal((int)xs.saved_blocks, N / B);
		fwdc_destroy(e);
		assert_true(ref_rel_err(dcold, ccold, V) <= tol);

		for (int into = 0; into < 2; into++)
			for (int from = 0; from < 2; from++) {
				e = make_engine(m, into, 64, B);
				int cached = kvx_run(e, m, from ? cdir : ddir, tok, N, got, &xs);
				assert_int_equal(cached, HIT);
				assert_int_equal((int)xs.hit_blocks, HIT / B);
				const float *cold = into ? ccold : dcold;
				double lim = cross_tol(into, from, tol);
				double err = ref_rel_err(got, cold, V);
				if (err > lim)
					printf("  %s into %s from %s: err %.3g > %.3g\n",
					       tname(dtypes[di]), into ? "cpu" : "dev",
					       from ? "cpu" : "dev", err, lim);
				assert_true(err <= lim);
				fwdc_destroy(e);
			}
		free(dcold), free(ccold), free(got);
		ref_model_free(m);
	}
}
#endif

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "--cuda")) {
		if (kvk_cuda_device_count() == 0) {
			printf("skipped: no GPU (or no CUDA in this build)\n");
			return 77;
		}
		BACKEND = KVK_DEV_CUDA;
		SELF_TOL = 1e-3;
	}
	const char *q = getenv("KVK_TEST_QUICK");
	QUICK = q && *q;
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_vs_cpu_f32),	  cmocka_unit_test(test_vs_cpu_f16),
	    cmocka_unit_test(test_vs_cpu_bf16),	  cmocka_unit_test(test_vs_cpu_q8_0),
	    cmocka_unit_test(test_vs_cpu_kq),	  cmocka_unit_test(test_decode_batch),
	    cmocka_unit_test(test_fork_cow),	  cmocka_unit_test(test_export_import),
	    cmocka_unit_test(test_errors),	  cmocka_unit_test(test_backend_tables),
	    cmocka_unit_test(test_inject),
#ifndef KVFS_TEST_NO_KVX
	    cmocka_unit_test(test_kvx_roundtrip),
#endif
	};
#ifndef KVFS_TEST_NO_KVX
	snprintf(ROOT, sizeof(ROOT), "/tmp/test_fwd_dev.XXXXXX");
	if (!mkdtemp(ROOT))
		return 1;
#endif
	int r = cmocka_run_group_tests_name(
	    BACKEND == KVK_DEV_CUDA ? "fwd_dev on cuda" : "fwd_dev on host", tests, NULL, NULL);
#ifndef KVFS_TEST_NO_KVX
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", ROOT);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", ROOT);
#endif
	return r;
}
