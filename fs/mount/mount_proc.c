/* The process behind a request, from /proc (mount.h): its thread group, whether it is dying from
 * a signal, and whether it still holds another descriptor of a file.
 *
 * Why a thread and a deadline: on Linux 6.x reading /proc/PID/stat and the links under
 * /proc/PID/fd take the process's exec_update_lock, which execve holds while it closes the
 * O_CLOEXEC descriptors — each close of a file on this mount waits for our answer to its flush,
 * and the flush handler would wait for the lock: both forever. So the look runs on a thread of
 * its own, and the handler waits for it at most PROBE_MS; an abandoned look finishes once the
 * exec goes on (after our answer) and frees itself.
 */
#define KVFS_LOG_TAG "mount"
#include "ktime.h"
#include "log.h"
#include "mount.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PROBE_MS 200

pid_t mnt_proc_tgid(pid_t tid)
{
	if (tid <= 0)
		return 0;
	char path[64], line[128];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)tid);
	FILE *f = fopen(path, "re");
	if (!f)
		return 0;
	pid_t tgid = 0;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, "Tgid:", 5) == 0) {
			tgid = (pid_t)strtol(line + 5, NULL, 10);
			break;
		}
	fclose(f);
	return tgid;
}

int mnt_proc_of(pid_t owner, pid_t tid)
{
	if (owner <= 0 || tid <= 0 || tid == owner)
		return 1;
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/task/%d", (int)owner, (int)tid);
	return access(path, F_OK) == 0;
}

/* PF_EXITING and a signal in exit_code (/proc/PID/stat fields 9 and 52). */
static int stat_says_killed(pid_t pid)
{
	char path[64], buf[2048];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	char *p = strrchr(buf, ')');
	if (!p)
		return 0;
	/* p+2 is field 3 (state); count fields from there. */
	unsigned long long flags = 0, exit_code = 0;
	int field = 3;
	for (char *save = NULL, *t = strtok_r(p + 2, " ", &save); t;
	     t = strtok_r(NULL, " ", &save), field++) {
		if (field == 9)
			flags = strtoull(t, NULL, 10);
		else if (field == 52)
			exit_code = strtoull(t, NULL, 10);
	}
	return (flags & 0x4) && (exit_code & 0x7f) != 0;
}

/* 1 when process pid has a writing descriptor of the file this mount (kernel id mnt_id, mounted on
 * mountpoint) knows as nodeid — the one being closed is already out of its table. A readlink
 * per descriptor picks those under the mountpoint (no request to this mount), and only their
 * fdinfo is read. */
static int holds_file(pid_t pid, int mnt_id, const char *mountpoint, uint64_t nodeid)
{
	char dpath[64];
	snprintf(dpath, sizeof(dpath), "/proc/%d/fd", (int)pid);
	DIR *d = opendir(dpath);
	if (!d)
		return 0;
	size_t mlen = strlen(mountpoint);
	int found = 0;
	for (struct dirent *e; !found && (e = readdir(d));) {
		if (e->d_name[0] == '.')
			continue;
		char p[300], target[CFG_STR_MAX + 64];
		snprintf(p, sizeof(p), "/proc/%d/fd/%s", (int)pid, e->d_name);
		ssize_t n = readlink(p, target, sizeof(target) - 1);
		if (n <= (ssize_t)mlen || memcmp(target, mountpoint, mlen) != 0 ||
		    target[mlen] != '/')
			continue;
		snprintf(p, sizeof(p), "/proc/%d/fdinfo/%s", (int)pid, e->d_name);
		FILE *f = fopen(p, "re");
		if (!f)
			continue;
		char line[128];
		long long id = -1;
		unsigned long long ino = 0;
		unsigned flags = O_RDONLY;
		while (fgets(line, sizeof(line), f)) {
			sscanf(line, "flags: %o", &flags);
			sscanf(line, "mnt_id: %lld", &id);
			sscanf(line, "ino: %llu", &ino);
		}
		fclose(f);
		/* Only writing descriptors: the process's readers of the same inode (the old
		 * version of a file it replaces) are other open files. */
		found = id == mnt_id && ino == nodeid && (flags & O_ACCMODE) != O_RDONLY;
	}
	closedir(d);
	return found;
}

/* One look, shared by the handler and the thread doing it; the last to let go frees it. */
struct probe {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pid_t tid, owner;
	uint64_t nodeid;
	int mnt_id, want_fds;
	char mountpoint[CFG_STR_MAX]; /* copied: an abandoned look may outlive the session */
	struct mnt_close_info res;    /* mu */
	int done, abandoned;	      /* mu */
};

static void probe_free(struct probe *p)
{
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	free(p);
}

static void *probe_main(void *arg)
{
	struct probe *p = arg;
	struct mnt_close_info r = {0, 0};
	r.killed = stat_says_killed(p->tid);
	if (!r.killed && p->want_fds && p->mnt_id > 0)
		r.holds_another = holds_file(p->owner, p->mnt_id, p->mountpoint, p->nodeid);
	pthread_mutex_lock(&p->mu);
	p->res = r;
	p->done = 1;
	int gone = p->abandoned;
	pthread_cond_signal(&p->cv);
	pthread_mutex_unlock(&p->mu);
	if (gone)
		probe_free(p);
	return NULL;
}

void mnt_proc_close_info(const struct mnt *m, pid_t tid, pid_t owner, uint64_t nodeid, int want_fds,
			 struct mnt_close_info *out)
{
	out->killed = 0;
	out->holds_another = 0;
	if (tid <= 0)
		return;
	struct probe *p = calloc(1, sizeof(*p));
	if (!p)
		return;
	pthread_mutex_init(&p->mu, NULL);
	kvfs_cond_init_mono(&p->cv);
	p->tid = tid;
	p->owner = owner > 0 ? owner : tid;
	p->nodeid = nodeid;
	p->mnt_id = m->mnt_id;
	p->want_fds = want_fds;
	memcpy(p->mountpoint, m->mountpoint, sizeof(p->mountpoint));
	pthread_attr_t at;
	pthread_t t;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&at, 256 << 10);
	int rc = pthread_create(&t, &at, probe_main, p);
	pthread_attr_destroy(&at);
	if (rc) {
		probe_free(p);
		return;
	}
	struct timespec until;
	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_nsec += PROBE_MS * 1000000L;
	until.tv_sec += until.tv_nsec / 1000000000L;
	until.tv_nsec %= 1000000000L;
	pthread_mutex_lock(&p->mu);
	while (!p->done && pthread_cond_timedwait(&p->cv, &p->mu, &until) == 0)
		;
	int done = p->done;
	if (done)
		*out = p->res;
	else
		p->abandoned = 1;
	pthread_mutex_unlock(&p->mu);
	if (done) {
		probe_free(p);
		return;
	}
	/* An execve closing its O_CLOEXEC descriptors (see the top): not a kill, and whether a
	 * descriptor without O_CLOEXEC survives it is unknown, so the file waits for its last
	 * release. */
	out->holds_another = want_fds;
	klog_info("close by pid %d: /proc does not answer (an execve closing its descriptors): "
		  "not a kill; the file is published at its last release",
		  (int)tid);
}
