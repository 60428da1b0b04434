/* fwd_dev — the forward pass on a device: the same model, API shape and KV semantics as the
 * CPU engine (fwd.h), with weights, activations and paged KV in device memory and every step
 * a kernel of the kvk_dev backend layer (kernels/kvk_dev.h):
 *
 *   backend "cuda"  the CUDA kernels (cuBLAS GEMM for F16/BF16/F32, Q8_0 GEMV) on one GPU;
 *   backend "host"  the same code over the CPU references: slow, for tests and for checking the
 *                   orchestration on a machine without a GPU.
 *
 * Per pass (a prefill chunk of one sequence, or one token of each of several sequences):
 * embed -> per layer: RMSNorm, Q/K/V (activations converted to the weight type for F16/BF16
 * GEMM; F32 GEMM; Q8_0 GEMV on f32 activations), bias, RoPE, K/V rows stored as f16 into the
 * sequence's blocks, paged attention (prefill kernel for a chunk, decode kernel for a batch),
 * output projection + residual, RMSNorm, gate/up, SwiGLU, down + residual -> final RMSNorm and
 * logits of the rows asked for, copied to the host.
 *
 * Numbers: not bit-identical to the CPU engine (other summation orders, f16/bf16 GEMM inputs,
 * f32 instead of 8-bit activations against Q8_0). tests/test_fwd_dev.c states the tolerances.
 * The device engine is deterministic for one backend and shape of work, and its logits do not
 * depend on whether a prefix was computed or loaded from blocks (the KV bytes are the same).
 *
 * KV memory: block ids, refcounts, sequences, forks and copy on write are the kvi_kv of kv.h,
 * so sequences look exactly as on the CPU. The block contents live in device memory, in the
 * same layout as kv.h's blocks ([layer][K,V][token][kv_head][head_dim] f16, so a block is its
 * block-file payload); the kvi_kv's own block memory is the host mirror that
 * kvi_kv_block_export/import and the KV connector (kvx_create_kv) use. Coherence (kv.h hooks):
 *  - before a pass, every block of the pass's sequences whose generation the engine has not
 *    seen (allocated and filled outside the engine: kvx loads, kvi_kv_block_import) is uploaded
 *    with the backend's kv_unpack;
 *  - a copy on write done by kvi_seq_reserve is repeated on the device (d2d);
 *  - kvi_kv_host_sync (called by kvi_kv_block_export and kvx_save) downloads, with kv_pack,
 *    the blocks whose device copy is newer than the mirror.
 *
 * Thread-safety: one caller thread at a time per engine. Several engines may share a model.
 */
#ifndef KVFS_KVI_FWD_DEV_H
#define KVFS_KVI_FWD_DEV_H

#include <stddef.h>
#include <stdint.h>

#include "fwd.h"
#include "kv.h"
#include "model.h"

struct kvi_dev_engine;

/* Like kvi_engine_create (o: threads and isa are ignored); backend is enum kvk_dev_kind
 * (KVK_DEV_HOST or KVK_DEV_CUDA), device the GPU index. Uploads every weight once (norms and
 * biases converted to f32). Needs head_dim even and <= 256 (the attention kernels). Returns 0,
 * -EINVAL (model or options; logged), -ENODEV (cuda: no GPU, or no CUDA in this build),
 * -ENOMEM (host or device memory), -EIO (a CUDA error, logged). */
int kvi_dev_engine_create(const struct kvi_model *m, const struct kvi_engine_opts *o, int backend,
			  int device, struct kvi_dev_engine **out);
/* All sequences on the engine's kv (and any kvx on it) must be gone first. NULL is a no-op. */
void kvi_dev_engine_destroy(struct kvi_dev_engine *e);

struct kvi_kv *kvi_dev_engine_kv(struct kvi_dev_engine *e);
const struct kvi_config *kvi_dev_engine_config(const struct kvi_dev_engine *e);
const struct kvi_engine_opts *kvi_dev_engine_opts(const struct kvi_dev_engine *e);
/* "host" or "cuda". */
const char *kvi_dev_engine_backend(const struct kvi_dev_engine *e);
/* Bytes of device memory the engine holds (weights + KV + activations). */
size_t kvi_dev_engine_device_bytes(const struct kvi_dev_engine *e);

/* Same contract as kvi_engine_prefill / kvi_engine_decode (fwd.h), plus -EIO for a device
 * error (logged). After -EIO the engine refuses further work with -EIO. */
int kvi_dev_engine_prefill(struct kvi_dev_engine *e, struct kvi_seq *seq, const int32_t *tokens,
			   int n, float *logits_last);
/* kvi_engine_prefill_inject's contract (fwd.h): the rows are uploaded over the token
 * embeddings of their positions, pass by pass. */
int kvi_dev_engine_prefill_inject(struct kvi_dev_engine *e, struct kvi_seq *seq,
				  const int32_t *tokens, int n, const struct kvi_inject *inject,
				  int ninject, float *logits_last);
int kvi_dev_engine_decode(struct kvi_dev_engine *e, struct kvi_seq *const *seqs,
			  const int32_t *tokens, int nseq, float *logits);

/* ---- NCCL: direct KV transfer between the engines of two processes (kernels/kvk_nccl.h) ----
 * Only the cuda backend with NCCL built; -ENODEV otherwise (host backend, no NCCL). */
struct kvk_nccl;
/* Joins communicator id (KVK_NCCL_ID_BYTES bytes, 2 ranks) as rank on the engine's GPU; blocks
 * until the other rank joined. Destroy with kvk_nccl_comm_destroy before the engine. */
int kvi_dev_engine_nccl_join(struct kvi_dev_engine *e, const uint8_t *id, int rank,
			     struct kvk_nccl **out);
/* Sends blocks ids[0..n) (first uploading any the device has not seen) to rank peer; the
 * receiver calls kvi_dev_engine_nccl_recv with the same n. Returns when the transfer is done:
 * 0, -EINVAL, -ENODEV, -EIO (engine broken afterwards only for a CUDA error). */
int kvi_dev_engine_nccl_send(struct kvi_dev_engine *e, struct kvk_nccl *c, const int32_t *ids,
			     int n, int peer);
/* Receives n blocks from rank peer into ids[0..n) (allocated blocks of this engine's kv); the
 * device copy is then the newer one (host_sync downloads it for export / kvx_save). */
int kvi_dev_engine_nccl_recv(struct kvi_dev_engine *e, struct kvk_nccl *c, const int32_t *ids,
			     int n, int peer);

#endif
