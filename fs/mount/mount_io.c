/* File handles: readers of committed files and write-once writers.
 *
 * A reader handle owns a kvc_file (layout fetched once; files are immutable) and asks the
 * kernel to keep its page cache. A writer handle shares a struct mnt_wfile: the kvc_writer
 * buffering the new file. Writer handles are direct_io so the bytes of a file being written
 * never enter the page cache that readers of the old version (O_TRUNC) use.
 *
 * When the commit happens: at a flush from the process that opened the handle (its owner)
 * when it is the file's last handle and has written since the previous such flush — i.e. on
 * the owner's close() after the last write, so that close() returns the commit's error. The
 * kernel sends a flush for every close of a descriptor, also of copies in other processes (a
 * forked child, the child of a subprocess between fork and exec, a descriptor passed over a
 * socket): a flush from any process other than the owner neither commits nor drops the file,
 * so those children cannot publish the owner's file cut short. A flush with nothing written
 * since (the dup2 + close a shell does before the command writes, or touch) does not commit;
 * release of the last handle commits whatever is left (an empty file, a file shared by several
 * handles, or one the owner closed before another process wrote its bytes). A flush from the
 * owner while it is being killed by a signal aborts the file instead: a killed writer never
 * publishes a partial file (a killed child changes nothing). docs/mount.md, "When close()
 * publishes", says what each call guarantees.
 */
#define KVFS_LOG_TAG "mount"
#include "ktime.h"
#include "log.h"
#include "mount.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* FH_CAND: a write open of a committed file. Reads work; it becomes FH_WRITE (a replacement)
 * when the truncate to 0 of an O_TRUNC open (or an ftruncate(fd, 0)) arrives; a write before
 * that is refused with EROFS. */
enum fh_kind { FH_READ = 1, FH_WRITE = 2, FH_VIRT = 3, FH_CAND = 4 };

struct fh {
	int kind;
	pthread_mutex_t lock; /* serializes kvc_pread on rf (one thread at a time) */
	uint64_t ino;	      /* meta inode read */
	struct kvc_file *rf;  /* lock */
	char *buf;	      /* lock; read window: file bytes [woff, woff + wlen) */
	size_t cap, wlen;     /* lock */
	uint64_t woff, next;  /* lock; next = where a sequential read continues */
	uint64_t cached_node; /* FH_READ through the page cache: the node id counted, or 0 */
	struct mnt_wfile *wf; /* writer (one reference) */
	char *text;	      /* status file snapshot */
	size_t len;
	/* FH_CAND: where the replacement goes, and who opened it */
	struct fh *cand_next; /* mnt.cand_lock */
	uint64_t nodeid, parent;
	pid_t pid;   /* the opening thread */
	pid_t owner; /* FH_WRITE, FH_CAND: its process (thread group); 0 = unknown */
	/* mnt.fh_lock: the live handles, so those the kernel never releases (the daemon stopped
	 * with them open) are freed at exit (mnt_fh_drop_all). m is NULL once unlinked. */
	struct mnt *m;
	struct fh *live_prev, *live_next;
	char name[KVP_NAME_MAX + 1];
};

static struct fh *fh_new(struct mnt *m, int kind)
{
	struct fh *h = calloc(1, sizeof(*h));
	if (!h)
		return NULL;
	h->kind = kind;
	pthread_mutex_init(&h->lock, NULL);
	h->m = m;
	pthread_mutex_lock(&m->fh_lock);
	h->live_next = m->fh_live;
	if (m->fh_live)
		m->fh_live->live_prev = h;
	m->fh_live = h;
	pthread_mutex_unlock(&m->fh_lock);
	return h;
}

/* Takes h out of its mount's list of live handles (caller holds fh_lock). */
static void fh_unlink_locked(struct fh *h)
{
	struct mnt *m = h->m;
	if (h->live_prev)
		h->live_prev->live_next = h->live_next;
	else
		m->fh_live = h->live_next;
	if (h->live_next)
		h->live_next->live_prev = h->live_prev;
	h->m = NULL;
}

static void fh_free(struct fh *h)
{
	if (!h)
		return;
	struct mnt *m = h->m;
	if (m) {
		pthread_mutex_lock(&m->fh_lock);
		fh_unlink_locked(h);
		pthread_mutex_unlock(&m->fh_lock);
	}
	if (h->rf)
		kvc_file_close(h->rf);
	if (h->wf)
		mnt_wfile_put(h->wf);
	free(h->buf);
	free(h->text);
	pthread_mutex_destroy(&h->lock);
	free(h);
}

static struct fh *fh_of(const struct fuse_file_info *fi)
{
	return (struct fh *)(uintptr_t)fi->fh;
}

/* ---- writers ---- */

static struct mnt_wfile *wfile_new(struct kvc_writer *w, uint64_t nodeid, uint64_t parent,
				   const char *name, uint32_t mode)
{
	struct mnt_wfile *wf = calloc(1, sizeof(*wf));
	if (!wf)
		return NULL;
	pthread_mutex_init(&wf->lock, NULL);
	atomic_init(&wf->refs, 1);
	wf->w = w;
	wf->nodeid = nodeid;
	wf->parent = parent;
	snprintf(wf->name, sizeof(wf->name), "%s", name);
	wf->mode = S_IFREG | (mode & 07777);
	wf->ctime_ns = mnt_now_ns();
	wf->uid = wf->gid = KVP_OWNER_NONE;
	return wf;
}

struct mnt_wfile *mnt_fh_writer(struct fuse_file_info *fi)
{
	struct fh *h = fi ? fh_of(fi) : NULL;
	if (!h || h->kind != FH_WRITE)
		return NULL;
	atomic_fetch_add(&h->wf->refs, 1);
	return h->wf;
}

/* Caller holds wf->lock. */
static void wfile_stat_locked(struct mnt *m, struct mnt_wfile *wf, struct stat *st)
{
	if (!wf->w && wf->err == 0 && wf->attr.ino) {
		mnt_attr_to_stat(m, &wf->attr, st);
		return;
	}
	memset(st, 0, sizeof(*st));
	st->st_ino = wf->nodeid;
	st->st_mode = wf->mode;
	st->st_nlink = 1;
	struct kvp_attr own = {.uid = wf->uid, .gid = wf->gid};
	mnt_owner(m, &own, st);
	st->st_size = wf->w ? (off_t)kvc_writer_size(wf->w) : 0;
	st->st_blksize = 1 << 20;
	int64_t mt = wf->mtime_ns ? wf->mtime_ns : wf->ctime_ns;
	int64_t at = wf->atime_ns ? wf->atime_ns : wf->ctime_ns;
	st->st_mtim.tv_sec = mt / 1000000000;
	st->st_mtim.tv_nsec = mt % 1000000000;
	st->st_atim.tv_sec = at / 1000000000;
	st->st_atim.tv_nsec = at % 1000000000;
	st->st_ctim.tv_sec = wf->ctime_ns / 1000000000;
	st->st_ctim.tv_nsec = wf->ctime_ns % 1000000000;
}

void mnt_wfile_stat(struct mnt *m, struct mnt_wfile *wf, struct stat *st)
{
	pthread_mutex_lock(&wf->lock);
	wfile_stat_locked(m, wf, st);
	pthread_mutex_unlock(&wf->lock);
}

static int64_t ts_ns(const struct timespec *t)
{
	return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec;
}

int mnt_wfile_setattr(struct mnt *m, struct mnt_wfile *wf, const struct stat *attr, int to_set,
		      struct stat *st)
{
	int rc = 0;
	pthread_mutex_lock(&wf->lock);
	if (!wf->w) {
		pthread_mutex_unlock(&wf->lock);
		return -EAGAIN; /* committed meanwhile: the caller applies it to metadata */
	}
	if (to_set & FUSE_SET_ATTR_SIZE) {
		rc = kvc_writer_truncate(wf->w, (uint64_t)attr->st_size);
		if (rc == -ENOMEM)
			rc = -ENOSPC;
	}
	if (!rc && (to_set & FUSE_SET_ATTR_MODE)) {
		wf->mode = S_IFREG | (attr->st_mode & 07777);
		wf->set_mode = 1;
	}
	if (!rc && (to_set & FUSE_SET_ATTR_MTIME))
		wf->mtime_ns =
		    (to_set & FUSE_SET_ATTR_MTIME_NOW) ? mnt_now_ns() : ts_ns(&attr->st_mtim);
	if (!rc && (to_set & FUSE_SET_ATTR_ATIME))
		wf->atime_ns =
		    (to_set & FUSE_SET_ATTR_ATIME_NOW) ? mnt_now_ns() : ts_ns(&attr->st_atim);
	wfile_stat_locked(m, wf, st);
	pthread_mutex_unlock(&wf->lock);
	return rc;
}

/* Commits (or, for a killed writer, aborts) the file. Caller holds wf->lock and wf->w != NULL.
 * Returns 0 or -errno; the result is also kept in wf->err. */
static int wfile_finish(struct mnt *m, struct mnt_wfile *wf)
{
	struct kvc_writer *w = wf->w;
	wf->w = NULL;
	if (wf->failed) {
		kvc_abort(w);
		atomic_fetch_add_explicit(&m->n.aborted, 1, memory_order_relaxed);
		klog_warn("%s: a write failed (%s); file dropped, not published", wf->name,
			  kvp_strerror(wf->failed));
		wf->err = wf->failed;
		return wf->err;
	}
	if (wf->killed) {
		kvc_abort(w);
		atomic_fetch_add_explicit(&m->n.aborted, 1, memory_order_relaxed);
		klog_warn("%s: writer was killed before closing it; file dropped, not published",
			  wf->name);
		wf->err = -EINTR;
		return wf->err;
	}
	uint64_t size = kvc_writer_size(w);
	struct kvp_attr a;
	atomic_fetch_add(&m->ns_busy, 1); /* see mnt_lease_lost */
	int rc = kvc_commit(w, &a);
	atomic_fetch_sub(&m->ns_busy, 1);
	if (rc) {
		atomic_fetch_add_explicit(&m->n.commit_errors, 1, memory_order_relaxed);
		klog_error("commit of %s (%llu bytes, dir inode %llu) failed: %s", wf->name,
			   (unsigned long long)size, (unsigned long long)wf->parent,
			   kvp_strerror(rc));
		/* Meta unreachable (a connection error) means "not stored": the application
		 * sees EIO. EHOSTDOWN (too few storage nodes up or reachable) says more and
		 * passes through, as docs/mount.md promises. */
		if (kvch_is_transport(rc))
			rc = -EIO;
		wf->err = rc;
		return rc;
	}
	atomic_fetch_add_explicit(&m->n.commits, 1, memory_order_relaxed);
	uint32_t valid = 0;
	if (wf->set_mode)
		valid |= KVP_SET_MODE;
	if (wf->mtime_ns)
		valid |= KVP_SET_MTIME;
	if (wf->atime_ns)
		valid |= KVP_SET_ATIME;
	if (valid) {
		struct kvp_attr b;
		int r2 = kvc_setattr(m->c, a.ino, valid, wf->mode & 07777, wf->mtime_ns,
				     wf->atime_ns, &b);
		if (r2 == 0)
			a = b;
		else
			klog_warn("%s: committed, but setting its mode/times failed: %s", wf->name,
				  kvp_strerror(r2));
	}
	wf->attr = a;
	wf->err = 0;
	mnt_dirtimes_restore(m, wf->parent, wf->ctime_ns);
	/* The node id the handles were opened on (a new file's temporary id, or the replaced
	 * file's old inode) now stands for the committed inode. */
	if (wf->repl_itab)
		mnt_itab_set_replaced(m->itab, wf->nodeid, a.ino, &wf->old);
	else
		mnt_itab_set_ino(m->itab, wf->nodeid, a.ino);
	/* The kernel's name still leads to the node id it knew (a temporary id, or the replaced
	 * file's): have it look the name up again. A new file's name is never cached (timeout
	 * 0), so it is only tidying. A replacement's old node id now answers the old attributes,
	 * so the writer's own stat after close() must not reach it: the notification queued at
	 * its start (cand_convert) covers that once the kernel has applied it; if it has not yet
	 * (a short write), wait for it a little (never long: it may wait on a directory lock),
	 * and if it failed or was never queued, send one now and wait the same way. */
	if (!wf->repl_itab) {
		mnt_inval_entry(m, wf->parent, wf->name, 0);
		return 0;
	}
	int r = wf->inval_ticket ? mnt_inval_wait(m, wf->inval_ticket, 0) : -ENOENT;
	if (r == 0)
		return 0;
	int64_t t0 = mnt_now_ns();
	if (r == -ETIMEDOUT)
		mnt_inval_wait(m, wf->inval_ticket, 200);
	else
		mnt_inval_entry(m, wf->parent, wf->name, 200);
	atomic_fetch_add_explicit(&m->n.inval_waits, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&m->n.inval_wait_us,
				  (unsigned long long)((mnt_now_ns() - t0) / 1000),
				  memory_order_relaxed);
	return 0;
}

static void cand_unlink(struct mnt *m, struct fh *h)
{
	for (struct fh **pp = &m->cands; *pp; pp = &(*pp)->cand_next)
		if (*pp == h) {
			*pp = h->cand_next;
			h->cand_next = NULL;
			return;
		}
}

/* The end of a handle: the last handle of a writer commits what is left (release). */
static void fh_drop(struct mnt *m, struct fh *h)
{
	if (h->kind == FH_CAND) {
		pthread_mutex_lock(&m->cand_lock);
		cand_unlink(m, h);
		pthread_mutex_unlock(&m->cand_lock);
	}
	if (h->kind == FH_WRITE) {
		struct mnt_wfile *wf = h->wf;
		pthread_mutex_lock(&wf->lock);
		if (--wf->handles == 0 && wf->w) {
			pthread_mutex_lock(&m->rel_lock);
			m->rel_commits++;
			pthread_mutex_unlock(&m->rel_lock);
			wfile_finish(m, wf); /* logged; no application is left to tell */
			pthread_mutex_lock(&m->rel_lock);
			m->rel_commits--;
			pthread_cond_broadcast(&m->rel_cond);
			pthread_mutex_unlock(&m->rel_lock);
		}
		pthread_mutex_unlock(&wf->lock);
	}
	if (h->cached_node)
		mnt_itab_readers(m->itab, h->cached_node, -1);
	/* The kernel sends RELEASE once every reply on the handle has reached it, but the thread
	 * that sent the last one may not have left mnt_read yet: wait for it. */
	pthread_mutex_lock(&h->lock);
	pthread_mutex_unlock(&h->lock);
	fh_free(h);
}

void mnt_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		struct fuse_file_info *fi)
{
	struct mnt *m = mnt_of(req);
	if (mnt_virt_is(parent)) {
		fuse_reply_err(req, EROFS);
		return;
	}
	if (parent == FUSE_ROOT_ID && strcmp(name, MNT_STATUS_NAME) == 0) {
		fuse_reply_err(req, EEXIST);
		return;
	}
	struct mnt_inode_info pi;
	uint64_t pino = parent;
	if (mnt_itab_get(m->itab, parent, &pi) == 0) {
		pino = pi.ino;
		mnt_wfile_put(pi.wf);
	}
	/* Without O_EXCL the last writer to close wins (as if it had truncated the other). */
	int replace = !(fi->flags & O_EXCL);
	struct kvc_writer *w;
	int rc = kvc_create(m->c, pino, name, mode, replace, &w);
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	/* The creator owns the file: what the kernel checks under allow_other. */
	const struct fuse_ctx *cx = fuse_req_ctx(req);
	kvc_writer_set_owner(w, cx->uid, cx->gid);
	uint64_t nodeid = MNT_TEMP_BASE | atomic_fetch_add(&m->next_temp, 1);
	struct mnt_wfile *wf = wfile_new(w, nodeid, pino, name, mode);
	if (wf) {
		wf->uid = cx->uid;
		wf->gid = cx->gid;
	}
	struct fh *h = fh_new(m, FH_WRITE);
	if (!wf || !h ||
	    mnt_itab_ref(m->itab, nodeid, 0, S_IFREG | (mode & 07777), pino, name, wf)) {
		if (wf)
			mnt_wfile_put(wf); /* aborts w */
		else
			kvc_abort(w);
		fh_free(h); /* h->wf is not set yet: wf was put above */
		fuse_reply_err(req, ENOMEM);
		return;
	}
	wf->handles = 1;
	h->wf = wf; /* the creation reference */
	h->owner = mnt_proc_tgid(fuse_req_ctx(req)->pid);
	struct fuse_entry_param e;
	memset(&e, 0, sizeof(e));
	e.ino = nodeid;
	mnt_wfile_stat(m, wf, &e.attr);
	/* Never cached: every later path walk asks us again, and we answer ENOENT until the
	 * commit, so no other process can open a file that is still being written. */
	e.entry_timeout = 0;
	e.attr_timeout = 0;
	fi->fh = (uint64_t)(uintptr_t)h;
	fi->direct_io = 1;
	fi->keep_cache = 0;
	atomic_fetch_add_explicit(&m->n.opens, 1, memory_order_relaxed);
	if (fuse_reply_create(req, &e, fi) != 0) {
		/* The kernel did not take the file: no release and no forget will come. */
		mnt_itab_forget(m->itab, nodeid, 1);
		fh_free(h);
	}
}

/* Turns a waiting write open of a committed file into the writer of its replacement. */
static int cand_convert(struct mnt *m, struct fh *h)
{
	struct kvp_attr a;
	int rc = kvc_getattr(m->c, h->ino, &a);
	if (rc == -ENOENT)
		return -ESTALE; /* replaced or removed since the open: the VFS looks it up again */
	if (rc)
		return rc;
	if (!S_ISREG(a.mode))
		return -EISDIR;
	struct kvc_writer *w;
	if ((rc = kvc_create(m->c, h->parent, h->name, a.mode, 1, &w)))
		return rc;
	struct mnt_wfile *wf = wfile_new(w, h->nodeid, h->parent, h->name, a.mode);
	if (!wf) {
		kvc_abort(w);
		return -ENOMEM;
	}
	wf->handles = 1;
	wf->old = a;
	wf->uid = a.uid; /* written over: the owner stays (meta keeps it too) */
	wf->gid = a.gid;
	wf->repl_itab = m->itab;
	/* After the commit, the writer's own stat must find the new file, so the kernel must not
	 * keep the name leading to this node id (whose getattr then answers the old file). Drop
	 * it now, while the file is written, rather than after the commit, which would have to
	 * wait for that: from here on lookups of the node id answer entry_timeout 0
	 * (mnt_lookup, readdirplus: the kernel asks again at every use), and this notification
	 * drops what the kernel cached before. The order makes that complete: the kernel holds
	 * the directory's lock from sending a LOOKUP (or READDIRPLUS) to caching its answer, and
	 * the notification takes the same lock, so an answer given before the count below
	 * is cached before the notification (and dropped by it) or the notification came first
	 * and the LOOKUP was sent after it, so it sees the count (a revalidation outside the lock
	 * only refreshes a dentry the notification has already unhashed). Once the kernel has
	 * applied it (mnt_inval_wait), no cached name leads to the node id, and the commit need
	 * not wait (wfile_finish). */
	mnt_itab_replacing(m->itab, h->nodeid, 1);
	if (mnt_inval_queue(m, h->parent, h->name, &wf->inval_ticket) != 0)
		wf->inval_ticket = 0;
	h->wf = wf;
	h->kind = FH_WRITE;
	return 0;
}

int mnt_replace_begin(struct mnt *m, uint64_t nodeid, struct fuse_file_info *fi, pid_t pid,
		      struct kvp_attr *old)
{
	struct fh *h = NULL;
	pthread_mutex_lock(&m->cand_lock);
	if (fi) {
		if (fh_of(fi)->kind == FH_CAND)
			h = fh_of(fi);
	} else {
		for (struct fh *x = m->cands; x && !h; x = x->cand_next)
			if (x->nodeid == nodeid && x->pid == pid)
				h = x;
	}
	if (h)
		cand_unlink(m, h);
	pthread_mutex_unlock(&m->cand_lock);
	if (!h)
		return -ENOENT;
	pthread_mutex_lock(&h->lock);
	int rc = cand_convert(m, h);
	if (!rc)
		*old = h->wf->old;
	pthread_mutex_unlock(&h->lock);
	if (rc) {
		pthread_mutex_lock(&m->cand_lock);
		h->cand_next = m->cands;
		m->cands = h;
		pthread_mutex_unlock(&m->cand_lock);
	}
	return rc;
}

/* A write open of a committed file: a candidate handle (see FH_CAND). */
static int open_write_committed(struct mnt *m, fuse_req_t req, uint64_t nodeid,
				const struct mnt_inode_info *ii, struct fuse_file_info *fi,
				struct fh **out)
{
	if (!ii->name[0]) {
		klog_warn("open for writing of inode %llu: its name is unknown here",
			  (unsigned long long)nodeid);
		return -ESTALE;
	}
	struct fh *h = fh_new(m, FH_CAND);
	if (!h)
		return -ENOMEM;
	h->ino = ii->ino;
	h->nodeid = nodeid;
	h->parent = ii->parent;
	h->pid = fuse_req_ctx(req)->pid;
	h->owner = mnt_proc_tgid(h->pid);
	snprintf(h->name, sizeof(h->name), "%s", ii->name);
	if (fi->flags & O_TRUNC) { /* a kernel that passes O_TRUNC on */
		int rc = cand_convert(m, h);
		if (rc) {
			fh_free(h);
			return rc;
		}
	} else {
		pthread_mutex_lock(&m->cand_lock);
		h->cand_next = m->cands;
		m->cands = h;
		pthread_mutex_unlock(&m->cand_lock);
	}
	*out = h;
	return 0;
}

/* An open of a .kvfs/ status file: a snapshot of its text, read-only. */
static int open_virt(struct mnt *m, fuse_ino_t ino, struct fuse_file_info *fi, struct fh **out)
{
	if ((fi->flags & O_ACCMODE) != O_RDONLY)
		return -EROFS;
	struct fh *h = fh_new(m, FH_VIRT);
	if (!h)
		return -ENOMEM;
	int rc = mnt_virt_read_all(m, ino, &h->text, &h->len);
	if (rc) {
		fh_free(h);
		return rc;
	}
	fi->direct_io = 1;
	fi->noflush = 1;
	*out = h;
	return 0;
}

/* An open of a new file still being written (through its temporary node id): a writing handle
 * shares its writer. Takes over the reference in wf. Returns 1 when the file is no longer being
 * written (the caller opens the committed file), else 0 or -errno. */
static int open_shared_writer(struct mnt *m, fuse_req_t req, struct mnt_wfile *wf,
			      struct fuse_file_info *fi, struct fh **out)
{
	struct fh *h = NULL;
	int rc = 1;
	pthread_mutex_lock(&wf->lock);
	if (wf->w) {
		rc = 0;
		if ((fi->flags & O_ACCMODE) == O_RDONLY)
			rc = -EBUSY; /* its bytes are not readable before the commit */
		else if (fi->flags & O_TRUNC)
			rc = kvc_writer_truncate(wf->w, 0);
		if (!rc && !(h = fh_new(m, FH_WRITE)))
			rc = -ENOMEM;
		if (!rc) {
			wf->handles++;
			h->wf = wf;
			h->owner = mnt_proc_tgid(fuse_req_ctx(req)->pid);
		}
	}
	pthread_mutex_unlock(&wf->lock);
	if (!h)
		mnt_wfile_put(wf);
	if (!rc) {
		fi->direct_io = 1;
		*out = h;
	}
	return rc;
}

/* A read open of committed inode ii->ino through node id ino. */
static int open_read(struct mnt *m, fuse_ino_t ino, const struct mnt_inode_info *ii,
		     struct fuse_file_info *fi, struct fh **out)
{
	struct fh *h = fh_new(m, FH_READ);
	if (!h)
		return -ENOMEM;
	h->ino = ii->ino;
	struct mnt_retry rt;
	mnt_retry_start(m, &rt);
	int rc;
	do
		rc = kvc_file_open(m->c, ii->ino, &h->rf);
	while (rc && mnt_retry(m, &rc, &rt));
	if (rc == -ENOENT && ino != FUSE_ROOT_ID && !(ino & MNT_TEMP_BASE))
		rc = -ESTALE; /* replaced through another node id, or elsewhere: look up again */
	if (rc) {
		fh_free(h);
		return rc;
	}
	/* Files never change, so the page cache stays valid across opens — except on a node id
	 * that now stands for a different inode (a committed new file), and while a replacement
	 * is being written through this node id: its writes move the kernel's size of the inode,
	 * so this reader of the old version must not go through the page cache. Decided now, not
	 * from ii (read before kvc_file_open's round trip): a replacement that began meanwhile
	 * and saw no page-cache reader would grow the size under this one. */
	int cached = mnt_itab_reader_open(m->itab, ino);
	fi->keep_cache = m->cfg.keep_cache && !ii->redirected && cached;
	fi->direct_io = !cached;
	fi->noflush = 1; /* nothing to do at close(): spare the round trip */
	if (cached)
		h->cached_node = ino;
	/* The kernel's first READ comes only after this reply reaches the caller and its read()
	 * misses the page cache: one FUSE round trip (two thread wake-ups, more under load) in
	 * which the chunks can already be on their way. Only when the kernel cannot answer from
	 * its pages: an open that drops them (no keep_cache), or the first of a kernel inode that
	 * has none yet; a warm open is served from the page cache and would waste the GETs. */
	if (m->cfg.open_prefetch && cached && kvc_file_size(h->rf) > 0 &&
	    (!fi->keep_cache || mnt_itab_first_read(m->itab, ino)) &&
	    kvc_file_prefetch(h->rf, 0) == 0)
		atomic_fetch_add_explicit(&m->n.open_prefetches, 1, memory_order_relaxed);
	*out = h;
	return 0;
}

/* An open of a file through node id ino (not a status file). */
static int open_file(struct mnt *m, fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi,
		     struct fh **out)
{
	struct mnt_inode_info ii;
	if (mnt_itab_get(m->itab, ino, &ii) != 0) {
		if (ino & MNT_TEMP_BASE)
			return -ESTALE;
		ii.ino = ino;
	}
	if (ii.wf) {
		int rc = open_shared_writer(m, req, ii.wf, fi, out);
		if (rc != 1)
			return rc;
	}
	if (ii.ino == 0) /* a new file whose commit failed */
		return -ENOENT;
	/* The kernel's inode of a replaced node id is the old file (its size, its pages): the
	 * VFS retries the open after looking the name up, which finds the new file under a node
	 * id of its own. */
	if (ii.replaced)
		return -ESTALE;
	if ((fi->flags & O_ACCMODE) == O_RDONLY)
		return open_read(m, ino, &ii, fi, out);
	int rc = open_write_committed(m, req, ino, &ii, fi, out);
	if (!rc)
		fi->direct_io = 1;
	return rc;
}

void mnt_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mnt *m = mnt_of(req);
	struct fh *h = NULL;
	atomic_fetch_add_explicit(&m->n.opens, 1, memory_order_relaxed);
	int rc = mnt_virt_is(ino) ? open_virt(m, ino, fi, &h) : open_file(m, req, ino, fi, &h);
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	fi->fh = (uint64_t)(uintptr_t)h;
	if (fuse_reply_open(req, fi) != 0)
		fh_drop(m, h); /* the kernel did not take it: no release will come */
}

void mnt_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)ino;
	struct mnt *m = mnt_of(req);
	struct fh *h = fh_of(fi);
	if (off < 0) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	if (h->kind == FH_VIRT) {
		size_t o = (size_t)off < h->len ? (size_t)off : h->len;
		size_t n = h->len - o < size ? h->len - o : size;
		pthread_mutex_lock(&h->lock);
		fuse_reply_buf(req, h->text + o, n);
		pthread_mutex_unlock(&h->lock);
		return;
	}
	if (h->kind != FH_READ && h->kind != FH_CAND) {
		fuse_reply_err(req, EBUSY); /* a file being written is not readable yet */
		return;
	}
	pthread_mutex_lock(&h->lock);
	if (!h->rf) { /* a write open of a committed file: read it */
		int rc = h->kind == FH_CAND ? kvc_file_open(m->c, h->ino, &h->rf) : -EBUSY;
		if (rc) {
			pthread_mutex_unlock(&h->lock);
			fuse_reply_err(req, -rc);
			return;
		}
	}
	uint64_t o = (uint64_t)off, fsize = kvc_file_size(h->rf), wend = h->woff + h->wlen;
	int hit = o >= h->woff && o < wend && (o + size <= wend || wend >= fsize);
	if (!hit) {
		/* Miss. A sequential reader (from the start, or where the last read ended) gets a
		 * whole read-ahead window in one kvc_pread, so the chunks of the stripes ahead are
		 * fetched in parallel instead of one kernel request at a time; a random read
		 * fetches just what it asks. */
		size_t want = size;
		if ((o == 0 || o == h->next) && m->cfg.readahead > want)
			want = (size_t)m->cfg.readahead;
		if (o < fsize && want > fsize - o)
			want = (size_t)(fsize - o) > size ? (size_t)(fsize - o) : size;
		if (h->cap < want) {
			char *nb = realloc(h->buf, want);
			if (!nb) {
				pthread_mutex_unlock(&h->lock);
				fuse_reply_err(req, ENOMEM);
				return;
			}
			h->buf = nb;
			h->cap = want;
		}
		h->wlen = 0;
		ssize_t n = o >= fsize ? 0 : kvc_pread(h->rf, h->buf, want, o);
		if (n < 0) {
			pthread_mutex_unlock(&h->lock);
			klog_error("read of inode %llu at %lld (+%zu) failed: %s",
				   (unsigned long long)h->ino, (long long)off, want,
				   kvp_strerror((int)n));
			fuse_reply_err(req, (int)-n);
			return;
		}
		h->woff = o;
		h->wlen = (size_t)n;
	}
	size_t n = 0;
	if (o >= h->woff && o < h->woff + h->wlen) {
		n = (size_t)(h->woff + h->wlen - o);
		if (n > size)
			n = size;
	}
	h->next = o + n;
	atomic_fetch_add_explicit(&m->n.reads, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&m->n.read_bytes, (unsigned long long)n, memory_order_relaxed);
	fuse_reply_buf(req, h->buf + (o - h->woff) * (n > 0), n);
	pthread_mutex_unlock(&h->lock);
}

/* A write of a replacement past the old version's size makes the kernel grow the size of the
 * inode it shares with the old version's readers; one of them reading past the old end at that
 * moment would get zeros. Readers opened since the replacement began bypass the page cache, so
 * only those from before are waited for (briefly: a reader that stays open wins after 2 s). */
static void wait_old_readers(struct mnt *m, struct mnt_wfile *wf)
{
	pthread_mutex_lock(&wf->lock);
	int ok = wf->grow_ok;
	pthread_mutex_unlock(&wf->lock);
	if (ok)
		return;
	if (mnt_itab_wait_readers(m->itab, wf->nodeid, 2000) > 0)
		klog_info(
		    "replacing '%s': a reader of the old version still has it open after 2 s; "
		    "the new version grows past the old size now",
		    wf->name);
	pthread_mutex_lock(&wf->lock);
	wf->grow_ok = 1;
	pthread_mutex_unlock(&wf->lock);
}

/* kvc_fill_fn over a FUSE bufvec (memory or a pipe): fuse_buf_copy reads it into dst. */
static ssize_t fill_bufvec(void *arg, void *dst, size_t len)
{
	struct fuse_bufvec d = FUSE_BUFVEC_INIT(len);
	d.buf[0].mem = dst;
	return fuse_buf_copy(&d, arg, 0);
}

void mnt_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *bufv, off_t off,
		   struct fuse_file_info *fi)
{
	size_t size = fuse_buf_size(bufv);
	struct mnt *m = mnt_of(req);
	struct fh *h = fh_of(fi);
	if (h->kind == FH_CAND) {
		atomic_fetch_add_explicit(&m->n.erofs, 1, memory_order_relaxed);
		klog_warn("write to committed file '%s' (inode %llu) refused (EROFS): kvfs files "
			  "are written once; open with O_TRUNC to replace it",
			  h->name, (unsigned long long)h->ino);
		fuse_reply_err(req, EROFS);
		return;
	}
	if (h->kind != FH_WRITE || off < 0) {
		fuse_reply_err(req, h->kind != FH_WRITE ? EBADF : EINVAL);
		return;
	}
	struct mnt_wfile *wf = h->wf;
	if (wf->repl_itab && (uint64_t)off + size > wf->old.size)
		wait_old_readers(m, wf);
	pthread_mutex_lock(&wf->lock);
	if (!wf->w) {
		pthread_mutex_unlock(&wf->lock);
		atomic_fetch_add_explicit(&m->n.erofs, 1, memory_order_relaxed);
		klog_warn("write to '%s' (node %llu) after it was committed refused (EROFS): kvfs "
			  "files are written once and published at close",
			  wf->name, (unsigned long long)ino);
		fuse_reply_err(req, EROFS);
		return;
	}
	/* O_APPEND: the end of the file is the end of what this writer has buffered. The kernel
	 * put off at its size of the inode, which for a replacement is still the old file's (so
	 * the first append would land past a hole of the old size). */
	int append = (fi->flags & O_APPEND) != 0;
	uint64_t at = append ? kvc_writer_size(wf->w) : (uint64_t)off;
	uint64_t epoch = kvc_buffer_epoch(m->c);
	ssize_t n = kvc_write_fill(wf->w, at, size, fill_bufvec, bufv);
	/* The process-wide buffer budget is shared: wait for other files' commits to give some
	 * back (libkvfs signals each freed writer) before failing, up to MNT_BUFFER_WAIT_MS. */
	struct timespec until;
	kvfs_deadline(&until, CLOCK_MONOTONIC, MNT_BUFFER_WAIT_MS);
	while (n == -ENOMEM) {
		struct timespec now;
		clock_gettime(CLOCK_MONOTONIC, &now);
		long left = (long)(until.tv_sec - now.tv_sec) * 1000 +
			    (until.tv_nsec - now.tv_nsec) / 1000000;
		if (left <= 0)
			break;
		pthread_mutex_unlock(&wf->lock);
		int rc = kvc_buffer_wait(m->c, epoch, (int)left);
		pthread_mutex_lock(&wf->lock);
		if (rc)
			break; /* none freed in time: n stays -ENOMEM */
		if (wf->w && append)
			at = kvc_writer_size(wf->w);
		epoch = kvc_buffer_epoch(m->c);
		n = wf->w ? kvc_write_fill(wf->w, at, size, fill_bufvec, bufv) : -EROFS;
	}
	if (n > 0)
		wf->dirty = 1;
	else if (n < 0 && n != -EROFS)
		wf->failed = n == -ENOMEM ? -ENOSPC : (int)n;
	pthread_mutex_unlock(&wf->lock);
	if (n < 0) {
		if (n == -EFBIG)
			klog_warn("write to '%s' at %lld: file larger than max-file (%llu bytes): "
				  "EFBIG",
				  wf->name, (long long)off, (unsigned long long)m->cfg.max_file);
		else if (n == -ENOMEM)
			klog_warn("write to '%s': writer buffers full (max-buffered %llu bytes)",
				  wf->name, (unsigned long long)m->cfg.max_buffered);
		fuse_reply_err(req, n == -ENOMEM ? ENOSPC : (int)-n);
		return;
	}
	atomic_fetch_add_explicit(&m->n.writes, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&m->n.write_bytes, (unsigned long long)n, memory_order_relaxed);
	fuse_reply_write(req, (size_t)n);
}

void mnt_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mnt *m = mnt_of(req);
	struct fh *h = fh_of(fi);
	pid_t pid = fuse_req_ctx(req)->pid;
	if (h->kind != FH_WRITE || !mnt_proc_of(h->owner, pid)) {
		/* Another process's copy of the descriptor closes (a forked child exits or execs):
		 * what it wrote stays in the file, which its owner's close (or the last release)
		 * publishes. Killed or not, it must not end the owner's file. */
		if (h->kind == FH_WRITE)
			atomic_fetch_add_explicit(&m->n.foreign_flushes, 1, memory_order_relaxed);
		fuse_reply_err(req, 0);
		return;
	}
	struct mnt_wfile *wf = h->wf;
	int rc = 0;
	pthread_mutex_lock(&wf->lock);
	int open = wf->w != NULL, maybe_last = wf->dirty && wf->handles == 1 && !wf->failed;
	pthread_mutex_unlock(&wf->lock);
	struct mnt_close_info ci = {0, 0};
	if (open)
		mnt_proc_close_info(m, pid, h->owner, ino, maybe_last, &ci);
	pthread_mutex_lock(&wf->lock);
	if (ci.killed)
		wf->killed = 1;
	/* The owner's last descriptor: a close of one of several (dash's `>&2` saves fd 1 by
	 * duplicating and closing it while fd 2 stays the file) is not the end of its writing. */
	int last = wf->w && wf->dirty && wf->handles == 1 && !ci.killed && !wf->failed &&
		   !ci.holds_another;
	if (wf->w && (last || ci.killed || wf->failed))
		rc = wfile_finish(m, wf);
	if (!wf->w || last)
		wf->dirty = 0;
	pthread_mutex_unlock(&wf->lock);
	fuse_reply_err(req, ci.killed ? 0 : -rc);
}

void mnt_fh_drop_all(struct mnt *m)
{
	size_t n = 0;
	for (;;) {
		pthread_mutex_lock(&m->fh_lock);
		struct fh *h = m->fh_live;
		if (h)
			fh_unlink_locked(h);
		pthread_mutex_unlock(&m->fh_lock);
		if (!h)
			break;
		if (h->kind == FH_CAND) {
			pthread_mutex_lock(&m->cand_lock);
			cand_unlink(m, h);
			pthread_mutex_unlock(&m->cand_lock);
		}
		if (h->kind == FH_WRITE) { /* dropped, not committed: the writer never closed it */
			pthread_mutex_lock(&h->wf->lock);
			h->wf->handles--;
			pthread_mutex_unlock(&h->wf->lock);
		}
		if (h->cached_node)
			mnt_itab_readers(m->itab, h->cached_node, -1);
		fh_free(h);
		n++;
	}
	if (n)
		klog_info("freed %zu file handles the kernel did not release before the unmount",
			  n);
}

void mnt_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	fh_drop(mnt_of(req), fh_of(fi));
	fuse_reply_err(req, 0);
}

void mnt_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	(void)ino, (void)datasync, (void)fi;
	/* A new file becomes durable at its commit (close); before that there is nothing
	 * partial to make durable, and committed files are durable already. */
	fuse_reply_err(req, 0);
}
