/* kvfs-mount metrics: see mount_metrics.h. Handler time is what is measured: each handler
 * answers its request before it returns (mount.h), so it is the request's latency in the daemon. */
#define KVFS_LOG_TAG "mount"
#include "mount_metrics.h"
#include "log.h"
#include "metrics.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
	OP_LOOKUP,
	OP_FORGET,
	OP_GETATTR,
	OP_SETATTR,
	OP_READLINK,
	OP_MKNOD,
	OP_MKDIR,
	OP_UNLINK,
	OP_RMDIR,
	OP_SYMLINK,
	OP_RENAME,
	OP_LINK,
	OP_OPEN,
	OP_READ,
	OP_WRITE,
	OP_FLUSH,
	OP_RELEASE,
	OP_FSYNC,
	OP_OPENDIR,
	OP_READDIR,
	OP_RELEASEDIR,
	OP_STATFS,
	OP_SETXATTR,
	OP_GETXATTR,
	OP_LISTXATTR,
	OP_REMOVEXATTR,
	OP_ACCESS,
	OP_CREATE,
	OP_FALLOCATE,
	OP_READDIRPLUS,
	OP_N
};
static const char *const op_names[OP_N] = {
    "lookup",	 "forget",	"getattr",    "setattr", "readlink",  "mknod",
    "mkdir",	 "unlink",	"rmdir",      "symlink", "rename",    "link",
    "open",	 "read",	"write",      "flush",	 "release",   "fsync",
    "opendir",	 "readdir",	"releasedir", "statfs",	 "setxattr",  "getxattr",
    "listxattr", "removexattr", "access",     "create",	 "fallocate", "readdirplus"};

struct mnt_metrics {
	struct fuse_lowlevel_ops real, wrapped;
	struct met_reg *r;
	struct met_http *http;
	struct met_ops *ops;
	struct mnt *m;
};

static uint64_t mono_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* The request is answered (and freed) inside the real handler: only m is used after it. */
#define WRAP(op, idx, params, args)                                                                \
	static void w_##op params                                                                  \
	{                                                                                          \
		struct mnt_metrics *mm = ((struct mnt *)fuse_req_userdata(req))->metrics;          \
		uint64_t t0 = mono_ns();                                                           \
		mm->real.op args;                                                                  \
		met_ops_observe(mm->ops, idx, 0, mono_ns() - t0);                                  \
	}

typedef fuse_req_t R;
typedef fuse_ino_t I;
typedef struct fuse_file_info FI;
WRAP(lookup, OP_LOOKUP, (R req, I p, const char *n), (req, p, n))
WRAP(forget, OP_FORGET, (R req, I i, uint64_t n), (req, i, n))
WRAP(forget_multi, OP_FORGET, (R req, size_t c, struct fuse_forget_data *f), (req, c, f))
WRAP(getattr, OP_GETATTR, (R req, I i, FI *fi), (req, i, fi))
WRAP(setattr, OP_SETATTR, (R req, I i, struct stat *a, int s, FI *fi), (req, i, a, s, fi))
WRAP(readlink, OP_READLINK, (R req, I i), (req, i))
WRAP(mknod, OP_MKNOD, (R req, I p, const char *n, mode_t mo, dev_t d), (req, p, n, mo, d))
WRAP(mkdir, OP_MKDIR, (R req, I p, const char *n, mode_t mo), (req, p, n, mo))
WRAP(unlink, OP_UNLINK, (R req, I p, const char *n), (req, p, n))
WRAP(rmdir, OP_RMDIR, (R req, I p, const char *n), (req, p, n))
WRAP(symlink, OP_SYMLINK, (R req, const char *l, I p, const char *n), (req, l, p, n))
WRAP(rename, OP_RENAME, (R req, I p, const char *n, I np, const char *nn, unsigned f),
     (req, p, n, np, nn, f))
WRAP(link, OP_LINK, (R req, I i, I np, const char *nn), (req, i, np, nn))
WRAP(open, OP_OPEN, (R req, I i, FI *fi), (req, i, fi))
WRAP(read, OP_READ, (R req, I i, size_t s, off_t o, FI *fi), (req, i, s, o, fi))
WRAP(write, OP_WRITE, (R req, I i, const char *b, size_t s, off_t o, FI *fi), (req, i, b, s, o, fi))
/* why: the mount writes through write_buf; an operator still reads it as op="write" */
WRAP(write_buf, OP_WRITE, (R req, I i, struct fuse_bufvec *b, off_t o, FI *fi), (req, i, b, o, fi))
WRAP(flush, OP_FLUSH, (R req, I i, FI *fi), (req, i, fi))
WRAP(release, OP_RELEASE, (R req, I i, FI *fi), (req, i, fi))
WRAP(fsync, OP_FSYNC, (R req, I i, int d, FI *fi), (req, i, d, fi))
WRAP(opendir, OP_OPENDIR, (R req, I i, FI *fi), (req, i, fi))
WRAP(readdir, OP_READDIR, (R req, I i, size_t s, off_t o, FI *fi), (req, i, s, o, fi))
WRAP(releasedir, OP_RELEASEDIR, (R req, I i, FI *fi), (req, i, fi))
WRAP(statfs, OP_STATFS, (R req, I i), (req, i))
WRAP(setxattr, OP_SETXATTR, (R req, I i, const char *n, const char *v, size_t s, int f),
     (req, i, n, v, s, f))
WRAP(getxattr, OP_GETXATTR, (R req, I i, const char *n, size_t s), (req, i, n, s))
WRAP(listxattr, OP_LISTXATTR, (R req, I i, size_t s), (req, i, s))
WRAP(removexattr, OP_REMOVEXATTR, (R req, I i, const char *n), (req, i, n))
WRAP(access, OP_ACCESS, (R req, I i, int mask), (req, i, mask))
WRAP(create, OP_CREATE, (R req, I p, const char *n, mode_t mo, FI *fi), (req, p, n, mo, fi))
WRAP(fallocate, OP_FALLOCATE, (R req, I i, int mo, off_t o, off_t l, FI *fi),
     (req, i, mo, o, l, fi))
WRAP(readdirplus, OP_READDIRPLUS, (R req, I i, size_t s, off_t o, FI *fi), (req, i, s, o, fi))

/* Only the handlers the real table has are wrapped: a NULL one keeps FUSE's default. */
#define SET(op)                                                                                    \
	if (mm->real.op)                                                                           \
	mm->wrapped.op = w_##op

static void counter(struct met_out *o, const char *name, const char *help, uint64_t v)
{
	met_out_family(o, name, "counter", help);
	met_out_sample(o, name, NULL, (double)v);
}

static void collect(void *ctx, struct met_out *o)
{
	struct mnt_metrics *mm = ctx;
	struct mnt *m = mm->m;
	struct kvc_stats st;
	kvc_get_stats(m->c, &st);
	counter(o, "kvfs_mount_bytes_read_total", "File bytes read through the client library",
		st.bytes_read);
	counter(o, "kvfs_mount_bytes_written_total",
		"File bytes written (committed) through the client library", st.bytes_written);
	counter(o, "kvfs_mount_files_committed_total", "Files committed", st.files_committed);
	counter(o, "kvfs_mount_degraded_reads_total",
		"Stripes read by decoding parity (a node down, slow or corrupt)",
		st.degraded_reads);
	counter(o, "kvfs_mount_crc_errors_total", "Chunks received failing their CRC32C",
		st.crc_errors);
	const struct mnt_counters *n = &m->n;
	counter(o, "kvfs_mount_commit_errors_total", "Commits that failed", n->commit_errors);
	counter(o, "kvfs_mount_aborted_writes_total", "Files being written that were dropped",
		n->aborted);
	counter(o, "kvfs_mount_retries_total", "Metadata requests retried while meta was away",
		n->retries);
	counter(o, "kvfs_mount_erofs_total", "Writes refused because the file is immutable",
		n->erofs);
	counter(o, "kvfs_mount_foreign_closes_total",
		"Closes of a file being written by a process other than its opener (no commit)",
		n->foreign_flushes);
	struct kvc_lease_stats ls;
	kvc_lease_get_stats(m->lease, &ls);
	counter(o, "kvfs_mount_lease_granted_total", "Directory leases taken (listing read)",
		ls.granted);
	counter(o, "kvfs_mount_lease_lookups_total",
		"Lookups answered from a directory lease, without meta (found or absent)",
		ls.hits + ls.negatives);
	counter(o, "kvfs_mount_lease_revoked_total",
		"Directory leases meta revoked (a change in the directory by any client)",
		ls.revoked);
	counter(o, "kvfs_mount_lease_pinned_total",
		"Names given to the kernel for --lease-pin (their lease kept renewed)", ls.pinned);
	counter(o, "kvfs_mount_lease_invals_total",
		"Pinned names invalidated in the kernel because their lease ended",
		n->lease_invals);
	met_out_family(o, "kvfs_mount_uptime_seconds", "gauge", "Seconds since the mount started");
	met_out_sample(o, "kvfs_mount_uptime_seconds", NULL,
		       (double)(mnt_now_ns() - m->start_ns) / 1e9);
}

int mnt_metrics_start(struct mnt *m, const struct fuse_lowlevel_ops **ops)
{
	struct mnt_metrics *mm = calloc(1, sizeof(*mm));
	if (!mm)
		return -ENOMEM;
	mm->m = m;
	mm->real = mnt_ops;
	mm->wrapped = mnt_ops;
	SET(lookup);
	SET(forget);
	SET(forget_multi);
	SET(getattr);
	SET(setattr);
	SET(readlink);
	SET(mknod);
	SET(mkdir);
	SET(unlink);
	SET(rmdir);
	SET(symlink);
	SET(rename);
	SET(link);
	SET(open);
	SET(read);
	SET(write);
	SET(write_buf);
	SET(flush);
	SET(release);
	SET(fsync);
	SET(opendir);
	SET(readdir);
	SET(releasedir);
	SET(statfs);
	SET(setxattr);
	SET(getxattr);
	SET(listxattr);
	SET(removexattr);
	SET(access);
	SET(create);
	SET(fallocate);
	SET(readdirplus);
	int rc = met_reg_create(&mm->r);
	if (!rc)
		rc = met_ops_new(mm->r, "kvfs_mount", op_names, OP_N, &mm->ops);
	if (!rc)
		rc = met_collector_add(mm->r, collect, mm);
	if (!rc) /* before the session starts: kvc is not yet shared between threads */
		rc = kvc_set_metrics(m->c, mm->r);
	m->metrics = mm; /* before serving: a scrape may come at once */
	if (!rc)
		rc = met_http_serve(mm->r, m->cfg.metrics_listen, m->cfg.metrics_addr_file,
				    &mm->http);
	if (rc) {
		m->metrics = NULL;
		kvc_set_metrics(m->c, NULL);
		met_reg_destroy(mm->r);
		free(mm);
		return rc;
	}
	*ops = &mm->wrapped;
	return 0;
}

void mnt_metrics_stop(struct mnt *m)
{
	struct mnt_metrics *mm = m->metrics;
	if (!mm)
		return;
	met_http_stop(mm->http);
	kvc_set_metrics(m->c, NULL); /* the session is gone: nothing uses m->c now */
	met_reg_destroy(mm->r);
	free(mm);
	m->metrics = NULL;
}
