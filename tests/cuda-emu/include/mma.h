// kvk_emu's mma.h: the warp matrix functions of nvcuda::wmma (CUDA C++ Programming Guide,
// "Warp Matrix Functions") for the one shape the project uses, m16n16k16: matrix_a / matrix_b
// fragments of __half or __nv_bfloat16 (row_major or col_major), accumulators of float,
// fill_fragment, load_matrix_sync, store_matrix_sync and mma_sync. Another shape or type does
// not compile (docs/cuda-emu.md, "Tensor cores").
//
// How a fragment is held: on a GPU each lane holds an unspecified part of the 16 x 16 tile and
// mma_sync exchanges them inside the tensor core. Here an a / b fragment holds the whole tile in
// every lane (as f32: f16 and bf16 values are exact in it), and an accumulator is right only in
// the lane's own elements (element e = row * 16 + col belongs to lane e % 32): load and fill set
// the whole tile, mma_sync computes the lane's 8 elements, store writes them.
// What stays as on the hardware:
//   - load, store and mma are warp operations: all 32 lanes must reach the same one (a lane
//     elsewhere is the emulator's "different warp operations" fault), and they order no memory:
//     a lane's store is not visible to another lane's load without __syncwarp() (TSan names it);
//   - a store writes the tile's elements by lane (its own, above), so two lanes never write the
//     same address and a missing barrier is a race, not a quiet copy;
//   - the pointer must be 256-bit (32-byte) aligned and ldm a multiple of 16 bytes (8 halves or
//     4 floats); anything else is a kernel fault, as it is undefined behaviour on a GPU;
//   - the product: each a*b exact (f16 x f16 and bf16 x bf16 fit f32), the 16 products of an
//     element summed in f32 in k order, then added to c. A tensor core sums in another order
//     (and may truncate where this rounds): results differ in the last bits of f32.
// Not provided: fragment::x[] / num_elements (their lane mapping is unspecified anyway), the
// sub-byte, tf32, double and int8 fragments, other shapes.
#ifndef KVFS_KVK_EMU_MMA_H
#define KVFS_KVK_EMU_MMA_H

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "kvk_emu.h"

namespace nvcuda
{
namespace wmma
{
struct matrix_a {
};
struct matrix_b {
};
struct accumulator {
};
struct row_major {
};
struct col_major {
};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> class fragment
{
	static_assert(M == 16 && N == 16 && K == 16, "kvk_emu: wmma supports m16n16k16 only");
	static_assert(std::is_same<Use, accumulator>::value
			  ? std::is_same<T, float>::value && std::is_same<Layout, void>::value
			  : (std::is_same<T, __half>::value ||
			     std::is_same<T, __nv_bfloat16>::value) &&
				(std::is_same<Layout, row_major>::value ||
				 std::is_same<Layout, col_major>::value),
		      "kvk_emu: wmma fragments are f16/bf16 matrix_a/b with a layout, or float "
		      "accumulators");

      public:
	float t[16 * 16]; // the whole tile, row-major (see above)
};

static inline float kvk_emu_wmma_f(__half v)
{
	return __half2float(v);
}
static inline float kvk_emu_wmma_f(__nv_bfloat16 v)
{
	return __bfloat162float(v);
}
static inline float kvk_emu_wmma_f(float v)
{
	return v;
}

// The calling thread's lane in its warp (threads numbered x fastest, as CUDA does).
static inline int kvk_emu_wmma_lane(void)
{
	return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32;
}

static inline void kvk_emu_wmma_check(const char *what, const void *p, unsigned ldm, size_t el)
{
	if ((uintptr_t)p % 32)
		kvk_emu_kernel_fault("%s: pointer %p is not 256-bit aligned", what, p);
	if (ldm < 16 || (ldm * el) % 16)
		kvk_emu_kernel_fault("%s: ldm %u is not a multiple of 16 bytes of at least 16 "
				     "elements",
				     what, ldm);
}

// Element (r, c) of a 16 x 16 tile stored with leading dimension ldm.
template <typename T>
static inline void kvk_emu_wmma_load(float *t, const T *p, unsigned ldm, bool col)
{
	kvk_emu_wmma_check("wmma::load_matrix_sync", p, ldm, sizeof(T));
	kvk_emu_warp(KVK_EMU_WMMA_LOAD, 0xffffffffu, 0, 0, 32);
	for (int r = 0; r < 16; r++)
		for (int c = 0; c < 16; c++)
			t[r * 16 + c] =
			    kvk_emu_wmma_f(col ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c]);
}

// matrix_a or matrix_b in either layout (the fragment's checks above): a col_major tile is read
// transposed. An accumulator's load takes the memory layout (below), as on a GPU.
template <typename Use, typename T, typename L>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L> &f, const T *p, unsigned ldm)
{
	static_assert(!std::is_same<Use, accumulator>::value,
		      "kvk_emu: an accumulator's load_matrix_sync takes a layout_t");
	kvk_emu_wmma_load(f.t, p, ldm, std::is_same<L, col_major>::value);
}
static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
				    unsigned ldm, layout_t layout)
{
	kvk_emu_wmma_load(f.t, p, ldm, layout == mem_col_major);
}

static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
				     unsigned ldm, layout_t layout)
{
	kvk_emu_wmma_check("wmma::store_matrix_sync", p, ldm, sizeof(float));
	int lane = kvk_emu_wmma_lane();
	kvk_emu_warp(KVK_EMU_WMMA_STORE, 0xffffffffu, 0, 0, 32);
	for (int e = lane; e < 256; e += 32) {
		int r = e / 16, c = e % 16;
		p[layout == mem_col_major ? (size_t)c * ldm + r : (size_t)r * ldm + c] = f.t[e];
	}
}

template <typename Use, typename T, typename L>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, T v)
{
	for (int e = 0; e < 256; e++)
		f.t[e] = kvk_emu_wmma_f(v);
}

template <typename T, typename LA, typename LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
			    const fragment<matrix_a, 16, 16, 16, T, LA> &a,
			    const fragment<matrix_b, 16, 16, 16, T, LB> &b,
			    const fragment<accumulator, 16, 16, 16, float> &c)
{
	int lane = kvk_emu_wmma_lane();
	kvk_emu_warp(KVK_EMU_WMMA_MMA, 0xffffffffu, 0, 0, 32);
	// Only the lane's own elements of d (those its store writes): the others are never read
	// from this lane, as on the hardware, and the warp does the product once, not 32 times.
	for (int e = lane; e < 256; e += 32) {
		int i = e / 16, j = e % 16;
		float s = 0.f;
		for (int k = 0; k < 16; k++)
			s += a.t[i * 16 + k] * b.t[k * 16 + j]; // exact product, f32 sum
		d.t[e] = c.t[e] + s;
	}
}

} // namespace wmma
} // namespace nvcuda

#endif
