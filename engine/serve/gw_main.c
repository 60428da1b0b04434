/* `kvinfer gateway`: the HTTP gateway in front of prefill and decode worker processes
 * (lb.h). */
#define KVFS_LOG_TAG "gateway"
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
#include "lb.h"
#include "log.h"

int kvinfer_cmd_gateway(int argc, char **argv);

struct gwm_cfg {
	char prefill[CFG_STR_MAX];
	char decode[CFG_STR_MAX];
	char encode[CFG_STR_MAX];
	char secret_file[CFG_STR_MAX];
	char policy[CFG_STR_MAX];
	char handoff[CFG_STR_MAX];
	int64_t local_prefill;
	int64_t workers, queue;
	char host[CFG_STR_MAX];
	int64_t port;
	char port_file[CFG_STR_MAX];
	char model_id[CFG_STR_MAX];
	char tmpl[CFG_STR_MAX];
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

#define GOFF(f) offsetof(struct gwm_cfg, f)
static const struct cfg_opt gwm_opts[] = {
    {"prefill", CFG_STR, GOFF(prefill), 0, 0, NULL, "prefill workers: host:port,host:port"},
    {"decode", CFG_STR, GOFF(decode), 0, 0, NULL, "decode workers: host:port,host:port"},
    {"encode", CFG_STR, GOFF(encode), 0, 0, NULL,
     "vision encode workers (`kvinfer encode`): host:port,host:port; enables images"},
    {"secret-file", CFG_STR, GOFF(secret_file), 0, 0, NULL, "the workers' shared secret"},
    {"policy", CFG_STR, GOFF(policy), 0, 0, "prefix",
     "balancing: rr, least, cache, prefix or chash"},
    {"handoff", CFG_STR, GOFF(handoff), 0, 0, "fs",
     "prompt KV to the decode worker: fs (through the kv dir) or direct (prefill -> decode)"},
    {"local-prefill", CFG_INT, GOFF(local_prefill), 0, 1 << 20, "0",
     "prompts of at most N tokens (bytes / 4 + 1) skip the prefill workers: 0 = never"},
    {"workers", CFG_INT, GOFF(workers), 1, LB_WORKERS_MAX, "64",
     "requests run at once (one thread each); more wait in the queue"},
    {"queue", CFG_INT, GOFF(queue), 1, LB_QUEUE_MAX, "448",
     "requests waiting for a worker; past it the gateway answers 503 overloaded"},
    {"host", CFG_STR, GOFF(host), 0, 0, "127.0.0.1", "listen address"},
    {"port", CFG_INT, GOFF(port), 0, 65535, "8080", "listen port, 0 = ephemeral"},
    {"port-file", CFG_STR, GOFF(port_file), 0, 0, NULL, "write the bound port here"},
    {"model-id", CFG_STR, GOFF(model_id), 0, 0, "kvinfer",
     "model names the API serves, comma-separated (the first is the default)"},
    {"chat-template", CFG_STR, GOFF(tmpl), 0, 0, "plain", "chatml, llama3 or plain"},
    {"max-tokens", CFG_INT, GOFF(max_tokens), 1, 1 << 20, "4096", "largest max_tokens"},
    {"api-keys", CFG_STR, GOFF(api_keys), 0, 0, NULL,
     "API key file: '<key> <tenant>' lines (docs/serving.md); reread on SIGHUP or a change"},
    {"tenant-secret-file", CFG_STR, GOFF(tenant_secret), 0, 0, NULL,
     "secret the tenants' cache salts are derived from (16..4096 bytes)"},
    {"open-gateway", CFG_BOOL, GOFF(open_gateway), 0, 0, "false",
     "no API keys: anyone who reaches the port may call /v1, with one shared cache"},
    {"tls-cert", CFG_STR, GOFF(tls_cert), 0, 0, NULL,
     "serve HTTPS with this PEM certificate chain (and --tls-key)"},
    {"tls-key", CFG_STR, GOFF(tls_key), 0, 0, NULL, "the PEM private key of --tls-cert"},
    {"max-conns", CFG_INT, GOFF(max_conns), 1, 100000, "512",
     "HTTP connections at most (one thread each); loopback has 16 more"},
    {"max-conns-per-address", CFG_INT, GOFF(max_conns_per_address), 1, 100000, "64",
     "HTTP connections at most from one client address"},
    {"max-body", CFG_SIZE, GOFF(max_body), 4096, 1 << 30, "1M",
     "largest request body (images come base64 in it)"},
    {"max-images", CFG_INT, GOFF(max_images), 1, OAI_MAX_IMAGES, "8",
     "images in one request at most"},
    {"image-max-bytes", CFG_SIZE, GOFF(image_max_bytes), 1, 1 << 30, "20M",
     "largest encoded image (PNG, JPEG, WebP)"},
    {"image-max-side", CFG_INT, GOFF(image_max_side), 1, 1 << 20, "8192",
     "largest image width or height, from its header"},
    {"image-max-pixels", CFG_INT, GOFF(image_max_pixels), 1, 1LL << 32, "16777216",
     "largest image width x height, from its header (decompression bombs)"},
    {"image-max-total-pixels", CFG_INT, GOFF(image_max_total_pixels), 1, 1LL << 36, "33554432",
     "largest width x height of all images of one request together"},
    {"image-fetch", CFG_BOOL, GOFF(image_fetch), 0, 0, "false",
     "let http(s) image URLs through the URL check (fetching is not implemented)"},
    CFG_END,
};

int kvinfer_cmd_gateway(int argc, char **argv)
{
	struct gwm_cfg c;
	int npos = 0;
	int rc = cfg_parse(gwm_opts, &c, argc, argv,
			   "--prefill A,B --decode C,D --secret-file F [options]", &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	int pol = lb_policy_parse(c.policy), ho = lb_handoff_parse(c.handoff);
	struct kvp_secret sec;
	if (npos || pol < 0 || ho < 0 || !c.prefill[0] || !c.decode[0] || !c.secret_file[0] ||
	    kvp_secret_load(c.secret_file, &sec)) {
		fprintf(stderr,
			"kvinfer gateway: need --prefill, --decode, --secret-file and "
			"--policy rr|least|cache|prefix|chash, --handoff fs|direct; see --help\n");
		return 2;
	}
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGHUP); /* reload the API keys */
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
	struct gw_auth *auth = NULL;
	if (gw_auth_from_options(c.api_keys, c.tenant_secret, c.open_gateway, "kvinfer gateway",
				 &auth))
		return 2;
	struct lb_opts lo = {.prefill = c.prefill,
			     .decode = c.decode,
			     .encode = c.encode,
			     .secret = &sec,
			     .policy = pol,
			     .handoff = ho,
			     .local_prefill = (int)c.local_prefill,
			     .workers = (int)c.workers,
			     .queue = (int)c.queue};
	struct lb *l = NULL;
	if ((rc = lb_create(&lo, &l))) {
		fprintf(stderr, "kvinfer gateway: bad --prefill/--decode/--encode list: %s\n",
			strerror(-rc));
		gw_auth_destroy(auth);
		return 2;
	}
	struct gw_backend be;
	lb_backend(l, &be);
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
	go.vision = c.encode[0] != 0; /* images go to the encode workers */
	struct gw *g = NULL;
	if ((rc = gw_start(&go, &be, &g))) {
		gw_auth_destroy(auth);
		fprintf(
		    stderr, "kvinfer gateway: %s\n",
		    rc == -EINVAL
			? "bad --host, TLS files, or --model-id not 1 to 8 comma-separated names"
			: strerror(-rc));
		lb_destroy(l);
		return 1;
	}
	klog_info("gateway on %s://%s:%u, policy %s, handoff %s; prefill %s; decode %s; encode %s",
		  go.tls_cert ? "https" : "http", c.host, gw_port(g), c.policy, c.handoff,
		  c.prefill, c.decode, c.encode[0] ? c.encode : "(none: no images)");
	if (c.port_file[0]) {
		FILE *f = fopen(c.port_file, "w");
		if (f) {
			fprintf(f, "%u\n", gw_port(g));
			fclose(f);
		}
	}
	klog_info("signal %d: stopping", gw_auth_sigwait(auth, &sigs));
	lb_stop(l); /* every job finished while the gateway still exists */
	gw_stop(g);
	gw_auth_destroy(auth);
	lb_destroy(l);
	return 0;
}
