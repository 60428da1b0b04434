/* kvfs-mount [options] META_ADDR MOUNTPOINT — the cluster as a FUSE filesystem.
 *
 * Options come from one table (common/cfg.h): defaults, then --config FILE, then --flags,
 * then -o name=value,... (mount(8) style; '_' and '-' are the same). -f stays in the
 * foreground, -d adds FUSE request tracing.
 *
 * Lifecycle: in the background mode the process forks first; the child connects to meta,
 * mounts, and only then tells the parent, which exits 0 — or prints the child's error and
 * exits 1 — so the caller learns whether the mount worked. Unmount with `fusermount3 -u
 * MOUNTPOINT` (or SIGINT/SIGTERM to the daemon): the loop ends, open writers are dropped,
 * the daemon exits 0. */
#define KVFS_LOG_TAG "mount"
#include "log.h"
#include "mount.h"
#include "mount_metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *const ignored_o[] = {
    "rw",   "defaults", "nodev", "nosuid", "noatime", "relatime", "_netdev", "auto", "noauto",
    "user", "nouser",	"exec",	 "noexec", "dev",     "suid",	  "async",   NULL};

/* Applies one -o list: "a=b,c,d=e". A bare name is a boolean set to true. */
static int apply_o(struct mnt_cfg *cfg, char *list)
{
	for (char *save = NULL, *t = strtok_r(list, ",", &save); t;
	     t = strtok_r(NULL, ",", &save)) {
		int skip = 0;
		for (int i = 0; ignored_o[i]; i++)
			skip |= strcmp(t, ignored_o[i]) == 0;
		if (skip || !*t)
			continue;
		char *eq = strchr(t, '=');
		if (eq)
			*eq = 0;
		for (char *p = t; *p; p++)
			if (*p == '_')
				*p = '-';
		int rc = cfg_set(mnt_cfg_opts, cfg, t, eq ? eq + 1 : "true");
		if (rc == -ENOENT) {
			fprintf(stderr, "kvfs-mount: unknown option -o %s (see --help)\n", t);
			return -EINVAL;
		}
		if (rc) {
			fprintf(stderr, "kvfs-mount: bad value for -o %s\n", t);
			return -EINVAL;
		}
	}
	return 0;
}

/* Splits -o / -f / -d out of argv (cfg_parse takes the rest), parses, applies them.
 * Returns 0, 1 (help printed) or -EINVAL. */
static int parse_args(int argc, char **argv, struct mnt_cfg *cfg, int *npos)
{
	char **rest = calloc((size_t)argc + 1, sizeof(char *));
	char **olist = calloc((size_t)argc + 1, sizeof(char *));
	if (!rest || !olist) {
		free(rest);
		free(olist);
		return -ENOMEM;
	}
	int nr = 0, no = 0, fg = 0, dbg = 0, dump = 0, rc = 0;
	rest[nr++] = argv[0];
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "-o") == 0) {
			if (i + 1 >= argc) {
				fprintf(stderr, "kvfs-mount: -o needs a value\n");
				rc = -EINVAL;
				goto out;
			}
			olist[no++] = argv[++i];
		} else if (strncmp(argv[i], "-o", 2) == 0) {
			olist[no++] = argv[i] + 2;
		} else if (strcmp(argv[i], "-f") == 0) {
			fg = 1;
		} else if (strcmp(argv[i], "-d") == 0) {
			dbg = 1;
		} else if (strcmp(argv[i], "--dump-config") == 0) {
			dump = 1; /* after -o is applied, below */
		} else if (strcmp(argv[i], "-h") == 0) {
			rest[nr++] = "--help";
		} else {
			rest[nr++] = argv[i];
		}
	}
	rc = cfg_parse(mnt_cfg_opts, cfg, nr, rest, "META_ADDR MOUNTPOINT", npos);
	if (rc == 1)
		printf("\n  -o name=value,...      any option above, mount(8) style\n"
		       "  -f                     foreground;  -d  debug (FUSE trace)\n");
	for (int i = 0; rc == 0 && i < no; i++)
		rc = apply_o(cfg, olist[i]);
	if (fg)
		cfg->foreground = 1;
	if (dbg)
		cfg->debug = cfg->foreground = 1;
	/* positional arguments back into argv[1..] */
	for (int i = 0; rc == 0 && i < *npos; i++)
		argv[1 + i] = rest[1 + i];
	if (rc == 0 && dump) {
		cfg_dump(mnt_cfg_opts, cfg, stdout);
		rc = 1;
	}
out:
	free(rest);
	free(olist);
	return rc;
}

/* The bdi of our mount: /proc/self/mountinfo "id parent MAJ:MIN root mountpoint ...". Read
 * without touching the mount itself (the session loop is not running yet). */
static void set_readahead(const char *mnt, uint64_t bytes)
{
	FILE *f = fopen("/proc/self/mountinfo", "r");
	if (!f)
		return;
	char line[4096], dev[64] = "";
	while (fgets(line, sizeof(line), f)) {
		char d[64], root[1024], mp[2048];
		if (sscanf(line, "%*s %*s %63s %1023s %2047s", d, root, mp) != 3)
			continue;
		if (strcmp(mp, mnt) == 0)
			snprintf(dev, sizeof(dev), "%s", d); /* the last (topmost) mount wins */
	}
	fclose(f);
	if (!dev[0])
		return;
	char path[128];
	snprintf(path, sizeof(path), "/sys/class/bdi/%s/read_ahead_kb", dev);
	FILE *ra = fopen(path, "w");
	if (!ra) {
		klog_info("read-ahead left at the kernel default (%s: %s)", path, strerror(errno));
		return;
	}
	fprintf(ra, "%llu\n", (unsigned long long)(bytes / 1024));
	if (fclose(ra) != 0)
		klog_info("read-ahead not set (%s)", strerror(errno));
}

/* Background: the child reports "0" or an error text through the pipe. */
static void report(int fd, const char *msg)
{
	if (fd < 0)
		return;
	ssize_t n = write(fd, msg, strlen(msg));
	(void)n;
	close(fd);
}

static int wait_child(int rfd, pid_t pid)
{
	char buf[1024];
	size_t len = 0;
	ssize_t n;
	while (len < sizeof(buf) - 1 && (n = read(rfd, buf + len, sizeof(buf) - 1 - len)) != 0) {
		if (n < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		len += (size_t)n;
	}
	buf[len] = 0;
	close(rfd);
	if (len == 1 && buf[0] == '0')
		return 0;
	int st;
	waitpid(pid, &st, 0);
	fprintf(stderr, "kvfs-mount: %s\n", len ? buf : "the mount process died during startup");
	return 1;
}

/* The id /proc/PID/fdinfo gives for descriptors of files on this mount: the last mountinfo line
 * of a kvfs FUSE file system on mountpoint (a mount stacked on an older one comes after it).
 * 0 when not found: then a close is never known to leave another descriptor (mount_io.c). */
static int own_mnt_id(const char *mountpoint)
{
	FILE *f = fopen("/proc/self/mountinfo", "r");
	if (!f)
		return 0;
	char line[4096], point[4096], *dash;
	int id = 0, found = 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%d %*d %*s %*s %4095s", &id, point) == 2 &&
		    strcmp(point, mountpoint) == 0 && (dash = strstr(line, " - fuse.kvfs ")))
			found = id;
	fclose(f);
	return found;
}

static void redirect_stdio(const char *logfile)
{
	int nul = open("/dev/null", O_RDWR);
	int log = logfile[0] ? open(logfile, O_WRONLY | O_CREAT | O_APPEND, 0644) : -1;
	if (nul >= 0) {
		dup2(nul, 0);
		dup2(nul, 1);
		dup2(log >= 0 ? log : nul, 2);
	}
	if (nul > 2)
		close(nul);
	if (log > 2)
		close(log);
}

/* Ends the dentry-invalidation thread before the session goes (mount.h, mount_inval.c).
 *
 * Why this is safe: the thread's notification in flight (fuse_lowlevel_notify_inval_entry) can
 * block in the kernel on the directory's inode lock, held by a process inside a syscall on this
 * mount that waits for one of our replies. When the loop ended because the file system was
 * unmounted (or its connection aborted), the kernel has failed every such request (ENOTCONN),
 * so the holder lets go and the notification returns. When it ended on a signal, the mount is
 * still there: a request the workers did not read before they stopped stays unanswered, and
 * neither closing /dev/fuse (the notification's write holds a reference to it) nor a lazy
 * unmount would end that wait. So this answers requests itself, one at a time, until the
 * thread has returned; nothing new is queued meanwhile (mnt_inval_close). Then the join cannot
 * block, and the session is destroyed only after it: nothing can touch the session later (the
 * old code gave up after 2 s and destroyed the session under a thread still using it). */
static void finish_inval(struct mnt *m)
{
	mnt_inval_close(m);
	/* A second signal must not end a request read below before it is answered. */
	signal(SIGINT, SIG_IGN);
	signal(SIGTERM, SIG_IGN);
	signal(SIGHUP, SIG_IGN);
	struct fuse_buf fb;
	memset(&fb, 0, sizeof(fb));
	unsigned long served = 0;
	while (mnt_inval_busy(m)) {
		struct pollfd p = {.fd = fuse_session_fd(m->se), .events = POLLIN};
		int n = poll(&p, 1, 50);
		if (n <= 0)
			continue; /* timeout or EINTR: look at the thread again */
		if (p.revents & (POLLERR | POLLHUP | POLLNVAL))
			break; /* the connection is gone: the notification returns on its own */
		fuse_session_reset(m->se); /* receive_buf drops what it reads once exited */
		int r = fuse_session_receive_buf(m->se, &fb);
		if (r > 0) {
			fuse_session_process_buf(m->se, &fb);
			served++;
		} else if (r == -ENODEV) {
			break; /* unmounted, as above */
		}
	}
	free(fb.mem);
	if (served)
		klog_info("answered %lu requests while a dentry notification finished", served);
	kvc_lease_mute(m->lease); /* its lost() queues notifications: none from here on */
	mnt_inval_stop(m);
}

/* Connects, mounts, serves until unmounted. wfd >= 0: the background parent waits there for
 * "0" or an error text. Returns the exit status. */
static int serve(struct mnt *m, const struct kvp_secret *secret, int wfd)
{
	char err[1024];
	int rc, status = 1;
	struct kvc_opts ko = {
	    .meta_addr = m->meta_addr,
	    .secret = secret,
	    .timeout_ms = (int)(m->cfg.timeout * 1000),
	    .k = (int)m->cfg.k,
	    .m = (int)m->cfg.m,
	    .max_chunk = (uint32_t)m->cfg.chunk,
	    .max_file = m->cfg.max_file,
	    .max_buffered = m->cfg.max_buffered,
	};
	/* The threads started before the loop (libkvfs's, metrics, dentry invalidation) inherit
	 * these blocked, so the signals that unmount reach the main thread, which waits in the
	 * loop and leaves it at once (libfuse's workers block them too); on another thread the
	 * loop would only notice at the next request, which libfuse then drops unanswered. */
	sigset_t quit, oldmask;
	sigemptyset(&quit);
	sigaddset(&quit, SIGINT);
	sigaddset(&quit, SIGTERM);
	sigaddset(&quit, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &quit, &oldmask);
	if ((rc = kvc_open(&ko, &m->c))) {
		snprintf(err, sizeof(err), "cannot reach the metadata server at %s: %s%s",
			 m->meta_addr, kvp_strerror(rc),
			 rc == -EACCES ? " (wrong cluster secret?)" : "");
		goto fail;
	}
	if (m->cfg.lease_after > 0) {
		struct kvc_lease_opts lo = {.after = (int)m->cfg.lease_after,
					    .ms = (uint32_t)(m->cfg.lease * 1000),
					    .pin_ms = (uint32_t)(m->cfg.lease_pin * 1000),
					    .lost = mnt_lease_lost,
					    .arg = m};
		if ((rc = kvc_lease_open(m->c, &lo, &m->lease)))
			klog_warn("no directory leases (%s): every lookup asks meta",
				  kvp_strerror(rc));
	}
	m->uid = getuid();
	m->gid = getgid();
	m->start_ns = mnt_now_ns();
	atomic_init(&m->next_temp, 1);
	pthread_mutex_init(&m->rel_lock, NULL);
	pthread_cond_init(&m->rel_cond, NULL);
	pthread_mutex_init(&m->cand_lock, NULL);
	pthread_mutex_init(&m->dt_lock, NULL);
	pthread_mutex_init(&m->fh_lock, NULL);
	if (mnt_itab_create(&m->itab)) {
		snprintf(err, sizeof(err), "out of memory");
		goto fail_kvc;
	}
	/* FUSE options are comma-separated: a replicated meta's list is named by its first
	 * address, "+" marking that more follow. */
	char fsopts[512];
	int first = (int)strcspn(m->meta_addr, ",");
	snprintf(fsopts, sizeof(fsopts), "fsname=kvfs:%.*s%s,subtype=kvfs,max_read=%u%s", first,
		 m->meta_addr, m->meta_addr[first] ? "+" : "", 1u << 20,
		 m->cfg.allow_other ? ",allow_other,default_permissions" : "");
	char *fargv[] = {"kvfs-mount", "-o", fsopts, m->cfg.debug ? "-d" : NULL, NULL};
	struct fuse_args fa = FUSE_ARGS_INIT(m->cfg.debug ? 4 : 3, fargv);
	const struct fuse_lowlevel_ops *ops = &mnt_ops;
	if ((rc = mnt_metrics_start(m, &ops))) {
		fuse_opt_free_args(&fa);
		snprintf(err, sizeof(err), "cannot serve metrics on %s: %s", m->cfg.metrics_listen,
			 kvp_strerror(rc));
		goto fail_itab;
	}
	m->se = fuse_session_new(&fa, ops, sizeof(*ops), m);
	fuse_opt_free_args(&fa);
	if (!m->se) {
		snprintf(err, sizeof(err), "cannot create the FUSE session");
		goto fail_itab;
	}
	if (fuse_set_signal_handlers(m->se) != 0) {
		snprintf(err, sizeof(err), "cannot install signal handlers");
		goto fail_se;
	}
	if (fuse_session_mount(m->se, m->mountpoint) != 0) {
		snprintf(err, sizeof(err),
			 "cannot mount on %s (is /dev/fuse usable and the directory not already "
			 "a mount? a stale one: fusermount3 -u %s)",
			 m->mountpoint, m->mountpoint);
		goto fail_sig;
	}
	set_readahead(m->mountpoint, m->cfg.readahead);
	m->mnt_id = own_mnt_id(m->mountpoint);
	klog_info("mounted %s on %s (pid %d)", m->meta_addr, m->mountpoint, (int)getpid());
	if (wfd >= 0) {
		report(wfd, "0");
		wfd = -1;
		if (chdir("/") != 0)
			klog_warn("chdir /: %s", strerror(errno));
	}
	if ((rc = mnt_inval_start(m)) != 0)
		klog_warn("no dentry invalidation thread (%s): replaced files show after "
			  "--entry-timeout",
			  strerror(-rc));
	pthread_sigmask(SIG_SETMASK, &oldmask, NULL);
	struct fuse_loop_config *lc = fuse_loop_cfg_create();
	fuse_loop_cfg_set_max_threads(lc, (unsigned)m->cfg.threads);
	fuse_loop_cfg_set_idle_threads(lc, (unsigned)(m->cfg.threads / 2 + 1));
	fuse_loop_cfg_set_clone_fd(lc, 0);
	rc = fuse_session_loop_mt(m->se, lc);
	fuse_loop_cfg_destroy(lc);
	finish_inval(m);
	klog_info("unmounting %s", m->mountpoint);
	fuse_session_unmount(m->se);
	mnt_fh_drop_all(m);
	/* libfuse returns the signal number when SIGINT/SIGTERM/SIGHUP ended the loop: that is
	 * an unmount asked for, like fusermount3 -u (exit 0); -errno is a failure. */
	status = rc >= 0 ? 0 : 1;
	err[0] = 0;
fail_sig:
	fuse_remove_signal_handlers(m->se);
fail_se:
	fuse_session_destroy(m->se);
fail_itab:
	mnt_metrics_stop(m);
	mnt_itab_destroy(m->itab);
	pthread_cond_destroy(&m->rel_cond);
	pthread_mutex_destroy(&m->rel_lock);
	pthread_mutex_destroy(&m->cand_lock);
	pthread_mutex_destroy(&m->dt_lock);
	pthread_mutex_destroy(&m->fh_lock);
fail_kvc:
	kvc_lease_close(m->lease);
	kvc_close(m->c);
fail:
	pthread_sigmask(SIG_SETMASK, &oldmask, NULL);
	if (status) {
		if (wfd < 0)
			fprintf(stderr, "kvfs-mount: %s\n", err);
		report(wfd, err);
	}
	return status;
}

int main(int argc, char **argv)
{
	struct mnt mstore, *m = &mstore; /* lives as long as the process serves */
	memset(m, 0, sizeof(*m));
	int npos = 0, rc = parse_args(argc, argv, &m->cfg, &npos);
	if (rc)
		return rc == 1 ? 0 : 2;
	if (npos != 2) {
		fprintf(stderr, "usage: kvfs-mount [options] META_ADDR MOUNTPOINT (see --help)\n");
		return 2;
	}
	kvfs_log_set_level((int)m->cfg.log_level);
	if (strlen(argv[1]) >= sizeof(m->meta_addr)) {
		fprintf(stderr, "kvfs-mount: META_ADDR longer than %zu bytes\n",
			sizeof(m->meta_addr) - 1);
		return 2;
	}
	snprintf(m->meta_addr, sizeof(m->meta_addr), "%s", argv[1]);
	char mp[PATH_MAX];
	if (!realpath(argv[2], mp)) {
		fprintf(stderr, "kvfs-mount: mountpoint %s: %s\n", argv[2], strerror(errno));
		return 1;
	}
	if (strlen(mp) >= sizeof(m->mountpoint)) {
		fprintf(stderr, "kvfs-mount: mountpoint path too long: %s\n", mp);
		return 1;
	}
	memcpy(m->mountpoint, mp, strlen(mp) + 1);
	struct kvp_secret secret;
	if (!m->cfg.secret_file[0]) {
		fprintf(stderr, "kvfs-mount: --secret-file is required (the cluster secret)\n");
		return 2;
	}
	if (kvp_secret_load(m->cfg.secret_file, &secret)) {
		fprintf(stderr, "kvfs-mount: cannot load the secret from %s\n", m->cfg.secret_file);
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	int wfd = -1;
	if (!m->cfg.foreground) {
		/* Fork before any thread exists; the child reports how the mount went. */
		int p[2];
		if (pipe(p)) {
			perror("kvfs-mount: pipe");
			return 1;
		}
		pid_t pid = fork();
		if (pid < 0) {
			perror("kvfs-mount: fork");
			return 1;
		}
		if (pid > 0) {
			close(p[1]);
			return wait_child(p[0], pid);
		}
		close(p[0]);
		wfd = p[1];
		setsid();
		/* From here on the daemon writes nothing to the caller's terminal (which the caller
		 * may have long left): its log goes to --log-file, or nowhere; a failure to start
		 * reaches the waiting parent through the pipe, which prints it. */
		redirect_stdio(m->cfg.log_file);
	}
	return serve(m, &secret, wfd);
}
