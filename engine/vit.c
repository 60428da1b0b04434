/* vit — the vision tower: mmproj loading and checks, the CPU forward on the thread pool. */
#include "vit.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "gguf.h"
#include "kvk.h"
#include "pool.h"
#include "vit_int.h"

/* Limits: far above any CLIP/SigLIP tower, low enough that every size product below fits
 * comfortably in size_t and a hostile header cannot ask for absurd buffers. */
#define VIT_MAX_IMAGE	4096
#define VIT_MAX_PATCHES 16384
#define VIT_MAX_EMBD	16384
#define VIT_MAX_FF	65536
#define VIT_MAX_LAYER	256
#define VIT_MAX_OUT	65536

/* ---- errors ------------------------------------------------------------------------------ */

struct ld {
	struct vit *v;
	char *err;
	size_t errlen;
};

static int lfail(struct ld *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int lfail(struct ld *l, const char *fmt, ...)
{
	if (l->err && l->errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(l->err, l->errlen, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

/* ---- metadata ------------------------------------------------------------------------------ */

static int key_u32(struct ld *l, const char *key, int lo, int hi, int *out)
{
	uint32_t u;
	int ret = kvi_gguf_get_u32(l->v->g, key, &u);
	if (ret == -ENOENT)
		return lfail(l, "missing required key '%s'", key);
	if (ret == -EINVAL)
		return lfail(l, "key '%s' is not an integer", key);
	if (ret)
		return lfail(l, "key '%s' is negative or larger than 2^32 (allowed: [%d, %d])", key,
			     lo, hi);
	if (u < (uint32_t)lo || u > (uint32_t)hi)
		return lfail(l, "key '%s' = %u out of range [%d, %d]", key, u, lo, hi);
	*out = (int)u;
	return 0;
}

/* Optional bool: absent -> def. */
static int key_bool(struct ld *l, const char *key, int def, int *out)
{
	int ret = kvi_gguf_get_bool(l->v->g, key, out);
	if (ret == -ENOENT) {
		*out = def;
		return 0;
	}
	return ret ? lfail(l, "key '%s' is not a bool", key) : 0;
}

static int key_f32x3(struct ld *l, const char *key, int positive, float out[3])
{
	enum kvi_gguf_type et;
	uint64_t n;
	int ret = kvi_gguf_get_arr(l->v->g, key, &et, &n);
	if (ret == -ENOENT)
		return lfail(l, "missing required key '%s'", key);
	if (ret || et != KVI_GGUF_F32 || n != 3)
		return lfail(l, "key '%s' must be an array of 3 f32 (one per RGB channel)", key);
	int64_t kv = kvi_gguf_find_kv(l->v->g, key);
	for (uint64_t i = 0; i < 3; i++) {
		if (kvi_gguf_arr_f32(l->v->g, kv, i, &out[i]) || !isfinite(out[i]) ||
		    (positive && !(out[i] > 0)))
			return lfail(l, "key '%s'[%u] = %g is not a %s number", key, (unsigned)i,
				     (double)out[i], positive ? "positive finite" : "finite");
	}
	return 0;
}

static int load_hparams(struct ld *l)
{
	struct vit *v = l->v;
	struct vit_info *I = &v->info;
	int b, ret;
	if ((ret = key_bool(l, "clip.has_vision_encoder", -1, &b)))
		return ret;
	if (b != 1)
		return lfail(l, b < 0 ? "missing required key 'clip.has_vision_encoder'"
				      : "clip.has_vision_encoder is false: no vision tower");
	/* projector: clip.projector_type, or the older clip.has_llava_projector (= mlp) */
	const char *pt;
	size_t ptlen;
	ret = kvi_gguf_get_str(v->g, "clip.projector_type", &pt, &ptlen);
	if (ret == -ENOENT) {
		if ((ret = key_bool(l, "clip.has_llava_projector", 0, &b)))
			return ret;
		if (!b)
			return lfail(l, "missing key 'clip.projector_type' (and no "
					"clip.has_llava_projector)");
	} else if (ret) {
		return lfail(l, "key 'clip.projector_type' is not a string");
	} else if (ptlen != 3 || memcmp(pt, "mlp", 3)) {
		return lfail(l, "clip.projector_type '%.*s' is not supported (supported: mlp)",
			     ptlen > 64 ? 64 : (int)ptlen, pt);
	}
	if ((ret = key_bool(l, "clip.use_silu", 0, &b)))
		return ret;
	if (b)
		return lfail(l, "clip.use_silu = true is not supported (GELU towers only)");
	if ((ret = key_bool(l, "clip.use_gelu", 0, &b)))
		return ret;
	I->gelu_quick = !b;
	/* LLaVA-1.6 any-resolution: llama.cpp then encodes several crops plus newline tokens;
	 * one fixed-size encode would silently give other embeddings, so refuse it */
	if (kvi_gguf_find_kv(v->g, "clip.vision.image_grid_pinpoints") >= 0)
		return lfail(l, "clip.vision.image_grid_pinpoints (LLaVA-1.6 any-resolution) is "
				"not supported");
	if (kvi_gguf_find_kv(v->g, "clip.vision.feature_layer") >= 0)
		return lfail(l, "clip.vision.feature_layer (stacked feature layers) is not "
				"supported");
	if ((ret = key_u32(l, "clip.vision.image_size", 1, VIT_MAX_IMAGE, &I->image_size)) ||
	    (ret = key_u32(l, "clip.vision.patch_size", 1, VIT_MAX_IMAGE, &I->patch_size)) ||
	    (ret = key_u32(l, "clip.vision.embedding_length", 1, VIT_MAX_EMBD, &I->n_embd)) ||
	    (ret = key_u32(l, "clip.vision.feed_forward_length", 1, VIT_MAX_FF, &I->n_ff)) ||
	    (ret = key_u32(l, "clip.vision.block_count", 1, VIT_MAX_LAYER, &I->n_layer)) ||
	    (ret = key_u32(l, "clip.vision.attention.head_count", 1, VIT_MAX_EMBD, &I->n_head)) ||
	    (ret = key_u32(l, "clip.vision.projection_dim", 1, VIT_MAX_OUT, &I->proj_dim)))
		return ret;
	if (I->image_size % I->patch_size)
		return lfail(l, "clip.vision.patch_size = %d does not divide image_size = %d",
			     I->patch_size, I->image_size);
	int side = I->image_size / I->patch_size;
	if (side > VIT_MAX_PATCHES / side)
		return lfail(l, "%d x %d patches: more than %d", side, side, VIT_MAX_PATCHES);
	I->n_patches = side * side;
	if (I->n_embd % I->n_head)
		return lfail(l,
			     "clip.vision.attention.head_count = %d does not divide "
			     "embedding_length = %d",
			     I->n_head, I->n_embd);
	I->n_layer_run = I->n_layer - 1;
	ret = kvi_gguf_get_f32(v->g, "clip.vision.attention.layer_norm_epsilon", &I->eps);
	if (ret == -ENOENT)
		return lfail(l, "missing required key 'clip.vision.attention.layer_norm_epsilon'");
	if (ret || !(I->eps > 0 && I->eps < 1))
		return lfail(l, "key 'clip.vision.attention.layer_norm_epsilon' must be a float in "
				"(0, 1)");
	if ((ret = key_f32x3(l, "clip.vision.image_mean", 0, v->mean)) ||
	    (ret = key_f32x3(l, "clip.vision.image_std", 1, v->std)))
		return ret;
	return 0;
}

/* ---- tensors ------------------------------------------------------------------------------ */

static const char *dims_str(const int64_t *ne, int n, char *buf, size_t cap)
{
	size_t o = 0;
	for (int i = 0; i < n && o < cap; i++)
		o += (size_t)snprintf(buf + o, cap - o, i ? ", %lld" : "%lld", (long long)ne[i]);
	return buf;
}

/* Finds name with exactly the n dims ne; NULL + *ret = 0 when absent and optional. */
static const struct kvi_gguf_tensor *find_t(struct ld *l, const char *name, int n,
					    const int64_t *ne, int optional, int *ret)
{
	*ret = 0;
	const struct kvi_gguf_tensor *t = kvi_gguf_find_tensor(l->v->g, name);
	if (!t) {
		if (!optional)
			*ret = lfail(l, "missing tensor '%s'", name);
		return NULL;
	}
	int ok = (int)t->n_dims == n;
	for (int i = 0; i < n && ok; i++)
		ok = t->ne[i] == ne[i];
	if (!ok) {
		char want[96], got[96];
		*ret = lfail(l, "tensor '%s' has shape [%s], expected [%s]", name,
			     dims_str(t->ne, (int)t->n_dims, got, sizeof(got)),
			     dims_str(ne, n, want, sizeof(want)));
		return NULL;
	}
	return t;
}

static int is_float_type(uint32_t t)
{
	return t == KVK_W_F32 || t == KVK_W_F16 || t == KVK_W_BF16;
}

/* Linear layers also take Q8_0 (llama.cpp's quantized mmproj files): the kernels' int8 path
 * with activations quantized per token (kvk_act_prepare). */
static int get_mat(struct ld *l, const char *name, int64_t n, int64_t rows, struct vit_mat *m)
{
	int ret;
	int64_t ne[2] = {n, rows};
	const struct kvi_gguf_tensor *t = find_t(l, name, 2, ne, 0, &ret);
	if (!t)
		return ret;
	if (!is_float_type(t->type) && t->type != KVK_W_Q8_0)
		return lfail(l, "tensor '%s' has type %s (supported: F32, F16, BF16, Q8_0)", name,
			     kvi_gguf_type_name(t->type) ? kvi_gguf_type_name(t->type) : "?");
	if (!kvk_row_bytes((enum kvk_wtype)t->type, (size_t)n))
		return lfail(l, "tensor '%s': rows of %lld elements are not whole %s blocks", name,
			     (long long)n, kvi_gguf_type_name(t->type));
	if (t->type == KVK_W_Q8_0)
		l->v->has_q8 = 1;
	*m = (struct vit_mat){(enum kvk_wtype)t->type, t->data, (size_t)n, (size_t)rows};
	return 0;
}

/* A float table of rows x n (1-D when rows == 0) converted to owned f32; optional ones may
 * come back NULL. */
static int get_vec(struct ld *l, const char *name, int64_t n, int64_t rows, int optional,
		   float **out)
{
	int ret;
	int64_t ne[2] = {n, rows};
	*out = NULL;
	const struct kvi_gguf_tensor *t = find_t(l, name, rows ? 2 : 1, ne, optional, &ret);
	if (!t)
		return ret;
	if (!is_float_type(t->type))
		return lfail(l, "tensor '%s' has type %s (supported: F32, F16, BF16)", name,
			     kvi_gguf_type_name(t->type) ? kvi_gguf_type_name(t->type) : "?");
	size_t r = rows ? (size_t)rows : 1;
	float *p = malloc(r * (size_t)n * sizeof(float));
	if (!p)
		return -ENOMEM;
	for (size_t i = 0; i < r; i++)
		kvk_row_to_f32((enum kvk_wtype)t->type, t->data, (size_t)n, i, p + i * (size_t)n);
	*out = p;
	return 0;
}

static int load_tensors(struct ld *l)
{
	struct vit *v = l->v;
	struct vit_info *I = &v->info;
	int64_t E = I->n_embd, F = I->n_ff, P = I->patch_size;
	int ret;
	{
		int64_t ne[4] = {P, P, 3, E};
		const struct kvi_gguf_tensor *t = find_t(l, "v.patch_embd.weight", 4, ne, 0, &ret);
		if (!t)
			return ret;
		if (!is_float_type(t->type))
			return lfail(l,
				     "tensor 'v.patch_embd.weight' has type %s (supported: F32, "
				     "F16, BF16)",
				     kvi_gguf_type_name(t->type) ? kvi_gguf_type_name(t->type)
								 : "?");
		/* [E][3][P][P] row-major: row e is the kernel of output channel e in (c, y, x)
		 * order, which is the im2col column order vit_encode gathers */
		v->patch = (struct vit_mat){(enum kvk_wtype)t->type, t->data, (size_t)(3 * P * P),
					    (size_t)E};
	}
	if ((ret = get_vec(l, "v.patch_embd.bias", E, 0, 1, &v->patch_b)) ||
	    (ret = get_vec(l, "v.class_embd", E, 0, 1, &v->cls)))
		return ret;
	I->has_class = v->cls != NULL;
	if ((ret = get_vec(l, "v.position_embd.weight", E, I->n_patches + I->has_class, 0,
			   &v->pos)) ||
	    (ret = get_vec(l, "v.pre_ln.weight", E, 0, 1, &v->pre_w)) ||
	    (ret = get_vec(l, "v.pre_ln.bias", E, 0, 1, &v->pre_b)) ||
	    (ret = get_vec(l, "v.post_ln.weight", E, 0, 1, &v->post_w)) ||
	    (ret = get_vec(l, "v.post_ln.bias", E, 0, 1, &v->post_b)))
		return ret;
	if (!v->pre_w && v->pre_b)
		return lfail(l, "tensor 'v.pre_ln.bias' without 'v.pre_ln.weight'");
	if (!v->post_w && v->post_b)
		return lfail(l, "tensor 'v.post_ln.bias' without 'v.post_ln.weight'");
	v->blk = calloc((size_t)I->n_layer, sizeof(*v->blk));
	if (!v->blk)
		return -ENOMEM;
	char nm[64];
#define NM(s) (snprintf(nm, sizeof(nm), "v.blk.%d.%s", i, s), nm)
	for (int i = 0; i < I->n_layer; i++) {
		struct vit_blk *b = &v->blk[i];
		/* Older LLaVA converters wrote fc1 as ffn_down and fc2 as ffn_up; llama.cpp swaps
		 * them back when ffn_down's rows have n_embd elements, and so do we (the same
		 * test, so a file means what it means to clip.cpp, also when n_ff == n_embd). */
		const struct kvi_gguf_tensor *fd =
		    kvi_gguf_find_tensor(v->g, NM("ffn_down.weight"));
		int sw = fd && fd->n_dims == 2 && fd->ne[0] == E;
		const char *up = sw ? "ffn_down" : "ffn_up", *down = sw ? "ffn_up" : "ffn_down";
		char upw[32], upb[32], dnw[32], dnb[32];
		snprintf(upw, sizeof(upw), "%s.weight", up);
		snprintf(upb, sizeof(upb), "%s.bias", up);
		snprintf(dnw, sizeof(dnw), "%s.weight", down);
		snprintf(dnb, sizeof(dnb), "%s.bias", down);
		if ((ret = get_vec(l, NM("ln1.weight"), E, 0, 0, &b->ln1_w)) ||
		    (ret = get_vec(l, NM("ln1.bias"), E, 0, 1, &b->ln1_b)) ||
		    (ret = get_mat(l, NM("attn_q.weight"), E, E, &b->q)) ||
		    (ret = get_vec(l, NM("attn_q.bias"), E, 0, 1, &b->bq)) ||
		    (ret = get_mat(l, NM("attn_k.weight"), E, E, &b->k)) ||
		    (ret = get_vec(l, NM("attn_k.bias"), E, 0, 1, &b->bk)) ||
		    (ret = get_mat(l, NM("attn_v.weight"), E, E, &b->v)) ||
		    (ret = get_vec(l, NM("attn_v.bias"), E, 0, 1, &b->bv)) ||
		    (ret = get_mat(l, NM("attn_out.weight"), E, E, &b->o)) ||
		    (ret = get_vec(l, NM("attn_out.bias"), E, 0, 1, &b->bo)) ||
		    (ret = get_vec(l, NM("ln2.weight"), E, 0, 0, &b->ln2_w)) ||
		    (ret = get_vec(l, NM("ln2.bias"), E, 0, 1, &b->ln2_b)) ||
		    (ret = get_mat(l, NM(upw), E, F, &b->up)) ||
		    (ret = get_vec(l, NM(upb), F, 0, 1, &b->bup)) ||
		    (ret = get_mat(l, NM(dnw), F, E, &b->down)) ||
		    (ret = get_vec(l, NM(dnb), E, 0, 1, &b->bdown)))
			return ret;
	}
#undef NM
	/* the projector: mm.0 [E -> H], mm.2 [H -> out]; widths come from the tensors */
	const struct kvi_gguf_tensor *m0 = kvi_gguf_find_tensor(v->g, "mm.0.weight");
	const struct kvi_gguf_tensor *m2 = kvi_gguf_find_tensor(v->g, "mm.2.weight");
	if (!m0 || !m2)
		return lfail(l, "missing tensor '%s' (mlp projector)",
			     !m0 ? "mm.0.weight" : "mm.2.weight");
	if (m0->n_dims != 2 || m0->ne[1] < 1 || m0->ne[1] > VIT_MAX_OUT)
		return lfail(l, "tensor 'mm.0.weight' must be 2-D with 1..%d rows", VIT_MAX_OUT);
	I->n_mm_hidden = (int)m0->ne[1];
	if (m2->n_dims != 2 || m2->ne[1] < 1 || m2->ne[1] > VIT_MAX_OUT)
		return lfail(l, "tensor 'mm.2.weight' must be 2-D with 1..%d rows", VIT_MAX_OUT);
	I->n_embd_out = (int)m2->ne[1];
	if ((ret = get_mat(l, "mm.0.weight", E, I->n_mm_hidden, &v->mm0)) ||
	    (ret = get_vec(l, "mm.0.bias", I->n_mm_hidden, 0, 1, &v->mm0_b)) ||
	    (ret = get_mat(l, "mm.2.weight", I->n_mm_hidden, I->n_embd_out, &v->mm2)) ||
	    (ret = get_vec(l, "mm.2.bias", I->n_embd_out, 0, 1, &v->mm2_b)))
		return ret;
	return 0;
}

/* ---- creation ------------------------------------------------------------------------------ */

static float *falloc(size_t n)
{
	size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
	float *p = aligned_alloc(64, bytes ? bytes : 64);
	if (p)
		memset(p, 0, bytes);
	return p;
}

static size_t maxz(size_t a, size_t b)
{
	return a > b ? a : b;
}

static int alloc_state(struct vit *v, int n_threads)
{
	const struct vit_info *I = &v->info;
	size_t T = (size_t)(I->n_patches + I->has_class), E = (size_t)I->n_embd;
	size_t NP = (size_t)I->n_patches, K = (size_t)(3 * I->patch_size * I->patch_size);
	int ret = kvi_pool_create(n_threads, &v->pool);
	if (ret)
		return ret;
	v->n_threads = n_threads;
	v->isa = kvk_isa_best();
	v->x = falloc(T * E);
	v->h = falloc(T * E);
	v->q = falloc(T * E);
	v->k = falloc(T * E);
	v->v = falloc(T * E);
	v->a = falloc(T * E);
	v->u = falloc(T * (size_t)I->n_ff);
	v->col = falloc(NP * K);
	v->mid = falloc(NP * (size_t)I->n_mm_hidden);
	v->scratch = calloc((size_t)n_threads, sizeof(float *));
	if (!v->x || !v->h || !v->q || !v->k || !v->v || !v->a || !v->u || !v->col || !v->mid ||
	    !v->scratch)
		return -ENOMEM;
	size_t sc = T;
	size_t D = E / (size_t)I->n_head;
	size_t widths[] = {K, E, (size_t)I->n_ff, (size_t)I->n_mm_hidden, D, T};
	for (size_t i = 0; i < sizeof(widths) / sizeof(widths[0]); i++)
		for (int wt = 0; wt < 4; wt++) {
			static const enum kvk_wtype W[] = {KVK_W_F32, KVK_W_F16, KVK_W_BF16,
							   KVK_W_Q8_0};
			sc = maxz(sc, kvk_matmul_scratch_floats(W[wt], widths[i]));
		}
	/* attention: Q_h, K_h, V_h^T, scores, O_h per thread (attn_run) */
	v->ascr = calloc((size_t)n_threads, sizeof(float *));
	if (!v->ascr)
		return -ENOMEM;
	size_t TD = (T * D + 15) & ~(size_t)15, TT = (T * T + 15) & ~(size_t)15;
	for (int i = 0; i < n_threads; i++)
		if (!(v->scratch[i] = falloc(sc)) || !(v->ascr[i] = falloc(4 * TD + TT)))
			return -ENOMEM;
	if (v->has_q8) {
		size_t ab = 0;
		for (size_t i = 0; i < sizeof(widths) / sizeof(widths[0]); i++)
			ab = maxz(ab, kvk_act_bytes(KVK_W_Q8_0, widths[i], T));
		if (!(v->act = falloc((ab + 3) / 4)))
			return -ENOMEM;
	}
	return 0;
}

static int fingerprint(struct vit *v)
{
	size_t len;
	const void *base = kvi_gguf_base(v->g, &len);
	unsigned int n = 0;
	if (EVP_Digest(base, len, v->fp, &n, EVP_sha256(), NULL) != 1 || n != sizeof(v->fp))
		return -EIO;
	return 0;
}

int vit_from_gguf(struct kvi_gguf *g, int n_threads, struct vit **out, char *err, size_t errlen)
{
	if (err && errlen)
		err[0] = 0;
	*out = NULL;
	if (n_threads < 1 || n_threads > 1024) {
		if (err && errlen)
			snprintf(err, errlen, "n_threads = %d out of range [1, 1024]", n_threads);
		kvi_gguf_close(g);
		return -EINVAL;
	}
	struct vit *v = calloc(1, sizeof(*v));
	if (!v) {
		kvi_gguf_close(g);
		return -ENOMEM;
	}
	v->g = g;
	struct ld l = {v, err, errlen};
	int ret = load_hparams(&l);
	if (!ret)
		ret = load_tensors(&l);
	if (!ret)
		ret = alloc_state(v, n_threads);
	if (!ret)
		ret = fingerprint(v);
	if (ret) {
		if (ret == -ENOMEM && err && errlen && !err[0])
			snprintf(err, errlen, "out of memory");
		vit_free(v);
		return ret;
	}
	*out = v;
	return 0;
}

int vit_load(const char *path, int n_threads, struct vit **out, char *err, size_t errlen)
{
	struct kvi_gguf *g;
	*out = NULL;
	int ret = kvi_gguf_open(path, &g, err, errlen);
	if (ret)
		return ret;
	return vit_from_gguf(g, n_threads, out, err, errlen);
}

void vit_free(struct vit *v)
{
	if (!v)
		return;
	vit_dev_free(v->dev);
	kvi_pool_destroy(v->pool);
	if (v->scratch)
		for (int i = 0; i < v->n_threads; i++)
			free(v->scratch[i]);
	free(v->scratch);
	if (v->ascr)
		for (int i = 0; i < v->n_threads; i++)
			free(v->ascr[i]);
	free(v->ascr);
	free(v->act);
	float *f[] = {v->x,	v->h,	  v->q,	     v->k,	 v->v,	   v->a,
		      v->u,	v->col,	  v->mid,    v->patch_b, v->cls,   v->pos,
		      v->pre_w, v->pre_b, v->post_w, v->post_b,	 v->mm0_b, v->mm2_b};
	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
		free(f[i]);
	if (v->blk)
		for (int i = 0; i < v->info.n_layer; i++) {
			struct vit_blk *b = &v->blk[i];
			float *bf[] = {b->bq,	 b->bk,	   b->bv,    b->bo,    b->bup,
				       b->bdown, b->ln1_w, b->ln1_b, b->ln2_w, b->ln2_b};
			for (size_t j = 0; j < sizeof(bf) / sizeof(bf[0]); j++)
				free(bf[j]);
		}
	free(v->blk);
	kvi_gguf_close(v->g);
	free(v);
}

/* ---- getters ------------------------------------------------------------------------------- */

const struct vit_info *vit_get_info(const struct vit *v)
{
	return &v->info;
}

int vit_n_tokens(const struct vit *v)
{
	return v->info.n_patches;
}

int vit_n_embd_out(const struct vit *v)
{
	return v->info.n_embd_out;
}

int vit_image_size(const struct vit *v)
{
	return v->info.image_size;
}

void vit_image_mean(const struct vit *v, float mean[3])
{
	memcpy(mean, v->mean, sizeof(v->mean));
}

void vit_image_std(const struct vit *v, float std[3])
{
	memcpy(std, v->std, sizeof(v->std));
}

const uint8_t *vit_fingerprint(const struct vit *v)
{
	return v->fp;
}

/* ---- forward ------------------------------------------------------------------------------- */

static float gelu(float x, int quick)
{
	if (quick)
		return x / (1.0f + expf(-1.702f * x));
	return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

/* y (ntok x rows) = x (ntok x n) . W^T + b, then an epilogue on this share's rows:
 * gelu, or accumulate into resid (resid += y). */
struct lin_job {
	struct vit *v;
	const struct vit_mat *w;
	const float *x, *b;
	float *y, *resid;
	size_t ntok;
	int act;	    /* 0 none, 1 gelu(file's kind), 2 tanh gelu (projector) */
	const void *act_in; /* x, or x quantized for Q8_0 weights */
};

static void prep_run(void *arg, int share, int nshares, int thread)
{
	(void)thread;
	struct lin_job *j = arg;
	long lo, hi;
	kvi_pool_split((long)j->ntok, share, nshares, 1, &lo, &hi);
	if (lo < hi)
		kvk_act_prepare(j->w->type, j->v->act, j->ntok, j->x, j->w->n, j->w->n, (size_t)lo,
				(size_t)hi);
}

static void lin_run(void *arg, int share, int nshares, int thread)
{
	struct lin_job *j = arg;
	size_t R = j->w->rows;
	long lo, hi;
	kvi_pool_split((long)R, share, nshares, 16, &lo, &hi);
	if (lo >= hi)
		return;
	kvk_matmul(j->v->isa, j->w->type, j->y, R, j->w->data, j->w->n, (size_t)lo, (size_t)hi,
		   j->act_in, j->ntok, j->v->scratch[thread]);
	for (size_t t = 0; t < j->ntok; t++) {
		float *y = j->y + t * R;
		for (size_t r = (size_t)lo; r < (size_t)hi; r++) {
			float s = y[r] + (j->b ? j->b[r] : 0.0f);
			if (j->act)
				s = gelu(s, j->act == 1 && j->v->info.gelu_quick);
			if (j->resid)
				j->resid[t * R + r] += s;
			else
				y[r] = s;
		}
	}
}

static void linear(struct vit *v, const struct vit_mat *w, const float *x, size_t ntok,
		   const float *b, float *y, int act, float *resid)
{
	struct lin_job j = {v, w, x, b, y, resid, ntok, act, x};
	if (!is_float_type(w->type)) {
		kvi_pool_run(v->pool, prep_run, &j);
		j.act_in = v->act;
	}
	kvi_pool_run(v->pool, lin_run, &j);
}

/* Q, K and V share their input: one pool run (one barrier, not three). Every share runs its
 * rows of each matrix, so the result is the same as three linear() calls. */
struct qkv_job {
	struct lin_job j[3];
};

static void qkv_run(void *arg, int share, int nshares, int thread)
{
	struct qkv_job *q = arg;
	for (int i = 0; i < 3; i++)
		lin_run(&q->j[i], share, nshares, thread);
}

static void linear_qkv(struct vit *v, const struct vit_blk *b, const float *x, size_t ntok)
{
	struct qkv_job q = {{{v, &b->q, x, b->bq, v->q, NULL, ntok, 0, x},
			     {v, &b->k, x, b->bk, v->k, NULL, ntok, 0, x},
			     {v, &b->v, x, b->bv, v->v, NULL, ntok, 0, x}}};
	int prepared = 0;
	for (int i = 0; i < 3; i++) {
		if (is_float_type(q.j[i].w->type))
			continue;
		/* the only non-float type is Q8_0, whose prepared activations depend on x alone */
		if (!prepared)
			kvi_pool_run(v->pool, prep_run, &q.j[i]);
		prepared = 1;
		q.j[i].act_in = v->act;
	}
	kvi_pool_run(v->pool, qkv_run, &q);
}

/* LayerNorm over rows of E: out = (x - mean) / sqrt(var + eps) * w + b. */
struct ln_job {
	const float *x, *w, *b;
	float *out;
	size_t E, ntok;
	float eps;
};

static void ln_row(const float *x, const float *w, const float *b, float *out, size_t E, float eps)
{
	float mean = 0, var = 0;
	for (size_t i = 0; i < E; i++)
		mean += x[i];
	mean /= (float)E;
	for (size_t i = 0; i < E; i++)
		var += (x[i] - mean) * (x[i] - mean);
	float r = 1.0f / sqrtf(var / (float)E + eps);
	for (size_t i = 0; i < E; i++)
		out[i] = (x[i] - mean) * r * w[i] + (b ? b[i] : 0.0f);
}

static void ln_run(void *arg, int share, int nshares, int thread)
{
	(void)thread;
	struct ln_job *j = arg;
	long lo, hi;
	kvi_pool_split((long)j->ntok, share, nshares, 1, &lo, &hi);
	for (long t = lo; t < hi; t++)
		ln_row(j->x + (size_t)t * j->E, j->w, j->b, j->out + (size_t)t * j->E, j->E,
		       j->eps);
}

static void layernorm(struct vit *v, const float *x, const float *w, const float *b, float *out,
		      size_t ntok)
{
	struct ln_job j = {x, w, b, out, (size_t)v->info.n_embd, ntok, v->info.eps};
	kvi_pool_run(v->pool, ln_run, &j);
}

/* Non-causal attention: every token sees every token. A share takes whole heads; a head is
 * two kvk_matmul products on contiguous copies: S = (Q_h * scale) K_h^T, row softmax, then
 * O_h = S V_h (V_h transposed so its rows are the weight rows). */
struct attn_job {
	struct vit *v;
	size_t T;
};

static size_t up16(size_t n)
{
	return (n + 15) & ~(size_t)15;
}

static void attn_run(void *arg, int share, int nshares, int thread)
{
	struct attn_job *j = arg;
	struct vit *v = j->v;
	size_t E = (size_t)v->info.n_embd, H = (size_t)v->info.n_head, D = E / H, T = j->T;
	float scale = 1.0f / sqrtf((float)D);
	float *qh = v->ascr[thread], *kh = qh + up16(T * D), *vt = kh + up16(T * D);
	float *s = vt + up16(D * T), *o = s + up16(T * T);
	long lo, hi;
	kvi_pool_split((long)H, share, nshares, 1, &lo, &hi);
	for (size_t h = (size_t)lo; h < (size_t)hi; h++) {
		for (size_t t = 0; t < T; t++)
			for (size_t c = 0; c < D; c++) {
				qh[t * D + c] = v->q[t * E + h * D + c] * scale;
				kh[t * D + c] = v->k[t * E + h * D + c];
				vt[c * T + t] = v->v[t * E + h * D + c];
			}
		kvk_matmul(v->isa, KVK_W_F32, s, T, kh, D, 0, T, qh, T, v->scratch[thread]);
		for (size_t i = 0; i < T; i++) {
			float *r = s + i * T, mx = -INFINITY, sum = 0;
			for (size_t t = 0; t < T; t++)
				mx = r[t] > mx ? r[t] : mx;
			for (size_t t = 0; t < T; t++)
				sum += (r[t] = expf(r[t] - mx));
			float inv = 1.0f / sum;
			for (size_t t = 0; t < T; t++)
				r[t] *= inv;
		}
		kvk_matmul(v->isa, KVK_W_F32, o, D, vt, T, 0, D, s, T, v->scratch[thread]);
		for (size_t i = 0; i < T; i++)
			memcpy(v->a + i * E + h * D, o + i * D, D * sizeof(float));
	}
}

/* im2col: patch (py, px) becomes the row of 3 * P * P pixels in (c, y, x) order. */
struct col_job {
	struct vit *v;
	const float *pix;
};

static void col_run(void *arg, int share, int nshares, int thread)
{
	(void)thread;
	struct col_job *j = arg;
	const struct vit_info *I = &j->v->info;
	size_t S = (size_t)I->image_size, P = (size_t)I->patch_size, side = S / P;
	long lo, hi;
	kvi_pool_split((long)I->n_patches, share, nshares, 1, &lo, &hi);
	for (long pi = lo; pi < hi; pi++) {
		size_t py = (size_t)pi / side, px = (size_t)pi % side;
		float *o = j->v->col + (size_t)pi * 3 * P * P;
		for (size_t c = 0; c < 3; c++)
			for (size_t y = 0; y < P; y++) {
				memcpy(o, j->pix + c * S * S + (py * P + y) * S + px * P,
				       P * sizeof(float));
				o += P;
			}
	}
}

void vit_im2col(struct vit *v, const float *pixels)
{
	struct col_job cj = {v, pixels};
	kvi_pool_run(v->pool, col_run, &cj);
}

int vit_use_device(struct vit *v, int backend, int device)
{
	if (!v || v->dev)
		return -EINVAL;
	return vit_dev_create(v, backend, device, &v->dev);
}

const char *vit_backend(const struct vit *v)
{
	return v->dev ? vit_dev_backend(v->dev) : "cpu";
}

int vit_encode(struct vit *v, const float *pixels, float *out_embd)
{
	if (!v || !pixels || !out_embd)
		return -EINVAL;
	if (v->dev)
		return vit_dev_encode(v, pixels, out_embd);
	const struct vit_info *I = &v->info;
	size_t E = (size_t)I->n_embd, NP = (size_t)I->n_patches, C = (size_t)I->has_class;
	size_t T = NP + C;
	vit_im2col(v, pixels);
	/* patch embedding: rows C.. of h; the class token (if any) is row 0 */
	linear(v, &v->patch, v->col, NP, v->patch_b, v->h + C * E, 0, NULL);
	if (C)
		memcpy(v->h, v->cls, E * sizeof(float));
	for (size_t t = 0; t < T; t++)
		for (size_t i = 0; i < E; i++)
			v->h[t * E + i] += v->pos[t * E + i];
	if (v->pre_w)
		layernorm(v, v->h, v->pre_w, v->pre_b, v->h, T);
	for (int l = 0; l < I->n_layer_run; l++) {
		const struct vit_blk *b = &v->blk[l];
		layernorm(v, v->h, b->ln1_w, b->ln1_b, v->x, T);
		linear_qkv(v, b, v->x, T);
		struct attn_job aj = {v, T};
		kvi_pool_run(v->pool, attn_run, &aj);
		linear(v, &b->o, v->a, T, b->bo, v->x, 0, v->h);
		layernorm(v, v->h, b->ln2_w, b->ln2_b, v->x, T);
		linear(v, &b->up, v->x, T, b->bup, v->u, 1, NULL);
		linear(v, &b->down, v->u, T, b->bdown, v->x, 0, v->h);
	}
	if (v->post_w)
		layernorm(v, v->h, v->post_w, v->post_b, v->h, T);
	/* the projector sees the patch tokens only */
	linear(v, &v->mm0, v->h + C * E, NP, v->mm0_b, v->mid, 2, NULL);
	linear(v, &v->mm2, v->mid, NP, v->mm2_b, out_embd, 0, NULL);
	size_t n = NP * (size_t)I->n_embd_out;
	for (size_t i = 0; i < n; i++)
		if (!isfinite(out_embd[i]))
			return -ERANGE;
	return 0;
}
