// The emulated cuBLAS (cublas_v2.h): a handle bound to the device current at its creation,
// and cublasGemmEx computed on the handle's stream in f32, column-major with cuBLAS's
// operations and leading dimensions. Argument rules as cuBLAS documents them; operands are
// also checked against device memory, where the GPU would fault instead.
#include <stdio.h>

#include <vector>

#include "cublas_v2.h"

struct cublasContext {
	int device;
	cudaStream_t stream;
	void *ws;
	size_t ws_bytes;
};

static int current_device(void)
{
	int d = -1;
	cudaGetDevice(&d);
	return d;
}

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
	int n = 0;
	*h = nullptr;
	if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	*h = new cublasContext{current_device(), nullptr, nullptr, 0};
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h)
{
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	cudaStreamSynchronize(h->stream); // cuBLAS waits for its work
	delete h;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	int d = kvk_emu_stream_device(s);
	if (d != h->device) {
		fprintf(stderr,
			"kvk-emu: cublasSetStream: stream of device %d for a handle of "
			"device %d\n",
			d, h->device);
		return CUBLAS_STATUS_INVALID_VALUE;
	}
	h->stream = s;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes)
{
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	int d = -1;
	if (bytes && (!kvk_emu_is_device(ws, bytes, &d) || d != h->device || (uintptr_t)ws % 256)) {
		fprintf(stderr,
			"kvk-emu: cublasSetWorkspace: %p + %zu is not 256-byte aligned "
			"device memory of device %d\n",
			ws, bytes, h->device);
		return CUBLAS_STATUS_INVALID_VALUE;
	}
	h->ws = ws;
	h->ws_bytes = bytes;
	return CUBLAS_STATUS_SUCCESS;
}

static size_t type_size(cudaDataType_t t)
{
	return t == CUDA_R_32F ? 4 : t == CUDA_R_16F || t == CUDA_R_16BF ? 2 : 0;
}

static float load(const void *p, cudaDataType_t t, size_t i)
{
	if (t == CUDA_R_32F)
		return ((const float *)p)[i];
	uint16_t h = ((const uint16_t *)p)[i];
	if (t == CUDA_R_16BF) {
		uint32_t u = (uint32_t)h << 16;
		float f;
		memcpy(&f, &u, 4);
		return f;
	}
	_Float16 v;
	memcpy(&v, &h, 2);
	return (float)v;
}

// Checks that a stored (rows x cols, ld) operand lies in device memory of the handle's
// device; if not, the device faults (as the GPU would when the kernel reads it).
static bool operand_ok(cublasHandle_t h, const char *name, const void *p, int rows, int cols,
		       int ld, size_t es)
{
	size_t bytes = ((size_t)(cols - 1) * (size_t)ld + (size_t)rows) * es;
	int d = -1;
	if (kvk_emu_is_device(p, bytes, &d) && d == h->device)
		return true;
	kvk_emu_fault(h->device, cudaErrorIllegalAddress,
		      "cublasGemmEx: %s (%d x %d stored, ld %d: %zu bytes from %p) is not inside "
		      "one allocation of device %d",
		      name, rows, cols, ld, bytes, p, h->device);
	return false;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb,
			    int m, int n, int k, const void *alpha, const void *A,
			    cudaDataType_t Atype, int lda, const void *B, cudaDataType_t Btype,
			    int ldb, const void *beta, void *C, cudaDataType_t Ctype, int ldc,
			    cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
	(void)algo;
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (current_device() != h->device) {
		fprintf(stderr,
			"kvk-emu: cublasGemmEx: handle of device %d used while device %d "
			"is current\n",
			h->device, current_device());
		return CUBLAS_STATUS_EXECUTION_FAILED;
	}
	bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
	int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
	if ((transa != CUBLAS_OP_N && transa != CUBLAS_OP_T) ||
	    (transb != CUBLAS_OP_N && transb != CUBLAS_OP_T) || m < 0 || n < 0 || k < 0 ||
	    lda < (ar > 1 ? ar : 1) || ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1))
		return CUBLAS_STATUS_INVALID_VALUE;
	if (Atype != Btype || type_size(Atype) == 0 || Ctype != CUDA_R_32F ||
	    compute != CUBLAS_COMPUTE_32F)
		return CUBLAS_STATUS_NOT_SUPPORTED;
	if (!m || !n)
		return CUBLAS_STATUS_SUCCESS;
	size_t es = type_size(Atype);
	if ((k && (!operand_ok(h, "A", A, ar, ac, lda, es) ||
		   !operand_ok(h, "B", B, br, bc, ldb, es))) ||
	    !operand_ok(h, "C", C, m, n, ldc, 4))
		return CUBLAS_STATUS_SUCCESS; // the fault shows at the next synchronization
	float al = *(const float *)alpha, be = *(const float *)beta; // host pointer mode
	cudaError_t e = kvk_emu_stream_enqueue(h->stream, [=]() {
		// op(A) as m rows of k, op(B) as n columns of k: both dot-product friendly.
		std::vector<float> a((size_t)m * k), b((size_t)n * k);
		for (int i = 0; i < m; i++)
			for (int l = 0; l < k; l++)
				a[(size_t)i * k + l] =
				    load(A, Atype, ta ? l + (size_t)i * lda : i + (size_t)l * lda);
		for (int j = 0; j < n; j++)
			for (int l = 0; l < k; l++)
				b[(size_t)j * k + l] =
				    load(B, Btype, tb ? j + (size_t)l * ldb : l + (size_t)j * ldb);
		float *c = (float *)C;
		for (int j = 0; j < n; j++)
			for (int i = 0; i < m; i++) {
				const float *x = &a[(size_t)i * k], *y = &b[(size_t)j * k];
				float s = 0.f;
				for (int l = 0; l < k; l++)
					s = fmaf(x[l], y[l], s);
				float *o = &c[i + (size_t)j * ldc];
				*o = be != 0.f ? al * s + be * *o : al * s; // beta 0: C is not read
			}
		return cudaSuccess;
	});
	return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
