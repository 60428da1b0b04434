/* lb — prefill/decode load balancers and the request pipeline of the disaggregated gateway
 * (see lb.h). */
#define KVFS_LOG_TAG "lb"
#include "lb.h"
#include "ktime.h"
#include "oai.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kvw.h"
#include "log.h"
#include "metrics.h"
#include "sample.h"
#include "sch.h"

#define RPC_TIMEOUT_MS	   600000 /* a long prompt on a slow CPU */
#define STATUS_TIMEOUT_MS  1000
#define CONNECT_TIMEOUT_MS 2000
/* A replica that has failed its health checks this long is taken as hung (stopped, not
 * answering): the calls and streams this gateway has in flight there are broken, so their
 * requests fail or retry instead of waiting out RPC_TIMEOUT_MS or forever. */
#define HUNG_MS 3000

/* How a request's KV reached its decode worker, for /metrics. */
enum ho_kind { HO_FS = 0, HO_DIRECT = 1, HO_FALLBACK = 2, HO_LOCAL = 3, HO_N };
static const char *const ho_names[HO_N] = {"fs", "direct", "fallback", "local"};

struct replica {
	char addr[KVP_ADDR_MAX];
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

struct lb {
	struct lb_opts o;
	struct kvp_secret secret;
	struct kvp_pool *pool;
	pthread_mutex_t mu; /* guards pf, dc, stop, counters */
	pthread_cond_t cv;
	struct role pf, dc;
	int stop;
	pthread_t health;
	atomic_int threads;  /* request threads alive */
	struct lreq *active; /* requests whose thread runs; guarded by mu */
	int stopping;	     /* lb_stop: no new requests; guarded by mu */
	uint64_t retries;
	uint64_t nonce;		 /* tickets of direct hand-overs: nonce + job id */
	uint64_t handoffs[HO_N]; /* by enum ho_kind; guarded by mu */
};

/* One request: referenced by its thread and by the gateway job (dropped in release). */
struct lreq {
	struct lb *l;
	atomic_int refs;
	struct lreq *prev, *next; /* l->active */
	struct gw_job *job;
	char *prompt;
	char *salt;
	int chat;
	struct kvi_sample_params sp;
	pthread_mutex_t mu;	   /* guards fd, dec, cancelled */
	int fd;			   /* the decode connection, -1 when none */
	const struct replica *dec; /* the decode replica of fd */
	int cancelled;
};

int lb_handoff_parse(const char *s)
{
	if (!strcmp(s, "fs"))
		return LB_HANDOFF_FS;
	if (!strcmp(s, "direct"))
		return LB_HANDOFF_DIRECT;
	return -EINVAL;
}

int lb_policy_parse(const char *s)
{
	if (!strcmp(s, "rr"))
		return LB_RR;
	if (!strcmp(s, "least"))
		return LB_LEAST;
	if (!strcmp(s, "cache"))
		return LB_CACHE;
	return -EINVAL;
}

static uint64_t fnv1a(const char *s, uint64_t h)
{
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
	return h;
}

/* Index of the replica for a request (est: its estimated prompt tokens, prefill), or -1 when
 * none is up. Caller holds l->mu. */
static int pick(struct lb *l, struct role *ro, int prefill, uint64_t key, int est, const int *skip)
{
	int best = -1;
	if (l->o.policy == LB_RR) {
		for (int k = 0; k < ro->n; k++) {
			int i = (int)(ro->rr++ % (unsigned)ro->n);
			if (ro->r[i].up && !skip[i])
				return i;
		}
		return -1;
	}
	for (int i = 0; i < ro->n; i++) {
		struct replica *r = &ro->r[i];
		if (!r->up || skip[i])
			continue;
		if (best < 0) {
			best = i;
			continue;
		}
		struct replica *b = &ro->r[best];
		if (prefill) {
			if (r->queued_tokens + r->inflight_tokens <
			    b->queued_tokens + b->inflight_tokens)
				best = i;
		} else if (r->inflight < b->inflight ||
			   (r->inflight == b->inflight && r->kv_free > b->kv_free)) {
			best = i;
		}
	}
	if (best < 0 || !prefill || l->o.policy != LB_CACHE)
		return best;
	/* cache: cost in blocks = LB_CACHE_W x the prompt blocks the replica is expected to compute
	 * + its queued uncached tokens / B. Expected: none on the rendezvous owner of the prompt
	 * (repeats went there, so its KV was computed there), all of them elsewhere. Compared in
	 * tokens (both terms x B) so the division does not round. */
	int own = -1;
	uint64_t top = 0;
	for (int i = 0; i < ro->n; i++) {
		if (!ro->r[i].up || skip[i])
			continue;
		uint64_t h = fnv1a(ro->r[i].addr, key);
		if (own < 0 || h > top) {
			own = i;
			top = h;
		}
	}
	long pblocks = ((long)est + LB_BLOCK_TOKENS - 1) / LB_BLOCK_TOKENS, bcost = 0;
	best = -1;
	for (int k = 0; k < ro->n; k++) {
		int i = (own + k) % ro->n; /* the owner first: it wins ties */
		struct replica *r = &ro->r[i];
		if (!r->up || skip[i])
			continue;
		long cost = (i == own ? 0 : (long)LB_CACHE_W * pblocks * LB_BLOCK_TOKENS) +
			    r->queued_tokens + r->inflight_tokens;
		if (best < 0 || cost < bcost) {
			best = i;
			bcost = cost;
		}
	}
	return best;
}

static int transport_err(int rc)
{
	return rc == -ECONNRESET || rc == -ECONNABORTED || rc == -ECONNREFUSED ||
	       rc == -ETIMEDOUT || rc == -EPIPE || rc == -EHOSTUNREACH || rc == -ENOTCONN;
}

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Caller holds l->mu. */
static void set_down(struct replica *r)
{
	if (r->up || !r->down_ms) {
		r->down_ms = mono_ms();
		r->broken = 0;
	}
	r->up = 0;
}

static void mark_down(struct lb *l, struct replica *r)
{
	pthread_mutex_lock(&l->mu);
	if (r->up)
		klog_warn("replica %s is down", r->addr);
	set_down(r);
	r->failures++;
	pthread_mutex_unlock(&l->mu);
}

/* ---- prefill ------------------------------------------------------------------------- */

struct pf_result {
	int32_t *toks;
	int n, cached;
	int32_t first;
	const uint8_t *blk; /* points into body */
	uint32_t blen;
	int handed; /* the whole KV is parked at the decode replica named in the PREFILL */
	uint8_t *body;
};

static int pf_parse(uint8_t *body, uint32_t len, struct pf_result *p)
{
	struct kvw_prefilled d;
	int rc = kvw_prefilled_dec(body, len, &d);
	if (rc) { /* the caller frees body: p must not hold it either */
		kvw_prefilled_free(&d);
		return rc;
	}
	p->toks = d.toks_buf; /* p owns it now */
	p->n = (int)d.n;
	p->cached = (int)d.cached;
	p->first = d.first;
	p->handed = d.handed == 1;
	p->blen = d.blen;
	p->blk = d.blk;
	p->body = body;
	return 0;
}

/* Runs the prompt on a prefill replica, retrying others on transport failures. peer: the
 * decode replica to hand the KV to directly under ticket, or NULL. */
static int do_prefill(struct lreq *q, struct pf_result *res, const char *peer, uint64_t ticket)
{
	struct lb *l = q->l;
	struct kvp_wbuf w;
	kvp_w_init(&w);
	size_t plen = strlen(q->prompt);
	struct kvw_prompt m = {.salt = q->salt,
			       .sp = q->sp,
			       .parse_special = (uint8_t)q->chat,
			       .text = q->prompt,
			       .len = (uint32_t)plen,
			       .peer = peer,
			       .ticket = ticket};
	int erc = kvw_prefill_enc(&w, &m);
	if (erc) {
		kvp_w_free(&w);
		return erc;
	}
	int skip[LB_MAX_REPLICAS] = {0}, rc = -EAGAIN;
	uint64_t key = fnv1a(q->prompt, 0xcbf29ce484222325ULL);
	int est = (int)(plen / 4) + 1;
	for (;;) {
		pthread_mutex_lock(&l->mu);
		int i = l->stopping ? -1 : pick(l, &l->pf, 1, key, est, skip);
		if (l->stopping)
			rc = -ESHUTDOWN;
		if (i >= 0) {
			l->pf.r[i].inflight++;
			l->pf.r[i].inflight_tokens += est;
			l->pf.r[i].picks++;
		}
		pthread_mutex_unlock(&l->mu);
		if (i < 0)
			break;
		struct replica *r = &l->pf.r[i];
		struct kvp_client *c = NULL;
		uint8_t *body = NULL;
		uint32_t blen = 0;
		rc = kvp_pool_get(l->pool, r->addr, &c);
		if (!rc) {
			rc = kvp_call(c, KVW_OP_PREFILL, w.p, w.len, NULL, 0, RPC_TIMEOUT_MS, &body,
				      &blen);
			kvp_pool_put(l->pool, c);
		}
		pthread_mutex_lock(&l->mu);
		r->inflight--;
		r->inflight_tokens -= est;
		pthread_mutex_unlock(&l->mu);
		if (!rc) {
			rc = pf_parse(body, blen, res);
			if (rc)
				free(body);
			break;
		}
		if (!transport_err(rc))
			break; /* the replica refused the request itself (too long, bad) */
		mark_down(l, r);
		skip[i] = 1;
		pthread_mutex_lock(&l->mu);
		l->retries++;
		pthread_mutex_unlock(&l->mu);
	}
	kvp_w_free(&w);
	return rc;
}

/* ---- decode -------------------------------------------------------------------------- */

/* Streams one DECODE from replica r. Returns 0 when the request finished (finish reported),
 * or a transport error with *ntok tokens relayed (the caller retries when 0). */
static int decode_on(struct lreq *q, struct replica *r, uint16_t op, const struct kvp_wbuf *w,
		     int *ntok)
{
	struct lb *l = q->l;
	int fd = kvp_connect(r->addr, CONNECT_TIMEOUT_MS);
	if (fd < 0)
		return fd;
	int rc = kvp_auth_client(fd, &l->secret, CONNECT_TIMEOUT_MS);
	pthread_mutex_lock(&q->mu);
	if (q->cancelled)
		rc = -ECANCELED;
	else
		q->fd = fd;
	q->dec = r;
	pthread_mutex_unlock(&q->mu);
	struct kvp_hdr h = {.op = op, .id = gw_job_id(q->job)};
	int refused = 0;
	if (!rc)
		rc = kvp_send(fd, &h, w->p, w->len, NULL, 0);
	while (!rc) {
		struct kvp_hdr rh;
		uint8_t *body = NULL;
		rc = kvp_recv(fd, &rh, &body, KVP_MAX_BODY);
		if (rc)
			break;
		if (rh.status) {
			refused = rh.status;
			free(body);
			break;
		}
		struct kvw_ev ev;
		int bad = kvw_ev_dec(body, rh.len, &ev);
		/* GENERATE: the decode worker tokenized the prompt */
		if (ev.kind == KVW_EV_PROMPT) {
			if (!bad)
				gw_job_prompt(q->job, (int)ev.prompt_tokens, (int)ev.cached);
			free(body);
			continue;
		}
		if (ev.kind == KVW_EV_TOKEN) {
			if (!bad) {
				gw_job_token(q->job, (const char *)ev.text, ev.len);
				(*ntok)++;
			}
			free(body);
			continue;
		}
		free(body);
		if (bad) { /* not a FINISH, or a bad one */
			rc = -EBADMSG;
			break;
		}
		int err = ev.err;
		const char *reason = ev.reason, *msg = ev.msg;
		pthread_mutex_lock(&q->mu);
		q->fd = -1;
		pthread_mutex_unlock(&q->mu);
		close(fd);
		gw_job_finish(q->job, err ? NULL : (!strcmp(reason, "length") ? "length" : "stop"),
			      err, err ? msg : NULL);
		return 0;
	}
	pthread_mutex_lock(&q->mu);
	q->fd = -1;
	int cancelled = q->cancelled;
	pthread_mutex_unlock(&q->mu);
	close(fd);
	if (refused) {
		gw_job_finish(q->job, NULL, refused, "decode worker refused the request");
		return 0;
	}
	if (cancelled) {
		gw_job_finish(q->job, NULL, -ECANCELED, "cancelled");
		return 0;
	}
	return rc;
}

static void lreq_put(struct lreq *q)
{
	if (!q || atomic_fetch_sub(&q->refs, 1) != 1)
		return;
	free(q->prompt);
	free(q->salt);
	pthread_mutex_destroy(&q->mu);
	free(q);
}

/* The GENERATE body: the prompt text, for a decode replica to compute itself. */
static void w_generate(struct kvp_wbuf *w, const struct lreq *q)
{
	struct kvw_prompt m = {.salt = q->salt,
			       .sp = q->sp,
			       .parse_special = (uint8_t)q->chat,
			       .text = q->prompt,
			       .len = (uint32_t)strlen(q->prompt)};
	kvw_generate_enc(w, &m); /* errors are sticky in w */
}

/* The DECODE body after a PREFILL. */
static void w_decode(struct kvp_wbuf *w, const struct lreq *q, const struct pf_result *pr,
		     uint64_t ticket)
{
	struct kvw_decode m = {.salt = q->salt,
			       .sp = q->sp,
			       .n = (uint32_t)pr->n,
			       .toks = pr->toks,
			       .first = pr->first,
			       .blen = pr->blen,
			       .blk = pr->blk,
			       .ticket = pr->handed ? ticket : 0};
	kvw_decode_enc(w, &m); /* errors are sticky in w */
}

/* What the client is told when no prefill replica computed its prompt: the worker's reason,
 * which the protocol carries as an errno (kvw.h: PREFILL's errors). */
static const char *prefill_refusal(int rc)
{
	switch (rc) {
	case -E2BIG:
		return "the prompt's tokens plus max_tokens exceed the model's context (refused by "
		       "the prefill worker)";
	case -EINVAL:
		return "the prefill worker refused the request as invalid (bad sampling parameters "
		       "or prompt)";
	case -ERANGE:
		return "'logit_bias' names a token id outside the model's vocabulary";
	case -EAGAIN:
		return "no prefill replica is up";
	case -ESHUTDOWN:
		return "the gateway is shutting down";
	}
	return "prefill failed";
}

/* PREFILL (a direct hand-over to a decode replica picked now, with LB_HANDOFF_DIRECT), then
 * the DECODE body into w. 0, or the request was finished here (1). */
static int prefill_then(struct lreq *q, struct kvp_wbuf *w, struct pf_result *pr, int *peer)
{
	struct lb *l = q->l;
	int skip[LB_MAX_REPLICAS] = {0};
	char peer_addr[KVP_ADDR_MAX] = "";
	uint64_t ticket = 0;
	*peer = -1;
	if (l->o.handoff == LB_HANDOFF_DIRECT) {
		/* the decode replica first: the prefill worker sends it the KV */
		pthread_mutex_lock(&l->mu);
		*peer = pick(l, &l->dc, 0, 0, 0, skip);
		if (*peer >= 0)
			snprintf(peer_addr, sizeof(peer_addr), "%s", l->dc.r[*peer].addr);
		pthread_mutex_unlock(&l->mu);
		ticket = l->nonce + gw_job_id(q->job);
		ticket += !ticket;
	}
	int rc = do_prefill(q, pr, *peer >= 0 ? peer_addr : NULL, ticket);
	pthread_mutex_lock(&q->mu);
	int cancelled = q->cancelled;
	pthread_mutex_unlock(&q->mu);
	if (!rc && cancelled) {
		gw_job_finish(q->job, NULL, -ECANCELED, "cancelled");
		return 1;
	}
	if (rc) {
		gw_job_finish(q->job, NULL, rc, prefill_refusal(rc));
		return 1;
	}
	gw_job_prompt(q->job, pr->n, pr->cached);
	pthread_mutex_lock(&l->mu);
	l->handoffs[*peer < 0 ? HO_FS : pr->handed ? HO_DIRECT : HO_FALLBACK]++;
	pthread_mutex_unlock(&l->mu);
	w_decode(w, q, pr, ticket);
	return 0;
}

static void *req_main(void *arg)
{
	struct lreq *q = arg;
	struct lb *l = q->l;
	struct pf_result pr = {0};
	int skip[LB_MAX_REPLICAS] = {0}, ntok = 0, peer = -1, rc;
	struct kvp_wbuf w;
	kvp_w_init(&w);
	uint16_t op = KVW_OP_DECODE;
	if (l->o.local_prefill > 0 && strlen(q->prompt) / 4 + 1 <= (size_t)l->o.local_prefill) {
		op = KVW_OP_GENERATE; /* short: the decode replica computes it */
		w_generate(&w, q);
		pthread_mutex_lock(&l->mu);
		l->handoffs[HO_LOCAL]++;
		pthread_mutex_unlock(&l->mu);
	} else if (prefill_then(q, &w, &pr, &peer)) {
		goto out;
	}
	rc = w.err ? w.err : -EAGAIN;
	while (!w.err) {
		pthread_mutex_lock(&l->mu);
		/* the KV is parked at the peer: go there unless it is down since */
		int i = peer >= 0 && pr.handed && l->dc.r[peer].up && !skip[peer]
			    ? peer
			    : pick(l, &l->dc, 0, 0, 0, skip);
		if (i >= 0) {
			l->dc.r[i].inflight++;
			l->dc.r[i].picks++;
		}
		pthread_mutex_unlock(&l->mu);
		if (i < 0)
			break;
		struct replica *r = &l->dc.r[i];
		rc = decode_on(q, r, op, &w, &ntok);
		pthread_mutex_lock(&l->mu);
		r->inflight--;
		pthread_mutex_unlock(&l->mu);
		if (rc == 0)
			break;
		mark_down(l, r);
		if (ntok > 0) /* the client saw tokens: no silent retry */
			break;
		skip[i] = 1;
		pthread_mutex_lock(&l->mu);
		l->retries++;
		pthread_mutex_unlock(&l->mu);
	}
	if (rc)
		gw_job_finish(q->job, NULL, rc == -EAGAIN ? -EAGAIN : -EIO,
			      rc == -EAGAIN ? "no decode replica is up" : "decode replica died");
out:
	kvp_w_free(&w);
	free(pr.toks);
	free(pr.body);
	pthread_mutex_lock(&l->mu);
	if (q->prev)
		q->prev->next = q->next;
	else
		l->active = q->next;
	if (q->next)
		q->next->prev = q->prev;
	pthread_mutex_unlock(&l->mu);
	lreq_put(q);
	atomic_fetch_sub(&l->threads, 1);
	return NULL;
}

/* ---- gw_backend ---------------------------------------------------------------------- */

static int be_submit(void *ctx, struct gw_job *job, const struct gw_req *g)
{
	struct lb *l = ctx;
	const struct oai_request *o = g->oai;
	struct lreq *q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	pthread_mutex_init(&q->mu, NULL);
	atomic_init(&q->refs, 1);
	q->l = l;
	q->job = job;
	q->fd = -1;
	q->chat = o->chat;
	q->prompt = strdup(g->prompt);
	q->salt = o->salt ? strdup(o->salt) : NULL;
	_Static_assert(OAI_MAX_SALT < KVW_SALT_MAX, "a salt the API accepts must fit a frame");
	if (!q->prompt || (o->salt && !q->salt) || (o->salt && strlen(o->salt) >= KVW_SALT_MAX)) {
		int rc = q->prompt && o->salt && q->salt ? -EINVAL : -ENOMEM;
		lreq_put(q);
		return rc;
	}
	sch_sample_params(o, g->id, &q->sp);
	pthread_mutex_lock(&l->mu);
	if (l->stopping) {
		pthread_mutex_unlock(&l->mu);
		lreq_put(q);
		return -EAGAIN;
	}
	atomic_fetch_add(&q->refs, 1); /* the thread's */
	q->next = l->active;
	if (l->active)
		l->active->prev = q;
	l->active = q;
	atomic_fetch_add(&l->threads, 1);
	pthread_mutex_unlock(&l->mu);
	gw_job_set_backend_data(job, q);
	pthread_t t;
	pthread_attr_t a;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	int rc = -pthread_create(&t, &a, req_main, q);
	pthread_attr_destroy(&a);
	if (rc) {
		pthread_mutex_lock(&l->mu);
		if (q->prev)
			q->prev->next = q->next;
		else
			l->active = q->next;
		if (q->next)
			q->next->prev = q->prev;
		pthread_mutex_unlock(&l->mu);
		atomic_fetch_sub(&l->threads, 1);
		gw_job_set_backend_data(job, NULL);
		lreq_put(q);
		lreq_put(q);
	}
	return rc;
}

static void be_cancel(void *ctx, struct gw_job *job)
{
	(void)ctx;
	struct lreq *q = gw_job_backend_data(job);
	if (!q)
		return;
	pthread_mutex_lock(&q->mu);
	q->cancelled = 1;
	if (q->fd >= 0) /* the decode worker sees the close and frees the KV */
		shutdown(q->fd, SHUT_RDWR);
	pthread_mutex_unlock(&q->mu);
}

static void be_release(void *ctx, struct gw_job *job)
{
	(void)ctx;
	lreq_put(gw_job_backend_data(job));
}

/* The per-replica families: one block each, every replica of both roles in it. */
static void replica_families(struct lb *l, struct met_out *o)
{
	static const struct {
		const char *name, *type, *help;
	} fams[] = {
	    {"lb_replica_up", "gauge", "1 while the replica answers its STATUS polls"},
	    {"lb_replica_inflight", "gauge", "This gateway's requests on the replica"},
	    {"lb_replica_queued_tokens", "gauge",
	     "Uncached prompt tokens queued there, as the replica last reported (0 while down)"},
	    {"lb_replica_running", "gauge",
	     "Sequences running there, as the replica last reported (0 while down)"},
	    {"lb_replica_kv_free_blocks", "gauge",
	     "Free KV blocks there, as the replica last reported (0 while down)"},
	    {"lb_replica_picks_total", "counter", "Requests this gateway sent to the replica"},
	    {"lb_replica_prompt_tokens_computed", "gauge",
	     "Prompt tokens the replica computed since it started, as last reported (0 while "
	     "down)"},
	};
	const struct {
		const char *name;
		struct role *ro;
	} roles[] = {{"prefill", &l->pf}, {"decode", &l->dc}};
	for (size_t f = 0; f < sizeof(fams) / sizeof(fams[0]); f++) {
		met_out_family(o, fams[f].name, fams[f].type, fams[f].help);
		for (int k = 0; k < 2; k++)
			for (int i = 0; i < roles[k].ro->n; i++) {
				const struct replica *r = &roles[k].ro->r[i];
				const double v[] = {r->up,	r->inflight, r->queued_tokens,
						    r->running, r->kv_free,  (double)r->picks,
						    r->computed};
				const char *lab[] = {"role", roles[k].name, "addr", r->addr, NULL};
				met_out_sample(o, fams[f].name, lab, v[f]);
			}
	}
}

static void be_metrics(void *ctx, struct met_out *o)
{
	struct lb *l = ctx;
	pthread_mutex_lock(&l->mu);
	replica_families(l, o);
	met_out_family(o, "lb_retries_total", "counter",
		       "Requests retried on another replica after a transport error");
	met_out_sample(o, "lb_retries_total", NULL, (double)l->retries);
	met_out_family(o, "lb_kv_handoffs_total", "counter",
		       "How prompts' KV reached their decode replica (local: computed there)");
	for (int k = 0; k < HO_N; k++) {
		const char *lab[] = {"how", ho_names[k], NULL};
		met_out_sample(o, "lb_kv_handoffs_total", lab, (double)l->handoffs[k]);
	}
	pthread_mutex_unlock(&l->mu);
}

static int be_healthy(void *ctx)
{
	struct lb *l = ctx;
	int pf = 0, dc = 0;
	pthread_mutex_lock(&l->mu);
	for (int i = 0; i < l->pf.n; i++)
		pf |= l->pf.r[i].up;
	for (int i = 0; i < l->dc.n; i++)
		dc |= l->dc.r[i].up;
	pthread_mutex_unlock(&l->mu);
	return pf && dc;
}

void lb_backend(struct lb *l, struct gw_backend *out)
{
	memset(out, 0, sizeof(*out));
	out->ctx = l;
	out->submit = be_submit;
	out->cancel = be_cancel;
	out->release = be_release;
	out->metrics = be_metrics;
	out->healthy = be_healthy;
}

/* ---- health -------------------------------------------------------------------------- */

/* One STATUS poll per replica. The calls are all started before any is waited for: polled one
 * after the other, a replica slow to answer (a busy worker on a loaded machine, up to
 * STATUS_TIMEOUT_MS) held back every later replica's refresh, which then kept showing the
 * load of a burst long finished while still up. A replica that does not answer is marked down
 * and its reported load cleared, so no old figure outlives the answer it came from. */
struct probe {
	struct replica *r;
	struct kvp_client *c;
	struct kvp_call *k;
	int rc;
};

static void probe_apply(struct lb *l, struct probe *p, uint8_t *body, uint32_t len)
{
	struct kvw_status st = {0};
	int rc = p->rc;
	if (!rc)
		rc = kvw_status_dec(body, len, &st);
	int running = (int)st.running, queued = (int)st.queued_tokens;
	int kv_free = (int)st.kv_free;
	uint32_t computed = st.prompt_computed;
	pthread_mutex_lock(&l->mu);
	struct replica *r = p->r;
	if (!rc && !r->up)
		klog_info("replica %s is up", r->addr);
	if (rc) {
		if (r->up)
			klog_warn("replica %s does not answer its health check: %s", r->addr,
				  kvp_strerror(rc));
		set_down(r);
	} else {
		r->up = 1;
		r->down_ms = 0;
	}
	r->running = rc ? 0 : running;
	r->queued_tokens = rc ? 0 : queued;
	r->kv_free = rc ? 0 : kv_free;
	if (!rc)
		r->computed = computed;
	pthread_mutex_unlock(&l->mu);
}

static void check_all(struct lb *l)
{
	struct probe ps[2 * LB_MAX_REPLICAS];
	int n = 0;
	for (int i = 0; i < l->pf.n; i++)
		ps[n++] = (struct probe){.r = &l->pf.r[i]};
	for (int i = 0; i < l->dc.n; i++)
		ps[n++] = (struct probe){.r = &l->dc.r[i]};
	/* addr is set once in lb_create and never written after: no lock needed to read it */
	for (int i = 0; i < n; i++) {
		struct probe *p = &ps[i];
		p->rc = kvp_pool_get(l->pool, p->r->addr, &p->c);
		if (!p->rc)
			p->rc = kvp_call_start(p->c, KVW_OP_STATUS, NULL, 0, NULL, 0, &p->k);
	}
	for (int i = 0; i < n; i++) {
		struct probe *p = &ps[i];
		uint8_t *body = NULL;
		uint32_t len = 0;
		if (p->k)
			p->rc = kvp_call_wait(p->k, STATUS_TIMEOUT_MS, &body, &len);
		if (p->c)
			kvp_pool_put(l->pool, p->c);
		probe_apply(l, p, body, len);
		free(body);
	}
}

/* Breaks what this gateway has in flight on replicas down for HUNG_MS: the prefill calls on
 * the pooled connection, the decode streams of the requests there. Caller holds l->mu. */
static void break_hung(struct lb *l)
{
	struct role *roles[2] = {&l->pf, &l->dc};
	int64_t now = mono_ms();
	for (int k = 0; k < 2; k++)
		for (int i = 0; i < roles[k]->n; i++) {
			struct replica *r = &roles[k]->r[i];
			if (r->up || !r->down_ms || r->broken || now - r->down_ms < HUNG_MS)
				continue;
			r->broken = 1;
			if (r->inflight)
				klog_warn("replica %s down for %d ms: breaking %d requests there",
					  r->addr, HUNG_MS, r->inflight);
			kvp_pool_abort(l->pool, r->addr);
			for (struct lreq *q = l->active; q; q = q->next) {
				pthread_mutex_lock(&q->mu);
				if (q->dec == r && q->fd >= 0)
					shutdown(q->fd, SHUT_RDWR);
				pthread_mutex_unlock(&q->mu);
			}
		}
}

static void *health_main(void *arg)
{
	struct lb *l = arg;
	pthread_mutex_lock(&l->mu);
	while (!l->stop) {
		pthread_mutex_unlock(&l->mu);
		check_all(l);
		pthread_mutex_lock(&l->mu);
		break_hung(l);
		struct timespec ts;
		kvfs_deadline(&ts, CLOCK_REALTIME, 200);
		if (!l->stop)
			pthread_cond_timedwait(&l->cv, &l->mu, &ts);
	}
	pthread_mutex_unlock(&l->mu);
	return NULL;
}

static int parse_list(const char *s, struct role *ro)
{
	ro->n = 0;
	while (s && *s) {
		const char *e = strchr(s, ',');
		size_t n = e ? (size_t)(e - s) : strlen(s);
		char host[KVP_ADDR_MAX];
		uint16_t port;
		if (ro->n == LB_MAX_REPLICAS || n == 0 || n >= KVP_ADDR_MAX)
			return -EINVAL;
		memcpy(ro->r[ro->n].addr, s, n);
		ro->r[ro->n].addr[n] = 0;
		if (kvp_addr_parse(ro->r[ro->n].addr, host, sizeof(host), &port) || port == 0)
			return -EINVAL;
		ro->r[ro->n].up = 1; /* until a check says otherwise */
		ro->n++;
		s = e ? e + 1 : NULL;
	}
	return ro->n ? 0 : -EINVAL;
}

int lb_create(const struct lb_opts *o, struct lb **out)
{
	struct lb *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->o = *o;
	l->secret = *o->secret;
	int rc = parse_list(o->prefill, &l->pf);
	if (!rc)
		rc = parse_list(o->decode, &l->dc);
	if (!rc)
		rc = kvp_pool_create(&l->secret, CONNECT_TIMEOUT_MS, &l->pool);
	if (rc) {
		free(l);
		return rc;
	}
	pthread_mutex_init(&l->mu, NULL);
	pthread_cond_init(&l->cv, NULL);
	/* tickets must not repeat across gateway restarts while a decode worker still holds
	 * one: the clock and pid are enough for that (a ticket lives SCH_PARK_MS) */
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	l->nonce = ((uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec) ^
		   ((uint64_t)getpid() << 40);
	l->nonce *= 0x9E3779B97F4A7C15ULL;
	if ((rc = -pthread_create(&l->health, NULL, health_main, l))) {
		kvp_pool_destroy(l->pool);
		free(l);
		return rc;
	}
	*out = l;
	return 0;
}

void lb_stop(struct lb *l)
{
	pthread_mutex_lock(&l->mu);
	l->stopping = 1;
	for (struct lreq *q = l->active; q; q = q->next) {
		pthread_mutex_lock(&q->mu);
		q->cancelled = 1;
		if (q->fd >= 0)
			shutdown(q->fd, SHUT_RDWR);
		pthread_mutex_unlock(&q->mu);
	}
	pthread_mutex_unlock(&l->mu);
	/* a prefill call in flight ends by itself (bounded by its RPC timeout) */
	while (atomic_load(&l->threads) > 0) {
		struct timespec ts = {0, 10 * 1000000L};
		nanosleep(&ts, NULL);
	}
}

void lb_destroy(struct lb *l)
{
	if (!l)
		return;
	lb_stop(l);
	pthread_mutex_lock(&l->mu);
	l->stop = 1;
	pthread_cond_signal(&l->cv);
	pthread_mutex_unlock(&l->mu);
	pthread_join(l->health, NULL);
	while (atomic_load(&l->threads) > 0) {
		struct timespec ts = {0, 10 * 1000000L};
		nanosleep(&ts, NULL);
	}
	kvp_pool_destroy(l->pool);
	pthread_mutex_destroy(&l->mu);
	pthread_cond_destroy(&l->cv);
	free(l);
}
