/* A cluster across hosts: kvfs-meta, 14 kvfs-node and the client each in a network namespace
 * of their own ("hosts", tests/netns_tutil.h), joined by veth pairs and a bridge, every link
 * shaped to 0.2 ms each way and 10 Gbit/s (delay only where the kernel has netem). The 14
 * nodes sit in 11 zones on 11 storage hosts: hosts 1-3 carry two nodes each (a machine with
 * two SSDs, one zone), so with k+m = 11 a placement that ignores zones puts both nodes of a
 * zone into most stripes, and losing that zone loses two chunks of them.
 *
 * Tests: `kvfs status` lists the zones; a whole zone cut off (its host's link down) — every file
 * reads back exact and new writes work; a slow host (50 ms each way, by netem or else the TAP
 * delayer of tests/link_delay.h, the added round trip measured and asserted; and 5 Mbit/s by
 * tbf) — writes and reads exact, each within a documented bound; a node killed mid-write — no
 * acknowledged file lost, no partial file visible. Where namespaces cannot be made it prints
 * "skipped: <reason>" and exits 77. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "kvc.h"
#include "kvp.h"
#include "netns_tutil.h"
#include "ret_tutil.h"

#define NZONES	      11
#define NNODES	      14 /* zones 0-2 hold two nodes each */
#define HOST_META     0
#define HOST_CLIENT   (NZONES + 1)
#define NHOSTS	      (NZONES + 2)
#define BASE_DELAY_MS 0.2
#define BASE_RATE     "10gbit"
/* The bound of the slow-host test, per whole-file write or read (docs/operations.md). */
#define SLOW_BOUND_MS 5000

static struct kvn_net g_net;
static struct kvh_cluster g_cl;
static struct kvc *g_c;

static int put_seeded(struct kvc *c, const char *path, size_t size, uint64_t seed)
{
	return rt_put_as(c, path, size, seed, 0, rt_fill8);
}

/* 0 when path holds exactly rt_fill8(size, seed); -EILSEQ when it holds anything else. */
static int check_seeded(struct kvc *c, const char *path, size_t size, uint64_t seed)
{
	return rt_check_as(c, path, size, seed, rt_fill8);
}

static int host_of_node(int i)
{
	return 1 + (i < NZONES ? i : i - NZONES);
}

/* Every node of zone z: the zone's host link down (0) or up (1). */
static void zone_link(int z, int up)
{
	assert_int_equal(kvn_link(&g_net, 1 + z, up), 0);
}

static size_t file_size(int i)
{
	static const size_t sizes[] = {0, 1, 4096, 100000, 1u << 20, (5u << 20) / 2, 3u << 20};
	return i < 7 ? sizes[i] : (size_t)(i * 7919u * 37u) % (3u << 20);
}

/* `kvfs status` from the client host: 11 zones, each node with its own. */
static void test_status_zones(void **state)
{
	(void)state;
	char bin[600];
	assert_int_equal(kvh_bin("kvfs", bin, sizeof(bin)), 0);
	assert_int_equal(kvh_sh("'%s' --meta %s --secret-file '%s' status | grep -q '^zones: %d$'",
				bin, g_cl.meta_addr, g_cl.secret_file, NZONES),
			 0);
	/* zone z0 holds two nodes (0 and 11), z10 one */
	assert_int_equal(kvh_sh("test $('%s' --meta %s --secret-file '%s' status | "
				"grep -c ' z0$') -eq 2",
				bin, g_cl.meta_addr, g_cl.secret_file),
			 0);
	assert_int_equal(kvh_sh("test $('%s' --meta %s --secret-file '%s' status | "
				"grep -c ' z10$') -eq 1",
				bin, g_cl.meta_addr, g_cl.secret_file),
			 0);
}

/* A whole zone lost (zone 0: its host holds nodes 0 and 11): every file still reads exact;
 * files written while it is gone read too. */
static void test_zone_lost(void **state)
{
	(void)state;
	const int nf = 40;
	char path[64];
	assert_int_equal(kvc_mkdir_p(g_c, "/zone", 0755), 0);
	for (int i = 0; i < nf; i++) {
		snprintf(path, sizeof(path), "/zone/f%d", i);
		assert_int_equal(put_seeded(g_c, path, file_size(i), 100 + (uint64_t)i), 0);
	}
	zone_link(0, 0);
	int64_t t0 = rt_now_ms();
	for (int i = 0; i < nf; i++) {
		snprintf(path, sizeof(path), "/zone/f%d", i);
		int rc = check_seeded(g_c, path, file_size(i), 100 + (uint64_t)i);
		if (rc)
			fprintf(stderr, "%s (%zu B): %s\n", path, file_size(i), kvp_strerror(rc));
		assert_int_equal(rc, 0);
	}
	fprintf(stderr, "zone 0 down: %d files read exact in %lld ms\n", nf,
		(long long)(rt_now_ms() - t0));
	/* Meta sees both nodes of the zone go; writes go on over the 10 zones left. */
	assert_int_equal(kvh_wait_nodes_up(&g_cl, NNODES - 2, 20000), 0);
	for (int i = 0; i < 10; i++) {
		snprintf(path, sizeof(path), "/zone/g%d", i);
		assert_int_equal(put_seeded(g_c, path, file_size(i + 3), 200 + (uint64_t)i), 0);
		assert_int_equal(check_seeded(g_c, path, file_size(i + 3), 200 + (uint64_t)i), 0);
	}
	zone_link(0, 1);
	assert_int_equal(kvh_wait_nodes_up(&g_cl, NNODES, 20000), 0);
	for (int i = 0; i < 10; i++) {
		snprintf(path, sizeof(path), "/zone/g%d", i);
		assert_int_equal(check_seeded(g_c, path, file_size(i + 3), 200 + (uint64_t)i), 0);
	}
}

/* Writes then reads n files of size bytes under dir; returns the slowest op in ms, and the
 * time of all of them in *total. */
static int64_t write_read(const char *dir, int n, size_t size, uint64_t seed, int64_t *total)
{
	int64_t t0 = rt_now_ms();
	char path[64];
	int64_t worst = 0;
	assert_int_equal(kvc_mkdir_p(g_c, dir, 0755), 0);
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < n; i++) {
			snprintf(path, sizeof(path), "%s/f%d", dir, i);
			int64_t t = rt_now_ms();
			if (pass == 0)
				assert_int_equal(put_seeded(g_c, path, size, seed + (uint64_t)i),
						 0);
			else
				assert_int_equal(check_seeded(g_c, path, size, seed + (uint64_t)i),
						 0);
			t = rt_now_ms() - t;
			worst = t > worst ? t : worst;
		}
	*total = rt_now_ms() - t0;
	return worst;
}

/* Host 6 (zone 5, node 5) made slow by how (delay_ms each way, rate), 12 x 1 MiB written and
 * read through it. Every stripe has a chunk there (11 zones, k+m = 11), so each write and
 * read waits for it, but no op takes longer than SLOW_BOUND_MS and every byte is exact. With
 * a delay, the round trip from the client to that host is measured before and after (a TCP
 * connect to a closed port) and must have grown by the delay, both ways: the test fails
 * when the delay is not applied. */
static void slow_run(const char *how, const char *dir, uint64_t seed, double delay_ms,
		     const char *rate)
{
	const int n = 12;
	const size_t size = 1u << 20;
	const int slow_host = 1 + 5;
	int64_t base_all, slow_all;
	double rtt0 = 0, rtt = 0;
	char fast[32];
	snprintf(fast, sizeof(fast), "%s-fast", dir);
	int64_t base = write_read(fast, n, size, seed, &base_all);
	assert_int_equal(kvn_rtt_ms(&g_net, slow_host, &rtt0), 0);
	assert_int_equal(kvn_shape(&g_net, slow_host, delay_ms, rate), 0);
	assert_int_equal(kvn_rtt_ms(&g_net, slow_host, &rtt), 0);
	int64_t slow = write_read(dir, n, size, seed + 100, &slow_all);
	fprintf(stderr,
		"slow host (%s): RTT client -> it %.2f ms (%.3f ms before); %d x 1 MiB written "
		"and read in %lld ms (%lld ms before), slowest op %lld ms (%lld ms before)\n",
		how, rtt, rtt0, n, (long long)slow_all, (long long)base_all, (long long)slow,
		(long long)base);
	assert_int_equal(
	    kvn_shape(&g_net, slow_host, g_net.have_netem ? BASE_DELAY_MS : 0, BASE_RATE), 0);
	/* Each way waits delay_ms at least; the tbf variant adds no delay to a lone SYN. */
	assert_true(rtt >= 2 * delay_ms);
	assert_true(slow < SLOW_BOUND_MS);
}

/* 50 ms each way (netem, else the TAP delayer of tests/link_delay.h), 10 Gbit/s. */
static void test_slow_host(void **state)
{
	(void)state;
	if (!g_net.have_delay)
		skip(); /* no netem and no /dev/net/tun: test_slow_host_rate still runs */
	slow_run(g_net.have_netem ? "netem 50 ms each way" : "TAP delayer 50 ms each way", "/slow",
		 300, 50, BASE_RATE);
}

/* A congested link rather than a far one: 5 Mbit/s (tbf; a 1 MiB file's ~100 KiB chunk
 * then takes ~170 ms to cross it), no delay. */
static void test_slow_host_rate(void **state)
{
	(void)state;
	slow_run("tbf 5 Mbit/s", "/slowrate", 700, 0, "5mbit");
}

struct writer {
	struct kvh_cluster *cl;
	atomic_int stop;
	atomic_int acked; /* files 0..acked-1 were acknowledged */
	int tried;	  /* files 0..tried-1 were attempted (after the thread ends) */
	int failed[4096];
	int nfailed;
};

static size_t kill_size(int i)
{
	return 50000 + (size_t)(i * 104729u) % (2u << 20);
}

static void *writer_main(void *arg)
{
	struct writer *w = arg;
	struct kvc *c = NULL;
	struct kvc_opts o = {.meta_addr = w->cl->meta_addr, .secret = &w->cl->secret};
	if (kvc_open(&o, &c))
		return NULL;
	char path[64];
	int i = 0;
	for (; !atomic_load(&w->stop) && i < 4096; i++) {
		snprintf(path, sizeof(path), "/kill/f%d", i);
		int rc = put_seeded(c, path, kill_size(i), 500 + (uint64_t)i);
		if (rc == 0)
			atomic_store(&w->acked, i + 1);
		else
			w->failed[w->nfailed++] = i;
	}
	w->tried = i;
	kvc_close(c);
	return NULL;
}

/* A node killed (SIGKILL) while a writer loops: every acknowledged file reads back exact,
 * and a file whose write failed is absent or exact, never partial. */
static void test_node_killed_mid_write(void **state)
{
	(void)state;
	assert_int_equal(kvc_mkdir_p(g_c, "/kill", 0755), 0);
	static struct writer w;
	memset(&w, 0, sizeof(w));
	w.cl = &g_cl;
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, writer_main, &w), 0);
	int64_t end = rt_now_ms() + 30000;
	while (atomic_load(&w.acked) < 10 && rt_now_ms() < end)
		usleep(10000);
	int victim = 7;
	assert_int_equal(kvh_node_kill(&g_cl, victim, SIGKILL), 0);
	int at_kill = atomic_load(&w.acked);
	while (atomic_load(&w.acked) < at_kill + 25 && rt_now_ms() < end)
		usleep(10000);
	atomic_store(&w.stop, 1);
	pthread_join(t, NULL);
	fprintf(stderr, "node %d killed after %d files; %d written, %d failed\n", victim, at_kill,
		w.tried, w.nfailed);
	assert_true(atomic_load(&w.acked) >= at_kill + 25); /* writes went on without it */
	char path[64];
	int fi = 0, lost = 0;
	for (int i = 0; i < w.tried; i++) {
		snprintf(path, sizeof(path), "/kill/f%d", i);
		int rc = check_seeded(g_c, path, kill_size(i), 500 + (uint64_t)i);
		if (fi < w.nfailed && w.failed[fi] == i) { /* not acknowledged */
			fi++;
			assert_true(rc == 0 || rc == -ENOENT);
			continue;
		}
		if (rc)
			fprintf(stderr, "%s: %s\n", path, kvp_strerror(rc)), lost++;
	}
	assert_int_equal(lost, 0);
	assert_int_equal(kvh_node_restart(&g_cl, victim), 0);
	assert_int_equal(kvh_wait_nodes_up(&g_cl, NNODES, 20000), 0);
}

static int setup(void **state)
{
	(void)state;
	struct kvh_hosts h = {.meta_ns = g_net.ns[HOST_META], .meta_ip = g_net.ip[HOST_META]};
	static char args[NNODES][32];
	for (int i = 0; i < NNODES; i++) {
		int host = host_of_node(i);
		h.node_ns[i] = g_net.ns[host];
		h.node_ip[i] = g_net.ip[host];
		snprintf(args[i], sizeof(args[i]), "--zone z%d", host - 1);
		h.node_args[i] = args[i];
	}
	int rc = kvh_cluster_start_hosts(&g_cl, NNODES, "--node-timeout 2s", NULL, 0, &h);
	if (rc) {
		fprintf(stderr, "cluster start: %s; meta log:\n", kvp_strerror(rc));
		kvh_sh("tail -n 5 '%s/meta.log' >&2", g_cl.dir);
		kvh_cluster_stop(&g_cl);
		return -1;
	}
	struct kvc_opts o = {.meta_addr = g_cl.meta_addr, .secret = &g_cl.secret};
	return kvc_open(&o, &g_c) ? -1 : 0;
}

static int teardown(void **state)
{
	(void)state;
	kvc_close(g_c);
	kvh_cluster_stop(&g_cl);
	return 0;
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	int rc = kvn_test_start(&g_net, NHOSTS, BASE_DELAY_MS, BASE_RATE, HOST_CLIENT);
	if (rc)
		return rc;
	fprintf(
	    stderr, "%d hosts in namespaces %s-*, links %s%s\n", NHOSTS, g_net.prefix, BASE_RATE,
	    g_net.have_netem ? " + 0.2 ms each way (netem)"
			     : " (tbf; no netem here: no base delay, the slow host's 50 ms by the "
			       "TAP delayer)");
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_status_zones),
	    cmocka_unit_test(test_zone_lost),
	    cmocka_unit_test(test_slow_host),
	    cmocka_unit_test(test_slow_host_rate),
	    cmocka_unit_test(test_node_killed_mid_write),
	};
	const char *flt = getenv("KVFS_TEST_FILTER");
	if (flt)
		cmocka_set_test_filter(flt);
	rc = cmocka_run_group_tests(tests, setup, teardown);
	kvn_net_destroy(&g_net);
	return rc;
}
