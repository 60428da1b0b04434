// GEMV for Q4_0 / Q4_K / Q5_K / Q6_K weights, dequantized on the fly (kvk_kq.cuh), f32
// activations. The launch shape of q8_0_gemv: one warp per output row, lane takes blocks of 32
// lane, lane + 32, ...; each block's 32 products summed in f32, then into the lane's total,
// then a warp reduction (kvk_ref_kq_gemv sums the blocks in row order: within tolerance).
#include "kvk_kq.cuh"

#define KQ_TOK	8 // tokens per pass
#define KQ_ROWS 8 // rows (warps) per block

static __global__ void kq_gemv_kernel(float *y, const uint8_t *w, int dt, size_t rb, const float *x,
				      int rows, int n, int nt)
{
	int r = blockIdx.x * KQ_ROWS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	if (r >= rows)
		return;
	const uint8_t *row = w + (size_t)r * rb;
	float acc[KQ_TOK];
#pragma unroll
	for (int t = 0; t < KQ_TOK; t++)
		acc[t] = 0.f;
	for (int b = lane; b < n / 32; b += 32) {
		float v[32];
		kq_block32(dt, row, b, v);
#pragma unroll
		for (int t = 0; t < KQ_TOK; t++) {
			if (t >= nt)
				break;
			const float4 *x4 = (const float4 *)(x + (size_t)t * n + (size_t)b * 32);
			float s = 0.f;
#pragma unroll
			for (int i = 0; i < 8; i++) {
				float4 xv = x4[i];
				s = fmaf(v[4 * i], xv.x, s);
				s = fmaf(v[4 * i + 1], xv.y, s);
				s = fmaf(v[4 * i + 2], xv.z, s);
				s = fmaf(v[4 * i + 3], xv.w, s);
			}
			acc[t] += s;
		}
	}
#pragma unroll
	for (int t = 0; t < KQ_TOK; t++) {
		if (t >= nt)
			break;
		float v = acc[t];
		for (int off = 16; off > 0; off >>= 1)
			v += __shfl_xor_sync(0xffffffffu, v, off);
		if (lane == 0)
			y[(size_t)t * rows + r] = v;
	}
}

extern "C" int kvk_cu_kq_gemv(struct kvk_cuda_ctx *ctx, float *y, const void *w, enum kvk_dtype dt,
			      const float *x, int rows, int n, int n_tok)
{
	size_t rb = n > 0 ? kq_row_bytes((int)dt, n) : 0;
	if (!rb || rows < 0 || n_tok < 0 || (uintptr_t)x % 16)
		return -EINVAL;
	KVK_ENTER(ctx);
	for (int t0 = 0; t0 < n_tok && rows > 0; t0 += KQ_TOK) {
		int nt = n_tok - t0 < KQ_TOK ? n_tok - t0 : KQ_TOK;
		kq_gemv_kernel<<<kvk_blocks((size_t)rows, KQ_ROWS), KQ_ROWS * 32, 0, ctx->s_comp>>>(
		    y + (size_t)t0 * rows, (const uint8_t *)w, (int)dt, rb, x + (size_t)t0 * n,
		    rows, n, nt);
		KVK_LAUNCHED();
	}
	return 0;
}
