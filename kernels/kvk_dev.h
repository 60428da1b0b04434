/* kvk_dev — one table of device operations with two backends, so code written once against it
 * (the device engine, engine/fwd_dev.h) runs on a GPU or, unchanged, on the CPU:
 *
 *   "cuda"  the kvk_cu_* kernels of kvk_cuda.h on one GPU (cudaMalloc'd memory);
 *   "host"  the kvk_ref_* references of kvk_ops.h on malloc'd memory: the same calls, the same
 *           buffers and the same order of operations, so every line of the caller's
 *           orchestration (uploads, tables, slots, pack/unpack, copy on write) runs and is
 *           tested on a machine without a GPU. It is slow (plain C, one thread): for tests.
 *
 * Every kernel op takes the arguments of its reference in kvk_ops.h (rmsnorm: kvk_rmsnorm_f32)
 * with "device" pointers, i.e. memory from op->alloc of the same backend (offsets into it are
 * fine), except where kvk_cuda.h says host (the kvk_kv_pages / kvk_kv_layers structs and their
 * pointer arrays, the block lists of kv_pack / kv_unpack, their host buffers). Ops may only
 * enqueue: results are certain after op->sync or after a synchronous d2h. Returns: 0, -EINVAL
 * (bad sizes), -ENOMEM, -EIO (a CUDA error, logged), -ENODEV (cuda backend without a GPU or
 * without CUDA in the build: only kvk_dev_open reports it in practice).
 *
 * Usage:  struct kvk_dev d;  kvk_dev_open(&d, KVK_DEV_HOST, 0);  d.op->gemm(&d, ...);
 *         kvk_dev_close(&d);
 * Thread-safety: one thread at a time per kvk_dev (a CUDA context has one compute stream).
 */
#ifndef KVFS_KVK_DEV_H
#define KVFS_KVK_DEV_H

#include <stddef.h>
#include <stdint.h>

#include "kvk_cuda.h"
#include "kvk_ops.h"

enum kvk_dev_kind {
	KVK_DEV_HOST = 1,
	KVK_DEV_CUDA = 2,
};

struct kvk_dev;

struct kvk_dev_ops {
	const char *name; /* "host", "cuda" */
	/* memory: alloc gives uninitialised memory (host: every byte 0xff, NaN as f32/f16, so a
	 * read of memory never written shows in tests), 256-byte aligned */
	int (*alloc)(struct kvk_dev *d, void **out, size_t bytes);
	void (*free)(struct kvk_dev *d, void *p);
	int (*h2d)(struct kvk_dev *d, void *dst, const void *src_host, size_t bytes); /* sync */
	int (*d2h)(struct kvk_dev *d, void *dst_host, const void *src, size_t bytes); /* sync */
	int (*d2d)(struct kvk_dev *d, void *dst, const void *src, size_t bytes);
	int (*memset)(struct kvk_dev *d, void *dst, int byte, size_t bytes);
	int (*sync)(struct kvk_dev *d);
	/* kernels: see kvk_ops.h */
	int (*embed)(struct kvk_dev *d, float *out, const void *table, enum kvk_dtype dt,
		     size_t n_rows, size_t dim, const int32_t *ids, size_t n_tok);
	int (*rmsnorm)(struct kvk_dev *d, float *out, const float *x, const float *w, size_t n,
		       size_t nrows, float eps);
	int (*rope)(struct kvk_dev *d, float *x, size_t n_tok, size_t n_heads, size_t head_dim,
		    size_t rope_dim, const int32_t *pos, float base, int style);
	int (*swiglu)(struct kvk_dev *d, float *out, const float *gate, const float *up, size_t n);
	int (*add)(struct kvk_dev *d, float *y, const float *x, size_t n);
	int (*add_bias)(struct kvk_dev *d, float *y, const float *b, size_t n, size_t nrows);
	int (*convert)(struct kvk_dev *d, void *dst, enum kvk_dtype dt, const float *src, size_t n);
	int (*gemm)(struct kvk_dev *d, float *c, const void *a, const void *b, enum kvk_dtype dt,
		    int m, int n, int k);
	int (*q8_0_gemv)(struct kvk_dev *d, float *y, const void *w, const float *x, int rows,
			 int n, int n_tok);
	int (*kq_gemv)(struct kvk_dev *d, float *y, const void *w, enum kvk_dtype dt,
		       const float *x, int rows, int n, int n_tok);
	int (*attn_prefill)(struct kvk_dev *d, float *out, const float *q,
			    const struct kvk_kv_pages *kv, const int32_t *table, int n_q,
			    int q_start, int n_heads, float scale);
	int (*attn_decode)(struct kvk_dev *d, float *out, const float *q,
			   const struct kvk_kv_pages *kv, const int32_t *tables, int max_blocks,
			   const int32_t *seq_lens, int n_seqs, int n_heads, float scale);
	int (*kv_store)(struct kvk_dev *d, const struct kvk_kv_layers *kv, int layer,
			const float *k, const float *v, const int32_t *slots, int n_tok);
	int (*argmax)(struct kvk_dev *d, int32_t *out, const float *logits, int n_rows, int vocab);
	/* the vision tower (engine/vit.h): kvk_ref_layernorm, kvk_ref_gelu, kvk_ref_attn_dense */
	int (*layernorm)(struct kvk_dev *d, float *out, const float *x, const float *w,
			 const float *b, size_t n, size_t nrows, float eps);
	int (*gelu)(struct kvk_dev *d, float *y, const float *x, size_t n, int quick);
	int (*attn_dense)(struct kvk_dev *d, float *out, const float *q, const float *k,
			  const float *v, int n_tok, int n_heads, int head_dim, float scale);
	/* host buffer <-> paged device KV, block-file payload layout; synchronous */
	int (*kv_pack)(struct kvk_dev *d, void *dst_host, const struct kvk_kv_layers *kv,
		       const int32_t *blocks, int n_blocks);
	int (*kv_unpack)(struct kvk_dev *d, const struct kvk_kv_layers *kv, const void *src_host,
			 const int32_t *blocks, int n_blocks);
};

/* The caller owns this struct (it may live on the stack or inside another struct). */
struct kvk_dev {
	const struct kvk_dev_ops *op;
	struct kvk_cuda_ctx *cu; /* cuda backend: its context; NULL for host */
	int kind;		 /* enum kvk_dev_kind */
};

/* Opens a backend (device: the GPU index for cuda, ignored for host). Returns 0, -EINVAL (bad
 * kind), -ENODEV (cuda: no GPU or no CUDA in this build), -ENOMEM, -EIO. */
int kvk_dev_open(struct kvk_dev *d, enum kvk_dev_kind kind, int device);
/* Waits for the backend's work and releases it. Safe on a zeroed or closed struct. */
void kvk_dev_close(struct kvk_dev *d);

/* "host" / "cuda" -> kind; -EINVAL otherwise. */
int kvk_dev_parse(const char *name);

/* Device buffers owned together and freed together (an engine's weights and scratch). */
struct kvk_dev_arena {
	struct kvk_dev *d; /* set before the first allocation */
	void **p;
	int n, cap;
	size_t bytes; /* the sum of the sizes asked for */
};
/* Allocates bytes (at least 4) on a->d and keeps it in the arena; NULL with *rc set (-ENOMEM,
 * the backend's error). Returns NULL at once when *rc is already non-zero, so a run of calls
 * checks once at its end. */
void *kvk_arena_alloc(struct kvk_dev_arena *a, size_t bytes, int *rc);
/* kvk_arena_alloc, then src copied there; NULL with *rc set. */
const void *kvk_arena_upload(struct kvk_dev_arena *a, const void *src, size_t bytes, int *rc);
/* Waits for the device's work, frees every buffer and the list; call before kvk_dev_close.
 * Safe on a zeroed arena. */
void kvk_arena_free(struct kvk_dev_arena *a);

/* The two tables (kvk_dev_host.c, kvk_dev_cuda.c). */
extern const struct kvk_dev_ops kvk_dev_host_ops;
extern const struct kvk_dev_ops kvk_dev_cuda_ops;

#endif
