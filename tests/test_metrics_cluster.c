/* test_metrics_cluster: /metrics of real daemons. A cluster of kvfs-meta + 4 kvfs-node (k=3,
 * m=1, tests/harness.h with KVH_METRICS) and, in "mount" mode, a real kvfs-mount on /dev/fuse.
 * Every scrape is parsed strictly (tests/prom_parse.h); the test writes and reads files and checks
 * that the counters moved by what it did, then kills a node and checks that meta shows it down
 * and that a read of a file with a chunk on it is counted as degraded.
 *
 *   test_metrics_cluster          daemons + libkvfs
 *   test_metrics_cluster mount    the same through kvfs-mount (exit 77, skipped, without FUSE)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "harness.h"
#include "kvc.h"
#include "prom_parse.h"

#define NNODES 4
#define NFILES 6
#define FSIZE  (200 * 1024 + 17)

static struct kvh_cluster g_cl;
static struct kvc *g_kvc;
static char g_mnt[600], g_mlog[600], g_maddr[64];
static pid_t g_mount_pid;

static void scrape(const char *addr, struct prom_doc *d)
{
	char *body = NULL;
	int st = prom_http_get(addr, "/metrics", &body);
	if (st != 200)
		fail_msg("GET http://%s/metrics: %d", addr, st);
	int rc = prom_parse(body, d);
	if (rc)
		fail_msg("http://%s/metrics does not parse: %s", addr, d->err);
	/* Prometheus's own linter agrees, when installed (it named kvfs_meta_ec_m an abbreviated
	 * unit); its absence is said once. */
	static int said;
	char why[2048];
	rc = prom_promtool(body, why, sizeof(why));
	if (rc < 0)
		fail_msg("promtool check metrics on http://%s/metrics:\n%s", addr, why);
	if (rc == 1 && !said++)
		print_message("promtool not installed: skipping `promtool check metrics`\n");
	free(body);
}

static double get(const struct prom_doc *d, const char *name, const char *labels)
{
	double v = 0;
	if (prom_get(d, name, labels, &v))
		fail_msg("no series %s{%s}", name, labels ? labels : "");
	return v;
}

/* Sum of one series over every node's scrape. */
static double nodes_sum(const char *name, const char *labels)
{
	double s = 0;
	for (int i = 0; i < g_cl.nnodes; i++) {
		if (!g_cl.nodes[i].pid)
			continue;
		struct prom_doc d;
		scrape(g_cl.nodes[i].metrics, &d);
		s += get(&d, name, labels);
		prom_free(&d);
	}
	return s;
}

/* A daemon counts a request after sending its reply, so the last one's count can trail the
 * caller that got the reply: wait for it, bounded, and give back what was seen (a caller that
 * asserts an exact figure still sees any excess). */
static double wait_nodes_at_least(const char *name, const char *labels, double want)
{
	double v = 0;
	for (int i = 0; i < 500; i++) {
		v = nodes_sum(name, labels);
		if (v >= want)
			return v;
		usleep(20000);
	}
	return v;
}

static double meta_value(const char *name, const char *labels)
{
	struct prom_doc d;
	scrape(g_cl.meta_metrics, &d);
	double v = get(&d, name, labels);
	prom_free(&d);
	return v;
}

static void fill(uint8_t *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (uint8_t)((i * 31 + seed * 7) ^ (i >> 8));
}

static int cluster_up(void)
{
	int rc = kvh_cluster_start_flags(&g_cl, NNODES, "--k 3 --m 1 --node-timeout 1s", NULL,
					 KVH_METRICS);
	if (rc) {
		fprintf(stderr, "cluster start: %s (logs in %s)\n", strerror(-rc), g_cl.dir);
		kvh_cluster_stop(&g_cl);
		return -1;
	}
	struct kvc_opts o = {.meta_addr = g_cl.meta_addr, .secret = &g_cl.secret};
	if (kvc_open(&o, &g_kvc)) {
		kvh_cluster_stop(&g_cl);
		return -1;
	}
	kvc_set_read_timeout(g_kvc, 500);
	return 0;
}

static void cluster_down(void)
{
	kvc_close(g_kvc);
	g_kvc = NULL;
	kvh_cluster_stop(&g_cl);
}

/* Kills node 0 and waits until meta's metrics show it down. */
static void kill_node0_and_wait(void)
{
	assert_int_equal(kvh_node_kill(&g_cl, 0, SIGKILL), 0);
	int down = 0;
	for (int i = 0; i < 100 && !down; i++) {
		struct prom_doc d;
		scrape(g_cl.meta_metrics, &d);
		down = get(&d, "kvfs_meta_nodes", "state=\"up\"") == NNODES - 1 &&
		       get(&d, "kvfs_meta_nodes_down", "") == 1;
		prom_free(&d);
		if (!down)
			usleep(100000);
	}
	assert_true(down);
	struct prom_doc d;
	scrape(g_cl.meta_metrics, &d);
	int n = 0;
	assert_true(prom_sum(&d, "kvfs_meta_node_state", NULL, &n) == 1 * (NNODES - 1) + 2);
	assert_int_equal(n, NNODES);
	char lab[128];
	snprintf(lab, sizeof(lab), "addr=\"%s\"", g_cl.nodes[0].addr);
	assert_true(prom_sum(&d, "kvfs_meta_node_state", lab, &n) == 2); /* down */
	assert_int_equal(n, 1);
	prom_free(&d);
}

/* Flips the last byte (chunk data, past the header) of every chunk file of node i; a second
 * call restores them. Returns the number of files. */
static int flip_node_chunks(int i)
{
	char pat[700];
	snprintf(pat, sizeof(pat), "%s/chunks/*/*", g_cl.nodes[i].dir);
	glob_t g;
	if (glob(pat, 0, NULL, &g))
		return 0;
	int n = 0;
	for (size_t j = 0; j < g.gl_pathc; j++) {
		int fd = open(g.gl_pathv[j], O_RDWR);
		struct stat st;
		uint8_t b;
		if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size > 0 &&
		    pread(fd, &b, 1, st.st_size - 1) == 1) {
			b ^= 0xA5;
			n += pwrite(fd, &b, 1, st.st_size - 1) == 1;
		}
		if (fd >= 0)
			close(fd);
	}
	globfree(&g);
	return n;
}

static void read_all_files(uint8_t *buf)
{
	for (int i = 0; i < NFILES; i++) {
		char path[64];
		snprintf(path, sizeof(path), "/f%d", i);
		void *got = NULL;
		size_t len = 0;
		assert_int_equal(kvc_get(g_kvc, path, &got, &len), 0);
		fill(buf, FSIZE, (unsigned)i);
		assert_int_equal(len, FSIZE);
		assert_memory_equal(got, buf, FSIZE);
		free(got);
	}
}

/* ---- daemons + libkvfs ---- */

static void test_daemons(void **st)
{
	(void)st;
	/* every daemon's page parses before any traffic */
	struct prom_doc d0;
	scrape(g_cl.meta_metrics, &d0);
	double commits0 = get(&d0, "kvfs_meta_requests_total", "op=\"commit\"");
	double hb0 = get(&d0, "kvfs_meta_requests_total", "op=\"heartbeat\"");
	assert_true(get(&d0, "kvfs_meta_files", "") == 0);
	assert_true(get(&d0, "kvfs_meta_nodes", "state=\"up\"") == NNODES);
	assert_true(get(&d0, "kvfs_meta_ec_data_chunks", "") == 3);
	assert_true(get(&d0, "kvfs_meta_raw_capacity_bytes", "") > 0);
	assert_true(get(&d0, "kvfs_meta_usable_capacity_bytes", "") ==
		    get(&d0, "kvfs_meta_raw_capacity_bytes", "") * 3 / 4);
	prom_free(&d0);
	double puts0 = nodes_sum("kvfs_node_requests_total", "op=\"put\"");
	double gets0 = nodes_sum("kvfs_node_requests_total", "op=\"get\"");
	double pbytes0 = nodes_sum("kvfs_node_put_bytes_total", "");
	double chunks0 = nodes_sum("kvfs_node_chunks", "");
	assert_true(puts0 == 0 && chunks0 == 0);

	uint8_t *buf = malloc(FSIZE);
	assert_non_null(buf);
	for (int i = 0; i < NFILES; i++) {
		char path[64];
		snprintf(path, sizeof(path), "/f%d", i);
		fill(buf, FSIZE, (unsigned)i);
		assert_int_equal(kvc_put(g_kvc, path, buf, FSIZE, 0), 0);
	}
	for (int i = 0; i < NFILES; i++) {
		char path[64];
		snprintf(path, sizeof(path), "/f%d", i);
		void *got = NULL;
		size_t len = 0;
		assert_int_equal(kvc_get(g_kvc, path, &got, &len), 0);
		assert_int_equal(len, FSIZE);
		free(got);
	}
	/* each file: k+m = 4 chunks on 4 distinct nodes; reads fetch its 3 data chunks, once
	 * (a file ends inside its stripe: the read to its end prefetches nothing more) */
	double puts1 =
	    wait_nodes_at_least("kvfs_node_requests_total", "op=\"put\"", puts0 + NFILES * 4);
	double gets1 =
	    wait_nodes_at_least("kvfs_node_requests_total", "op=\"get\"", gets0 + NFILES * 3);
	assert_true(puts1 - puts0 == NFILES * 4);
	assert_true(gets1 - gets0 == NFILES * 3);
	assert_true(nodes_sum("kvfs_node_put_bytes_total", "") - pbytes0 >= (double)NFILES * FSIZE);
	assert_true(nodes_sum("kvfs_node_get_bytes_total", "") >= (double)NFILES * FSIZE);
	assert_true(nodes_sum("kvfs_node_chunks", "") == NFILES * 4);
	assert_true(nodes_sum("kvfs_node_request_duration_seconds_count", "op=\"put\"") == puts1);
	assert_true(nodes_sum("kvfs_node_request_errors_total", "op=\"put\"") == 0);
	/* every PUT and GET had its disk time measured, apart from the request's own */
	assert_true(nodes_sum("kvfs_node_disk_duration_seconds_count", "op=\"put\"") == puts1);
	assert_true(nodes_sum("kvfs_node_disk_duration_seconds_count", "op=\"get\"") == gets1);
	assert_true(nodes_sum("kvfs_node_disk_duration_seconds_sum", "op=\"put\"") > 0);

	struct prom_doc d1;
	scrape(g_cl.meta_metrics, &d1);
	assert_true(get(&d1, "kvfs_meta_requests_total", "op=\"commit\"") - commits0 == NFILES);
	assert_true(get(&d1, "kvfs_meta_requests_total", "op=\"alloc\"") >= NFILES);
	assert_true(get(&d1, "kvfs_meta_requests_total", "op=\"layout\"") >= NFILES);
	assert_true(get(&d1, "kvfs_meta_request_duration_seconds_count", "op=\"commit\"") ==
		    get(&d1, "kvfs_meta_requests_total", "op=\"commit\""));
	assert_true(get(&d1, "kvfs_meta_files", "") == NFILES);
	prom_free(&d1);
	/* raw used follows the nodes' heartbeats */
	double used = 0;
	for (int i = 0; i < 50 && used < (double)NFILES * FSIZE; i++) {
		used = meta_value("kvfs_meta_raw_used_bytes", "");
		if (used < (double)NFILES * FSIZE)
			usleep(100000);
	}
	assert_true(used >= (double)NFILES * FSIZE);
	/* the used figure came with heartbeats after the writes */
	assert_true(meta_value("kvfs_meta_requests_total", "op=\"heartbeat\"") > hb0);

	struct kvc_stats cs0;
	kvc_get_stats(g_kvc, &cs0);
	assert_int_equal(cs0.files_committed, NFILES);
	assert_int_equal(cs0.degraded_reads, 0);
	assert_int_equal(cs0.crc_errors, 0);
	assert_true(nodes_sum("kvfs_node_crc_errors_total", "") == 0);

	/* corrupt chunks, one node at a time: reads still return the right bytes (decoded), and
	 * the nodes and the client count CRC errors */
	for (int i = 0; i < NNODES; i++) {
		assert_int_equal(flip_node_chunks(i), NFILES);
		read_all_files(buf);
		assert_int_equal(flip_node_chunks(i), NFILES);
	}
	kvc_get_stats(g_kvc, &cs0);
	assert_true(cs0.crc_errors >= NFILES);
	assert_true(cs0.degraded_reads >= NFILES);
	assert_true(nodes_sum("kvfs_node_crc_errors_total", "") >= NFILES);
	assert_true(nodes_sum("kvfs_node_request_errors_total", "op=\"get\"") >= NFILES);
	read_all_files(buf); /* restored: no new errors */
	struct kvc_stats cs_ok;
	kvc_get_stats(g_kvc, &cs_ok);
	assert_int_equal(cs_ok.crc_errors, cs0.crc_errors);
	assert_int_equal(cs_ok.degraded_reads, cs0.degraded_reads);

	/* issue-5 counters come from MSTATUS: an orphan-GC pass lists every chunk */
	double scanned0 = meta_value("kvfs_meta_gc_scanned_chunks_total", "");
	uint8_t gc[5] = {KVP_MAINT_GC, 0, 0, 0, 0};
	assert_int_equal(kvc_admin(g_kvc, KVP_OP_MAINT, gc, sizeof(gc), NULL, NULL), 0);
	assert_true(meta_value("kvfs_meta_gc_scanned_chunks_total", "") - scanned0 >= NFILES * 4);
	assert_true(meta_value("kvfs_meta_requests_total", "op=\"maint\"") == 1);
	/* one more file, then its removal: files gauge and unlink count follow */
	fill(buf, FSIZE, 99);
	assert_int_equal(kvc_put(g_kvc, "/gone", buf, FSIZE, 0), 0);
	assert_true(meta_value("kvfs_meta_files", "") == NFILES + 1);
	assert_int_equal(kvc_unlink(g_kvc, KVP_ROOT_INO, "gone"), 0);
	assert_true(meta_value("kvfs_meta_files", "") == NFILES);
	assert_true(meta_value("kvfs_meta_requests_total", "op=\"unlink\"") == 1);

	/* kvfs status shows the same at a glance */
	char cli[600];
	if (kvh_bin("kvfs", cli, sizeof(cli)) == 0) {
		assert_int_equal(
		    kvh_sh("'%s' --meta %s --secret-file '%s' status > '%s/status.out'", cli,
			   g_cl.meta_addr, g_cl.secret_file, g_cl.dir),
		    0);
		assert_int_equal(kvh_sh("grep -q '^nodes: %d up of %d' '%s/status.out'", NNODES,
					NNODES, g_cl.dir),
				 0);
		assert_int_equal(kvh_sh("grep -q '^files: %d ' '%s/status.out'", NFILES, g_cl.dir),
				 0);
		assert_int_equal(
		    kvh_sh("grep -q '^counters: expired 0, ' '%s/status.out'", g_cl.dir), 0);
		assert_int_equal(kvh_sh("grep -q 'use%%' '%s/status.out'", g_cl.dir), 0);
	}

	/* a node down: meta says so, and reading every file needs parity for some stripes */
	kill_node0_and_wait();
	read_all_files(buf);
	struct kvc_stats cs1;
	kvc_get_stats(g_kvc, &cs1);
	assert_true(cs1.degraded_reads > cs0.degraded_reads);
	free(buf);
}

/* ---- through kvfs-mount ---- */

static int is_fuse(const char *path)
{
	struct statfs s;
	return statfs(path, &s) == 0 && s.f_type == 0x65735546;
}

static int start_mount(void)
{
	char bin[600], mfile[700];
	if (kvh_bin("kvfs-mount", bin, sizeof(bin)))
		return -1;
	snprintf(g_mnt, sizeof(g_mnt), "%s/mnt", g_cl.dir);
	snprintf(g_mlog, sizeof(g_mlog), "%s/mount.log", g_cl.dir);
	snprintf(mfile, sizeof(mfile), "%s/mount.metrics", g_cl.dir);
	if (mkdir(g_mnt, 0755))
		return -1;
	char *argv[] = {"kvfs-mount",
			"-f",
			"--secret-file",
			g_cl.secret_file,
			"--timeout",
			"2s",
			"--metrics-listen",
			"127.0.0.1:0",
			"--metrics-addr-file",
			mfile,
			g_cl.meta_addr,
			g_mnt,
			NULL};
	g_mount_pid = kvh_spawn(bin, argv, g_mlog);
	if (g_mount_pid <= 0)
		return -1;
	for (int i = 0; i < 200 && !is_fuse(g_mnt); i++)
		usleep(50000);
	if (!is_fuse(g_mnt))
		return -1;
	return kvh_wait_file(mfile, 5000, g_maddr, sizeof(g_maddr));
}

static void stop_mount(void)
{
	if (g_mount_pid > 0) {
		if (is_fuse(g_mnt) && kvh_sh("fusermount3 -u '%s'", g_mnt) != 0)
			kvh_sh("fusermount3 -uz '%s'", g_mnt);
		kvh_stop_pid(g_mount_pid, SIGTERM, 5000);
		g_mount_pid = 0;
	}
}

static double mount_value(const char *name, const char *labels)
{
	struct prom_doc d;
	scrape(g_maddr, &d);
	double v = get(&d, name, labels);
	prom_free(&d);
	return v;
}

/* The mount counts a request after its handler has replied, so the last request's count can
 * trail the syscall that returned by as long as the mount's thread is off a core (ASan, a
 * loaded machine): wait for it, bounded — a request that never reached the mount still fails. */
static void wait_mount_at_least(const char *name, const char *labels, double want)
{
	double v = 0;
	for (int i = 0; i < 500; i++) {
		v = mount_value(name, labels);
		if (v >= want)
			return;
		usleep(20000);
	}
	fail_msg("%s{%s} = %.0f after 10 s, want >= %.0f", name, labels, v, want);
}

static void write_file(const char *path, const uint8_t *b, size_t n)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, b, n), (ssize_t)n);
	assert_int_equal(close(fd), 0);
}

static void read_file(const char *path, const uint8_t *want, size_t n)
{
	uint8_t *got = malloc(n + 1);
	assert_non_null(got);
	int fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	size_t off = 0;
	ssize_t r;
	while ((r = read(fd, got + off, n + 1 - off)) > 0)
		off += (size_t)r;
	close(fd);
	assert_int_equal(off, n);
	assert_memory_equal(got, want, n);
	free(got);
}

static void test_mount(void **st)
{
	(void)st;
	struct prom_doc d0;
	scrape(g_maddr, &d0);
	double creates0 = get(&d0, "kvfs_mount_requests_total", "op=\"create\"");
	double writes0 = get(&d0, "kvfs_mount_requests_total", "op=\"write\"");
	double reads0 = get(&d0, "kvfs_mount_requests_total", "op=\"read\"");
	double committed0 = get(&d0, "kvfs_mount_files_committed_total", "");
	assert_true(get(&d0, "kvfs_mount_degraded_reads_total", "") == 0);
	prom_free(&d0);
	double commits0 = meta_value("kvfs_meta_requests_total", "op=\"commit\"");
	double c_commit0 = mount_value("kvfs_client_meta_requests_total", "op=\"commit\"");
	double st_commit0 =
	    mount_value("kvfs_client_stage_duration_seconds_count", "stage=\"commit\"");
	double st_enc0 =
	    mount_value("kvfs_client_stage_duration_seconds_count", "stage=\"encode\"");
	double st_open0 = mount_value("kvfs_client_stage_duration_seconds_count", "stage=\"open\"");
	double st_get0 =
	    mount_value("kvfs_client_stage_duration_seconds_count", "stage=\"stripe_get\"");

	uint8_t *buf = malloc(FSIZE);
	assert_non_null(buf);
	char path[700];
	for (int i = 0; i < NFILES; i++) {
		snprintf(path, sizeof(path), "%s/m%d.kvb", g_mnt, i);
		fill(buf, FSIZE, 100u + (unsigned)i);
		write_file(path, buf, FSIZE);
	}
	for (int i = 0; i < NFILES; i++) {
		snprintf(path, sizeof(path), "%s/m%d.kvb", g_mnt, i);
		fill(buf, FSIZE, 100u + (unsigned)i);
		read_file(path, buf, FSIZE);
	}
	wait_mount_at_least("kvfs_mount_requests_total", "op=\"read\"", reads0 + NFILES);
	struct prom_doc d1;
	scrape(g_maddr, &d1);
	assert_true(get(&d1, "kvfs_mount_requests_total", "op=\"create\"") - creates0 == NFILES);
	assert_true(get(&d1, "kvfs_mount_requests_total", "op=\"write\"") - writes0 >= NFILES);
	assert_true(get(&d1, "kvfs_mount_requests_total", "op=\"read\"") - reads0 >= NFILES);
	assert_true(get(&d1, "kvfs_mount_request_duration_seconds_count", "op=\"create\"") ==
		    get(&d1, "kvfs_mount_requests_total", "op=\"create\""));
	assert_true(get(&d1, "kvfs_mount_files_committed_total", "") - committed0 == NFILES);
	assert_true(get(&d1, "kvfs_mount_bytes_written_total", "") >= (double)NFILES * FSIZE);
	assert_true(get(&d1, "kvfs_mount_bytes_read_total", "") >= (double)NFILES * FSIZE);
	/* the client library's stages, timed inside the mount: one commit, one COMMIT and one
	 * stripe to encode per file (FSIZE fits one stripe), a LAYOUT and a stripe read per open */
	assert_true(get(&d1, "kvfs_client_meta_requests_total", "op=\"commit\"") - c_commit0 ==
		    NFILES);
	assert_true(get(&d1, "kvfs_client_meta_request_duration_seconds_count", "op=\"commit\"") ==
		    get(&d1, "kvfs_client_meta_requests_total", "op=\"commit\""));
	assert_true(get(&d1, "kvfs_client_stage_duration_seconds_count", "stage=\"commit\"") -
			st_commit0 ==
		    NFILES);
	assert_true(get(&d1, "kvfs_client_stage_duration_seconds_count", "stage=\"encode\"") -
			st_enc0 ==
		    NFILES);
	assert_true(get(&d1, "kvfs_client_stage_duration_seconds_count", "stage=\"open\"") -
			st_open0 >=
		    NFILES);
	assert_true(get(&d1, "kvfs_client_stage_duration_seconds_count", "stage=\"stripe_get\"") -
			st_get0 >=
		    NFILES);
	assert_true(get(&d1, "kvfs_client_stage_duration_seconds_sum", "stage=\"commit\"") > 0);
	prom_free(&d1);
	assert_true(meta_value("kvfs_meta_requests_total", "op=\"commit\"") - commits0 == NFILES);
	assert_true(meta_value("kvfs_meta_files", "") == NFILES);
	assert_true(nodes_sum("kvfs_node_chunks", "") == NFILES * 4);

	/* a LOOKUP brings the layout: the open right after it makes no LAYOUT round trip */
	for (int i = 0; i < NFILES; i++) {
		snprintf(path, sizeof(path), "/p%d.kvb", i);
		fill(buf, FSIZE, 300u + (unsigned)i);
		assert_int_equal(kvc_put(g_kvc, path, buf, FSIZE, 0), 0);
	}
	double lookups0 = mount_value("kvfs_client_meta_requests_total", "op=\"lookup\"");
	double layouts0 = mount_value("kvfs_client_meta_requests_total", "op=\"layout\"");
	double opens0 = mount_value("kvfs_client_stage_duration_seconds_count", "stage=\"open\"");
	for (int i = 0; i < NFILES; i++) {
		snprintf(path, sizeof(path), "%s/p%d.kvb", g_mnt, i);
		fill(buf, FSIZE, 300u + (unsigned)i);
		read_file(path, buf, FSIZE);
	}
	assert_true(mount_value("kvfs_client_stage_duration_seconds_count", "stage=\"open\"") -
			opens0 ==
		    NFILES);
	assert_true(mount_value("kvfs_client_meta_requests_total", "op=\"lookup\"") - lookups0 >=
		    NFILES);
	assert_true(mount_value("kvfs_client_meta_requests_total", "op=\"layout\"") == layouts0);
	assert_true(meta_value("kvfs_meta_files", "") == 2 * NFILES);

	/* A stat storm in one directory takes a lease (the mount's default: 32 found lookups in a
	 * second), and another client's unlink there revokes it, the holder acknowledging: both
	 * sides count it. A lease lasts 1 s: a round whose unlink came after it ran out (a loaded
	 * machine) is tried again in a fresh directory. */
	int revoked = 0;
	for (int round = 0; round < 5 && !revoked; round++) {
		struct kvp_attr da;
		char dn[16];
		snprintf(dn, sizeof(dn), "lz%d", round);
		assert_int_equal(kvc_mkdir(g_kvc, KVP_ROOT_INO, dn, 0755, &da), 0);
		for (int i = 0; i < 48; i++) {
			snprintf(path, sizeof(path), "/%s/f%02d", dn, i);
			assert_int_equal(kvc_put(g_kvc, path, "x", 1, 0), 0);
		}
		double mg0 = mount_value("kvfs_mount_lease_granted_total", "");
		double lg0 = meta_value("kvfs_meta_lease_granted_total", "");
		double lr0 = meta_value("kvfs_meta_lease_revoked_total", "");
		double la0 = meta_value("kvfs_meta_lease_acked_total", "");
		for (int i = 0; i < 48; i++) {
			struct stat sb;
			snprintf(path, sizeof(path), "%s/%s/f%02d", g_mnt, dn, i);
			assert_int_equal(stat(path, &sb), 0);
		}
		/* the mount takes the lease after answering the lookup that ended the burst */
		for (int w = 0; w < 100 && mount_value("kvfs_mount_lease_granted_total", "") == mg0;
		     w++)
			usleep(20000);
		assert_true(mount_value("kvfs_mount_lease_granted_total", "") > mg0);
		assert_int_equal(kvc_unlink(g_kvc, da.ino, "f00"), 0);
		assert_true(meta_value("kvfs_meta_lease_granted_total", "") - lg0 >= 1);
		revoked = meta_value("kvfs_meta_lease_revoked_total", "") > lr0;
		if (revoked)
			assert_true(meta_value("kvfs_meta_lease_acked_total", "") > la0);
	}
	assert_true(revoked);
	assert_true(mount_value("kvfs_mount_lease_revoked_total", "") >= 1);

	/* files the mount has never read (so nothing is in its page cache), then a node down */
	for (int i = 0; i < NFILES; i++) {
		snprintf(path, sizeof(path), "/d%d.kvb", i);
		fill(buf, FSIZE, 200u + (unsigned)i);
		assert_int_equal(kvc_put(g_kvc, path, buf, FSIZE, 0), 0);
	}
	kill_node0_and_wait();
	for (int i = 0; i < NFILES; i++) {
		snprintf(path, sizeof(path), "%s/d%d.kvb", g_mnt, i);
		fill(buf, FSIZE, 200u + (unsigned)i);
		read_file(path, buf, FSIZE);
	}
	assert_true(mount_value("kvfs_mount_degraded_reads_total", "") > 0);
	assert_true(mount_value("kvfs_mount_crc_errors_total", "") == 0);
	free(buf);
}

static int setup(void **st)
{
	(void)st;
	return cluster_up();
}

static int teardown(void **st)
{
	(void)st;
	cluster_down();
	return 0;
}

static int setup_mount(void **st)
{
	(void)st;
	if (cluster_up())
		return -1;
	if (start_mount()) {
		fprintf(stderr, "kvfs-mount did not start (see %s)\n", g_mlog);
		kvh_sh("cat '%s' >&2", g_mlog);
		stop_mount();
		cluster_down();
		return -1;
	}
	return 0;
}

static int teardown_mount(void **st)
{
	(void)st;
	stop_mount();
	cluster_down();
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "mount") == 0) {
		char bin[600];
		if (!kvh_have_fuse()) {
			printf("skipped: no /dev/fuse\n");
			return 77;
		}
		if (kvh_bin("kvfs-mount", bin, sizeof(bin))) {
			printf("skipped: kvfs-mount not built\n");
			return 77;
		}
		const struct CMUnitTest t[] = {cmocka_unit_test(test_mount)};
		return cmocka_run_group_tests(t, setup_mount, teardown_mount);
	}
	const struct CMUnitTest t[] = {cmocka_unit_test(test_daemons)};
	return cmocka_run_group_tests(t, setup, teardown);
}
