// Kernels and host sequences for test_kvk_emu (tests/test_kvk_emu_main.c): the CUDA emulation's
// semantics (warp operations, barriers, shared memory, streams and events, memory and cuBLAS
// rules) and the faults it must report. Compiled only in the emulated build (KVFS_CUDA=EMU):
// some kernels here call host functions (usleep), which no GPU allows.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

extern "C" {
#include "test_kvk_emu.h"
}

// ---- warp operations: out[lane * 8 + i] for 64 threads (two warps) ------------------------------
static __global__ void shfl_kernel(int *out)
{
	int t = threadIdx.x, v = 100 + t;
	int *o = out + t * 8;
	o[0] = __shfl_xor_sync(0xffffffffu, v, 1);
	o[1] = __shfl_xor_sync(0xffffffffu, v, 16);
	o[2] = __shfl_down_sync(0xffffffffu, v, 3);
	o[3] = __shfl_down_sync(0xffffffffu, v, 3, 8);
	o[4] = __shfl_up_sync(0xffffffffu, v, 2);
	o[5] = __shfl_sync(0xffffffffu, v, 7);
	o[6] = __shfl_sync(0xffffffffu, v, 33, 16); // srcLane % width within the 16-lane segment
	o[7] = (int)__ballot_sync(0xffffffffu, t % 3 == 0);
}

extern "C" int emu_shuffles(int *out)
{
	int *d;
	if (cudaMalloc(&d, 64 * 8 * sizeof(int)))
		return -1;
	shfl_kernel<<<1, 64>>>(d);
	int rc = cudaGetLastError();
	if (!rc)
		rc = cudaMemcpy(out, d, 64 * 8 * sizeof(int), cudaMemcpyDeviceToHost);
	cudaFree(d);
	return rc;
}

// ---- barriers and shared memory ----

// Block b sums b * 1000 + t over its threads through static shared memory; out[b] = the sum,
// out[nb + b] = what thread 0 read back of its block's tag after the barrier.
static __global__ void reduce_kernel(int *out)
{
	__shared__ int part[256];
	__shared__ int tag;
	int t = threadIdx.x, b = blockIdx.x;
	if (t == 0)
		tag = b;
	part[t] = b * 1000 + t;
	__syncthreads();
	for (int s = blockDim.x / 2; s > 0; s >>= 1) {
		if (t < s)
			part[t] += part[t + s];
		__syncthreads();
	}
	if (t == 0) {
		out[b] = part[0];
		out[gridDim.x + b] = tag;
	}
}

extern "C" int emu_reduce(int *out, int nb)
{
	int *d;
	if (cudaMalloc(&d, 2 * nb * sizeof(int)))
		return -1;
	reduce_kernel<<<nb, 256>>>(d);
	int rc = cudaGetLastError();
	if (!rc)
		rc = cudaMemcpy(out, d, 2 * nb * sizeof(int), cudaMemcpyDeviceToHost);
	cudaFree(d);
	return rc;
}

// out[0] = dynamic shared memory before any write (poison), out[1] = after a write.
static __global__ void dyn_smem_kernel(unsigned *out)
{
	extern __shared__ unsigned sm[];
	if (threadIdx.x == 0) {
		out[0] = sm[0];
		sm[0] = 7;
		out[1] = sm[0];
	}
}

extern "C" int emu_dyn_smem(unsigned *out, size_t bytes, int set_attr)
{
	unsigned *d;
	if (cudaMalloc(&d, 2 * sizeof(unsigned)))
		return -1;
	if (set_attr &&
	    cudaFuncSetAttribute(dyn_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
				 (int)bytes))
		return -2;
	dyn_smem_kernel<<<1, 32, bytes>>>(d);
	int rc = cudaGetLastError();
	if (!rc)
		rc = cudaMemcpy(out, d, 2 * sizeof(unsigned), cudaMemcpyDeviceToHost);
	cudaFree(d);
	return rc;
}

// Static shared memory, 3 blocks: out[b * 4 + 0] = a[1] before any write (poison), then what
// thread 1 reads after the barrier: a[1], c, and 1 when d is aligned, holds what thread 0 wrote
// and none of the three overlap.
static __global__ void static_smem_kernel(unsigned *out)
{
	__shared__ unsigned a[4];
	__shared__ unsigned char c;
	__shared__ double d[2];
	unsigned *o = out + blockIdx.x * 4;
	if (threadIdx.x == 0) {
		o[0] = a[1];
		a[1] = 7 + blockIdx.x;
		c = (unsigned char)(blockIdx.x + 1);
		d[1] = 0.5;
	}
	__syncthreads();
	if (threadIdx.x == 1) {
		const char *pa = (const char *)a, *pc = (const char *)&c, *pd = (const char *)d;
		o[1] = a[1];
		o[2] = c;
		o[3] = (uintptr_t)d % alignof(double) == 0 && d[1] == 0.5 &&
		       (pc < pa || pc >= pa + sizeof(a)) &&
		       (pd + sizeof(d) <= pa || pd >= pa + sizeof(a)) &&
		       (pc < pd || pc >= pd + sizeof(d));
	}
}

extern "C" int emu_static_smem(unsigned *out)
{
	unsigned *d;
	if (cudaMalloc(&d, 12 * sizeof(unsigned)))
		return -1;
	static_smem_kernel<<<3, 64>>>(d);
	int rc = cudaGetLastError();
	if (!rc)
		rc = cudaMemcpy(out, d, 12 * sizeof(unsigned), cudaMemcpyDeviceToHost);
	cudaFree(d);
	return rc;
}

// 32 KiB of static shared memory and `dyn` bytes of dynamic.
static __global__ void smem_total_kernel(float *out)
{
	__shared__ float st[8192];
	extern __shared__ float dy[];
	st[threadIdx.x] = 1.0f;
	dy[threadIdx.x] = 2.0f;
	__syncthreads();
	out[threadIdx.x] = st[threadIdx.x] + dy[31 - threadIdx.x];
}

extern "C" int emu_smem_total(size_t dyn, int set_attr, float *out)
{
	float *d;
	if (cudaMalloc(&d, 32 * sizeof(float)))
		return -1;
	if (set_attr && cudaFuncSetAttribute(smem_total_kernel,
					     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn))
		return -2;
	smem_total_kernel<<<1, 32, dyn>>>(d);
	int rc = cudaGetLastError();
	if (!rc)
		rc = cudaDeviceSynchronize();
	if (!rc)
		rc = cudaMemcpy(out, d, 32 * sizeof(float), cudaMemcpyDeviceToHost);
	cudaFree(d);
	return rc;
}

// Writes a[i] of a 4-element static shared array; *b_after = the next variable after it.
static __global__ void smem_overflow_kernel(unsigned *out, int i)
{
	__shared__ unsigned a[4];
	__shared__ unsigned b;
	if (threadIdx.x == 0) {
		b = 5;
		unsigned *p = a; // through a pointer: UBSan's bounds check would see a[i] first
		p[i] = 9;
		out[0] = b;
	}
}

extern "C" int emu_smem_overflow(int i, unsigned *b_after)
{
	unsigned *d;
	if (cudaMalloc(&d, sizeof(unsigned)))
		return -1;
	smem_overflow_kernel<<<1, 32>>>(d, i);
	int rc = cudaGetLastError();
	if (!rc)
		rc = cudaMemcpy(b_after, d, sizeof(unsigned), cudaMemcpyDeviceToHost);
	cudaFree(d);
	return rc;
}

extern "C" int emu_fresh_memory(unsigned char *first_byte)
{
	unsigned char *d;
	if (cudaMalloc(&d, 4096))
		return -1;
	int rc = cudaMemcpy(first_byte, d + 4000, 1, cudaMemcpyDeviceToHost);
	cudaFree(d);
	return rc;
}

// ---- faults (each on its own device: a fault is sticky) ----
static __global__ void divergent_barrier_kernel(int *out)
{
	int v = threadIdx.x;
	if (threadIdx.x % 2)
		__syncthreads();
	out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, 1);
}

static __global__ void partial_warp_kernel(int *out)
{
	out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

static __global__ void exited_lane_kernel(int *out)
{
	if (threadIdx.x == 5)
		return;
	out[threadIdx.x] = __shfl_down_sync(0xffffffffu, (int)threadIdx.x, 1);
}

static __global__ void big_static_smem_kernel(int *out)
{
	__shared__ int big[12289]; // 4 bytes over 48 KiB
	big[threadIdx.x] = (int)threadIdx.x;
	__syncthreads();
	out[threadIdx.x] = big[63 - threadIdx.x];
}

static __global__ void mixed_ops_kernel(int *out)
{
	int v = threadIdx.x;
	if (threadIdx.x < 16)
		v = __shfl_xor_sync(0xffffffffu, v, 1);
	else
		v = __shfl_down_sync(0xffffffffu, v, 1);
	out[threadIdx.x] = v;
}

// nvcuda::wmma misuse: a misaligned pointer, an ldm that is not 16 bytes, lanes at different
// wmma operations.
static __global__ void wmma_fault_kernel(int *out, int which)
{
	using namespace nvcuda;
	wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
	wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
	wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
	wmma::fill_fragment(fa, __float2half_rn(1.f));
	wmma::fill_fragment(fb, __float2half_rn(1.f));
	wmma::fill_fragment(fc, 0.f);
	if (which == EMU_FAULT_WMMA_ALIGN)
		wmma::load_matrix_sync(fa, (const __half *)out + 8, 16);
	else if (which == EMU_FAULT_WMMA_LDM)
		wmma::load_matrix_sync(fa, (const __half *)out, 12);
	else if (threadIdx.x < 16)
		wmma::mma_sync(fc, fa, fb, fc);
	else
		__syncwarp();
}

// Launches the fault kernel `which` on the current device; returns what the next
// synchronization reports (cudaErrorLaunchFailure expected) and, in *after, what a later
// unrelated call on the device reports (the fault is sticky).
extern "C" int emu_fault_kernel(int which, int *after)
{
	cudaGetLastError(); // the thread's last error may be another device's
	int *d;
	if (cudaMalloc(&d, 64 * sizeof(int)))
		return -1;
	switch (which) {
	case EMU_FAULT_DIVERGENT_BARRIER:
		divergent_barrier_kernel<<<1, 64>>>(d);
		break;
	case EMU_FAULT_PARTIAL_WARP:
		partial_warp_kernel<<<1, 48>>>(d);
		break;
	case EMU_FAULT_EXITED_LANE:
		exited_lane_kernel<<<1, 32>>>(d);
		break;
	case EMU_FAULT_MIXED_OPS:
		mixed_ops_kernel<<<1, 32>>>(d);
		break;
	case EMU_FAULT_STATIC_SMEM:
		big_static_smem_kernel<<<1, 64>>>(d);
		break;
	case EMU_FAULT_SMEM_TOTAL: // 32 KiB static + 20 KiB dynamic, no attribute: over 48 KiB
		smem_total_kernel<<<1, 32, 20 << 10>>>((float *)d);
		break;
	case EMU_FAULT_WMMA_ALIGN:
	case EMU_FAULT_WMMA_LDM:
	case EMU_FAULT_WMMA_DIVERGENT:
		wmma_fault_kernel<<<1, 32>>>(d, which);
		break;
	}
	int launch = cudaGetLastError();
	int rc = cudaDeviceSynchronize();
	void *p = NULL;
	*after = cudaMalloc(&p, 16);
	cudaFree(p);
	cudaFree(d); // frees even on a faulted device: the host memory behind it is real
	// The kernel runs on the stream's thread: it may fault before cudaGetLastError above is
	// called, which then reports that asynchronous fault (as on a GPU, any later call may).
	if (launch == cudaErrorLaunchFailure)
		return launch;
	return launch ? -launch : rc;
}

// ---- launch limits ----
static __global__ void nop_kernel(int *out)
{
	if (out)
		out[0] = 1;
}

extern "C" int emu_launch_config(unsigned gx, unsigned gy, unsigned gz, unsigned bx)
{
	cudaGetLastError();
	dim3 grid(gx, gy, gz);
	nop_kernel<<<grid, bx>>>(nullptr);
	int rc = cudaGetLastError();
	int s = cudaDeviceSynchronize();
	return rc ? rc : s;
}

// A kernel launched on a stream of device `other` while device `cur` is current.
extern "C" int emu_wrong_device_stream(int cur, int other)
{
	cudaStream_t s;
	if (cudaSetDevice(other) || cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking))
		return -1;
	cudaSetDevice(cur);
	nop_kernel<<<1, 32, 0, s>>>(nullptr);
	int rc = cudaGetLastError();
	cudaSetDevice(other);
	cudaStreamDestroy(s);
	cudaSetDevice(cur);
	return rc;
}

// ---- copies ----

// kind 0: H2D into a host pointer (refused, device unharmed); 1: D2H reading past the end of an
// allocation (the device faults). Returns the call's error; *after: a later cudaMalloc's.
extern "C" int emu_bad_copy(int kind, int *after)
{
	char host[64] = {0}, *d;
	if (cudaMalloc(&d, 32))
		return -1;
	int rc = kind == 0 ? cudaMemcpy(host + 32, host, 16, cudaMemcpyHostToDevice)
			   : cudaMemcpy(host, d + 16, 32, cudaMemcpyDeviceToHost);
	void *p = NULL;
	*after = cudaMalloc(&p, 16);
	cudaFree(p);
	cudaFree(d);
	return rc;
}

// Pageable destination: cudaMemcpyAsync D2H returns with the bytes there (no sync).
extern "C" int emu_pageable_d2h(void)
{
	cudaStream_t s;
	int *d, v = 0;
	const int want = 1234567;
	if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) || cudaMalloc(&d, 4))
		return -1;
	int rc = cudaMemcpyAsync(d, &want, 4, cudaMemcpyHostToDevice, s);
	if (!rc)
		rc = cudaMemcpyAsync(&v, d, 4, cudaMemcpyDeviceToHost, s);
	cudaStreamDestroy(s);
	cudaFree(d);
	return rc ? rc : v == want ? 0 : 1;
}

// ---- jitter (KVK_EMU_JITTER) ----

// A race on purpose: thread 0 writes its block's tag v + 16 * block, the others read it with no
// barrier between. out[b * nt + t] = what thread t of block b read (0xffffffff when it came
// first: static shared memory is poisoned for every block); out[nb * nt + b] = block b's turn
// among the grid's blocks (a plain counter: blocks run one after another in the emulation).
static __global__ void race_kernel(int *out, int *turn, int v)
{
	__shared__ int tag;
	int t = threadIdx.x, b = blockIdx.x, nt = blockDim.x;
	if (t == 0)
		tag = v + 16 * b;
	out[b * nt + t] = tag;
	if (t == 0)
		out[gridDim.x * nt + b] = (*turn)++;
}

extern "C" int emu_jitter_race(unsigned long long seed, int nt, int nb, int *out)
{
	int *d, zero = 0, n = nt * nb + nb;
	if (cudaMalloc(&d, (n + 1) * sizeof(int)) ||
	    cudaMemcpy(d + n, &zero, sizeof(int), cudaMemcpyHostToDevice))
		return -1;
	cudaGetLastError(); // an earlier test's error, on this thread
	kvk_emu_set_jitter(seed);
	race_kernel<<<nb, nt>>>(d, d + n, (int)(1000 + seed));
	kvk_emu_set_jitter(0);
	int rc = cudaGetLastError();
	if (!rc)
		rc = cudaMemcpy(out, d, n * sizeof(int), cudaMemcpyDeviceToHost);
	cudaFree(d);
	return rc;
}

// ---- streams and events -------------------------------------------------------------------------
static __global__ void slow_write_kernel(int *p, int v)
{
	usleep(100 * 1000); // host call: the emulator only
	*p = v;
}

// Stream a: a slow kernel writes 42; stream b waits for a's event, then copies the value out.
// Returns what b copied (42 when the wait orders them).
extern "C" int emu_event_order(void)
{
	cudaStream_t a, b;
	cudaEvent_t ev;
	int *src, *dst, out = -1, zero = 0;
	if (cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) ||
	    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) ||
	    cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) || cudaMalloc(&src, 4) ||
	    cudaMalloc(&dst, 4))
		return -1;
	cudaMemcpy(src, &zero, 4, cudaMemcpyHostToDevice);
	slow_write_kernel<<<1, 1, 0, a>>>(src, 42);
	cudaEventRecord(ev, a);
	cudaStreamWaitEvent(b, ev, 0);
	cudaMemcpyAsync(dst, src, 4, cudaMemcpyDeviceToDevice, b);
	cudaStreamSynchronize(b);
	cudaMemcpy(&out, dst, 4, cudaMemcpyDeviceToHost);
	cudaEventDestroy(ev);
	cudaStreamDestroy(a);
	cudaStreamDestroy(b);
	cudaFree(src);
	cudaFree(dst);
	return out;
}

// ---- cuBLAS ----

// C (2 x 3, col-major) = A^T (A stored 4 x 2, lda 4) * B (4 x 3, ldb 5) in f32.
extern "C" int emu_gemm(float *c_out)
{
	const float A[8] = {1, 2, 3, 4, 5, 6, 7, 8}; // columns (1 2 3 4), (5 6 7 8)
	const float B[15] = {1, 0, 0, 0, -9, 0, 1, 0, 0, -9, 1, 1, 1, 1, -9}; // ldb 5
	float *a, *b, *c;
	cublasHandle_t h;
	if (cudaMalloc(&a, sizeof(A)) || cudaMalloc(&b, sizeof(B)) || cudaMalloc(&c, 6 * 4) ||
	    cublasCreate(&h))
		return -1;
	cudaMemcpy(a, A, sizeof(A), cudaMemcpyHostToDevice);
	cudaMemcpy(b, B, sizeof(B), cudaMemcpyHostToDevice);
	const float one = 1.f, zero = 0.f;
	int st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 3, 4, &one, a, CUDA_R_32F, 4, b,
			      CUDA_R_32F, 5, &zero, c, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F,
			      CUBLAS_GEMM_DEFAULT);
	int rc = st ? 1000 + st : cudaMemcpy(c_out, c, 6 * 4, cudaMemcpyDeviceToHost);
	cublasDestroy(h);
	cudaFree(a), cudaFree(b), cudaFree(c);
	return rc;
}

// kind 0: lda below the rows of A (status INVALID_VALUE); 1: B smaller than m, n, k and ldb
// say (status SUCCESS, then the device faults). Returns the status; *sync: the next
// synchronization's error.
// ---- tensor cores (mma.h) ----------------------------------------------------------------------
static __global__ void wmma_f16_kernel(float *d, const __half *a, const __half *b, const float *c)
{
	using namespace nvcuda;
	wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
	wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
	wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
	wmma::load_matrix_sync(fa, a, 24);
	wmma::load_matrix_sync(fb, b, 16);
	wmma::load_matrix_sync(fc, c, 16, wmma::mem_col_major);
	wmma::mma_sync(fc, fa, fb, fc);
	wmma::store_matrix_sync(d, fc, 20, wmma::mem_row_major);
}

static __global__ void wmma_bf16_kernel(float *d, const __nv_bfloat16 *a, const __nv_bfloat16 *b)
{
	using namespace nvcuda;
	wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
	wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
	wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
	wmma::fill_fragment(fc, 0.f);
	wmma::load_matrix_sync(fa, a, 16);
	wmma::load_matrix_sync(fb, b, 16);
	wmma::mma_sync(fc, fa, fb, fc);
	wmma::store_matrix_sync(d, fc, 16, wmma::mem_col_major);
}

extern "C" int emu_wmma(int bf16, const float *a, const float *b, const float *c, float *d)
{
	unsigned short ha[16 * 24] = {}, hb[256];
	float hc[256];
	for (int r = 0; r < 16; r++)
		for (int k = 0; k < 16; k++) {
			float av = a[r * 16 + k], bv = b[r * 16 + k]; // b[k = r][n = k]
			if (bf16) {
				ha[r * 16 + k] = __float2bfloat16(av).x;
				hb[r * 16 + k] = __float2bfloat16(bv).x;
			} else {
				ha[r * 24 + k] = __float2half_rn(av).x;
				hb[k * 16 + r] =
				    __float2half_rn(bv).x; // col_major: b[k][n] at n*16+k
				hc[k * 16 + r] = c[r * 16 + k];
			}
		}
	void *da, *db, *dc;
	float *dd;
	if (cudaMalloc(&da, sizeof(ha)) || cudaMalloc(&db, sizeof(hb)) ||
	    cudaMalloc(&dc, sizeof(hc)) || cudaMalloc((void **)&dd, 16 * 20 * sizeof(float)))
		return -1;
	cudaMemcpy(da, ha, sizeof(ha), cudaMemcpyHostToDevice);
	cudaMemcpy(db, hb, sizeof(hb), cudaMemcpyHostToDevice);
	cudaMemcpy(dc, hc, sizeof(hc), cudaMemcpyHostToDevice);
	if (bf16)
		wmma_bf16_kernel<<<1, 32>>>(dd, (const __nv_bfloat16 *)da,
					    (const __nv_bfloat16 *)db);
	else
		wmma_f16_kernel<<<1, 32>>>(dd, (const __half *)da, (const __half *)db,
					   (const float *)dc);
	// d's padding (never stored) reads as the emulator's 0xff fill
	int rc = cudaMemcpy(d, dd, 16 * 20 * sizeof(float), cudaMemcpyDeviceToHost);
	cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dd);
	return rc;
}

extern "C" int emu_bad_gemm(int kind, int *sync)
{
	float *a, *b, *c;
	cublasHandle_t h;
	if (cudaMalloc(&a, 64 * 4) || cudaMalloc(&b, 64 * 4) || cudaMalloc(&c, 64 * 4) ||
	    cublasCreate(&h))
		return -1;
	const float one = 1.f, zero = 0.f;
	int st = kind == 0 ? cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, a, CUDA_R_32F,
					  4, b, CUDA_R_32F, 8, &zero, c, CUDA_R_32F, 8,
					  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
			   : cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, a, CUDA_R_32F,
					  8, b, CUDA_R_32F, 9, &zero, c, CUDA_R_32F, 8,
					  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
	*sync = cudaDeviceSynchronize();
	cublasDestroy(h);
	cudaFree(a), cudaFree(b), cudaFree(c);
	return st;
}

// ---- NCCL ----
struct nccl_rank {
	ncclUniqueId id;
	int rank, device, bytes, rc, send;
	int abort_after_ms; // > 0: this rank posts nothing; the other is aborted after this long
	ncclComm_t *peer_comm;
	unsigned char val;
	int aborted_by_peer; // its communicator is freed by the abort: not destroyed again
};

static void *nccl_rank_main(void *p)
{
	nccl_rank *r = (nccl_rank *)p;
	ncclComm_t comm;
	cudaSetDevice(r->device);
	cudaStream_t s;
	unsigned char *d;
	if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) || cudaMalloc(&d, 4096)) {
		r->rc = -1;
		return NULL;
	}
	r->rc = ncclCommInitRank(&comm, 2, r->id, r->rank);
	if (r->rc) {
		cudaFree(d);
		cudaStreamDestroy(s);
		return NULL;
	}
	if (r->abort_after_ms) {
		usleep((useconds_t)r->abort_after_ms * 1000);
		// the peer publishes its communicator after its init returns: on a loaded machine
		// that can come after the sleep
		ncclComm_t peer;
		while (!(peer = __atomic_load_n(r->peer_comm, __ATOMIC_ACQUIRE)))
			usleep(1000);
		ncclCommAbort(peer);
		ncclCommDestroy(comm);
		r->rc = 0;
	} else {
		__atomic_store_n(r->peer_comm, comm, __ATOMIC_RELEASE);
		if (r->send)
			cudaMemsetAsync(d, r->val, r->bytes, s);
		r->rc = r->send ? ncclSend(d, r->bytes, ncclUint8, 1 - r->rank, comm, s)
				: ncclRecv(d, r->bytes, ncclUint8, 1 - r->rank, comm, s);
		int e = cudaStreamSynchronize(s);
		if (!r->rc)
			r->rc = e ? 1000 + e : 0;
		unsigned char got = 0;
		if (!r->rc && !r->send)
			cudaMemcpy(&got, d + r->bytes - 1, 1, cudaMemcpyDeviceToHost);
		r->val = got;
		if (!r->aborted_by_peer)
			ncclCommDestroy(comm);
	}
	cudaFree(d);
	cudaStreamDestroy(s);
	return NULL;
}

// mode 0: 100 bytes of 0x5a from rank 1 (device d1) to rank 0 (device d0); returns 0 and the
// byte received in *got. mode 1: the sizes differ (100 vs 99): returns the receiver's result.
// mode 2: rank 1 posts nothing and aborts rank 0's communicator after 200 ms: returns rank
// 0's result (its receive must end). mode 3: both ranks on device d0: ncclCommInitRank's
// result.
extern "C" int emu_nccl(int mode, int d0, int d1, int *got)
{
	ncclUniqueId id;
	ncclGetUniqueId(&id);
	ncclComm_t c0 = NULL, c1 = NULL;
	nccl_rank r0 = {id, 0, d0, 100, -99, 0, 0, &c0, 0, mode == 2};
	nccl_rank r1 = {id, 1, mode == 3 ? d0 : d1, mode == 1 ? 99 : 100, -99, 1, 0, &c1, 0x5a, 0};
	if (mode == 2) {
		r1.abort_after_ms = 200;
		r1.peer_comm = &c0;
	}
	pthread_t t0, t1;
	pthread_create(&t0, NULL, nccl_rank_main, &r0);
	pthread_create(&t1, NULL, nccl_rank_main, &r1);
	pthread_join(t0, NULL);
	pthread_join(t1, NULL);
	*got = r0.val;
	if (mode == 3)
		return r0.rc ? r0.rc : r1.rc;
	return r0.rc;
}

// ---- NCCL between processes ------------------------------------------------------------------
extern "C" int emu_nccl_id(char *hex /* 2 * 128 + 1 */)
{
	ncclUniqueId id;
	if (ncclGetUniqueId(&id))
		return -1;
	for (size_t i = 0; i < sizeof(id.internal); i++)
		snprintf(hex + 2 * i, 3, "%02x", (unsigned char)id.internal[i]);
	return 0;
}

// One rank of a 2-rank communicator named by hex: sends `bytes` bytes of `val` to the other
// rank, or receives them and stores the last byte in *got.
extern "C" int emu_nccl_rank(const char *hex, int rank, int bytes, int send, int val, int *got)
{
	ncclUniqueId id;
	for (size_t i = 0; i < sizeof(id.internal); i++) {
		unsigned v = 0;
		if (sscanf(hex + 2 * i, "%2x", &v) != 1)
			return -1;
		id.internal[i] = (char)v;
	}
	cudaStream_t s;
	unsigned char *d;
	ncclComm_t comm;
	if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) || cudaMalloc(&d, (size_t)bytes))
		return -1;
	int rc = ncclCommInitRank(&comm, 2, id, rank);
	if (!rc) {
		if (send)
			cudaMemsetAsync(d, val, (size_t)bytes, s);
		rc = send ? ncclSend(d, (size_t)bytes, ncclUint8, 1 - rank, comm, s)
			  : ncclRecv(d, (size_t)bytes, ncclUint8, 1 - rank, comm, s);
		int e = cudaStreamSynchronize(s);
		rc = rc ? rc : e ? 1000 + e : 0;
		unsigned char last = 0;
		if (!rc && !send && cudaMemcpy(&last, d + bytes - 1, 1, cudaMemcpyDeviceToHost))
			rc = -2;
		*got = last;
		ncclCommDestroy(comm);
	}
	cudaFree(d);
	cudaStreamDestroy(s);
	return rc;
}
