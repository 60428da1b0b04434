// NCCL transfer of KV blocks (kvk_nccl.h): gather -> ncclSend / ncclRecv -> scatter, chunked
// through the context's staging buffers, all on the context's compute stream.
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvk_cuda_int.h"

extern "C" {
#include "kvk_nccl.h"
}

#define NCCL_CHUNK_BYTES (16u << 20)

static_assert(sizeof(ncclUniqueId) == KVK_NCCL_ID_BYTES, "ncclUniqueId size");

struct kvk_nccl {
	struct kvk_cuda_ctx *ctx;
	ncclComm_t comm;
	int rank, nranks;
	int aborted; /* kvk_nccl_abort ran (atomic builtins: any thread) */
	int posting; /* a transfer is between its aborted check and its ncclSend/Recv (atomic) */
};

/* How long kvk_nccl_abort lets a post that checked `aborted` finish before it frees the
 * communicator under it: a post only enqueues, unless NCCL blocks in it to connect to a peer
 * that never comes, which is what the abort is for. */
#define ABORT_GRACE_MS 2000

static int nccl_err(ncclResult_t r, const char *what)
{
	if (r == ncclSuccess)
		return 0;
	klog_error("%s: %s", what, ncclGetErrorString(r));
	return -EIO;
}

extern "C" int kvk_nccl_available(void)
{
	return 1;
}

extern "C" int kvk_nccl_id_create(uint8_t id[KVK_NCCL_ID_BYTES])
{
	if (kvk_cuda_device_count() < 1)
		return -ENODEV;
	ncclUniqueId u;
	int rc = nccl_err(ncclGetUniqueId(&u), "ncclGetUniqueId");
	if (!rc)
		memcpy(id, &u, sizeof(u));
	return rc;
}

extern "C" int kvk_nccl_comm_create(struct kvk_nccl **out, struct kvk_cuda_ctx *ctx,
				    const uint8_t id[KVK_NCCL_ID_BYTES], int nranks, int rank)
{
	*out = NULL;
	if (nranks < 2 || rank < 0 || rank >= nranks)
		return -EINVAL;
	KVK_ENTER(ctx);
	struct kvk_nccl *c = (struct kvk_nccl *)calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	ncclUniqueId u;
	memcpy(&u, id, sizeof(u));
	int rc = nccl_err(ncclCommInitRank(&c->comm, nranks, u, rank), "ncclCommInitRank");
	if (rc) {
		free(c);
		return rc;
	}
	c->ctx = ctx;
	c->rank = rank;
	c->nranks = nranks;
	*out = c;
	return 0;
}

extern "C" void kvk_nccl_comm_destroy(struct kvk_nccl *c)
{
	if (!c)
		return;
	cudaSetDevice(c->ctx->device);
	if (!__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) // an aborted comm is already freed
		ncclCommDestroy(c->comm);
	free(c);
}

extern "C" void kvk_nccl_abort(struct kvk_nccl *c)
{
	if (!c || __atomic_exchange_n(&c->aborted, 1, __ATOMIC_SEQ_CST))
		return;
	// A transfer that saw aborted == 0 may be about to post on c->comm: ncclCommAbort frees
	// it, and a post on a freed communicator is undefined. New posts see aborted == 1.
	for (int ms = 0; ms < ABORT_GRACE_MS && __atomic_load_n(&c->posting, __ATOMIC_SEQ_CST);
	     ms++)
		usleep(1000);
	cudaSetDevice(c->ctx->device);
	nccl_err(ncclCommAbort(c->comm), "ncclCommAbort");
}

// One ncclSend / ncclRecv on c, unless c is aborted (-EIO): see kvk_nccl_abort.
static int post(struct kvk_nccl *c, int send, void *buf, size_t bytes, int peer)
{
	__atomic_add_fetch(&c->posting, 1, __ATOMIC_SEQ_CST);
	int rc = -EIO;
	if (!__atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST))
		rc = send ? nccl_err(ncclSend(buf, bytes, ncclUint8, peer, c->comm, c->ctx->s_comp),
				     "ncclSend")
			  : nccl_err(ncclRecv(buf, bytes, ncclUint8, peer, c->comm, c->ctx->s_comp),
				     "ncclRecv");
	__atomic_sub_fetch(&c->posting, 1, __ATOMIC_SEQ_CST);
	return rc;
}

static int transfer(struct kvk_nccl *c, const struct kvk_kv_layers *kv, const int32_t *blocks,
		    int n_blocks, int peer, int send)
{
	if (!c || peer < 0 || peer >= c->nranks || peer == c->rank || n_blocks < 0)
		return -EINVAL;
	if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE))
		return -EIO;
	struct kvk_cuda_ctx *ctx = c->ctx;
	KVK_ENTER(ctx);
	size_t payload = kvk_kv_payload_bytes(kv);
	if (!payload)
		return -EINVAL;
	int per = payload >= NCCL_CHUNK_BYTES ? 1 : (int)(NCCL_CHUNK_BYTES / payload);
	int rc = kvk_cuda_stage(ctx, (size_t)per * payload);
	// Chunks alternate between the two staging buffers; everything is on one stream, so a
	// buffer is reused only after the operations that read it.
	for (int first = 0, i = 0; !rc && first < n_blocks; first += per, i++) {
		int cnt = n_blocks - first < per ? n_blocks - first : per;
		void *buf = ctx->stage[i & 1];
		size_t bytes = (size_t)cnt * payload;
		if (send)
			rc = kvk_cu_kv_gather(ctx, buf, kv, blocks + first, cnt);
		if (!rc)
			rc = post(c, send, buf, bytes, peer);
		if (!rc && !send)
			rc = kvk_cu_kv_scatter(ctx, kv, buf, blocks + first, cnt);
	}
	int rs = kvk_cuda_err(cudaStreamSynchronize(ctx->s_comp), "nccl transfer");
	// An abort ends a pending send or receive without an error of its own (the stream
	// completes): without this check an aborted receive would report blocks it never got.
	if (__atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST))
		return -EIO;
	return rc ? rc : rs;
}

extern "C" int kvk_nccl_send_kv(struct kvk_nccl *c, const struct kvk_kv_layers *kv,
				const int32_t *blocks, int n_blocks, int peer)
{
	return transfer(c, kv, blocks, n_blocks, peer, 1);
}

extern "C" int kvk_nccl_recv_kv(struct kvk_nccl *c, const struct kvk_kv_layers *kv,
				const int32_t *blocks, int n_blocks, int peer)
{
	return transfer(c, kv, blocks, n_blocks, peer, 0);
}
