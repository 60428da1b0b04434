/* sch internals shared by sch.c (the scheduler) and sch_park.c (direct hand-over, NCCL).
 * Layering: sch.c calls sch_park.c (parking, calls onto the scheduler thread), never the
 * reverse; what both need lives here. */
#ifndef KVFS_SCH_INT_H
#define KVFS_SCH_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "fwd.h"
#include "fwd_dev.h"
#include "kv.h"
#include "kvx.h"
#include "kvw.h"
#include "sch.h"

/* RS_FORK: admitted, waiting for its parent's prefill to fork the prompt's KV from. */
enum req_state { RS_WAIT = 0, RS_PREFILL, RS_DECODE, RS_FORK };

/* One request. Created in submit, freed in release (after gw_job_finish and the client's end);
 * the scheduler thread stops touching it at gw_job_finish. */
struct sch_req {
	struct sch *s;
	struct sch_sink k;
	void *u;
	enum sch_mode mode;
	atomic_int cancelled;
	int finished;	    /* scheduler thread: ended, finish not yet reported */
	const char *reason; /* what finish will report (static strings) */
	int err;
	const char *msg;
	struct sch_req *next; /* incoming queue / scheduler lists; guarded by s->mu while queued */
	/* scheduler thread only: */
	enum req_state st;
	int32_t *toks;
	int n, pos; /* prompt tokens; tokens already in seq */
	int cached; /* prompt tokens loaded from the cache */
	char *salt;
	struct kvi_sample_params sp;
	struct kvi_seq *seq;
	struct kvi_sampler *smp;
	int32_t last;
	char utf8[8]; /* bytes of a UTF-8 character split across tokens */
	int nutf8;
	int32_t first; /* SCH_DECODE: the handed-over first token */
	void *blk;     /* SCH_DECODE: the handed-over last block */
	size_t blen;
	int handoff;	  /* SCH_PREFILL: enum sch_handoff_kind */
	int skip_cached;  /* SCH_PREFILL: hand over the blocks after the cached prefix only */
	uint64_t ticket;  /* SCH_DECODE: a parked prompt to claim, or 0 */
	int64_t t_submit; /* CLOCK_MONOTONIC ns at sch_submit: queue time at admission */
	int logprobs;	  /* sch_job.logprobs */
	int nx;		  /* SCH_PREFILL: sch_job.nx, xseeds */
	uint64_t xseeds[KVW_MAX_CHOICES - 1];
	atomic_int refs; /* the submitter's, and one per fork child (sch_req_free) */
	/* sch_job.fork_of (a reference), whose prompt KV this request forks once computed */
	struct sch_req *parent;
	atomic_int pending_forks; /* children not yet submitted: not admitted before 0 */
	int nforks;		  /* sch_job.forks: admitted with its children (admit_group) */
	/* images (sch_vision.c): their placeholder spans in toks (with the pixels' hashes, for
	 * the block names) and embedding rows, nimg x sch_vision_tokens x n_embd; a fork child
	 * borrows its parent's (img_borrowed: held alive by its parent reference) */
	struct kvb_image *img;
	int nimg, img_borrowed;
	float *img_rows;
};

/* A function run on the scheduler thread between steps (sch_call); the caller waits. */
struct sch_call {
	int (*fn)(struct sch *s, void *arg);
	void *arg;
	int rc, done;
	struct sch_call *next;
};

/* A hand-over by bytes as it came (sch_park): kept as bytes until its DECODE is admitted, so
 * that taking it needs no step of the scheduler thread. Guarded by s->mu. */
struct sch_pend {
	uint64_t ticket;
	int32_t *toks;
	int n, first_block;
	void *kv; /* ceil(n / B) - first_block blocks, export layout */
	size_t len;
	struct timespec expires; /* CLOCK_MONOTONIC */
	struct sch_pend *next;
};

/* A handed-over prompt in KV blocks (NCCL: sch_park_nccl; bytes: at the claim) waiting for its
 * DECODE request. Scheduler thread only. */
struct sch_parked {
	uint64_t ticket;
	int32_t *toks;
	int n;
	int first_block; /* blocks before it come from the kv dir at the claim */
	int32_t *ids;	 /* the blocks from first_block on (references held) */
	int nids;
	struct timespec expires; /* CLOCK_MONOTONIC */
	struct sch_parked *next;
};

struct sch {
	struct sch_opts o;
	struct kvi_model *m;
	struct kvi_tok *tok;
	struct kvi_engine *e;	   /* the CPU engine, or NULL */
	struct kvi_dev_engine *de; /* the device engine (opts.device), or NULL */
	struct kvx *kx;
	int n_vocab;
	float *logits; /* (max_seqs, n_vocab) */
	pthread_t thr;
	pthread_mutex_t mu; /* guards inq, stop, calls */
	pthread_cond_t cv;
	pthread_cond_t call_cv; /* a call is done */
	struct sch_req *inq, **inq_tail;
	struct sch_call *calls, **calls_tail;
	struct sch_pend *pend; /* sch_park's */
	size_t pend_bytes;
	int stop;
	int joined; /* the scheduler thread has ended (sch_stop) */
	/* scheduler thread only */
	struct sch_req **run; /* admitted requests, oldest first */
	int nrun;
	struct sch_parked *parked;
	/* gauges published after each step for /metrics */
	atomic_int g_waiting, g_running, g_kv_used, g_kv_total, g_queued, g_wait_tokens;
	void *blkbuf; /* one block, for SCH_PREFILL hand-overs */
	atomic_ullong c_steps, c_decode_tokens, c_prefill_tokens;
	/* vllm:request_queue_time_seconds, once registered (sch_metrics_register / _serve; NULL
	 * before: observing it is then a no-op), and a worker's own /metrics (sch_metrics_serve).
	 */
	struct met_hist *h_queue;
	struct met_reg *mreg;
	struct met_http *mhttp;
	/* sch_vision.c: the tower (opts.mmproj) or NULL; one encode at a time */
	struct vit *tower;
	pthread_mutex_t tower_mu;
	uint8_t tower_fp[32]; /* the tower's fingerprint with the preprocessing's version */
	atomic_ullong c_images, c_encodes, c_emb_hits, c_encode_ns;
};

/* ---- sch_vision.c: images in FULL requests ---- */
#define SCH_MAX_IMAGES 64 /* in one request (the API's own limit is lower: oai.h) */
struct met_out;
struct vit;
/* Loads opts.mmproj (sch_create); 0 without one, or -errno with a message logged. */
int sch_vision_open(struct sch *s);
void sch_vision_close(struct sch *s);
/* Tokenizes prompt with j's images in it into r->toks / r->n (flags: kvi_tok_encode's, the BOS
 * only before the first piece), and fills r->img and r->img_rows: each image's embeddings from
 * the kv dir, else encoded by the tower and saved there. Caller's thread (sch_submit).
 * 0, -EINVAL (no tower, bad offsets, untokenizable), -E2BIG, -ENOMEM, -EIO. */
int sch_vision_prepare(struct sch *s, struct sch_req *r, const char *prompt, int flags,
		       const struct sch_image *im, int nim);
/* The disaggregated form: as sch_vision_prepare (the same tokenization), the images named by
 * ref (offsets into prompt), their embeddings from the kv dir only (an encode worker put them
 * there): a miss is -ENOENT. No tower needed. */
int sch_vision_prepare_refs(struct sch *s, struct sch_req *r, const char *prompt, int flags,
			    const struct sch_image_ref *ref, int nim);
/* DECODE: r->toks holds the prompt; ref's offsets are token positions of the image spans
 * (in order, apart, inside): r->img and the embeddings (kv dir only, -ENOENT), for the block
 * names and for whatever of the prompt the decode worker computes itself. -EINVAL. */
int sch_vision_spans(struct sch *s, struct sch_req *r, const struct sch_image_ref *ref, int nim);
/* The inject spans (fwd.h) of r's images over its tokens [pos, pos + n), into out (r->nimg
 * entries at most); returns their count. */
int sch_vision_inject(const struct sch_req *r, int pos, int n, struct kvi_inject *out);
/* The tower's metric families (none without one). */
void sch_vision_metrics(struct sch *s, struct met_out *o);
/* kvx_load_prefix / kvx_save with r's images in the block names. */
int sch_kvx_load(struct sch *s, struct sch_req *r, int n, int *cached);
void sch_kvx_save(struct sch *s, struct sch_req *r);

/* The engine's KV pool, whichever engine it is. */
static inline struct kvi_kv *eng_kv(const struct sch *s)
{
	return s->de ? kvi_dev_engine_kv(s->de) : kvi_engine_kv(s->e);
}

/* sch_park.c, scheduler thread: runs the queued calls (each caller is woken). */
void sch_run_calls(struct sch *s);
/* Fails every queued call with rc (the thread is stopping). Under s->mu. */
void sch_fail_calls_locked(struct sch *s, int rc);
/* Drops parked and pending prompts past their expiry (all of them with all != 0); returns how
 * many remain, and when one does, *next = the earliest expiry among them (CLOCK_MONOTONIC;
 * next may be NULL). Not under s->mu. */
int sch_parked_expire(struct sch *s, int all, struct timespec *next);
/* Takes the parked prompt of r->ticket into r->seq (empty) when its tokens are r's, loading
 * or computing the blocks before its first_block; 1 when taken, 0 when not (r->seq is then
 * empty again), or -errno (engine error). */
int sch_parked_claim(struct sch *s, struct sch_req *r);
/* A prefill pass of either engine (fwd.h contract). Here, not in sch.c, so that sch_park.c
 * (which computes the blocks a parked prompt lacks) does not call back into sch.c. */
static inline int sch_eng_prefill(struct sch *s, struct kvi_seq *seq, const int32_t *toks, int n,
				  float *logits_last)
{
	atomic_fetch_add(&s->c_prefill_tokens, (unsigned long long)n);
	return s->de ? kvi_dev_engine_prefill(s->de, seq, toks, n, logits_last)
		     : kvi_engine_prefill(s->e, seq, toks, n, logits_last);
}

/* sch_eng_prefill of r's tokens [pos, pos + n) with its images' embeddings in place. */
static inline int sch_eng_prefill_req(struct sch *s, struct sch_req *r, int pos, int n,
				      float *logits_last)
{
	if (!r->nimg)
		return sch_eng_prefill(s, r->seq, r->toks + pos, n, logits_last);
	struct kvi_inject inj[SCH_MAX_IMAGES];
	int ni = sch_vision_inject(r, pos, n, inj);
	atomic_fetch_add(&s->c_prefill_tokens, (unsigned long long)n);
	return s->de ? kvi_dev_engine_prefill_inject(s->de, r->seq, r->toks + pos, n, inj, ni,
						     logits_last)
		     : kvi_engine_prefill_inject(s->e, r->seq, r->toks + pos, n, inj, ni,
						 logits_last);
}
/* The KV of a finished prefill as a hand-over (SCH_PREFILL with handoff). 0 or -errno. */
int sch_handoff_run(struct sch *s, struct sch_req *r, int32_t first);

#endif
