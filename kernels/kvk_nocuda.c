/* Built instead of cuda/ when nvcc is absent: every CUDA entry point reports no device. */
#include "kvk.h"
#include "kvk_cuda.h"

#include <errno.h>

int kvk_cuda_available(void)
{
	return 0;
}

int kvk_cuda_rmsnorm_f32(float *out, const float *x, const float *w, size_t n, size_t nrows,
			 float eps)
{
	(void)out, (void)x, (void)w, (void)n, (void)nrows, (void)eps;
	return -ENODEV;
}

/* ---- kvk_cuda.h (issue 9): no device, so nothing is ever created or enqueued ------------- */

int kvk_cuda_device_count(void)
{
	return 0;
}

int kvk_cuda_ctx_create(int device, struct kvk_cuda_ctx **out)
{
	(void)device;
	*out = NULL;
	return -ENODEV;
}

void kvk_cuda_ctx_destroy(struct kvk_cuda_ctx *ctx)
{
	(void)ctx;
}

int kvk_cuda_sync(struct kvk_cuda_ctx *ctx)
{
	(void)ctx;
	return -ENODEV;
}

int kvk_cuda_device_info(struct kvk_cuda_ctx *ctx, char *buf, size_t len)
{
	(void)ctx, (void)buf, (void)len;
	return -ENODEV;
}

void *kvk_cuda_stream(struct kvk_cuda_ctx *ctx)
{
	(void)ctx;
	return NULL;
}

int kvk_cuda_device(struct kvk_cuda_ctx *ctx)
{
	(void)ctx;
	return -1;
}

int kvk_cuda_malloc(struct kvk_cuda_ctx *ctx, void **out, size_t bytes)
{
	(void)ctx, (void)bytes;
	*out = NULL;
	return -ENODEV;
}

void kvk_cuda_free(struct kvk_cuda_ctx *ctx, void *p)
{
	(void)ctx, (void)p;
}

int kvk_cuda_host_alloc(struct kvk_cuda_ctx *ctx, void **out, size_t bytes)
{
	(void)ctx, (void)bytes;
	*out = NULL;
	return -ENODEV;
}

void kvk_cuda_host_free(struct kvk_cuda_ctx *ctx, void *p)
{
	(void)ctx, (void)p;
}

int kvk_cuda_h2d(struct kvk_cuda_ctx *ctx, void *dst_dev, const void *src, size_t bytes)
{
	(void)ctx, (void)dst_dev, (void)src, (void)bytes;
	return -ENODEV;
}

int kvk_cuda_d2h(struct kvk_cuda_ctx *ctx, void *dst, const void *src_dev, size_t bytes)
{
	(void)ctx, (void)dst, (void)src_dev, (void)bytes;
	return -ENODEV;
}

int kvk_cuda_memset(struct kvk_cuda_ctx *ctx, void *dst_dev, int byte, size_t bytes)
{
	(void)ctx, (void)dst_dev, (void)byte, (void)bytes;
	return -ENODEV;
}

int kvk_cu_embed(struct kvk_cuda_ctx *ctx, float *out, const void *table, enum kvk_dtype dt,
		 size_t n_rows, size_t dim, const int32_t *ids, size_t n_tok)
{
	(void)ctx, (void)out, (void)table, (void)dt, (void)n_rows, (void)dim, (void)ids,
	    (void)n_tok;
	return -ENODEV;
}

int kvk_cu_rmsnorm(struct kvk_cuda_ctx *ctx, float *out, const float *x, const float *w, size_t n,
		   size_t nrows, float eps)
{
	(void)ctx, (void)out, (void)x, (void)w, (void)n, (void)nrows, (void)eps;
	return -ENODEV;
}

int kvk_cu_rope(struct kvk_cuda_ctx *ctx, float *x, size_t n_tok, size_t n_heads, size_t head_dim,
		size_t rope_dim, const int32_t *pos, float base, int style)
{
	(void)ctx, (void)x, (void)n_tok, (void)n_heads, (void)head_dim, (void)rope_dim, (void)pos,
	    (void)base, (void)style;
	return -ENODEV;
}

int kvk_cu_swiglu(struct kvk_cuda_ctx *ctx, float *out, const float *gate, const float *up,
		  size_t n)
{
	(void)ctx, (void)out, (void)gate, (void)up, (void)n;
	return -ENODEV;
}

int kvk_cu_layernorm(struct kvk_cuda_ctx *ctx, float *out, const float *x, const float *w,
		     const float *b, size_t n, size_t nrows, float eps)
{
	(void)ctx, (void)out, (void)x, (void)w, (void)b, (void)n, (void)nrows, (void)eps;
	return -ENODEV;
}

int kvk_cu_gelu(struct kvk_cuda_ctx *ctx, float *y, const float *x, size_t n, int quick)
{
	(void)ctx, (void)y, (void)x, (void)n, (void)quick;
	return -ENODEV;
}

int kvk_cu_attn_dense(struct kvk_cuda_ctx *ctx, float *out, const float *q, const float *k,
		      const float *v, int n_tok, int n_heads, int head_dim, float scale)
{
	(void)ctx, (void)out, (void)q, (void)k, (void)v, (void)n_tok, (void)n_heads, (void)head_dim,
	    (void)scale;
	return -ENODEV;
}

int kvk_cu_attn_prefill(struct kvk_cuda_ctx *ctx, float *out, const float *q,
			const struct kvk_kv_pages *kv, const int32_t *table, int n_q, int q_start,
			int n_heads, float scale)
{
	(void)ctx, (void)out, (void)q, (void)kv, (void)table, (void)n_q, (void)q_start,
	    (void)n_heads, (void)scale;
	return -ENODEV;
}

int kvk_cu_attn_decode(struct kvk_cuda_ctx *ctx, float *out, const float *q,
		       const struct kvk_kv_pages *kv, const int32_t *tables, int max_blocks,
		       const int32_t *seq_lens, int n_seqs, int n_heads, float scale)
{
	(void)ctx, (void)out, (void)q, (void)kv, (void)tables, (void)max_blocks, (void)seq_lens,
	    (void)n_seqs, (void)n_heads, (void)scale;
	return -ENODEV;
}

int kvk_cu_gemm(struct kvk_cuda_ctx *ctx, float *c, const void *a, const void *b, enum kvk_dtype dt,
		int m, int n, int k)
{
	(void)ctx, (void)c, (void)a, (void)b, (void)dt, (void)m, (void)n, (void)k;
	return -ENODEV;
}

int kvk_cu_kq_gemv(struct kvk_cuda_ctx *ctx, float *y, const void *w, enum kvk_dtype dt,
		   const float *x, int rows, int n, int n_tok)
{
	(void)ctx, (void)y, (void)w, (void)dt, (void)x, (void)rows, (void)n, (void)n_tok;
	return -ENODEV;
}

int kvk_cu_q8_0_gemv(struct kvk_cuda_ctx *ctx, float *y, const void *w, const float *x, int rows,
		     int n, int n_tok)
{
	(void)ctx, (void)y, (void)w, (void)x, (void)rows, (void)n, (void)n_tok;
	return -ENODEV;
}

int kvk_cu_convert(struct kvk_cuda_ctx *ctx, void *dst, enum kvk_dtype dt, const float *src,
		   size_t n)
{
	(void)ctx, (void)dst, (void)dt, (void)src, (void)n;
	return -ENODEV;
}

int kvk_cu_argmax(struct kvk_cuda_ctx *ctx, int32_t *out, const float *logits, int n_rows,
		  int vocab)
{
	(void)ctx, (void)out, (void)logits, (void)n_rows, (void)vocab;
	return -ENODEV;
}

int kvk_cu_sample_topk(struct kvk_cuda_ctx *ctx, int32_t *out, const float *logits, int n_rows,
		       int vocab, int k, float temperature, const float *u)
{
	(void)ctx, (void)out, (void)logits, (void)n_rows, (void)vocab, (void)k, (void)temperature,
	    (void)u;
	return -ENODEV;
}

int kvk_cu_kv_pack(struct kvk_cuda_ctx *ctx, void *dst_host, const struct kvk_kv_layers *kv,
		   const int32_t *blocks, int n_blocks, kvk_chunk_fn cb, void *arg)
{
	(void)ctx, (void)dst_host, (void)kv, (void)blocks, (void)n_blocks, (void)cb, (void)arg;
	return -ENODEV;
}

int kvk_cu_kv_unpack(struct kvk_cuda_ctx *ctx, const struct kvk_kv_layers *kv, const void *src_host,
		     const int32_t *blocks, int n_blocks, kvk_chunk_fn cb, void *arg)
{
	(void)ctx, (void)kv, (void)src_host, (void)blocks, (void)n_blocks, (void)cb, (void)arg;
	return -ENODEV;
}

int kvk_cu_kv_gather(struct kvk_cuda_ctx *ctx, void *dst_dev, const struct kvk_kv_layers *kv,
		     const int32_t *blocks, int n_blocks)
{
	(void)ctx, (void)dst_dev, (void)kv, (void)blocks, (void)n_blocks;
	return -ENODEV;
}

int kvk_cu_kv_scatter(struct kvk_cuda_ctx *ctx, const struct kvk_kv_layers *kv, const void *src_dev,
		      const int32_t *blocks, int n_blocks)
{
	(void)ctx, (void)kv, (void)src_dev, (void)blocks, (void)n_blocks;
	return -ENODEV;
}

int kvk_cuda_d2d(struct kvk_cuda_ctx *ctx, void *dst_dev, const void *src_dev, size_t bytes)
{
	(void)ctx, (void)dst_dev, (void)src_dev, (void)bytes;
	return -ENODEV;
}

int kvk_cu_add(struct kvk_cuda_ctx *ctx, float *y, const float *x, size_t n)
{
	(void)ctx, (void)y, (void)x, (void)n;
	return -ENODEV;
}

int kvk_cu_add_bias(struct kvk_cuda_ctx *ctx, float *y, const float *b, size_t n, size_t nrows)
{
	(void)ctx, (void)y, (void)b, (void)n, (void)nrows;
	return -ENODEV;
}

int kvk_cu_kv_store(struct kvk_cuda_ctx *ctx, const struct kvk_kv_layers *kv, int layer,
		    const float *k, const float *v, const int32_t *slots, int n_tok)
{
	(void)ctx, (void)kv, (void)layer, (void)k, (void)v, (void)slots, (void)n_tok;
	return -ENODEV;
}

int kvk_cu_attn_prefill_mma(struct kvk_cuda_ctx *ctx, float *out, const float *q,
			    const struct kvk_kv_pages *kv, const int32_t *table, int n_q,
			    int q_start, int n_heads, float scale)
{
	return kvk_cu_attn_prefill(ctx, out, q, kv, table, n_q, q_start, n_heads, scale);
}

int kvk_cu_attn_prefill_fp32(struct kvk_cuda_ctx *ctx, float *out, const float *q,
			     const struct kvk_kv_pages *kv, const int32_t *table, int n_q,
			     int q_start, int n_heads, float scale)
{
	return kvk_cu_attn_prefill(ctx, out, q, kv, table, n_q, q_start, n_heads, scale);
}

int kvk_cu_kq_gemm(struct kvk_cuda_ctx *ctx, float *y, const void *w, enum kvk_dtype dt,
		   const float *x, int rows, int n, int n_tok)
{
	return kvk_cu_kq_gemv(ctx, y, w, dt, x, rows, n, n_tok);
}

int kvk_cu_kq_gemv_fp32(struct kvk_cuda_ctx *ctx, float *y, const void *w, enum kvk_dtype dt,
			const float *x, int rows, int n, int n_tok)
{
	return kvk_cu_kq_gemv(ctx, y, w, dt, x, rows, n, n_tok);
}
