/* kvfs-mount with allow-other used by several local users (test_mount binary): the kernel
 * checks owners and modes (default_permissions) and a file or directory belongs to the user
 * who created it, recorded in meta (it survives a remount). The test runs as root and acts as
 * two unprivileged users, 65534 (nobody) and 65533, in forked children that drop every
 * privilege (setgroups, setresgid, setresuid). */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "mount_tutil.h"

enum perm_op { OP_READ, OP_CREATE, OP_MKDIR, OP_UNLINK };

/* Runs op on path as uid:gid (no supplementary groups) in a child: 0 or the errno it got. */
static int as_user(uid_t uid, gid_t gid, enum perm_op op, const char *path)
{
	pid_t p = fork();
	if (p < 0)
		return -1;
	if (p == 0) {
		if (setgroups(0, NULL) || setresgid(gid, gid, gid) || setresuid(uid, uid, uid))
			_exit(200);
		int rc = 0, fd;
		char buf[64];
		switch (op) {
		case OP_READ:
			fd = open(path, O_RDONLY);
			if (fd < 0 || read(fd, buf, sizeof(buf)) < 0)
				rc = errno;
			if (fd >= 0)
				close(fd);
			break;
		case OP_CREATE:
			fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
			if (fd < 0 || write(fd, "mine", 4) != 4)
				rc = errno;
			if (fd >= 0 && close(fd))
				rc = errno;
			break;
		case OP_MKDIR:
			rc = mkdir(path, 0700) ? errno : 0;
			break;
		case OP_UNLINK:
			rc = unlink(path) ? errno : 0;
			break;
		}
		_exit(rc);
	}
	int st = 0;
	waitpid(p, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int start_allow_other(void)
{
	char log[800];
	snprintf(log, sizeof(log), "%s/mount-ao.log", g_cl.dir);
	char *argv[] = {"kvfs-mount",	  "-f",		  "--secret-file", g_cl.secret_file,
			"--allow-other",  "--max-file",	  "16M",	   "-o",
			"attr_timeout=0", g_cl.meta_addr, g_mnt2,	   NULL};
	g_mount2_pid = kvh_spawn(g_bin, argv, log);
	for (int i = 0; i < 200 && g_mount2_pid > 0 && !mtu_is_fuse(g_mnt2); i++)
		usleep(50000);
	return mtu_is_fuse(g_mnt2) ? 0 : -1;
}

static void path_of(char *out, size_t cap, const char *rel)
{
	snprintf(out, cap, "%s/%s", g_mnt2, rel);
}

void test_allow_other_perms(void **state)
{
	(void)state;
	/* a mountpoint every user can reach (the cluster's directory is root's alone) */
	snprintf(g_mnt2, sizeof(g_mnt2), "/tmp/kvfs_ao.XXXXXX");
	assert_non_null(mkdtemp(g_mnt2));
	assert_int_equal(chmod(g_mnt2, 0755), 0);
	assert_int_equal(start_allow_other(), 0);
	char rootdir[800], secret[800], pub[800], shared[800], nb[800], nbdir[800], p[800];
	path_of(rootdir, sizeof(rootdir), "perm-root");
	path_of(secret, sizeof(secret), "perm-root/secret");
	path_of(pub, sizeof(pub), "perm-root/public");
	path_of(shared, sizeof(shared), "perm-shared");
	path_of(nb, sizeof(nb), "perm-shared/nobodys");
	path_of(nbdir, sizeof(nbdir), "perm-shared/nobodys-dir");
	/* the mount root is the mounting user's (root), 0755 */
	assert_int_equal(mkdir(rootdir, 0755), 0);
	int fd = open(secret, O_CREAT | O_EXCL | O_WRONLY, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "root only", 9), 9);
	assert_int_equal(close(fd), 0);
	assert_int_equal(mtu_write_file(pub, "for all", 7), 0);
	assert_int_equal(chmod(pub, 0644), 0);
	assert_int_equal(mkdir(shared, 0777), 0);
	assert_int_equal(chmod(shared, 01777), 0);
	struct stat st;
	assert_int_equal(stat(secret, &st), 0);
	assert_int_equal(st.st_uid, 0);
	assert_int_equal(st.st_mode & 07777, 0600);

	/* nobody: not root's 0600 file, nothing in root's 0755 directory */
	assert_int_equal(as_user(65534, 65534, OP_READ, secret), EACCES);
	path_of(p, sizeof(p), "perm-root/by-nobody");
	assert_int_equal(as_user(65534, 65534, OP_CREATE, p), EACCES);
	assert_int_equal(stat(p, &st), -1);
	assert_int_equal(as_user(65534, 65534, OP_MKDIR, p), EACCES);
	assert_int_equal(as_user(65534, 65534, OP_UNLINK, pub), EACCES);
	/* but a 0644 file, and files of its own in a sticky world-writable directory */
	assert_int_equal(as_user(65534, 65534, OP_READ, pub), 0);
	assert_int_equal(as_user(65534, 65534, OP_CREATE, nb), 0);
	assert_int_equal(as_user(65534, 65534, OP_MKDIR, nbdir), 0);
	assert_int_equal(stat(nb, &st), 0);
	assert_int_equal(st.st_uid, 65534);
	assert_int_equal(st.st_gid, 65534);
	assert_int_equal(st.st_mode & 07777, 0600);
	assert_int_equal(stat(nbdir, &st), 0);
	assert_int_equal(st.st_uid, 65534);
	assert_true(S_ISDIR(st.st_mode));
	assert_int_equal(as_user(65534, 65534, OP_READ, nb), 0);
	/* a second user: not nobody's 0600 file, nor (sticky directory) its removal */
	assert_int_equal(as_user(65533, 65533, OP_READ, nb), EACCES);
	assert_int_equal(as_user(65533, 65533, OP_UNLINK, nb), EPERM);
	path_of(p, sizeof(p), "perm-shared/nobodys-dir/x");
	assert_int_equal(as_user(65533, 65533, OP_CREATE, p), EACCES);
	/* a chown is refused (owners are set at creation), a no-op chown is not */
	assert_int_equal(chown(nb, 0, 0), -1);
	assert_int_equal(errno, EPERM);
	assert_int_equal(chown(nb, 65534, 65534), 0);

	/* owners live in meta: a fresh mount shows them */
	mtu_stop_mount2();
	assert_int_equal(start_allow_other(), 0);
	assert_int_equal(stat(nb, &st), 0);
	assert_int_equal(st.st_uid, 65534);
	assert_int_equal(stat(secret, &st), 0);
	assert_int_equal(st.st_uid, 0);
	assert_int_equal(as_user(65534, 65534, OP_READ, secret), EACCES);
	assert_int_equal(as_user(65534, 65534, OP_UNLINK, nb), 0);

	/* the cluster is shared with the later tests (test_tree wants an empty root) */
	assert_int_equal(kvh_sh("rm -r '%s/perm-root' '%s/perm-shared'", g_mnt2, g_mnt2), 0);
	mtu_stop_mount2();
	assert_int_equal(rmdir(g_mnt2), 0);
	g_mnt2[0] = 0;
}
