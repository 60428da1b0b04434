// kvk_emu — runs the project's CUDA sources (kernels/cuda/*.cu) on the CPU, for tests.
//
// What it is: the subset of the CUDA runtime, cuda_fp16, cuBLAS and NCCL that kernels/cuda
// uses, implemented on the host, plus the device-side builtins (threadIdx, __syncthreads,
// warp shuffles, __shared__). tests/cuda-emu/cu2cc.pl rewrites a .cu file's launches
// (`k<<<grid, block, smem, stream>>>(args)`) and `__shared__` declarations into calls of this
// header; the result compiles as C++ with the emulator's cuda_runtime.h, cuda_fp16.h,
// cublas_v2.h and nccl.h (tests/cuda-emu/include) first on the include path. Nothing in
// kernels/cuda changes for it. It is not a GPU and proves nothing about speed; it runs the
// same index math, the same barriers and the same stream/event order, and checks them
// (docs/cuda-emu.md):
//
// - a thread block runs as one fiber per CUDA thread on one OS thread; __syncthreads and each
//   warp operation are barriers where the fibers meet. A barrier that cannot complete (some
//   threads wait at __syncthreads while others wait in a shuffle or have exited), a shuffle
//   whose mask is not the warp's lanes, lanes of a warp meeting at different warp operations,
//   or a shuffle naming an exited lane is reported as a kernel fault;
// - every stream is a worker thread that runs its work in order; events order streams as on
//   a GPU, so a missing wait is a real race. Copies from pageable memory are staged at the
//   call, to pageable memory are synchronous (the CUDA rules); pinned memory is asynchronous;
// - device memory is malloc'd (so ASan sees a kernel's out-of-bounds access as a heap
//   overflow), filled with 0xff bytes at allocation (NaN as f32 and f16: a read of memory
//   never written shows), checked by every copy, memset and cuBLAS call for kind and range;
//   static and dynamic shared memory are filled with 0xff for every block;
// - a kernel fault, or a copy or cuBLAS operand outside device memory, becomes the device's
//   sticky error, returned by every later call on that device (as after a fault on a GPU).
//
// Threading: any number of host threads; each has its own current device and last error.
// Kernels of one stream run one block at a time on that stream's worker thread.
//
// Environment: KVK_EMU_DEVICES (devices reported, default 1, at most 16); KVK_EMU_MEM_MB
// (device memory per device, default 4096).
#ifndef KVFS_KVK_EMU_H
#define KVFS_KVK_EMU_H

#ifndef __cplusplus
#error "kvk_emu compiles CUDA sources as C++"
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- qualifiers -------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__	__attribute__((noinline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) alignas(n)
// __shared__ is not defined: cu2cc.pl rewrites every declaration of it (KVK_EMU_SHARED below),
// so one it did not understand does not compile.

// ---- vector types ------------------------------------------------------------------------------
struct uint3 {
	unsigned x, y, z;
};
struct dim3 {
	unsigned x, y, z;
	dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz)
	{
	}
};
struct alignas(8) float2 {
	float x, y;
};
struct alignas(16) float4 {
	float x, y, z, w;
};
struct alignas(16) uint4 {
	unsigned x, y, z, w;
};
struct alignas(8) int2 {
	int x, y;
};
static inline float2 make_float2(float x, float y)
{
	return float2{x, y};
}
static inline float4 make_float4(float x, float y, float z, float w)
{
	return float4{x, y, z, w};
}
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w)
{
	return uint4{x, y, z, w};
}

// ---- the running thread -------------------------------------------------------------------------
struct kvk_emu_block {
	uint3 idx;
	dim3 dim, grid;
	void *dyn_smem;
};
struct kvk_emu_lane {
	uint3 tid;
	const kvk_emu_block *blk;
};
// The lane running on this OS thread (NULL outside a kernel). Set by the scheduler. GNU
// __thread, not thread_local: no TLS wrapper call (GCC 12's UBSan null check of that wrapper
// misreads its flags).
extern __thread kvk_emu_lane *kvk_emu_cur;

static const int warpSize = 32;
#define threadIdx (kvk_emu_cur->tid)
#define blockIdx  (kvk_emu_cur->blk->idx)
#define blockDim  (kvk_emu_cur->blk->dim)
#define gridDim	  (kvk_emu_cur->blk->grid)

void kvk_emu_syncthreads(void);
// A kernel fault in the running CUDA thread (mma.h's checks): reported with the kernel, block
// and thread, the block abandoned, the device's error sticky. Does not return.
[[noreturn]] void kvk_emu_kernel_fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void *kvk_emu_dyn_smem(void);

// Static shared memory: `__shared__ T name[dims];` becomes KVK_EMU_SHARED(T, name, [dims]), a
// reference into the running block's static shared memory. The block's first thread to reach
// the declaration allocates it (filled with 0xff bytes, like the dynamic shared memory: a
// read before any write shows); the others get the same bytes. `site` (one per declaration,
// and per template instantiation) tells the variables apart. A block's variables over 48 KiB
// in all, or with the dynamic over the launch's limit, are a kernel fault. Under ASan the
// bytes between and after the variables are poisoned, so an access out of one is reported.
void *kvk_emu_static_smem(const void *site, size_t size, size_t align);
template <typename T> using kvk_emu_type = T;
#define KVK_EMU_SHARED(T, name, dims)                                                              \
	static char kvk_emu_site_##name;                                                           \
	kvk_emu_type<T dims> &name = *(kvk_emu_type<T dims> *)kvk_emu_static_smem(                 \
	    &kvk_emu_site_##name, sizeof(T dims), alignof(T))
#define __syncthreads() kvk_emu_syncthreads()

// Warp operations meet at one barrier per call; `kind` names the operation so lanes at
// different ones are reported. The value travels as 64 bits.
enum kvk_emu_warp_op {
	KVK_EMU_SHFL_IDX = 1,
	KVK_EMU_SHFL_XOR,
	KVK_EMU_SHFL_DOWN,
	KVK_EMU_SHFL_UP,
	KVK_EMU_SYNCWARP,
	KVK_EMU_BALLOT,
	KVK_EMU_WMMA_LOAD, // nvcuda::wmma (mma.h): warp-synchronous, no memory ordering
	KVK_EMU_WMMA_STORE,
	KVK_EMU_WMMA_MMA,
};
uint64_t kvk_emu_warp(enum kvk_emu_warp_op op, unsigned mask, uint64_t v, int arg, int width);

template <typename T> static inline uint64_t kvk_emu_bits(T v)
{
	static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle type");
	uint64_t b = 0;
	memcpy(&b, &v, sizeof(v));
	return b;
}
template <typename T> static inline T kvk_emu_unbits(uint64_t b)
{
	T v;
	memcpy(&v, &b, sizeof(v));
	return v;
}
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
	return kvk_emu_unbits<T>(kvk_emu_warp(KVK_EMU_SHFL_IDX, mask, kvk_emu_bits(v), src, width));
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
	return kvk_emu_unbits<T>(
	    kvk_emu_warp(KVK_EMU_SHFL_XOR, mask, kvk_emu_bits(v), lane_mask, width));
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
	return kvk_emu_unbits<T>(
	    kvk_emu_warp(KVK_EMU_SHFL_DOWN, mask, kvk_emu_bits(v), (int)delta, width));
}
template <typename T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
	return kvk_emu_unbits<T>(
	    kvk_emu_warp(KVK_EMU_SHFL_UP, mask, kvk_emu_bits(v), (int)delta, width));
}
static inline void __syncwarp(unsigned mask = 0xffffffffu)
{
	kvk_emu_warp(KVK_EMU_SYNCWARP, mask, 0, 0, 32);
}
static inline unsigned __ballot_sync(unsigned mask, int pred)
{
	return (unsigned)kvk_emu_warp(KVK_EMU_BALLOT, mask, pred != 0, 0, 32);
}

// ---- device math
// ---------------------------------------------------------------------------------
static inline float rsqrtf(float x)
{
	return 1.0f / sqrtf(x);
}
// glibc declares a function of this name: a macro, so device code gets expf.
#define __expf(x) expf(x)
static inline float __fdividef(float a, float b)
{
	return a / b;
}
static inline float __uint_as_float(unsigned u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}
static inline unsigned __float_as_uint(float f)
{
	unsigned u;
	memcpy(&u, &f, 4);
	return u;
}
static inline float __int_as_float(int i)
{
	float f;
	memcpy(&f, &i, 4);
	return f;
}
static inline int __float_as_int(float f)
{
	int i;
	memcpy(&i, &f, 4);
	return i;
}
static inline int min(int a, int b)
{
	return a < b ? a : b;
}
static inline int max(int a, int b)
{
	return a > b ? a : b;
}
static inline unsigned min(unsigned a, unsigned b)
{
	return a < b ? a : b;
}
static inline unsigned max(unsigned a, unsigned b)
{
	return a > b ? a : b;
}
static inline long long min(long long a, long long b)
{
	return a < b ? a : b;
}
static inline long long max(long long a, long long b)
{
	return a > b ? a : b;
}
static inline unsigned long long min(unsigned long long a, unsigned long long b)
{
	return a < b ? a : b;
}
static inline unsigned long long max(unsigned long long a, unsigned long long b)
{
	return a > b ? a : b;
}

// ---- launches
// ------------------------------------------------------------------------------------
typedef struct CUstream_st *cudaStream_t;

struct kvk_emu_cfg {
	dim3 grid, block;
	size_t smem;
	cudaStream_t stream;
};
static inline kvk_emu_cfg kvk_emu_config(dim3 grid, dim3 block, size_t smem = 0,
					 cudaStream_t stream = 0)
{
	return kvk_emu_cfg{grid, block, smem, stream};
}

// Checks the configuration against the device's limits (errors go to cudaGetLastError) and
// enqueues the grid on the stream; body runs once per CUDA thread.
void kvk_emu_launch_body(const char *name, const void *fn, const kvk_emu_cfg &cfg,
			 std::function<void()> body);

// What `name<<<cfg>>>(args...)` becomes: the arguments are converted to the kernel's
// parameter types now (as at a real launch) and each thread gets its own copy.
template <typename... P, typename... A>
static inline void kvk_emu_launch(const char *name, const kvk_emu_cfg &cfg, void (*k)(P...),
				  A &&...a)
{
	auto args =
	    std::make_shared<std::tuple<typename std::decay<P>::type...>>(std::forward<A>(a)...);
	kvk_emu_launch_body(name, (const void *)k, cfg, [k, args]() { std::apply(k, *args); });
}

#endif
