/* kvk_cuda — the CUDA versions of the kvk_ops.h references, on device memory.
 *
 * Every kernel entry point kvk_cu_<op>(ctx, ...) takes the same arguments as kvk_ref_<op>
 * (kvk_rmsnorm_f32 for kvk_cu_rmsnorm), with device pointers for every array (except where a
 * comment says host), and a context first. It only enqueues work on the context's stream and
 * returns: the result is ready after kvk_cuda_sync() or after a later synchronous call on the
 * same context (copies to the host are synchronous). Return values: 0; -EINVAL for bad sizes
 * (checked on the host before anything is enqueued); -ENODEV when this build has no CUDA or
 * the machine has no GPU; -EIO on a CUDA / cuBLAS error (logged); -ENOMEM when device or
 * pinned memory runs out.
 *
 * Context: struct kvk_cuda_ctx is opaque (so C callers need no CUDA headers). It owns one
 * device, a compute stream, a copy stream, a cuBLAS handle with its workspace, and the
 * staging buffers and events of pack/unpack. Thread-safety: one thread uses a context at a
 * time; several contexts (one per thread or per device) are independent.
 *
 * Kernels in this build: FP32 CUDA-core code (no tensor cores) except the GEMM, which is
 * cuBLAS on tensor cores. docs/cuda.md lists the kernels, layouts and test tolerances.
 */
#ifndef KVFS_KVK_CUDA_H
#define KVFS_KVK_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "kvk_ops.h"

struct kvk_cuda_ctx;

/* Creates a context on GPU `device` (0-based). -ENODEV when there is no such GPU. */
int kvk_cuda_ctx_create(int device, struct kvk_cuda_ctx **out);
/* Waits for the context's work, then frees it. NULL is a no-op. */
void kvk_cuda_ctx_destroy(struct kvk_cuda_ctx *ctx);
/* Waits for everything enqueued on the context. 0, or -EIO for an error of earlier work. */
int kvk_cuda_sync(struct kvk_cuda_ctx *ctx);
/* Number of GPUs (0 without CUDA). */
int kvk_cuda_device_count(void);
/* The device's name, SM count and memory into buf (a line of text). Returns 0 or -ENODEV. */
int kvk_cuda_device_info(struct kvk_cuda_ctx *ctx, char *buf, size_t len);

/* ---- memory (helpers so C code needs no CUDA headers) -------------------------------------- */

/* Device memory of `bytes` on the context's device; free with kvk_cuda_free. */
int kvk_cuda_malloc(struct kvk_cuda_ctx *ctx, void **out, size_t bytes);
void kvk_cuda_free(struct kvk_cuda_ctx *ctx, void *p);
/* Pinned (page-locked) host memory: what pack/unpack and fast copies need. */
int kvk_cuda_host_alloc(struct kvk_cuda_ctx *ctx, void **out, size_t bytes);
void kvk_cuda_host_free(struct kvk_cuda_ctx *ctx, void *p);
/* Synchronous copies on the context's stream (they wait for earlier work). */
int kvk_cuda_h2d(struct kvk_cuda_ctx *ctx, void *dst_dev, const void *src, size_t bytes);
int kvk_cuda_d2h(struct kvk_cuda_ctx *ctx, void *dst, const void *src_dev, size_t bytes);
int kvk_cuda_memset(struct kvk_cuda_ctx *ctx, void *dst_dev, int byte, size_t bytes);
/* Device-to-device copy, enqueued on the compute stream (kvk_fwd.cu). */
int kvk_cuda_d2d(struct kvk_cuda_ctx *ctx, void *dst_dev, const void *src_dev, size_t bytes);

/* ---- kernels (see kvk_ops.h for the meaning of every argument) ---------------------------- */

int kvk_cu_embed(struct kvk_cuda_ctx *ctx, float *out, const void *table, enum kvk_dtype dt,
		 size_t n_rows, size_t dim, const int32_t *ids, size_t n_tok);
/* kvk_rmsnorm_f32 (kvk.h) on device memory. */
int kvk_cu_rmsnorm(struct kvk_cuda_ctx *ctx, float *out, const float *x, const float *w, size_t n,
		   size_t nrows, float eps);
int kvk_cu_rope(struct kvk_cuda_ctx *ctx, float *x, size_t n_tok, size_t n_heads, size_t head_dim,
		size_t rope_dim, const int32_t *pos, float base, int style);
int kvk_cu_swiglu(struct kvk_cuda_ctx *ctx, float *out, const float *gate, const float *up,
		  size_t n);

/* Flash-style: tiles of 32 keys through shared memory, online softmax, 16 query rows (query,
 * head of one GQA group) per thread block. kv->k / kv->v are device pointers. Beyond the
 * reference's checks (-EINVAL otherwise): kv->k and kv->v 4-byte aligned, block_stride even,
 * n_kv_heads <= 65535 (keys are read as f16 pairs; kv heads are grid.y). */
int kvk_cu_attn_prefill(struct kvk_cuda_ctx *ctx, float *out, const float *q,
			const struct kvk_kv_pages *kv, const int32_t *table, int n_q, int q_start,
			int n_heads, float scale);
/* The two kernels kvk_cu_attn_prefill chooses from, for tests and benchmarks: on tensor cores
 * (flash-style, nvcuda::wmma: Q rounded to f16 once, P as f16, f32 accumulate and softmax; 64
 * rows per block) and on FP32 CUDA cores (the kernel above). kvk_cu_attn_prefill takes the
 * first where it runs: compute capability >= 8.0 (the emulation reports 9.0) and head_dim a
 * multiple of 16; _mma returns -ENOTSUP elsewhere. Within 5e-4 of the f32 reference for
 * values of magnitude <= 1 (tests/test_kernels_cuda.c, test_attn_prefill_mma). */
int kvk_cu_attn_prefill_mma(struct kvk_cuda_ctx *ctx, float *out, const float *q,
			    const struct kvk_kv_pages *kv, const int32_t *table, int n_q,
			    int q_start, int n_heads, float scale);
int kvk_cu_attn_prefill_fp32(struct kvk_cuda_ctx *ctx, float *out, const float *q,
			     const struct kvk_kv_pages *kv, const int32_t *table, int n_q,
			     int q_start, int n_heads, float scale);
/* All sequences in one launch: one thread block per (sequence, kv head) covers the heads of
 * that GQA group. */
int kvk_cu_attn_decode(struct kvk_cuda_ctx *ctx, float *out, const float *q,
		       const struct kvk_kv_pages *kv, const int32_t *tables, int max_blocks,
		       const int32_t *seq_lens, int n_seqs, int n_heads, float scale);

/* cuBLAS GemmEx, f16/bf16 inputs, f32 accumulate and output, tensor cores; f32 inputs run
 * in full f32 (CUBLAS_COMPUTE_32F, no TF32). */
int kvk_cu_gemm(struct kvk_cuda_ctx *ctx, float *c, const void *a, const void *b, enum kvk_dtype dt,
		int m, int n, int k);
/* Q8_0 weights dequantized on the fly: one warp per output row, n_tok <= 8 per pass. Beyond
 * the reference's checks (-EINVAL otherwise): x 16-byte aligned (float4 loads), w 2-byte
 * aligned; memory from kvk_cuda_malloc (256-byte aligned) qualifies. */
int kvk_cu_q8_0_gemv(struct kvk_cuda_ctx *ctx, float *y, const void *w, const float *x, int rows,
		     int n, int n_tok);
/* Q4_0 / Q4_K / Q5_K / Q6_K weights (dt) dequantized on the fly (kvk_kq.cu), the same
 * alignment rules as kvk_cu_q8_0_gemv; reference kvk_ref_kq_gemv. Products of f16 inputs
 * (weights and activations each rounded to f16) summed in f32, in every path, so the result
 * does not depend on the path taken (the device engine's batch invariance). From 16 tokens on,
 * where tensor cores run (compute capability >= 8.0), it is kvk_cu_kq_gemm; else the GEMV
 * (kvk_cu_kq_gemv_fp32: one warp per row, weights streamed once per 8 tokens). */
int kvk_cu_kq_gemv(struct kvk_cuda_ctx *ctx, float *y, const void *w, enum kvk_dtype dt,
		   const float *x, int rows, int n, int n_tok);
/* Dequant-GEMM on tensor cores: 64 tokens x 64 rows per block, weights dequantized to f16 in
 * shared memory once per 64 tokens, activations rounded to f16, f32 accumulate; -ENOTSUP
 * below compute capability 8.0. Within 2e-3 * sqrt(n) * max|w| * max|x| of the reference
 * (test_kq_gemm). */
int kvk_cu_kq_gemm(struct kvk_cuda_ctx *ctx, float *y, const void *w, enum kvk_dtype dt,
		   const float *x, int rows, int n, int n_tok);
int kvk_cu_kq_gemv_fp32(struct kvk_cuda_ctx *ctx, float *y, const void *w, enum kvk_dtype dt,
			const float *x, int rows, int n, int n_tok);
/* f32 -> f16 / bf16 (activations into GEMM inputs), n elements. */
int kvk_cu_convert(struct kvk_cuda_ctx *ctx, void *dst, enum kvk_dtype dt, const float *src,
		   size_t n);

/* The vision tower's ops (engine/vit.h): LayerNorm with an optional bias (b NULL: none) and
 * GELU (quick or tanh), kvk_elem.cu; attention without a mask over dense f32 Q/K/V
 * (kvk_attn.cu: the paged kernel's online softmax, 16 query rows of one head per block, keys
 * in tiles of 32 through shared memory as f32). */
int kvk_cu_layernorm(struct kvk_cuda_ctx *ctx, float *out, const float *x, const float *w,
		     const float *b, size_t n, size_t nrows, float eps);
int kvk_cu_gelu(struct kvk_cuda_ctx *ctx, float *y, const float *x, size_t n, int quick);
int kvk_cu_attn_dense(struct kvk_cuda_ctx *ctx, float *out, const float *q, const float *k,
		      const float *v, int n_tok, int n_heads, int head_dim, float scale);

/* Forward-pass glue (kvk_fwd.cu): residual add, bias add, K/V rows into the paged pool. For
 * kv_store, kv->k[l] / kv->v[l] are device pointers in a host array; slots is device memory. */
int kvk_cu_add(struct kvk_cuda_ctx *ctx, float *y, const float *x, size_t n);
int kvk_cu_add_bias(struct kvk_cuda_ctx *ctx, float *y, const float *b, size_t n, size_t nrows);
int kvk_cu_kv_store(struct kvk_cuda_ctx *ctx, const struct kvk_kv_layers *kv, int layer,
		    const float *k, const float *v, const int32_t *slots, int n_tok);

int kvk_cu_argmax(struct kvk_cuda_ctx *ctx, int32_t *out, const float *logits, int n_rows,
		  int vocab);
int kvk_cu_sample_topk(struct kvk_cuda_ctx *ctx, int32_t *out, const float *logits, int n_rows,
		       int vocab, int k, float temperature, const float *u);

/* ---- KV pack / unpack between paged device KV and the block-file payload ------------------
 *
 * kv->k[l] / kv->v[l] are device pointers; blocks is a HOST array of block ids (checked
 * against kv->num_blocks). The host buffer should be pinned (kvk_cuda_host_alloc); pageable
 * memory works but is not overlapped.
 *
 * Pipeline: the payload moves in chunks of whole blocks (about 4 MiB). A gather kernel on the
 * compute stream packs chunk i into device staging buffer i % 2 while the copy stream moves
 * chunk i - 1 across PCIe; events order the two streams and keep a staging buffer from being
 * overwritten before its copy has finished (double buffering).
 *
 * The chunk callback, when not NULL, overlaps the caller's file I/O with the transfer:
 * pack calls it as soon as chunk [first, first + count) of the host buffer is complete (while
 * later chunks are still moving); unpack calls it before it copies a chunk, so the caller
 * fills (reads from the file) that part of the host buffer while the GPU works on the previous
 * one. A non-zero return from the callback stops the transfer and is returned. Both calls
 * return when all work is done (the device pages are written / the host buffer is full). */
typedef int (*kvk_chunk_fn)(void *arg, int first_block, int n_blocks);

int kvk_cu_kv_pack(struct kvk_cuda_ctx *ctx, void *dst_host, const struct kvk_kv_layers *kv,
		   const int32_t *blocks, int n_blocks, kvk_chunk_fn cb, void *arg);
int kvk_cu_kv_unpack(struct kvk_cuda_ctx *ctx, const struct kvk_kv_layers *kv, const void *src_host,
		     const int32_t *blocks, int n_blocks, kvk_chunk_fn cb, void *arg);

/* Device-to-device forms (no host buffer): the payload of n_blocks blocks to / from dst_dev /
 * src_dev, enqueued on the compute stream. Used by the NCCL transfer. */
int kvk_cu_kv_gather(struct kvk_cuda_ctx *ctx, void *dst_dev, const struct kvk_kv_layers *kv,
		     const int32_t *blocks, int n_blocks);
int kvk_cu_kv_scatter(struct kvk_cuda_ctx *ctx, const struct kvk_kv_layers *kv, const void *src_dev,
		      const int32_t *blocks, int n_blocks);

/* The compute stream as a cudaStream_t (returned as void * so this header needs no CUDA
 * types); NULL without CUDA. For modules such as kvk_nccl that enqueue on the same stream. */
void *kvk_cuda_stream(struct kvk_cuda_ctx *ctx);
/* The context's device index. */
int kvk_cuda_device(struct kvk_cuda_ctx *ctx);

#endif
