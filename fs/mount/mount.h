/* mount — kvfs-mount internals shared by its files (not a library: one program).
 *
 *   mount_main.c    options (cfg table, -o, config file), lifecycle, daemonizing
 *   mount_ops.c     the fuse_lowlevel_ops table and the namespace handlers (mnt_*)
 *   mount_io.c      open/create/read/write/flush/release: readers and write-once writers
 *   mount_inode.c   the inode table: FUSE node ids, lookup counts, names, new-file writers
 *   mount_status.c  the .kvfs/ status directory and the user.kvfs.* extended attributes
 *   mount_inval.c   a thread that tells the kernel to drop stale names (dentry invalidation)
 *   mount_proc.c    the process behind a request: its thread group, its descriptors, a kill
 *
 * FUSE node ids: a committed file or directory uses its metadata inode number. A new file,
 * until its writer commits, gets a temporary id (MNT_TEMP_BASE | n); after the commit the id
 * maps to the real inode (so open handles and the creator's dentry keep working). The .kvfs/
 * entries use ids at MNT_VIRT_BASE. Metadata inodes are assumed below 2^62 and never reused.
 *
 * Replacement (open with O_TRUNC of a committed file): the writer necessarily shares the kernel
 * inode (node id N) of the file it replaces, whose page cache and size readers of the old
 * version use. So N keeps standing for the OLD file in the kernel's eyes: while the writer runs,
 * new read opens of N bypass the page cache (direct_io: the writer's writes move the kernel's
 * size of N), and a write past the old size first waits (up to 2 s) for the old version's
 * page-cache readers to close, since for them the grown size would read as zeros past the old
 * end; after the commit N is "replaced": getattr answers the old file's attributes (so
 * open handles of the old version keep a consistent size) and every new open of N fails with
 * ESTALE, which makes the kernel look the name up again (the VFS retries an open once with
 * revalidation) and open the new file under its own node id, with its own size and page cache.
 * The same ESTALE answers an open of a node id whose inode is gone (replaced or removed
 * elsewhere). So that `stat` shows the new file at once, not after --entry-timeout, a thread
 * (mount_inval.c) drops the name from the kernel's dentry cache when the replacement starts,
 * and until it ends lookups of N are answered uncached (entry_timeout 0); the commit waits for
 * that drop only if it has not landed yet (cand_convert, wfile_finish in mount_io.c).
 *
 * Threading: handlers run on fuse_session_loop_mt worker threads. struct mnt is shared; each
 * field says what protects it. Every request is answered exactly once.
 */
#ifndef KVFS_MOUNT_H
#define KVFS_MOUNT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/stat.h>

#include <fuse_lowlevel.h>

#include "cfg.h"
#include "kvc.h"
#include "kvch.h"

#define MNT_TEMP_BASE	(1ull << 63)
#define MNT_VIRT_BASE	(1ull << 62)
#define MNT_VIRT_DIR	(MNT_VIRT_BASE + 1) /* <mnt>/.kvfs */
#define MNT_STATUS_NAME ".kvfs"

struct mnt_cfg {
	char secret_file[CFG_STR_MAX];
	char config[CFG_STR_MAX];
	char log_file[CFG_STR_MAX];
	char metrics_listen[CFG_STR_MAX], metrics_addr_file[CFG_STR_MAX];
	double entry_timeout, attr_timeout; /* kernel cache of names / attributes */
	double timeout;			    /* per request to meta or a node */
	double meta_retry;		    /* keep retrying meta this long while it is away */
	uint64_t max_file, max_buffered;    /* writer buffers: one file / all files */
	uint64_t readahead;		    /* kernel read-ahead window (bdi read_ahead_kb) */
	int64_t k, m;			    /* 0 = the cluster's default */
	uint64_t chunk;			    /* 0 = the cluster's chunk size */
	int64_t threads;		    /* FUSE worker threads (at most) */
	int64_t log_level;
	int64_t lease_after; /* lookups in a directory within 1 s before a lease (0: never) */
	double lease;	     /* lease length asked for */
	double lease_pin;    /* kernel keeps names answered from a lease (0: the lease's rest) */
	int foreground, debug, allow_other, readdirplus, keep_cache, xattr, lookup_layout;
	int splice_write;
	int open_prefetch; /* a read open of an inode with no pages yet starts its GETs */
};

struct mnt_itab;
struct fh;
struct mnt_metrics;
struct mnt_inval;

/* Counters (relaxed atomics) shown in .kvfs/stats. */
struct mnt_counters {
	atomic_ullong lookups, opens, reads, read_bytes, writes, write_bytes;
	atomic_ullong open_prefetches; /* read opens that started the first stripe's GETs */
	atomic_ullong commits, commit_errors, aborted, erofs, retries;
	atomic_ullong foreign_flushes; /* closes of a write handle's copy in another process */
	atomic_ullong inval_waits; /* replacement commits that waited for the kernel's name drop */
	atomic_ullong inval_wait_us; /* and how long, in total */
	atomic_ullong lease_invals;  /* names dropped from the kernel: their lease ended */
};

struct mnt {
	struct kvc *c;		     /* thread-safe */
	struct kvc_lease *lease;     /* thread-safe; NULL: no directory leases */
	struct fuse_session *se;     /* set once before the loop starts */
	struct mnt_cfg cfg;	     /* read-only after start */
	struct mnt_itab *itab;	     /* its own lock */
	char meta_addr[CFG_STR_MAX]; /* one address, or every replica's, comma-separated */
	char mountpoint[CFG_STR_MAX];
	int mnt_id; /* the kernel's id of this mount (mountinfo), set once mounted; 0 = unknown */
	uid_t uid;
	gid_t gid;
	int64_t start_ns;
	atomic_ullong next_temp;
	struct mnt_counters n;
	struct mnt_metrics *metrics; /* set before the session starts (mount_metrics.h) */
	/* Commits running from release (empty or shared files): a negative lookup or a readdir
	 * waits for them briefly, so `touch f; ls` shows f. */
	pthread_mutex_t rel_lock;
	pthread_cond_t rel_cond;
	int rel_commits; /* rel_lock */
	/* Write opens of committed files, waiting for the truncate to 0 that an O_TRUNC open
	 * sends right after the open (mount_io.c); LIFO. */
	pthread_mutex_t cand_lock;
	struct fh *cands;	 /* cand_lock */
	struct mnt_inval *inval; /* set before the session loop starts; may be NULL */
	/* Our own changes at meta in flight: mkdir, rmdir, unlink, rename (the kernel holds the
	 * directory's lock meanwhile) and commits (a writer's close waiting): a revocation they
	 * cause must not wait for an invalidation of that directory (mnt_lease_lost). */
	atomic_int ns_busy;
	pthread_mutex_t fh_lock;
	struct fh *fh_live; /* fh_lock; every handle not yet released (mount_io.c) */
	/* Times recently set on inodes by setattr (mnt_dirtimes_*), a ring. */
	pthread_mutex_t dt_lock;
	struct mnt_dirtime {
		uint64_t ino;
		int64_t noted_ns; /* mnt_now_ns() before the set was sent */
		uint32_t valid;	  /* KVP_SET_MTIME | KVP_SET_ATIME */
		int64_t mtime_ns, atime_ns;
	} dt[32];	  /* dt_lock */
	unsigned dt_next; /* dt_lock */
};

/* The writer of a file being written: a new file (temporary node id) or the replacement of a
 * committed one (opened with O_TRUNC). Shared by the handles of one new file; refcounted. */
struct mnt_wfile {
	pthread_mutex_t lock;
	atomic_int refs;      /* handles + the inode-table entry of a new file */
	struct kvc_writer *w; /* lock; NULL once committed or aborted */
	int handles;	      /* lock; open handles */
	int dirty;	      /* lock; written since the last flush */
	int killed;	      /* lock; a flush came from a process killed by a signal */
	int failed;	      /* lock; a write failed (-errno): the file is dropped at close */
	int err;	      /* lock; the commit's result once w is NULL */
	uint64_t nodeid;      /* the FUSE node id the handles were opened on */
	uint64_t parent;      /* meta inode of the directory */
	char name[KVP_NAME_MAX + 1];
	uint32_t mode;		    /* lock; S_IFREG | permission bits */
	int set_mode;		    /* lock; chmod while writing: apply after commit */
	int64_t mtime_ns, atime_ns; /* lock; 0 = not set while writing */
	int64_t ctime_ns;	    /* creation */
	uint32_t uid, gid;	    /* owner (KVP_OWNER_NONE: the mount's user), set at creation */
	struct kvp_attr attr;	    /* lock; after a successful commit */
	/* A replacement: the inode table whose entry for nodeid counts this writer as
	 * "replacing" (uncounted when the writer is freed), and the replaced file's attributes. */
	struct mnt_itab *repl_itab;
	struct kvp_attr old;
	uint64_t
	    inval_ticket; /* replacement: its name's notification queued at the start (0: none) */
	int grow_ok;	  /* lock; the old version's page-cache readers are gone (mnt_write) */
};

/* The option table (mount_cfg.c): fills struct mnt_cfg; main parses with it, .kvfs/ dumps it. */
extern const struct cfg_opt mnt_cfg_opts[];

/* ---- inode table and writer references (mount_inode.c); thread-safe ---- */
struct mnt_inode_info {
	uint64_t ino;  /* meta inode (0: a new file not yet committed) */
	uint32_t mode; /* S_IFREG / S_IFDIR | bits, as last seen (0: unknown) */
	uint64_t parent;
	char name[KVP_NAME_MAX + 1];
	int redirected;	      /* ino differs from the node id (committed new file or replaced) */
	int replacing;	      /* writers replacing this committed file are running */
	int cached_readers;   /* open read handles that use the kernel's page cache */
	int replaced;	      /* a replacement committed: the node id's file is gone (see top) */
	struct kvp_attr old;  /* when replaced: the attributes of the file the node id was */
	int known;	      /* last is set */
	struct kvp_attr last; /* the metadata attributes last answered for the node id */
	struct mnt_wfile *wf; /* new file's writer with a reference taken, or NULL */
};
int mnt_itab_create(struct mnt_itab **out);
void mnt_itab_destroy(struct mnt_itab *t); /* drops the writer references it holds */
/* One more kernel reference (a lookup, create, mkdir or readdirplus entry) for nodeid, whose
 * metadata inode is ino (of type mode), found as name in parent. wf (may be NULL) is a new file's
 * writer: the table takes its own reference. -ENOMEM. */
int mnt_itab_ref(struct mnt_itab *t, uint64_t nodeid, uint64_t ino, uint32_t mode, uint64_t parent,
		 const char *name, struct mnt_wfile *wf);
/* The kernel dropped n references; the entry goes when none remain. */
void mnt_itab_forget(struct mnt_itab *t, uint64_t nodeid, uint64_t n);
/* Fills *out for nodeid. -ENOENT when the table has no entry (then a committed node id is its
 * own inode and nothing is known of its name). The caller puts out->wf (mnt_wfile_put). */
int mnt_itab_get(struct mnt_itab *t, uint64_t nodeid, struct mnt_inode_info *out);
/* From now on nodeid stands for metadata inode ino (a commit). */
void mnt_itab_set_ino(struct mnt_itab *t, uint64_t nodeid, uint64_t ino);
/* A writer replacing nodeid's file starts (delta 1) or ends (-1). No-op without an entry. */
void mnt_itab_replacing(struct mnt_itab *t, uint64_t nodeid, int delta);
/* 1 while writers replacing nodeid's file run (its entries are then answered uncached). */
int mnt_itab_is_replacing(struct mnt_itab *t, uint64_t nodeid);
/* A read handle using the page cache opens (1) or closes (-1) on nodeid. */
void mnt_itab_readers(struct mnt_itab *t, uint64_t nodeid, int delta);
/* Blocks until nodeid has no page-cache reader left (or no entry), at most timeout_ms; returns
 * how many are left (0: none). Woken by the close of the last one, not by polling. */
int mnt_itab_wait_readers(struct mnt_itab *t, uint64_t nodeid, int timeout_ms);
/* A read handle opens on nodeid: 0 when a replacement of it is running (the handle must not
 * use the page cache), else 1, and the handle is counted as a page-cache reader (close it
 * with mnt_itab_readers(-1)). One step under the table's lock, so a replacement that starts
 * meanwhile either sees this reader or is seen by it. */
int mnt_itab_reader_open(struct mnt_itab *t, uint64_t nodeid);
/* The first page-cache read open of nodeid since the kernel looked it up afresh: 1 once (the
 * kernel's inode is new, so it holds no pages of the file and its READs will come here), then
 * 0 until the kernel forgets the node id (an evicted inode takes its pages with it). 1 too
 * without an entry (nothing known). Inodes whose pages were reclaimed while the kernel kept
 * them answer 0: a lost prefetch, not a wrong one. */
int mnt_itab_first_read(struct mnt_itab *t, uint64_t nodeid);
/* A replacement of nodeid's file committed as ino; old = the replaced file's attributes. */
void mnt_itab_set_replaced(struct mnt_itab *t, uint64_t nodeid, uint64_t ino,
			   const struct kvp_attr *old);
/* Records a (lookup or getattr) answer a for nodeid, whose metadata inode is a->ino: what
 * getattr answers once that inode is gone while the kernel still holds the node id. No-op
 * without an entry. */
void mnt_itab_set_attr(struct mnt_itab *t, uint64_t nodeid, const struct kvp_attr *a);
/* Records a rename of the entry for ino. */
void mnt_itab_rename(struct mnt_itab *t, uint64_t ino, uint64_t newparent, const char *newname);
size_t mnt_itab_count(struct mnt_itab *t);

/* Drops a reference to a writer (the inode table, handles and .kvfs/ hold them); the last
 * one aborts a writer never committed and ends its replacement mark. */
void mnt_wfile_put(struct mnt_wfile *wf);

/* ---- writers and file handles (mount_io.c) ---- */
/* Attributes of a file being written (size = bytes buffered so far). */
void mnt_wfile_stat(struct mnt *m, struct mnt_wfile *wf, struct stat *st);
/* setattr on a file being written: size (truncate the buffer), mode and times are kept and
 * applied at commit. Returns 0 or -errno; fills *st. */
int mnt_wfile_setattr(struct mnt *m, struct mnt_wfile *wf, const struct stat *attr, int to_set,
		      struct stat *st);
/* A truncate to 0 of committed nodeid (through handle fi, or, for open(O_TRUNC), by the
 * thread pid that just opened it for writing) starts that handle's replacement writer and
 * fills *old with the attributes of the file it replaces (what the truncate answers: the
 * kernel's inode stays that file's until the commit, even if another writer's commit has
 * already removed it from metadata). -ENOENT when no such handle waits. */
int mnt_replace_begin(struct mnt *m, uint64_t nodeid, struct fuse_file_info *fi, pid_t pid,
		      struct kvp_attr *old);
/* After the session loop has ended (no request in flight): frees the handles the kernel will
 * never release now (libfuse sends no RELEASE for files still open when the daemon stops);
 * files being written through them are dropped, not published. */
void mnt_fh_drop_all(struct mnt *m);
/* The handle's writer (referenced) when fi is a write handle still being written, else NULL. */
struct mnt_wfile *mnt_fh_writer(struct fuse_file_info *fi);

void mnt_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		struct fuse_file_info *fi);
void mnt_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void mnt_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi);
/* When the process-wide writer budget (--max-buffered) is full, a write blocks its FUSE thread
 * until another file's commit or abort gives buffer memory back (kvc_buffer_wait: a condition,
 * no polling), up to MNT_BUFFER_WAIT_MS in all, then answers ENOSPC. */
#define MNT_BUFFER_WAIT_MS 10000
/* FUSE's write_buf: the data is in libfuse's buffer, or with --splice-write still in a pipe
 * (libfuse spliced the request out of /dev/fuse, FUSE_CAP_SPLICE_READ), and is copied once,
 * straight into the file's buffer (kvc_write_fill). */
void mnt_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *bufv, off_t off,
		   struct fuse_file_info *fi);
void mnt_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void mnt_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void mnt_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi);

/* ---- dentry invalidation (mount_inval.c) ----
 * fuse_lowlevel_notify_inval_entry must not run inside a request the kernel may be waiting on
 * with the directory locked, so a thread of its own sends it. Queueing never blocks; when the
 * queue is full the name is dropped (it then expires after --entry-timeout, as without this). */
int mnt_inval_start(struct mnt *m); /* after the session is mounted; 0 or -errno */
/* Unmount, in this order (mount_main.c): mnt_inval_close (nothing more is queued; the thread
 * ends after the notification in flight, if any), then keep answering requests while
 * mnt_inval_busy (that notification may wait for a directory lock held by a process waiting
 * for one of our replies), then mnt_inval_stop (joins the thread, frees it; without a timeout),
 * and only then destroy the session. All NULL-safe (no thread). */
void mnt_inval_close(struct mnt *m);
int mnt_inval_busy(struct mnt *m); /* 1 until the thread has returned */
void mnt_inval_stop(struct mnt *m);
/* Queues name in directory parent. wait_ms > 0: then waits up to that long for the kernel to
 * have taken it (never forever: the thread may be waiting on a directory lock). Returns 0,
 * -ETIMEDOUT (queued, not yet sent), -ENOSPC (dropped) or -ENOENT (no thread, or stopping). */
int mnt_inval_entry(struct mnt *m, uint64_t parent, const char *name, int wait_ms);
/* kvc_lease_opts.lost for the mount (arg: the mnt): queues the invalidation of each name the
 * kernel was told to keep (--lease-pin) in directory dir, and waits (up to 500 ms) for them
 * to reach the kernel before returning, unless one of our own directory changes is in flight
 * (ns_busy: the kernel may hold the directory's lock for it, waiting on this revocation; a
 * commit: its writer's close would wait for names it did not touch), or a commit from a
 * release (a negative lookup waits for those holding the lock shared). */
void mnt_lease_lost(void *arg, uint64_t dir, const char *names, size_t n);
/* The same in two steps. mnt_inval_queue: never blocks; 0 and *ticket, -ENOSPC or -ENOENT.
 * mnt_inval_wait: 0 once the kernel has applied notification `ticket` (the name is no longer
 * cached, or was not: -ENOENT from the kernel counts as done), waiting up to wait_ms (0: just
 * look); -ETIMEDOUT (not sent yet), -EIO (the kernel refused it, or one queued after it: do
 * not count on it), -ENOENT (no thread, or stopping). */
int mnt_inval_queue(struct mnt *m, uint64_t parent, const char *name, uint64_t *ticket);
int mnt_inval_wait(struct mnt *m, uint64_t ticket, int wait_ms);

/* ---- the process behind a request (mount_proc.c) ----
 * FUSE requests carry the calling thread's id (0 when it lives in another pid namespace). A
 * write handle belongs to the process (thread group) that opened it, its owner: only the
 * owner's closes can publish or drop its file (mount_io.c). */
/* The thread group of thread tid (/proc/TID/status); 0 when unknown. */
pid_t mnt_proc_tgid(pid_t tid);
/* 1 when thread tid belongs to process owner, or either is unknown (then a close counts as the
 * owner's). One stat of /proc/OWNER/task/TID; never blocks on the process. */
int mnt_proc_of(pid_t owner, pid_t tid);
struct mnt_close_info {
	int killed;	   /* the closing process is dying from a signal */
	int holds_another; /* the owner still has another descriptor of the file */
};
/* What the owner's close (a flush from thread tid) of the file the kernel knows as nodeid
 * means; want_fds: also look for the owner's other descriptors (else holds_another is 0).
 * /proc answers for a process in execve only once the exec goes on, which waits for this
 * flush: so this waits at most 200 ms, and an unanswered look counts as not killed and still
 * held (the commit then happens at the last release: a descriptor without O_CLOEXEC outlives
 * the exec, and the exec'ing process never sees a close-on-exec's error anyway). */
void mnt_proc_close_info(const struct mnt *m, pid_t tid, pid_t owner, uint64_t nodeid, int want_fds,
			 struct mnt_close_info *out);

/* ---- metadata helpers (mount_meta.c): used by mount_ops.c and mount_io.c ---- */
/* Wall-clock now in ns (CLOCK_REALTIME: file times). */
int64_t mnt_now_ns(void);
/* Metadata attributes -> struct stat as the mount reports them (st_blocks from stored bytes,
 * directories with size 0, owner: mnt_owner). */
void mnt_attr_to_stat(const struct mnt *m, const struct kvp_attr *a, struct stat *st);
/* st_uid / st_gid of a: with allow_other, the owner recorded at creation (the kernel checks
 * modes against it: default_permissions); otherwise, or when none was recorded, the mounting
 * user, so a single-user mount reads as before owners were kept. */
void mnt_owner(const struct mnt *m, const struct kvp_attr *a, struct stat *st);
/* Meta calls that may be retried while the metadata server is away, by kvch's one retry policy
 * (KVCH_RETRY_MOUNT, fs/chunk/kvch.h): every 250 ms on a transport error, within --meta-retry
 * from the request's start (mnt_retry_start), counting the time the failed calls themselves
 * take (libkvfs retries a refused connection for ~5.5 s, an unanswered request for two
 * timeouts), not only the waits between them.
 *
 *   struct mnt_retry r;
 *   mnt_retry_start(m, &r);
 *   do rc = kvc_...(...); while (rc && mnt_retry(m, &rc, &r));
 *
 * mnt_retry returns 1 (after the wait: it blocks the FUSE thread up to 250 ms) when *rc is a
 * transport error (kvch_is_transport) or -EREMCHG (no replica of a replicated meta leads yet)
 * and another attempt, expected to take as long as the one
 * that just failed, still ends before the deadline; else 0, and a transport *rc becomes -EIO
 * (what the application sees once the budget is spent). Other errors are left as they are. */
struct mnt_retry {
	struct kvch_retry r;
};
void mnt_retry_start(const struct mnt *m, struct mnt_retry *r);
int mnt_retry(struct mnt *m, int *rc, struct mnt_retry *r);
/* A directory's times set explicitly must outlast the commits of files created in it before:
 * cp -a, rsync -a and tar x set a directory's times once it is filled, and a file published at
 * its last release (an empty one) lands after that and moves the mtime. mnt_dirtimes_note
 * records a setattr of times (before it is sent); mnt_dirtimes_restore, after a commit of a
 * file created at created_ns in dir, sets again the latest times noted for dir since then. */
void mnt_dirtimes_note(struct mnt *m, uint64_t ino, uint32_t valid, int64_t mtime_ns,
		       int64_t atime_ns);
void mnt_dirtimes_restore(struct mnt *m, uint64_t dir, int64_t created_ns);

/* ---- namespace (mount_ops.c) ---- */
extern const struct fuse_lowlevel_ops mnt_ops;
/* Blocks up to ~2 s while commits started from release are running. */
void mnt_wait_release_commits(struct mnt *m);

/* ---- .kvfs/ and xattrs (mount_status.c) ---- */
int mnt_virt_is(uint64_t nodeid);
/* Entry for name in the root (".kvfs") or in .kvfs/; -ENOENT otherwise. */
int mnt_virt_lookup(struct mnt *m, uint64_t parent, const char *name, struct stat *st);
int mnt_virt_getattr(struct mnt *m, uint64_t nodeid, struct stat *st);
/* Snapshot of a status file's text (malloc'd, caller frees). */
int mnt_virt_read_all(struct mnt *m, uint64_t nodeid, char **buf, size_t *len);
/* readdir of .kvfs/: fills buf from entry index off. */
size_t mnt_virt_readdir(struct mnt *m, fuse_req_t req, char *buf, size_t size, off_t off, int plus);
void mnt_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size);
void mnt_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size);

static inline struct mnt *mnt_of(fuse_req_t req)
{
	return (struct mnt *)fuse_req_userdata(req);
}

#endif
