/* Helpers shared by the cluster integration tests (test_retention.c, test_repair.c,
 * test_chunk.c, test_cluster.c, test_hosts*.c, test_raft*.c): cluster teardown, seeded file
 * contents, chunk files on the nodes' disks, meta's MSTATUS. */
#ifndef KVFS_RET_TUTIL_H
#define KVFS_RET_TUTIL_H

#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "build_tutil.h"
#include "harness.h"
#include "kvc.h"

/* 1 when kvh_bin finds the kvfs-meta and kvfs-node binaries (an integration test skips if not). */
static inline int rt_have_bins(void)
{
	char bin[600];
	return kvh_bin("kvfs-meta", bin, sizeof(bin)) == 0 &&
	       kvh_bin("kvfs-node", bin, sizeof(bin)) == 0;
}

/* Ends the running test (a failure; a skip under KVFS_TEST_ALLOW_SKIP=1, build_tutil.h) unless
 * the kvfs-meta and kvfs-node binaries are there. */
static inline void rt_need_bins(void)
{
	if (!rt_have_bins())
		tu_no_build("kvfs-meta / kvfs-node (under $KVFS_BUILD_DIR/bin, else ./bin)");
}

/* main()'s check of a test that starts kvfs-meta / kvfs-node itself: 0 when both are there;
 * else it says why and returns 77 (CTest's "skipped") under KVFS_TEST_ALLOW_SKIP=1, or 1. */
static inline int rt_main_bins(void)
{
	if (rt_have_bins())
		return 0;
	if (tu_skip_allowed()) {
		printf("skipped: kvfs-meta / kvfs-node not built\n");
		return 77;
	}
	printf("kvfs-meta / kvfs-node not found (KVFS_BUILD_DIR %s): set KVFS_BUILD_DIR to the "
	       "build directory (ctest does), or KVFS_TEST_ALLOW_SKIP=1 to skip\n",
	       getenv("KVFS_BUILD_DIR") ? getenv("KVFS_BUILD_DIR") : "unset");
	return 1;
}

/* A test's scratch directory removed, unless KVFS_TEST_KEEP is set (to look at its logs). */
static inline void rt_rm_dir(const char *dir)
{
	if (!getenv("KVFS_TEST_KEEP"))
		kvh_sh("rm -rf %s", dir);
}

/* A cluster test's start: ends the running test without the kvfs binaries (rt_need_bins); else sets
 * *up (the teardown's rt_stop then stops even a half-started cluster) and starts cl as
 * kvh_cluster_start_flags does, failing the test unless it started. */
static inline void rt_start(struct kvh_cluster *cl, int *up, int nnodes, const char *meta_args,
			    const char *node_args, unsigned flags)
{
	rt_need_bins();
	*up = 1;
	assert_int_equal(kvh_cluster_start_flags(cl, nnodes, meta_args, node_args, flags), 0);
}

/* A test's teardown: closes *c, stops *cl if *up (even half-started), and clears both. */
static inline void rt_stop(struct kvh_cluster *cl, int *up, struct kvc **c)
{
	kvc_close(*c);
	*c = NULL;
	if (*up)
		kvh_cluster_stop(cl);
	*up = 0;
}

static inline void rt_fill(uint8_t *p, size_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (uint8_t)x;
	}
}

/* Another seeded fill, 8 bytes a step (test_cluster's 300 MiB stay cheap to make and check). */
static inline void rt_fill8(uint8_t *p, size_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x1234567;
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(p + i, &x, 8);
	}
	for (; i < n; i++)
		p[i] = (uint8_t)(x >> (8 * (i & 7)));
}

typedef void (*rt_fill_fn)(uint8_t *p, size_t n, uint64_t seed);

static inline int64_t rt_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void rt_sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
	nanosleep(&ts, NULL);
}

/* Writes path as fill(size, seed) (kvc_put; replace as there). 0, -ENOMEM or kvc_put's error. */
static inline int rt_put_as(struct kvc *c, const char *path, size_t size, uint64_t seed,
			    int replace, rt_fill_fn fill)
{
	uint8_t *b = malloc(size ? size : 1);
	if (!b)
		return -ENOMEM;
	fill(b, size, seed);
	int rc = kvc_put(c, path, b, size, replace);
	free(b);
	return rc;
}

/* 0 when path reads back as fill(size, seed); -EILSEQ on a mismatch; else kvc_get's error. */
static inline int rt_check_as(struct kvc *c, const char *path, size_t size, uint64_t seed,
			      rt_fill_fn fill)
{
	void *got = NULL;
	size_t len = 0;
	int rc = kvc_get(c, path, &got, &len);
	if (rc)
		return rc;
	uint8_t *want = malloc(size ? size : 1);
	int ok = want != NULL;
	if (ok) {
		fill(want, size, seed);
		ok = len == size && memcmp(got, want, size) == 0;
	}
	free(want);
	free(got);
	return !want ? -ENOMEM : ok ? 0 : -EILSEQ;
}

/* rt_put_as with rt_fill, replacing. */
static inline int rt_put(struct kvc *c, const char *path, size_t size, uint64_t seed)
{
	return rt_put_as(c, path, size, seed, 1, rt_fill);
}

/* rt_check_as with rt_fill. */
static inline int rt_check(struct kvc *c, const char *path, size_t size, uint64_t seed)
{
	return rt_check_as(c, path, size, seed, rt_fill);
}

/* Chunk files on node i's disk (DIR/chunks/xx/id). If path/cap given, the path of the first. */
static inline int rt_node_chunks(const struct kvh_cluster *cl, int i, char *path, size_t cap)
{
	char d[700];
	snprintf(d, sizeof(d), "%s/chunks", cl->nodes[i].dir);
	DIR *top = opendir(d);
	if (!top)
		return 0;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(top))) {
		if (e->d_name[0] == '.')
			continue;
		char sd[1000];
		snprintf(sd, sizeof(sd), "%s/%s", d, e->d_name);
		DIR *sub = opendir(sd);
		if (!sub)
			continue;
		struct dirent *f;
		while ((f = readdir(sub))) {
			if (f->d_name[0] == '.')
				continue;
			if (path && n == 0 && strlen(sd) + strlen(f->d_name) + 2 <= cap) {
				memcpy(path, sd, strlen(sd));
				path[strlen(sd)] = '/';
				strcpy(path + strlen(sd) + 1, f->d_name);
			}
			n++;
		}
		closedir(sub);
	}
	closedir(top);
	return n;
}

static inline int rt_all_chunks(const struct kvh_cluster *cl)
{
	int n = 0;
	for (int i = 0; i < cl->nnodes; i++)
		n += rt_node_chunks(cl, i, NULL, 0);
	return n;
}

struct rt_status {
	uint8_t kind, running;
	uint32_t node;
	uint64_t total, done, failed, bytes;
	int64_t elapsed_ns;
	uint64_t st[KVP_MST_COUNT];
};

static inline int rt_mstatus(struct kvc *c, struct rt_status *s)
{
	uint8_t *rb = NULL;
	uint32_t rl = 0;
	int rc = kvc_admin(c, KVP_OP_MSTATUS, NULL, 0, &rb, &rl);
	if (rc)
		return rc;
	struct kvp_rbuf r;
	kvp_r_init(&r, rb, rl);
	memset(s, 0, sizeof(*s));
	s->kind = kvp_r_u8(&r);
	s->running = kvp_r_u8(&r);
	s->node = kvp_r_u32(&r);
	s->total = kvp_r_u64(&r);
	s->done = kvp_r_u64(&r);
	s->failed = kvp_r_u64(&r);
	s->bytes = kvp_r_u64(&r);
	s->elapsed_ns = kvp_r_i64(&r);
	uint32_t n = kvp_r_u32(&r);
	for (uint32_t i = 0; i < n; i++) {
		uint64_t v = kvp_r_u64(&r);
		if (i < KVP_MST_COUNT)
			s->st[i] = v;
	}
	rc = kvp_r_end(&r);
	free(rb);
	return rc;
}

static inline int rt_maint(struct kvc *c, uint8_t action, uint32_t node)
{
	uint8_t b[5] = {action, (uint8_t)node, (uint8_t)(node >> 8), (uint8_t)(node >> 16),
			(uint8_t)(node >> 24)};
	return kvc_admin(c, KVP_OP_MAINT, b, sizeof(b), NULL, NULL);
}

/* Starts a job and waits (up to timeout_ms) for it to end; its final status in *s. */
static inline int rt_job(struct kvc *c, uint8_t action, uint32_t node, int timeout_ms,
			 struct rt_status *s)
{
	int64_t end = rt_now_ms() + timeout_ms;
	int rc;
	/* An automatic job (degraded stripes, background scrub) may be running: wait it out. */
	while ((rc = rt_maint(c, action, node)) == -EBUSY && rt_now_ms() < end)
		rt_sleep_ms(100);
	if (rc)
		return rc;
	do {
		rt_sleep_ms(50);
		if ((rc = rt_mstatus(c, s)))
			return rc;
		if (!s->running)
			return 0;
	} while (rt_now_ms() < end);
	return -ETIMEDOUT;
}

#endif
