/* Q4_0 / Q4_K / Q5_K / Q6_K: row sizes, dequantization, a quantizer (for kvinfer-synth and the
 * tests), activation preparation and the scalar reference matmul. Layouts: kvk_quant_impl.h. */
#include "kvk_quant_impl.h"

#include <errno.h>
#include <math.h>
#include <string.h>

static float f16at(const uint8_t *p)
{
	uint16_t h;
	memcpy(&h, p, 2);
	return kvk_f16_to_f32(h);
}

static void f16put(uint8_t *p, float f)
{
	uint16_t h = kvk_f32_to_f16(f);
	memcpy(p, &h, 2);
}

size_t kvk_kq_row_bytes(enum kvk_wtype wt, size_t n)
{
	switch (wt) {
	case KVK_W_Q4_0:
		return n % 32 ? 0 : n / 32 * KVK_Q4_0_BYTES;
	case KVK_W_Q5_0:
		return n % 32 ? 0 : n / 32 * KVK_Q5_0_BYTES;
	case KVK_W_Q5_1:
		return n % 32 ? 0 : n / 32 * KVK_Q5_1_BYTES;
	case KVK_W_Q4_K:
		return n % KVK_QK ? 0 : n / KVK_QK * KVK_Q4_K_BYTES;
	case KVK_W_Q5_K:
		return n % KVK_QK ? 0 : n / KVK_QK * KVK_Q5_K_BYTES;
	case KVK_W_Q6_K:
		return n % KVK_QK ? 0 : n / KVK_QK * KVK_Q6_K_BYTES;
	default:
		return 0;
	}
}

/* ---- dequantization ---- */

static void deq_q4_0(const uint8_t *b, float *y)
{
	float d = f16at(b);
	for (int i = 0; i < 16; i++) {
		y[i] = d * (float)((b[2 + i] & 15) - 8);
		y[i + 16] = d * (float)((b[2 + i] >> 4) - 8);
	}
}

/* Q5_0 / Q5_1 value i (0..31) of a block, 0..31: nibble plus the fifth bit. */
static int q5_at(const uint8_t *b, int one, int i)
{
	const uint8_t *qh = b + (one ? 4 : 2), *qs = qh + 4;
	uint32_t h =
	    (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
	int lo = i < 16 ? qs[i] & 15 : qs[i - 16] >> 4;
	return lo | (int)((h >> i) & 1) << 4;
}

static void deq_q5(const uint8_t *b, int one, float *y)
{
	float d = f16at(b), m = one ? f16at(b + 2) : 0;
	for (int i = 0; i < 32; i++)
		y[i] = one ? d * (float)q5_at(b, 1, i) + m : d * (float)(q5_at(b, 0, i) - 16);
}

/* Q4_K and Q5_K (qh NULL for Q4_K). */
static void deq_k45(const uint8_t *b, const uint8_t *qh, const uint8_t *qs, float *y)
{
	float d = f16at(b), dmin = f16at(b + 2);
	for (int s = 0; s < 8; s++) {
		int sc, m;
		kvk_kq_scale_min(s, b + 4, &sc, &m);
		const uint8_t *q = qs + 32 * (s / 2);
		for (int i = 0; i < 32; i++) {
			int v = s % 2 ? q[i] >> 4 : q[i] & 15;
			if (qh)
				v |= ((qh[i] >> s) & 1) << 4;
			y[32 * s + i] = d * (float)sc * (float)v - dmin * (float)m;
		}
	}
}

/* Q6_K value e (0..255) of a block, q in 0..63, and its scale index. */
static int q6_at(const uint8_t *b, int e, int *si)
{
	int h = e / 128, k = (e % 128) / 32, l = e % 32;
	const uint8_t *ql = b + 64 * h + (k % 2) * 32, *qh = b + 128 + 32 * h;
	int lo = k < 2 ? ql[l] & 15 : ql[l] >> 4;
	*si = 8 * h + 2 * k + l / 16;
	return lo | (((qh[l] >> (2 * k)) & 3) << 4);
}

static void deq_q6_k(const uint8_t *b, float *y)
{
	float d = f16at(b + 208);
	for (int e = 0; e < KVK_QK; e++) {
		int si, q = q6_at(b, e, &si);
		y[e] = d * (float)(int8_t)b[192 + si] * (float)(q - 32);
	}
}

void kvk_kq_row_to_f32(enum kvk_wtype wt, const void *row, size_t n, float *out)
{
	const uint8_t *b = row;
	switch (wt) {
	case KVK_W_Q4_0:
		for (size_t i = 0; i < n / 32; i++)
			deq_q4_0(b + i * KVK_Q4_0_BYTES, out + i * 32);
		return;
	case KVK_W_Q5_0:
	case KVK_W_Q5_1: {
		int one = wt == KVK_W_Q5_1;
		size_t bb = one ? KVK_Q5_1_BYTES : KVK_Q5_0_BYTES;
		for (size_t i = 0; i < n / 32; i++)
			deq_q5(b + i * bb, one, out + i * 32);
		return;
	}
	case KVK_W_Q4_K:
		for (size_t i = 0; i < n / KVK_QK; i++) {
			const uint8_t *p = b + i * KVK_Q4_K_BYTES;
			deq_k45(p, NULL, p + 16, out + i * KVK_QK);
		}
		return;
	case KVK_W_Q5_K:
		for (size_t i = 0; i < n / KVK_QK; i++) {
			const uint8_t *p = b + i * KVK_Q5_K_BYTES;
			deq_k45(p, p + 16, p + 48, out + i * KVK_QK);
		}
		return;
	case KVK_W_Q6_K:
		for (size_t i = 0; i < n / KVK_QK; i++)
			deq_q6_k(b + i * KVK_Q6_K_BYTES, out + i * KVK_QK);
		return;
	default:
		return;
	}
}

/* ---- quantization: plain round-to-nearest with min/max scales (no search) ---- */

static int clampi(int v, int lo, int hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

static void qz_q4_0(const float *x, uint8_t *b)
{
	float amax = 0, mx = 0;
	for (int i = 0; i < 32; i++)
		if (fabsf(x[i]) > amax) {
			amax = fabsf(x[i]);
			mx = x[i];
		}
	/* the extreme value maps to -8, so the full 16 levels are used on its side */
	float d = mx / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
	f16put(b, d);
	for (int i = 0; i < 16; i++) {
		int a = clampi((int)lrintf(x[i] * id) + 8, 0, 15);
		int c = clampi((int)lrintf(x[i + 16] * id) + 8, 0, 15);
		b[2 + i] = (uint8_t)(a | (c << 4));
	}
}

static void qz_q5(const float *x, int one, uint8_t *b)
{
	float d, m = 0;
	if (one) {
		float lo = x[0], hi = x[0];
		for (int i = 1; i < 32; i++) {
			lo = fminf(lo, x[i]);
			hi = fmaxf(hi, x[i]);
		}
		d = (hi - lo) / 31.0f;
		f16put(b + 2, lo);
		m = f16at(b + 2);
	} else {
		float amax = 0, mx = 0;
		for (int i = 0; i < 32; i++)
			if (fabsf(x[i]) > amax) {
				amax = fabsf(x[i]);
				mx = x[i];
			}
		d = mx / -16.0f;
	}
	f16put(b, d);
	d = f16at(b);
	float id = d != 0 ? 1.0f / d : 0.0f;
	uint8_t *qh = b + (one ? 4 : 2), *qs = qh + 4;
	uint32_t h = 0;
	memset(qs, 0, 16);
	for (int i = 0; i < 32; i++) {
		int q = one ? clampi((int)lrintf((x[i] - m) * id), 0, 31)
			    : clampi((int)lrintf(x[i] * id) + 16, 0, 31);
		qs[i % 16] |= (uint8_t)((q & 15) << (i < 16 ? 0 : 4));
		h |= (uint32_t)(q >> 4) << i;
	}
	for (int k = 0; k < 4; k++)
		qh[k] = (uint8_t)(h >> (8 * k));
}

/* Q4_K / Q5_K (levels 15 or 31; qh NULL for Q4_K). */
static void qz_k45(const float *x, int levels, uint8_t *b, uint8_t *qh, uint8_t *qs)
{
	float scale[8], mins[8], smax = 0, mmax = 0;
	for (int s = 0; s < 8; s++) {
		float lo = 0, hi = 0; /* the min is clamped at 0: m >= 0 */
		for (int i = 0; i < 32; i++) {
			lo = fminf(lo, x[32 * s + i]);
			hi = fmaxf(hi, x[32 * s + i]);
		}
		scale[s] = (hi - lo) / (float)levels;
		mins[s] = -lo;
		smax = fmaxf(smax, scale[s]);
		mmax = fmaxf(mmax, mins[s]);
	}
	float d = smax / 63.0f, dmin = mmax / 63.0f;
	f16put(b, d);
	f16put(b + 2, dmin);
	d = f16at(b), dmin = f16at(b + 2);
	uint8_t *sp = b + 4;
	memset(sp, 0, 12);
	if (qh)
		memset(qh, 0, 32);
	memset(qs, 0, 128);
	for (int s = 0; s < 8; s++) {
		int sc = d > 0 ? clampi((int)lrintf(scale[s] / d), 0, 63) : 0;
		int m = dmin > 0 ? clampi((int)lrintf(mins[s] / dmin), 0, 63) : 0;
		if (s < 4) {
			sp[s] |= (uint8_t)sc;
			sp[s + 4] |= (uint8_t)m;
		} else {
			sp[s + 4] = (uint8_t)((sc & 15) | ((m & 15) << 4));
			sp[s - 4] |= (uint8_t)((sc >> 4) << 6);
			sp[s] |= (uint8_t)((m >> 4) << 6);
		}
		float ds = d * (float)sc, dm = dmin * (float)m;
		for (int i = 0; i < 32; i++) {
			int v =
			    ds > 0 ? clampi((int)lrintf((x[32 * s + i] + dm) / ds), 0, levels) : 0;
			qs[32 * (s / 2) + i] |= (uint8_t)((v & 15) << (4 * (s % 2)));
			if (qh)
				qh[i] |= (uint8_t)((v >> 4) << s);
		}
	}
}

static void qz_q6_k(const float *x, uint8_t *b)
{
	float scale[16], smax = 0, ssig = 0;
	for (int g = 0; g < 16; g++) {
		float amax = 0, mx = 0;
		for (int i = 0; i < 16; i++)
			if (fabsf(x[16 * g + i]) > amax) {
				amax = fabsf(x[16 * g + i]);
				mx = x[16 * g + i];
			}
		scale[g] = mx / -32.0f;
		if (fabsf(scale[g]) > smax) {
			smax = fabsf(scale[g]);
			ssig = scale[g];
		}
	}
	float d = ssig / -128.0f;
	f16put(b + 208, d);
	d = f16at(b + 208);
	memset(b, 0, 208);
	for (int g = 0; g < 16; g++)
		b[192 + g] =
		    (uint8_t)(int8_t)(d != 0 ? clampi((int)lrintf(scale[g] / d), -128, 127) : 0);
	for (int e = 0; e < KVK_QK; e++) {
		int h = e / 128, k = (e % 128) / 32, l = e % 32, g = e / 16;
		float ds = d * (float)(int8_t)b[192 + g];
		int q = ds != 0 ? clampi((int)lrintf(x[e] / ds), -32, 31) + 32 : 32;
		uint8_t *ql = b + 64 * h + (k % 2) * 32, *qh = b + 128 + 32 * h;
		ql[l] |= (uint8_t)((q & 15) << (k < 2 ? 0 : 4));
		qh[l] |= (uint8_t)((q >> 4) << (2 * k));
	}
}

int kvk_quantize_row(enum kvk_wtype wt, void *out, const float *x, size_t n)
{
	uint8_t *o = out;
	switch (wt) {
	case KVK_W_Q4_0:
		if (n % 32)
			return -EINVAL;
		for (size_t i = 0; i < n / 32; i++)
			qz_q4_0(x + 32 * i, o + i * KVK_Q4_0_BYTES);
		return 0;
	case KVK_W_Q5_0:
	case KVK_W_Q5_1:
		if (n % 32)
			return -EINVAL;
		for (size_t i = 0; i < n / 32; i++)
			qz_q5(x + 32 * i, wt == KVK_W_Q5_1,
			      o + i * (wt == KVK_W_Q5_1 ? KVK_Q5_1_BYTES : KVK_Q5_0_BYTES));
		return 0;
	case KVK_W_Q4_K:
	case KVK_W_Q5_K:
	case KVK_W_Q6_K:
		if (n % KVK_QK)
			return -EINVAL;
		for (size_t i = 0; i < n / KVK_QK; i++) {
			const float *xb = x + KVK_QK * i;
			if (wt == KVK_W_Q6_K) {
				qz_q6_k(xb, o + i * KVK_Q6_K_BYTES);
			} else if (wt == KVK_W_Q4_K) {
				uint8_t *p = o + i * KVK_Q4_K_BYTES;
				qz_k45(xb, 15, p, NULL, p + 16);
			} else {
				uint8_t *p = o + i * KVK_Q5_K_BYTES;
				qz_k45(xb, 31, p, p + 16, p + 48);
			}
		}
		return 0;
	default:
		return -EINVAL;
	}
}

/* ---- activations ---- */

void kvk_kq_act_prepare(void *act, size_t ntok, const float *x, size_t ldx, size_t n, size_t t0,
			size_t t1)
{
	size_t nb = n / 32;
	int8_t *q = act;
	float *d = (float *)((uint8_t *)act + kvk_kqact_qbytes(n, ntok));
	float *s = d + ntok * nb;
	for (size_t t = t0; t < t1; t++) {
		const float *xt = x + t * ldx;
		for (size_t b = 0; b < nb; b++) {
			const float *xb = xt + b * 32;
			float amax = 0;
			for (int i = 0; i < 32; i++)
				amax = fmaxf(amax, fabsf(xb[i]));
			float db = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
			int sum = 0;
			for (int i = 0; i < 32; i++) {
				/* |q| <= 127: the AVX2 kernels' sign trick needs -128 kept out */
				float v = xb[i] * id;
				int qi = clampi((int)(v + (v < 0 ? -0.5f : 0.5f)), -127, 127);
				q[t * n + b * 32 + i] = (int8_t)qi;
				sum += qi;
			}
			d[t * nb + b] = db;
			s[t * nb + b] = db * (float)sum;
		}
	}
}

/* ---- scalar reference ---- */

/* dot(row, token) for one row; xq/xd/xs are the token's quants, block scales and sums. */
static float dot_scalar(enum kvk_wtype wt, const uint8_t *row, size_t n, const int8_t *xq,
			const float *xd, const float *xs)
{
	float acc = 0, macc = 0;
	if (wt == KVK_W_Q5_0 || wt == KVK_W_Q5_1) {
		int one = wt == KVK_W_Q5_1;
		size_t bb = one ? KVK_Q5_1_BYTES : KVK_Q5_0_BYTES;
		for (size_t b = 0; b < n / 32; b++) {
			const uint8_t *p = row + b * bb;
			int s = 0;
			for (int i = 0; i < 32; i++)
				s += (q5_at(p, one, i) - (one ? 0 : 16)) * xq[32 * b + i];
			acc += (float)s * (f16at(p) * xd[b]);
			if (one)
				macc += f16at(p + 2) * xs[b];
		}
		return acc + macc;
	}
	if (wt == KVK_W_Q4_0) {
		for (size_t b = 0; b < n / 32; b++) {
			const uint8_t *p = row + b * KVK_Q4_0_BYTES;
			int s = 0;
			for (int i = 0; i < 16; i++)
				s += ((p[2 + i] & 15) - 8) * xq[32 * b + i] +
				     ((p[2 + i] >> 4) - 8) * xq[32 * b + 16 + i];
			acc += (float)s * (f16at(p) * xd[b]);
		}
		return acc;
	}
	for (size_t sb = 0; sb < n / KVK_QK; sb++) {
		const int8_t *x = xq + KVK_QK * sb;
		if (wt == KVK_W_Q6_K) {
			const uint8_t *p = row + sb * KVK_Q6_K_BYTES;
			float d = f16at(p + 208);
			for (int b = 0; b < 8; b++) {
				int s[2] = {0, 0}, si = 0;
				for (int i = 0; i < 32; i++)
					s[i / 16] +=
					    (q6_at(p, 32 * b + i, &si) - 32) * x[32 * b + i];
				int is =
				    (int8_t)p[192 + 2 * b] * s[0] + (int8_t)p[193 + 2 * b] * s[1];
				acc += (float)is * (d * xd[8 * sb + b]);
			}
			continue;
		}
		size_t bb = wt == KVK_W_Q4_K ? KVK_Q4_K_BYTES : KVK_Q5_K_BYTES;
		const uint8_t *p = row + sb * bb;
		const uint8_t *qh = wt == KVK_W_Q5_K ? p + 16 : NULL;
		const uint8_t *qs = wt == KVK_W_Q5_K ? p + 48 : p + 16;
		float d = f16at(p), dmin = f16at(p + 2);
		for (int b = 0; b < 8; b++) {
			int sc, m, s = 0;
			kvk_kq_scale_min(b, p + 4, &sc, &m);
			for (int i = 0; i < 32; i++) {
				const uint8_t *q = qs + 32 * (b / 2);
				int v = b % 2 ? q[i] >> 4 : q[i] & 15;
				if (qh)
					v |= ((qh[i] >> b) & 1) << 4;
				s += v * x[32 * b + i];
			}
			acc += (float)s * (d * (float)sc * xd[8 * sb + b]);
			macc += dmin * (float)m * xs[8 * sb + b];
		}
	}
	return acc - macc;
}

void kvk_kq_matmul_scalar(enum kvk_wtype wt, float *y, size_t ldy, const void *w, size_t n,
			  size_t r0, size_t r1, const void *act, size_t ntok)
{
	size_t rb = kvk_kq_row_bytes(wt, n), nb = n / 32;
	const int8_t *q = act;
	const float *d = (const float *)((const uint8_t *)act + kvk_kqact_qbytes(n, ntok));
	const float *s = d + ntok * nb;
	for (size_t r = r0; r < r1; r++)
		for (size_t t = 0; t < ntok; t++)
			y[t * ldy + r] = dot_scalar(wt, (const uint8_t *)w + r * rb, n, q + t * n,
						    d + t * nb, s + t * nb);
}

float kvk_kq_value(enum kvk_wtype wt, const void *row, size_t i)
{
	const uint8_t *b = row;
	switch (wt) {
	case KVK_W_Q4_0: {
		const uint8_t *p = b + i / 32 * KVK_Q4_0_BYTES;
		int k = (int)(i % 32);
		return f16at(p) * (float)((k < 16 ? p[2 + k] & 15 : p[2 + k - 16] >> 4) - 8);
	}
	case KVK_W_Q5_0:
	case KVK_W_Q5_1: {
		int one = wt == KVK_W_Q5_1;
		const uint8_t *p = b + i / 32 * (one ? KVK_Q5_1_BYTES : KVK_Q5_0_BYTES);
		int q = q5_at(p, one, (int)(i % 32));
		return one ? f16at(p) * (float)q + f16at(p + 2) : f16at(p) * (float)(q - 16);
	}
	case KVK_W_Q4_K:
	case KVK_W_Q5_K: {
		int five = wt == KVK_W_Q5_K;
		const uint8_t *p = b + i / KVK_QK * (five ? KVK_Q5_K_BYTES : KVK_Q4_K_BYTES);
		int e = (int)(i % KVK_QK), s = e / 32, sc, m;
		kvk_kq_scale_min(s, p + 4, &sc, &m);
		uint8_t q = p[(five ? 48 : 16) + 32 * (s / 2) + e % 32];
		int v = s % 2 ? q >> 4 : q & 15;
		if (five)
			v |= ((p[16 + e % 32] >> s) & 1) << 4;
		return f16at(p) * (float)sc * (float)v - f16at(p + 2) * (float)m;
	}
	case KVK_W_Q6_K: {
		const uint8_t *p = b + i / KVK_QK * KVK_Q6_K_BYTES;
		int si, q = q6_at(p, (int)(i % KVK_QK), &si);
		return f16at(p + 208) * (float)(int8_t)p[192 + si] * (float)(q - 32);
	}
	default:
		return 0;
	}
}
