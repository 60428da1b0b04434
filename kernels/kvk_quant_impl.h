/* Private interface of the quantized weight types Q4_0, Q4_K, Q5_K, Q6_K (kvk_quant.c, the
 * scalar reference and block formats; kvk_matmul_kq_avx2.c, the AVX2 kernels;
 * kvk_matmul_kq_avx512.c, AVX-512 + VNNI). kernels/ only.
 *
 * Block layouts are GGML's, byte for byte (docs/gguf.md), so a llama.cpp file loads:
 *   Q4_0 (32 values, 18 B): f16 d; u8 qs[16]. v[i] = d * ((qs[i] & 15) - 8),
 *        v[i + 16] = d * ((qs[i] >> 4) - 8), i < 16.
 *   Q5_0 (32 values, 22 B): f16 d; u8 qh[4] (32 bits, little-endian); u8 qs[16]. As Q4_0 with
 *        bit i of qh as 16 for value i: v = d * (q - 16), q 0..31.
 *   Q5_1 (32 values, 24 B): f16 d, f16 m; qh[4]; qs[16]. v = d * q + m.
 *   Q4_K (256 values, 144 B): f16 d, f16 dmin; u8 scales[12]; u8 qs[128]. Eight sub-blocks of
 *        32 with a 6-bit scale sc and 6-bit min m each (kvk_kq_scale_min): v = d*sc*q - dmin*m.
 *        Sub-blocks 2j and 2j+1 are the low and high nibbles of qs[32j .. 32j+31].
 *   Q5_K (256 values, 176 B): f16 d, f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]. As Q4_K
 *        with a fifth bit: sub-block s takes bit s of qh[i] as 16.
 *   Q6_K (256 values, 210 B): u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d. Sixteen groups of
 *        16 with an int8 scale each: v = d * sc * (q - 32), q 6 bits (4 in ql, 2 in qh).
 *
 * Activations (all these types): per token, int8 q[n] in blocks of 32 with a float scale dx and
 * the float dx * sum(q) of each block (for the K-quant mins), laid out as int8 q[ntok][n], then
 * (32-byte aligned) float d[ntok][n / 32], then float s[ntok][n / 32]. Blocks of 32 (not
 * llama.cpp's Q8_K blocks of 256) keep the activation error per block of each weight scale. */
#ifndef KVFS_KVK_QUANT_IMPL_H
#define KVFS_KVK_QUANT_IMPL_H

#include "kvk.h"

#define KVK_QK	       256 /* K-quant super-block */
#define KVK_Q4_0_BYTES 18
#define KVK_Q5_0_BYTES 22
#define KVK_Q5_1_BYTES 24
#define KVK_Q4_K_BYTES 144
#define KVK_Q5_K_BYTES 176
#define KVK_Q6_K_BYTES 210

/* 1 for Q4_0, Q4_K, Q5_K, Q6_K. */
static inline int kvk_wtype_kq(enum kvk_wtype wt)
{
	return wt == KVK_W_Q4_0 || wt == KVK_W_Q5_0 || wt == KVK_W_Q5_1 || wt == KVK_W_Q4_K ||
	       wt == KVK_W_Q5_K || wt == KVK_W_Q6_K;
}

static inline size_t kvk_kqact_qbytes(size_t n, size_t ntok)
{
	return (n * ntok + 31) & ~(size_t)31;
}

/* Scale and min of sub-block j (0..7) from the 12 packed bytes of a Q4_K/Q5_K block: j < 4
 * in the low 6 bits of bytes j and j + 4; j >= 4 in the nibbles of byte j + 4 with the top
 * two bits in the high bits of bytes j - 4 and j. */
static inline void kvk_kq_scale_min(int j, const uint8_t *q, int *sc, int *m)
{
	if (j < 4) {
		*sc = q[j] & 63;
		*m = q[j + 4] & 63;
	} else {
		*sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
		*m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
	}
}

size_t kvk_kq_row_bytes(enum kvk_wtype wt, size_t n);
void kvk_kq_row_to_f32(enum kvk_wtype wt, const void *row, size_t n, float *out);
/* Element i of a row (the same value kvk_kq_row_to_f32 gives; for per-element readers). */
float kvk_kq_value(enum kvk_wtype wt, const void *row, size_t i);
void kvk_kq_act_prepare(void *act, size_t ntok, const float *x, size_t ldx, size_t n, size_t t0,
			size_t t1);
/* Scalar reference: the contract every other ISA is tested against. */
void kvk_kq_matmul_scalar(enum kvk_wtype wt, float *y, size_t ldy, const void *w, size_t n,
			  size_t r0, size_t r1, const void *act, size_t ntok);
#if defined(__x86_64__) || defined(__i386__)
void kvk_kq_matmul_avx2(enum kvk_wtype wt, float *y, size_t ldy, const void *w, size_t n, size_t r0,
			size_t r1, const void *act, size_t ntok);
/* AVX-512 + VNNI (kvk_matmul_kq_avx512.c): every type above; -ENOTSUP (nothing written) for
 * any other, which the caller then runs on the AVX2 kernels. */
int kvk_kq_matmul_avx512(enum kvk_wtype wt, float *y, size_t ldy, const void *w, size_t n,
			 size_t r0, size_t r1, const void *act, size_t ntok);
#endif

#endif
