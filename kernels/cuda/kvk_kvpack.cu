// KV pack / unpack between paged device KV and the block-file payload (kvk_cuda.h): gather /
// scatter kernels and the two-stream, double-buffered pipeline around them.
#include <stdlib.h>

#include "kvk_cuda_int.h"

#define CHUNK_BYTES (4u << 20) // staging target per buffer
#define CHUNK_MAX   64	       // block ids per launch (passed by value)

struct chunk_ids {
	int n;
	int32_t id[CHUNK_MAX];
};

// Payload element e of a chunk (in units of T) <-> its place in the pools. gather: dst is the
// payload; scatter: src is. Layer table entry 2 * l + kv is the pool of layer l, K or V.
template <typename T>
static __global__ void move_kernel(T *payload, T *const *layers, size_t stride, size_t slab,
				   int n_pools, struct chunk_ids ids, int to_payload)
{
	size_t per_block = slab * n_pools, total = per_block * ids.n;
	for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
	     e += (size_t)gridDim.x * blockDim.x) {
		size_t bi = e / per_block, rem = e % per_block;
		T *pool = layers[rem / slab] + (size_t)ids.id[bi] * stride + rem % slab;
		if (to_payload)
			payload[e] = *pool;
		else
			*pool = payload[e];
	}
}

struct plan {
	size_t payload; // bytes per block
	size_t slab;	// halves of one (layer, K|V) slab of a block
	int vec;	// 16-byte moves possible
	int per_chunk;	// blocks per chunk
	int n_pools;	// 2 * n_layer
};

static int plan_make(struct kvk_cuda_ctx *ctx, const struct kvk_kv_layers *kv,
		     const int32_t *blocks, int n_blocks, struct plan *p)
{
	p->payload = kvk_kv_payload_bytes(kv);
	if (!p->payload || n_blocks < 0 || !kv->k || !kv->v || kv->num_blocks < 1 ||
	    kv->n_layer > (1 << 20) ||
	    kv->block_stride < (size_t)kv->block_tokens * kv->n_kv_heads * kv->head_dim)
		return -EINVAL;
	for (int i = 0; i < n_blocks; i++)
		if (blocks[i] < 0 || blocks[i] >= kv->num_blocks)
			return -EINVAL;
	p->slab = (size_t)kv->block_tokens * kv->n_kv_heads * kv->head_dim;
	p->n_pools = 2 * kv->n_layer;
	p->vec = p->slab % 8 == 0 && kv->block_stride % 8 == 0;
	for (int l = 0; l < kv->n_layer; l++) {
		if (!kv->k[l] || !kv->v[l])
			return -EINVAL;
		if (((uintptr_t)kv->k[l] | (uintptr_t)kv->v[l]) % 16)
			p->vec = 0;
	}
	size_t per = CHUNK_BYTES / p->payload;
	p->per_chunk = per < 1 ? 1 : per > CHUNK_MAX ? CHUNK_MAX : (int)per;

	// The layer table goes to the device once per call, on the compute stream (so after
	// earlier kernels that may still read the previous table).
	if (ctx->d_layers_cap < p->n_pools) {
		KVK_CK(cudaStreamSynchronize(ctx->s_comp));
		cudaFree(ctx->d_layers);
		ctx->d_layers = NULL;
		ctx->d_layers_cap = 0;
		KVK_CK(cudaMalloc(&ctx->d_layers, p->n_pools * sizeof(uint16_t *)));
		ctx->d_layers_cap = p->n_pools;
	}
	uint16_t **tab = (uint16_t **)malloc(p->n_pools * sizeof(uint16_t *));
	if (!tab)
		return -ENOMEM;
	for (int l = 0; l < kv->n_layer; l++) {
		tab[2 * l] = kv->k[l];
		tab[2 * l + 1] = kv->v[l];
	}
	// Pageable source: returns once the bytes are staged, so tab can go.
	int rc = kvk_cuda_err(cudaMemcpyAsync(ctx->d_layers, tab, p->n_pools * sizeof(uint16_t *),
					      cudaMemcpyHostToDevice, ctx->s_comp),
			      "upload layer table");
	if (!rc)
		rc = kvk_cuda_err(cudaStreamSynchronize(ctx->s_comp), "upload layer table");
	free(tab);
	return rc;
}

// Enqueues the move of blocks[0 .. n-1] (n <= CHUNK_MAX) between payload and pools.
static int move_chunk(struct kvk_cuda_ctx *ctx, const struct plan *p,
		      const struct kvk_kv_layers *kv, void *payload, const int32_t *blocks, int n,
		      int to_payload)
{
	struct chunk_ids ids;
	ids.n = n;
	for (int i = 0; i < n; i++)
		ids.id[i] = blocks[i];
	size_t bytes = (size_t)n * p->payload;
	int vec = p->vec && (uintptr_t)payload % 16 == 0;
	unsigned grid = kvk_blocks(bytes / (vec ? 16 : 2), 256);
	if (grid > 4096)
		grid = 4096;
	if (vec)
		move_kernel<uint4><<<grid, 256, 0, ctx->s_comp>>>(
		    (uint4 *)payload, (uint4 *const *)ctx->d_layers, kv->block_stride / 8,
		    p->slab / 8, p->n_pools, ids, to_payload);
	else
		move_kernel<uint16_t><<<grid, 256, 0, ctx->s_comp>>>(
		    (uint16_t *)payload, (uint16_t *const *)ctx->d_layers, kv->block_stride,
		    p->slab, p->n_pools, ids, to_payload);
	KVK_LAUNCHED();
	return 0;
}

// After an error mid-pipeline: nothing may still run on the caller's buffers when we return.
static int drain(struct kvk_cuda_ctx *ctx, int rc)
{
	cudaStreamSynchronize(ctx->s_copy);
	cudaStreamSynchronize(ctx->s_comp);
	return rc;
}

#define PIPE_CK(call)                                                                              \
	do {                                                                                       \
		int rc_ = kvk_cuda_err((call), #call);                                             \
		if (rc_)                                                                           \
			return drain(ctx, rc_);                                                    \
	} while (0)

extern "C" int kvk_cu_kv_pack(struct kvk_cuda_ctx *ctx, void *dst_host,
			      const struct kvk_kv_layers *kv, const int32_t *blocks, int n_blocks,
			      kvk_chunk_fn cb, void *arg)
{
	KVK_ENTER(ctx);
	struct plan p;
	int rc = plan_make(ctx, kv, blocks, n_blocks, &p);
	if (rc)
		return rc;
	if ((rc = kvk_cuda_stage(ctx, (size_t)p.per_chunk * p.payload)))
		return rc;
	int nchunks = (n_blocks + p.per_chunk - 1) / p.per_chunk;
	for (int c = 0; c < nchunks; c++) {
		int buf = c & 1, first = c * p.per_chunk;
		int cnt = n_blocks - first < p.per_chunk ? n_blocks - first : p.per_chunk;
		if (c >= 2) // the download of chunk c - 2 has left this buffer
			PIPE_CK(cudaStreamWaitEvent(ctx->s_comp, ctx->ev_free[buf], 0));
		if ((rc = move_chunk(ctx, &p, kv, ctx->stage[buf], blocks + first, cnt, 1)))
			return drain(ctx, rc);
		PIPE_CK(cudaEventRecord(ctx->ev_ready[buf], ctx->s_comp));
		PIPE_CK(cudaStreamWaitEvent(ctx->s_copy, ctx->ev_ready[buf], 0));
		PIPE_CK(cudaMemcpyAsync((char *)dst_host + (size_t)first * p.payload,
					ctx->stage[buf], (size_t)cnt * p.payload,
					cudaMemcpyDeviceToHost, ctx->s_copy));
		PIPE_CK(cudaEventRecord(ctx->ev_free[buf], ctx->s_copy));
		if (cb && c >= 1) { // chunk c - 1 is on the host while chunk c moves
			PIPE_CK(cudaEventSynchronize(ctx->ev_free[buf ^ 1]));
			if ((rc = cb(arg, first - p.per_chunk, p.per_chunk)))
				return drain(ctx, rc);
		}
	}
	PIPE_CK(cudaStreamSynchronize(ctx->s_copy));
	if (cb && nchunks > 0) {
		int first = (nchunks - 1) * p.per_chunk;
		if ((rc = cb(arg, first, n_blocks - first)))
			return drain(ctx, rc);
	}
	return 0;
}

extern "C" int kvk_cu_kv_unpack(struct kvk_cuda_ctx *ctx, const struct kvk_kv_layers *kv,
				const void *src_host, const int32_t *blocks, int n_blocks,
				kvk_chunk_fn cb, void *arg)
{
	KVK_ENTER(ctx);
	struct plan p;
	int rc = plan_make(ctx, kv, blocks, n_blocks, &p);
	if (rc)
		return rc;
	if ((rc = kvk_cuda_stage(ctx, (size_t)p.per_chunk * p.payload)))
		return rc;
	int nchunks = (n_blocks + p.per_chunk - 1) / p.per_chunk;
	for (int c = 0; c < nchunks; c++) {
		int buf = c & 1, first = c * p.per_chunk;
		int cnt = n_blocks - first < p.per_chunk ? n_blocks - first : p.per_chunk;
		// The caller fills chunk c (e.g. reads it from the file) while chunk c - 1 moves.
		if (cb && (rc = cb(arg, first, cnt)))
			return drain(ctx, rc);
		if (c >= 2) // the scatter of chunk c - 2 has left this buffer
			PIPE_CK(cudaStreamWaitEvent(ctx->s_copy, ctx->ev_free[buf], 0));
		PIPE_CK(cudaMemcpyAsync(
		    ctx->stage[buf], (const char *)src_host + (size_t)first * p.payload,
		    (size_t)cnt * p.payload, cudaMemcpyHostToDevice, ctx->s_copy));
		PIPE_CK(cudaEventRecord(ctx->ev_ready[buf], ctx->s_copy));
		PIPE_CK(cudaStreamWaitEvent(ctx->s_comp, ctx->ev_ready[buf], 0));
		if ((rc = move_chunk(ctx, &p, kv, ctx->stage[buf], blocks + first, cnt, 0)))
			return drain(ctx, rc);
		PIPE_CK(cudaEventRecord(ctx->ev_free[buf], ctx->s_comp));
	}
	PIPE_CK(cudaStreamSynchronize(ctx->s_comp));
	return 0;
}

static int move_all(struct kvk_cuda_ctx *ctx, void *payload, const struct kvk_kv_layers *kv,
		    const int32_t *blocks, int n_blocks, int to_payload)
{
	KVK_ENTER(ctx);
	struct plan p;
	int rc = plan_make(ctx, kv, blocks, n_blocks, &p);
	for (int first = 0; !rc && first < n_blocks; first += CHUNK_MAX) {
		int cnt = n_blocks - first < CHUNK_MAX ? n_blocks - first : CHUNK_MAX;
		rc = move_chunk(ctx, &p, kv, (char *)payload + (size_t)first * p.payload,
				blocks + first, cnt, to_payload);
	}
	return rc;
}

extern "C" int kvk_cu_kv_gather(struct kvk_cuda_ctx *ctx, void *dst_dev,
				const struct kvk_kv_layers *kv, const int32_t *blocks, int n_blocks)
{
	return move_all(ctx, dst_dev, kv, blocks, n_blocks, 1);
}

extern "C" int kvk_cu_kv_scatter(struct kvk_cuda_ctx *ctx, const struct kvk_kv_layers *kv,
				 const void *src_dev, const int32_t *blocks, int n_blocks)
{
	return move_all(ctx, (void *)src_dev, kv, blocks, n_blocks, 0);
}
