/* Private to fs/meta: the server state shared by its .c files, the RocksDB key families and
 * the record codecs. docs/meta.md describes the same layout for people. */
#ifndef KVFS_META_INT_H
#define KVFS_META_INT_H

#include <pthread.h>
#include <rocksdb/c.h>
#include <stdatomic.h>
#include <stdint.h>

#include "kvp.h"
#include "meta.h"
#include "meta_req.h"

/* Key families: one prefix byte, then big-endian integers so RocksDB's byte order is numeric
 * order (a family, an inode's dirents, an inode's stripes are each one contiguous range).
 * A stripe slot with node 0 holds no chunk (written degraded); its stripe has a G key, as have
 * stripes an older meta placed with a node twice (--allow-degraded): repair does them first. */
enum {
	MK_COUNTER = 'C', /* u8 id -> u64 (enum below) */
	MK_DIRENT = 'D',  /* parent be64, name bytes -> u64 ino, u32 mode */
	MK_INODE = 'I',	  /* ino be64 -> inode record */
	MK_STRIPE = 'S',  /* ino be64, stripe be32 -> (k+m) x slot (u32 node, u64 chunk, u32 crc) */
	MK_NODE = 'N',	  /* node_id be32 -> node record */
	MK_UUID = 'U',	  /* uuid be64 -> u32 node_id */
	MK_PENDING = 'W', /* write_id be64 -> pending-write record */
	MK_DELQ = 'Q',	  /* node_id be32, chunk_id be64 -> i64 queued_ns */
	MK_ATIME = 'A',	  /* (access_ns ^ sign bit) be64, ino be64 -> (empty) */
	MK_REV = 'R',	  /* node_id be32, chunk_id be64 -> u64 ino, u32 stripe (chunk owner) */
	MK_DEGRADED = 'G', /* ino be64, stripe be32 -> (empty): a stripe written degraded */
	MK_VERSION = 'V',  /* (no suffix) -> "kvfs-meta 1" */
	/* (no suffix) -> u64 replica id, u64 term, str client address: written through Raft by
	 * each serving leader once per term, so every replica can redirect (meta_leader.c) */
	MK_LEADER = 'L',
};
enum {
	MC_INO_LIMIT = 1,   /* inode numbers below it may have been handed out */
	MC_CHUNK_LIMIT = 2, /* chunk ids (and write ids) below it may have been handed out */
	MC_NEXT_NODE = 3,
	MC_FILES = 4,
	MC_DIRS = 5,
	MC_REV_BUILT = 6,  /* 1 once the R index covers every stripe map (built at first open) */
	MC_PARENTS_OK = 7, /* 1 once every file's parent matches its directory entry (below) */
	MC_ACCESS_OK = 8,  /* 1 once every file has its own access time and A is keyed by it */
};

#define MK_MAX (1 + 8 + KVP_NAME_MAX + 8)

size_t mk_counter(uint8_t *k, uint8_t id);
size_t mk_inode(uint8_t *k, uint64_t ino);
size_t mk_dirent(uint8_t *k, uint64_t parent, const char *name, size_t len);
size_t mk_stripe(uint8_t *k, uint64_t ino, uint32_t stripe);
size_t mk_node(uint8_t *k, uint32_t id);
size_t mk_uuid(uint8_t *k, uint64_t uuid);
size_t mk_pending(uint8_t *k, uint64_t write_id);
size_t mk_delq(uint8_t *k, uint32_t node, uint64_t chunk);
size_t mk_atime(uint8_t *k, int64_t atime_ns, uint64_t ino);
size_t mk_rev(uint8_t *k, uint32_t node, uint64_t chunk);
size_t mk_degraded(uint8_t *k, uint64_t ino, uint32_t stripe);
void mk_be64(uint8_t *p, uint64_t v);
uint64_t mk_rd_be64(const uint8_t *p);
uint32_t mk_rd_be32(const uint8_t *p);

/* Inode record (value of MK_INODE). Directories: size 0, parent = containing directory (for
 * the rename-into-own-subtree check). Files: the layout header. Two access times: atime_ns is
 * what stat shows (a client may set it: `touch -a -d`, `cp -a`); access_ns is kvfs's own
 * clock (creation, then the opens TOUCH reports, never past meta's now; a SETATTR atime moves
 * it only forward, to at most now), and it alone keys the A index, so retention and LRU
 * eviction never obey a time a client set. */
struct mino {
	uint64_t ino;
	uint32_t mode, nlink;
	uint64_t size;
	int64_t mtime_ns, atime_ns, ctime_ns;
	uint32_t chunk_size;
	uint8_t k, m;
	uint32_t nstripes;
	uint64_t parent;
	int64_t access_ns;
	uint32_t uid, gid; /* KVP_OWNER_NONE: none recorded (records before version 3) */
};

#define MREP_THREADS	 4 /* chunks a repair job rebuilds at once */
#define MFREED_BUCKETS	 8
#define MFREED_STEP_NS	 100000000
#define MFREED_SETTLE_NS 300000000 /* a heartbeat this long after a deletion reflects it */

/* A registered node; the in-memory registry mirrors MK_NODE records. */
struct mnode {
	uint32_t id;
	uint64_t uuid;
	char addr[KVP_ADDR_MAX];
	char zone[KVP_ZONE_MAX]; /* failure domain as it last reported; "" = none (persisted) */
	uint64_t capacity, used, chunks;
	int64_t hb_ns;	  /* wall clock of the last heartbeat (persisted) */
	uint8_t state;	  /* enum kvp_node_state (persisted) */
	int64_t hb_mono;  /* monotonic time of the last heartbeat (memory only) */
	uint64_t pending; /* bytes placed on it since its last heartbeat (memory only) */
	uint8_t draining; /* no new placements; its chunks are moved off (persisted) */
	/* Bytes of chunks queued for deletion on it (freeing) and deleted since its last heartbeat
	 * (freed): its `used` still counts them until it next reports (memory only). Deleted
	 * bytes sit in 100 ms buckets by acknowledgement time; a heartbeat drops the buckets old
	 * enough that its report must reflect them (mnode_freed sums the rest). */
	uint64_t freeing;
	uint64_t freed_b[MFREED_BUCKETS];
	int64_t freed_ep[MFREED_BUCKETS]; /* bucket epoch: monotonic ns / MFREED_STEP_NS */
	int64_t down_mono; /* monotonic time it was marked down (memory only; 0 = never) */
	/* The last automatic repair of it that left chunks unrepaired, and how many nodes were
	 * up then: it is retried when more are up, or after REPAIR_RETRY_NS (memory only). */
	int64_t repair_fail_mono;
	size_t repair_fail_up;
};

static inline uint64_t mnode_freed(const struct mnode *n)
{
	uint64_t s = 0;
	for (int i = 0; i < MFREED_BUCKETS; i++)
		s += n->freed_b[i];
	return s;
}

/* The repair worker's current or last job (MSTATUS). */
struct mjob {
	uint8_t kind; /* enum kvp_maint: REPAIR, DRAIN, SCRUB; 0 none yet */
	uint8_t running;
	uint32_t node; /* DRAIN / one-node REPAIR; 0 = every down node */
	uint64_t total, done, failed, bytes;
	int64_t start_mono, end_mono;
};

struct mraft;

struct meta {
	struct meta_opts o;
	struct mraft *raft;   /* NULL: a single meta; else every mdb_write goes through Raft */
	struct mlease *lease; /* directory leases (meta_lease.h) */
	rocksdb_t *db;
	rocksdb_options_t *dbo;
	rocksdb_writeoptions_t *wo;
	rocksdb_readoptions_t *ro;

	/* mu serialises every read-check-write of namespace keys, counters and pending writes;
	 * reads that change nothing go to RocksDB without it. */
	pthread_mutex_t mu;
	uint64_t next_ino, ino_limit;	  /* protected by mu */
	uint64_t next_chunk, chunk_limit; /* protected by mu */
	uint64_t files, dirs;		  /* protected by mu */

	/* nodes_mu protects the registry. Lock order: mu, then nodes_mu. freed_cv (with nodes_mu,
	 * CLOCK_MONOTONIC) is broadcast when queued deletions are done or a node goes down: what
	 * mlife_evict waits for. */
	pthread_mutex_t nodes_mu;
	pthread_cond_t freed_cv;
	struct mnode *nodes;
	size_t nnodes, nodes_cap;
	uint32_t next_node;

	struct kvp_pool *pool; /* meta as a client of nodes (deletions) */
	pthread_t bg;
	int bg_started;
	pthread_mutex_t bg_mu; /* protects stopping, client_addr; bg_cv wakes the bg thread */
	pthread_cond_t bg_cv;
	int stopping, kicked;
	/* Replicated: where clients reach this replica (meta_set_addr; "" until known), and the
	 * term whose MK_LEADER record this replica wrote as leader (background thread only). */
	char client_addr[KVP_ADDR_MAX];
	uint64_t announced_term;

	/* Counters since start (enum kvp_mstat), plain atomics so a metrics endpoint can read
	 * them without locks. */
	atomic_uint_fast64_t st[KVP_MST_COUNT];
	/* MAINT COMPACT (mdb_compact_start): its thread, joined by the next start or at close;
	 * compacting is 1 from the start until the compaction returns. */
	pthread_t compact_thr;
	int compact_started;
	atomic_int compacting;
	int64_t last_orphan_mono, last_retention_mono; /* background thread only */
	/* One evictor at a time: several deciding from the same usage would each evict it. */
	pthread_mutex_t evict_mu;

	/* The repair worker: repair, drain, scrub (meta_repair.c). job_mu protects job, req_*,
	 * inflight and last_scrub_mono; job_cv wakes the worker. */
	pthread_t worker;
	int worker_started;
	pthread_mutex_t job_mu;
	pthread_cond_t job_cv;
	struct mjob job;
	struct mjob last_job; /* the last finished job that had work: shown after an empty one */
	uint8_t req_kind;
	uint32_t req_node;
	/* Chunk ids being written by repair threads, not yet in S (GC skips them); 0 = free. */
	uint64_t inflight[MREP_THREADS];
	int64_t last_scrub_mono;
	int64_t last_degraded_mono; /* worker only: last attempt at fixing degraded stripes */
	size_t degraded_fail_up;    /* worker only: nodes up when that attempt left some */
	size_t degraded_seen_up;    /* worker only: nodes up at the last look (a rise: try now) */
	/* Nodes that registered or came back up, ever (nodes_mu): a down and up between two of
	 * the worker's looks (200 ms) leaves the count of nodes up unchanged, not this. */
	uint64_t node_arrivals;
	uint64_t degraded_seen_arrivals; /* worker only: node_arrivals at the last look */
};

static inline void mst_add(struct meta *m, int which, uint64_t v)
{
	atomic_fetch_add_explicit(&m->st[which], v, memory_order_relaxed);
}

int64_t meta_now_ns(void);
int64_t meta_mono_ns(void);

/* ---- meta_leader.c: who leads, for redirects (docs/meta.md, "Redirects") ---- */
/* As the serving leader, records this replica's client address in MK_LEADER (through Raft)
 * once per term; does nothing otherwise. Background thread only. 0 or mdb_write's error. */
int mleader_announce(struct meta *m);
/* Into out (an -EREMCHG reply's body, docs/protocol.md "Errors"): the client address of the
 * leader this replica follows, when that leader has recorded it in the current term; nothing
 * when none is known (then the reply has an empty body). */
void mleader_redirect(struct meta *m, struct kvp_wbuf *out);
/* The serving leader's client address into addr (cap bytes), as followers redirect to it
 * (self: also when this replica is that leader). 0, or -ENOENT (none known: an election, or
 * no record of this term yet; addr is ""). */
int mleader_addr(struct meta *m, int self, char *addr, size_t cap);
/* 1 while this replica leads but does not serve yet (its announcement is near). */
int mleader_pending(struct meta *m);

/* ---- meta_db.c ---- */
/* MAINT COMPACT: starts a full compaction of the database on its own thread. 0, -EBUSY (one
 * runs), or -errno from pthread_create. */
int mdb_compact_start(struct meta *m);
/* RocksDB's state now, for MSTATUS: level-0 files, estimated bytes compaction still has to
 * rewrite, compactions running (a MAINT COMPACT counts as one). */
void mdb_compact_state(struct meta *m, uint64_t *l0, uint64_t *pending, uint64_t *running);
int mdb_open(struct meta *m);
/* Reads the counters into memory (next ids start at the reservations). Caller holds mu or
 * is alone. 0 or -EIO. */
int mdb_load_counters(struct meta *m);
void mdb_close(struct meta *m);
/* 0, -ENOENT or -EIO. *val malloc'd (rocksdb_free / free). ro NULL = m->ro. */
int mdb_get(struct meta *m, const rocksdb_readoptions_t *ro, const uint8_t *key, size_t klen,
	    char **val, size_t *vlen);
/* Writes b (WAL + memtable, no fsync). With Raft: b is applied here speculatively and
 * proposed; with mdb_defer set (meta_handle, for the request it runs) it returns at once and
 * the caller must mdb_settle before anything it did or read is shown outside; else it waits
 * for the commit. -EREMCHG when this replica does not serve (nothing written), -ECONNABORTED
 * when leadership was lost meanwhile (outcome unknown). 0 or -EIO. */
int mdb_write(struct meta *m, rocksdb_writebatch_t *b);
extern _Thread_local int mdb_defer;
/* Waits until every write this replica's database shows is committed (Raft; else 0 at once):
 * called before a reply or an action on nodes that depends on what was read. 0, or
 * -ECONNABORTED: some were rolled back (leadership lost). */
int mdb_settle(struct meta *m);
/* fsyncs the WAL: every batch written before the call is durable when it returns. Called
 * without locks, so concurrent callers share device flushes. 0 or -EIO. */
int mdb_sync(struct meta *m);
int mdb_inode_get(struct meta *m, const rocksdb_readoptions_t *ro, uint64_t ino, struct mino *out);
/* Record encoders add one key to a batch. They return 0, or -ENOMEM when the record could not
 * be encoded (allocation failed): then nothing was added, and the caller must drop the whole
 * batch and answer the error, never write the batch without that key. */
__attribute__((warn_unused_result)) int mdb_inode_put(rocksdb_writebatch_t *b,
						      const struct mino *in);
/* Ends a record encoded into w: 0, or w's error (-ENOMEM) with w freed. With KVFS_FAULT_INJECT
 * it also fails while the file named by $KVFS_META_FAULT_ENOMEM exists (tests only). */
__attribute__((warn_unused_result)) int mdb_rec_end(struct kvp_wbuf *w);

/* A pending write (P record): the placement an ALLOC handed out, until COMMIT or ABORT. */
struct mpend {
	int64_t created_ns;
	uint32_t chunk_size, nstripes;
	uint8_t k, m;
	uint64_t first;
	uint32_t *node; /* nstripes * (k+m) node ids, malloc'd */
};

static inline size_t mpend_slots(const struct mpend *p)
{
	return (size_t)p->nstripes * (size_t)(p->k + p->m);
}
/* 0 or -ENOMEM (nothing added: see mdb_inode_put). */
__attribute__((warn_unused_result)) int mdb_pend_put(rocksdb_writebatch_t *b, uint64_t write_id,
						     const struct mpend *p);
/* 0, -EIO (corrupt) or -ENOMEM; p->node is malloc'd (caller frees). */
int mdb_pend_decode(const char *v, size_t vl, struct mpend *p);
/* 1 if a pending write places a chunk on node, else 0, or -EIO / -ENOMEM. Caller holds m->mu
 * (so no ALLOC or COMMIT runs meanwhile). */
int mdb_pending_on(struct meta *m, uint32_t node);
void mdb_counter_put(rocksdb_writebatch_t *b, uint8_t id, uint64_t v);
/* Hands out an inode number / n consecutive chunk ids; when the reserved range is used up a
 * larger reservation is written first (on its own). Caller holds mu. 0 or -EIO. */
int mdb_alloc_ino(struct meta *m, uint64_t *ino);
int mdb_alloc_chunks(struct meta *m, uint64_t n, uint64_t *first);
void mino_to_attr(const struct mino *in, struct kvp_attr *a);
/* Adds the deletion-queue entries and atime-index removal for a file's whole stripe map, and
 * deletes the stripe keys, inode key; used by unlink and replace. Caller holds mu. */
int mdb_file_drop(struct meta *m, rocksdb_writebatch_t *b, const struct mino *f);
/* As mdb_file_drop, also adding chunk_size per chunk to bytes[node_id] (node_id < nbytes):
 * what the deletion will free on each node, for the watermark. */
int mdb_file_drop_acct(struct meta *m, rocksdb_writebatch_t *b, const struct mino *f,
		       uint64_t *bytes, uint32_t nbytes);
void mdb_delq_put(rocksdb_writebatch_t *b, uint32_t node, uint64_t chunk, int64_t now);
void mdb_rev_put(rocksdb_writebatch_t *b, uint32_t node, uint64_t chunk, uint64_t ino,
		 uint32_t stripe);
/* Builds the R index from every stripe map once (databases made before it existed). */
int mdb_rev_build(struct meta *m);
/* Once: sets each file's parent from its directory entry (a rename across directories did
 * not update it before, so retention and eviction skipped the file). */
int mdb_parents_fix(struct meta *m);
/* Once: gives each file of a database from before access_ns (record version 1, A keyed by
 * the settable atime) its own access time, max(atime capped at now, ctime), and moves its A
 * key there: a file whose atime a client set into the past is no longer expired for it. */
int mdb_access_fix(struct meta *m);
/* Moves ino's A key from access time old_ns to new_ns (no-op when equal). */
void mdb_atime_move(rocksdb_writebatch_t *b, uint64_t ino, int64_t old_ns, int64_t new_ns);

/* ---- meta_ns.c: directory entries (value: u64 ino, u32 mode) ---- */
int mdir_entry_get(struct meta *m, const rocksdb_readoptions_t *ro, uint64_t parent,
		   const struct mreq_str *name, uint64_t *ino, uint32_t *mode);
void mdir_entry_put(rocksdb_writebatch_t *b, uint64_t parent, const struct mreq_str *name,
		    uint64_t ino, uint32_t mode);
/* The directory ino, or -ENOENT / -ENOTDIR. */
int mdir_get(struct meta *m, const rocksdb_readoptions_t *ro, uint64_t ino, struct mino *out);
/* Writes b after adding the file/dir counter changes; on failure the in-memory counters are
 * put back. Caller holds mu. */
int mns_write(struct meta *m, rocksdb_writebatch_t *b, int64_t dfiles, int64_t ddirs);

/* ---- meta_ns.c: namespace ops; each returns 0 / a negative errno and fills out ---- */
int mns_lookup(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
int mns_getattr(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
int mns_readdir(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
int mns_mkdir(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
int mns_rmdir(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
int mns_unlink(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
int mns_rename(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
int mns_setattr(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
int mns_touch(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);

/* ---- meta_file.c: placement and the write path ---- */
int mfile_alloc(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
int mfile_commit(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
int mfile_abort(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
/* BFILL (kvp.h): -EPERM unless opts.bench_fill. */
int mfile_bfill(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
int mfile_layout(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
/* Aborts pending writes older than the write timeout. Takes mu. */
void mfile_expire(struct meta *m);

/* ---- meta_nodes.c: registry, statfs, deletion queue ---- */
int mnodes_load(struct meta *m);
int mnodes_heartbeat(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
int mnodes_list(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
int mnodes_statfs(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
/* Copies node id's address and state; -ENOENT if unknown. Takes nodes_mu. */
int mnodes_addr(struct meta *m, uint32_t id, char *addr, uint8_t *state);
/* Refreshes up/down states from heartbeat ages (persisting changes). Takes nodes_mu. */
void mnodes_check(struct meta *m);
/* Wakes the background thread (meta.c) now: new deletion-queue entries. */
void mbg_kick(struct meta *m);
/* One round of the deletion queue: the first queued node at or after *from, up to a batch of
 * its chunks as one DEL. Returns 1 to go on, 0 when nothing more is queued at or after *from.
 * Called by the background thread only. */
int mnodes_delq_round(struct meta *m, uint32_t *from);
/* Node id bound (ids are < it), for per-node arrays. Takes nodes_mu. */
uint32_t mnodes_id_bound(struct meta *m);
/* Adds bytes[id] to each node's `freeing` (queued deletions). Takes nodes_mu. */
void mnodes_freeing_add(struct meta *m, const uint64_t *bytes, uint32_t nbytes);
/* Raw capacity and effective use (used + placed - being freed) of the nodes that are up. */
void mnodes_usage(struct meta *m, uint64_t *cap, uint64_t *used);
/* Sets or clears draining (persisted). -ENOENT unknown node. */
int mnodes_set_draining(struct meta *m, uint32_t id, int on);
/* Forgets a node: registry, N, U and its deletion queue. -EBUSY if it is up and not draining
 * or still owns chunks (R), -ENOENT unknown. */
int mnodes_remove(struct meta *m, uint32_t id);

/* ---- meta_life.c: retention (TTL, watermark eviction) and orphan-chunk GC ---- */
/* One TTL + watermark pass. Returns files removed or a negative errno. */
int mlife_retention(struct meta *m);
/* Evicts least recently accessed files until use is under the low watermark and at least
 * `need` more bytes are free (ALLOC's retry). With need > 0 it then blocks the calling request
 * until the nodes have acknowledged the deletions (freed_cv), up to 3 s. No lock held on
 * entry. Returns files removed. */
int mlife_evict(struct meta *m, uint64_t need);
/* One orphan pass over every up node. Returns orphans queued or a negative errno. */
int mlife_orphans(struct meta *m);
/* Called by the background thread every pass: runs what is due. */
void mlife_tick(struct meta *m);
int mlife_maint(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
int mlife_status(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);

/* ---- meta_repair.c: the repair worker (repair, drain, scrub) ---- */
int mrep_start(struct meta *m);
void mrep_stop(struct meta *m);
/* Queues a job (REPAIR, DRAIN, SCRUB). -EBUSY if one is running or queued. */
int mrep_request(struct meta *m, uint8_t kind, uint32_t node);
/* Stripes marked degraded (G) and the files they belong to: one scan of the G keys, no lock.
 * Returns 0. */
int mrep_degraded_count(struct meta *m, uint64_t *stripes, uint64_t *files);

#endif
