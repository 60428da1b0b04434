/* The fuse_lowlevel_ops table and the namespace handlers: lookup, forget, getattr, setattr,
 * readdir(plus), mkdir, rmdir, unlink, rename, statfs, access, and the refusals (link,
 * symlink, mknod, setxattr). File I/O is in mount_io.c, .kvfs/ and xattrs in mount_status.c.
 * Every handler answers its request exactly once. */
#define KVFS_LOG_TAG "mount"
#include "ktime.h"
#include "log.h"
#include "mount.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

void mnt_wait_release_commits(struct mnt *m)
{
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 2;
	pthread_mutex_lock(&m->rel_lock);
	while (m->rel_commits > 0)
		if (pthread_cond_timedwait(&m->rel_cond, &m->rel_lock, &until) == ETIMEDOUT)
			break;
	pthread_mutex_unlock(&m->rel_lock);
}

/* The metadata inode a node id stands for (0: a new file not committed), and its writer
 * while one is running (referenced; caller puts). */
static uint64_t resolve(struct mnt *m, uint64_t nodeid, struct mnt_wfile **wf, int *redirected)
{
	struct mnt_inode_info ii;
	if (wf)
		*wf = NULL;
	if (redirected)
		*redirected = 0;
	if (mnt_itab_get(m->itab, nodeid, &ii) != 0)
		return (nodeid & MNT_TEMP_BASE) ? 0 : nodeid;
	if (wf)
		*wf = ii.wf;
	else
		mnt_wfile_put(ii.wf);
	if (redirected)
		*redirected = ii.redirected;
	return ii.ino;
}

static void fill_entry(struct mnt *m, struct fuse_entry_param *e, const struct kvp_attr *a)
{
	memset(e, 0, sizeof(*e));
	e->ino = a->ino;
	mnt_attr_to_stat(m, a, &e->attr);
	e->entry_timeout = m->cfg.entry_timeout;
	e->attr_timeout = m->cfg.attr_timeout;
}

/* The largest max_write (<= want) whose whole request, with libfuse's 4 KiB header page, fits
 * a pipe this process may size: want where F_SETPIPE_SZ can reach it (CAP_SYS_RESOURCE, or
 * pipe-max-size large enough), else pipe-max-size less the header. 0: no useful splice. */
static unsigned splice_max_write(unsigned want)
{
	enum { HDR = 4096 };
	int p[2];
	if (pipe2(p, O_CLOEXEC))
		return 0;
	long got = fcntl(p[0], F_SETPIPE_SZ, (int)(want + HDR));
	if (got < 0) {
		FILE *f = fopen("/proc/sys/fs/pipe-max-size", "r");
		unsigned long max = 0;
		if (f && fscanf(f, "%lu", &max) != 1)
			max = 0;
		if (f)
			fclose(f);
		got = max >= 2 * HDR
			  ? fcntl(p[0], F_SETPIPE_SZ, (int)(max < want + HDR ? max : want + HDR))
			  : -1;
	}
	close(p[0]);
	close(p[1]);
	if (got < 2 * HDR)
		return 0;
	unsigned w = (unsigned)got - HDR;
	return w < want ? w : want;
}

static void mnt_init(void *ud, struct fuse_conn_info *conn)
{
	struct mnt *m = ud;
	/* 1 MiB requests (libfuse caps max_write at its buffer, max_pages follows). */
	conn->max_write = 1u << 20;
	conn->max_read = 1u << 20; /* must match the max_read mount option */
	conn->max_readahead =
	    (unsigned)(m->cfg.readahead < (64u << 20) ? m->cfg.readahead : (64u << 20));
	conn->max_background = 64;
	conn->congestion_threshold = 48;
	conn->time_gran = 1;
	unsigned want = FUSE_CAP_ASYNC_READ | FUSE_CAP_PARALLEL_DIROPS | FUSE_CAP_ASYNC_DIO;
	/* SPLICE_READ: a write's data is spliced out of /dev/fuse into a pipe (page references,
	 * no copy) and read from there straight into the file's buffer (mnt_write_buf); else the
	 * kernel copies it into libfuse's buffer (pinning that buffer's pages first) and we copy
	 * it again. The pipe must hold a whole request, max_write + 4 KiB: where it cannot grow
	 * that far, max_write shrinks to fit rather than lose the splice. */
	unsigned splice_max = m->cfg.splice_write ? splice_max_write(conn->max_write) : 0;
	if (splice_max && (conn->capable & FUSE_CAP_SPLICE_READ)) {
		want |= FUSE_CAP_SPLICE_READ;
		conn->max_write = splice_max;
	} else {
		conn->want &= ~(unsigned)FUSE_CAP_SPLICE_READ;
	}
	if (m->cfg.readdirplus)
		want |= FUSE_CAP_READDIRPLUS;
	conn->want |= want & conn->capable;
	/* Files are immutable: never drop the page cache because an mtime moved. */
	/* No atomic O_TRUNC: with it the kernel zeroes the size of the inode that readers of the
	 * old version share as soon as a replacement is opened. Without it the kernel sends a
	 * truncate to 0 after the open, which starts the replacement (mnt_replace_begin) and is
	 * answered with the old file's attributes, so readers keep seeing it whole. */
	conn->want &= ~(unsigned)(FUSE_CAP_AUTO_INVAL_DATA | FUSE_CAP_WRITEBACK_CACHE |
				  FUSE_CAP_READDIRPLUS_AUTO | FUSE_CAP_ATOMIC_O_TRUNC);
	klog_info("FUSE protocol %u.%u, max_write %u, max_readahead %u, readdirplus %s, "
		  "splice %s",
		  conn->proto_major, conn->proto_minor, conn->max_write, conn->max_readahead,
		  (conn->want & FUSE_CAP_READDIRPLUS) ? "on" : "off",
		  (conn->want & FUSE_CAP_SPLICE_READ) ? "on" : "off");
}

static void mnt_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct mnt *m = mnt_of(req);
	struct fuse_entry_param e;
	atomic_fetch_add_explicit(&m->n.lookups, 1, memory_order_relaxed);
	if (mnt_virt_is(parent) || (parent == FUSE_ROOT_ID && !strcmp(name, MNT_STATUS_NAME))) {
		memset(&e, 0, sizeof(e));
		int rc = mnt_virt_lookup(m, parent, name, &e.attr);
		if (rc) {
			fuse_reply_err(req, -rc);
			return;
		}
		e.ino = e.attr.st_ino;
		e.attr_timeout = 0;
		e.entry_timeout = 60;
		fuse_reply_entry(req, &e);
		return;
	}
	struct mnt_retry rt;
	mnt_retry_start(m, &rt);
	uint64_t pino = resolve(m, parent, NULL, NULL);
	struct kvp_attr a;
	/* A held lease answers without meta (revoked by meta before any change there is
	 * acknowledged: docs/meta.md, "Directory leases"); the kernel keeps the answer no longer
	 * than the lease has left, or with --lease-pin that long: the lease is then kept renewed
	 * and the name dropped from the kernel before a revocation is acknowledged
	 * (mnt_lease_lost). */
	int64_t left_ns = -1;
	int rc = kvc_lease_lookup(m->lease, pino, name, &a, &left_ns);
	if (rc == -EAGAIN) {
		left_ns = -1;
		do
			rc = m->cfg.lookup_layout ? kvc_lookup_layout(m->c, pino, name, &a)
						  : kvc_lookup(m->c, pino, name, &a);
		while (rc && mnt_retry(m, &rc, &rt));
	}
	if (rc == -ENOENT) {
		/* A file closed a moment ago may still be committing from its release. */
		pthread_mutex_lock(&m->rel_lock);
		int busy = m->rel_commits > 0;
		pthread_mutex_unlock(&m->rel_lock);
		if (busy) {
			mnt_wait_release_commits(m);
			rc = kvc_lookup(m->c, pino, name, &a);
		}
	}
	if (rc) {
		/* No negative caching: a file appears when another process commits it. */
		fuse_reply_err(req, -rc);
		return;
	}
	if (mnt_itab_ref(m->itab, a.ino, a.ino, a.mode, pino, name, NULL)) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	mnt_itab_set_attr(m->itab, a.ino, &a);
	fill_entry(m, &e, &a);
	if (left_ns >= 0 && m->cfg.lease_pin > 0) {
		e.entry_timeout = e.attr_timeout = (double)left_ns / 1e9;
	} else if (left_ns >= 0) {
		double left = (double)left_ns / 1e9;
		if (e.entry_timeout > left)
			e.entry_timeout = left;
		if (e.attr_timeout > left)
			e.attr_timeout = left;
	}
	if (mnt_itab_is_replacing(m->itab, a.ino))
		e.entry_timeout = 0; /* why: cand_convert in mount_io.c */
	if (fuse_reply_entry(req, &e) != 0)
		mnt_itab_forget(m->itab, a.ino, 1);
	else
		kvc_lease_note(m->lease, pino); /* may take or renew a lease: after the reply */
}

static void mnt_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	mnt_itab_forget(mnt_of(req)->itab, ino, nlookup);
	fuse_reply_none(req);
}

static void mnt_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
	struct mnt *m = mnt_of(req);
	for (size_t i = 0; i < count; i++)
		mnt_itab_forget(m->itab, forgets[i].ino, forgets[i].nlookup);
	fuse_reply_none(req);
}

/* Attributes of nodeid: a file being written reports its buffered size. */
static int getattr_of(struct mnt *m, uint64_t nodeid, struct stat *st, double *timeout)
{
	*timeout = m->cfg.attr_timeout;
	if (mnt_virt_is(nodeid)) {
		*timeout = 0;
		return mnt_virt_getattr(m, nodeid, st);
	}
	struct mnt_inode_info ii;
	if (mnt_itab_get(m->itab, nodeid, &ii) == 0) {
		mnt_wfile_put(ii.wf);
		if (ii.replaced) { /* what the kernel's inode is: see mount.h */
			mnt_attr_to_stat(m, &ii.old, st);
			return 0;
		}
	}
	struct mnt_wfile *wf;
	uint64_t ino = resolve(m, nodeid, &wf, NULL);
	if (wf) {
		pthread_mutex_lock(&wf->lock);
		int writing = wf->w != NULL;
		pthread_mutex_unlock(&wf->lock);
		if (writing) {
			mnt_wfile_stat(m, wf, st);
			mnt_wfile_put(wf);
			*timeout = 0;
			return 0;
		}
		mnt_wfile_put(wf);
	}
	if (ino == 0)
		return -ENOENT; /* a new file that was never committed */
	struct kvp_attr a;
	struct mnt_retry rt;
	mnt_retry_start(m, &rt);
	int rc;
	do
		rc = kvc_getattr(m->c, ino, &a);
	while (rc && mnt_retry(m, &rc, &rt));
	if (rc == -ENOENT && ino == nodeid && mnt_itab_get(m->itab, nodeid, &ii) == 0) {
		/* The inode is gone while the kernel still holds its node id: replaced or removed
		 * through another mount, or replaced here a moment ago (metadata committed, the
		 * node id not yet marked replaced). Its open descriptors read on (the chunks stay
		 * for --unlink-delay); a read that reaches the cached size asks for attributes,
		 * so answer what the file was instead of failing that read and fstat. */
		mnt_wfile_put(ii.wf);
		if (ii.replaced || ii.known) {
			mnt_attr_to_stat(m, ii.replaced ? &ii.old : &ii.last, st);
			st->st_nlink = 0; /* no name leads to it any more (fstat after unlink) */
			return 0;
		}
	}
	if (rc)
		return rc;
	if (ino == nodeid)
		mnt_itab_set_attr(m->itab, nodeid, &a);
	mnt_attr_to_stat(m, &a, st);
	return 0;
}

static void mnt_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)fi;
	struct stat st;
	double to;
	int rc = getattr_of(mnt_of(req), ino, &st, &to);
	if (rc)
		fuse_reply_err(req, -rc);
	else
		fuse_reply_attr(req, &st, to);
}

static void mnt_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
			struct fuse_file_info *fi)
{
	struct mnt *m = mnt_of(req);
	struct stat st;
	double to;
	int rc;
	if (mnt_virt_is(ino)) {
		fuse_reply_err(req, EROFS);
		return;
	}
	if (to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) {
		/* Owners are set at creation only: a chown to the owner it has is a no-op. */
		rc = getattr_of(m, ino, &st, &to);
		if (!rc && ((to_set & FUSE_SET_ATTR_UID && attr->st_uid != st.st_uid) ||
			    (to_set & FUSE_SET_ATTR_GID && attr->st_gid != st.st_gid)))
			rc = -EPERM;
		if (rc) {
			fuse_reply_err(req, -rc);
			return;
		}
	}
	/* A file being written: through its handle, or a new file by its node id. */
	struct mnt_wfile *wf = mnt_fh_writer(fi);
	if (!wf && (ino & MNT_TEMP_BASE))
		resolve(m, ino, &wf, NULL);
	if (wf) {
		int replacing = !(wf->nodeid & MNT_TEMP_BASE);
		rc = mnt_wfile_setattr(m, wf, attr, to_set, &st);
		mnt_wfile_put(wf);
		if (rc != -EAGAIN) {
			if (rc) {
				fuse_reply_err(req, -rc);
				return;
			}
			/* A replacement shares the kernel inode of the file it replaces: until
			 * the commit that inode keeps the old file's attributes. */
			if (replacing)
				getattr_of(m, ino, &st, &to);
			fuse_reply_attr(req, &st, 0);
			return;
		}
	}
	uint64_t mino = resolve(m, ino, NULL, NULL);
	if (mino == 0) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	if ((to_set & FUSE_SET_ATTR_SIZE) && attr->st_size == 0 && !(ino & MNT_TEMP_BASE)) {
		struct kvp_attr old;
		rc = mnt_replace_begin(m, ino, fi, fuse_req_ctx(req)->pid, &old);
		if (rc == 0) {
			/* The kernel inode stays the old file's until the commit. Answered from
			 * what the replacement captured, never an error: a failed truncate fails
			 * the open(O_TRUNC), and the writer just started would then be committed
			 * empty at its release, over another writer's version (the old inode may
			 * be gone already when two replace the file at once). */
			mnt_attr_to_stat(m, &old, &st);
			fuse_reply_attr(req, &st, 0);
			return;
		}
		if (rc != -ENOENT) {
			fuse_reply_err(req, -rc);
			return;
		}
	}
	if (to_set & FUSE_SET_ATTR_SIZE) {
		struct kvp_attr a;
		if ((rc = kvc_getattr(m->c, mino, &a))) {
			fuse_reply_err(req, -rc);
			return;
		}
		if ((uint64_t)attr->st_size != a.size) {
			atomic_fetch_add_explicit(&m->n.erofs, 1, memory_order_relaxed);
			klog_warn("truncate of committed inode %llu to %lld refused (EROFS): kvfs "
				  "files are written once; replace it with open(O_TRUNC)",
				  (unsigned long long)mino, (long long)attr->st_size);
			fuse_reply_err(req, EROFS);
			return;
		}
	}
	uint32_t valid = 0;
	int64_t mt = 0, at = 0;
	if (to_set & FUSE_SET_ATTR_MODE)
		valid |= KVP_SET_MODE;
	if (to_set & FUSE_SET_ATTR_MTIME) {
		valid |= KVP_SET_MTIME;
		mt = (to_set & FUSE_SET_ATTR_MTIME_NOW)
			 ? mnt_now_ns()
			 : (int64_t)attr->st_mtim.tv_sec * 1000000000 + attr->st_mtim.tv_nsec;
	}
	if (to_set & FUSE_SET_ATTR_ATIME) {
		valid |= KVP_SET_ATIME;
		at = (to_set & FUSE_SET_ATTR_ATIME_NOW)
			 ? mnt_now_ns()
			 : (int64_t)attr->st_atim.tv_sec * 1000000000 + attr->st_atim.tv_nsec;
	}
	if (valid) {
		struct kvp_attr a;
		if (valid & (KVP_SET_MTIME | KVP_SET_ATIME))
			mnt_dirtimes_note(m, mino, valid, mt, at);
		rc = kvc_setattr(m->c, mino, valid, attr->st_mode & 07777, mt, at, &a);
		if (rc) {
			fuse_reply_err(req, -rc);
			return;
		}
		mnt_attr_to_stat(m, &a, &st);
		fuse_reply_attr(req, &st, m->cfg.attr_timeout);
		return;
	}
	rc = getattr_of(m, ino, &st, &to);
	if (rc)
		fuse_reply_err(req, -rc);
	else
		fuse_reply_attr(req, &st, to);
}

/* ---- directories ---- */

struct dh {
	uint64_t ino;
	int virt;
	struct kvc_dirent *ents;
	size_t n;
};

static void mnt_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mnt *m = mnt_of(req);
	struct dh *d = calloc(1, sizeof(*d));
	if (!d) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	d->ino = ino;
	if (mnt_virt_is(ino)) {
		d->virt = 1;
	} else {
		struct mnt_retry rt;
		mnt_retry_start(m, &rt);
		mnt_wait_release_commits(m);
		int rc;
		do
			rc = kvc_readdir(m->c, ino, &d->ents, &d->n);
		while (rc && mnt_retry(m, &rc, &rt));
		if (rc) {
			free(d);
			fuse_reply_err(req, -rc);
			return;
		}
	}
	fi->fh = (uint64_t)(uintptr_t)d;
	/* A snapshot per opendir: offsets are indexes into it. */
	if (fuse_reply_open(req, fi) != 0) {
		free(d->ents);
		free(d);
	}
}

static void readdir_common(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			   struct fuse_file_info *fi, int plus)
{
	struct mnt *m = mnt_of(req);
	struct dh *d = (struct dh *)(uintptr_t)fi->fh;
	char *buf = malloc(size);
	if (!buf || off < 0) {
		free(buf);
		fuse_reply_err(req, buf ? EINVAL : ENOMEM);
		return;
	}
	size_t pos = 0;
	if (d->virt) {
		pos = mnt_virt_readdir(m, req, buf, size, off, plus);
		fuse_reply_buf(req, buf, pos);
		free(buf);
		return;
	}
	for (size_t i = (size_t)off; i < d->n + 2; i++) {
		struct fuse_entry_param e;
		const char *name;
		memset(&e, 0, sizeof(e));
		if (i < 2) {
			name = i == 0 ? "." : "..";
			e.attr.st_ino = i == 0 ? ino : FUSE_ROOT_ID;
			e.attr.st_mode = S_IFDIR;
		} else {
			const struct kvc_dirent *de = &d->ents[i - 2];
			name = de->name;
			fill_entry(m, &e, &de->attr);
			if (plus && mnt_itab_is_replacing(m->itab, de->attr.ino))
				e.entry_timeout = 0; /* as in mnt_lookup */
		}
		size_t rem = size - pos, sz;
		if (plus) {
			if (i < 2) /* no lookup reference for "." and ".." */
				e.ino = 0;
			sz = fuse_add_direntry_plus(req, buf + pos, rem, name, &e, (off_t)i + 1);
		} else {
			sz = fuse_add_direntry(req, buf + pos, rem, name, &e.attr, (off_t)i + 1);
		}
		if (sz > rem)
			break;
		if (plus && i >= 2 &&
		    mnt_itab_ref(m->itab, e.ino, e.ino, d->ents[i - 2].attr.mode, ino, name,
				 NULL) == 0)
			mnt_itab_set_attr(m->itab, e.ino, &d->ents[i - 2].attr);
		pos += sz;
	}
	fuse_reply_buf(req, buf, pos);
	free(buf);
}

static void mnt_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			struct fuse_file_info *fi)
{
	readdir_common(req, ino, size, off, fi, 0);
}

static void mnt_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			    struct fuse_file_info *fi)
{
	readdir_common(req, ino, size, off, fi, 1);
}

static void mnt_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	struct dh *d = (struct dh *)(uintptr_t)fi->fh;
	free(d->ents);
	free(d);
	fuse_reply_err(req, 0);
}

/* Refuses changes inside .kvfs/ and to the name .kvfs itself. */
static int protected_name(fuse_ino_t parent, const char *name)
{
	if (mnt_virt_is(parent))
		return -EROFS;
	if (parent == FUSE_ROOT_ID && strcmp(name, MNT_STATUS_NAME) == 0)
		return -EPERM;
	return 0;
}

static void mnt_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	struct mnt *m = mnt_of(req);
	int rc = protected_name(parent, name);
	if (rc) {
		fuse_reply_err(req, rc == -EPERM ? EEXIST : -rc);
		return;
	}
	struct kvp_attr a;
	const struct fuse_ctx *cx = fuse_req_ctx(req);
	atomic_fetch_add(&m->ns_busy, 1);
	rc = kvc_mkdir_owned(m->c, parent, name, S_IFDIR | (mode & 07777), cx->uid, cx->gid, &a);
	atomic_fetch_sub(&m->ns_busy, 1);
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	struct fuse_entry_param e;
	if (mnt_itab_ref(m->itab, a.ino, a.ino, a.mode, parent, name, NULL)) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	fill_entry(m, &e, &a);
	if (fuse_reply_entry(req, &e) != 0)
		mnt_itab_forget(m->itab, a.ino, 1);
}

static void mnt_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct mnt *m = mnt_of(req);
	int rc = protected_name(parent, name);
	atomic_fetch_add(&m->ns_busy, 1);
	if (!rc)
		rc = kvc_rmdir(m->c, parent, name);
	atomic_fetch_sub(&m->ns_busy, 1);
	fuse_reply_err(req, -rc);
}

static void mnt_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct mnt *m = mnt_of(req);
	int rc = protected_name(parent, name);
	atomic_fetch_add(&m->ns_busy, 1);
	if (!rc)
		rc = kvc_unlink(m->c, parent, name);
	atomic_fetch_sub(&m->ns_busy, 1);
	fuse_reply_err(req, -rc);
}

static void mnt_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		       const char *newname, unsigned int flags)
{
	struct mnt *m = mnt_of(req);
	int rc = protected_name(parent, name);
	if (!rc)
		rc = protected_name(newparent, newname);
	if (!rc && (flags & ~(unsigned)RENAME_NOREPLACE))
		rc = -EINVAL; /* RENAME_EXCHANGE, RENAME_WHITEOUT */
	atomic_fetch_add(&m->ns_busy, 1);
	if (!rc)
		rc = kvc_rename(m->c, parent, name, newparent, newname,
				(flags & RENAME_NOREPLACE) ? 1 : 0);
	atomic_fetch_sub(&m->ns_busy, 1);
	if (!rc) {
		/* Keep the moved file's name current for a later open(O_TRUNC) through it. */
		struct kvp_attr a;
		if (kvc_lookup(m->c, newparent, newname, &a) == 0)
			mnt_itab_rename(m->itab, a.ino, newparent, newname);
	}
	fuse_reply_err(req, -rc);
}

static void mnt_statfs(fuse_req_t req, fuse_ino_t ino)
{
	(void)ino;
	struct mnt *m = mnt_of(req);
	struct kvc_statfs s;
	struct mnt_retry rt;
	mnt_retry_start(m, &rt);
	int rc;
	do
		rc = kvc_statfs(m->c, &s);
	while (rc && mnt_retry(m, &rc, &rt));
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	/* Usable space: raw bytes scaled by k/(k+m) (what files can still hold). */
	unsigned k = s.k > 0 ? (unsigned)s.k : 1, mm = s.m > 0 ? (unsigned)s.m : 0;
	unsigned __int128 cap = (unsigned __int128)s.raw_capacity * k / (k + mm);
	uint64_t rawfree = s.raw_capacity > s.raw_used ? s.raw_capacity - s.raw_used : 0;
	unsigned __int128 fre = (unsigned __int128)rawfree * k / (k + mm);
	struct statvfs st;
	memset(&st, 0, sizeof(st));
	st.f_bsize = 4096;
	st.f_frsize = 4096;
	st.f_blocks = (fsblkcnt_t)(cap / 4096);
	st.f_bfree = (fsblkcnt_t)(fre / 4096);
	st.f_bavail = st.f_bfree;
	/* Inodes: metadata has no fixed limit; report a large, honest "free" count. */
	st.f_ffree = 1ull << 32;
	st.f_files = s.files + s.dirs + st.f_ffree;
	st.f_favail = st.f_ffree;
	st.f_namemax = KVP_NAME_MAX;
	fuse_reply_statfs(req, &st);
}

static void mnt_access(fuse_req_t req, fuse_ino_t ino, int mask)
{
	struct mnt *m = mnt_of(req);
	struct stat st;
	double to;
	int rc = getattr_of(m, ino, &st, &to);
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	if (mask == F_OK) {
		fuse_reply_err(req, 0);
		return;
	}
	if (mnt_virt_is(ino) && (mask & W_OK)) {
		fuse_reply_err(req, EROFS);
		return;
	}
	const struct fuse_ctx *cx = fuse_req_ctx(req);
	if (cx->uid == 0) {
		/* root: everything but executing a file nobody may execute */
		int ok = !(mask & X_OK) || S_ISDIR(st.st_mode) || (st.st_mode & 0111);
		fuse_reply_err(req, ok ? 0 : EACCES);
		return;
	}
	unsigned bits = cx->uid == st.st_uid   ? (st.st_mode >> 6) & 7
			: cx->gid == st.st_gid ? (st.st_mode >> 3) & 7
					       : st.st_mode & 7;
	unsigned need = ((mask & R_OK) ? 4 : 0) | ((mask & W_OK) ? 2 : 0) | ((mask & X_OK) ? 1 : 0);
	fuse_reply_err(req, (bits & need) == need ? 0 : EACCES);
}

/* ---- refused operations: answered with an error, logged at debug level ---- */

static void mnt_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
	(void)ino, (void)newparent;
	klog_debug("link %s: hard links are not supported (EPERM)", newname);
	fuse_reply_err(req, EPERM);
}

static void mnt_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	(void)link, (void)parent;
	klog_debug("symlink %s: symbolic links are not supported (EPERM)", name);
	fuse_reply_err(req, EPERM);
}

static void mnt_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
	(void)parent, (void)mode, (void)rdev;
	klog_debug("mknod %s: device files, fifos and sockets are not supported (EPERM)", name);
	fuse_reply_err(req, EPERM);
}

static void mnt_readlink(fuse_req_t req, fuse_ino_t ino)
{
	(void)ino;
	fuse_reply_err(req, EINVAL); /* nothing here is a symbolic link */
}

static void mnt_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
			 size_t size, int flags)
{
	(void)ino, (void)name, (void)value, (void)size, (void)flags;
	fuse_reply_err(req, ENOTSUP);
}

static void mnt_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	(void)ino, (void)name;
	fuse_reply_err(req, ENOTSUP);
}

static void mnt_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
			  struct fuse_file_info *fi)
{
	(void)ino, (void)mode, (void)offset, (void)length, (void)fi;
	fuse_reply_err(req, EOPNOTSUPP);
}

const struct fuse_lowlevel_ops mnt_ops = {
    .init = mnt_init,
    .lookup = mnt_lookup,
    .forget = mnt_forget,
    .forget_multi = mnt_forget_multi,
    .getattr = mnt_getattr,
    .setattr = mnt_setattr,
    .readlink = mnt_readlink,
    .mknod = mnt_mknod,
    .mkdir = mnt_mkdir,
    .unlink = mnt_unlink,
    .rmdir = mnt_rmdir,
    .symlink = mnt_symlink,
    .rename = mnt_rename,
    .link = mnt_link,
    .open = mnt_open,
    .read = mnt_read,
    .write_buf = mnt_write_buf,
    .flush = mnt_flush,
    .release = mnt_release,
    .fsync = mnt_fsync,
    .opendir = mnt_opendir,
    .readdir = mnt_readdir,
    .releasedir = mnt_releasedir,
    .statfs = mnt_statfs,
    .setxattr = mnt_setxattr,
    .getxattr = mnt_getxattr,
    .listxattr = mnt_listxattr,
    .removexattr = mnt_removexattr,
    .access = mnt_access,
    .create = mnt_create,
    .fallocate = mnt_fallocate,
    .readdirplus = mnt_readdirplus,
};
