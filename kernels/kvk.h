/* kvk — compute kernels for the engine: CPU reference implementations, and CUDA versions with
 * the same signature when the build found nvcc.
 *
 * CPU functions are pure (no allocation, no global state) and thread-safe on disjoint outputs.
 * CUDA entry points (kvk_cuda_*) take host pointers, copy in, run the kernel and copy out; they
 * exist for testing each kernel against its CPU reference. They return 0, or -ENODEV when the
 * build has no CUDA or the machine has no GPU, or -EIO on a CUDA error (logged).
 */
#ifndef KVFS_KVK_H
#define KVFS_KVK_H

#include <stddef.h>
#include <stdint.h>

/* out[r][i] = x[r][i] / sqrt(mean(x[r]^2) + eps) * w[i], for rows r < nrows, i < n.
 * out may alias x. n > 0. */
void kvk_rmsnorm_f32(float *out, const float *x, const float *w, size_t n, size_t nrows, float eps);

/* 1 if this build has CUDA kernels and a GPU answers, else 0. */
int kvk_cuda_available(void);

/* CUDA version of kvk_rmsnorm_f32 (host pointers). */
int kvk_cuda_rmsnorm_f32(float *out, const float *x, const float *w, size_t n, size_t nrows,
			 float eps);

/* ---- Matrix-vector / matrix-matrix products for the forward pass (kvk_matmul*.c) ----------
 *
 * y[t][r] = dot(W row r, x[t]) for tokens t < ntok and rows r0 <= r < r1. W is row-major with
 * rows of n elements of one weight type (GGML layouts; the enum values are GGML's type ids).
 *
 * Batch invariance (a contract, tested): every output element is reduced in one fixed order
 * that depends only on n and the ISA, never on ntok, r0/r1, the tiling or the thread count, so
 * a token's result is bit-identical whether it is computed alone or in a batch of any size.
 * Threads split rows (or tokens), never the reduction dimension.
 *
 * Activations: F32/F16/BF16 weights take f32 activations as they are (rows of n floats). Q8_0
 * weights take activations quantized per token in blocks of 32 (kvk_act_prepare); the layout
 * is private to the kernels: size it with kvk_act_bytes. Q4_0/Q4_K/Q5_K/Q6_K weights share
 * one activation format (int8 blocks of 32 with their scale and sum), so one prepared buffer
 * serves a mix of these types; it is not the Q8_0 one.
 *
 * Tolerance of the quantized types: a SIMD kernel differs from the scalar reference only in
 * float summation order (the integer block dots are exact), within 1e-5 relative of the sum of
 * |w x| over the row; tests/test_kernels_ref.c checks it per type. */
enum kvk_wtype {
	KVK_W_F32 = 0,
	KVK_W_F16 = 1,
	KVK_W_Q4_0 = 2,	 /* blocks of 32: f16 scale, 16 bytes of nibbles */
	KVK_W_Q5_0 = 6,	 /* blocks of 32: f16 scale, 4 bytes of fifth bits, 16 of nibbles */
	KVK_W_Q5_1 = 7,	 /* the same with an f16 min after the scale */
	KVK_W_Q8_0 = 8,	 /* blocks of 32: f16 scale, 32 x int8 */
	KVK_W_Q4_K = 12, /* K-quants: super-blocks of 256 (layouts in kvk_quant_impl.h) */
	KVK_W_Q5_K = 13,
	KVK_W_Q6_K = 14,
	KVK_W_BF16 = 30,
	/* Not a file type: F16 rows repacked by kvk_f16_pack (see there) for the AVX-512 kernels.
	 * The same results as KVK_W_F16 on AVX-512 (bit for bit); r0 must be a multiple of 16. */
	KVK_W_F16_P16 = 1001,
};

enum kvk_isa {
	KVK_ISA_AUTO = 0,   /* the best this CPU supports */
	KVK_ISA_SCALAR = 1, /* portable C */
	KVK_ISA_AVX2 = 2,   /* AVX2 + FMA + F16C */
	KVK_ISA_AVX512 = 3, /* + AVX-512 F/BW/VL/VNNI (16-lane sums: not AVX2's bits) */
};

/* The ISA KVK_ISA_AUTO resolves to on this CPU (cpuid and the OS's enabled vector state,
 * probed once per process; thread-safe). An ISA above it passed to a kernel runs as this one. */
enum kvk_isa kvk_isa_best(void);
/* "auto", "scalar", "avx2", "avx512"; "?" for an unknown value. */
const char *kvk_isa_name(enum kvk_isa isa);
/* 1 if wt is a weight type the kernels know, else 0. */
int kvk_wtype_valid(int wt);
/* Bytes of one weight row of n elements; 0 when invalid (Q8_0, Q4_0 need n % 32 == 0, the
 * K-quants n % 256 == 0). */
size_t kvk_row_bytes(enum kvk_wtype wt, size_t n);

/* Bytes of prepared activations for ntok tokens of n elements against wt weights. */
size_t kvk_act_bytes(enum kvk_wtype wt, size_t n, size_t ntok);

/* Prepares tokens t0 <= t < t1 of x (rows of n floats, row stride ldx) into act, which holds
 * ntok tokens in all. For float weight types act is a plain copy (rows of n floats; skip the
 * call and pass x when ldx == n). Deterministic per token: a token's prepared bytes do not
 * depend on ntok or t0/t1. Thread-safe on disjoint token ranges. */
void kvk_act_prepare(enum kvk_wtype wt, void *act, size_t ntok, const float *x, size_t ldx,
		     size_t n, size_t t0, size_t t1);

/* Floats of per-thread scratch kvk_matmul needs for rows of n elements. */
size_t kvk_matmul_scratch_floats(enum kvk_wtype wt, size_t n);

/* y[t * ldy + r] = dot(W row r, act token t) for r0 <= r < r1, t < ntok. w points at row 0.
 * scratch: kvk_matmul_scratch_floats(wt, n) floats, 32-byte aligned, private to the caller's
 * thread. Pure; thread-safe on disjoint (rows, y) ranges. n % 32 == 0 for Q8_0. */
void kvk_matmul(enum kvk_isa isa, enum kvk_wtype wt, float *y, size_t ldy, const void *w, size_t n,
		size_t r0, size_t r1, const void *act, size_t ntok, float *scratch);

/* F16 weights repacked for streaming: panel p (rows 16 p .. 16 p + 15) holds, for k = 0 ..
 * n - 1, those 16 rows' halves at k (rows past `rows` are zero). The AVX-512 F16 kernels keep
 * one accumulator lane per row and one fma chain per output over k in order; on the GGUF
 * layout their decode gathers a column of 16 rows, on this one it reads 32 contiguous bytes.
 * The scalar and AVX2 kernels take it too (scalar: the same fma chain, so the same bits).
 * kvk_f16_pack_bytes: bytes for a (rows x n) matrix. kvk_f16_pack: packs rows [r0, r1) of w
 * (row-major, rows of n halves; r0 % 16 == 0, r1 % 16 == 0 or r1 == rows) into dst, which
 * holds the whole matrix: disjoint ranges may run on different threads. */
size_t kvk_f16_pack_bytes(size_t rows, size_t n);
void kvk_f16_pack(uint16_t *dst, const uint16_t *w, size_t rows, size_t n, size_t r0, size_t r1);
/* 1 if isa's F16 kernels run faster on kvk_f16_pack's layout than on the file's (AVX-512). */
int kvk_f16_pack_wanted(enum kvk_isa isa);

/* Quantizes n floats into one row of wt (Q4_0, Q4_K, Q5_K, Q6_K; kvk_row_bytes(wt, n) bytes
 * at out) with round-to-nearest scales, no search: for synthetic files and tests, not a
 * replacement for llama.cpp's quantizer. 0, or -EINVAL for another type or a bad n. */
int kvk_quantize_row(enum kvk_wtype wt, void *out, const float *x, size_t n);

/* Row r of W converted to n floats (embedding lookup). */
void kvk_row_to_f32(enum kvk_wtype wt, const void *w, size_t n, size_t r, float *out);

/* IEEE half <-> float, exact for every half (float -> half rounds to nearest even). */
float kvk_f16_to_f32(uint16_t h);
uint16_t kvk_f32_to_f16(float f);
float kvk_bf16_to_f32(uint16_t h);
uint16_t kvk_f32_to_bf16(float f);

/* Dot products and axpy on f16 vectors for attention over an f16 KV cache, in one fixed
 * order (by n only). kvk_dot_f16: sum_i a[i] * b[i]. kvk_axpy_f16: y[i] += s * b[i]. */
float kvk_dot_f16(enum kvk_isa isa, const float *a, const uint16_t *b, size_t n);
void kvk_axpy_f16(enum kvk_isa isa, float *y, float s, const uint16_t *b, size_t n);
/* The same two as function pointers for isa, resolved once (for inner loops). */
typedef float (*kvk_dot_f16_fn)(const float *a, const uint16_t *b, size_t n);
typedef void (*kvk_axpy_f16_fn)(float *y, float s, const uint16_t *b, size_t n);
kvk_dot_f16_fn kvk_dot_f16_get(enum kvk_isa isa);
kvk_axpy_f16_fn kvk_axpy_f16_get(enum kvk_isa isa);

/* Attention over np consecutive f16 K or V rows (row p at k + p * ks halves) for G query heads
 * of hd floats (head g at q + g * hd, output row g at o + g * hd), scores of head g at
 * sc + g * ldsc. qk: sc[g][p] = dot(q_g, k_p) * scale. av: o_g += sc[g][p] * v_p, p in order.
 * Bit for bit the loops over p and g of the dot / axpy of the same isa: one call per run of
 * rows instead of one per (row, head). */
typedef void (*kvk_qk_f16_fn)(float *sc, size_t ldsc, const float *q, size_t G, size_t hd,
			      const uint16_t *k, size_t ks, size_t np, float scale);
typedef void (*kvk_av_f16_fn)(float *o, const float *sc, size_t ldsc, size_t G, size_t hd,
			      const uint16_t *v, size_t vs, size_t np);
kvk_qk_f16_fn kvk_qk_f16_get(enum kvk_isa isa);
kvk_av_f16_fn kvk_av_f16_get(enum kvk_isa isa);

/* Flash-style causal attention over a paged f16 KV cache (struct kvk_kv_pages, kvk_ops.h) for
 * nt consecutive query tokens of one sequence at positions pos0 .. pos0 + nt - 1 and G query
 * heads that all read KV head kvh: the query of (token i, head g) at q + i * ldq + g * hd, its
 * output at o + i * ldo + g * hd (hd = kv->head_dim). Tokens go in tiles of KVK_FLASH_QT; keys
 * in tiles cut at absolute positions (multiples of KVK_FLASH_KT and block ends), each tile's K
 * and V converted to f32 once and used by every row of the query tile while it sits in L1;
 * an online softmax (running max, rescaled sum and output) needs no per-context buffer.
 * Batch invariance: a row's arithmetic depends only on its position, never on nt, pos0 or
 * which rows share its tile (decode, nt = 1, gives the bits of the same row in any prefill
 * chunk). Per (row, key): dot as 8 lane partial fma chains over d then a fixed tree, times
 * scale; per tile: the max over the visible keys, alpha = e^(m_old - m_new), p = e^(s - m_new),
 * l = l alpha + sum p (8 lanes, then hsum), o = o alpha, then o += p v as one fma chain per
 * element in key order; finally o / l. AVX2 and AVX-512 give the same bits; scalar differs by
 * rounding (sequential dot and sum). scratch: kvk_flash_scratch_floats(hd, G) floats, 64-byte
 * aligned, private to the calling thread. 0, or -EINVAL (hd outside 1..256, G < 1, nt < 0). */
#define KVK_FLASH_KT 64
#define KVK_FLASH_QT 16
struct kvk_kv_pages;
size_t kvk_flash_scratch_floats(int hd, int G);
int kvk_flash_attn_f16(enum kvk_isa isa, float *o, size_t ldo, const float *q, size_t ldq, int nt,
		       int pos0, int G, int kvh, const struct kvk_kv_pages *kv,
		       const int32_t *table, float scale, float *scratch);

/* e^x in f32 for the engine's softmax and SiLU, inline so the compiler vectorizes the loops
 * around it (libm's expf is a call per element: at a 512-token prefill of qwen2-0.5b about
 * 100 M calls, a sixth of the time). Cephes' method: x = k ln2 + r with k = round(x log2 e)
 * (ln2 in two parts, r exact to f32), e^r by a degree-7 polynomial, times 2^k built in the
 * exponent bits; within 1 ulp of e^x. Outside [-87.3, 88.3] it returns 0 and inf (expf: its
 * subnormals below, finite up to 88.72), so SiLU of a very negative x is -0 as with expf and
 * nothing downstream turns subnormal (a subnormal product costs a microcode assist of ~100
 * cycles: a clamp to e^-87.3 instead made the SiLU loop ten times slower). NaN in, NaN out.
 * Plain +, *, conversions and selects: the same bits in a vector lane as in scalar code as
 * long as the caller's file is compiled without FMA contraction (the engine's files are:
 * baseline x86-64), so it keeps batch invariance. */
static inline float kvk_exp(float x)
{
	float c = x > 88.3f ? 88.3f : x;
	c = c < -87.3f ? -87.3f : c;
	float k = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
	float r = c - k * 0.693359375f;
	r = r - k * -2.12194440e-4f;
	float p = 1.9875691500e-4f;
	p = p * r + 1.3981999507e-3f;
	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	p = p * (r * r) + r + 1.0f;
	union {
		uint32_t u;
		float f;
	} s, inf; /* no designated initializers: the CUDA sources (C++) include this header */
	s.u = (uint32_t)((int32_t)k + 127) << 23;
	inf.u = 0x7f800000u;
	float e = p * s.f;
	e = x < -87.3f ? 0.0f : e;
	return x > 88.3f ? inf.f : e;
}

#endif
