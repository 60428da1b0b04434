// Private to kernels/emu: what the runtime (kvk_emu_rt.cc) and the block scheduler
// (kvk_emu_sm.cc) share.
#ifndef KVFS_KVK_EMU_INT_H
#define KVFS_KVK_EMU_INT_H

#include "cuda_runtime.h"

// Runs every block of a grid on the calling thread (a stream's worker), one block at a time.
// Returns cudaSuccess, or the fault of the first block that faulted (already reported: the
// grid stops there).
cudaError_t kvk_emu_run_grid(const char *name, const kvk_emu_cfg &cfg,
			     const std::function<void()> &body);

#endif
