/* AVX2 + FMA + F16C matmul kernels, compiled for that target and called only after cpuid says
 * the CPU has it (kvk_matmul.c).
 *
 * Batch invariance: each output element (row r, token t) owns exactly one 8-lane accumulator
 * that sees the products for k = 0, 8, 16, ... in order (Q8_0: one int32x8 block dot per block
 * of 32, converted and FMA'd with the block scale, blocks in order), then one fixed horizontal
 * sum, then the k % 8 tail in order. The register tile (how many rows and tokens share loads)
 * and the F16/BF16 -> f32 panel conversion (exact) change speed, never bits. */
#include "kvk_matmul_impl.h"

#ifdef KVK_HAVE_X86

#include <immintrin.h>
#include <string.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AI   __attribute__((always_inline)) inline

static AVX2 AI float hsum8(__m256 v)
{
	__m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
	lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
	return _mm_cvtss_f32(lo);
}

static AVX2 AI __m256 ld8(enum kvk_wtype wt, const void *row, size_t k)
{
	if (wt == KVK_W_F32)
		return _mm256_loadu_ps((const float *)row + k);
	__m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + k));
	if (wt == KVK_W_F16)
		return _mm256_cvtph_ps(h);
	return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static AVX2 AI float ld1(enum kvk_wtype wt, const void *row, size_t k)
{
	if (wt == KVK_W_F32)
		return ((const float *)row)[k];
	uint16_t h;
	memcpy(&h, (const uint16_t *)row + k, 2);
	if (wt == KVK_W_F16)
		return _cvtsh_ss(h);
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* RB rows (row i at w + i * wstride bytes) x TB tokens (token j at x + j * n floats). */
static AVX2 AI void tile_f(enum kvk_wtype wt, int RB, int TB, float *y, size_t ldy,
			   const uint8_t *w, size_t wstride, size_t n, const float *x)
{
	__m256 acc[4][4];
#pragma GCC unroll 4
	for (int i = 0; i < RB; i++)
#pragma GCC unroll 4
		for (int j = 0; j < TB; j++)
			acc[i][j] = _mm256_setzero_ps();
	size_t n8 = n & ~(size_t)7;
	for (size_t k = 0; k < n8; k += 8) {
		__m256 xv[4];
#pragma GCC unroll 4
		for (int j = 0; j < TB; j++)
			xv[j] = _mm256_loadu_ps(x + j * n + k);
#pragma GCC unroll 4
		for (int i = 0; i < RB; i++) {
			__m256 wv = ld8(wt, w + i * wstride, k);
#pragma GCC unroll 4
			for (int j = 0; j < TB; j++)
				acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < RB; i++)
#pragma GCC unroll 4
		for (int j = 0; j < TB; j++) {
			float s = hsum8(acc[i][j]);
			for (size_t k = n8; k < n; k++)
				s += ld1(wt, w + i * wstride, k) * x[j * n + k];
			y[j * ldy + i] = s;
		}
}

/* All tokens against rows [r0, r1) of one float-typed matrix, tiles of 4 rows x TB tokens. */
static AVX2 AI void rows_f(enum kvk_wtype wt, float *y, size_t ldy, const uint8_t *w,
			   size_t wstride, size_t n, size_t r0, size_t r1, const float *x,
			   size_t ntok)
{
	size_t t = 0;
	for (; t + 3 <= ntok; t += 3) {
		size_t r = r0;
		for (; r + 4 <= r1; r += 4)
			tile_f(wt, 4, 3, y + t * ldy + r, ldy, w + r * wstride, wstride, n,
			       x + t * n);
		for (; r < r1; r++)
			tile_f(wt, 1, 3, y + t * ldy + r, ldy, w + r * wstride, wstride, n,
			       x + t * n);
	}
	size_t left = ntok - t;
	if (left == 0)
		return;
	size_t r = r0;
	for (; r + 4 <= r1; r += 4) {
		if (left == 2)
			tile_f(wt, 4, 2, y + t * ldy + r, ldy, w + r * wstride, wstride, n,
			       x + t * n);
		else
			tile_f(wt, 4, 1, y + t * ldy + r, ldy, w + r * wstride, wstride, n,
			       x + t * n);
	}
	for (; r < r1; r++) {
		if (left == 2)
			tile_f(wt, 1, 2, y + t * ldy + r, ldy, w + r * wstride, wstride, n,
			       x + t * n);
		else
			tile_f(wt, 1, 1, y + t * ldy + r, ldy, w + r * wstride, wstride, n,
			       x + t * n);
	}
}

static AVX2 void rows_f32(float *y, size_t ldy, const uint8_t *w, size_t ws, size_t n, size_t r0,
			  size_t r1, const float *x, size_t ntok)
{
	/* panels of rows against all tokens: each weight leaves memory once */
	for (size_t p = r0; p < r1; p += KVK_PANEL_ROWS)
		rows_f(KVK_W_F32, y, ldy, w, ws, n, p,
		       p + KVK_PANEL_ROWS < r1 ? p + KVK_PANEL_ROWS : r1, x, ntok);
}

static AVX2 void rows_f16(float *y, size_t ldy, const uint8_t *w, size_t ws, size_t n, size_t r0,
			  size_t r1, const float *x, size_t ntok)
{
	rows_f(KVK_W_F16, y, ldy, w, ws, n, r0, r1, x, ntok);
}

static AVX2 void rows_bf16(float *y, size_t ldy, const uint8_t *w, size_t ws, size_t n, size_t r0,
			   size_t r1, const float *x, size_t ntok)
{
	rows_f(KVK_W_BF16, y, ldy, w, ws, n, r0, r1, x, ntok);
}

/* Converts rows [r0, r1) of a 16-bit matrix to f32 rows of stride ld (exact). */
static AVX2 void panel_to_f32(enum kvk_wtype wt, float *dst, size_t ld, const uint8_t *w, size_t ws,
			      size_t n, size_t r0, size_t r1)
{
	size_t n8 = n & ~(size_t)7;
	for (size_t r = r0; r < r1; r++) {
		const uint8_t *row = w + r * ws;
		float *d = dst + (r - r0) * ld;
		if (wt == KVK_W_F16) {
			for (size_t k = 0; k < n8; k += 8)
				_mm256_storeu_ps(d + k, ld8(KVK_W_F16, row, k));
			for (size_t k = n8; k < n; k++)
				d[k] = ld1(KVK_W_F16, row, k);
		} else {
			for (size_t k = 0; k < n8; k += 8)
				_mm256_storeu_ps(d + k, ld8(KVK_W_BF16, row, k));
			for (size_t k = n8; k < n; k++)
				d[k] = ld1(KVK_W_BF16, row, k);
		}
	}
}

/* Q8_0: RB rows x TB tokens. Per block: |w| (u8) x sign-adjusted x (s8) -> 16 x i16 pair sums
 * (no saturation: |x| <= 127, |w| <= 128) -> 8 x i32 -> f32, FMA'd with dw * dx. */
static AVX2 AI void tile_q8(int RB, int TB, float *y, size_t ldy, const uint8_t *w, size_t ws,
			    size_t nb, const int8_t *xq, size_t n, const float *xd)
{
	__m256 acc[4][4];
#pragma GCC unroll 4
	for (int i = 0; i < RB; i++)
#pragma GCC unroll 4
		for (int j = 0; j < TB; j++)
			acc[i][j] = _mm256_setzero_ps();
	const __m256i ones = _mm256_set1_epi16(1);
	for (size_t b = 0; b < nb; b++) {
		__m256i xv[4];
		float dx[4];
#pragma GCC unroll 4
		for (int j = 0; j < TB; j++) {
			xv[j] = _mm256_loadu_si256((const __m256i *)(xq + j * n + b * 32));
			dx[j] = xd[j * nb + b];
		}
#pragma GCC unroll 4
		for (int i = 0; i < RB; i++) {
			const uint8_t *blk = w + i * ws + b * 34;
			uint16_t h;
			memcpy(&h, blk, 2);
			float dw = _cvtsh_ss(h);
			__m256i wq = _mm256_loadu_si256((const __m256i *)(blk + 2));
			__m256i aw = _mm256_sign_epi8(wq, wq);
#pragma GCC unroll 4
			for (int j = 0; j < TB; j++) {
				__m256i sx = _mm256_sign_epi8(xv[j], wq);
				__m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones);
				acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
							    _mm256_set1_ps(dw * dx[j]), acc[i][j]);
			}
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < RB; i++)
#pragma GCC unroll 4
		for (int j = 0; j < TB; j++)
			y[j * ldy + i] = hsum8(acc[i][j]);
}

/* Q8_0 register tile: 2 rows x 4 tokens (8 accumulators; measured a little ahead of 4 x 2 and
 * 3 x 3). Leftover tokens go one at a time against 4-row tiles. */
#define QRB 2
#define QTB 4
/* Rows in panels of KVK_PANEL_ROWS (about 15 KB of Q8_0 at n = 896: stays in L1) against
 * every token group, so a weight is read from memory once per call, not once per group. */
static AVX2 void rows_q8(float *y, size_t ldy, const uint8_t *w, size_t ws, size_t n, size_t r0,
			 size_t r1, const void *act, size_t ntok)
{
	size_t nb = n / 32;
	const int8_t *q = act;
	const float *d = (const float *)((const uint8_t *)act + kvk_q8act_qbytes(n, ntok));
	for (size_t p0 = r0; p0 < r1; p0 += KVK_PANEL_ROWS) {
		size_t p1 = p0 + KVK_PANEL_ROWS < r1 ? p0 + KVK_PANEL_ROWS : r1;
		size_t t = 0;
		for (; t + QTB <= ntok; t += QTB) {
			size_t r = p0;
			for (; r + QRB <= p1; r += QRB)
				tile_q8(QRB, QTB, y + t * ldy + r, ldy, w + r * ws, ws, nb,
					q + t * n, n, d + t * nb);
			for (; r < p1; r++)
				tile_q8(1, QTB, y + t * ldy + r, ldy, w + r * ws, ws, nb, q + t * n,
					n, d + t * nb);
		}
		for (; t < ntok; t++) {
			size_t r = p0;
			for (; r + 4 <= p1; r += 4)
				tile_q8(4, 1, y + t * ldy + r, ldy, w + r * ws, ws, nb, q + t * n,
					n, d + t * nb);
			for (; r < p1; r++)
				tile_q8(1, 1, y + t * ldy + r, ldy, w + r * ws, ws, nb, q + t * n,
					n, d + t * nb);
		}
	}
}

AVX2 void kvk_matmul_avx2(enum kvk_wtype wt, float *y, size_t ldy, const void *w, size_t n,
			  size_t r0, size_t r1, const void *act, size_t ntok, float *scratch)
{
	const uint8_t *wb = w;
	size_t ws = kvk_row_bytes(wt, n);
	switch (wt) {
	case KVK_W_F32:
		rows_f32(y, ldy, wb, ws, n, r0, r1, act, ntok);
		return;
	case KVK_W_Q8_0:
		rows_q8(y, ldy, wb, ws, n, r0, r1, act, ntok);
		return;
	case KVK_W_F16:
	case KVK_W_BF16:
		break;
	default: /* the block types: kvk_matmul_kq_avx2.c */
		return;
	}
	if (ntok < 4 || !scratch) {
		/* decode-sized batches: convert on the fly, each weight is used ntok times */
		if (wt == KVK_W_F16)
			rows_f16(y, ldy, wb, ws, n, r0, r1, act, ntok);
		else
			rows_bf16(y, ldy, wb, ws, n, r0, r1, act, ntok);
		return;
	}
	/* prefill: convert a panel of rows to f32 once, use it against every token */
	size_t ld = (n + 7) & ~(size_t)7;
	for (size_t p = r0; p < r1; p += KVK_PANEL_ROWS) {
		size_t pe = p + KVK_PANEL_ROWS < r1 ? p + KVK_PANEL_ROWS : r1;
		panel_to_f32(wt, scratch, ld, wb, ws, n, p, pe);
		rows_f32(y + p, ldy, (const uint8_t *)scratch, ld * 4, n, 0, pe - p, act, ntok);
	}
}

AVX2 float kvk_dot_f16_avx2(const float *a, const uint16_t *b, size_t n)
{
	__m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
	size_t k = 0;
	for (; k + 16 <= n; k += 16) {
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), ld8(KVK_W_F16, b, k), s0);
		s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), ld8(KVK_W_F16, b, k + 8), s1);
	}
	for (; k + 8 <= n; k += 8)
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), ld8(KVK_W_F16, b, k), s0);
	float s = hsum8(_mm256_add_ps(s0, s1));
	for (; k < n; k++)
		s += a[k] * _cvtsh_ss(b[k]);
	return s;
}

AVX2 void kvk_axpy_f16_avx2(float *y, float s, const uint16_t *b, size_t n)
{
	__m256 sv = _mm256_set1_ps(s);
	size_t k = 0;
	for (; k + 8 <= n; k += 8)
		_mm256_storeu_ps(y + k,
				 _mm256_fmadd_ps(sv, ld8(KVK_W_F16, b, k), _mm256_loadu_ps(y + k)));
	for (; k < n; k++)
		y[k] += s * _cvtsh_ss(b[k]);
}

#endif
