/* The entry points of tests/test_kvk_emu.cu (the CUDA emulation's self-test), called by
 * tests/test_kvk_emu_main.c. Each returns 0 or a CUDA / cuBLAS / NCCL status (a few: -1 when
 * the setup itself failed). */
#ifndef KVFS_TEST_KVK_EMU_H
#define KVFS_TEST_KVK_EMU_H

#include <stddef.h>

enum {
	EMU_FAULT_DIVERGENT_BARRIER = 1,
	EMU_FAULT_PARTIAL_WARP,
	EMU_FAULT_EXITED_LANE,
	EMU_FAULT_MIXED_OPS,
	EMU_FAULT_STATIC_SMEM,
	EMU_FAULT_SMEM_TOTAL,
	EMU_FAULT_WMMA_ALIGN,	  /* load_matrix_sync from a pointer not 32-byte aligned */
	EMU_FAULT_WMMA_LDM,	  /* ldm of 12 halves (24 bytes) */
	EMU_FAULT_WMMA_DIVERGENT, /* half the warp at mma_sync, half at __syncwarp */
};

int emu_shuffles(int *out /* 64 * 8 */);
int emu_reduce(int *out /* 2 * nb */, int nb);
int emu_dyn_smem(unsigned *out /* 2 */, size_t bytes, int set_attr);
/* static_smem_kernel on 3 blocks; out: 12 unsigned. */
int emu_static_smem(unsigned *out);
/* 32 KiB of static shared memory plus dyn bytes of dynamic; out: 32 floats (3 each). */
int emu_smem_total(size_t dyn, int set_attr, float *out);
/* Writes element i of a 4-element static shared array; *b_after: the variable after it. */
int emu_smem_overflow(int i, unsigned *b_after);
int emu_fresh_memory(unsigned char *first_byte);
int emu_fault_kernel(int which, int *after);
int emu_launch_config(unsigned gx, unsigned gy, unsigned gz, unsigned bx);
int emu_wrong_device_stream(int cur, int other);
int emu_bad_copy(int kind, int *after);
int emu_pageable_d2h(void);
int emu_event_order(void);
int emu_gemm(float *c /* 2 x 3 column-major */);
/* One m16n16k16 wmma product d = a b + c on a warp. bf16 0: f16 a (row_major, ldm 24) and b
 * (col_major, ldm 16: b[k][n] at b[n * 16 + k]), c loaded col_major (c[m][n] at c[n * 16 + m]),
 * d stored row_major with ldm 20 (d[m][n] at d[m * 20 + n]); bf16 1: bf16 a and b both
 * row_major (ldm 16), c = 0 by fill_fragment, d stored col_major (ldm 16). a, b, c: f32
 * values given row-major 16 x 16, rounded to the input type; d: 16 * 20 floats. */
int emu_wmma(int bf16, const float *a, const float *b, const float *c, float *d);
int emu_bad_gemm(int kind, int *sync);
/* race_kernel with jitter seed (0: off), nt threads, nb blocks; out: (nt + 1) * nb ints. */
int emu_jitter_race(unsigned long long seed, int nt, int nb, int *out);
int emu_nccl(int mode, int d0, int d1, int *got);
int emu_nccl_id(char *hex /* 257 */);
int emu_nccl_rank(const char *hex, int rank, int bytes, int send, int val, int *got);

#endif
