/* AVX-512 (F, BW, VL) + AVX512-VNNI matmul kernels: the template kvk_matmul_x86.inc compiled
 * with 32 vector registers and vpdpbusd, called only after cpuid (and the OS's saved state)
 * says the CPU has them (kvk_matmul.c). Q8_0 keeps 8-lane accumulators, so its results are
 * bit-identical to the AVX2 kernels' (tested); its gain is larger register tiles and one
 * instruction for the int8 block dot instead of two. F32/F16/BF16 accumulate in 16 lanes (twice
 * the FMA width; another fixed order, within f32 rounding of AVX2's). */
#include "kvk_matmul_impl.h"

#ifdef KVK_HAVE_X86

#define KX_T	 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define KX_FN(x) x##_avx512
#define KX_VNNI	 2
#define KX_QRB	 4 /* 16 accumulators of 32 ymm registers */
#define KX_QTB	 4
#define KX_QDR	 8
#define KX_FTB	 4
#define KX_ZMM	 1 /* F32/F16/BF16 in 16 lanes: not AVX2's bits */
#include "kvk_matmul_x86.inc"

#endif
