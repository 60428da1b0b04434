/* Tests for engine/fwd: the optimized forward pass against the scalar reference (ref_fwd.c)
 * for every weight type and both ISAs, and bit-identical logits (memcmp) across prefill chunk
 * sizes, prefill vs decode, thread counts, decode batches, KV export/import and forks.
 *
 * Tolerance against the reference (stated in docs/engine.md): max |engine - ref| over a
 * logits row <= TOL * max(1, max |ref|), TOL = 2e-3 for F32/F16/BF16 weights (the engine
 * keeps K/V in f16 and sums in f32) and 6e-2 for Q8_0 (the engine also quantizes activations
 * to 8 bits per block of 32, as llama.cpp does; the reference does not). */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "build_tutil.h"
#include "fwd.h"
#include "fwd_checks.h"
#include "kvk.h"
#include "kvk_matmul_impl.h"
#include "model.h"
#include "ref_fwd.h"

static const enum kvi_dtype dtypes[] = {KVI_F32, KVI_F16, KVI_BF16, KVI_Q8_0};

static struct kvi_engine *engine(const struct kvi_model *m, int threads, int chunk, int B, int isa)
{
	struct kvi_engine_opts o;
	kvi_engine_opts_default(&o);
	o.threads = threads;
	o.max_batch_tokens = chunk;
	o.block_tokens = B;
	o.max_ctx = 256;
	o.kv_blocks = 64;
	o.isa = isa;
	struct kvi_engine *e = NULL;
	assert_int_equal(kvi_engine_create(m, &o, &e), 0);
	return e;
}

/* Prefill P0 tokens (chunk 8), decode the rest one by one; every logits row against the
 * reference's. Returns the worst relative error. */
static double vs_reference_model(const struct kvi_model *m, int isa)
{
	enum { P = 40, P0 = 29 };
	const struct kvi_config *c = &m->cfg;
	int V = c->n_vocab;
	int32_t tok[P];
	ref_tokens(tok, P, V, 5);
	float *ref = malloc(sizeof(float) * V * P), *got = malloc(sizeof(float) * V);
	struct ref_fwd *r;
	assert_int_equal(ref_fwd_create(m, P, &r), 0);
	for (int i = 0; i < P; i++)
		ref_fwd_step(r, tok[i], ref + (size_t)i * V);
	ref_fwd_destroy(r);

	struct kvi_engine *e = engine(m, 2, 8, 16, isa);
	struct kvi_seq *s;
	assert_int_equal(kvi_seq_create(kvi_engine_kv(e), &s), 0);
	assert_int_equal(kvi_engine_prefill(e, s, tok, P0, got), 0);
	double worst = ref_rel_err(got, ref + (size_t)(P0 - 1) * V, V);
	for (int i = P0; i < P; i++) {
		assert_int_equal(kvi_engine_decode(e, &s, &tok[i], 1, got), 0);
		worst = fmax(worst, ref_rel_err(got, ref + (size_t)i * V, V));
	}
	assert_int_equal(kvi_seq_len(s), P);
	kvi_seq_destroy(s);
	kvi_engine_destroy(e);
	free(ref);
	free(got);
	return worst;
}

static double vs_reference(const struct kvi_config *c, enum kvi_dtype wt, int isa)
{
	struct kvi_model *m = ref_model_random(c, wt, 11 + (uint64_t)wt);
	assert_non_null(m);
	double worst = vs_reference_model(m, isa);
	ref_model_free(m);
	return worst;
}

static void check_vs_reference(enum kvi_dtype wt)
{
	double tol = wt == KVI_Q8_0 ? 6e-2 : 2e-3;
	struct kvi_config cfgs[3] = {ref_cfg_tiny_llama(203), ref_cfg_tiny_qwen(), ref_cfg_odd()};
	int ncfg = wt == KVI_Q8_0 ? 2 : 3;
	int isas[2] = {KVK_ISA_SCALAR, kvk_isa_best()};
	for (int ci = 0; ci < ncfg; ci++)
		for (int ii = 0; ii < 2; ii++) {
			double err = vs_reference(&cfgs[ci], wt, isas[ii]);
			printf("  type %2d %-5s %-6s rel err %.2e (tol %.0e)\n", wt, cfgs[ci].arch,
			       kvk_isa_name(isas[ii]), err, tol);
			assert_true(err <= tol);
		}
}

static void test_ref_f32(void **st)
{
	(void)st;
	check_vs_reference(KVI_F32);
}

static void test_ref_f16(void **st)
{
	(void)st;
	check_vs_reference(KVI_F16);
}

static void test_ref_bf16(void **st)
{
	(void)st;
	check_vs_reference(KVI_BF16);
}

static void test_ref_q8_0(void **st)
{
	(void)st;
	check_vs_reference(KVI_Q8_0);
}

/* kvinfer-synth's quantized file types (preset "small": 4 layers, rows of 256 and 768) load
 * with llama.cpp's tensor mix and give logits within the Q8_0 tolerance of the reference
 * (which computes with the dequantized weights and f32 activations), on both ISAs. */
static void test_ref_synth_quant(void **st)
{
	(void)st;
	const char *bd = tu_need_build_dir();
	static const struct {
		const char *type;
		enum kvi_dtype base, more; /* attn_v / ffn_down in layers 2 and 3 of 4 */
	} F[] = {{"q4_k_m", KVI_Q4_K, KVI_Q6_K},
		 {"q5_k_m", KVI_Q5_K, KVI_Q6_K},
		 {"q4_0", KVI_Q4_0, KVI_Q4_0}};
	for (size_t fi = 0; fi < sizeof(F) / sizeof(F[0]); fi++) {
		char path[64] = "/tmp/test_fwd_synth_XXXXXX", cmd[512], err[256];
		int fd = mkstemp(path);
		assert_true(fd >= 0);
		close(fd);
		snprintf(
		    cmd, sizeof(cmd),
		    "%s/tools/kvinfer-synth --preset small --type %s --seed 3 -o %s >/dev/null", bd,
		    F[fi].type, path);
		assert_int_equal(system(cmd), 0);
		struct kvi_model *m = NULL;
		int rc = kvi_model_load(path, &m, err, sizeof(err));
		unlink(path);
		if (rc)
			fail_msg("%s: %s", F[fi].type, err);
		/* llama.cpp's choices (llama-quant.cpp): output Q6_K, use_more_bits layers */
		assert_int_equal(m->output.type, KVI_Q6_K);
		assert_int_equal(m->tok_embd.type, F[fi].base);
		for (int l = 0; l < 4; l++) {
			enum kvi_dtype more = l >= 2 ? F[fi].more : F[fi].base;
			assert_int_equal(m->layers[l].wq.type, F[fi].base);
			assert_int_equal(m->layers[l].w_up.type, F[fi].base);
			assert_int_equal(m->layers[l].wv.type, more);
			assert_int_equal(m->layers[l].w_down.type, more);
		}
		int isas[2] = {KVK_ISA_SCALAR, kvk_isa_best()};
		for (int ii = 0; ii < 2; ii++) {
			double e = vs_reference_model(m, isas[ii]);
			printf("  %-6s %-6s rel err %.2e (tol 6e-2)\n", F[fi].type,
			       kvk_isa_name(isas[ii]), e);
			assert_true(e <= 6e-2);
		}
		kvi_model_free(m);
	}
	/* 64-wide presets: llama.cpp's fallbacks give Q5_0 (q4_k_m) and Q5_1 (q5_k_m) */
	static const struct {
		const char *preset, *type;
		enum kvi_dtype want;
	} G[] = {{"tiny", "q4_k_m", KVI_Q5_0}, {"tiny-qwen2", "q5_k_m", KVI_Q5_1}};
	for (size_t gi = 0; gi < 2; gi++) {
		char path[64] = "/tmp/test_fwd_synth_XXXXXX", cmd[512], err[256];
		int fd = mkstemp(path);
		assert_true(fd >= 0);
		close(fd);
		snprintf(cmd, sizeof(cmd),
			 "%s/tools/kvinfer-synth --preset %s --type %s --seed 4 -o %s >/dev/null",
			 bd, G[gi].preset, G[gi].type, path);
		assert_int_equal(system(cmd), 0);
		struct kvi_model *m = NULL;
		int rc = kvi_model_load(path, &m, err, sizeof(err));
		unlink(path);
		if (rc)
			fail_msg("%s: %s", G[gi].type, err);
		assert_int_equal(m->layers[0].wq.type, G[gi].want);
		int isas[2] = {KVK_ISA_SCALAR, kvk_isa_best()};
		for (int ii = 0; ii < 2; ii++) {
			double e = vs_reference_model(m, isas[ii]);
			printf("  %-10s %-6s %-6s rel err %.2e (tol 6e-2)\n", G[gi].preset,
			       G[gi].type, kvk_isa_name(isas[ii]), e);
			assert_true(e <= 6e-2);
		}
		kvi_model_free(m);
	}
}

/* Prefill n tokens with the given chunk/threads; last logits and every KV block's bytes. */
static void run_prefill(const struct kvi_model *m, const int32_t *tok, int n, int chunk,
			int threads, float *logits, uint8_t *kvbytes)
{
	struct kvi_engine *e = engine(m, threads, chunk, 16, 0);
	struct kvi_kv *kv = kvi_engine_kv(e);
	struct kvi_seq *s;
	assert_int_equal(kvi_seq_create(kv, &s), 0);
	assert_int_equal(kvi_engine_prefill(e, s, tok, n, logits), 0);
	size_t bb = kvi_kv_block_bytes(kv);
	int full = n / 16;
	for (int b = 0; b < full; b++)
		assert_int_equal(
		    kvi_kv_block_export(kv, kvi_seq_blocks(s)[b], kvbytes + b * bb, bb), (long)bb);
	kvi_seq_destroy(s);
	kvi_engine_destroy(e);
}

/* Prefill with injected input embeddings, exactly as prefilling the ids the rows embed
 * (fwd_checks.h, fwdc_inject). */
static void test_inject(void **st)
{
	(void)st;
	struct kvi_config c = ref_cfg_tiny_llama(203);
	struct kvi_model *m = ref_model_random(&c, KVI_F16, 31);
	struct fwdc_engine e = {NULL, engine(m, 2, 7, 16, 0)};
	fwdc_inject(e, m, -1);
	fwdc_destroy(e);
	ref_model_free(m);
}

/* Prefilling n tokens of m (seeded by seed) gives the last logits and KV block bytes it gives
 * with chunk 64 on one thread with every (chunks[i], threads[i]) of nrun, and the same logits
 * when the last token goes through decode after a prefill of the others. */
static void check_chunk_invariance(const struct kvi_model *m, int n, unsigned seed,
				   const int *chunks, const int *threads, int nrun)
{
	int V = m->cfg.n_vocab;
	int32_t *tok = malloc((size_t)n * sizeof(*tok));
	assert_non_null(tok);
	ref_tokens(tok, n, V, seed);
	size_t bb = (size_t)m->cfg.n_layer * 2 * 16 * m->cfg.n_head_kv * m->cfg.head_dim * 2;
	float *l0 = malloc(V * 4), *l1 = malloc(V * 4);
	uint8_t *k0 = malloc(bb * (n / 16)), *k1 = malloc(bb * (n / 16));
	run_prefill(m, tok, n, 64, 1, l0, k0);
	for (int i = 0; i < nrun; i++) {
		run_prefill(m, tok, n, chunks[i], threads[i], l1, k1);
		assert_memory_equal(l0, l1, (size_t)V * 4);
		assert_memory_equal(k0, k1, bb * (n / 16));
	}
	struct kvi_engine *e = engine(m, 2, 64, 16, 0);
	struct kvi_seq *s;
	assert_int_equal(kvi_seq_create(kvi_engine_kv(e), &s), 0);
	assert_int_equal(kvi_engine_prefill(e, s, tok, n - 1, NULL), 0);
	assert_int_equal(kvi_engine_decode(e, &s, &tok[n - 1], 1, l1), 0);
	assert_memory_equal(l0, l1, (size_t)V * 4);
	kvi_seq_destroy(s);
	kvi_engine_destroy(e);
	free(l0), free(l1), free(k0), free(k1), free(tok);
}

static void test_chunk_invariance(void **st)
{
	(void)st;
	struct kvi_config cfgs[3] = {ref_cfg_tiny_llama(203), ref_cfg_tiny_qwen(), ref_cfg_odd()};
	const int chunks[] = {1, 7, 64, 5};
	const int threads[] = {1, 2, 2, 2};
	for (int ci = 0; ci < 3; ci++)
		for (size_t di = 0; di < 4; di++) {
			if (ci == 2 && dtypes[di] == KVI_Q8_0)
				continue;
			struct kvi_model *m = ref_model_random(&cfgs[ci], dtypes[di], 3 + di);
			check_chunk_invariance(m, 100, 9, chunks, threads, 4);
			ref_model_free(m);
		}
}

/* Long prefix, 64-wide heads, blocks of 128: the attention's 64-key tiles end inside blocks
 * and its 16-token query tiles start at every offset; logits equal for chunks 1, 9, 64, 80 on
 * 1 or 2 threads and through decode (kvk_flash_attn_f16's batch invariance in the engine). */
static void test_chunk_invariance_long(void **st)
{
	(void)st;
	enum { N = 200, B = 128 };
	struct kvi_config c = ref_cfg_tiny_llama(203);
	c.head_dim = 64;
	c.rope_dim = 64;
	struct kvi_model *m = ref_model_random(&c, KVI_F16, 7);
	int V = c.n_vocab;
	int32_t tok[N];
	ref_tokens(tok, N, V, 13);
	float *l0 = malloc(V * 4), *l1 = malloc(V * 4);
	const int chunks[] = {64, 1, 9, 80}, threads[] = {1, 2, 1, 2};
	for (int i = 0; i < 4; i++) {
		struct kvi_engine *e = engine(m, threads[i], chunks[i], B, 0);
		struct kvi_seq *s;
		assert_int_equal(kvi_seq_create(kvi_engine_kv(e), &s), 0);
		assert_int_equal(kvi_engine_prefill(e, s, tok, N, i ? l1 : l0), 0);
		if (i)
			assert_memory_equal(l0, l1, (size_t)V * 4);
		kvi_seq_destroy(s);
		kvi_engine_destroy(e);
	}
	struct kvi_engine *e = engine(m, 2, 64, B, 0);
	struct kvi_seq *s;
	assert_int_equal(kvi_seq_create(kvi_engine_kv(e), &s), 0);
	assert_int_equal(kvi_engine_prefill(e, s, tok, N - 1, NULL), 0);
	assert_int_equal(kvi_engine_decode(e, &s, &tok[N - 1], 1, l1), 0);
	assert_memory_equal(l0, l1, (size_t)V * 4);
	kvi_seq_destroy(s);
	kvi_engine_destroy(e);
	free(l0), free(l1);
	ref_model_free(m);
}

/* A Q4_K_M file (Q4_K and Q6_K matmuls: the AVX-512 panel kernels where the CPU has them)
 * gives the same logits whatever the prefill chunk and thread count, and through decode. */
static void test_chunk_invariance_q4km(void **st)
{
	(void)st;
	const char *bd = tu_need_build_dir();
	char path[64] = "/tmp/test_fwd_q4km_XXXXXX", cmd[512], err[256];
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	close(fd);
	snprintf(cmd, sizeof(cmd),
		 "%s/tools/kvinfer-synth --preset small --type q4_k_m --seed 5 -o %s >/dev/null",
		 bd, path);
	assert_int_equal(system(cmd), 0);
	struct kvi_model *m = NULL;
	int rc = kvi_model_load(path, &m, err, sizeof(err));
	unlink(path);
	if (rc)
		fail_msg("q4_k_m: %s", err);
	const int chunks[] = {1, 9, 80};
	const int threads[] = {2, 2, 1};
	check_chunk_invariance(m, 80, 11, chunks, threads, 3);
	kvi_model_free(m);
}

/* Three sequences decoded in one batch give the logits each gets alone. */
static void test_decode_batch(void **st)
{
	(void)st;
	struct kvi_config c = ref_cfg_tiny_qwen();
	for (size_t di = 0; di < 4; di++) {
		struct kvi_model *m = ref_model_random(&c, dtypes[di], 21);
		int V = c.n_vocab;
		struct kvi_engine *e = engine(m, 2, 64, 16, 0);
		struct kvi_seq *s[3];
		int32_t tok[3][40], next[3] = {1, 2, 3};
		float *alone = malloc(3 * V * 4), *batch = malloc(3 * V * 4);
		for (int i = 0; i < 3; i++) {
			ref_tokens(tok[i], 40, V, 100 + i);
			assert_int_equal(kvi_seq_create(kvi_engine_kv(e), &s[i]), 0);
			assert_int_equal(kvi_engine_prefill(e, s[i], tok[i], 10 + 13 * i, NULL), 0);
		}
		struct kvi_seq *f[3];
		for (int i = 0; i < 3; i++) {
			assert_int_equal(kvi_seq_fork(s[i], &f[i]), 0);
			assert_int_equal(kvi_engine_decode(e, &f[i], &next[i], 1, alone + i * V),
					 0);
		}
		assert_int_equal(kvi_engine_decode(e, s, next, 3, batch), 0);
		assert_memory_equal(alone, batch, (size_t)3 * V * 4);
		/* the same sequence twice in one batch is refused */
		struct kvi_seq *dup[2] = {s[0], s[0]};
		assert_int_equal(kvi_engine_decode(e, dup, next, 2, batch), -EINVAL);
		for (int i = 0; i < 3; i++) {
			kvi_seq_destroy(s[i]);
			kvi_seq_destroy(f[i]);
		}
		kvi_engine_destroy(e);
		free(alone), free(batch);
		ref_model_free(m);
	}
}

/* Greedy: prompt, then gen tokens; writes the tokens and the last logits. */
static void greedy(struct kvi_engine *e, struct kvi_seq *s, const int32_t *prompt, int n, int gen,
		   int32_t *out, float *logits)
{
	int V = kvi_engine_config(e)->n_vocab;
	assert_int_equal(kvi_engine_prefill(e, s, prompt, n, logits), 0);
	for (int i = 0; i < gen; i++) {
		out[i] = ref_argmax(logits, V);
		assert_int_equal(kvi_engine_decode(e, &s, &out[i], 1, logits), 0);
	}
}

/* Export the full blocks of a prefix, import them into a fresh engine, attach, prefill the
 * tail and decode: the same tokens and bit-identical logits as a cold run. */
static void test_kv_export_import(void **st)
{
	(void)st;
	enum { N = 75, GEN = 12, B = 16 };
	struct kvi_config cfgs[2] = {ref_cfg_tiny_llama(203), ref_cfg_tiny_qwen()};
	for (int ci = 0; ci < 2; ci++)
		for (size_t di = 0; di < 4; di++) {
			struct kvi_model *m = ref_model_random(&cfgs[ci], dtypes[di], 31);
			int V = cfgs[ci].n_vocab;
			int32_t tok[N], cold[GEN], warm[GEN];
			ref_tokens(tok, N, V, 77);
			float *lc = malloc(V * 4), *lw = malloc(V * 4);

			struct kvi_engine *e = engine(m, 2, 64, B, 0);
			struct kvi_kv *kv = kvi_engine_kv(e);
			struct kvi_seq *s;
			assert_int_equal(kvi_seq_create(kv, &s), 0);
			greedy(e, s, tok, N, GEN, cold, lc);
			int nfull = N / B;
			size_t bb = kvi_kv_block_bytes(kv);
			uint8_t *buf = malloc(bb * nfull);
			for (int b = 0; b < nfull; b++)
				assert_int_equal(
				    kvi_kv_block_export(kv, kvi_seq_blocks(s)[b], buf + b * bb, bb),
				    (long)bb);
			kvi_seq_destroy(s);
			kvi_engine_destroy(e);

			/* a different engine (other threads/chunk), blocks in other slots */
			e = engine(m, 1, 7, B, 0);
			kv = kvi_engine_kv(e);
			int junk = kvi_kv_block_alloc(kv);
			assert_true(junk >= 0);
			int32_t ids[8];
			for (int b = 0; b < nfull; b++) {
				ids[b] = kvi_kv_block_alloc(kv);
				assert_true(ids[b] >= 0);
				assert_int_equal(kvi_kv_block_import(kv, ids[b], buf + b * bb, bb),
						 0);
			}
			assert_int_equal(kvi_seq_create(kv, &s), 0);
			assert_int_equal(kvi_seq_attach(s, ids, nfull, nfull * B), 0);
			for (int b = 0; b < nfull; b++) /* the sequence holds them now */
				assert_int_equal(kvi_kv_block_unref(kv, ids[b]), 0);
			greedy(e, s, tok + nfull * B, N - nfull * B, GEN, warm, lw);
			assert_memory_equal(cold, warm, sizeof(cold));
			assert_memory_equal(lc, lw, (size_t)V * 4);
			kvi_seq_destroy(s);
			assert_int_equal(kvi_kv_block_unref(kv, junk), 0);
			assert_int_equal(kvi_kv_n_free(kv), kvi_kv_n_blocks(kv));
			kvi_engine_destroy(e);
			free(buf), free(lc), free(lw);
			ref_model_free(m);
		}
}

/* A forked sequence shares the prefix; both continue differently (copy on write of the
 * partly filled block) and each matches a cold run of its own tokens. */
static void test_fork_cow(void **st)
{
	(void)st;
	struct kvi_config c = ref_cfg_tiny_llama(203);
	struct kvi_model *m = ref_model_random(&c, KVI_F16, 41);
	struct kvi_engine *e = engine(m, 2, 64, 16, 0);
	fwdc_fork_cow((struct fwdc_engine){.ce = e}, c.n_vocab, -1);
	kvi_engine_destroy(e);
	ref_model_free(m);
}

static void test_greedy_deterministic(void **st)
{
	(void)st;
	struct kvi_config c = ref_cfg_tiny_qwen();
	struct kvi_model *m = ref_model_random(&c, KVI_Q8_0, 51);
	int V = c.n_vocab;
	int32_t p[20], g1[30], g2[30];
	ref_tokens(p, 20, V, 3);
	float *l = malloc(V * 4), *l1 = malloc(V * 4);
	for (int run = 0; run < 2; run++) {
		struct kvi_engine *e = engine(m, 1 + run, 64, 16, 0);
		struct kvi_seq *s;
		assert_int_equal(kvi_seq_create(kvi_engine_kv(e), &s), 0);
		greedy(e, s, p, 20, 30, run ? g2 : g1, run ? l : l1);
		kvi_seq_destroy(s);
		kvi_engine_destroy(e);
	}
	assert_memory_equal(g1, g2, sizeof(g1));
	assert_memory_equal(l, l1, (size_t)V * 4);
	free(l1);
	free(l);
	ref_model_free(m);
}

static void test_errors(void **st)
{
	(void)st;
	struct kvi_config c = ref_cfg_tiny_llama(203);
	struct kvi_model *m = ref_model_random(&c, KVI_F32, 61);
	struct kvi_engine_opts o;
	kvi_engine_opts_default(&o);
	o.max_ctx = 40;
	o.block_tokens = 16;
	o.kv_blocks = 3;
	struct kvi_engine *e;
	assert_int_equal(kvi_engine_create(m, &o, &e), 0);
	fwdc_limits((struct fwdc_engine){.ce = e}, c.n_vocab);
	kvi_engine_destroy(e);

	/* a wrong shape is refused at create, not crashed on later */
	struct kvi_tensor saved = m->layers[1].wk;
	m->layers[1].wk.ne[1] = 7;
	assert_int_equal(kvi_engine_create(m, &o, &e), -EINVAL);
	m->layers[1].wk = saved;
	m->layers[0].w_up.nbytes /= 2;
	assert_int_equal(kvi_engine_create(m, &o, &e), -EINVAL);
	m->layers[0].w_up.nbytes *= 2;
	ref_model_free(m);
}

enum { INV_ROWS = 37, INV_T = 13 };

/* For one ISA: the whole batch (rows split unevenly in two calls) into yb, each token alone
 * bit-identical to its batch row, within f32 rounding of the scalar ys, and batches of 2..5
 * from the middle bit-identical too. act holds x prepared for INV_T tokens on return. */
static void check_isa_invariance(int isa, enum kvk_wtype wt, size_t n, const void *w,
				 const float *x, float *yb, float *y1, float *ys, float *scr,
				 void *act, void *act1)
{
	enum { ROWS = INV_ROWS, T = INV_T };
	float *yt = malloc(ROWS * T * 4);
	kvk_act_prepare(wt, act, T, x, n, n, 0, T);
	kvk_matmul(isa, wt, yb, ROWS, w, n, 0, 5, act, T, scr);
	kvk_matmul(isa, wt, yb, ROWS, w, n, 5, ROWS, act, T, scr);
	for (int t = 0; t < T; t++) {
		kvk_act_prepare(wt, act1, 1, x + t * n, n, n, 0, 1);
		kvk_matmul(isa, wt, y1, ROWS, w, n, 0, ROWS, act1, 1, scr);
		assert_memory_equal(y1, yb + t * ROWS, ROWS * 4);
		for (int r = 0; r < ROWS; r++)
			assert_float_equal(yb[t * ROWS + r], ys[t * ROWS + r],
					   1e-4 * (1 + fabsf(ys[t * ROWS + r])));
	}
	for (int b = 2; b <= 5; b++) {
		kvk_act_prepare(wt, act, b, x + 4 * n, n, n, 0, b);
		kvk_matmul(isa, wt, yt, ROWS, w, n, 0, ROWS, act, b, scr);
		assert_memory_equal(yt, yb + 4 * ROWS, (size_t)b * ROWS * 4);
	}
	free(yt);
}

/* Kernel level: a token's outputs are bit-identical whatever the batch size and row split,
 * for every weight type and every SIMD ISA the CPU has; each agrees with scalar to f32
 * rounding (each ISA has its own fixed order: AVX-512 accumulates in 16 lanes). */
static void test_matmul_invariance(void **st)
{
	(void)st;
	enum { ROWS = INV_ROWS, T = INV_T };
	const size_t ns[3] = {96, 99, 128}; /* Q8_0: an odd and an even block count */
	for (size_t di = 0; di < 4; di++)
		for (int ni = 0; ni < 3; ni++) {
			enum kvk_wtype wt = (enum kvk_wtype)dtypes[di];
			size_t n = ns[ni];
			if (wt == KVK_W_Q8_0 && n % 32)
				continue;
			struct kvi_config c = ref_cfg_tiny_llama(203);
			c.n_embd = (int)n;
			c.n_vocab = ROWS;
			c.n_layer = 0;
			struct kvi_model *m = ref_model_random(&c, (enum kvi_dtype)wt, 5 + di);
			const void *w = m->tok_embd.data;
			float *x = malloc(n * T * 4), *yb = malloc(ROWS * T * 4);
			float *y1 = malloc(ROWS * 4), *ys = malloc(ROWS * T * 4);
			float *scr =
			    aligned_alloc(64, (kvk_matmul_scratch_floats(wt, n) * 4 + 64) & ~63ul);
			void *act = malloc(kvk_act_bytes(wt, n, T)),
			     *act1 = malloc(kvk_act_bytes(wt, n, 1));
			unsigned sd = 3;
			for (size_t i = 0; i < n * T; i++) {
				sd = sd * 1103515245u + 12345u;
				x[i] = (float)((int)(sd >> 16) % 2001 - 1000) / 500.0f;
			}
			kvk_act_prepare(wt, act, T, x, n, n, 0, T);
			kvk_matmul(KVK_ISA_SCALAR, wt, ys, ROWS, w, n, 0, ROWS, act, T, scr);
			/* every SIMD ISA this CPU has, each on its own (AVX-512 accumulates in
			 * 16 lanes: another fixed order than AVX2's, within f32 rounding) */
			for (int isa = KVK_ISA_AVX2; isa <= (int)kvk_isa_best(); isa++) {
				check_isa_invariance(isa, wt, n, w, x, yb, y1, ys, scr, act, act1);
				printf("  type %2d n %3zu %-6s batch-invariant, within 1e-4 of "
				       "scalar\n",
				       wt, n, kvk_isa_name((enum kvk_isa)isa));
			}
			free(x), free(yb), free(y1), free(ys), free(scr), free(act), free(act1);
			ref_model_free(m);
		}
}

/* F16 weights repacked by kvk_f16_pack (the engine's layout on AVX-512): the same bits as the
 * file's layout on AVX-512, on every ISA the bits of the packed scalar kernel (one fma chain
 * per output), batch- and split-invariant; packing in shares (one empty, at the end, as the
 * pool hands out) writes nothing past the buffer. Row counts not a multiple of 16. */
static void test_f16_pack(void **st)
{
	(void)st;
	enum { T = 9 };
	const size_t ns[2] = {99, 128}, rowss[2] = {37, 48};
	for (int ni = 0; ni < 2; ni++)
		for (int ri = 0; ri < 2; ri++) {
			size_t n = ns[ni], R = rowss[ri], nb = kvk_f16_pack_bytes(R, n);
			uint16_t *w = malloc(R * n * 2), *wp = malloc(nb + 64);
			float *x = malloc(n * T * 4), *yf = malloc(R * T * 4);
			float *yp = malloc(R * T * 4), *y1 = malloc(R * 4), *ys = malloc(R * T * 4);
			float *scr = aligned_alloc(
			    64, (kvk_matmul_scratch_floats(KVK_W_F16_P16, n) * 4 + 64) & ~63ul);
			unsigned sd = 7;
			for (size_t i = 0; i < R * n; i++) {
				sd = sd * 1103515245u + 12345u;
				w[i] =
				    kvk_f32_to_f16((float)((int)(sd >> 16) % 2001 - 1000) / 700.0f);
			}
			for (size_t i = 0; i < n * T; i++) {
				sd = sd * 1103515245u + 12345u;
				x[i] = (float)((int)(sd >> 16) % 2001 - 1000) / 500.0f;
			}
			memset(wp, 0xa5, nb + 64);
			kvk_f16_pack(wp, w, R, n, 16, R);
			kvk_f16_pack(wp, w, R, n, R, R); /* empty share */
			kvk_f16_pack(wp, w, R, n, 0, 16);
			for (size_t i = 0; i < 64; i++)
				assert_int_equal(((uint8_t *)wp)[nb + i], 0xa5);
			for (size_t r = 0; r < (R + 15) / 16 * 16; r++) /* layout, padding zero */
				for (size_t k = 0; k < n; k += 7)
					assert_int_equal(wp[(r / 16) * 16 * n + k * 16 + r % 16],
							 r < R ? w[r * n + k] : 0);
			kvk_matmul(KVK_ISA_SCALAR, KVK_W_F16_P16, ys, R, wp, n, 0, R, x, T, scr);
			for (int isa = KVK_ISA_SCALAR; isa <= (int)kvk_isa_best(); isa++) {
				kvk_matmul(isa, KVK_W_F16_P16, yp, R, wp, n, 0, 16, x, T, scr);
				kvk_matmul(isa, KVK_W_F16_P16, yp, R, wp, n, 16, R, x, T, scr);
				assert_memory_equal(yp, ys, R * T * 4);
				for (int t = 0; t < T; t++) {
					kvk_matmul(isa, KVK_W_F16_P16, y1, R, wp, n, 0, R,
						   x + t * n, 1, scr);
					assert_memory_equal(y1, ys + t * R, R * 4);
				}
				kvk_matmul(isa, KVK_W_F16_P16, yp, R, wp, n, 0, R, x, T, NULL);
				assert_memory_equal(yp, ys, R * T * 4);
			}
			kvk_matmul(KVK_ISA_SCALAR, KVK_W_F16, yf, R, w, n, 0, R, x, T, scr);
			for (size_t i = 0; i < R * T; i++)
				assert_float_equal(ys[i], yf[i], 1e-4 * (1 + fabsf(yf[i])));
			if (kvk_isa_best() == KVK_ISA_AVX512) {
				kvk_matmul(KVK_ISA_AVX512, KVK_W_F16, yf, R, w, n, 0, R, x, T, scr);
				assert_memory_equal(yf, ys, R * T * 4);
			}
			printf("  f16 packed, %zu x %zu: the file layout's avx512 bits, every ISA, "
			       "batch- and split-invariant\n",
			       R, n);
			free(w), free(wp), free(x), free(yf), free(yp), free(y1), free(ys),
			    free(scr);
		}
}

/* Q8_0 activations from the SIMD path are the reference's bytes: random blocks, blocks whose
 * scale makes x * id land on .5 ties (both signs, -0), an all-zero block, odd token ranges. */
static void test_act_prepare_q8(void **st)
{
	(void)st;
	enum { N = 256, T = 7 };
	float *x = malloc(N * T * 4);
	unsigned sd = 11;
	for (size_t i = 0; i < N * T; i++) {
		sd = sd * 1103515245u + 12345u;
		x[i] = (float)((int)(sd >> 8) % 200001 - 100000) * 1e-4f;
	}
	static const float ties[] = {127, 2.5f, -3.5f, 0.5f, -0.5f, -0.0f, 126.5f, -126.5f};
	for (int i = 0; i < 32; i++)
		x[N + i] = ties[i % 8] * (i < 8 ? 1 : 0.25f); /* token 1 block 0: amax 127, id 1 */
	memset(x + 2 * N + 64, 0, 32 * 4);		      /* token 2 block 2: all zero */
	size_t bytes = kvk_act_bytes(KVK_W_Q8_0, N, T);
	void *got = calloc(1, bytes), *want = calloc(1, bytes);
	kvk_act_prepare_q8_ref(want, T, x, N, N, 0, T);
	kvk_act_prepare(KVK_W_Q8_0, got, T, x, N, N, 0, 3);
	kvk_act_prepare(KVK_W_Q8_0, got, T, x, N, N, 3, T);
	assert_memory_equal(got, want, bytes);
	assert_int_equal(((int8_t *)want)[N + 1], 3);  /* 2.5 -> 3 */
	assert_int_equal(((int8_t *)want)[N + 2], -4); /* -3.5 -> -4 */
	printf("  q8_0 activations (%s) equal the reference's bytes\n",
	       kvk_isa_name(kvk_isa_best()));
	free(x), free(got), free(want);
}

/* The attention kernels over a run of KV rows give the bits of the per-(row, head) dot / axpy
 * loops they replace, for the specialised head size 64 and others, on every ISA here. */
static void test_attn_runs(void **st)
{
	(void)st;
	enum { G = 3, NP = 37, KS = 200 };
	static const size_t hds[] = {64, 15, 128};
	float *q = malloc(G * 128 * 4), *sc = malloc(G * NP * 4), *sw = malloc(G * NP * 4);
	float *o = malloc(G * 128 * 4), *ow = malloc(G * 128 * 4);
	uint16_t *kv = malloc(NP * KS * 2);
	unsigned sd = 5;
	for (size_t i = 0; i < G * 128; i++) {
		sd = sd * 1103515245u + 12345u;
		q[i] = (float)((int)(sd >> 8) % 2001 - 1000) * 1e-3f;
	}
	for (size_t i = 0; i < NP * KS; i++) {
		sd = sd * 1103515245u + 12345u;
		kv[i] = kvk_f32_to_f16((float)((int)(sd >> 8) % 2001 - 1000) * 1e-3f);
	}
	for (int isa = KVK_ISA_SCALAR; isa <= (int)kvk_isa_best(); isa++)
		for (size_t hi = 0; hi < 3; hi++) {
			size_t hd = hds[hi];
			kvk_dot_f16_fn dot = kvk_dot_f16_get((enum kvk_isa)isa);
			kvk_axpy_f16_fn axpy = kvk_axpy_f16_get((enum kvk_isa)isa);
			for (size_t p = 0; p < NP; p++)
				for (size_t g = 0; g < G; g++)
					sw[g * NP + p] = dot(q + g * hd, kv + p * KS, hd) * 0.125f;
			kvk_qk_f16_get((enum kvk_isa)isa)(sc, NP, q, G, hd, kv, KS, NP, 0.125f);
			assert_memory_equal(sc, sw, G * NP * 4);
			memcpy(o, q, G * hd * 4);
			memcpy(ow, q, G * hd * 4);
			for (size_t p = 0; p < NP; p++)
				for (size_t g = 0; g < G; g++)
					axpy(ow + g * hd, sw[g * NP + p], kv + p * KS, hd);
			kvk_av_f16_get((enum kvk_isa)isa)(o, sw, NP, G, hd, kv, KS, NP);
			assert_memory_equal(o, ow, G * hd * 4);
		}
	printf("  qk / av runs equal the dot / axpy loops (scalar .. %s)\n",
	       kvk_isa_name(kvk_isa_best()));
	free(q), free(sc), free(sw), free(o), free(ow), free(kv);
}

/* `kvinfer generate --logits FILE`: one row per prompt token and per decoded token, and the
 * rows are the engine's own logits (prefill of the whole prompt gives the last prompt row's
 * bits, prefill of the first token alone row 0's). Fails without the built tools
 * (tests/build_tutil.h). */
static void test_cli_logits(void **st)
{
	(void)st;
	const char *b = tu_need_build_dir();
	char dir[] = "/tmp/test_fwd_cli_XXXXXX", cmd[2048], model[128], lf[128];
	assert_non_null(mkdtemp(dir));
	snprintf(model, sizeof(model), "%s/tiny.gguf", dir);
	snprintf(lf, sizeof(lf), "%s/logits.f32", dir);
	snprintf(cmd, sizeof(cmd),
		 "'%s/tools/kvinfer-synth' --preset tiny --type f16 -o '%s' >/dev/null && "
		 "'%s/bin/kvinfer' generate -m '%s' -t 1 -n 3 --ignore-eos --tokens 1,2,3,4,5 "
		 "--logits '%s' >/dev/null 2>&1",
		 b, model, b, model, lf);
	assert_int_equal(system(cmd), 0);
	struct kvi_model *m;
	char err[256];
	assert_int_equal(kvi_model_load(model, &m, err, sizeof(err)), 0);
	size_t V = (size_t)m->cfg.n_vocab;
	FILE *f = fopen(lf, "rb");
	assert_non_null(f);
	enum { ROWS = 5 + 2 }; /* 5 prompt rows, then 2 decodes (the 3rd token is not fed) */
	float *got = malloc(ROWS * V * 4), *want = malloc(V * 4);
	assert_int_equal(fread(got, 4, ROWS * V, f), ROWS * V);
	assert_int_equal(fgetc(f), EOF);
	fclose(f);
	const int32_t toks[5] = {1, 2, 3, 4, 5};
	struct kvi_engine *e = engine(m, 1, 64, 16, 0);
	struct kvi_seq *seq;
	assert_int_equal(kvi_seq_create(kvi_engine_kv(e), &seq), 0);
	assert_int_equal(kvi_engine_prefill(e, seq, toks, 5, want), 0);
	assert_memory_equal(got + 4 * V, want, V * 4);
	kvi_seq_destroy(seq);
	assert_int_equal(kvi_seq_create(kvi_engine_kv(e), &seq), 0);
	assert_int_equal(kvi_engine_prefill(e, seq, toks, 1, want), 0);
	assert_memory_equal(got, want, V * 4);
	kvi_seq_destroy(seq);
	kvi_engine_destroy(e);
	kvi_model_free(m);
	free(got), free(want);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

/* Every half converts to the float it denotes and back to itself; float -> half rounds to
 * nearest even. */
static void test_f16_conversion(void **st)
{
	(void)st;
	for (uint32_t h = 0; h < 65536; h++) {
		float f = kvk_f16_to_f32((uint16_t)h);
		if (isnan(f))
			continue;
		assert_int_equal(kvk_f32_to_f16(f), h);
		int e = (h >> 10) & 31, mm = h & 1023;
		double v = e == 0 ? ldexp(mm, -24) : e == 31 ? INFINITY : ldexp(1024 + mm, e - 25);
		assert_true((double)fabsf(f) == v);
	}
	assert_int_equal(kvk_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00); /* tie: even */
	assert_int_equal(kvk_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02); /* tie: even */
	assert_int_equal(kvk_f32_to_f16(65520.0f), 0x7c00);	      /* to inf */
	assert_int_equal(kvk_f32_to_f16(65519.0f), 0x7bff);
	assert_true(isnan(kvk_f16_to_f32(kvk_f32_to_f16(NAN))));
	assert_int_equal(kvk_f32_to_bf16(1.0f + 1.0f / 256), 0x3f80); /* tie: even */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_f16_conversion),
	    cmocka_unit_test(test_matmul_invariance),
	    cmocka_unit_test(test_f16_pack),
	    cmocka_unit_test(test_act_prepare_q8),
	    cmocka_unit_test(test_attn_runs),
	    cmocka_unit_test(test_cli_logits),
	    cmocka_unit_test(test_ref_f32),
	    cmocka_unit_test(test_ref_f16),
	    cmocka_unit_test(test_ref_bf16),
	    cmocka_unit_test(test_ref_q8_0),
	    cmocka_unit_test(test_ref_synth_quant),
	    cmocka_unit_test(test_chunk_invariance),
	    cmocka_unit_test(test_chunk_invariance_q4km),
	    cmocka_unit_test(test_chunk_invariance_long),
	    cmocka_unit_test(test_decode_batch),
	    cmocka_unit_test(test_kv_export_import),
	    cmocka_unit_test(test_fork_cow),
	    cmocka_unit_test(test_greedy_deterministic),
	    cmocka_unit_test(test_errors),
	    cmocka_unit_test(test_inject),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
