/* ref_fwd — a plain scalar Llama/Qwen2 forward pass, written to be obviously correct and to
 * share no code with the engine or the kernels: one token at a time, weights dequantized by
 * its own decoders, sums in double, f32 KV cache. Also builds random hand-made models. */
#ifndef KVFS_TEST_REF_FWD_H
#define KVFS_TEST_REF_FWD_H

#include <stdint.h>

#include "model.h"

struct ref_fwd;

int ref_fwd_create(const struct kvi_model *m, int max_ctx, struct ref_fwd **out);
void ref_fwd_destroy(struct ref_fwd *r);
/* Appends token tok at the next position; logits (n_vocab) may be NULL. */
void ref_fwd_step(struct ref_fwd *r, int32_t tok, float *logits);

/* A model with random weights of type wt for every matrix (norms/biases F32), built with
 * kvi_model_init_empty; weights are malloc'd and freed by ref_model_free. */
struct kvi_model *ref_model_random(const struct kvi_config *cfg, enum kvi_dtype wt, uint64_t seed);
void ref_model_free(struct kvi_model *m);

/* The tests' small Llama config: 2 layers, n_embd 64, n_ff 96, 4 heads (2 KV) of 16, adjacent
 * RoPE base 10000, rms_eps 1e-5, n_ctx_train 512; n_vocab as given. */
struct kvi_config ref_cfg_tiny_llama(int n_vocab);
/* ref_cfg_tiny_llama(203) made Qwen2-like: arch "qwen2", 1 KV head, RoPE halves base 1e6,
 * rms_eps 1e-6, QKV biases, tied output. */
struct kvi_config ref_cfg_tiny_qwen(void);
/* ref_cfg_tiny_llama with odd sizes: n_embd 60, head_dim 15, rope_dim 14 (partial), n_ff 100,
 * n_vocab 37 (SIMD tails; float weight types only, as 60 is no multiple of 32). */
struct kvi_config ref_cfg_odd(void);

/* ---- helpers the engine tests share -------------------------------------------------------- */

/* n token ids in [0, vocab) from an LCG started at seed: the same seed, the same tokens. */
void ref_tokens(int32_t *t, int n, int vocab, unsigned seed);
/* Index of the largest of l[0..n), the first on a tie; n >= 1. */
int ref_argmax(const float *l, int n);
/* max |a - ref| / max(1, max |ref|) over n values; INFINITY when a holds a NaN. */
double ref_rel_err(const float *a, const float *ref, int n);

#endif
