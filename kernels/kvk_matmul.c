/* Matmul front end: ISA dispatch, activation preparation, number conversions and the portable
 * scalar kernels. Every output element is reduced in index order, the same for any batch. */
#include "kvk_matmul_impl.h"
#include "kvk_quant_impl.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>
#ifdef KVK_HAVE_X86
#include <cpuid.h>
#endif

static enum kvk_isa isa_probe(void)
{
#ifdef KVK_HAVE_X86
	/* F16C through CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports has no "f16c". */
	unsigned a, b, c, d;
	int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
	__builtin_cpu_init();
	if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c))
		return KVK_ISA_SCALAR;
	/* the compiler runtime reports AVX-512 only when the OS saves its state (XCR0) */
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
		return KVK_ISA_AVX512;
	return KVK_ISA_AVX2;
#endif
	return KVK_ISA_SCALAR;
}

enum kvk_isa kvk_isa_best(void)
{
	/* A cache of a hardware fact, not state: every thread computes the same value, so a
	 * race only repeats the probe. It matters: cpuid traps to the hypervisor in a VM, and
	 * probing on every matmul call cost 17 % of decode time. */
	static _Atomic int best;
	int b = atomic_load_explicit(&best, memory_order_relaxed);
	if (!b) {
		b = (int)isa_probe();
		atomic_store_explicit(&best, b, memory_order_relaxed);
	}
	return (enum kvk_isa)b;
}

const char *kvk_isa_name(enum kvk_isa isa)
{
	switch (isa) {
	case KVK_ISA_AUTO:
		return "auto";
	case KVK_ISA_SCALAR:
		return "scalar";
	case KVK_ISA_AVX2:
		return "avx2";
	case KVK_ISA_AVX512:
		return "avx512";
	}
	return "?";
}

/* Resolves AUTO and refuses an ISA this CPU lacks (falls back to scalar). */
static enum kvk_isa resolve(enum kvk_isa isa)
{
	if (isa == KVK_ISA_SCALAR)
		return isa;
	enum kvk_isa best = kvk_isa_best();
	if (isa == KVK_ISA_AUTO || isa > best)
		return best;
	return isa;
}

int kvk_wtype_valid(int wt)
{
	return wt == KVK_W_F32 || wt == KVK_W_F16 || wt == KVK_W_Q8_0 || wt == KVK_W_BF16 ||
	       kvk_wtype_kq((enum kvk_wtype)wt);
}

size_t kvk_row_bytes(enum kvk_wtype wt, size_t n)
{
	switch (wt) {
	case KVK_W_F32:
		return n * 4;
	case KVK_W_F16:
	case KVK_W_BF16:
		return n * 2;
	case KVK_W_Q8_0:
		return n % 32 ? 0 : n / 32 * 34;
	case KVK_W_Q4_0:
	case KVK_W_Q5_0:
	case KVK_W_Q5_1:
	case KVK_W_Q4_K:
	case KVK_W_Q5_K:
	case KVK_W_Q6_K:
		return kvk_kq_row_bytes(wt, n);
	case KVK_W_F16_P16: /* not row-major: kvk_f16_pack_bytes */
		return 0;
	}
	return 0;
}

size_t kvk_f16_pack_bytes(size_t rows, size_t n)
{
	return (rows + 15) / 16 * 16 * n * 2;
}

void kvk_f16_pack(uint16_t *dst, const uint16_t *w, size_t rows, size_t n, size_t r0, size_t r1)
{
	if (r0 >= r1) /* an empty share (its end may be rows, past which lies only padding) */
		return;
	size_t end = r1 == rows ? (rows + 15) / 16 * 16 : r1;
	for (size_t p = r0; p < end; p += 16) {
		uint16_t *d = dst + p * n;
		for (size_t i = 0; i < 16; i++) {
			const uint16_t *row = w + (p + i) * n;
			if (p + i >= rows) {
				for (size_t k = 0; k < n; k++)
					d[k * 16 + i] = 0;
				continue;
			}
			for (size_t k = 0; k < n; k++)
				d[k * 16 + i] = row[k];
		}
	}
}

int kvk_f16_pack_wanted(enum kvk_isa isa)
{
	return resolve(isa) == KVK_ISA_AVX512;
}

/* The packed layout on an ISA without its kernel: the AVX-512 order (one fma chain per output
 * over k in order from 0), so the same bits; slow (fmaf), for tests and odd CPUs. */
static void matmul_f16p_scalar(float *y, size_t ldy, const uint16_t *wp, size_t n, size_t r0,
			       size_t r1, const float *x, size_t ntok)
{
	for (size_t r = r0; r < r1; r++) {
		const uint16_t *col = wp + (r / 16) * 16 * n + r % 16;
		for (size_t t = 0; t < ntok; t++) {
			float acc = 0;
			for (size_t k = 0; k < n; k++)
				acc = fmaf(kvk_f16_to_f32(col[k * 16]), x[t * n + k], acc);
			y[t * ldy + r] = acc;
		}
	}
}

float kvk_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff, x;
	if (e == 0) {
		/* zero or subnormal: m * 2^-24, exact in float */
		float v = ldexpf((float)m, -24);
		memcpy(&x, &v, 4);
		x |= sign;
	} else if (e == 31) {
		x = sign | 0x7f800000u | (m << 13);
	} else {
		x = sign | ((e + 112) << 23) | (m << 13);
	}
	float f;
	memcpy(&f, &x, 4);
	return f;
}

uint16_t kvk_f32_to_f16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
	if (ax >= 0x7f800000u) /* inf, nan (keep it a nan) */
		return (uint16_t)(sign | 0x7c00 |
				  (ax > 0x7f800000u ? 0x200 | ((ax >> 13) & 0x3ff) : 0));
	if (ax >= 0x47800000u) /* >= 65536: overflows */
		return (uint16_t)(sign | 0x7c00);
	if (ax < 0x38800000u) { /* below 2^-14: a half subnormal, m = round(v * 2^24) */
		float v;
		memcpy(&v, &ax, 4);
		return (uint16_t)(sign | (uint32_t)nearbyintf(v * 16777216.0f));
	}
	uint32_t h = ((((ax >> 23) - 127 + 15) << 10) | ((ax & 0x7fffff) >> 13));
	uint32_t rem = ax & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
		h++; /* a carry into the exponent is right, up to inf */
	return (uint16_t)(sign | h);
}

float kvk_bf16_to_f32(uint16_t h)
{
	uint32_t x = (uint32_t)h << 16;
	float f;
	memcpy(&f, &x, 4);
	return f;
}

uint16_t kvk_f32_to_bf16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40);
	return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

static float wval(enum kvk_wtype wt, const void *row, size_t k)
{
	switch (wt) {
	case KVK_W_F32:
		return ((const float *)row)[k];
	case KVK_W_F16: {
		uint16_t h;
		memcpy(&h, (const uint8_t *)row + 2 * k, 2);
		return kvk_f16_to_f32(h);
	}
	case KVK_W_BF16: {
		uint16_t h;
		memcpy(&h, (const uint8_t *)row + 2 * k, 2);
		return kvk_bf16_to_f32(h);
	}
	case KVK_W_Q8_0: {
		const uint8_t *blk = (const uint8_t *)row + k / 32 * 34;
		uint16_t h;
		memcpy(&h, blk, 2);
		return kvk_f16_to_f32(h) * (float)(int8_t)blk[2 + k % 32];
	}
	default: /* the block types go through kvk_kq_row_to_f32 */
		return 0;
	}
}

void kvk_row_to_f32(enum kvk_wtype wt, const void *w, size_t n, size_t r, float *out)
{
	const uint8_t *row = (const uint8_t *)w + r * kvk_row_bytes(wt, n);
	if (kvk_wtype_kq(wt)) {
		kvk_kq_row_to_f32(wt, row, n, out);
		return;
	}
	for (size_t k = 0; k < n; k++)
		out[k] = wval(wt, row, k);
}

size_t kvk_act_bytes(enum kvk_wtype wt, size_t n, size_t ntok)
{
	if (wt == KVK_W_Q8_0)
		return kvk_q8act_qbytes(n, ntok) +
		       ntok * (n / 32) * (sizeof(float) + sizeof(int32_t));
	if (kvk_wtype_kq(wt))
		return kvk_kqact_qbytes(n, ntok) + 2 * ntok * (n / 32) * sizeof(float);
	return n * ntok * sizeof(float);
}

/* The reference for the SIMD versions: per block of 32, d = amax / 127 and q = x * 127 / amax
 * rounded half away from zero. */
void kvk_act_prepare_q8_ref(void *act, size_t ntok, const float *x, size_t ldx, size_t n, size_t t0,
			    size_t t1)
{
	size_t nb = n / 32;
	int8_t *q = act;
	float *d = (float *)((uint8_t *)act + kvk_q8act_qbytes(n, ntok));
	int32_t *c = (int32_t *)((uint8_t *)act + kvk_q8act_corr_off(n, ntok));
	for (size_t t = t0; t < t1; t++) {
		const float *xt = x + t * ldx;
		for (size_t b = 0; b < nb; b++) {
			const float *xb = xt + b * 32;
			int32_t sum = 0;
			float amax = 0;
			for (int i = 0; i < 32; i++) {
				float a = xb[i] < 0 ? -xb[i] : xb[i];
				amax = a > amax ? a : amax;
			}
			float db = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
			d[t * nb + b] = db;
			for (int i = 0; i < 32; i++) {
				/* round half away from zero; |x * id| <= 127 up to rounding, and
				 * the clamp keeps -128 out (maddubs needs |x| <= 127) */
				float v = xb[i] * id;
				int qi = (int)(v + (v < 0 ? -0.5f : 0.5f));
				qi = qi > 127 ? 127 : qi < -127 ? -127 : qi;
				q[t * n + b * 32 + i] = (int8_t)qi;
				sum += qi;
			}
			c[t * nb + b] = -128 * sum;
		}
	}
}

void kvk_act_prepare(enum kvk_wtype wt, void *act, size_t ntok, const float *x, size_t ldx,
		     size_t n, size_t t0, size_t t1)
{
	if (kvk_wtype_kq(wt)) {
		kvk_kq_act_prepare(act, ntok, x, ldx, n, t0, t1);
		return;
	}
	if (wt != KVK_W_Q8_0) {
		for (size_t t = t0; t < t1; t++)
			if ((const void *)(x + t * ldx) != (void *)((float *)act + t * n))
				memcpy((float *)act + t * n, x + t * ldx, n * sizeof(float));
		return;
	}
#ifdef KVK_HAVE_X86
	/* SIMD versions give the same bytes, so the choice never changes a result */
	switch (kvk_isa_best()) {
	case KVK_ISA_AVX512:
		kvk_act_prepare_q8_avx512(act, ntok, x, ldx, n, t0, t1);
		return;
	case KVK_ISA_AVX2:
		kvk_act_prepare_q8_avx2(act, ntok, x, ldx, n, t0, t1);
		return;
	default:
		break;
	}
#endif
	kvk_act_prepare_q8_ref(act, ntok, x, ldx, n, t0, t1);
}

size_t kvk_matmul_scratch_floats(enum kvk_wtype wt, size_t n)
{
	if (wt == KVK_W_F16 || wt == KVK_W_F16_P16 ||
	    wt == KVK_W_BF16) /* AVX-512 F16 panels hold 2 * 16 rows */
		return 2 * KVK_PANEL_ROWS * ((n + 7) & ~(size_t)7);
	if (wt == KVK_W_Q8_0) /* two interleaved panels: each its bytes, then its f32 scales */
		return 2 * KVK_PANEL_ROWS * (n / 4 + n / 32);
	return 0;
}

static void matmul_scalar(enum kvk_wtype wt, float *y, size_t ldy, const void *w, size_t n,
			  size_t r0, size_t r1, const void *act, size_t ntok)
{
	size_t rb = kvk_row_bytes(wt, n);
	if (wt == KVK_W_Q8_0) {
		size_t nb = n / 32;
		const int8_t *q = act;
		const float *d = (const float *)((const uint8_t *)act + kvk_q8act_qbytes(n, ntok));
		for (size_t r = r0; r < r1; r++) {
			const uint8_t *row = (const uint8_t *)w + r * rb;
			for (size_t t = 0; t < ntok; t++) {
				float acc = 0;
				for (size_t b = 0; b < nb; b++) {
					const uint8_t *blk = row + b * 34;
					const int8_t *xq = q + t * n + b * 32;
					int32_t s = 0;
					for (int i = 0; i < 32; i++)
						s += (int32_t)(int8_t)blk[2 + i] * xq[i];
					uint16_t h;
					memcpy(&h, blk, 2);
					acc += (float)s * (kvk_f16_to_f32(h) * d[t * nb + b]);
				}
				y[t * ldy + r] = acc;
			}
		}
		return;
	}
	const float *x = act;
	for (size_t r = r0; r < r1; r++) {
		const uint8_t *row = (const uint8_t *)w + r * rb;
		for (size_t t = 0; t < ntok; t++) {
			float acc = 0;
			for (size_t k = 0; k < n; k++)
				acc += wval(wt, row, k) * x[t * n + k];
			y[t * ldy + r] = acc;
		}
	}
}

void kvk_matmul(enum kvk_isa isa, enum kvk_wtype wt, float *y, size_t ldy, const void *w, size_t n,
		size_t r0, size_t r1, const void *act, size_t ntok, float *scratch)
{
	if (r0 >= r1 || ntok == 0)
		return;
	if (wt == KVK_W_F16_P16) {
#ifdef KVK_HAVE_X86
		if (resolve(isa) == KVK_ISA_AVX512) {
			kvk_matmul_avx512(wt, y, ldy, w, n, r0, r1, act, ntok, scratch);
			return;
		}
#endif
		matmul_f16p_scalar(y, ldy, w, n, r0, r1, act, ntok);
		return;
	}
	if (kvk_wtype_kq(wt)) {
#ifdef KVK_HAVE_X86
		/* AVX-512 + VNNI kernels first; any wider ISA has AVX2 too */
		enum kvk_isa ri = resolve(isa);
		if (ri == KVK_ISA_AVX512 &&
		    kvk_kq_matmul_avx512(wt, y, ldy, w, n, r0, r1, act, ntok) == 0)
			return;
		if (ri >= KVK_ISA_AVX2) {
			kvk_kq_matmul_avx2(wt, y, ldy, w, n, r0, r1, act, ntok);
			return;
		}
#endif
		kvk_kq_matmul_scalar(wt, y, ldy, w, n, r0, r1, act, ntok);
		return;
	}
#ifdef KVK_HAVE_X86
	switch (resolve(isa)) {
	case KVK_ISA_AVX512:
		kvk_matmul_avx512(wt, y, ldy, w, n, r0, r1, act, ntok, scratch);
		return;
	case KVK_ISA_AVX2:
		kvk_matmul_avx2(wt, y, ldy, w, n, r0, r1, act, ntok, scratch);
		return;
	default:
		break;
	}
#endif
	(void)scratch;
	(void)isa;
	matmul_scalar(wt, y, ldy, w, n, r0, r1, act, ntok);
}

static float dot_f16_scalar(const float *a, const uint16_t *b, size_t n)
{
	float s = 0;
	for (size_t i = 0; i < n; i++)
		s += a[i] * kvk_f16_to_f32(b[i]);
	return s;
}

static void axpy_f16_scalar(float *y, float s, const uint16_t *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		y[i] += s * kvk_f16_to_f32(b[i]);
}

kvk_dot_f16_fn kvk_dot_f16_get(enum kvk_isa isa)
{
#ifdef KVK_HAVE_X86
	if (resolve(isa) == KVK_ISA_AVX512)
		return kvk_dot_f16_avx512;
	if (resolve(isa) == KVK_ISA_AVX2)
		return kvk_dot_f16_avx2;
#endif
	(void)isa;
	return dot_f16_scalar;
}

kvk_axpy_f16_fn kvk_axpy_f16_get(enum kvk_isa isa)
{
#ifdef KVK_HAVE_X86
	if (resolve(isa) == KVK_ISA_AVX512)
		return kvk_axpy_f16_avx512;
	if (resolve(isa) == KVK_ISA_AVX2)
		return kvk_axpy_f16_avx2;
#endif
	(void)isa;
	return axpy_f16_scalar;
}

static void qk_f16_scalar(float *sc, size_t ldsc, const float *q, size_t G, size_t hd,
			  const uint16_t *k, size_t ks, size_t np, float scale)
{
	for (size_t p = 0; p < np; p++)
		for (size_t g = 0; g < G; g++)
			sc[g * ldsc + p] = dot_f16_scalar(q + g * hd, k + p * ks, hd) * scale;
}

static void av_f16_scalar(float *o, const float *sc, size_t ldsc, size_t G, size_t hd,
			  const uint16_t *v, size_t vs, size_t np)
{
	for (size_t p = 0; p < np; p++)
		for (size_t g = 0; g < G; g++)
			axpy_f16_scalar(o + g * hd, sc[g * ldsc + p], v + p * vs, hd);
}

kvk_qk_f16_fn kvk_qk_f16_get(enum kvk_isa isa)
{
#ifdef KVK_HAVE_X86
	if (resolve(isa) == KVK_ISA_AVX512)
		return kvk_qk_f16_avx512;
	if (resolve(isa) == KVK_ISA_AVX2)
		return kvk_qk_f16_avx2;
#endif
	(void)isa;
	return qk_f16_scalar;
}

kvk_av_f16_fn kvk_av_f16_get(enum kvk_isa isa)
{
#ifdef KVK_HAVE_X86
	if (resolve(isa) == KVK_ISA_AVX512)
		return kvk_av_f16_avx512;
	if (resolve(isa) == KVK_ISA_AVX2)
		return kvk_av_f16_avx2;
#endif
	(void)isa;
	return av_f16_scalar;
}

kvk_flash_tile_fn kvk_flash_tile_get(enum kvk_isa isa)
{
#ifdef KVK_HAVE_X86
	if (resolve(isa) == KVK_ISA_AVX512)
		return kvk_flash_tile_avx512;
	if (resolve(isa) == KVK_ISA_AVX2)
		return kvk_flash_tile_avx2;
#endif
	(void)isa;
	return kvk_flash_tile_scalar;
}

float kvk_dot_f16(enum kvk_isa isa, const float *a, const uint16_t *b, size_t n)
{
	return kvk_dot_f16_get(isa)(a, b, n);
}

void kvk_axpy_f16(enum kvk_isa isa, float *y, float s, const uint16_t *b, size_t n)
{
	kvk_axpy_f16_get(isa)(y, s, b, n);
}
