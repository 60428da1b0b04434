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
#include <sys/random.h>
#include <time.h>

#include "cfg.h"
#include "kvinfer_cli.h"
#include "kvk_nccl.h"
#include "kvp_frame.h"
#include "ktime.h"
#include "kvw.h"
#include "log.h"
#include "sch.h"

#include "wk_int.h"
int kvinfer_cmd_prefill(int argc, char **argv);
int kvinfer_cmd_decode(int argc, char **argv);

struct wk_cfg {
	char model[CFG_STR_MAX];
	char kv_dir[CFG_STR_MAX];
	char listen[CFG_STR_MAX];
	char port_file[CFG_STR_MAX];
	char secret_file[CFG_STR_MAX];
	int64_t threads, max_seqs, ctx, chunk, block_tokens, fork_delay_ms;
	char isa[CFG_STR_MAX];
	char device[CFG_STR_MAX];
	int ignore_eos;
	int nccl;
	char metrics_listen[CFG_STR_MAX], metrics_addr_file[CFG_STR_MAX];
};

#define WOFF(f) offsetof(struct wk_cfg, f)
static const struct cfg_opt wk_opts[] = {
    {"model", CFG_STR, WOFF(model), 0, 0, NULL, "GGUF model file (-m)"},
    {"kv-dir", CFG_STR, WOFF(kv_dir), 0, 0, NULL,
     "shared prefix-cache directory (a kvfs mount); prefill and decode must share it"},
    KVINFER_OPTS_KVW(WOFF),
    {"threads", CFG_INT, WOFF(threads), 0, 256, "0", "engine threads, 0 = all cores (-t)"},
    {"max-seqs", CFG_INT, WOFF(max_seqs), 1, 1024, "16", "running sequences at most"},
    {"ctx", CFG_INT, WOFF(ctx), 0, 1 << 20, "0", "per-sequence context, 0 = min(train, 2048)"},
    {"prefill-chunk", CFG_INT, WOFF(chunk), 1, 1 << 16, "256", "prompt tokens per step"},
    {"block-tokens", CFG_INT, WOFF(block_tokens), 1, 4096, "64", "KV block size B"},
    {"isa", CFG_STR, WOFF(isa), 0, 0, "auto", "matmul kernels: auto, avx2, scalar"},
    {"device", CFG_STR, WOFF(device), 0, 0, "cpu", KVINFER_DEVICE_HELP},
    {"ignore-eos", CFG_BOOL, WOFF(ignore_eos), 0, 0, "false", "generate past end tokens"},
    {"fork-delay-ms", CFG_INT, WOFF(fork_delay_ms), 0, 1000, "0",
     "tests: submit each further choice (n > 1) this much later"},
    {"nccl", CFG_BOOL, WOFF(nccl), 0, 0, "false",
     "prefill, --device cuda: direct hand-overs to decode workers on other GPUs with NCCL"},
    KVINFER_OPTS_METRICS(WOFF),
    CFG_END,
};

/* Decode side: w on k->live, so that a KVW_OP_CANCEL finds it (before its sch_submit: the
 * scheduler may finish it at once). */
static void wr_list(struct wreq *w)
{
	pthread_mutex_lock(&w->k->mu);
	w->lnext = w->k->live;
	w->k->live = w;
	w->listed = 1;
	pthread_mutex_unlock(&w->k->mu);
}

static void wr_unlist(struct wreq *w)
{
	if (!w->listed)
		return;
	pthread_mutex_lock(&w->k->mu);
	for (struct wreq **pp = &w->k->live; *pp; pp = &(*pp)->lnext)
		if (*pp == w) {
			*pp = w->lnext;
			break;
		}
	w->listed = 0;
	pthread_mutex_unlock(&w->k->mu);
}

/* KVW_OP_CANCEL: cancels choice of the DECODE h->id on c (the connection thread that
 * submitted it: its w->r is set). Nothing when it is not running. */
static void wk_cancel_choice(struct wk *k, struct kvp_conn *c, uint64_t id, uint8_t choice)
{
	pthread_mutex_lock(&k->mu);
	for (struct wreq *w = k->live; w; w = w->lnext)
		if (w->c == c && w->h.id == id && w->choice == choice && w->r)
			sch_cancel(w->r);
	pthread_mutex_unlock(&k->mu);
}

static void wr_done(struct wreq *w)
{
	wr_unlist(w);
	kvp_conn_unref(w->c);
	sch_req_free(w->r);
	free(w->f.lps);
	free(w);
}

static void pf_prefilled(void *u, const int32_t *toks, int n, int cached, int32_t first,
			 const void *blk, size_t blen)
{
	struct wreq *w = u;
	w->f.nimg = sch_req_images(w->r, w->f.img_pos, KVW_MAX_IMAGES);
	if (!wk_pf_reply(w->c, &w->h, toks, n, cached, first, &w->f, 0, blk, blen))
		w->replied = 1;
}

/* PREFILL: the first tokens' logprobs, in choice order. */
static void pf_logprob(void *u, const struct gw_logprob *lp)
{
	struct wreq *w = u;
	if (w->f.lps && w->f.nlp < KVW_MAX_CHOICES)
		kvw_lp_from(&w->f.lps[w->f.nlp++], lp);
}

static void pf_choice(void *u, int32_t first)
{
	struct wreq *w = u;
	if (w->f.nx < KVW_MAX_CHOICES - 1)
		w->f.xfirst[w->f.nx++] = first;
}

/* DECODE / GENERATE: the next token's logprob, sent with its TOKEN frame. */
static void dc_logprob(void *u, const struct gw_logprob *lp)
{
	struct wreq *w = u;
	if (w->f.lps)
		kvw_lp_from(&w->f.lps[0], lp);
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

/* GENERATE: the prompt's size, the first event of the stream. */
static void dc_prompt(void *u, int prompt_tokens, int cached)
{
	struct wreq *w = u;
	struct kvp_wbuf b;
	kvp_w_init(&b);
	if (kvw_ev_prompt_enc(&b, (uint32_t)prompt_tokens, (uint32_t)cached) ||
	    kvp_reply(w->c, &w->h, 0, b.p, b.len, NULL, 0))
		sch_cancel(w->r);
	kvp_w_free(&b);
}

static void dc_token(void *u, int32_t id, const char *piece, size_t len)
{
	struct wreq *w = u;
	struct kvp_wbuf b;
	kvp_w_init(&b);
	/* the gateway is gone: stop generating and free the KV */
	struct kvw_lp *lp = w->f.lps && w->f.lps[0].present ? &w->f.lps[0] : NULL;
	if (kvw_ev_token_enc(&b, w->choice, id, lp, (uint32_t)len) ||
	    kvp_reply(w->c, &w->h, 0, b.p, b.len, piece, len))
		sch_cancel(w->r);
	if (lp)
		lp->present = 0;
	kvp_w_free(&b);
}

static void dc_finish(void *u, const char *reason, int err, const char *msg)
{
	struct wreq *w = u;
	struct kvp_wbuf b;
	kvp_w_init(&b);
	if (!kvw_ev_finish_enc(&b, w->choice, err, reason, msg))
		kvp_reply(w->c, &w->h, 0, b.p, b.len, NULL, 0);
	kvp_w_free(&b);
	wr_done(w);
}

/* The images of a PREFILL or DECODE as the scheduler takes them. */
static void img_refs(const struct kvw_image *im, uint32_t n, struct sch_image_ref *out)
{
	for (uint32_t i = 0; i < n; i++) {
		out[i] = (struct sch_image_ref){.off = im[i].off, .n_tokens = im[i].n_tokens};
		memcpy(out[i].hash, im[i].hash, sizeof(out[i].hash));
		memcpy(out[i].tower_fp, im[i].tower_fp, sizeof(out[i].tower_fp));
	}
}

/* Decodes a PREFILL, GENERATE or DECODE body into j (pointing into q / d, and refs: room for
 * KVW_MAX_IMAGES). */
static int job_dec(struct wk *k, const struct kvp_hdr *h, const uint8_t *body, int gen,
		   struct sch_job *j, struct kvw_prompt *q, struct kvw_decode *d,
		   struct sch_image_ref *refs)
{
	if (k->mode == SCH_PREFILL || gen) {
		int rc = gen ? kvw_generate_dec(body, h->len, q) : kvw_prefill_dec(body, h->len, q);
		j->salt = q->salt;
		j->sp = q->sp;
		j->logprobs = q->logprobs;
		j->parse_special = q->parse_special;
		j->prompt = q->text;
		j->toks = q->nt ? q->toks : NULL;
		j->n = (int)q->nt;
		j->nx = (int)q->nx;
		j->xseeds = q->seeds;
		img_refs(q->images, q->nimg, refs);
		j->image_refs = refs;
		j->n_image_refs = (int)q->nimg;
		return rc;
	}
	int rc = kvw_decode_dec(body, h->len, d);
	j->salt = d->salt;
	j->sp = d->sp;
	j->logprobs = d->logprobs;
	j->toks = d->toks;
	j->n = (int)d->n;
	j->first = d->first;
	j->blen = d->blen;
	j->blk = d->blk;
	j->ticket = d->ticket;
	img_refs(d->images, d->nimg, refs);
	j->image_refs = refs;
	j->n_image_refs = (int)d->nimg;
	return rc;
}

/* Answers STATUS or HELLO (bodies checked by the caller: rc). */
static void wk_small_reply(struct wk *k, struct kvp_conn *c, const struct kvp_hdr *h, int rc)
{
	struct kvp_wbuf b;
	kvp_w_init(&b);
	if (!rc && h->op == KVW_OP_STATUS) {
		struct sch_load l;
		sch_load_get(k->s, &l);
		struct kvw_status st = {.waiting = (uint32_t)l.waiting,
					.running = (uint32_t)l.running,
					.queued_tokens = (uint32_t)l.queued_tokens,
					.kv_free = (uint32_t)l.kv_free,
					.kv_total = (uint32_t)l.kv_total,
					.prompt_computed = l.prompt_computed};
		rc = kvw_status_enc(&b, &st);
	} else if (!rc) {
		rc = kvw_hello_enc(&b, sch_cache_id(k->s));
	}
	kvp_reply(c, h, rc, rc ? NULL : b.p, rc ? 0 : b.len, NULL, 0);
	kvp_w_free(&b);
}

/* Control ops: STATUS, and on a decode worker HELLO, NCCL_ID and KV_PUT. 1 when h is none of
 * them (body untouched); else body is freed and the handler's result returned. */
static int wk_control(struct wk *k, struct kvp_conn *c, const struct kvp_hdr *h, uint8_t *body)
{
	if (h->op == KVW_OP_STATUS ||
	    (k->mode == SCH_DECODE && (h->op == KVW_OP_HELLO || h->op == KVW_OP_NCCL_ID))) {
		int rc = kvw_empty_dec(body, h->len);
		free(body);
		if (!rc && h->op == KVW_OP_NCCL_ID)
			wk_dc_nccl_id(k, c, h);
		else
			wk_small_reply(k, c, h, rc);
		return rc ? -1 : 0;
	}
	if (k->mode == SCH_DECODE && h->op == KVW_OP_CANCEL) {
		uint8_t choice = 0;
		int rc = kvw_cancel_dec(body, h->len, &choice);
		free(body);
		if (!rc)
			wk_cancel_choice(k, c, h->id, choice);
		return rc ? -1 : 0;
	}
	if (k->mode == SCH_DECODE && h->op == KVW_OP_KV_PUT) {
		int rc = wk_dc_put(k, body, h->len);
		free(body);
		kvp_reply(c, h, rc, NULL, 0, NULL, 0);
		return rc == -EBADMSG ? -1 : 0;
	}
	return 1;
}

/* A request's state for the scheduler's callbacks, holding a reference on c; NULL: -ENOMEM. A
 * PREFILL naming a decode worker (q->peer) also learns what is known of that peer, which may
 * block up to CONNECT_TIMEOUT_MS on first contact (wk_peer_get). */
static struct wreq *wreq_new(struct wk *k, struct kvp_conn *c, const struct kvp_hdr *h, int gen,
			     const struct kvw_prompt *q, struct sch_job *j)
{
	struct wreq *w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	w->k = k;
	w->c = c;
	w->h = *h;
	if (j->logprobs && !(w->f.lps = calloc(KVW_MAX_CHOICES, sizeof(*w->f.lps)))) {
		free(w);
		return NULL;
	}
	if (!gen && k->mode == SCH_PREFILL && q->peer[0]) {
		memcpy(w->peer, q->peer_buf, sizeof(w->peer));
		w->ticket = q->ticket;
		wk_peer_get(k, w->peer, &w->pi);
		j->handoff = w->pi.c ? SCH_HANDOFF_DEVICE : SCH_HANDOFF_BYTES;
		j->handoff_skip_cached = w->pi.shared;
	}
	kvp_conn_ref(c);
	return w;
}

/* Frees a wreq no scheduler request took (NULL: nothing). */
static void wreq_drop(struct wreq *w)
{
	if (!w)
		return;
	wr_unlist(w);
	kvp_conn_unref(w->c);
	free(w->f.lps);
	free(w);
}

/* DECODE with further choices, its first (parent, j) submitted: submits each as a fork of it,
 * its own seed and first token, answering as choice 1 + i. One that cannot be submitted
 * gets its FINISH with the error here (the others go on). */
static void dc_forks(struct wk *k, const struct sch_job *j, const struct kvw_decode *d,
		     struct wreq *parent, struct wreq **xw)
{
	static const struct sch_sink dc = {
	    .token = dc_token, .logprob = dc_logprob, .finish = dc_finish};
	for (uint32_t i = 0; i < d->nx; i++) {
		struct sch_job x = *j;
		x.forks = 0;
		x.fork_of = parent->r;
		x.first = d->xfirst[i];
		x.sp.seed = d->xseeds[i];
		x.ticket = 0;
		xw[i]->choice = (uint8_t)(1 + i);
		wr_list(xw[i]);
		int rc = sch_submit(k->s, &x, &dc, xw[i], &xw[i]->r);
		if (rc)
			dc_finish(xw[i], NULL, rc, "cannot fork the prompt's KV");
	}
}

/* PREFILL (prefill worker), DECODE or GENERATE (decode worker; gen): decodes the body and hands
 * the job to the scheduler, whose sink answers it. Frees body; -1 on a malformed body. */
static int wk_job_start(struct wk *k, struct kvp_conn *c, const struct kvp_hdr *h, uint8_t *body,
			int gen)
{
	static const struct sch_sink pf = {.logprob = pf_logprob,
					   .choice = pf_choice,
					   .prefilled = pf_prefilled,
					   .handoff = wk_pf_handoff,
					   .finish = pf_finish};
	static const struct sch_sink dc = {
	    .token = dc_token, .logprob = dc_logprob, .finish = dc_finish};
	static const struct sch_sink dg = {
	    .prompt = dc_prompt, .token = dc_token, .logprob = dc_logprob, .finish = dc_finish};
	struct sch_job j = {.mode = gen ? SCH_FULL : k->mode};
	struct wreq *xw[KVW_MAX_CHOICES - 1] = {0};
	struct sch_image_ref *refs = malloc(KVW_MAX_IMAGES * sizeof(*refs));
	struct kvw_prompt *qp = calloc(1, sizeof(*qp)); /* images make it large for a stack */
	struct kvw_decode *dp = calloc(1, sizeof(*dp));
	int rc = refs && qp && dp ? job_dec(k, h, body, gen, &j, qp, dp, refs) : -ENOMEM;
	struct wreq *w = rc ? NULL : wreq_new(k, c, h, gen, qp, &j);
	if (!rc && !w)
		rc = -ENOMEM;
	for (uint32_t i = 0; !rc && !gen && i < dp->nx; i++) /* every one before the first runs */
		if (!(xw[i] = wreq_new(k, c, h, gen, qp, &j)))
			rc = -ENOMEM;
	if (!rc) {
		j.forks = gen ? 0 : (int)dp->nx;
		if (k->mode == SCH_DECODE)
			wr_list(w);
		rc = sch_submit(k->s, &j, gen ? &dg : k->mode == SCH_PREFILL ? &pf : &dc, w, &w->r);
		if (rc) {
			wreq_drop(w);
			w = NULL;
		}
	}
	if (!rc)
		dc_forks(k, &j, dp, w, xw);
	else
		for (uint32_t i = 0; dp && i < dp->nx; i++)
			wreq_drop(xw[i]);
	if (rc)
		kvp_reply(c, h, rc, NULL, 0, NULL, 0);
	if (qp)
		kvw_prompt_free(qp);
	if (dp)
		kvw_decode_free(dp);
	free(qp);
	free(dp);
	free(refs);
	free(body);
	return rc == -EBADMSG ? -1 : 0;
}

/* kvp_server's handler (one of its connection threads): dispatches one request frame. */
static int wk_handler(void *ctx, struct kvp_conn *c, const struct kvp_hdr *h, uint8_t *body)
{
	struct wk *k = ctx;
	int rc = wk_control(k, c, h, body);
	if (rc <= 0)
		return rc;
	int want = k->mode == SCH_PREFILL ? KVW_OP_PREFILL : KVW_OP_DECODE;
	int gen = k->mode == SCH_DECODE && h->op == KVW_OP_GENERATE; /* computed here: SCH_FULL */
	if (h->op != want && !gen) {
		free(body);
		kvp_reply(c, h, -EOPNOTSUPP, NULL, 0, NULL, 0);
		return 0;
	}
	return wk_job_start(k, c, h, body, gen);
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
	kvinfer_block_signals(&sigs, 0);
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
	so.fork_delay_ms = (int)c.fork_delay_ms;
	struct wk k;
	memset(&k, 0, sizeof(k));
	k.mode = mode;
	k.nccl = c.nccl;
	/* NCCL session ids must not repeat across restarts: a prefill worker still holding a
	 * session of this worker's previous run must not name another prefill worker's. */
	if (getrandom(&k.next_session, sizeof(k.next_session), 0) != sizeof(k.next_session))
		k.next_session = (uint32_t)time(NULL) ^ ((uint32_t)getpid() << 16);
	pthread_mutex_init(&k.mu, NULL);
	pthread_cond_init(&k.cv, NULL);
	if ((rc = sch_create(&so, &k.s))) {
		fprintf(stderr, "kvinfer %s: %s\n", name, strerror(-rc));
		return 1;
	}
	if ((rc = sch_metrics_serve(k.s, c.metrics_listen, c.metrics_addr_file))) {
		fprintf(stderr, "kvinfer %s: --metrics-listen %s: %s\n", name, c.metrics_listen,
			strerror(-rc));
		sch_destroy(k.s);
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
	size_t kvmax = mode == SCH_DECODE ? sch_handoff_max_bytes(k.s) + WK_KV_PUT_HDR_ROOM : 0;
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
	kvinfer_port_file(c.port_file, kvp_server_port(srv));
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
