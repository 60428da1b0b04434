/* kvfs-node-bench: chunk PUT/GET throughput of a real kvfs-node over loopback, against a
 * baseline measured in the same run on the same filesystem: the same chunks written and read
 * back as files by one thread with plain syscalls (open/write/close/rename, open/read/close)
 * and the same CRC32C work. The ratio says what the node (TCP, protocol, io_uring, CRCs,
 * threads) delivers relative to the filesystem itself. Reads come from the page cache in both
 * unless --direct-read runs the node with O_DIRECT reads.
 *
 *   kvfs-node-bench [--chunk 1M] [--count 256] [--depth 32] [--rounds 3] [--node PATH]
 *                   [--dir DIR] [--io-threads 2] [--direct-read]
 */
#define KVFS_LOG_TAG "node-bench"
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <malloc.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cfg.h"
#include "kvch.h"
#include "kvec.h"
#include "kvp.h"

struct conf {
	uint64_t chunk;
	int64_t count, depth, io_threads, rounds;
	int direct_read;
	char node[CFG_STR_MAX], dir[CFG_STR_MAX];
};

static const struct cfg_opt opts[] = {
    {"chunk", CFG_SIZE, offsetof(struct conf, chunk), 1, 16 << 20, "1M", "chunk size"},
    {"count", CFG_INT, offsetof(struct conf, count), 1, 1 << 20, "256", "chunks per phase"},
    {"depth", CFG_INT, offsetof(struct conf, depth), 1, 4096, "32", "requests in flight"},
    {"rounds", CFG_INT, offsetof(struct conf, rounds), 1, 100, "3",
     "interleaved rounds (baseline, node, baseline, ...); times are summed"},
    {"io-threads", CFG_INT, offsetof(struct conf, io_threads), 1, 64, "2",
     "the node's --io-threads"},
    {"direct-read", CFG_BOOL, offsetof(struct conf, direct_read), 0, 0, "false",
     "run the node with --direct-read (its GETs then come from the disk, not the cache)"},
    {"node", CFG_STR, offsetof(struct conf, node), 0, 0, NULL,
     "kvfs-node binary (default: ../bin/kvfs-node beside this program)"},
    {"dir", CFG_STR, offsetof(struct conf, dir), 0, 0, "/tmp",
     "where to make the scratch directory (same filesystem for both)"},
    CFG_END,
};

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int die(const char *what)
{
	fprintf(stderr, "kvfs-node-bench: %s\n", what);
	return 1;
}

/* Baseline: what the node does per chunk, minus the node. */
static int base_put(const char *dir, uint64_t i, const uint8_t *d, size_t n)
{
	char tmp[600], fin[600];
	uint8_t hdr[64] = {0};
	uint32_t crc = kvec_crc32c(0, d, n);
	memcpy(hdr, &crc, 4);
	snprintf(tmp, sizeof(tmp), "%s/t%" PRIu64, dir, i);
	snprintf(fin, sizeof(fin), "%s/c%" PRIu64, dir, i);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
	if (fd < 0)
		return -errno;
	int ok = write(fd, hdr, 64) == 64 && write(fd, d, n) == (ssize_t)n;
	close(fd);
	return ok && rename(tmp, fin) == 0 ? 0 : -EIO;
}

static int base_get(const char *dir, uint64_t i, uint8_t *buf, size_t n)
{
	char fin[600];
	snprintf(fin, sizeof(fin), "%s/c%" PRIu64, dir, i);
	int fd = open(fin, O_RDONLY);
	if (fd < 0)
		return -errno;
	ssize_t r = read(fd, buf, 64 + n);
	close(fd);
	uint32_t crc;
	memcpy(&crc, buf, 4);
	return r == (ssize_t)(64 + n) && kvec_crc32c(0, buf + 64, n) == crc ? 0 : -EIO;
}

static int node_phase(struct kvp_client *c, int put, uint64_t base, const struct conf *cf,
		      const uint8_t *d, uint32_t crc)
{
	struct kvp_call **calls = calloc((size_t)cf->depth, sizeof(*calls));
	int rc = 0;
	int64_t sent = 0, done = 0;
	while (done < cf->count && !rc) {
		while (sent < cf->count && sent - done < cf->depth) {
			uint8_t h[KVCH_REQ_MAX];
			uint64_t id = base + (uint64_t)sent;
			size_t hl = put ? kvch_put_req(h, id, crc, (uint32_t)cf->chunk)
					: kvch_get_req(h, id, 0, KVCH_TO_END);
			rc = kvp_call_start(c, put ? KVP_OP_PUT : KVP_OP_GET, h, hl, put ? d : NULL,
					    put ? cf->chunk : 0, &calls[sent % cf->depth]);
			if (rc)
				break;
			sent++;
		}
		if (rc)
			break;
		uint8_t *b = NULL;
		uint32_t bl = 0;
		rc = kvp_call_wait(calls[done % cf->depth], 30000, &b, &bl);
		if (!rc && !put && bl != 8 + cf->chunk)
			rc = -EIO;
		free(b);
		done++;
	}
	free(calls);
	return rc;
}

int main(int argc, char **argv)
{
	struct conf cf;
	int npos = 0;
	int rc = cfg_parse(opts, &cf, argc, argv, "", &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	signal(SIGPIPE, SIG_IGN);
	/* kvp_client mallocs every response body; without this each 16 MiB GET would be a fresh
	 * mmap whose 4096 pages all fault in, and the bench would measure that, not the node. */
	mallopt(M_MMAP_THRESHOLD, 64 << 20);
	mallopt(M_TRIM_THRESHOLD, 256 << 20);
	char bin[CFG_STR_MAX + 64];
	if (cf.node[0]) {
		snprintf(bin, sizeof(bin), "%s", cf.node);
	} else {
		char self[CFG_STR_MAX];
		snprintf(self, sizeof(self), "%s", argv[0]);
		snprintf(bin, sizeof(bin), "%s/../bin/kvfs-node", dirname(self));
	}
	char root[CFG_STR_MAX + 32], bdir[CFG_STR_MAX + 64], ndir[CFG_STR_MAX + 64],
	    sec[CFG_STR_MAX + 64], addrf[CFG_STR_MAX + 64];
	snprintf(root, sizeof(root), "%s/kvfs-node-bench-XXXXXX", cf.dir);
	if (!mkdtemp(root))
		return die("cannot make a scratch directory");
	snprintf(bdir, sizeof(bdir), "%s/base", root);
	snprintf(ndir, sizeof(ndir), "%s/node", root);
	snprintf(sec, sizeof(sec), "%s/secret", root);
	snprintf(addrf, sizeof(addrf), "%s/addr", root);
	mkdir(bdir, 0755);
	FILE *f = fopen(sec, "w");
	if (!f)
		return die("cannot write the secret");
	fprintf(f, "node-bench-secret-0123456789\n");
	fclose(f);

	size_t n = cf.chunk;
	uint8_t *d = malloc(n), *buf = malloc(n + 64);
	for (size_t i = 0; i < n; i++)
		d[i] = (uint8_t)(i * 131 + 7);
	uint32_t crc = kvec_crc32c(0, d, n);
	double mb = (double)n * (double)cf.count * (double)cf.rounds / 1e6;

	double t0;
	char depth_s[32];
	snprintf(depth_s, sizeof(depth_s), "%" PRId64, cf.io_threads);
	pid_t pid = fork();
	if (pid == 0) {
		execl(bin, bin, "--dir", ndir, "--secret-file", sec, "--addr-file", addrf,
		      "--capacity", "1T", "--io-threads", depth_s, "--log-level", "1",
		      cf.direct_read ? "--direct-read=true" : "--direct-read=false", (char *)NULL);
		_exit(127);
	}
	char addr[KVP_ADDR_MAX] = "";
	for (t0 = now(); now() - t0 < 10 && !addr[0]; usleep(10000)) {
		f = fopen(addrf, "r");
		if (f) {
			if (!fgets(addr, sizeof(addr), f))
				addr[0] = 0;
			fclose(f);
			addr[strcspn(addr, "\n")] = 0;
		}
	}
	struct kvp_secret s;
	struct kvp_client *c = NULL;
	if (!addr[0] || kvp_secret_load(sec, &s) || kvp_client_open(addr, &s, 5000, &c)) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		return die("cannot start or reach kvfs-node (see --node)");
	}
	double base_w = 0, base_r = 0, node_w = 0, node_r = 0;
	for (int64_t r = 0; r < cf.rounds && !rc; r++) {
		uint64_t first = (uint64_t)(r * cf.count);
		t0 = now();
		for (int64_t i = 0; i < cf.count && !rc; i++)
			rc = base_put(bdir, first + (uint64_t)i, d, n);
		base_w += now() - t0;
		t0 = now();
		for (int64_t i = 0; i < cf.count && !rc; i++)
			rc = base_get(bdir, first + (uint64_t)i, buf, n);
		base_r += now() - t0;
		if (rc) {
			fprintf(stderr, "kvfs-node-bench: baseline file I/O failed\n");
			break;
		}
		t0 = now();
		rc = node_phase(c, 1, first + 1, &cf, d, crc);
		node_w += now() - t0;
		t0 = now();
		if (!rc)
			rc = node_phase(c, 0, first + 1, &cf, d, crc);
		node_r += now() - t0;
	}
	struct conf one = cf;
	one.depth = 1;
	one.count = cf.count < 64 ? cf.count : 64;
	t0 = now();
	if (!rc)
		rc = node_phase(c, 0, 1, &one, d, crc);
	double lat = (now() - t0) / (double)one.count;
	double blat = base_r / (double)(cf.count * cf.rounds);
	kvp_client_close(c);
	kill(pid, SIGTERM);
	int st = 0;
	waitpid(pid, &st, 0);
	char cmd[CFG_STR_MAX + 64];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd) != 0)
		fprintf(stderr, "kvfs-node-bench: could not remove %s\n", root);
	if (rc)
		return die(kvp_strerror(rc));

	printf("chunk %" PRIu64 " B x %" PRId64 " x %" PRId64 " rounds, depth %" PRId64
	       ", node io-threads %" PRId64 "\n",
	       cf.chunk, cf.count, cf.rounds, cf.depth, cf.io_threads);
	/* Other work on the machine skews both sides alike (interleaved rounds) but not the
	 * latency line; say how busy it was. */
	char load[64] = "?";
	f = fopen("/proc/loadavg", "r");
	if (f) {
		if (!fgets(load, sizeof(load), f))
			snprintf(load, sizeof(load), "?");
		fclose(f);
		load[strcspn(load, "\n")] = 0;
	}
	printf("load average at the end: %s\n", load);
	printf("%-6s %14s %14s %8s\n", "op", "baseline MB/s", "node MB/s", "ratio");
	printf("%-6s %14.0f %14.0f %8.2f\n", "put", mb / base_w, mb / node_w, base_w / node_w);
	printf("%-6s %14.0f %14.0f %8.2f\n", "get", mb / base_r, mb / node_r, base_r / node_r);
	printf("get latency at depth 1: %.0f us (baseline %.0f us per chunk)\n", lat * 1e6,
	       blat * 1e6);
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : die("kvfs-node did not exit cleanly");
}
