/* Repair against real daemons (harness): a node lost for good is rebuilt onto the others and
 * a second node loss then reads every file byte-exact (full redundancy was restored); drain
 * empties a live node so it can be removed; scrub finds chunk files flipped on disk and
 * rebuilds them, while reads were never wrong. docs/operations.md. */
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <unistd.h>

#include <cmocka.h>

#include "prom_parse.h"
#include "ret_tutil.h"

#define NFILES 24

/* The running test's cluster and client, stopped by teardown even when an assertion failed. */
static struct kvh_cluster g_cl;
static int g_up;
static struct kvc *g_c;

static int teardown(void **state)
{
	(void)state;
	rt_stop(&g_cl, &g_up, &g_c);
	return 0;
}

static struct kvc *client(struct kvh_cluster *cl)
{
	struct kvc_opts o = {.meta_addr = cl->meta_addr, .secret = &cl->secret};
	struct kvc *c = NULL;
	assert_int_equal(kvc_open(&o, &c), 0);
	kvc_set_read_timeout(c, 500);
	return c;
}

static size_t file_size(int i)
{
	return (size_t)(1 + i) * 37000u + (size_t)(i % 3) * 4096u;
}

static void check_files(struct kvc *c)
{
	char p[64];
	for (int i = 0; i < NFILES; i++) {
		snprintf(p, sizeof(p), "/d%d/f%d", i % 3, i);
		int rc = rt_check(c, p, file_size(i), 100 + (uint64_t)i);
		if (rc)
			fail_msg("%s: %s", p, kvp_strerror(rc));
	}
}

/* Node id of harness node i (by address). */
static uint32_t node_id(struct kvc *c, struct kvh_cluster *cl, int i)
{
	struct kvc_node *n;
	size_t nn;
	assert_int_equal(kvc_nodes(c, &n, &nn), 0);
	uint32_t id = 0;
	for (size_t j = 0; j < nn; j++)
		if (!strcmp(n[j].addr, cl->nodes[i].addr))
			id = n[j].id;
	free(n);
	assert_true(id != 0);
	return id;
}

/* Starts an nnodes cluster (meta/node flags as kvh_cluster_start takes them), opens the client
 * and writes the NFILES files that check_files reads back. */
static struct kvc *start_with_files_flags(int nnodes, const char *meta_args, const char *node_args,
					  unsigned flags)
{
	rt_start(&g_cl, &g_up, nnodes, meta_args, node_args, flags);
	struct kvc *c = g_c = client(&g_cl);
	for (int i = 0; i < 3; i++) {
		char p[16];
		snprintf(p, sizeof(p), "/d%d", i);
		assert_int_equal(kvc_mkdir_p(c, p, 0755), 0);
	}
	for (int i = 0; i < NFILES; i++) {
		char p[64];
		snprintf(p, sizeof(p), "/d%d/f%d", i % 3, i);
		assert_int_equal(rt_put(c, p, file_size(i), 100 + (uint64_t)i), 0);
	}
	return c;
}

static struct kvc *start_with_files(int nnodes, const char *meta_args, const char *node_args)
{
	return start_with_files_flags(nnodes, meta_args, node_args, 0);
}

/* Sum of one series over the scrapes of every running node (KVH_METRICS). */
static double nodes_metric(struct kvh_cluster *cl, const char *name, const char *labels)
{
	double sum = 0;
	for (int i = 0; i < cl->nnodes; i++) {
		if (!cl->nodes[i].pid)
			continue;
		char *body = NULL;
		struct prom_doc d;
		double v = 0;
		assert_int_equal(prom_http_get(cl->nodes[i].metrics, "/metrics", &body), 200);
		assert_int_equal(prom_parse(body, &d), 0);
		assert_int_equal(prom_get(&d, name, labels, &v), 0);
		sum += v;
		prom_free(&d);
		free(body);
	}
	return sum;
}

static void test_repair(void **state)
{
	(void)state;
	struct kvh_cluster *const clp = &g_cl;
	/* 5 nodes, stripes of 2+1: after one loss 4 remain, so repair has room for distinct
	 * nodes, and after a second loss reads need every stripe whole again. */
	struct kvc *c = start_with_files(5,
					 "--k 2 --m 1 --node-timeout 1s --gc-interval 0.1s "
					 "--repair-delay 0",
					 NULL);
	uint32_t lost = node_id(c, clp, 0);
	int held = rt_node_chunks(clp, 0, NULL, 0);
	assert_true(held > 0);
	assert_int_equal(kvh_node_kill(clp, 0, SIGKILL), 0);
	assert_int_equal(kvh_wait_nodes_up(clp, 4, 10000), 0);
	assert_int_equal(rt_maint(c, KVP_MAINT_NODE_REMOVE, lost), -EBUSY); /* still owns chunks */

	struct rt_status s = {0};
	assert_int_equal(rt_job(c, KVP_MAINT_REPAIR, 0, 60000, &s), 0);
	fprintf(stderr, "  repaired %llu/%llu chunks, %llu bytes, %llu failed\n",
		(unsigned long long)s.done, (unsigned long long)s.total,
		(unsigned long long)s.bytes, (unsigned long long)s.failed);
	assert_int_equal(s.kind, KVP_MAINT_REPAIR);
	assert_int_equal(s.total, (uint64_t)held);
	assert_int_equal(s.done, s.total);
	assert_int_equal(s.failed, 0);
	assert_true(s.bytes > 0);

	/* A second node goes: every stripe must be whole again for this to read. */
	assert_int_equal(kvh_node_kill(clp, 1, SIGKILL), 0);
	assert_int_equal(kvh_wait_nodes_up(clp, 3, 10000), 0);
	check_files(c);
	/* The first node owns nothing now: it can be forgotten. */
	assert_int_equal(rt_maint(c, KVP_MAINT_NODE_REMOVE, lost), 0);
	assert_int_equal(rt_maint(c, KVP_MAINT_NODE_REMOVE, lost), -ENOENT);
}

/* ALLOCs a 4-stripe 3+1 write, as wide as the 4-node cluster so that every stripe has a
 * chunk on every node, and returns its id when one is on node `on`, else aborts it and
 * returns 0. (A 2+1 write goes to the three emptiest nodes each time, and aborted writes
 * change no node's free space, so a fuller node was missed by every try in CI.) */
static uint64_t alloc_on(struct kvc *c, uint32_t on)
{
	uint8_t req[10] = {3, 1, 0, 0x10, 0, 0, 4, 0, 0, 0}; /* k 3, m 1, 4 KiB, 4 stripes */
	uint8_t *rb = NULL;
	uint32_t rl = 0;
	assert_int_equal(kvc_admin(c, KVP_OP_ALLOC, req, sizeof(req), &rb, &rl), 0);
	struct kvp_rbuf r;
	kvp_r_init(&r, rb, rl);
	uint64_t wid = kvp_r_u64(&r);
	uint32_t nn = kvp_r_u32(&r);
	for (uint32_t i = 0; i < nn; i++) {
		char a[KVP_ADDR_MAX];
		kvp_r_u32(&r);
		kvp_r_str(&r, a, sizeof(a));
	}
	int hit = 0;
	for (int s = 0; s < 4 * 4; s++) {
		hit |= kvp_r_u32(&r) == on;
		kvp_r_u64(&r);
	}
	assert_int_equal(r.err, 0);
	free(rb);
	if (hit)
		return wid;
	uint8_t ab[8];
	for (int i = 0; i < 8; i++)
		ab[i] = (uint8_t)(wid >> (8 * i));
	assert_int_equal(kvc_admin(c, KVP_OP_ABORT, ab, sizeof(ab), NULL, NULL), 0);
	return 0;
}

static void test_drain(void **state)
{
	(void)state;
	struct kvh_cluster *const clp = &g_cl;
	struct kvc *c = start_with_files(4,
					 "--k 2 --m 1 --node-timeout 2s --gc-interval 0.1s "
					 "--repair-delay 0",
					 NULL);
	uint32_t id = node_id(c, clp, 2);
	int held = rt_node_chunks(clp, 2, NULL, 0);
	fprintf(stderr, "  node %u holds %d chunks (%d in all)\n", id, held, rt_all_chunks(clp));
	assert_int_equal(rt_maint(c, KVP_MAINT_NODE_REMOVE, id), -EBUSY); /* up, not drained */
	/* A write allocated before the drain, with a chunk placed on the node. */
	uint64_t wid = 0;
	wid = alloc_on(c, id);
	assert_true(wid != 0);
	struct rt_status s = {0};
	assert_int_equal(rt_job(c, KVP_MAINT_DRAIN, id, 60000, &s), 0);
	assert_int_equal(s.total, (uint64_t)held);
	assert_int_equal(s.failed, 0);
	/* No new chunk lands on a draining node, and its old ones are deleted. */
	assert_int_equal(rt_put(c, "/after", 100000, 7), 0);
	int64_t end = rt_now_ms() + 5000;
	while (rt_node_chunks(clp, 2, NULL, 0) && rt_now_ms() < end)
		rt_sleep_ms(50);
	assert_int_equal(rt_node_chunks(clp, 2, NULL, 0), 0);
	struct kvc_node *n;
	size_t nn;
	assert_int_equal(kvc_nodes(c, &n, &nn), 0);
	for (size_t j = 0; j < nn; j++)
		if (n[j].id == id)
			assert_int_equal(n[j].state, KVP_NODE_DRAINING);
	free(n);
	assert_int_equal(kvh_node_kill(clp, 2, SIGTERM), 0);
	/* Not while that write could still commit a chunk on it (before: removed, and the
	 * commit then named a node no longer registered, never repaired). */
	assert_int_equal(rt_maint(c, KVP_MAINT_NODE_REMOVE, id), -EBUSY);
	uint8_t ab[8];
	for (int i = 0; i < 8; i++)
		ab[i] = (uint8_t)(wid >> (8 * i));
	assert_int_equal(kvc_admin(c, KVP_OP_ABORT, ab, sizeof(ab), NULL, NULL), 0);
	assert_int_equal(rt_maint(c, KVP_MAINT_NODE_REMOVE, id), 0);
	check_files(c);
	assert_int_equal(rt_check(c, "/after", 100000, 7), 0);
}

/* Flips one byte in the data of up to `max` chunk files of node i. Returns how many. */
static int rot_node(struct kvh_cluster *cl, int i, int max)
{
	char cmd[900];
	snprintf(cmd, sizeof(cmd), "find %s/chunks -type f -size +1k | head -n %d > %s/rot.list",
		 cl->nodes[i].dir, max, cl->dir);
	assert_int_equal(kvh_sh("%s", cmd), 0);
	char lf[400];
	snprintf(lf, sizeof(lf), "%s/rot.list", cl->dir);
	FILE *f = fopen(lf, "r");
	assert_non_null(f);
	char path[1000];
	int n = 0;
	while (fgets(path, sizeof(path), f)) {
		path[strcspn(path, "\n")] = 0;
		int fd = open(path, O_RDWR);
		assert_true(fd >= 0);
		uint8_t b;
		assert_int_equal(pread(fd, &b, 1, 64 + 100), 1);
		b ^= 0x5A;
		assert_int_equal(pwrite(fd, &b, 1, 64 + 100), 1);
		close(fd);
		n++;
	}
	fclose(f);
	return n;
}

static void test_scrub(void **state)
{
	(void)state;
	struct kvh_cluster *const clp = &g_cl;
	struct kvc *c = start_with_files_flags(4,
					       "--k 2 --m 1 --node-timeout 2s --gc-interval 0.1s "
					       "--repair-delay 0 --scrub-interval 0",
					       "--direct-read", KVH_METRICS);
	/* One node only: a stripe has one chunk per node, so no stripe loses two. */
	int rotten = rot_node(clp, 1, 7);
	assert_true(rotten >= 4);
	check_files(c); /* never wrong: CRC catches the flips, parity decodes */

	/* The nodes check their chunks themselves (VERIFY): no chunk crosses to meta, only the
	 * rebuilds of the rotten ones read their stripes' other chunks. */
	double verify0 = nodes_metric(clp, "kvfs_node_requests_total", "op=\"verify\"");
	double gets0 = nodes_metric(clp, "kvfs_node_requests_total", "op=\"get\"");
	struct rt_status s = {0};
	assert_int_equal(rt_job(c, KVP_MAINT_SCRUB, 0, 60000, &s), 0);
	double verifies = nodes_metric(clp, "kvfs_node_requests_total", "op=\"verify\"") - verify0;
	double gets = nodes_metric(clp, "kvfs_node_requests_total", "op=\"get\"") - gets0;
	fprintf(stderr, "  scrub: %.0f verify, %.0f get requests on the nodes\n", verifies, gets);
	fprintf(stderr, "  scrub: checked %llu corrupt %llu missing %llu repaired %llu\n",
		(unsigned long long)s.st[KVP_MST_SCRUB_CHECKED],
		(unsigned long long)s.st[KVP_MST_SCRUB_CORRUPT],
		(unsigned long long)s.st[KVP_MST_SCRUB_MISSING],
		(unsigned long long)s.st[KVP_MST_SCRUB_REPAIRED]);
	assert_int_equal(s.st[KVP_MST_SCRUB_CHECKED], (uint64_t)rt_all_chunks(clp));
	assert_int_equal(s.st[KVP_MST_SCRUB_CORRUPT], (uint64_t)rotten);
	assert_int_equal(s.st[KVP_MST_SCRUB_REPAIRED], (uint64_t)rotten);
	assert_int_equal(s.failed, 0);
	assert_true(verifies == (double)s.st[KVP_MST_SCRUB_CHECKED]);
	assert_true(gets <= 2.0 * rotten); /* k = 2 survivors read per rebuilt chunk */

	/* A chunk file deleted on disk is found missing and rebuilt too. */
	char victim[1000];
	assert_true(rt_node_chunks(clp, 0, victim, sizeof(victim)) > 0);
	assert_int_equal(unlink(victim), 0);
	assert_int_equal(rt_job(c, KVP_MAINT_SCRUB, 0, 60000, &s), 0);
	assert_int_equal(s.st[KVP_MST_SCRUB_CORRUPT], (uint64_t)rotten); /* none new */
	assert_int_equal(s.st[KVP_MST_SCRUB_MISSING], 1);
	assert_int_equal(s.st[KVP_MST_SCRUB_REPAIRED], (uint64_t)rotten + 1);

	/* Every stripe is whole again: with any one node gone, everything still reads. */
	assert_int_equal(kvh_node_kill(clp, 2, SIGKILL), 0);
	assert_int_equal(kvh_wait_nodes_up(clp, 3, 10000), 0);
	check_files(c);
}

/* Sizes 0 B .. 3 stripes of SF_K data chunks of 4 KiB: every chunk boundary, one byte either
 * side, and a few sizes inside a chunk. Returns how many (at most cap). */
#define SF_K	 4
#define SF_CHUNK 4096u
static size_t small_sizes(size_t *out, size_t cap)
{
	size_t n = 0;
	out[n++] = 0;
	out[n++] = 100;
	for (size_t b = SF_CHUNK; b <= 3 * SF_K * SF_CHUNK && n + 3 <= cap; b += SF_CHUNK) {
		out[n++] = b - 1;
		out[n++] = b;
		if (b < 3 * SF_K * SF_CHUNK)
			out[n++] = b + 1;
	}
	if (n < cap)
		out[n++] = SF_K * SF_CHUNK + SF_CHUNK / 2;
	return n;
}

static void check_small(struct kvc *c, const size_t *sz, size_t n)
{
	char p[64];
	for (size_t i = 0; i < n; i++) {
		snprintf(p, sizeof(p), "/s/f%zu", i);
		int rc = rt_check(c, p, sz[i], 500 + i);
		if (rc)
			fail_msg("%s (%zu bytes): %s", p, sz[i], kvp_strerror(rc));
	}
}

/* Files smaller than a stripe (and the last stripe of bigger ones) have data chunks that hold
 * no byte: they are never stored. Scrub, repair and drain know it from the file's size and
 * layout. Before, a healthy cluster's scrub counted every such chunk missing and failed to
 * repair it (a 1-byte 4+2 file: 3 "missing", 3 "failed"), and a drain of a node holding one
 * never finished, so the node could never be removed. A chunk really gone is still found. */
static void test_small_files(void **state)
{
	(void)state;
	struct kvh_cluster *const clp = &g_cl;
	/* 4+2 on 7 nodes: a drained node's chunks have a node outside their stripe to go to. */
	rt_start(clp, &g_up, 7,
		 "--k 4 --m 2 --chunk-size 4096 --node-timeout 2s "
		 "--gc-interval 0.1s --repair-delay 0 --scrub-interval 0",
		 NULL, 0);
	struct kvc *c = g_c = client(clp);
	assert_int_equal(kvc_mkdir_p(c, "/s", 0755), 0);
	size_t sz[64];
	size_t n = small_sizes(sz, 64);
	char p[64];
	for (size_t i = 0; i < n; i++) {
		snprintf(p, sizeof(p), "/s/f%zu", i);
		assert_int_equal(rt_put(c, p, sz[i], 500 + i), 0);
	}
	check_small(c, sz, n);

	/* Healthy: nothing missing, nothing failed, only stored chunks checked. */
	struct rt_status s = {0};
	assert_int_equal(rt_job(c, KVP_MAINT_SCRUB, 0, 60000, &s), 0);
	fprintf(stderr, "  %zu files: scrub %llu/%llu, checked %llu, missing %llu, failed %llu\n",
		n, (unsigned long long)s.done, (unsigned long long)s.total,
		(unsigned long long)s.st[KVP_MST_SCRUB_CHECKED],
		(unsigned long long)s.st[KVP_MST_SCRUB_MISSING], (unsigned long long)s.failed);
	assert_int_equal(s.st[KVP_MST_SCRUB_MISSING], 0);
	assert_int_equal(s.st[KVP_MST_SCRUB_CORRUPT], 0);
	assert_int_equal(s.failed, 0);
	assert_int_equal(s.done, s.total);
	assert_int_equal(s.st[KVP_MST_SCRUB_CHECKED], (uint64_t)rt_all_chunks(clp));

	/* Drain a node: it finishes, the node ends up owning nothing and can be removed. */
	uint32_t id = node_id(c, clp, 0);
	int held = rt_node_chunks(clp, 0, NULL, 0);
	assert_true(held > 0);
	assert_int_equal(rt_job(c, KVP_MAINT_DRAIN, id, 60000, &s), 0);
	fprintf(stderr, "  drain of node %u (%d chunk files): %llu/%llu slots, %llu failed\n", id,
		held, (unsigned long long)s.done, (unsigned long long)s.total,
		(unsigned long long)s.failed);
	assert_int_equal(s.failed, 0);
	assert_int_equal(s.done, s.total);
	assert_true(s.total >= (uint64_t)held);
	int64_t end = rt_now_ms() + 5000;
	while (rt_node_chunks(clp, 0, NULL, 0) && rt_now_ms() < end)
		rt_sleep_ms(50);
	assert_int_equal(rt_node_chunks(clp, 0, NULL, 0), 0);
	assert_int_equal(kvh_node_kill(clp, 0, SIGTERM), 0);
	assert_int_equal(rt_maint(c, KVP_MAINT_NODE_REMOVE, id), 0);
	check_small(c, sz, n);

	/* Still healthy after the drain: a second scrub finds nothing either. */
	uint64_t missing0 = s.st[KVP_MST_SCRUB_MISSING], failed0 = s.st[KVP_MST_REPAIR_FAILED];
	assert_int_equal(rt_job(c, KVP_MAINT_SCRUB, 0, 60000, &s), 0);
	assert_int_equal(s.st[KVP_MST_SCRUB_MISSING], missing0);
	assert_int_equal(s.st[KVP_MST_REPAIR_FAILED], failed0);
	assert_int_equal(s.failed, 0);

	/* A chunk file really gone is still missing, and rebuilt. */
	char victim[1000];
	assert_true(rt_node_chunks(clp, 1, victim, sizeof(victim)) > 0);
	assert_int_equal(unlink(victim), 0);
	uint64_t rep0 = s.st[KVP_MST_SCRUB_REPAIRED];
	assert_int_equal(rt_job(c, KVP_MAINT_SCRUB, 0, 60000, &s), 0);
	assert_int_equal(s.st[KVP_MST_SCRUB_MISSING], missing0 + 1);
	assert_int_equal(s.st[KVP_MST_SCRUB_REPAIRED], rep0 + 1);
	assert_int_equal(s.failed, 0);

	/* A node lost for good is repaired and removed: the data chunks it held are rebuilt from
	 * stripes whose empty chunks count as present zeros (a 1-byte file's data chunk 0 from
	 * its 3 empty chunks and a parity; before, 2 of 4 were found: -EIO). A node is added
	 * first: a 4+2 stripe needs 6 distinct nodes to go to. */
	assert_true(kvh_node_add(clp, NULL) >= 0);
	assert_int_equal(kvh_wait_nodes_up(clp, 7, 10000), 0);
	uint32_t lost = node_id(c, clp, 1);
	assert_int_equal(kvh_node_kill(clp, 1, SIGKILL), 0);
	assert_int_equal(kvh_wait_nodes_up(clp, 6, 10000), 0);
	assert_int_equal(rt_job(c, KVP_MAINT_REPAIR, lost, 60000, &s), 0);
	fprintf(stderr, "  repair of node %u: %llu/%llu slots, %llu failed\n", lost,
		(unsigned long long)s.done, (unsigned long long)s.total,
		(unsigned long long)s.failed);
	assert_int_equal(s.failed, 0);
	assert_int_equal(s.done, s.total);
	assert_int_equal(rt_maint(c, KVP_MAINT_NODE_REMOVE, lost), 0);
	/* Whole again: with two more nodes gone (m = 2), everything still reads. */
	assert_int_equal(kvh_node_kill(clp, 2, SIGKILL), 0);
	assert_int_equal(kvh_node_kill(clp, 3, SIGKILL), 0);
	assert_int_equal(kvh_wait_nodes_up(clp, 4, 10000), 0);
	check_small(c, sz, n);
}

/* A down node whose chunks have nowhere to go (2+1 on 3 nodes: both survivors hold the
 * stripe) is tried once, with no reads, and not again until more nodes are up. Before, the
 * automatic repair started over every ~200 ms, rebuilding every chunk (reading its stripe's
 * survivors) before finding no destination. */
static void test_repair_impossible(void **state)
{
	(void)state;
	struct kvh_cluster *const clp = &g_cl;
	struct kvc *c = start_with_files_flags(3,
					       "--k 2 --m 1 --node-timeout 1s --gc-interval 0.1s "
					       "--repair-delay 0.5s",
					       NULL, KVH_METRICS);
	int held = rt_node_chunks(clp, 2, NULL, 0);
	assert_true(held > 0);
	double gets0 = nodes_metric(clp, "kvfs_node_requests_total", "op=\"get\"");
	assert_int_equal(kvh_node_kill(clp, 2, SIGKILL), 0);
	struct rt_status s = {0};
	int64_t end = rt_now_ms() + 30000;
	do { /* the first attempt */
		rt_sleep_ms(100);
		assert_int_equal(rt_mstatus(c, &s), 0);
	} while (s.st[KVP_MST_REPAIR_FAILED] < (uint64_t)held && rt_now_ms() < end);
	assert_int_equal(s.st[KVP_MST_REPAIR_FAILED], (uint64_t)held);
	rt_sleep_ms(3000); /* ~15 passes of the worker */
	assert_int_equal(rt_mstatus(c, &s), 0);
	double gets = nodes_metric(clp, "kvfs_node_requests_total", "op=\"get\"") - gets0;
	fprintf(stderr, "  impossible repair: %llu failed, %.0f chunk reads\n",
		(unsigned long long)s.st[KVP_MST_REPAIR_FAILED], gets);
	assert_int_equal(s.st[KVP_MST_REPAIR_FAILED], (uint64_t)held);
	assert_true(gets == 0);
	check_files(c); /* degraded reads still decode */
}

/* A node down for --repair-delay is repaired without anyone asking, rate-limited. */
static void test_auto_repair(void **state)
{
	(void)state;
	struct kvh_cluster *const clp = &g_cl;
	struct kvc *c = start_with_files(4,
					 "--k 2 --m 1 --node-timeout 1s --gc-interval 0.1s "
					 "--repair-delay 1s --repair-rate 20M",
					 NULL);
	int held = rt_node_chunks(clp, 3, NULL, 0);
	assert_true(held > 0);
	assert_int_equal(kvh_node_kill(clp, 3, SIGKILL), 0);
	struct rt_status s = {0};
	int64_t end = rt_now_ms() + 30000;
	do {
		rt_sleep_ms(200);
		assert_int_equal(rt_mstatus(c, &s), 0);
	} while (!(s.kind == KVP_MAINT_REPAIR && !s.running && s.done == (uint64_t)held) &&
		 rt_now_ms() < end);
	fprintf(stderr, "  auto repair: %llu/%llu chunks, %.1f MiB/s\n", (unsigned long long)s.done,
		(unsigned long long)s.total,
		s.elapsed_ns ? (double)s.bytes / 1048576.0 / ((double)s.elapsed_ns / 1e9) : 0.0);
	assert_int_equal(s.kind, KVP_MAINT_REPAIR);
	assert_int_equal(s.done, (uint64_t)held);
	assert_int_equal(s.failed, 0);
	assert_int_equal(kvh_node_kill(clp, 0, SIGKILL), 0);
	assert_int_equal(kvh_wait_nodes_up(clp, 2, 10000), 0);
	check_files(c);
}

/* Stripes of path not stored whole: a slot without a node (written degraded) or two slots on
 * one node. 0 when every stripe has k+m chunks on k+m distinct nodes. */
static int short_stripes(struct kvc *c, const char *path)
{
	struct kvp_attr a;
	struct kvc_file *f;
	assert_int_equal(kvc_resolve(c, path, &a), 0);
	assert_int_equal(kvc_file_open(c, a.ino, &f), 0);
	struct kvc_layout_info li;
	uint32_t *slots = NULL;
	assert_int_equal(kvc_file_layout(f, &li, &slots), 0);
	int w = li.k + li.m, n = 0;
	for (uint32_t s = 0; s < li.nstripes; s++) {
		int bad = 0;
		for (int j = 0; j < w; j++) {
			bad |= slots[s * w + j] == 0;
			for (int i = 0; i < j; i++)
				bad |= slots[s * w + i] == slots[s * w + j];
		}
		n += bad;
	}
	free(slots);
	kvc_file_close(f);
	return n;
}

/* 4+1 with 16 KiB chunks: every size fills all 4 data chunks of its last stripe (1..4
 * stripes), so each stripe has 5 stored chunks when whole. */
#define DG_FILES 8
static size_t dg_size(int i)
{
	return (size_t)(1 + i % 4) * 65536u - 1000u * (size_t)(1 + i);
}

static void dg_write(struct kvc *c, const char *batch, uint64_t seed0)
{
	char p[64];
	for (int i = 0; i < DG_FILES; i++) {
		snprintf(p, sizeof(p), "/g/%s%d", batch, i);
		int rc = rt_put(c, p, dg_size(i), seed0 + (uint64_t)i);
		if (rc)
			fail_msg("write %s with a node down: %s", p, kvp_strerror(rc));
	}
}

/* Every file of a batch reads back exact; returns how many have stripes not stored whole. */
static int dg_check(struct kvc *c, const char *batch, uint64_t seed0)
{
	char p[64];
	int shortf = 0;
	for (int i = 0; i < DG_FILES; i++) {
		snprintf(p, sizeof(p), "/g/%s%d", batch, i);
		int rc = rt_check(c, p, dg_size(i), seed0 + (uint64_t)i);
		if (rc)
			fail_msg("%s: %s", p, kvp_strerror(rc));
		shortf += short_stripes(c, p) > 0;
	}
	return shortf;
}

static double meta_metric(struct kvh_cluster *cl, const char *name)
{
	char *body = NULL;
	struct prom_doc d;
	double v = -1;
	assert_int_equal(prom_http_get(cl->meta_metrics, "/metrics", &body), 200);
	assert_int_equal(prom_parse(body, &d), 0);
	assert_int_equal(prom_get(&d, name, "", &v), 0);
	prom_free(&d);
	free(body);
	return v;
}

/* Exactly k+m nodes (4+1 on 5) and one SIGKILLed: writes go on at once, before meta notices
 * (the client writes around the node that refuses) and after (meta places 4 nodes, parity left
 * out); every stripe that lacks a chunk is marked and shown. When the node returns, repair
 * completes those stripes first, without being asked; a second node lost then still reads
 * every file exact. Before: every write failed (EIO after retries, then EHOSTDOWN). */
static void test_degraded_writes(void **state)
{
	(void)state;
	struct kvh_cluster *const clp = &g_cl;
	rt_start(clp, &g_up, 5,
		 "--k 4 --m 1 --chunk-size 16K --node-timeout 12s "
		 "--gc-interval 0.1s --repair-delay 0",
		 NULL, KVH_METRICS);
	struct kvc *c = g_c = client(clp);
	assert_int_equal(kvc_mkdir_p(c, "/g", 0755), 0);
	dg_write(c, "a", 500);
	assert_int_equal(dg_check(c, "a", 500), 0);

	/* Killed, and meta does not know yet (6 s): the writes must not wait for it. */
	struct kvc_stats st0, st1;
	kvc_get_stats(c, &st0);
	assert_int_equal(kvh_node_kill(clp, 4, SIGKILL), 0);
	int64_t t0 = rt_now_ms();
	dg_write(c, "b", 600);
	int64_t took = rt_now_ms() - t0;
	kvc_get_stats(c, &st1);
	struct kvc_statfs sf;
	assert_int_equal(kvc_statfs(c, &sf), 0);
	fprintf(stderr,
		"  %d files with a node killed: %lld ms, %llu chunks written around, "
		"meta saw %u up\n",
		DG_FILES, (long long)took,
		(unsigned long long)(st1.chunks_written_around - st0.chunks_written_around),
		sf.nodes_up);
	assert_true(st1.chunks_written_around > st0.chunks_written_around);

	/* Meta knows: it places 4 nodes, the client stores what it was given. Until then (12 s)
	 * an automatic repair of the new degraded stripes tries the node meta still thinks up,
	 * and fails; that must not keep them from repair once the node is back. */
	assert_int_equal(kvh_wait_nodes_up(clp, 4, 20000), 0);
	dg_write(c, "c", 700);
	assert_int_equal(dg_check(c, "a", 500), 0);
	assert_int_equal(dg_check(c, "b", 600), DG_FILES); /* 5 slots on 5 nodes: all touched */
	assert_int_equal(dg_check(c, "c", 700), DG_FILES);
	struct rt_status s = {0};
	assert_int_equal(rt_mstatus(c, &s), 0);
	uint64_t stripes = 0;
	for (int i = 0; i < DG_FILES; i++)
		stripes += 2 * (uint64_t)(1 + i % 4); /* batches b and c */
	fprintf(stderr, "  degraded: %llu stripes in %llu files, %llu written degraded\n",
		(unsigned long long)s.st[KVP_MST_DEGR_STRIPES],
		(unsigned long long)s.st[KVP_MST_DEGR_FILES],
		(unsigned long long)s.st[KVP_MST_DEGR_WRITES]);
	assert_int_equal(s.st[KVP_MST_DEGR_FILES], 2 * DG_FILES);
	assert_int_equal(s.st[KVP_MST_DEGR_STRIPES], stripes);
	assert_int_equal(s.st[KVP_MST_DEGR_WRITES], stripes);
	assert_true(meta_metric(clp, "kvfs_meta_degraded_stripes") == (double)stripes);
	assert_true(meta_metric(clp, "kvfs_meta_degraded_files") == 2.0 * DG_FILES);

	/* The node returns: degraded stripes are completed without anyone asking. */
	uint64_t failed0 = s.st[KVP_MST_REPAIR_FAILED];
	assert_int_equal(kvh_node_restart(clp, 4), 0);
	assert_int_equal(kvh_wait_nodes_up(clp, 5, 15000), 0);
	int64_t end = rt_now_ms() + 30000;
	do {
		rt_sleep_ms(100);
		assert_int_equal(rt_mstatus(c, &s), 0);
	} while ((s.st[KVP_MST_DEGR_STRIPES] || s.running) && rt_now_ms() < end);
	fprintf(stderr,
		"  after the node returned: %llu degraded stripes, %llu repaired, %llu failed "
		"while the node was down\n",
		(unsigned long long)s.st[KVP_MST_DEGR_STRIPES],
		(unsigned long long)s.st[KVP_MST_REPAIRED], (unsigned long long)failed0);
	assert_int_equal(s.st[KVP_MST_DEGR_STRIPES], 0);
	assert_int_equal(s.st[KVP_MST_REPAIR_FAILED], failed0);
	assert_int_equal(dg_check(c, "a", 500), 0);
	assert_int_equal(dg_check(c, "b", 600), 0); /* k+m chunks on k+m nodes again */
	assert_int_equal(dg_check(c, "c", 700), 0);

	/* Full redundancy holds: another node lost, everything still reads exact. */
	assert_int_equal(kvh_node_kill(clp, 1, SIGKILL), 0);
	assert_int_equal(kvh_wait_nodes_up(clp, 4, 15000), 0);
	kvc_set_read_timeout(c, 500);
	for (int b = 0; b < 3; b++) {
		char p[64];
		for (int i = 0; i < DG_FILES; i++) {
			snprintf(p, sizeof(p), "/g/%c%d", 'a' + b, i);
			int rc = rt_check(c, p, dg_size(i), 500 + 100 * (uint64_t)b + (uint64_t)i);
			if (rc)
				fail_msg("%s after a second loss: %s", p, kvp_strerror(rc));
		}
	}
}

/* --write-redundancy 1 on 2+1: a write must store all 3 chunks, so with a node down it is
 * refused (EHOSTDOWN once meta knows; before, the PUT's error) and nothing is published. */
static void test_write_redundancy(void **state)
{
	(void)state;
	struct kvh_cluster *const clp = &g_cl;
	rt_start(clp, &g_up, 3,
		 "--k 2 --m 1 --node-timeout 8s --gc-interval 0.1s "
		 "--repair-delay 0 --write-redundancy 1",
		 NULL, 0);
	struct kvc *c = g_c = client(clp);
	assert_int_equal(kvc_mkdir_p(c, "/r", 0755), 0);
	assert_int_equal(rt_put(c, "/r/ok", 50000, 1), 0);
	assert_int_equal(kvh_node_kill(clp, 0, SIGKILL), 0);
	int rc = rt_put(c, "/r/early", 50000, 2); /* meta does not know yet */
	fprintf(stderr, "  before meta noticed: %s\n", kvp_strerror(rc));
	assert_true(rc != 0);
	struct kvp_attr a;
	assert_int_equal(kvc_resolve(c, "/r/early", &a), -ENOENT);
	assert_int_equal(kvh_wait_nodes_up(clp, 2, 20000), 0);
	assert_int_equal(rt_put(c, "/r/late", 50000, 3), -EHOSTDOWN);
	assert_int_equal(kvc_resolve(c, "/r/late", &a), -ENOENT);
	assert_int_equal(rt_check(c, "/r/ok", 50000, 1), 0);
	struct rt_status s = {0};
	assert_int_equal(rt_mstatus(c, &s), 0);
	assert_int_equal(s.st[KVP_MST_DEGR_WRITES], 0);
}

/* Zones of every stripe of path: fails when two of a stripe's chunks share a zone. */
static void check_zones(struct kvc *c, const char *path, const struct kvc_node *nd, size_t nn)
{
	struct kvp_attr a;
	assert_int_equal(kvc_resolve(c, path, &a), 0);
	struct kvc_file *f;
	assert_int_equal(kvc_file_open(c, a.ino, &f), 0);
	struct kvc_layout_info li;
	uint32_t *slots = NULL;
	assert_int_equal(kvc_file_layout(f, &li, &slots), 0);
	uint32_t w = (uint32_t)(li.k + li.m);
	for (uint32_t s = 0; s < li.nstripes; s++)
		for (uint32_t j = 0; j < w; j++)
			for (uint32_t i = 0; i < j; i++) {
				const char *zi = "", *zj = "";
				for (size_t x = 0; x < nn; x++) {
					if (nd[x].id == slots[s * w + i])
						zi = nd[x].zone;
					if (nd[x].id == slots[s * w + j])
						zj = nd[x].zone;
				}
				if (zi[0] && strcmp(zi, zj) == 0)
					fail_msg("%s stripe %u: two chunks in zone %s", path, s,
						 zi);
			}
	free(slots);
	kvc_file_close(f);
}

/* Repair keeps failure domains: 5 nodes in zones a, a, b, c, d (d's node small, so placement
 * by free space alone never picks it while the others have room). 2+1 stripes span 3 zones:
 * an a-node, b and c. With b's node lost, its chunks have two candidates, the other a-node
 * (more room, but zone a already holds a chunk of the stripe) and d: repair must pick d. */
static void test_repair_zones(void **state)
{
	(void)state;
	rt_need_bins();
	struct kvh_cluster *const clp = &g_cl;
	struct kvh_hosts h = {.node_args = {"--zone a", "--zone a", "--zone b", "--zone c",
					    "--zone d --capacity 64M"}};
	g_up = 1;
	assert_int_equal(kvh_cluster_start_hosts(clp, 5,
						 "--k 2 --m 1 --node-timeout 1s --repair-delay 1h",
						 NULL, 0, &h),
			 0);
	struct kvc *c = g_c = client(clp);
	assert_int_equal(kvc_mkdir_p(c, "/z", 0755), 0);
	char p[32];
	for (int i = 0; i < 12; i++) {
		snprintf(p, sizeof(p), "/z/f%d", i);
		assert_int_equal(rt_put(c, p, 60000 + (size_t)i * 1000, 700 + (uint64_t)i), 0);
	}
	struct kvc_node *nd;
	size_t nn;
	assert_int_equal(kvc_nodes(c, &nd, &nn), 0);
	for (int i = 0; i < 12; i++) {
		snprintf(p, sizeof(p), "/z/f%d", i);
		check_zones(c, p, nd, nn);
	}
	free(nd);
	uint32_t lost = node_id(c, clp, 2);
	assert_true(rt_node_chunks(clp, 2, NULL, 0) > 0);
	assert_int_equal(kvh_node_kill(clp, 2, SIGKILL), 0);
	assert_int_equal(kvh_wait_nodes_up(clp, 4, 10000), 0);
	struct rt_status s = {0};
	assert_int_equal(rt_job(c, KVP_MAINT_REPAIR, lost, 60000, &s), 0);
	assert_int_equal(s.failed, 0);
	assert_true(s.done > 0);
	assert_int_equal(kvc_nodes(c, &nd, &nn), 0);
	for (int i = 0; i < 12; i++) {
		snprintf(p, sizeof(p), "/z/f%d", i);
		check_zones(c, p, nd, nn);
		assert_int_equal(rt_check(c, p, 60000 + (size_t)i * 1000, 700 + (uint64_t)i), 0);
	}
	free(nd);
}

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	/* --only PATTERN: the tests whose name matches (cmocka's * and ? wildcards) */
	if (argc > 2 && strcmp(argv[1], "--only") == 0)
		cmocka_set_test_filter(argv[2]);
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_teardown(test_repair, teardown),
	    cmocka_unit_test_teardown(test_drain, teardown),
	    cmocka_unit_test_teardown(test_scrub, teardown),
	    cmocka_unit_test_teardown(test_small_files, teardown),
	    cmocka_unit_test_teardown(test_repair_impossible, teardown),
	    cmocka_unit_test_teardown(test_auto_repair, teardown),
	    cmocka_unit_test_teardown(test_degraded_writes, teardown),
	    cmocka_unit_test_teardown(test_write_redundancy, teardown),
	    cmocka_unit_test_teardown(test_repair_zones, teardown),
	};
	const char *flt = getenv("KVFS_TEST_FILTER");
	if (flt)
		cmocka_set_test_filter(flt);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
