/* Tests for kvfs-node: the real binary runs as a child process on a temp directory and is
 * driven over loopback with kvp_client. Covers put/get of edge sizes and ranges, pipelining,
 * delete and list paging, stat numbers, on-disk corruption, capacity, kill -9 and restart,
 * authentication, bad frames, heartbeats to a (stand-in) metadata server that restarts. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvec.h"
#include "kvp.h"
#include "node_index.h"
#include "sock_tutil.h"

#define SECRET	     "test-cluster-secret-0123456789"
#define CALL_MS	     20000
#define LEN_TO_END   0xFFFFFFFFu
#define CHUNK_MAX    (16u << 20)
#define NODE_HDR_LEN 64

struct nodeproc {
	pid_t pid;
	char dir[512], data[600], addrf[600], addr[KVP_ADDR_MAX];
};

static char g_tmp[256];
static struct kvp_secret g_sec;
static struct nodeproc g_node; /* shared by the tests that need no special flags */
static struct kvp_client *g_cl;
/* Every node started and not yet stopped: a failed assertion leaves its test early, and the
 * group teardown kills what it left running. */
static pid_t g_live[16];

static void live_forget(pid_t pid)
{
	for (size_t i = 0; i < sizeof(g_live) / sizeof(g_live[0]); i++)
		if (g_live[i] == pid)
			g_live[i] = 0;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
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

/* Starts kvfs-node on np->data with extra flags (NULL-terminated) and waits for its address. */
static int node_start(struct nodeproc *np, const char *name, ...)
{
	const char *bd = getenv("KVFS_BUILD_DIR");
	char bin[512];
	snprintf(bin, sizeof(bin), "%s/bin/kvfs-node", bd ? bd : ".");
	if (!np->dir[0]) {
		snprintf(np->dir, sizeof(np->dir), "%s/%s", g_tmp, name);
		mkdir(np->dir, 0755);
		snprintf(np->data, sizeof(np->data), "%s/data", np->dir);
		snprintf(np->addrf, sizeof(np->addrf), "%s/addr", np->dir);
	}
	unlink(np->addrf);
	char secf[512], logf[600];
	snprintf(secf, sizeof(secf), "%s/secret", g_tmp);
	snprintf(logf, sizeof(logf), "%s/node.log", np->dir);
	const char *argv[40] = {bin,  "--dir",	     np->data,	"--secret-file",
				secf, "--addr-file", np->addrf, "--log-level",
				"1"};
	int argc = 9;
	va_list ap;
	va_start(ap, name);
	const char *a;
	while ((a = va_arg(ap, const char *)) && argc < 38)
		argv[argc++] = a;
	va_end(ap);
	argv[argc] = NULL;
	pid_t pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		int fd = open(logf, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd >= 0)
			dup2(fd, 2);
		execv(bin, (char **)argv);
		_exit(127);
	}
	np->pid = pid;
	for (size_t i = 0; i < sizeof(g_live) / sizeof(g_live[0]); i++)
		if (!g_live[i]) {
			g_live[i] = pid;
			break;
		}
	for (double t0 = now_s(); now_s() - t0 < 10;) {
		FILE *f = fopen(np->addrf, "r");
		if (f) {
			int ok = fgets(np->addr, sizeof(np->addr), f) != NULL;
			fclose(f);
			if (ok) {
				np->addr[strcspn(np->addr, "\n")] = 0;
				return 0;
			}
		}
		int st;
		if (waitpid(pid, &st, WNOHANG) == pid) {
			live_forget(pid);
			np->pid = 0;
			return -ECHILD;
		}
		usleep(10000);
	}
	return -ETIMEDOUT;
}

/* SIGTERM (or sig), then SIGKILL after 10 s; returns the exit status, or 128+signal. */
static int node_stop(struct nodeproc *np, int sig)
{
	if (np->pid <= 0)
		return -1;
	kill(np->pid, sig);
	int st = 0;
	double t0 = now_s();
	while (waitpid(np->pid, &st, WNOHANG) != np->pid) {
		if (now_s() - t0 > 10) {
			kill(np->pid, SIGKILL);
			waitpid(np->pid, &st, 0);
			break;
		}
		usleep(5000);
	}
	live_forget(np->pid);
	np->pid = 0;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static struct kvp_client *connect_node(const struct nodeproc *np)
{
	struct kvp_client *c = NULL;
	assert_int_equal(kvp_client_open(np->addr, &g_sec, 5000, &c), 0);
	return c;
}

/* ---- request helpers ---- */

static int put_start(struct kvp_client *c, uint64_t id, const void *d, uint32_t len, uint32_t crc,
		     struct kvp_call **call)
{
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u64(&w, id);
	kvp_w_u32(&w, crc);
	kvp_w_u32(&w, len);
	int rc = kvp_call_start(c, KVP_OP_PUT, w.p, w.len, d, len, call);
	kvp_w_free(&w);
	return rc;
}

static int put(struct kvp_client *c, uint64_t id, const void *d, uint32_t len)
{
	struct kvp_call *call;
	int rc = put_start(c, id, d, len, kvec_crc32c(0, d, len), &call);
	return rc ? rc : kvp_call_wait(call, CALL_MS, NULL, NULL);
}

static int get_start(struct kvp_client *c, uint64_t id, uint32_t off, uint32_t len,
		     struct kvp_call **call)
{
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u64(&w, id);
	kvp_w_u32(&w, off);
	kvp_w_u32(&w, len);
	int rc = kvp_call_start(c, KVP_OP_GET, w.p, w.len, NULL, 0, call);
	kvp_w_free(&w);
	return rc;
}

/* VERIFY of id: 0 with the chunk's crc and length, or the node's error. */
static int verify(struct kvp_client *c, uint64_t id, uint32_t *crc, uint32_t *len)
{
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u64(&w, id);
	uint8_t *b = NULL;
	uint32_t bl = 0;
	int rc = kvp_call(c, KVP_OP_VERIFY, w.p, w.len, NULL, 0, CALL_MS, &b, &bl);
	kvp_w_free(&w);
	if (!rc) {
		struct kvp_rbuf r;
		kvp_r_init(&r, b, bl);
		*crc = kvp_r_u32(&r);
		*len = kvp_r_u32(&r);
		rc = kvp_r_end(&r);
	}
	free(b);
	return rc;
}

/* Waits for a GET; on success checks the body's framing and crc and returns the data. */
static int get_wait(struct kvp_call *call, uint8_t **data, uint32_t *len)
{
	uint8_t *b = NULL;
	uint32_t bl = 0;
	int rc = kvp_call_wait(call, CALL_MS, &b, &bl);
	if (rc)
		return rc;
	assert_true(bl >= 8);
	struct kvp_rbuf r;
	kvp_r_init(&r, b, bl);
	uint32_t crc = kvp_r_u32(&r), n = kvp_r_u32(&r);
	assert_int_equal(n, bl - 8);
	assert_int_equal(crc, kvec_crc32c(0, b + 8, n));
	*data = malloc(n ? n : 1);
	memcpy(*data, b + 8, n);
	*len = n;
	free(b);
	return 0;
}

static int get(struct kvp_client *c, uint64_t id, uint32_t off, uint32_t len, uint8_t **data,
	       uint32_t *dlen)
{
	struct kvp_call *call;
	int rc = get_start(c, id, off, len, &call);
	return rc ? rc : get_wait(call, data, dlen);
}

static long del(struct kvp_client *c, const uint64_t *ids, uint32_t n)
{
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u32(&w, n);
	for (uint32_t i = 0; i < n; i++)
		kvp_w_u64(&w, ids[i]);
	uint8_t *b = NULL;
	uint32_t bl = 0;
	int rc = kvp_call(c, KVP_OP_DEL, w.p, w.len, NULL, 0, CALL_MS, &b, &bl);
	kvp_w_free(&w);
	if (rc)
		return rc;
	assert_int_equal(bl, 4);
	struct kvp_rbuf r;
	kvp_r_init(&r, b, bl);
	long v = kvp_r_u32(&r);
	free(b);
	return v;
}

struct nstat {
	uint64_t uuid, capacity, used, chunks, crc_errors;
};

static void stat_node(struct kvp_client *c, struct nstat *s)
{
	uint8_t *b = NULL;
	uint32_t bl = 0;
	assert_int_equal(kvp_call(c, KVP_OP_STAT, NULL, 0, NULL, 0, CALL_MS, &b, &bl), 0);
	struct kvp_rbuf r;
	kvp_r_init(&r, b, bl);
	s->uuid = kvp_r_u64(&r);
	s->capacity = kvp_r_u64(&r);
	s->used = kvp_r_u64(&r);
	s->chunks = kvp_r_u64(&r);
	s->crc_errors = kvp_r_u64(&r);
	assert_int_equal(kvp_r_end(&r), 0);
	free(b);
}

/* One LIST page: ids into out (room for max), returns n; *more set. */
static uint32_t list_page(struct kvp_client *c, uint64_t after, uint32_t max, uint64_t *out,
			  int64_t *mt, int *more)
{
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u64(&w, after);
	kvp_w_u32(&w, max);
	uint8_t *b = NULL;
	uint32_t bl = 0;
	assert_int_equal(kvp_call(c, KVP_OP_LIST, w.p, w.len, NULL, 0, CALL_MS, &b, &bl), 0);
	kvp_w_free(&w);
	struct kvp_rbuf r;
	kvp_r_init(&r, b, bl);
	uint32_t n = kvp_r_u32(&r);
	assert_true(n <= max);
	for (uint32_t i = 0; i < n; i++) {
		out[i] = kvp_r_u64(&r);
		int64_t m = kvp_r_i64(&r);
		if (mt)
			mt[i] = m;
	}
	*more = kvp_r_u8(&r);
	assert_int_equal(kvp_r_end(&r), 0);
	free(b);
	return n;
}

static void chunk_path(const struct nodeproc *np, uint64_t id, char *out, size_t cap)
{
	snprintf(out, cap, "%s/chunks/%02x/%016" PRIx64, np->data, (unsigned)(id & 0xff), id);
}

/* ---- tests ---- */

static void test_sizes_and_ranges(void **state)
{
	(void)state;
	static const uint32_t sizes[] = {0, 1, 4095, 4096, (1u << 20) + 3, CHUNK_MAX};
	uint8_t *d = malloc(CHUNK_MAX);
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		uint32_t n = sizes[i];
		uint64_t id = 0x1000 + i;
		fill(d, n, id);
		assert_int_equal(put(g_cl, id, d, n), 0);
		uint8_t *g;
		uint32_t gl;
		assert_int_equal(get(g_cl, id, 0, LEN_TO_END, &g, &gl), 0);
		assert_int_equal(gl, n);
		assert_memory_equal(g, d, n);
		free(g);
		/* Ranges: first byte, interior, the tail, empty at the end. */
		uint32_t rs[][2] = {{0, n ? 1 : 0}, {n / 3, n / 2}, {n / 2, LEN_TO_END}, {n, 0}};
		for (int k = 0; k < 4; k++) {
			assert_int_equal(get(g_cl, id, rs[k][0], rs[k][1], &g, &gl), 0);
			uint32_t want = rs[k][1] == LEN_TO_END ? n - rs[k][0] : rs[k][1];
			assert_int_equal(gl, want);
			assert_memory_equal(g, d + rs[k][0], want);
			free(g);
			g = NULL; /* a get that fails leaves it alone (GCC 12 -O3 warns) */
		}
		assert_int_equal(get(g_cl, id, n + 1, 0, &g, &gl), -EINVAL);
		assert_int_equal(get(g_cl, id, n / 2, n - n / 2 + 1, &g, &gl), -EINVAL);
		/* A second PUT of the same id is refused and the first one kept. */
		assert_int_equal(put(g_cl, id, "x", 1), -EEXIST);
	}
	uint8_t *g;
	uint32_t gl;
	assert_int_equal(get(g_cl, 0xDEAD0000, 0, LEN_TO_END, &g, &gl), -ENOENT);
	/* A chunk whose data does not match the client's CRC is refused. */
	struct kvp_call *call;
	fill(d, 4096, 1);
	assert_int_equal(put_start(g_cl, 0x2000, d, 4096, kvec_crc32c(0, d, 4096) ^ 1, &call), 0);
	assert_int_equal(kvp_call_wait(call, CALL_MS, NULL, NULL), -EBADMSG);
	assert_int_equal(get(g_cl, 0x2000, 0, LEN_TO_END, &g, &gl), -ENOENT);
	/* Above the 16 MiB chunk maximum (the frame itself is still legal). */
	assert_int_equal(put(g_cl, 0x2001, d, 0), 0);
	free(d);
	d = calloc(1, CHUNK_MAX + 1);
	assert_int_equal(put(g_cl, 0x2002, d, CHUNK_MAX + 1), -EINVAL);
	assert_int_equal(kvp_client_alive(g_cl), 1);
	free(d);
}

static void test_pipelined(void **state)
{
	(void)state;
	enum { N = 200, SZ = 65536 + 17 };
	uint8_t *d = malloc((size_t)N * SZ);
	struct kvp_call *calls[N];
	for (int i = 0; i < N; i++) {
		fill(d + (size_t)i * SZ, SZ, 5000 + i);
		assert_int_equal(put_start(g_cl, 0x5000 + i, d + (size_t)i * SZ, SZ,
					   kvec_crc32c(0, d + (size_t)i * SZ, SZ), &calls[i]),
				 0);
	}
	for (int i = 0; i < N; i++)
		assert_int_equal(kvp_call_wait(calls[i], CALL_MS, NULL, NULL), 0);
	for (int i = 0; i < N; i++)
		assert_int_equal(get_start(g_cl, 0x5000 + i, 0, LEN_TO_END, &calls[i]), 0);
	for (int i = N - 1; i >= 0; i--) {
		uint8_t *g;
		uint32_t gl;
		assert_int_equal(get_wait(calls[i], &g, &gl), 0);
		assert_int_equal(gl, SZ);
		assert_memory_equal(g, d + (size_t)i * SZ, SZ);
		free(g);
	}
	uint64_t ids[N];
	for (int i = 0; i < N; i++)
		ids[i] = 0x5000 + i;
	assert_int_equal(del(g_cl, ids, N), N);
	free(d);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static void test_del_list_stat(void **state)
{
	(void)state;
	/* A fresh node so the numbers are exact. */
	struct nodeproc np = {0};
	/* A tiny ring (7 SQEs in flight) and one thread each: requests queue behind a full ring. */
	assert_int_equal(node_start(&np, "list", "--capacity", "64M", "--io-threads", "1",
				    "--ring-depth", "8", "--workers", "1", NULL),
			 0);
	struct kvp_client *c = connect_node(&np);
	enum { N = 300 };
	uint64_t ids[N];
	uint64_t used = 0;
	uint8_t d[1000];
	struct kvp_call *calls[N];
	for (int i = 0; i < N; i++) {
		/* Scattered ids, including ones at the ends of the u64 range. */
		ids[i] = i == 0 ? 1 : i == 1 ? UINT64_MAX : (uint64_t)i * 0x9E3779B97F4A7C15ull;
		uint32_t n = (uint32_t)(i * 3 % 1000);
		fill(d, n, ids[i]);
		assert_int_equal(put_start(c, ids[i], d, n, kvec_crc32c(0, d, n), &calls[i]), 0);
		used += n;
	}
	for (int i = 0; i < N; i++)
		assert_int_equal(kvp_call_wait(calls[i], CALL_MS, NULL, NULL), 0);
	struct nstat st;
	stat_node(c, &st);
	assert_int_equal(st.chunks, N);
	assert_int_equal(st.used, used);
	assert_int_equal(st.capacity, 64u << 20);
	assert_int_equal(st.crc_errors, 0);
	assert_true(st.uuid != 0);

	/* Paging: ascending, every id exactly once, mtimes recent. */
	uint64_t page[128], seen[N + 1];
	int64_t mt[128];
	size_t ns = 0;
	uint64_t after = 0;
	int more = 1, pages = 0;
	int64_t now = (int64_t)time(NULL) * 1000000000;
	while (more) {
		uint32_t n = list_page(c, after, 128, page, mt, &more);
		pages++;
		for (uint32_t i = 0; i < n; i++) {
			assert_true(page[i] > after);
			after = page[i];
			assert_true(mt[i] > now - 120 * 1000000000ll &&
				    mt[i] < now + 120000000000ll);
			assert_true(ns < N);
			seen[ns++] = page[i];
		}
		if (!n)
			break;
	}
	assert_int_equal(ns, N);
	assert_int_equal(pages, 3);
	uint64_t sorted[N];
	memcpy(sorted, ids, sizeof(sorted));
	qsort(sorted, N, sizeof(sorted[0]), cmp_u64);
	assert_memory_equal(seen, sorted, sizeof(sorted));
	assert_int_equal(list_page(c, UINT64_MAX, 10, page, NULL, &more), 0);
	assert_int_equal(more, 0);
	assert_int_equal(list_page(c, 0, 0, page, NULL, &more), 0);
	assert_int_equal(more, 1);

	/* Delete half, plus unknown and repeated ids: only the real ones count. */
	uint64_t dl[N / 2 + 3];
	uint64_t freed = 0;
	for (int i = 0; i < N / 2; i++) {
		dl[i] = ids[2 * i];
		freed += (uint32_t)(2 * i * 3 % 1000);
	}
	dl[N / 2] = 0x77;
	dl[N / 2 + 1] = ids[0];
	dl[N / 2 + 2] = 0x78;
	assert_int_equal(del(c, dl, N / 2 + 3), N / 2);
	assert_int_equal(del(c, dl, N / 2 + 3), 0);
	assert_int_equal(del(c, dl, 0), 0);
	stat_node(c, &st);
	assert_int_equal(st.chunks, N - N / 2);
	assert_int_equal(st.used, used - freed);
	uint8_t *g;
	uint32_t gl;
	assert_int_equal(get(c, ids[0], 0, LEN_TO_END, &g, &gl), -ENOENT);
	assert_int_equal(get(c, ids[1], 0, LEN_TO_END, &g, &gl), 0);
	free(g);
	char p[700];
	chunk_path(&np, ids[2], p, sizeof(p));
	assert_int_equal(access(p, F_OK), -1);
	chunk_path(&np, ids[3], p, sizeof(p));
	assert_int_equal(access(p, F_OK), 0);
	/* Deleted ids can be written again. */
	assert_int_equal(put(c, ids[0], "abc", 3), 0);
	kvp_client_close(c);
	assert_int_equal(node_stop(&np, SIGTERM), 0);
}

static void flip_byte(const char *path, off_t off)
{
	int fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	uint8_t b;
	assert_int_equal(pread(fd, &b, 1, off), 1);
	b ^= 0x40;
	assert_int_equal(pwrite(fd, &b, 1, off), 1);
	close(fd);
}

static void test_corruption(void **state)
{
	(void)state;
	struct nstat st0, st;
	stat_node(g_cl, &st0);
	uint8_t d[8192];
	fill(d, sizeof(d), 77);
	char p[700];
	uint8_t *g;
	uint32_t gl;
	uint32_t vcrc = 0, vlen = 0;
	/* A data byte, a header byte, a truncated file: each is refused, never served. */
	for (int k = 0; k < 3; k++) {
		uint64_t id = 0x7700 + k;
		assert_int_equal(put(g_cl, id, d, sizeof(d)), 0);
		assert_int_equal(get(g_cl, id, 100, 10, &g, &gl), 0);
		free(g);
		assert_int_equal(verify(g_cl, id, &vcrc, &vlen), 0);
		assert_int_equal(vcrc, kvec_crc32c(0, d, sizeof(d)));
		assert_int_equal(vlen, sizeof(d));
		chunk_path(&g_node, id, p, sizeof(p));
		if (k == 0)
			flip_byte(p, NODE_HDR_LEN + 5000);
		else if (k == 1)
			flip_byte(p, 9);
		else
			assert_int_equal(truncate(p, NODE_HDR_LEN + 4096), 0);
		assert_int_equal(get(g_cl, id, 0, LEN_TO_END, &g, &gl), -EILSEQ);
		/* A range that avoids the bad byte is refused too: the whole chunk is checked. */
		assert_int_equal(get(g_cl, id, 0, 10, &g, &gl), -EILSEQ);
		/* So is a VERIFY (what scrub asks for): it reads and checks without sending. */
		assert_int_equal(verify(g_cl, id, &vcrc, &vlen), -EILSEQ);
		stat_node(g_cl, &st);
		assert_int_equal(st.crc_errors, st0.crc_errors + 3 * (k + 1));
	}
	/* Repair in place: the corrupt chunk blocks a PUT of its id until it is deleted. */
	assert_int_equal(put(g_cl, 0x7700, d, sizeof(d)), -EEXIST);
	uint64_t bad = 0x7700;
	assert_int_equal(del(g_cl, &bad, 1), 1);
	assert_int_equal(put(g_cl, 0x7700, d, sizeof(d)), 0);
	assert_int_equal(get(g_cl, 0x7700, 0, LEN_TO_END, &g, &gl), 0);
	assert_int_equal(gl, sizeof(d));
	assert_memory_equal(g, d, sizeof(d));
	free(g);
	assert_int_equal(verify(g_cl, 0x7700, &vcrc, &vlen), 0);
	assert_int_equal(verify(g_cl, 0x77ff, &vcrc, &vlen), -ENOENT);
	assert_int_equal(kvp_client_alive(g_cl), 1);
}

static void test_capacity(void **state)
{
	(void)state;
	/* Options from a config file (same table as the flags). */
	char conf[300];
	snprintf(conf, sizeof(conf), "%s/cap.conf", g_tmp);
	FILE *f = fopen(conf, "w");
	assert_non_null(f);
	fprintf(f, "# a small node\ncapacity = 1M\nio-threads = 1\n");
	fclose(f);
	struct nodeproc np = {0};
	assert_int_equal(node_start(&np, "cap", "--config", conf, NULL), 0);
	struct kvp_client *c = connect_node(&np);
	uint8_t *d = malloc(1 << 20);
	fill(d, 1 << 20, 3);
	assert_int_equal(put(c, 1, d, 512 << 10), 0);
	assert_int_equal(put(c, 2, d, (512 << 10) + 1), -ENOSPC);
	assert_int_equal(put(c, 3, d, 256 << 10), 0);
	/* Many concurrent puts cannot overshoot: exactly the room left (256K) is granted. */
	struct kvp_call *calls[16];
	for (int i = 0; i < 16; i++)
		assert_int_equal(
		    put_start(c, 100 + i, d, 64 << 10, kvec_crc32c(0, d, 64 << 10), &calls[i]), 0);
	int ok = 0, full = 0;
	for (int i = 0; i < 16; i++) {
		int rc = kvp_call_wait(calls[i], CALL_MS, NULL, NULL);
		ok += rc == 0;
		full += rc == -ENOSPC;
	}
	assert_int_equal(ok, 4);
	assert_int_equal(full, 12);
	struct nstat st;
	stat_node(c, &st);
	assert_int_equal(st.used, 1 << 20);
	/* What is stored is intact. */
	uint8_t *g;
	uint32_t gl;
	assert_int_equal(get(c, 1, 0, LEN_TO_END, &g, &gl), 0);
	assert_int_equal(gl, 512 << 10);
	assert_memory_equal(g, d, 512 << 10);
	free(g);
	/* Deleting makes room again. */
	uint64_t one = 1;
	assert_int_equal(del(c, &one, 1), 1);
	assert_int_equal(put(c, 2, d, (512 << 10)), 0);
	assert_int_equal(put(c, 4, d, 1), -ENOSPC);
	free(d);
	kvp_client_close(c);
	assert_int_equal(node_stop(&np, SIGTERM), 0);
}

/* The node's data directory on a tmpfs of its own (test_disk), unmounted by the group
 * teardown if the test failed first. */
static char g_tmpfs[700];

/* Capacity is the disk's: on a 4 MiB filesystem with a 1 MiB reserve a node offers ~3 MiB
 * (no --capacity), takes two 1 MiB chunks and refuses the third (it would go into the
 * reserve), offers less when something else fills its disk, and --capacity still caps it. */
static void test_disk(void **state)
{
	(void)state;
	struct nodeproc np = {0};
	snprintf(np.dir, sizeof(np.dir), "%s/disk", g_tmp);
	snprintf(np.data, sizeof(np.data), "%s/data", np.dir);
	snprintf(np.addrf, sizeof(np.addrf), "%s/addr", np.dir);
	char cmd[1600];
	snprintf(cmd, sizeof(cmd),
		 "mkdir -p '%s' && mount -t tmpfs -o size=4m tmpfs '%s' 2>/dev/null", np.data,
		 np.data);
	if (system(cmd) != 0)
		skip(); /* not root */
	snprintf(g_tmpfs, sizeof(g_tmpfs), "%s", np.data);
	assert_int_equal(node_start(&np, "disk", "--reserve", "1M", "--io-threads", "1", NULL), 0);
	struct kvp_client *c = connect_node(&np);
	struct nstat st;
	stat_node(c, &st);
	assert_true(st.capacity > (2900u << 10) && st.capacity <= (3u << 20));
	uint8_t *d = malloc(1 << 20);
	fill(d, 1 << 20, 5);
	assert_int_equal(put(c, 1, d, 1 << 20), 0);
	assert_int_equal(put(c, 2, d, 1 << 20), 0);
	assert_int_equal(put(c, 3, d, 1 << 20), -ENOSPC);
	assert_int_equal(put(c, 4, d, 512 << 10), 0);
	struct nstat st2;
	stat_node(c, &st2);
	assert_int_equal(st2.used, (2u << 20) + (512u << 10));
	/* Held chunks + free space: the same room, less the headers and block rounding. */
	assert_true(st2.capacity <= st.capacity && st2.capacity + (64u << 10) > st.capacity);
	/* Another writer takes 256 KiB of the disk: the node offers that much less. */
	snprintf(cmd, sizeof(cmd), "head -c 256K /dev/zero > '%s/junk'", np.data);
	assert_int_equal(system(cmd), 0);
	stat_node(c, &st);
	assert_true(st.capacity + (256u << 10) <= st2.capacity);
	assert_int_equal(put(c, 5, d, 512 << 10), -ENOSPC); /* ~250 KiB left above the reserve */
	uint64_t one = 1;
	assert_int_equal(del(c, &one, 1), 1);
	assert_int_equal(put(c, 5, d, 512 << 10), 0); /* deleting makes room again */
	kvp_client_close(c);
	assert_int_equal(node_stop(&np, SIGTERM), 0);
	/* --capacity caps what the disk offers. */
	np.pid = 0;
	assert_int_equal(node_start(&np, "disk", "--reserve", "1M", "--capacity", "1M", NULL), 0);
	c = connect_node(&np);
	stat_node(c, &st);
	assert_int_equal(st.capacity, 1u << 20);
	kvp_client_close(c);
	assert_int_equal(node_stop(&np, SIGTERM), 0);
	free(d);
	snprintf(cmd, sizeof(cmd), "umount '%s'", g_tmpfs);
	assert_int_equal(system(cmd), 0);
	g_tmpfs[0] = 0;
}

static void test_crash_restart(void **state)
{
	(void)state;
	struct nodeproc np = {0};
	assert_int_equal(node_start(&np, "crash", "--sync", NULL), 0);
	struct kvp_client *c = connect_node(&np);
	enum { N = 64 };
	uint8_t *d = malloc(N * 5000);
	uint64_t used = 0;
	for (int i = 0; i < N; i++) {
		fill(d + i * 5000, 5000, 900 + i);
		assert_int_equal(put(c, 0xC000 + i, d + i * 5000, 100 + i * 70), 0);
		used += 100 + i * 70;
	}
	struct nstat st0, st;
	stat_node(c, &st0);
	kvp_client_close(c);
	assert_int_equal(node_stop(&np, SIGKILL), 128 + SIGKILL);

	/* What a crash mid-PUT leaves: a temp file (never renamed) and, on a filesystem that
	 * lost the data of a renamed file, an empty chunk file. */
	char p[700];
	snprintf(p, sizeof(p), "%s/tmp/000000000000c0ff.7", np.data);
	int fd = open(p, O_WRONLY | O_CREAT, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, d, 3000), 3000);
	close(fd);
	char empty[700];
	chunk_path(&np, 0xC0FE, empty, sizeof(empty));
	fd = open(empty, O_WRONLY | O_CREAT, 0644);
	assert_true(fd >= 0);
	close(fd);

	/* Restarted with O_DIRECT reads: chunk files end off a block boundary. */
	assert_int_equal(node_start(&np, "crash", "--direct-read", NULL), 0);
	/* A second node on the same directory is refused (it exits without serving). */
	struct nodeproc twin = np;
	snprintf(twin.addrf, sizeof(twin.addrf), "%s/addr2", np.dir);
	assert_int_equal(node_start(&twin, "crash", NULL), -ECHILD);
	c = connect_node(&np);
	stat_node(c, &st);
	assert_int_equal(st.uuid, st0.uuid);
	assert_int_equal(st.chunks, N);
	assert_int_equal(st.used, used);
	for (int i = 0; i < N; i++) {
		uint8_t *g;
		uint32_t gl;
		assert_int_equal(get(c, 0xC000 + i, 0, LEN_TO_END, &g, &gl), 0);
		assert_int_equal(gl, 100 + i * 70);
		assert_memory_equal(g, d + i * 5000, gl);
		free(g);
	}
	uint8_t *g;
	uint32_t gl;
	assert_int_equal(get(c, 0xC0FF, 0, LEN_TO_END, &g, &gl), -ENOENT);
	assert_int_equal(get(c, 0xC0FE, 0, LEN_TO_END, &g, &gl), -ENOENT);
	assert_int_equal(access(p, F_OK), -1);
	assert_int_equal(access(empty, F_OK), -1);
	/* The lost ids can be written again. */
	assert_int_equal(put(c, 0xC0FF, d, 10), 0);
	/* Files cut short while the node runs (at a block boundary and off one) are corrupt. */
	for (int k = 0; k < 2; k++) {
		chunk_path(&np, 0xC000 + N - 1 - k, p, sizeof(p));
		assert_int_equal(truncate(p, k ? 1000 : 4096), 0);
		assert_int_equal(get(c, 0xC000 + N - 1 - k, 0, 1, &g, &gl), -EILSEQ);
	}
	stat_node(c, &st);
	assert_int_equal(st.crc_errors, 2);
	free(d);
	kvp_client_close(c);
	assert_int_equal(node_stop(&np, SIGTERM), 0);
}

/* Pages of path the page cache holds (mincore of a mapping; no I/O). */
static size_t cached_pages(const char *path)
{
	int fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	struct stat st;
	assert_int_equal(fstat(fd, &st), 0);
	long pg = sysconf(_SC_PAGESIZE);
	size_t np = ((size_t)st.st_size + (size_t)pg - 1) / (size_t)pg, n = 0;
	void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	assert_true(m != MAP_FAILED);
	unsigned char *v = malloc(np);
	assert_int_equal(mincore(m, (size_t)st.st_size, v), 0);
	for (size_t i = 0; i < np; i++)
		n += v[i] & 1;
	free(v);
	munmap(m, (size_t)st.st_size);
	close(fd);
	return n;
}

/* Drops a chunk file from the page cache (clean after fsync). */
static void drop_chunk(const struct nodeproc *np, uint64_t id)
{
	char p[700];
	chunk_path(np, id, p, sizeof(p));
	int fd = open(p, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(fdatasync(fd), 0);
	assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
	close(fd);
	assert_int_equal(cached_pages(p), 0);
}

/* --direct-cold (the default): a chunk the page cache does not hold is read with O_DIRECT
 * (so it stays out of the cache), whole or in part, at lengths on and off a block boundary;
 * one the cache holds is read through it; with --direct-cold=false a cold read fills the
 * cache as before. */
static void test_direct_cold(void **state)
{
	(void)state;
	const uint32_t lens[] = {1, 4096 - 64, 4096, 100000, 1u << 20};
	enum { NL = sizeof(lens) / sizeof(lens[0]) };
	uint8_t *d = malloc(1u << 20);
	char p[700];
	for (int mode = 0; mode < 2; mode++) {
		struct nodeproc np = {0};
		assert_int_equal(node_start(&np, mode ? "cold-off" : "cold",
					    mode ? "--direct-cold=false" : NULL, NULL),
				 0);
		struct kvp_client *c = connect_node(&np);
		for (int i = 0; i < NL; i++) {
			fill(d, lens[i], 70 + (uint64_t)i);
			assert_int_equal(put(c, 0xD000 + (uint64_t)i, d, lens[i]), 0);
			drop_chunk(&np, 0xD000 + (uint64_t)i);
			uint8_t *g;
			uint32_t gl;
			assert_int_equal(get(c, 0xD000 + (uint64_t)i, 0, LEN_TO_END, &g, &gl), 0);
			assert_int_equal(gl, lens[i]);
			assert_memory_equal(g, d, gl);
			free(g);
			g = NULL;
			chunk_path(&np, 0xD000 + (uint64_t)i, p, sizeof(p));
			if (mode == 0)
				assert_int_equal(cached_pages(p), 0);
			else
				assert_true(cached_pages(p) > 0);
			/* A range of a cold chunk. */
			drop_chunk(&np, 0xD000 + (uint64_t)i);
			uint32_t off = lens[i] / 3, len = lens[i] - off;
			assert_int_equal(get(c, 0xD000 + (uint64_t)i, off, len, &g, &gl), 0);
			assert_int_equal(gl, len);
			assert_memory_equal(g, d + off, len);
			free(g);
		}
		/* Held by the cache: read through it (it stays cached). */
		fill(d, 100000, 99);
		assert_int_equal(put(c, 0xD100, d, 100000), 0);
		chunk_path(&np, 0xD100, p, sizeof(p));
		assert_true(cached_pages(p) > 0);
		uint8_t *g;
		uint32_t gl;
		assert_int_equal(get(c, 0xD100, 0, LEN_TO_END, &g, &gl), 0);
		assert_memory_equal(g, d, 100000);
		free(g);
		assert_true(cached_pages(p) > 0);
		kvp_client_close(c);
		assert_int_equal(node_stop(&np, SIGTERM), 0);
	}
	free(d);
}

/* A peer that pipelines GETs and never reads the replies: with one completion worker, its
 * replies held that worker in a blocked send for as long as the connection stayed open, so
 * every other client's requests went unanswered. The reply timeout closes that connection. */
static void test_slow_reader(void **state)
{
	(void)state;
	enum { SZ = 4 << 20, NGET = 64 };
	struct nodeproc np = {0};
	assert_int_equal(node_start(&np, "slow", "--workers", "1", "--reply-timeout", "1s", NULL),
			 0);
	struct kvp_client *good = connect_node(&np);
	uint8_t *d = malloc(SZ);
	fill(d, SZ, 77);
	assert_int_equal(put(good, 0x7000, d, SZ), 0);

	struct kvp_sock *k = sock_authed(np.addr, &g_sec);
	for (int i = 0; i < NGET; i++) {
		struct kvp_wbuf w;
		kvp_w_init(&w);
		kvp_w_u64(&w, 0x7000);
		kvp_w_u32(&w, 0);
		kvp_w_u32(&w, LEN_TO_END);
		struct kvp_hdr h = {.op = KVP_OP_GET, .id = (uint64_t)i + 1};
		assert_int_equal(kvp_send(k, &h, w.p, w.len, NULL, 0), 0);
		kvp_w_free(&w);
	}
	usleep(300000); /* the worker is now blocked on the full socket */

	/* The well-behaved client is answered (after the timeout frees the worker). */
	struct kvp_call *call;
	assert_int_equal(get_start(good, 0x7000, 0, LEN_TO_END, &call), 0);
	uint8_t *g = NULL;
	uint32_t gl = 0;
	assert_int_equal(get_wait(call, &g, &gl), 0);
	assert_int_equal(gl, SZ);
	assert_memory_equal(g, d, SZ);
	free(g);

	/* The stalled connection was closed: what it can read ends in EOF, short of all replies. */
	size_t cap = 1 << 20, got = 0;
	uint8_t *b = malloc(cap);
	long n;
	while ((n = kvp_sock_read(k, b, cap, 5000)) > 0)
		got += (size_t)n;
	assert_true(n == 0 || n == -ECONNRESET);
	assert_true(got < (size_t)NGET * SZ);
	free(b);
	kvp_sock_close(k);

	kvp_client_close(good);
	free(d);
	assert_int_equal(node_stop(&np, SIGTERM), 0);
}

static void test_auth_and_bad_frames(void **state)
{
	(void)state;
	struct kvp_secret bad;
	assert_int_equal(kvp_secret_from_string("a-wrong-secret-of-some-length", &bad), 0);
	struct kvp_client *c = NULL;
	assert_int_equal(kvp_client_open(g_node.addr, &bad, 5000, &c), -EACCES);

	uint8_t hb[KVP_HDR_SIZE];
	/* Garbage instead of a header. */
	struct kvp_sock *k = sock_authed(g_node.addr, &g_sec);
	memset(hb, 0xA5, sizeof(hb));
	assert_int_equal(kvp_sock_write(k, hb, sizeof(hb)), 0);
	assert_true(sock_closed(k));
	kvp_sock_close(k);
	/* A header announcing more than any peer accepts. */
	k = sock_authed(g_node.addr, &g_sec);
	struct kvp_hdr h = {.magic = KVP_MAGIC,
			    .version = KVP_VERSION,
			    .op = KVP_OP_PUT,
			    .id = 1,
			    .len = KVP_MAX_BODY + 1};
	kvp_hdr_encode(&h, hb);
	assert_int_equal(kvp_sock_write(k, hb, sizeof(hb)), 0);
	assert_true(sock_closed(k));
	kvp_sock_close(k);
	/* A truncated frame: header promises 100 bytes, 10 arrive, then the writer hangs up. */
	k = sock_authed(g_node.addr, &g_sec);
	h.len = 100;
	kvp_hdr_encode(&h, hb);
	assert_int_equal(kvp_sock_write(k, hb, sizeof(hb)), 0);
	assert_int_equal(kvp_sock_write(k, hb, 10), 0);
	shutdown(kvp_sock_fd(k), SHUT_WR);
	assert_true(sock_closed(k));
	kvp_sock_close(k);
	/* Well-framed bodies that do not parse: PUT whose len disagrees with its data, GET one
	 * byte short, DEL whose count disagrees with its ids, VERIFY one byte long. */
	uint8_t body[64] = {0};
	struct {
		uint16_t op;
		uint32_t len;
		uint32_t put_len;
	} cases[] = {{KVP_OP_PUT, 16 + 8, 9},
		     {KVP_OP_GET, 15, 0},
		     {KVP_OP_DEL, 4 + 16, 3},
		     {KVP_OP_VERIFY, 9, 0}};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		k = sock_authed(g_node.addr, &g_sec);
		memset(body, 0, sizeof(body));
		if (cases[i].op == KVP_OP_PUT)
			body[12] = (uint8_t)cases[i].put_len;
		if (cases[i].op == KVP_OP_DEL)
			body[0] = (uint8_t)cases[i].put_len;
		struct kvp_hdr q = {.op = cases[i].op, .id = 9};
		assert_int_equal(kvp_send(k, &q, body, cases[i].len, NULL, 0), 0);
		assert_true(sock_closed(k));
		kvp_sock_close(k);
	}
	/* An op a node does not serve is answered with an error; the connection stays. */
	k = sock_authed(g_node.addr, &g_sec);
	struct kvp_hdr q = {.op = KVP_OP_LOOKUP, .id = 11};
	assert_int_equal(kvp_send(k, &q, NULL, 0, NULL, 0), 0);
	struct kvp_hdr rh;
	uint8_t *rb = NULL;
	assert_int_equal(kvp_recv(k, &rh, &rb, KVP_MAX_BODY), 0);
	assert_int_equal(rh.id, 11);
	assert_int_equal(rh.status, -EOPNOTSUPP);
	q.op = KVP_OP_STAT;
	q.id = 12;
	assert_int_equal(kvp_send(k, &q, NULL, 0, NULL, 0), 0);
	assert_int_equal(kvp_recv(k, &rh, &rb, KVP_MAX_BODY), 0);
	assert_int_equal(rh.status, 0);
	assert_int_equal(rh.len, 40);
	free(rb);
	kvp_sock_close(k);
	/* The shared client was never disturbed. */
	struct nstat st;
	stat_node(g_cl, &st);
	assert_int_equal(kvp_client_alive(g_cl), 1);
}

/* A stand-in metadata server that records heartbeats. */
struct fake_meta {
	pthread_mutex_t mu;
	int beats;
	uint64_t uuid, capacity;
	char addr[KVP_ADDR_MAX];
};

static int meta_handler(void *ctx, struct kvp_conn *c, const struct kvp_hdr *h, uint8_t *body)
{
	struct fake_meta *m = ctx;
	if (h->op != KVP_OP_HEARTBEAT) {
		free(body);
		return -EPROTO;
	}
	struct kvp_rbuf r;
	kvp_r_init(&r, body, h->len);
	pthread_mutex_lock(&m->mu);
	m->uuid = kvp_r_u64(&r);
	kvp_r_str(&r, m->addr, sizeof(m->addr));
	m->capacity = kvp_r_u64(&r);
	kvp_r_u64(&r);
	kvp_r_u64(&r);
	int rc = kvp_r_end(&r);
	if (!rc)
		m->beats++;
	pthread_mutex_unlock(&m->mu);
	free(body);
	if (rc)
		return rc;
	uint8_t id[4] = {7, 0, 0, 0};
	kvp_reply(c, h, 0, id, 4, NULL, 0);
	return 0;
}

static int wait_beats(struct fake_meta *m, int n)
{
	for (double t0 = now_s(); now_s() - t0 < 10; usleep(10000)) {
		pthread_mutex_lock(&m->mu);
		int b = m->beats;
		pthread_mutex_unlock(&m->mu);
		if (b >= n)
			return 0;
	}
	return -ETIMEDOUT;
}

static void test_heartbeat(void **state)
{
	(void)state;
	struct fake_meta m = {.mu = PTHREAD_MUTEX_INITIALIZER};
	struct kvp_server_opts o = {.name = "fake-meta",
				    .host = "127.0.0.1",
				    .secret = &g_sec,
				    .handler = meta_handler,
				    .ctx = &m};
	struct kvp_server *srv = NULL;
	assert_int_equal(kvp_server_start(&o, &srv), 0);
	uint16_t port = kvp_server_port(srv);
	char maddr[32];
	snprintf(maddr, sizeof(maddr), "127.0.0.1:%u", port);
	struct nodeproc np = {0};
	assert_int_equal(
	    node_start(&np, "hb", "--meta", maddr, "--heartbeat", "50ms", "--capacity", "3G", NULL),
	    0);
	assert_int_equal(wait_beats(&m, 3), 0);
	pthread_mutex_lock(&m.mu);
	assert_string_equal(m.addr, np.addr);
	assert_int_equal(m.capacity, 3ull << 30);
	assert_true(m.uuid != 0);
	pthread_mutex_unlock(&m.mu);
	/* The metadata server goes away and comes back on the same port: beats resume. */
	kvp_server_stop(srv);
	usleep(300000);
	m.beats = 0;
	o.port = port;
	assert_int_equal(kvp_server_start(&o, &srv), 0);
	assert_int_equal(wait_beats(&m, 2), 0);
	kvp_server_stop(srv);
	assert_int_equal(node_stop(&np, SIGINT), 0);
}

/* Runs kvfs-node with args (a shell fragment) and returns its exit status; out gets stdout. */
static int run_node(const char *args, char *out, size_t cap)
{
	const char *bd = getenv("KVFS_BUILD_DIR");
	char cmd[1024];
	snprintf(cmd, sizeof(cmd), "'%s/bin/kvfs-node' %s 2>/dev/null", bd ? bd : ".", args);
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	size_t n = fread(out, 1, cap - 1, p);
	out[n] = 0;
	int st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_flags(void **state)
{
	(void)state;
	char *out = malloc(16384);
	assert_int_equal(run_node("--help", out, 16384), 0);
	static const char *const flags[] = {"--listen",	     "--dir",	      "--meta",
					    "--secret-file", "--capacity",    "--heartbeat",
					    "--addr-file",   "--log-level",   "--config",
					    "--sync",	     "--direct-read", "--reply-timeout"};
	for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++)
		assert_non_null(strstr(out, flags[i]));
	assert_int_equal(run_node("--no-such-flag 1", out, 16384), 2);
	assert_int_equal(run_node("--capacity banana --dir /nonexistent", out, 16384), 2);
	/* Required flags. */
	char args[700];
	snprintf(args, sizeof(args), "--dir '%s/flags'", g_tmp);
	assert_int_equal(run_node(args, out, 16384), 2);
	free(out);
}

/* The index on its own: random inserts and removals against a plain array, list pages
 * against a sorted copy (hash collisions, backward-shift deletion, growth, selection). */
static void test_index(void **state)
{
	(void)state;
	enum { M = 20000 };
	struct node_index *x;
	assert_int_equal(node_index_create(&x), 0);
	uint64_t *ref = malloc(M * sizeof(*ref));
	uint8_t *in = calloc(M, 1);
	uint64_t seed = 12345;
	for (int i = 0; i < M; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		/* Small ids collide in the low bits; big ones spread. */
		ref[i] = i % 3 ? seed >> 7 : (uint64_t)i;
	}
	size_t live = 0;
	for (int round = 0; round < 4; round++) {
		for (int i = 0; i < M; i++) {
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			int want = (seed >> 33) % 4 != 0;
			if (want && !in[i]) {
				struct node_chunk *e = node_index_insert(x, ref[i]);
				assert_non_null(e);
				e->state = NODE_CHUNK_LIVE;
				e->len = (uint32_t)i;
				in[i] = 1;
				live++;
			} else if (!want && in[i]) {
				assert_int_equal(node_index_remove(x, ref[i]), 0);
				in[i] = 0;
				live--;
			}
		}
		assert_int_equal(node_index_count(x), live);
		for (int i = 0; i < M; i++) {
			struct node_chunk *e = node_index_find(x, ref[i]);
			assert_int_equal(e != NULL, in[i]);
			if (e)
				assert_int_equal(e->len, (uint32_t)i);
		}
	}
	assert_int_equal(node_index_remove(x, 0xFFFFFFFFFFFFull), -ENOENT);
	uint64_t *sorted = malloc(live * sizeof(*sorted));
	size_t k = 0;
	for (int i = 0; i < M; i++)
		if (in[i])
			sorted[k++] = ref[i];
	qsort(sorted, k, sizeof(*sorted), cmp_u64);
	struct node_chunk page[777];
	uint64_t after = 0;
	size_t got = 0;
	int more = 1;
	if (k && sorted[0] == 0) /* id 0 is never above start_after = 0 */
		got = 1;
	while (more) {
		long n = node_index_list(x, after, 777, page, &more);
		assert_true(n >= 0);
		for (long i = 0; i < n; i++) {
			assert_true(got < k);
			assert_int_equal(page[i].id, sorted[got]);
			got++;
		}
		if (n)
			after = page[n - 1].id;
	}
	assert_int_equal(got, k);
	free(sorted);
	free(ref);
	free(in);
	node_index_destroy(x);
}

static int group_setup(void **state)
{
	(void)state;
	signal(SIGPIPE, SIG_IGN);
	snprintf(g_tmp, sizeof(g_tmp), "/tmp/kvfs-test-node-XXXXXX");
	if (!mkdtemp(g_tmp))
		return -1;
	char p[300];
	snprintf(p, sizeof(p), "%s/secret", g_tmp);
	FILE *f = fopen(p, "w");
	if (!f)
		return -1;
	fprintf(f, "%s\n", SECRET);
	fclose(f);
	if (kvp_secret_from_string(SECRET, &g_sec))
		return -1;
	/* A small in-flight budget: pipelined tests run into back-pressure, and a 16 MiB chunk
	 * must still pass alone. */
	if (node_start(&g_node, "main", "--max-inflight", "1M", NULL)) {
		fprintf(stderr, "cannot start kvfs-node (KVFS_BUILD_DIR=%s)\n",
			getenv("KVFS_BUILD_DIR"));
		return -1;
	}
	if (kvp_client_open(g_node.addr, &g_sec, 5000, &g_cl))
		return -1;
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	kvp_client_close(g_cl);
	int rc = node_stop(&g_node, SIGTERM);
	if (rc != 0)
		fprintf(stderr, "kvfs-node exited with %d on SIGTERM\n", rc);
	for (size_t i = 0; i < sizeof(g_live) / sizeof(g_live[0]); i++)
		if (g_live[i]) {
			fprintf(stderr, "killing kvfs-node %d left by a failed test\n",
				(int)g_live[i]);
			kill(g_live[i], SIGKILL);
			waitpid(g_live[i], NULL, 0);
		}
	char cmd[800];
	if (g_tmpfs[0]) {
		snprintf(cmd, sizeof(cmd), "umount '%s'", g_tmpfs);
		if (system(cmd) != 0)
			fprintf(stderr, "could not unmount %s\n", g_tmpfs);
	}
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_tmp);
	if (getenv("KVFS_TEST_KEEP")) /* keep the node directories and logs for a look */
		fprintf(stderr, "kept %s\n", g_tmp);
	else if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", g_tmp);
	return rc == 0 ? 0 : -1;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_index),
	    cmocka_unit_test(test_sizes_and_ranges),
	    cmocka_unit_test(test_pipelined),
	    cmocka_unit_test(test_del_list_stat),
	    cmocka_unit_test(test_corruption),
	    cmocka_unit_test(test_capacity),
	    cmocka_unit_test(test_crash_restart),
	    cmocka_unit_test(test_direct_cold),
	    cmocka_unit_test(test_auth_and_bad_frames),
	    cmocka_unit_test(test_heartbeat),
	    cmocka_unit_test(test_flags),
	    cmocka_unit_test(test_slow_reader),
	    cmocka_unit_test(test_disk),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
