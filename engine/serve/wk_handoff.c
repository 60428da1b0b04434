/* The direct prefill -> decode KV hand-over of `kvinfer prefill` / `decode` (docs/serving.md,
 * kvw.h KVW_OP_KV_PUT / HELLO / NCCL_ID): bytes over the worker connection, or NCCL between
 * GPU engines with watchdogs on both sides. */
#define KVFS_LOG_TAG "worker"
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cfg.h"
#include "ktime.h"
#include "kvk_nccl.h"
#include "kvw.h"
#include "log.h"
#include "wk_int.h"

_Static_assert(KVK_NCCL_ID_BYTES == KVW_NCCL_ID_BYTES, "kvw carries an NCCL id");

/* The PREFILL reply (kvw.h), here because both the hand-over and wk.c's plain prefill
 * answer with it (wk.c calls this file, never the reverse). 0, or the encoding's error (nothing
 * sent). */
int wk_pf_reply(struct kvp_conn *c, const struct kvp_hdr *h, const int32_t *toks, int n, int cached,
		int32_t first, const struct wk_firsts *f, int handed, const void *blk, size_t blen)
{
	struct kvw_prefilled p = {.n = (uint32_t)n,
				  .toks = toks,
				  .cached = (uint32_t)cached,
				  .first = first,
				  .nx = (uint32_t)f->nx,
				  .handed = (uint8_t)handed,
				  .blen = (uint32_t)blen};
	memcpy(p.xfirst, f->xfirst, sizeof(p.xfirst));
	p.nimg = (uint32_t)f->nimg;
	for (int i = 0; i < f->nimg; i++)
		p.images[i].off = f->img_pos[i];
	if (f->lps && f->nlp == 1 + f->nx) { /* every choice's, or none */
		p.lp = &f->lps[0];
		p.xlp = &f->lps[1];
	}
	struct kvp_wbuf b;
	kvp_w_init(&b);
	int rc = kvw_prefilled_enc(&b, &p);
	if (!rc)
		kvp_reply(c, h, 0, b.p, b.len, blk, blen);
	kvp_w_free(&b);
	return rc;
}

/* ---- direct hand-over, prefill side ---------------------------------------------------- */

/* The KVW_OP_KV_PUT body: everything but the bytes of the KV. */
static void put_header(struct kvp_wbuf *b, const struct wreq *w, const struct sch_handoff *h,
		       int via)
{
	struct kvw_put p = {.ticket = w->ticket,
			    .n = (uint32_t)h->n,
			    .toks = h->toks,
			    .first_block = (uint32_t)h->first_block,
			    .block_bytes = (uint32_t)h->block_bytes,
			    .n_blocks = (uint32_t)h->n_blocks,
			    .via = (uint8_t)via,
			    .session = w->pi.session};
	kvw_put_enc(b, &p); /* errors are sticky in b */
}

/* A hand-over by bytes, sent and answered on a thread of its own so the prefill scheduler
 * goes on computing meanwhile. Owns everything it points to. */
struct put {
	struct wk *k;
	struct kvp_conn *c;
	struct kvp_hdr h;
	char peer[KVP_ADDR_MAX];
	struct kvp_wbuf hdr;
	uint8_t *kv;
	size_t kv_len, bb;
	int32_t *toks;
	int n, cached;
	int32_t first;
	struct wk_firsts f; /* its lps a copy */
};

static int put_send(struct wk *k, const char *peer, const struct kvp_wbuf *hdr, const void *kv,
		    size_t len)
{
	struct kvp_client *cl = NULL;
	int rc = kvp_pool_get(k->pool, peer, &cl);
	if (!rc) {
		rc = kvp_call(cl, KVW_OP_KV_PUT, hdr->p, hdr->len, kv, len, PUT_TIMEOUT_MS, NULL,
			      NULL);
		kvp_pool_put(k->pool, cl);
	}
	return rc;
}

static void *put_main(void *arg)
{
	struct put *p = arg;
	int rc = put_send(p->k, p->peer, &p->hdr, p->kv, p->kv_len);
	if (rc) /* the decode worker computes from the kv dir instead; it needs the last block */
		klog_warn("hand-over to %s: %s; the decode worker loads from the kv dir", p->peer,
			  kvp_strerror(rc));
	wk_pf_reply(p->c, &p->h, p->toks, p->n, p->cached, p->first, &p->f, rc == 0,
		    rc ? p->kv + p->kv_len - p->bb : NULL, rc ? p->bb : 0);
	kvp_conn_unref(p->c);
	struct wk *k = p->k;
	kvp_w_free(&p->hdr);
	free(p->f.lps);
	free(p->kv);
	free(p->toks);
	free(p);
	pthread_mutex_lock(&k->mu);
	k->puts--;
	pthread_cond_broadcast(&k->cv);
	pthread_mutex_unlock(&k->mu);
	return NULL;
}

static int put_start(struct wreq *w, const struct sch_handoff *h)
{
	struct put *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	kvp_w_init(&p->hdr);
	put_header(&p->hdr, w, h, 0);
	p->kv_len = (size_t)h->n_blocks * h->block_bytes;
	p->bb = h->block_bytes;
	p->kv = malloc(p->kv_len);
	p->toks = malloc((size_t)h->n * sizeof(int32_t));
	p->f = w->f;
	p->f.lps = w->f.lps ? malloc(KVW_MAX_CHOICES * sizeof(*p->f.lps)) : NULL;
	int rc = p->hdr.err		 ? p->hdr.err
		 : !p->kv || !p->toks	 ? -ENOMEM
		 : w->f.lps && !p->f.lps ? -ENOMEM
					 : 0;
	if (!rc) {
		if (p->f.lps)
			memcpy(p->f.lps, w->f.lps, KVW_MAX_CHOICES * sizeof(*p->f.lps));
		memcpy(p->kv, h->kv, p->kv_len);
		memcpy(p->toks, h->toks, (size_t)h->n * sizeof(int32_t));
		memcpy(p->peer, w->peer, sizeof(p->peer));
		p->k = w->k;
		p->c = w->c;
		p->h = w->h;
		p->n = h->n;
		p->cached = h->cached;
		p->first = h->first;
		kvp_conn_ref(p->c);
		pthread_mutex_lock(&w->k->mu);
		w->k->puts++;
		pthread_mutex_unlock(&w->k->mu);
		pthread_t t;
		pthread_attr_t a;
		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		rc = -pthread_create(&t, &a, put_main, p);
		pthread_attr_destroy(&a);
		if (!rc)
			return 0;
		kvp_conn_unref(p->c);
		pthread_mutex_lock(&w->k->mu);
		w->k->puts--;
		pthread_mutex_unlock(&w->k->mu);
	}
	kvp_w_free(&p->hdr);
	free(p->kv);
	free(p->toks);
	free(p->f.lps);
	free(p);
	return rc;
}

/* NCCL: the KV_PUT announces the transfer, the scheduler thread sends the blocks (the decode
 * worker's scheduler receives them when it handles the KV_PUT), then the reply confirms. */
/* Waits for the decode worker's answer to an NCCL KV_PUT while the scheduler thread sends:
 * an error answer (it refused, or died) means it will never receive, so the communicator is
 * aborted to release the send (NCCL has no timeout). */
struct nccl_watch {
	struct kvp_call *call;
	struct kvk_nccl *c;
	int rc;
};

static void *watch_main(void *arg)
{
	struct nccl_watch *x = arg;
	x->rc = kvp_call_wait(x->call, PUT_TIMEOUT_MS, NULL, NULL);
	if (x->rc)
		kvk_nccl_abort(x->c);
	return NULL;
}

/* Prefill side: communicator c is broken; later hand-overs to its peer start afresh (HELLO,
 * NCCL_ID). It is destroyed at exit: requests already holding it fail on it meanwhile. */
static void peer_drop(struct wk *k, struct kvk_nccl *c)
{
	pthread_mutex_lock(&k->mu);
	for (int i = 0; i < k->npeers; i++)
		if (k->peers[i].c == c) {
			k->peers[i] = k->peers[--k->npeers];
			if (k->ndead < WK_MAX_COMMS)
				k->dead[k->ndead++] = c;
			break;
		}
	pthread_mutex_unlock(&k->mu);
}

/* 1 while c is the communicator of a peer (not dropped). Drops happen on the scheduler thread
 * (put_nccl), so there this answer holds until its next hand-over. */
static int peer_current(struct wk *k, const struct kvk_nccl *c)
{
	int ok = 0;
	pthread_mutex_lock(&k->mu);
	for (int i = 0; i < k->npeers; i++)
		ok |= k->peers[i].c == c;
	pthread_mutex_unlock(&k->mu);
	return ok;
}

static int put_nccl(struct wreq *w, struct sch *s, const struct sch_handoff *h)
{
	/* Requests queued before their peer's communicator broke still hold it. Announcing a
	 * transfer on it would park the decode worker's scheduler in its receive (this side's send
	 * fails at once on the aborted communicator) until its watchdog fires, and this scheduler
	 * in the wait for that reply: both stalled PUT_TIMEOUT_MS. */
	if (!peer_current(w->k, w->pi.c))
		return -ENOTCONN; /* the communicator is no longer connected to the peer */
	struct kvp_wbuf b;
	kvp_w_init(&b);
	put_header(&b, w, h, 1);
	struct kvp_client *cl = NULL;
	struct kvp_call *call = NULL;
	int rc = b.err;
	if (!rc && !(rc = kvp_pool_get(w->k->pool, w->peer, &cl))) {
		rc = kvp_call_start(cl, KVW_OP_KV_PUT, b.p, b.len, NULL, 0, &call);
		kvp_pool_put(w->k->pool, cl);
	}
	kvp_w_free(&b);
	if (rc)
		return rc;
	struct nccl_watch x = {.call = call, .c = w->pi.c};
	pthread_t t;
	if ((rc = -pthread_create(&t, NULL, watch_main, &x))) {
		kvk_nccl_abort(w->pi.c); /* the KV_PUT is out: a send could wait forever */
		x.rc = kvp_call_wait(call, PUT_TIMEOUT_MS, NULL, NULL);
	} else {
		rc = sch_nccl_send(s, w->pi.c, h, 0);
		pthread_join(t, NULL);
	}
	if (rc || x.rc)
		peer_drop(w->k, w->pi.c);
	return rc ? rc : x.rc;
}

void wk_pf_handoff(void *u, struct sch *s, const struct sch_handoff *h)
{
	struct wreq *w = u;
	w->f.nimg = sch_req_images(w->r, w->f.img_pos, KVW_MAX_IMAGES);
	if (h->kv) {
		int rc = put_start(w, h);
		if (!rc) {
			w->replied = 1; /* the thread replies */
			return;
		}
		klog_warn("hand-over to %s: %s", w->peer, strerror(-rc));
		size_t last = (size_t)(h->n_blocks - 1) * h->block_bytes;
		if (!wk_pf_reply(w->c, &w->h, h->toks, h->n, h->cached, h->first, &w->f, 0,
				 (const uint8_t *)h->kv + last, h->block_bytes))
			w->replied = 1;
		return;
	}
	int rc = put_nccl(w, s, h);
	if (rc)
		klog_warn("NCCL hand-over to %s: %s; the decode worker loads from the kv dir",
			  w->peer, kvp_strerror(rc));
	if (!wk_pf_reply(w->c, &w->h, h->toks, h->n, h->cached, h->first, &w->f, rc == 0, NULL, 0))
		w->replied = 1;
}

/* Prefill side: NCCL with decode worker peer (the decode side creates the id,
 * KVW_OP_NCCL_ID). NULL when it cannot. */
static struct kvk_nccl *nccl_setup(struct wk *k, const char *peer, uint32_t *session)
{
	struct kvp_client *cl = NULL;
	uint8_t *body = NULL;
	uint32_t len = 0;
	int rc = kvp_pool_get(k->pool, peer, &cl);
	if (!rc) {
		rc = kvp_call(cl, KVW_OP_NCCL_ID, NULL, 0, NULL, 0, PUT_TIMEOUT_MS, &body, &len);
		kvp_pool_put(k->pool, cl);
	}
	struct kvk_nccl *c = NULL;
	if (!rc) {
		const uint8_t *id = NULL;
		rc = kvw_nccl_id_dec(body, len, session, &id);
		if (!rc)
			rc = sch_nccl_join(k->s, id, 1, &c);
	}
	free(body);
	if (rc)
		klog_warn("no NCCL with %s (%s): hand-overs go as bytes", peer, kvp_strerror(rc));
	else
		klog_info("NCCL communicator with %s (session %u)", peer, *session);
	return c;
}

/* Prefill side: *out = what is known of decode worker peer, asked on first contact. 0, or
 * the transport error (nothing learned: bytes, every block). */
int wk_peer_get(struct wk *k, const char *peer, struct wk_peer *out)
{
	pthread_mutex_lock(&k->mu);
	for (int i = 0; i < k->npeers; i++)
		if (!strcmp(k->peers[i].addr, peer)) {
			*out = k->peers[i];
			pthread_mutex_unlock(&k->mu);
			return 0;
		}
	pthread_mutex_unlock(&k->mu);
	struct wk_peer e = {0};
	snprintf(e.addr, sizeof(e.addr), "%s", peer);
	struct kvp_client *cl = NULL;
	uint8_t *body = NULL;
	uint32_t len = 0;
	int rc = kvp_pool_get(k->pool, peer, &cl);
	if (!rc) {
		rc = kvp_call(cl, KVW_OP_HELLO, NULL, 0, NULL, 0, PUT_TIMEOUT_MS, &body, &len);
		kvp_pool_put(k->pool, cl);
	}
	if (!rc) {
		char id[CFG_STR_MAX + 64];
		rc = kvw_hello_dec(body, len, id, sizeof(id));
		const char *mine = sch_cache_id(k->s);
		e.shared = !rc && mine[0] && !strcmp(id, mine);
	}
	free(body);
	if (rc) {
		klog_warn("decode worker %s: %s", peer, kvp_strerror(rc));
		*out = e;
		return rc;
	}
	if (k->nccl && sch_nccl_capable(k->s))
		e.c = nccl_setup(k, peer, &e.session);
	klog_info("decode worker %s: %s kv dir, hand-overs by %s", peer,
		  e.shared ? "the same" : "another (or no)", e.c ? "NCCL" : "bytes");
	pthread_mutex_lock(&k->mu);
	struct kvk_nccl *drop = NULL;
	int i = 0;
	while (i < k->npeers && strcmp(k->peers[i].addr, peer))
		i++;
	if (i < k->npeers) { /* a racing request learned it first */
		drop = e.c;
		e = k->peers[i];
	} else if (k->npeers < WK_MAX_COMMS) {
		k->peers[k->npeers++] = e;
	} else {
		drop = e.c;
		e.c = NULL;
	}
	pthread_mutex_unlock(&k->mu);
	sch_nccl_leave(k->s, drop);
	*out = e;
	return 0;
}

/* ---- direct hand-over, decode side ------------------------------------------------------ */

/* Aborts communicator c unless the receive it guards ends within PUT_TIMEOUT_MS: a prefill
 * worker that died after its KV_PUT never sends, and the scheduler thread would wait in the
 * receive for good. */
struct recv_guard {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done, fired;
	struct kvk_nccl *c;
};

static void *guard_main(void *arg)
{
	struct recv_guard *g = arg;
	struct timespec t;
	kvfs_deadline(&t, CLOCK_MONOTONIC, PUT_TIMEOUT_MS);
	pthread_mutex_lock(&g->mu);
	while (!g->done && pthread_cond_timedwait(&g->cv, &g->mu, &t) != ETIMEDOUT)
		;
	g->fired = !g->done;
	pthread_mutex_unlock(&g->mu);
	if (g->fired)
		kvk_nccl_abort(g->c);
	return NULL;
}

static int park_nccl_guarded(struct wk *k, uint64_t ticket, const int32_t *toks, int n, int first,
			     uint32_t session)
{
	struct kvk_nccl *c = NULL;
	pthread_mutex_lock(&k->mu);
	for (int i = 0; i < k->ncomms; i++)
		if (k->comms[i].session == session)
			c = k->comms[i].c;
	pthread_mutex_unlock(&k->mu);
	if (!c)
		return -ENOENT;
	struct recv_guard g = {.c = c};
	pthread_mutex_init(&g.mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&g.cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_t t;
	int rc = -pthread_create(&t, NULL, guard_main, &g);
	if (!rc) {
		rc = sch_park_nccl(k->s, ticket, toks, n, first, c, 1);
		pthread_mutex_lock(&g.mu);
		g.done = 1;
		pthread_cond_signal(&g.cv);
		pthread_mutex_unlock(&g.mu);
		pthread_join(t, NULL);
	}
	if (g.fired || rc == -EIO) { /* that session is over: the prefill worker sets up anew */
		klog_warn("NCCL session %u: %s; dropped", session,
			  g.fired ? "no data within the timeout" : "transfer failed");
		pthread_mutex_lock(&k->mu);
		for (int i = 0; i < k->ncomms; i++)
			if (k->comms[i].session == session)
				k->comms[i].session = 0; /* kept for destruction at exit */
		pthread_mutex_unlock(&k->mu);
	}
	pthread_mutex_destroy(&g.mu);
	pthread_cond_destroy(&g.cv);
	return g.fired ? -ETIMEDOUT : rc;
}

int wk_dc_put(struct wk *k, const uint8_t *body, size_t len)
{
	struct kvw_put p;
	int rc = kvw_put_dec(body, len, &p);
	if (rc) {
		kvw_put_free(&p);
		return rc;
	}
	/* another geometry: the prefill worker falls back to the kv dir. n_blocks is checked for
	 * NCCL too: both sides must transfer the same count, or one waits in NCCL for good */
	if (p.via > 1 || p.block_bytes != sch_block_bytes(k->s) || p.first_block > p.n ||
	    p.n > INT32_MAX ||
	    (int64_t)p.n_blocks != sch_handoff_blocks(k->s, (int)p.n, (int)p.first_block))
		rc = -EINVAL;
	else if (p.via == 0)
		rc = sch_park(k->s, p.ticket, p.toks, (int)p.n, (int)p.first_block, p.kv, p.kv_len);
	else
		rc = p.session ? park_nccl_guarded(k, p.ticket, p.toks, (int)p.n,
						   (int)p.first_block, p.session)
			       : -ENOENT;
	kvw_put_free(&p);
	return rc;
}

/* KVW_OP_NCCL_ID: a fresh id to the prefill worker, then this side joins as rank 0 (this
 * connection's thread waits until the prefill worker joined too). */
void wk_dc_nccl_id(struct wk *k, struct kvp_conn *conn, const struct kvp_hdr *h)
{
	uint8_t id[KVK_NCCL_ID_BYTES];
	int rc = sch_nccl_capable(k->s) ? kvk_nccl_id_create(id) : -EOPNOTSUPP;
	pthread_mutex_lock(&k->mu);
	if (!rc && k->ncomms == WK_MAX_COMMS)
		rc = -ENOSPC;
	uint32_t sess = ++k->next_session;
	if (!sess) /* 0 is "no session" */
		sess = ++k->next_session;
	pthread_mutex_unlock(&k->mu);
	struct kvp_wbuf b;
	kvp_w_init(&b);
	int erc = kvw_nccl_id_enc(&b, sess, id);
	if (!rc)
		rc = erc;
	kvp_reply(conn, h, rc, rc ? NULL : b.p, rc ? 0 : b.len, NULL, 0);
	kvp_w_free(&b);
	struct kvk_nccl *c = NULL;
	if (rc || (rc = sch_nccl_join(k->s, id, 0, &c)))
		return;
	pthread_mutex_lock(&k->mu);
	if (k->ncomms < WK_MAX_COMMS) {
		k->comms[k->ncomms++] = (struct wk_comm){.session = sess, .c = c};
		c = NULL;
	}
	pthread_mutex_unlock(&k->mu);
	sch_nccl_leave(k->s, c);
}
