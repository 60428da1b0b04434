/* kvfs-store-bench — the distributed store through libkvfs against plain files in one local
 * directory on the same disk, in one run.
 *
 * Starts a local cluster with tools/kvfs-cluster.sh (meta + N nodes, 10+1 by default) under
 * --work DIR (or attaches to one with --cluster), then:
 *   store write  N files of --size through kvc_create/kvc_write/kvc_commit, --threads at a time
 *   store read   the same files through kvc_file_open/kvc_pread, checked byte for byte
 *   raw write    the same bytes as files in WORK/raw (open/write/close)
 *   raw read     read back with read(2), checked the same way
 * Writes go to the page cache on both sides (the nodes' default: no fsync per chunk); every
 * phase starts after a sync(), so none pays for the previous one's writeback. Reads
 * are cold on both sides: before each read phase every file involved (raw files, the nodes'
 * chunk files) is fsynced and dropped from the page cache with posix_fadvise(DONTNEED).
 * Prints files/s and MiB/s (2^20) per phase and store/raw ratios.
 *
 * --degraded (with a cluster it started): then writes --files more files healthy (the baseline,
 * right before), SIGKILLs the last node and writes --files more at once (meta does not know
 * yet: the client writes around the node), again once meta has marked it down (meta places
 * the other nodes), reads both sets back byte for byte, and prints each degraded write rate
 * against the baseline.
 *
 * --breakdown: where the time of one block goes. Only store write then cold store read of
 * --files files (use --threads 1: one block at a time), with libkvfs's stage histograms
 * (kvc_set_metrics) and, on a cluster it started (with KVFS_METRICS=1), the nodes' request and
 * disk histograms: prints each stage's calls and milliseconds per file. */
#define KVFS_LOG_TAG "store-bench"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cfg.h"
#include "kvc.h"
#include "log.h"
#include "metrics.h"

struct conf {
	int64_t files, threads, nodes;
	uint64_t size;
	char work[CFG_STR_MAX];
	char cluster[CFG_STR_MAX];
	char script[CFG_STR_MAX];
	char node_args[CFG_STR_MAX];
	int cold, keep, degraded, breakdown;
};

#define F(x) offsetof(struct conf, x)
static const struct cfg_opt opts[] = {
    {"files", CFG_INT, F(files), 1, 1000000, "2000", "number of files"},
    {"size", CFG_SIZE, F(size), 0, 1ull << 30, "2M", "bytes per file"},
    {"threads", CFG_INT, F(threads), 1, 64, "4", "files in flight (one thread each)"},
    {"nodes", CFG_INT, F(nodes), 1, 64, "11", "storage nodes to start"},
    {"work", CFG_STR, F(work), 0, 0, "/var/tmp/kvfs-store-bench",
     "work dir: cluster state and the raw files (one disk)"},
    {"cluster", CFG_STR, F(cluster), 0, 0, NULL, "attach to this running cluster dir instead"},
    {"script", CFG_STR, F(script), 0, 0, NULL, "path of kvfs-cluster.sh (default: found)"},
    {"node-args", CFG_STR, F(node_args), 0, 0, NULL, "extra kvfs-node flags"},
    {"cold", CFG_BOOL, F(cold), 0, 0, "true", "drop the files from the page cache before reads"},
    {"keep", CFG_BOOL, F(keep), 0, 0, "false", "leave the cluster running and files in place"},
    {"degraded", CFG_BOOL, F(degraded), 0, 0, "false",
     "then kill one node and measure writes with it down (needs a cluster it started)"},
    {"breakdown", CFG_BOOL, F(breakdown), 0, 0, "false",
     "only store write and cold read, with the time per stage of one file (use --threads 1)"},
    CFG_END};

#define NPAT 8

struct bench {
	const struct conf *cf;
	struct kvc *c;
	uint64_t dir_ino;
	char raw[PATH_MAX];
	uint8_t *pat[NPAT]; /* file i holds pat[i % NPAT] with i stamped in its first 8 bytes */
	atomic_long next;
	atomic_int errors;
	int phase;   /* 0 store write, 1 store read, 2 raw write, 3 raw read */
	char prefix; /* store file names: 'f' healthy, 'd' and 'e' with a node down */
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void expected(const struct bench *b, long i, uint8_t *out)
{
	memcpy(out, b->pat[i % NPAT], b->cf->size);
	if (b->cf->size >= 8)
		memcpy(out, &i, 8);
}

static int one(struct bench *b, long i, uint8_t *buf, uint8_t *want)
{
	size_t sz = b->cf->size;
	char name[32], path[PATH_MAX + 64];
	snprintf(name, sizeof(name), "%c%06ld", b->prefix, i);
	snprintf(path, sizeof(path), "%s/%s", b->raw, name);
	int rc = 0;
	switch (b->phase) {
	case 0: {
		expected(b, i, buf);
		struct kvc_writer *w;
		if ((rc = kvc_create(b->c, b->dir_ino, name, 0644, 1, &w)))
			break;
		ssize_t n = kvc_write(w, buf, sz, 0);
		if (n < 0) {
			kvc_abort(w);
			rc = (int)n;
			break;
		}
		rc = kvc_commit(w, NULL);
		break;
	}
	case 1: {
		struct kvp_attr a;
		struct kvc_file *f;
		if ((rc = kvc_lookup(b->c, b->dir_ino, name, &a)) ||
		    (rc = kvc_file_open(b->c, a.ino, &f)))
			break;
		ssize_t n = kvc_pread(f, buf, sz, 0);
		kvc_file_close(f);
		expected(b, i, want);
		if (n != (ssize_t)sz || memcmp(buf, want, sz))
			rc = n < 0 ? (int)n : -EILSEQ;
		break;
	}
	case 2: {
		expected(b, i, buf);
		int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd < 0 || write(fd, buf, sz) != (ssize_t)sz)
			rc = -errno;
		if (fd >= 0 && close(fd) && !rc)
			rc = -errno;
		break;
	}
	case 3: {
		int fd = open(path, O_RDONLY);
		ssize_t n = fd < 0 ? -1 : read(fd, buf, sz);
		if (fd < 0 || n < 0)
			rc = -errno;
		if (fd >= 0)
			close(fd);
		expected(b, i, want);
		if (!rc && (n != (ssize_t)sz || memcmp(buf, want, sz)))
			rc = -EILSEQ;
		break;
	}
	}
	if (rc && atomic_fetch_add(&b->errors, 1) < 5)
		fprintf(stderr, "store-bench: phase %d file %ld: %s\n", b->phase, i,
			kvp_strerror(rc));
	return rc;
}

static void *worker(void *arg)
{
	struct bench *b = arg;
	uint8_t *buf = malloc(b->cf->size + 1), *want = malloc(b->cf->size + 1);
	for (long i; buf && want && (i = atomic_fetch_add(&b->next, 1)) < b->cf->files;)
		one(b, i, buf, want);
	free(buf);
	free(want);
	return NULL;
}

static double run_phase(struct bench *b, int phase)
{
	pthread_t th[64];
	sync(); /* no phase pays for the previous one's writeback */
	b->phase = phase;
	atomic_store(&b->next, 0);
	double t0 = now_s();
	for (int t = 0; t < b->cf->threads; t++)
		pthread_create(&th[t], NULL, worker, b);
	for (int t = 0; t < b->cf->threads; t++)
		pthread_join(th[t], NULL);
	return now_s() - t0;
}

/* fsync + POSIX_FADV_DONTNEED every regular file under dir, so the next read comes from disk. */
static void drop_tree(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		char p[PATH_MAX];
		snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
		struct stat st;
		if (lstat(p, &st))
			continue;
		if (S_ISDIR(st.st_mode)) {
			drop_tree(p);
		} else if (S_ISREG(st.st_mode)) {
			int fd = open(p, O_RDONLY);
			if (fd >= 0) {
				fdatasync(fd);
				posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
				close(fd);
			}
		}
	}
	closedir(d);
}

static int find_script(const struct conf *cf, char *out, size_t cap)
{
	if (cf->script[0]) {
		snprintf(out, cap, "%s", cf->script);
		return access(out, X_OK) ? -ENOENT : 0;
	}
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0)
		return -ENOENT;
	exe[n] = 0;
	*strrchr(exe, '/') = 0; /* <build>/tools */
	const char *src = getenv("KVFS_SOURCE_DIR");
	int w = src ? snprintf(out, cap, "%s/tools/kvfs-cluster.sh", src)
		    : snprintf(out, cap, "%s/../../tools/kvfs-cluster.sh", exe);
	if (w < 0 || (size_t)w >= cap)
		return -ENAMETOOLONG;
	return access(out, X_OK) ? -ENOENT : 0;
}

static int read_line(const char *path, char *out, size_t cap)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return -errno;
	int ok = fgets(out, (int)cap, f) != NULL;
	fclose(f);
	out[strcspn(out, "\r\n")] = 0;
	return ok ? 0 : -EINVAL;
}

/* The meta list of a launcher's meta.addr (one address a line: every replica) as "A,B,C". */
static int read_meta_list(const char *path, char *out, size_t cap)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return -errno;
	char line[256];
	size_t n = 0;
	out[0] = 0;
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\r\n")] = 0;
		if (!line[0])
			continue;
		int w = snprintf(out + n, cap - n, "%s%s", n ? "," : "", line);
		if (w < 0 || (size_t)w >= cap - n) {
			fclose(f);
			return -ENAMETOOLONG;
		}
		n += (size_t)w;
	}
	fclose(f);
	return n ? 0 : -EINVAL;
}

static void report(const char *name, double secs, const struct conf *cf, double *mibs)
{
	double mib = (double)cf->files * (double)cf->size / 1048576.0;
	*mibs = mib / secs;
	printf("%-26s %8.2f s %10.1f files/s %10.1f MiB/s\n", name, secs, (double)cf->files / secs,
	       *mibs);
}

/* SIGKILLs the last node kvfs-cluster.sh recorded in DIR/pids. */
static int kill_last_node(const char *cdir)
{
	char p[PATH_MAX + 8], name[64];
	snprintf(p, sizeof(p), "%s/pids", cdir);
	FILE *f = fopen(p, "r");
	if (!f)
		return -errno;
	long pid, last = 0;
	while (fscanf(f, "%63s %ld", name, &pid) == 2)
		if (!strncmp(name, "node", 4))
			last = pid;
	fclose(f);
	if (last <= 0)
		return -ENOENT;
	return kill((pid_t)last, SIGKILL) ? -errno : 0;
}

/* The degraded phases: a healthy write again (the baseline, on disks as full as the next
 * phases'), writes with a node just killed, then with meta knowing, both read back. */
static int degraded_phases(struct bench *b, const char *cdir)
{
	const struct conf *cf = b->cf;
	struct kvc_statfs st;
	double th, healthy;
	/* Each write phase starts with no dirty pages left from the one before (sync): the nodes'
	 * disks are one VM disk here, and the kernel's writeback of the previous 1.2 GiB phase
	 * would otherwise throttle whichever phase came fourth. */
	b->prefix = 'h';
	sync();
	th = run_phase(b, 0);
	report("write, healthy (baseline)", th, cf, &healthy);
	int rc = kvc_statfs(b->c, &st);
	uint32_t up0 = st.nodes_up;
	sync(); /* before the kill: the next phase must start within meta's --node-timeout */
	if (!rc)
		rc = kill_last_node(cdir);
	if (rc) {
		fprintf(stderr, "store-bench: cannot kill a node: %s\n", kvp_strerror(rc));
		return rc;
	}
	double t[3], mibs[3];
	b->prefix = 'd';
	t[0] = run_phase(b, 0);
	kvc_statfs(b->c, &st);
	uint32_t up_after = st.nodes_up;
	double w0 = now_s();
	while (st.nodes_up >= up0 && now_s() - w0 < 60) { /* meta's --node-timeout */
		usleep(100000);
		kvc_statfs(b->c, &st);
	}
	b->prefix = 'e';
	sync();
	t[1] = run_phase(b, 0);
	b->prefix = 'd';
	double r = run_phase(b, 1);
	b->prefix = 'e';
	r += run_phase(b, 1);
	report("write, 1 node just killed", t[0], cf, &mibs[0]);
	report("write, 1 node marked down", t[1], cf, &mibs[1]);
	t[2] = r / 2;
	report("read of both (mean)", t[2], cf, &mibs[2]);
	printf(
	    "nodes up per meta: %u before, %u after the first degraded phase, %u in the second\n",
	    up0, up_after, st.nodes_up);
	printf("ratio degraded/healthy write: node just killed %.2f, node marked down %.2f\n",
	       mibs[0] / healthy, mibs[1] / healthy);
	return 0;
}

/* ---- --breakdown: the stage histograms' sums and counts, per file ---- */

/* Adds to sum[i] / cnt[i] the _sum and _count of every series of family `fam` (a histogram)
 * in the exposition text whose labels equal lab[i] ("op=\"get\""). */
static void hist_add(const char *text, const char *fam, const char *const lab[], int n, double *sum,
		     double *cnt)
{
	size_t fl = strlen(fam);
	for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
		if (strncmp(l, fam, fl))
			continue;
		const char *p = l + fl;
		int is_sum = !strncmp(p, "_sum{", 5), is_cnt = !strncmp(p, "_count{", 7);
		if (!is_sum && !is_cnt)
			continue;
		p = strchr(p, '{') + 1;
		const char *e = strchr(p, '}');
		if (!e)
			continue;
		for (int i = 0; i < n; i++) {
			if (strlen(lab[i]) != (size_t)(e - p) ||
			    strncmp(p, lab[i], (size_t)(e - p)))
				continue;
			double v = strtod(e + 1, NULL);
			if (is_sum)
				sum[i] += v;
			else
				cnt[i] += v;
		}
	}
}

/* GET http://addr/metrics (HTTP/1.0, loopback): the body, malloc'd, or NULL. */
static char *http_metrics(const char *addr)
{
	char host[64];
	const char *colon = strrchr(addr, ':');
	if (!colon || (size_t)(colon - addr) >= sizeof(host))
		return NULL;
	memcpy(host, addr, (size_t)(colon - addr));
	host[colon - addr] = 0;
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_port = htons((uint16_t)atoi(colon + 1))};
	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
		return NULL;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return NULL;
	char *buf = NULL;
	size_t len = 0, cap = 0;
	static const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
	    write(fd, req, sizeof(req) - 1) == (ssize_t)sizeof(req) - 1) {
		for (;;) {
			if (len + 4096 + 1 > cap) {
				char *nb = realloc(buf, cap = cap * 2 + 8192);
				if (!nb)
					break;
				buf = nb;
			}
			ssize_t n = read(fd, buf + len, cap - len - 1);
			if (n <= 0)
				break;
			len += (size_t)n;
		}
	}
	close(fd);
	if (buf)
		buf[len] = 0;
	return buf;
}

static void row(const char *what, double sum, double cnt, long files)
{
	printf("  %-44s %6.2f calls  %8.3f ms/file  %8.3f ms/call\n", what, cnt / (double)files,
	       sum * 1e3 / (double)files, cnt ? sum * 1e3 / cnt : 0.0);
}

/* Prints the client's stages from r and, where nodes serve metrics, the nodes' disk and request
 * time; before[] holds the same figures taken before the phase (subtracted). */
#define BD_N 16
static const char *const bd_lab[BD_N] = {
    "stage=\"commit\"",	  "op=\"alloc\"",	"stage=\"encode\"", "stage=\"crc\"",
    "stage=\"put_send\"", "stage=\"put_wait\"", "op=\"commit\"",    "op=\"lookup\"",
    "stage=\"open\"",	  "op=\"layout\"",	"stage=\"pread\"",  "stage=\"stripe_get\"",
    "op=\"put\"",	  "op=\"get\"",		"op=\"put\"",	    "op=\"get\""};
static void bd_take(struct met_reg *r, const char *cdir, int nodes, double *sum, double *cnt)
{
	memset(sum, 0, BD_N * sizeof(*sum));
	memset(cnt, 0, BD_N * sizeof(*cnt));
	char *text = NULL;
	size_t len;
	if (met_render(r, &text, &len) == 0) {
		hist_add(text, "kvfs_client_stage_duration_seconds", bd_lab, 12, sum, cnt);
		hist_add(text, "kvfs_client_meta_request_duration_seconds", bd_lab, 12, sum, cnt);
		free(text);
	}
	for (int i = 0; i < nodes; i++) {
		char p[PATH_MAX + 32], addr[128];
		snprintf(p, sizeof(p), "%s/node%d.metrics", cdir, i);
		if (read_line(p, addr, sizeof(addr)))
			continue;
		char *t = http_metrics(addr);
		if (!t)
			continue;
		hist_add(t, "kvfs_node_request_duration_seconds", bd_lab + 12, 2, sum + 12,
			 cnt + 12);
		hist_add(t, "kvfs_node_disk_duration_seconds", bd_lab + 14, 2, sum + 14, cnt + 14);
		free(t);
	}
}

static void bd_print(const double *s0, const double *c0, const double *s1, const double *c1,
		     const int *rows, int nrows, long files)
{
	static const char *const what[BD_N] = {"commit (whole kvc_commit)",
					       "  meta ALLOC round trip",
					       "  EC encode (per stripe)",
					       "  CRC32C of the chunks (per stripe)",
					       "  chunk PUTs sent (per stripe)",
					       "  chunk PUT acks waited for (per stripe)",
					       "  meta COMMIT round trip",
					       "meta LOOKUP round trip",
					       "open (kvc_file_open)",
					       "  meta LAYOUT round trip",
					       "pread (kvc_pread of the whole file)",
					       "  stripe GETs, in parallel (per stripe)",
					       "node PUT request (all nodes)",
					       "node GET request (all nodes)",
					       "  node PUT disk (ring queue + io_uring)",
					       "  node GET disk (ring queue + io_uring)"};
	for (int j = 0; j < nrows; j++)
		row(what[rows[j]], s1[rows[j]] - s0[rows[j]], c1[rows[j]] - c0[rows[j]], files);
}

/* --breakdown: store write, then (cold) store read, each between two takes of the histograms. */
static void breakdown(struct bench *b, struct met_reg *reg, const char *cdir)
{
	const struct conf *cf = b->cf;
	double s0[BD_N], c0[BD_N], s1[BD_N], c1[BD_N], s2[BD_N], c2[BD_N], t[2], mibs[2];
	bd_take(reg, cdir, (int)cf->nodes, s0, c0);
	t[0] = run_phase(b, 0);
	bd_take(reg, cdir, (int)cf->nodes, s1, c1);
	if (cf->cold)
		drop_tree(cdir);
	t[1] = run_phase(b, 1);
	bd_take(reg, cdir, (int)cf->nodes, s2, c2);
	report("store write", t[0], cf, &mibs[0]);
	report("store read", t[1], cf, &mibs[1]);
	static const int wrows[] = {0, 1, 2, 3, 4, 5, 6, 12, 14};
	static const int rrows[] = {7, 8, 9, 10, 11, 13, 15};
	printf("write, per file (%lld threads): %.3f ms wall\n", (long long)cf->threads,
	       t[0] * 1e3 * (double)cf->threads / (double)cf->files);
	bd_print(s0, c0, s1, c1, wrows, 9, (long)cf->files);
	printf("read%s, per file: %.3f ms wall (LOOKUP + open + pread + close)\n",
	       cf->cold ? " (cold)" : "", t[1] * 1e3 * (double)cf->threads / (double)cf->files);
	bd_print(s1, c1, s2, c2, rrows, 7, (long)cf->files);
}

int main(int argc, char **argv)
{
	struct conf cf;
	int npos;
	int rc = cfg_parse(opts, &cf, argc, argv, "", &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	char cdir[PATH_MAX], script[PATH_MAX], cmd[3 * PATH_MAX];
	int started = 0;
	if (mkdir(cf.work, 0755) && errno != EEXIST) {
		fprintf(stderr, "store-bench: cannot create %s: %s\n", cf.work, strerror(errno));
		return 1;
	}
	if (cf.cluster[0]) {
		snprintf(cdir, sizeof(cdir), "%s", cf.cluster);
	} else {
		snprintf(cdir, sizeof(cdir), "%s/cluster", cf.work);
		if (find_script(&cf, script, sizeof(script))) {
			fprintf(stderr, "store-bench: kvfs-cluster.sh not found (use --script)\n");
			return 1;
		}
		char exe[PATH_MAX];
		ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
		exe[n > 0 ? n : 0] = 0;
		*strrchr(exe, '/') = 0;
		if (cf.breakdown)
			setenv("KVFS_METRICS", "1", 1); /* the nodes' histograms */
		/* One unreplicated meta unless asked: the recorded figures were taken so. */
		setenv("KVFS_META_REPLICAS", "1", 0);
		int w = snprintf(cmd, sizeof(cmd),
				 "rm -rf '%s' && KVFS_BIN='%s/../bin' '%s' start '%s' %d %s", cdir,
				 exe, script, cdir, (int)cf.nodes, cf.node_args);
		if (w < 0 || (size_t)w >= sizeof(cmd) || system(cmd) != 0) {
			fprintf(stderr, "store-bench: cluster start failed\n");
			return 1;
		}
		started = 1;
	}
	struct bench b = {.cf = &cf, .prefix = 'f'};
	char meta[1024], sp[PATH_MAX + 16];
	struct kvp_secret sec;
	snprintf(sp, sizeof(sp), "%s/meta.addr", cdir);
	rc = read_meta_list(sp, meta, sizeof(meta));
	snprintf(sp, sizeof(sp), "%s/secret", cdir);
	if (!rc)
		rc = kvp_secret_load(sp, &sec);
	struct kvc_opts o = {.meta_addr = meta, .secret = &sec, .timeout_ms = 30000};
	if (!rc)
		rc = kvc_open(&o, &b.c);
	struct met_reg *reg = NULL;
	if (!rc && cf.breakdown && !(rc = met_reg_create(&reg)))
		rc = kvc_set_metrics(b.c, reg);
	struct kvp_attr a;
	if (!rc) {
		rc = kvc_mkdir(b.c, KVP_ROOT_INO, "store-bench", 0755, &a);
		if (rc == -EEXIST)
			rc = kvc_lookup(b.c, KVP_ROOT_INO, "store-bench", &a);
		b.dir_ino = a.ino;
	}
	snprintf(b.raw, sizeof(b.raw), "%s/raw", cf.work);
	if (!rc && mkdir(b.raw, 0755) && errno != EEXIST)
		rc = -errno;
	for (int i = 0; i < NPAT && !rc; i++) {
		if (!(b.pat[i] = malloc(cf.size + 1)))
			rc = -ENOMEM;
		uint64_t x = 0x9E3779B97F4A7C15ull * (i + 1);
		for (size_t j = 0; b.pat[i] && j < cf.size; j++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			b.pat[i][j] = (uint8_t)x;
		}
	}
	if (rc) {
		fprintf(stderr, "store-bench: setup: %s\n", kvp_strerror(rc));
	} else {
		struct kvc_statfs st;
		kvc_statfs(b.c, &st);
		printf("store-bench: %lld files x %llu bytes, %lld threads, %u nodes, %d+%d, cold "
		       "reads %s, work %s\n",
		       (long long)cf.files, (unsigned long long)cf.size, (long long)cf.threads,
		       st.nodes, st.k, st.m, cf.cold ? "yes" : "no", cf.work);
		double t[4], mibs[4];
		if (cf.breakdown) {
			breakdown(&b, reg, cdir);
			goto done;
		}
		/* Interleaved: store write, raw write, then both reads, each after a cache drop. */
		t[0] = run_phase(&b, 0);
		t[2] = run_phase(&b, 2);
		if (cf.cold) {
			drop_tree(cdir);
			drop_tree(b.raw);
		}
		t[1] = run_phase(&b, 1);
		if (cf.cold)
			drop_tree(b.raw);
		t[3] = run_phase(&b, 3);
		report("store write", t[0], &cf, &mibs[0]);
		report("raw write", t[2], &cf, &mibs[2]);
		report("store read", t[1], &cf, &mibs[1]);
		report("raw read", t[3], &cf, &mibs[3]);
		printf("ratio store/raw: write %.2f, read %.2f\n", mibs[0] / mibs[2],
		       mibs[1] / mibs[3]);
		if (cf.degraded && started && degraded_phases(&b, cdir))
			atomic_fetch_add(&b.errors, 1);
	done:;
		struct kvc_stats ks;
		kvc_get_stats(b.c, &ks);
		printf("client: %llu files committed, %llu degraded stripes, %llu crc errors, "
		       "%llu chunks written around\n",
		       (unsigned long long)ks.files_committed,
		       (unsigned long long)ks.degraded_reads, (unsigned long long)ks.crc_errors,
		       (unsigned long long)ks.chunks_written_around);
		if (atomic_load(&b.errors)) {
			fprintf(stderr, "store-bench: %d errors\n", atomic_load(&b.errors));
			rc = -EIO;
		}
	}
	kvc_close(b.c);
	met_reg_destroy(reg);
	for (int i = 0; i < NPAT; i++)
		free(b.pat[i]);
	if (!cf.keep) {
		if (started) {
			int w =
			    snprintf(cmd, sizeof(cmd), "'%s' stop '%s' >/dev/null && rm -rf '%s'",
				     script, cdir, cdir);
			if (w < 0 || (size_t)w >= sizeof(cmd) || system(cmd) != 0)
				fprintf(stderr, "store-bench: stopping the cluster failed\n");
		}
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", b.raw);
		if (system(cmd) != 0)
			fprintf(stderr, "store-bench: cannot remove %s\n", b.raw);
	}
	return rc ? 1 : 0;
}
