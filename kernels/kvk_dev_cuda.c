/* The cuda backend of kvk_dev.h: each op is its kvk_cu_* / kvk_cuda_* call on the backend's
 * context. Built in every configuration: without CUDA those calls are the -ENODEV stubs of
 * kvk_nocuda.c, and kvk_dev_open refuses the backend before any op could run. */
#include "kvk_dev.h"

static int c_alloc(struct kvk_dev *d, void **out, size_t bytes)
{
	return kvk_cuda_malloc(d->cu, out, bytes);
}

static void c_free(struct kvk_dev *d, void *p)
{
	kvk_cuda_free(d->cu, p);
}

static int c_h2d(struct kvk_dev *d, void *dst, const void *src, size_t bytes)
{
	return bytes ? kvk_cuda_h2d(d->cu, dst, src, bytes) : 0;
}

static int c_d2h(struct kvk_dev *d, void *dst, const void *src, size_t bytes)
{
	return bytes ? kvk_cuda_d2h(d->cu, dst, src, bytes) : 0;
}

static int c_d2d(struct kvk_dev *d, void *dst, const void *src, size_t bytes)
{
	return kvk_cuda_d2d(d->cu, dst, src, bytes);
}

static int c_memset(struct kvk_dev *d, void *dst, int byte, size_t bytes)
{
	return kvk_cuda_memset(d->cu, dst, byte, bytes);
}

static int c_sync(struct kvk_dev *d)
{
	return kvk_cuda_sync(d->cu);
}

static int c_embed(struct kvk_dev *d, float *out, const void *table, enum kvk_dtype dt,
		   size_t n_rows, size_t dim, const int32_t *ids, size_t n_tok)
{
	return kvk_cu_embed(d->cu, out, table, dt, n_rows, dim, ids, n_tok);
}

static int c_rmsnorm(struct kvk_dev *d, float *out, const float *x, const float *w, size_t n,
		     size_t nrows, float eps)
{
	return kvk_cu_rmsnorm(d->cu, out, x, w, n, nrows, eps);
}

static int c_rope(struct kvk_dev *d, float *x, size_t n_tok, size_t n_heads, size_t head_dim,
		  size_t rope_dim, const int32_t *pos, float base, int style)
{
	return kvk_cu_rope(d->cu, x, n_tok, n_heads, head_dim, rope_dim, pos, base, style);
}

static int c_swiglu(struct kvk_dev *d, float *out, const float *gate, const float *up, size_t n)
{
	return kvk_cu_swiglu(d->cu, out, gate, up, n);
}

static int c_add(struct kvk_dev *d, float *y, const float *x, size_t n)
{
	return kvk_cu_add(d->cu, y, x, n);
}

static int c_add_bias(struct kvk_dev *d, float *y, const float *b, size_t n, size_t nrows)
{
	return kvk_cu_add_bias(d->cu, y, b, n, nrows);
}

static int c_convert(struct kvk_dev *d, void *dst, enum kvk_dtype dt, const float *src, size_t n)
{
	return kvk_cu_convert(d->cu, dst, dt, src, n);
}

static int c_gemm(struct kvk_dev *d, float *c, const void *a, const void *b, enum kvk_dtype dt,
		  int m, int n, int k)
{
	return kvk_cu_gemm(d->cu, c, a, b, dt, m, n, k);
}

static int c_q8_0_gemv(struct kvk_dev *d, float *y, const void *w, const float *x, int rows, int n,
		       int n_tok)
{
	return kvk_cu_q8_0_gemv(d->cu, y, w, x, rows, n, n_tok);
}

static int c_kq_gemv(struct kvk_dev *d, float *y, const void *w, enum kvk_dtype dt, const float *x,
		     int rows, int n, int n_tok)
{
	return kvk_cu_kq_gemv(d->cu, y, w, dt, x, rows, n, n_tok);
}

static int c_attn_prefill(struct kvk_dev *d, float *out, const float *q,
			  const struct kvk_kv_pages *kv, const int32_t *table, int n_q, int q_start,
			  int n_heads, float scale)
{
	return kvk_cu_attn_prefill(d->cu, out, q, kv, table, n_q, q_start, n_heads, scale);
}

static int c_attn_decode(struct kvk_dev *d, float *out, const float *q,
			 const struct kvk_kv_pages *kv, const int32_t *tables, int max_blocks,
			 const int32_t *seq_lens, int n_seqs, int n_heads, float scale)
{
	return kvk_cu_attn_decode(d->cu, out, q, kv, tables, max_blocks, seq_lens, n_seqs, n_heads,
				  scale);
}

static int c_kv_store(struct kvk_dev *d, const struct kvk_kv_layers *kv, int layer, const float *k,
		      const float *v, const int32_t *slots, int n_tok)
{
	return kvk_cu_kv_store(d->cu, kv, layer, k, v, slots, n_tok);
}

static int c_argmax(struct kvk_dev *d, int32_t *out, const float *logits, int n_rows, int vocab)
{
	return kvk_cu_argmax(d->cu, out, logits, n_rows, vocab);
}

static int c_kv_pack(struct kvk_dev *d, void *dst_host, const struct kvk_kv_layers *kv,
		     const int32_t *blocks, int n_blocks)
{
	return kvk_cu_kv_pack(d->cu, dst_host, kv, blocks, n_blocks, NULL, NULL);
}

static int c_kv_unpack(struct kvk_dev *d, const struct kvk_kv_layers *kv, const void *src_host,
		       const int32_t *blocks, int n_blocks)
{
	return kvk_cu_kv_unpack(d->cu, kv, src_host, blocks, n_blocks, NULL, NULL);
}

static int c_layernorm(struct kvk_dev *d, float *out, const float *x, const float *w,
		       const float *b, size_t n, size_t nrows, float eps)
{
	return kvk_cu_layernorm(d->cu, out, x, w, b, n, nrows, eps);
}

static int c_gelu(struct kvk_dev *d, float *y, const float *x, size_t n, int quick)
{
	return kvk_cu_gelu(d->cu, y, x, n, quick);
}

static int c_attn_dense(struct kvk_dev *d, float *out, const float *q, const float *k,
			const float *v, int n_tok, int n_heads, int head_dim, float scale)
{
	return kvk_cu_attn_dense(d->cu, out, q, k, v, n_tok, n_heads, head_dim, scale);
}

const struct kvk_dev_ops kvk_dev_cuda_ops = {
    .name = "cuda",
    .alloc = c_alloc,
    .free = c_free,
    .h2d = c_h2d,
    .d2h = c_d2h,
    .d2d = c_d2d,
    .memset = c_memset,
    .sync = c_sync,
    .embed = c_embed,
    .rmsnorm = c_rmsnorm,
    .rope = c_rope,
    .swiglu = c_swiglu,
    .add = c_add,
    .add_bias = c_add_bias,
    .convert = c_convert,
    .gemm = c_gemm,
    .q8_0_gemv = c_q8_0_gemv,
    .kq_gemv = c_kq_gemv,
    .attn_prefill = c_attn_prefill,
    .attn_decode = c_attn_decode,
    .kv_store = c_kv_store,
    .argmax = c_argmax,
    .kv_pack = c_kv_pack,
    .kv_unpack = c_kv_unpack,
    .layernorm = c_layernorm,
    .gelu = c_gelu,
    .attn_dense = c_attn_dense,
};
