// GEMV for Q4_0 / Q4_K / Q5_K / Q6_K weights, dequantized on the fly (kvk_kq.cuh), f32
// activations. The launch shape of q8_0_gemv: one warp per output row, lane takes blocks of 32
// lane, lane + 32, ...; each block's 32 products summed in f32, then into the lane's total,
// then a warp reduction (kvk_ref_kq_gemv sums the blocks in row order: within tolerance).
//
// Both kernels here multiply f16 inputs: the dequantized weight and the activation are each
// rounded to f16 and their products summed in f32, as the tensor cores of kq_gemm_kernel do
// (and as the F16 weights' cuBLAS GEMM does). So the GEMV (decode, short chunks) and the GEMM
// (prefill from KG_MIN_TOK tokens) differ only in the order of f32 sums: the device engine's
// logits do not depend on how a prompt is cut into chunks (test_fwd_dev's SELF_TOL, 1e-3,
// which f32 weights in the GEMV against f16 in the GEMM exceeded: 1.8e-3).
#include "kvk_kq.cuh"

#define KQ_TOK	8 // tokens per pass
#define KQ_ROWS 8 // rows (warps) per block

static __device__ __forceinline__ float kq_h(float v)
{
	return __half2float(__float2half_rn(v));
}

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
		for (int i = 0; i < 32; i++)
			v[i] = kq_h(v[i]);
#pragma unroll
		for (int t = 0; t < KQ_TOK; t++) {
			if (t >= nt)
				break;
			const float4 *x4 = (const float4 *)(x + (size_t)t * n + (size_t)b * 32);
			float s = 0.f;
#pragma unroll
			for (int i = 0; i < 8; i++) {
				float4 xv = x4[i];
				s = fmaf(v[4 * i], kq_h(xv.x), s);
				s = fmaf(v[4 * i + 1], kq_h(xv.y), s);
				s = fmaf(v[4 * i + 2], kq_h(xv.z), s);
				s = fmaf(v[4 * i + 3], kq_h(xv.w), s);
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

// Prefill (many tokens) on tensor cores (sm_80+, KVK_MMA_DEVICE): the GEMV above streams the
// weights once per KQ_TOK tokens; this kernel reads them once per KG_BT. A block owns KG_BT
// tokens x KG_BR rows; per 32 values of k (one quant block) half its threads dequantize a block
// of each of its rows into shared memory as f16 (kq_block32, the GEMV's code), the other half
// convert the tokens' 32 activations to f16, and each warp adds its 32 x 32 sub-tile with wmma
// (f32 accumulate). Activations rounded to f16 (as a cuBLAS F16 GEMM of the F16 weights does)
// is what the GEMV does too (above).
#define KG_BT	   64	       // tokens per block
#define KG_BR	   64	       // weight rows per block
#define KG_XS	   40	       // row stride of the 32-wide k slices (halves; a multiple of 8)
#define KG_CS	   (KG_BR + 4) // row stride of the output tile (floats)
#define KG_MIN_TOK 16	       // kvk_cu_kq_gemv takes this kernel from this many tokens up

static __global__ void __launch_bounds__(128)
    kq_gemm_kernel(float *y, const uint8_t *w, int dt, size_t rb, const float *x, int rows, int n,
		   int n_tok)
{
#if KVK_MMA_DEVICE
	using namespace nvcuda;
	extern __shared__ float smem[];
	__half *xs = (__half *)smem;		   // [KG_BT][KG_XS] tokens x k
	__half *ws = xs + KG_BT * KG_XS;	   // [KG_BR][KG_XS] rows x k
	float *cs = (float *)(ws + KG_BR * KG_XS); // [KG_BT][KG_CS]
	const int r0 = blockIdx.x * KG_BR, t0 = blockIdx.y * KG_BT, tid = threadIdx.x;
	const int warp = tid >> 5, wt = (warp >> 1) * 32, wr = (warp & 1) * 32;
	wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fx[2];
	wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fw[2];
	wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc[2][2];
#pragma unroll
	for (int i = 0; i < 2; i++)
#pragma unroll
		for (int j = 0; j < 2; j++)
			wmma::fill_fragment(fc[i][j], 0.f);

	for (int b = 0; b < n / 32; b++) {
		__syncthreads(); // the previous slice is consumed
		if (tid < KG_BR) {
			int r = r0 + tid;
			float v[32];
			if (r < rows)
				kq_block32(dt, w + (size_t)r * rb, b, v);
			else
				for (int i = 0; i < 32; i++)
					v[i] = 0.f;
#pragma unroll
			for (int i = 0; i < 32; i++)
				ws[tid * KG_XS + i] = __float2half_rn(v[i]);
		} else {
			int t = tid - KG_BR, tok = t0 + t;
			const float4 *x4 = (const float4 *)(x + (size_t)tok * n + (size_t)b * 32);
#pragma unroll
			for (int i = 0; i < 8; i++) {
				float4 xv = tok < n_tok ? x4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
				__half *d = xs + t * KG_XS + 4 * i;
				d[0] = __float2half_rn(xv.x);
				d[1] = __float2half_rn(xv.y);
				d[2] = __float2half_rn(xv.z);
				d[3] = __float2half_rn(xv.w);
			}
		}
		__syncthreads();
#pragma unroll
		for (int k0 = 0; k0 < 32; k0 += 16) {
#pragma unroll
			for (int i = 0; i < 2; i++) {
				wmma::load_matrix_sync(fx[i], xs + (wt + 16 * i) * KG_XS + k0,
						       KG_XS);
				wmma::load_matrix_sync(fw[i], ws + (wr + 16 * i) * KG_XS + k0,
						       KG_XS); // W^T
			}
#pragma unroll
			for (int i = 0; i < 2; i++)
#pragma unroll
				for (int j = 0; j < 2; j++)
					wmma::mma_sync(fc[i][j], fx[i], fw[j], fc[i][j]);
		}
	}
#pragma unroll
	for (int i = 0; i < 2; i++)
#pragma unroll
		for (int j = 0; j < 2; j++)
			wmma::store_matrix_sync(cs + (wt + 16 * i) * KG_CS + wr + 16 * j, fc[i][j],
						KG_CS, wmma::mem_row_major);
	__syncthreads();
	for (int e = tid; e < KG_BT * KG_BR; e += blockDim.x) {
		int t = e / KG_BR, r = e % KG_BR;
		if (t0 + t < n_tok && r0 + r < rows)
			y[(size_t)(t0 + t) * rows + r0 + r] = cs[t * KG_CS + r];
	}
#endif
}

// which: 0 picks (the GEMM from KG_MIN_TOK tokens where tensor cores run), 1 the GEMM
// (-ENOTSUP without them), 2 the GEMV.
static int kq_mul(struct kvk_cuda_ctx *ctx, float *y, const void *w, enum kvk_dtype dt,
		  const float *x, int rows, int n, int n_tok, int which)
{
	size_t rb = n > 0 ? kq_row_bytes((int)dt, n) : 0;
	if (!rb || rows < 0 || n_tok < 0 || (uintptr_t)x % 16)
		return -EINVAL;
	KVK_ENTER(ctx);
	if (which == 1 && !ctx->mma)
		return -ENOTSUP;
	if (which == 1 || (which == 0 && ctx->mma && n_tok >= KG_MIN_TOK)) {
		if (!rows || !n_tok)
			return 0;
		size_t smem = (KG_BT + KG_BR) * KG_XS * 2 + KG_BT * KG_CS * 4;
		dim3 grid(kvk_blocks((size_t)rows, KG_BR), kvk_blocks((size_t)n_tok, KG_BT), 1);
		if (grid.y > 65535)
			return -EINVAL;
		kq_gemm_kernel<<<grid, 128, smem, ctx->s_comp>>>(y, (const uint8_t *)w, (int)dt, rb,
								 x, rows, n, n_tok);
		KVK_LAUNCHED();
		return 0;
	}
	for (int t0 = 0; t0 < n_tok && rows > 0; t0 += KQ_TOK) {
		int nt = n_tok - t0 < KQ_TOK ? n_tok - t0 : KQ_TOK;
		kq_gemv_kernel<<<kvk_blocks((size_t)rows, KQ_ROWS), KQ_ROWS * 32, 0, ctx->s_comp>>>(
		    y + (size_t)t0 * rows, (const uint8_t *)w, (int)dt, rb, x + (size_t)t0 * n,
		    rows, n, nt);
		KVK_LAUNCHED();
	}
	return 0;
}

extern "C" int kvk_cu_kq_gemv(struct kvk_cuda_ctx *ctx, float *y, const void *w, enum kvk_dtype dt,
			      const float *x, int rows, int n, int n_tok)
{
	return kq_mul(ctx, y, w, dt, x, rows, n, n_tok, 0);
}

extern "C" int kvk_cu_kq_gemm(struct kvk_cuda_ctx *ctx, float *y, const void *w, enum kvk_dtype dt,
			      const float *x, int rows, int n, int n_tok)
{
	return kq_mul(ctx, y, w, dt, x, rows, n, n_tok, 1);
}

extern "C" int kvk_cu_kq_gemv_fp32(struct kvk_cuda_ctx *ctx, float *y, const void *w,
				   enum kvk_dtype dt, const float *x, int rows, int n, int n_tok)
{
	return kq_mul(ctx, y, w, dt, x, rows, n, n_tok, 2);
}
