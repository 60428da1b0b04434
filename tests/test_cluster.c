/* Cluster integration tests: real kvfs-meta and 11 kvfs-node processes on loopback (started by
 * tests/harness.c), driven through libkvfs. No mocks. Covers the namespace, 500 files of random
 * sizes read back byte-exact, degraded reads with a node killed, meta killed during writes,
 * ENOSPC on a small cluster, and hostile frames to meta and a node.
 *
 * Sizes of the 500 files are skewed (most small, some up to 8 MiB, ~300 MiB in all) so the whole
 * binary fits in about a minute on 2 cores; 0 B and 8 MiB are always included. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "kvc.h"
#include "kvc_int.h" /* kvc__node_mark_bad: a node a timeout put on the bad list */
#include "kvp.h"
#include "ret_tutil.h"
#include "sock_tutil.h"

#define NNODES 11
#define NFILES 500

static struct kvh_cluster g_cl;
static int g_started;
static struct kvh_cluster g_small; /* test_enospc's own cluster */
static int g_small_started;
static struct kvc *g_c;

static uint64_t rng_next(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

static int open_client(struct kvh_cluster *cl, struct kvc **out)
{
	struct kvc_opts o = {.meta_addr = cl->meta_addr, .secret = &cl->secret};
	return kvc_open(&o, out);
}

/* Reads path and compares it with rt_fill8(size, seed). */
static int check_file(struct kvc *c, const char *path, size_t size, uint64_t seed)
{
	return rt_check_as(c, path, size, seed, rt_fill8);
}

static int put_seeded(struct kvc *c, const char *path, size_t size, uint64_t seed, int replace)
{
	return rt_put_as(c, path, size, seed, replace, rt_fill8);
}

static int setup(void **state)
{
	(void)state;
	char bin[600];
	if (kvh_bin("kvfs-meta", bin, sizeof(bin)) || kvh_bin("kvfs-node", bin, sizeof(bin))) {
		/* Every test would skip and the binary exit 0: a pass, to a run by hand. */
		if (tu_skip_allowed()) {
			fprintf(stderr, "kvfs-meta / kvfs-node not built: skipping\n");
			return 0;
		}
		fprintf(stderr,
			"kvfs-meta / kvfs-node not found (KVFS_BUILD_DIR %s): set "
			"KVFS_BUILD_DIR to the build directory (ctest does), or "
			"KVFS_TEST_ALLOW_SKIP=1 to skip\n",
			getenv("KVFS_BUILD_DIR") ? getenv("KVFS_BUILD_DIR") : "unset");
		return -1;
	}
	signal(SIGPIPE, SIG_IGN);
	int rc = kvh_cluster_start(&g_cl, NNODES, "--node-timeout 1s --gc-interval 0.2s", NULL);
	if (rc) {
		fprintf(stderr, "cluster start: %s; meta log:\n", kvp_strerror(rc));
		kvh_sh("tail -n 5 '%s/meta.log' >&2", g_cl.dir);
		kvh_cluster_stop(&g_cl); /* whatever did start */
		return -1;
	}
	g_started = 1;
	return open_client(&g_cl, &g_c) ? -1 : 0;
}

static int teardown(void **state)
{
	(void)state;
	kvc_close(g_c);
	int64_t t0 = rt_now_ms();
	if (g_small_started) /* a failed test_enospc leaves it behind */
		kvh_cluster_stop(&g_small);
	if (g_started)
		kvh_cluster_stop(&g_cl);
	fprintf(stderr, "  cluster stop %.1f s\n", (double)(rt_now_ms() - t0) / 1000);
	return 0;
}

#define NEED_CLUSTER()                                                                             \
	do {                                                                                       \
		if (!g_started)                                                                    \
			skip();                                                                    \
	} while (0)

static void test_namespace(void **state)
{
	(void)state;
	NEED_CLUSTER();
	struct kvc *c = g_c;
	struct kvp_attr a, d;
	assert_int_equal(kvc_mkdir_p(c, "/ns/a/b", 0755), 0);
	assert_int_equal(kvc_resolve(c, "/ns/a/b", &d), 0);
	assert_true(S_ISDIR(d.mode));
	assert_int_equal(kvc_mkdir(c, KVP_ROOT_INO, "ns", 0755, NULL), -EEXIST);

	/* put / get / stat / replace */
	assert_int_equal(put_seeded(c, "/ns/a/f1", 100000, 1, 0), 0);
	assert_int_equal(put_seeded(c, "/ns/a/f1", 5, 2, 0), -EEXIST);
	assert_int_equal(check_file(c, "/ns/a/f1", 100000, 1), 0);
	assert_int_equal(put_seeded(c, "/ns/a/f1", 7000, 3, 1), 0);
	assert_int_equal(check_file(c, "/ns/a/f1", 7000, 3), 0);
	assert_int_equal(kvc_resolve(c, "/ns/a/f1", &a), 0);
	assert_true(S_ISREG(a.mode));
	assert_int_equal(a.size, 7000);
	assert_int_equal(put_seeded(c, "/ns/a/empty", 0, 0, 0), 0);
	assert_int_equal(check_file(c, "/ns/a/empty", 0, 0), 0);
	assert_int_equal(put_seeded(c, "/nope/x", 10, 0, 0), -ENOENT);
	assert_int_equal(put_seeded(c, "/ns/a/f1/x", 10, 0, 0), -ENOTDIR);

	/* writer: holes, overwrite, truncate */
	struct kvc_writer *w;
	assert_int_equal(kvc_resolve(c, "/ns/a", &d), 0);
	assert_int_equal(kvc_create(c, d.ino, "w", 0600, 0, &w), 0);
	uint8_t blk[5000];
	memset(blk, 0xAB, sizeof(blk));
	assert_int_equal(kvc_write(w, blk, sizeof(blk), 10000), (ssize_t)sizeof(blk));
	memset(blk, 0xCD, 100);
	assert_int_equal(kvc_write(w, blk, 100, 0), 100);
	assert_int_equal(kvc_writer_truncate(w, 12000), 0);
	assert_int_equal(kvc_writer_size(w), 12000);
	assert_int_equal(kvc_commit(w, &a), 0);
	assert_int_equal(a.size, 12000);
	struct kvc_file *f;
	assert_int_equal(kvc_file_open(c, a.ino, &f), 0);
	uint8_t rb[12000];
	assert_int_equal(kvc_pread(f, rb, sizeof(rb) + 50, 0), 12000);
	for (int i = 0; i < 12000; i++)
		assert_int_equal(rb[i], i < 100 ? 0xCD : i < 10000 ? 0 : 0xAB);
	assert_int_equal(kvc_pread(f, rb, 10, 12000), 0);
	kvc_file_close(f);

	/* small reads in a multi-stripe file fetch ranges and match */
	struct kvc_statfs st;
	assert_int_equal(kvc_statfs(c, &st), 0);
	assert_int_equal(st.nodes_up, NNODES);
	assert_int_equal(st.k + st.m, NNODES);
	size_t big = (size_t)st.k * st.chunk_size * 2 + 12345;
	assert_int_equal(put_seeded(c, "/ns/big", big, 9, 0), 0);
	assert_int_equal(check_file(c, "/ns/big", big, 9), 0);
	assert_int_equal(kvc_resolve(c, "/ns/big", &a), 0);
	uint8_t *want = malloc(big), *got = malloc(big);
	rt_fill8(want, big, 9);
	assert_int_equal(kvc_file_open(c, a.ino, &f), 0);
	struct kvc_layout_info li;
	uint32_t *slots;
	assert_int_equal(kvc_file_layout(f, &li, &slots), 0);
	assert_int_equal(li.nstripes, 3);
	free(slots);
	uint64_t seed = 5;
	for (int i = 0; i < 200; i++) {
		uint64_t off = rng_next(&seed) % big, n = rng_next(&seed) % 300000;
		ssize_t r = kvc_pread(f, got, n, off);
		size_t exp = off + n > big ? big - off : n;
		assert_int_equal(r, (ssize_t)exp);
		assert_memory_equal(got, want + off, exp);
	}
	for (size_t off = 0; off < big; off += 131072) { /* sequential, FUSE-sized */
		ssize_t r = kvc_pread(f, got + off, 131072, off);
		assert_true(r > 0);
	}
	assert_memory_equal(got, want, big);
	kvc_file_close(f);
	free(want);
	free(got);

	/* readdir, rename, unlink, rmdir */
	struct kvc_dirent *ents;
	size_t n;
	assert_int_equal(kvc_resolve(c, "/ns/a", &d), 0);
	assert_int_equal(kvc_readdir(c, d.ino, &ents, &n), 0);
	assert_int_equal(n, 4);
	assert_string_equal(ents[0].name, "b");
	assert_string_equal(ents[1].name, "empty");
	assert_string_equal(ents[2].name, "f1");
	assert_string_equal(ents[3].name, "w");
	assert_int_equal(ents[2].attr.size, 7000);
	free(ents);
	assert_int_equal(kvc_rename(c, d.ino, "f1", KVP_ROOT_INO, "moved", 0), 0);
	assert_int_equal(check_file(c, "/moved", 7000, 3), 0);
	assert_int_equal(kvc_resolve(c, "/ns/a/f1", &a), -ENOENT);
	assert_int_equal(kvc_rmdir(c, KVP_ROOT_INO, "ns"), -ENOTEMPTY);
	assert_int_equal(kvc_unlink(c, KVP_ROOT_INO, "moved"), 0);
	assert_int_equal(kvc_unlink(c, KVP_ROOT_INO, "moved"), -ENOENT);
	assert_int_equal(kvc_resolve(c, "/moved", &a), -ENOENT);
	assert_int_equal(kvc_rmdir(c, d.ino, "b"), 0);
	struct kvc_node *nodes;
	assert_int_equal(kvc_nodes(c, &nodes, &n), 0);
	assert_int_equal(n, NNODES);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(nodes[i].state, KVP_NODE_UP);
	free(nodes);
}

/* ---- 500 files, read back, then degraded with one node killed ---- */

struct fileset {
	int n;
	size_t size[NFILES];
	int rc[NFILES];
	int nthreads, t;
	struct kvc *c;
	int write;
	pthread_mutex_t mu;
	int next;
};

static size_t pick_size(uint64_t *rs, int i)
{
	if (i == 0)
		return 0;
	if (i == 1)
		return 8u << 20;
	uint64_t r = rng_next(rs) % 100;
	if (r < 70)
		return rng_next(rs) % 65537;
	if (r < 92)
		return 65536 + rng_next(rs) % (1u << 20);
	return (1u << 20) + rng_next(rs) % ((7u << 20) + 1);
}

static void *fileset_worker(void *arg)
{
	struct fileset *fs = arg;
	for (;;) {
		pthread_mutex_lock(&fs->mu);
		int i = fs->next++;
		pthread_mutex_unlock(&fs->mu);
		if (i >= fs->n)
			return NULL;
		char path[64];
		snprintf(path, sizeof(path), "/many/f%03d", i);
		fs->rc[i] = fs->write ? put_seeded(fs->c, path, fs->size[i], 1000 + i, 0)
				      : check_file(fs->c, path, fs->size[i], 1000 + i);
	}
}

static void fileset_run(struct fileset *fs, int write)
{
	pthread_t th[4];
	fs->write = write;
	fs->next = 0;
	for (int t = 0; t < 4; t++)
		pthread_create(&th[t], NULL, fileset_worker, fs);
	for (int t = 0; t < 4; t++)
		pthread_join(th[t], NULL);
	for (int i = 0; i < fs->n; i++)
		if (fs->rc[i])
			fail_msg("file %d (%zu bytes) %s: %s", i, fs->size[i],
				 write ? "write" : "read", kvp_strerror(fs->rc[i]));
}

/* ---- sequential reads in windows that do not match the stripes ---- */

/* Reads path from start to end in preads of win bytes through one open file and compares
 * every byte with rt_fill8(seed); 0 or -EILSEQ / the read's error. */
static int read_windows(struct kvc *c, const char *path, size_t size, uint64_t seed, size_t win)
{
	struct kvp_attr a;
	struct kvc_file *f;
	int rc = kvc_resolve(c, path, &a);
	if (rc || (rc = kvc_file_open(c, a.ino, &f)))
		return rc;
	uint8_t *want = malloc(size), *got = malloc(win);
	rt_fill8(want, size, seed);
	for (size_t off = 0; off < size && !rc; off += win) {
		size_t n = size - off < win ? size - off : win;
		ssize_t r = kvc_pread(f, got, win, off);
		if (r != (ssize_t)n)
			rc = r < 0 ? (int)r : -EIO;
		else if (memcmp(got, want + off, n) != 0)
			rc = -EILSEQ;
	}
	kvc_file_close(f);
	free(want);
	free(got);
	return rc;
}

static void test_sequential_windows(void **state)
{
	(void)state;
	NEED_CLUSTER();
	/* Chunks of 64 KiB: a stripe of 640 KiB (k = 10), so 12 MiB is ~20 stripes. */
	struct kvc_opts o = {
	    .meta_addr = g_cl.meta_addr, .secret = &g_cl.secret, .max_chunk = 64u << 10};
	struct kvc *c;
	assert_int_equal(kvc_open(&o, &c), 0);
	const size_t size = (12u << 20) + 12345;
	assert_int_equal(put_seeded(c, "/seqw", size, 77, 0), 0);
	struct kvp_attr a;
	struct kvc_file *f;
	assert_int_equal(kvc_resolve(c, "/seqw", &a), 0);
	assert_int_equal(kvc_file_open(c, a.ino, &f), 0);
	struct kvc_layout_info li;
	uint32_t *slots = NULL;
	assert_int_equal(kvc_file_layout(f, &li, &slots), 0);
	free(slots);
	const size_t sb = (size_t)li.k * li.chunk_size;
	assert_true(li.nstripes >= 8);
	/* A read of a stripe and a half (the mount's read-ahead window is not stripe-aligned):
	 * the stripe after it is on its way before the reader asks (before, the half stripe's
	 * cache fill made the prefetch skip it). */
	uint8_t *buf = malloc(sb * 2);
	struct kvc_stats st0, st1;
	kvc_get_stats(c, &st0);
	assert_int_equal(kvc_pread(f, buf, sb + sb / 2, 0), (ssize_t)(sb + sb / 2));
	kvc_get_stats(c, &st1);
	assert_int_equal(st1.stripes_prefetched - st0.stripes_prefetched, 1);
	/* ...and after whole stripes read straight into the caller's buffer. */
	assert_int_equal(kvc_pread(f, buf, sb / 2 + sb, sb + sb / 2), (ssize_t)(sb + sb / 2));
	kvc_get_stats(c, &st0);
	assert_int_equal(st0.stripes_prefetched - st1.stripes_prefetched, 1);
	kvc_file_close(f);
	free(buf);
	/* Every byte, through windows of several shapes, healthy and with a node gone (a
	 * prefetched stripe then misses a chunk: decoded from parity). */
	const size_t wins[] = {sb + sb / 2, sb, 1u << 20, 3 * 4096 + 7, 2 * sb + 1};
	for (int down = 0; down < 2; down++) {
		if (down)
			assert_int_equal(kvh_node_kill(&g_cl, 5, SIGKILL), 0);
		for (size_t w = 0; w < sizeof(wins) / sizeof(wins[0]); w++) {
			int rc = read_windows(c, "/seqw", size, 77, wins[w]);
			if (rc)
				fail_msg("windows of %zu, %s: %s", wins[w],
					 down ? "node 5 down" : "healthy", kvp_strerror(rc));
		}
	}
	kvc_close(c);
	assert_int_equal(kvh_node_restart(&g_cl, 5), 0);
	assert_int_equal(kvh_wait_nodes_up(&g_cl, NNODES, 10000), 0);
}

/* kvc_file_prefetch: the stripe's GETs leave at once and the read that follows takes their
 * answers instead of asking again. Checked by stopping every node between the two: the read
 * can then only succeed from the chunks already received. */
static void test_prefetch(void **state)
{
	(void)state;
	NEED_CLUSTER();
	/* Short timeouts: a read that asked the stopped nodes again would fail in ~1 s. */
	struct kvc_opts o = {.meta_addr = g_cl.meta_addr,
			     .secret = &g_cl.secret,
			     .timeout_ms = 500,
			     .max_chunk = 64u << 10}; /* stripes of 640 KiB */
	struct kvc *c;
	assert_int_equal(kvc_open(&o, &c), 0);
	kvc_set_read_timeout(c, 300);
	const size_t size = (3u << 20) + 777; /* ~5 stripes */
	assert_int_equal(put_seeded(c, "/pf", size, 55, 0), 0);
	struct kvp_attr a;
	struct kvc_file *f;
	assert_int_equal(kvc_resolve(c, "/pf", &a), 0);
	assert_int_equal(kvc_file_open(c, a.ino, &f), 0);
	struct kvc_layout_info li;
	uint32_t *slots = NULL;
	assert_int_equal(kvc_file_layout(f, &li, &slots), 0);
	free(slots);
	const size_t sb = (size_t)li.k * li.chunk_size;
	assert_true(sb < size);
	assert_int_equal(kvc_file_prefetch(f, size), -EINVAL);
	struct kvc_stats st0, st1;
	kvc_get_stats(c, &st0);
	assert_int_equal(kvc_file_prefetch(f, 0), 0);
	assert_int_equal(kvc_file_prefetch(f, 1), 0); /* already on its way: not again */
	kvc_get_stats(c, &st1);
	assert_int_equal(st1.stripes_prefetched - st0.stripes_prefetched, 1);
	usleep(500 * 1000); /* the answers arrive (into buffers of their own: no read yet) */
	for (int i = 0; i < NNODES; i++)
		assert_int_equal(kill(g_cl.nodes[i].pid, SIGSTOP), 0);
	uint8_t *want = malloc(size), *got = malloc(size);
	rt_fill8(want, size, 55);
	ssize_t n = kvc_pread(f, got, sb, 0);
	for (int i = 0; i < NNODES; i++)
		assert_int_equal(kill(g_cl.nodes[i].pid, SIGCONT), 0);
	assert_int_equal(n, (ssize_t)sb);
	assert_memory_equal(got, want, sb);
	/* The rest (the second stripe, not prefetched before the stop) reads as usual. */
	assert_int_equal(kvc_pread(f, got, size - sb, sb), (ssize_t)(size - sb));
	assert_memory_equal(got, want + sb, size - sb);
	/* A cached stripe (a read of part of it fills the cache) is not fetched again. */
	assert_int_equal(kvc_pread(f, got, sb / 2, sb + 5), (ssize_t)(sb / 2));
	assert_memory_equal(got, want + sb + 5, sb / 2);
	kvc_get_stats(c, &st0);
	assert_int_equal(kvc_file_prefetch(f, sb), 0);
	kvc_get_stats(c, &st1);
	assert_int_equal(st1.stripes_prefetched, st0.stripes_prefetched);
	kvc_file_close(f);
	/* A whole-file read that ends inside its last stripe prefetches nothing: before, the
	 * stripe holding the end (the one just read) was fetched again and thrown away. */
	assert_int_equal(kvc_file_open(c, a.ino, &f), 0);
	kvc_get_stats(c, &st0);
	assert_int_equal(kvc_pread(f, got, size, 0), (ssize_t)size);
	assert_memory_equal(got, want, size);
	kvc_get_stats(c, &st1);
	assert_int_equal(st1.stripes_prefetched, st0.stripes_prefetched);
	kvc_file_close(f);
	/* A prefetch never read is cancelled by the close; one with a node down still reads
	 * every byte (the missing chunk decoded from parity). */
	assert_int_equal(kvc_file_open(c, a.ino, &f), 0);
	assert_int_equal(kvc_file_prefetch(f, 0), 0);
	kvc_file_close(f);
	assert_int_equal(kvh_node_kill(&g_cl, 2, SIGKILL), 0);
	assert_int_equal(kvc_file_open(c, a.ino, &f), 0);
	assert_int_equal(kvc_file_prefetch(f, 0), 0);
	assert_int_equal(kvc_pread(f, got, sb, 0), (ssize_t)sb);
	assert_memory_equal(got, want, sb);
	kvc_file_close(f);
	free(want);
	free(got);
	kvc_close(c);
	assert_int_equal(kvh_node_restart(&g_cl, 2), 0);
	assert_int_equal(kvh_wait_nodes_up(&g_cl, NNODES, 10000), 0);
}

static void test_many_files_and_degraded(void **state)
{
	(void)state;
	NEED_CLUSTER();
	static struct fileset fs;
	memset(&fs, 0, sizeof(fs));
	pthread_mutex_init(&fs.mu, NULL);
	fs.n = NFILES;
	fs.c = g_c;
	uint64_t rs = 42, total = 0;
	for (int i = 0; i < NFILES; i++)
		total += fs.size[i] = pick_size(&rs, i);
	assert_int_equal(kvc_mkdir(g_c, KVP_ROOT_INO, "many", 0755, NULL), 0);
	/* Besides the 500: one file of several stripes (whole-stripe reads pipelined). */
	const size_t multi = (25u << 20) + 4321;
	assert_int_equal(put_seeded(g_c, "/many/multi", multi, 99, 0), 0);
	assert_int_equal(check_file(g_c, "/many/multi", multi, 99), 0);
	fileset_run(&fs, 1);
	struct kvc_stats st0, st1;
	/* A GET that outlives the 2 s read timeout is decoded around, rightly; on 2 shared cores
	 * at load 20 one did (3 stripes decoded). The healthy pass checks that nothing decodes
	 * without a failure, so it gives slow nodes time; the killed node below fails fast. */
	kvc_set_read_timeout(g_c, 30000);
	kvc_get_stats(g_c, &st0);
	fileset_run(&fs, 0);
	kvc_get_stats(g_c, &st1);
	kvc_set_read_timeout(g_c, 2000);
	assert_int_equal(st1.degraded_reads, st0.degraded_reads); /* healthy: no decoding */
	assert_int_equal(st1.crc_errors, 0);
	assert_true(st1.bytes_read - st0.bytes_read == total);

	/* One node gone without warning: every file still reads byte-exact. */
	assert_int_equal(kvh_node_kill(&g_cl, 3, SIGKILL), 0);
	fileset_run(&fs, 0);
	assert_int_equal(check_file(g_c, "/many/multi", multi, 99), 0);
	kvc_get_stats(g_c, &st0);
	assert_true(st0.degraded_reads > st1.degraded_reads);
	fprintf(stderr, "  %d files, %.1f MiB; degraded stripes decoded: %llu\n", NFILES,
		(double)total / 1048576,
		(unsigned long long)(st0.degraded_reads - st1.degraded_reads));

	/* Meta notices it is down; writes go on with 10 of 11 nodes (parity left for repair;
	 * before, -EHOSTDOWN until the node was back). */
	assert_int_equal(kvh_wait_nodes_up(&g_cl, NNODES - 1, 10000), 0);
	assert_int_equal(put_seeded(g_c, "/many/while-down", 300000, 7, 0), 0);
	assert_int_equal(check_file(g_c, "/many/while-down", 300000, 7), 0);
	assert_int_equal(kvh_node_restart(&g_cl, 3), 0);
	assert_int_equal(kvh_wait_nodes_up(&g_cl, NNODES, 10000), 0);
	assert_int_equal(check_file(g_c, "/many/f001", 8u << 20, 1001), 0);
	assert_int_equal(check_file(g_c, "/many/while-down", 300000, 7), 0);
	pthread_mutex_destroy(&fs.mu);
}

/* ---- meta killed during writes ---- */

#define MK_MAX 4000

struct mkstate {
	struct kvc *c;
	atomic_int stop;
	atomic_int n; /* entries below n are complete */
	int rc[MK_MAX];
	size_t size[MK_MAX];
	int64_t done_ms[MK_MAX];
};

static void *mk_writer(void *arg)
{
	struct mkstate *m = arg;
	uint64_t rs = 77;
	while (!atomic_load(&m->stop) && atomic_load(&m->n) < MK_MAX) {
		int i = atomic_load(&m->n);
		char path[64];
		snprintf(path, sizeof(path), "/mk/f%04d", i);
		m->size[i] = rng_next(&rs) % (300 * 1024);
		m->rc[i] = put_seeded(m->c, path, m->size[i], 5000 + i, 0);
		m->done_ms[i] = rt_now_ms();
		atomic_store(&m->n, i + 1);
	}
	return NULL;
}

static void test_meta_kill_during_writes(void **state)
{
	(void)state;
	NEED_CLUSTER();
	static struct mkstate m;
	memset(&m, 0, sizeof(m));
	m.c = g_c;
	assert_int_equal(kvc_mkdir(g_c, KVP_ROOT_INO, "mk", 0755, NULL), 0);
	pthread_t th[2];
	for (int t = 0; t < 1; t++)
		pthread_create(&th[t], NULL, mk_writer, &m);
	usleep(700000);
	int before = m.n;
	assert_int_equal(kvh_meta_kill(&g_cl, SIGKILL), 0);
	usleep(300000);
	assert_int_equal(kvh_meta_restart(&g_cl), 0);
	int64_t restarted = rt_now_ms();
	assert_int_equal(kvh_wait_nodes_up(&g_cl, NNODES, 10000), 0);
	/* Let a few writes complete on the restarted meta (at most 20 s on a loaded machine). */
	for (int64_t end = rt_now_ms() + 20000; rt_now_ms() < end;) {
		int done_after = 0, n = atomic_load(&m.n);
		for (int i = 0; i < n; i++)
			done_after += m.done_ms[i] > restarted;
		if (done_after >= 5 || n >= MK_MAX)
			break;
		usleep(50000);
	}
	atomic_store(&m.stop, 1);
	pthread_join(th[0], NULL);

	int acked = 0, failed = 0, after = 0;
	for (int i = 0; i < m.n; i++) {
		if (m.rc[i] == 0) {
			acked++;
			after += m.done_ms[i] > restarted;
		} else {
			failed++;
		}
	}
	fprintf(stderr,
		"  meta kill: %d writes before, %d acknowledged, %d failed, %d after restart\n",
		before, acked, failed, after);
	assert_true(before > 0);
	assert_true(after > 0); /* writes resume on the same kvc without reopening */

	/* Every acknowledged file is whole; whatever is visible is whole (no partial file). */
	for (int i = 0; i < m.n; i++) {
		char path[64];
		snprintf(path, sizeof(path), "/mk/f%04d", i);
		if (m.rc[i] == 0)
			assert_int_equal(check_file(g_c, path, m.size[i], 5000 + i), 0);
	}
	struct kvp_attr d;
	struct kvc_dirent *e;
	size_t n;
	assert_int_equal(kvc_resolve(g_c, "/mk", &d), 0);
	assert_int_equal(kvc_readdir(g_c, d.ino, &e, &n), 0);
	assert_true(n >= (size_t)acked);
	for (size_t j = 0; j < n; j++) {
		int i = atoi(e[j].name + 1);
		assert_true(i >= 0 && i < m.n);
		char path[300];
		snprintf(path, sizeof(path), "/mk/%s", e[j].name);
		assert_int_equal(e[j].attr.size, m.size[i]);
		assert_int_equal(check_file(g_c, path, m.size[i], 5000 + i), 0);
	}
	free(e);
}

/* ---- ENOSPC on a small cluster ---- */

/* LRU eviction off (high watermark 0): this is about running out of room, not about making it
 * (eviction may delete any file, so "every acknowledged file is there" would not hold). */
#define ENOSPC_META_ARGS "--node-timeout 2s --gc-interval 0.2s --high-watermark 0 --low-watermark 0"

/* Harness index of node id, by address. */
static int node_index(struct kvc *c, struct kvh_cluster *cl, uint32_t id)
{
	struct kvc_node *n;
	size_t nn;
	int idx = -1;
	assert_int_equal(kvc_nodes(c, &n, &nn), 0);
	for (size_t j = 0; j < nn; j++)
		for (int i = 0; i < cl->nnodes && n[j].id == id; i++)
			if (!strcmp(n[j].addr, cl->nodes[i].addr))
				idx = i;
	free(n);
	assert_true(idx >= 0);
	return idx;
}

/* Node id of slot `slot` of path's last stripe. */
static uint32_t last_stripe_node(struct kvc *c, const char *path, int slot)
{
	struct kvp_attr a;
	struct kvc_file *f;
	struct kvc_layout_info li;
	uint32_t *slots;
	assert_int_equal(kvc_resolve(c, path, &a), 0);
	assert_int_equal(kvc_file_open(c, a.ino, &f), 0);
	assert_int_equal(kvc_file_layout(f, &li, &slots), 0);
	uint32_t id = slots[(size_t)(li.nstripes - 1) * (size_t)(li.k + li.m) + (size_t)slot];
	free(slots);
	kvc_file_close(f);
	return id;
}

#define EDGE_FILES 7
static const size_t edge_size[EDGE_FILES] = {1, 100, 4096, 16384, 65537, 81921, 200000};

/* Every edge file reads byte-exact through a fresh client, whole and by ranges. */
static void check_edges(struct kvh_cluster *cl)
{
	struct kvc *c;
	assert_int_equal(open_client(cl, &c), 0);
	for (int i = 0; i < EDGE_FILES; i++) {
		char p[32];
		snprintf(p, sizeof(p), "/e%d", i);
		int rc = check_file(c, p, edge_size[i], 300 + (uint64_t)i);
		if (rc)
			fail_msg("%s (%zu bytes): %s", p, edge_size[i], kvp_strerror(rc));
	}
	kvc_close(c);
}

/* 4+2 over 7 nodes, 16 KiB chunks (last stripes of every shape): with two nodes down,
 * chosen so the read must go to parity, every file reads at once, before meta notices (its
 * node timeout is long). Before: a file whose last stripe has only data chunk 0 lost its
 * data-0 and first-parity nodes gave -EIO (the empty data chunks used up the round's turns,
 * and so did a GET that could not start); and a chunk skipped because its node was on the
 * bad list (not failed) was never asked, even when it was the last one left. */
struct commit_later {
	struct kvc_writer *w;
	int delay_ms, rc;
};

static void *commit_later_main(void *arg)
{
	struct commit_later *x = arg;
	struct timespec d = {x->delay_ms / 1000, (long)(x->delay_ms % 1000) * 1000000L};
	nanosleep(&d, NULL);
	x->rc = kvc_commit(x->w, NULL);
	return NULL;
}

/* A writer out of buffer budget waits on libkvfs's condition, not a poll: kvc_buffer_wait
 * times out while nothing is freed and returns as soon as another file's commit frees its
 * buffer, after which the write fits. */
static void test_buffer_wait(void **state)
{
	(void)state;
	NEED_CLUSTER();
	struct kvc_opts o = {
	    .meta_addr = g_cl.meta_addr, .secret = &g_cl.secret, .max_buffered = 256 << 10};
	struct kvc *c;
	assert_int_equal(kvc_open(&o, &c), 0);
	static uint8_t buf[200 << 10];
	rt_fill8(buf, sizeof(buf), 77);
	struct kvc_writer *a, *b;
	assert_int_equal(kvc_create(c, KVP_ROOT_INO, "bw-a", 0644, 0, &a), 0);
	assert_int_equal(kvc_create(c, KVP_ROOT_INO, "bw-b", 0644, 0, &b), 0);
	assert_int_equal(kvc_write(a, buf, sizeof(buf), 0), (ssize_t)sizeof(buf));
	uint64_t epoch = kvc_buffer_epoch(c);
	assert_int_equal(kvc_write(b, buf, sizeof(buf), 0), -ENOMEM);
	assert_int_equal(kvc_buffer_wait(c, epoch, 100), -ETIMEDOUT); /* nothing freed */
	struct commit_later x = {.w = a, .delay_ms = 300, .rc = 1};
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, commit_later_main, &x), 0);
	assert_int_equal(kvc_buffer_wait(c, epoch, 30000), 0); /* woken by a's commit */
	pthread_join(t, NULL);
	assert_int_equal(x.rc, 0);
	assert_int_equal(kvc_write(b, buf, sizeof(buf), 0), (ssize_t)sizeof(buf));
	assert_int_equal(kvc_commit(b, NULL), 0);
	assert_int_equal(check_file(c, "/bw-a", sizeof(buf), 77), 0);
	assert_int_equal(check_file(c, "/bw-b", sizeof(buf), 77), 0);
	kvc_close(c);
}

/* A writer's buffer grows in whole MiB past 512 KiB, but never fails for it: a 600 KiB file
 * under a 700 KiB budget gets exactly what it needs. */
static void test_buffer_exact_fit(void **state)
{
	(void)state;
	NEED_CLUSTER();
	struct kvc_opts o = {
	    .meta_addr = g_cl.meta_addr, .secret = &g_cl.secret, .max_buffered = 700 << 10};
	struct kvc *c;
	assert_int_equal(kvc_open(&o, &c), 0);
	static uint8_t buf[600 << 10];
	rt_fill8(buf, sizeof(buf), 78);
	struct kvc_writer *w;
	assert_int_equal(kvc_create(c, KVP_ROOT_INO, "bw-exact", 0644, 0, &w), 0);
	assert_int_equal(kvc_write(w, buf, 300 << 10, 0), 300 << 10);
	assert_int_equal(kvc_write(w, buf + (300 << 10), 300 << 10, 300 << 10), 300 << 10);
	assert_int_equal(kvc_commit(w, NULL), 0);
	assert_int_equal(check_file(c, "/bw-exact", sizeof(buf), 78), 0);
	kvc_close(c);
}

static void test_degraded_edges(void **state)
{
	(void)state;
	NEED_CLUSTER();
	struct kvh_cluster *cl = &g_small;
	int rc = kvh_cluster_start(cl, 7, "--k 4 --m 2 --chunk-size 16K --node-timeout 60s", NULL);
	g_small_started = 1;
	assert_int_equal(rc, 0);
	struct kvc *c;
	assert_int_equal(open_client(cl, &c), 0);
	for (int i = 0; i < EDGE_FILES; i++) {
		char p[32];
		snprintf(p, sizeof(p), "/e%d", i);
		assert_int_equal(put_seeded(c, p, edge_size[i], 300 + (uint64_t)i, 0), 0);
	}
	/* Files of 10 geometries read through one client (it could hold the codecs of 8; the
	 * 9th and later failed with ENOMEM for the client's lifetime). */
	for (int g = 0; g < 10; g++) {
		struct kvc_opts o = {.meta_addr = cl->meta_addr,
				     .secret = &cl->secret,
				     .k = 1 + g / 2,
				     .m = 1 + g % 2};
		struct kvc *w;
		assert_int_equal(kvc_open(&o, &w), 0);
		char p[32];
		snprintf(p, sizeof(p), "/g%d", g);
		assert_int_equal(put_seeded(w, p, 50000, 400 + (uint64_t)g, 0), 0);
		kvc_close(w);
	}
	for (int g = 0; g < 10; g++) {
		char p[32];
		snprintf(p, sizeof(p), "/g%d", g);
		rc = check_file(c, p, 50000, 400 + (uint64_t)g);
		if (rc)
			fail_msg("%s (%d+%d): %s", p, 1 + g / 2, 1 + g % 2, kvp_strerror(rc));
	}
	/* Data 0 and parity 0 of the last stripe of a 1-byte and of a 65537-byte file. */
	static const int targets[] = {0, 4};
	for (size_t t = 0; t < sizeof(targets) / sizeof(targets[0]); t++) {
		char p[32];
		snprintf(p, sizeof(p), "/e%d", targets[t]);
		int a = node_index(c, cl, last_stripe_node(c, p, 0));
		int b = node_index(c, cl, last_stripe_node(c, p, 4));
		assert_int_equal(kvh_node_kill(cl, a, SIGKILL), 0);
		assert_int_equal(kvh_node_kill(cl, b, SIGKILL), 0);
		check_edges(cl);
		assert_int_equal(kvh_node_restart(cl, a), 0);
		assert_int_equal(kvh_node_restart(cl, b), 0);
	}
	/* 16 KiB = data chunk 0 only: both parity nodes down, and data 0's node on the bad
	 * list (as after a timeout): the read still asks it. */
	int p0 = node_index(c, cl, last_stripe_node(c, "/e3", 4));
	int p1 = node_index(c, cl, last_stripe_node(c, "/e3", 5));
	uint32_t d0 = last_stripe_node(c, "/e3", 0);
	assert_int_equal(kvh_node_kill(cl, p0, SIGKILL), 0);
	assert_int_equal(kvh_node_kill(cl, p1, SIGKILL), 0);
	struct kvc *c2;
	assert_int_equal(open_client(cl, &c2), 0);
	kvc__node_mark_bad(c2, d0);
	rc = check_file(c2, "/e3", edge_size[3], 303);
	if (rc)
		fail_msg("/e3 with data 0's node on the bad list: %s", kvp_strerror(rc));
	kvc_close(c2);
	kvc_close(c);
	kvh_cluster_stop(cl);
	g_small_started = 0;
}

static void test_enospc(void **state)
{
	(void)state;
	NEED_CLUSTER();
	struct kvh_cluster *cl = &g_small;
	int64_t ts0 = rt_now_ms();
	int rc = kvh_cluster_start(cl, NNODES, ENOSPC_META_ARGS, "--capacity 8M");
	g_small_started = 1;
	assert_int_equal(rc, 0);
	fprintf(stderr, "  enospc: start %.1f s\n", (double)(rt_now_ms() - ts0) / 1000);
	struct kvc *c;
	assert_int_equal(open_client(cl, &c), 0);
	const size_t sz = 1u << 20;
	int n = 0;
	int64_t t0 = rt_now_ms();
	for (; n < 200; n++) {
		char path[64];
		snprintf(path, sizeof(path), "/f%03d", n);
		rc = put_seeded(c, path, sz, 900 + n, 0);
		if (rc)
			break;
	}
	fprintf(stderr, "  enospc: %d files of 1 MiB stored, then %s\n", n, kvp_strerror(rc));
	fprintf(stderr, "  enospc: filled in %.1f s\n", (double)(rt_now_ms() - t0) / 1000);
	assert_int_equal(rc, -ENOSPC);
	assert_true(n >= 40); /* 11 x 8 MiB raw holds ~72 such files; most space is usable */

	/* Nothing corrupted, nothing partial: exactly the acknowledged files, all whole. */
	struct kvc_dirent *e;
	size_t ne;
	assert_int_equal(kvc_readdir(c, KVP_ROOT_INO, &e, &ne), 0);
	assert_int_equal(ne, (size_t)n);
	free(e);
	for (int i = 0; i < n; i++) {
		char path[64];
		snprintf(path, sizeof(path), "/f%03d", i);
		assert_int_equal(check_file(c, path, sz, 900 + i), 0);
	}
	/* Deleting frees the chunks in the background; the space comes back. */
	for (int i = 0; i < 10; i++) {
		char name[16];
		snprintf(name, sizeof(name), "f%03d", i);
		assert_int_equal(kvc_unlink(c, KVP_ROOT_INO, name), 0);
	}
	int64_t end = rt_now_ms() + 15000;
	do {
		rc = put_seeded(c, "/again", sz, 1, 0);
		if (rc)
			usleep(200000);
	} while (rc == -ENOSPC && rt_now_ms() < end);
	fprintf(stderr, "  enospc: space back %.1f s after the unlinks\n",
		(double)(rt_now_ms() - (end - 15000)) / 1000);
	assert_int_equal(rc, 0);
	assert_int_equal(check_file(c, "/again", sz, 1), 0);
	kvc_close(c);
	int64_t ts = rt_now_ms();
	kvh_cluster_stop(cl);
	g_small_started = 0;
	fprintf(stderr, "  enospc: stop %.1f s\n", (double)(rt_now_ms() - ts) / 1000);
}

/* ---- a node with rotten chunks, then a stopped node ---- */

/* Flips the last byte of every chunk file a node holds (DIR/chunks/XX/<id>). */
static int rot_node(const char *dir)
{
	return kvh_sh("for f in '%s'/chunks/*/*; do [ -f \"$f\" ] && [ -s \"$f\" ] || continue; "
		      "printf '\\xA5' | dd of=\"$f\" bs=1 seek=$(( $(stat -c %%s \"$f\") - 1 )) "
		      "conv=notrunc status=none; done",
		      dir);
}

static void test_corrupt_and_stopped_node(void **state)
{
	(void)state;
	NEED_CLUSTER();
	struct kvc *c;
	assert_int_equal(open_client(&g_cl, &c), 0);
	kvc_set_read_timeout(c, 500);
	assert_int_equal(kvc_mkdir(c, KVP_ROOT_INO, "rot", 0755, NULL), 0);
	const int nf = 20;
	for (int i = 0; i < nf; i++) {
		char path[64];
		snprintf(path, sizeof(path), "/rot/f%02d", i);
		assert_int_equal(put_seeded(c, path, 200000 + (size_t)i * 40000, 300 + i, 0), 0);
	}
	/* Every chunk on node 6 now fails its CRC: reads decode around it, byte-exact. */
	assert_int_equal(rot_node(g_cl.nodes[6].dir), 0);
	struct kvc_stats s0, s1;
	kvc_get_stats(c, &s0);
	for (int i = 0; i < nf; i++) {
		char path[64];
		snprintf(path, sizeof(path), "/rot/f%02d", i);
		assert_int_equal(check_file(c, path, 200000 + (size_t)i * 40000, 300 + i), 0);
	}
	kvc_get_stats(c, &s1);
	assert_true(s1.crc_errors > s0.crc_errors);
	assert_true(s1.degraded_reads - s0.degraded_reads >= s1.crc_errors - s0.crc_errors);

	/* A stopped (not dead) node: its connection stays open and it never answers. Reads pay
	 * one short timeout, then skip it. (Fresh files: the rotten ones have lost their one
	 * chunk of slack already.) */
	for (int i = 0; i < nf; i++) {
		char path[64];
		snprintf(path, sizeof(path), "/rot/g%02d", i);
		assert_int_equal(put_seeded(c, path, 200000 + (size_t)i * 40000, 300 + i, 0), 0);
	}
	pid_t pid = g_cl.nodes[8].pid;
	assert_int_equal(kill(pid, SIGSTOP), 0);
	int64_t t0 = rt_now_ms();
	for (int i = 0; i < nf; i++) {
		char path[64];
		snprintf(path, sizeof(path), "/rot/g%02d", i);
		int rc = check_file(c, path, 200000 + (size_t)i * 40000, 300 + i);
		if (rc) {
			kill(pid, SIGCONT);
			fail_msg("read with node 8 stopped: %s", kvp_strerror(rc));
		}
	}
	int64_t took = rt_now_ms() - t0;
	kill(pid, SIGCONT);
	fprintf(stderr, "  rot: %llu crc errors; %d files with a node stopped in %lld ms\n",
		(unsigned long long)(s1.crc_errors - s0.crc_errors), nf, (long long)took);
	assert_true(took < 6000); /* without the skip: ~one timeout per file, 10 s */
	kvc_close(c);
}

/* ---- hostile frames ---- */

static int raw_connect(const char *addr)
{
	int fd = kvp_connect(addr, 2000);
	assert_true(fd >= 0);
	struct timeval tv = {.tv_sec = 5};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

/* Drains until the peer closes; 0 when it did within the receive timeout. */
static int closed_by_peer(int fd)
{
	uint8_t b[4096];
	for (int i = 0; i < 1000; i++) {
		ssize_t r = recv(fd, b, sizeof(b), 0);
		if (r == 0 || (r < 0 && errno == ECONNRESET))
			return 0;
		if (r < 0)
			return -errno;
	}
	return -EMSGSIZE;
}

static void hdr_bytes(uint8_t *out, uint16_t op, uint32_t len, uint32_t magic)
{
	struct kvp_hdr h = {
	    .magic = KVP_MAGIC, .version = KVP_VERSION, .op = op, .id = 1, .len = len};
	kvp_hdr_encode(&h, out);
	if (magic != KVP_MAGIC)
		memcpy(out, &magic, 4);
}

static void still_serves(struct kvh_cluster *cl, const char *node)
{
	struct kvc_statfs st;
	assert_int_equal(kvc_statfs(g_c, &st), 0);
	struct kvp_client *k;
	assert_int_equal(kvp_client_open(node, &cl->secret, 2000, &k), 0);
	uint8_t *b = NULL;
	uint32_t len = 0;
	assert_int_equal(kvp_call(k, KVP_OP_STAT, NULL, 0, NULL, 0, 3000, &b, &len), 0);
	assert_int_equal(len, 40);
	free(b);
	kvp_client_close(k);
}

static void attack(const char *addr, const struct kvp_secret *good, uint16_t op)
{
	uint8_t h[KVP_HDR_SIZE], junk[300];
	rt_fill8(junk, sizeof(junk), 3);
	int fd;
	/* 1. garbage instead of a handshake */
	fd = raw_connect(addr);
	assert_int_equal(send(fd, junk, sizeof(junk), MSG_NOSIGNAL), (ssize_t)sizeof(junk));
	assert_int_equal(closed_by_peer(fd), 0);
	close(fd);
	/* 2. a well-formed request without authenticating */
	fd = raw_connect(addr);
	hdr_bytes(h, op, 0, KVP_MAGIC);
	send(fd, h, sizeof(h), MSG_NOSIGNAL);
	assert_int_equal(closed_by_peer(fd), 0);
	close(fd);
	/* 3. the wrong secret */
	struct kvp_secret bad;
	assert_int_equal(kvp_secret_from_string("not-the-cluster-secret", &bad), 0);
	struct kvp_sock *k = NULL;
	assert_int_equal(kvp_sock_open(addr, &bad, 3000, &k), -EACCES);
	/* 4. authenticated, then garbage bytes */
	k = sock_authed(addr, good);
	assert_int_equal(kvp_sock_write(k, junk, sizeof(junk)), 0);
	assert_true(sock_closed(k));
	kvp_sock_close(k);
	/* 5. a truncated header, then end of stream */
	k = sock_authed(addr, good);
	hdr_bytes(h, op, 0, KVP_MAGIC);
	assert_int_equal(kvp_sock_write(k, h, 13), 0);
	shutdown(kvp_sock_fd(k), SHUT_WR);
	assert_true(sock_closed(k));
	kvp_sock_close(k);
	/* 6. an oversized length */
	k = sock_authed(addr, good);
	hdr_bytes(h, op, KVP_MAX_BODY + 1, KVP_MAGIC);
	assert_int_equal(kvp_sock_write(k, h, sizeof(h)), 0);
	assert_true(sock_closed(k));
	kvp_sock_close(k);
	/* 7. a valid header, a truncated body */
	k = sock_authed(addr, good);
	hdr_bytes(h, op, 200, KVP_MAGIC);
	assert_int_equal(kvp_sock_write(k, h, sizeof(h)), 0);
	assert_int_equal(kvp_sock_write(k, junk, 20), 0);
	shutdown(kvp_sock_fd(k), SHUT_WR);
	assert_true(sock_closed(k));
	kvp_sock_close(k);
	/* 8. a complete frame whose body does not parse */
	k = sock_authed(addr, good);
	hdr_bytes(h, op, 3, KVP_MAGIC);
	assert_int_equal(kvp_sock_write(k, h, sizeof(h)), 0);
	assert_int_equal(kvp_sock_write(k, junk, 3), 0);
	assert_true(sock_closed(k));
	kvp_sock_close(k);
	/* 9. bad magic */
	k = sock_authed(addr, good);
	hdr_bytes(h, op, 0, 0xdeadbeef);
	assert_int_equal(kvp_sock_write(k, h, sizeof(h)), 0);
	assert_true(sock_closed(k));
	kvp_sock_close(k);
}

static void test_hostile_frames(void **state)
{
	(void)state;
	NEED_CLUSTER();
	const char *node = g_cl.nodes[0].addr;
	assert_int_equal(put_seeded(g_c, "/hostile", 3u << 20, 31, 1), 0);
	attack(g_cl.meta_addr, &g_cl.secret, KVP_OP_LOOKUP);
	still_serves(&g_cl, node);
	attack(node, &g_cl.secret, KVP_OP_GET);
	still_serves(&g_cl, node);
	assert_int_equal(check_file(g_c, "/hostile", 3u << 20, 31), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_namespace),
	    cmocka_unit_test(test_buffer_wait),
	    cmocka_unit_test(test_buffer_exact_fit),
	    cmocka_unit_test(test_sequential_windows),
	    cmocka_unit_test(test_prefetch),
	    cmocka_unit_test(test_many_files_and_degraded),
	    cmocka_unit_test(test_meta_kill_during_writes),
	    cmocka_unit_test(test_corrupt_and_stopped_node),
	    cmocka_unit_test(test_enospc),
	    cmocka_unit_test(test_degraded_edges),
	    cmocka_unit_test(test_hostile_frames),
	};
	const char *flt = getenv("KVFS_TEST_FILTER");
	if (flt)
		cmocka_set_test_filter(flt);
	return cmocka_run_group_tests(tests, setup, teardown);
}
