/* Built when CUDA or NCCL is absent: the NCCL transfer reports no device. */
#include "kvk_nccl.h"

#include <errno.h>
#include <stddef.h>

int kvk_nccl_available(void)
{
	return 0;
}

int kvk_nccl_id_create(uint8_t id[KVK_NCCL_ID_BYTES])
{
	(void)id;
	return -ENODEV;
}

int kvk_nccl_comm_create(struct kvk_nccl **out, struct kvk_cuda_ctx *ctx,
			 const uint8_t id[KVK_NCCL_ID_BYTES], int nranks, int rank)
{
	(void)ctx, (void)id, (void)nranks, (void)rank;
	*out = NULL;
	return -ENODEV;
}

void kvk_nccl_comm_destroy(struct kvk_nccl *c)
{
	(void)c;
}

void kvk_nccl_abort(struct kvk_nccl *c)
{
	(void)c;
}

int kvk_nccl_send_kv(struct kvk_nccl *c, const struct kvk_kv_layers *kv, const int32_t *blocks,
		     int n_blocks, int peer)
{
	(void)c, (void)kv, (void)blocks, (void)n_blocks, (void)peer;
	return -ENODEV;
}

int kvk_nccl_recv_kv(struct kvk_nccl *c, const struct kvk_kv_layers *kv, const int32_t *blocks,
		     int n_blocks, int peer)
{
	(void)c, (void)kv, (void)blocks, (void)n_blocks, (void)peer;
	return -ENODEV;
}
