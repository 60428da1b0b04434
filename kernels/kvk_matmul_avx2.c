/* AVX2 + FMA + F16C matmul kernels (the template kvk_matmul_x86.inc, which states the
 * batch-invariance rule), compiled for that target and called only after cpuid says the CPU
 * has it (kvk_matmul.c). */
#include "kvk_matmul_impl.h"

#ifdef KVK_HAVE_X86

#define KX_T	 __attribute__((target("avx2,fma,f16c")))
#define KX_FN(x) x##_avx2
#define KX_VNNI	 0
#define KX_QRB	 2 /* 2 rows x 4 tokens: measured a little ahead of 4 x 2 and 3 x 3 */
#define KX_QTB	 4
#define KX_QDR	 4 /* 16 ymm registers: 4 accumulators + loads */
#define KX_FTB	 3
#define KX_ZMM	 0
#include "kvk_matmul_x86.inc"

#endif
