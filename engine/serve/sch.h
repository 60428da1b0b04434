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

#include <stddef.h>
#include <stdint.h>

#include "gw.h"
#include "sample.h"

struct sch_opts {
	const char *model;  /* GGUF path */
	const char *kv_dir; /* cache directory, NULL/"" = no prefix cache */
	int threads;	    /* engine threads; default 1 */
	int max_seqs;	    /* running sequences at most; default 16 */
	int max_ctx;	    /* per-sequence tokens; default min(n_ctx_train, 2048) */
	int prefill_chunk;  /* uncached prompt tokens per step; default 256 */
	int block_tokens;   /* KV block size; default 64 */
	int isa;	    /* enum kvk_isa, 0 = best */
	int device;	    /* 0 = the CPU engine (fwd.h); KVK_DEV_HOST / KVK_DEV_CUDA (kvk_dev.h):
			     * the device engine (fwd_dev.h) on that backend */
	int gpu;	    /* cuda: the GPU index */
	int ignore_eos;	    /* generate max_tokens even past end-of-generation tokens */
};

void sch_opts_default(struct sch_opts *o);

struct sch;
struct sch_req;

/* How a request reports; every callback runs on the scheduler thread, in this order:
 * prompt (once admitted), token*, then finish exactly once (its last touch of the request). */
struct sch_sink {
	void (*prompt)(void *u, int prompt_tokens, int cached_tokens); /* may be NULL */
	void (*token)(void *u, int32_t id, const char *piece, size_t len);
	/* SCH_PREFILL only, before finish("stop"): the prompt's tokens, the cached prefix, the
	 * first sampled token and the KV block holding the prompt's last token (blen bytes, the
	 * kv.h export layout); every full block before it is published in the kv dir. */
	void (*prefilled)(void *u, const int32_t *toks, int n, int cached, int32_t first,
			  const void *blk, size_t blen);
	void (*finish)(void *u, const char *reason, int err, const char *msg);
};

enum sch_mode {
	SCH_FULL = 0,	 /* tokenize, prefill, decode (embedded) */
	SCH_PREFILL = 1, /* tokenize, prefill, save every full block, hand over the last one */
	SCH_DECODE = 2,	 /* load the prompt's blocks (+ the handed-over last one), decode */
};

struct sch_job {
	enum sch_mode mode;
	const char *prompt;  /* FULL, PREFILL: the text (NUL-terminated) */
	int parse_special;   /* control-token texts become tokens (chat templates) */
	const int32_t *toks; /* DECODE: the prompt's token ids (copied) */
	int n;
	int32_t first;	 /* DECODE: the first token, sampled by the prefill worker */
	const void *blk; /* DECODE: the block holding the prompt's last token, or NULL */
	size_t blen;
	const char *salt; /* may be NULL */
	struct kvi_sample_params sp;
};

/* Queues a request. Returns 0 and *out (free with sch_req_free after finish ran and no
 * sch_cancel can come any more), or -E2BIG (prompt + max_tokens > max_ctx), -EINVAL (empty or
 * untokenizable prompt, bad ids), -ENOMEM, -EAGAIN (stopping). Nothing is reported on error. */
int sch_submit(struct sch *s, const struct sch_job *j, const struct sch_sink *k, void *u,
	       struct sch_req **out);
/* Ends the request at the next step (finish with -ECANCELED) and frees its KV. Thread-safe;
 * a no-op after finish. */
void sch_cancel(struct sch_req *r);
void sch_req_free(struct sch_req *r);

/* Load, for balancers (thread-safe, updated every step). */
struct sch_load {
	int waiting, running;
	int queued_tokens; /* prompt tokens not yet prefilled, over waiting + prefilling */
	int kv_free, kv_total;
};
void sch_load_get(struct sch *s, struct sch_load *out);
/* Bytes of one KV block (the hand-over size). */
size_t sch_block_bytes(const struct sch *s);

/* Loads the model and tokenizer, creates the engine (KV pool of max_seqs * max_ctx tokens) and
 * the kvx, and starts the thread. Returns 0, -EINVAL (bad model, options), -ENOENT, -ENOMEM. */
int sch_create(const struct sch_opts *o, struct sch **out);
/* Finishes every request (-ESHUTDOWN), stops the thread; later submits get -EAGAIN, cancels
 * are harmless. Call before gw_stop, so no job is finished while the gateway is freed. */
void sch_stop(struct sch *s);
/* sch_stop, then frees. After gw_stop. */
void sch_destroy(struct sch *s);
/* The embedded backend to pass to gw_start (SCH_FULL requests); valid while s lives. */
void sch_backend(struct sch *s, struct gw_backend *out);
/* Model architecture name, for logs. */
const char *sch_model_arch(const struct sch *s);

#endif
