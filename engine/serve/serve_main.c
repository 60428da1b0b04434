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
#include "gw_cli.h"
#include "kvinfer_cli.h"
#include "log.h"
#include "sch.h"

int kvinfer_cmd_serve(int argc, char **argv);

struct serve_cfg {
	char model[CFG_STR_MAX];
	char mmproj[CFG_STR_MAX];
	char kv_dir[CFG_STR_MAX];
	int64_t threads, max_seqs, ctx, chunk, block_tokens;
	char isa[CFG_STR_MAX];
	char device[CFG_STR_MAX];
	int no_cache, ignore_eos;
	struct gwc_cfg http;
};

#define SOFF(f) offsetof(struct serve_cfg, f)
static const struct cfg_opt serve_opts[] = {
    {"model", CFG_STR, SOFF(model), 0, 0, NULL, "GGUF model file (-m)"},
    {"mmproj", CFG_STR, SOFF(mmproj), 0, 0, NULL,
     "vision tower (llama.cpp's mmproj GGUF): chat requests may then carry images"},
    {"kv-dir", CFG_STR, SOFF(kv_dir), 0, 0, NULL,
     "prefix-cache directory (a kvfs mount or a local dir); empty = no cache"},
    {"no-cache", CFG_BOOL, SOFF(no_cache), 0, 0, "false", "ignore --kv-dir (baseline runs)"},
    GWC_OPTS_LISTEN(SOFF(http)),
    {"threads", CFG_INT, SOFF(threads), 0, 256, "0", "engine threads, 0 = all cores (-t)"},
    {"max-seqs", CFG_INT, SOFF(max_seqs), 1, 1024, "16", "running sequences at most"},
    {"ctx", CFG_INT, SOFF(ctx), 0, 1 << 20, "0", "per-sequence context, 0 = min(train, 2048)"},
    {"prefill-chunk", CFG_INT, SOFF(chunk), 1, 1 << 16, "256",
     "uncached prompt tokens per scheduler step"},
    {"block-tokens", CFG_INT, SOFF(block_tokens), 1, 4096, "64", "KV block size B"},
    GWC_OPTS_API(SOFF(http)),
    {"ignore-eos", CFG_BOOL, SOFF(ignore_eos), 0, 0, "false",
     "generate max_tokens even past end tokens (benchmarks)"},
    {"isa", CFG_STR, SOFF(isa), 0, 0, "auto", "matmul kernels: auto, avx2, scalar"},
    {"device", CFG_STR, SOFF(device), 0, 0, "cpu", KVINFER_DEVICE_HELP},
    GWC_OPTS_ACCESS(SOFF(http)),
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
	kvinfer_block_signals(&sigs, 1);
	struct gw_auth *auth = NULL;
	if (gw_auth_from_options(c.http.api_keys, c.http.tenant_secret, c.http.open_gateway,
				 "kvinfer serve", &auth))
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
	struct gw_opts go;
	struct img_limits il;
	gwc_opts(&c.http, auth, sch_has_vision(s), &go, &il);
	struct gw *g = NULL;
	if ((rc = gw_start(&go, &be, &g))) {
		gw_auth_destroy(auth);
		fprintf(stderr, "kvinfer serve: listen %s:%d: %s\n", c.http.host, (int)c.http.port,
			rc == -EINVAL ? "bad --host, or --model-id not 1 to 8 comma-separated names"
				      : strerror(-rc));
		sch_destroy(s);
		return 1;
	}
	klog_info("serving %s (%s) on %s://%s:%u; cache %s; %d threads, %d sequences", c.model,
		  sch_model_arch(s), go.tls_cert ? "https" : "http", c.http.host, gw_port(g),
		  so.kv_dir && so.kv_dir[0] ? so.kv_dir : "off", so.threads, so.max_seqs);
	kvinfer_port_file(c.http.port_file, gw_port(g));
	int sig = gw_auth_sigwait(auth, &sigs);
	klog_info("signal %d: stopping", sig);
	sch_stop(s); /* every job finished while the gateway still exists */
	gw_stop(g);
	gw_auth_destroy(auth);
	sch_destroy(s);
	return 0;
}
