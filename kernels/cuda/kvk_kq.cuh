// Device-side dequantization of Q4_0 / Q4_K / Q5_K / Q6_K (GGML's layouts, described in
// kernels/kvk_quant_impl.h; the host's kvk_kq_row_to_f32 is the reference). Byte loads only:
// Q4_0 and Q6_K blocks (18 and 210 bytes) are 2-byte aligned at best.
#ifndef KVFS_KVK_KQ_CUH
#define KVFS_KVK_KQ_CUH

#include "kvk_cuda_int.h"

static __device__ __forceinline__ float kq_f16(const uint8_t *p)
{
	return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

// Bytes of a row of n values; 0 when n is not whole blocks or dt is not one of the four.
static __host__ __device__ __forceinline__ size_t kq_row_bytes(int dt, int n)
{
	switch (dt) {
	case KVK_DT_Q4_0:
		return n % 32 ? 0 : (size_t)(n / 32) * 18;
	case KVK_DT_Q5_0:
		return n % 32 ? 0 : (size_t)(n / 32) * 22;
	case KVK_DT_Q5_1:
		return n % 32 ? 0 : (size_t)(n / 32) * 24;
	case KVK_DT_Q4_K:
		return n % 256 ? 0 : (size_t)(n / 256) * 144;
	case KVK_DT_Q5_K:
		return n % 256 ? 0 : (size_t)(n / 256) * 176;
	case KVK_DT_Q6_K:
		return n % 256 ? 0 : (size_t)(n / 256) * 210;
	default:
		return 0;
	}
}

// The 32 values of block b (values 32b .. 32b + 31) of a row.
static __device__ __forceinline__ void kq_block32(int dt, const uint8_t *row, int b, float *v)
{
	if (dt == KVK_DT_Q4_0) {
		const uint8_t *p = row + (size_t)b * 18;
		float d = kq_f16(p);
#pragma unroll
		for (int i = 0; i < 16; i++) {
			v[i] = d * (float)((p[2 + i] & 15) - 8);
			v[16 + i] = d * (float)((p[2 + i] >> 4) - 8);
		}
		return;
	}
	if (dt == KVK_DT_Q5_0 || dt == KVK_DT_Q5_1) {
		int one = dt == KVK_DT_Q5_1;
		const uint8_t *p = row + (size_t)b * (one ? 24 : 22), *qh = p + (one ? 4 : 2);
		float d = kq_f16(p), m = one ? kq_f16(p + 2) : 0.f;
		uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
			     (uint32_t)qh[3] << 24;
#pragma unroll
		for (int i = 0; i < 16; i++) {
			int lo = (qh[4 + i] & 15) | (int)((h >> i) & 1) << 4;
			int hi = (qh[4 + i] >> 4) | (int)((h >> (i + 16)) & 1) << 4;
			v[i] = one ? d * (float)lo + m : d * (float)(lo - 16);
			v[16 + i] = one ? d * (float)hi + m : d * (float)(hi - 16);
		}
		return;
	}
	if (dt == KVK_DT_Q4_K || dt == KVK_DT_Q5_K) {
		int five = dt == KVK_DT_Q5_K, s = b % 8, sc, m;
		const uint8_t *p = row + (size_t)(b / 8) * (five ? 176 : 144), *k = p + 4;
		if (s < 4) {
			sc = k[s] & 63;
			m = k[s + 4] & 63;
		} else {
			sc = (k[s + 4] & 15) | ((k[s - 4] >> 6) << 4);
			m = (k[s + 4] >> 4) | ((k[s] >> 6) << 4);
		}
		float d = kq_f16(p) * (float)sc, mn = kq_f16(p + 2) * (float)m;
		const uint8_t *q = p + (five ? 48 : 16) + 32 * (s / 2);
#pragma unroll 8
		for (int i = 0; i < 32; i++) {
			int x = s % 2 ? q[i] >> 4 : q[i] & 15;
			if (five)
				x |= ((p[16 + i] >> s) & 1) << 4;
			v[i] = d * (float)x - mn;
		}
		return;
	}
	// Q6_K: block b of a super-block is half h = (b % 8) / 4, quarter k = b % 4
	const uint8_t *p = row + (size_t)(b / 8) * 210;
	int h = (b % 8) / 4, k = b % 4;
	const uint8_t *ql = p + 64 * h + 32 * (k % 2), *qh = p + 128 + 32 * h;
	const int8_t *sc = (const int8_t *)(p + 192 + 8 * h + 2 * k);
	float d = kq_f16(p + 208);
#pragma unroll 8
	for (int i = 0; i < 32; i++) {
		int lo = k < 2 ? ql[i] & 15 : ql[i] >> 4;
		int q = lo | (((qh[i] >> (2 * k)) & 3) << 4);
		v[i] = d * (float)sc[i / 16] * (float)(q - 32);
	}
}

#endif
