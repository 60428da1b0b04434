// Forward-pass glue for the device engine (engine/fwd_dev.h): residual add, bias add, the
// K/V rows of a batch into the paged f16 pool, and a device-to-device copy (copy on write).
#include "kvk_cuda_int.h"

extern "C" int kvk_cuda_d2d(struct kvk_cuda_ctx *ctx, void *dst_dev, const void *src_dev,
			    size_t bytes)
{
	KVK_ENTER(ctx);
	if (!bytes)
		return 0;
	KVK_CK(cudaMemcpyAsync(dst_dev, src_dev, bytes, cudaMemcpyDeviceToDevice, ctx->s_comp));
	return 0;
}

static __global__ void add_kernel(float *y, const float *x, size_t n)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		y[i] += x[i];
}

extern "C" int kvk_cu_add(struct kvk_cuda_ctx *ctx, float *y, const float *x, size_t n)
{
	KVK_ENTER(ctx);
	if (!n)
		return 0;
	unsigned nb = kvk_blocks(n, 256), grid = nb > 65535 ? 65535 : nb;
	add_kernel<<<grid, 256, 0, ctx->s_comp>>>(y, x, n);
	KVK_LAUNCHED();
	return 0;
}

static __global__ void add_bias_kernel(float *y, const float *b, size_t n, size_t total)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
	     i += (size_t)gridDim.x * blockDim.x)
		y[i] += b[i % n];
}

extern "C" int kvk_cu_add_bias(struct kvk_cuda_ctx *ctx, float *y, const float *b, size_t n,
			       size_t nrows)
{
	KVK_ENTER(ctx);
	if (!n || !nrows)
		return 0;
	if (nrows > SIZE_MAX / n)
		return -EINVAL;
	size_t total = n * nrows;
	unsigned nb = kvk_blocks(total, 256), grid = nb > 65535 ? 65535 : nb;
	add_bias_kernel<<<grid, 256, 0, ctx->s_comp>>>(y, b, n, total);
	KVK_LAUNCHED();
	return 0;
}

// One block per token; threads cover the row (n_kv_heads * head_dim) of K and of V.
static __global__ void kv_store_kernel(uint16_t *kp, uint16_t *vp, const float *k, const float *v,
				       const int32_t *slots, size_t row, size_t block_stride,
				       int block_tokens, long total)
{
	int t = blockIdx.x;
	int32_t s = slots[t];
	if (s < 0 || s >= total)
		return;
	size_t off = (size_t)(s / block_tokens) * block_stride + (size_t)(s % block_tokens) * row;
	for (size_t i = threadIdx.x; i < row; i += blockDim.x) {
		kp[off + i] = __half_as_ushort(__float2half_rn(k[(size_t)t * row + i]));
		vp[off + i] = __half_as_ushort(__float2half_rn(v[(size_t)t * row + i]));
	}
}

extern "C" int kvk_cu_kv_store(struct kvk_cuda_ctx *ctx, const struct kvk_kv_layers *kv, int layer,
			       const float *k, const float *v, const int32_t *slots, int n_tok)
{
	if (!kv || !kvk_kv_payload_bytes(kv) || !kv->k || !kv->v || kv->num_blocks < 1 ||
	    kv->block_stride < (size_t)kv->block_tokens * kv->n_kv_heads * kv->head_dim ||
	    layer < 0 || layer >= kv->n_layer || n_tok < 0)
		return -EINVAL;
	KVK_ENTER(ctx);
	if (!n_tok)
		return 0;
	size_t row = (size_t)kv->n_kv_heads * kv->head_dim;
	kv_store_kernel<<<(unsigned)n_tok, 128, 0, ctx->s_comp>>>(
	    kv->k[layer], kv->v[layer], k, v, slots, row, kv->block_stride, kv->block_tokens,
	    (long)kv->num_blocks * kv->block_tokens);
	KVK_LAUNCHED();
	return 0;
}
