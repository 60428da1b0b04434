// Private to kernels/cuda: the context layout and error conversion shared by the .cu files.
#ifndef KVFS_KVK_CUDA_INT_H
#define KVFS_KVK_CUDA_INT_H

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <mma.h>

extern "C" {
#include "kvk_cuda.h"
#ifndef KVFS_LOG_TAG
#define KVFS_LOG_TAG "kvk"
#endif
#include "log.h"
}

struct kvk_cuda_ctx {
	int device;
	cudaStream_t s_comp; // kernels (and cuBLAS)
	cudaStream_t s_copy; // host <-> device copies of pack/unpack
	cublasHandle_t blas;
	void *blas_ws;
	size_t blas_ws_bytes;
	void *stage[2]; // pack/unpack staging (device), stage_bytes each
	size_t stage_bytes;
	cudaEvent_t ev_ready[2]; // staging buffer i filled (gather done / upload done)
	cudaEvent_t ev_free[2];	 // staging buffer i consumed (download done / scatter done)
	uint16_t **d_layers;	 // device copy of the pack/unpack layer table: [2 * l + kv]
	int d_layers_cap;	 // entries
	int mma;		 // compute capability >= 8.0: the tensor-core kernels run
};

// Tensor-core code (nvcuda::wmma: f16/bf16 inputs, f32 accumulate) is compiled for sm_80 and up
// and on the emulation (docs/cuda-emu.md, "Tensor cores"); for older targets the bodies of its
// kernels are empty and the host never launches them (ctx->mma is 0 there).
#if defined(KVFS_KVK_EMU_H) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800)
#define KVK_MMA_DEVICE 1
#else
#define KVK_MMA_DEVICE 0
#endif

// Converts a CUDA error once, at the boundary: logged with the call, returned as -errno.
static inline int kvk_cuda_err(cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return 0;
	klog_error("%s: %s", what, cudaGetErrorString(e));
	return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

#define KVK_CK(call)                                                                               \
	do {                                                                                       \
		int rc_ = kvk_cuda_err((call), #call);                                             \
		if (rc_)                                                                           \
			return rc_;                                                                \
	} while (0)

// Every entry point starts with this: the context's device must be current in this thread.
// It also clears the thread's last-error slot: an error left there by a call whose status was
// already returned or deliberately ignored (a cudaFree in kvk_cuda_free, a sync in an error
// path) would otherwise be reported by this call's KVK_LAUNCHED as its own. A sticky error
// (a faulted context) is not lost: every later call returns it again.
#define KVK_ENTER(ctx)                                                                             \
	do {                                                                                       \
		if (!(ctx))                                                                        \
			return -EINVAL;                                                            \
		(void)cudaGetLastError();                                                          \
		KVK_CK(cudaSetDevice((ctx)->device));                                              \
	} while (0)

// After a launch: configuration errors surface here; errors while running at the next sync.
#define KVK_LAUNCHED() KVK_CK(cudaGetLastError())

static inline unsigned kvk_blocks(size_t n, unsigned per)
{
	size_t b = (n + per - 1) / per;
	return (unsigned)(b > 0x7fffffffu ? 0x7fffffffu : (b ? b : 1));
}

// Grows the two staging buffers to at least bytes each (pack/unpack, NCCL).
int kvk_cuda_stage(struct kvk_cuda_ctx *ctx, size_t bytes);

#endif
