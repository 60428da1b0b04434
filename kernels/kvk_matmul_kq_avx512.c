/* AVX-512 (F, BW, VL) + AVX512-VNNI kernels for the Q4_0 / Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K
 * weights (layouts and the activation format in kvk_quant_impl.h), called only after cpuid (and
 * the OS's saved state) says the CPU has them (kvk_matmul.c).
 *
 * The Q8_0 treatment (kvk_matmul_x86.inc, tile_q8p): 16 rows per zmm, one row per 32-bit lane.
 * For each 16-row panel and super-block of 256 values, the rows' bytes are transposed in
 * registers (tr16x8 / tr16x4, no gathers) and their nibbles / 6-bit values unpacked once;
 * unpacked once; then every token of the pass runs vpdpbusd of 4 broadcast activation bytes against
 * them, 8 per sub-block (Q4_K, Q5_K), 4 per group of 16 (Q6_K) or 8 per block of 32 (Q4_0, Q5_0,
 * Q5_1), into the 16 rows' int32 dots (exact).
 * Scales, mins and d are unpacked 16 rows at a time the same way, as per-lane floats.
 *
 * Batch invariance: each output (row, token) is one f32 lane of one chain per pass: acc =
 * fma(int dot, (d * sc) * dx, acc) over its sub-blocks / groups / blocks in order (Q4_K,
 * Q5_K, Q5_1: plus a mins chain, combined at the end). Which lane a row lands in, the panel split,
 * the token tile (8, or 1 for the tail) and ntok change speed, never bits: decode and prefill give
 * the same result for a token. Against the scalar reference and the AVX2 kernels only the f32
 * summation order differs. */
#include "kvk_quant_impl.h"

#if defined(__x86_64__) || defined(__i386__)

#include <errno.h>
#include <immintrin.h>
#include <string.h>

#define K5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define AI __attribute__((always_inline)) inline

/* ---- Q4_K on 16-row panels: one row per 32-bit lane ----
 *
 * Per 16-row panel and super-block, the rows' bytes are transposed in registers so that zmm
 * W[s][g] holds, in lane r, values 4g .. 4g + 3 of sub-block s of row r (unsigned 0..15); a
 * token's 4 activation bytes are broadcast and vpdpbusd adds the 4 products into each row's
 * lane: the sub-block's int32 dot for 16 rows after 8 of them (exact). Then, per lane,
 * acc = fma(dot, (d * sc) * dx, acc) in sub-block order, and the mins into a second chain
 * macc = fma(dmin * m, dx * sum(q), macc); y = acc - macc. Each output is those two f32
 * chains over the sub-blocks in order, whatever the panel, the lane, the token tile or ntok:
 * batch-invariant. The transposes cost about as much as 3 tokens' dots, so decode pays them
 * per token and prefill once per KP_TG tokens. */

#define KP_TG 64 /* tokens whose accumulators are kept (on the stack) per pass over a panel */
#define KP_TB 8	 /* tokens per register tile */

/* Dwords off/4 .. off/4 + 3 of 16 rows (row r at rp[r]): out[m] lane r = dword m of row r.
 * Rows 4L + q go to 128-bit lane L of z[q], then a 4 x 4 dword transpose per 128-bit lane. */
static K5 AI void tr16x4(const uint8_t *const *rp, size_t off, __m512i out[4])
{
	__m512i z[4];
#pragma GCC unroll 4
	for (int q = 0; q < 4; q++) {
		__m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(rp[q] + off)));
		v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(rp[4 + q] + off)), 1);
		v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(rp[8 + q] + off)), 2);
		z[q] =
		    _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(rp[12 + q] + off)), 3);
	}
	__m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
	__m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
	out[0] = _mm512_unpacklo_epi64(t0, t2);
	out[1] = _mm512_unpackhi_epi64(t0, t2);
	out[2] = _mm512_unpacklo_epi64(t1, t3);
	out[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* Dwords off/4 .. off/4 + 7 of 16 rows: out[g] lane r = dword g of row r. Rows k and k + 8
 * share a zmm, an 8 x 8 dword transpose per 256-bit half (unpacks), then one two-source
 * qword permute per output: 32 shuffles for 8 outputs where tr16x4 takes 40. */
static K5 AI void tr16x8(const uint8_t *const *rp, size_t off, __m512i out[8])
{
	__m512i z[8], a[8], b[8];
#pragma GCC unroll 8
	for (int k = 0; k < 8; k++)
		z[k] = _mm512_inserti64x4(
		    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(rp[k] + off))),
		    _mm256_loadu_si256((const __m256i *)(rp[k + 8] + off)), 1);
#pragma GCC unroll 4
	for (int k = 0; k < 4; k++) { /* rows 2k, 2k + 1 (and + 8) */
		a[k] = _mm512_unpacklo_epi32(z[2 * k], z[2 * k + 1]);
		a[4 + k] = _mm512_unpackhi_epi32(z[2 * k], z[2 * k + 1]);
	}
#pragma GCC unroll 2
	for (int q = 0; q < 2; q++) { /* rows 4q .. 4q + 3: dwords d (low 128) and d + 4 */
		b[4 * q + 0] = _mm512_unpacklo_epi64(a[2 * q], a[2 * q + 1]);
		b[4 * q + 1] = _mm512_unpackhi_epi64(a[2 * q], a[2 * q + 1]);
		b[4 * q + 2] = _mm512_unpacklo_epi64(a[4 + 2 * q], a[4 + 2 * q + 1]);
		b[4 * q + 3] = _mm512_unpackhi_epi64(a[4 + 2 * q], a[4 + 2 * q + 1]);
	}
	const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
	const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
#pragma GCC unroll 4
	for (int d = 0; d < 4; d++) {
		out[d] = _mm512_permutex2var_epi64(b[d], lo, b[4 + d]);
		out[4 + d] = _mm512_permutex2var_epi64(b[d], hi, b[4 + d]);
	}
}

/* Byte k of every dword as a float. */
static K5 AI __m512 byte_ps(__m512i v, int k)
{
	return _mm512_cvtepi32_ps(
	    _mm512_and_si512(_mm512_srli_epi32(v, 8 * k), _mm512_set1_epi32(255)));
}

/* One super-block of a 16-row panel: W (see above), per sub-block d * sc and dmin * m. */
struct kp_q4k {
	__m512i w[8][8];
	__m512 dsc[8], mn[8];
};

/* five = 1: Q5_K, whose fifth bits (qh, bytes 16..47: bit s of byte i for value i of
 * sub-block s) go into bit 4 of each value byte; its quants start at byte 48. */
static K5 AI void kp_q4k_unpack(int five, const uint8_t *const *rp, struct kp_q4k *p)
{
	__m512i h[4];
	tr16x4(rp, 0, h);
	__m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h[0]));
	__m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h[0], 16)));
	/* the word-wise 6-bit unpacking of scales_k4, 16 rows at once */
	const __m512i m3f = _mm512_set1_epi32(0x3f3f3f3f), m0f = _mm512_set1_epi32(0x0f0f0f0f);
	const __m512i m30 = _mm512_set1_epi32(0x30303030);
	__m512i s_lo = _mm512_and_si512(h[1], m3f), m_lo = _mm512_and_si512(h[2], m3f);
	__m512i s_hi = _mm512_or_si512(_mm512_and_si512(h[3], m0f),
				       _mm512_and_si512(_mm512_srli_epi32(h[1], 2), m30));
	__m512i m_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(h[3], 4), m0f),
				       _mm512_and_si512(_mm512_srli_epi32(h[2], 2), m30));
#pragma GCC unroll 4
	for (int k = 0; k < 4; k++) {
		p->dsc[k] = _mm512_mul_ps(d, byte_ps(s_lo, k));
		p->dsc[4 + k] = _mm512_mul_ps(d, byte_ps(s_hi, k));
		p->mn[k] = _mm512_mul_ps(dmin, byte_ps(m_lo, k));
		p->mn[4 + k] = _mm512_mul_ps(dmin, byte_ps(m_hi, k));
	}
	const __m512i lo4 = _mm512_set1_epi8(15);
	size_t qs = five ? 48 : 16;
#pragma GCC unroll 4
	for (int c = 0; c < 4; c++) {
		__m512i o[8];
		tr16x8(rp, qs + 32 * (size_t)c, o);
#pragma GCC unroll 8
		for (int g = 0; g < 8; g++) {
			p->w[2 * c][g] = _mm512_and_si512(o[g], lo4);
			p->w[2 * c + 1][g] = _mm512_and_si512(_mm512_srli_epi16(o[g], 4), lo4);
		}
	}
	if (!five)
		return;
	__m512i qh[8]; /* lane r: qh bytes 4g .. 4g + 3 of row r */
	tr16x8(rp, 16, qh);
	const __m512i b4 = _mm512_set1_epi8(16);
#pragma GCC unroll 8
	for (int sb = 0; sb < 8; sb++)
#pragma GCC unroll 8
		for (int g = 0; g < 8; g++) {
			/* bit sb of each byte to bit 4 (bits moved across bytes are masked) */
			__m512i h = sb < 4   ? _mm512_slli_epi32(qh[g], 4 - sb)
				    : sb > 4 ? _mm512_srli_epi32(qh[g], sb - 4)
					     : qh[g];
			p->w[sb][g] =
			    _mm512_ternarylogic_epi32(p->w[sb][g], h, b4, 0xF8); /* a|(b&c) */
		}
}

static K5 AI int32_t ld4(const int8_t *p)
{
	int32_t v;
	memcpy(&v, p, 4);
	return v;
}

/* TB tokens (token j's quants at xq + j * n, its block scales / sums at d / s + j * nb, the
 * super-block's first) against one unpacked super-block; acc / macc: the tokens' chains. */
static K5 AI void kp_q4k_tile(int TB, const struct kp_q4k *p, const int8_t *xq, const float *d,
			      const float *s, size_t n, size_t nb, __m512 *acc, __m512 *macc)
{
	__m512 fa[KP_TB];
#pragma GCC unroll 8
	for (int j = 0; j < TB; j++)
		fa[j] = acc[j];
#pragma GCC unroll 1
	for (int sb = 0; sb < 8; sb++) {
		__m512i a[KP_TB];
#pragma GCC unroll 8
		for (int j = 0; j < TB; j++)
			a[j] = _mm512_setzero_si512();
#pragma GCC unroll 8
		for (int g = 0; g < 8; g++)
#pragma GCC unroll 8
			for (int j = 0; j < TB; j++)
				a[j] = _mm512_dpbusd_epi32(
				    a[j], p->w[sb][g],
				    _mm512_set1_epi32(ld4(xq + j * n + 32 * sb + 4 * g)));
#pragma GCC unroll 8
		for (int j = 0; j < TB; j++)
			fa[j] = _mm512_fmadd_ps(
			    _mm512_cvtepi32_ps(a[j]),
			    _mm512_mul_ps(p->dsc[sb], _mm512_set1_ps(d[j * nb + sb])), fa[j]);
	}
#pragma GCC unroll 8
	for (int j = 0; j < TB; j++) {
		acc[j] = fa[j];
		__m512 ma = macc[j];
#pragma GCC unroll 8
		for (int sb = 0; sb < 8; sb++)
			ma = _mm512_fmadd_ps(p->mn[sb], _mm512_set1_ps(s[j * nb + sb]), ma);
		macc[j] = ma;
	}
}

static K5 AI void rows_k45_panel(int five, float *y, size_t ldy, const uint8_t *w, size_t n,
				 size_t r0, size_t r1, const void *act, size_t ntok)
{
	size_t bb = five ? KVK_Q5_K_BYTES : KVK_Q4_K_BYTES;
	size_t rb = kvk_kq_row_bytes(five ? KVK_W_Q5_K : KVK_W_Q4_K, n), nb = n / 32,
	       nsb = n / KVK_QK;
	const int8_t *q = act;
	const float *d = (const float *)((const uint8_t *)act + kvk_kqact_qbytes(n, ntok));
	const float *s = d + ntok * nb;
	__m512 acc[KP_TG], macc[KP_TG];
	struct kp_q4k pk;
	for (size_t p0 = r0; p0 < r1; p0 += 16) {
		size_t nr = r1 - p0 < 16 ? r1 - p0 : 16;
		for (size_t t0 = 0; t0 < ntok; t0 += KP_TG) {
			size_t tg = ntok - t0 < KP_TG ? ntok - t0 : KP_TG;
			for (size_t j = 0; j < tg; j++)
				acc[j] = macc[j] = _mm512_setzero_ps();
			for (size_t sb = 0; sb < nsb; sb++) {
				const uint8_t *rp[16];
				for (size_t r = 0; r < 16; r++) /* short panels repeat a row */
					rp[r] = w + (p0 + (r < nr ? r : 0)) * rb + sb * bb;
				kp_q4k_unpack(five, rp, &pk);
				size_t t = 0;
				for (; t + KP_TB <= tg; t += KP_TB) {
					size_t tt = t0 + t;
					kp_q4k_tile(KP_TB, &pk, q + tt * n + sb * KVK_QK,
						    d + tt * nb + 8 * sb, s + tt * nb + 8 * sb, n,
						    nb, acc + t, macc + t);
				}
				for (; t < tg; t++) {
					size_t tt = t0 + t;
					kp_q4k_tile(1, &pk, q + tt * n + sb * KVK_QK,
						    d + tt * nb + 8 * sb, s + tt * nb + 8 * sb, n,
						    nb, acc + t, macc + t);
				}
			}
			__mmask16 mk = (__mmask16)((1u << nr) - 1);
			for (size_t j = 0; j < tg; j++)
				_mm512_mask_storeu_ps(y + (t0 + j) * ldy + p0, mk,
						      _mm512_sub_ps(acc[j], macc[j]));
		}
	}
}

static K5 void rows_q4_k_panel(float *y, size_t ldy, const uint8_t *w, size_t n, size_t r0,
			       size_t r1, const void *act, size_t ntok)
{
	rows_k45_panel(0, y, ldy, w, n, r0, r1, act, ntok);
}

static K5 void rows_q5_k_panel(float *y, size_t ldy, const uint8_t *w, size_t n, size_t r0,
			       size_t r1, const void *act, size_t ntok)
{
	rows_k45_panel(1, y, ldy, w, n, r0, r1, act, ntok);
}

/* ---- Q6_K on 16-row panels (as Q4_K above) ----
 *
 * W[b][g] lane r: values 4g .. 4g + 3 of block b (of 32) of row r, unsigned 0..63 (q, not
 * q - 32). The offset goes into the start of each group's int32 dot: -32 * the sum of the
 * token's 16 activation bytes of the group, the same for every row (formed per token and
 * super-block). Per lane: acc = fma(dot_g, (d * sc_g) * dx_b, acc) over the 16 groups of 16 in
 * order: one f32 chain per output, batch-invariant. */

struct kp_q6k {
	__m512i w[8][8];
	__m512 scl[16];
};

static K5 AI void kp_q6k_unpack(const uint8_t *const *rp, __m512i vidx, struct kp_q6k *p)
{
	/* d (bytes 208-209) by a gather of bytes 206..209: a 16-byte load there would pass
	 * the end of the block */
	__m512i dg = _mm512_i32gather_epi32(vidx, rp[0] + 206, 1);
	__m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dg, 16)));
	__m512i sc[4];
	tr16x4(rp, 192, sc);
#pragma GCC unroll 16
	for (int gi = 0; gi < 16; gi++) {
		__m512i v = _mm512_srai_epi32(_mm512_slli_epi32(sc[gi / 4], 24 - 8 * (gi % 4)), 24);
		p->scl[gi] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(v));
	}
	const __m512i lo4 = _mm512_set1_epi8(15), m33 = _mm512_set1_epi8(0x33);
	const __m512i mcc = _mm512_set1_epi8((char)0xcc);
#pragma GCC unroll 2
	for (int h = 0; h < 2; h++) {
		__m512i la[8], lb[8], qh[8];
		tr16x8(rp, 64 * (size_t)h, la);	     /* ql dwords 16h + 0..7 */
		tr16x8(rp, 64 * (size_t)h + 32, lb); /* 16h + 8..15 */
		tr16x8(rp, 128 + 32 * (size_t)h, qh);
#pragma GCC unroll 8
		for (int g = 0; g < 8; g++) {
			__m512i a = la[g], b = lb[g]; /* k = 0 (low), 2 (high); k = 1, 3 */
			__m512i e = qh[g];	      /* qh bits 2k, 2k + 1 */
			/* low nibble from x, bits 4-5 from y: vpternlogd (x & 15) | (y & ~15) per
			 * byte, y's bits 6-7 zero by pre-masking e (shifts that cross a byte
			 * land in the next byte's low nibble, which x supplies) */
			__m512i e03 = _mm512_and_si512(e, m33), e47 = _mm512_and_si512(e, mcc);
			p->w[4 * h][g] =
			    _mm512_ternarylogic_epi32(a, _mm512_slli_epi16(e03, 4), lo4, 0xE4);
			p->w[4 * h + 1][g] =
			    _mm512_ternarylogic_epi32(b, _mm512_slli_epi16(e47, 2), lo4, 0xE4);
			p->w[4 * h + 2][g] =
			    _mm512_ternarylogic_epi32(_mm512_srli_epi16(a, 4), e03, lo4, 0xE4);
			p->w[4 * h + 3][g] = _mm512_ternarylogic_epi32(
			    _mm512_srli_epi16(b, 4), _mm512_srli_epi16(e47, 2), lo4, 0xE4);
		}
	}
}

/* -32 * the sum of each group of 16 of a token's 256 activation bytes: out[4 * (gi % 4) +
 * gi / 4] for group gi (the order the in-lane reduction leaves them in). Exact. */
static K5 AI void kp_q6k_corr(const int8_t *xq, int32_t *out)
{
	const __m512i c32 = _mm512_set1_epi8(32);
	__m512i p[4];
#pragma GCC unroll 4
	for (int i = 0; i < 4; i++) /* 128-bit lane L of p[i]: group 4i + L */
		p[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c32,
					   _mm512_loadu_si512(xq + 64 * i));
	__m512i t0 =
	    _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1]));
	__m512i t1 =
	    _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
	__m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
	_mm512_storeu_si512(out, _mm512_sub_epi32(_mm512_setzero_si512(), u));
}

static K5 AI void kp_q6k_tile(int TB, const struct kp_q6k *p, const int8_t *xq, const float *d,
			      size_t n, size_t nb, __m512 *acc)
{
	int32_t corr[KP_TB][16];
	__m512 fa[KP_TB];
#pragma GCC unroll 8
	for (int j = 0; j < TB; j++) {
		kp_q6k_corr(xq + j * n, corr[j]);
		fa[j] = acc[j];
	}
#pragma GCC unroll 1
	for (int gi = 0; gi < 16; gi++) {
		int b = gi / 2, g0 = 4 * (gi % 2);
		__m512i a[KP_TB];
#pragma GCC unroll 8
		for (int j = 0; j < TB; j++)
			a[j] = _mm512_set1_epi32(corr[j][4 * (gi % 4) + gi / 4]);
#pragma GCC unroll 4
		for (int g = g0; g < g0 + 4; g++)
#pragma GCC unroll 8
			for (int j = 0; j < TB; j++)
				a[j] = _mm512_dpbusd_epi32(
				    a[j], p->w[b][g],
				    _mm512_set1_epi32(ld4(xq + j * n + 32 * b + 4 * g)));
#pragma GCC unroll 8
		for (int j = 0; j < TB; j++)
			fa[j] = _mm512_fmadd_ps(
			    _mm512_cvtepi32_ps(a[j]),
			    _mm512_mul_ps(p->scl[gi], _mm512_set1_ps(d[j * nb + b])), fa[j]);
	}
#pragma GCC unroll 8
	for (int j = 0; j < TB; j++)
		acc[j] = fa[j];
}

static K5 void rows_q6_k_panel(float *y, size_t ldy, const uint8_t *w, size_t n, size_t r0,
			       size_t r1, const void *act, size_t ntok)
{
	size_t rb = kvk_kq_row_bytes(KVK_W_Q6_K, n), nb = n / 32, nsb = n / KVK_QK;
	const int8_t *q = act;
	const float *d = (const float *)((const uint8_t *)act + kvk_kqact_qbytes(n, ntok));
	__m512 acc[KP_TG];
	struct kp_q6k pk;
	for (size_t p0 = r0; p0 < r1; p0 += 16) {
		size_t nr = r1 - p0 < 16 ? r1 - p0 : 16;
		int32_t vi[16];
		for (size_t r = 0; r < 16; r++)
			vi[r] = (int32_t)((r < nr ? r : 0) * rb);
		__m512i vidx = _mm512_loadu_si512(vi);
		for (size_t t0 = 0; t0 < ntok; t0 += KP_TG) {
			size_t tg = ntok - t0 < KP_TG ? ntok - t0 : KP_TG;
			for (size_t j = 0; j < tg; j++)
				acc[j] = _mm512_setzero_ps();
			for (size_t sb = 0; sb < nsb; sb++) {
				const uint8_t *rp[16];
				for (size_t r = 0; r < 16; r++) /* short panels repeat a row */
					rp[r] =
					    w + (p0 + (r < nr ? r : 0)) * rb + sb * KVK_Q6_K_BYTES;
				kp_q6k_unpack(rp, vidx, &pk);
				size_t t = 0;
				for (; t + KP_TB <= tg; t += KP_TB) {
					size_t tt = t0 + t;
					kp_q6k_tile(KP_TB, &pk, q + tt * n + sb * KVK_QK,
						    d + tt * nb + 8 * sb, n, nb, acc + t);
				}
				for (; t < tg; t++) {
					size_t tt = t0 + t;
					kp_q6k_tile(1, &pk, q + tt * n + sb * KVK_QK,
						    d + tt * nb + 8 * sb, n, nb, acc + t);
				}
			}
			__mmask16 mk = (__mmask16)((1u << nr) - 1);
			for (size_t j = 0; j < tg; j++)
				_mm512_mask_storeu_ps(y + (t0 + j) * ldy + p0, mk, acc[j]);
		}
	}
}

/* ---- Q4_0 / Q5_0 on 16-row panels (as Q6_K above, blocks of 32) ----
 *
 * Chunks of up to 8 blocks (256 values; the last may be shorter: these rows need only be a
 * multiple of 32). W[k][g] lane r: values 4g .. 4g + 3 of block k of row r, unsigned (q, 0..15
 * or 0..31); the offset (8 or 16) goes into the start of the block's int32 dot as -off * the
 * token's sum over the block, the same for every row. d and Q5_0's 32 fifth bits come by
 * gathers (2-byte and 4-byte fields at odd offsets), the quants by one 4 x 4 transpose per
 * block; a group's 4 fifth bits become 4 bytes of 16 by one vpermd from a 16-entry table. Per
 * lane acc = fma(dot_b, d * dx_b, acc) over the blocks in order: batch-invariant. */

struct kp_q0 {
	__m512i w[8][8];
	__m512 d[8], m[8]; /* m: Q5_1's per-block min */
};

/* kind: 0 Q4_0, 1 Q5_0, 2 Q5_1 (f16 d, f16 m, qh[4], qs[16]: v = d q + m). */
static K5 AI void kp_q0_unpack(int kind, int kb, const uint8_t *base, __m512i vidx, struct kp_q0 *p)
{
	int five = kind > 0;
	size_t bb = kind == 2 ? KVK_Q5_1_BYTES : five ? KVK_Q5_0_BYTES : KVK_Q4_0_BYTES;
	size_t oqh = kind == 2 ? 4 : 2, oqs = kind == 2 ? 8 : five ? 6 : 2;
	const __m512i lo4 = _mm512_set1_epi8(15);
	/* entry i: bit j of i as 16 in byte j */
	const __m512i spread = _mm512_setr_epi32(0x00000000, 0x00000010, 0x00001000, 0x00001010,
						 0x00100000, 0x00100010, 0x00101000, 0x00101010,
						 0x10000000, 0x10000010, 0x10001000, 0x10001010,
						 0x10100000, 0x10100010, 0x10101000, 0x10101010);
	for (int k = 0; k < kb; k++) {
		const uint8_t *b = base + (size_t)k * bb;
		__m512i h0 = _mm512_i32gather_epi32(vidx, b, 1);
		p->d[k] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h0));
		if (kind == 2)
			p->m[k] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h0, 16)));
		const uint8_t *rp[16];
		int32_t vi[16];
		_mm512_storeu_si512(vi, vidx);
		for (int r = 0; r < 16; r++)
			rp[r] = b + vi[r];
		__m512i o[4];
		tr16x4(rp, oqs, o);
		__m512i qh =
		    five ? _mm512_i32gather_epi32(vidx, b + oqh, 1) : _mm512_setzero_si512();
#pragma GCC unroll 4
		for (int g = 0; g < 4; g++) {
			p->w[k][g] = _mm512_and_si512(o[g], lo4);
			p->w[k][4 + g] = _mm512_and_si512(_mm512_srli_epi16(o[g], 4), lo4);
		}
		if (five)
#pragma GCC unroll 8
			for (int g = 0; g < 8; g++) /* vpermd reads the low 4 bits of each index */
				p->w[k][g] = _mm512_or_si512(
				    p->w[k][g],
				    _mm512_permutexvar_epi32(_mm512_srli_epi32(qh, 4 * g), spread));
	}
}

/* -off * the sum of each block of 32 of a token's kb * 32 activation bytes (kb <= 8). */
static K5 AI void kp_q0_corr(int off, int kb, const int8_t *xq, int32_t *out)
{
	const __m512i c = _mm512_set1_epi8((char)off);
	__m512i p[4];
#pragma GCC unroll 4
	for (int i = 0; i < 4; i++) { /* 128-bit lane L of p[i]: group of 16 4i + L */
		int nbytes = 32 * kb - 64 * i;
		__mmask64 m = nbytes >= 64  ? ~(__mmask64)0
			      : nbytes <= 0 ? 0
					    : (((__mmask64)1 << nbytes) - 1);
		p[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c,
					   _mm512_maskz_loadu_epi8(m, xq + 64 * i));
	}
	__m512i t0 =
	    _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1]));
	__m512i t1 =
	    _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
	__m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
	int32_t g[16];
	_mm512_storeu_si512(g, u); /* group gi at 4 * (gi % 4) + gi / 4 */
	for (int k = 0; k < kb; k++) {
		int a = 2 * k, b = 2 * k + 1;
		out[k] = -(g[4 * (a % 4) + a / 4] + g[4 * (b % 4) + b / 4]);
	}
}

/* macc: Q5_1's min chain, fma(m, dx * sum(q), macc) per block (unused otherwise). */
static K5 AI void kp_q0_tile(int kind, int TB, int kb, const struct kp_q0 *p, const int8_t *xq,
			     const float *d, const float *s, size_t n, size_t nb, __m512 *acc,
			     __m512 *macc)
{
	int32_t corr[KP_TB][8];
	__m512 fa[KP_TB];
#pragma GCC unroll 8
	for (int j = 0; j < TB; j++) {
		if (kind == 2) /* unsigned: no offset */
			for (int k = 0; k < kb; k++)
				corr[j][k] = 0;
		else
			kp_q0_corr(kind ? 16 : 8, kb, xq + j * n, corr[j]);
		fa[j] = acc[j];
	}
#pragma GCC unroll 1
	for (int k = 0; k < kb; k++) {
		__m512i a[KP_TB];
#pragma GCC unroll 8
		for (int j = 0; j < TB; j++)
			a[j] = _mm512_set1_epi32(corr[j][k]);
#pragma GCC unroll 8
		for (int g = 0; g < 8; g++)
#pragma GCC unroll 8
			for (int j = 0; j < TB; j++)
				a[j] = _mm512_dpbusd_epi32(
				    a[j], p->w[k][g],
				    _mm512_set1_epi32(ld4(xq + j * n + 32 * k + 4 * g)));
#pragma GCC unroll 8
		for (int j = 0; j < TB; j++)
			fa[j] = _mm512_fmadd_ps(
			    _mm512_cvtepi32_ps(a[j]),
			    _mm512_mul_ps(p->d[k], _mm512_set1_ps(d[j * nb + k])), fa[j]);
	}
#pragma GCC unroll 8
	for (int j = 0; j < TB; j++) {
		acc[j] = fa[j];
		if (kind == 2) {
			__m512 ma = macc[j];
			for (int k = 0; k < kb; k++)
				ma = _mm512_fmadd_ps(p->m[k], _mm512_set1_ps(s[j * nb + k]), ma);
			macc[j] = ma;
		}
	}
}

static K5 AI void rows_q0_panel(int kind, float *y, size_t ldy, const uint8_t *w, size_t n,
				size_t r0, size_t r1, const void *act, size_t ntok)
{
	enum kvk_wtype wt = kind == 2 ? KVK_W_Q5_1 : kind ? KVK_W_Q5_0 : KVK_W_Q4_0;
	size_t bb = kind == 2 ? KVK_Q5_1_BYTES : kind ? KVK_Q5_0_BYTES : KVK_Q4_0_BYTES;
	size_t rb = kvk_kq_row_bytes(wt, n), nb = n / 32;
	const int8_t *q = act;
	const float *d = (const float *)((const uint8_t *)act + kvk_kqact_qbytes(n, ntok));
	const float *s = d + ntok * nb;
	__m512 acc[KP_TG], macc[KP_TG];
	struct kp_q0 pk;
	for (size_t p0 = r0; p0 < r1; p0 += 16) {
		size_t nr = r1 - p0 < 16 ? r1 - p0 : 16;
		int32_t vi[16];
		for (size_t r = 0; r < 16; r++) /* short panels repeat a row */
			vi[r] = (int32_t)((r < nr ? r : 0) * rb);
		__m512i vidx = _mm512_loadu_si512(vi);
		for (size_t t0 = 0; t0 < ntok; t0 += KP_TG) {
			size_t tg = ntok - t0 < KP_TG ? ntok - t0 : KP_TG;
			for (size_t j = 0; j < tg; j++)
				acc[j] = macc[j] = _mm512_setzero_ps();
			for (size_t b0 = 0; b0 < nb; b0 += 8) {
				int kb = nb - b0 < 8 ? (int)(nb - b0) : 8;
				kp_q0_unpack(kind, kb, w + p0 * rb + b0 * bb, vidx, &pk);
				size_t t = 0;
				for (; t + KP_TB <= tg; t += KP_TB) {
					size_t tt = t0 + t;
					kp_q0_tile(kind, KP_TB, kb, &pk, q + tt * n + 32 * b0,
						   d + tt * nb + b0, s + tt * nb + b0, n, nb,
						   acc + t, macc + t);
				}
				for (; t < tg; t++) {
					size_t tt = t0 + t;
					kp_q0_tile(kind, 1, kb, &pk, q + tt * n + 32 * b0,
						   d + tt * nb + b0, s + tt * nb + b0, n, nb,
						   acc + t, macc + t);
				}
			}
			__mmask16 mk = (__mmask16)((1u << nr) - 1);
			for (size_t j = 0; j < tg; j++)
				_mm512_mask_storeu_ps(y + (t0 + j) * ldy + p0, mk,
						      kind == 2 ? _mm512_add_ps(acc[j], macc[j])
								: acc[j]);
		}
	}
}

static K5 void rows_q4_0_panel(float *y, size_t ldy, const uint8_t *w, size_t n, size_t r0,
			       size_t r1, const void *act, size_t ntok)
{
	rows_q0_panel(0, y, ldy, w, n, r0, r1, act, ntok);
}

static K5 void rows_q5_0_panel(float *y, size_t ldy, const uint8_t *w, size_t n, size_t r0,
			       size_t r1, const void *act, size_t ntok)
{
	rows_q0_panel(1, y, ldy, w, n, r0, r1, act, ntok);
}

static K5 void rows_q5_1_panel(float *y, size_t ldy, const uint8_t *w, size_t n, size_t r0,
			       size_t r1, const void *act, size_t ntok)
{
	rows_q0_panel(2, y, ldy, w, n, r0, r1, act, ntok);
}

int kvk_kq_matmul_avx512(enum kvk_wtype wt, float *y, size_t ldy, const void *w, size_t n,
			 size_t r0, size_t r1, const void *act, size_t ntok)
{
	switch (wt) {
	case KVK_W_Q4_K:
		rows_q4_k_panel(y, ldy, w, n, r0, r1, act, ntok);
		return 0;
	case KVK_W_Q6_K:
		rows_q6_k_panel(y, ldy, w, n, r0, r1, act, ntok);
		return 0;
	case KVK_W_Q5_K:
		rows_q5_k_panel(y, ldy, w, n, r0, r1, act, ntok);
		return 0;
	case KVK_W_Q4_0:
		rows_q4_0_panel(y, ldy, w, n, r0, r1, act, ntok);
		return 0;
	case KVK_W_Q5_0:
		rows_q5_0_panel(y, ldy, w, n, r0, r1, act, ntok);
		return 0;
	case KVK_W_Q5_1:
		rows_q5_1_panel(y, ldy, w, n, r0, r1, act, ntok);
		return 0;
	default:
		return -ENOTSUP;
	}
}

#endif
