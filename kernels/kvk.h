/* kvk — compute kernels for the engine: CPU reference implementations, and CUDA versions with
 * the same signature when the build found nvcc.
 *
 * CPU functions are pure (no allocation, no global state) and thread-safe on disjoint outputs.
 * CUDA entry points (kvk_cuda_*) take host pointers, copy in, run the kernel and copy out; they
 * exist for testing each kernel against its CPU reference. They return 0, or -ENODEV when the
 * build has no CUDA or the machine has no GPU, or -EIO on a CUDA error (logged).
 */
#ifndef KVFS_KVK_H
#define KVFS_KVK_H

#include <stddef.h>

/* out[r][i] = x[r][i] / sqrt(mean(x[r]^2) + eps) * w[i], for rows r < nrows, i < n.
 * out may alias x. n > 0. */
void kvk_rmsnorm_f32(float *out, const float *x, const float *w, size_t n, size_t nrows,
		     float eps);

/* 1 if this build has CUDA kernels and a GPU answers, else 0. */
int kvk_cuda_available(void);

/* CUDA version of kvk_rmsnorm_f32 (host pointers). */
int kvk_cuda_rmsnorm_f32(float *out, const float *x, const float *w, size_t n, size_t nrows,
			 float eps);

#endif
