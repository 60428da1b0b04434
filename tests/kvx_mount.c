/* test_kvx --mount: a real kvfs cluster (tests/harness.h: kvfs-meta + 11 kvfs-node) and
 * kvfs-mount in the foreground as a child process; the suite runs on the mount. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

int kvx_mount_start(char *root, size_t cap);
void kvx_mount_stop(void);

#define FUSE_MAGIC 0x65735546

static struct {
	struct kvh_cluster cl;
	int cluster_up;
	pid_t mount_pid;
	char mnt[600];
} M;

static int is_fuse(const char *p)
{
	struct statfs s;
	return statfs(p, &s) == 0 && (unsigned)s.f_type == FUSE_MAGIC;
}

int kvx_mount_start(char *root, size_t cap)
{
	char bin[512];
	if (!kvh_have_fuse()) {
		fprintf(stderr, "skipped: no /dev/fuse (or no fusermount3)\n");
		return 77;
	}
	if (kvh_bin("kvfs-mount", bin, sizeof(bin)) != 0 || access(bin, X_OK) != 0) {
		fprintf(stderr, "skipped: kvfs-mount is not built\n");
		return 77;
	}
	int r = kvh_cluster_start(&M.cl, 11, NULL, NULL);
	if (r) {
		fprintf(stderr, "cluster start: %s\n", strerror(-r));
		return -1;
	}
	M.cluster_up = 1;
	snprintf(M.mnt, sizeof(M.mnt), "%s/mnt", M.cl.dir);
	char log[700];
	snprintf(log, sizeof(log), "%s/mount.log", M.cl.dir);
	if (mkdir(M.mnt, 0755) != 0)
		goto fail;
	char *argv[] = {"kvfs-mount", "-f", "--secret-file", M.cl.secret_file, M.cl.meta_addr,
			M.mnt,	      NULL};
	M.mount_pid = kvh_spawn(bin, argv, log);
	if (M.mount_pid <= 0)
		goto fail;
	for (int i = 0; i < 200 && !is_fuse(M.mnt); i++) { /* 10 s */
		struct timespec t = {0, 50 * 1000 * 1000};
		nanosleep(&t, NULL);
	}
	if (!is_fuse(M.mnt)) {
		fprintf(stderr, "kvfs-mount did not mount %s (see %s)\n", M.mnt, log);
		goto fail;
	}
	snprintf(root, cap, "%s", M.mnt);
	fprintf(stderr, "kvfs mounted at %s (meta %s)\n", M.mnt, M.cl.meta_addr);
	return 0;
fail:
	kvx_mount_stop();
	return -1;
}

void kvx_mount_stop(void)
{
	if (M.mount_pid > 0) {
		/* also when the daemon died: a dead mount fails statfs but is still mounted */
		if (kvh_sh("fusermount3 -u '%s' 2>/dev/null", M.mnt) != 0)
			kvh_sh("fusermount3 -uz '%s' 2>/dev/null", M.mnt);
		kvh_stop_pid(M.mount_pid, SIGTERM, 5000);
		M.mount_pid = 0;
	}
	if (M.cluster_up) {
		kvh_cluster_stop(&M.cl);
		M.cluster_up = 0;
	}
}
