// Sampling: argmax and top-k, one thread block per row, in the exact order kvk_ref_* use.
#include "kvk_cuda_int.h"

#define SAMPLE_THREADS 512

// a before b: larger value, or equal with a lower index (NaN counts as -inf).
static __device__ bool ranks_before(float va, int ia, float vb, int ib)
{
	if (isnan(va))
		va = -INFINITY;
	if (isnan(vb))
		vb = -INFINITY;
	return va > vb || (va == vb && ia < ib);
}

// Block-wide best (v, i) by ranks_before; index -1 means "none". Every thread gets the result.
static __device__ void block_best(float *v, int *i, float *sv, int *si)
{
	for (int off = 16; off > 0; off >>= 1) {
		float ov = __shfl_xor_sync(0xffffffffu, *v, off);
		int oi = __shfl_xor_sync(0xffffffffu, *i, off);
		if (oi >= 0 && (*i < 0 || ranks_before(ov, oi, *v, *i))) {
			*v = ov;
			*i = oi;
		}
	}
	int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	__syncthreads(); // sv/si of an earlier call are consumed
	if ((threadIdx.x & 31) == 0) {
		sv[warp] = *v;
		si[warp] = *i;
	}
	__syncthreads();
	*v = sv[0];
	*i = si[0];
	for (int w = 1; w < nw; w++)
		if (si[w] >= 0 && (*i < 0 || ranks_before(sv[w], si[w], *v, *i))) {
			*v = sv[w];
			*i = si[w];
		}
}

static __global__ void argmax_kernel(int32_t *out, const float *logits, int vocab)
{
	__shared__ float sv[32];
	__shared__ int si[32];
	const float *l = logits + (size_t)blockIdx.x * vocab;
	float bv = 0.f;
	int bi = -1;
	for (int i = threadIdx.x; i < vocab; i += blockDim.x)
		if (bi < 0 || ranks_before(l[i], i, bv, bi)) {
			bv = l[i];
			bi = i;
		}
	block_best(&bv, &bi, sv, si);
	if (threadIdx.x == 0)
		out[blockIdx.x] = bi;
}

// k rounds of a block-wide best among the elements ranked after the previous pick: no list of
// picked indices is needed, and ties come out in index order as in the reference.
static __global__ void topk_kernel(int32_t *out, const float *logits, int vocab, int k,
				   float temperature, const float *u)
{
	__shared__ float sv[32];
	__shared__ int si[32];
	__shared__ int picked[KVK_TOPK_MAX];
	const float *l = logits + (size_t)blockIdx.x * vocab;
	float pv = 0.f;
	int pi = -1;
	for (int r = 0; r < k; r++) {
		float bv = 0.f;
		int bi = -1;
		for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
			if (pi >= 0 && !ranks_before(pv, pi, l[i], i))
				continue;
			if (bi < 0 || ranks_before(l[i], i, bv, bi)) {
				bv = l[i];
				bi = i;
			}
		}
		block_best(&bv, &bi, sv, si);
		pv = bv;
		pi = bi;
		if (threadIdx.x == 0)
			picked[r] = bi;
	}
	if (threadIdx.x != 0)
		return;
	if (k == 1 || !(temperature > 0.f)) {
		out[blockIdx.x] = picked[0];
		return;
	}
	// The same arithmetic, in the same order, as kvk_ref_sample_topk.
	float p[KVK_TOPK_MAX], sum = 0.f;
	float top = isnan(l[picked[0]]) ? -INFINITY : l[picked[0]];
	for (int i = 0; i < k; i++) {
		float v = isnan(l[picked[i]]) ? -INFINITY : l[picked[i]];
		p[i] = v == top ? 1.f : expf((v - top) / temperature);
		sum += p[i];
	}
	float target = u[blockIdx.x] * sum, run = 0.f;
	int pick = picked[k - 1];
	for (int i = 0; i < k; i++) {
		run += p[i];
		if (run > target) {
			pick = picked[i];
			break;
		}
	}
	out[blockIdx.x] = pick;
}

extern "C" int kvk_cu_argmax(struct kvk_cuda_ctx *ctx, int32_t *out, const float *logits,
			     int n_rows, int vocab)
{
	if (n_rows < 0 || vocab < 1)
		return -EINVAL;
	KVK_ENTER(ctx);
	if (!n_rows)
		return 0;
	argmax_kernel<<<(unsigned)n_rows, SAMPLE_THREADS, 0, ctx->s_comp>>>(out, logits, vocab);
	KVK_LAUNCHED();
	return 0;
}

extern "C" int kvk_cu_sample_topk(struct kvk_cuda_ctx *ctx, int32_t *out, const float *logits,
				  int n_rows, int vocab, int k, float temperature, const float *u)
{
	if (n_rows < 0 || vocab < 1 || k < 1 || k > KVK_TOPK_MAX || k > vocab)
		return -EINVAL;
	KVK_ENTER(ctx);
	if (!n_rows)
		return 0;
	topk_kernel<<<(unsigned)n_rows, SAMPLE_THREADS, 0, ctx->s_comp>>>(out, logits, vocab, k,
									  temperature, u);
	KVK_LAUNCHED();
	return 0;
}
