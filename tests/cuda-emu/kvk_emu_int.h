// Private to tests/cuda-emu: what the runtime (kvk_emu_rt.cc) and the block scheduler
// (kvk_emu_sm.cc) share.
#ifndef KVFS_KVK_EMU_INT_H
#define KVFS_KVK_EMU_INT_H

#include "cuda_runtime.h"

// Runs every block of a grid on the calling thread (a stream's worker), one block at a time.
// Returns cudaSuccess, or the fault of the first block that faulted (already reported: the
// grid stops there).
// jitter: the seed at the launch (0: blocks in order, threads in order until they wait).
// smem_limit: the bytes of static and dynamic shared memory a block of this launch may use.
cudaError_t kvk_emu_run_grid(const char *name, const kvk_emu_cfg &cfg,
			     const std::function<void()> &body, uint64_t jitter, size_t smem_limit);

// KVK_EMU_JITTER=seed (or kvk_emu_set_jitter): 0 when off. When on, streams delay their work
// at random, grids run their blocks in a permuted order and blocks run their threads in a
// random order, so a missing wait or a race between barriers changes what a test sees.
uint64_t kvk_emu_jitter(void);

// A step of xorshift64* (state must not be 0).
static inline uint64_t kvk_emu_rand(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dull;
}

#endif
