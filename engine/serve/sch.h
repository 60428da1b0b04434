/* sch — the serving scheduler: one engine, its KV connector and the model's tokenizer driven by
 * one thread with continuous batching, exposed to the HTTP gateway as a struct gw_backend (the
 * embedded, single-process form of `kvinfer serve`).
 *
 * Each step of the scheduler thread:
 *   1. drops cancelled requests (their sequence is destroyed: KV freed at that step);
 *   2. admits waiting requests while fewer than max_seqs run: kvx_load_prefix finds the cached
 *      prefix, gw_job_prompt reports prompt and cached tokens;
 *   3. prefills at most prefill_chunk uncached tokens of the oldest admitted request, so the
 *      running sequences' decode steps are never starved by a long prompt; when its prompt is
 *      done the first token is sampled and the prompt's full blocks are saved (kvx_save);
 *   4. runs ONE kvi_engine_decode over every decoding sequence (they join and leave the batch
 *      every step), samples each, and reports tokens / finishes.
 * The engine is batch-invariant (fwd.h), so a request's greedy output does not depend on what
 * else runs. When idle it flushes kvx saves, so no KV block stays referenced.
 *
 * Tokenization runs on the gateway's connection thread in submit (the tokenizer is immutable),
 * so a prompt that does not fit (prompt + max_tokens > max_ctx) is refused with -E2BIG there.
 *
 * Threading: the gw_backend callbacks are thread-safe (one mutex guards the incoming queue);
 * everything else is owned by the scheduler thread.
 */
#ifndef KVFS_SCH_H
#define KVFS_SCH_H

#include "gw.h"

struct sch_opts {
	const char *model;  /* GGUF path */
	const char *kv_dir; /* cache directory, NULL/"" = no prefix cache */
	int threads;	    /* engine threads; default 1 */
	int max_seqs;	    /* running sequences at most; default 16 */
	int max_ctx;	    /* per-sequence tokens; default min(n_ctx_train, 2048) */
	int prefill_chunk;  /* uncached prompt tokens per step; default 256 */
	int block_tokens;   /* KV block size; default 64 */
	int isa;	    /* enum kvk_isa, 0 = best */
	int ignore_eos;	    /* generate max_tokens even past end-of-generation tokens */
};

void sch_opts_default(struct sch_opts *o);

struct sch;

/* Loads the model and tokenizer, creates the engine (KV pool of max_seqs * max_ctx tokens) and
 * the kvx, and starts the thread. Returns 0, -EINVAL (bad model, options), -ENOENT, -ENOMEM. */
int sch_create(const struct sch_opts *o, struct sch **out);
/* Finishes every request with an error, stops the thread, frees. Call after gw_stop. */
void sch_destroy(struct sch *s);
/* The backend to pass to gw_start; valid while s lives. */
void sch_backend(struct sch *s, struct gw_backend *out);
/* Model architecture name, for logs. */
const char *sch_model_arch(const struct sch *s);

#endif
