/* kvc — libkvfs, the client library: namespace calls to kvfs-meta, chunk I/O to kvfs-node,
 * erasure coding on write and (only when needed) on read. Used by kvfs-mount and the tools.
 *
 * Write path: kvc_create buffers a new file in memory; kvc_commit splits it into stripes
 * (per-file chunk size, see below), encodes parity, CRC32Cs every chunk, asks meta for a
 * placement (ALLOC), sends all chunks to their nodes in parallel and, only after every one is
 * acknowledged, commits the file (COMMIT, one RocksDB batch): a file is visible whole or not at
 * all. Read path: LAYOUT once per open, then the k data chunks of the needed stripes in
 * parallel; a node down, a timeout or a CRC mismatch fetches parity and decodes. A healthy
 * cluster's reads never decode.
 *
 * Chunking: a file of `size` bytes uses chunk_size = clamp(roundup(ceil(size / k), 4096), 4096,
 * max_chunk) so that even a small file spreads over all k data nodes. Data chunk j of stripe s
 * holds file bytes [(s*k + j) * chunk_size, +chunk_size) ∩ [0, size) and is stored at exactly
 * that length (possibly 0); the stripe's parity chunks have the length of its data chunk 0;
 * shorter chunks are zero-padded in memory for coding.
 *
 * Threading: a struct kvc is thread-safe and meant to be shared (one per process). A writer
 * or a kvc_file is used by one thread at a time. Every call returns 0 / a count or a negative
 * errno: -ENOENT, -EEXIST, -ENOTDIR, -EISDIR, -ENOTEMPTY, -ENOSPC, -EFBIG, -EIO (data cannot
 * be read: more than m chunks of a stripe lost), -EHOSTDOWN (too few nodes up or reachable
 * to write),
 * -ECONNREFUSED / -ETIMEDOUT (metadata unreachable), -EACCES (wrong cluster secret).
 */
#ifndef KVFS_KVC_H
#define KVFS_KVC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvp.h"

struct kvc;
struct kvc_writer;
struct kvc_file;

#define KVC_MAX_METAS 9

struct kvc_opts {
	/* "HOST:PORT", or replicated meta's replicas "HOST:PORT,HOST:PORT,..." (at most
	 * KVC_MAX_METAS): requests go to the one that leads, found by asking in turn. */
	const char *meta_addr;
	const struct kvp_secret *secret; /* cluster secret */
	int timeout_ms;			 /* per request to meta or a node; 0 = 5000 */
	int k, m;			 /* 0 = the cluster's default (from meta STATFS) */
	uint32_t max_chunk;		 /* 0 = the cluster's chunk size */
	uint64_t max_file;		 /* bytes one writer may buffer; 0 = 1 GiB */
	uint64_t max_buffered;		 /* bytes all writers together may buffer; 0 = 4 GiB */
};

/* Connects to meta (and checks the secret). *out is freed with kvc_close. */
int kvc_open(const struct kvc_opts *o, struct kvc **out);
/* Splits a meta list "A,B,C" into out (each shorter than KVP_ADDR_MAX, none empty, at most
 * max): how many, or -EINVAL. */
int kvc_meta_list(const char *list, char out[][KVP_ADDR_MAX], int max);
void kvc_close(struct kvc *c);

/* ---- namespace, by inode (root is KVP_ROOT_INO) ---- */
int kvc_lookup(struct kvc *c, uint64_t parent, const char *name, struct kvp_attr *out);
/* kvc_lookup that, for a regular file, also brings its layout in the same round trip and keeps
 * it for the next kvc_file_open of that inode within KVC_PREFETCH_MS (at most KVC_PREFETCH
 * kept, the oldest dropped): a lookup then open costs one meta round trip, not two. */
int kvc_lookup_layout(struct kvc *c, uint64_t parent, const char *name, struct kvp_attr *out);
int kvc_getattr(struct kvc *c, uint64_t ino, struct kvp_attr *out);
int kvc_setattr(struct kvc *c, uint64_t ino, uint32_t valid, uint32_t mode, int64_t mtime_ns,
		int64_t atime_ns, struct kvp_attr *out);
int kvc_mkdir(struct kvc *c, uint64_t parent, const char *name, uint32_t mode,
	      struct kvp_attr *out);
/* kvc_mkdir recording an owner (uid, gid; KVP_OWNER_NONE = none, as kvc_mkdir). */
int kvc_mkdir_owned(struct kvc *c, uint64_t parent, const char *name, uint32_t mode, uint32_t uid,
		    uint32_t gid, struct kvp_attr *out);
int kvc_rmdir(struct kvc *c, uint64_t parent, const char *name);
int kvc_unlink(struct kvc *c, uint64_t parent, const char *name);
int kvc_rename(struct kvc *c, uint64_t parent, const char *name, uint64_t newparent,
	       const char *newname, uint32_t flags);

struct kvc_dirent {
	char name[KVP_NAME_MAX + 1];
	struct kvp_attr attr;
};
/* The whole directory, in name order: *out is a malloc'd array (caller frees) of *n entries. */
int kvc_readdir(struct kvc *c, uint64_t ino, struct kvc_dirent **out, size_t *n);

struct kvc_statfs {
	uint64_t raw_capacity, raw_used; /* bytes on all nodes */
	uint64_t files, dirs;
	int k, m;
	uint32_t chunk_size;
	uint32_t nodes_up, nodes;
};
int kvc_statfs(struct kvc *c, struct kvc_statfs *out);

struct kvc_node {
	uint32_t id;
	uint64_t uuid;
	char addr[KVP_ADDR_MAX];
	int state; /* enum kvp_node_state */
	uint64_t capacity, used, chunks;
	int64_t heartbeat_ns;
	char zone[KVP_ZONE_MAX]; /* its failure domain; "" = none */
};
/* *out malloc'd (caller frees). */
int kvc_nodes(struct kvc *c, struct kvc_node **out, size_t *n);

/* ---- paths ("/a/b", absolute in the kvfs namespace) for tools and tests ---- */
int kvc_resolve(struct kvc *c, const char *path, struct kvp_attr *out);
/* Resolves the parent directory of path; *name points into path at the last component. */
int kvc_resolve_parent(struct kvc *c, const char *path, uint64_t *parent, const char **name);
int kvc_mkdir_p(struct kvc *c, const char *path, uint32_t mode);
/* Whole-file helpers: create+write+commit (replace=1 overwrites), and read all. *buf is
 * malloc'd (caller frees). */
int kvc_put(struct kvc *c, const char *path, const void *buf, size_t len, int replace);
int kvc_get(struct kvc *c, const char *path, void **buf, size_t *len);

/* ---- writing: a new file is built in memory and published whole at commit ---- */
/* replace = 1: commit atomically replaces an existing regular file of that name (O_TRUNC);
 * else commit fails with -EEXIST if the name exists by then. */
int kvc_create(struct kvc *c, uint64_t parent, const char *name, uint32_t mode, int replace,
	       struct kvc_writer **out);
/* Copies len bytes at offset off (holes read as zeros). -EFBIG past max_file, -ENOMEM when the
 * process-wide buffer budget is exhausted. */
ssize_t kvc_write(struct kvc_writer *w, const void *buf, size_t len, uint64_t off);
/* As kvc_write, but the bytes are produced straight into the writer's buffer, so a caller whose
 * data is not in memory yet (kvfs-mount: a FUSE write spliced into a pipe) copies it once, not
 * into a buffer of its own first. fill(arg, dst, len) writes up to len bytes at dst and
 * returns how many, or a negative errno; it is called only once room for all len is taken
 * (after -EFBIG or -ENOMEM nothing was consumed: the caller may retry with the same source).
 * Returns what fill returned; a short fill extends the file only by the bytes filled. */
typedef ssize_t (*kvc_fill_fn)(void *arg, void *dst, size_t len);
ssize_t kvc_write_fill(struct kvc_writer *w, uint64_t off, size_t len, kvc_fill_fn fill, void *arg);
/* Waiting for the buffer budget instead of polling kvc_write: read the epoch before a
 * kvc_write; after its -ENOMEM, kvc_buffer_wait blocks the calling thread until budget was
 * given back since that epoch (kvc_commit or kvc_abort freed a writer: 0) or timeout_ms
 * passed (-ETIMEDOUT). A kvc_write that fails the budget holds none of it, even briefly.
 * Any thread; hold no lock a committing thread needs. */
uint64_t kvc_buffer_epoch(struct kvc *c);
int kvc_buffer_wait(struct kvc *c, uint64_t epoch, int timeout_ms);
/* Sets the file's size (grow with zeros or shrink); for truncate while the file is new. */
int kvc_writer_truncate(struct kvc_writer *w, uint64_t size);
uint64_t kvc_writer_size(const struct kvc_writer *w);
/* The owner kvc_commit records for the file (default KVP_OWNER_NONE: none). A commit that
 * replaces a file which has an owner keeps that owner. */
void kvc_writer_set_owner(struct kvc_writer *w, uint32_t uid, uint32_t gid);
/* Encodes, stores and publishes; frees w whatever the result. *out may be NULL. */
int kvc_commit(struct kvc_writer *w, struct kvp_attr *out);
/* Drops an unfinished file; frees w. NULL is a no-op. */
void kvc_abort(struct kvc_writer *w);

/* ---- reading ---- */
/* Fetches the layout. Files are immutable, so it stays valid while the file exists. */
int kvc_file_open(struct kvc *c, uint64_t ino, struct kvc_file **out);
uint64_t kvc_file_size(const struct kvc_file *f);
/* Reads up to len bytes at off; returns the count (short only at end of file). Keeps the last
 * stripes in a small cache and prefetches the next stripe on sequential access. */
ssize_t kvc_pread(struct kvc_file *f, void *buf, size_t len, uint64_t off);
/* Starts the data GETs of the stripe holding off, unless it is cached or already on its way,
 * so that a read expected soon (the mount's first READ after an OPEN) finds its chunks in
 * flight: a kvc_pread of that stripe then waits on these GETs instead of sending its own
 * (received straight into its buffer when they have not arrived yet). Counted in
 * stripes_prefetched. Nothing to free; a stripe never read is cancelled by the next read of
 * another stripe or by kvc_file_close. 0, or -EINVAL (off past the end). */
int kvc_file_prefetch(struct kvc_file *f, uint64_t off);
void kvc_file_close(struct kvc_file *f);

/* Layout of an open file, for xattrs and tools: k, m, chunk size, and the node id of every
 * slot (stripe-major, k+m per stripe). *slots malloc'd (caller frees). */
struct kvc_layout_info {
	int k, m;
	uint32_t chunk_size;
	uint32_t nstripes;
};
int kvc_file_layout(const struct kvc_file *f, struct kvc_layout_info *info, uint32_t **slots);

/* Counters since kvc_open, for metrics and benchmarks. */
struct kvc_stats {
	uint64_t bytes_written, bytes_read, files_committed;
	uint64_t degraded_reads; /* stripes that needed decoding */
	uint64_t crc_errors;	 /* chunks that failed their CRC */
	/* chunks of committed files not stored: their node was down (meta placed none) or
	 * failed the PUT, and the stripe still held its minimum; meta repairs them */
	uint64_t chunks_written_around;
	/* stripes whose GETs were started ahead of a read: by a sequential reader, or by
	 * kvc_file_prefetch */
	uint64_t stripes_prefetched;
};
void kvc_get_stats(struct kvc *c, struct kvc_stats *out);

/* Directory leases (docs/meta.md, "Directory leases"): after `after` lookups in one directory
 * within a second were answered "found" by meta (kvc_lease_note), a lease on it is taken from
 * meta (at most ms, at most KVP_LEASE_MAX_MS) and its listing read with attributes; until meta
 * revokes it (a change there by anyone, acknowledged on a watch connection of the lease's
 * own) or it runs out, kvc_lease_lookup answers from the listing. After a revocation the
 * directory gets no new lease for a while (doubling from 250 ms to 8 s); once a directory is
 * known to hold n entries, a burst must reach n / 16 lookups too. kvc_lease_open starts
 * the watch thread; the object is freed by kvc_lease_close (before kvc_close). Thread-safe. */
struct kvc_lease;
struct kvc_lease_opts {
	int after; /* 0: never take a lease */
	uint32_t ms;
	/* Pinning (pin_ms > 0 and lost set): a name kvc_lease_lookup finds is "pinned" — the
	 * caller may keep the answer pin_ms (a kernel's dentry), and a keeper thread renews the
	 * lease while any pin is younger than that. When a lease with pins ends otherwise than by
	 * its pins running out (revoked, dropped with the watch connection, or not renewed by the
	 * time a tenth of it is left), lost(arg, dir, names, n) is called with the pinned names
	 * (n NUL-terminated strings back to back), from a kvc_lease thread, no lock held; a
	 * revocation is acknowledged to meta (which holds the change until then, or until the
	 * lease's end) only once lost returns. */
	uint32_t pin_ms;
	void (*lost)(void *arg, uint64_t dir, const char *names, size_t n);
	void *arg;
};
int kvc_lease_open(struct kvc *c, const struct kvc_lease_opts *o, struct kvc_lease **out);
void kvc_lease_close(struct kvc_lease *l);
/* No lost() call starts after this returns, and none is in progress (it waits for one): for a
 * caller about to free what lost() uses, while lookups still run. NULL-safe. */
void kvc_lease_mute(struct kvc_lease *l);
/* name in dir from a held lease: 0 (*out; *left_ns: how long the answer may be kept: what the
 * lease has left, or pin_ms when pinning), -ENOENT (no such name), or -EAGAIN: no lease, ask
 * meta (l NULL: always). */
int kvc_lease_lookup(struct kvc_lease *l, uint64_t dir, const char *name, struct kvp_attr *out,
		     int64_t *left_ns);
/* A lookup in dir found its name (answered by meta or by a lease): counts toward a burst, and
 * at the burst's end takes the lease and reads the listing here; a lease in use with less than
 * half of it left is renewed here (one round trip, the listing kept). Network round trips:
 * call it after replying. */
void kvc_lease_note(struct kvc_lease *l, uint64_t dir);
struct kvc_lease_stats {
	uint64_t granted;   /* leases taken (listing read) */
	uint64_t renewed;   /* leases extended by use (no new listing) */
	uint64_t hits;	    /* lookups answered from a lease: found */
	uint64_t negatives; /* ... and absent */
	uint64_t revoked;   /* leases meta revoked while held */
	uint64_t dropped;   /* leases dropped because the watch connection ended */
	uint64_t refused;   /* lease attempts that failed or were revoked before use */
	uint64_t pinned;    /* names pinned (answered for pin_ms) */
	uint64_t lost;	    /* leases with pins that ended: lost() called */
	uint64_t expired;   /* ... of them because no renewal came in time */
};
void kvc_lease_get_stats(struct kvc_lease *l, struct kvc_lease_stats *out);

/* Where the time of a read or a write goes, as histograms in r (docs/operations.md, "Metrics"):
 * kvfs_client_meta_requests_total / _request_errors_total / _request_duration_seconds {op} for
 * every metadata round trip (retries included), and kvfs_client_stage_duration_seconds{stage}:
 *   open        kvc_file_open (LAYOUT and the node table)
 *   pread       one kvc_pread
 *   stripe_get  one stripe's chunk GETs in parallel until the last arrived, CRC-checked
 *   commit      one kvc_commit (ALLOC, encode, CRC, PUTs, COMMIT)
 *   encode      parity of one stripe;  crc  the CRC32Cs of one stripe's chunks
 *   put_send    starting one stripe's PUTs (the sends);  put_wait  waiting for their acks
 * and kvfs_client_handshake_failures_total / _timeouts_total, the handshakes this process
 * started (kvp_client_conn_stats; call once per r).
 * Call before sharing c between threads; r must outlive c's use, or detach with r NULL (no
 * thread may be using c then). 0 or a negative errno (nothing is measured then). */
struct met_reg;
int kvc_set_metrics(struct kvc *c, struct met_reg *r);

/* Per-node timeout for chunk reads (default min(timeout_ms, 2000)): past it the chunk counts
 * as missing and the read decodes from parity, and the node is skipped for a few seconds, so a
 * stopped node delays reads only briefly. Call before sharing c between threads. */
void kvc_set_read_timeout(struct kvc *c, int ms);

/* ---- access times (retention counts from the last access) ---- */
/* kvc_file_open records (ino, now); the records go to meta in one TOUCH at most every
 * interval (default 30 s; meta also ignores moves under its --atime-granularity), piggybacked
 * on a later kvc_file_open, or now with kvc_touch_flush. ms < 0: never send. Call before
 * sharing c between threads. */
void kvc_set_touch_interval(struct kvc *c, int ms);
/* Sends the recorded access times now. 0 or a negative errno (they are kept for a retry). */
int kvc_touch_flush(struct kvc *c);

/* A raw request to meta for admin tools (MAINT, MSTATUS): body of len bytes; on 0, *rb
 * (malloc'd, caller frees; may be NULL) and *rl get the reply body. */
int kvc_admin(struct kvc *c, uint16_t op, const void *body, size_t len, uint8_t **rb, uint32_t *rl);

#endif
