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
#include "gw_cli.h"
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
	struct gwc_cfg http;
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
    GWC_OPTS_LISTEN(GOFF(http)),
    GWC_OPTS_API(GOFF(http)),
    GWC_OPTS_ACCESS(GOFF(http)),
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
	kvinfer_block_signals(&sigs, 1);
	struct gw_auth *auth = NULL;
	if (gw_auth_from_options(c.http.api_keys, c.http.tenant_secret, c.http.open_gateway,
				 "kvinfer gateway", &auth))
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
	struct gw_opts go;
	struct img_limits il;
	gwc_opts(&c.http, auth, c.encode[0] != 0 /* images go to the encode workers */, &go, &il);
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
		  go.tls_cert ? "https" : "http", c.http.host, gw_port(g), c.policy, c.handoff,
		  c.prefill, c.decode, c.encode[0] ? c.encode : "(none: no images)");
	kvinfer_port_file(c.http.port_file, gw_port(g));
	klog_info("signal %d: stopping", gw_auth_sigwait(auth, &sigs));
	lb_stop(l); /* every job finished while the gateway still exists */
	gw_stop(g);
	gw_auth_destroy(auth);
	lb_destroy(l);
	return 0;
}
