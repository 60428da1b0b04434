/* kvfs-node: one storage node per data directory (one per SSD). Serves PUT/GET/DEL/LIST/STAT
 * over the kvfs protocol and heartbeats to the metadata server. docs/node.md. */
#define KVFS_LOG_TAG "node"
#include "cfg.h"
#include "kvp.h"
#include "log.h"
#include "node_metrics.h"
#include "node_req.h"
#include "node_store.h"

#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

struct node_conf {
	char listen[CFG_STR_MAX];
	char advertise[CFG_STR_MAX];
	char dir[CFG_STR_MAX];
	char meta[CFG_STR_MAX];
	char zone[CFG_STR_MAX];
	char secret_file[CFG_STR_MAX];
	char addr_file[CFG_STR_MAX];
	char metrics_listen[CFG_STR_MAX], metrics_addr_file[CFG_STR_MAX];
	uint64_t capacity, reserve;
	double heartbeat, reply_timeout;
	int sync, direct_read, direct_cold;
	int64_t io_threads, workers, ring_depth;
	uint64_t max_inflight;
	int64_t log_level;
};

#define F(x) offsetof(struct node_conf, x)
static const struct cfg_opt node_opts[] = {
    {"listen", CFG_STR, F(listen), 0, 0, "127.0.0.1:0", "HOST:PORT to serve on (port 0: any)"},
    {"advertise", CFG_STR, F(advertise), 0, 0, NULL,
     "HOST other peers reach this node at (default: the listen host; 127.0.0.1 for 0.0.0.0)"},
    {"dir", CFG_STR, F(dir), 0, 0, NULL, "data directory (required; created if absent)"},
    {"meta", CFG_STR, F(meta), 0, 0, NULL,
     "metadata server HOST:PORT to heartbeat to (none: serve without registering)"},
    {"zone", CFG_STR, F(zone), 0, 0, NULL,
     "failure domain (rack, host, room: 1-63 of [A-Za-z0-9._-]); meta never puts two chunks of "
     "a stripe in one zone when there are k+m zones (none: the node is a zone of its own)"},
    {"secret-file", CFG_STR, F(secret_file), 0, 0, NULL, "cluster secret file (required)"},
    {"capacity", CFG_SIZE, F(capacity), 0, 1e18, "0",
     "cap on the bytes of chunk data this node accepts (0: none; its disk's free space always "
     "limits it)"},
    {"reserve", CFG_SIZE, F(reserve), 0, 1e18, "64M",
     "free space kept on the data directory's filesystem: no chunk is stored into it"},
    {"heartbeat", CFG_SECS, F(heartbeat), 0.01, 3600, "1s", "heartbeat interval"},
    {"addr-file", CFG_STR, F(addr_file), 0, 0, NULL,
     "once listening, write HOST:PORT here (atomically)"},
    {"sync", CFG_BOOL, F(sync), 0, 0, "false",
     "fdatasync each chunk and fsync its directory before acknowledging a PUT"},
    {"direct-read", CFG_BOOL, F(direct_read), 0, 0, "false",
     "read chunks with O_DIRECT (bypass the page cache; for data sets far above RAM)"},
    {"direct-cold", CFG_BOOL, F(direct_cold), 0, 0, "true",
     "read a chunk the page cache does not hold whole with O_DIRECT (one disk request "
     "instead of readahead's), one it holds through the cache"},
    {"io-threads", CFG_INT, F(io_threads), 1, 64, "2", "I/O threads (one io_uring each)"},
    {"workers", CFG_INT, F(workers), 1, 256, "4", "completion threads (CRC checks, replies)"},
    {"reply-timeout", CFG_SECS, F(reply_timeout), 0.1, 3600, "10s",
     "close a connection whose peer takes no byte of a reply for this long"},
    {"ring-depth", CFG_INT, F(ring_depth), 8, 4096, "256", "submission queue entries per ring"},
    {"max-inflight", CFG_SIZE, F(max_inflight), 1 << 20, 1e12, "512M",
     "bytes of requests in flight before connections are slowed down"},
    {"metrics-listen", CFG_STR, F(metrics_listen), 0, 0, NULL,
     "HOST:PORT to serve Prometheus /metrics on (port 0: any; empty: off)"},
    {"metrics-addr-file", CFG_STR, F(metrics_addr_file), 0, 0, NULL,
     "once serving metrics, write their HOST:PORT here (atomically)"},
    {"log-level", CFG_INT, F(log_level), 0, 3, "2", "0 error, 1 warn, 2 info, 3 debug"},
    CFG_END,
};
#undef F

struct node {
	struct node_conf cf;
	struct node_store *store;
	struct kvp_secret secret;
	char addr[KVP_ADDR_MAX];
	pthread_mutex_t hb_mu; /* protects hb_stop */
	pthread_cond_t hb_cv;
	int hb_stop;
};

static int handle(void *ctx, struct kvp_conn *c, const struct kvp_hdr *h, uint8_t *body)
{
	struct node *n = ctx;
	struct node_req r;
	int rc = node_req_parse(h->op, body, h->len, &r);
	if (rc == -EBADMSG) {
		free(body);
		return rc; /* closes this connection */
	}
	if (rc) {
		kvp_reply(c, h, rc, NULL, 0, NULL, 0);
		free(body);
		return 0;
	}
	switch (h->op) {
	case KVP_OP_PUT:
		node_store_put(n->store, c, h, body, &r);
		return 0;
	case KVP_OP_GET:
	case KVP_OP_VERIFY:
		node_store_get(n->store, c, h, body, &r);
		return 0;
	case KVP_OP_DEL:
		node_store_del(n->store, c, h, body, &r);
		return 0;
	}
	free(body);
	struct kvp_wbuf w;
	kvp_w_init(&w);
	if (h->op == KVP_OP_LIST) {
		rc = node_store_list(n->store, r.start_after, r.max, &w);
	} else { /* STAT */
		struct node_stats st;
		node_store_stats(n->store, &st);
		kvp_w_u64(&w, st.uuid);
		kvp_w_u64(&w, st.capacity);
		kvp_w_u64(&w, st.used);
		kvp_w_u64(&w, st.chunks);
		kvp_w_u64(&w, st.crc_errors);
		rc = w.err;
	}
	kvp_reply(c, h, rc, w.p, w.len, NULL, 0);
	kvp_w_free(&w);
	return 0;
}

/* Registers with the metadata server every interval; a meta that is down or restarting is
 * simply retried (the pool reconnects), so no node restart is ever needed. */
static void *heartbeat_main(void *arg)
{
	struct node *n = arg;
	struct kvp_pool *pool = NULL;
	int rc = kvp_pool_create(&n->secret, 1000, &pool);
	if (rc) {
		klog_error("heartbeat: cannot create a connection pool: %s", kvp_strerror(rc));
		return NULL;
	}
	int64_t node_id = -1;
	int last_err = 0;
	/* --meta may list every replica of a replicated meta: heartbeats go to one until it
	 * fails or says it does not lead (-EREMCHG), then to the leader that replica named
	 * (kept in one of 4 slots past the list, so one follower's address is enough) or the
	 * next. */
	char metas[9 + 4][KVP_ADDR_MAX];
	/* named_by: the replica whose redirect was followed last; if the leader it named fails,
	 * the next one tried is the replica after it (as in libkvfs, kvc_meta.c). */
	int nmetas = 0, nconf = 0, learned = 0, cur = 0, refused = 0, named_by = -1;
	{
		const char *p = n->cf.meta;
		for (;;) {
			size_t len = strcspn(p, ",");
			if (len && len < KVP_ADDR_MAX && nmetas < 9) {
				memcpy(metas[nmetas], p, len);
				metas[nmetas++][len] = 0;
			}
			if (!p[len])
				break;
			p += len + 1;
		}
	}
	nconf = nmetas;
	if (!nmetas) {
		klog_error("heartbeat: bad --meta %s", n->cf.meta);
		kvp_pool_destroy(pool);
		return NULL;
	}
	for (;;) {
		struct node_stats st;
		node_store_stats(n->store, &st);
		struct kvp_wbuf w;
		kvp_w_init(&w);
		kvp_w_u64(&w, st.uuid);
		kvp_w_cstr(&w, n->addr);
		kvp_w_u64(&w, st.capacity);
		kvp_w_u64(&w, st.used);
		kvp_w_u64(&w, st.chunks);
		if (n->cf.zone[0]) /* only when set: an older meta takes no trailing field */
			kvp_w_cstr(&w, n->cf.zone);
		struct kvp_client *cl = NULL;
		const char *meta = metas[cur];
		rc = w.err ? w.err : kvp_pool_get(pool, meta, &cl);
		uint8_t *rb = NULL;
		uint32_t rl = 0;
		char leader[KVP_ADDR_MAX] = "";
		if (!rc) {
			/* Bounded so that a hung meta delays shutdown by at most ~4 s. */
			int ms = (int)(n->cf.heartbeat * 1000) + 1000;
			ms = ms > 3000 ? 3000 : ms;
			rc = kvp_call_detail(cl, KVP_OP_HEARTBEAT, w.p, w.len, NULL, 0, ms, &rb,
					     &rl);
			kvp_pool_put(pool, cl);
			if (rc == -EREMCHG)
				kvp_redirect_parse(rb, rl, leader);
		}
		kvp_w_free(&w);
		if (!rc) {
			struct kvp_rbuf r;
			kvp_r_init(&r, rb, rl);
			uint32_t id = kvp_r_u32(&r);
			rc = kvp_r_end(&r);
			if (!rc && (int64_t)id != node_id) {
				klog_info("registered with meta %s as node %u", meta, id);
				node_id = id;
			}
		}
		free(rb);
		if (rc && rc != last_err && rc != -EREMCHG)
			klog_warn("heartbeat to meta %s failed: %s (retrying)", meta,
				  kvp_strerror(rc));
		else if (!rc && last_err)
			klog_info("heartbeat to meta %s works again", meta);
		last_err = rc;
		if (leader[0]) {
			int i = 0;
			while (i < nmetas && strcmp(metas[i], leader))
				i++;
			if (i == nmetas && nmetas < (int)(sizeof(metas) / sizeof(metas[0])))
				nmetas++;
			else if (i == nmetas)
				i = nconf + learned++ % (nmetas - nconf);
			snprintf(metas[i], KVP_ADDR_MAX, "%s", leader);
			named_by = cur;
			cur = i;
			if (++refused < nmetas)
				continue;
		} else if (rc && nmetas > 1) {
			cur = ((named_by >= 0 ? named_by : cur) + 1) % nmetas;
			named_by = -1;
			/* at once: the leader is another one, unless all said so (an election) */
			if (rc == -EREMCHG && ++refused < nmetas)
				continue;
		}
		refused = 0;
		if (!rc)
			named_by = -1;

		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		double t = (double)ts.tv_nsec / 1e9 + n->cf.heartbeat;
		ts.tv_sec += (time_t)t;
		ts.tv_nsec = (long)((t - (double)(time_t)t) * 1e9);
		pthread_mutex_lock(&n->hb_mu);
		if (!n->hb_stop)
			pthread_cond_timedwait(&n->hb_cv, &n->hb_mu, &ts);
		int stop = n->hb_stop;
		pthread_mutex_unlock(&n->hb_mu);
		if (stop)
			break;
	}
	kvp_pool_destroy(pool);
	return NULL;
}

/* Writes "addr\n" to path via a temp file and rename, so a reader never sees half of it. */
static int write_addr_file(const char *path, const char *addr)
{
	char tmp[CFG_STR_MAX + 16];
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return -errno;
	int ok = fprintf(f, "%s\n", addr) > 0;
	ok = (fclose(f) == 0) && ok;
	if (!ok || rename(tmp, path)) {
		unlink(tmp);
		return -EIO;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct node n;
	memset(&n, 0, sizeof(n));
	/* Signals go to the main thread only (sigwait below); every thread inherits this mask,
	 * and a SIGTERM during startup waits for the node to be up, then stops it cleanly. */
	signal(SIGPIPE, SIG_IGN);
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);

	int npos = 0;
	int rc = cfg_parse(node_opts, &n.cf, argc, argv, "", &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	if (npos > 0 || !n.cf.dir[0] || !n.cf.secret_file[0]) {
		fprintf(stderr, "kvfs-node: --dir and --secret-file are required (see --help)\n");
		return 2;
	}
	if (n.cf.zone[0] && kvp_zone_check(n.cf.zone, strlen(n.cf.zone))) {
		fprintf(stderr, "kvfs-node: --zone '%s': 1-%d characters of A-Z a-z 0-9 . _ -\n",
			n.cf.zone, KVP_ZONE_MAX - 1);
		return 2;
	}
	kvfs_log_set_level((int)n.cf.log_level);
	char host[KVP_ADDR_MAX];
	uint16_t port;
	if (kvp_addr_parse(n.cf.listen, host, sizeof(host), &port)) {
		fprintf(stderr, "kvfs-node: bad --listen '%s' (want HOST:PORT)\n", n.cf.listen);
		return 2;
	}
	if (kvp_secret_load(n.cf.secret_file, &n.secret))
		return 2;

	/* Request bodies and read buffers are up to 16 MiB and short-lived: keep them on the
	 * heap instead of fresh mmaps, which would page-fault in every byte of every request. */
	mallopt(M_MMAP_THRESHOLD, 64 << 20);
	mallopt(M_TRIM_THRESHOLD, 256 << 20);

	/* A busy node holds a file per request in flight plus one per shard directory. */
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}

	struct node_store_opts so = {
	    .dir = n.cf.dir,
	    .capacity = n.cf.capacity,
	    .reserve = n.cf.reserve,
	    .sync = n.cf.sync,
	    .io_threads = (int)n.cf.io_threads,
	    .workers = (int)n.cf.workers,
	    .ring_depth = (unsigned)n.cf.ring_depth,
	    .max_inflight = n.cf.max_inflight,
	    .direct_read = n.cf.direct_read,
	    .direct_cold = n.cf.direct_cold,
	};
	rc = node_store_open(&so, &n.store);
	if (rc)
		return 1;

	struct node_metrics *nm = NULL;
	if (node_metrics_start(n.store, n.cf.metrics_listen, n.cf.metrics_addr_file, &nm)) {
		node_store_close(n.store);
		return 1;
	}
	struct kvp_server *srv = NULL;
	struct kvp_server_opts o = {.name = "node",
				    .host = host,
				    .port = port,
				    .secret = &n.secret,
				    .send_timeout_ms = (int)(n.cf.reply_timeout * 1000),
				    .handler = handle,
				    .ctx = &n,
				    .on_reply = node_metrics_on_reply,
				    .stats_ctx = nm,
				    .conn_stats = node_metrics_conn_stats(nm)};
	rc = kvp_server_start(&o, &srv);
	if (rc) {
		node_metrics_stop(nm);
		node_store_close(n.store);
		node_metrics_free(nm);
		return 1;
	}
	const char *adv = n.cf.advertise[0]		 ? n.cf.advertise
			  : strcmp(host, "0.0.0.0") == 0 ? "127.0.0.1"
							 : host;
	if (snprintf(n.addr, sizeof(n.addr), "%.*s:%u", KVP_ADDR_MAX - 8, adv,
		     kvp_server_port(srv)) >= (int)sizeof(n.addr))
		klog_warn("advertised address truncated to %s", n.addr);
	struct node_stats st;
	node_store_stats(n.store, &st);
	klog_info("kvfs-node %016" PRIx64 " serving %s on %s (%" PRIu64 " chunks)", st.uuid,
		  n.cf.dir, n.addr, st.chunks);
	if (n.cf.addr_file[0] && (rc = write_addr_file(n.cf.addr_file, n.addr))) {
		klog_error("cannot write --addr-file %s: %s", n.cf.addr_file, strerror(-rc));
		kvp_server_stop(srv);
		node_metrics_stop(nm);
		node_store_close(n.store);
		node_metrics_free(nm);
		return 1;
	}

	pthread_t hb;
	int have_hb = 0;
	pthread_mutex_init(&n.hb_mu, NULL);
	pthread_cond_init(&n.hb_cv, NULL);
	if (n.cf.meta[0]) {
		have_hb = pthread_create(&hb, NULL, heartbeat_main, &n) == 0;
		if (!have_hb)
			klog_error("cannot start the heartbeat thread");
	} else {
		klog_info("no --meta: serving without registering");
	}

	int sig = 0;
	while (sigwait(&sigs, &sig) != 0)
		;
	klog_info("signal %d: shutting down", sig);

	if (have_hb) {
		pthread_mutex_lock(&n.hb_mu);
		n.hb_stop = 1;
		pthread_cond_signal(&n.hb_cv);
		pthread_mutex_unlock(&n.hb_mu);
		pthread_join(hb, NULL);
	}
	kvp_server_stop(srv);
	node_metrics_stop(nm);
	node_store_close(n.store);
	node_metrics_free(nm);
	pthread_mutex_destroy(&n.hb_mu);
	pthread_cond_destroy(&n.hb_cv);
	klog_info("stopped");
	return 0;
}
