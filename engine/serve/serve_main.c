/* `kvinfer serve`: the embedded server — HTTP gateway + one continuous-batching scheduler
 * (prefill and decode on one engine) in one process. */
#define KVFS_LOG_TAG "serve"
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cfg.h"
#include "gw.h"
#include "gw_auth.h"
#include "kvinfer_cli.h"
#include "log.h"
#include "sch.h"

int kvinfer_cmd_serve(int argc, char **argv);

struct serve_cfg {
	char model[CFG_STR_MAX];
	char mmproj[CFG_STR_MAX];
	char kv_dir[CFG_STR_MAX];
	char host[CFG_STR_MAX];
	int64_t port;
	char port_file[CFG_STR_MAX];
	int64_t threads, max_seqs, ctx, chunk, block_tokens;
	char model_id[CFG_STR_MAX];
	char tmpl[CFG_STR_MAX];
	char isa[CFG_STR_MAX];
	char device[CFG_STR_MAX];
	int no_cache, ignore_eos;
	int64_t max_tokens;
	char api_keys[CFG_STR_MAX];
	char tenant_secret[CFG_STR_MAX];
	int open_gateway;
	char tls_cert[CFG_STR_MAX], tls_key[CFG_STR_MAX];
	int64_t max_conns, max_conns_per_address;
	uint64_t max_body, image_max_bytes;
	int64_t max_images, image_max_side, image_max_pixels, image_max_total_pixels;
	int image_fetch;
};

#define SOFF(f) offsetof(struct serve_cfg, f)
static const struct cfg_opt serve_opts[] = {
    {"model", CFG_STR, SOFF(model), 0, 0, NULL, "GGUF model file (-m)"},
    {"mmproj", CFG_STR, SOFF(mmproj), 0, 0, NULL,
     "vision tower (llama.cpp's mmproj GGUF): chat requests may then carry images"},
    {"kv-dir", CFG_STR, SOFF(kv_dir), 0, 0, NULL,
     "prefix-cache directory (a kvfs mount or a local dir); empty = no cache"},
    {"no-cache", CFG_BOOL, SOFF(no_cache), 0, 0, "false", "ignore --kv-dir (baseline runs)"},
    {"host", CFG_STR, SOFF(host), 0, 0, "127.0.0.1", "listen address"},
    {"port", CFG_INT, SOFF(port), 0, 65535, "8080", "listen port, 0 = ephemeral"},
    {"port-file", CFG_STR, SOFF(port_file), 0, 0, NULL, "write the bound port here"},
    {"threads", CFG_INT, SOFF(threads), 0, 256, "0", "engine threads, 0 = all cores (-t)"},
    {"max-seqs", CFG_INT, SOFF(max_seqs), 1, 1024, "16", "running sequences at most"},
    {"ctx", CFG_INT, SOFF(ctx), 0, 1 << 20, "0", "per-sequence context, 0 = min(train, 2048)"},
    {"prefill-chunk", CFG_INT, SOFF(chunk), 1, 1 << 16, "256",
     "uncached prompt tokens per scheduler step"},
    {"block-tokens", CFG_INT, SOFF(block_tokens), 1, 4096, "64", "KV block size B"},
    {"model-id", CFG_STR, SOFF(model_id), 0, 0, "kvinfer",
     "model names the API serves, comma-separated (the first is the default)"},
    {"chat-template", CFG_STR, SOFF(tmpl), 0, 0, "plain", "chatml, llama3 or plain"},
    {"max-tokens", CFG_INT, SOFF(max_tokens), 1, 1 << 20, "4096", "largest max_tokens"},
    {"ignore-eos", CFG_BOOL, SOFF(ignore_eos), 0, 0, "false",
     "generate max_tokens even past end tokens (benchmarks)"},
    {"isa", CFG_STR, SOFF(isa), 0, 0, "auto", "matmul kernels: auto, avx2, scalar"},
    {"device", CFG_STR, SOFF(device), 0, 0, "cpu", KVINFER_DEVICE_HELP},
    {"api-keys", CFG_STR, SOFF(api_keys), 0, 0, NULL,
     "API key file: '<key> <tenant>' lines (docs/serving.md); reread on SIGHUP or a change"},
    {"tenant-secret-file", CFG_STR, SOFF(tenant_secret), 0, 0, NULL,
     "secret the tenants' cache salts are derived from (16..4096 bytes)"},
    {"open-gateway", CFG_BOOL, SOFF(open_gateway), 0, 0, "false",
     "no API keys: anyone who reaches the port may call /v1, with one shared cache"},
    {"tls-cert", CFG_STR, SOFF(tls_cert), 0, 0, NULL,
     "serve HTTPS with this PEM certificate chain (and --tls-key)"},
    {"tls-key", CFG_STR, SOFF(tls_key), 0, 0, NULL, "the PEM private key of --tls-cert"},
    {"max-conns", CFG_INT, SOFF(max_conns), 1, 100000, "512",
     "HTTP connections at most (one thread each); loopback has 16 more"},
    {"max-conns-per-address", CFG_INT, SOFF(max_conns_per_address), 1, 100000, "64",
     "HTTP connections at most from one client address"},
    {"max-body", CFG_SIZE, SOFF(max_body), 4096, 1 << 30, "1M",
     "largest request body (images come base64 in it)"},
    {"max-images", CFG_INT, SOFF(max_images), 1, OAI_MAX_IMAGES, "8",
     "images in one request at most"},
    {"image-max-bytes", CFG_SIZE, SOFF(image_max_bytes), 1, 1 << 30, "20M",
     "largest encoded image (PNG, JPEG, WebP)"},
    {"image-max-side", CFG_INT, SOFF(image_max_side), 1, 1 << 20, "8192",
     "largest image width or height, from its header"},
    {"image-max-pixels", CFG_INT, SOFF(image_max_pixels), 1, 1LL << 32, "16777216",
     "largest image width x height, from its header (decompression bombs)"},
    {"image-max-total-pixels", CFG_INT, SOFF(image_max_total_pixels), 1, 1LL << 36, "33554432",
     "largest width x height of all images of one request together"},
    {"image-fetch", CFG_BOOL, SOFF(image_fetch), 0, 0, "false",
     "let http(s) image URLs through the URL check (fetching is not implemented)"},
    CFG_END,
};

int kvinfer_cmd_serve(int argc, char **argv)
{
	static const char *const shorts[] = {"-m", "--model", "-t", "--threads", NULL};
	kvinfer_short_flags(argc, argv, shorts);
	struct serve_cfg c;
	int npos = 0;
	int rc =
	    cfg_parse(serve_opts, &c, argc, argv, "-m MODEL.gguf [--kv-dir DIR] [options]", &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	int isa = kvinfer_parse_isa(c.isa);
	if (kvinfer_eng_check(c.device, "kvinfer serve"))
		return 1;
	if (!c.model[0] || npos || isa < 0) {
		fprintf(stderr, "kvinfer serve: need -m MODEL (and a valid --isa); see --help\n");
		return 2;
	}
	/* SIGINT/SIGTERM are taken by sigwait below: block them before any thread starts */
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGHUP); /* reload the API keys */
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
	struct gw_auth *auth = NULL;
	if (gw_auth_from_options(c.api_keys, c.tenant_secret, c.open_gateway, "kvinfer serve",
				 &auth))
		return 2;

	struct sch_opts so;
	sch_opts_default(&so);
	so.model = c.model;
	so.kv_dir = c.no_cache ? NULL : c.kv_dir;
	so.threads = c.threads > 0 ? (int)c.threads : kvinfer_default_threads();
	so.max_seqs = (int)c.max_seqs;
	so.max_ctx = (int)c.ctx;
	so.prefill_chunk = (int)c.chunk;
	so.block_tokens = (int)c.block_tokens;
	so.isa = isa;
	so.device = kvinfer_eng_parse(c.device, &so.gpu);
	so.ignore_eos = c.ignore_eos;
	so.mmproj = c.mmproj[0] ? c.mmproj : NULL;
	struct sch *s = NULL;
	if ((rc = sch_create(&so, &s))) {
		fprintf(stderr, "kvinfer serve: %s\n", strerror(-rc));
		gw_auth_destroy(auth);
		return 1;
	}
	struct gw_backend be;
	sch_backend(s, &be);
	struct gw_opts go = {0};
	go.host = c.host;
	go.port = (uint16_t)c.port;
	go.model_id = c.model_id;
	go.chat_template = c.tmpl;
	go.limits.max_tokens = (int)c.max_tokens;
	go.auth = auth;
	go.tls_cert = c.tls_cert[0] ? c.tls_cert : NULL;
	go.tls_key = c.tls_key[0] ? c.tls_key : NULL;
	go.max_conns = (unsigned)c.max_conns;
	go.max_conns_per_address = (unsigned)c.max_conns_per_address;
	go.max_body = (size_t)c.max_body;
	go.limits.max_images = (int)c.max_images;
	go.limits.max_image_pixels_total = (uint64_t)c.image_max_total_pixels;
	struct img_limits il = {.max_bytes = (size_t)c.image_max_bytes,
				.max_width = (uint32_t)c.image_max_side,
				.max_height = (uint32_t)c.image_max_side,
				.max_pixels = (uint64_t)c.image_max_pixels,
				.allow_fetch = c.image_fetch};
	go.limits.img = &il;
	go.vision = sch_has_vision(s);
	struct gw *g = NULL;
	if ((rc = gw_start(&go, &be, &g))) {
		gw_auth_destroy(auth);
		fprintf(stderr, "kvinfer serve: listen %s:%d: %s\n", c.host, (int)c.port,
			rc == -EINVAL ? "bad --host, or --model-id not 1 to 8 comma-separated names"
				      : strerror(-rc));
		sch_destroy(s);
		return 1;
	}
	klog_info("serving %s (%s) on %s://%s:%u; cache %s; %d threads, %d sequences", c.model,
		  sch_model_arch(s), go.tls_cert ? "https" : "http", c.host, gw_port(g),
		  so.kv_dir && so.kv_dir[0] ? so.kv_dir : "off", so.threads, so.max_seqs);
	if (c.port_file[0]) {
		FILE *f = fopen(c.port_file, "w");
		if (f) {
			fprintf(f, "%u\n", gw_port(g));
			fclose(f);
		}
	}
	int sig = gw_auth_sigwait(auth, &sigs);
	klog_info("signal %d: stopping", sig);
	sch_stop(s); /* every job finished while the gateway still exists */
	gw_stop(g);
	gw_auth_destroy(auth);
	sch_destroy(s);
	return 0;
}
