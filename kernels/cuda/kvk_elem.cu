// Elementwise and row kernels: embedding gather, RMSNorm, RoPE, SwiGLU, f32 -> f16/bf16, and the
// vision tower's LayerNorm (with bias) and GELU.
#include "kvk_cuda_int.h"
#include "kvk_kq.cuh"

static __device__ float bf16_to_f32(uint16_t h)
{
	return __uint_as_float((uint32_t)h << 16);
}

// Same rounding as kvk_ops_f32_to_bf16: nearest even, NaN stays NaN.
static __device__ uint16_t f32_to_bf16(float f)
{
	uint32_t x = __float_as_uint(f);
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u);
	return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static __device__ float f16_to_f32(uint16_t h)
{
	return __half2float(__ushort_as_half(h));
}

static __global__ void embed_kernel(float *out, const uint8_t *table, int dt, size_t n_rows,
				    size_t dim, size_t row_bytes, const int32_t *ids)
{
	size_t t = blockIdx.x;
	float *o = out + t * dim;
	int32_t id = ids[t];
	bool ok = id >= 0 && (size_t)id < n_rows;
	const uint8_t *row = table + (ok ? (size_t)id : 0) * row_bytes;
	for (size_t i = threadIdx.x; i < dim; i += blockDim.x) {
		float v = 0.f;
		if (ok) {
			switch (dt) {
			case KVK_DT_F32:
				v = ((const float *)row)[i];
				break;
			case KVK_DT_F16:
				v = f16_to_f32(((const uint16_t *)row)[i]);
				break;
			case KVK_DT_BF16:
				v = bf16_to_f32(((const uint16_t *)row)[i]);
				break;
			case KVK_DT_Q8_0: { // blocks are 2-byte aligned only
				const uint8_t *blk = row + (i / KVK_Q8_0_BLOCK) * KVK_Q8_0_BYTES;
				v = f16_to_f32(*(const uint16_t *)blk) *
				    (float)(int8_t)blk[2 + i % KVK_Q8_0_BLOCK];
				break;
			}
			default: { // Q4_0, K-quants: once per token, so a whole block per value
				float blk[32];
				kq_block32(dt, row, (int)(i / 32), blk);
				v = blk[i % 32];
			}
			}
		}
		o[i] = v;
	}
}

extern "C" int kvk_cu_embed(struct kvk_cuda_ctx *ctx, float *out, const void *table,
			    enum kvk_dtype dt, size_t n_rows, size_t dim, const int32_t *ids,
			    size_t n_tok)
{
	size_t rb;
	switch (dt) {
	case KVK_DT_F32:
		rb = dim * 4;
		break;
	case KVK_DT_F16:
	case KVK_DT_BF16:
		rb = dim * 2;
		break;
	case KVK_DT_Q8_0:
		rb = dim % KVK_Q8_0_BLOCK ? 0 : dim / KVK_Q8_0_BLOCK * KVK_Q8_0_BYTES;
		break;
	default:
		rb = dim < 0x7fffffffu ? kq_row_bytes((int)dt, (int)dim) : 0;
	}
	if (!rb || n_tok > 0x7fffffffu)
		return -EINVAL;
	KVK_ENTER(ctx);
	if (!n_tok)
		return 0;
	embed_kernel<<<(unsigned)n_tok, 256, 0, ctx->s_comp>>>(out, (const uint8_t *)table, dt,
							       n_rows, dim, rb, ids);
	KVK_LAUNCHED();
	return 0;
}

// Block-wide sum (blockDim.x a multiple of 32, <= 1024); every thread gets the total.
static __device__ float block_sum(float v, float *red)
{
	for (int off = 16; off > 0; off >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, off);
	if ((threadIdx.x & 31) == 0)
		red[threadIdx.x >> 5] = v;
	__syncthreads();
	if (threadIdx.x < 32) {
		v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
		for (int off = 16; off > 0; off >>= 1)
			v += __shfl_xor_sync(0xffffffffu, v, off);
		if (threadIdx.x == 0)
			red[32] = v;
	}
	__syncthreads();
	return red[32];
}

static __global__ void rmsnorm_rows(float *out, const float *x, const float *w, size_t n, float eps)
{
	__shared__ float red[33];
	const float *xr = x + blockIdx.x * n;
	float *o = out + blockIdx.x * n;
	float ss = 0.f;
	for (size_t i = threadIdx.x; i < n; i += blockDim.x)
		ss += xr[i] * xr[i];
	float scale = rsqrtf(block_sum(ss, red) / (float)n + eps);
	for (size_t i = threadIdx.x; i < n; i += blockDim.x)
		o[i] = xr[i] * scale * w[i];
}

extern "C" int kvk_cu_rmsnorm(struct kvk_cuda_ctx *ctx, float *out, const float *x, const float *w,
			      size_t n, size_t nrows, float eps)
{
	if (n == 0 || nrows > 0x7fffffffu)
		return -EINVAL;
	KVK_ENTER(ctx);
	if (!nrows)
		return 0;
	rmsnorm_rows<<<(unsigned)nrows, 256, 0, ctx->s_comp>>>(out, x, w, n, eps);
	KVK_LAUNCHED();
	return 0;
}

// LayerNorm: one block per row, two passes as in kvk_ref_layernorm (mean, then the sum of
// (x - mean)^2), so a row with a large mean keeps its variance. out may alias x: each thread
// writes only the elements it reads in the last loop, after both sums are complete.
static __global__ void layernorm_rows(float *out, const float *x, const float *w, const float *b,
				      size_t n, float eps)
{
	__shared__ float red[33];
	const float *xr = x + blockIdx.x * n;
	float *o = out + blockIdx.x * n;
	float s = 0.f;
	for (size_t i = threadIdx.x; i < n; i += blockDim.x)
		s += xr[i];
	float mean = block_sum(s, red) / (float)n;
	float ss = 0.f;
	for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
		float d = xr[i] - mean;
		ss += d * d;
	}
	float scale = rsqrtf(block_sum(ss, red) / (float)n + eps);
	for (size_t i = threadIdx.x; i < n; i += blockDim.x)
		o[i] = (xr[i] - mean) * scale * w[i] + (b ? b[i] : 0.f);
}

extern "C" int kvk_cu_layernorm(struct kvk_cuda_ctx *ctx, float *out, const float *x,
				const float *w, const float *b, size_t n, size_t nrows, float eps)
{
	if (n == 0 || !w || nrows > 0x7fffffffu)
		return -EINVAL;
	KVK_ENTER(ctx);
	if (!nrows)
		return 0;
	layernorm_rows<<<(unsigned)nrows, 256, 0, ctx->s_comp>>>(out, x, w, b, n, eps);
	KVK_LAUNCHED();
	return 0;
}

static __global__ void gelu_kernel(float *y, const float *x, size_t n, int quick)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float v = x[i];
		y[i] = quick
			   ? v / (1.0f + expf(-1.702f * v))
			   : 0.5f * v *
				 (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
	}
}

extern "C" int kvk_cu_gelu(struct kvk_cuda_ctx *ctx, float *y, const float *x, size_t n, int quick)
{
	KVK_ENTER(ctx);
	if (!n)
		return 0;
	unsigned nb = kvk_blocks(n, 256), grid = nb > 65535 ? 65535 : nb;
	gelu_kernel<<<grid, 256, 0, ctx->s_comp>>>(y, x, n, quick);
	KVK_LAUNCHED();
	return 0;
}

// One thread per rotated pair; theta and the angle are formed exactly as in kvk_ref_rope.
static __global__ void rope_kernel(float *x, size_t n_tok, size_t n_heads, size_t head_dim,
				   size_t rope_dim, const int32_t *pos, float base, int style)
{
	size_t half = rope_dim / 2;
	size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (idx >= n_tok * n_heads * half)
		return;
	size_t i = idx % half, th = idx / half, t = th / n_heads;
	float *v = x + th * head_dim;
	float theta = (float)pow((double)base, -2.0 * (double)i / (double)rope_dim);
	float ang = (float)pos[t] * theta;
	float s, c;
	sincosf(ang, &s, &c);
	size_t a = style == 0 ? 2 * i : i, b = style == 0 ? 2 * i + 1 : i + half;
	float va = v[a], vb = v[b];
	v[a] = va * c - vb * s;
	v[b] = va * s + vb * c;
}

extern "C" int kvk_cu_rope(struct kvk_cuda_ctx *ctx, float *x, size_t n_tok, size_t n_heads,
			   size_t head_dim, size_t rope_dim, const int32_t *pos, float base,
			   int style)
{
	if (rope_dim < 2 || rope_dim % 2 || rope_dim > head_dim || (style != 0 && style != 1) ||
	    !(base > 0))
		return -EINVAL;
	KVK_ENTER(ctx);
	size_t n = n_tok * n_heads * (rope_dim / 2);
	if (!n)
		return 0;
	rope_kernel<<<kvk_blocks(n, 256), 256, 0, ctx->s_comp>>>(x, n_tok, n_heads, head_dim,
								 rope_dim, pos, base, style);
	KVK_LAUNCHED();
	return 0;
}

static __global__ void swiglu_kernel(float *out, const float *gate, const float *up, size_t n)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float g = gate[i];
		out[i] = g / (1.0f + expf(-g)) * up[i];
	}
}

extern "C" int kvk_cu_swiglu(struct kvk_cuda_ctx *ctx, float *out, const float *gate,
			     const float *up, size_t n)
{
	KVK_ENTER(ctx);
	if (!n)
		return 0;
	unsigned nb = kvk_blocks(n, 256), grid = nb > 65535 ? 65535 : nb;
	swiglu_kernel<<<grid, 256, 0, ctx->s_comp>>>(out, gate, up, n);
	KVK_LAUNCHED();
	return 0;
}

static __global__ void convert_kernel(uint16_t *dst, int bf16, const float *src, size_t n)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		dst[i] = bf16 ? f32_to_bf16(src[i]) : __half_as_ushort(__float2half_rn(src[i]));
}

extern "C" int kvk_cu_convert(struct kvk_cuda_ctx *ctx, void *dst, enum kvk_dtype dt,
			      const float *src, size_t n)
{
	if (dt != KVK_DT_F16 && dt != KVK_DT_BF16)
		return -EINVAL;
	KVK_ENTER(ctx);
	if (!n)
		return 0;
	unsigned nb = kvk_blocks(n, 256), grid = nb > 65535 ? 65535 : nb;
	convert_kernel<<<grid, 256, 0, ctx->s_comp>>>((uint16_t *)dst, dt == KVK_DT_BF16, src, n);
	KVK_LAUNCHED();
	return 0;
}
