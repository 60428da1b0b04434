/* meta — the kvfs metadata service: namespace, per-file stripe maps, node registry, chunk id
 * allocation and the deletion queue, in one RocksDB database (docs/meta.md).
 *
 * meta_open() opens (or creates, with the root directory) the database and starts a background
 * thread that marks silent nodes down, sends queued chunk deletions to nodes and expires
 * abandoned writes. meta_handle() is the kvp_handler_fn to give kvp_server_start(): it serves
 * HEARTBEAT from nodes and the client ops of enum kvp_op. meta_close() stops the thread and
 * closes the database (call it after kvp_server_stop()).
 *
 * Durability: every change is one RocksDB WriteBatch, written to the WAL before the reply is
 * sent (survives kill -9); with opts.sync the WAL is also fsync'd before the reply (survives a
 * machine crash), outside the mutex so concurrent changes share a flush. Threading: meta_handle is
 * called from many connection threads at once; mutations are serialised by one mutex, reads are
 * lock-free. Returns 0 or a negative errno (-EIO for RocksDB errors, logged).
 */
#ifndef KVFS_META_H
#define KVFS_META_H

#include <stdint.h>

#include "kvp.h"

struct meta;

/* Field types are those of the daemon's option table (common/cfg.h: CFG_INT is int64_t,
 * CFG_SIZE uint64_t, CFG_SECS double, CFG_BOOL int), which fills this struct directly. */
struct meta_opts {
	const char *db_path;
	const struct kvp_secret *secret; /* to talk to nodes */
	int sync;			 /* fsync the WAL on every commit */
	uint64_t block_cache;		 /* bytes of RocksDB block cache; 0 = none */
	int64_t bloom_bits;		 /* bloom filter bits per key; 0 = no filter */
	int mmap_reads;			 /* read table files through mmap, not pread */
	int verify_reads; /* LOOKUP/GETATTR check block checksums (compaction always) */
	int64_t k, m;	  /* cluster defaults, reported by STATFS */
	uint64_t chunk_size;
	double node_timeout_s;	/* no heartbeat for this long: node down */
	double write_timeout_s; /* an ALLOC not committed for this long is aborted */
	double gc_interval_s;	/* background pass period (deletion queue, timeouts) */
	/* chunks of an unlinked or replaced file are deleted this long later, so a reader that
	 * opened the old file (its layout cached) can finish; evicted/expired ones go at once */
	double unlink_delay_s;

	/* retention (docs/operations.md, "Retention, eviction, repair") */
	double ttl_s;		/* a file expires this long after its last access; 0 = never */
	struct meta_ttl_rule {	/* a directory (and everything under it) with its own TTL */
		char path[256]; /* absolute kvfs path of a directory */
		double ttl_s;	/* 0 = never expires */
	} rules[16];
	int nrules;
	double atime_granularity_s;  /* TOUCH moves an access time only by at least this */
	double retention_interval_s; /* period of the TTL / watermark pass */
	int64_t high_wm, low_wm;     /* percent of raw capacity of up nodes; high 0 = no eviction */
	/* orphan chunk GC */
	double gc_grace_s;	  /* a chunk younger than this (node mtime) is never an orphan */
	double orphan_interval_s; /* period of the orphan pass; 0 = only on request */
	/* repair */
	double repair_delay_s;	 /* a node down this long is repaired automatically; 0 = never */
	uint64_t repair_rate;	 /* bytes/s rebuilt by background repair; 0 = unlimited */
	double scrub_interval_s; /* a background scrub starts this long after the last; 0 = off */
	uint64_t scrub_rate;	 /* bytes/s read by background scrub; 0 = unlimited */
	/* degraded writes: each stripe must store at least k + min(write_redundancy, m) chunks;
	 * fewer nodes up (or reachable by the writer): ALLOC / COMMIT say -EHOSTDOWN. 0 (the
	 * default) writes while any k nodes of a stripe take chunks, the rest marked for repair;
	 * m or more refuses any write that cannot store all k+m. */
	int64_t write_redundancy;
	/* Replication (docs/meta.md, "Replicated metadata"): raft_id 0 = a single meta, as
	 * before; otherwise this replica's id among raft_peers ("ID=HOST:PORT,..."), its log in
	 * raft_dir. A replica serves only while it leads; others answer -EREMCHG. */
	int64_t raft_id;
	const char *raft_peers, *raft_dir;
	double raft_election_s;
	int64_t raft_snapshot_every;  /* entries between snapshots (log compaction) */
	uint64_t raft_snapshot_bytes; /* ... or bytes of entries between them; 0 = by count only */
	int raft_join;		      /* joins a running group (kvfs meta add): no bootstrap */
	int raft_snapshot_compress;   /* libraft stores snapshots LZ4-compressed */
	/* Benchmarks only: accept BFILL (kvp.h), which creates files that own chunks no node
	 * holds. Never on a cache that serves data. */
	int bench_fill;
};

int meta_open(const struct meta_opts *o, struct meta **out);
/* Where clients reach this meta ("HOST:PORT", shorter than KVP_ADDR_MAX), once its server
 * listens: a replicated meta's leader records it for the followers' redirects (docs/meta.md,
 * "Redirects"). Thread-safe. 0 or -EINVAL. */
int meta_set_addr(struct meta *m, const char *addr);
void meta_close(struct meta *m);
/* kvp_handler_fn: ctx is the struct meta. */
int meta_handle(void *ctx, struct kvp_conn *c, const struct kvp_hdr *h, uint8_t *body);

#endif
