/* kvfs-meta-bench: request rates of a real kvfs-meta, each against the bare RPC round trip
 * (STATFS: no RocksDB access, no lock) measured in the same run.
 *
 * Starts kvfs-meta (next to this binary: ../bin/kvfs-meta, or --meta-bin) on a temporary
 * database, registers 12 fake nodes by heartbeat, then runs each op for --seconds with
 * --threads connections: STATFS, LOOKUP (a point read), MKDIR (a locked read-check-write and
 * one batch), file create = ALLOC + COMMIT of one 10+1 stripe (two batches); then the file
 * create again on a second daemon with --sync (fsync per batch). */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cfg.h"
#include "kvp.h"

#define SECRET "meta-bench-secret-0123456789"

struct bench_cfg {
	int64_t threads;
	double seconds;
	char meta_bin[CFG_STR_MAX];
	char dir[CFG_STR_MAX];
};

static const struct cfg_opt opts[] = {
    {"threads", CFG_INT, offsetof(struct bench_cfg, threads), 1, 64, "4", "client connections"},
    {"seconds", CFG_SECS, offsetof(struct bench_cfg, seconds), 0.1, 600, "2s", "per measurement"},
    {"meta-bin", CFG_STR, offsetof(struct bench_cfg, meta_bin), 0, 0, NULL,
     "kvfs-meta binary (default: ../bin/kvfs-meta beside this program)"},
    {"dir", CFG_STR, offsetof(struct bench_cfg, dir), 0, 0, "/tmp",
     "where the temporary databases go"},
    CFG_END,
};

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static pid_t start_meta(const char *bin, const char *dir, const char *name, int sync, char *addr,
			size_t cap)
{
	char db[PATH_MAX], af[PATH_MAX], sf[PATH_MAX];
	snprintf(db, sizeof(db), "%s/%s", dir, name);
	snprintf(af, sizeof(af), "%s/%s.addr", dir, name);
	snprintf(sf, sizeof(sf), "%s/secret", dir);
	pid_t pid = fork();
	if (pid == 0) {
		execl(bin, bin, "--listen", "127.0.0.1:0", "--db", db, "--secret-file", sf,
		      "--addr-file", af, "--log-level", "1", "--node-timeout", "1d",
		      /* the fake nodes heartbeat only once */ sync ? "--sync" : NULL,
		      (char *)NULL);
		perror(bin);
		_exit(127);
	}
	for (int i = 0; i < 1000 && pid > 0; i++) {
		FILE *f = fopen(af, "r");
		if (f) {
			int ok = fgets(addr, (int)cap, f) != NULL;
			fclose(f);
			if (ok) {
				addr[strcspn(addr, "\n")] = 0;
				return pid;
			}
		}
		if (waitpid(pid, NULL, WNOHANG) == pid)
			return -1;
		usleep(10000);
	}
	if (pid > 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
	return -1;
}

static void stop_meta(pid_t pid)
{
	kill(pid, SIGTERM);
	for (int i = 0; i < 500; i++) {
		if (waitpid(pid, NULL, WNOHANG) == pid)
			return;
		usleep(10000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

enum op { OP_STATFS, OP_LOOKUP, OP_MKDIR, OP_CREATE };

struct worker {
	const char *addr;
	const struct kvp_secret *secret;
	enum op op;
	int id;
	double seconds;
	uint64_t done, errors;
};

static int create_file(struct kvp_client *c, const char *name)
{
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u8(&w, 10);
	kvp_w_u8(&w, 1);
	kvp_w_u32(&w, 4096);
	kvp_w_u32(&w, 1);
	uint8_t *b = NULL;
	uint32_t l = 0;
	int rc = kvp_call(c, KVP_OP_ALLOC, w.p, w.len, NULL, 0, 10000, &b, &l);
	kvp_w_free(&w);
	if (rc)
		return rc;
	struct kvp_rbuf r;
	kvp_r_init(&r, b, l);
	uint64_t wid = kvp_r_u64(&r);
	uint32_t nn = kvp_r_u32(&r);
	for (uint32_t i = 0; i < nn && !r.err; i++) {
		char a[KVP_ADDR_MAX];
		kvp_r_u32(&r);
		kvp_r_str(&r, a, sizeof(a));
	}
	kvp_w_init(&w);
	kvp_w_u64(&w, KVP_ROOT_INO);
	kvp_w_cstr(&w, name);
	kvp_w_u32(&w, 0644);
	kvp_w_u64(&w, wid);
	kvp_w_u64(&w, 40000);
	kvp_w_u32(&w, 4096);
	kvp_w_u8(&w, 10);
	kvp_w_u8(&w, 1);
	kvp_w_u8(&w, 0);
	kvp_w_u32(&w, 1);
	for (int i = 0; i < 11; i++) {
		kvp_w_u32(&w, kvp_r_u32(&r));
		kvp_w_u64(&w, kvp_r_u64(&r));
		kvp_w_u32(&w, 0);
	}
	rc = kvp_r_end(&r);
	free(b);
	if (!rc)
		rc = kvp_call(c, KVP_OP_COMMIT, w.p, w.len, NULL, 0, 10000, NULL, NULL);
	kvp_w_free(&w);
	return rc;
}

static void *worker_main(void *arg)
{
	struct worker *wk = arg;
	struct kvp_client *c;
	if (kvp_client_open(wk->addr, wk->secret, 5000, &c)) {
		wk->errors++;
		return NULL;
	}
	static atomic_ulong seq;
	double end = now_s() + wk->seconds;
	while (now_s() < end) {
		char name[64];
		snprintf(name, sizeof(name), "w%d-%lu", wk->id, atomic_fetch_add(&seq, 1));
		struct kvp_wbuf w;
		kvp_w_init(&w);
		int rc;
		switch (wk->op) {
		case OP_STATFS:
			rc = kvp_call(c, KVP_OP_STATFS, NULL, 0, NULL, 0, 10000, NULL, NULL);
			break;
		case OP_LOOKUP:
			kvp_w_u64(&w, KVP_ROOT_INO);
			kvp_w_cstr(&w, "lookup-target");
			rc = kvp_call(c, KVP_OP_LOOKUP, w.p, w.len, NULL, 0, 10000, NULL, NULL);
			break;
		case OP_MKDIR:
			kvp_w_u64(&w, KVP_ROOT_INO);
			kvp_w_cstr(&w, name);
			kvp_w_u32(&w, 0755);
			rc = kvp_call(c, KVP_OP_MKDIR, w.p, w.len, NULL, 0, 10000, NULL, NULL);
			break;
		default:
			rc = create_file(c, name);
			break;
		}
		kvp_w_free(&w);
		if (rc)
			wk->errors++;
		else
			wk->done++;
	}
	kvp_client_close(c);
	return NULL;
}

/* ops/s of op over all threads; negative if any request failed. */
static double measure(const char *addr, const struct kvp_secret *s, const struct bench_cfg *c,
		      enum op op)
{
	struct worker wk[64];
	pthread_t t[64];
	double t0 = now_s();
	for (int i = 0; i < c->threads; i++) {
		wk[i] = (struct worker){
		    .addr = addr, .secret = s, .op = op, .id = i, .seconds = c->seconds};
		pthread_create(&t[i], NULL, worker_main, &wk[i]);
	}
	uint64_t done = 0, errors = 0;
	for (int i = 0; i < c->threads; i++) {
		pthread_join(t[i], NULL);
		done += wk[i].done;
		errors += wk[i].errors;
	}
	double el = now_s() - t0;
	if (errors)
		fprintf(stderr, "meta-bench: %llu requests failed\n", (unsigned long long)errors);
	return errors ? -1 : (double)done / el;
}

static int setup_cluster(const char *addr, const struct kvp_secret *s)
{
	struct kvp_client *c;
	int rc = kvp_client_open(addr, s, 5000, &c);
	for (int i = 0; i < 12 && !rc; i++) {
		struct kvp_wbuf w;
		kvp_w_init(&w);
		kvp_w_u64(&w, 100 + (uint64_t)i);
		kvp_w_cstr(&w, "127.0.0.1:1");
		kvp_w_u64(&w, 1ull << 50);
		kvp_w_u64(&w, 0);
		kvp_w_u64(&w, 0);
		rc = kvp_call(c, KVP_OP_HEARTBEAT, w.p, w.len, NULL, 0, 5000, NULL, NULL);
		kvp_w_free(&w);
	}
	if (!rc) {
		struct kvp_wbuf w;
		kvp_w_init(&w);
		kvp_w_u64(&w, KVP_ROOT_INO);
		kvp_w_cstr(&w, "lookup-target");
		kvp_w_u32(&w, 0755);
		rc = kvp_call(c, KVP_OP_MKDIR, w.p, w.len, NULL, 0, 5000, NULL, NULL);
		kvp_w_free(&w);
	}
	if (c)
		kvp_client_close(c);
	return rc;
}

int main(int argc, char **argv)
{
	struct bench_cfg c;
	int npos;
	int rc = cfg_parse(opts, &c, argc, argv, "", &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	signal(SIGPIPE, SIG_IGN);
	if (!c.meta_bin[0]) {
		char self[PATH_MAX];
		ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
		if (n <= 0)
			return 2;
		self[n] = 0;
		*strrchr(self, '/') = 0;
		snprintf(c.meta_bin, sizeof(c.meta_bin), "%.200s/../bin/kvfs-meta", self);
	}
	char dir[PATH_MAX];
	snprintf(dir, sizeof(dir), "%s/kvfs-meta-bench-XXXXXX", c.dir);
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	char path[PATH_MAX + 16];
	snprintf(path, sizeof(path), "%s/secret", dir);
	FILE *f = fopen(path, "w");
	fprintf(f, "%s\n", SECRET);
	fclose(f);
	struct kvp_secret s;
	kvp_secret_from_string(SECRET, &s);

	double r[5] = {0};
	char addr[64];
	pid_t pid = start_meta(c.meta_bin, dir, "db", 0, addr, sizeof(addr));
	if (pid < 0 || setup_cluster(addr, &s)) {
		fprintf(stderr, "meta-bench: cannot start %s\n", c.meta_bin);
		rc = 1;
	} else {
		r[0] = measure(addr, &s, &c, OP_STATFS);
		r[1] = measure(addr, &s, &c, OP_LOOKUP);
		r[2] = measure(addr, &s, &c, OP_MKDIR);
		r[3] = measure(addr, &s, &c, OP_CREATE);
	}
	if (pid > 0)
		stop_meta(pid);
	if (!rc) {
		pid = start_meta(c.meta_bin, dir, "db-sync", 1, addr, sizeof(addr));
		if (pid < 0 || setup_cluster(addr, &s))
			rc = 1;
		else
			r[4] = measure(addr, &s, &c, OP_CREATE);
		if (pid > 0)
			stop_meta(pid);
	}
	if (!rc) {
		const char *names[] = {"STATFS (bare RPC, baseline)", "LOOKUP (point read)",
				       "MKDIR (locked batch)", "file create (ALLOC + COMMIT)",
				       "file create, --sync"};
		printf("kvfs-meta-bench: %lld connections, %.1f s each\n", (long long)c.threads,
		       c.seconds);
		printf("%-32s %12s %10s\n", "op", "ops/s", "vs RPC");
		for (int i = 0; i < 5; i++)
			printf("%-32s %12.0f %9.2fx\n", names[i], r[i], r[i] / r[0]);
		for (int i = 0; i < 5; i++)
			rc |= r[i] <= 0;
	}
	snprintf(path, sizeof(path), "rm -rf '%s'", dir);
	if (system(path) != 0)
		fprintf(stderr, "meta-bench: could not remove %s\n", dir);
	return rc ? 1 : 0;
}
