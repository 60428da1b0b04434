/* AVX2 kernels for Q4_0 / Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K weights (layouts and the activation
 * format in kvk_quant_impl.h), called only after cpuid says the CPU has AVX2 + FMA + F16C.
 *
 * Each block's weights are unpacked once to bytes and used against up to KQ_TB tokens. The
 * integer dot of a 32-value block is exact (|pair sums| < 2^15, no saturation: |x| <= 127,
 * weights 0..31 unsigned or |w| <= 32 signed); it is converted to 8 floats and FMA'd with the
 * block's float scale into one 8-lane accumulator per (row, token), blocks in order; the
 * K-quant mins go into a second accumulator, 8 sub-blocks per FMA. Batch invariance: a
 * (row, token) sees the same instruction sequence whatever the tile, ntok or row range, so
 * its result is bit-identical alone or in any batch. Against the scalar reference only the
 * float summation order differs. */
#include "kvk_quant_impl.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <string.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AI   __attribute__((always_inline)) inline

#define KQ_TB	 4  /* tokens per tile */
#define KQ_PANEL 16 /* rows per panel: a panel stays in L1 while every token group passes */

static AVX2 AI float hsum8(__m256 v)
{
	__m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
	lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
	return _mm_cvtss_f32(lo);
}

static AVX2 AI float f16at(const uint8_t *p)
{
	uint16_t h;
	memcpy(&h, p, 2);
	return _cvtsh_ss(h);
}

/* 32 unsigned bytes (<= 63) x 32 signed bytes -> 8 x i32 pair-of-pair sums. */
static AVX2 AI __m256i dot_us(__m256i u, __m256i x)
{
	return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

/* 32 signed bytes (|w| <= 127) x 32 signed bytes (|x| <= 127). */
static AVX2 AI __m256i dot_ss(__m256i w, __m256i x)
{
	return dot_us(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

static AVX2 AI __m256i ld32(const void *p)
{
	return _mm256_loadu_si256((const __m256i *)p);
}

/* The tokens of a tile: token j's quants at q + j * n, block scales and sums at d/s + j * nb. */
struct kq_tok {
	const int8_t *q;
	const float *d, *s;
	size_t n, nb;
};

static AVX2 AI void tile_q4_0(int TB, float *y, size_t ldy, const uint8_t *row,
			      const struct kq_tok *x)
{
	__m256 acc[KQ_TB];
	for (int j = 0; j < TB; j++)
		acc[j] = _mm256_setzero_ps();
	const __m256i lo4 = _mm256_set1_epi8(15), eight = _mm256_set1_epi8(8);
	for (size_t b = 0; b < x->nb; b++) {
		const uint8_t *p = row + b * KVK_Q4_0_BYTES;
		float d = f16at(p);
		__m128i q = _mm_loadu_si128((const __m128i *)(p + 2));
		__m256i w =
		    _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
		w = _mm256_sub_epi8(_mm256_and_si256(w, lo4), eight);
		for (int j = 0; j < TB; j++) {
			__m256i xv = ld32(x->q + j * x->n + 32 * b);
			acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_ss(w, xv)),
						 _mm256_set1_ps(d * x->d[j * x->nb + b]), acc[j]);
		}
	}
	for (int j = 0; j < TB; j++)
		y[j * ldy] = hsum8(acc[j]);
}

/* Q5_0 (one = 0: w = d (q - 16)) and Q5_1 (one = 1: w = d q + m). The 32 fifth bits become
 * bytes by a shuffle (byte i takes byte i / 8 of qh) and a per-byte bit test. */
static AVX2 AI void tile_q5(int one, int TB, float *y, size_t ldy, const uint8_t *row,
			    const struct kq_tok *x)
{
	__m256 acc[KQ_TB];
	float msum[KQ_TB];
	for (int j = 0; j < TB; j++) {
		acc[j] = _mm256_setzero_ps();
		msum[j] = 0;
	}
	const __m256i lo4 = _mm256_set1_epi8(15), sixteen = _mm256_set1_epi8(16);
	const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2,
					      2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
	const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
	size_t bb = one ? KVK_Q5_1_BYTES : KVK_Q5_0_BYTES;
	for (size_t b = 0; b < x->nb; b++) {
		const uint8_t *p = row + b * bb, *qh = p + (one ? 4 : 2);
		float d = f16at(p), m = one ? f16at(p + 2) : 0;
		uint32_t h;
		memcpy(&h, qh, 4);
		__m256i hv = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), shuf);
		hv = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hv, bit), bit), sixteen);
		__m128i q = _mm_loadu_si128((const __m128i *)(qh + 4));
		__m256i w =
		    _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
		w = _mm256_or_si256(_mm256_and_si256(w, lo4), hv);
		if (!one)
			w = _mm256_sub_epi8(w, sixteen);
		for (int j = 0; j < TB; j++) {
			__m256i xv = ld32(x->q + j * x->n + 32 * b);
			__m256i pi = one ? dot_us(w, xv) : dot_ss(w, xv);
			acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pi),
						 _mm256_set1_ps(d * x->d[j * x->nb + b]), acc[j]);
			if (one)
				msum[j] += m * x->s[j * x->nb + b];
		}
	}
	for (int j = 0; j < TB; j++)
		y[j * ldy] = hsum8(acc[j]) + msum[j];
}

/* The 8 scales and 8 mins of a Q4_K/Q5_K block as floats, unpacked by whole words instead of
 * kvk_kq_scale_min per sub-block: bytes 0-3 hold sc0..3 in their low 6 bits and the top bits
 * of sc4..7 in bits 6-7; bytes 4-7 the same for the mins; bytes 8-11 the low nibbles of sc4..7
 * (low half) and m4..7 (high half). Shifts across byte boundaries are masked off. */
static AVX2 AI void scales_k45(const uint8_t *k, __m256 *sc, __m256 *mn)
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

/* Q4_K (five = 0) and Q5_K (five = 1). */
static AVX2 AI void tile_k45(int five, int TB, float *y, size_t ldy, const uint8_t *row,
			     const struct kq_tok *x)
{
	__m256 acc[KQ_TB], macc[KQ_TB];
	for (int j = 0; j < TB; j++)
		acc[j] = macc[j] = _mm256_setzero_ps();
	const __m256i lo4 = _mm256_set1_epi8(15), sixteen = _mm256_set1_epi8(16);
	size_t bb = five ? KVK_Q5_K_BYTES : KVK_Q4_K_BYTES, nsb = x->n / KVK_QK;
	for (size_t sb = 0; sb < nsb; sb++) {
		const uint8_t *p = row + sb * bb;
		const uint8_t *qs = p + (five ? 48 : 16);
		float d = f16at(p), dmin = f16at(p + 2);
		__m256 scf, mf;
		scales_k45(p + 4, &scf, &mf);
		__m256 mv = _mm256_mul_ps(mf, _mm256_set1_ps(dmin));
		__m256 dsc = _mm256_mul_ps(_mm256_set1_ps(d), scf);
		/* (d * sc_s) * dx_s for each sub-block and token, broadcast from memory below */
		float ds[KQ_TB][8];
		for (int j = 0; j < TB; j++) {
			macc[j] = _mm256_fmadd_ps(mv, _mm256_loadu_ps(x->s + j * x->nb + 8 * sb),
						  macc[j]);
			_mm256_storeu_ps(
			    ds[j], _mm256_mul_ps(dsc, _mm256_loadu_ps(x->d + j * x->nb + 8 * sb)));
		}
		__m256i qh = five ? ld32(p + 16) : _mm256_setzero_si256();
		for (int c = 0; c < 4; c++) {
			__m256i q = ld32(qs + 32 * c);
			__m256i lo = _mm256_and_si256(q, lo4);
			__m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), lo4);
			if (five) {
				__m256i m0 = _mm256_set1_epi8((char)(1 << (2 * c)));
				__m256i m1 = _mm256_set1_epi8((char)(2 << (2 * c)));
				lo = _mm256_or_si256(
				    lo,
				    _mm256_and_si256(
					_mm256_cmpeq_epi8(_mm256_and_si256(qh, m0), m0), sixteen));
				hi = _mm256_or_si256(
				    hi,
				    _mm256_and_si256(
					_mm256_cmpeq_epi8(_mm256_and_si256(qh, m1), m1), sixteen));
			}
			for (int j = 0; j < TB; j++) {
				const int8_t *xq = x->q + j * x->n + KVK_QK * sb + 64 * c;
				acc[j] =
				    _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_us(lo, ld32(xq))),
						    _mm256_broadcast_ss(&ds[j][2 * c]), acc[j]);
				acc[j] =
				    _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_us(hi, ld32(xq + 32))),
						    _mm256_broadcast_ss(&ds[j][2 * c + 1]), acc[j]);
			}
		}
	}
	for (int j = 0; j < TB; j++)
		y[j * ldy] = hsum8(acc[j]) - hsum8(macc[j]);
}

static AVX2 AI void tile_q6_k(int TB, float *y, size_t ldy, const uint8_t *row,
			      const struct kq_tok *x)
{
	__m256 acc[KQ_TB];
	for (int j = 0; j < TB; j++)
		acc[j] = _mm256_setzero_ps();
	const __m256i lo4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
	const __m256i off = _mm256_set1_epi8(32);
	const __m128i step = _mm_set_epi8(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
	size_t nsb = x->n / KVK_QK;
	for (size_t sb = 0; sb < nsb; sb++) {
		const uint8_t *p = row + sb * KVK_Q6_K_BYTES;
		const int8_t *sc = (const int8_t *)(p + 192);
		__m256 dv = _mm256_set1_ps(f16at(p + 208));
		__m128i sc8 = _mm_loadu_si128((const __m128i *)sc);
		float ds[KQ_TB][8]; /* d * dx_b for the 8 blocks of 32, per token */
		for (int j = 0; j < TB; j++)
			_mm256_storeu_ps(
			    ds[j], _mm256_mul_ps(dv, _mm256_loadu_ps(x->d + j * x->nb + 8 * sb)));
		for (int h = 0; h < 2; h++) {
			__m256i ql0 = ld32(p + 64 * h), ql1 = ld32(p + 64 * h + 32);
			__m256i qh = ld32(p + 128 + 32 * h);
			__m256i q[4];
			/* the high pairs of qh to bits 4..5 of each byte; bits shifted across a
			 * byte boundary fall outside 0x30 */
			q[0] = _mm256_or_si256(_mm256_and_si256(ql0, lo4),
					       _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
			q[1] = _mm256_or_si256(_mm256_and_si256(ql1, lo4),
					       _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
			q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), lo4),
					       _mm256_and_si256(qh, m30));
			q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), lo4),
					       _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
			for (int k = 0; k < 4; k++) {
				__m256i w = _mm256_sub_epi8(q[k], off);
				__m256i aw = _mm256_sign_epi8(w, w);
				/* int16 scales: 8 x group 2k, then 8 x group 2k + 1 */
				__m256i sv = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
				    sc8, _mm_add_epi8(_mm_set1_epi8((char)(8 * h + 2 * k)), step)));
				size_t b = 8 * sb + 4 * h + k;
				for (int j = 0; j < TB; j++) {
					__m256i xv = ld32(x->q + j * x->n + 32 * b);
					__m256i p16 =
					    _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, w));
					__m256i pi = _mm256_madd_epi16(p16, sv);
					acc[j] = _mm256_fmadd_ps(
					    _mm256_cvtepi32_ps(pi),
					    _mm256_broadcast_ss(&ds[j][4 * h + k]), acc[j]);
				}
			}
		}
	}
	for (int j = 0; j < TB; j++)
		y[j * ldy] = hsum8(acc[j]);
}

static AVX2 AI void tile(enum kvk_wtype wt, int TB, float *y, size_t ldy, const uint8_t *row,
			 const struct kq_tok *x)
{
	switch (wt) {
	case KVK_W_Q4_0:
		tile_q4_0(TB, y, ldy, row, x);
		return;
	case KVK_W_Q5_0:
		tile_q5(0, TB, y, ldy, row, x);
		return;
	case KVK_W_Q5_1:
		tile_q5(1, TB, y, ldy, row, x);
		return;
	case KVK_W_Q4_K:
		tile_k45(0, TB, y, ldy, row, x);
		return;
	case KVK_W_Q5_K:
		tile_k45(1, TB, y, ldy, row, x);
		return;
	default:
		tile_q6_k(TB, y, ldy, row, x);
		return;
	}
}

static AVX2 AI void rows(enum kvk_wtype wt, float *y, size_t ldy, const uint8_t *w, size_t n,
			 size_t r0, size_t r1, const void *act, size_t ntok)
{
	size_t rb = kvk_kq_row_bytes(wt, n), nb = n / 32;
	const int8_t *q = act;
	const float *d = (const float *)((const uint8_t *)act + kvk_kqact_qbytes(n, ntok));
	const float *s = d + ntok * nb;
	for (size_t p0 = r0; p0 < r1; p0 += KQ_PANEL) {
		size_t p1 = p0 + KQ_PANEL < r1 ? p0 + KQ_PANEL : r1;
		size_t t = 0;
		for (; t + KQ_TB <= ntok; t += KQ_TB) {
			struct kq_tok x = {q + t * n, d + t * nb, s + t * nb, n, nb};
			for (size_t r = p0; r < p1; r++)
				tile(wt, KQ_TB, y + t * ldy + r, ldy, w + r * rb, &x);
		}
		for (; t < ntok; t++) {
			struct kq_tok x = {q + t * n, d + t * nb, s + t * nb, n, nb};
			for (size_t r = p0; r < p1; r++)
				tile(wt, 1, y + t * ldy + r, ldy, w + r * rb, &x);
		}
	}
}

static AVX2 void rows_q4_0(float *y, size_t ldy, const uint8_t *w, size_t n, size_t r0, size_t r1,
			   const void *act, size_t ntok)
{
	rows(KVK_W_Q4_0, y, ldy, w, n, r0, r1, act, ntok);
}

static AVX2 void rows_q5_0(float *y, size_t ldy, const uint8_t *w, size_t n, size_t r0, size_t r1,
			   const void *act, size_t ntok)
{
	rows(KVK_W_Q5_0, y, ldy, w, n, r0, r1, act, ntok);
}

static AVX2 void rows_q5_1(float *y, size_t ldy, const uint8_t *w, size_t n, size_t r0, size_t r1,
			   const void *act, size_t ntok)
{
	rows(KVK_W_Q5_1, y, ldy, w, n, r0, r1, act, ntok);
}

static AVX2 void rows_q4_k(float *y, size_t ldy, const uint8_t *w, size_t n, size_t r0, size_t r1,
			   const void *act, size_t ntok)
{
	rows(KVK_W_Q4_K, y, ldy, w, n, r0, r1, act, ntok);
}

static AVX2 void rows_q5_k(float *y, size_t ldy, const uint8_t *w, size_t n, size_t r0, size_t r1,
			   const void *act, size_t ntok)
{
	rows(KVK_W_Q5_K, y, ldy, w, n, r0, r1, act, ntok);
}

static AVX2 void rows_q6_k(float *y, size_t ldy, const uint8_t *w, size_t n, size_t r0, size_t r1,
			   const void *act, size_t ntok)
{
	rows(KVK_W_Q6_K, y, ldy, w, n, r0, r1, act, ntok);
}

void kvk_kq_matmul_avx2(enum kvk_wtype wt, float *y, size_t ldy, const void *w, size_t n, size_t r0,
			size_t r1, const void *act, size_t ntok)
{
	switch (wt) {
	case KVK_W_Q4_0:
		rows_q4_0(y, ldy, w, n, r0, r1, act, ntok);
		return;
	case KVK_W_Q5_0:
		rows_q5_0(y, ldy, w, n, r0, r1, act, ntok);
		return;
	case KVK_W_Q5_1:
		rows_q5_1(y, ldy, w, n, r0, r1, act, ntok);
		return;
	case KVK_W_Q4_K:
		rows_q4_k(y, ldy, w, n, r0, r1, act, ntok);
		return;
	case KVK_W_Q5_K:
		rows_q5_k(y, ldy, w, n, r0, r1, act, ntok);
		return;
	case KVK_W_Q6_K:
		rows_q6_k(y, ldy, w, n, r0, r1, act, ntok);
		return;
	default:
		return;
	}
}

#endif
