// Matrix products: F16/BF16 GEMM through cuBLAS (tensor cores), Q8_0 GEMV dequantizing on the
// fly.
#include "kvk_cuda_int.h"

extern "C" int kvk_cu_gemm(struct kvk_cuda_ctx *ctx, float *c, const void *a, const void *b,
			   enum kvk_dtype dt, int m, int n, int k)
{
	if ((dt != KVK_DT_F16 && dt != KVK_DT_BF16 && dt != KVK_DT_F32) || m < 0 || n < 0 || k < 1)
		return -EINVAL;
	KVK_ENTER(ctx);
	if (!m || !n)
		return 0;
	// Row-major c (m, n) = a (m, k) b (n, k)^T is column-major c^T (n, m) = b^T' a': cuBLAS
	// sees b as a (k, n) column-major matrix to transpose and a as (k, m) as it is.
	cudaDataType_t t = dt == KVK_DT_F16    ? CUDA_R_16F
			   : dt == KVK_DT_BF16 ? CUDA_R_16BF
					       : CUDA_R_32F;
	const float one = 1.f, zero = 0.f;
	cublasStatus_t st =
	    cublasGemmEx(ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, b, t, k, a, t, k,
			 &zero, c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
	if (st != CUBLAS_STATUS_SUCCESS) {
		klog_error("cublasGemmEx(%d x %d x %d): status %d", m, n, k, (int)st);
		return -EIO;
	}
	return 0;
}

#define GEMV_TOK  8 // tokens per pass
#define GEMV_ROWS 8 // rows (warps) per block

// One warp per row; lane takes blocks lane, lane + 32, ...; each block's 32 products are summed
// in f32 before the scale, as in kvk_ref_q8_0_gemv.
static __global__ void q8_0_gemv_kernel(float *y, const uint8_t *w, const float *x, int rows, int n,
					int nt)
{
	int r = blockIdx.x * GEMV_ROWS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	if (r >= rows)
		return;
	int nb = n / KVK_Q8_0_BLOCK;
	const uint8_t *row = w + (size_t)r * nb * KVK_Q8_0_BYTES;
	float acc[GEMV_TOK];
#pragma unroll
	for (int t = 0; t < GEMV_TOK; t++)
		acc[t] = 0.f;
	for (int bi = lane; bi < nb; bi += 32) {
		const uint16_t *blk = (const uint16_t *)(row + (size_t)bi * KVK_Q8_0_BYTES);
		float d = __half2float(__ushort_as_half(blk[0]));
		int8_t q[KVK_Q8_0_BLOCK];
#pragma unroll
		for (int i = 0; i < KVK_Q8_0_BLOCK / 2; i++) {
			uint16_t two = blk[1 + i];
			q[2 * i] = (int8_t)(two & 0xff);
			q[2 * i + 1] = (int8_t)(two >> 8);
		}
#pragma unroll
		for (int t = 0; t < GEMV_TOK; t++) {
			if (t >= nt)
				break;
			const float4 *x4 =
			    (const float4 *)(x + (size_t)t * n + bi * KVK_Q8_0_BLOCK);
			float s = 0.f;
#pragma unroll
			for (int i = 0; i < KVK_Q8_0_BLOCK / 4; i++) {
				float4 xv = x4[i];
				s = fmaf((float)q[4 * i], xv.x, s);
				s = fmaf((float)q[4 * i + 1], xv.y, s);
				s = fmaf((float)q[4 * i + 2], xv.z, s);
				s = fmaf((float)q[4 * i + 3], xv.w, s);
			}
			acc[t] = fmaf(s, d, acc[t]);
		}
	}
#pragma unroll
	for (int t = 0; t < GEMV_TOK; t++) {
		if (t >= nt)
			break;
		float v = acc[t];
		for (int off = 16; off > 0; off >>= 1)
			v += __shfl_xor_sync(0xffffffffu, v, off);
		if (lane == 0)
			y[(size_t)t * rows + r] = v;
	}
}

extern "C" int kvk_cu_q8_0_gemv(struct kvk_cuda_ctx *ctx, float *y, const void *w, const float *x,
				int rows, int n, int n_tok)
{
	if (rows < 0 || n < KVK_Q8_0_BLOCK || n % KVK_Q8_0_BLOCK || n_tok < 0 ||
	    (uintptr_t)x % 16 || (uintptr_t)w % 2)
		return -EINVAL;
	KVK_ENTER(ctx);
	for (int t0 = 0; t0 < n_tok && rows > 0; t0 += GEMV_TOK) {
		int nt = n_tok - t0 < GEMV_TOK ? n_tok - t0 : GEMV_TOK;
		q8_0_gemv_kernel<<<kvk_blocks((size_t)rows, GEMV_ROWS), GEMV_ROWS * 32, 0,
				   ctx->s_comp>>>(y + (size_t)t0 * rows, (const uint8_t *)w,
						  x + (size_t)t0 * n, rows, n, nt);
		KVK_LAUNCHED();
	}
	return 0;
}
