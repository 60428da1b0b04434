/* kvfs-repair-bench — repair rebuild rate beside the cluster's read throughput, same run.
 *
 *   kvfs-repair-bench [--nodes 12] [--k 10] [--m 1] [--files 48] [--size 4M] [--dir /tmp]
 *
 * Starts kvfs-meta and N kvfs-node on loopback (tests/harness.c; binaries from
 * $KVFS_BUILD_DIR/bin or ./bin), writes the files through libkvfs, reads them all back
 * (timed: the baseline, MiB/s of file bytes), runs `scrub` on meta (timed: MiB/s of chunk bytes
 * checked, from meta's job counters), kills one node for good and runs `repair` on
 * meta (timed: MiB/s of chunk bytes rebuilt, from meta's own job counters), then reads every
 * file again with a second node killed to prove redundancy was restored. Prints both rates and
 * their ratio. Exit 0 ok, 1 failure, 2 usage. */
#define KVFS_LOG_TAG "bench"
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cfg.h"
#include "harness.h"
#include "kvc.h"
#include "log.h"

struct bench_cfg {
	int64_t nodes, k, m, files;
	uint64_t size;
};

#define F(x) offsetof(struct bench_cfg, x)
static const struct cfg_opt opts[] = {
    {"nodes", CFG_INT, F(nodes), 3, KVH_MAX_NODES, "12", "storage nodes (>= k+m+1)"},
    {"k", CFG_INT, F(k), 1, 32, "10", "data chunks per stripe"},
    {"m", CFG_INT, F(m), 1, 8, "1", "parity chunks per stripe"},
    {"files", CFG_INT, F(files), 1, 100000, "48", "files to write"},
    {"size", CFG_SIZE, F(size), 4096, 1ull << 30, "4M", "bytes per file"},
    CFG_END};

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (uint8_t)x;
	}
}

/* Reads every file, checks it, returns MiB/s of file bytes or < 0. */
static double read_all(struct kvc *c, const struct bench_cfg *b, uint8_t *want)
{
	double t0 = now_s();
	for (int64_t i = 0; i < b->files; i++) {
		char p[64];
		snprintf(p, sizeof(p), "/bench/f%" PRId64, i);
		void *got;
		size_t len;
		int rc = kvc_get(c, p, &got, &len);
		if (rc) {
			fprintf(stderr, "read %s: %s\n", p, kvp_strerror(rc));
			return -1;
		}
		fill(want, b->size, (uint64_t)i);
		int ok = len == b->size && memcmp(got, want, len) == 0;
		free(got);
		if (!ok) {
			fprintf(stderr, "read %s: wrong bytes\n", p);
			return -1;
		}
	}
	double dt = now_s() - t0;
	return (double)b->size * (double)b->files / 1048576.0 / dt;
}

static int mstatus(struct kvc *c, uint8_t *running, uint64_t *done, uint64_t *total,
		   uint64_t *failed, uint64_t *bytes, int64_t *ns)
{
	uint8_t *rb = NULL;
	uint32_t rl = 0;
	int rc = kvc_admin(c, KVP_OP_MSTATUS, NULL, 0, &rb, &rl);
	if (rc)
		return rc;
	struct kvp_rbuf r;
	kvp_r_init(&r, rb, rl);
	kvp_r_u8(&r);
	*running = kvp_r_u8(&r);
	kvp_r_u32(&r);
	*total = kvp_r_u64(&r);
	*done = kvp_r_u64(&r);
	*failed = kvp_r_u64(&r);
	*bytes = kvp_r_u64(&r);
	*ns = kvp_r_i64(&r);
	rc = r.err;
	free(rb);
	return rc;
}

/* Starts a maintenance job on meta and waits for its end; its counters from MSTATUS. */
static int run_job(struct kvc *c, uint8_t kind, uint64_t *done, uint64_t *failed, uint64_t *bytes,
		   int64_t *ns)
{
	uint8_t req[5] = {kind, 0, 0, 0, 0};
	int rc = kvc_admin(c, KVP_OP_MAINT, req, sizeof(req), NULL, NULL);
	if (rc)
		return rc;
	uint8_t running = 1;
	uint64_t total = 0;
	while (running) {
		usleep(100000);
		if ((rc = mstatus(c, &running, done, &total, failed, bytes, ns)))
			return rc;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct bench_cfg b;
	int npos = 0;
	int rc = cfg_parse(opts, &b, argc, argv, "", &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	if (b.nodes < b.k + b.m + 1) {
		fprintf(stderr, "kvfs-repair-bench: --nodes must be at least k+m+1\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	kvfs_log_set_level(0);
	char margs[256];
	snprintf(margs, sizeof(margs),
		 "--k %" PRId64 " --m %" PRId64 " --node-timeout 1s --repair-delay 0 "
		 "--gc-interval 0.2s --scrub-interval 0 --scrub-rate 0",
		 b.k, b.m);
	struct kvh_cluster cl;
	if ((rc = kvh_cluster_start(&cl, (int)b.nodes, margs, "--capacity 64G"))) {
		fprintf(stderr, "cluster start: %s\n", kvp_strerror(rc));
		return 1;
	}
	int ret = 1;
	struct kvc *c = NULL;
	uint8_t *buf = malloc(b.size);
	struct kvc_opts o = {.meta_addr = cl.meta_addr, .secret = &cl.secret, .timeout_ms = 20000};
	if (!buf || (rc = kvc_open(&o, &c)) || (rc = kvc_mkdir_p(c, "/bench", 0755))) {
		fprintf(stderr, "client: %s\n", kvp_strerror(rc));
		goto out;
	}
	kvc_set_read_timeout(c, 500);
	double t0 = now_s();
	for (int64_t i = 0; i < b.files; i++) {
		char p[64];
		snprintf(p, sizeof(p), "/bench/f%" PRId64, i);
		fill(buf, b.size, (uint64_t)i);
		if ((rc = kvc_put(c, p, buf, b.size, 1))) {
			fprintf(stderr, "write %s: %s\n", p, kvp_strerror(rc));
			goto out;
		}
	}
	double wr = (double)b.size * (double)b.files / 1048576.0 / (now_s() - t0);
	double rd = read_all(c, &b, buf);
	if (rd < 0)
		goto out;
	uint64_t sdone = 0, sfailed = 0, sbytes = 0;
	int64_t sns = 0;
	if ((rc = run_job(c, KVP_MAINT_SCRUB, &sdone, &sfailed, &sbytes, &sns)) || sfailed) {
		fprintf(stderr, "scrub: %s, %" PRIu64 " failed\n", kvp_strerror(rc), sfailed);
		goto out;
	}
	double scr = (double)sbytes / 1048576.0 / ((double)sns / 1e9);

	kvh_node_kill(&cl, 0, SIGKILL);
	if ((rc = kvh_wait_nodes_up(&cl, (int)b.nodes - 1, 20000))) {
		fprintf(stderr, "node down: %s\n", kvp_strerror(rc));
		goto out;
	}
	uint64_t done = 0, failed = 0, bytes = 0;
	int64_t ns = 0;
	if ((rc = run_job(c, KVP_MAINT_REPAIR, &done, &failed, &bytes, &ns))) {
		fprintf(stderr, "repair: %s\n", kvp_strerror(rc));
		goto out;
	}
	double rep = (double)bytes / 1048576.0 / ((double)ns / 1e9);
	kvh_node_kill(&cl, 1, SIGKILL);
	if ((rc = kvh_wait_nodes_up(&cl, (int)b.nodes - 2, 20000)))
		goto out;
	double rd2 = read_all(c, &b, buf);
	if (rd2 < 0 || failed)
		goto out;
	char la[128] = "?";
	FILE *f = fopen("/proc/loadavg", "r");
	if (f) {
		if (!fgets(la, sizeof(la), f))
			la[0] = 0;
		la[strcspn(la, "\n")] = 0;
		fclose(f);
	}
	printf("cluster: %" PRId64 " nodes, k=%" PRId64 " m=%" PRId64 ", %" PRId64
	       " files of %.1f MiB (load %s)\n",
	       b.nodes, b.k, b.m, b.files, (double)b.size / 1048576.0, la);
	printf("write        %8.1f MiB/s (file bytes)\n", wr);
	printf("read         %8.1f MiB/s (file bytes, healthy)\n", rd);
	printf("scrub        %8.1f MiB/s of chunks checked: %" PRIu64
	       " chunks, %.1f MiB in %.2f s\n",
	       scr, sdone, (double)sbytes / 1048576.0, (double)sns / 1e9);
	printf("scrub/read   %8.2f\n", scr / rd);
	printf("repair       %8.1f MiB/s of chunks rebuilt: %" PRIu64
	       " chunks, %.1f MiB in %.2f s\n",
	       rep, done, (double)bytes / 1048576.0, (double)ns / 1e9);
	printf("repair/read  %8.2f\n", rep / rd);
	printf("read after a second node loss: %.1f MiB/s, every file byte-exact\n", rd2);
	ret = 0;
out:
	kvc_close(c);
	free(buf);
	kvh_cluster_stop(&cl);
	return ret;
}
