/* lb internals shared by lb.c (the request pipeline, the worker pool, the backend) and
 * lb_replica.c (the replica table: address lists, picking, up/down state, the health thread).
 * Layering: lb.c calls lb_replica.c, never the reverse. */
#ifndef KVFS_LB_INT_H
#define KVFS_LB_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "lb.h"
#include "kvw.h"
#include "lbp.h"
#include "sample.h"

#define RPC_TIMEOUT_MS	   600000 /* a long prompt on a slow CPU */
#define STATUS_TIMEOUT_MS  1000
#define CONNECT_TIMEOUT_MS 2000
/* A replica that has failed its health checks this long is taken as hung (stopped, not
 * answering): the calls and streams this gateway has in flight there are broken, so their
 * requests fail or retry instead of waiting out RPC_TIMEOUT_MS or forever. */
#define HUNG_MS		 3000
#define HEALTH_PERIOD_MS 200 /* STATUS polls, lb.h */
/* The prefix index (policy prefix): 2^18 prompt blocks of 256 bytes remembered, 3 MiB. */
#define LB_INDEX_BITS 18
/* Prompt blocks a pick looks at: 512 KiB of rendered prompt. */
#define LB_MAX_BLOCKS 2048

/* How a request's KV reached its decode worker, for /metrics. */
enum ho_kind { HO_FS = 0, HO_DIRECT = 1, HO_FALLBACK = 2, HO_LOCAL = 3, HO_N };

struct replica {
	char addr[KVP_ADDR_MAX];
	uint64_t id;	     /* lbp_id(addr): its rendezvous identity */
	int up;		     /* last health check or call succeeded */
	int queued_tokens;   /* reported */
	int running;	     /* reported */
	int kv_free;	     /* reported */
	uint32_t computed;   /* reported: prompt tokens computed there */
	int inflight;	     /* this gateway's requests there */
	int64_t down_ms;     /* monotonic ms when it was last seen going down; 0 while up */
	int broken;	     /* its in-flight requests were broken for this down spell */
	int inflight_tokens; /* their estimated prompt tokens (prefill) */
	uint64_t picks, failures;
};

struct role {
	struct replica r[LB_MAX_REPLICAS];
	int n;
	unsigned rr;
};

/* Where a request is: queued for a worker, run by one, or ended (finished, or taken out of
 * the queue by a cancel or lb_stop). Moves only forward, under lb.mu. */
enum lq_state { LQ_QUEUED = 0, LQ_RUNNING = 1, LQ_DONE = 2 };

/* A FIFO of requests through their prev/next links (a request is on one list at a time). */
struct lq_list {
	struct lreq *head, *tail;
	int n;
};

struct lb {
	struct lb_opts o;
	struct kvp_secret secret;
	struct kvp_pool *pool;
	pthread_mutex_t mu;	/* guards pf, dc, stop, stopping, queue, active, counters */
	pthread_cond_t cv;	/* health: stop */
	pthread_cond_t work_cv; /* workers: queue not empty, or stop */
	pthread_cond_t idle_cv; /* lb_stop: active emptied */
	struct role pf, dc, en; /* en: encode replicas (lb_opts.encode), maybe none */
	struct lbp_index index; /* prompt blocks -> the prefill replica that computed them */
	int stop;		/* lb_destroy: the health thread and the workers end */
	pthread_t health;
	pthread_t *workers; /* o.workers of them, started in lb_create */
	int nworkers;
	/* workers not running a request (also one not yet scheduled after its creation): each
	 * takes one of the queue's first */
	int idle;
	struct lq_list queue;  /* LQ_QUEUED, at most o.queue */
	struct lq_list active; /* LQ_RUNNING */
	int stopping;	       /* lb_stop: no new requests */
	uint64_t retries;
	uint64_t nonce;		 /* tickets of direct hand-overs: nonce + job id */
	uint64_t handoffs[HO_N]; /* by enum ho_kind; guarded by mu */
	int img_tokens; /* tokens per image, as the encoders last said (encode picks' cost) */
};

/* An event of a DECODE stream for a further choice, queued in its group (kvw_ev, its text
 * copied after it). */
struct lgev {
	struct lgev *next;
	struct kvw_ev ev;
	uint8_t text[];
};

/* The choices of one prompt (n > 1): the first choice's request computes the prompt once
 * (PREFILL with every choice's seed, through the kv dir) and publishes the result here, then
 * sends one DECODE for all of them: the decode worker loads the prompt's KV once and decodes
 * the further choices as forks of the first. The first's request relays each further choice's
 * events to that choice's queue here; the choice's own request (waiting on a worker) reports
 * them to its gw_job, so every job is finished by its own request. Referenced by each member
 * request. */
struct lgroup {
	atomic_int refs;
	pthread_mutex_t mu; /* guards what follows */
	pthread_cond_t cv;  /* done, or a member cancelled */
	int n;		    /* choices */
	uint64_t seeds[KVW_MAX_CHOICES];
	int done, rc; /* the PREFILL's outcome (rc: its error) */
	int32_t *toks;
	int ntoks, cached;
	uint8_t *blk;
	uint32_t blen;
	int32_t first[KVW_MAX_CHOICES];
	struct kvw_lp *lps; /* n records when logprobs were asked, else NULL */
	/* further choices (index 1..n-1): their event queues; ended: its FINISH was queued;
	 * gone: its request no longer reads (finished, cancelled): nothing more is queued */
	struct lgev *evq[KVW_MAX_CHOICES], **evtail[KVW_MAX_CHOICES];
	uint8_t ended[KVW_MAX_CHOICES], gone[KVW_MAX_CHOICES];
	uint8_t told[KVW_MAX_CHOICES]; /* gone before ended: the decode worker was told to stop */
};

/* What a PREFILL reply told (lb.c pf_parse). */
struct pf_result {
	int32_t *toks;
	int n, cached;
	int32_t first;
	int nx;
	int32_t xfirst[KVW_MAX_CHOICES - 1];
	struct kvw_lp *lps; /* 1 + nx records (the first tokens' logprobs), or NULL; owned */
	const uint8_t *blk; /* points into body */
	uint32_t blen;
	int handed; /* the whole KV is parked at the decode replica named in the PREFILL */
	int nimg;   /* where the images' tokens start */
	uint32_t img_pos[KVW_MAX_IMAGES];
	uint8_t *body;
};

/* One request: referenced by the queue or its worker (one reference, passed along) and by the
 * gateway job (dropped in release). */
struct lreq {
	struct lb *l;
	atomic_int refs;
	enum lq_state state;	  /* guarded by l->mu */
	struct lreq *prev, *next; /* on l->queue or l->active; guarded by l->mu */
	struct gw_job *job;
	char *prompt;
	int32_t *toks; /* a prompt of token ids (prompt ""), or NULL */
	int ntoks;
	char *salt;
	int chat;
	int logprobs; /* kvw.h logprobs */
	struct kvi_sample_params sp;
	struct lgroup *grp; /* n > 1: its choices, or NULL */
	int choice;	    /* its index in grp */
	int index;	    /* gw_req.index */
	/* the first token's logprob (from the PREFILL reply), relayed before that token; NULL
	 * for none. Set by its worker before the DECODE. */
	const struct kvw_lp *first_lp;
	/* chat images (gw_req.images: valid until the job is finished, which this request
	 * does) and, once encoded, what the PREFILL and DECODE say of them */
	const struct img_image **images;
	int nimg;
	struct kvw_image *kimg;	   /* nimg records, malloc'd */
	pthread_mutex_t mu;	   /* guards sk, dec, cancelled */
	struct kvp_sock *sk;	   /* the decode connection, NULL when none */
	const struct replica *dec; /* the decode replica of sk */
	int cancelled;
};

/* ---- lb_group.c ---- (lock order: a group's mutex, then a request's) */
/* n > 1 (g->n_forks, g->first): the first choice makes q's group (every choice's seed: seed + k
 * x golden ratio, as the gateway gives a seeded request's k-th choice), the others join the
 * first's (its seed for their sampling). Not a choice of a group: nothing. 0 or -ENOMEM. */
int lb_grp_join(struct lreq *q, const struct gw_req *g);
/* The first choice's PREFILL ended: its result (rc 0, pr copied) or error rc for the others;
 * a no-op after the first call (and for g NULL), so every way the first can end calls it. */
void lb_grp_publish(struct lgroup *g, int rc, const struct pf_result *pr);
/* q was cancelled: a member waiting for its group's prompt looks again. */
void lb_grp_wake(struct lreq *q);
/* Drops a member's reference (NULL: nothing). */
void lb_grp_put(struct lgroup *g);
/* The first choice's DECODE stream brought ev (choice >= 1): queued for that choice (copied;
 * dropped when it is gone or ended). 0 or -ENOMEM (then the choice is ended with -ENOMEM). */
int lb_grp_push(struct lgroup *g, const struct kvw_ev *ev);
/* Every further choice not yet ended gets a FINISH with err and msg (the first's DECODE
 * failed or ended without theirs). */
void lb_grp_end(struct lgroup *g, int err, const char *msg);
/* Further choices gone (cancelled: a stop string, or the client left) that the decode worker
 * still generates (no FINISH came) and was not told to stop: into ks (at least KVW_MAX_CHOICES),
 * marked told; how many. */
int lb_grp_untold(struct lgroup *g, uint8_t *ks);
/* Further choices still reading: neither ended nor gone. */
int lb_grp_live(struct lgroup *g);
/* A further choice after the group's prompt was computed: reports its queued events to its
 * gw_job until its FINISH, or until it is cancelled. Blocks for the whole generation. */
void lb_grp_follow(struct lreq *q);
/* A further choice q finished its job itself (cancelled before following): nothing more is
 * queued for it. */
void lb_grp_leave(struct lreq *q);

/* ---- lb_replica.c ---- */
/* What a pick knows of request q: the gateway does not tokenize, so its tokens are estimated
 * as bytes / 4 + 1 and its blocks are LBP_BLOCK_BYTES of rendered prompt (lbp.h). blk: room
 * for LB_MAX_BLOCKS hashes, or NULL for none (decode picks). */
struct lbp_req lb_req_of(const struct lreq *q, uint64_t *blk);
/* Index of the replica of ro for request q by the policy (engine/serve/lbp.h), or -1 when
 * none is up and not in skip. Caller holds l->mu. */
int lb_pick(struct lb *l, struct role *ro, int prefill, const struct lbp_req *q,
	    const unsigned char *skip);
/* Index of the encode replica for an image (lbp_pick_encode: image-hash affinity under a load
 * bound), or -1. Caller holds l->mu. */
int lb_pick_encoder(struct lb *l, uint64_t img_key, int cost, const unsigned char *skip);
/* A call to r failed at the transport level: r is down (skipped until a health check says
 * otherwise) and the failure counted. Takes l->mu. */
void lb_mark_down(struct lb *l, struct replica *r);
/* Parses a comma-separated host:port list into ro (1..LB_MAX_REPLICAS). 0 or -EINVAL. */
int lb_parse_list(const char *s, struct role *ro);
/* The health thread (lb.h): STATUS rounds every HEALTH_PERIOD_MS until l->stop. */
void *lb_health_main(void *arg);

#endif
