// kvk_emu's NCCL: unique ids, communicators and point-to-point send/recv between the ranks of
// one process (the ranks' devices must differ, as NCCL requires). A send meets the receive of
// its peer on the streams' workers; sizes that differ are reported and become both devices'
// sticky error. ncclCommAbort releases a send or receive waiting for its peer. Ranks may be
// threads of one process or separate processes (kvk_emu_nccl.cc: Unix sockets).
#ifndef KVFS_KVK_EMU_NCCL_H
#define KVFS_KVK_EMU_NCCL_H

#include "cuda_runtime.h"

typedef enum {
	ncclSuccess = 0,
	ncclUnhandledCudaError = 1,
	ncclSystemError = 2,
	ncclInternalError = 3,
	ncclInvalidArgument = 4,
	ncclInvalidUsage = 5,
	ncclRemoteError = 6,
} ncclResult_t;

typedef enum {
	ncclInt8 = 0,
	ncclUint8 = 1,
	ncclInt32 = 2,
	ncclFloat16 = 6,
	ncclFloat32 = 7,
} ncclDataType_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
	char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef struct ncclComm *ncclComm_t;

extern "C" {
ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
		      cudaStream_t stream);
ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
		      cudaStream_t stream);
const char *ncclGetErrorString(ncclResult_t r);
}

#endif
