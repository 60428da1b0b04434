#include "mount_tutil.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

struct kvh_cluster g_cl;
char g_mnt[600], g_bin[600], g_log[700];
pid_t g_mount_pid;
char g_mnt2[700]; /* a second mount of the cluster (test_replace_other_mount) */
pid_t g_mount2_pid;

int64_t mtu_now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

void mtu_fill(uint8_t *p, size_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x1234567;
	for (size_t i = 0; i < n; i++) {
		if ((i & 7) == 0) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
		}
		p[i] = (uint8_t)(x >> (8 * (i & 7)));
	}
}

int mtu_is_fuse(const char *path)
{
	struct statfs s;
	return statfs(path, &s) == 0 && (unsigned)s.f_type == FUSE_MAGIC;
}

int mtu_write_file(const char *path, const void *buf, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		return -errno;
	size_t off = 0;
	while (off < len) {
		ssize_t n = write(fd, (const char *)buf + off, len - off);
		if (n < 0) {
			int e = -errno;
			close(fd);
			return e;
		}
		off += (size_t)n;
	}
	return close(fd) == 0 ? 0 : -errno;
}

/* Reads the whole file; returns its length or -errno. */
ssize_t mtu_read_file(const char *path, void *buf, size_t cap)
{
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return -errno;
	size_t off = 0;
	for (;;) {
		ssize_t n = read(fd, (char *)buf + off, cap - off);
		if (n < 0) {
			int e = -errno;
			close(fd);
			return e;
		}
		if (n == 0 || off + (size_t)n == cap) {
			off += (size_t)n;
			break;
		}
		off += (size_t)n;
	}
	close(fd);
	return (ssize_t)off;
}

int mtu_start_mount(void)
{
	char *argv[] = {"kvfs-mount", "-f", "--secret-file", g_cl.secret_file, "-o",
			/* lease_after=2: directory leases taken at the second lookup in a
			 * directory, so every test runs with lookups answered from them */
			"max_file=16M,entry_timeout=0.5,attr_timeout=1,lease_after=2",
			"--meta-retry", "30s", g_cl.meta_addr, g_mnt, NULL};
	g_mount_pid = kvh_spawn(g_bin, argv, g_log);
	if (g_mount_pid <= 0)
		return -1;
	for (int i = 0; i < 200 && !mtu_is_fuse(g_mnt); i++)
		usleep(50000);
	return mtu_is_fuse(g_mnt) ? 0 : -1;
}

int mtu_start_mount2(const char *tag, const char *opts, char *log2, size_t cap)
{
	snprintf(g_mnt2, sizeof(g_mnt2), "%s/mnt-%s", g_cl.dir, tag);
	snprintf(log2, cap, "%s/mount-%s.log", g_cl.dir, tag);
	if (mkdir(g_mnt2, 0755) != 0)
		return -1;
	char o[512];
	snprintf(o, sizeof(o), "%s,lease_after=2", opts ? opts : "rw");
	char *argv[] = {"kvfs-mount",	  "-f",	  "--secret-file",
			g_cl.secret_file, "-o",	  o,
			g_cl.meta_addr,	  g_mnt2, NULL};
	g_mount2_pid = kvh_spawn(g_bin, argv, log2);
	if (g_mount2_pid <= 0)
		return -1;
	for (int i = 0; i < 200 && !mtu_is_fuse(g_mnt2); i++)
		usleep(50000);
	return mtu_is_fuse(g_mnt2) ? 0 : -1;
}

long long mtu_stat_counter(const char *mnt, const char *name)
{
	char p[800], line[256];
	snprintf(p, sizeof(p), "%s/.kvfs/stats", mnt);
	FILE *f = fopen(p, "r");
	if (!f)
		return -1;
	long long v = -1;
	size_t nl = strlen(name);
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, name, nl) && !strncmp(line + nl, " = ", 3))
			v = atoll(line + nl + 3);
	fclose(f);
	return v;
}

/* Also from teardown, so a failed test does not leave it mounted. */
void mtu_stop_mount2(void)
{
	if (g_mount2_pid > 0) {
		if (mtu_is_fuse(g_mnt2) && kvh_sh("fusermount3 -u '%s'", g_mnt2) != 0)
			kvh_sh("fusermount3 -uz '%s'", g_mnt2);
		kvh_stop_pid(g_mount2_pid, SIGTERM, 5000);
		g_mount2_pid = 0;
	}
}

void mtu_stop_mount(void)
{
	if (g_mount_pid > 0) {
		if (mtu_is_fuse(g_mnt) && kvh_sh("fusermount3 -u '%s'", g_mnt) != 0)
			kvh_sh("fusermount3 -uz '%s'", g_mnt);
		kvh_stop_pid(g_mount_pid, SIGTERM, 5000);
		g_mount_pid = 0;
	}
}

int mtu_skip(void)
{
	char bin[600];
	if (!kvh_have_fuse()) {
		printf("skipped: no /dev/fuse\n");
		return 1;
	}
	if (kvh_bin("kvfs-mount", bin, sizeof(bin)) != 0) {
		printf("skipped: kvfs-mount not built\n");
		return 1;
	}
	return 0;
}

int mtu_setup(void **state)
{
	(void)state;
	if (kvh_bin("kvfs-mount", g_bin, sizeof(g_bin)) != 0)
		return -1;
	int rc = kvh_cluster_start(&g_cl, NNODES, NULL, NULL);
	if (rc) {
		fprintf(stderr, "cluster start: %s\n", strerror(-rc));
		kvh_cluster_stop(&g_cl); /* teardown does not run after a failed setup */
		return -1;
	}
	snprintf(g_mnt, sizeof(g_mnt), "%s/mnt", g_cl.dir);
	snprintf(g_log, sizeof(g_log), "%s/mount.log", g_cl.dir);
	if (mkdir(g_mnt, 0755) != 0 || mtu_start_mount() != 0) {
		fprintf(stderr, "kvfs-mount did not mount %s (see %s)\n", g_mnt, g_log);
		kvh_sh("cat '%s' >&2", g_log);
		mtu_stop_mount();
		kvh_cluster_stop(&g_cl);
		return -1;
	}
	return 0;
}

int mtu_teardown(void **state)
{
	(void)state;
	mtu_stop_mount2();
	/* The tests ran with lookups answered from directory leases (lease_after=2): how many */
	if (g_mount_pid > 0 && mtu_is_fuse(g_mnt))
		fprintf(stderr, "mount: %lld directory leases, %lld lookups answered from them\n",
			mtu_stat_counter(g_mnt, "lease_granted"),
			mtu_stat_counter(g_mnt, "lease_hits") +
			    mtu_stat_counter(g_mnt, "lease_negatives"));
	mtu_stop_mount();
	if (getenv("KVFS_TEST_VERBOSE")) /* also the second mounts' logs */
		kvh_sh("cat '%s' '%s'/mount-*.log >&2 2>/dev/null", g_log, g_cl.dir);
	kvh_cluster_stop(&g_cl);
	return 0;
}
