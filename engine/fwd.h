/* fwd — the CPU forward pass: an engine object over a loaded model, with paged KV memory.
 *
 * Model: Llama-family (llama, qwen2): RMSNorm, RoPE (adjacent pairs or halves, per
 * model.h), grouped-query attention, SwiGLU, optional QKV bias, tied output. Weights F32,
 * F16, BF16 or Q8_0 (per tensor); norms are read as any of these and converted once.
 *
 * Batch invariance (a contract, tested bit for bit): the logits of a token depend only on the
 * model, the token ids of its sequence up to it and the engine's ISA — not on how the prompt
 * was split into prefill chunks, whether it came through prefill or decode, which other
 * sequences share a decode batch, the thread count, or whether its prefix was computed now or
 * imported from exported KV blocks. Every reduction (matmul rows, attention over positions
 * 0..p, norms) runs in one fixed order; threads split rows, tokens or heads, never a sum.
 *
 * Memory: every activation buffer is allocated at kvi_engine_create, sized by
 * max_batch_tokens and max_ctx; prefill/decode never allocate (KV blocks come from the pool).
 *
 * Thread-safety: an engine is used by one caller thread at a time; it runs its own worker
 * threads (opts.threads - 1 of them) inside each call. Several engines may share a model.
 */
#ifndef KVFS_KVI_FWD_H
#define KVFS_KVI_FWD_H

#include <stdint.h>

#include "kv.h"
#include "model.h"

struct kvi_engine_opts {
	int threads;	      /* >= 1; default 1 */
	int block_tokens;     /* KV block size B; default 64 */
	int kv_blocks;	      /* blocks in the KV pool; 0 = 2 * ceil(max_ctx / B) */
	int max_batch_tokens; /* tokens per forward pass (prefill chunk); default 64 */
	int max_ctx;	      /* longest sequence; 0 = min(n_ctx_train, 4096) */
	int isa;	      /* enum kvk_isa: 0 = best available (tests force scalar) */
};

void kvi_engine_opts_default(struct kvi_engine_opts *o);
/* Fills in the defaults above that depend on the model config c (max_ctx, block_tokens,
 * max_batch_tokens, kv_blocks; threads and isa are left as they are). Returns 0, or -EINVAL when
 * max_ctx > 2^24 or max_batch_tokens > 65536. Shared with the device engine (fwd_dev.h). */
int kvi_engine_opts_resolve(struct kvi_engine_opts *o, const struct kvi_config *c);

struct kvi_engine;

/* Validates the model (shapes, types, divisibility) against what the forward pass needs and
 * allocates everything. m must outlive the engine. Returns 0, -EINVAL (with a log line naming
 * the problem), -ENOMEM, or a pthread error. */
int kvi_engine_create(const struct kvi_model *m, const struct kvi_engine_opts *o,
		      struct kvi_engine **out);
/* The model checks of kvi_engine_create alone (shapes, types, divisibility; a log line names
 * the problem): 0 or -EINVAL. Shared with the device engine (fwd_dev.h). */
int kvi_engine_check_model(const struct kvi_model *m);
/* All sequences on the engine's kv must be destroyed first. NULL is a no-op. */
void kvi_engine_destroy(struct kvi_engine *e);

/* The engine's KV pool: create sequences on it (kvi_seq_create), export/import blocks. */
struct kvi_kv *kvi_engine_kv(struct kvi_engine *e);
const struct kvi_config *kvi_engine_config(const struct kvi_engine *e);
/* The effective options (defaults filled in). */
const struct kvi_engine_opts *kvi_engine_opts(const struct kvi_engine *e);
/* Name of the matmul ISA in use ("avx512", "avx2", "scalar"). */
const char *kvi_engine_isa(const struct kvi_engine *e);
/* The engine's thread pool's counters (pool.h), for benchmarks. */
struct kvi_pool_stats;
void kvi_engine_pool_stats(const struct kvi_engine *e, struct kvi_pool_stats *st);
/* CPU seconds all threads spent in attention (scores, softmax, weighted sum) since create, by
 * each thread's CPU clock: the attention share of a prefill for benchmarks. Read between
 * calls. */
double kvi_engine_attn_cpu_s(const struct kvi_engine *e);

/* Appends n tokens to seq (positions len .. len+n-1), in passes of up to max_batch_tokens.
 * If logits_last != NULL it receives the n_vocab logits after the last token. n >= 1.
 * Returns 0; -EINVAL (bad token id, n < 1, seq on another kv); -E2BIG (past max_ctx);
 * -ENOSPC (KV pool full). On error the sequence keeps the tokens of the passes that finished
 * (its length says how many). */
int kvi_engine_prefill(struct kvi_engine *e, struct kvi_seq *seq, const int32_t *tokens, int n,
		       float *logits_last);

/* Input embeddings that replace the token embedding at some prompt positions: an image's
 * vision-tower output at its placeholder tokens (issue 26). Positions [pos, pos + n) are
 * relative to the tokens of the prefill call; rows holds n rows of n_embd floats. */
struct kvi_inject {
	int pos, n;
	const float *rows;
};

/* kvi_engine_prefill with inject[0..ninject) replacing the token embeddings at their positions
 * (the token ids there still name the KV blocks and must be valid). ninject 0: the same as
 * kvi_engine_prefill. -EINVAL also for a span that is empty, has no rows or leaves [0, n). */
int kvi_engine_prefill_inject(struct kvi_engine *e, struct kvi_seq *seq, const int32_t *tokens,
			      int n, const struct kvi_inject *inject, int ninject,
			      float *logits_last);
/* The span checks of kvi_engine_prefill_inject alone (shared with fwd_dev.h): 0 or -EINVAL. */
int kvi_engine_check_inject(const struct kvi_inject *inject, int ninject, int n);

/* One token for each of nseq distinct sequences, in batches of up to max_batch_tokens;
 * logits (may be NULL) receives nseq rows of n_vocab. Same errors as prefill; on error no
 * sequence has advanced in the failing batch. */
int kvi_engine_decode(struct kvi_engine *e, struct kvi_seq *const *seqs, const int32_t *tokens,
		      int nseq, float *logits);

/* The argument checks of kvi_engine_prefill and kvi_engine_decode alone, for an engine with KV
 * pool kv, n_vocab tokens and max_ctx: 0, -EINVAL or -E2BIG as documented there. Shared with
 * the device engine (fwd_dev.h). */
int kvi_engine_check_prefill(const struct kvi_kv *kv, int n_vocab, int max_ctx,
			     const struct kvi_seq *seq, const int32_t *tokens, int n);
int kvi_engine_check_decode(const struct kvi_kv *kv, int n_vocab, int max_ctx,
			    struct kvi_seq *const *seqs, const int32_t *tokens, int nseq);

#endif
