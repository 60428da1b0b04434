/* Private to fs/meta: the server state shared by its .c files, the RocksDB key families and
 * the record codecs. docs/meta.md describes the same layout for people. */
#ifndef KVFS_META_INT_H
#define KVFS_META_INT_H

#include <pthread.h>
#include <rocksdb/c.h>
#include <stdint.h>

#include "kvp.h"
#include "meta.h"
#include "meta_req.h"

/* Key families: one prefix byte, then big-endian integers so RocksDB's byte order is numeric
 * order (a family, an inode's dirents, an inode's stripes are each one contiguous range). */
enum {
	MK_COUNTER = 'C', /* u8 id -> u64 (enum below) */
	MK_DIRENT = 'D',  /* parent be64, name bytes -> u64 ino, u32 mode */
	MK_INODE = 'I',	  /* ino be64 -> inode record */
	MK_STRIPE = 'S',  /* ino be64, stripe be32 -> (k+m) x slot (u32 node, u64 chunk, u32 crc) */
	MK_NODE = 'N',	  /* node_id be32 -> node record */
	MK_UUID = 'U',	  /* uuid be64 -> u32 node_id */
	MK_PENDING = 'W', /* write_id be64 -> pending-write record */
	MK_DELQ = 'Q',	  /* node_id be32, chunk_id be64 -> i64 queued_ns */
	MK_ATIME = 'A',	  /* (atime_ns ^ sign bit) be64, ino be64 -> (empty) */
	MK_VERSION = 'V', /* (no suffix) -> "kvfs-meta 1" */
};
enum {
	MC_INO_LIMIT = 1,   /* inode numbers below it may have been handed out */
	MC_CHUNK_LIMIT = 2, /* chunk ids (and write ids) below it may have been handed out */
	MC_NEXT_NODE = 3,
	MC_FILES = 4,
	MC_DIRS = 5,
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
void mk_be64(uint8_t *p, uint64_t v);
uint64_t mk_rd_be64(const uint8_t *p);
uint32_t mk_rd_be32(const uint8_t *p);

/* Inode record (value of MK_INODE). Directories: size 0, parent = containing directory (for
 * the rename-into-own-subtree check). Files: the layout header. */
struct mino {
	uint64_t ino;
	uint32_t mode, nlink;
	uint64_t size;
	int64_t mtime_ns, atime_ns, ctime_ns;
	uint32_t chunk_size;
	uint8_t k, m;
	uint32_t nstripes;
	uint64_t parent;
};

/* A registered node; the in-memory registry mirrors MK_NODE records. */
struct mnode {
	uint32_t id;
	uint64_t uuid;
	char addr[KVP_ADDR_MAX];
	uint64_t capacity, used, chunks;
	int64_t hb_ns;	  /* wall clock of the last heartbeat (persisted) */
	uint8_t state;	  /* enum kvp_node_state (persisted) */
	int64_t hb_mono;  /* monotonic time of the last heartbeat (memory only) */
	uint64_t pending; /* bytes placed on it since its last heartbeat (memory only) */
};

struct meta {
	struct meta_opts o;
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

	/* nodes_mu protects the registry. Lock order: mu, then nodes_mu. */
	pthread_mutex_t nodes_mu;
	struct mnode *nodes;
	size_t nnodes, nodes_cap;
	uint32_t next_node;

	struct kvp_pool *pool; /* meta as a client of nodes (deletions) */
	pthread_t bg;
	int bg_started;
	pthread_mutex_t bg_mu; /* protects stopping; bg_cv wakes the background thread */
	pthread_cond_t bg_cv;
	int stopping, kicked;
};

int64_t meta_now_ns(void);
int64_t meta_mono_ns(void);

/* ---- meta_db.c ---- */
int mdb_open(struct meta *m);
void mdb_close(struct meta *m);
/* 0, -ENOENT or -EIO. *val malloc'd (rocksdb_free / free). ro NULL = m->ro. */
int mdb_get(struct meta *m, const rocksdb_readoptions_t *ro, const uint8_t *key, size_t klen,
	    char **val, size_t *vlen);
/* Writes b (WAL + memtable, no fsync). 0 or -EIO. */
int mdb_write(struct meta *m, rocksdb_writebatch_t *b);
/* fsyncs the WAL: every batch written before the call is durable when it returns. Called
 * without locks, so concurrent callers share device flushes. 0 or -EIO. */
int mdb_sync(struct meta *m);
int mdb_inode_get(struct meta *m, const rocksdb_readoptions_t *ro, uint64_t ino, struct mino *out);
void mdb_inode_put(rocksdb_writebatch_t *b, const struct mino *in);
void mdb_counter_put(rocksdb_writebatch_t *b, uint8_t id, uint64_t v);
/* Hands out an inode number / n consecutive chunk ids; when the reserved range is used up a
 * larger reservation is written first (on its own). Caller holds mu. 0 or -EIO. */
int mdb_alloc_ino(struct meta *m, uint64_t *ino);
int mdb_alloc_chunks(struct meta *m, uint64_t n, uint64_t *first);
void mino_to_attr(const struct mino *in, struct kvp_attr *a);
/* Adds the deletion-queue entries and atime-index removal for a file's whole stripe map, and
 * deletes the stripe keys, inode key; used by unlink and replace. Caller holds mu. */
int mdb_file_drop(struct meta *m, rocksdb_writebatch_t *b, const struct mino *f);
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
int mfile_layout(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
/* Aborts pending writes older than the write timeout. Takes mu. */
void mfile_expire(struct meta *m);

/* ---- meta_nodes.c: registry, statfs, background thread ---- */
int mnodes_load(struct meta *m);
int mnodes_heartbeat(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
int mnodes_list(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
int mnodes_statfs(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
/* Copies node id's address and state; -ENOENT if unknown. Takes nodes_mu. */
int mnodes_addr(struct meta *m, uint32_t id, char *addr, uint8_t *state);
/* Refreshes up/down states from heartbeat ages (persisting changes). Takes nodes_mu. */
void mnodes_check(struct meta *m);
int mbg_start(struct meta *m);
/* Wakes the background thread now (new deletion-queue entries). */
void mbg_kick(struct meta *m);
void mbg_stop(struct meta *m);

#endif
