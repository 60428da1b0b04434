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
	int fork_delay_ms;  /* tests: each fork (n > 1) is submitted this much later, and the
			     * scheduler, finding a request still waiting for its forks, looks
			     * again twice as much later: the forks arrive after it took the
			     * request, deterministically */
	/* a vision tower (llama.cpp's mmproj GGUF, engine/vit.h) for images in FULL requests;
	 * NULL = none (sch_job.images refused). Its output width must be the model's. */
	const char *mmproj;
};

/* sch_opts defaults (also for values < 1 passed to sch_create) */
#define SCH_MAX_SEQS	  16
#define SCH_MAX_CTX	  2048 /* capped by the model's training context */
#define SCH_PREFILL_CHUNK 256
#define SCH_BLOCK_TOKENS  64

void sch_opts_default(struct sch_opts *o);

struct sch;
struct sch_req;

/* What a direct hand-over carries (SCH_PREFILL with sch_job.handoff). */
struct sch_handoff {
	const int32_t *toks; /* the prompt's token ids */
	int n, cached;
	int32_t first;	       /* the first sampled token */
	int first_block;       /* blocks before it are not sent: the decode worker loads them
				* from the kv dir they share (sch_job.handoff_skip_cached) */
	const int32_t *blocks; /* the engine's ids of the blocks sent, in order */
	int n_blocks;	       /* = ceil(n / block_tokens) - first_block */
	size_t block_bytes;    /* sch_block_bytes */
	const void *kv;	       /* SCH_HANDOFF_BYTES: the n_blocks blocks in the kv.h export
				* layout, one after another; NULL for SCH_HANDOFF_DEVICE */
};

enum sch_handoff_kind {
	SCH_HANDOFF_NONE = 0,
	SCH_HANDOFF_BYTES = 1,	/* the KV as host bytes (any engine) */
	SCH_HANDOFF_DEVICE = 2, /* no copy: the sink sends it with sch_nccl_send */
};

/* How a request reports; every callback runs on the scheduler thread, in this order:
 * prompt (once admitted), token*, then finish exactly once (its last touch of the request). */
struct sch_sink {
	void (*prompt)(void *u, int prompt_tokens, int cached_tokens); /* may be NULL */
	void (*token)(void *u, int32_t id, const char *piece, size_t len);
	/* sch_job.logprobs: the next token's log-probability, before its token call (texts
	 * valid during the call). May be NULL. */
	void (*logprob)(void *u, const struct gw_logprob *lp);
	/* SCH_PREFILL with sch_job.nx: each further choice's first token, in order, after its
	 * logprob call, before prefilled / handoff. May be NULL. */
	void (*choice)(void *u, int32_t first);
	/* SCH_PREFILL only, before finish("stop"): the prompt's tokens, the cached prefix, the
	 * first sampled token and the KV block holding the prompt's last token (blen bytes, the
	 * kv.h export layout); every full block before it is published in the kv dir. */
	void (*prefilled)(void *u, const int32_t *toks, int n, int cached, int32_t first,
			  const void *blk, size_t blen);
	/* SCH_PREFILL with sch_job.handoff, instead of prefilled: the whole prompt's KV for a
	 * direct hand-over to a decode worker (kvw.h KVW_OP_KV_PUT). Runs on the scheduler
	 * thread; h and what it points to are valid during the call only. */
	void (*handoff)(void *u, struct sch *s, const struct sch_handoff *h);
	void (*finish)(void *u, const char *reason, int err, const char *msg);
};

enum sch_mode {
	SCH_FULL = 0,	 /* tokenize, prefill, decode (embedded) */
	SCH_PREFILL = 1, /* tokenize, prefill, save every full block, hand over the last one */
	SCH_DECODE = 2,	 /* load the prompt's blocks (+ the handed-over last one), decode */
};

/* An image in a FULL request's text prompt: its placeholder tokens go where `offset` bytes of
 * the prompt end (sch_vision.c). */
struct img_image;
struct sch_image {
	size_t offset;
	const struct img_image *img; /* decoded pixels and their hash (img.h); read in submit */
};

/* An image whose embeddings an encode worker left in the kv dir (disaggregated form: kvw.h
 * KVW_OP_ENCODE): PREFILL with a text prompt: placeholder tokens where off bytes of it end;
 * DECODE: the prompt's tokens [off, off + n_tokens) are its placeholders. */
struct sch_image_ref {
	size_t off;
	uint32_t n_tokens;
	uint8_t hash[32];     /* img_hash of the pixels */
	uint8_t tower_fp[32]; /* the kve.h key's tower fingerprint (emb_tower_fp) */
};

struct sch_job {
	enum sch_mode mode;
	const char *prompt;  /* FULL, PREFILL: the text (NUL-terminated), unless toks */
	int parse_special;   /* control-token texts become tokens (chat templates) */
	const int32_t *toks; /* DECODE, and FULL / PREFILL instead of prompt: the prompt's token
			      * ids (copied) */
	int n;
	int32_t first;	 /* DECODE: the first token, sampled by the prefill worker */
	const void *blk; /* DECODE: the block holding the prompt's last token, or NULL */
	size_t blen;
	const char *salt; /* may be NULL */
	struct kvi_sample_params sp;
	/* 0 = off, else 1 + the alternatives wanted (0..20) per token: FULL every token,
	 * PREFILL the first (and nx's), DECODE every token after the first */
	int logprobs;
	/* PREFILL: nx further choices of the prompt (< KVW_MAX_CHOICES), each sampling its first
	 * token from the same logits with sp and seed xseeds[i] (sink.choice) */
	int nx;
	const uint64_t *xseeds;
	/* FULL and DECODE, n > 1: forks = the requests to be submitted next with fork_of = this
	 * one (it is not admitted before); fork_of = a request submitted so, whose prompt (and its
	 * KV, once computed or loaded: kvi_seq_fork, blocks shared) this request takes instead of
	 * prompt/toks. A DECODE fork keeps its own first (and blk, used only when it must load
	 * the prompt itself: its parent ended, or was stepped before it was admitted). */
	int forks;
	struct sch_req *fork_of;
	int handoff; /* PREFILL: enum sch_handoff_kind; the full blocks are still saved in
		      * the kv dir (for later prompts), but not waited for */
	int handoff_skip_cached; /* PREFILL: the decode worker has this kv dir: the blocks
				  * loaded from it are not sent (sch_handoff.first_block) */
	uint64_t ticket; /* DECODE: the KV parked under this ticket (sch_park) is the prompt's,
			  * when its tokens match; else (expired, never came) the normal path */
	/* FULL with a text prompt: its images, in prompt order (offsets not decreasing); each
	 * becomes sch_vision_tokens() placeholder tokens whose input is the tower's embedding,
	 * loaded from the kv dir or encoded (and saved there) during sch_submit. */
	const struct sch_image *images;
	int n_images;
	/* PREFILL (text prompt) and DECODE: images by reference, embeddings from the kv dir (a
	 * miss: sch_submit fails with -ENOENT) */
	const struct sch_image_ref *image_refs;
	int n_image_refs;
};

/* Queues a request. Returns 0 and *out (free with sch_req_free after finish ran and no
 * sch_cancel can come any more), or -E2BIG (prompt + max_tokens > max_ctx), -EINVAL (empty or
 * untokenizable prompt, bad ids), -ERANGE (a logit_bias token id outside the vocabulary),
 * -ENOMEM, -EAGAIN (stopping). Nothing is reported on error. */
int sch_submit(struct sch *s, const struct sch_job *j, const struct sch_sink *k, void *u,
	       struct sch_req **out);
/* Where r's images' placeholder tokens start (at most max), as sch_submit placed them; the
 * count. Callable from r's sink callbacks. */
int sch_req_images(const struct sch_req *r, uint32_t *pos, int max);
/* 1 when s has a vision tower (sch_opts.mmproj) and takes sch_job.images. */
int sch_has_vision(const struct sch *s);
/* Ends the request at the next step (finish with -ECANCELED) and frees its KV. Thread-safe;
 * a no-op after finish. */
void sch_cancel(struct sch_req *r);
void sch_req_free(struct sch_req *r);

/* ---- direct hand-over (decode side) and NCCL --------------------------------------------
 *
 * A prefill worker hands a prompt's KV straight to a decode worker, which parks it under a
 * ticket until the DECODE request with that ticket arrives (normally within milliseconds; a
 * parked prompt no DECODE claims is dropped after SCH_PARK_MS). KV parked over NCCL counts
 * as used; KV parked as bytes takes blocks only at its claim. These calls are thread-safe;
 * all but sch_park block until the scheduler thread has done the work (at its next step);
 * -EAGAIN once stopping. */
#define SCH_PARK_MS	   30000
#define SCH_PARK_MAX_BYTES (1ull << 30)

/* Parks the n-token prompt toks whose blocks from first_block on are kv (len = ceil(n / B) -
 * first_block blocks in the export layout), copied; returns at once (no scheduler step). At the
 * DECODE's admission the bytes become KV blocks and the blocks before first_block are loaded
 * from the kv dir (what is not there is computed then). Returns 0, -EINVAL (bad ids, length,
 * ticket 0), -EEXIST (ticket parked already), -ENOSPC (more than SCH_PARK_MAX_BYTES waiting),
 * -ENOMEM, -EAGAIN (stopping). */
int sch_park(struct sch *s, uint64_t ticket, const int32_t *toks, int n, int first_block,
	     const void *kv, size_t len);

struct kvk_nccl;
/* As sch_park, the KV received from rank peer of communicator c (kvk_nccl.h) instead.
 * -ENODEV unless the engine is the cuda device engine; -EIO for an NCCL or CUDA error. */
int sch_park_nccl(struct sch *s, uint64_t ticket, const int32_t *toks, int n, int first_block,
		  struct kvk_nccl *c, int peer);
/* Joins NCCL communicator id (2 ranks) as rank on the engine's GPU; blocks until the other
 * rank joined. Free *out with sch_nccl_leave. -ENODEV unless the cuda device engine with NCCL. */
int sch_nccl_join(struct sch *s, const uint8_t *id, int rank, struct kvk_nccl **out);
/* Destroys a communicator of this scheduler's engine (on its thread). Call while the
 * scheduler runs or after sch_stop returned. NULL is a no-op. */
void sch_nccl_leave(struct sch *s, struct kvk_nccl *c);
/* Scheduler thread only, inside a handoff callback (SCH_HANDOFF_DEVICE): sends h's blocks to
 * rank peer of c; returns when the receiver has them. 0, -ENODEV, -EIO. */
int sch_nccl_send(struct sch *s, struct kvk_nccl *c, const struct sch_handoff *h, int peer);
/* 1 when this engine can take part in NCCL transfers (the cuda device engine, NCCL built). */
int sch_nccl_capable(const struct sch *s);
/* Where this scheduler's KV cache lives (kvx_model_dir: "<kv dir>/<cache fingerprint>"), or ""
 * without one. Workers with equal ids share cached blocks. Thread-safe. */
const char *sch_cache_id(const struct sch *s);

/* Load, for balancers (thread-safe, updated every step). */
struct sch_load {
	int waiting, running;
	int queued_tokens; /* prompt tokens not yet prefilled, over waiting + prefilling */
	int kv_free, kv_total;
	uint32_t prompt_computed; /* prompt tokens computed here since start (mod 2^32) */
};
void sch_load_get(struct sch *s, struct sch_load *out);
/* Blocks a hand-over of an n-token prompt carries from first_block on: ceil(n / B) -
 * first_block (< 1: none, not a valid hand-over). n >= 0, first_block >= 0. */
int sch_handoff_blocks(const struct sch *s, int n, int first_block);
/* Bytes of one KV block (the hand-over size). */
size_t sch_block_bytes(const struct sch *s);
/* Bytes of the largest prompt's token ids and KV blocks (a KVW_OP_KV_PUT body, less its
 * fixed fields). */
size_t sch_handoff_max_bytes(const struct sch *s);

/* Loads the model and tokenizer, creates the engine (KV pool of max_seqs * max_ctx tokens) and
 * the kvx, and starts the thread. Returns 0, -EINVAL (bad model, options), -ENOENT, -ENOMEM. */
int sch_create(const struct sch_opts *o, struct sch **out);
/* Finishes every request (-ESHUTDOWN), stops the thread; later submits get -EAGAIN, cancels
 * are harmless. Call before gw_stop, so no job is finished while the gateway is freed. */
void sch_stop(struct sch *s);
/* sch_stop, then frees. After gw_stop. */
void sch_destroy(struct sch *s);
/* A request's sampling parameters (temperature, top_p, top_k, seed, max_tokens, penalties,
 * logit_bias); a request without a seed gets one derived from id. For both backends. */
void sch_sample_params(const struct oai_request *o, uint64_t id, struct kvi_sample_params *sp);
/* The embedded backend to pass to gw_start (SCH_FULL requests); valid while s lives. */
void sch_backend(struct sch *s, struct gw_backend *out);
/* A worker's own GET /metrics on listen ("HOST:PORT"; empty or NULL: none, returns 0): the
 * scheduler's families (sch_backend's collector and vllm:request_queue_time_seconds), served
 * until sch_destroy; "HOST:PORT\n" written to addr_file when non-empty. Call once, before
 * submitting, and not for a scheduler passed to gw_start (it registers the same families in
 * the gateway's registry). 0 or a negative errno (-EADDRINUSE, -EINVAL, -ENOMEM). */
int sch_metrics_serve(struct sch *s, const char *listen, const char *addr_file);
/* Model architecture name, for logs. */
const char *sch_model_arch(const struct sch *s);

#endif
