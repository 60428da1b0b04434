/* Dentry invalidation off the request path (see mount.h).
 *
 * A commit runs inside a FLUSH or RELEASE request; the kernel's inval_entry takes the directory's
 * inode lock, which another process may hold while it waits for one of our replies. Sending it
 * from this thread keeps the workers free to send that reply. The queue is a small ring: a name
 * that does not fit is dropped, which only means the kernel keeps it until --entry-timeout. */
#define KVFS_LOG_TAG "mount"
#include "log.h"
#include "ktime.h"
#include "mount.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define INVAL_SLOTS 256

struct inval_item {
	uint64_t parent;
	char name[KVP_NAME_MAX + 1];
};

struct mnt_inval {
	struct fuse_session *se;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond, done;
	struct inval_item q[INVAL_SLOTS]; /* lock */
	uint64_t queued, finished;	  /* lock; items queued / sent so far (= tickets) */
	uint64_t last_failed;		  /* lock; the last ticket the kernel refused (0: none) */
	unsigned head, n;		  /* lock */
	int stop;			  /* lock; no more queuing, the thread ends */
	int exited;			  /* lock; the thread has returned (done broadcast) */
	unsigned long long sent, dropped; /* lock */
	/* Tests only (env KVFS_MOUNT_TEST_INVAL_DELAY_MS): each notification waits this long
	 * after it is taken off the queue, so a test can have one in flight at unmount. */
	int delay_ms;
};

static void *inval_main(void *arg)
{
	struct mnt_inval *v = arg;
	struct inval_item it;
	pthread_mutex_lock(&v->lock);
	for (;;) {
		while (!v->stop && v->n == 0)
			pthread_cond_wait(&v->cond, &v->lock);
		if (v->stop)
			break;
		it = v->q[v->head];
		v->head = (v->head + 1) % INVAL_SLOTS;
		v->n--;
		pthread_mutex_unlock(&v->lock);
		if (v->delay_ms > 0) {
			klog_info("test hook: notification for '%s' held %d ms", it.name,
				  v->delay_ms);
			usleep((useconds_t)v->delay_ms * 1000);
		}
		/* -ENOENT (the kernel has no such name cached) is the common, harmless answer. */
		int rc =
		    fuse_lowlevel_notify_inval_entry(v->se, it.parent, it.name, strlen(it.name));
		if (rc && rc != -ENOENT)
			klog_debug("inval_entry %llu/%s: %s", (unsigned long long)it.parent,
				   it.name, strerror(-rc));
		pthread_mutex_lock(&v->lock);
		v->sent++;
		v->finished++; /* FIFO, one thread: tickets finish in order */
		if (rc && rc != -ENOENT)
			v->last_failed = v->finished;
		pthread_cond_broadcast(&v->done);
	}
	v->exited = 1;
	pthread_cond_broadcast(&v->done);
	pthread_mutex_unlock(&v->lock);
	return NULL;
}

int mnt_inval_start(struct mnt *m)
{
	struct mnt_inval *v = calloc(1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	v->se = m->se;
	pthread_mutex_init(&v->lock, NULL);
	pthread_cond_init(&v->cond, NULL);
	pthread_cond_init(&v->done, NULL);
	const char *d = getenv("KVFS_MOUNT_TEST_INVAL_DELAY_MS");
	v->delay_ms = d ? atoi(d) : 0;
	int rc = pthread_create(&v->thread, NULL, inval_main, v);
	if (rc) {
		pthread_cond_destroy(&v->done);
		pthread_cond_destroy(&v->cond);
		pthread_mutex_destroy(&v->lock);
		free(v);
		return -rc;
	}
	m->inval = v;
	return 0;
}

void mnt_inval_close(struct mnt *m)
{
	struct mnt_inval *v = m->inval;
	if (!v)
		return;
	pthread_mutex_lock(&v->lock);
	v->stop = 1;
	pthread_cond_broadcast(&v->cond);
	pthread_cond_broadcast(&v->done); /* committers waiting for theirs stop waiting */
	pthread_mutex_unlock(&v->lock);
}

int mnt_inval_busy(struct mnt *m)
{
	struct mnt_inval *v = m->inval;
	if (!v)
		return 0;
	pthread_mutex_lock(&v->lock);
	int busy = !v->exited;
	pthread_mutex_unlock(&v->lock);
	return busy;
}

void mnt_inval_stop(struct mnt *m)
{
	struct mnt_inval *v = m->inval;
	if (!v)
		return;
	mnt_inval_close(m);
	/* No timeout, never abandoned: the thread uses the session, which the caller destroys
	 * next. It ends once its notification in flight (if any) does; that one can only wait
	 * for a directory lock held by a process whose request the caller keeps answering, or
	 * that the aborted connection has failed (see serve() in mount_main.c). */
	pthread_join(v->thread, NULL);
	klog_debug("dentry invalidations: %llu sent, %llu dropped", v->sent, v->dropped);
	pthread_cond_destroy(&v->done);
	pthread_cond_destroy(&v->cond);
	pthread_mutex_destroy(&v->lock);
	free(v);
	m->inval = NULL;
}

int mnt_inval_queue(struct mnt *m, uint64_t parent, const char *name, uint64_t *ticket)
{
	struct mnt_inval *v = m->inval;
	if (!v || !name[0])
		return -ENOENT;
	int rc = 0;
	pthread_mutex_lock(&v->lock);
	if (v->stop) {
		rc = -ENOENT; /* as mount.h says: stopping */
	} else if (v->n == INVAL_SLOTS) {
		v->dropped++;
		rc = -ENOSPC;
	} else {
		struct inval_item *it = &v->q[(v->head + v->n) % INVAL_SLOTS];
		it->parent = parent;
		snprintf(it->name, sizeof(it->name), "%s", name);
		v->n++;
		*ticket = ++v->queued;
		pthread_cond_signal(&v->cond);
	}
	pthread_mutex_unlock(&v->lock);
	return rc;
}

int mnt_inval_wait(struct mnt *m, uint64_t ticket, int wait_ms)
{
	struct mnt_inval *v = m->inval;
	if (!v)
		return -ENOENT;
	int rc = 0;
	pthread_mutex_lock(&v->lock);
	if (v->finished < ticket && wait_ms > 0) {
		struct timespec until;
		kvfs_deadline(&until, CLOCK_REALTIME, wait_ms);
		while (v->finished < ticket && !v->stop)
			if (pthread_cond_timedwait(&v->done, &v->lock, &until) == ETIMEDOUT)
				break;
	}
	if (v->finished < ticket)
		rc = v->stop ? -ENOENT : -ETIMEDOUT;
	else if (v->last_failed >= ticket)
		rc = -EIO; /* this one or a later one failed: do not count on this one */
	pthread_mutex_unlock(&v->lock);
	return rc;
}

int mnt_inval_entry(struct mnt *m, uint64_t parent, const char *name, int wait_ms)
{
	uint64_t t;
	int rc = mnt_inval_queue(m, parent, name, &t);
	if (rc == 0 && wait_ms > 0)
		rc = mnt_inval_wait(m, t, wait_ms);
	return rc == -EIO ? 0 : rc; /* sent (the kernel's answer is only logged) */
}

void mnt_lease_lost(void *arg, uint64_t dir, const char *names, size_t n)
{
	struct mnt *m = arg;
	int64_t deadline = mnt_now_ns() + 500 * 1000000ll;
	uint64_t t = 0;
	size_t queued = 0;
	for (size_t i = 0; i < n; i++, names += strlen(names) + 1) {
		int rc;
		/* A full queue (a big directory) drains at the kernel's pace: wait for room rather
		 * than leave a name the kernel would keep for --lease-pin. */
		while ((rc = mnt_inval_queue(m, dir, names, &t)) == -ENOSPC &&
		       mnt_now_ns() < deadline)
			usleep(1000);
		if (rc == 0)
			queued++;
	}
	atomic_fetch_add_explicit(&m->n.lease_invals, queued, memory_order_relaxed);
	if (queued < n)
		klog_warn("directory %llu: %zu of %zu names left in the kernel's cache after its "
			  "lease ended (they run out after --lease-pin)",
			  (unsigned long long)dir, n - queued, n);
	/* Our own change in flight may be what holds the directory's lock in the kernel, waiting
	 * for meta, which waits for this revocation: do not wait for the notification then (the
	 * kernel updates its own names for that change; the others follow a moment later). Nor
	 * for a commit of ours: a writer's close would pay for invalidating every pinned name of
	 * its directory, which its own file does not need (its name is dropped by the commit).
	 * The same for a commit from a release: a negative lookup waits for those
	 * (mnt_wait_release_commits) with the directory's lock held shared. */
	pthread_mutex_lock(&m->rel_lock);
	int busy = atomic_load(&m->ns_busy) > 0 || m->rel_commits > 0;
	pthread_mutex_unlock(&m->rel_lock);
	int64_t left_ms = (deadline - mnt_now_ns()) / 1000000;
	if (t && left_ms > 0 && !busy)
		mnt_inval_wait(m, t, (int)left_ms);
}
