/* test_usertools — kvfs-mount as users' own tools use it (issue 20): a real cluster of 11
 * nodes, the real mount, and the shell, fork, subprocess, cp -a, rsync -a and tar writing and
 * reading through it.
 *
 * What each test pins:
 * - a descriptor shared with a forked child (the child closes it, writes through it, or is
 *   killed holding it) never publishes the parent's file short nor drops it: the file is whole
 *   when the parent's close() returns 0;
 * - 200 files written while another thread forks and execs in a loop: none published short;
 * - shell redirections whose commands fork ((a; b) > f, loops of external commands) give the
 *   same bytes as on a local directory; Python's subprocess between two writes too;
 * - cp -a, rsync -a and tar x of a tree into the mount and back out keep every byte, mode and
 *   time (directories holding empty files included);
 * - files whose atime a user set to the past outlive a retention pass;
 * - a scrub of a healthy cluster holding files of every size from 0 B to 3 stripes reports 0
 *   missing and 0 failed.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "mount_tutil.h"

#define PIECE 4096

static char g_tmp[600]; /* a local directory beside the cluster: the reference side */

/* The whole file at path equals want[0..len). */
static void assert_file_is(const char *path, const uint8_t *want, size_t len)
{
	uint8_t *got = malloc(len + 1);
	assert_non_null(got);
	ssize_t n = mtu_read_file(path, got, len + 1);
	if (n != (ssize_t)len)
		fprintf(stderr, "%s: %zd bytes, want %zu\n", path, n, len);
	assert_int_equal(n, (ssize_t)len);
	assert_memory_equal(got, want, len);
	free(got);
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0)
			return -errno;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* A child that shares the parent's descriptor: closes its copy, writes through it, or is
 * killed holding it. The parent goes on writing and closes last: its file is whole. */
static void test_fork_inherit(void **state)
{
	(void)state;
	uint8_t want[3 * PIECE];
	mtu_fill(want, sizeof(want), 7);
	for (int mode = 0; mode < 3; mode++) {
		char path[700];
		snprintf(path, sizeof(path), "%s/fork%d", g_mnt, mode);
		int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		assert_true(fd >= 0);
		assert_int_equal(write_all(fd, want, PIECE), 0);
		pid_t c = fork();
		assert_true(c >= 0);
		if (c == 0) {
			if (mode == 0)
				close(fd); /* an explicit close of the inherited copy */
			else if (mode == 1)
				_exit(write_all(fd, want + PIECE, PIECE) ? 1 : 0); /* exit closes */
			else
				pause(); /* killed below, holding the descriptor */
			_exit(0);
		}
		if (mode == 2) {
			usleep(100000);
			kill(c, SIGKILL);
		}
		int st;
		assert_int_equal(waitpid(c, &st, 0), c);
		if (mode == 1)
			assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
		size_t len = mode == 1 ? 3 * PIECE : 2 * PIECE;
		const uint8_t *rest = mode == 1 ? want + 2 * PIECE : want + PIECE;
		/* The parent writes on after the child's close: EROFS before the fix. */
		assert_int_equal(write_all(fd, rest, PIECE), 0);
		assert_int_equal(close(fd), 0);
		uint8_t ref[3 * PIECE];
		memcpy(ref, want, len);
		if (mode != 1)
			memcpy(ref + PIECE, want + PIECE, PIECE);
		assert_file_is(path, ref, len);
	}
}

/* A process writes a file it opened O_CLOEXEC and execs without closing it (what a Python
 * program that ends in os.exec* does): the exec's close is the owner's last close, so the file
 * is published whole. The exec holds a lock that reading the process's /proc stat waits for,
 * so a mount that read it inside the flush hung both forever (bounded here: 20 s). */
static void test_exec_closes(void **state)
{
	(void)state;
	uint8_t want[2 * PIECE];
	mtu_fill(want, sizeof(want), 11);
	char path[700];
	snprintf(path, sizeof(path), "%s/execd", g_mnt);
	pid_t c = fork();
	assert_true(c >= 0);
	if (c == 0) {
		int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd < 0 || write_all(fd, want, sizeof(want)))
			_exit(1);
		execl("/bin/true", "true", (char *)NULL);
		_exit(127);
	}
	int st = 0, done = 0;
	for (int i = 0; i < 400 && !done; i++) {
		done = waitpid(c, &st, WNOHANG) == c;
		if (!done)
			usleep(50000);
	}
	if (!done)
		fprintf(stderr, "the exec'ing writer (pid %d) still hangs after 20 s\n", (int)c);
	assert_true(done);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	/* The exec's close may leave the commit to the last release, which the kernel sends
	 * right after, without waiting for it. */
	struct stat sb;
	for (int i = 0; i < 100 && stat(path, &sb) != 0; i++)
		usleep(50000);
	assert_file_is(path, want, sizeof(want));
}

/* Another thread forks and execs /bin/true in a loop, so at any moment a child may hold a copy
 * of the writer's descriptors (all of them before exec, those without O_CLOEXEC after). */
static atomic_int g_spawn_stop;
static atomic_int g_spawned;

static void *spawn_loop(void *arg)
{
	(void)arg;
	while (!atomic_load(&g_spawn_stop)) {
		pid_t c = fork();
		if (c == 0) {
			execl("/bin/true", "true", (char *)NULL);
			_exit(127);
		}
		if (c > 0) {
			waitpid(c, NULL, 0);
			atomic_fetch_add(&g_spawned, 1);
		}
	}
	return NULL;
}

static void test_spawn_loop(void **state)
{
	(void)state;
	enum { FILES = 200, LEN = 3 * PIECE };
	static uint8_t want[LEN], got[LEN + 1];
	pthread_t t;
	atomic_store(&g_spawn_stop, 0);
	atomic_store(&g_spawned, 0);
	assert_int_equal(pthread_create(&t, NULL, spawn_loop, NULL), 0);
	int bad_close = 0, bad_bytes = 0;
	for (int i = 0; i < FILES; i++) {
		char path[700];
		snprintf(path, sizeof(path), "%s/spawn%03d", g_mnt, i);
		mtu_fill(want, LEN, 1000 + (uint64_t)i);
		int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | (i % 2 ? O_CLOEXEC : 0), 0644);
		assert_true(fd >= 0);
		int rc = 0;
		for (int p = 0; p < 3 && !rc; p++) {
			rc = write_all(fd, want + p * PIECE, PIECE);
			usleep(500); /* give the loop's children time to close their copies */
		}
		if (close(fd) != 0 || rc) {
			bad_close++;
			continue;
		}
		ssize_t n = mtu_read_file(path, got, sizeof(got));
		if (n != LEN || memcmp(got, want, LEN) != 0)
			bad_bytes++;
	}
	atomic_store(&g_spawn_stop, 1);
	pthread_join(t, NULL);
	fprintf(stderr,
		"spawn loop: %d files, %d children spawned meanwhile; failed writes or "
		"closes %d, files published short or wrong %d\n",
		FILES, atomic_load(&g_spawned), bad_close, bad_bytes);
	assert_true(atomic_load(&g_spawned) > 0);
	assert_int_equal(bad_close, 0);
	assert_int_equal(bad_bytes, 0);
}

/* Runs the shell command cmd (with %s for the directory) in dir; 0 or its status. */
static int sh_in(const char *dir, const char *cmd)
{
	return kvh_sh("cd '%s' && %s", dir, cmd);
}

/* Each command writes file "out" in the directory it runs in; the mount's bytes must equal a
 * local directory's. Every one of them forks: the commands in () and the external ones. */
static void test_shell_redirects(void **state)
{
	(void)state;
	static const char *cmds[] = {
	    "{ echo a; /bin/echo b; echo c; } > out",
	    "(/bin/echo x; uname -s; printf 'y\\n') > out",
	    "for i in $(seq 1 40); do /bin/echo line $i; done > out",
	    "sh -c 'echo 1; /bin/echo 2; printf 3' > out 2>&1",
	    "{ /bin/echo first; /bin/echo second >&2; } > out 2>&1",
	    "exec 3> out; /bin/echo via3 >&3; echo more >&3; exec 3>&-",
	};
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
		char md[700], ld[700];
		snprintf(md, sizeof(md), "%s/sh%zu", g_mnt, i);
		snprintf(ld, sizeof(ld), "%s/sh%zu", g_tmp, i);
		assert_int_equal(mkdir(md, 0755), 0);
		assert_int_equal(mkdir(ld, 0755), 0);
		assert_int_equal(sh_in(ld, cmds[i]), 0);
		int rc = sh_in(md, cmds[i]);
		if (rc)
			fprintf(stderr, "on the mount: '%s' exited %d\n", cmds[i], rc);
		assert_int_equal(rc, 0);
		int same = kvh_sh("cmp '%s/out' '%s/out'", ld, md);
		if (same)
			fprintf(stderr, "'%s': the mount's file differs from the local one\n",
				cmds[i]);
		assert_int_equal(same, 0);
	}
}

/* Python: subprocess.run between two writes (the child holds the descriptor until exec), and a
 * file handed to a child as its stdout. */
static void test_python_subprocess(void **state)
{
	(void)state;
	char py[800];
	snprintf(py, sizeof(py), "%s/sub.py", g_tmp);
	FILE *f = fopen(py, "w");
	assert_non_null(f);
	fputs("import os, subprocess, sys\n"
	      "d = sys.argv[1]\n"
	      "bad = 0\n"
	      "for i in range(20):\n"
	      "    p = os.path.join(d, 'py%d' % i)\n"
	      "    with open(p, 'w') as f:\n"
	      "        f.write('x' * 1000)\n"
	      "        f.flush()\n"
	      "        subprocess.run(['true'], check=True)\n"
	      "        f.write('y' * 1000)\n"
	      "    if open(p).read() != 'x' * 1000 + 'y' * 1000:\n"
	      "        bad += 1\n"
	      "p = os.path.join(d, 'pyout')\n"
	      "with open(p, 'w') as f:\n"
	      "    f.write('head\\n')\n"
	      "    f.flush()\n"
	      "    subprocess.run(['sh', '-c', 'echo a; /bin/echo b'], stdout=f, check=True)\n"
	      "    f.write('tail\\n')\n"
	      "if open(p).read() != 'head\\na\\nb\\ntail\\n':\n"
	      "    bad += 1\n"
	      "print('python subprocess: %d files wrong' % bad)\n"
	      "sys.exit(1 if bad else 0)\n",
	      f);
	assert_int_equal(fclose(f), 0);
	assert_int_equal(kvh_sh("python3 '%s' '%s'", py, g_mnt), 0);
}

/* A tree with files of several sizes (empty ones too), modes and old times, the directories'
 * times set last (deepest first), as an archive or a backup would leave it. */
static void make_tree(const char *src)
{
	assert_int_equal(
	    kvh_sh("set -e; mkdir -p '%s'; cd '%s'; mkdir -p a/b/c empty d; "
		   "head -c 1 /dev/urandom > one; head -c 4095 /dev/urandom > a/odd; "
		   "head -c 65536 /dev/urandom > a/b/sixty4k; "
		   "head -c 1048579 /dev/urandom > a/b/c/big; : > a/b/c/zero; : > d/zero2; "
		   "printf 'text\\n' > d/t; chmod 600 a/odd; chmod 750 a/b/sixty4k; "
		   "find . -type f -exec touch -m -d '2021-03-04 05:06:07.123456789' {} +; "
		   "find . -type f -exec touch -a -d '2020-01-01 00:00:00' {} +; "
		   "find . -depth -type d -exec touch -d '2019-07-08 09:10:11.5' {} +",
		   src, src),
	    0);
}

/* Files: path, size, mode, mtime, sha256; directories: path, mode, mtime. Sorted. */
static void manifest(const char *dir, const char *out)
{
	assert_int_equal(kvh_sh("cd '%s' && { find . -type f -printf 'f %%p %%s %%m %%T@\\n'; "
				"find . -mindepth 1 -type d -printf 'd %%p %%m %%T@\\n'; "
				"find . -type f -exec sha256sum {} +; } | sort > '%s'",
				dir, out),
			 0);
}

static void assert_same_tree(const char *a, const char *b, const char *what)
{
	char ma[800], mb[800];
	snprintf(ma, sizeof(ma), "%s.manifest", a);
	snprintf(mb, sizeof(mb), "%s.manifest", b);
	manifest(a, ma);
	manifest(b, mb);
	int rc = kvh_sh("diff '%s' '%s' >&2", ma, mb);
	if (rc)
		fprintf(stderr, "%s: %s and %s differ (above)\n", what, a, b);
	assert_int_equal(rc, 0);
}

static void test_copy_tools(void **state)
{
	(void)state;
	char src[700], in[700], out[700];
	snprintf(src, sizeof(src), "%s/src", g_tmp);
	make_tree(src);
	/* cp -a in and back out */
	snprintf(in, sizeof(in), "%s/cp", g_mnt);
	snprintf(out, sizeof(out), "%s/cp-out", g_tmp);
	assert_int_equal(kvh_sh("cp -a '%s' '%s'", src, in), 0);
	assert_same_tree(src, in, "cp -a into the mount");
	assert_int_equal(kvh_sh("cp -a '%s' '%s'", in, out), 0);
	assert_same_tree(src, out, "cp -a out of the mount");
	/* rsync -a (temporary names, then renames) */
	snprintf(in, sizeof(in), "%s/rs", g_mnt);
	snprintf(out, sizeof(out), "%s/rs-out", g_tmp);
	assert_int_equal(kvh_sh("rsync -a '%s/' '%s/'", src, in), 0);
	assert_same_tree(src, in, "rsync -a into the mount");
	assert_int_equal(kvh_sh("rsync -a '%s/' '%s/'", in, out), 0);
	assert_same_tree(src, out, "rsync -a out of the mount");
	/* tar c | tar x, both ways (POSIX format: GNU tar keeps whole seconds otherwise) */
	snprintf(in, sizeof(in), "%s/tar", g_mnt);
	snprintf(out, sizeof(out), "%s/tar-out", g_tmp);
	assert_int_equal(
	    kvh_sh("mkdir '%s' '%s' && tar -C '%s' --format=posix -cf - . | tar -C '%s' -xpf -", in,
		   out, src, in),
	    0);
	assert_same_tree(src, in, "tar x into the mount");
	assert_int_equal(kvh_sh("tar -C '%s' --format=posix -cf - . | tar -C '%s' -xpf -", in, out),
			 0);
	assert_same_tree(src, out, "tar x out of the mount");
}

/* What docs/mount.md says of calls a write-once file cannot serve as on a local disk: fstat of
 * an unlinked open file says st_nlink 0 and reads on (it said 1); a shared writable mapping
 * is ENODEV; a read through the writer's own O_RDWR descriptor before the commit is EBUSY. */
static void test_odd_calls(void **state)
{
	(void)state;
	char path[700];
	snprintf(path, sizeof(path), "%s/odd", g_mnt);
	assert_int_equal(mtu_write_file(path, "abcdef", 6), 0);
	int fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	struct stat st;
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(st.st_nlink, 1);
	assert_int_equal(unlink(path), 0);
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(st.st_nlink, 0);
	char b[8];
	assert_int_equal(pread(fd, b, sizeof(b), 0), 6);
	assert_memory_equal(b, "abcdef", 6);
	close(fd);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "xyz", 3), 3);
	errno = 0;
	assert_int_equal(pread(fd, b, 3, 0), -1);
	assert_int_equal(errno, EBUSY);
	errno = 0;
	assert_true(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED);
	assert_int_equal(errno, ENODEV);
	assert_int_equal(close(fd), 0);
	assert_int_equal(mtu_read_file(path, b, sizeof(b)), 3);
	assert_memory_equal(b, "xyz", 3);
}

/* Runs `kvfs ARGS` against the test cluster, its output to out; the exit status. */
static int kvfs_cli(const char *args, const char *out)
{
	char cli[600];
	if (kvh_bin("kvfs", cli, sizeof(cli)) != 0)
		return -1;
	return kvh_sh("'%s' --meta %s --secret-file '%s' %s > '%s' 2>&1", cli, g_cl.meta_addr,
		      g_cl.secret_file, args, out);
}

/* A user sets an old atime (touch -a, cp -a of an old file): the file outlives a retention
 * pass, which follows kvfs's own access clock (72 h TTL; 2020 is long past it). */
static void test_old_atime_kept(void **state)
{
	(void)state;
	char a[700], b[700], src[700], out[700];
	snprintf(a, sizeof(a), "%s/touched", g_mnt);
	snprintf(b, sizeof(b), "%s/copied", g_mnt);
	snprintf(src, sizeof(src), "%s/old-src", g_tmp);
	snprintf(out, sizeof(out), "%s/expire.out", g_tmp);
	assert_int_equal(mtu_write_file(a, "touched", 7), 0);
	assert_int_equal(kvh_sh("touch -a -d 2020-01-01 '%s'", a), 0);
	assert_int_equal(kvh_sh("printf copied > '%s' && touch -a -d 2020-01-01 '%s' && "
				"cp -a '%s' '%s'",
				src, src, src, b),
			 0);
	struct stat st;
	assert_int_equal(stat(a, &st), 0);
	assert_true(st.st_atime < 1600000000); /* shown as set */
	int rc = kvfs_cli("expire", out);
	if (rc)
		kvh_sh("cat '%s' >&2", out);
	assert_int_equal(rc, 0);
	char buf[16];
	assert_int_equal(mtu_read_file(a, buf, sizeof(buf)), 7);
	assert_memory_equal(buf, "touched", 7);
	assert_int_equal(mtu_read_file(b, buf, sizeof(buf)), 6);
	assert_memory_equal(buf, "copied", 6);
}

/* Files of every size from 0 B to 3 stripes (a second mount writes 64 KiB chunks: a 10+1
 * stripe is 640 KiB) on a healthy cluster: a scrub finds nothing missing and fails nothing. */
static void test_scrub_healthy(void **state)
{
	(void)state;
	snprintf(g_mnt2, sizeof(g_mnt2), "%s/mnt-small", g_cl.dir);
	char log[800];
	snprintf(log, sizeof(log), "%s/mount-small.log", g_cl.dir);
	assert_int_equal(mkdir(g_mnt2, 0755), 0);
	char *argv[] = {"kvfs-mount", "-f", "--secret-file", g_cl.secret_file, "--chunk",
			"64K",	      "-o", "max_file=16M",  g_cl.meta_addr,   g_mnt2,
			NULL};
	g_mount2_pid = kvh_spawn(g_bin, argv, log);
	assert_true(g_mount2_pid > 0);
	for (int i = 0; i < 200 && !mtu_is_fuse(g_mnt2); i++)
		usleep(50000);
	assert_true(mtu_is_fuse(g_mnt2));
	enum { CH = 64 << 10, STRIPE = 10 * CH };
	static const size_t sizes[] = {0,
				       1,
				       4095,
				       4096,
				       4097,
				       CH - 1,
				       CH,
				       CH + 1,
				       2 * CH + 7,
				       STRIPE - 1,
				       STRIPE,
				       STRIPE + 1,
				       2 * STRIPE,
				       2 * STRIPE + CH + 3,
				       3 * STRIPE - 1,
				       3 * STRIPE};
	size_t n = sizeof(sizes) / sizeof(sizes[0]);
	uint8_t *buf = malloc(3 * STRIPE);
	assert_non_null(buf);
	for (size_t i = 0; i < n; i++) {
		char p[800];
		snprintf(p, sizeof(p), "%s/s%02zu", g_mnt2, i);
		mtu_fill(buf, sizes[i], 500 + i);
		assert_int_equal(mtu_write_file(p, buf, sizes[i]), 0);
	}
	free(buf);
	char out[700];
	snprintf(out, sizeof(out), "%s/scrub.out", g_tmp);
	int rc = kvfs_cli("scrub", out);
	kvh_sh("cat '%s' >&2", out);
	assert_int_equal(rc, 0);
	assert_int_equal(kvh_sh("grep -q ', 0 failed,' '%s' && grep -q 'corrupt 0, missing 0,' "
				"'%s'",
				out, out),
			 0);
	mtu_stop_mount2();
}

int main(int argc, char **argv)
{
	if (argc > 2 && strcmp(argv[1], "--only") == 0)
		cmocka_set_test_filter(argv[2]);
	if (mtu_skip())
		return 77;
	snprintf(g_tmp, sizeof(g_tmp), "/tmp/kvfs-usertools-%d", (int)getpid());
	if (mkdir(g_tmp, 0755) != 0) {
		perror(g_tmp);
		return 1;
	}
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_fork_inherit),      cmocka_unit_test(test_exec_closes),
	    cmocka_unit_test(test_spawn_loop),	      cmocka_unit_test(test_shell_redirects),
	    cmocka_unit_test(test_python_subprocess), cmocka_unit_test(test_copy_tools),
	    cmocka_unit_test(test_odd_calls),	      cmocka_unit_test(test_old_atime_kept),
	    cmocka_unit_test(test_scrub_healthy),
	};
	int rc = cmocka_run_group_tests(tests, mtu_setup, mtu_teardown);
	kvh_sh("rm -rf '%s'", g_tmp);
	return rc;
}
