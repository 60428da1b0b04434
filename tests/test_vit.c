/* Tests for engine/vit.c: the tower against the scalar reference (tests/ref_vit.c) on files
 * written here (every optional tensor, both GELUs, F32/F16/BF16) and by kvinfer-synth; thread
 * count does not change a bit; every loader check rejects its hostile file with a message
 * naming the key or tensor; the fingerprint is the file's SHA-256. The device tower
 * (vit_use_device) against the CPU tower and the reference on the host backend;
 *
 *   test_vit --cuda   only the device checks, on GPU 0 (on the CUDA emulation in CI); exits 77
 *                     without a GPU. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/evp.h>

#include "build_tutil.h"
#include "gguf.h"
#include "gguf_write.h"
#include "kvk.h"
#include "kvk_dev.h"
#include "ref_vit.h"
#include "vit.h"

/* ---- building mmproj files ------------------------------------------------------------------ */

struct spec {
	int image, patch, E, F, L, H, hidden, out;
	int has_class, patch_bias, pre_ln, post_ln, use_gelu;
	uint32_t wtype;	       /* matrices */
	const char *proj_type; /* NULL: has_llava_projector instead */
	/* hostile variations */
	const char *skip;     /* key or tensor not written */
	const char *bad_name; /* tensor written one column wider */
	int legacy_ffn;	      /* fc1 named ffn_down, fc2 ffn_up (old LLaVA converters) */
	const char *q4_name;  /* tensor written as Q4_0 (zeros): a type the tower refuses */
	const char *q8_one;   /* one tensor written as Q8_0 among float ones */
	int has_vis;	      /* 0: clip.has_vision_encoder false */
	int mean_n;	      /* elements of image_mean (3) */
	float std0, eps;
	int pos_extra; /* extra position rows */
	int use_silu;
	int feature_layer;
	int pinpoints;
};

static struct spec base_spec(void)
{
	return (struct spec){.image = 16,
			     .patch = 4,
			     .E = 32,
			     .F = 80,
			     .L = 3,
			     .H = 4,
			     .hidden = 48,
			     .out = 40,
			     .has_class = 1,
			     .patch_bias = 1,
			     .pre_ln = 1,
			     .post_ln = 1,
			     .use_gelu = 1,
			     .wtype = KVK_W_F32,
			     .proj_type = "mlp",
			     .has_vis = 1,
			     .mean_n = 3,
			     .std0 = 0.26f,
			     .eps = 1e-5f};
}

struct tens {
	char name[64];
	uint32_t type;
	int nd;
	int64_t ne[4];
	void *data;
};

struct builder {
	struct kvi_gguf_writer *w;
	struct tens t[512];
	int n;
	uint64_t rng;
	const struct spec *s;
};

static float urand(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((*s >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static void add(struct builder *b, const char *name, int nd, int64_t ne0, int64_t ne1, int64_t ne2,
		int64_t ne3, float scale, int norm)
{
	const struct spec *s = b->s;
	if (s->skip && !strcmp(s->skip, name))
		return;
	struct tens *t = &b->t[b->n++];
	snprintf(t->name, sizeof(t->name), "%s", name);
	int64_t ne[4] = {ne0, ne1, ne2, ne3};
	if (s->bad_name && !strcmp(s->bad_name, name))
		ne[0]++;
	memcpy(t->ne, ne, sizeof(ne));
	t->nd = nd;
	t->type = nd >= 2 && !norm && scale != 0.5f ? s->wtype : KVK_W_F32;
	if (nd == 4 && t->type == KVK_W_Q8_0)
		t->type = KVK_W_F16; /* the patch kernel's ggml rows are p wide: never Q8_0 */
	if (s->q4_name && !strcmp(s->q4_name, name))
		t->type = KVK_W_Q4_0;
	if (s->q8_one && !strcmp(s->q8_one, name))
		t->type = KVK_W_Q8_0;
	size_t rows = (size_t)(ne[1] * ne[2] * ne[3]), rb = kvk_row_bytes(t->type, (size_t)ne[0]);
	t->data = calloc(rows, rb ? rb : 1);
	assert_non_null(t->data);
	float *row = malloc((size_t)ne[0] * sizeof(float));
	assert_non_null(row);
	for (size_t r = 0; r < rows; r++) {
		for (int64_t i = 0; i < ne[0]; i++)
			row[i] = (norm ? 1.0f : 0.0f) + scale * urand(&b->rng);
		uint8_t *o = (uint8_t *)t->data + r * rb;
		if (t->type == KVK_W_Q8_0 && rb) /* round to nearest, scale amax / 127 */
			for (int64_t blk = 0; blk < ne[0] / 32; blk++) {
				float amax = 0, *x = row + blk * 32;
				for (int i = 0; i < 32; i++)
					amax = fmaxf(amax, fabsf(x[i]));
				float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
				uint16_t dh = kvk_f32_to_f16(d);
				memcpy(o + blk * 34, &dh, 2);
				for (int i = 0; i < 32; i++)
					o[blk * 34 + 2 + i] = (uint8_t)(int8_t)lrintf(x[i] * id);
			}
		for (int64_t i = 0; i < ne[0] && t->type != KVK_W_Q8_0 && t->type != KVK_W_Q4_0;
		     i++) {
			if (t->type == KVK_W_F32) {
				memcpy(o + 4 * i, &row[i], 4);
			} else {
				uint16_t h = t->type == KVK_W_F16 ? kvk_f32_to_f16(row[i])
								  : kvk_f32_to_bf16(row[i]);
				memcpy(o + 2 * i, &h, 2);
			}
		}
	}
	free(row);
	assert_true(kvi_gguf_w_tensor(b->w, t->name, t->type, nd, t->ne, t->data) >= 0);
}

static void kv_u32(struct builder *b, const char *k, uint32_t v)
{
	if (!b->s->skip || strcmp(b->s->skip, k))
		kvi_gguf_w_u32(b->w, k, v);
}

/* Writes the file of s into a malloc'd buffer. */
static void build(const struct spec *s, uint64_t seed, void **buf, size_t *len)
{
	struct builder *b = calloc(1, sizeof(*b));
	assert_non_null(b);
	b->s = s;
	b->rng = seed;
	assert_int_equal(kvi_gguf_writer_create(&b->w), 0);
	struct kvi_gguf_writer *w = b->w;
	kvi_gguf_w_str(w, "general.architecture", "clip");
	if (!s->skip || strcmp(s->skip, "clip.has_vision_encoder"))
		kvi_gguf_w_bool(w, "clip.has_vision_encoder", s->has_vis);
	if (s->proj_type)
		kvi_gguf_w_str(w, "clip.projector_type", s->proj_type);
	else
		kvi_gguf_w_bool(w, "clip.has_llava_projector", 1);
	kvi_gguf_w_bool(w, "clip.use_gelu", s->use_gelu);
	if (s->use_silu)
		kvi_gguf_w_bool(w, "clip.use_silu", 1);
	if (s->feature_layer) {
		int32_t fl[2] = {1, 2};
		kvi_gguf_w_arr_i32(w, "clip.vision.feature_layer", fl, 2);
	}
	if (s->pinpoints) {
		int32_t pp[4] = {336, 672, 672, 336};
		kvi_gguf_w_arr_i32(w, "clip.vision.image_grid_pinpoints", pp, 4);
	}
	kv_u32(b, "clip.vision.image_size", (uint32_t)s->image);
	kv_u32(b, "clip.vision.patch_size", (uint32_t)s->patch);
	kv_u32(b, "clip.vision.embedding_length", (uint32_t)s->E);
	kv_u32(b, "clip.vision.feed_forward_length", (uint32_t)s->F);
	kv_u32(b, "clip.vision.block_count", (uint32_t)s->L);
	kv_u32(b, "clip.vision.attention.head_count", (uint32_t)s->H);
	kv_u32(b, "clip.vision.projection_dim", (uint32_t)s->out);
	if (!s->skip || strcmp(s->skip, "clip.vision.attention.layer_norm_epsilon"))
		kvi_gguf_w_f32(w, "clip.vision.attention.layer_norm_epsilon", s->eps);
	float mean[4] = {0.48f, 0.45f, 0.40f, 0.1f}, std[3] = {s->std0, 0.26f, 0.27f};
	kvi_gguf_w_arr_f32(w, "clip.vision.image_mean", mean, (size_t)s->mean_n);
	kvi_gguf_w_arr_f32(w, "clip.vision.image_std", std, 3);
	int64_t E = s->E, F = s->F, P = s->patch,
		np = (int64_t)(s->image / s->patch) * (s->image / s->patch);
	float in_e = sqrtf(3.0f / (float)E), in_f = sqrtf(3.0f / (float)F);
	if (s->has_class)
		add(b, "v.class_embd", 1, E, 1, 1, 1, 0.5f, 0);
	add(b, "v.patch_embd.weight", 4, P, P, 3, E, sqrtf(1.0f / (float)(P * P)), 0);
	if (s->patch_bias)
		add(b, "v.patch_embd.bias", 1, E, 1, 1, 1, 0.1f, 0);
	add(b, "v.position_embd.weight", 2, E, np + s->has_class + s->pos_extra, 1, 1, 0.5f, 0);
	if (s->pre_ln) {
		add(b, "v.pre_ln.weight", 1, E, 1, 1, 1, 0.1f, 1);
		add(b, "v.pre_ln.bias", 1, E, 1, 1, 1, 0.1f, 0);
	}
	char n[64];
#define A(nm, nd, a0, a1, sc, nrm)                                                                 \
	(snprintf(n, sizeof(n), "v.blk.%d.%s", l, nm), add(b, n, nd, a0, a1, 1, 1, sc, nrm))
	for (int l = 0; l < s->L; l++) {
		A("ln1.weight", 1, E, 1, 0.1f, 1);
		A("ln1.bias", 1, E, 1, 0.1f, 0);
		A("attn_q.weight", 2, E, E, in_e, 0);
		A("attn_q.bias", 1, E, 1, 0.1f, 0);
		A("attn_k.weight", 2, E, E, in_e, 0);
		A("attn_k.bias", 1, E, 1, 0.1f, 0);
		A("attn_v.weight", 2, E, E, in_e, 0);
		A("attn_v.bias", 1, E, 1, 0.1f, 0);
		A("attn_out.weight", 2, E, E, in_e * 0.5f, 0);
		A("attn_out.bias", 1, E, 1, 0.1f, 0);
		A("ln2.weight", 1, E, 1, 0.1f, 1);
		A("ln2.bias", 1, E, 1, 0.1f, 0);
		const char *up = s->legacy_ffn ? "ffn_down" : "ffn_up";
		const char *dn = s->legacy_ffn ? "ffn_up" : "ffn_down";
		char nw[32], nb[32];
		snprintf(nw, sizeof(nw), "%s.weight", up);
		snprintf(nb, sizeof(nb), "%s.bias", up);
		A(nw, 2, E, F, in_e, 0);
		A(nb, 1, F, 1, 0.1f, 0);
		snprintf(nw, sizeof(nw), "%s.weight", dn);
		snprintf(nb, sizeof(nb), "%s.bias", dn);
		A(nw, 2, F, E, in_f * 0.5f, 0);
		A(nb, 1, E, 1, 0.1f, 0);
	}
#undef A
	if (s->post_ln) {
		add(b, "v.post_ln.weight", 1, E, 1, 1, 1, 0.1f, 1);
		add(b, "v.post_ln.bias", 1, E, 1, 1, 1, 0.1f, 0);
	}
	add(b, "mm.0.weight", 2, E, s->hidden, 1, 1, in_e, 0);
	add(b, "mm.0.bias", 1, s->hidden, 1, 1, 1, 0.1f, 0);
	add(b, "mm.2.weight", 2, s->hidden, s->out, 1, 1, sqrtf(3.0f / (float)s->hidden), 0);
	add(b, "mm.2.bias", 1, s->out, 1, 1, 1, 0.1f, 0);
	assert_int_equal(kvi_gguf_w_write_mem(w, NULL, NULL, buf, len), 0);
	for (int i = 0; i < b->n; i++)
		free(b->t[i].data);
	kvi_gguf_writer_free(w);
	free(b);
}

static int load_mem(const void *buf, size_t len, int threads, struct vit **v, char *err,
		    size_t errlen)
{
	struct kvi_gguf *g;
	int ret = kvi_gguf_open_mem(buf, len, &g, err, errlen);
	if (ret)
		return ret;
	return vit_from_gguf(g, threads, v, err, errlen);
}

static float *image(int S, unsigned seed)
{
	float *p = malloc((size_t)3 * S * S * sizeof(float));
	assert_non_null(p);
	uint64_t s = seed;
	for (int i = 0; i < 3 * S * S; i++)
		p[i] = 2.0f * urand(&s);
	return p;
}

static double rel_err(const float *a, const float *r, size_t n)
{
	double mx = 1, d = 0;
	for (size_t i = 0; i < n; i++)
		mx = fmax(mx, fabs(r[i]));
	for (size_t i = 0; i < n; i++) {
		if (!isfinite(a[i]))
			return INFINITY;
		d = fmax(d, fabs((double)a[i] - r[i]));
	}
	return d / mx;
}

/* Encodes a random image with the tower and the reference; returns the relative error. */
static double compare(const void *buf, size_t len, int threads)
{
	char err[256] = "";
	struct vit *v;
	int ret = load_mem(buf, len, threads, &v, err, sizeof(err));
	if (ret)
		fail_msg("load: %d %s", ret, err);
	const struct vit_info *I = vit_get_info(v);
	size_t n = (size_t)vit_n_tokens(v) * (size_t)vit_n_embd_out(v);
	float *px = image(I->image_size, 7), *out = malloc(n * 4), *ref = malloc(n * 4);
	assert_non_null(out);
	assert_non_null(ref);
	assert_int_equal(vit_encode(v, px, out), 0);
	struct kvi_gguf *g;
	assert_int_equal(kvi_gguf_open_mem(buf, len, &g, NULL, 0), 0);
	assert_int_equal(ref_vit_encode(g, px, ref), 0);
	kvi_gguf_close(g);
	double e = rel_err(out, ref, n);
	/* a useless comparison (all ~0) would pass anything: the outputs must carry signal */
	double mag = 0;
	for (size_t i = 0; i < n; i++)
		mag = fmax(mag, fabs(ref[i]));
	assert_true(mag > 0.1);
	free(px), free(out), free(ref);
	vit_free(v);
	return e;
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void test_vs_ref_all_optional(void **state)
{
	(void)state;
	struct spec s = base_spec();
	void *buf;
	size_t len;
	build(&s, 1, &buf, &len);
	double e = compare(buf, len, 3);
	print_message("f32, tanh gelu, every optional tensor: rel err %.3g\n", e);
	assert_true(e < 1e-4);
	free(buf);
}

static void test_vs_ref_variants(void **state)
{
	(void)state;
	/* no class token, no pre/post-LN, no patch bias, quick GELU, old projector key, F16 */
	struct spec s = base_spec();
	s.has_class = 0, s.pre_ln = 0, s.post_ln = 0, s.patch_bias = 0, s.use_gelu = 0;
	s.proj_type = NULL, s.wtype = KVK_W_F16, s.H = 2, s.L = 2;
	void *buf;
	size_t len;
	build(&s, 2, &buf, &len);
	double e = compare(buf, len, 2);
	print_message("f16, quick gelu, nothing optional: rel err %.3g\n", e);
	assert_true(e < 1e-4);
	free(buf);
	/* Q8_0 linear layers (patch kernel F16): the tower also quantizes activations to 8 bits
	 * per block of 32 and the reference does not, hence the engine's Q8_0 bound (engine.md) */
	s = base_spec();
	s.wtype = KVK_W_Q8_0, s.F = 96, s.hidden = 64;
	build(&s, 6, &buf, &len);
	e = compare(buf, len, 2);
	print_message("q8_0: rel err %.3g\n", e);
	assert_true(e < 6e-2);
	free(buf);
	/* one Q8_0 matrix among F32 ones (K of block 1): Q and V keep the float input */
	s = base_spec();
	s.q8_one = "v.blk.1.attn_k.weight";
	build(&s, 7, &buf, &len);
	e = compare(buf, len, 2);
	print_message("one q8_0 matrix: rel err %.3g\n", e);
	assert_true(e < 6e-2 && e > 1e-6); /* > 1e-6: the Q8_0 path did run */
	free(buf);
	s = base_spec();
	s.wtype = KVK_W_BF16, s.image = 12, s.patch = 3, s.E = 24, s.H = 3, s.L = 4;
	build(&s, 3, &buf, &len);
	e = compare(buf, len, 1);
	print_message("bf16, odd sizes: rel err %.3g\n", e);
	assert_true(e < 1e-4);
	free(buf);
}

/* Old LLaVA converters named fc1 ffn_down and fc2 ffn_up; llama.cpp swaps them back by
 * shape and so must the tower: the same weights under either naming give the same bits. */
static void test_legacy_ffn_names(void **state)
{
	(void)state;
	struct spec s = base_spec();
	void *b1, *b2;
	size_t l1, l2;
	build(&s, 8, &b1, &l1);
	s.legacy_ffn = 1;
	build(&s, 8, &b2, &l2);
	struct vit *a, *b;
	assert_int_equal(load_mem(b1, l1, 2, &a, NULL, 0), 0);
	char err[256] = "";
	int ret = load_mem(b2, l2, 2, &b, err, sizeof(err));
	if (ret)
		fail_msg("legacy naming refused: %d %s", ret, err);
	size_t n = (size_t)vit_n_tokens(a) * (size_t)vit_n_embd_out(a);
	float *px = image(s.image, 3), *oa = malloc(n * 4), *ob = malloc(n * 4);
	assert_int_equal(vit_encode(a, px, oa), 0);
	assert_int_equal(vit_encode(b, px, ob), 0);
	assert_memory_equal(oa, ob, n * 4);
	double e = compare(b2, l2, 1);
	print_message("legacy ffn names: rel err %.3g\n", e);
	assert_true(e < 1e-4);
	free(px), free(oa), free(ob), free(b1), free(b2);
	vit_free(a);
	vit_free(b);
}

/* Threads split rows and (head, query) pairs, never a reduction: the same bits. */
static void test_threads_bit_identical(void **state)
{
	(void)state;
	struct spec s = base_spec();
	void *buf;
	size_t len;
	build(&s, 4, &buf, &len);
	struct vit *a, *b;
	assert_int_equal(load_mem(buf, len, 1, &a, NULL, 0), 0);
	assert_int_equal(load_mem(buf, len, 4, &b, NULL, 0), 0);
	size_t n = (size_t)vit_n_tokens(a) * (size_t)vit_n_embd_out(a);
	float *px = image(s.image, 9), *oa = malloc(n * 4), *ob = malloc(n * 4);
	assert_int_equal(vit_encode(a, px, oa), 0);
	assert_int_equal(vit_encode(b, px, ob), 0);
	assert_memory_equal(oa, ob, n * 4);
	/* and a second encode on the same tower gives the same again (no state leaks) */
	assert_int_equal(vit_encode(b, px, ob), 0);
	assert_memory_equal(oa, ob, n * 4);
	assert_memory_equal(vit_fingerprint(a), vit_fingerprint(b), VIT_FINGERPRINT_BYTES);
	px[5] = NAN;
	assert_int_equal(vit_encode(a, px, oa), -ERANGE);
	assert_int_equal(vit_encode(a, NULL, oa), -EINVAL);
	free(px), free(oa), free(ob), free(buf);
	vit_free(a);
	vit_free(b);
}

/* ---- the device tower (vit_use_device) -------------------------------------------------------
 * Each file is encoded by the CPU tower, then by the same tower moved to the backend, and by
 * the reference. Bounds (docs/vision.md, "Device path"): F32 weights 1e-4 against both (f32
 * everywhere, other summation orders); F16 weights 2e-3 and BF16 1e-2 against both (the
 * device rounds each GEMM's activations to f16/bf16, as the device engine does; the CPU
 * kernels keep them f32); Q8_0 6e-2 against the CPU tower (the engine's Q8_0 bound: the CPU
 * tower quantizes the activations to 8 bits, the device does not) and 1e-3 against the
 * reference, which does not either. */

static int BACKEND = KVK_DEV_HOST;

static void dev_case(const char *what, const struct spec *s, uint64_t seed, double bound_cpu,
		     double bound_ref)
{
	void *buf;
	size_t len;
	build(s, seed, &buf, &len);
	struct vit *v;
	char err[256] = "";
	int ret = load_mem(buf, len, 2, &v, err, sizeof(err));
	if (ret)
		fail_msg("load: %d %s", ret, err);
	size_t n = (size_t)vit_n_tokens(v) * (size_t)vit_n_embd_out(v);
	float *px = image(s->image, 21), *cpu = malloc(n * 4), *dev = malloc(n * 4);
	float *ref = malloc(n * 4), *again = malloc(n * 4);
	assert_true(cpu && dev && ref && again);
	assert_string_equal(vit_backend(v), "cpu");
	assert_int_equal(vit_encode(v, px, cpu), 0);
	assert_int_equal(vit_use_device(v, BACKEND, 0), 0);
	assert_string_equal(vit_backend(v), BACKEND == KVK_DEV_CUDA ? "cuda" : "host");
	assert_int_equal(vit_use_device(v, BACKEND, 0), -EINVAL); /* once */
	assert_int_equal(vit_encode(v, px, dev), 0);
	struct kvi_gguf *g;
	assert_int_equal(kvi_gguf_open_mem(buf, len, &g, NULL, 0), 0);
	assert_int_equal(ref_vit_encode(g, px, ref), 0);
	kvi_gguf_close(g);
	double ec = rel_err(dev, cpu, n), er = rel_err(dev, ref, n), cr = rel_err(cpu, ref, n);
	print_message("%s on %s: rel err vs cpu tower %.3g, vs reference %.3g (cpu vs ref %.3g)\n",
		      what, vit_backend(v), ec, er, cr);
	assert_true(ec < bound_cpu);
	assert_true(er < bound_ref);
	/* deterministic: a second encode gives the same bits; a NaN pixel is -ERANGE */
	assert_int_equal(vit_encode(v, px, again), 0);
	assert_memory_equal(again, dev, n * 4);
	px[1] = NAN;
	assert_int_equal(vit_encode(v, px, again), -ERANGE);
	free(px), free(cpu), free(dev), free(ref), free(again), free(buf);
	vit_free(v);
}

static void test_device(void **state)
{
	(void)state;
	struct spec s = base_spec(); /* F32, tanh GELU, every optional tensor */
	dev_case("f32, every optional tensor", &s, 31, 1e-4, 1e-4);
	s = base_spec(); /* F16, quick GELU, no class token / pre / post-LN / patch bias */
	s.has_class = 0, s.pre_ln = 0, s.post_ln = 0, s.patch_bias = 0, s.use_gelu = 0;
	s.proj_type = NULL, s.wtype = KVK_W_F16, s.H = 2, s.L = 2;
	dev_case("f16, nothing optional", &s, 32, 2e-3, 2e-3);
	s = base_spec(); /* BF16, patch 3 (rows of 27), 3 heads of 8 */
	s.wtype = KVK_W_BF16, s.image = 12, s.patch = 3, s.E = 24, s.H = 3, s.L = 4;
	dev_case("bf16, odd sizes", &s, 33, 1e-2, 1e-2);
	s = base_spec(); /* Q8_0 linear layers, the patch kernel F16 */
	s.wtype = KVK_W_Q8_0, s.F = 96, s.hidden = 64;
	dev_case("q8_0", &s, 34, 6e-2, 1e-3);
	s = base_spec(); /* more tokens than an attention tile holds: 65 with the class token */
	s.image = 32, s.patch = 4, s.E = 64, s.H = 2;
	dev_case("f32, 65 tokens", &s, 35, 1e-4, 1e-4);
}

static void test_kvinfer_synth_file(void **state)
{
	(void)state;
	const char *bd = tu_need_build_dir();
	char path[512], cmd[1200];
	snprintf(path, sizeof(path), "/tmp/test_vit_%d.gguf", (int)getpid());
	snprintf(cmd, sizeof(cmd), "%s/tools/kvinfer-synth --preset small --mmproj %s >/dev/null",
		 bd, path);
	assert_int_equal(system(cmd), 0);
	char err[256] = "";
	struct vit *v;
	int ret = vit_load(path, 2, &v, err, sizeof(err));
	if (ret)
		fail_msg("kvinfer-synth's mmproj does not load: %d %s", ret, err);
	const struct vit_info *I = vit_get_info(v);
	assert_int_equal(vit_image_size(v), 32);
	assert_int_equal(I->patch_size, 8);
	assert_int_equal(vit_n_tokens(v), 16);
	assert_int_equal(vit_n_embd_out(v), 256); /* the small preset's width */
	assert_int_equal(I->proj_dim, 256);
	assert_int_equal(I->n_layer_run, I->n_layer - 1);
	assert_int_equal(I->has_class, 1);
	assert_int_equal(I->gelu_quick, 1);
	float mean[3], std[3];
	vit_image_mean(v, mean);
	vit_image_std(v, std);
	assert_true(fabsf(mean[0] - 0.48145466f) < 1e-7f && fabsf(std[2] - 0.27577711f) < 1e-7f);
	/* fingerprint = SHA-256 of the file's bytes */
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	long fl = ftell(f);
	fseek(f, 0, SEEK_SET);
	void *bytes = malloc((size_t)fl);
	assert_int_equal(fread(bytes, 1, (size_t)fl, f), (size_t)fl);
	fclose(f);
	uint8_t md[32];
	unsigned int mdl;
	assert_int_equal(EVP_Digest(bytes, (size_t)fl, md, &mdl, EVP_sha256(), NULL), 1);
	assert_memory_equal(md, vit_fingerprint(v), 32);
	vit_free(v);
	double e = compare(bytes, (size_t)fl, 2);
	print_message("kvinfer-synth mmproj (f16): rel err %.3g\n", e);
	assert_true(e < 1e-4);
	free(bytes);
	/* --type q8_0: Q8_0 linear layers, F16 patch kernel; loads, and within the Q8_0 bound */
	snprintf(cmd, sizeof(cmd),
		 "%s/tools/kvinfer-synth --preset tiny --type q8_0 --mmproj %s >/dev/null", bd,
		 path);
	assert_int_equal(system(cmd), 0);
	struct kvi_gguf *g;
	assert_int_equal(kvi_gguf_open(path, &g, NULL, 0), 0);
	assert_int_equal(kvi_gguf_find_tensor(g, "mm.2.weight")->type, KVK_W_Q8_0);
	assert_int_equal(kvi_gguf_find_tensor(g, "v.patch_embd.weight")->type, KVK_W_F16);
	size_t ql;
	const void *qb = kvi_gguf_base(g, &ql);
	e = compare(qb, ql, 2);
	print_message("kvinfer-synth mmproj (q8_0): rel err %.3g\n", e);
	assert_true(e < 6e-2);
	kvi_gguf_close(g);
	unlink(path);
}

struct bad {
	const char *what, *expect;
	void (*mod)(struct spec *);
};

static void m_no_vis(struct spec *s)
{
	s->has_vis = 0;
}
static void m_skip_vis(struct spec *s)
{
	s->skip = "clip.has_vision_encoder";
}
static void m_proj(struct spec *s)
{
	s->proj_type = "ldp";
}
static void m_silu(struct spec *s)
{
	s->use_silu = 1;
}
static void m_feat(struct spec *s)
{
	s->feature_layer = 1;
}
static void m_pinpoints(struct spec *s)
{
	s->pinpoints = 1;
}
static void m_skip_img(struct spec *s)
{
	s->skip = "clip.vision.image_size";
}
static void m_patch(struct spec *s)
{
	s->patch = 5;
}
static void m_heads(struct spec *s)
{
	s->H = 5;
}
static void m_layers(struct spec *s)
{
	s->L = 0;
}
static void m_huge(struct spec *s)
{
	s->image = 1 << 20;
	s->skip = "v.position_embd.weight";
}
static void m_many(struct spec *s)
{
	s->image = 4096, s->patch = 1, s->skip = "v.position_embd.weight";
}
static void m_eps(struct spec *s)
{
	s->eps = 0;
}
static void m_skip_eps(struct spec *s)
{
	s->skip = "clip.vision.attention.layer_norm_epsilon";
}
static void m_mean(struct spec *s)
{
	s->mean_n = 2;
}
static void m_std(struct spec *s)
{
	s->std0 = 0;
}
static void m_pos(struct spec *s)
{
	s->pos_extra = 1;
}
static void m_q(struct spec *s)
{
	s->bad_name = "v.blk.1.attn_q.weight";
}
static void m_up(struct spec *s)
{
	s->bad_name = "v.blk.0.ffn_up.bias";
}
static void m_patchw(struct spec *s)
{
	s->bad_name = "v.patch_embd.weight";
}
static void m_q4(struct spec *s)
{
	s->q4_name = "v.blk.0.attn_k.weight";
}
static void m_skip_ln(struct spec *s)
{
	s->skip = "v.blk.2.ln2.weight";
}
static void m_skip_out(struct spec *s)
{
	s->skip = "v.blk.1.attn_out.weight";
}
static void m_skip_mm2(struct spec *s)
{
	s->skip = "mm.2.weight";
}
static void m_mm2(struct spec *s)
{
	s->bad_name = "mm.2.weight";
}
static void m_mm2b(struct spec *s)
{
	s->bad_name = "mm.2.bias";
}
static void m_preln(struct spec *s)
{
	s->skip = "v.pre_ln.weight";
}

static void test_bad_files(void **state)
{
	(void)state;
	static const struct bad B[] = {
	    {"vision encoder false", "has_vision_encoder is false", m_no_vis},
	    {"no has_vision_encoder", "missing required key 'clip.has_vision_encoder'", m_skip_vis},
	    {"projector ldp", "projector_type 'ldp' is not supported", m_proj},
	    {"silu", "use_silu", m_silu},
	    {"feature layers", "feature_layer", m_feat},
	    {"any-resolution", "image_grid_pinpoints (LLaVA-1.6", m_pinpoints},
	    {"no image size", "missing required key 'clip.vision.image_size'", m_skip_img},
	    {"patch 5 of 16", "does not divide image_size", m_patch},
	    {"5 heads of 32", "head_count = 5 does not divide", m_heads},
	    {"0 blocks", "'clip.vision.block_count' = 0 out of range", m_layers},
	    {"image 2^20", "'clip.vision.image_size' = 1048576 out of range", m_huge},
	    {"4096^2 patches", "patches: more than", m_many},
	    {"eps 0", "layer_norm_epsilon' must be a float in (0, 1)", m_eps},
	    {"no eps", "missing required key 'clip.vision.attention.layer_norm_epsilon'",
	     m_skip_eps},
	    {"mean of 2", "'clip.vision.image_mean' must be an array of 3 f32", m_mean},
	    {"std 0", "'clip.vision.image_std'[0] = 0 is not a positive", m_std},
	    {"pos rows", "tensor 'v.position_embd.weight' has shape [32, 18], expected [32, 17]",
	     m_pos},
	    {"attn_q shape", "tensor 'v.blk.1.attn_q.weight' has shape [33, 32]", m_q},
	    {"ffn_up bias", "tensor 'v.blk.0.ffn_up.bias' has shape [81]", m_up},
	    {"patch kernel", "tensor 'v.patch_embd.weight' has shape [5, 4, 3, 32]", m_patchw},
	    {"q4_0 matrix",
	     "'v.blk.0.attn_k.weight' has type Q4_0 (supported: F32, F16, BF16, Q8_0)", m_q4},
	    {"no ln2", "missing tensor 'v.blk.2.ln2.weight'", m_skip_ln},
	    {"no attn_out", "missing tensor 'v.blk.1.attn_out.weight'", m_skip_out},
	    {"no mm.2", "missing tensor 'mm.2.weight'", m_skip_mm2},
	    {"mm.2 shape", "tensor 'mm.2.weight' has shape [49, 40], expected [48, 40]", m_mm2},
	    {"mm.2 bias", "tensor 'mm.2.bias' has shape [41]", m_mm2b},
	    {"pre_ln bias alone", "'v.pre_ln.bias' without 'v.pre_ln.weight'", m_preln},
	};
	for (size_t i = 0; i < sizeof(B) / sizeof(B[0]); i++) {
		struct spec s = base_spec();
		B[i].mod(&s);
		void *buf;
		size_t len;
		build(&s, 10 + i, &buf, &len);
		char err[256] = "";
		struct vit *v = NULL;
		int ret = load_mem(buf, len, 2, &v, err, sizeof(err));
		if (ret != -EINVAL || !strstr(err, B[i].expect))
			fail_msg("%s: expected -EINVAL with '%s', got %d '%s'", B[i].what,
				 B[i].expect, ret, err);
		assert_null(v);
		/* every truncation of the file fails cleanly too (the GGUF reader's checks) */
		if (i == 0) {
			struct spec ok = base_spec();
			free(buf);
			build(&ok, 1, &buf, &len);
			for (size_t cut = 0; cut < len; cut += len / 97 + 1) {
				ret = load_mem(buf, cut, 1, &v, err, sizeof(err));
				assert_true(ret < 0);
				assert_null(v);
			}
		}
		free(buf);
	}
	struct vit *v = (struct vit *)1;
	assert_true(vit_load("/nonexistent/mmproj.gguf", 1, &v, NULL, 0) < 0);
	assert_null(v);
}

/* Writes the fuzzer's seed (tests/fuzz/corpus/fuzz_vit/) when KVFS_VIT_SEED_OUT names a
 * file: a tower of 4 patches, 8 wide, F16, every optional tensor. */
static void test_fuzz_seed(void **state)
{
	(void)state;
	struct spec s = base_spec();
	s.image = 8, s.patch = 4, s.E = 8, s.F = 16, s.L = 2, s.H = 2, s.hidden = 8, s.out = 8;
	s.wtype = KVK_W_F16;
	void *buf;
	size_t len;
	build(&s, 5, &buf, &len);
	struct vit *v;
	assert_int_equal(load_mem(buf, len, 1, &v, NULL, 0), 0);
	vit_free(v);
	const char *out = getenv("KVFS_VIT_SEED_OUT");
	if (out) {
		FILE *f = fopen(out, "wb");
		assert_non_null(f);
		assert_int_equal(fwrite(buf, 1, len, f), len);
		assert_int_equal(fclose(f), 0);
	}
	free(buf);
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "--cuda")) {
		if (kvk_cuda_device_count() == 0) {
			printf("skipped: no GPU (or no CUDA in this build)\n");
			return 77;
		}
		BACKEND = KVK_DEV_CUDA;
		const struct CMUnitTest dev[] = {cmocka_unit_test(test_device)};
		return cmocka_run_group_tests_name("vit_cuda", dev, NULL, NULL);
	}
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_device),	     cmocka_unit_test(test_vs_ref_all_optional),
	    cmocka_unit_test(test_vs_ref_variants),  cmocka_unit_test(test_threads_bit_identical),
	    cmocka_unit_test(test_legacy_ffn_names), cmocka_unit_test(test_kvinfer_synth_file),
	    cmocka_unit_test(test_bad_files),	     cmocka_unit_test(test_fuzz_seed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
