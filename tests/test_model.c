/* Tests for engine/model.c: valid tiny models (llama, qwen2, every weight type, tied or not,
 * rope_freqs) load with the right config; every model-level validation path rejects a broken
 * file with a message naming the key or tensor; truncation anywhere and random corruption fail
 * cleanly; the fingerprint follows the bytes; kvinfer-synth output loads with sane weights. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <math.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "build_tutil.h"
#include "gguf.h"
#include "gguf_write.h"
#include "model.h"

/* ---- valid models, built with the writer ---- */

struct spec {
	const char *arch;
	int n_layer, n_embd, n_head, n_kv, n_ff, n_vocab;
	enum kvi_dtype type;
	int tied, bias;
	const char *omit_key;	 /* metadata key left out */
	const char *omit_tensor; /* tensor left out */
	const char *bad_shape;	 /* tensor written with ne[1] + 1 (or ne[0] + 32 for vectors) */
	const char *bad_type;	 /* tensor written as Q8_0 (vectors) or Q4_1 (matrices) */
	int head_count_array;	 /* per-layer head counts */
	float eps;
	int rope_freqs; /* 1: rope_freqs.weight of the right shape, 2: a wrong one */
	int vec_f16;	/* norms and biases as F16 */
};

static struct spec llama_spec(void)
{
	return (struct spec){.arch = "llama",
			     .n_layer = 2,
			     .n_embd = 64,
			     .n_head = 4,
			     .n_kv = 2,
			     .n_ff = 96,
			     .n_vocab = 40,
			     .type = KVI_F32,
			     .eps = 1e-5f};
}

/* Builds a small model file in memory. Returns 0 and the buffer (caller frees). */
static void build(const struct spec *s, void **buf, size_t *len)
{
	struct kvi_gguf_writer *w;
	assert_int_equal(kvi_gguf_writer_create(&w), 0);
	char k[128];
#define KEY(x)	(snprintf(k, sizeof(k), "%s.%s", s->arch, x), k)
#define OMIT(x) (s->omit_key && !strcmp(s->omit_key, x))
	if (!OMIT("general.architecture"))
		kvi_gguf_w_str(w, "general.architecture", s->arch);
	if (!OMIT("block_count"))
		kvi_gguf_w_u32(w, KEY("block_count"), (uint32_t)s->n_layer);
	if (!OMIT("context_length"))
		kvi_gguf_w_u32(w, KEY("context_length"), 256);
	if (!OMIT("embedding_length"))
		kvi_gguf_w_u32(w, KEY("embedding_length"), (uint32_t)s->n_embd);
	if (!OMIT("feed_forward_length"))
		kvi_gguf_w_u32(w, KEY("feed_forward_length"), (uint32_t)s->n_ff);
	if (s->head_count_array) {
		int32_t hc[8] = {4, 4, 4, 4, 4, 4, 4, 4};
		kvi_gguf_w_arr_i32(w, KEY("attention.head_count"), hc, (size_t)s->n_layer);
	} else if (!OMIT("attention.head_count")) {
		kvi_gguf_w_u32(w, KEY("attention.head_count"), (uint32_t)s->n_head);
	}
	kvi_gguf_w_u32(w, KEY("attention.head_count_kv"), (uint32_t)s->n_kv);
	kvi_gguf_w_f32(w, KEY("rope.freq_base"), 10000.0f);
	if (!OMIT("attention.layer_norm_rms_epsilon"))
		kvi_gguf_w_f32(w, KEY("attention.layer_norm_rms_epsilon"), s->eps);
	int hd = s->n_embd / s->n_head;
	int64_t q = (int64_t)s->n_head * hd, kv = (int64_t)s->n_kv * hd;
	struct {
		char name[64];
		int64_t ne0, ne1;
		int vec;
	} T[64];
	int n = 0;
#define ADD(nm, a, b, v)                                                                           \
	do {                                                                                       \
		snprintf(T[n].name, sizeof(T[n].name), "%s", nm);                                  \
		T[n].ne0 = a;                                                                      \
		T[n].ne1 = b;                                                                      \
		T[n].vec = v;                                                                      \
		n++;                                                                               \
	} while (0)
	ADD("token_embd.weight", s->n_embd, s->n_vocab, 0);
	ADD("output_norm.weight", s->n_embd, 1, 1);
	if (s->rope_freqs)
		ADD("rope_freqs.weight", hd / 2 + (s->rope_freqs == 2), 1, 1);
	if (!s->tied)
		ADD("output.weight", s->n_embd, s->n_vocab, 0);
	char nm[64];
	for (int l = 0; l < s->n_layer; l++) {
#define LADD(x, a, b, v)                                                                           \
	do {                                                                                       \
		snprintf(nm, sizeof(nm), "blk.%d." x, l);                                          \
		ADD(nm, a, b, v);                                                                  \
	} while (0)
		LADD("attn_norm.weight", s->n_embd, 1, 1);
		LADD("attn_q.weight", s->n_embd, q, 0);
		LADD("attn_k.weight", s->n_embd, kv, 0);
		LADD("attn_v.weight", s->n_embd, kv, 0);
		LADD("attn_output.weight", q, s->n_embd, 0);
		if (s->bias) {
			LADD("attn_q.bias", q, 1, 1);
			LADD("attn_k.bias", kv, 1, 1);
			LADD("attn_v.bias", kv, 1, 1);
		}
		LADD("ffn_norm.weight", s->n_embd, 1, 1);
		LADD("ffn_gate.weight", s->n_embd, s->n_ff, 0);
		LADD("ffn_up.weight", s->n_embd, s->n_ff, 0);
		LADD("ffn_down.weight", s->n_ff, s->n_embd, 0);
	}
	for (int i = 0; i < n; i++) {
		if (s->omit_tensor && !strcmp(s->omit_tensor, T[i].name))
			continue;
		int64_t ne[2] = {T[i].ne0, T[i].ne1};
		uint32_t type = T[i].vec ? (s->vec_f16 ? KVI_F16 : KVI_F32) : (uint32_t)s->type;
		if (s->bad_shape && !strcmp(s->bad_shape, T[i].name)) {
			if (T[i].vec)
				ne[1] = 2;
			else
				ne[1] += 1;
		}
		if (s->bad_type && !strcmp(s->bad_type, T[i].name))
			type = T[i].vec ? KVI_Q8_0 : 3 /* Q4_1: not computed */;
		int nd = T[i].vec && ne[1] == 1 ? 1 : 2;
		if (type == 3) {
			/* the writer only writes engine types: write F16 and patch the type below
			 */
			assert_true(kvi_gguf_w_tensor(w, T[i].name, KVI_F16, nd, ne, NULL) >= 0);
		} else {
			assert_true(kvi_gguf_w_tensor(w, T[i].name, type, nd, ne, NULL) >= 0);
		}
	}
	assert_int_equal(kvi_gguf_w_write_mem(w, NULL, NULL, buf, len), 0);
	kvi_gguf_writer_free(w);
	if (s->bad_type) {
		/* patch: find the name in the header and rewrite the type after its dims */
		size_t nl = strlen(s->bad_type);
		uint8_t *p = *buf;
		for (size_t i = 0; i + nl + 8 < *len; i++) {
			uint64_t l;
			memcpy(&l, p + i, 8);
			if (l == nl && !memcmp(p + i + 8, s->bad_type, nl)) {
				uint32_t nd;
				memcpy(&nd, p + i + 8 + nl, 4);
				size_t to = i + 8 + nl + 4 + 8 * nd;
				uint32_t ty;
				memcpy(&ty, p + to, 4);
				if (ty == KVI_F16 && nd == 2)
					ty = 3, memcpy(p + to, &ty, 4);
				break;
			}
		}
	}
#undef KEY
#undef OMIT
}

/* Opens buf as a model; returns the result and leaves the message in err. */
static int try_load(const void *buf, size_t len, char *err, size_t errlen, struct kvi_model **out)
{
	struct kvi_gguf *g = NULL;
	err[0] = 0;
	int ret = kvi_gguf_open_mem(buf, len, &g, err, errlen);
	if (ret)
		return ret;
	struct kvi_model *m = NULL;
	ret = kvi_model_from_gguf(g, &m, err, errlen);
	if (ret)
		return ret;
	if (out)
		*out = m;
	else
		kvi_model_free(m);
	return 0;
}

static void expect_fail(const void *buf, size_t len, const char *substr)
{
	char err[512];
	int ret = try_load(buf, len, err, sizeof(err), NULL);
	if (ret >= 0 || !strstr(err, substr))
		fail_msg("expected failure containing '%s', got %d '%s'", substr, ret, err);
}

static void expect_spec_fail(const struct spec *s, const char *substr)
{
	void *buf;
	size_t len;
	build(s, &buf, &len);
	expect_fail(buf, len, substr);
	free(buf);
}

static void test_valid_llama(void **state)
{
	(void)state;
	static const enum kvi_dtype types[] = {KVI_F32, KVI_F16, KVI_BF16, KVI_Q8_0};
	for (int ti = 0; ti < 4; ti++) {
		struct spec s = llama_spec();
		s.type = types[ti];
		void *buf;
		size_t len;
		build(&s, &buf, &len);
		char err[256];
		struct kvi_model *m = NULL;
		int ret = try_load(buf, len, err, sizeof(err), &m);
		if (ret)
			fail_msg("load: %s", err);
		const struct kvi_config *c = &m->cfg;
		assert_string_equal(c->arch, "llama");
		assert_int_equal(c->n_layer, 2);
		assert_int_equal(c->n_embd, 64);
		assert_int_equal(c->n_head, 4);
		assert_int_equal(c->n_head_kv, 2);
		assert_int_equal(c->head_dim, 16);
		assert_int_equal(c->rope_dim, 16);
		assert_int_equal(c->n_ff, 96);
		assert_int_equal(c->n_vocab, 40);
		assert_int_equal(c->n_ctx_train, 256);
		assert_int_equal(c->rope_style, KVI_ROPE_ADJACENT);
		assert_false(c->has_qkv_bias);
		assert_false(c->tied_output);
		assert_true(c->rms_eps > 0.9e-5f && c->rms_eps < 1.1e-5f);
		assert_true(c->rope_base == 10000.0f);
		assert_int_equal(m->layers[1].wk.ne[0], 64);
		assert_int_equal(m->layers[1].wk.ne[1], 32);
		assert_int_equal(m->layers[1].wk.type, types[ti]);
		assert_int_equal(m->layers[1].wk.nbytes, 32 * kvi_dtype_row_bytes(types[ti], 64));
		assert_int_equal(m->layers[0].w_down.ne[0], 96);
		assert_int_equal(m->layers[0].attn_norm.type, KVI_F32);
		assert_null(m->layers[0].bq.data);
		assert_ptr_not_equal(m->output.data, m->tok_embd.data);
		/* pointers are into the buffer */
		assert_true((const uint8_t *)m->tok_embd.data > (const uint8_t *)buf &&
			    (const uint8_t *)m->tok_embd.data + m->tok_embd.nbytes <=
				(const uint8_t *)buf + len);
		assert_non_null(kvi_model_gguf(m));
		kvi_model_free(m);
		free(buf);
	}
}

static void test_valid_qwen2_tied(void **state)
{
	(void)state;
	struct spec s = llama_spec();
	s.arch = "qwen2";
	s.tied = 1;
	s.bias = 1;
	s.type = KVI_Q8_0;
	void *buf;
	size_t len;
	build(&s, &buf, &len);
	char err[256];
	struct kvi_model *m = NULL;
	if (try_load(buf, len, err, sizeof(err), &m))
		fail_msg("load: %s", err);
	assert_int_equal(m->cfg.rope_style, KVI_ROPE_HALVES);
	assert_true(m->cfg.has_qkv_bias);
	assert_true(m->cfg.tied_output);
	assert_ptr_equal(m->output.data, m->tok_embd.data);
	assert_int_equal(m->layers[1].bk.ne[0], 32);
	assert_int_equal(m->layers[1].bk.type, KVI_F32);
	assert_non_null(m->layers[1].bv.data);
	kvi_model_free(m);
	free(buf);
}

/* F16 norms and biases are accepted (the forward pass converts them). */
static void test_f16_vectors(void **state)
{
	(void)state;
	struct spec s = llama_spec();
	s.arch = "qwen2";
	s.bias = 1;
	s.vec_f16 = 1;
	void *buf;
	size_t len;
	build(&s, &buf, &len);
	char err[256];
	struct kvi_model *m = NULL;
	if (try_load(buf, len, err, sizeof(err), &m))
		fail_msg("%s", err);
	assert_int_equal(m->layers[0].attn_norm.type, KVI_F16);
	assert_int_equal(m->layers[0].bq.type, KVI_F16);
	assert_int_equal(m->out_norm.nbytes, 128);
	kvi_model_free(m);
	free(buf);
}

static void test_rope_freqs(void **state)
{
	(void)state;
	struct spec s = llama_spec();
	s.rope_freqs = 1;
	void *buf;
	size_t len;
	build(&s, &buf, &len);
	char err[256];
	struct kvi_model *m = NULL, *plain = NULL;
	if (try_load(buf, len, err, sizeof(err), &m))
		fail_msg("%s", err);
	assert_non_null(m->rope_freqs.data);
	assert_int_equal(m->rope_freqs.ne[0], 8);
	assert_int_equal(m->rope_freqs.type, KVI_F32);
	free(buf);
	s.rope_freqs = 0;
	build(&s, &buf, &len);
	assert_int_equal(try_load(buf, len, err, sizeof(err), &plain), 0);
	assert_null(plain->rope_freqs.data);
	assert_int_equal(plain->rope_freqs.ne[0], 0);
	assert_memory_not_equal(m->fingerprint, plain->fingerprint, 32);
	kvi_model_free(m);
	kvi_model_free(plain);
	free(buf);
	s.rope_freqs = 2;
	expect_spec_fail(&s, "tensor 'rope_freqs.weight': shape (9, 1), expected (8, 1)");
}

static void test_fingerprint(void **state)
{
	(void)state;
	struct spec s = llama_spec();
	void *buf, *buf2;
	size_t len, len2;
	build(&s, &buf, &len);
	build(&s, &buf2, &len2);
	assert_int_equal(len, len2);
	char err[256];
	struct kvi_model *a = NULL, *b = NULL;
	assert_int_equal(try_load(buf, len, err, sizeof(err), &a), 0);
	assert_int_equal(try_load(buf2, len2, err, sizeof(err), &b), 0);
	assert_memory_equal(a->fingerprint, b->fingerprint, 32);
	/* flip one byte of the last layer's ffn_down: the fingerprint must change */
	size_t off = (size_t)((const uint8_t *)b->layers[1].w_down.data - (uint8_t *)buf2) + 17;
	kvi_model_free(b);
	((uint8_t *)buf2)[off] ^= 1;
	assert_int_equal(try_load(buf2, len2, err, sizeof(err), &b), 0);
	assert_memory_not_equal(a->fingerprint, b->fingerprint, 32);
	uint8_t save[32];
	memcpy(save, b->fingerprint, 32);
	assert_int_equal(kvi_model_compute_fingerprint(b), 0);
	assert_memory_equal(save, b->fingerprint, 32);
	/* a hyper-parameter change alone changes it too */
	b->cfg.rope_base = 20000.0f;
	assert_int_equal(kvi_model_compute_fingerprint(b), 0);
	assert_memory_not_equal(save, b->fingerprint, 32);
	kvi_model_free(a);
	kvi_model_free(b);
	free(buf);
	free(buf2);
}

/* Hand-built model with a tensor of several 64 MiB fingerprint chunks: every chunk counts and
 * the parallel hashing is deterministic. */
static void test_fingerprint_chunks(void **state)
{
	(void)state;
	struct kvi_config cfg = {.arch = "llama", .n_layer = 1, .n_embd = 4096, .n_vocab = 8200};
	struct kvi_model *m = NULL;
	assert_int_equal(kvi_model_init_empty(&cfg, &m), 0);
	size_t nb = 4096 * 8200 * sizeof(float); /* ~134 MB: 3 chunks */
	uint8_t *w = calloc(1, nb);
	assert_non_null(w);
	m->tok_embd = (struct kvi_tensor){KVI_F32, {4096, 8200}, w, nb};
	m->cfg.tied_output = 1;
	uint8_t a[32], b[32];
	assert_int_equal(kvi_model_compute_fingerprint(m), 0);
	memcpy(a, m->fingerprint, 32);
	assert_int_equal(kvi_model_compute_fingerprint(m), 0);
	assert_memory_equal(a, m->fingerprint, 32);
	w[nb - 1] = 1; /* last chunk */
	assert_int_equal(kvi_model_compute_fingerprint(m), 0);
	memcpy(b, m->fingerprint, 32);
	assert_memory_not_equal(a, b, 32);
	w[nb - 1] = 0;
	w[(size_t)70 << 20] = 1; /* second chunk */
	assert_int_equal(kvi_model_compute_fingerprint(m), 0);
	assert_memory_not_equal(a, m->fingerprint, 32);
	assert_memory_not_equal(b, m->fingerprint, 32);
	kvi_model_free(m);
	free(w);
}

static void test_file_load(void **state)
{
	(void)state;
	struct spec s = llama_spec();
	void *buf;
	size_t len;
	build(&s, &buf, &len);
	char path[] = "/tmp/test_gguf_XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, buf, len), (ssize_t)len);
	close(fd);
	struct kvi_model *m = NULL;
	char err[256];
	assert_int_equal(kvi_model_load(path, &m, err, sizeof(err)), 0);
	struct kvi_model *mm = NULL;
	assert_int_equal(try_load(buf, len, err, sizeof(err), &mm), 0);
	assert_memory_equal(m->fingerprint, mm->fingerprint, 32);
	kvi_model_free(m);
	kvi_model_free(mm);
	assert_int_equal(truncate(path, 0), 0);
	assert_true(kvi_model_load(path, &m, err, sizeof(err)) < 0);
	assert_non_null(strstr(err, "empty"));
	unlink(path);
	assert_int_equal(kvi_model_load(path, &m, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, path));
	free(buf);
}

/* ---- kvinfer-synth output ---- */

static float f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
	float v;
	if (e == 0)
		v = (float)m / 16777216.0f; /* 2^-24 */
	else if (e == 31)
		v = m ? NAN : INFINITY;
	else
		v = ldexpf((float)(m | 0x400), (int)e - 25);
	uint32_t x;
	memcpy(&x, &v, 4);
	x |= sign;
	memcpy(&v, &x, 4);
	return v;
}

static float elem(const struct kvi_tensor *t, size_t i)
{
	const uint8_t *p = t->data;
	uint16_t h;
	uint32_t x;
	float f;
	switch (t->type) {
	case KVI_F32:
		memcpy(&f, p + 4 * i, 4);
		return f;
	case KVI_F16:
		memcpy(&h, p + 2 * i, 2);
		return f16_to_f32(h);
	case KVI_BF16:
		memcpy(&h, p + 2 * i, 2);
		x = (uint32_t)h << 16;
		memcpy(&f, &x, 4);
		return f;
	case KVI_Q8_0: {
		const uint8_t *b = p + (i / 32) * KVI_Q8_0_BYTES;
		memcpy(&h, b, 2);
		return f16_to_f32(h) * (float)(int8_t)b[2 + i % 32];
	}
	default:
		return NAN;
	}
}

/* max |x| over a tensor, failing on NaN / Inf */
static float absmax(const struct kvi_tensor *t)
{
	size_t n = (size_t)(t->ne[0] * t->ne[1]);
	float m = 0;
	for (size_t i = 0; i < n; i++) {
		float v = elem(t, i);
		if (!isfinite(v))
			fail_msg("non-finite weight at %zu", i);
		m = fmaxf(m, fabsf(v));
	}
	return m;
}

static int run_synth(const char *preset, const char *type, int seed, char *path)
{
	const char *bd = tu_need_build_dir();
	char cmd[1024];
	strcpy(path, "/tmp/test_gguf_synth_XXXXXX");
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	close(fd);
	snprintf(cmd, sizeof(cmd),
		 "%s/tools/kvinfer-synth --preset %s --type %s --seed %d -o %s >/dev/null", bd,
		 preset, type, seed, path);
	return system(cmd);
}

static void test_synth_presets(void **state)
{
	(void)state;
	tu_need_build_dir();
	static const char *types[] = {"f32", "f16", "bf16", "q8_0"};
	static const enum kvi_dtype dt[] = {KVI_F32, KVI_F16, KVI_BF16, KVI_Q8_0};
	char path[64], err[256];
	uint8_t fp[2][32];
	for (int p = 0; p < 2; p++) {
		for (int ti = 0; ti < 4; ti++) {
			const char *preset = p ? "tiny-qwen2" : "tiny";
			assert_int_equal(run_synth(preset, types[ti], 7, path), 0);
			struct kvi_model *m = NULL;
			if (kvi_model_load(path, &m, err, sizeof(err)))
				fail_msg("%s %s: %s", preset, types[ti], err);
			struct stat st;
			assert_int_equal(stat(path, &st), 0);
			assert_true(st.st_size < 5 * 1000 * 1000);
			unlink(path);
			const struct kvi_config *c = &m->cfg;
			assert_int_equal(c->n_embd, 64);
			assert_int_equal(c->n_layer, 2);
			assert_int_equal(c->n_head, 4);
			assert_int_equal(c->n_head_kv, 2);
			assert_int_equal(c->n_ff, 192);
			assert_int_equal(c->n_vocab, 512);
			assert_int_equal(c->rope_style, p ? KVI_ROPE_HALVES : KVI_ROPE_ADJACENT);
			assert_int_equal(c->has_qkv_bias, p);
			assert_int_equal(c->tied_output, p);
			assert_int_equal(m->layers[0].wq.type, dt[ti]);
			/* weights bounded by the generator's scale, norms near 1 */
			assert_true(absmax(&m->layers[1].wq) <= 0.25f);
			assert_true(absmax(&m->layers[1].w_down) <= 0.25f);
			assert_true(absmax(&m->tok_embd) <= 0.25f);
			float nm = absmax(&m->layers[1].ffn_norm);
			assert_true(nm > 0.9f && nm < 1.1f);
			if (ti == 1)
				memcpy(fp[p], m->fingerprint, 32);
			kvi_model_free(m);
		}
	}
	assert_memory_not_equal(fp[0], fp[1], 32);
	/* same seed -> same file; another seed -> another fingerprint */
	struct kvi_model *a = NULL, *b = NULL;
	assert_int_equal(run_synth("tiny", "f16", 7, path), 0);
	assert_int_equal(kvi_model_load(path, &a, err, sizeof(err)), 0);
	unlink(path);
	assert_memory_equal(a->fingerprint, fp[0], 32);
	assert_int_equal(run_synth("tiny", "f16", 8, path), 0);
	assert_int_equal(kvi_model_load(path, &b, err, sizeof(err)), 0);
	unlink(path);
	assert_memory_not_equal(a->fingerprint, b->fingerprint, 32);
	kvi_model_free(a);
	kvi_model_free(b);
	assert_true(run_synth("nope", "f16", 1, path) != 0);
	unlink(path);
	/* q4_0 fits 64-wide rows (output: Q6_K falls back to Q8_0, as in llama.cpp); q4_k_m
	 * would need llama.cpp's Q5_0 fallback there and is refused, leaving no file */
	assert_int_equal(run_synth("tiny", "q4_0", 1, path), 0);
	assert_int_equal(kvi_model_load(path, &a, err, sizeof(err)), 0);
	unlink(path);
	assert_int_equal(a->layers[0].wq.type, KVI_Q4_0);
	assert_int_equal(a->output.type, KVI_Q8_0);
	kvi_model_free(a);
	/* 64-wide rows are not K-quant super-blocks: llama.cpp's fallbacks, Q4_K -> Q5_0,
	 * Q5_K -> Q5_1, Q6_K -> Q8_0 (attn_v, ffn_down of layer 1 of 2 get Q6_K first) */
	static const struct {
		const char *type;
		enum kvi_dtype base;
	} FB[] = {{"q4_k_m", KVI_Q5_0}, {"q5_k_m", KVI_Q5_1}};
	for (int i = 0; i < 2; i++) {
		assert_int_equal(run_synth("tiny", FB[i].type, 1, path), 0);
		if (kvi_model_load(path, &a, err, sizeof(err)))
			fail_msg("%s: %s", FB[i].type, err);
		unlink(path);
		assert_int_equal(a->tok_embd.type, FB[i].base);
		assert_int_equal(a->layers[0].wq.type, FB[i].base);
		assert_int_equal(a->layers[0].wv.type, FB[i].base);
		assert_int_equal(a->layers[1].wv.type, KVI_Q8_0);
		assert_int_equal(a->layers[1].w_down.type, KVI_Q8_0);
		assert_int_equal(a->output.type, KVI_Q8_0);
		kvi_model_free(a);
	}
}

static void test_bad_model(void **state)
{
	(void)state;
	struct spec s;
	static const char *req[] = {"block_count",	   "embedding_length",
				    "feed_forward_length", "attention.head_count",
				    "context_length",	   "attention.layer_norm_rms_epsilon"};
	for (size_t i = 0; i < sizeof(req) / sizeof(req[0]); i++) {
		char want[128];
		s = llama_spec();
		s.omit_key = req[i];
		snprintf(want, sizeof(want), "missing required key 'llama.%s'", req[i]);
		expect_spec_fail(&s, want);
	}
	s = llama_spec();
	s.omit_key = "general.architecture";
	expect_spec_fail(&s, "missing required key 'general.architecture'");
	s = llama_spec();
	s.arch = "gpt2";
	expect_spec_fail(&s, "unsupported architecture 'gpt2'");
	s = llama_spec();
	s.n_kv = 3;
	expect_spec_fail(&s, "does not divide");
	s = llama_spec();
	s.head_count_array = 1;
	expect_spec_fail(&s, "llama.attention.head_count' is not an integer");
	s = llama_spec();
	s.n_layer = 0;
	expect_spec_fail(&s, "key 'llama.block_count' = 0 out of range [1, 4096]");
	s = llama_spec();
	s.eps = 0.0f;
	expect_spec_fail(&s, "layer_norm_rms_epsilon' = 0 out of range");
	s = llama_spec();
	s.n_head = 5;
	s.n_kv = 5;
	expect_spec_fail(&s, "not a multiple of head_count");
	s = llama_spec();
	s.omit_tensor = "blk.1.ffn_down.weight";
	expect_spec_fail(&s, "missing tensor 'blk.1.ffn_down.weight'");
	s = llama_spec();
	s.omit_tensor = "token_embd.weight";
	expect_spec_fail(&s, "missing tensor 'token_embd.weight'");
	s = llama_spec();
	s.arch = "qwen2";
	expect_spec_fail(&s, "missing tensor 'blk.0.attn_q.bias'");
	s = llama_spec();
	s.bad_shape = "blk.0.attn_k.weight";
	expect_spec_fail(&s, "tensor 'blk.0.attn_k.weight': shape (64, 33), expected (64, 32)");
	s = llama_spec();
	s.bad_shape = "output.weight";
	expect_spec_fail(&s, "tensor 'output.weight': shape (64, 41), expected (64, 40)");
	s = llama_spec();
	s.bad_shape = "blk.1.ffn_norm.weight";
	expect_spec_fail(&s, "tensor 'blk.1.ffn_norm.weight': has 2 dimensions, expected 1");
	s = llama_spec();
	s.bad_type = "blk.0.attn_norm.weight";
	expect_spec_fail(&s, "tensor 'blk.0.attn_norm.weight': type Q8_0 not supported here "
			     "(norms and biases must be F32, F16 or BF16)");
	s = llama_spec();
	s.type = KVI_F16;
	s.bad_type = "blk.1.attn_v.weight";
	expect_spec_fail(&s, "tensor 'blk.1.attn_v.weight': type Q4_1 not supported");
}

/* Every prefix of the header and sampled prefixes of the data fail cleanly. */
static void test_truncation(void **state)
{
	(void)state;
	struct spec s = llama_spec();
	void *buf;
	size_t len;
	build(&s, &buf, &len);
	struct kvi_gguf *g;
	char err[512];
	assert_int_equal(kvi_gguf_open_mem(buf, len, &g, err, sizeof(err)), 0);
	const struct kvi_gguf_tensor *t0 = kvi_gguf_tensor(g, 0);
	size_t data_off = (size_t)((const uint8_t *)t0->data - (const uint8_t *)buf);
	kvi_gguf_close(g);
	for (size_t l = 0; l < len; l += l < data_off + 64 ? 1 : 997) {
		/* a copy of exactly l bytes, so ASan sees any read past the end */
		uint8_t *cut = malloc(l ? l : 1);
		memcpy(cut, buf, l);
		int ret = try_load(cut, l, err, sizeof(err), NULL);
		if (ret >= 0)
			fail_msg("prefix of %zu / %zu bytes loaded", l, len);
		if (!strstr(err, "truncated") && !strstr(err, "bad magic") &&
		    !strstr(err, "past the end") && !strstr(err, "outside the file"))
			fail_msg("prefix %zu: unexpected message '%s'", l, err);
		free(cut);
	}
	expect_fail(buf, len - 1, "outside the file");
	free(buf);
}

/* Random byte flips in the header: any outcome but a crash (ASan checks the reads). */
static void test_random_corruption(void **state)
{
	(void)state;
	struct spec s = llama_spec();
	s.bias = 1;
	s.arch = "qwen2";
	void *buf;
	size_t len;
	build(&s, &buf, &len);
	uint64_t rng = 12345;
	char err[512];
	int failed = 0;
	for (int it = 0; it < 3000; it++) {
		uint8_t *c = malloc(len);
		memcpy(c, buf, len);
		int flips = 1 + it % 4;
		for (int f = 0; f < flips; f++) {
			rng = rng * 6364136223846793005ull + 1442695040888963407ull;
			size_t pos = (size_t)(rng >> 33) % 2048;
			c[pos] ^= (uint8_t)(1u << ((rng >> 20) & 7));
		}
		if (try_load(c, len, err, sizeof(err), NULL) < 0) {
			assert_true(err[0] != 0);
			failed++;
		}
		free(c);
	}
	assert_true(failed > 0);
	free(buf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_valid_llama),	      cmocka_unit_test(test_valid_qwen2_tied),
	    cmocka_unit_test(test_f16_vectors),	      cmocka_unit_test(test_rope_freqs),
	    cmocka_unit_test(test_fingerprint),	      cmocka_unit_test(test_fingerprint_chunks),
	    cmocka_unit_test(test_file_load),	      cmocka_unit_test(test_synth_presets),
	    cmocka_unit_test(test_bad_model),	      cmocka_unit_test(test_truncation),
	    cmocka_unit_test(test_random_corruption),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
