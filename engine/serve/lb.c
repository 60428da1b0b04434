/* lb — the request pipeline, worker pool and gw_backend of the disaggregated gateway (see
 * lb.h); the replica table is in lb_replica.c. */
#define KVFS_LOG_TAG "lb"
#include "lb.h"
#include "oai.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "img.h"
#include "kvw.h"
#include "lb_int.h"
#include "log.h"
#include "metrics.h"
#include "sample.h"
#include "sch.h"

static const char *const ho_names[HO_N] = {"fs", "direct", "fallback", "local"};

static int transport_err(int rc)
{
	return rc == -ECONNRESET || rc == -ECONNABORTED || rc == -ECONNREFUSED ||
	       rc == -ETIMEDOUT || rc == -EPIPE || rc == -EHOSTUNREACH || rc == -ENOTCONN;
}

/* ---- prefill ------------------------------------------------------------------------- */

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
	p->nx = (int)d.nx;
	memcpy(p->xfirst, d.xfirst, sizeof(p->xfirst));
	if (d.lp) { /* p owns the records */
		p->lps = d.lp_buf;
		d.lp_buf = NULL;
	}
	d.toks_buf = NULL;
	kvw_prefilled_free(&d);
	p->handed = d.handed == 1;
	p->nimg = (int)d.nimg;
	for (uint32_t i = 0; i < d.nimg; i++)
		p->img_pos[i] = d.images[i].off;
	p->blen = d.blen;
	p->blk = d.blk;
	p->body = body;
	return 0;
}

/* The prompt fields of q's PREFILL or GENERATE. */
static void prompt_of(const struct lreq *q, struct kvw_prompt *m)
{
	m->salt = q->salt;
	m->sp = q->sp;
	m->logprobs = (uint8_t)q->logprobs;
	m->parse_special = (uint8_t)q->chat;
	m->text = q->prompt;
	m->len = (uint32_t)strlen(q->prompt);
	m->toks = q->toks;
	m->nt = q->toks ? (uint32_t)q->ntoks : 0;
}

/* A PREFILL call to r has started. lb_stop breaks the prefill connections after setting
 * stopping, which a call started before then does not outlive; one started after (picked
 * before the stop, sent after the break) is broken here, so no call waits out RPC_TIMEOUT_MS
 * while lb_stop waits for it. */
static void pf_call_started(struct lb *l, const struct replica *r)
{
	pthread_mutex_lock(&l->mu);
	int stopping = l->stopping;
	pthread_mutex_unlock(&l->mu);
	if (stopping)
		kvp_pool_abort(l->pool, r->addr); /* addr is immutable after lb_create */
}

/* Runs the prompt on a prefill replica, retrying others on transport failures. peer: the
 * decode replica to hand the KV to directly under ticket, or NULL. Blocks for the PREFILL
 * (up to RPC_TIMEOUT_MS per replica tried, cut short by lb_stop: -ESHUTDOWN). */
static int do_prefill(struct lreq *q, struct pf_result *res, const char *peer, uint64_t ticket)
{
	struct lb *l = q->l;
	struct kvp_wbuf w;
	kvp_w_init(&w);
	struct kvw_prompt m = {.peer = peer, .ticket = ticket};
	prompt_of(q, &m);
	if (q->grp && q->choice == 0) { /* every choice's first token, from one prompt */
		m.nx = (uint32_t)q->grp->n - 1;
		memcpy(m.seeds, q->grp->seeds + 1, m.nx * sizeof(m.seeds[0]));
	}
	m.nimg = (uint32_t)q->nimg;
	if (q->nimg)
		memcpy(m.images, q->kimg, (size_t)q->nimg * sizeof(m.images[0]));
	int erc = kvw_prefill_enc(&w, &m);
	if (erc) {
		kvp_w_free(&w);
		return erc;
	}
	unsigned char skip[LB_MAX_REPLICAS] = {0};
	int rc = -EAGAIN;
	uint64_t *blk = malloc(LB_MAX_BLOCKS * sizeof(*blk));
	struct lbp_req pq = lb_req_of(q, blk); /* no blocks without memory: policies still work */
	int est = pq.est_tokens;
	for (;;) {
		pthread_mutex_lock(&l->mu);
		int i = l->stopping ? -1 : lb_pick(l, &l->pf, 1, &pq, skip);
		if (l->stopping)
			rc = -ESHUTDOWN;
		if (i >= 0) {
			lbp_index_note(&l->index, &pq, i);
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
			struct kvp_call *k = NULL;
			rc = kvp_call_start(c, KVW_OP_PREFILL, w.p, w.len, NULL, 0, &k);
			if (!rc) {
				pf_call_started(l, r);
				rc = kvp_call_wait(k, RPC_TIMEOUT_MS, &body, &blen);
			}
			kvp_pool_put(l->pool, c);
		}
		pthread_mutex_lock(&l->mu);
		r->inflight--;
		r->inflight_tokens -= est;
		int stopping = l->stopping;
		pthread_mutex_unlock(&l->mu);
		if (!rc) {
			rc = pf_parse(body, blen, res);
			if (rc)
				free(body);
			break;
		}
		if (stopping && transport_err(rc)) {
			rc = -ESHUTDOWN; /* lb_stop broke the call: the replica is not at fault */
			break;
		}
		if (!transport_err(rc))
			break; /* the replica refused the request itself (too long, bad) */
		lb_mark_down(l, r);
		skip[i] = 1;
		pthread_mutex_lock(&l->mu);
		l->retries++;
		pthread_mutex_unlock(&l->mu);
	}
	free(blk);
	kvp_w_free(&w);
	return rc;
}

/* ---- encode -------------------------------------------------------------------------- */

static int lreq_cancelled(struct lreq *q);

/* Image k of q on an encode replica (lbp_pick_encode), retrying others on transport failures:
 * its embeddings are then in the shared kv dir, and q->kimg[k] says what the PREFILL names
 * them by. Blocks for the ENCODE (cut short by lb_stop: -ESHUTDOWN). */
static int do_encode(struct lreq *q, int k)
{
	struct lb *l = q->l;
	const struct img_image *im = q->images[k];
	struct kvw_encode e = {.salt = q->salt, .w = im->w, .h = im->h};
	memcpy(e.hash, im->hash, KVW_IMG_HASH);
	struct kvp_wbuf w;
	kvp_w_init(&w);
	int rc = kvw_encode_enc(&w, &e);
	if (rc) {
		kvp_w_free(&w);
		return rc;
	}
	uint64_t key;
	memcpy(&key, im->hash, sizeof(key));
	size_t npx = (size_t)im->w * im->h * 3;
	unsigned char skip[LB_MAX_REPLICAS] = {0};
	rc = -EAGAIN;
	for (;;) {
		pthread_mutex_lock(&l->mu);
		int cost = l->img_tokens;
		int i = l->stopping ? -1 : lb_pick_encoder(l, key, cost, skip);
		if (l->stopping)
			rc = -ESHUTDOWN;
		if (i >= 0) {
			l->en.r[i].inflight++;
			l->en.r[i].inflight_tokens += cost;
			l->en.r[i].picks++;
		}
		pthread_mutex_unlock(&l->mu);
		if (i < 0)
			break;
		struct replica *r = &l->en.r[i];
		struct kvp_client *c = NULL;
		uint8_t *body = NULL;
		uint32_t blen = 0;
		rc = kvp_pool_get(l->pool, r->addr, &c);
		if (!rc) {
			struct kvp_call *kc = NULL;
			rc = kvp_call_start(c, KVW_OP_ENCODE, w.p, w.len, im->rgb, npx, &kc);
			if (!rc) {
				pf_call_started(l, r);
				rc = kvp_call_wait(kc, RPC_TIMEOUT_MS, &body, &blen);
			}
			kvp_pool_put(l->pool, c);
		}
		pthread_mutex_lock(&l->mu);
		r->inflight--;
		r->inflight_tokens -= cost;
		int stopping = l->stopping;
		pthread_mutex_unlock(&l->mu);
		if (!rc) {
			struct kvw_encoded d;
			rc = kvw_encoded_dec(body, blen, &d);
			free(body);
			if (!rc) {
				q->kimg[k].n_tokens = d.n_tokens;
				memcpy(q->kimg[k].tower_fp, d.tower_fp, KVW_IMG_HASH);
				pthread_mutex_lock(&l->mu);
				l->img_tokens = (int)d.n_tokens;
				pthread_mutex_unlock(&l->mu);
			}
			break;
		}
		if (stopping && transport_err(rc)) {
			rc = -ESHUTDOWN;
			break;
		}
		if (!transport_err(rc))
			break; /* the replica refused the image itself */
		lb_mark_down(l, r);
		skip[i] = 1;
		pthread_mutex_lock(&l->mu);
		l->retries++;
		pthread_mutex_unlock(&l->mu);
	}
	kvp_w_free(&w);
	return rc;
}

/* Every image of q encoded (in order); 0, or the request was finished here (1). */
static int encode_all(struct lreq *q)
{
	for (int k = 0; k < q->nimg; k++) {
		int rc = lreq_cancelled(q) ? -ECANCELED : do_encode(q, k);
		if (!rc)
			continue;
		const char *msg = rc == -EINVAL	  ? "the vision encoder cannot take this image"
				  : rc == -E2BIG  ? "the image is larger than the encoder takes"
				  : rc == -EAGAIN ? "no encode replica is up, or all are overloaded"
				  : rc == -ECANCELED ? "cancelled"
				  : rc == -ESHUTDOWN ? "the gateway is shutting down"
						     : "image encoding failed";
		/* an image too large is the client's error, not a context overflow */
		gw_job_finish(q->job, NULL, rc == -E2BIG ? -EINVAL : rc, msg);
		return 1;
	}
	return 0;
}

/* ---- decode -------------------------------------------------------------------------- */

static int lreq_cancelled(struct lreq *q);

/* A KVW_OP_CANCEL of choice on the DECODE dh's connection (sent by the thread reading it:
 * the only one that writes to it after the DECODE). 0 or a transport error. */
static int send_cancel(struct kvp_sock *sk, const struct kvp_hdr *dh, uint8_t choice)
{
	struct kvp_wbuf w;
	kvp_w_init(&w);
	int rc = kvw_cancel_enc(&w, choice);
	struct kvp_hdr h = {.op = KVW_OP_CANCEL, .id = dh->id};
	if (!rc)
		rc = kvp_send(sk, &h, w.p, w.len, NULL, 0);
	kvp_w_free(&w);
	return rc;
}

/* The group's further choices that went (a stop string, the client) while the worker still
 * generates them: each told to stop, so that it no longer takes a batch slot and decode
 * steps until the whole group ends. 0 or a transport error. */
static int cancel_gone(struct lgroup *g, struct kvp_sock *sk, const struct kvp_hdr *dh)
{
	uint8_t ks[KVW_MAX_CHOICES];
	int n = lb_grp_untold(g, ks), rc = 0;
	for (int i = 0; i < n && !rc; i++)
		rc = send_cancel(sk, dh, ks[i]);
	return rc;
}

/* Streams one DECODE from replica r (for a group's first choice, every choice's: the further
 * ones' events go to their queues, and the stream lasts until every choice ended). Returns 0 when
 * the request finished (finish reported), or a transport error with *ntok tokens relayed (the
 * caller retries when 0). */
static int decode_on(struct lreq *q, struct replica *r, uint16_t op, const struct kvp_wbuf *w,
		     int *ntok)
{
	struct lb *l = q->l;
	struct kvp_sock *sk;
	int rc = kvp_sock_open(r->addr, &l->secret, CONNECT_TIMEOUT_MS, &sk);
	if (rc)
		return rc;
	pthread_mutex_lock(&q->mu);
	if (q->cancelled)
		rc = -ECANCELED;
	else
		q->sk = sk;
	q->dec = r;
	pthread_mutex_unlock(&q->mu);
	struct kvp_hdr h = {.op = op, .id = gw_job_id(q->job)};
	int refused = 0, own_done = 0, own_tok = 0; /* own: this choice's, not the group's */
	if (!rc)
		rc = kvp_send(sk, &h, w->p, w->len, NULL, 0);
	while (!rc) {
		struct kvp_hdr rh;
		uint8_t *body = NULL;
		if (!own_done && q->grp && lreq_cancelled(q)) { /* the others go on */
			gw_job_finish(q->job, NULL, -ECANCELED, "cancelled");
			own_done = 1;
			if ((rc = send_cancel(sk, &h, 0))) /* the worker stops generating it */
				break;
		}
		if (own_done && (!q->grp || !lb_grp_live(q->grp)))
			break;
		if (q->grp && q->choice == 0 && (rc = cancel_gone(q->grp, sk, &h)))
			break;
		rc = kvp_recv(sk, &rh, &body, KVP_MAX_BODY);
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
		if (!bad && ev.choice > 0 && q->grp && q->choice == 0) { /* a further choice's */
			lb_grp_push(q->grp, &ev);
			(*ntok)++;
			free(body);
			if (own_done && !lb_grp_live(q->grp))
				break;
			continue;
		}
		if (ev.kind == KVW_EV_TOKEN) {
			if (!bad && !own_done) {
				/* the first token's logprob came with the PREFILL reply */
				const struct kvw_lp *lp = ev.lp.present	 ? &ev.lp
							  : own_tok == 0 ? q->first_lp
									 : NULL;
				if (lp && q->logprobs) {
					struct gw_logprob g;
					kvw_lp_to(lp, &g);
					gw_job_logprob(q->job, &g);
				}
				gw_job_token(q->job, (const char *)ev.text, ev.len);
				(*ntok)++;
				own_tok++;
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
		if (!own_done)
			gw_job_finish(q->job,
				      err ? NULL : (!strcmp(reason, "length") ? "length" : "stop"),
				      err, err ? msg : NULL);
		own_done = 1;
		(*ntok)++;
		if (q->grp && q->choice == 0 && lb_grp_live(q->grp))
			continue; /* the further choices go on */
		break;
	}
	if (own_done) { /* every choice ended (or no one reads any more) */
		pthread_mutex_lock(&q->mu);
		q->sk = NULL;
		pthread_mutex_unlock(&q->mu);
		kvp_sock_close(sk);
		return 0;
	}
	pthread_mutex_lock(&q->mu);
	q->sk = NULL;
	int cancelled = q->cancelled;
	pthread_mutex_unlock(&q->mu);
	kvp_sock_close(sk);
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

static int lreq_cancelled(struct lreq *q)
{
	pthread_mutex_lock(&q->mu);
	int c = q->cancelled;
	pthread_mutex_unlock(&q->mu);
	return c;
}

static void lreq_put(struct lreq *q)
{
	if (!q || atomic_fetch_sub(&q->refs, 1) != 1)
		return;
	lb_grp_put(q->grp);
	free(q->images);
	free(q->kimg);
	free(q->prompt);
	free(q->toks);
	free(q->salt);
	pthread_mutex_destroy(&q->mu);
	free(q);
}

/* The GENERATE body: the prompt text, for a decode replica to compute itself. */
static void w_generate(struct kvp_wbuf *w, const struct lreq *q)
{
	struct kvw_prompt m = {0};
	prompt_of(q, &m);
	kvw_generate_enc(w, &m); /* errors are sticky in w */
}

/* The DECODE body after a PREFILL. */
static void w_decode(struct kvp_wbuf *w, const struct lreq *q, const struct pf_result *pr,
		     uint64_t ticket)
{
	struct kvw_decode m = {.salt = q->salt,
			       .sp = q->sp,
			       .logprobs = (uint8_t)q->logprobs,
			       .n = (uint32_t)pr->n,
			       .toks = pr->toks,
			       .first = pr->first,
			       .blen = pr->blen,
			       .blk = pr->blk,
			       .ticket = pr->handed ? ticket : 0};
	if (q->grp && q->choice == 0) { /* every choice, forks of this one on one worker */
		m.nx = (uint32_t)q->grp->n - 1;
		memcpy(m.xseeds, q->grp->seeds + 1, m.nx * sizeof(m.xseeds[0]));
		memcpy(m.xfirst, q->grp->first + 1, m.nx * sizeof(m.xfirst[0]));
	}
	if (pr->nimg != q->nimg) { /* the prefill worker placed other images than it was sent */
		w->err = -EPROTO;
		return;
	}
	m.nimg = (uint32_t)q->nimg;
	for (int i = 0; i < q->nimg; i++) {
		m.images[i] = q->kimg[i];
		m.images[i].off = pr->img_pos[i];
	}
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
	case -ENOENT: /* kvw.h: an image's embeddings were not in the prefill worker's kv dir */
		return "the prefill worker found no embeddings of an image in its kv dir (the "
		       "encode and prefill workers must share --kv-dir)";
	case -ESHUTDOWN:
		return "the gateway is shutting down";
	case -ECANCELED: /* a group's first choice, before its PREFILL */
		return "cancelled";
	}
	return "prefill failed";
}

/* PREFILL (a direct hand-over to a decode replica picked now, with LB_HANDOFF_DIRECT), then
 * the DECODE body into w. 0, or the request was finished here (1). */
static int prefill_then(struct lreq *q, struct kvp_wbuf *w, struct pf_result *pr, int *peer)
{
	struct lb *l = q->l;
	unsigned char skip[LB_MAX_REPLICAS] = {0};
	struct lbp_req dq = lb_req_of(q, NULL);
	char peer_addr[KVP_ADDR_MAX] = "";
	uint64_t ticket = 0;
	*peer = -1;
	/* the choices of one prompt all load its blocks from the kv dir: no direct hand-over,
	 * which parks the KV for one DECODE */
	if (l->o.handoff == LB_HANDOFF_DIRECT && !q->grp) {
		/* the decode replica first: the prefill worker sends it the KV */
		pthread_mutex_lock(&l->mu);
		*peer = lb_pick(l, &l->dc, 0, &dq, skip);
		if (*peer >= 0)
			snprintf(peer_addr, sizeof(peer_addr), "%s", l->dc.r[*peer].addr);
		pthread_mutex_unlock(&l->mu);
		ticket = l->nonce + gw_job_id(q->job);
		ticket += !ticket;
	}
	int rc = do_prefill(q, pr, *peer >= 0 ? peer_addr : NULL, ticket);
	lb_grp_publish(q->grp, rc, pr);
	int cancelled = lreq_cancelled(q);
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
	q->first_lp = pr->lps;
	w_decode(w, q, pr, ticket);
	return 0;
}

/* A further choice of a group: waits for the first choice's PREFILL (pr then points into the
 * group). 0: its first choice's DECODE generates it (lb_grp_follow), or the request was
 * finished here (1). */
static int choice_then(struct lreq *q, struct pf_result *pr)
{
	struct lgroup *g = q->grp;
	pthread_mutex_lock(&g->mu);
	while (!g->done && !lreq_cancelled(q))
		pthread_cond_wait(&g->cv, &g->mu);
	int done = g->done, rc = g->rc;
	pthread_mutex_unlock(&g->mu);
	if (!done || lreq_cancelled(q)) {
		lb_grp_leave(q);
		gw_job_finish(q->job, NULL, -ECANCELED, "cancelled");
		return 1;
	}
	if (rc) {
		gw_job_finish(q->job, NULL, rc, prefill_refusal(rc));
		return 1;
	}
	/* done: the group's fields no longer change */
	*pr = (struct pf_result){.toks = g->toks,
				 .n = g->ntoks,
				 .cached = g->cached,
				 .first = g->first[q->choice],
				 .blk = g->blk,
				 .blen = g->blen};
	q->first_lp = g->lps ? &g->lps[q->choice] : NULL;
	gw_job_prompt(q->job, pr->n, pr->cached);
	pthread_mutex_lock(&q->l->mu);
	q->l->handoffs[HO_FS]++;
	pthread_mutex_unlock(&q->l->mu);
	return 0;
}

/* Runs request q to its gw_job_finish, on a worker. */
static void req_run(struct lreq *q)
{
	struct lb *l = q->l;
	struct pf_result pr = {0};
	unsigned char skip[LB_MAX_REPLICAS] = {0};
	int ntok = 0, peer = -1, rc;
	struct lbp_req dq = lb_req_of(q, NULL);
	struct kvp_wbuf w;
	kvp_w_init(&w);
	uint16_t op = KVW_OP_DECODE;
	int gerr = -ECANCELED; /* what the group's other choices are told if this one ends them */
	const char *gmsg = "cancelled";
	int follower = q->grp && q->choice > 0; /* pr points into the group: not freed */
	if (follower) {
		if (!choice_then(q, &pr))
			lb_grp_follow(q);
		goto out;
	} else if (q->nimg && encode_all(q)) {
		goto out;
	} else if (!q->grp && !q->nimg && l->o.local_prefill > 0 &&
		   dq.est_tokens <= l->o.local_prefill) {
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
			    : lb_pick(l, &l->dc, 0, &dq, skip);
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
		lb_mark_down(l, r);
		if (ntok > 0) /* the client saw tokens: no silent retry */
			break;
		skip[i] = 1;
		pthread_mutex_lock(&l->mu);
		l->retries++;
		pthread_mutex_unlock(&l->mu);
	}
	gerr = rc == -EAGAIN ? -EAGAIN : -EIO;
	gmsg = !rc	       ? "the decode replica ended without this choice"
	       : rc == -EAGAIN ? "no decode replica is up"
			       : "decode replica died";
	if (rc)
		gw_job_finish(q->job, NULL, gerr, gmsg);
out:
	if (q->grp && q->choice == 0) { /* ended before its PREFILL did: the others end too */
		lb_grp_publish(q->grp, -ECANCELED, NULL);
		lb_grp_end(q->grp, gerr, gmsg); /* their DECODE was this one's */
	}
	kvp_w_free(&w);
	if (!follower) {
		free(pr.toks);
		free(pr.body);
		free(pr.lps);
	}
}

/* ---- the worker pool ------------------------------------------------------------------ */

static void lq_push(struct lq_list *ls, struct lreq *q)
{
	q->next = NULL;
	q->prev = ls->tail;
	if (ls->tail)
		ls->tail->next = q;
	else
		ls->head = q;
	ls->tail = q;
	ls->n++;
}

static void lq_remove(struct lq_list *ls, struct lreq *q)
{
	if (q->prev)
		q->prev->next = q->next;
	else
		ls->head = q->next;
	if (q->next)
		q->next->prev = q->prev;
	else
		ls->tail = q->prev;
	q->prev = q->next = NULL;
	ls->n--;
}

/* A worker: takes the oldest queued request, runs it, repeats; ends at lb_destroy once the
 * queue is empty (lb_stop has emptied it by then). */
static void *worker_main(void *arg)
{
	struct lb *l = arg;
	pthread_mutex_lock(&l->mu);
	for (;;) {
		while (!l->queue.head && !l->stop)
			pthread_cond_wait(&l->work_cv, &l->mu);
		struct lreq *q = l->queue.head;
		if (!q)
			break;
		l->idle--;
		lq_remove(&l->queue, q);
		q->state = LQ_RUNNING;
		lq_push(&l->active, q);
		pthread_mutex_unlock(&l->mu);
		req_run(q);
		pthread_mutex_lock(&l->mu);
		lq_remove(&l->active, q);
		q->state = LQ_DONE;
		l->idle++;
		if (!l->active.n)
			pthread_cond_broadcast(&l->idle_cv);
		pthread_mutex_unlock(&l->mu);
		lreq_put(q); /* the queue's reference, which this worker held */
		pthread_mutex_lock(&l->mu);
	}
	pthread_mutex_unlock(&l->mu);
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
	q->sk = NULL;
	q->chat = o->chat;
	q->logprobs = o->logprobs ? 1 + o->top_logprobs : 0;
	q->index = g->index;
	q->prompt = strdup(g->prompt);
	if (g->toks && g->n_toks > 0 && (q->toks = malloc((size_t)g->n_toks * sizeof(int32_t)))) {
		memcpy(q->toks, g->toks, (size_t)g->n_toks * sizeof(int32_t));
		q->ntoks = g->n_toks;
	} else if (g->toks && g->n_toks > 0) {
		lreq_put(q);
		return -ENOMEM;
	}
	q->salt = o->salt ? strdup(o->salt) : NULL;
	_Static_assert(OAI_MAX_SALT < KVW_SALT_MAX, "a salt the API accepts must fit a frame");
	if (!q->prompt || (o->salt && !q->salt) || (o->salt && strlen(o->salt) >= KVW_SALT_MAX)) {
		int rc = q->prompt && o->salt && q->salt ? -EINVAL : -ENOMEM;
		lreq_put(q);
		return rc;
	}
	sch_sample_params(o, g->id, &q->sp);
	/* the images: a further choice of a group takes its first's prompt, encoded there */
	if (g->n_images > 0 && !(g->n_forks == 0 && g->first)) {
		if (!l->en.n || g->n_images > KVW_MAX_IMAGES || g->prompt[0] == 0) {
			lreq_put(q);
			return -EINVAL;
		}
		q->images = malloc((size_t)g->n_images * sizeof(*q->images));
		q->kimg = calloc((size_t)g->n_images, sizeof(*q->kimg));
		if (!q->images || !q->kimg) {
			lreq_put(q);
			return -ENOMEM;
		}
		for (int i = 0; i < g->n_images; i++) {
			if (g->image_off[i] > UINT32_MAX) {
				lreq_put(q);
				return -EINVAL;
			}
			q->images[i] = g->images[i];
			q->kimg[i].off = (uint32_t)g->image_off[i];
			memcpy(q->kimg[i].hash, g->images[i]->hash, KVW_IMG_HASH);
		}
		q->nimg = g->n_images;
	}
	int rc = lb_grp_join(q, g);
	if (rc) {
		lreq_put(q);
		return rc;
	}
	/* backend data before the request is visible to a worker: cancel and release find it */
	gw_job_set_backend_data(job, q);
	pthread_mutex_lock(&l->mu);
	/* waiting for a busy worker: what the idle ones will not take at once */
	int full = l->queue.n - l->idle >= l->o.queue;
	if (l->stopping || full) {
		pthread_mutex_unlock(&l->mu);
		if (full)
			klog_debug("request queue full (%d waiting): refused", l->o.queue);
		return -EAGAIN; /* release drops the job's reference, the only one */
	}
	atomic_fetch_add(&q->refs, 1); /* the queue's, then its worker's */
	q->state = LQ_QUEUED;
	lq_push(&l->queue, q);
	pthread_cond_signal(&l->work_cv);
	pthread_mutex_unlock(&l->mu);
	return 0;
}

static void be_cancel(void *ctx, struct gw_job *job)
{
	(void)ctx;
	struct lreq *q = gw_job_backend_data(job);
	if (!q)
		return;
	struct lb *l = q->l;
	pthread_mutex_lock(&l->mu);
	int queued = q->state == LQ_QUEUED;
	if (queued) { /* no worker has it: end it here, freeing its place in the queue */
		lq_remove(&l->queue, q);
		q->state = LQ_DONE;
	}
	pthread_mutex_unlock(&l->mu);
	if (queued) {
		if (q->choice == 0)
			lb_grp_publish(q->grp, -ECANCELED, NULL);
		lb_grp_leave(q);
		gw_job_finish(job, NULL, -ECANCELED, "cancelled");
		lreq_put(q); /* the queue's reference */
		return;
	}
	/* a group's first choice streams the others too: its connection stays while they read
	 * (decode_on finishes its job at once) */
	int others = q->grp && q->choice == 0 && lb_grp_live(q->grp);
	pthread_mutex_lock(&q->mu);
	q->cancelled = 1;
	if (q->sk && !others) /* the decode worker sees the close and frees the KV */
		kvp_sock_shutdown(q->sk);
	pthread_mutex_unlock(&q->mu);
	lb_grp_wake(q);
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
	} roles[] = {{"prefill", &l->pf}, {"decode", &l->dc}, {"encode", &l->en}};
	for (size_t f = 0; f < sizeof(fams) / sizeof(fams[0]); f++) {
		met_out_family(o, fams[f].name, fams[f].type, fams[f].help);
		for (int k = 0; k < 3; k++)
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
	met_out_family(o, "lb_requests_running", "gauge",
		       "Requests a worker of the pool runs (at most --workers)");
	met_out_sample(o, "lb_requests_running", NULL, (double)l->active.n);
	met_out_family(o, "lb_requests_queued", "gauge",
		       "Requests waiting for a worker (at most --queue; past it: 503 overloaded)");
	met_out_sample(o, "lb_requests_queued", NULL, (double)l->queue.n);
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

/* Ends the workers started so far and the health thread (when started). */
static void lb_join(struct lb *l, int health)
{
	pthread_mutex_lock(&l->mu);
	l->stop = 1;
	pthread_cond_signal(&l->cv);
	pthread_cond_broadcast(&l->work_cv);
	pthread_mutex_unlock(&l->mu);
	if (health)
		pthread_join(l->health, NULL);
	for (int i = 0; i < l->nworkers; i++)
		pthread_join(l->workers[i], NULL);
}

static void lb_free(struct lb *l)
{
	kvp_pool_destroy(l->pool);
	lbp_index_free(&l->index);
	pthread_mutex_destroy(&l->mu);
	pthread_cond_destroy(&l->cv);
	pthread_cond_destroy(&l->work_cv);
	pthread_cond_destroy(&l->idle_cv);
	free(l->workers);
	free(l);
}

int lb_create(const struct lb_opts *o, struct lb **out)
{
	if (o->workers < 0 || o->workers > LB_WORKERS_MAX || o->queue < 0 ||
	    o->queue > LB_QUEUE_MAX)
		return -EINVAL;
	struct lb *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->o = *o;
	l->o.workers = o->workers ? o->workers : LB_WORKERS;
	l->o.queue = o->queue ? o->queue : LB_QUEUE;
	l->secret = *o->secret;
	int rc = lb_parse_list(o->prefill, &l->pf);
	if (!rc)
		rc = lb_parse_list(o->decode, &l->dc);
	if (!rc && o->encode && *o->encode)
		rc = lb_parse_list(o->encode, &l->en);
	l->img_tokens = 1; /* until an encoder tells */
	if (!rc && l->o.policy == LB_PREFIX)
		rc = lbp_index_init(&l->index, LB_INDEX_BITS);
	if (!rc)
		rc = kvp_pool_create(&l->secret, CONNECT_TIMEOUT_MS, &l->pool);
	if (!rc && !(l->workers = calloc((size_t)l->o.workers, sizeof(*l->workers)))) {
		kvp_pool_destroy(l->pool);
		rc = -ENOMEM;
	}
	if (rc) {
		lbp_index_free(&l->index);
		free(l);
		return rc;
	}
	pthread_mutex_init(&l->mu, NULL);
	pthread_cond_init(&l->cv, NULL);
	pthread_cond_init(&l->work_cv, NULL);
	pthread_cond_init(&l->idle_cv, NULL);
	/* tickets must not repeat across gateway restarts while a decode worker still holds
	 * one: the clock and pid are enough for that (a ticket lives SCH_PARK_MS) */
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	l->nonce = ((uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec) ^
		   ((uint64_t)getpid() << 40);
	l->nonce *= 0x9E3779B97F4A7C15ULL;
	l->idle = l->o.workers; /* before any worker exists: no lock needed */
	while (!rc && l->nworkers < l->o.workers) {
		rc = -pthread_create(&l->workers[l->nworkers], NULL, worker_main, l);
		l->nworkers += !rc;
	}
	if (!rc)
		rc = -pthread_create(&l->health, NULL, lb_health_main, l);
	if (rc) {
		lb_join(l, 0);
		lb_free(l);
		return rc;
	}
	*out = l;
	return 0;
}

void lb_stop(struct lb *l)
{
	pthread_mutex_lock(&l->mu);
	l->stopping = 1;
	struct lreq *queued = l->queue.head; /* ended here, below: no worker has them */
	for (struct lreq *q = queued; q; q = q->next)
		q->state = LQ_DONE;
	l->queue = (struct lq_list){0};
	for (struct lreq *q = l->active.head; q; q = q->next) {
		pthread_mutex_lock(&q->mu);
		q->cancelled = 1;
		if (q->sk) /* a decode stream: its worker sees the close */
			kvp_sock_shutdown(q->sk);
		pthread_mutex_unlock(&q->mu);
		lb_grp_wake(q);
	}
	pthread_mutex_unlock(&l->mu);
	while (queued) {
		struct lreq *q = queued;
		queued = q->next;
		if (q->choice == 0)
			lb_grp_publish(q->grp, -ECANCELED, NULL);
		gw_job_finish(q->job, NULL, -ECANCELED, "the gateway is stopping");
		lreq_put(q);
	}
	/* PREFILL calls in flight (RPC_TIMEOUT_MS) fail now: see pf_call_started */
	for (int i = 0; i < l->pf.n; i++)
		kvp_pool_abort(l->pool, l->pf.r[i].addr);
	pthread_mutex_lock(&l->mu);
	while (l->active.n)
		pthread_cond_wait(&l->idle_cv, &l->mu);
	pthread_mutex_unlock(&l->mu);
}

void lb_destroy(struct lb *l)
{
	if (!l)
		return;
	lb_stop(l);
	lb_join(l, 1);
	lb_free(l);
}
