/* kvk-gpu-bench: short GPU benchmark of the kvk CUDA kernels (tools/gpu-check.sh runs it).
 *
 * Every figure comes with its baseline measured in the same run:
 *   - host<->device copy bandwidth of pinned memory (cudaMemcpy), the baseline of
 *   - KV pack / unpack of a 1B-shape sequence (GB/s and the ratio to that bandwidth),
 *   - F16 / BF16 GEMM through cuBLAS at 8192^3 (TFLOP/s and the ratio to the dense peak given
 *     with --peak, default H200 989 TFLOP/s),
 *   - paged attention: prefill TFLOP/s on tensor cores (ratio to --peak, and to the FP32
 *     kernel in the same run), decode GB/s of KV read;
 *   - decode GEMV (1 token) of Q8_0 and Q4_K weights: GB/s of weights and the ratio to the
 *     HBM bandwidth given with --hbm (default H200 4800 GB/s);
 *   - K-quant prefill (Q4_K, 512 tokens): the dequant-GEMM on tensor cores in TFLOP/s, its
 *     ratio to --peak and to the GEMV path in the same run.
 * Each limit is a vendor figure, not measured here (gpu-check.sh picks them by GPU name).
 * Output: "key: value" lines on stdout. Exit 0, 77 without a GPU, 1 on an error.
 *
 *   kvk-gpu-bench [--peak TFLOPS] [--hbm GBPS] [--quick]
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvk_cuda.h"
#include "kvk_ops.h"

/* The 1B shape (Llama-3.2-1B): 16 layers, 32 query heads, 8 kv heads, head_dim 64. */
#define L1B_LAYERS 16
#define L1B_HEADS  32
#define L1B_KV	   8
#define L1B_HD	   64
#define BLOCK_TOK  64

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define TRY(call)                                                                                  \
	do {                                                                                       \
		int rc_ = (call);                                                                  \
		if (rc_) {                                                                         \
			fprintf(stderr, "kvk-gpu-bench: %s: %s\n", #call, strerror(-rc_));         \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

static void *dalloc(struct kvk_cuda_ctx *c, size_t bytes)
{
	void *p;
	TRY(kvk_cuda_malloc(c, &p, bytes));
	TRY(kvk_cuda_memset(c, p, 0, bytes));
	return p;
}

/* Fills device memory with small finite f16 values (0x3000..0x33ff: 0.125 .. 0.25) through a
 * host buffer, so the math kernels see ordinary numbers. */
static void dfill_f16(struct kvk_cuda_ctx *c, void *d, size_t halves)
{
	size_t chunk = (size_t)1 << 22;
	uint16_t *h = malloc(chunk * 2);
	if (!h)
		exit(1);
	for (size_t i = 0; i < chunk; i++)
		h[i] = (uint16_t)(0x3000 + (i * 2654435761u >> 22) % 0x400);
	for (size_t off = 0; off < halves; off += chunk) {
		size_t n = halves - off < chunk ? halves - off : chunk;
		TRY(kvk_cuda_h2d(c, (uint16_t *)d + off, h, n * 2));
	}
	free(h);
}

struct copy_bw {
	double h2d, d2h; /* GB/s */
};

static struct copy_bw bench_copy(struct kvk_cuda_ctx *c, size_t bytes, int reps)
{
	void *h, *d = dalloc(c, bytes);
	TRY(kvk_cuda_host_alloc(c, &h, bytes));
	memset(h, 1, bytes);
	struct copy_bw r = {0, 0};
	for (int i = 0; i < reps; i++) {
		double t = now();
		TRY(kvk_cuda_h2d(c, d, h, bytes));
		double bw = bytes / (now() - t) / 1e9;
		r.h2d = bw > r.h2d ? bw : r.h2d;
		t = now();
		TRY(kvk_cuda_d2h(c, h, d, bytes));
		bw = bytes / (now() - t) / 1e9;
		r.d2h = bw > r.d2h ? bw : r.d2h;
	}
	kvk_cuda_host_free(c, h);
	kvk_cuda_free(c, d);
	return r;
}

static void bench_pack(struct kvk_cuda_ctx *c, const struct copy_bw *bw, int n_blocks, int reps)
{
	int pool_blocks = n_blocks + 16;
	size_t slab = (size_t)BLOCK_TOK * L1B_KV * L1B_HD;
	uint16_t *k[L1B_LAYERS], *v[L1B_LAYERS];
	for (int l = 0; l < L1B_LAYERS; l++) {
		k[l] = dalloc(c, slab * pool_blocks * 2);
		v[l] = dalloc(c, slab * pool_blocks * 2);
	}
	struct kvk_kv_layers kv = {L1B_LAYERS, pool_blocks, BLOCK_TOK, L1B_KV, L1B_HD, slab, k, v};
	int32_t *blocks = malloc(n_blocks * sizeof(int32_t));
	if (!blocks)
		exit(1);
	for (int i = 0; i < n_blocks; i++) /* scattered, as in a real pool */
		blocks[i] = (int32_t)((i * 7 + 3) % pool_blocks);
	size_t bytes = kvk_kv_payload_bytes(&kv) * n_blocks;
	void *h;
	TRY(kvk_cuda_host_alloc(c, &h, bytes));
	memset(h, 0, bytes);
	double best_p = 0, best_u = 0;
	for (int i = 0; i < reps; i++) {
		double t = now();
		TRY(kvk_cu_kv_pack(c, h, &kv, blocks, n_blocks, NULL, NULL));
		double g = bytes / (now() - t) / 1e9;
		best_p = g > best_p ? g : best_p;
		t = now();
		TRY(kvk_cu_kv_unpack(c, &kv, h, blocks, n_blocks, NULL, NULL));
		g = bytes / (now() - t) / 1e9;
		best_u = g > best_u ? g : best_u;
	}
	printf("kv_payload: %d blocks x %.2f MiB (1B shape, %d tokens/block) = %.0f MiB\n",
	       n_blocks, kvk_kv_payload_bytes(&kv) / 1048576.0, BLOCK_TOK, bytes / 1048576.0);
	printf("kv_pack_GBps: %.2f  ratio_to_d2h: %.3f  (bar >= 0.7)\n", best_p, best_p / bw->d2h);
	printf("kv_unpack_GBps: %.2f  ratio_to_h2d: %.3f  (bar >= 0.7)\n", best_u,
	       best_u / bw->h2d);
	kvk_cuda_host_free(c, h);
	free(blocks);
	for (int l = 0; l < L1B_LAYERS; l++) {
		kvk_cuda_free(c, k[l]);
		kvk_cuda_free(c, v[l]);
	}
}

static void bench_gemm(struct kvk_cuda_ctx *c, int n, double peak, int reps)
{
	size_t e = (size_t)n * n;
	void *a = dalloc(c, e * 2), *b = dalloc(c, e * 2), *d = dalloc(c, e * 4);
	dfill_f16(c, a, e);
	dfill_f16(c, b, e);
	for (int bf = 0; bf < 2; bf++) {
		enum kvk_dtype dt = bf ? KVK_DT_BF16 : KVK_DT_F16;
		TRY(kvk_cu_gemm(c, d, a, b, dt, n, n, n)); /* warm-up: heuristics, clocks */
		TRY(kvk_cuda_sync(c));
		double t = now();
		for (int i = 0; i < reps; i++)
			TRY(kvk_cu_gemm(c, d, a, b, dt, n, n, n));
		TRY(kvk_cuda_sync(c));
		double tf = 2.0 * n * n * (double)n * reps / (now() - t) / 1e12;
		printf("gemm_%s_%d_TFLOPs: %.1f  ratio_to_peak: %.3f  (peak %.0f, bar >= 0.6)\n",
		       bf ? "bf16" : "f16", n, tf, tf / peak, peak);
	}
	kvk_cuda_free(c, a), kvk_cuda_free(c, b), kvk_cuda_free(c, d);
}

static void bench_attention(struct kvk_cuda_ctx *c, int n_q, int n_seqs, int ctx_len, int reps,
			    double peak)
{
	/* Pool big enough for the prefill sequence and every decode sequence. */
	int per_seq = (ctx_len + BLOCK_TOK - 1) / BLOCK_TOK,
	    pre_blocks = (n_q + BLOCK_TOK - 1) / BLOCK_TOK;
	int nb = pre_blocks + n_seqs * per_seq;
	size_t slab = (size_t)BLOCK_TOK * L1B_KV * L1B_HD;
	void *k = dalloc(c, slab * nb * 2), *v = dalloc(c, slab * nb * 2);
	dfill_f16(c, k, slab * nb);
	dfill_f16(c, v, slab * nb);
	struct kvk_kv_pages kv = {k, v, slab, nb, BLOCK_TOK, L1B_KV, L1B_HD};
	int32_t *tab = malloc((size_t)nb * 4);
	int32_t *lens = malloc((size_t)n_seqs * 4);
	if (!tab || !lens)
		exit(1);
	for (int i = 0; i < nb; i++)
		tab[i] = (i * 13 + 5) % nb;
	for (int s = 0; s < n_seqs; s++)
		lens[s] = ctx_len;
	int32_t *dtab = dalloc(c, (size_t)nb * 4), *dlens = dalloc(c, (size_t)n_seqs * 4);
	TRY(kvk_cuda_h2d(c, dtab, tab, (size_t)nb * 4));
	TRY(kvk_cuda_h2d(c, dlens, lens, (size_t)n_seqs * 4));
	size_t qn = (size_t)(n_q > n_seqs ? n_q : n_seqs) * L1B_HEADS * L1B_HD;
	float *q = dalloc(c, qn * 4), *o = dalloc(c, qn * 4);
	float scale = 0.125f;

	/* Prefill: causal, so query i does 4 * hd * (i + 1) FLOP per head. The tensor-core
	 * kernel (what the engine runs on sm_80+) and the FP32 one, same inputs, same run. */
	double flop = 4.0 * L1B_HD * L1B_HEADS * ((double)n_q * (n_q + 1) / 2), tf[2] = {0, 0};
	for (int which = 0; which < 2; which++) {
		int (*fn)(struct kvk_cuda_ctx *, float *, const float *,
			  const struct kvk_kv_pages *, const int32_t *, int, int, int, float) =
		    which ? kvk_cu_attn_prefill_fp32 : kvk_cu_attn_prefill_mma;
		int rc = fn(c, o, q, &kv, dtab, n_q, 0, L1B_HEADS, scale);
		if (rc == -ENOTSUP) {
			printf("attn_prefill_TFLOPs: n/a  (no tensor-core kernel below sm_80)\n");
			continue;
		}
		TRY(rc);
		TRY(kvk_cuda_sync(c));
		double t = now();
		for (int i = 0; i < reps; i++)
			TRY(fn(c, o, q, &kv, dtab, n_q, 0, L1B_HEADS, scale));
		TRY(kvk_cuda_sync(c));
		double dt = (now() - t) / reps;
		tf[which] = flop / dt / 1e12;
		if (which)
			printf("attn_prefill_fp32_TFLOPs: %.2f  (the FP32 CUDA-core kernel, %.2f "
			       "ms)\n",
			       tf[1], dt * 1e3);
		else
			printf("attn_prefill_TFLOPs: %.2f  ratio_to_peak: %.3f  (tensor cores; 1B "
			       "heads "
			       "%d/%d x %d, %d tokens causal, %.2f ms; bar >= 100 TFLOP/s)\n",
			       tf[0], tf[0] / peak, L1B_HEADS, L1B_KV, L1B_HD, n_q, dt * 1e3);
	}
	if (tf[0] > 0 && tf[1] > 0)
		printf("attn_prefill_mma_vs_fp32: %.2f\n", tf[0] / tf[1]);

	/* Decode: memory bound; compare the KV bytes read with a device copy of the same size. */
	int32_t *dtab2 = dtab + pre_blocks;
	TRY(kvk_cu_attn_decode(c, o, q, &kv, dtab2, per_seq, dlens, n_seqs, L1B_HEADS, scale));
	TRY(kvk_cuda_sync(c));
	double t = now();
	for (int i = 0; i < reps; i++)
		TRY(kvk_cu_attn_decode(c, o, q, &kv, dtab2, per_seq, dlens, n_seqs, L1B_HEADS,
				       scale));
	TRY(kvk_cuda_sync(c));
	double dt = (now() - t) / reps;
	double kvbytes = (double)n_seqs * ctx_len * L1B_KV * L1B_HD * 2 * 2;
	printf("attn_decode_GBps: %.1f  (%d seqs x %d ctx, KV read %.0f MiB, %.3f ms/step)\n",
	       kvbytes / dt / 1e9, n_seqs, ctx_len, kvbytes / 1048576, dt * 1e3);
	kvk_cuda_free(c, k), kvk_cuda_free(c, v), kvk_cuda_free(c, dtab);
	kvk_cuda_free(c, dlens), kvk_cuda_free(c, q), kvk_cuda_free(c, o);
	free(tab), free(lens);
}

/* Copies of a weight matrix to rotate through so that a repeated GEMV reads HBM, not the L2
 * cache (50 MiB on an H100 / H200 holds one 8192 x 2048 matrix): 256 MiB in all. */
#define L2_COPIES(wb) ((int)(((size_t)256 << 20) / (wb) + 1))

static void bench_q8(struct kvk_cuda_ctx *c, int rows, int n, int reps, double hbm)
{
	size_t wb = (size_t)rows * (n / KVK_Q8_0_BLOCK) * KVK_Q8_0_BYTES;
	int nc = L2_COPIES(wb);
	uint8_t *w = dalloc(c, wb * nc);
	float *x = dalloc(c, (size_t)n * 4), *y = dalloc(c, (size_t)rows * 4);
	TRY(kvk_cu_q8_0_gemv(c, y, w, x, rows, n, 1));
	TRY(kvk_cuda_sync(c));
	double t = now();
	for (int i = 0; i < reps; i++)
		TRY(kvk_cu_q8_0_gemv(c, y, w + wb * (i % nc), x, rows, n, 1));
	TRY(kvk_cuda_sync(c));
	double dt = (now() - t) / reps;
	printf("q8_0_gemv_GBps: %.1f  ratio_to_hbm: %.3f  (%d x %d weights, 1 token, %.1f us; HBM "
	       "%.0f GB/s, bar >= 0.5)\n",
	       wb / dt / 1e9, wb / dt / 1e9 / hbm, rows, n, dt * 1e6, hbm);
	kvk_cuda_free(c, w), kvk_cuda_free(c, x), kvk_cuda_free(c, y);
}

/* Q4_K weights (144 bytes per 256 values; zeros are valid blocks: d = dmin = 0): the decode
 * GEMV (1 token) against HBM bandwidth, then prefill of ntok tokens, dequant-GEMM on tensor
 * cores against the GEMV path (weights streamed once per 8 tokens) in the same run. */
static void bench_kq(struct kvk_cuda_ctx *c, int rows, int n, int ntok, int reps, double peak,
		     double hbm)
{
	size_t wb = (size_t)rows * (n / 256) * 144;
	int nc = L2_COPIES(wb);
	uint8_t *w = dalloc(c, wb * nc);
	float *x = dalloc(c, (size_t)ntok * n * 4), *y = dalloc(c, (size_t)ntok * rows * 4);
	TRY(kvk_cu_kq_gemv_fp32(c, y, w, KVK_DT_Q4_K, x, rows, n, 1));
	TRY(kvk_cuda_sync(c));
	double t = now();
	for (int i = 0; i < 10 * reps; i++)
		TRY(kvk_cu_kq_gemv_fp32(c, y, w + wb * (i % nc), KVK_DT_Q4_K, x, rows, n, 1));
	TRY(kvk_cuda_sync(c));
	double dt = (now() - t) / (10 * reps);
	printf("q4_k_gemv_GBps: %.1f  ratio_to_hbm: %.3f  (%d x %d weights, 1 token, %.1f us)\n",
	       wb / dt / 1e9, wb / dt / 1e9 / hbm, rows, n, dt * 1e6);
	double flop = 2.0 * rows * n * ntok, tf[2] = {0, 0};
	for (int which = 0; which < 2; which++) {
		int (*fn)(struct kvk_cuda_ctx *, float *, const void *, enum kvk_dtype,
			  const float *, int, int, int) =
		    which ? kvk_cu_kq_gemv_fp32 : kvk_cu_kq_gemm;
		int rc = fn(c, y, w, KVK_DT_Q4_K, x, rows, n, ntok);
		if (rc == -ENOTSUP) {
			printf("q4_k_gemm_TFLOPs: n/a  (no tensor-core kernel below sm_80)\n");
			continue;
		}
		TRY(rc);
		TRY(kvk_cuda_sync(c));
		t = now();
		for (int i = 0; i < reps; i++)
			TRY(fn(c, y, w, KVK_DT_Q4_K, x, rows, n, ntok));
		TRY(kvk_cuda_sync(c));
		dt = (now() - t) / reps;
		tf[which] = flop / dt / 1e12;
		if (which)
			printf("q4_k_prefill_gemv_TFLOPs: %.2f  (the GEMV path, %.2f ms)\n", tf[1],
			       dt * 1e3);
		else
			printf("q4_k_gemm_TFLOPs: %.2f  ratio_to_peak: %.3f  (%d x %d weights, %d "
			       "tokens, %.2f ms)\n",
			       tf[0], tf[0] / peak, rows, n, ntok, dt * 1e3);
	}
	if (tf[0] > 0 && tf[1] > 0)
		printf("q4_k_gemm_vs_gemv: %.2f\n", tf[0] / tf[1]);
	kvk_cuda_free(c, w), kvk_cuda_free(c, x), kvk_cuda_free(c, y);
}

/* Device-to-device copy bandwidth: the ceiling for the memory-bound kernels. */
static void bench_d2d(struct kvk_cuda_ctx *c, size_t bytes, int reps)
{
	void *a = dalloc(c, bytes), *b = dalloc(c, bytes);
	/* gather of 1 "layer" with one huge block = a plain device copy through our kernel. */
	TRY(kvk_cuda_sync(c));
	uint16_t *ks[1] = {a}, *vs[1] = {a};
	size_t slab = bytes / 4; /* halves: K + V slabs make the payload `bytes` */
	struct kvk_kv_layers kv = {1,	 1,  1, 1, (int)(slab > 0x7fffffff ? 0x7fffffff : slab),
				   slab, ks, vs};
	int32_t blk = 0;
	TRY(kvk_cu_kv_gather(c, b, &kv, &blk, 1));
	TRY(kvk_cuda_sync(c));
	double t = now();
	for (int i = 0; i < reps; i++)
		TRY(kvk_cu_kv_gather(c, b, &kv, &blk, 1));
	TRY(kvk_cuda_sync(c));
	double dt = (now() - t) / reps;
	/* Read + write of the payload. */
	printf("device_gather_GBps: %.0f  (read+write, %.0f MiB payload)\n", 2.0 * bytes / dt / 1e9,
	       bytes / 1048576.0);
	kvk_cuda_free(c, a), kvk_cuda_free(c, b);
}

int main(int argc, char **argv)
{
	double peak = 989.0; /* H200 SXM dense FP16/BF16 tensor TFLOP/s */
	double hbm = 4800.0; /* H200 HBM3e GB/s */
	int quick = 0;
	/* gpu-check.sh sends stdout to a file: each figure must be there even if a timeout kills
	 * the program later. */
	setvbuf(stdout, NULL, _IOLBF, 0);
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--peak") && i + 1 < argc)
			peak = atof(argv[++i]);
		else if (!strcmp(argv[i], "--hbm") && i + 1 < argc)
			hbm = atof(argv[++i]);
		else if (!strcmp(argv[i], "--quick"))
			quick = 1;
		else {
			fprintf(stderr,
				"usage: kvk-gpu-bench [--peak TFLOPS] [--hbm GBPS] [--quick]\n");
			return 2;
		}
	}
	if (kvk_cuda_device_count() < 1) {
		printf("skipped: no GPU (or no CUDA in this build)\n");
		return 77;
	}
	struct kvk_cuda_ctx *c;
	TRY(kvk_cuda_ctx_create(0, &c));
	char info[256];
	TRY(kvk_cuda_device_info(c, info, sizeof(info)));
	printf("device: %s\n", info);
	struct copy_bw bw = bench_copy(c, (size_t)256 << 20, quick ? 2 : 5);
	printf("copy_h2d_pinned_GBps: %.2f\ncopy_d2h_pinned_GBps: %.2f\n", bw.h2d, bw.d2h);
	/* cuBLAS first, the pack pipeline (512 MiB pinned, the newest code) last: an error ends
	 * the program, and the figures printed before it still reach the report. */
	bench_gemm(c, quick ? 4096 : 8192, peak, quick ? 3 : 20);
	bench_attention(c, quick ? 1024 : 4096, 64, quick ? 1024 : 4096, quick ? 2 : 5, peak);
	/* 1B decode's FFN matrix, 8192 x 2048 */
	bench_q8(c, 8192, 2048, quick ? 10 : 100, hbm);
	bench_kq(c, 8192, 2048, 512, quick ? 3 : 20, peak, hbm);
	bench_d2d(c, (size_t)512 << 20, quick ? 2 : 10);
	bench_pack(c, &bw, quick ? 64 : 256, quick ? 2 : 4);
	printf("engine on GPU: see kvinfer bench --device cuda (tools/gpu-check.sh runs it)\n");
	kvk_cuda_ctx_destroy(c);
	return 0;
}
