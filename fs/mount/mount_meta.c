/* What the namespace handlers and the file I/O both need from metadata: attribute conversion,
 * the retry while meta is away (kvch's policy), directory times kept across commits, the
 * clock. Below mount_ops.c and mount_io.c: it calls neither. */
#define KVFS_LOG_TAG "mount"
#include "log.h"
#include "mount.h"

#include <errno.h>
#include <string.h>
#include <time.h>

int64_t mnt_now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void ns_to_ts(int64_t ns, struct timespec *t)
{
	t->tv_sec = ns / 1000000000;
	t->tv_nsec = ns % 1000000000;
	if (t->tv_nsec < 0) {
		t->tv_nsec += 1000000000;
		t->tv_sec--;
	}
}

void mnt_owner(const struct mnt *m, const struct kvp_attr *a, struct stat *st)
{
	int own = m->cfg.allow_other && a->uid != KVP_OWNER_NONE;
	st->st_uid = own ? (uid_t)a->uid : m->uid;
	st->st_gid = own ? (gid_t)a->gid : m->gid;
}

void mnt_attr_to_stat(const struct mnt *m, const struct kvp_attr *a, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = a->ino;
	st->st_mode = a->mode;
	st->st_nlink = a->nlink ? a->nlink : 1;
	mnt_owner(m, a, st);
	if (S_ISREG(a->mode)) {
		st->st_size = (off_t)a->size;
		/* What the cluster really stores (data + parity of every stripe), so `du` shows
		 * raw usage; `du --apparent-size` uses st_size. */
		st->st_blocks = (blkcnt_t)((a->stored + 511) / 512);
	}
	/* Directories report size 0, so `du -sb` of a tree equals the sum of its file sizes. */
	st->st_blksize = 1 << 20;
	ns_to_ts(a->mtime_ns, &st->st_mtim);
	ns_to_ts(a->atime_ns, &st->st_atim);
	ns_to_ts(a->ctime_ns, &st->st_ctim);
}

void mnt_retry_start(const struct mnt *m, struct mnt_retry *r)
{
	struct kvch_retry_policy p = KVCH_RETRY_MOUNT;
	p.budget_ms = (int)(m->cfg.meta_retry * 1000);
	kvch_retry_start(&r->r, &p);
}

int mnt_retry(struct mnt *m, int *rc, struct mnt_retry *r)
{
	/* -EREMCHG: every replica of a replicated meta said it does not lead (an election
	 * outlasted libkvfs's own leader hunt): meta is away as much as a refused connection. */
	if (!kvch_is_transport(*rc) && *rc != -EREMCHG)
		return 0;
	if (!kvch_retry_wait(&r->r, *rc)) {
		klog_warn("metadata server %s: %s; answering EIO after %.1f s (%d retries, "
			  "--meta-retry %gs)",
			  m->meta_addr, kvp_strerror(*rc),
			  (double)(r->r.p.budget_ms - kvch_retry_left_ms(&r->r)) / 1000,
			  r->r.retries, m->cfg.meta_retry);
		*rc = -EIO;
		return 0;
	}
	if (r->r.retries == 1)
		klog_warn("metadata server %s: %s; retrying for up to %gs", m->meta_addr,
			  kvp_strerror(*rc), m->cfg.meta_retry);
	atomic_fetch_add_explicit(&m->n.retries, 1, memory_order_relaxed);
	return 1;
}

void mnt_dirtimes_note(struct mnt *m, uint64_t ino, uint32_t valid, int64_t mtime_ns,
		       int64_t atime_ns)
{
	pthread_mutex_lock(&m->dt_lock);
	struct mnt_dirtime *d = &m->dt[m->dt_next++ % (sizeof(m->dt) / sizeof(m->dt[0]))];
	*d = (struct mnt_dirtime){.ino = ino,
				  .noted_ns = mnt_now_ns(),
				  .valid = valid & (KVP_SET_MTIME | KVP_SET_ATIME),
				  .mtime_ns = mtime_ns,
				  .atime_ns = atime_ns};
	pthread_mutex_unlock(&m->dt_lock);
}

void mnt_dirtimes_restore(struct mnt *m, uint64_t dir, int64_t created_ns)
{
	struct mnt_dirtime last = {0};
	pthread_mutex_lock(&m->dt_lock);
	for (size_t i = 0; i < sizeof(m->dt) / sizeof(m->dt[0]); i++)
		if (m->dt[i].ino == dir && m->dt[i].valid && m->dt[i].noted_ns >= created_ns &&
		    m->dt[i].noted_ns >= last.noted_ns)
			last = m->dt[i];
	pthread_mutex_unlock(&m->dt_lock);
	if (!last.valid)
		return;
	struct kvp_attr a;
	int rc = kvc_setattr(m->c, dir, last.valid, 0, last.mtime_ns, last.atime_ns, &a);
	if (rc)
		klog_warn("directory inode %llu: setting its times again after a commit in it "
			  "failed: %s",
			  (unsigned long long)dir, kvp_strerror(rc));
}
