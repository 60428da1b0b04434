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
#include "kvinfer_cli.h"
#include "lb.h"
#include "log.h"

int kvinfer_cmd_gateway(int argc, char **argv);

struct gwm_cfg {
	char prefill[CFG_STR_MAX];
	char decode[CFG_STR_MAX];
	char secret_file[CFG_STR_MAX];
	char policy[CFG_STR_MAX];
	char handoff[CFG_STR_MAX];
	int64_t local_prefill;
	char host[CFG_STR_MAX];
	int64_t port;
	char port_file[CFG_STR_MAX];
	char model_id[CFG_STR_MAX];
	char tmpl[CFG_STR_MAX];
	int64_t max_tokens;
};

#define GOFF(f) offsetof(struct gwm_cfg, f)
static const struct cfg_opt gwm_opts[] = {
    {"prefill", CFG_STR, GOFF(prefill), 0, 0, NULL, "prefill workers: host:port,host:port"},
    {"decode", CFG_STR, GOFF(decode), 0, 0, NULL, "decode workers: host:port,host:port"},
    {"secret-file", CFG_STR, GOFF(secret_file), 0, 0, NULL, "the workers' shared secret"},
    {"policy", CFG_STR, GOFF(policy), 0, 0, "cache", "balancing: rr, least or cache"},
    {"handoff", CFG_STR, GOFF(handoff), 0, 0, "fs",
     "prompt KV to the decode worker: fs (through the kv dir) or direct (prefill -> decode)"},
    {"local-prefill", CFG_INT, GOFF(local_prefill), 0, 1 << 20, "0",
     "prompts of at most N tokens (bytes / 4 + 1) skip the prefill workers: 0 = never"},
    {"host", CFG_STR, GOFF(host), 0, 0, "127.0.0.1", "listen address"},
    {"port", CFG_INT, GOFF(port), 0, 65535, "8080", "listen port, 0 = ephemeral"},
    {"port-file", CFG_STR, GOFF(port_file), 0, 0, NULL, "write the bound port here"},
    {"model-id", CFG_STR, GOFF(model_id), 0, 0, "kvinfer",
     "model names the API serves, comma-separated (the first is the default)"},
    {"chat-template", CFG_STR, GOFF(tmpl), 0, 0, "plain", "chatml, llama3 or plain"},
    {"max-tokens", CFG_INT, GOFF(max_tokens), 1, 1 << 20, "4096", "largest max_tokens"},
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
		fprintf(stderr, "kvinfer gateway: need --prefill, --decode, --secret-file and "
				"--policy rr|least|cache, --handoff fs|direct; see --help\n");
		return 2;
	}
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
	struct lb_opts lo = {.prefill = c.prefill,
			     .decode = c.decode,
			     .secret = &sec,
			     .policy = pol,
			     .handoff = ho,
			     .local_prefill = (int)c.local_prefill};
	struct lb *l = NULL;
	if ((rc = lb_create(&lo, &l))) {
		fprintf(stderr, "kvinfer gateway: bad --prefill/--decode list: %s\n",
			strerror(-rc));
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
	struct gw *g = NULL;
	if ((rc = gw_start(&go, &be, &g))) {
		fprintf(stderr, "kvinfer gateway: %s\n",
			rc == -EINVAL ? "bad --host, or --model-id not 1 to 8 comma-separated names"
				      : strerror(-rc));
		lb_destroy(l);
		return 1;
	}
	klog_info("gateway on http://%s:%u, policy %s, handoff %s; prefill %s; decode %s", c.host,
		  gw_port(g), c.policy, c.handoff, c.prefill, c.decode);
	if (c.port_file[0]) {
		FILE *f = fopen(c.port_file, "w");
		if (f) {
			fprintf(f, "%u\n", gw_port(g));
			fclose(f);
		}
	}
	int sig = 0;
	sigwait(&sigs, &sig);
	lb_stop(l); /* every job finished while the gateway still exists */
	gw_stop(g);
	lb_destroy(l);
	return 0;
}
