/* model — a Llama-family model's configuration and weights, as the forward pass sees them.
 *
 * This header is the contract between the loader (gguf.c/model.c fill a kvi_model from a GGUF
 * file, weights pointing into the read-only mapping) and the forward pass (which only reads
 * it). Tests may also build a kvi_model by hand (weights in malloc'd buffers) with
 * kvi_model_init_empty(), without any file.
 *
 * Thread-safety: a loaded model is immutable; any number of engines/threads may share it.
 */
#ifndef KVFS_KVI_MODEL_H
#define KVFS_KVI_MODEL_H

#include <stddef.h>
#include <stdint.h>

/* Element types; the values are GGML's type ids, so GGUF tensor types map 1:1. */
enum kvi_dtype {
	KVI_F32 = 0,
	KVI_F16 = 1,
	KVI_Q4_0 = 2,  /* blocks of 32 in 18 bytes (layouts: kernels/kvk_quant_impl.h) */
	KVI_Q5_0 = 6,  /* blocks of 32 in 22 bytes */
	KVI_Q5_1 = 7,  /* blocks of 32 in 24 bytes */
	KVI_Q8_0 = 8,  /* blocks of 32: one f16 scale d, then 32 int8 q; value = d * q */
	KVI_Q4_K = 12, /* super-blocks of 256 in 144 bytes */
	KVI_Q5_K = 13, /* super-blocks of 256 in 176 bytes */
	KVI_Q6_K = 14, /* super-blocks of 256 in 210 bytes */
	KVI_BF16 = 30,
};

#define KVI_Q8_0_BLOCK 32
#define KVI_Q8_0_BYTES 34 /* 2-byte f16 scale + 32 int8 */

/* A 1-D or 2-D weight. ne[0] is the row length (contiguous, the reduction dimension of a
 * matmul), ne[1] the number of rows (1 for vectors). For Q8_0, ne[0] % 32 == 0. */
struct kvi_tensor {
	enum kvi_dtype type;
	int64_t ne[2];
	const void *data;
	size_t nbytes;
};

/* RoPE pairing. GGUF `llama` models rotate adjacent pairs (x[2i], x[2i+1]) because the
 * converter permuted Q/K rows; `qwen2` rotates halves (x[i], x[i + rope_dim/2]) ("NEOX"). */
enum kvi_rope_style {
	KVI_ROPE_ADJACENT = 0,
	KVI_ROPE_HALVES = 1,
};

struct kvi_config {
	char arch[32];	 /* "llama" or "qwen2" */
	int n_layer;	 /* {arch}.block_count */
	int n_embd;	 /* {arch}.embedding_length */
	int n_ff;	 /* {arch}.feed_forward_length */
	int n_head;	 /* {arch}.attention.head_count */
	int n_head_kv;	 /* {arch}.attention.head_count_kv (GQA), divides n_head */
	int head_dim;	 /* n_embd / n_head, or {arch}.attention.key_length */
	int rope_dim;	 /* {arch}.rope.dimension_count, default head_dim; even */
	float rope_base; /* {arch}.rope.freq_base, default 10000 */
	float rms_eps;	 /* {arch}.attention.layer_norm_rms_epsilon */
	int n_ctx_train; /* {arch}.context_length */
	int n_vocab;	 /* rows of token_embd */
	enum kvi_rope_style rope_style;
	int has_qkv_bias; /* qwen2: bq, bk, bv present */
	int tied_output;  /* no output.weight: the output projection reuses token_embd */
};

/* Per-layer weights. Shapes as (ne[0], ne[1]) = (in, out) for matrices:
 *   attn_norm (n_embd), wq (n_embd, n_head*head_dim), wk/wv (n_embd, n_head_kv*head_dim),
 *   wo (n_head*head_dim, n_embd), bq/bk/bv (out) or data == NULL,
 *   ffn_norm (n_embd), w_gate/w_up (n_embd, n_ff), w_down (n_ff, n_embd). */
struct kvi_layer {
	struct kvi_tensor attn_norm, wq, wk, wv, wo, bq, bk, bv;
	struct kvi_tensor ffn_norm, w_gate, w_up, w_down;
};

struct kvi_model {
	struct kvi_config cfg;
	struct kvi_tensor tok_embd; /* (n_embd, n_vocab) */
	struct kvi_tensor out_norm; /* (n_embd) */
	struct kvi_tensor output;   /* (n_embd, n_vocab); == tok_embd when tied_output */
	struct kvi_layer *layers;   /* n_layer entries, owned by the model */
	/* SHA-256 over everything that changes KV values: architecture, hyper-parameters and
	 * every tensor's name, type, shape and bytes. Filled by the loader. */
	uint8_t fingerprint[32];
	void *priv; /* loader-owned (the GGUF mapping); NULL for hand-built models */
	/* Optional (rope_dim / 2) F32 "rope_freqs.weight" of Llama 3.1+ files ("llama3" RoPE
	 * scaling): pair i rotates by pos * rope_base^(-2i / rope_dim) / rope_freqs[i]. data ==
	 * NULL (and ne[0] == 0) when the file has none: then no scaling. */
	struct kvi_tensor rope_freqs;
};

/* Loads a GGUF file (memory-mapped, validated). On error returns a negative errno and writes
 * a message naming what is wrong into err (errlen bytes, may be NULL). *out is freed with
 * kvi_model_free. */
int kvi_model_load(const char *path, struct kvi_model **out, char *err, size_t errlen);

/* Frees a model from kvi_model_load or kvi_model_init_empty (not the weight buffers of a
 * hand-built model: their owner frees those). NULL is a no-op. */
void kvi_model_free(struct kvi_model *m);

/* A model with cfg copied and cfg->n_layer zeroed layers, for hand-built tests. */
int kvi_model_init_empty(const struct kvi_config *cfg, struct kvi_model **out);

/* Bytes of a row of n elements of type t; 0 when n is invalid for t (Q8_0: n % 32 != 0). */
size_t kvi_dtype_row_bytes(enum kvi_dtype t, int64_t n);

#endif
