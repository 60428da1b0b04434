// The kvk_cuda context: device, streams, cuBLAS handle, staging buffers; memory helpers.
#include <stdio.h>
#include <stdlib.h>

#include "kvk_cuda_int.h"

// cuBLAS workspace: enough for its fastest Hopper/Blackwell kernels at large sizes.
#define BLAS_WS_BYTES (32u << 20)

extern "C" int kvk_cuda_device_count(void)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess) {
		cudaGetLastError(); // clear the sticky "no device" error
		return 0;
	}
	return n;
}

extern "C" int kvk_cuda_ctx_create(int device, struct kvk_cuda_ctx **out)
{
	*out = NULL;
	if (device < 0 || device >= kvk_cuda_device_count())
		return -ENODEV;
	struct kvk_cuda_ctx *c = (struct kvk_cuda_ctx *)calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->device = device;
	int rc = kvk_cuda_err(cudaSetDevice(device), "cudaSetDevice");
	if (!rc)
		rc = kvk_cuda_err(cudaStreamCreateWithFlags(&c->s_comp, cudaStreamNonBlocking),
				  "stream");
	if (!rc)
		rc = kvk_cuda_err(cudaStreamCreateWithFlags(&c->s_copy, cudaStreamNonBlocking),
				  "stream");
	for (int i = 0; i < 2 && !rc; i++) {
		rc = kvk_cuda_err(cudaEventCreateWithFlags(&c->ev_ready[i], cudaEventDisableTiming),
				  "event");
		if (!rc)
			rc = kvk_cuda_err(
			    cudaEventCreateWithFlags(&c->ev_free[i], cudaEventDisableTiming),
			    "event");
	}
	if (!rc) {
		cudaDeviceProp p;
		rc = kvk_cuda_err(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
		c->mma = !rc && p.major >= 8;
	}
	if (!rc)
		rc = kvk_cuda_err(cudaMalloc(&c->blas_ws, BLAS_WS_BYTES), "cudaMalloc(workspace)");
	if (!rc) {
		c->blas_ws_bytes = BLAS_WS_BYTES;
		if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS ||
		    cublasSetStream(c->blas, c->s_comp) != CUBLAS_STATUS_SUCCESS ||
		    cublasSetWorkspace(c->blas, c->blas_ws, c->blas_ws_bytes) !=
			CUBLAS_STATUS_SUCCESS) {
			klog_error("cuBLAS initialisation failed");
			rc = -EIO;
		}
	}
	if (rc) {
		kvk_cuda_ctx_destroy(c);
		return rc;
	}
	*out = c;
	return 0;
}

extern "C" void kvk_cuda_ctx_destroy(struct kvk_cuda_ctx *c)
{
	if (!c)
		return;
	cudaSetDevice(c->device);
	if (c->s_comp)
		cudaStreamSynchronize(c->s_comp);
	if (c->s_copy)
		cudaStreamSynchronize(c->s_copy);
	if (c->blas)
		cublasDestroy(c->blas);
	cudaFree(c->blas_ws);
	cudaFree(c->d_layers);
	for (int i = 0; i < 2; i++) {
		cudaFree(c->stage[i]);
		if (c->ev_ready[i])
			cudaEventDestroy(c->ev_ready[i]);
		if (c->ev_free[i])
			cudaEventDestroy(c->ev_free[i]);
	}
	if (c->s_comp)
		cudaStreamDestroy(c->s_comp);
	if (c->s_copy)
		cudaStreamDestroy(c->s_copy);
	free(c);
}

extern "C" int kvk_cuda_sync(struct kvk_cuda_ctx *ctx)
{
	KVK_ENTER(ctx);
	KVK_CK(cudaStreamSynchronize(ctx->s_copy));
	KVK_CK(cudaStreamSynchronize(ctx->s_comp));
	return 0;
}

extern "C" int kvk_cuda_device_info(struct kvk_cuda_ctx *ctx, char *buf, size_t len)
{
	KVK_ENTER(ctx);
	cudaDeviceProp p;
	KVK_CK(cudaGetDeviceProperties(&p, ctx->device));
	snprintf(buf, len, "%s, sm_%d%d, %d SMs, %.1f GiB", p.name, p.major, p.minor,
		 p.multiProcessorCount, (double)p.totalGlobalMem / (1u << 30) / 1.0);
	return 0;
}

extern "C" void *kvk_cuda_stream(struct kvk_cuda_ctx *ctx)
{
	return ctx ? (void *)ctx->s_comp : NULL;
}

extern "C" int kvk_cuda_device(struct kvk_cuda_ctx *ctx)
{
	return ctx ? ctx->device : -1;
}

int kvk_cuda_stage(struct kvk_cuda_ctx *ctx, size_t bytes)
{
	if (ctx->stage_bytes >= bytes)
		return 0;
	// Earlier transfers may still read the old buffers.
	KVK_CK(cudaStreamSynchronize(ctx->s_comp));
	KVK_CK(cudaStreamSynchronize(ctx->s_copy));
	for (int i = 0; i < 2; i++) {
		cudaFree(ctx->stage[i]);
		ctx->stage[i] = NULL;
	}
	ctx->stage_bytes = 0;
	for (int i = 0; i < 2; i++)
		KVK_CK(cudaMalloc(&ctx->stage[i], bytes));
	ctx->stage_bytes = bytes;
	return 0;
}

extern "C" int kvk_cuda_malloc(struct kvk_cuda_ctx *ctx, void **out, size_t bytes)
{
	*out = NULL;
	KVK_ENTER(ctx);
	KVK_CK(cudaMalloc(out, bytes ? bytes : 1));
	return 0;
}

extern "C" void kvk_cuda_free(struct kvk_cuda_ctx *ctx, void *p)
{
	if (!ctx || !p)
		return;
	cudaSetDevice(ctx->device);
	cudaFree(p);
}

extern "C" int kvk_cuda_host_alloc(struct kvk_cuda_ctx *ctx, void **out, size_t bytes)
{
	*out = NULL;
	KVK_ENTER(ctx);
	KVK_CK(cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocPortable));
	return 0;
}

extern "C" void kvk_cuda_host_free(struct kvk_cuda_ctx *ctx, void *p)
{
	if (!ctx || !p)
		return;
	cudaSetDevice(ctx->device);
	cudaFreeHost(p);
}

extern "C" int kvk_cuda_h2d(struct kvk_cuda_ctx *ctx, void *dst_dev, const void *src, size_t bytes)
{
	KVK_ENTER(ctx);
	KVK_CK(cudaMemcpyAsync(dst_dev, src, bytes, cudaMemcpyHostToDevice, ctx->s_comp));
	KVK_CK(cudaStreamSynchronize(ctx->s_comp));
	return 0;
}

extern "C" int kvk_cuda_d2h(struct kvk_cuda_ctx *ctx, void *dst, const void *src_dev, size_t bytes)
{
	KVK_ENTER(ctx);
	KVK_CK(cudaMemcpyAsync(dst, src_dev, bytes, cudaMemcpyDeviceToHost, ctx->s_comp));
	KVK_CK(cudaStreamSynchronize(ctx->s_comp));
	return 0;
}

extern "C" int kvk_cuda_memset(struct kvk_cuda_ctx *ctx, void *dst_dev, int byte, size_t bytes)
{
	KVK_ENTER(ctx);
	KVK_CK(cudaMemsetAsync(dst_dev, byte, bytes, ctx->s_comp));
	return 0;
}
