/* kvk_ops — CPU reference kernels for the CUDA path (issue 9), and the layouts they share with
 * their CUDA versions (kvk_cuda.h: same arguments, plus a context, on device pointers).
 *
 * These are the references, not the engine's fast CPU path: plain C, f32 math, one thread,
 * no allocation except scratch for attention scores, no global state; thread-safe on disjoint
 * outputs. Every function returns 0 or -EINVAL for bad sizes (attention also -ENOMEM for its
 * scratch); it never reads past the sizes it is given. Tensors are row-major; a shape comment
 * names the dimensions outermost first.
 *
 * Number formats: f16 is IEEE binary16, bf16 the top half of a binary32, both stored as
 * uint16_t little-endian. Activations are f32 everywhere.
 */
#ifndef KVFS_KVK_OPS_H
#define KVFS_KVK_OPS_H

#include <stddef.h>
#include <stdint.h>

/* Element types of weights / tables. Values are GGML's type ids (the same as enum kvk_wtype
 * in kvk.h and the engine's enum kvi_dtype). */
enum kvk_dtype {
	KVK_DT_F32 = 0,
	KVK_DT_F16 = 1,
	KVK_DT_Q4_0 = 2, /* GGML's block layouts: kernels/kvk_quant_impl.h */
	KVK_DT_Q5_0 = 6,
	KVK_DT_Q5_1 = 7,
	KVK_DT_Q8_0 = 8,
	KVK_DT_Q4_K = 12,
	KVK_DT_Q5_K = 13,
	KVK_DT_Q6_K = 14,
	KVK_DT_BF16 = 30,
};

/* Q8_0: rows of n elements (n % 32 == 0) are n / 32 blocks of 34 bytes, 2-byte aligned:
 * an f16 scale d, then 32 int8 q; element i of the block is d * q[i]. */
#define KVK_Q8_0_BLOCK 32
#define KVK_Q8_0_BYTES 34
struct kvk_q8_0_block {
	uint16_t d;
	int8_t q[KVK_Q8_0_BLOCK];
};

/* ---- paged KV cache ---------------------------------------------------------------------
 *
 * One layer's keys live in a pool of blocks; values in another pool of the same shape. A block
 * holds block_tokens consecutive positions of one sequence, f16:
 *
 *   k pool = [block][token 0..block_tokens-1][kv_head 0..n_kv_heads-1][head_dim]  (f16)
 *
 * Block b starts block_stride halves after block 0 (block_stride >= block_tokens * n_kv_heads *
 * head_dim). With block_stride equal to that product the pool is dense per layer (the layout
 * the CUDA path allocates); with block_stride = n_layer * 2 * block_tokens * n_kv_heads *
 * head_dim and k/v pointing into block 0's layer slab, the same struct describes the engine's
 * all-layers-per-block layout (engine/kv.h), so both layouts work without a copy.
 *
 * Position p of a sequence is in block table[p / block_tokens] at token p % block_tokens.
 * K is stored after RoPE. A block id outside [0, num_blocks) in a table is an error for the
 * CPU references (-EINVAL); the CUDA kernels cannot report it and read zeros instead. */
struct kvk_kv_pages {
	const uint16_t *k;   /* block 0 of this layer's K pool */
	const uint16_t *v;   /* block 0 of this layer's V pool */
	size_t block_stride; /* halves from block b to block b + 1, in both pools */
	int num_blocks;	     /* blocks in each pool: valid ids are 0 .. num_blocks - 1 */
	int block_tokens;    /* >= 1 */
	int n_kv_heads;	     /* >= 1 */
	int head_dim;	     /* even, 2..256 */
};

/* All layers of a KV cache, for pack/unpack: k[l] and v[l] point at block 0 of layer l.
 * Same block_stride in every pool. The pointer arrays are host memory (also for the CUDA
 * version, whose k[l] / v[l] are device pointers). */
struct kvk_kv_layers {
	int n_layer;
	int num_blocks; /* blocks in each pool */
	int block_tokens;
	int n_kv_heads;
	int head_dim;
	size_t block_stride;
	uint16_t *const *k; /* n_layer entries */
	uint16_t *const *v; /* n_layer entries */
};

/* The block-file payload of one block: [layer][K, V][token][kv_head][head_dim] f16 LE, i.e.
 * n_layer * 2 * block_tokens * n_kv_heads * head_dim * 2 bytes; 0 if the geometry is bad.
 * A packed sequence is its blocks' payloads back to back, in block-table order. */
size_t kvk_kv_payload_bytes(const struct kvk_kv_layers *kv);

/* ---- elementwise and row kernels --------------------------------------------------------- */

/* out (n_tok, dim) = rows ids[t] of table (n_rows, dim) of type dt, as f32. An id outside
 * [0, n_rows) gives a row of zeros (the caller validated tokens; this only keeps a bad id from
 * reading out of bounds). Q8_0: dim % 32 == 0. */
int kvk_ref_embed(float *out, const void *table, enum kvk_dtype dt, size_t n_rows, size_t dim,
		  const int32_t *ids, size_t n_tok);

/* RoPE in place on x (n_tok, n_heads, head_dim): for every head, the first rope_dim dims are
 * rotated in pairs by angle pos[t] * theta_i, theta_i = (float)(base ^ (-2i / rope_dim))
 * computed in double, angle computed as a float product. style 0 rotates adjacent pairs
 * (x[2i], x[2i+1]) (GGUF llama), style 1 halves (x[i], x[i + rope_dim/2]) (NEOX, qwen2).
 * rope_dim even, 2 <= rope_dim <= head_dim. */
int kvk_ref_rope(float *x, size_t n_tok, size_t n_heads, size_t head_dim, size_t rope_dim,
		 const int32_t *pos, float base, int style);

/* out[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i], i < n. out may
 * alias gate or up. */
int kvk_ref_swiglu(float *out, const float *gate, const float *up, size_t n);

/* ---- attention over paged KV ------------------------------------------------------------
 *
 * GQA: query head h reads kv head h / (n_heads / n_kv_heads); n_heads % n_kv_heads == 0.
 * Scores are scale * dot(q, k) in f32, softmax over the visible keys, output the weighted sum
 * of V, f32. */

/* Prefill of one sequence: q and out (n_q, n_heads, head_dim). Query i is at position
 * q_start + i and sees keys 0 .. q_start + i (causal); those positions' K/V must be in the
 * pages already. table: ceil((q_start + n_q) / block_tokens) block ids. */
int kvk_ref_attn_prefill(float *out, const float *q, const struct kvk_kv_pages *kv,
			 const int32_t *table, int n_q, int q_start, int n_heads, float scale);

/* Decode for many sequences: q and out (n_seqs, n_heads, head_dim), one new token each, at
 * position seq_lens[s] - 1, seeing keys 0 .. seq_lens[s] - 1. tables (n_seqs, max_blocks):
 * sequence s's block table is row s. seq_lens[s] <= max_blocks * block_tokens; a sequence with
 * seq_lens[s] <= 0 gets a zero output. */
int kvk_ref_attn_decode(float *out, const float *q, const struct kvk_kv_pages *kv,
			const int32_t *tables, int max_blocks, const int32_t *seq_lens, int n_seqs,
			int n_heads, float scale);

/* ---- matrix products -------------------------------------------------------------------- */

/* c (m, n) = a (m, k) * b (n, k)^T, a and b of type dt (F16, BF16 or F32), f32 result. b is
 * the weight layout of GGUF (one row per output). F32 is for models stored in f32 (the device
 * engine keeps their weights as they are). */
int kvk_ref_gemm(float *c, const void *a, const void *b, enum kvk_dtype dt, int m, int n, int k);

/* y (n_tok, rows) = x (n_tok, n) * W^T for Q8_0 weights W (rows, n); n % 32 == 0. Each block's
 * integer products are summed in f32, then scaled by d. */
int kvk_ref_q8_0_gemv(float *y, const void *w, const float *x, int rows, int n, int n_tok);

/* The same for Q4_0 / Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K weights (dt), f32 activations: each block of
 * 32 dequantized values dotted with x in f32, in order, the block sums added in order. n % 32
 * (Q4_0) or n % 256 (K-quants) == 0; -EINVAL otherwise or for another dt, -ENOMEM. */
int kvk_ref_kq_gemv(float *y, const void *w, enum kvk_dtype dt, const float *x, int rows, int n,
		    int n_tok);

/* ---- forward-pass glue (the device engine, engine/fwd_dev.h) ----------------------------- */

/* y[i] += x[i], i < n (residual adds). */
int kvk_ref_add(float *y, const float *x, size_t n);

/* y (nrows, n): y[r][i] += b[i] (QKV bias). */
int kvk_ref_add_bias(float *y, const float *b, size_t n, size_t nrows);

/* Writes the K and V rows of n_tok tokens into layer `layer` of a paged KV cache, as f16
 * (round to nearest even, as kvk_ops_f32_to_f16): k and v are (n_tok, n_kv_heads, head_dim)
 * f32; token t goes to flat slot slots[t] = block id * block_tokens + token-in-block, i.e. into
 * block slots[t] / block_tokens at token slots[t] % block_tokens of kv->k[layer] / kv->v[layer].
 * A slot outside the pool is -EINVAL for the reference (checked before anything is written);
 * the CUDA kernel skips it. 0 <= layer < kv->n_layer. */
int kvk_ref_kv_store(const struct kvk_kv_layers *kv, int layer, const float *k, const float *v,
		     const int32_t *slots, int n_tok);

/* ---- vision tower (engine/vit.h) --------------------------------------------------------- */

/* LayerNorm over each of nrows rows of n: out = (x - mean) / sqrt(var + eps) * w + b, mean and
 * (biased) variance in f32, the variance from a second pass over (x - mean). b may be NULL (no
 * bias); w may not. out may alias x. n >= 1. */
int kvk_ref_layernorm(float *out, const float *x, const float *w, const float *b, size_t n,
		      size_t nrows, float eps);

/* GELU in place or out of place (y may alias x), n elements: quick != 0 is CLIP's quick GELU
 * x * sigmoid(1.702 x) = x / (1 + exp(-1.702 x)); quick == 0 the tanh form
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). f32 math (expf, tanhf). */
int kvk_ref_gelu(float *y, const float *x, size_t n, int quick);

/* Attention without a mask over dense f32 Q, K, V (a ViT block): q, k, v and out are
 * (n_tok, n_heads, head_dim); query t of head h sees every key of head h. Scores scale *
 * dot(q, k) in f32, softmax in f32 (max subtracted), output the weighted sum of V. n_tok >= 0,
 * n_heads >= 1, 1 <= head_dim <= 256 (the CUDA kernel's limit, kept here so both refuse the
 * same); -ENOMEM for the scores' scratch. out must not alias q, k or v. */
int kvk_ref_attn_dense(float *out, const float *q, const float *k, const float *v, int n_tok,
		       int n_heads, int head_dim, float scale);

/* ---- sampling ---------------------------------------------------------------------------- */

#define KVK_TOPK_MAX 64

/* out[r] = index of the largest logit of row r of logits (n_rows, vocab); ties go to the lowest
 * index; NaN counts as -inf. */
int kvk_ref_argmax(int32_t *out, const float *logits, int n_rows, int vocab);

/* Top-k sampling for each row: the k largest logits (ties: lower index first; NaN as -inf),
 * in that order, get p_i = exp((l_i - l_0) / temperature); with S = sum p_i, the pick is the
 * first i whose running sum exceeds u[r] * S (the last one if none does). u[r] in [0, 1) is the
 * caller's random number, so CPU and GPU agree. k == 1 or temperature <= 0: argmax.
 * 1 <= k <= min(KVK_TOPK_MAX, vocab). */
int kvk_ref_sample_topk(int32_t *out, const float *logits, int n_rows, int vocab, int k,
			float temperature, const float *u);

/* ---- KV block pack / unpack (block-file payload, see kvk_kv_payload_bytes) -------------- */

/* dst = the payloads of blocks[0 .. n_blocks-1], back to back (n_blocks * payload bytes). */
int kvk_ref_kv_pack(void *dst, const struct kvk_kv_layers *kv, const int32_t *blocks, int n_blocks);
/* The reverse: block blocks[i] of every layer is filled from payload i of src. */
int kvk_ref_kv_unpack(const struct kvk_kv_layers *kv, const void *src, const int32_t *blocks,
		      int n_blocks);

/* Helpers for tests and callers (exact for every half; f32 -> half rounds to nearest even). */
float kvk_ops_f16_to_f32(uint16_t h);
uint16_t kvk_ops_f32_to_f16(float f);
float kvk_ops_bf16_to_f32(uint16_t h);
uint16_t kvk_ops_f32_to_bf16(float f);

#endif
