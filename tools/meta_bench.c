/* kvfs-meta-bench: request rates of a real kvfs-meta, each against the bare RPC round trip
 * (STATFS: no RocksDB access, no lock) measured in the same run.
 *
 * Starts kvfs-meta (next to this binary: ../bin/kvfs-meta, or --meta-bin) on a temporary
 * database, registers 12 fake nodes by heartbeat, then runs each op for --seconds with
 * --threads connections: STATFS, LOOKUP (a point read), MKDIR (a locked read-check-write and
 * one batch), file create = ALLOC + COMMIT of one 10+1 stripe (two batches); then the file
 * create again on a second daemon with --sync (fsync per batch); then MKDIR and file create
 * on a group of 3 Raft replicas (docs/meta.md, "Replicated metadata"), sent to its leader,
 * against the single meta of the same run.
 *
 * --grow N: the namespace at scale instead. Creates N files (metadata only: one 10+1 stripe
 * of 4 KiB chunks on fake nodes that hold nothing) spread over --dirs directories, and at
 * 10^4, 10^5, ... and N files reports the create rate of the last stretch, LOOKUP and
 * GETATTR rates over --seconds on random existing files, kvfs-meta's RSS and the size of its
 * RocksDB directory. --bulk creates them with BFILL (kvfs-meta --bench-fill, 512 files a
 * batch, the records a commit writes) so 10^7 files take minutes; --replicas 3 then grows a
 * group of 3 Raft replicas the same way (the leader's figures, plus Raft log entries/s and
 * MB/s) and prints the replicated/single create ratio. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <dirent.h>
#include <ftw.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
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
	int64_t grow, dirs;
	char ab[CFG_STR_MAX];
	int bulk;
	int64_t replicas;
	int compact;
};

static const struct cfg_opt opts[] = {
    {"threads", CFG_INT, offsetof(struct bench_cfg, threads), 1, 512, "4", "client connections"},
    {"seconds", CFG_SECS, offsetof(struct bench_cfg, seconds), 0.1, 600, "2s", "per measurement"},
    {"meta-bin", CFG_STR, offsetof(struct bench_cfg, meta_bin), 0, 0, NULL,
     "kvfs-meta binary (default: ../bin/kvfs-meta beside this program)"},
    {"dir", CFG_STR, offsetof(struct bench_cfg, dir), 0, 0, "/tmp",
     "where the temporary databases go"},
    {"grow", CFG_INT, offsetof(struct bench_cfg, grow), 0, 1000000000, "0",
     "grow the namespace to this many files and report rates, RSS and DB size on the way "
     "(0: the request-rate table)"},
    {"dirs", CFG_INT, offsetof(struct bench_cfg, dirs), 1, 1000000, "256",
     "directories the --grow files are spread over (as <model>/<2 hex>/ paths are)"},
    {"ab", CFG_STR, offsetof(struct bench_cfg, ab), 0, 0, NULL,
     "with --grow: at each point, also restart meta on the same database with these flags "
     "(e.g. \"--block-cache=0 --bloom-bits=0\") and measure the reads both ways"},
    {"bulk", CFG_BOOL, offsetof(struct bench_cfg, bulk), 0, 0, "false",
     "with --grow: create the files with BFILL, 512 a request in one write batch (kvfs-meta "
     "runs with --bench-fill), instead of ALLOC + COMMIT each: the same records, minutes for "
     "10^7 files"},
    {"replicas", CFG_INT, offsetof(struct bench_cfg, replicas), 1, 3, "1",
     "with --grow: 3 also grows a group of 3 Raft replicas the same way after the single meta, "
     "and reports its Raft log throughput and the replicated/single create ratio"},
    {"compact", CFG_BOOL, offsetof(struct bench_cfg, compact), 0, 0, "false",
     "with --grow: at each point, after the reads, compact meta's database (kvfs compact, "
     "MAINT COMPACT), wait for it, and measure the reads again"},
    CFG_END,
};

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* extra: more flags for kvfs-meta, separated by spaces (up to 8), or NULL. */
static pid_t start_meta_x(const char *bin, const char *dir, const char *name, int sync,
			  const char *extra, char *addr, size_t cap)
{
	char db[PATH_MAX], af[PATH_MAX], sf[PATH_MAX], xb[4096];
	snprintf(db, sizeof(db), "%s/%s", dir, name);
	snprintf(af, sizeof(af), "%s/%s.addr", dir, name);
	snprintf(sf, sizeof(sf), "%s/secret", dir);
	unlink(af); /* a restart on the same database writes it anew */
	char *argv[32] = {(char *)bin,
			  "--listen",
			  "127.0.0.1:0",
			  "--db",
			  db,
			  "--secret-file",
			  sf,
			  "--addr-file",
			  af,
			  "--log-level",
			  "1",
			  "--node-timeout",
			  /* the fake nodes heartbeat only once */ "1d"};
	int argc = 13;
	if (sync)
		argv[argc++] = "--sync";
	snprintf(xb, sizeof(xb), "%s", extra ? extra : "");
	char *save = NULL;
	for (char *t = strtok_r(xb, " ", &save); t && argc < 31; t = strtok_r(NULL, " ", &save))
		argv[argc++] = t;
	pid_t pid = fork();
	if (pid == 0) {
		execv(bin, argv);
		perror(bin);
		_exit(127);
	}
	/* Up to 60 s: a restart on a grown database replays its WAL (tens of MiB), which took
	 * over 10 s at load average 50 and failed --ab's B side. */
	for (int i = 0; i < 6000 && pid > 0; i++) {
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

static pid_t start_meta(const char *bin, const char *dir, const char *name, int sync, char *addr,
			size_t cap)
{
	return start_meta_x(bin, dir, name, sync, NULL, addr, cap);
}

/* raft: NULL, or {id, peers, raft dir} of a replica (no spaces in them). */
static pid_t start_meta_raft(const char *bin, const char *dir, const char *name, int sync,
			     char *addr, size_t cap, const char *const *raft)
{
	char x[4096];
	if (raft)
		snprintf(x, sizeof(x), "--raft-id %s --raft-peers %s --raft-dir %s", raft[0],
			 raft[1], raft[2]);
	return start_meta_x(bin, dir, name, sync, raft ? x : NULL, addr, cap);
}

/* A loopback port free now, below the ephemeral range (a Raft connection's source port could
 * take one inside it). */
static unsigned raft_port(void)
{
	for (;;) {
		unsigned p = 20000 + (unsigned)(random() % 12000);
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_in a = {.sin_family = AF_INET,
					.sin_port = htons((uint16_t)p),
					.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
		if (fd >= 0)
			close(fd);
		if (ok)
			return p;
	}
}

/* 1 when the replica at addr serves as leader (RSTATUS), else 0. */
static int is_leader(const char *addr, const struct kvp_secret *s)
{
	struct kvp_client *c;
	uint8_t *rb = NULL;
	uint32_t rl = 0;
	if (kvp_client_open(addr, s, 1000, &c))
		return 0;
	int rc = kvp_call(c, KVP_OP_RSTATUS, NULL, 0, NULL, 0, 1000, &rb, &rl);
	kvp_client_close(c);
	struct kvp_rstatus st;
	int lead = !rc && kvp_rstatus_parse(rb, rl, &st) == 0 && st.state == 3 && st.serving;
	free(rb);
	return lead;
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

/* ALLOC + COMMIT of one 10+1 stripe of 4 KiB chunks named name in parent; *ino (if not
 * NULL) gets the new file's inode. */
static int create_in(struct kvp_client *c, uint64_t parent, const char *name, uint64_t *ino)
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
	kvp_w_u64(&w, parent);
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
	b = NULL;
	if (!rc)
		rc = kvp_call(c, KVP_OP_COMMIT, w.p, w.len, NULL, 0, 10000, &b, &l);
	kvp_w_free(&w);
	if (!rc && ino) {
		struct kvp_attr a;
		kvp_r_init(&r, b, l);
		kvp_r_attr(&r, &a);
		rc = kvp_r_end(&r);
		*ino = a.ino;
	}
	free(b);
	return rc;
}

static int create_file(struct kvp_client *c, const char *name)
{
	return create_in(c, KVP_ROOT_INO, name, NULL);
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
	struct worker *wk = calloc((size_t)c->threads, sizeof(*wk));
	pthread_t *t = calloc((size_t)c->threads, sizeof(*t));
	if (!wk || !t) {
		free(wk);
		free(t);
		return -1;
	}
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
	free(wk);
	free(t);
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

/* ---- --grow: the namespace at scale ---- */

#define GROW_SAMPLE 64 /* every 64th file's inode is kept for the GETATTR runs */

struct grow {
	const char *addr;
	const struct kvp_secret *secret;
	uint64_t *dir_ino;
	uint64_t ndirs;
	uint64_t *ino; /* [seq / GROW_SAMPLE] */
	atomic_ullong next;
	uint64_t target; /* create up to this seq */
	uint64_t have;	 /* files 0..have-1 exist (for lookups) */
	double seconds;
	int bulk;
	atomic_ullong done, errors;
	pid_t meta_pid; /* for grow_read's CPU per request; 0: not measured */
	double cpu_us;	/* grow_read's result: meta request-thread CPU µs per op, -1 unknown */
};

static void grow_name(uint64_t seq, char *name, size_t cap)
{
	/* A KV block's name: 64 hex digits, like <hash>.kvb (the hash of seq, so names do not
	 * arrive in key order). */
	uint64_t h = seq * 0x9E3779B97F4A7C15ull;
	h ^= h >> 29;
	snprintf(name, cap, "%016llx%016llx%016llx%016llx.kvb", (unsigned long long)h,
		 (unsigned long long)seq, (unsigned long long)(h * 31),
		 (unsigned long long)(seq ^ h));
}

static void *grow_create_main(void *arg)
{
	struct grow *g = arg;
	struct kvp_client *c;
	if (kvp_client_open(g->addr, g->secret, 5000, &c)) {
		atomic_fetch_add(&g->errors, 1);
		return NULL;
	}
	for (;;) {
		uint64_t seq = atomic_fetch_add(&g->next, 1);
		if (seq >= g->target)
			break;
		char name[96];
		grow_name(seq, name, sizeof(name));
		uint64_t ino = 0;
		int rc = create_in(c, g->dir_ino[seq % g->ndirs], name, &ino);
		if (rc) {
			atomic_fetch_add(&g->errors, 1);
			continue;
		}
		if (seq % GROW_SAMPLE == 0)
			g->ino[seq / GROW_SAMPLE] = ino;
		atomic_fetch_add(&g->done, 1);
	}
	kvp_client_close(c);
	return NULL;
}

#define GROW_BULK 512 /* files per BFILL (KVP_BFILL_MAX) */

/* --bulk: BFILL requests of GROW_BULK consecutive files, each in its own directory as the
 * ALLOC + COMMIT path puts it. */
static void *grow_bulk_main(void *arg)
{
	struct grow *g = arg;
	struct kvp_client *c;
	if (kvp_client_open(g->addr, g->secret, 5000, &c)) {
		atomic_fetch_add(&g->errors, 1);
		return NULL;
	}
	for (;;) {
		uint64_t seq = atomic_fetch_add(&g->next, GROW_BULK);
		if (seq >= g->target)
			break;
		uint32_t n = (uint32_t)(g->target - seq < GROW_BULK ? g->target - seq : GROW_BULK);
		struct kvp_wbuf w;
		kvp_w_init(&w);
		kvp_w_u8(&w, 10);
		kvp_w_u8(&w, 1);
		kvp_w_u32(&w, 4096);
		kvp_w_u64(&w, 40000);
		kvp_w_u32(&w, n);
		for (uint32_t i = 0; i < n; i++) {
			char name[96];
			grow_name(seq + i, name, sizeof(name));
			kvp_w_u64(&w, g->dir_ino[(seq + i) % g->ndirs]);
			kvp_w_cstr(&w, name);
		}
		uint8_t *b = NULL;
		uint32_t l = 0;
		int rc =
		    w.err ? w.err : kvp_call(c, KVP_OP_BFILL, w.p, w.len, NULL, 0, 60000, &b, &l);
		kvp_w_free(&w);
		struct kvp_rbuf r;
		kvp_r_init(&r, b, l);
		for (uint32_t i = 0; !rc && i < n; i++) {
			uint64_t ino = kvp_r_u64(&r);
			if ((seq + i) % GROW_SAMPLE == 0)
				g->ino[(seq + i) / GROW_SAMPLE] = ino;
		}
		if (!rc)
			rc = kvp_r_end(&r);
		free(b);
		if (rc) {
			fprintf(stderr, "meta-bench: BFILL: %s\n", kvp_strerror(rc));
			atomic_fetch_add(&g->errors, 1);
			continue;
		}
		atomic_fetch_add(&g->done, n);
	}
	kvp_client_close(c);
	return NULL;
}

struct grow_reader {
	struct grow *g;
	int getattr;
	unsigned seed;
	uint64_t done, errors;
};

static void *grow_read_main(void *arg)
{
	struct grow_reader *rd = arg;
	struct grow *g = rd->g;
	struct kvp_client *c;
	if (kvp_client_open(g->addr, g->secret, 5000, &c)) {
		rd->errors++;
		return NULL;
	}
	uint64_t x = rd->seed | 1;
	double end = now_s() + g->seconds;
	while (now_s() < end) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		struct kvp_wbuf w;
		kvp_w_init(&w);
		int rc;
		if (rd->getattr) {
			kvp_w_u64(&w, g->ino[(x % g->have) / GROW_SAMPLE]);
			rc = kvp_call(c, KVP_OP_GETATTR, w.p, w.len, NULL, 0, 10000, NULL, NULL);
		} else {
			uint64_t seq = x % g->have;
			char name[96];
			grow_name(seq, name, sizeof(name));
			kvp_w_u64(&w, g->dir_ino[seq % g->ndirs]);
			kvp_w_cstr(&w, name);
			rc = kvp_call(c, KVP_OP_LOOKUP, w.p, w.len, NULL, 0, 10000, NULL, NULL);
		}
		kvp_w_free(&w);
		if (rc)
			rd->errors++;
		else
			rd->done++;
	}
	kvp_client_close(c);
	return NULL;
}

/* utime + stime ticks in a /proc stat file; *rocks: its thread is one of RocksDB's own
 * (flush, compaction: named "rocksdb:..."). -1 if unreadable. */
static long long stat_ticks(const char *path, int *rocks)
{
	char line[1024];
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	size_t n = fread(line, 1, sizeof(line) - 1, f);
	fclose(f);
	line[n] = 0;
	/* pid (comm) state ...: comm may hold spaces, so parse after the last ')' */
	char *open = strchr(line, '('), *close = strrchr(line, ')');
	unsigned long long ut = 0, st = 0;
	if (!open || !close ||
	    sscanf(close + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) !=
		2)
		return -1;
	*rocks = strncmp(open + 1, "rocksdb", 7) == 0;
	return (long long)(ut + st);
}

/* CPU seconds (user + system) meta has used so far outside RocksDB's own threads: the request
 * threads, whose time stays in the process's total after their connection closes. Wall rates
 * on a shared machine swing with its load; CPU per request much less. -1 if unknown. */
static double meta_req_cpu_s(pid_t pid)
{
	char path[64];
	int rocks;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	long long ticks = stat_ticks(path, &rocks);
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	DIR *d = opendir(path);
	if (ticks < 0 || !d) {
		if (d)
			closedir(d);
		return -1;
	}
	struct dirent *e;
	while ((e = readdir(d))) {
		char sp[128];
		snprintf(sp, sizeof(sp), "%s/%.32s/stat", path, e->d_name);
		long long t = e->d_name[0] == '.' ? -1 : stat_ticks(sp, &rocks);
		if (t > 0 && rocks)
			ticks -= t;
	}
	closedir(d);
	return (double)ticks / (double)sysconf(_SC_CLK_TCK);
}

/* ops/s of LOOKUP (getattr 0) or GETATTR over random existing files; -1 on any error. With
 * g->meta_pid set, g->cpu_us becomes meta's request-thread CPU per operation (µs). */
static double grow_read(struct grow *g, int threads, int getattr)
{
	double cpu0 = g->meta_pid > 0 ? meta_req_cpu_s(g->meta_pid) : -1;
	struct grow_reader rd[64];
	pthread_t t[64];
	double t0 = now_s();
	for (int i = 0; i < threads; i++) {
		rd[i] = (struct grow_reader){
		    .g = g, .getattr = getattr, .seed = 7919u * (unsigned)(i + 1)};
		pthread_create(&t[i], NULL, grow_read_main, &rd[i]);
	}
	uint64_t done = 0, errors = 0;
	for (int i = 0; i < threads; i++) {
		pthread_join(t[i], NULL);
		done += rd[i].done;
		errors += rd[i].errors;
	}
	double cpu1 = g->meta_pid > 0 ? meta_req_cpu_s(g->meta_pid) : -1;
	g->cpu_us = cpu0 >= 0 && cpu1 >= 0 && done ? (cpu1 - cpu0) * 1e6 / (double)done : -1;
	return errors ? -1 : (double)done / (now_s() - t0);
}

/* VmRSS (what = "VmRSS") or its peak so far ("VmHWM") of pid, KiB; -1 if unknown. */
static long vm_kib(pid_t pid, const char *what)
{
	char path[64], line[256], fmt[32];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	snprintf(fmt, sizeof(fmt), "%s: %%ld kB", what);
	FILE *f = fopen(path, "r");
	long kib = -1;
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, fmt, &kib) == 1)
			break;
	if (f)
		fclose(f);
	return kib;
}

static uint64_t g_du; /* nftw has no context argument */
static int du_add(const char *p, const struct stat *st, int type, struct FTW *ftw)
{
	(void)p, (void)ftw;
	if (type == FTW_F)
		g_du += (uint64_t)st->st_size;
	return 0;
}

static uint64_t du_bytes(const char *path)
{
	g_du = 0;
	nftw(path, du_add, 16, FTW_PHYS);
	return g_du;
}

/* The leader's last Raft log index (RSTATUS), or 0. */
static uint64_t raft_last_index(const char *addr, const struct kvp_secret *s)
{
	struct kvp_client *c;
	uint8_t *rb = NULL;
	uint32_t rl = 0;
	if (kvp_client_open(addr, s, 1000, &c))
		return 0;
	int rc = kvp_call(c, KVP_OP_RSTATUS, NULL, 0, NULL, 0, 1000, &rb, &rl);
	kvp_client_close(c);
	struct kvp_rstatus st;
	uint64_t last = !rc && kvp_rstatus_parse(rb, rl, &st) == 0 ? st.last : 0;
	free(rb);
	return last;
}

/* From meta's MSTATUS: level-0 files, pending compaction bytes, full compactions done. 0 or
 * an error. */
static int db_state(const char *addr, const struct kvp_secret *s, uint64_t *l0, uint64_t *pending,
		    uint64_t *compacts)
{
	struct kvp_client *c;
	uint8_t *rb = NULL;
	uint32_t rl = 0;
	int rc = kvp_client_open(addr, s, 5000, &c);
	if (rc)
		return rc;
	rc = kvp_call(c, KVP_OP_MSTATUS, NULL, 0, NULL, 0, 5000, &rb, &rl);
	kvp_client_close(c);
	if (rc)
		return rc;
	struct kvp_rbuf r;
	kvp_r_init(&r, rb, rl);
	kvp_r_bytes(&r, 1 + 1 + 4 + 8 * 5);
	uint32_t n = kvp_r_u32(&r);
	uint64_t v[KVP_MST_COUNT] = {0};
	for (uint32_t i = 0; i < n && !r.err; i++) {
		uint64_t x = kvp_r_u64(&r);
		if (i < KVP_MST_COUNT)
			v[i] = x;
	}
	rc = r.err ? r.err : n < KVP_MST_COUNT ? -EPROTO : 0;
	free(rb);
	*l0 = v[KVP_MST_DB_L0_FILES];
	*pending = v[KVP_MST_DB_PENDING];
	*compacts = v[KVP_MST_DB_COMPACTS];
	return rc;
}

/* MAINT COMPACT, then waits until meta counts it finished. Seconds it took, or -1. */
static double compact_db(const char *addr, const struct kvp_secret *s)
{
	uint64_t l0, pend, before, after;
	if (db_state(addr, s, &l0, &pend, &before))
		return -1;
	struct kvp_client *c;
	double t0 = now_s();
	uint8_t b[5] = {KVP_MAINT_COMPACT, 0, 0, 0, 0};
	int rc = kvp_client_open(addr, s, 5000, &c);
	if (!rc) {
		rc = kvp_call(c, KVP_OP_MAINT, b, sizeof(b), NULL, 0, 5000, NULL, NULL);
		kvp_client_close(c);
	}
	while (!rc && !(rc = db_state(addr, s, &l0, &pend, &after)) && after == before)
		usleep(200000);
	return rc ? -1 : now_s() - t0;
}

#define GROW_POINTS 12

/* One --grow run: a single meta (replicated 0) or a group of 3 Raft replicas, driven through
 * its leader. create[i] gets the create rate at the i-th point (10^4, 10^5, ...). The
 * databases are removed at the end. */
static int grow_run(const struct bench_cfg *c, const char *dir, const struct kvp_secret *s,
		    int replicated, double *create_at)
{
	char addr[64], db[PATH_MAX], rdir[PATH_MAX] = "", raddr[3][64];
	const char *fill = c->bulk ? "--bench-fill" : "";
	pid_t pid = -1, rp[3] = {-1, -1, -1};
	if (!replicated) {
		pid = start_meta_x(c->meta_bin, dir, "db", 0, fill, addr, sizeof(addr));
		snprintf(db, sizeof(db), "%.4000s/db", dir);
	} else {
		srandom((unsigned)getpid());
		char peers[256], x[3][8192];
		snprintf(peers, sizeof(peers), "1=127.0.0.1:%u,2=127.0.0.1:%u,3=127.0.0.1:%u",
			 raft_port(), raft_port(), raft_port());
		for (int i = 0; i < 3; i++) {
			char name[32];
			snprintf(name, sizeof(name), "graft-db%d", i + 1);
			/* A longer election timeout than the 1 s default: at full bulk load
			 * (entries near 1 MiB back to back) on a shared 2-core machine a
			 * follower once timed out mid-run; this measures throughput, not
			 * failover (test_raft does that). */
			snprintf(x[i], sizeof(x[i]),
				 "--raft-election-timeout 5s --raft-id %d --raft-peers %s "
				 "--raft-dir %.4000s/graft%d %s",
				 i + 1, peers, dir, i + 1, fill);
			rp[i] = start_meta_x(c->meta_bin, dir, name, 0, x[i], raddr[i],
					     sizeof(raddr[i]));
		}
		int lead = -1;
		for (int t = 0; t < 300 && rp[0] > 0 && rp[1] > 0 && rp[2] > 0 && lead < 0; t++) {
			for (int i = 0; i < 3 && lead < 0; i++)
				if (is_leader(raddr[i], s))
					lead = i;
			usleep(50000);
		}
		if (lead >= 0) {
			pid = rp[lead];
			snprintf(addr, sizeof(addr), "%s", raddr[lead]);
			snprintf(db, sizeof(db), "%.4000s/graft-db%d", dir, lead + 1);
			snprintf(rdir, sizeof(rdir), "%.4000s/graft%d", dir, lead + 1);
		}
	}
	if (pid < 0 || setup_cluster(addr, s)) {
		fprintf(stderr, "meta-bench: cannot start %s\n", c->meta_bin);
		for (int i = 0; i < 3; i++)
			if (rp[i] > 0)
				stop_meta(rp[i]);
		if (!replicated && pid > 0)
			stop_meta(pid);
		return 1;
	}
	struct grow g = {.addr = addr,
			 .secret = s,
			 .ndirs = (uint64_t)c->dirs,
			 .seconds = c->seconds,
			 .bulk = c->bulk};
	g.dir_ino = calloc(g.ndirs, sizeof(*g.dir_ino));
	g.ino = calloc((size_t)c->grow / GROW_SAMPLE + 1, sizeof(*g.ino));
	struct kvp_client *cl = NULL;
	int rc = !g.dir_ino || !g.ino || kvp_client_open(addr, s, 5000, &cl);
	for (uint64_t i = 0; !rc && i < g.ndirs; i++) {
		struct kvp_wbuf w;
		kvp_w_init(&w);
		char name[32];
		snprintf(name, sizeof(name), "%02llx", (unsigned long long)i);
		kvp_w_u64(&w, KVP_ROOT_INO);
		kvp_w_cstr(&w, name);
		kvp_w_u32(&w, 0755);
		uint8_t *b = NULL;
		uint32_t l = 0;
		rc = kvp_call(cl, KVP_OP_MKDIR, w.p, w.len, NULL, 0, 5000, &b, &l);
		kvp_w_free(&w);
		if (!rc) {
			struct kvp_rbuf r;
			struct kvp_attr a;
			kvp_r_init(&r, b, l);
			kvp_r_attr(&r, &a);
			rc = kvp_r_end(&r);
			g.dir_ino[i] = a.ino;
		}
		free(b);
	}
	if (cl)
		kvp_client_close(cl);
	printf("kvfs-meta-bench --grow %lld, %s, creates by %s: %lld dirs, %lld connections, "
	       "reads %.1f s per point\n",
	       (long long)c->grow,
	       replicated ? "3 Raft replicas (the leader's figures)" : "single meta",
	       c->bulk ? "BFILL (bulk, 512 a batch)" : "ALLOC + COMMIT", (long long)c->dirs,
	       (long long)c->threads, c->seconds);
	printf("%12s %12s %12s %12s %10s %10s", "files", "create/s", "lookup/s", "getattr/s",
	       "RSS MiB", "DB MiB");
	if (replicated)
		printf(" %12s %12s %10s %10s", "log entry/s", "log MB/s", "log MiB", "peak MiB");
	if (c->ab[0])
		printf(" %12s %12s  (B: %s)", "B lookup/s", "B getattr/s", c->ab);
	printf(" %6s %11s", "L0", "pending MiB");
	if (!replicated)
		printf(" %9s", "lk CPU us");
	if (c->ab[0])
		printf(" %9s", "B lk us");
	if (c->compact)
		printf(" %10s %12s %12s %6s", "compact s", "C lookup/s", "C getattr/s", "C L0");
	printf("\n");
	fflush(stdout);
	uint64_t point = 10000, last_idx = replicated ? raft_last_index(addr, s) : 0;
	uint64_t last_log = replicated ? du_bytes(rdir) : 0;
	int npoint = 0;
	while (!rc && g.have < (uint64_t)c->grow) {
		g.target = point < (uint64_t)c->grow ? point : (uint64_t)c->grow;
		atomic_store(&g.done, 0);
		atomic_store(&g.next, g.have); /* each thread took one past the last target */
		pthread_t t[64];
		double t0 = now_s();
		for (int i = 0; i < c->threads; i++)
			pthread_create(&t[i], NULL, c->bulk ? grow_bulk_main : grow_create_main,
				       &g);
		for (int i = 0; i < c->threads; i++)
			pthread_join(t[i], NULL);
		double el = now_s() - t0;
		double create = (double)atomic_load(&g.done) / el;
		if (npoint < GROW_POINTS)
			create_at[npoint++] = create;
		double ent_s = 0, log_mb_s = 0, log_mib = 0;
		if (replicated) {
			uint64_t idx = raft_last_index(addr, s), lb = du_bytes(rdir);
			ent_s = (double)(idx - last_idx) / el;
			log_mb_s = ((double)lb - (double)last_log) / el / 1e6;
			log_mib = (double)lb / 1048576.0;
			last_idx = idx;
			last_log = lb;
		}
		if (atomic_load(&g.errors)) {
			fprintf(stderr, "meta-bench: %llu creates failed\n",
				(unsigned long long)atomic_load(&g.errors));
			rc = 1;
			break;
		}
		g.have = g.target;
		double ab_lookup = 0, ab_getattr = 0, ab_cpu = -1;
		if (c->ab[0]) {
			/* Both read paths on the same files in the same minute, each from a fresh
			 * start (empty caches): the other flags first, then the defaults. */
			stop_meta(pid);
			char abx[CFG_STR_MAX + 32];
			snprintf(abx, sizeof(abx), "%s %s", c->ab, fill); /* BFILL goes on after */
			pid = start_meta_x(c->meta_bin, dir, "db", 0, abx, addr, sizeof(addr));
			g.meta_pid = pid;
			ab_lookup = pid < 0 ? -1 : grow_read(&g, (int)c->threads, 0);
			ab_cpu = g.cpu_us;
			g.meta_pid = 0;
			ab_getattr = pid < 0 ? -1 : grow_read(&g, (int)c->threads, 1);
			if (pid > 0)
				stop_meta(pid);
			pid = start_meta_x(c->meta_bin, dir, "db", 0, fill, addr, sizeof(addr));
			if (pid < 0) {
				fprintf(stderr, "meta-bench: cannot restart %s\n", c->meta_bin);
				free(g.dir_ino);
				free(g.ino);
				return 1;
			}
		}
		/* RocksDB's state as the reads begin: level-0 files each read checks, and the
		 * compaction still owed. */
		uint64_t l0 = 0, pend = 0, nc = 0;
		db_state(addr, s, &l0, &pend, &nc);
		g.meta_pid = replicated ? 0 : pid;
		double lookup = grow_read(&g, (int)c->threads, 0);
		double lookup_cpu = g.cpu_us;
		g.meta_pid = 0;
		double getattr = grow_read(&g, (int)c->threads, 1);
		printf("%12llu %12.0f %12.0f %12.0f %10.1f %10.1f", (unsigned long long)g.have,
		       create, lookup, getattr, (double)vm_kib(pid, "VmRSS") / 1024.0,
		       (double)du_bytes(db) / 1048576.0);
		if (replicated)
			printf(" %12.1f %12.1f %10.1f %10.1f", ent_s, log_mb_s, log_mib,
			       (double)vm_kib(pid, "VmHWM") / 1024.0);
		if (c->ab[0])
			printf(" %12.0f %12.0f", ab_lookup, ab_getattr);
		printf(" %6llu %11.1f", (unsigned long long)l0, (double)pend / 1048576.0);
		if (!replicated)
			printf(" %9.1f", lookup_cpu);
		if (c->ab[0])
			printf(" %9.1f", ab_cpu);
		double c_s = 0, c_lookup = 0, c_getattr = 0;
		if (c->compact) {
			/* The same files after a full compaction (kvfs compact), the way an
			 * operator settles a bulk load. */
			fflush(stdout);
			c_s = compact_db(addr, s);
			db_state(addr, s, &l0, &pend, &nc);
			c_lookup = c_s < 0 ? -1 : grow_read(&g, (int)c->threads, 0);
			c_getattr = c_s < 0 ? -1 : grow_read(&g, (int)c->threads, 1);
			printf(" %10.1f %12.0f %12.0f %6llu", c_s, c_lookup, c_getattr,
			       (unsigned long long)l0);
		}
		printf("\n");
		fflush(stdout);
		rc = lookup < 0 || getattr < 0 || ab_lookup < 0 || ab_getattr < 0 || c_lookup < 0 ||
		     c_getattr < 0;
		point *= 10;
	}
	if (replicated) {
		for (int i = 0; i < 3; i++)
			stop_meta(rp[i]);
	} else
		stop_meta(pid);
	free(g.dir_ino);
	free(g.ino);
	/* GBs at 10^7 files: gone before the next run needs the space */
	char cmd[2 * PATH_MAX + 64];
	snprintf(cmd, sizeof(cmd), "rm -rf '%.4000s'/db '%.4000s'/graft*", dir, dir);
	if (system(cmd) != 0)
		fprintf(stderr, "meta-bench: could not remove the databases in %s\n", dir);
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
	if (c.grow > 0) {
		if (c.threads > 64) { /* the --grow readers' arrays */
			fprintf(stderr, "meta-bench: --grow takes at most 64 --threads\n");
			rc = 1;
		} else if (c.replicas == 3 && c.ab[0]) {
			fprintf(stderr, "meta-bench: --ab is for a single meta\n");
			rc = 1;
		} else {
			double one[GROW_POINTS] = {0}, three[GROW_POINTS] = {0};
			rc = grow_run(&c, dir, &s, 0, one);
			if (!rc && c.replicas == 3)
				rc = grow_run(&c, dir, &s, 1, three);
			if (!rc && c.replicas == 3) {
				printf("3 replicas / single meta, create rate:");
				uint64_t pt = 10000;
				for (int i = 0; i < GROW_POINTS && one[i] > 0 && three[i] > 0;
				     i++, pt *= 10)
					printf(" %llu files %.2fx%s",
					       (unsigned long long)(pt < (uint64_t)c.grow
									? pt
									: (uint64_t)c.grow),
					       three[i] / one[i], pt < (uint64_t)c.grow ? ";" : "");
				printf("\n");
			}
		}
		snprintf(path, sizeof(path), "rm -rf '%s'", dir);
		if (system(path) != 0)
			fprintf(stderr, "meta-bench: could not remove %s\n", dir);
		return rc ? 1 : 0;
	}

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
	/* 3 Raft replicas: the same ops sent to the leader. */
	double rr[2] = {0};
	if (!rc) {
		srandom((unsigned)getpid());
		char peers[256], ids[3][16], rdir[3][PATH_MAX + 16], name[3][16], raddr[3][64];
		snprintf(peers, sizeof(peers), "1=127.0.0.1:%u,2=127.0.0.1:%u,3=127.0.0.1:%u",
			 raft_port(), raft_port(), raft_port());
		pid_t rp[3];
		int lead = -1;
		for (int i = 0; i < 3; i++) {
			snprintf(ids[i], sizeof(ids[i]), "%d", i + 1);
			snprintf(rdir[i], sizeof(rdir[i]), "%s/raft%d", dir, i + 1);
			snprintf(name[i], sizeof(name[i]), "db-raft%d", i + 1);
			const char *ra[] = {ids[i], peers, rdir[i]};
			rp[i] = start_meta_raft(c.meta_bin, dir, name[i], 0, raddr[i],
						sizeof(raddr[i]), ra);
			if (rp[i] < 0)
				rc = 1;
		}
		for (int t = 0; t < 300 && !rc && lead < 0; t++) {
			for (int i = 0; i < 3 && lead < 0; i++)
				if (is_leader(raddr[i], &s))
					lead = i;
			usleep(50000);
		}
		if (lead < 0 || setup_cluster(raddr[lead], &s)) {
			fprintf(stderr, "meta-bench: no Raft leader among 3 replicas\n");
			rc = 1;
		} else {
			rr[0] = measure(raddr[lead], &s, &c, OP_MKDIR);
			rr[1] = measure(raddr[lead], &s, &c, OP_CREATE);
		}
		for (int i = 0; i < 3; i++)
			if (rp[i] > 0)
				stop_meta(rp[i]);
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
		printf("%-32s %12s %10s\n", "3 Raft replicas (to the leader)", "ops/s",
		       "vs 1 meta");
		printf("%-32s %12.0f %9.2fx\n", "MKDIR, 3 replicas", rr[0], rr[0] / r[2]);
		printf("%-32s %12.0f %9.2fx\n", "file create, 3 replicas", rr[1], rr[1] / r[3]);
		for (int i = 0; i < 5; i++)
			rc |= r[i] <= 0;
		rc |= rr[0] <= 0 || rr[1] <= 0;
	}
	snprintf(path, sizeof(path), "rm -rf '%s'", dir);
	if (system(path) != 0)
		fprintf(stderr, "meta-bench: could not remove %s\n", dir);
	return rc ? 1 : 0;
}
