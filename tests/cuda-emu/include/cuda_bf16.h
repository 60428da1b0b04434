// kvk_emu's cuda_bf16: __nv_bfloat16 and its f32 conversions (round to nearest even, NaN kept
// quiet), what mma.h's bf16 fragments and their tests use.
#ifndef KVFS_KVK_EMU_CUDA_BF16_H
#define KVFS_KVK_EMU_CUDA_BF16_H

#include "kvk_emu.h"

struct alignas(2) __nv_bfloat16 {
	unsigned short x;
};

static inline __nv_bfloat16 __float2bfloat16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u) // NaN: keep it a (quiet) NaN
		return __nv_bfloat16{(unsigned short)((u >> 16) | 0x40)};
	u += 0x7fffu + ((u >> 16) & 1u);
	return __nv_bfloat16{(unsigned short)(u >> 16)};
}
static inline float __bfloat162float(__nv_bfloat16 h)
{
	uint32_t u = (uint32_t)h.x << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

#endif
