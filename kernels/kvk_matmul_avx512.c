/* AVX-512 (F, BW, VL) + AVX512-VNNI matmul kernels: the template kvk_matmul_x86.inc compiled
 * with 16-lane accumulators (Q8_0: two blocks per zmm through vpdpbusd), 32 vector registers
 * and larger register tiles; called only after cpuid (and the OS's saved state) says the CPU
 * has them (kvk_matmul.c). Results are within f32 rounding of the AVX2 kernels' (another fixed
 * order), batch-invariant like them. */
#include "kvk_matmul_impl.h"

#ifdef KVK_HAVE_X86

#define KX_T	 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define KX_FN(x) x##_avx512
#define KX_VNNI	 2
#define KX_QRB	 4 /* 16 accumulators of 32 zmm registers */
#define KX_QTB	 4
#define KX_QDR	 8
#define KX_FTB	 4
#define KX_ZMM	 1
#include "kvk_matmul_x86.inc"

#endif
