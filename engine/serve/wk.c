/* `kvinfer prefill` and `kvinfer decode`: worker processes of the disaggregated server. Each
 * runs one scheduler (sch.h) behind a kvp_server speaking kvw.h. A prefill worker computes
 * prompts (SCH_PREFILL) and hands over the last block — or, when the gateway names a decode
 * worker, sends that worker the whole prompt's KV (KVW_OP_KV_PUT, bytes or NCCL); a decode
 * worker parks such KV, loads the blocks and generates with continuous batching (SCH_DECODE),
 * streaming one frame per token. */
#define KVFS_LOG_TAG "worker"
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cfg.h"
#include "kvinfer_cli.h"
#include "kvk_nccl.h"
#include "kvp.h"
#include "ktime.h"
#include "kvw.h"
#include "log.h"
#include "sch.h"

int kvinfer_cmd_prefill(int argc, char **argv);
int kvinfer_cmd_decode(int argc, char **argv);

struct wk_cfg {
	char model[CFG_STR_MAX];
	char kv_dir[CFG_STR_MAX];
	char listen[CFG_STR_MAX];
	char port_file[CFG_STR_MAX];
	char secret_file[CFG_STR_MAX];
	int64_t threads, max_seqs, ctx, chunk, block_tokens;
	char isa[CFG_STR_MAX];
	char device[CFG_STR_MAX];
	int ignore_eos;
	int nccl;
};

#define WOFF(f) offsetof(struct wk_cfg, f)
static const struct cfg_opt wk_opts[] = {
    {"model", CFG_STR, WOFF(model), 0, 0, NULL, "GGUF model file (-m)"},
    {"kv-dir", CFG_STR, WOFF(kv_dir), 0, 0, NULL,
     "shared prefix-cache directory (a kvfs mount); prefill and decode must share it"},
    {"listen", CFG_STR, WOFF(listen), 0, 0, "127.0.0.1:0", "host:port to serve kvw on"},
    {"port-file", CFG_STR, WOFF(port_file), 0, 0, NULL, "write the bound port here"},
    {"secret-file", CFG_STR, WOFF(secret_file), 0, 0, NULL, "shared secret (16..64 bytes)"},
    {"threads", CFG_INT, WOFF(threads), 0, 256, "0", "engine threads, 0 = all cores (-t)"},
    {"max-seqs", CFG_INT, WOFF(max_seqs), 1, 1024, "16", "running sequences at most"},
    {"ctx", CFG_INT, WOFF(ctx), 0, 1 << 20, "0", "per-sequence context, 0 = min(train, 2048)"},
    {"prefill-chunk", CFG_INT, WOFF(chunk), 1, 1 << 16, "256", "prompt tokens per step"},
    {"block-tokens", CFG_INT, WOFF(block_tokens), 1, 4096, "64", "KV block size B"},
    {"isa", CFG_STR, WOFF(isa), 0, 0, "auto", "matmul kernels: auto, avx2, scalar"},
    {"device", CFG_STR, WOFF(device), 0, 0, "cpu", KVINFER_DEVICE_HELP},
    {"ignore-eos", CFG_BOOL, WOFF(ignore_eos), 0, 0, "false", "generate past end tokens"},
    {"nccl", CFG_BOOL, WOFF(nccl), 0, 0, "false",
     "prefill, --device cuda: direct hand-overs to decode workers on other GPUs with NCCL"},
    CFG_END,
};

#define PUT_TIMEOUT_MS	   30000 /* a decode worker parks a hand-over at its next step */
#define CONNECT_TIMEOUT_MS 2000
#define WK_MAX_COMMS	   64

/* Decode side: an NCCL communicator a prefill worker set up (KVW_OP_NCCL_ID). */
struct wk_comm {
	uint32_t session;
	struct kvk_nccl *c;
};

/* Prefill side: what the first contact with a decode worker told (KVW_OP_HELLO). */
struct wk_peer {
	char addr[KVP_ADDR_MAX];
	int shared;	    /* same kv dir and cache: blocks loaded from it are not sent */
	struct kvk_nccl *c; /* NCCL with it (--nccl, both able), or NULL: bytes */
	uint32_t session;
};

struct wk {
	struct sch *s;
	enum sch_mode mode;
	struct kvp_pool *pool; /* prefill: connections to decode workers */
	int nccl;	       /* prefill: try NCCL for hand-overs */
	pthread_mutex_t mu;    /* guards peers, comms, puts */
	pthread_cond_t cv;     /* puts dropped */
	struct wk_comm comms[WK_MAX_COMMS];
	int ncomms;
	struct wk_peer peers[WK_MAX_COMMS];
	int npeers;
	struct kvk_nccl *dead[WK_MAX_COMMS]; /* aborted, destroyed at exit */
	int ndead;
	uint32_t next_session;
	int puts; /* hand-over threads running */
};

/* One request from the gateway; freed by its finish callback (the scheduler's last touch). */
struct wreq {
	struct wk *k;
	struct kvp_conn *c;
	struct kvp_hdr h;
	struct sch_req *r;
	int replied;
	/* PREFILL with a direct hand-over */
	char peer[KVP_ADDR_MAX];
	uint64_t ticket;
	struct wk_peer pi; /* what is known of peer */
};

static void wr_done(struct wreq *w)
{
	kvp_conn_unref(w->c);
	sch_req_free(w->r);
	free(w);
}

/* The PREFILL reply (kvw.h). 0, or the encoding's error (nothing sent). */
static int pf_reply(struct kvp_conn *c, const struct kvp_hdr *h, const int32_t *toks, int n,
		    int cached, int32_t first, int handed, const void *blk, size_t blen)
{
	struct kvp_wbuf b;
	kvp_w_init(&b);
	kvp_w_u32(&b, (uint32_t)n);
	for (int i = 0; i < n; i++)
		kvp_w_u32(&b, (uint32_t)toks[i]);
	kvp_w_u32(&b, (uint32_t)cached);
	kvp_w_u32(&b, (uint32_t)first);
	kvp_w_u8(&b, (uint8_t)handed);
	kvp_w_u32(&b, (uint32_t)blen);
	int rc = b.err;
	if (!rc)
		kvp_reply(c, h, 0, b.p, b.len, blk, blen);
	kvp_w_free(&b);
	return rc;
}

static void pf_prefilled(void *u, const int32_t *toks, int n, int cached, int32_t first,
			 const void *blk, size_t blen)
{
	struct wreq *w = u;
	if (!pf_reply(w->c, &w->h, toks, n, cached, first, 0, blk, blen))
		w->replied = 1;
}

static void pf_finish(void *u, const char *reason, int err, const char *msg)
{
	struct wreq *w = u;
	(void)reason;
	(void)msg;
	if (!w->replied)
		kvp_reply(w->c, &w->h, err ? err : -EIO, NULL, 0, NULL, 0);
	wr_done(w);
}

static void dc_token(void *u, int32_t id, const char *piece, size_t len)
{
	struct wreq *w = u;
	struct kvp_wbuf b;
	kvp_w_init(&b);
	kvp_w_u8(&b, KVW_EV_TOKEN);
	kvp_w_u32(&b, (uint32_t)id);
	kvp_w_u32(&b, (uint32_t)len);
	/* the gateway is gone: stop generating and free the KV */
	if (b.err || kvp_reply(w->c, &w->h, 0, b.p, b.len, piece, len))
		sch_cancel(w->r);
	kvp_w_free(&b);
}

static void dc_finish(void *u, const char *reason, int err, const char *msg)
{
	struct wreq *w = u;
	struct kvp_wbuf b;
	kvp_w_init(&b);
	kvp_w_u8(&b, KVW_EV_FINISH);
	kvp_w_u32(&b, (uint32_t)err);
	kvp_w_cstr(&b, reason ? reason : "");
	kvp_w_cstr(&b, msg ? msg : "");
	if (!b.err)
		kvp_reply(w->c, &w->h, 0, b.p, b.len, NULL, 0);
	kvp_w_free(&b);
	wr_done(w);
}

/* ---- direct hand-over, prefill side ---------------------------------------------------- */

/* The KVW_OP_KV_PUT body: everything but the bytes of the KV. */
static void put_header(struct kvp_wbuf *b, const struct wreq *w, const struct sch_handoff *h,
		       int via)
{
	kvp_w_u64(b, w->ticket);
	kvp_w_u32(b, (uint32_t)h->n);
	for (int i = 0; i < h->n; i++)
		kvp_w_u32(b, (uint32_t)h->toks[i]);
	kvp_w_u32(b, (uint32_t)h->first_block);
	kvp_w_u32(b, (uint32_t)h->block_bytes);
	kvp_w_u32(b, (uint32_t)h->n_blocks);
	kvp_w_u8(b, (uint8_t)via);
	kvp_w_u32(b, via ? w->pi.session : 0);
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
	pf_reply(p->c, &p->h, p->toks, p->n, p->cached, p->first, rc == 0,
		 rc ? p->kv + p->kv_len - p->bb : NULL, rc ? p->bb : 0);
	kvp_conn_unref(p->c);
	struct wk *k = p->k;
	kvp_w_free(&p->hdr);
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
	int rc = p->hdr.err ? p->hdr.err : p->kv && p->toks ? 0 : -ENOMEM;
	if (!rc) {
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

static int put_nccl(struct wreq *w, struct sch *s, const struct sch_handoff *h)
{
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

static void pf_handoff(void *u, struct sch *s, const struct sch_handoff *h)
{
	struct wreq *w = u;
	if (h->kv) {
		int rc = put_start(w, h);
		if (!rc) {
			w->replied = 1; /* the thread replies */
			return;
		}
		klog_warn("hand-over to %s: %s", w->peer, strerror(-rc));
		size_t last = (size_t)(h->n_blocks - 1) * h->block_bytes;
		if (!pf_reply(w->c, &w->h, h->toks, h->n, h->cached, h->first, 0,
			      (const uint8_t *)h->kv + last, h->block_bytes))
			w->replied = 1;
		return;
	}
	int rc = put_nccl(w, s, h);
	if (rc)
		klog_warn("NCCL hand-over to %s: %s; the decode worker loads from the kv dir",
			  w->peer, kvp_strerror(rc));
	if (!pf_reply(w->c, &w->h, h->toks, h->n, h->cached, h->first, rc == 0, NULL, 0))
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
		struct kvp_rbuf rb;
		kvp_r_init(&rb, body, len);
		*session = kvp_r_u32(&rb);
		const uint8_t *id = kvp_r_bytes(&rb, KVK_NCCL_ID_BYTES);
		rc = kvp_r_end(&rb);
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
static int peer_get(struct wk *k, const char *peer, struct wk_peer *out)
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
		struct kvp_rbuf rb;
		kvp_r_init(&rb, body, len);
		kvp_r_str(&rb, id, sizeof(id));
		rc = kvp_r_end(&rb);
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

static int dc_put(struct wk *k, struct kvp_rbuf *rb, uint32_t body_len)
{
	uint64_t ticket = kvp_r_u64(rb);
	uint32_t n = kvp_r_u32(rb);
	if (n == 0 || (size_t)n * 4 > body_len)
		return -EBADMSG;
	int32_t *toks = malloc((size_t)n * sizeof(int32_t));
	if (!toks)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		toks[i] = (int32_t)kvp_r_u32(rb);
	uint32_t first = kvp_r_u32(rb), bb = kvp_r_u32(rb), nb = kvp_r_u32(rb);
	uint8_t via = kvp_r_u8(rb);
	uint32_t session = kvp_r_u32(rb);
	const uint8_t *kv = NULL;
	size_t len = (size_t)nb * bb;
	if (!rb->err && via == 0)
		kv = kvp_r_bytes(rb, len);
	int rc = kvp_r_end(rb);
	if (!rc && (via > 1 || bb != sch_block_bytes(k->s) || first > n))
		rc = -EINVAL; /* another geometry: the prefill worker falls back to the kv dir */
	if (!rc && via == 0) {
		rc = sch_park(k->s, ticket, toks, (int)n, (int)first, kv, len);
	} else if (!rc) {
		rc = session ? park_nccl_guarded(k, ticket, toks, (int)n, (int)first, session)
			     : -ENOENT;
	}
	free(toks);
	return rc;
}

/* KVW_OP_NCCL_ID: a fresh id to the prefill worker, then this side joins as rank 0 (this
 * connection's thread waits until the prefill worker joined too). */
static void dc_nccl_id(struct wk *k, struct kvp_conn *conn, const struct kvp_hdr *h)
{
	uint8_t id[KVK_NCCL_ID_BYTES];
	int rc = sch_nccl_capable(k->s) ? kvk_nccl_id_create(id) : -EOPNOTSUPP;
	pthread_mutex_lock(&k->mu);
	if (!rc && k->ncomms == WK_MAX_COMMS)
		rc = -ENOSPC;
	uint32_t sess = ++k->next_session;
	pthread_mutex_unlock(&k->mu);
	struct kvp_wbuf b;
	kvp_w_init(&b);
	kvp_w_u32(&b, sess);
	kvp_w_bytes(&b, id, sizeof(id));
	if (!rc)
		rc = b.err;
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

static int wk_handler(void *ctx, struct kvp_conn *c, const struct kvp_hdr *h, uint8_t *body)
{
	struct wk *k = ctx;
	struct kvp_rbuf rb;
	kvp_r_init(&rb, body, h->len);
	if (h->op == KVW_OP_STATUS) {
		free(body);
		struct sch_load l;
		sch_load_get(k->s, &l);
		struct kvp_wbuf b;
		kvp_w_init(&b);
		kvp_w_u32(&b, (uint32_t)l.waiting);
		kvp_w_u32(&b, (uint32_t)l.running);
		kvp_w_u32(&b, (uint32_t)l.queued_tokens);
		kvp_w_u32(&b, (uint32_t)l.kv_free);
		kvp_w_u32(&b, (uint32_t)l.kv_total);
		kvp_w_u32(&b, l.prompt_computed);
		kvp_reply(c, h, b.err, b.p, b.len, NULL, 0);
		kvp_w_free(&b);
		return 0;
	}
	if (k->mode == SCH_DECODE && h->op == KVW_OP_KV_PUT) {
		int rc = dc_put(k, &rb, h->len);
		free(body);
		kvp_reply(c, h, rc, NULL, 0, NULL, 0);
		return rc == -EBADMSG ? -1 : 0;
	}
	if (k->mode == SCH_DECODE && h->op == KVW_OP_HELLO) {
		free(body);
		struct kvp_wbuf b;
		kvp_w_init(&b);
		kvp_w_cstr(&b, sch_cache_id(k->s));
		kvp_reply(c, h, b.err, b.p, b.len, NULL, 0);
		kvp_w_free(&b);
		return 0;
	}
	if (k->mode == SCH_DECODE && h->op == KVW_OP_NCCL_ID) {
		free(body);
		dc_nccl_id(k, c, h);
		return 0;
	}
	int want = k->mode == SCH_PREFILL ? KVW_OP_PREFILL : KVW_OP_DECODE;
	if (h->op != want) {
		free(body);
		kvp_reply(c, h, -EOPNOTSUPP, NULL, 0, NULL, 0);
		return 0;
	}
	char salt[KVW_SALT_MAX];
	struct sch_job j = {.mode = k->mode};
	kvp_r_str(&rb, salt, sizeof(salt));
	j.salt = salt[0] ? salt : NULL;
	kvw_r_params(&rb, &j.sp);
	char *prompt = NULL;
	int32_t *toks = NULL;
	char peer[KVP_ADDR_MAX] = "";
	uint64_t ticket = 0;
	if (k->mode == SCH_PREFILL) {
		j.parse_special = kvp_r_u8(&rb);
		uint32_t len = kvp_r_u32(&rb);
		const uint8_t *p = kvp_r_bytes(&rb, len);
		if (p && (prompt = malloc((size_t)len + 1))) {
			memcpy(prompt, p, len);
			prompt[len] = 0;
			if (strlen(prompt) != len) /* a NUL inside: not text */
				rb.err = -EBADMSG;
		}
		j.prompt = prompt;
		kvp_r_str(&rb, peer, sizeof(peer));
		ticket = kvp_r_u64(&rb);
	} else {
		uint32_t n = kvp_r_u32(&rb);
		if (n == 0 || (size_t)n * 4 > h->len)
			rb.err = -EBADMSG;
		else if ((toks = malloc((size_t)n * sizeof(int32_t))))
			for (uint32_t i = 0; i < n; i++)
				toks[i] = (int32_t)kvp_r_u32(&rb);
		j.toks = toks;
		j.n = (int)n;
		j.first = (int32_t)kvp_r_u32(&rb);
		j.blen = kvp_r_u32(&rb);
		j.blk = kvp_r_bytes(&rb, j.blen);
		j.ticket = kvp_r_u64(&rb);
	}
	int rc = kvp_r_end(&rb);
	if (!rc && peer[0]) { /* a direct hand-over: a valid address and a ticket */
		char host[KVP_ADDR_MAX];
		uint16_t port;
		if (!ticket || kvp_addr_parse(peer, host, sizeof(host), &port) || !port)
			rc = -EINVAL;
	}
	if (!rc && !(prompt || toks))
		rc = -ENOMEM;
	struct wreq *w = rc ? NULL : calloc(1, sizeof(*w));
	if (!rc && !w)
		rc = -ENOMEM;
	if (!rc) {
		static const struct sch_sink pf = {
		    .prefilled = pf_prefilled, .handoff = pf_handoff, .finish = pf_finish};
		static const struct sch_sink dc = {.token = dc_token, .finish = dc_finish};
		w->k = k;
		w->c = c;
		w->h = *h;
		if (peer[0]) {
			memcpy(w->peer, peer, sizeof(w->peer));
			w->ticket = ticket;
			peer_get(k, peer, &w->pi);
			j.handoff = w->pi.c ? SCH_HANDOFF_DEVICE : SCH_HANDOFF_BYTES;
			j.handoff_skip_cached = w->pi.shared;
		}
		kvp_conn_ref(c);
		rc = sch_submit(k->s, &j, k->mode == SCH_PREFILL ? &pf : &dc, w, &w->r);
		if (rc) {
			kvp_conn_unref(c);
			free(w);
		}
	}
	if (rc)
		kvp_reply(c, h, rc, NULL, 0, NULL, 0);
	free(prompt);
	free(toks);
	free(body);
	return rc == -EBADMSG ? -1 : 0;
}

static int run_worker(int argc, char **argv, enum sch_mode mode, const char *name)
{
	static const char *const shorts[] = {"-m", "--model", "-t", "--threads", NULL};
	kvinfer_short_flags(argc, argv, shorts);
	struct wk_cfg c;
	int npos = 0;
	int rc =
	    cfg_parse(wk_opts, &c, argc, argv,
		      "-m MODEL.gguf --kv-dir DIR --secret-file F [--listen HOST:PORT]", &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	int isa = kvinfer_parse_isa(c.isa);
	if (kvinfer_eng_check(c.device, name))
		return 1;
	char host[64];
	uint16_t port;
	struct kvp_secret sec;
	if (!c.model[0] || npos || isa < 0 || !c.secret_file[0] ||
	    kvp_addr_parse(c.listen, host, sizeof(host), &port) ||
	    kvp_secret_load(c.secret_file, &sec)) {
		fprintf(stderr,
			"kvinfer %s: need -m MODEL, --secret-file F, a valid --listen "
			"HOST:PORT; see --help\n",
			name);
		return 2;
	}
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
	struct sch_opts so;
	sch_opts_default(&so);
	so.model = c.model;
	so.kv_dir = c.kv_dir;
	so.threads = c.threads > 0 ? (int)c.threads : kvinfer_default_threads();
	so.max_seqs = (int)c.max_seqs;
	so.max_ctx = (int)c.ctx;
	so.prefill_chunk = (int)c.chunk;
	so.block_tokens = (int)c.block_tokens;
	so.isa = isa;
	so.device = kvinfer_eng_parse(c.device, &so.gpu);
	so.ignore_eos = c.ignore_eos;
	struct wk k;
	memset(&k, 0, sizeof(k));
	k.mode = mode;
	k.nccl = c.nccl;
	pthread_mutex_init(&k.mu, NULL);
	pthread_cond_init(&k.cv, NULL);
	if ((rc = sch_create(&so, &k.s))) {
		fprintf(stderr, "kvinfer %s: %s\n", name, strerror(-rc));
		return 1;
	}
	if (mode == SCH_PREFILL && (rc = kvp_pool_create(&sec, CONNECT_TIMEOUT_MS, &k.pool))) {
		fprintf(stderr, "kvinfer %s: %s\n", name, strerror(-rc));
		sch_destroy(k.s);
		return 1;
	}
	if (c.nccl && !sch_nccl_capable(k.s))
		klog_warn("--nccl: this engine cannot (needs --device cuda and NCCL): bytes");
	/* a decode worker takes a whole prompt's KV in one KVW_OP_KV_PUT frame */
	size_t kvmax = mode == SCH_DECODE ? sch_handoff_max_bytes(k.s) + 4096 : 0;
	struct kvp_server_opts ko = {
	    .name = name,
	    .host = host,
	    .port = port,
	    .secret = &sec,
	    .max_body = kvmax > KVP_MAX_BODY && kvmax < UINT32_MAX ? (uint32_t)kvmax : 0,
	    .handler = wk_handler,
	    .ctx = &k};
	struct kvp_server *srv = NULL;
	if ((rc = kvp_server_start(&ko, &srv))) {
		fprintf(stderr, "kvinfer %s: listen %s: %s\n", name, c.listen, kvp_strerror(rc));
		kvp_pool_destroy(k.pool);
		sch_destroy(k.s);
		return 1;
	}
	klog_info("%s worker on %s:%u, model %s, kv dir %s", name, host, kvp_server_port(srv),
		  c.model, c.kv_dir[0] ? c.kv_dir : "(none)");
	if (c.port_file[0]) {
		FILE *f = fopen(c.port_file, "w");
		if (f) {
			fprintf(f, "%u\n", kvp_server_port(srv));
			fclose(f);
		}
	}
	int sig = 0;
	sigwait(&sigs, &sig);
	sch_stop(k.s); /* replies go out while the connections still exist */
	kvp_server_stop(srv);
	pthread_mutex_lock(&k.mu);
	while (k.puts > 0) /* hand-overs in flight end within PUT_TIMEOUT_MS */
		pthread_cond_wait(&k.cv, &k.mu);
	pthread_mutex_unlock(&k.mu);
	for (int i = 0; i < k.ncomms; i++)
		sch_nccl_leave(k.s, k.comms[i].c);
	for (int i = 0; i < k.npeers; i++)
		sch_nccl_leave(k.s, k.peers[i].c);
	for (int i = 0; i < k.ndead; i++)
		sch_nccl_leave(k.s, k.dead[i]);
	kvp_pool_destroy(k.pool);
	sch_destroy(k.s);
	return 0;
}

int kvinfer_cmd_prefill(int argc, char **argv)
{
	return run_worker(argc, argv, SCH_PREFILL, "prefill");
}

int kvinfer_cmd_decode(int argc, char **argv)
{
	return run_worker(argc, argv, SCH_DECODE, "decode");
}
