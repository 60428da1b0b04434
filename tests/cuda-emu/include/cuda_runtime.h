// kvk_emu's CUDA runtime: the calls kernels/cuda makes, with the real API's names, values and
// rules (kvk_emu.h). A call this header does not declare does not compile: the emulator
// implements what the project uses, and a new call is added here with its semantics.
#ifndef KVFS_KVK_EMU_CUDA_RUNTIME_H
#define KVFS_KVK_EMU_CUDA_RUNTIME_H

#include "kvk_emu.h"

enum cudaError {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
	cudaErrorInvalidConfiguration = 9,
	cudaErrorInvalidDevice = 101,
	cudaErrorNoDevice = 100,
	cudaErrorInvalidResourceHandle = 400,
	cudaErrorIllegalAddress = 700,
	cudaErrorLaunchFailure = 719,
	cudaErrorNotSupported = 801,
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
	cudaMemcpyHostToHost = 0,
	cudaMemcpyHostToDevice = 1,
	cudaMemcpyDeviceToHost = 2,
	cudaMemcpyDeviceToDevice = 3,
	cudaMemcpyDefault = 4,
};

enum cudaFuncAttribute {
	cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

#define cudaStreamNonBlocking  0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault   0x00
#define cudaHostAllocPortable  0x01

typedef struct CUevent_st *cudaEvent_t;

struct cudaDeviceProp {
	char name[256];
	size_t totalGlobalMem;
	size_t sharedMemPerBlock;
	size_t sharedMemPerBlockOptin;
	int warpSize;
	int maxThreadsPerBlock;
	int major, minor;
	int multiProcessorCount;
};

// Library data types (library_types.h in the toolkit); cuBLAS uses them.
enum cudaDataType_t {
	CUDA_R_32F = 0,
	CUDA_R_16F = 2,
	CUDA_R_16BF = 14,
};

// The runtime API has C linkage, as in the toolkit (C callers may declare what they use).
extern "C" {
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaFree(void *p);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
			    cudaStream_t stream = 0);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream = 0);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned flags = 0);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t ev);
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t ev);
}

cudaError_t kvk_emu_malloc(void **p, size_t bytes);
cudaError_t kvk_emu_host_alloc(void **p, size_t bytes, unsigned flags);
template <typename T> static inline cudaError_t cudaMalloc(T **p, size_t bytes)
{
	return kvk_emu_malloc((void **)p, bytes);
}
template <typename T> static inline cudaError_t cudaHostAlloc(T **p, size_t bytes, unsigned flags)
{
	return kvk_emu_host_alloc((void **)p, bytes, flags);
}
cudaError_t kvk_emu_func_set_attribute(const void *fn, cudaFuncAttribute attr, int value);
template <typename F>
static inline cudaError_t cudaFuncSetAttribute(F *fn, cudaFuncAttribute attr, int value)
{
	return kvk_emu_func_set_attribute((const void *)fn, attr, value);
}

// ---- for the other emulated libraries (cuBLAS, NCCL): not CUDA API ----------------------------
// The device of a stream (0: the current device's legacy stream), or -1 for a bad handle.
int kvk_emu_stream_device(cudaStream_t s);
// Enqueues fn on s (0: the current device's legacy stream). fn runs on the stream's worker
// in order with the stream's other work; it returns a cudaError_t, which becomes the device's
// sticky error when not cudaSuccess.
cudaError_t kvk_emu_stream_enqueue(cudaStream_t s, std::function<cudaError_t()> fn);
// 1 when [p, p + bytes) lies inside one device allocation (of device *dev when dev is
// non-NULL, where the device is stored), else 0.
int kvk_emu_is_device(const void *p, size_t bytes, int *dev);
// Sets the jitter seed (0: off) for the launches made from now on and the stream work run while
// it is set; see kvk_emu_int.h.
void kvk_emu_set_jitter(uint64_t seed);
// Makes e the sticky error of device dev after printing why.
void kvk_emu_fault(int dev, cudaError_t e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
