// kvk_emu's cuBLAS: the handle calls and cublasGemmEx for the types kernels/cuda uses
// (F16/BF16/F32 inputs, F32 output and compute), column-major as cuBLAS, with cuBLAS's own
// argument rules (status INVALID_VALUE / NOT_SUPPORTED) and, beyond them, a check that every
// operand lies in device memory (else the device's sticky error, as the fault would be).
#ifndef KVFS_KVK_EMU_CUBLAS_V2_H
#define KVFS_KVK_EMU_CUBLAS_V2_H

#include "cuda_runtime.h"

typedef enum {
	CUBLAS_STATUS_SUCCESS = 0,
	CUBLAS_STATUS_NOT_INITIALIZED = 1,
	CUBLAS_STATUS_ALLOC_FAILED = 3,
	CUBLAS_STATUS_INVALID_VALUE = 7,
	CUBLAS_STATUS_EXECUTION_FAILED = 13,
	CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;

typedef enum {
	CUBLAS_OP_N = 0,
	CUBLAS_OP_T = 1,
	CUBLAS_OP_C = 2,
} cublasOperation_t;

typedef enum {
	CUBLAS_COMPUTE_32F = 68,
} cublasComputeType_t;

typedef enum {
	CUBLAS_GEMM_DEFAULT = -1,
} cublasGemmAlgo_t;

typedef struct cublasContext *cublasHandle_t;

extern "C" {
cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes);
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb,
			    int m, int n, int k, const void *alpha, const void *A,
			    cudaDataType_t Atype, int lda, const void *B, cudaDataType_t Btype,
			    int ldb, const void *beta, void *C, cudaDataType_t Ctype, int ldc,
			    cublasComputeType_t compute, cublasGemmAlgo_t algo);
}

#endif
