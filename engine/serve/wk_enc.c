/* `kvinfer encode`: a vision encoder worker of the disaggregated server (issue 26). It holds
 * one vision tower (--mmproj) behind a kvp_server speaking kvw.h's KVW_OP_ENCODE: the gateway
 * sends it decoded pixels, it finds their embeddings in the shared kv dir or encodes them and
 * saves them there (emb.h, the code the embedded server uses), and answers what the prefill
 * worker needs to load them. The embeddings themselves travel as the kv dir's file. Requests
 * run on kvp_server's connection threads; encodes are serialised on the tower. */
#define KVFS_LOG_TAG "encode"
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cfg.h"
#include "emb.h"
#include "img.h"
#include "kvinfer_cli.h"
#include "kvp_frame.h"
#include "kvw.h"
#include "kvx.h"
#include "log.h"
#include "metrics.h"
#include "vit.h"

int kvinfer_cmd_encode(int argc, char **argv);

/* ENCODE requests in hand at most (each a thread and its image, up to 48 MiB); more are
 * refused with -EAGAIN, which the gateway reports as overload. */
#define ENC_MAX_INFLIGHT 64

struct enc_cfg {
	char mmproj[CFG_STR_MAX];
	char kv_dir[CFG_STR_MAX];
	char listen[CFG_STR_MAX];
	char port_file[CFG_STR_MAX];
	char secret_file[CFG_STR_MAX];
	int64_t threads;
	char device[CFG_STR_MAX];
	char metrics_listen[CFG_STR_MAX], metrics_addr_file[CFG_STR_MAX];
};

#define EOFF(f) offsetof(struct enc_cfg, f)
static const struct cfg_opt enc_opts[] = {
    {"mmproj", CFG_STR, EOFF(mmproj), 0, 0, NULL, "vision tower: llama.cpp mmproj GGUF file"},
    {"kv-dir", CFG_STR, EOFF(kv_dir), 0, 0, NULL,
     "shared cache directory (a kvfs mount): embeddings are saved here for prefill workers"},
    KVINFER_OPTS_KVW(EOFF),
    {"threads", CFG_INT, EOFF(threads), 0, 256, "0", "tower threads, 0 = all cores (-t)"},
    {"device", CFG_STR, EOFF(device), 0, 0, "cpu",
     "where the tower runs: cpu (default), cuda or cuda:N (GPU N), host (the device path on "
     "the CPU references: slow, for checks)"},
    KVINFER_OPTS_METRICS(EOFF),
    CFG_END,
};

struct enc {
	struct vit *v;
	pthread_mutex_t mu; /* the tower: one vit_encode at a time */
	uint8_t fp[KVB_HASH];
	const char *dir;
	int on_kvfs;
	_Atomic int waiting, inflight; /* for STATUS and the gauges */
	struct met_reg *reg;
	struct met_counter *c_req, *c_err, *c_hits, *c_encodes;
	struct met_hist *h_enc;
};

/* STATUS for the gateway's balancer: waiting = requests queued for the tower, running = ENCODE
 * requests in hand, queued_tokens = their image tokens (the encoder pick's load). */
static void enc_status(struct enc *e, struct kvp_conn *c, const struct kvp_hdr *h)
{
	int inflight = atomic_load(&e->inflight);
	struct kvw_status st = {.waiting = (uint32_t)atomic_load(&e->waiting),
				.running = (uint32_t)inflight,
				.queued_tokens = (uint32_t)inflight * (uint32_t)vit_n_tokens(e->v)};
	struct kvp_wbuf b;
	kvp_w_init(&b);
	int rc = kvw_status_enc(&b, &st);
	kvp_reply(c, h, rc, rc ? NULL : b.p, rc ? 0 : b.len, NULL, 0);
	kvp_w_free(&b);
}

/* One ENCODE: the body checked (kvw_encode_dec), the hash checked against the pixels (a
 * wrong one would file these embeddings under another image's name for every prefill worker
 * sharing the dir), then the embeddings looked up or made. The reply's status. */
static int enc_one(struct enc *e, const uint8_t *body, size_t len, struct kvw_encoded *out)
{
	struct kvw_encode q;
	int rc = kvw_encode_dec(body, len, &q);
	if (rc)
		return rc;
	struct img_image im = {.w = q.w, .h = q.h, .rgb = (uint8_t *)q.pix};
	img_hash(q.pix, q.w, q.h, im.hash);
	if (memcmp(im.hash, q.hash, KVW_IMG_HASH)) {
		klog_warn("ENCODE: the image hash is not its pixels'");
		return -EINVAL;
	}
	int nt = vit_n_tokens(e->v), E = vit_n_embd_out(e->v);
	float *rows = malloc((size_t)nt * (size_t)E * sizeof(float));
	if (!rows)
		return -ENOMEM;
	struct emb_stat st = {.waiting = &e->waiting};
	rc = emb_image(e->v, &e->mu, e->fp, e->dir, e->on_kvfs, q.salt, &im, rows, &st);
	free(rows);
	if (rc)
		return rc;
	if (st.cached) {
		met_counter_add(e->c_hits, 1);
	} else {
		met_counter_add(e->c_encodes, 1);
		met_hist_observe_ns(e->h_enc, st.enc_ns);
	}
	*out = (struct kvw_encoded){
	    .n_tokens = (uint32_t)nt, .dim = (uint32_t)E, .cached = (uint8_t)st.cached};
	memcpy(out->tower_fp, e->fp, KVB_HASH);
	return 0;
}

/* One ENCODE, answered on a thread of its own: a lookup need not wait behind an encode, and the
 * connection thread stays free for the balancer's STATUS polls (which share the gateway's
 * pooled connection with its ENCODEs: answered behind a queue of encodes, they would time out
 * and get the replica marked down). */
struct enc_job {
	struct enc *e;
	struct kvp_conn *c; /* a reference */
	struct kvp_hdr h;
	uint8_t *body;
};

static void *enc_job_main(void *arg)
{
	struct enc_job *j = arg;
	struct enc *e = j->e;
	struct kvw_encoded r;
	int rc = enc_one(e, j->body, j->h.len, &r);
	free(j->body);
	struct kvp_wbuf b;
	kvp_w_init(&b);
	if (!rc)
		rc = kvw_encoded_enc(&b, &r);
	if (rc)
		met_counter_add(e->c_err, 1);
	kvp_reply(j->c, &j->h, rc, rc ? NULL : b.p, rc ? 0 : b.len, NULL, 0);
	kvp_w_free(&b);
	kvp_conn_unref(j->c);
	free(j);
	atomic_fetch_sub(&e->inflight, 1); /* last: kvinfer_cmd_encode waits for 0 to free e */
	return NULL;
}

static int enc_handler(void *ctx, struct kvp_conn *c, const struct kvp_hdr *h, uint8_t *body)
{
	struct enc *e = ctx;
	if (h->op == KVW_OP_STATUS) {
		int rc = kvw_empty_dec(body, h->len);
		free(body);
		if (!rc)
			enc_status(e, c, h);
		return rc ? -1 : 0;
	}
	if (h->op != KVW_OP_ENCODE) {
		free(body);
		kvp_reply(c, h, -EOPNOTSUPP, NULL, 0, NULL, 0);
		return 0;
	}
	met_counter_add(e->c_req, 1);
	struct kvw_encode q;
	if (kvw_encode_dec(body, h->len, &q) == -EBADMSG) { /* a peer that does not speak kvw */
		free(body);
		met_counter_add(e->c_err, 1);
		kvp_reply(c, h, -EBADMSG, NULL, 0, NULL, 0);
		return -1;
	}
	if (atomic_fetch_add(&e->inflight, 1) >= ENC_MAX_INFLIGHT) {
		atomic_fetch_sub(&e->inflight, 1);
		free(body);
		met_counter_add(e->c_err, 1);
		kvp_reply(c, h, -EAGAIN, NULL, 0, NULL, 0);
		return 0;
	}
	struct enc_job *j = malloc(sizeof(*j));
	pthread_t t;
	pthread_attr_t at;
	int ok = j && !pthread_attr_init(&at);
	if (ok) {
		*j = (struct enc_job){.e = e, .c = c, .h = *h, .body = body};
		kvp_conn_ref(c);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		ok = !pthread_create(&t, &at, enc_job_main, j);
		pthread_attr_destroy(&at);
		if (!ok)
			kvp_conn_unref(c);
	}
	if (!ok) {
		free(j);
		free(body);
		atomic_fetch_sub(&e->inflight, 1);
		met_counter_add(e->c_err, 1);
		kvp_reply(c, h, -EAGAIN, NULL, 0, NULL, 0);
	}
	return 0;
}

static double g_waiting(void *ctx)
{
	return (double)atomic_load(&((struct enc *)ctx)->waiting);
}

static double g_inflight(void *ctx)
{
	return (double)atomic_load(&((struct enc *)ctx)->inflight);
}

/* The encoder's metrics, registered whether or not they are served (the counters are its
 * bookkeeping). 0 or -ENOMEM. */
static int enc_metrics(struct enc *e)
{
	int rc = met_reg_create(&e->reg);
	if (rc)
		return rc;
	e->c_req = met_counter_new(e->reg, "encoder_requests_total",
				   "ENCODE requests received (one image each)", NULL);
	e->c_err = met_counter_new(e->reg, "encoder_request_errors_total",
				   "ENCODE requests answered with an error", NULL);
	e->c_hits = met_counter_new(
	    e->reg, "encoder_cache_hits_total",
	    "Images whose embeddings were already in the kv dir (no encoding)", NULL);
	e->c_encodes = met_counter_new(e->reg, "encoder_encodes_total",
				       "Images the vision tower encoded", NULL);
	e->h_enc =
	    met_hist_new(e->reg, "encoder_encode_seconds",
			 "Time to encode one image, waiting for the tower included", NULL, NULL, 0);
	if (!e->c_req || !e->c_err || !e->c_hits || !e->c_encodes || !e->h_enc ||
	    !met_gauge_fn_new(e->reg, "encoder_queue_depth",
			      "ENCODE requests waiting for the vision tower", NULL, g_waiting, e) ||
	    !met_gauge_fn_new(e->reg, "encoder_requests_in_flight",
			      "ENCODE requests being handled (waiting, encoding or loading)", NULL,
			      g_inflight, e))
		return -ENOMEM;
	return 0;
}

int kvinfer_cmd_encode(int argc, char **argv)
{
	static const char *const shorts[] = {"-t", "--threads", NULL};
	kvinfer_short_flags(argc, argv, shorts);
	struct enc_cfg c;
	int npos = 0;
	int rc = cfg_parse(enc_opts, &c, argc, argv,
			   "--mmproj MMPROJ.gguf --kv-dir DIR --secret-file F [--listen HOST:PORT]",
			   &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	char host[64];
	uint16_t port;
	struct kvp_secret sec;
	if (!c.mmproj[0] || !c.kv_dir[0] || npos || !c.secret_file[0] ||
	    kvp_addr_parse(c.listen, host, sizeof(host), &port) ||
	    kvp_secret_load(c.secret_file, &sec)) {
		fprintf(stderr,
			"kvinfer encode: need --mmproj F, --kv-dir DIR (shared with the "
			"prefill workers), --secret-file F, a valid --listen HOST:PORT; see "
			"--help\n");
		return 2;
	}
	if (kvinfer_eng_check(c.device, "kvinfer encode"))
		return 1;
	sigset_t sigs;
	kvinfer_block_signals(&sigs, 0);
	static struct enc e; /* outlives the server's threads */
	pthread_mutex_init(&e.mu, NULL);
	char err[256] = "";
	int threads = c.threads > 0 ? (int)c.threads : kvinfer_default_threads();
	if ((rc = vit_load(c.mmproj, threads, &e.v, err, sizeof(err)))) {
		fprintf(stderr, "kvinfer encode: --mmproj %s: %s\n", c.mmproj,
			err[0] ? err : strerror(-rc));
		return 1;
	}
	int gpu = 0, dev = kvinfer_eng_parse(c.device, &gpu);
	if (dev > 0 && (rc = vit_use_device(e.v, dev, gpu))) {
		fprintf(stderr, "kvinfer encode: the tower on --device %s: %s\n", c.device,
			strerror(-rc));
		vit_free(e.v);
		return 1;
	}
	e.dir = c.kv_dir;
	e.on_kvfs = kvx_dir_on_kvfs(c.kv_dir) == 1;
	struct met_http *mh = NULL;
	if ((rc = emb_tower_fp(e.v, e.fp)) || (rc = enc_metrics(&e)) ||
	    (rc = met_http_serve(e.reg, c.metrics_listen, c.metrics_addr_file, &mh))) {
		fprintf(stderr, "kvinfer encode: %s\n", strerror(-rc));
		met_reg_destroy(e.reg);
		vit_free(e.v);
		return 1;
	}
	/* an ENCODE carries a whole decoded image */
	uint64_t maxb = KVW_ENC_MAX_PIXELS * 3 + KVW_ENC_HDR_ROOM;
	struct kvp_server_opts ko = {.name = "encode",
				     .host = host,
				     .port = port,
				     .secret = &sec,
				     .max_body = (uint32_t)maxb,
				     .handler = enc_handler,
				     .ctx = &e};
	struct kvp_server *srv = NULL;
	if ((rc = kvp_server_start(&ko, &srv))) {
		fprintf(stderr, "kvinfer encode: listen %s: %s\n", c.listen, kvp_strerror(rc));
		met_http_stop(mh);
		met_reg_destroy(e.reg);
		vit_free(e.v);
		return 1;
	}
	klog_info("encode worker on %s:%u, tower %s (%d tokens x %d per image) on %s, kv dir %s",
		  host, kvp_server_port(srv), c.mmproj, vit_n_tokens(e.v), vit_n_embd_out(e.v),
		  vit_backend(e.v), c.kv_dir);
	kvinfer_port_file(c.port_file, kvp_server_port(srv));
	int sig = 0;
	sigwait(&sigs, &sig);
	kvp_server_stop(srv);
	while (atomic_load(&e.inflight) > 0) /* replies of the encodes running end them */
		nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
	met_http_stop(mh);
	met_reg_destroy(e.reg);
	vit_free(e.v);
	return 0;
}
