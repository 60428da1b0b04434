/* Private interface between the ISA-independent matmul front end (kvk_matmul.c) and the
 * per-ISA kernels (kvk_matmul_avx2.c, kvk_matmul_avx512.c: one template, kvk_matmul_x86.inc). Not
 * installed; kernels/ only. */
#ifndef KVFS_KVK_MATMUL_IMPL_H
#define KVFS_KVK_MATMUL_IMPL_H

#include "kvk.h"

/* Q8_0 activations for ntok tokens of n elements: int8 q[ntok][n], then (32-byte aligned)
 * float d[ntok][n / 32], then int32 c[ntok][n / 32]. Token t block b is d[t][b] *
 * q[t][b*32 .. b*32+31]; c[t][b] = -128 * the sum of those 32 q: the AVX-512 kernels feed
 * vpdpbusd w + 128 (unsigned) and start each block's sum from c (exact: sum(w * q)). */
static inline size_t kvk_q8act_qbytes(size_t n, size_t ntok)
{
	return (n * ntok + 31) & ~(size_t)31;
}

static inline size_t kvk_q8act_corr_off(size_t n, size_t ntok)
{
	return kvk_q8act_qbytes(n, ntok) + ntok * (n / 32) * 4;
}

/* kvk_act_prepare for Q8_0 in portable C: the reference the SIMD versions equal byte for
 * byte (tests compare them through kvk_act_prepare, which picks the best ISA). */
void kvk_act_prepare_q8_ref(void *act, size_t ntok, const float *x, size_t ldx, size_t n, size_t t0,
			    size_t t1);

/* One key tile of flash attention (kvk_flash_attn_f16): nt query tokens x G heads (row
 * r = i * G + g: query at q + i * ldq + g * hd, accumulator at o + i * ldo + g * hd, running
 * max m[r] and sum l[r]) against np <= KVK_FLASH_KT keys (key p at k + p * ks, value at
 * v + p * ks halves); token i sees keys p < lim[i] (0: the row is left as it is). kf, vf:
 * (KVK_FLASH_KT + 7) * hd floats each; sc: 4 * KVK_FLASH_KT floats; all 64-byte aligned. */
struct kvk_flash_args {
	const float *q;
	size_t ldq;
	float *o;
	size_t ldo;
	int nt, G, hd, np;
	const int *lim;
	float *m, *l;
	const uint16_t *k, *v;
	size_t ks;
	float scale;
	float *kf, *vf, *sc;
};
typedef void (*kvk_flash_tile_fn)(const struct kvk_flash_args *a);
kvk_flash_tile_fn kvk_flash_tile_get(enum kvk_isa isa);
void kvk_flash_tile_scalar(const struct kvk_flash_args *a);

#if defined(__x86_64__) || defined(__i386__)
#define KVK_HAVE_X86 1
void kvk_flash_tile_avx2(const struct kvk_flash_args *a);
void kvk_flash_tile_avx512(const struct kvk_flash_args *a);
void kvk_matmul_avx2(enum kvk_wtype wt, float *y, size_t ldy, const void *w, size_t n, size_t r0,
		     size_t r1, const void *act, size_t ntok, float *scratch);
float kvk_dot_f16_avx2(const float *a, const uint16_t *b, size_t n);
void kvk_axpy_f16_avx2(float *y, float s, const uint16_t *b, size_t n);
void kvk_qk_f16_avx2(float *sc, size_t ldsc, const float *q, size_t G, size_t hd, const uint16_t *k,
		     size_t ks, size_t np, float scale);
void kvk_av_f16_avx2(float *o, const float *sc, size_t ldsc, size_t G, size_t hd, const uint16_t *v,
		     size_t vs, size_t np);
void kvk_act_prepare_q8_avx2(void *act, size_t ntok, const float *x, size_t ldx, size_t n,
			     size_t t0, size_t t1);
void kvk_matmul_avx512(enum kvk_wtype wt, float *y, size_t ldy, const void *w, size_t n, size_t r0,
		       size_t r1, const void *act, size_t ntok, float *scratch);
float kvk_dot_f16_avx512(const float *a, const uint16_t *b, size_t n);
void kvk_axpy_f16_avx512(float *y, float s, const uint16_t *b, size_t n);
void kvk_qk_f16_avx512(float *sc, size_t ldsc, const float *q, size_t G, size_t hd,
		       const uint16_t *k, size_t ks, size_t np, float scale);
void kvk_av_f16_avx512(float *o, const float *sc, size_t ldsc, size_t G, size_t hd,
		       const uint16_t *v, size_t vs, size_t np);
void kvk_act_prepare_q8_avx512(void *act, size_t ntok, const float *x, size_t ldx, size_t n,
			       size_t t0, size_t t1);
#endif

/* Panel height for the F16/BF16 weight-to-f32 conversion in the batched path. */
#define KVK_PANEL_ROWS 16

#endif
