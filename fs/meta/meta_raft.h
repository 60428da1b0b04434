/* mraft — kvfs-meta as a Raft-replicated state machine, on Debian's libraft (the C Raft of
 * dqlite) with its libuv I/O, over kvfs's TLS (meta_rtls.h; docs/meta.md, "Replicated metadata").
 *
 * RocksDB stays the state: every mutation meta makes is one RocksDB WriteBatch, one Raft
 * entry, applied with rocksdb_write on every replica in log order. Followers apply committed
 * entries on the loop thread. The serving leader applies its own entries speculatively when
 * it proposes them (mraft_propose_async, in log order under one lock, each with an undo
 * record in the same batch), so meta need not hold its namespace mutex until commit; the
 * loop thread skips them at commit. Whatever is not known committed when leadership is lost
 * (or an append fails, or the process stops or crashes) is rolled back from the undo records
 * before anything else is applied, and meta serves again only after on_lead. No reply may
 * show a speculative write: meta calls mraft_settle before each (docs/meta.md, "Pipelined
 * writes"). A snapshot is the whole committed key space serialised; installing one replaces
 * the database's content.
 *
 * Threads: mraft_start starts a libuv loop thread (owns the struct raft and everything libraft
 * touches) and a watcher thread. The watcher calls on_lead(ctx) once per term in which this
 * replica leads, after a barrier proved every earlier entry applied: meta rebuilds its
 * in-memory state from RocksDB there, as at a restart, and only then serves (mraft_serving).
 * mraft_propose*, mraft_wait, mraft_settle, mraft_serving and mraft_status may be called
 * from any thread.
 */
#ifndef KVFS_META_RAFT_H
#define KVFS_META_RAFT_H

#include "kvp_frame.h"

#include <rocksdb/c.h>
#include <stddef.h>
#include <stdint.h>

#define MRAFT_MAX_PEERS 9
#define MRAFT_ADDR_MAX	64

struct mraft;

struct mraft_opts {
	uint64_t id;	      /* this replica's id, one of peers */
	const char *peers;    /* "1=HOST:PORT,2=HOST:PORT,...": every voter's Raft address */
	const char *dir;      /* Raft log and snapshots (created if missing) */
	rocksdb_t *db;	      /* the state: committed entries are applied to it */
	unsigned election_ms; /* election timeout (heartbeats every tenth of it) */
	/* a snapshot every this many entries, a fifth of them kept behind it; 0 = 100000 */
	unsigned snapshot_every;
	/* ... or once the entries applied since the last snapshot hold this many bytes, with
	 * about a fifth of these bytes kept behind it: libraft holds every entry since the last
	 * snapshot in memory, and the entry count alone does not bound that when entries are
	 * large (docs/meta.md, "Snapshots and log compaction"). 0 = by entry count only. */
	uint64_t snapshot_bytes;
	int join; /* a new replica of a running group: no bootstrap, it waits to be added */
	/* The cluster secret: Raft runs over TLS with it (meta_rtls.h). NULL, or one in
	 * insecure_plaintext mode (KVFS_INSECURE_PLAINTEXT=1): libraft's plaintext TCP
	 * transport, which anyone reaching the port can write entries through. */
	const struct kvp_secret *secret;
	/* libraft stores snapshots uncompressed (its default is LZ4, a second copy of the
	 * database in memory while it compresses; docs/meta.md) */
	int no_compress;
	/* Called on the watcher thread when this replica becomes leader and has applied every
	 * earlier entry; 0, or a negative errno: not serving, tried again after a while. */
	int (*on_lead)(void *ctx);
	void *ctx;
};

/* 0, -EINVAL (bad peers list: message logged), -ENOMEM, -EIO (libraft error, logged). The
 * replica bootstraps the peers as the first configuration when its Raft directory is empty.
 * Free with mraft_stop. */
int mraft_start(const struct mraft_opts *o, struct mraft **out);
/* Stops the threads and closes libraft; proposals in flight end with -ECONNABORTED. */
void mraft_stop(struct mraft *r);

/* Applies a serialised WriteBatch (Put, Delete, SingleDelete, DeleteRange records only) to
 * the database now and appends it as one entry, without waiting: *seq names it for
 * mraft_wait. 0; -EREMCHG: not the serving leader, nothing written or appended (safe to send
 * elsewhere); -EINVAL (a record kind it cannot undo), -ENOMEM, -EIO (nothing written). */
int mraft_propose_async(struct mraft *r, const char *data, size_t len, uint64_t *seq);
/* Waits until entry seq is committed (0), or was rolled back (-ECONNABORTED: leadership was
 * lost or the append failed, so it may or may not commit later: the same ambiguity as a
 * connection lost mid-request). */
int mraft_wait(struct mraft *r, uint64_t seq);
/* Waits until every speculative write made so far is committed: a reply built from what the
 * database showed before the call reveals no uncommitted state. 0 or -ECONNABORTED (some
 * were rolled back). Returns at once when none is pending. */
int mraft_settle(struct mraft *r);
/* mraft_propose_async, then mraft_wait. */
int mraft_propose(struct mraft *r, const char *data, size_t len);
/* Changes the group's configuration on the leader: add (a voter, once it caught up) or
 * remove replica id. Waits until the change is committed. 0, -EREMCHG (not the leader),
 * -EINVAL (bad id or address), -EBUSY (another change in progress), -ECONNABORTED, -EIO. */
int mraft_change(struct mraft *r, int add, uint64_t id, const char *addr);
/* 1 when this replica leads, caught up, and on_lead succeeded in the current term. */
int mraft_serving(struct mraft *r);

struct mraft_status {
	uint64_t id, term, leader_id;
	uint8_t state; /* 0 unavailable, 1 follower, 2 candidate, 3 leader (libraft's) */
	uint8_t serving;
	char leader_addr[MRAFT_ADDR_MAX];
	uint64_t last_index, applied, commit;
	uint32_t npeers;
	struct mraft_peer {
		uint64_t id;
		char addr[MRAFT_ADDR_MAX];
		uint64_t match; /* leader only: highest entry known replicated on it */
	} peers[MRAFT_MAX_PEERS];
	uint64_t snap_index; /* the last snapshot's last entry (0 none) */
	uint64_t snapshots;  /* snapshots this process took (not installed ones) */
	uint64_t log_bytes;  /* bytes of the entries applied since the last snapshot */
	uint64_t log_mem;    /* entries libraft holds in memory (trailing ones included) */
	uint64_t snap_size;  /* bytes of the last snapshot taken or installed (0 none) */
};
/* A copy of the state as of at most 20 ms ago. */
void mraft_status(struct mraft *r, struct mraft_status *s);

#endif
