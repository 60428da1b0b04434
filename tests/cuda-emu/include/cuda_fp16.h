// kvk_emu's cuda_fp16: __half / __half2 and the conversions kernels/cuda uses. Conversions go
// through the compiler's _Float16 (IEEE binary16, round to nearest even): an implementation
// independent of the project's own kvk_ops_f32_to_f16, so a test comparing the two checks
// both.
#ifndef KVFS_KVK_EMU_CUDA_FP16_H
#define KVFS_KVK_EMU_CUDA_FP16_H

#include "kvk_emu.h"

#ifndef __FLT16_MAX__
#error "kvk_emu needs a compiler with _Float16 (GCC >= 12 or clang on x86-64 / aarch64)"
#endif

struct alignas(2) __half {
	unsigned short x;
};
struct alignas(4) __half2 {
	__half x, y;
};
typedef __half half;
typedef __half2 half2;

static inline __half __ushort_as_half(unsigned short u)
{
	return __half{u};
}
static inline unsigned short __half_as_ushort(__half h)
{
	return h.x;
}
static inline __half __float2half_rn(float f)
{
	_Float16 h = (_Float16)f;
	__half r;
	memcpy(&r.x, &h, 2);
	return r;
}
static inline float __half2float(__half h)
{
	_Float16 v;
	memcpy(&v, &h.x, 2);
	return (float)v;
}
static inline float2 __half22float2(__half2 h)
{
	return make_float2(__half2float(h.x), __half2float(h.y));
}
static inline __half2 __floats2half2_rn(float a, float b)
{
	return __half2{__float2half_rn(a), __float2half_rn(b)};
}
static inline float __low2float(__half2 h)
{
	return __half2float(h.x);
}
static inline float __high2float(__half2 h)
{
	return __half2float(h.y);
}

#endif
