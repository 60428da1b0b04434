/* kvk_nccl — direct GPU-to-GPU transfer of a sequence's KV blocks from a prefill engine to a
 * decode engine with NCCL send/recv, beside the filesystem path (issue 9, part 4).
 *
 * Setup: the decode side creates the communicator id (kvk_nccl_id_create) and hands its
 * KVK_NCCL_ID_BYTES bytes to the prefill side by any channel it already has (a file on the
 * shared mount, the gateway's request); then both call kvk_nccl_comm_create with the same id,
 * nranks 2 and their own rank (decode 0, prefill 1). The call blocks until every rank joined.
 *
 * Transfer: the sender gathers the blocks into the block-file payload layout (kvk_ops.h) in the
 * context's device staging buffers and sends them in chunks; the receiver receives into its
 * staging buffers and scatters into its own block ids. Both sides must pass the same geometry
 * (n_layer, block_tokens, n_kv_heads, head_dim) and the same n_blocks; block ids are local to
 * each side (host arrays). Both calls return when the transfer is complete. Only one transfer
 * at a time per communicator; the context must not be used by another thread meanwhile.
 *
 * Errors: 0; -EINVAL for bad arguments; -ENODEV when the build has no NCCL (or no CUDA) or no
 * GPU; -EIO for an NCCL or CUDA error (logged).
 */
#ifndef KVFS_KVK_NCCL_H
#define KVFS_KVK_NCCL_H

#include <stdint.h>

#include "kvk_cuda.h"

#define KVK_NCCL_ID_BYTES 128

struct kvk_nccl;

/* 1 if this build links NCCL, else 0. */
int kvk_nccl_available(void);
/* A fresh communicator id (decode side). */
int kvk_nccl_id_create(uint8_t id[KVK_NCCL_ID_BYTES]);
/* Joins communicator `id` as `rank` of `nranks` on ctx's device. ctx outlives the result. */
int kvk_nccl_comm_create(struct kvk_nccl **out, struct kvk_cuda_ctx *ctx,
			 const uint8_t id[KVK_NCCL_ID_BYTES], int nranks, int rank);
/* NULL is a no-op. */
void kvk_nccl_comm_destroy(struct kvk_nccl *c);
/* Ends c for good, from any thread: a send or receive waiting on it (another thread, e.g. for a
 * peer that will never post its side) returns -EIO, also when part of it had arrived (its
 * blocks hold no defined data), and every later one at once. c must still be destroyed. NCCL
 * has no timeouts of its own: this is how a watchdog unblocks a transfer. It waits (at most
 * 2 s) for a transfer that is posting its next chunk at that moment, so no post touches the
 * communicator NCCL frees. */
void kvk_nccl_abort(struct kvk_nccl *c);

int kvk_nccl_send_kv(struct kvk_nccl *c, const struct kvk_kv_layers *kv, const int32_t *blocks,
		     int n_blocks, int peer);
int kvk_nccl_recv_kv(struct kvk_nccl *c, const struct kvk_kv_layers *kv, const int32_t *blocks,
		     int n_blocks, int peer);

#endif
