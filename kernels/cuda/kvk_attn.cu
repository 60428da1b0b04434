// Attention over paged f16 KV: one kernel for prefill (one sequence, many queries, causal) and
// decode (many sequences, one query each).
//
// A thread block owns ROWS query rows that share one sequence and one kv head: row r of the
// block is (query r / group, head r % group of the GQA group), so a decode block covers the
// group's heads and a prefill block a few queries times the group. Keys go through shared
// memory in tiles of 32 (K and V as f16, rows padded by one word so that lane j reading key j
// hits bank j); each warp owns rows warp, warp + 4, ...; per row a lane scores one key of the
// tile, the warp keeps the running max m, the running sum l and the output accumulator
// (lane owns head-dim pairs lane, lane + 32, ...): online softmax, no score matrix in memory.
#include "kvk_cuda_int.h"

#define ROWS	 16 // query rows per block
#define WARPS	 4
#define TILE	 32 // keys per tile (one per lane)
#define MAX_HD	 256
#define MAX_PAIR (MAX_HD / 2 / 32) // head-dim pairs per lane

struct attn_args {
	float *out;
	const float *q;
	const uint16_t *k, *v;
	size_t block_stride; // halves
	const int32_t *tables;
	const int32_t *seq_lens; // decode only (NULL: prefill)
	int max_blocks;
	int num_blocks, B, nkv, hd, n_heads, group;
	int n_q, q_start;
	float scale;
};

static __device__ float warp_max(float v)
{
	for (int off = 16; off > 0; off >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
	return v;
}

static __device__ float warp_sum(float v)
{
	for (int off = 16; off > 0; off >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, off);
	return v;
}

// Both kernels' mapping of a block's rows and keys (file comment): row r of kv head kvh is query
// r / group and head kvh * group + r % group; its query and output row start at this offset in
// q and out (s: the sequence, 0 in prefill).
static __device__ __forceinline__ size_t row_off(const struct attn_args &a, int s, int kvh, int r)
{
	int qi = r / a.group, h = kvh * a.group + r % a.group;
	return (((size_t)s * a.n_q + qi) * a.n_heads + h) * a.hd;
}

// Causal: the keys row r sees, from the first query's position pos0.
static __device__ __forceinline__ int row_nkeys(const struct attn_args &a, int pos0, int r)
{
	return pos0 + r / a.group + 1;
}

// Word p (a half pair) of key `key`'s K and V for kv head kvh through the block table; zeros
// for a table entry that names no block.
static __device__ __forceinline__ void kv_words(const struct attn_args &a, const int32_t *table,
						int key, int kvh, int p, uint32_t *kw, uint32_t *vw)
{
	int32_t b = table[key / a.B];
	if (b >= 0 && b < a.num_blocks) {
		size_t off =
		    (size_t)b * a.block_stride + ((size_t)(key % a.B) * a.nkv + kvh) * a.hd + 2 * p;
		*kw = *(const uint32_t *)(a.k + off);
		*vw = *(const uint32_t *)(a.v + off);
	}
}

static __global__ void __launch_bounds__(WARPS * 32) attn_kernel(struct attn_args a)
{
	extern __shared__ float smem[];
	const int hd = a.hd, hp = hd / 2, kstride = hp + 1; // row stride of ks/vs in words
	float *qs = smem;				    // [ROWS][hd], pre-scaled
	uint32_t *ks = (uint32_t *)(qs + ROWS * hd);	    // [TILE][kstride] half2
	uint32_t *vs = ks + TILE * kstride;
	const int s = blockIdx.z, kvh = blockIdx.y, row0 = blockIdx.x * ROWS;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int total_rows = a.n_q * a.group;
	const int32_t *table = a.tables + (size_t)s * a.max_blocks;

	// Query position of the block's first query; keys 0 .. pos are visible to that query.
	int len = a.seq_lens ? a.seq_lens[s] : a.q_start + a.n_q;
	int pos0 = a.seq_lens ? len - 1 : a.q_start;
	int last_row = min(row0 + ROWS, total_rows) - 1;
	int block_keys = row_nkeys(a, pos0, last_row); // keys of the block's last query

	for (int e = threadIdx.x; e < ROWS * hd; e += blockDim.x) {
		int r = row0 + e / hd, d = e % hd;
		float v = 0.f;
		if (r < total_rows && len > 0)
			v = a.q[row_off(a, s, kvh, r) + d] * a.scale;
		qs[e] = v;
	}

	float m[ROWS / WARPS], l[ROWS / WARPS];
	float2 acc[ROWS / WARPS][MAX_PAIR];
#pragma unroll
	for (int j = 0; j < ROWS / WARPS; j++) {
		m[j] = -INFINITY;
		l[j] = 0.f;
#pragma unroll
		for (int i = 0; i < MAX_PAIR; i++)
			acc[j][i] = make_float2(0.f, 0.f);
	}

	for (int kt = 0; len > 0 && kt < block_keys; kt += TILE) {
		__syncthreads(); // the previous tile (or the q load) is done
		for (int e = threadIdx.x; e < TILE * hp; e += blockDim.x) {
			int j = e / hp, p = e % hp, key = kt + j;
			uint32_t kw = 0, vw = 0;
			// A decode length past its table row reads zeros, never another row.
			if (key < block_keys && (!a.seq_lens || key / a.B < a.max_blocks))
				kv_words(a, table, key, kvh, p, &kw, &vw);
			ks[j * kstride + p] = kw;
			vs[j * kstride + p] = vw;
		}
		__syncthreads();
#pragma unroll
		for (int j = 0; j < ROWS / WARPS; j++) {
			int r = row0 + warp + WARPS * j;
			if (r >= total_rows)
				continue;
			int row_keys = row_nkeys(a, pos0, r);
			if (kt >= row_keys)
				continue; // warp-uniform
			const float2 *q2 = (const float2 *)(qs + (r - row0) * hd);
			const uint32_t *kr = ks + lane * kstride;
			float sc = 0.f;
			for (int p = 0; p < hp; p++) {
				float2 kf = __half22float2(*(const __half2 *)&kr[p]);
				float2 qf = q2[p];
				sc = fmaf(qf.x, kf.x, sc);
				sc = fmaf(qf.y, kf.y, sc);
			}
			if (kt + lane >= row_keys)
				sc = -INFINITY;
			float m_new = fmaxf(m[j], warp_max(sc));
			float corr = expf(m[j] - m_new);
			float pr = expf(sc - m_new);
			l[j] = l[j] * corr + warp_sum(pr);
			m[j] = m_new;
#pragma unroll
			for (int i = 0; i < MAX_PAIR; i++) {
				acc[j][i].x *= corr;
				acc[j][i].y *= corr;
			}
			int nk = min(TILE, row_keys - kt);
			for (int t = 0; t < nk; t++) {
				float pt = __shfl_sync(0xffffffffu, pr, t);
				const uint32_t *vr = vs + t * kstride;
#pragma unroll
				for (int i = 0; i < MAX_PAIR; i++) {
					int p = lane + 32 * i;
					if (p < hp) {
						float2 vf =
						    __half22float2(*(const __half2 *)&vr[p]);
						acc[j][i].x = fmaf(pt, vf.x, acc[j][i].x);
						acc[j][i].y = fmaf(pt, vf.y, acc[j][i].y);
					}
				}
			}
		}
	}

#pragma unroll
	for (int j = 0; j < ROWS / WARPS; j++) {
		int r = row0 + warp + WARPS * j;
		if (r >= total_rows)
			continue;
		float *o = a.out + row_off(a, s, kvh, r);
		float inv = len > 0 && l[j] > 0.f ? 1.f / l[j] : 0.f;
#pragma unroll
		for (int i = 0; i < MAX_PAIR; i++) {
			int p = lane + 32 * i;
			if (p < hp)
				*(float2 *)(o + 2 * p) =
				    make_float2(acc[j][i].x * inv, acc[j][i].y * inv);
		}
	}
}

// Prefill on tensor cores (sm_80+, KVK_MMA_DEVICE): the same rows and causal limits as
// attn_kernel, 64 rows per block (16 per warp), keys in tiles of FA_BN through shared memory as
// f16. Per tile each warp computes its 16 x FA_BN scores S = Q K^T with wmma (Q pre-scaled and
// rounded to f16 once, f32 accumulate) into shared memory; two lanes per row run the online
// softmax over S (row max and sum through one shuffle), write P as f16 and rescale the row of
// the f32 output O (kept in shared memory, since a fragment's lane layout is unspecified and a
// row cannot be rescaled in registers); then O += P V with wmma. The row sum l adds the f16
// values of P that the product used, so the weights stay normalised. Needs head_dim % 16 == 0.
#define FA_WARPS 4
#define FA_BM	 (16 * FA_WARPS) // rows per block
#define FA_BN	 32		 // keys per tile
#define FA_SS	 (FA_BN + 4)	 // row stride of S (floats; a multiple of 4 for wmma)
#define FA_PS	 (FA_BN + 8)	 // row stride of P (halves; a multiple of 8)

// Dynamic shared memory of fa_kernel at head_dim hd; every part starts 32-byte aligned.
static size_t fa_smem(int hd)
{
	size_t qk = (size_t)hd + 8; // row stride of Q, K and V in halves
	return (FA_BM + 2 * FA_BN) * qk * 2 + FA_BM * FA_SS * 4 + FA_BM * FA_PS * 2 +
	       FA_BM * ((size_t)hd + 4) * 4;
}

static __global__ void __launch_bounds__(FA_WARPS * 32) fa_kernel(struct attn_args a)
{
#if KVK_MMA_DEVICE
	using namespace nvcuda;
	extern __shared__ float smem[];
	const int hd = a.hd, hp = hd / 2, QS = hd + 8, OS = hd + 4;
	__half *qs = (__half *)smem;  // [FA_BM][QS], pre-scaled
	__half *ks = qs + FA_BM * QS; // [FA_BN][QS]
	__half *vs = ks + FA_BN * QS;
	float *ss = (float *)(vs + FA_BN * QS);	     // [FA_BM][FA_SS]
	__half *ps = (__half *)(ss + FA_BM * FA_SS); // [FA_BM][FA_PS]
	float *os = (float *)(ps + FA_BM * FA_PS);   // [FA_BM][OS]
	const int kvh = blockIdx.y, row0 = blockIdx.x * FA_BM;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int total_rows = a.n_q * a.group, pos0 = a.q_start;
	const int32_t *table = a.tables;
	int block_keys = row_nkeys(a, pos0, min(row0 + FA_BM, total_rows) - 1);

	for (int e = threadIdx.x; e < FA_BM * hd; e += blockDim.x) {
		int i = e / hd, d = e % hd, r = row0 + i;
		float v = 0.f;
		if (r < total_rows)
			v = a.q[row_off(a, 0, kvh, r) + d] * a.scale;
		qs[i * QS + d] = __float2half_rn(v);
		os[i * OS + d] = 0.f;
	}

	// This lane's row (two lanes per row, each half of the tile's keys and of the head dims).
	const int wr = warp * 16 + (lane >> 1), hf = lane & 1, r = row0 + wr;
	const int row_keys = r < total_rows ? row_nkeys(a, pos0, r) : 0;
	const int wlast = min(row0 + warp * 16 + 15, total_rows - 1);
	const int warp_keys = wlast >= row0 + warp * 16 ? row_nkeys(a, pos0, wlast) : 0;
	float m = -INFINITY, l = 0.f;

	for (int kt = 0; kt < block_keys; kt += FA_BN) {
		__syncthreads(); // the previous tile (or the q load) is done
		for (int e = threadIdx.x; e < FA_BN * hp; e += blockDim.x) {
			int j = e / hp, p = e % hp, key = kt + j;
			uint32_t kw = 0, vw = 0; // keys past the block's last are zeros
			if (key < block_keys)
				kv_words(a, table, key, kvh, p, &kw, &vw);
			((uint32_t *)ks)[j * (QS / 2) + p] = kw;
			((uint32_t *)vs)[j * (QS / 2) + p] = vw;
		}
		__syncthreads();
		if (kt >= warp_keys)
			continue; // warp-uniform: every row of this warp is past its last key

		wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
		wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fk;
		wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fv;
		wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
#pragma unroll
		for (int n0 = 0; n0 < FA_BN; n0 += 16) {
			wmma::fill_fragment(fc, 0.f);
			for (int k0 = 0; k0 < hd; k0 += 16) {
				wmma::load_matrix_sync(fa, qs + warp * 16 * QS + k0, QS);
				wmma::load_matrix_sync(fk, ks + n0 * QS + k0, QS); // K^T
				wmma::mma_sync(fc, fa, fk, fc);
			}
			wmma::store_matrix_sync(ss + warp * 16 * FA_SS + n0, fc, FA_SS,
						wmma::mem_row_major);
		}
		__syncwarp();

		const float *sr = ss + wr * FA_SS + hf * (FA_BN / 2);
		__half *pr = ps + wr * FA_PS + hf * (FA_BN / 2);
		const int key0 = kt + hf * (FA_BN / 2);
		float mx = -INFINITY;
#pragma unroll
		for (int c = 0; c < FA_BN / 2; c++)
			if (key0 + c < row_keys)
				mx = fmaxf(mx, sr[c]);
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
		float m_new = fmaxf(m, mx);
		// a row with no visible key yet (or no row) keeps m = -inf: nothing to rescale
		float corr = m_new == -INFINITY ? 1.f : expf(m - m_new), sum = 0.f;
#pragma unroll
		for (int c = 0; c < FA_BN / 2; c++) {
			__half p = __float2half_rn(key0 + c < row_keys ? expf(sr[c] - m_new) : 0.f);
			pr[c] = p;
			sum += __half2float(p);
		}
		sum += __shfl_xor_sync(0xffffffffu, sum, 1);
		l = l * corr + sum;
		m = m_new;
		float *orow = os + wr * OS + hf * hp;
		for (int d = 0; d < hp; d++)
			orow[d] *= corr;
		__syncwarp();

		for (int n0 = 0; n0 < hd; n0 += 16) {
			wmma::load_matrix_sync(fc, os + warp * 16 * OS + n0, OS,
					       wmma::mem_row_major);
#pragma unroll
			for (int k0 = 0; k0 < FA_BN; k0 += 16) {
				wmma::load_matrix_sync(fa, ps + warp * 16 * FA_PS + k0, FA_PS);
				wmma::load_matrix_sync(fv, vs + k0 * QS + n0, QS);
				wmma::mma_sync(fc, fa, fv, fc);
			}
			__syncwarp(); // every lane's load of this tile of O is done before it is
				      // rewritten
			wmma::store_matrix_sync(os + warp * 16 * OS + n0, fc, OS,
						wmma::mem_row_major);
		}
	}
	__syncwarp(); // the last stores of O are read by the row's lanes

	if (r < total_rows) {
		float *o = a.out + row_off(a, 0, kvh, r) + hf * hp;
		const float *orow = os + wr * OS + hf * hp;
		float inv = l > 0.f ? 1.f / l : 0.f;
		for (int d = 0; d < hp; d++)
			o[d] = orow[d] * inv;
	}
#endif
}

static int pages_ok(const struct kvk_kv_pages *kv, int n_heads)
{
	return kv && kv->k && kv->v && kv->num_blocks >= 1 && kv->block_tokens >= 1 &&
	       kv->n_kv_heads >= 1 && kv->n_kv_heads <= 65535 && kv->head_dim >= 2 &&
	       kv->head_dim <= MAX_HD && kv->head_dim % 2 == 0 && kv->block_stride % 2 == 0 &&
	       kv->block_stride >= (size_t)kv->block_tokens * kv->n_kv_heads * kv->head_dim &&
	       ((uintptr_t)kv->k | (uintptr_t)kv->v) % 4 == 0 && n_heads >= 1 &&
	       n_heads % kv->n_kv_heads == 0;
}

static int launch(struct kvk_cuda_ctx *ctx, struct attn_args *a, int n_seqs)
{
	size_t rows = (size_t)a->n_q * a->group;
	size_t smem = ROWS * a->hd * sizeof(float) + 2 * TILE * (a->hd / 2 + 1) * sizeof(uint32_t);
	if (smem > 48 * 1024)
		KVK_CK(cudaFuncSetAttribute(
		    attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
	dim3 grid(kvk_blocks(rows, ROWS), (unsigned)a->nkv, (unsigned)n_seqs);
	attn_kernel<<<grid, WARPS * 32, smem, ctx->s_comp>>>(*a);
	KVK_LAUNCHED();
	return 0;
}

static void fill(struct attn_args *a, float *out, const float *q, const struct kvk_kv_pages *kv,
		 int n_heads, float scale)
{
	a->out = out;
	a->q = q;
	a->k = kv->k;
	a->v = kv->v;
	a->block_stride = kv->block_stride;
	a->num_blocks = kv->num_blocks;
	a->B = kv->block_tokens;
	a->nkv = kv->n_kv_heads;
	a->hd = kv->head_dim;
	a->n_heads = n_heads;
	a->group = n_heads / kv->n_kv_heads;
	a->scale = scale;
}

// which: 0 picks the tensor-core kernel where it runs, 1 forces it (-ENOTSUP where it does
// not), 2 forces the FP32 kernel.
static int prefill(struct kvk_cuda_ctx *ctx, float *out, const float *q,
		   const struct kvk_kv_pages *kv, const int32_t *table, int n_q, int q_start,
		   int n_heads, float scale, int which)
{
	if (!pages_ok(kv, n_heads) || n_q < 0 || q_start < 0 || q_start > INT32_MAX - n_q ||
	    (size_t)n_q * n_heads > INT32_MAX)
		return -EINVAL;
	KVK_ENTER(ctx);
	int mma = ctx->mma && kv->head_dim % 16 == 0;
	if (which == 1 && !mma)
		return -ENOTSUP;
	if (!n_q)
		return 0;
	struct attn_args a = {};
	fill(&a, out, q, kv, n_heads, scale);
	a.tables = table;
	a.seq_lens = NULL;
	a.max_blocks = 0; // one table: row stride unused
	a.n_q = n_q;
	a.q_start = q_start;
	if (which == 2 || !mma)
		return launch(ctx, &a, 1);
	size_t smem = fa_smem(a.hd);
	if (smem > 48 * 1024)
		KVK_CK(cudaFuncSetAttribute(fa_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
					    (int)smem));
	dim3 grid(kvk_blocks((size_t)n_q * a.group, FA_BM), (unsigned)a.nkv, 1);
	fa_kernel<<<grid, FA_WARPS * 32, smem, ctx->s_comp>>>(a);
	KVK_LAUNCHED();
	return 0;
}

extern "C" int kvk_cu_attn_prefill(struct kvk_cuda_ctx *ctx, float *out, const float *q,
				   const struct kvk_kv_pages *kv, const int32_t *table, int n_q,
				   int q_start, int n_heads, float scale)
{
	return prefill(ctx, out, q, kv, table, n_q, q_start, n_heads, scale, 0);
}

extern "C" int kvk_cu_attn_prefill_mma(struct kvk_cuda_ctx *ctx, float *out, const float *q,
				       const struct kvk_kv_pages *kv, const int32_t *table, int n_q,
				       int q_start, int n_heads, float scale)
{
	return prefill(ctx, out, q, kv, table, n_q, q_start, n_heads, scale, 1);
}

extern "C" int kvk_cu_attn_prefill_fp32(struct kvk_cuda_ctx *ctx, float *out, const float *q,
					const struct kvk_kv_pages *kv, const int32_t *table,
					int n_q, int q_start, int n_heads, float scale)
{
	return prefill(ctx, out, q, kv, table, n_q, q_start, n_heads, scale, 2);
}

extern "C" int kvk_cu_attn_decode(struct kvk_cuda_ctx *ctx, float *out, const float *q,
				  const struct kvk_kv_pages *kv, const int32_t *tables,
				  int max_blocks, const int32_t *seq_lens, int n_seqs, int n_heads,
				  float scale)
{
	if (!pages_ok(kv, n_heads) || max_blocks < 1 || n_seqs < 0)
		return -EINVAL;
	KVK_ENTER(ctx);
	// Sequences are grid.z (at most 65535): a larger batch (the engine allows 65536) goes in
	// several launches, each on its slice of q, out, tables and seq_lens.
	for (int s0 = 0; s0 < n_seqs; s0 += 65535) {
		int ns = n_seqs - s0 < 65535 ? n_seqs - s0 : 65535;
		size_t row = (size_t)s0 * n_heads * kv->head_dim;
		struct attn_args a = {};
		fill(&a, out + row, q + row, kv, n_heads, scale);
		a.tables = tables + (size_t)s0 * max_blocks;
		a.seq_lens = seq_lens + s0;
		a.max_blocks = max_blocks;
		a.n_q = 1;
		a.q_start = 0;
		int rc = launch(ctx, &a, ns);
		if (rc)
			return rc;
	}
	return 0;
}

// Attention without a mask over dense f32 Q/K/V (the vision tower, kvk_ref_attn_dense): the
// scheme above on one head per block (grid.y), ROWS query rows per block, keys in tiles of 32
// through shared memory as f32 (rows padded by one word: lane j scoring key j hits bank j);
// every row sees every key, so there is no causal limit and no page table. Any head_dim up to
// MAX_HD (no f16 pairs here).
static __global__ void __launch_bounds__(WARPS * 32)
    attn_dense_kernel(float *out, const float *q, const float *k, const float *v, int n_tok,
		      int n_heads, int hd, float scale)
{
	extern __shared__ float smem[];
	const int stride = hd + 1;
	float *qs = smem;		// [ROWS][hd], pre-scaled
	float *ks = qs + ROWS * hd;	// [TILE][hd + 1]
	float *vs = ks + TILE * stride; // [TILE][hd + 1]
	const int h = blockIdx.y, row0 = blockIdx.x * ROWS;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const size_t row = (size_t)n_heads * hd;

	for (int e = threadIdx.x; e < ROWS * hd; e += blockDim.x) {
		int r = row0 + e / hd, d = e % hd;
		qs[e] = r < n_tok ? q[(size_t)r * row + (size_t)h * hd + d] * scale : 0.f;
	}

	float m[ROWS / WARPS], l[ROWS / WARPS];
	float acc[ROWS / WARPS][MAX_HD / 32];
#pragma unroll
	for (int j = 0; j < ROWS / WARPS; j++) {
		m[j] = -INFINITY;
		l[j] = 0.f;
#pragma unroll
		for (int i = 0; i < MAX_HD / 32; i++)
			acc[j][i] = 0.f;
	}

	for (int kt = 0; kt < n_tok; kt += TILE) {
		__syncthreads(); // the previous tile (or the q load) is done
		for (int e = threadIdx.x; e < TILE * hd; e += blockDim.x) {
			int j = e / hd, d = e % hd, key = kt + j;
			size_t off = (size_t)key * row + (size_t)h * hd + d;
			ks[j * stride + d] = key < n_tok ? k[off] : 0.f;
			vs[j * stride + d] = key < n_tok ? v[off] : 0.f;
		}
		__syncthreads();
		int nk = min(TILE, n_tok - kt);
#pragma unroll
		for (int j = 0; j < ROWS / WARPS; j++) {
			int r = row0 + warp + WARPS * j;
			if (r >= n_tok)
				continue; // warp-uniform
			const float *qr = qs + (r - row0) * hd;
			const float *kr = ks + lane * stride;
			float sc = 0.f;
			for (int d = 0; d < hd; d++)
				sc = fmaf(qr[d], kr[d], sc);
			if (lane >= nk)
				sc = -INFINITY;
			float m_new = fmaxf(m[j], warp_max(sc));
			float corr = expf(m[j] - m_new);
			float pr = expf(sc - m_new);
			l[j] = l[j] * corr + warp_sum(pr);
			m[j] = m_new;
#pragma unroll
			for (int i = 0; i < MAX_HD / 32; i++)
				acc[j][i] *= corr;
			for (int t = 0; t < nk; t++) {
				float pt = __shfl_sync(0xffffffffu, pr, t);
				const float *vr = vs + t * stride;
#pragma unroll
				for (int i = 0; i < MAX_HD / 32; i++) {
					int d = lane + 32 * i;
					if (d < hd)
						acc[j][i] = fmaf(pt, vr[d], acc[j][i]);
				}
			}
		}
	}

#pragma unroll
	for (int j = 0; j < ROWS / WARPS; j++) {
		int r = row0 + warp + WARPS * j;
		if (r >= n_tok)
			continue;
		float *o = out + (size_t)r * row + (size_t)h * hd;
		float inv = l[j] > 0.f ? 1.f / l[j] : 0.f;
#pragma unroll
		for (int i = 0; i < MAX_HD / 32; i++) {
			int d = lane + 32 * i;
			if (d < hd)
				o[d] = acc[j][i] * inv;
		}
	}
}

extern "C" int kvk_cu_attn_dense(struct kvk_cuda_ctx *ctx, float *out, const float *q,
				 const float *k, const float *v, int n_tok, int n_heads,
				 int head_dim, float scale)
{
	if (n_tok < 0 || n_heads < 1 || n_heads > 65535 || head_dim < 1 || head_dim > MAX_HD)
		return -EINVAL;
	KVK_ENTER(ctx);
	if (!n_tok)
		return 0;
	size_t smem = (ROWS * (size_t)head_dim + 2 * TILE * ((size_t)head_dim + 1)) * sizeof(float);
	if (smem > 48 * 1024)
		KVK_CK(cudaFuncSetAttribute(
		    attn_dense_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
	dim3 grid(kvk_blocks((size_t)n_tok, ROWS), (unsigned)n_heads, 1);
	attn_dense_kernel<<<grid, WARPS * 32, smem, ctx->s_comp>>>(out, q, k, v, n_tok, n_heads,
								   head_dim, scale);
	KVK_LAUNCHED();
	return 0;
}
