/* kvfs-mount through the real kernel mount: a cluster of real kvfs-meta + 11 kvfs-node
 * processes (tests/harness.h, fixture in mount_tutil.h) and the real kvfs-mount binary on
 * /dev/fuse. No mocks.
 *
 * Covers: a 300-file tree copied in and out with checksums, ls -lR / du -sb (= sum of sizes)
 * / du / df / mv / rm -r; 4 processes writing and reading at once; the replacement tests
 * (test_mount_replace.c: no partial file ever visible, replacements as applications meet
 * them); 500 block files written and read through io_uring; a node killed during a read loop
 * (no EIO); meta gone for good (requests answer EIO within --meta-retry); meta restarted while
 * mounted (operations resume, one even waits across the outage); every refused call with its
 * error code; EFBIG; a writer killed mid-file publishes nothing; SIGTERM with a dentry
 * notification stuck on a directory lock (the daemon still exits cleanly); .kvfs/ status files
 * and user.kvfs.* xattrs; startup errors (meta unreachable, bad option) and the background mode.
 *
 * Without /dev/fuse (or fusermount3) it prints "skipped: no /dev/fuse" and exits 77, which
 * CTest reports as Skipped. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <liburing.h>

#include "mount_tutil.h"

/* ---- 300-file tree in and out ---- */

static void test_tree(void **state)
{
	(void)state;
	char src[700], out[700];
	snprintf(src, sizeof(src), "%s/src", g_cl.dir);
	snprintf(out, sizeof(out), "%s/out", g_cl.dir);
	assert_int_equal(mkdir(src, 0755), 0);
	uint8_t *buf = malloc(200000);
	uint64_t total = 0, seed = 42;
	for (int d = 0; d < 10; d++) {
		char p[800];
		snprintf(p, sizeof(p), "%s/d%d", src, d);
		assert_int_equal(mkdir(p, 0755), 0);
		for (int f = 0; f < 30; f++) {
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			size_t len = (f == 0) ? 0 : (size_t)((seed >> 33) % 200000);
			mtu_fill(buf, len, seed);
			snprintf(p, sizeof(p), "%s/d%d/f%03d.kvb", src, d, f);
			assert_int_equal(mtu_write_file(p, buf, len), 0);
			total += len;
		}
	}
	free(buf);
	assert_int_equal(kvh_sh("cp -r '%s' '%s/tree'", src, g_mnt), 0);
	assert_int_equal(kvh_sh("cd '%s' && find . -type f | sort | xargs sha256sum > '%s/sum.src'",
				src, g_cl.dir),
			 0);
	assert_int_equal(kvh_sh("cd '%s/tree' && find . -type f | sort | xargs sha256sum > "
				"'%s/sum.mnt' && cmp '%s/sum.src' '%s/sum.mnt'",
				g_mnt, g_cl.dir, g_cl.dir, g_cl.dir),
			 0);
	assert_int_equal(kvh_sh("test $(find '%s/tree' -type f | wc -l) -eq 300", g_mnt), 0);
	/* and out again, from a cold page cache */
	kvh_sh("sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null");
	assert_int_equal(kvh_sh("cp -r '%s/tree' '%s' && cd '%s' && find . -type f | sort | "
				"xargs sha256sum | cmp - '%s/sum.src'",
				g_mnt, out, out, g_cl.dir),
			 0);
	/* ls -lR lists every file; du -sb equals the sum of the sizes (directories are 0) */
	assert_int_equal(kvh_sh("test $(ls -lR '%s/tree' | grep -c '\\.kvb$') -eq 300", g_mnt), 0);
	assert_int_equal(
	    kvh_sh("test $(du -sb '%s/tree' | cut -f1) -eq %llu", g_mnt, (unsigned long long)total),
	    0);
	/* du (allocated) counts parity: more than the apparent size, at most ~k+m/k of it plus
	 * rounding per file */
	assert_int_equal(kvh_sh("a=$(du -sk --apparent-size '%s/tree' | cut -f1); "
				"b=$(du -sk '%s/tree' | cut -f1); test $b -gt $a",
				g_mnt, g_mnt),
			 0);
	assert_int_equal(kvh_sh("df -h '%s' | grep -q kvfs && df -i '%s' >/dev/null", g_mnt, g_mnt),
			 0);
	assert_int_equal(kvh_sh("find '%s/tree' -mmin -10 -type f | grep -q f001", g_mnt), 0);

	/* mv a directory and a file; contents unchanged */
	assert_int_equal(kvh_sh("mv '%s/tree/d3' '%s/moved' && mv '%s/moved/f002.kvb' "
				"'%s/moved/renamed.kvb'",
				g_mnt, g_mnt, g_mnt, g_mnt),
			 0);
	assert_int_equal(kvh_sh("cmp '%s/moved/renamed.kvb' '%s/d3/f002.kvb' && test ! -e "
				"'%s/tree/d3'",
				g_mnt, src, g_mnt),
			 0);
	/* rm -r removes everything */
	assert_int_equal(kvh_sh("rm -r '%s/tree' '%s/moved'", g_mnt, g_mnt), 0);
	assert_int_equal(kvh_sh("test -z \"$(ls -A '%s')\"", g_mnt), 0);
	kvh_sh("rm -rf '%s' '%s'", src, out);
}

/* ---- 4 processes writing and reading at once ---- */

#define CP_PROCS 4
#define CP_FILES 25
#define CP_SIZE	 (300u << 10)

static int cp_worker(int id)
{
	uint8_t *w = malloc(CP_SIZE), *r = malloc(CP_SIZE + 1);
	char p[800];
	int bad = 0;
	for (int f = 0; f < CP_FILES && !bad; f++) {
		size_t len = CP_SIZE - (size_t)f * 1000;
		mtu_fill(w, len, (uint64_t)id * 1000 + (uint64_t)f);
		snprintf(p, sizeof(p), "%s/conc/p%d-%d", g_mnt, id, f);
		if (mtu_write_file(p, w, len) != 0)
			bad = 1;
		/* read what another process wrote, if it is there already: whole or absent */
		snprintf(p, sizeof(p), "%s/conc/p%d-%d", g_mnt, (id + 1) % CP_PROCS, f);
		ssize_t n = mtu_read_file(p, r, CP_SIZE + 1);
		if (n >= 0) {
			mtu_fill(w, CP_SIZE - (size_t)f * 1000,
				 (uint64_t)((id + 1) % CP_PROCS) * 1000 + (uint64_t)f);
			if ((size_t)n != CP_SIZE - (size_t)f * 1000 || memcmp(w, r, (size_t)n))
				bad = 2;
		} else if (n != -ENOENT) {
			bad = 3;
		}
	}
	free(w);
	free(r);
	return bad;
}

static void test_concurrent(void **state)
{
	(void)state;
	char p[700];
	snprintf(p, sizeof(p), "%s/conc", g_mnt);
	assert_int_equal(mkdir(p, 0755), 0);
	pid_t pids[CP_PROCS];
	for (int i = 0; i < CP_PROCS; i++) {
		pids[i] = fork();
		assert_true(pids[i] >= 0);
		if (pids[i] == 0)
			_exit(cp_worker(i));
	}
	for (int i = 0; i < CP_PROCS; i++) {
		int st;
		assert_int_equal(waitpid(pids[i], &st, 0), pids[i]);
		assert_true(WIFEXITED(st));
		assert_int_equal(WEXITSTATUS(st), 0);
	}
	/* everything is there, byte-exact */
	uint8_t *w = malloc(CP_SIZE), *r = malloc(CP_SIZE + 1);
	for (int i = 0; i < CP_PROCS; i++)
		for (int f = 0; f < CP_FILES; f++) {
			size_t len = CP_SIZE - (size_t)f * 1000;
			char q[800];
			snprintf(q, sizeof(q), "%s/conc/p%d-%d", g_mnt, i, f);
			mtu_fill(w, len, (uint64_t)i * 1000 + (uint64_t)f);
			assert_int_equal(mtu_read_file(q, r, CP_SIZE + 1), (ssize_t)len);
			assert_memory_equal(w, r, len);
		}
	free(w);
	free(r);
	assert_int_equal(kvh_sh("rm -r '%s'", p), 0);
}

/* ---- 500 block files through io_uring ---- */

#define UR_FILES 500
#define UR_BATCH 25
#define UR_SIZE	 (64u << 10)

static void test_io_uring(void **state)
{
	(void)state;
	struct io_uring ring;
	assert_int_equal(io_uring_queue_init(64, &ring, 0), 0);
	char dir[700];
	snprintf(dir, sizeof(dir), "%s/uring", g_mnt);
	assert_int_equal(mkdir(dir, 0755), 0);
	uint8_t *bufs = malloc((size_t)UR_BATCH * UR_SIZE), *exp = malloc(UR_SIZE);
	int fds[UR_BATCH];
	for (int pass = 0; pass < 2; pass++) {
		for (int b = 0; b < UR_FILES; b += UR_BATCH) {
			for (int i = 0; i < UR_BATCH; i++) {
				char p[800];
				snprintf(p, sizeof(p), "%s/%04d.kvb", dir, b + i);
				fds[i] = pass == 0 ? open(p, O_WRONLY | O_CREAT | O_EXCL, 0644)
						   : open(p, O_RDONLY);
				assert_true(fds[i] >= 0);
				uint8_t *bp = bufs + (size_t)i * UR_SIZE;
				struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
				if (pass == 0) {
					mtu_fill(bp, UR_SIZE, (uint64_t)(b + i));
					io_uring_prep_write(sqe, fds[i], bp, UR_SIZE, 0);
				} else {
					memset(bp, 0, UR_SIZE);
					io_uring_prep_read(sqe, fds[i], bp, UR_SIZE, 0);
				}
				sqe->user_data = (uint64_t)i;
			}
			assert_int_equal(io_uring_submit(&ring), UR_BATCH);
			for (int i = 0; i < UR_BATCH; i++) {
				struct io_uring_cqe *cqe;
				assert_int_equal(io_uring_wait_cqe(&ring, &cqe), 0);
				assert_int_equal(cqe->res, (int)UR_SIZE);
				io_uring_cqe_seen(&ring, cqe);
			}
			/* close through the ring too: the commit happens in that close */
			for (int i = 0; i < UR_BATCH; i++) {
				struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
				io_uring_prep_close(sqe, fds[i]);
			}
			assert_int_equal(io_uring_submit(&ring), UR_BATCH);
			for (int i = 0; i < UR_BATCH; i++) {
				struct io_uring_cqe *cqe;
				assert_int_equal(io_uring_wait_cqe(&ring, &cqe), 0);
				assert_int_equal(cqe->res, 0);
				io_uring_cqe_seen(&ring, cqe);
			}
			if (pass == 1)
				for (int i = 0; i < UR_BATCH; i++) {
					mtu_fill(exp, UR_SIZE, (uint64_t)(b + i));
					assert_memory_equal(exp, bufs + (size_t)i * UR_SIZE,
							    UR_SIZE);
				}
		}
	}
	io_uring_queue_exit(&ring);
	free(bufs);
	free(exp);
	assert_int_equal(kvh_sh("test $(ls '%s' | wc -l) -eq %d && rm -r '%s'", dir, UR_FILES, dir),
			 0);
}

/* ---- a node killed during a read loop: no failed read ---- */

struct rloop {
	int nfiles;
	size_t size;
	atomic_int stop, reads; /* read by the test while the loop runs */
	int errors, mismatches;
};

static void *read_loop(void *arg)
{
	struct rloop *l = arg;
	uint8_t *b = NULL, *e = malloc(l->size);
	if (posix_memalign((void **)&b, 4096, l->size))
		return NULL;
	while (!l->stop)
		for (int f = 0; f < l->nfiles && !l->stop; f++) {
			char p[800];
			snprintf(p, sizeof(p), "%s/nk/%d.kvb", g_mnt, f);
			/* O_DIRECT: every read goes to the cluster, not the page cache */
			int fd = open(p, O_RDONLY | O_DIRECT);
			ssize_t n = fd >= 0 ? pread(fd, b, l->size, 0) : -1;
			if (n != (ssize_t)l->size) {
				l->errors++;
				fprintf(stderr, "read %s: %zd (%s)\n", p, n, strerror(errno));
			} else {
				mtu_fill(e, l->size, (uint64_t)f + 500);
				l->mismatches += memcmp(e, b, l->size) != 0;
			}
			if (fd >= 0)
				close(fd);
			l->reads++;
		}
	free(b);
	free(e);
	return NULL;
}

static void test_node_kill(void **state)
{
	(void)state;
	struct rloop l = {.nfiles = 12, .size = 2u << 20};
	char p[800];
	snprintf(p, sizeof(p), "%s/nk", g_mnt);
	assert_int_equal(mkdir(p, 0755), 0);
	uint8_t *b = malloc(l.size);
	for (int f = 0; f < l.nfiles; f++) {
		mtu_fill(b, l.size, (uint64_t)f + 500);
		snprintf(p, sizeof(p), "%s/nk/%d.kvb", g_mnt, f);
		assert_int_equal(mtu_write_file(p, b, l.size), 0);
	}
	free(b);
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, read_loop, &l), 0);
	usleep(500000);
	int before = l.reads;
	assert_int_equal(kvh_node_kill(&g_cl, 3, SIGKILL), 0);
	int64_t end = mtu_now_ms() + 3000;
	while (mtu_now_ms() < end)
		usleep(50000);
	l.stop = 1;
	pthread_join(t, NULL);
	assert_int_equal(l.errors, 0);
	assert_int_equal(l.mismatches, 0);
	assert_true(l.reads > before + l.nfiles); /* a full loop at least ran with the node down */
	assert_int_equal(kvh_node_restart(&g_cl, 3), 0);
	assert_int_equal(kvh_wait_nodes_up(&g_cl, NNODES, 15000), 0);
	snprintf(p, sizeof(p), "%s/nk", g_mnt);
	assert_int_equal(kvh_sh("rm -r '%s'", p), 0);
}

/* ---- too few nodes to store a file: close() says EHOSTDOWN, as docs/mount.md does ---- */

/* Two of 11 nodes gone under 10+1 (fewer than k up: no placement can store a stripe). Right
 * after the kill meta still lists them up and the client cannot reach them; once meta marks
 * them down, ALLOC refuses. Both used to reach the application as EIO (the mount folded
 * EHOSTDOWN into it, and the client returned the connection error). */
static void test_nodes_down_close(void **state)
{
	(void)state;
	char p[800];
	/* 1 MiB: every one of the 11 chunks is stored (a small file stores empty chunks on no
	 * node, and would not need the killed ones). */
	static uint8_t b[1u << 20];
	mtu_fill(b, sizeof(b), 77);
	assert_int_equal(kvh_node_kill(&g_cl, 4, SIGKILL), 0);
	assert_int_equal(kvh_node_kill(&g_cl, 5, SIGKILL), 0);
	snprintf(p, sizeof(p), "%s/hd-early.kvb", g_mnt);
	assert_int_equal(mtu_write_file(p, b, sizeof(b)), -EHOSTDOWN);
	assert_int_equal(kvh_wait_nodes_up(&g_cl, NNODES - 2, 20000), 0);
	snprintf(p, sizeof(p), "%s/hd-known.kvb", g_mnt);
	assert_int_equal(mtu_write_file(p, b, sizeof(b)), -EHOSTDOWN);
	struct stat st;
	assert_int_equal(stat(p, &st), -1); /* not published */
	assert_int_equal(errno, ENOENT);
	assert_int_equal(kvh_node_restart(&g_cl, 4), 0);
	assert_int_equal(kvh_node_restart(&g_cl, 5), 0);
	assert_int_equal(kvh_wait_nodes_up(&g_cl, NNODES, 15000), 0);
	assert_int_equal(mtu_write_file(p, b, sizeof(b)), 0);
	assert_int_equal(unlink(p), 0);
}

/* ---- meta restarted while mounted ---- */

static void test_meta_restart(void **state)
{
	(void)state;
	char p[800], q[800];
	uint8_t b[5000], r[5001];
	mtu_fill(b, sizeof(b), 99);
	snprintf(p, sizeof(p), "%s/before.kvb", g_mnt);
	assert_int_equal(mtu_write_file(p, b, sizeof(b)), 0);
	assert_int_equal(kvh_meta_kill(&g_cl, SIGKILL), 0);
	/* a stat issued while meta is down waits for it (the mount retries) and succeeds */
	snprintf(q, sizeof(q), "%s/stat.out", g_cl.dir);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct stat st;
		usleep(100000);
		_exit(stat(p, &st) == 0 && st.st_size == (off_t)sizeof(b) ? 0 : 1);
	}
	usleep(1500000);
	assert_int_equal(kvh_meta_restart(&g_cl), 0);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_int_equal(kvh_wait_nodes_up(&g_cl, NNODES, 15000), 0);
	/* everything works again, without a remount */
	assert_int_equal(mtu_read_file(p, r, sizeof(r)), (ssize_t)sizeof(b));
	assert_memory_equal(b, r, sizeof(b));
	snprintf(q, sizeof(q), "%s/after.kvb", g_mnt);
	assert_int_equal(mtu_write_file(q, b, sizeof(b)), 0);
	assert_int_equal(mtu_read_file(q, r, sizeof(r)), (ssize_t)sizeof(b));
	assert_int_equal(kvh_sh("ls -l '%s' >/dev/null && rm '%s' '%s'", g_mnt, p, q), 0);
}

/* ---- SIGTERM with a dentry notification in flight: the daemon still ends cleanly ---- */

/* A new file's commit queues a notification for its directory; the test hook holds it 1.5 s
 * (in flight). Meanwhile the daemon gets SIGTERM, its loop stops reading requests, and another
 * process starts a mkdir in that directory: the kernel holds the directory's lock while that
 * process waits for its LOOKUP, and the notification needs the same lock. The daemon must
 * still answer, join the notification thread and exit 0. (The old code gave up on the thread
 * after 2 s, destroyed the session under it and could never exit: the thread stayed blocked.) */
static void test_unmount_inval(void **state)
{
	(void)state;
	char log2[800], dir[800], p[900];
	setenv("KVFS_MOUNT_TEST_INVAL_DELAY_MS", "1500", 1);
	int rc = mtu_start_mount2("d", NULL, log2, sizeof(log2));
	unsetenv("KVFS_MOUNT_TEST_INVAL_DELAY_MS");
	assert_int_equal(rc, 0);
	snprintf(dir, sizeof(dir), "%s/ud", g_mnt2);
	assert_int_equal(mkdir(dir, 0755), 0);
	snprintf(p, sizeof(p), "%s/a.kvb", dir);
	assert_int_equal(mtu_write_file(p, "x", 1), 0); /* its notification is now queued */
	/* ... and in flight once the hook says it holds it (on a loaded machine the thread may
	 * not have taken it yet, and SIGTERM would then find nothing in flight) */
	int held = 0;
	for (int i = 0; i < 100 && !held; i++) {
		held = kvh_sh("grep -q \"notification for 'a.kvb' held\" '%s'", log2) == 0;
		if (!held)
			usleep(50000);
	}
	assert_true(held);
	int64_t t0 = mtu_now_ms();
	assert_int_equal(kill(g_mount2_pid, SIGTERM), 0);
	usleep(300000); /* the loop has stopped reading requests */
	/* mkdir holds the directory's lock over its LOOKUP and MKDIR, and leaves no open handle
	 * (libfuse sends no RELEASE for handles still open when the daemon stops) */
	snprintf(p, sizeof(p), "%s/sub", dir);
	pid_t cpid = fork();
	assert_true(cpid >= 0);
	if (cpid == 0)
		_exit(mkdir(p, 0755) == 0 ? 0 : 1);
	int ws = 0, exited = 0;
	while (!exited && mtu_now_ms() - t0 < 10000) {
		exited = waitpid(g_mount2_pid, &ws, WNOHANG) == g_mount2_pid;
		if (!exited)
			usleep(50000);
	}
	int cws = 0;
	if (!exited) {
		fprintf(stderr, "kvfs-mount still running 10 s after SIGTERM\n");
		kill(cpid,
		     SIGKILL); /* its unread request is dropped: the lock goes, the thread ends */
		waitpid(cpid, &cws, 0);
		kvh_stop_pid(g_mount2_pid, SIGKILL, 5000);
	} else {
		printf("kvfs-mount exited %d, %lld ms after SIGTERM\n",
		       WIFEXITED(ws) ? WEXITSTATUS(ws) : -1, (long long)(mtu_now_ms() - t0));
		waitpid(cpid, &cws, 0);
		kvh_sh("grep -o 'answered [0-9]* requests.*' '%s'", log2);
	}
	g_mount2_pid = 0;
	if (mtu_is_fuse(g_mnt2))
		kvh_sh("fusermount3 -uz '%s'", g_mnt2);
	rmdir(g_mnt2);
	kvh_sh("rm -rf '%s/ud'", g_mnt);
	assert_true(exited);
	assert_true(WIFEXITED(ws));
	assert_int_equal(WEXITSTATUS(ws), 0);
	assert_true(WIFEXITED(cws)); /* answered, not left waiting */
	assert_int_equal(WEXITSTATUS(cws), 0);
}

/* ---- writer budget full: a write waits for another file's commit, then goes on ---- */

struct bf_writer {
	char path[900];
	const uint8_t *buf;
	size_t len;
	atomic_int done;
	ssize_t wrote;
	int close_rc;
};

static void *bf_writer_main(void *arg)
{
	struct bf_writer *x = arg;
	int fd = open(x->path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
	x->wrote = fd < 0 ? -errno : write(fd, x->buf, x->len);
	if (x->wrote < 0 && fd >= 0)
		x->wrote = -errno;
	x->close_rc = fd < 0 ? -1 : close(fd);
	atomic_store(&x->done, 1);
	return NULL;
}

/* A mount whose --max-buffered (1 MiB) one open file fills: a second file's write blocks in
 * the mount (kvc_buffer_wait) until the first file's close commits it and frees its buffer,
 * then succeeds; both files read back whole. */
static void test_buffer_full(void **state)
{
	(void)state;
	char log2[800], a[900];
	assert_int_equal(mtu_start_mount2("b", "max_buffered=1M", log2, sizeof(log2)), 0);
	static uint8_t ba[900 << 10], bb[256 << 10], r[900 << 10];
	mtu_fill(ba, sizeof(ba), 31);
	mtu_fill(bb, sizeof(bb), 32);
	snprintf(a, sizeof(a), "%s/bf-a.kvb", g_mnt2);
	int fa = open(a, O_CREAT | O_WRONLY | O_TRUNC, 0644);
	assert_true(fa >= 0);
	assert_int_equal(write(fa, ba, sizeof(ba)), (ssize_t)sizeof(ba)); /* 900 of 1024 KiB */
	struct bf_writer x = {.buf = bb, .len = sizeof(bb)};
	snprintf(x.path, sizeof(x.path), "%s/bf-b.kvb", g_mnt2);
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, bf_writer_main, &x), 0);
	usleep(500000);
	assert_false(atomic_load(&x.done)); /* waiting for budget, not failed */
	assert_int_equal(close(fa), 0);	    /* commits a: its buffer is freed */
	pthread_join(t, NULL);
	assert_int_equal(x.wrote, (ssize_t)sizeof(bb));
	assert_int_equal(x.close_rc, 0);
	assert_int_equal(mtu_read_file(a, r, sizeof(r)), (ssize_t)sizeof(ba));
	assert_memory_equal(r, ba, sizeof(ba));
	assert_int_equal(mtu_read_file(x.path, r, sizeof(r)), (ssize_t)sizeof(bb));
	assert_memory_equal(r, bb, sizeof(bb));
	unlink(a);
	unlink(x.path);
	mtu_stop_mount2();
	rmdir(g_mnt2);
}

/* --splice-write: every write's data comes out of a pipe (libfuse spliced the request out of
 * /dev/fuse) straight into the file's buffer. Requests of max_write (1020 KiB where the pipe
 * cannot hold 1 MiB + 4 KiB), written in and out of order, across a hole and past the end, read
 * back byte for byte. */
static void test_splice_write(void **state)
{
	(void)state;
	char log2[800], p[900];
	assert_int_equal(mtu_start_mount2("s", "splice_write=true", log2, sizeof(log2)), 0);
	enum { BIG = (2 << 20) + 5000 };
	static uint8_t a[BIG], r[BIG + 4096];
	mtu_fill(a, sizeof(a), 41);
	snprintf(p, sizeof(p), "%s/sp-a.kvb", g_mnt2);
	int fd = open(p, O_CREAT | O_WRONLY | O_TRUNC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, a, sizeof(a)), (ssize_t)sizeof(a));
	assert_int_equal(close(fd), 0);
	assert_int_equal(mtu_read_file(p, r, sizeof(r)), (ssize_t)sizeof(a));
	assert_memory_equal(r, a, sizeof(a));
	/* Second half first, then a hole of 100 bytes, then the first half: the file's bytes are
	 * [0, 1 MiB) then [1 MiB, 2 MiB) of a, then 100 zeros, then 4000 bytes of a again. */
	snprintf(p, sizeof(p), "%s/sp-b.kvb", g_mnt2);
	fd = open(p, O_CREAT | O_WRONLY | O_TRUNC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, a + (1 << 20), 1 << 20, 1 << 20), 1 << 20);
	assert_int_equal(pwrite(fd, a, 4000, (2 << 20) + 100), 4000);
	assert_int_equal(pwrite(fd, a, 1 << 20, 0), 1 << 20);
	assert_int_equal(close(fd), 0);
	assert_int_equal(mtu_read_file(p, r, sizeof(r)), (2 << 20) + 4100);
	assert_memory_equal(r, a, 2 << 20);
	for (int i = 0; i < 100; i++)
		assert_int_equal(r[(2 << 20) + i], 0);
	assert_memory_equal(r + (2 << 20) + 100, a, 4000);
	unlink(p);
	snprintf(p, sizeof(p), "%s/sp-a.kvb", g_mnt2);
	unlink(p);
	mtu_stop_mount2();
	rmdir(g_mnt2);
	/* The mount says whether it spliced; off only where no pipe could grow to 8 KiB (this
	 * user's pipe-user-pages-soft spent), and then this test covered the memory path. */
	char line[256] = "";
	FILE *f = fopen(log2, "r");
	assert_non_null(f);
	int said = 0, on = 0;
	while (fgets(line, sizeof(line), f)) {
		if (!strstr(line, "FUSE protocol"))
			continue;
		said = strstr(line, "splice ") != NULL;
		on = strstr(line, "splice on") != NULL;
	}
	fclose(f);
	assert_true(said);
	if (!on)
		print_message("splice off on this machine: the memory path was tested\n");
}

/* ---- meta gone for good: a request answers EIO within --meta-retry ---- */

#define MG_RETRY_S  8	 /* the second mount's --meta-retry */
#define MG_SLACK_MS 3000 /* scheduling on a loaded machine; a correctness bound, not speed */
#define MG_OPS	    4

/* One metadata request each (the second mount caches names for 60 s, attributes not at all):
 * GETATTR, OPEN (its LAYOUT request), LOOKUP of a name not cached, STATFS. Returns errno. */
static int mg_op(int op, const char *mnt)
{
	char p[800];
	struct stat st;
	struct statvfs sv;
	snprintf(p, sizeof(p), "%s/%s", mnt, op == 2 ? "never-seen.kvb" : "gone.kvb");
	int rc;
	if (op == 0) {
		rc = stat(p, &st);
	} else if (op == 1) {
		rc = open(p, O_RDONLY);
		if (rc >= 0)
			close(rc);
	} else if (op == 2) {
		rc = stat(p, &st);
	} else {
		rc = statvfs(mnt, &sv);
	}
	return rc < 0 ? errno : 0;
}

static void test_meta_gone(void **state)
{
	(void)state;
	static const char *const what[MG_OPS] = {"stat (getattr)", "open", "stat (lookup)",
						 "statfs"};
	char log2[800], p[800];
	snprintf(g_mnt2, sizeof(g_mnt2), "%s/mnt-c", g_cl.dir);
	snprintf(log2, sizeof(log2), "%s/mount-c.log", g_cl.dir);
	assert_int_equal(mkdir(g_mnt2, 0755), 0);
	char opts[128];
	/* lookup_layout off: the open below must make its own meta round trip (with it, the
	 * stat's lookup brings the layout and that open succeeds without meta) */
	snprintf(opts, sizeof(opts),
		 "meta_retry=%d,entry_timeout=60,attr_timeout=0,lookup_layout=false", MG_RETRY_S);
	char *argv[] = {"kvfs-mount",	  "-f",	  "--secret-file",
			g_cl.secret_file, "-o",	  opts,
			g_cl.meta_addr,	  g_mnt2, NULL};
	g_mount2_pid = kvh_spawn(g_bin, argv, log2);
	assert_true(g_mount2_pid > 0);
	for (int i = 0; i < 200 && !mtu_is_fuse(g_mnt2); i++)
		usleep(50000);
	assert_true(mtu_is_fuse(g_mnt2));
	snprintf(p, sizeof(p), "%s/gone.kvb", g_mnt);
	assert_int_equal(mtu_write_file(p, "0123456789", 10), 0);
	snprintf(p, sizeof(p), "%s/gone.kvb", g_mnt2);
	struct stat st;
	assert_int_equal(stat(p, &st), 0); /* its name is now cached there */
	assert_int_equal(kvh_meta_kill(&g_cl, SIGKILL), 0);

	/* Each request in a process of its own, all at once; one still blocked past the budget
	 * (plus slack) is a failure. Before the budget was wall-clock, each retry also spent
	 * libkvfs's ~5.5 s of reconnect attempts, and these blocked for minutes. */
	pid_t pid[MG_OPS];
	int64_t t0 = mtu_now_ms(), took[MG_OPS], limit = MG_RETRY_S * 1000 + MG_SLACK_MS;
	int err[MG_OPS], left = MG_OPS;
	for (int i = 0; i < MG_OPS; i++) {
		pid[i] = fork();
		assert_true(pid[i] >= 0);
		if (pid[i] == 0)
			_exit(mg_op(i, g_mnt2));
		took[i] = -1;
		err[i] = -1;
	}
	while (left > 0 && mtu_now_ms() - t0 <= limit) {
		for (int i = 0; i < MG_OPS; i++) {
			int ws;
			if (pid[i] > 0 && waitpid(pid[i], &ws, WNOHANG) == pid[i]) {
				took[i] = mtu_now_ms() - t0;
				err[i] = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
				pid[i] = 0;
				left--;
			}
		}
		usleep(20000);
	}
	/* The cluster back for the tests that follow, first: a request the mount has taken is
	 * not ended by SIGKILL (the kernel waits for its answer), so a blocked one ends by
	 * succeeding now. */
	assert_int_equal(kvh_meta_restart(&g_cl), 0);
	for (int i = 0; i < MG_OPS; i++) {
		if (pid[i] > 0) {
			kill(pid[i], SIGKILL);
			waitpid(pid[i], NULL, 0);
			fprintf(stderr, "meta gone: %s still blocked after %lld ms\n", what[i],
				(long long)limit);
		} else {
			printf("meta gone: %s answered %s after %lld ms\n", what[i],
			       err[i] > 0 ? strerror(err[i]) : "ok", (long long)took[i]);
		}
	}
	assert_int_equal(kvh_wait_nodes_up(&g_cl, NNODES, 15000), 0);
	mtu_stop_mount2();
	rmdir(g_mnt2);
	snprintf(p, sizeof(p), "%s/gone.kvb", g_mnt);
	for (int i = 0; i < MG_OPS; i++) {
		assert_true(took[i] >= 0 && took[i] <= limit);
		assert_int_equal(err[i], EIO);
	}
	assert_int_equal(unlink(p), 0);
}

/* ---- refused operations and their error codes ---- */

static void test_refused(void **state)
{
	(void)state;
	char f[800], g[800], d[800];
	snprintf(f, sizeof(f), "%s/ref.kvb", g_mnt);
	snprintf(g, sizeof(g), "%s/other", g_mnt);
	snprintf(d, sizeof(d), "%s/refdir", g_mnt);
	assert_int_equal(mtu_write_file(f, "0123456789", 10), 0);
	assert_int_equal(mkdir(d, 0755), 0);

	errno = 0;
	assert_int_equal(link(f, g), -1);
	assert_int_equal(errno, EPERM);
	assert_int_equal(symlink("ref.kvb", g), -1);
	assert_int_equal(errno, EPERM);
	assert_int_equal(mknod(g, S_IFIFO | 0644, 0), -1);
	assert_int_equal(errno, EPERM);
	assert_int_equal(mknod(g, S_IFREG | 0644, 0), -1);
	assert_int_equal(errno, EPERM);
	/* committed files are immutable: opening one for writing works (and reads), but a
	 * write without O_TRUNC, or a truncate to another size, is EROFS */
	int wfd = open(f, O_WRONLY);
	assert_true(wfd >= 0);
	assert_int_equal(write(wfd, "x", 1), -1);
	assert_int_equal(errno, EROFS);
	assert_int_equal(ftruncate(wfd, 5), -1);
	assert_int_equal(errno, EROFS);
	assert_int_equal(close(wfd), 0);
	wfd = open(f, O_RDWR | O_APPEND);
	assert_true(wfd >= 0);
	char rb[16];
	assert_int_equal(read(wfd, rb, sizeof(rb)), 10);
	assert_memory_equal(rb, "0123456789", 10);
	assert_int_equal(write(wfd, "x", 1), -1);
	assert_int_equal(errno, EROFS);
	assert_int_equal(close(wfd), 0);
	assert_int_equal(mtu_read_file(f, rb, sizeof(rb)), 10);
	assert_memory_equal(rb, "0123456789", 10);
	assert_int_equal(truncate(f, 3), -1);
	assert_int_equal(errno, EROFS);
	assert_int_equal(truncate(f, 10), 0); /* to its own size: nothing to change */
	assert_int_equal(setxattr(f, "user.x", "1", 1, 0), -1);
	assert_int_equal(errno, ENOTSUP);
	assert_int_equal(removexattr(f, "user.kvfs.layout"), -1);
	assert_int_equal(errno, ENOTSUP);
	assert_int_equal(renameat2(AT_FDCWD, f, AT_FDCWD, d, RENAME_EXCHANGE), -1);
	assert_int_equal(errno, EINVAL);
	assert_int_equal(rename(f, d), -1); /* a file over a directory */
	assert_true(errno == EISDIR || errno == ENOTEMPTY || errno == EEXIST);
	assert_int_equal(rmdir(g_mnt), -1); /* the mount root */
	/* a duplicate descriptor still open: closing the other one does not publish the file,
	 * the last close does (EROFS for "def" before) */
	char s0[800];
	int fd = open(g, O_WRONLY | O_CREAT | O_EXCL, 0644);
	assert_true(fd >= 0);
	int fd2 = dup(fd);
	assert_int_equal(write(fd, "abc", 3), 3);
	assert_int_equal(close(fd), 0);
	assert_int_equal(access(g, F_OK), -1); /* not published yet */
	assert_int_equal(write(fd2, "def", 3), 3);
	assert_int_equal(close(fd2), 0); /* commits */
	assert_int_equal(mtu_read_file(g, rb, sizeof(rb)), 6);
	assert_memory_equal(rb, "abcdef", 6);
	/* the owner's last close publishes even while a child still holds a copy: the child's
	 * write after it is refused (docs/mount.md, "When close() publishes") */
	snprintf(s0, sizeof(s0), "%s/handed", g_mnt);
	fd = open(s0, O_WRONLY | O_CREAT | O_EXCL, 0644);
	assert_true(fd >= 0);
	int go[2];
	assert_int_equal(pipe(go), 0);
	pid_t c = fork();
	assert_true(c >= 0);
	if (c == 0) {
		char x;
		close(go[1]);
		if (read(go[0], &x, 1) != 1)
			_exit(2);
		_exit(write(fd, "late", 4) == -1 && errno == EROFS ? 0 : 1);
	}
	close(go[0]);
	assert_int_equal(write(fd, "early", 5), 5);
	assert_int_equal(close(fd), 0); /* the owner's last close: published */
	assert_int_equal(write(go[1], "x", 1), 1);
	close(go[1]);
	int cst;
	assert_int_equal(waitpid(c, &cst, 0), c);
	assert_true(WIFEXITED(cst) && WEXITSTATUS(cst) == 0);
	assert_int_equal(mtu_read_file(s0, rb, sizeof(rb)), 5);
	assert_memory_equal(rb, "early", 5);
	assert_int_equal(unlink(s0), 0);
	/* the status directory is read-only */
	char s[800];
	snprintf(s, sizeof(s), "%s/.kvfs/nodes", g_mnt);
	assert_int_equal(open(s, O_WRONLY), -1);
	assert_int_equal(errno, EROFS);
	snprintf(s, sizeof(s), "%s/.kvfs/new", g_mnt);
	assert_int_equal(open(s, O_WRONLY | O_CREAT, 0644), -1);
	assert_int_equal(errno, EROFS);
	snprintf(s, sizeof(s), "%s/.kvfs", g_mnt);
	assert_int_equal(mkdir(s, 0755), -1);
	assert_int_equal(errno, EEXIST);
	/* a file larger than max-file (16M here): EFBIG, and nothing is published */
	snprintf(s, sizeof(s), "%s/huge", g_mnt);
	fd = open(s, O_WRONLY | O_CREAT, 0644);
	assert_true(fd >= 0);
	static uint8_t chunk[1 << 20];
	ssize_t n = 0;
	for (int i = 0; i < 17 && n >= 0; i++)
		n = write(fd, chunk, sizeof(chunk));
	assert_int_equal(n, -1);
	assert_int_equal(errno, EFBIG);
	assert_int_equal(close(fd), -1); /* the failed file is dropped, and close says so */
	assert_int_equal(errno, EFBIG);
	assert_int_equal(access(s, F_OK), -1);
	/* unsupported but harmless: O_TRUNC replace of a file still works after all that */
	assert_int_equal(mtu_write_file(f, "xyz", 3), 0);
	char r[16];
	assert_int_equal(mtu_read_file(f, r, sizeof(r)), 3);
	assert_memory_equal(r, "xyz", 3);
	kvh_sh("rm -rf '%s' '%s' '%s' '%s/huge'", f, g, d, g_mnt);
}

/* ---- a writer killed mid-file publishes nothing ---- */

static void test_killed_writer(void **state)
{
	(void)state;
	char p[800];
	snprintf(p, sizeof(p), "%s/killed.kvb", g_mnt);
	int pfd[2];
	assert_int_equal(pipe(pfd), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int fd = open(p, O_WRONLY | O_CREAT, 0644);
		char b[65536] = {1};
		ssize_t n = write(fd, b, sizeof(b));
		(void)!write(pfd[1], n == (ssize_t)sizeof(b) ? "w" : "e", 1);
		pause();
		_exit(0);
	}
	char c = 0;
	assert_int_equal(read(pfd[0], &c, 1), 1);
	assert_int_equal(c, 'w');
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	usleep(300000);
	struct stat st;
	assert_int_equal(stat(p, &st), -1);
	assert_int_equal(errno, ENOENT);
	close(pfd[0]);
	close(pfd[1]);
}

/* ---- operator's view: .kvfs/, xattrs, st_blocks, statfs ---- */

static void test_status(void **state)
{
	(void)state;
	assert_int_equal(kvh_sh("test $(grep -c ' up ' '%s/.kvfs/nodes') -eq %d", g_mnt, NNODES),
			 0);
	assert_int_equal(kvh_sh("grep -q '^k = 10' '%s/.kvfs/cluster' && grep -q '^commits = ' "
				"'%s/.kvfs/stats' && grep -q '^max-file = ' '%s/.kvfs/config'",
				g_mnt, g_mnt, g_mnt),
			 0);
	/* k = 0 (this mount's default) says what it means: the cluster's 10+1, everywhere */
	assert_int_equal(kvh_sh("grep -q '^k = 0$' '%s/.kvfs/config' && grep -q '^# .*cluster.s "
				"defaults' '%s/.kvfs/config' && grep -q '^# .*now k = 10, m = 1,' "
				"'%s/.kvfs/config'",
				g_mnt, g_mnt, g_mnt),
			 0);
	assert_int_equal(
	    kvh_sh("ls '%s/.kvfs' | grep -q nodes && ! ls '%s' | grep -q kvfs", g_mnt, g_mnt), 0);
	char p[800], v[4096];
	snprintf(p, sizeof(p), "%s/x.kvb", g_mnt);
	size_t len = 2u << 20;
	uint8_t *b = malloc(len);
	mtu_fill(b, len, 5);
	assert_int_equal(mtu_write_file(p, b, len), 0);
	free(b);
	ssize_t n = getxattr(p, "user.kvfs.layout", v, sizeof(v) - 1);
	assert_true(n > 0);
	v[n] = 0;
	assert_non_null(strstr(v, "k=10 m=1"));
	n = getxattr(p, "user.kvfs.nodes", v, sizeof(v) - 1);
	assert_true(n > 0);
	v[n] = 0;
	assert_non_null(strstr(v, "stripe 0: data "));
	assert_non_null(strstr(v, " parity "));
	assert_non_null(strstr(v, "node "));
	n = getxattr(p, "user.kvfs.atime", v, sizeof(v) - 1);
	assert_true(n > 0);
	n = getxattr(p, "user.kvfs.stored", v, sizeof(v) - 1);
	assert_true(n > 0);
	v[n] = 0;
	unsigned long long stored = strtoull(v, NULL, 10);
	assert_true(stored >= len + len / 10);
	n = listxattr(p, v, sizeof(v));
	assert_true(n > 0);
	assert_int_equal(getxattr(p, "user.nope", v, sizeof(v)), -1);
	assert_int_equal(errno, ENODATA);
	/* No ACLs or SELinux labels here: "not supported" (ls -l then stops asking for the
	 * whole mount), and the user.kvfs.* attributes still answer after it. */
	assert_int_equal(getxattr(p, "system.posix_acl_access", v, sizeof(v)), -1);
	assert_int_equal(errno, EOPNOTSUPP);
	assert_int_equal(getxattr(g_mnt, "system.posix_acl_default", v, sizeof(v)), -1);
	assert_int_equal(errno, EOPNOTSUPP);
	assert_int_equal(getxattr(p, "system.nfs4_acl", v, sizeof(v)), -1);
	assert_int_equal(errno, EOPNOTSUPP);
	assert_int_equal(getxattr(p, "security.selinux", v, sizeof(v)), -1);
	assert_int_equal(errno, EOPNOTSUPP);
	assert_true(getxattr(p, "user.kvfs.layout", v, sizeof(v) - 1) > 0);
	struct stat st;
	assert_int_equal(stat(p, &st), 0);
	assert_int_equal(st.st_size, (off_t)len);
	assert_int_equal((unsigned long long)st.st_blocks, (stored + 511) / 512);
	struct statvfs sv;
	assert_int_equal(statvfs(g_mnt, &sv), 0);
	assert_true(sv.f_blocks > 0 && sv.f_bfree <= sv.f_blocks);
	assert_true(sv.f_files > sv.f_ffree);
	assert_int_equal(sv.f_namemax, 255);
	/* touch of an existing file sets times; of a new one creates it empty */
	assert_int_equal(kvh_sh("touch -d '2020-01-02 03:04:05' '%s' && test $(stat -c %%Y '%s') "
				"-eq $(date -d '2020-01-02 03:04:05' +%%s)",
				p, p),
			 0);
	assert_int_equal(
	    kvh_sh("touch '%s/empty' && test -f '%s/empty' && test ! -s '%s/empty' "
		   "&& : > '%s/empty2' && test -f '%s/empty2' && echo hi > '%s/echo' && "
		   "test \"$(cat '%s/echo')\" = hi",
		   g_mnt, g_mnt, g_mnt, g_mnt, g_mnt, g_mnt, g_mnt),
	    0);
	assert_int_equal(kvh_sh("rm '%s' '%s/empty' '%s/empty2' '%s/echo'", p, g_mnt, g_mnt, g_mnt),
			 0);
}

/* --open-prefetch: the first read open of a file starts its first stripe's GETs (the kernel
 * holds no page of it yet); an open the page cache serves starts none. Every byte checked. */
static void test_open_prefetch(void **state)
{
	(void)state;
	char p[800], q[800];
	snprintf(p, sizeof(p), "%s/pf.kvb", g_mnt);
	snprintf(q, sizeof(q), "%s/pf2.kvb", g_mnt);
	const size_t len = (3u << 20) + 4097; /* more than one stripe */
	uint8_t *want = malloc(len), *got = malloc(len);
	mtu_fill(want, len, 61);
	assert_int_equal(mtu_write_file(p, want, len), 0);
	assert_int_equal(mtu_write_file(q, want, len), 0);
	/* Past the entry timeout (0.5 s): the names are looked up again and now stand for node
	 * ids of the committed files (kept in the page cache), not the writers' temporary ones. */
	usleep(700 * 1000);
	long long c0 = mtu_stat_counter(g_mnt, "open_prefetches");
	assert_true(c0 >= 0);
	assert_int_equal(mtu_read_file(p, got, len), (ssize_t)len);
	assert_memory_equal(got, want, len);
	assert_int_equal(mtu_stat_counter(g_mnt, "open_prefetches"), c0 + 1);
	/* Read again: the kernel's pages answer (keep_cache), nothing is fetched at open. */
	assert_int_equal(mtu_read_file(p, got, len), (ssize_t)len);
	assert_memory_equal(got, want, len);
	assert_int_equal(mtu_stat_counter(g_mnt, "open_prefetches"), c0 + 1);
	/* An open that reads nothing: its prefetch is dropped at close, the next open's read is
	 * whole and right. */
	int fd = open(q, O_RDONLY);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(mtu_stat_counter(g_mnt, "open_prefetches"), c0 + 2);
	memset(got, 0, len);
	assert_int_equal(mtu_read_file(q, got, len), (ssize_t)len);
	assert_memory_equal(got, want, len);
	assert_int_equal(kvh_sh("rm '%s' '%s'", p, q), 0);
	free(want);
	free(got);
}

/* ---- paths of a file being written ---- */

static int stat_wait(const char *p, struct stat *st)
{
	for (int i = 0; i < 100; i++) { /* a commit from the last release: ~ms */
		if (stat(p, st) == 0)
			return 0;
		usleep(20000);
	}
	return -1;
}

static void test_writer_paths(void **state)
{
	(void)state;
	char a[800], b[800], pfd[64];
	snprintf(a, sizeof(a), "%s/wp-a", g_mnt);
	snprintf(b, sizeof(b), "%s/wp-b", g_mnt);
	static uint8_t buf[1000];
	mtu_fill(buf, sizeof(buf), 3);
	int fd = open(a, O_WRONLY | O_CREAT | O_EXCL, 0640);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, buf, sizeof(buf)), (ssize_t)sizeof(buf));
	struct stat st;
	assert_int_equal(fstat(fd, &st), 0); /* the creator sees the buffered size */
	assert_int_equal(st.st_size, (off_t)sizeof(buf));
	assert_int_equal(stat(a, &st), -1); /* nobody finds it by name before the commit */
	assert_int_equal(errno, ENOENT);
	/* a second handle on the same new file shares its writer; reading it is refused */
	snprintf(pfd, sizeof(pfd), "/proc/self/fd/%d", fd);
	int fd2 = open(pfd, O_WRONLY);
	assert_true(fd2 >= 0);
	assert_int_equal(pwrite(fd2, "x", 1, (off_t)sizeof(buf)), 1);
	assert_int_equal(open(pfd, O_RDONLY), -1);
	assert_int_equal(errno, EBUSY);
	/* chmod and times set while writing are applied at the commit */
	assert_int_equal(fchmod(fd, 0604), 0);
	struct timespec ts[2] = {{1234567890, 0}, {1234567890, 0}};
	assert_int_equal(futimens(fd, ts), 0);
	assert_int_equal(close(fd2), 0);
	assert_int_equal(close(fd), 0);
	assert_int_equal(stat_wait(a, &st), 0);
	assert_int_equal(st.st_size, (off_t)sizeof(buf) + 1);
	assert_int_equal(st.st_mode & 07777, 0604);
	assert_int_equal(st.st_mtime, 1234567890);
	/* renamed, then replaced through its new name */
	assert_int_equal(rename(a, b), 0);
	assert_int_equal(mtu_write_file(b, "new", 3), 0);
	char r[8];
	assert_int_equal(mtu_read_file(b, r, sizeof(r)), 3);
	assert_memory_equal(r, "new", 3);
	assert_int_equal(access(a, F_OK), -1);
	assert_int_equal(unlink(b), 0);
}

/* ---- startup: errors reach the caller; background mode ---- */

static void test_lifecycle(void **state)
{
	(void)state;
	char out[800], m2[800];
	snprintf(out, sizeof(out), "%s/start.err", g_cl.dir);
	snprintf(m2, sizeof(m2), "%s/mnt2", g_cl.dir);
	assert_int_equal(mkdir(m2, 0755), 0);
	/* nothing listens on port 1: a clear error and exit 1, nothing mounted */
	assert_int_equal(kvh_sh("'%s' --secret-file '%s' --timeout 1s 127.0.0.1:1 '%s' 2>'%s'",
				g_bin, g_cl.secret_file, m2, out),
			 1);
	assert_int_equal(kvh_sh("grep -q 'cannot reach the metadata server' '%s'", out), 0);
	assert_false(mtu_is_fuse(m2));
	assert_int_equal(kvh_sh("'%s' -o no_such_option=1 --secret-file '%s' '%s' '%s' 2>/dev/null",
				g_bin, g_cl.secret_file, g_cl.meta_addr, m2),
			 2);
	/* config file, then flags, then -o: later wins */
	char cfgf[800];
	snprintf(cfgf, sizeof(cfgf), "%s/mount.conf", g_cl.dir);
	assert_int_equal(kvh_sh("printf 'max-file = 123M\\nattr-timeout = 3s\\n' > '%s'", cfgf), 0);
	assert_int_equal(kvh_sh("'%s' --config '%s' --attr-timeout 4s -o attr_timeout=7,rw "
				"--dump-config > '%s' && grep -q '^max-file = 128974848$' '%s' && "
				"grep -q '^attr-timeout = 7s$' '%s'",
				g_bin, cfgf, out, out, out),
			 0);
	/* background mode returns once mounted, and from then on writes nothing where the
	 * caller's output went (it printed its "mounted" and metrics lines there);
	 * fusermount3 -u ends the daemon */
	char tty[800];
	snprintf(tty, sizeof(tty), "%s/bg-output", g_cl.dir);
	assert_int_equal(kvh_sh("'%s' --secret-file '%s' --metrics-listen 127.0.0.1:0 '%s' '%s' "
				"> '%s' 2>&1",
				g_bin, g_cl.secret_file, g_cl.meta_addr, m2, tty),
			 0);
	assert_true(mtu_is_fuse(m2));
	assert_int_equal(kvh_sh("cat '%s/.kvfs/cluster' >/dev/null", m2), 0);
	usleep(300000);
	assert_int_equal(kvh_sh("test ! -s '%s' || { cat '%s' >&2; false; }", tty, tty), 0);
	assert_int_equal(kvh_sh("fusermount3 -u '%s'", m2), 0);
	assert_false(mtu_is_fuse(m2));
	rmdir(m2);
}

int main(int argc, char **argv)
{
	/* --replace-race: only that test (to run it many times) */
	int race = argc > 1 && strcmp(argv[1], "--replace-race") == 0;
	/* --replace: the replacement tests only */
	int replace = argc > 1 && strcmp(argv[1], "--replace") == 0;
	/* --replace PATTERN: those of them whose name matches (cmocka's * and ? wildcards) */
	if (replace && argc > 2)
		cmocka_set_test_filter(argv[2]);
	/* --only PATTERN: the tests whose name matches */
	if (argc > 2 && strcmp(argv[1], "--only") == 0)
		cmocka_set_test_filter(argv[2]);
	if (mtu_skip())
		return 77;
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_lifecycle),
	    cmocka_unit_test(test_allow_other_perms),
	    cmocka_unit_test(test_refused),
	    cmocka_unit_test(test_status),
	    cmocka_unit_test(test_open_prefetch),
	    cmocka_unit_test(test_killed_writer),
	    cmocka_unit_test(test_writer_paths),
	    cmocka_unit_test(test_no_partial),
	    cmocka_unit_test(test_replace_race),
	    cmocka_unit_test(test_replace_hold),
	    cmocka_unit_test(test_replace_shell),
	    cmocka_unit_test(test_replace_nowait),
	    cmocka_unit_test(test_replace_two_writers),
	    cmocka_unit_test(test_replace_other_mount),
	    cmocka_unit_test(test_replace_append),
	    cmocka_unit_test(test_replace_killed),
	    cmocka_unit_test(test_lease_other_mount),
	    cmocka_unit_test(test_lease_stopped_holder),
	    cmocka_unit_test(test_lease_renewed),
	    cmocka_unit_test(test_lease_pin_cached),
	    cmocka_unit_test(test_lease_pin_inval),
	    cmocka_unit_test(test_lease_pin_meta_restart),
	    cmocka_unit_test(test_tree),
	    cmocka_unit_test(test_concurrent),
	    cmocka_unit_test(test_io_uring),
	    cmocka_unit_test(test_node_kill),
	    cmocka_unit_test(test_nodes_down_close),
	    cmocka_unit_test(test_unmount_inval),
	    cmocka_unit_test(test_buffer_full),
	    cmocka_unit_test(test_splice_write),
	    cmocka_unit_test(test_meta_gone),
	    cmocka_unit_test(test_meta_restart),
	};
	const struct CMUnitTest race_tests[] = {cmocka_unit_test(test_replace_race)};
	const struct CMUnitTest replace_tests[] = {
	    cmocka_unit_test(test_replace_hold),	cmocka_unit_test(test_replace_shell),
	    cmocka_unit_test(test_replace_nowait),	cmocka_unit_test(test_replace_two_writers),
	    cmocka_unit_test(test_replace_other_mount), cmocka_unit_test(test_replace_append),
	    cmocka_unit_test(test_replace_killed),	cmocka_unit_test(test_replace_race),
	};
	if (race)
		return cmocka_run_group_tests(race_tests, mtu_setup, mtu_teardown);
	if (replace)
		return cmocka_run_group_tests(replace_tests, mtu_setup, mtu_teardown);
	return cmocka_run_group_tests(tests, mtu_setup, mtu_teardown);
}
