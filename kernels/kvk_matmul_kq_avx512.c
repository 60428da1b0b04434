/* AVX-512 (F, BW, VL) + AVX512-VNNI kernels for Q4_K and Q6_K weights (layouts and the
 * activation format in kvk_quant_impl.h), called only after cpuid (and the OS's saved state)
 * says the CPU has them (kvk_matmul.c); the other block types stay on the AVX2 kernels.
 *
 * One row at a time, 64 weights per zmm: a Q4_K zmm holds sub-blocks 2c (low 8 lanes, the low
 * nibbles of 32 bytes) and 2c + 1 (high 8 lanes, the high nibbles), a Q6_K zmm two blocks of
 * 32 (four groups of 16). Each zmm of weights is unpacked once and used against up to KQ5_TB
 * tokens: vpdpbusd (unsigned weights 0..63 against the signed activation bytes, on a zero
 * accumulator) gives exact int32 sums of 4 products per lane; Q6_K subtracts 32 * the same
 * lanes' activation sums (vpdpbusd of 32s: exact; the start of
 * each row's vpdpbusd). Each lane is then converted to float and
 * FMA'd into the (row, token) accumulator with its own scale: (d * sc) * dx of the lane's
 * sub-block (Q4_K) or group (Q6_K); the K-quant mins go into an 8-lane accumulator, one FMA per
 * 256 values, as in the AVX2 kernels.
 *
 * Batch invariance: each (row, token) owns one 16-lane accumulator fed the same instruction
 * sequence (zmm 0, 1, ... of its row in order) whatever the tile width, ntok or row range, and
 * ends in one fixed reduction, so a token's result is bit-identical alone or in any batch.
 * Against the scalar reference and the AVX2 kernels only the f32 summation order differs. */
#include "kvk_quant_impl.h"

#if defined(__x86_64__) || defined(__i386__)

#include <errno.h>
#include <immintrin.h>
#include <string.h>

#define K5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define AI __attribute__((always_inline)) inline

/* Register tiles: KQ5_TB_RB rows x KQ5_TB tokens for batches, KQ5_RB rows x 1 token for the
 * rest (decode: independent accumulator chains, one activation load for KQ5_RB rows). */
#define KQ5_TB	  4
#define KQ5_TB_RB 2
#define KQ5_RB	  4
#define KQ5_PANEL 16 /* rows per panel: a panel stays in L1/L2 while every token tile passes */

static K5 AI float f16at(const uint8_t *p)
{
	uint16_t h;
	memcpy(&h, p, 2);
	return _cvtsh_ss(h);
}

/* A fixed reduction order (not _mm512_reduce_add_ps, whose tree is the compiler's). */
static K5 AI float hsum16(__m512 v)
{
	__m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
				 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
	__m128 lo = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
	lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
	lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
	return _mm_cvtss_f32(lo);
}

static K5 AI float hsum8(__m256 v)
{
	__m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
	lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
	return _mm_cvtss_f32(lo);
}

struct kq_tok {
	const int8_t *q;
	const float *d, *s;
	size_t n, nb;
};

/* Index vectors that spread 8 per-block floats over 16 lanes: lanes 0-7 take element 2c,
 * lanes 8-15 element 2c + 1. */
static K5 AI __m512i spread_idx(int c)
{
	__m256i lo = _mm256_set1_epi32(2 * c), hi = _mm256_set1_epi32(2 * c + 1);
	return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* Lanes 0-7 take element a, lanes 8-15 element b. */
static K5 AI __m512i spread_idx2(int a, int b)
{
	return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(a)),
				  _mm256_set1_epi32(b), 1);
}

/* The 8 scales and 8 mins of a Q4_K block as floats (the word-wise unpacking of the AVX2
 * kernel, kvk_matmul_kq_avx2.c scales_k45). */
static K5 AI void scales_k4(const uint8_t *k, __m256 *sc, __m256 *mn)
{
	uint32_t u[3];
	memcpy(u, k, 12);
	uint32_t s_lo = u[0] & 0x3f3f3f3fu, m_lo = u[1] & 0x3f3f3f3fu;
	uint32_t s_hi = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 2) & 0x30303030u);
	uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 2) & 0x30303030u);
	__m128i sv = _mm_cvtsi64_si128((long long)((uint64_t)s_hi << 32 | s_lo));
	__m128i mv = _mm_cvtsi64_si128((long long)((uint64_t)m_hi << 32 | m_lo));
	*sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sv));
	*mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mv));
}

/* RB rows (row i at row + i * rb) x TB tokens. */
static K5 AI void tile_q4_k(int RB, int TB, float *y, size_t ldy, const uint8_t *row, size_t rb,
			    const struct kq_tok *x)
{
	__m512 acc[KQ5_RB][KQ5_TB];
	__m256 macc[KQ5_RB][KQ5_TB];
#pragma GCC unroll 8
	for (int i = 0; i < RB; i++)
#pragma GCC unroll 8
		for (int j = 0; j < TB; j++) {
			acc[i][j] = _mm512_setzero_ps();
			macc[i][j] = _mm256_setzero_ps();
		}
	const __m512i lo4 = _mm512_set1_epi8(15);
	size_t nsb = x->n / KVK_QK;
	for (size_t sb = 0; sb < nsb; sb++) {
		__m512 ds[KQ5_RB][KQ5_TB]; /* d * sc_s * dx_s per sub-block s, lanes 0-7 */
#pragma GCC unroll 8
		for (int i = 0; i < RB; i++) {
			const uint8_t *p = row + i * rb + sb * KVK_Q4_K_BYTES;
			__m256 scf, mf;
			scales_k4(p + 4, &scf, &mf);
			__m256 mv = _mm256_mul_ps(mf, _mm256_set1_ps(f16at(p + 2)));
			__m256 dsc = _mm256_mul_ps(_mm256_set1_ps(f16at(p)), scf);
#pragma GCC unroll 8
			for (int j = 0; j < TB; j++) {
				size_t o = j * x->nb + 8 * sb;
				macc[i][j] =
				    _mm256_fmadd_ps(mv, _mm256_loadu_ps(x->s + o), macc[i][j]);
				ds[i][j] = _mm512_castps256_ps512(
				    _mm256_mul_ps(dsc, _mm256_loadu_ps(x->d + o)));
			}
		}
		/* 64 bytes of qs at a time: the low nibbles are sub-blocks 4cc and 4cc + 2, the
		 * high nibbles 4cc + 1 and 4cc + 3; each token's activations are gathered to
		 * match by two 32-byte loads (shared by the RB rows) */
#pragma GCC unroll 8
		for (int cc = 0; cc < 2; cc++) {
			__m512i wl[KQ5_RB], wh[KQ5_RB];
#pragma GCC unroll 8
			for (int i = 0; i < RB; i++) {
				const uint8_t *p = row + i * rb + sb * KVK_Q4_K_BYTES;
				__m512i q = _mm512_loadu_si512(p + 16 + 64 * cc);
				wl[i] = _mm512_and_si512(q, lo4);
				wh[i] = _mm512_and_si512(_mm512_srli_epi16(q, 4), lo4);
			}
			__m512i il = spread_idx2(4 * cc, 4 * cc + 2);
			__m512i ih = spread_idx2(4 * cc + 1, 4 * cc + 3);
#pragma GCC unroll 8
			for (int j = 0; j < TB; j++) {
				const int8_t *xq = x->q + j * x->n + KVK_QK * sb + 128 * cc;
				__m512i xl = _mm512_inserti64x4(
				    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)xq)),
				    _mm256_loadu_si256((const __m256i *)(xq + 64)), 1);
				__m512i xh = _mm512_inserti64x4(
				    _mm512_castsi256_si512(
					_mm256_loadu_si256((const __m256i *)(xq + 32))),
				    _mm256_loadu_si256((const __m256i *)(xq + 96)), 1);
#pragma GCC unroll 8
				for (int i = 0; i < RB; i++) {
					__m512i z = _mm512_setzero_si512();
					acc[i][j] = _mm512_fmadd_ps(
					    _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(z, wl[i], xl)),
					    _mm512_permutexvar_ps(il, ds[i][j]), acc[i][j]);
					acc[i][j] = _mm512_fmadd_ps(
					    _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(z, wh[i], xh)),
					    _mm512_permutexvar_ps(ih, ds[i][j]), acc[i][j]);
				}
			}
		}
	}
#pragma GCC unroll 8
	for (int i = 0; i < RB; i++)
#pragma GCC unroll 8
		for (int j = 0; j < TB; j++)
			y[j * ldy + i] = hsum16(acc[i][j]) - hsum8(macc[i][j]);
}

static K5 AI void tile_q6_k(int RB, int TB, float *y, size_t ldy, const uint8_t *row, size_t rb,
			    const struct kq_tok *x)
{
	__m512 acc[KQ5_RB][KQ5_TB];
#pragma GCC unroll 8
	for (int i = 0; i < RB; i++)
#pragma GCC unroll 8
		for (int j = 0; j < TB; j++)
			acc[i][j] = _mm512_setzero_ps();
	const __m512i lo4 = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
	const __m512i c32 = _mm512_set1_epi8(32);
	size_t nsb = x->n / KVK_QK;
	for (size_t sb = 0; sb < nsb; sb++) {
		/* the 16 group scales times d, each over its 4 lanes: zmm k holds groups
		 * 4k .. 4k + 3 */
		__m512 scl[KQ5_RB][4];
#pragma GCC unroll 8
		for (int i = 0; i < RB; i++) {
			const uint8_t *p = row + i * rb + sb * KVK_Q6_K_BYTES;
			__m512 dv = _mm512_set1_ps(f16at(p + 208));
			__m512i sc =
			    _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 192)));
#pragma GCC unroll 8
			for (int k = 0; k < 4; k++) {
				__m512i gi = _mm512_srli_epi32(
				    _mm512_add_epi32(_mm512_set1_epi32(16 * k),
						     _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9,
								       10, 11, 12, 13, 14, 15)),
				    2);
				scl[i][k] = _mm512_mul_ps(
				    dv, _mm512_cvtepi32_ps(_mm512_permutexvar_epi32(gi, sc)));
			}
		}
		__m512 dxs[KQ5_TB]; /* dx_b for the 8 blocks of 32, lanes 0-7 */
#pragma GCC unroll 8
		for (int j = 0; j < TB; j++)
			dxs[j] = _mm512_castps256_ps512(_mm256_loadu_ps(x->d + j * x->nb + 8 * sb));
#pragma GCC unroll 8
		for (int h = 0; h < 2; h++) {
			__m512i q[KQ5_RB][2];
#pragma GCC unroll 8
			for (int i = 0; i < RB; i++) {
				const uint8_t *p = row + i * rb + sb * KVK_Q6_K_BYTES;
				__m512i ql = _mm512_loadu_si512(p + 64 * h);
				__m256i qh =
				    _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));
				__m512i qhz = _mm512_inserti64x4(_mm512_castsi256_si512(qh),
								 _mm256_srli_epi16(qh, 2), 1);
				/* blocks 4h, 4h + 1: low nibbles with qh bits 0-1 / 2-3; blocks
				 * 4h + 2, 4h + 3: high nibbles with bits 4-5 / 6-7 (bits shifted
				 * across a byte boundary fall outside 0x30) */
				q[i][0] = _mm512_or_si512(
				    _mm512_and_si512(ql, lo4),
				    _mm512_and_si512(_mm512_slli_epi16(qhz, 4), m30));
				q[i][1] =
				    _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), lo4),
						    _mm512_and_si512(qhz, m30));
			}
#pragma GCC unroll 8
			for (int k = 0; k < 2; k++) {
				int zk = 2 * h + k; /* blocks 2zk, 2zk + 1; groups 4zk .. 4zk + 3 */
				__m512i idx = spread_idx(zk);
#pragma GCC unroll 8
				for (int j = 0; j < TB; j++) {
					__m512i xv = _mm512_loadu_si512(x->q + j * x->n +
									KVK_QK * sb + 64 * zk);
					/* -32 * each lane's activation sum, the start of every row's
					 * dot: sum((q - 32) x), exact */
					__m512i xs = _mm512_sub_epi32(
					    _mm512_setzero_si512(),
					    _mm512_dpbusd_epi32(_mm512_setzero_si512(), c32, xv));
					__m512 dx = _mm512_permutexvar_ps(idx, dxs[j]);
#pragma GCC unroll 8
					for (int i = 0; i < RB; i++) {
						__m512i dot = _mm512_dpbusd_epi32(xs, q[i][k], xv);
						acc[i][j] = _mm512_fmadd_ps(
						    _mm512_cvtepi32_ps(dot),
						    _mm512_mul_ps(scl[i][zk], dx), acc[i][j]);
					}
				}
			}
		}
	}
#pragma GCC unroll 8
	for (int i = 0; i < RB; i++)
#pragma GCC unroll 8
		for (int j = 0; j < TB; j++)
			y[j * ldy + i] = hsum16(acc[i][j]);
}

static K5 AI void tile(enum kvk_wtype wt, int RB, int TB, float *y, size_t ldy, const uint8_t *row,
		       size_t rb, const struct kq_tok *x)
{
	if (wt == KVK_W_Q4_K)
		tile_q4_k(RB, TB, y, ldy, row, rb, x);
	else
		tile_q6_k(RB, TB, y, ldy, row, rb, x);
}

/* The rows p0 .. p1 of a panel against one token tile: RB rows at a time, then singles. */
static K5 AI void panel(enum kvk_wtype wt, int RB, int TB, float *y, size_t ldy, const uint8_t *w,
			size_t rb, size_t p0, size_t p1, const struct kq_tok *x)
{
	size_t r = p0;
	for (; r + (size_t)RB <= p1; r += (size_t)RB)
		tile(wt, RB, TB, y + r, ldy, w + r * rb, rb, x);
	for (; r < p1; r++)
		tile(wt, 1, TB, y + r, ldy, w + r * rb, rb, x);
}

static K5 AI void rows(enum kvk_wtype wt, float *y, size_t ldy, const uint8_t *w, size_t n,
		       size_t r0, size_t r1, const void *act, size_t ntok)
{
	size_t rb = kvk_kq_row_bytes(wt, n), nb = n / 32;
	const int8_t *q = act;
	const float *d = (const float *)((const uint8_t *)act + kvk_kqact_qbytes(n, ntok));
	const float *s = d + ntok * nb;
	for (size_t p0 = r0; p0 < r1; p0 += KQ5_PANEL) {
		size_t p1 = p0 + KQ5_PANEL < r1 ? p0 + KQ5_PANEL : r1;
		size_t t = 0;
		for (; t + KQ5_TB <= ntok; t += KQ5_TB) {
			struct kq_tok x = {q + t * n, d + t * nb, s + t * nb, n, nb};
			panel(wt, KQ5_TB_RB, KQ5_TB, y + t * ldy, ldy, w, rb, p0, p1, &x);
		}
		for (; t < ntok; t++) {
			struct kq_tok x = {q + t * n, d + t * nb, s + t * nb, n, nb};
			panel(wt, KQ5_RB, 1, y + t * ldy, ldy, w, rb, p0, p1, &x);
		}
	}
}

static K5 void rows_q4_k(float *y, size_t ldy, const uint8_t *w, size_t n, size_t r0, size_t r1,
			 const void *act, size_t ntok)
{
	rows(KVK_W_Q4_K, y, ldy, w, n, r0, r1, act, ntok);
}

static K5 void rows_q6_k(float *y, size_t ldy, const uint8_t *w, size_t n, size_t r0, size_t r1,
			 const void *act, size_t ntok)
{
	rows(KVK_W_Q6_K, y, ldy, w, n, r0, r1, act, ntok);
}

int kvk_kq_matmul_avx512(enum kvk_wtype wt, float *y, size_t ldy, const void *w, size_t n,
			 size_t r0, size_t r1, const void *act, size_t ntok)
{
	switch (wt) {
	case KVK_W_Q4_K:
		rows_q4_k(y, ldy, w, n, r0, r1, act, ntok);
		return 0;
	case KVK_W_Q6_K:
		rows_q6_k(y, ldy, w, n, r0, r1, act, ntok);
		return 0;
	default:
		return -ENOTSUP;
	}
}

#endif
