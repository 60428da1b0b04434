/* The host backend of kvk_dev.h (the kvk_ref_* references on malloc'd memory) and the layer's
 * entry points (open, close, parse). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvk.h"
#include "kvk_dev.h"

static int h_alloc(struct kvk_dev *d, void **out, size_t bytes)
{
	(void)d;
	size_t n = (bytes + 255) & ~(size_t)255;
	if (n < bytes)
		return -ENOMEM;
	*out = aligned_alloc(256, n ? n : 256);
	if (!*out)
		return -ENOMEM;
	/* NaN in every f32 / f16 / bf16 view (-1 as int32): cudaMalloc'd memory is not zeroed,
	 * so code that reads memory it never wrote must fail its tests here too */
	memset(*out, 0xff, n ? n : 256);
	return 0;
}

static void h_free(struct kvk_dev *d, void *p)
{
	(void)d;
	free(p);
}

static int h_copy(struct kvk_dev *d, void *dst, const void *src, size_t bytes)
{
	(void)d;
	if (bytes)
		memmove(dst, src, bytes);
	return 0;
}

static int h_memset(struct kvk_dev *d, void *dst, int byte, size_t bytes)
{
	(void)d;
	memset(dst, byte, bytes);
	return 0;
}

static int h_sync(struct kvk_dev *d)
{
	(void)d;
	return 0;
}

static int h_embed(struct kvk_dev *d, float *out, const void *table, enum kvk_dtype dt,
		   size_t n_rows, size_t dim, const int32_t *ids, size_t n_tok)
{
	(void)d;
	return kvk_ref_embed(out, table, dt, n_rows, dim, ids, n_tok);
}

static int h_rmsnorm(struct kvk_dev *d, float *out, const float *x, const float *w, size_t n,
		     size_t nrows, float eps)
{
	(void)d;
	if (n == 0)
		return -EINVAL;
	kvk_rmsnorm_f32(out, x, w, n, nrows, eps);
	return 0;
}

static int h_rope(struct kvk_dev *d, float *x, size_t n_tok, size_t n_heads, size_t head_dim,
		  size_t rope_dim, const int32_t *pos, float base, int style)
{
	(void)d;
	return kvk_ref_rope(x, n_tok, n_heads, head_dim, rope_dim, pos, base, style);
}

static int h_swiglu(struct kvk_dev *d, float *out, const float *gate, const float *up, size_t n)
{
	(void)d;
	return kvk_ref_swiglu(out, gate, up, n);
}

static int h_add(struct kvk_dev *d, float *y, const float *x, size_t n)
{
	(void)d;
	return kvk_ref_add(y, x, n);
}

static int h_add_bias(struct kvk_dev *d, float *y, const float *b, size_t n, size_t nrows)
{
	(void)d;
	return kvk_ref_add_bias(y, b, n, nrows);
}

/* f32 -> f16 / bf16 with the references' rounding (nearest even, as the CUDA kernel). */
static int h_convert(struct kvk_dev *d, void *dst, enum kvk_dtype dt, const float *src, size_t n)
{
	(void)d;
	if (dt != KVK_DT_F16 && dt != KVK_DT_BF16)
		return -EINVAL;
	uint16_t *o = dst;
	for (size_t i = 0; i < n; i++)
		o[i] = dt == KVK_DT_F16 ? kvk_ops_f32_to_f16(src[i]) : kvk_ops_f32_to_bf16(src[i]);
	return 0;
}

static int h_gemm(struct kvk_dev *d, float *c, const void *a, const void *b, enum kvk_dtype dt,
		  int m, int n, int k)
{
	(void)d;
	return kvk_ref_gemm(c, a, b, dt, m, n, k);
}

static int h_q8_0_gemv(struct kvk_dev *d, float *y, const void *w, const float *x, int rows, int n,
		       int n_tok)
{
	(void)d;
	return kvk_ref_q8_0_gemv(y, w, x, rows, n, n_tok);
}

static int h_kq_gemv(struct kvk_dev *d, float *y, const void *w, enum kvk_dtype dt, const float *x,
		     int rows, int n, int n_tok)
{
	(void)d;
	return kvk_ref_kq_gemv(y, w, dt, x, rows, n, n_tok);
}

static int h_attn_prefill(struct kvk_dev *d, float *out, const float *q,
			  const struct kvk_kv_pages *kv, const int32_t *table, int n_q, int q_start,
			  int n_heads, float scale)
{
	(void)d;
	return kvk_ref_attn_prefill(out, q, kv, table, n_q, q_start, n_heads, scale);
}

static int h_attn_decode(struct kvk_dev *d, float *out, const float *q,
			 const struct kvk_kv_pages *kv, const int32_t *tables, int max_blocks,
			 const int32_t *seq_lens, int n_seqs, int n_heads, float scale)
{
	(void)d;
	return kvk_ref_attn_decode(out, q, kv, tables, max_blocks, seq_lens, n_seqs, n_heads,
				   scale);
}

static int h_kv_store(struct kvk_dev *d, const struct kvk_kv_layers *kv, int layer, const float *k,
		      const float *v, const int32_t *slots, int n_tok)
{
	(void)d;
	return kvk_ref_kv_store(kv, layer, k, v, slots, n_tok);
}

static int h_argmax(struct kvk_dev *d, int32_t *out, const float *logits, int n_rows, int vocab)
{
	(void)d;
	return kvk_ref_argmax(out, logits, n_rows, vocab);
}

static int h_kv_pack(struct kvk_dev *d, void *dst_host, const struct kvk_kv_layers *kv,
		     const int32_t *blocks, int n_blocks)
{
	(void)d;
	return kvk_ref_kv_pack(dst_host, kv, blocks, n_blocks);
}

static int h_kv_unpack(struct kvk_dev *d, const struct kvk_kv_layers *kv, const void *src_host,
		       const int32_t *blocks, int n_blocks)
{
	(void)d;
	return kvk_ref_kv_unpack(kv, src_host, blocks, n_blocks);
}

static int h_layernorm(struct kvk_dev *d, float *out, const float *x, const float *w,
		       const float *b, size_t n, size_t nrows, float eps)
{
	(void)d;
	return kvk_ref_layernorm(out, x, w, b, n, nrows, eps);
}

static int h_gelu(struct kvk_dev *d, float *y, const float *x, size_t n, int quick)
{
	(void)d;
	return kvk_ref_gelu(y, x, n, quick);
}

static int h_attn_dense(struct kvk_dev *d, float *out, const float *q, const float *k,
			const float *v, int n_tok, int n_heads, int head_dim, float scale)
{
	(void)d;
	return kvk_ref_attn_dense(out, q, k, v, n_tok, n_heads, head_dim, scale);
}

const struct kvk_dev_ops kvk_dev_host_ops = {
    .name = "host",
    .alloc = h_alloc,
    .free = h_free,
    .h2d = h_copy,
    .d2h = h_copy,
    .d2d = h_copy,
    .memset = h_memset,
    .sync = h_sync,
    .embed = h_embed,
    .rmsnorm = h_rmsnorm,
    .rope = h_rope,
    .swiglu = h_swiglu,
    .add = h_add,
    .add_bias = h_add_bias,
    .convert = h_convert,
    .gemm = h_gemm,
    .q8_0_gemv = h_q8_0_gemv,
    .kq_gemv = h_kq_gemv,
    .attn_prefill = h_attn_prefill,
    .attn_decode = h_attn_decode,
    .kv_store = h_kv_store,
    .argmax = h_argmax,
    .kv_pack = h_kv_pack,
    .kv_unpack = h_kv_unpack,
    .layernorm = h_layernorm,
    .gelu = h_gelu,
    .attn_dense = h_attn_dense,
};

/* ---- entry points ------------------------------------------------------------------------ */

int kvk_dev_parse(const char *name)
{
	if (name && !strcmp(name, "host"))
		return KVK_DEV_HOST;
	if (name && !strcmp(name, "cuda"))
		return KVK_DEV_CUDA;
	return -EINVAL;
}

int kvk_dev_open(struct kvk_dev *d, enum kvk_dev_kind kind, int device)
{
	memset(d, 0, sizeof(*d));
	if (kind == KVK_DEV_HOST) {
		d->op = &kvk_dev_host_ops;
		d->kind = kind;
		return 0;
	}
	if (kind != KVK_DEV_CUDA)
		return -EINVAL;
	if (kvk_cuda_device_count() <= device || device < 0)
		return -ENODEV;
	int rc = kvk_cuda_ctx_create(device, &d->cu);
	if (rc)
		return rc;
	d->op = &kvk_dev_cuda_ops;
	d->kind = kind;
	return 0;
}

void kvk_dev_close(struct kvk_dev *d)
{
	if (!d)
		return;
	if (d->cu)
		kvk_cuda_ctx_destroy(d->cu);
	memset(d, 0, sizeof(*d));
}

void *kvk_arena_alloc(struct kvk_dev_arena *a, size_t bytes, int *rc)
{
	if (*rc)
		return NULL;
	if (a->n == a->cap) {
		int cap = a->cap ? 2 * a->cap : 64;
		void **np = realloc(a->p, (size_t)cap * sizeof(void *));
		if (!np) {
			*rc = -ENOMEM;
			return NULL;
		}
		a->p = np;
		a->cap = cap;
	}
	void *p = NULL;
	*rc = a->d->op->alloc(a->d, &p, bytes ? bytes : 4);
	if (*rc)
		return NULL;
	a->p[a->n++] = p;
	a->bytes += bytes;
	return p;
}

const void *kvk_arena_upload(struct kvk_dev_arena *a, const void *src, size_t bytes, int *rc)
{
	void *p = kvk_arena_alloc(a, bytes, rc);
	if (p && bytes)
		*rc = a->d->op->h2d(a->d, p, src, bytes);
	return *rc ? NULL : p;
}

void kvk_arena_free(struct kvk_dev_arena *a)
{
	if (a->n && a->d && a->d->op) {
		a->d->op->sync(a->d);
		for (int i = 0; i < a->n; i++)
			a->d->op->free(a->d, a->p[i]);
	}
	free(a->p);
	a->p = NULL;
	a->n = a->cap = 0;
	a->bytes = 0;
}
