/* kvfs-mount-bench: block files written then read, in one run, three ways over the same
 * cluster: through a kvfs mount (open/write/close, open/read/close), through libkvfs directly
 * (kvc_create/kvc_write/kvc_commit, kvc_lookup/kvc_file_open/kvc_pread), and as plain files
 * in a local directory. Reads are cold: the page cache is dropped before every read phase
 * (/proc/sys/vm/drop_caches; without permission, O_DIRECT is used on the mount and the local
 * directory instead, and the output says so). With --replace (the default) each way also
 * writes the same names a second time, timed apart: every file is then a replacement
 * (open(O_TRUNC) of an existing file on the mount, kvc_create over an existing name in the
 * library). Prints one line per phase and the ratios mount/library and replace/new.
 * tools/kvfs_mount_bench.sh starts the cluster and mount and runs it.
 *
 *   kvfs-mount-bench --meta ADDR --secret-file F --mnt DIR --local DIR
 *                    [--files 2000] [--size 2M] [--threads 4] [--replace false]
 *
 * With --dir, one phase over plain files in one directory (a mount or a local one; no cluster
 * needed), timing each file from open to close and printing MiB/s with the per-file p50, p99
 * and max: --op write (create, write whole, close), read (open, read whole, close; the caller
 * drops the page cache for a cold read) or unlink. Files are read and written in 1 MiB calls
 * whatever --size, so one large file works too. tools/kvfs-datapath-bench.sh runs it.
 *
 *   kvfs-mount-bench --dir DIR --op write|read|unlink [--files 2000] [--size 2M] [--threads 1]
 */
#define KVFS_LOG_TAG "bench"
#include "cfg.h"
#include "kvc.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct bopts {
	char meta[CFG_STR_MAX], secret_file[CFG_STR_MAX], mnt[CFG_STR_MAX], local[CFG_STR_MAX];
	char dir[CFG_STR_MAX], op[CFG_STR_MAX];
	int64_t files, threads, rounds;
	int populate, replace;
	uint64_t size;
};

static const struct cfg_opt opts[] = {
    {"meta", CFG_STR, offsetof(struct bopts, meta), 0, 0, NULL, "metadata server address"},
    {"secret-file", CFG_STR, offsetof(struct bopts, secret_file), 0, 0, NULL, "cluster secret"},
    {"mnt", CFG_STR, offsetof(struct bopts, mnt), 0, 0, NULL, "a kvfs mount of that cluster"},
    {"local", CFG_STR, offsetof(struct bopts, local), 0, 0, NULL, "a local directory"},
    {"files", CFG_INT, offsetof(struct bopts, files), 1, 1e7, "2000", "files per phase"},
    {"size", CFG_SIZE, offsetof(struct bopts, size), 1, 1ll << 40, "2M", "bytes per file"},
    {"threads", CFG_INT, offsetof(struct bopts, threads), 1, 256, "4", "parallel workers"},
    {"rounds", CFG_INT, offsetof(struct bopts, rounds), 1, 100, "2",
     "rounds (the order of the three ways rotates; the best round is reported)"},
    {"populate", CFG_BOOL, offsetof(struct bopts, populate), 0, 0, "false",
     "only create the files (library into /many, and in --local), for ls/du timing"},
    {"replace", CFG_BOOL, offsetof(struct bopts, replace), 0, 0, "true",
     "also time writing the same names again (replacements of existing files)"},
    {"dir", CFG_STR, offsetof(struct bopts, dir), 0, 0, NULL,
     "plain-file mode: one phase (--op) over the files in this directory"},
    {"op", CFG_STR, offsetof(struct bopts, op), 0, 0, "read",
     "plain-file mode: write, read or unlink"},
    CFG_END,
};

enum mode { M_MOUNT, M_LIB, M_LOCAL };
static const char *const mode_name[] = {"mount", "library", "local dir"};

struct job {
	const struct bopts *o;
	struct kvc *c;
	uint64_t parent; /* library: directory inode */
	enum mode mode;
	int write, direct; /* direct: O_DIRECT reads */
	int round, tid;
	int errors;
	uint8_t *buf;
};

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
	for (size_t i = 0; i + 8 <= n; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(p + i, &x, 8);
	}
}

static int do_file(struct job *j, int64_t i)
{
	const struct bopts *o = j->o;
	char name[64], path[CFG_STR_MAX + 80];
	snprintf(name, sizeof(name), "r%d-%06lld.kvb", j->round, (long long)i);
	size_t len = (size_t)o->size;
	if (j->write < 0) { /* cleanup */
		if (j->mode == M_LIB)
			return kvc_unlink(j->c, j->parent, name);
		snprintf(path, sizeof(path), "%s/%s", j->mode == M_MOUNT ? o->mnt : o->local, name);
		return unlink(path) == 0 ? 0 : -errno;
	}
	if (j->mode == M_LIB) {
		if (j->write) {
			struct kvc_writer *w;
			int rc = kvc_create(j->c, j->parent, name, 0644, 1, &w);
			if (rc)
				return rc;
			if (kvc_write(w, j->buf, len, 0) != (ssize_t)len) {
				kvc_abort(w);
				return -EIO;
			}
			return kvc_commit(w, NULL);
		}
		struct kvp_attr a;
		struct kvc_file *f;
		int rc = kvc_lookup(j->c, j->parent, name, &a);
		if (rc || (rc = kvc_file_open(j->c, a.ino, &f)))
			return rc;
		ssize_t n = kvc_pread(f, j->buf, len, 0);
		kvc_file_close(f);
		return n == (ssize_t)len ? 0 : -EIO;
	}
	snprintf(path, sizeof(path), "%s/%s", j->mode == M_MOUNT ? o->mnt : o->local, name);
	int fd = j->write ? open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644)
			  : open(path, O_RDONLY | (j->direct ? O_DIRECT : 0));
	if (fd < 0)
		return -errno;
	size_t off = 0;
	while (off < len) {
		ssize_t n = j->write ? write(fd, j->buf + off, len - off)
				     : read(fd, j->buf + off, len - off);
		if (n <= 0) {
			close(fd);
			return n < 0 ? -errno : -EIO;
		}
		off += (size_t)n;
	}
	return close(fd) == 0 ? 0 : -errno;
}

static void *worker(void *arg)
{
	struct job *j = arg;
	for (int64_t i = j->tid; i < j->o->files; i += j->o->threads)
		if (do_file(j, i) != 0)
			j->errors++;
	return NULL;
}

static int drop_caches(void)
{
	sync();
	FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
	if (!f)
		return -errno;
	fputs("3\n", f);
	return fclose(f) == 0 ? 0 : -errno;
}

/* Runs one phase; returns seconds (or -1 on errors). */
static double phase(const struct bopts *o, struct kvc *c, uint64_t parent, enum mode mode,
		    int write, int direct, int round)
{
	int nt = (int)o->threads;
	struct job *jobs = calloc((size_t)nt, sizeof(*jobs));
	pthread_t *th = calloc((size_t)nt, sizeof(*th));
	for (int t = 0; t < nt; t++) {
		jobs[t] = (struct job){.o = o,
				       .c = c,
				       .parent = parent,
				       .mode = mode,
				       .write = write,
				       .direct = direct,
				       .round = round,
				       .tid = t};
		if (posix_memalign((void **)&jobs[t].buf, 4096, (size_t)o->size))
			return -1;
		fill(jobs[t].buf, (size_t)o->size, (uint64_t)t + 1);
	}
	double t0 = now_s();
	for (int t = 0; t < nt; t++)
		pthread_create(&th[t], NULL, worker, &jobs[t]);
	int errors = 0;
	for (int t = 0; t < nt; t++) {
		pthread_join(th[t], NULL);
		errors += jobs[t].errors;
		free(jobs[t].buf);
	}
	double dt = now_s() - t0;
	free(jobs);
	free(th);
	if (errors) {
		fprintf(stderr, "bench: %s %s: %d files failed\n", mode_name[mode],
			write > 0   ? "write"
			: write < 0 ? "delete"
				    : "read",
			errors);
		return -1;
	}
	return dt;
}

static void report(const struct bopts *o, const char *what, double s)
{
	double mib = (double)o->files * (double)o->size / (1 << 20);
	printf("%-22s %8.2f s %9.1f files/s %9.1f MiB/s\n", what, s, (double)o->files / s, mib / s);
}

/* Plain-file mode (--dir): one phase, every file timed from open to close. */
struct pjob {
	const struct bopts *o;
	int op; /* 0 read, 1 write, 2 unlink */
	int tid, errors;
	double *lat; /* per file, seconds; shared, each thread fills its own indexes */
};

#define PLAIN_IO (1u << 20) /* bytes per read()/write() call */

static int plain_file(const struct pjob *j, int64_t i, uint8_t *buf)
{
	char path[CFG_STR_MAX + 32];
	snprintf(path, sizeof(path), "%s/f%06lld.kvb", j->o->dir, (long long)i);
	if (j->op == 2)
		return unlink(path) == 0 ? 0 : -errno;
	int fd = j->op ? open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644) : open(path, O_RDONLY);
	if (fd < 0)
		return -errno;
	uint64_t off = 0, len = j->o->size;
	while (off < len) {
		size_t want = len - off < PLAIN_IO ? (size_t)(len - off) : PLAIN_IO;
		ssize_t n = j->op ? write(fd, buf, want) : read(fd, buf, want);
		if (n <= 0) {
			int e = n < 0 ? -errno : -EIO;
			close(fd);
			return e;
		}
		off += (uint64_t)n;
	}
	return close(fd) == 0 ? 0 : -errno;
}

static void *plain_worker(void *arg)
{
	struct pjob *j = arg;
	uint8_t *buf;
	if (posix_memalign((void **)&buf, 4096, PLAIN_IO)) {
		j->errors++;
		return NULL;
	}
	fill(buf, PLAIN_IO, (uint64_t)j->tid + 1);
	for (int64_t i = j->tid; i < j->o->files; i += j->o->threads) {
		buf[0] = (uint8_t)i; /* each file's bytes differ a little */
		double t0 = now_s();
		if (plain_file(j, i, buf) != 0)
			j->errors++;
		j->lat[i] = now_s() - t0;
	}
	free(buf);
	return NULL;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static int plain_run(const struct bopts *o)
{
	static const char *const ops[] = {"read", "write", "unlink"};
	int op = -1;
	for (int k = 0; k < 3; k++)
		if (strcmp(o->op, ops[k]) == 0)
			op = k;
	if (op < 0) {
		fprintf(stderr, "kvfs-mount-bench: --op %s: write, read or unlink\n", o->op);
		return 2;
	}
	int nt = (int)o->threads;
	double *lat = calloc((size_t)o->files, sizeof(*lat));
	struct pjob *jobs = calloc((size_t)nt, sizeof(*jobs));
	pthread_t *th = calloc((size_t)nt, sizeof(*th));
	if (!lat || !jobs || !th)
		return 1;
	double t0 = now_s();
	for (int t = 0; t < nt; t++) {
		jobs[t] = (struct pjob){.o = o, .op = op, .tid = t, .lat = lat};
		pthread_create(&th[t], NULL, plain_worker, &jobs[t]);
	}
	int errors = 0;
	for (int t = 0; t < nt; t++) {
		pthread_join(th[t], NULL);
		errors += jobs[t].errors;
	}
	double dt = now_s() - t0;
	qsort(lat, (size_t)o->files, sizeof(*lat), cmp_double);
	size_t n = (size_t)o->files;
	double mib = (double)o->files * (double)o->size / (1 << 20);
	printf("%-6s %lld files x %llu B, %d threads: %.3f s %.1f MiB/s %.1f files/s "
	       "p50 %.2f ms p99 %.2f ms max %.2f ms errors %d\n",
	       ops[op], (long long)o->files, (unsigned long long)o->size, nt, dt,
	       op == 2 ? 0.0 : mib / dt, (double)n / dt, lat[n / 2] * 1e3, lat[n * 99 / 100] * 1e3,
	       lat[n - 1] * 1e3, errors);
	free(lat);
	free(jobs);
	free(th);
	return errors ? 1 : 0;
}

int main(int argc, char **argv)
{
	struct bopts o;
	int npos = 0, rc = cfg_parse(opts, &o, argc, argv, "", &npos);
	if (rc)
		return rc == 1 ? 0 : 2;
	if (o.dir[0])
		return plain_run(&o);
	if (!o.meta[0] || !o.secret_file[0] || !o.mnt[0] || !o.local[0]) {
		fprintf(stderr, "kvfs-mount-bench: --meta, --secret-file, --mnt, --local needed\n");
		return 2;
	}
	struct kvp_secret sec;
	if (kvp_secret_load(o.secret_file, &sec))
		return 1;
	struct kvc_opts ko = {.meta_addr = o.meta, .secret = &sec};
	struct kvc *c;
	if ((rc = kvc_open(&ko, &c))) {
		fprintf(stderr, "kvfs-mount-bench: meta %s: %s\n", o.meta, kvp_strerror(rc));
		return 1;
	}
	const char *libdir = o.populate ? "/many" : "/bench-lib";
	kvc_mkdir_p(c, libdir, 0755);
	struct kvp_attr da;
	if ((rc = kvc_resolve(c, libdir, &da))) {
		fprintf(stderr, "kvfs-mount-bench: %s: %s\n", libdir, kvp_strerror(rc));
		return 1;
	}
	if (o.populate) {
		double a = phase(&o, c, da.ino, M_LIB, 1, 0, 0);
		double b = phase(&o, c, da.ino, M_LOCAL, 1, 0, 0);
		printf("populated %lld files: library %.1f s, local %.1f s\n", (long long)o.files,
		       a, b);
		kvc_close(c);
		return a < 0 || b < 0;
	}
	int direct = drop_caches() != 0;
	printf("# %lld files of %llu bytes, %lld threads; cold reads: %s\n", (long long)o.files,
	       (unsigned long long)o.size, (long long)o.threads,
	       direct ? "O_DIRECT (no permission to drop caches)"
		      : "page cache dropped before each read phase");
	double best[3][3] = {{0}}; /* [mode][write, read, replace] */
	for (int round = 0; round < o.rounds; round++) {
		for (int k = 0; k < 3; k++) {
			int mode = (k + round) % 3;
			char label[64];
			double w = phase(&o, c, da.ino, (enum mode)mode, 1, 0, round);
			snprintf(label, sizeof(label), "%d: %s write", round + 1, mode_name[mode]);
			report(&o, label, w);
			double rw = 0;
			if (o.replace) {
				rw = phase(&o, c, da.ino, (enum mode)mode, 1, 0, round);
				snprintf(label, sizeof(label), "%d: %s replace", round + 1,
					 mode_name[mode]);
				report(&o, label, rw);
				if (rw < 0)
					return 1;
				if (!best[mode][2] || rw < best[mode][2])
					best[mode][2] = rw;
			}
			if (!direct)
				drop_caches();
			double r = phase(&o, c, da.ino, (enum mode)mode, 0, direct && mode != M_LIB,
					 round);
			snprintf(label, sizeof(label), "%d: %s read (cold)", round + 1,
				 mode_name[mode]);
			report(&o, label, r);
			fflush(stdout);
			if (w < 0 || r < 0)
				return 1;
			if (!best[mode][0] || w < best[mode][0])
				best[mode][0] = w;
			if (!best[mode][1] || r < best[mode][1])
				best[mode][1] = r;
			phase(&o, c, da.ino, (enum mode)mode, -1, 0, round); /* delete, untimed */
		}
	}
	printf("best of %lld rounds:\n", (long long)o.rounds);
	for (int mode = 0; mode < 3; mode++) {
		char label[64];
		snprintf(label, sizeof(label), "%s write", mode_name[mode]);
		report(&o, label, best[mode][0]);
		snprintf(label, sizeof(label), "%s read (cold)", mode_name[mode]);
		report(&o, label, best[mode][1]);
		if (o.replace) {
			snprintf(label, sizeof(label), "%s replace", mode_name[mode]);
			report(&o, label, best[mode][2]);
		}
	}
	printf("ratio mount/library: write %.2f, read %.2f\n", best[M_LIB][0] / best[M_MOUNT][0],
	       best[M_LIB][1] / best[M_MOUNT][1]);
	printf("ratio mount/local:   write %.2f, read %.2f\n", best[M_LOCAL][0] / best[M_MOUNT][0],
	       best[M_LOCAL][1] / best[M_MOUNT][1]);
	if (o.replace)
		printf("ratio replace/new write (time): mount %.2f, library %.2f, local %.2f\n",
		       best[M_MOUNT][2] / best[M_MOUNT][0], best[M_LIB][2] / best[M_LIB][0],
		       best[M_LOCAL][2] / best[M_LOCAL][0]);
	kvc_close(c);
	return 0;
}
