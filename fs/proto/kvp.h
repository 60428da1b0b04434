/* kvp — the kvfs filesystem protocol: the ops of the storage nodes and the metadata server
 * and their field types, on the framing layer of common/frame/kvp_frame.h (frames, body codec,
 * authentication, RPC client, pool and server; included here). docs/protocol.md is the
 * byte-level specification and this header with kvp_frame.h its C contract.
 *
 * Threading: the attr codec is plain functions on caller-owned state.
 */
#ifndef KVFS_KVP_H
#define KVFS_KVP_H

#include <stddef.h>
#include <stdint.h>

#include "kvp_frame.h"

#define KVP_NAME_MAX 255

/* Opcodes. Body layouts: "->" request, "<-" response body when status is 0. `str` is u16 length
 * + bytes (no NUL), `attr` is struct kvp_attr as encoded by kvp_w_attr (80 bytes), `slot` is
 * (u32 node_id, u64 chunk_id, u32 crc32c). Enum values only ever grow. */
enum kvp_op {
	/* 0x01-0x0F: the handshake, enum kvp_frame_op in kvp_frame.h */

	/* storage node */
	KVP_OP_PUT = 0x10, /* -> u64 chunk_id, u32 crc32c, u32 len, len bytes   <- (empty)
			    *    errors: -ENOSPC over capacity, -EEXIST, -EBADMSG crc mismatch */
	KVP_OP_GET =
	    0x11,	      /* -> u64 chunk_id, u32 offset, u32 len (0xFFFFFFFF: to the end)
			       * <- u32 crc32c of the returned bytes, u32 len, len bytes
			       *    errors: -ENOENT, -EILSEQ stored chunk fails its CRC, -EINVAL range */
	KVP_OP_DEL = 0x12,    /* -> u32 n (<= KVP_MAX_IDS), n x u64 chunk_id  <- u32 deleted */
	KVP_OP_LIST = 0x13,   /* -> u64 start_after, u32 max (<= KVP_MAX_IDS)
			       * <- u32 n, n x (u64 chunk_id, i64 mtime_ns), u8 more */
	KVP_OP_STAT = 0x14,   /* -> (empty)  <- u64 node_uuid, u64 capacity, u64 used, u64 chunks,
			       *    u64 crc_errors */
	KVP_OP_VERIFY = 0x15, /* -> u64 chunk_id  <- u32 crc32c of the whole chunk, u32 len: the
			       *    node reads the chunk and checks it, no data crosses the wire
			       *    errors: as GET (-ENOENT, -EILSEQ) */

	/* metadata server, from nodes */
	KVP_OP_HEARTBEAT = 0x20, /* -> u64 node_uuid, str addr, u64 capacity, u64 used, u64 chunks
				  *    [, str zone (kvp_zone_check; absent = none)]
				  * <- u32 node_id (stable for a uuid) */

	/* metadata server, from clients */
	KVP_OP_LOOKUP = 0x30,  /* -> u64 parent, str name [, u8 flags (kvp_lookup_flags)]  <- attr
				* [, with KVP_LOOKUP_LAYOUT and a regular file: its LAYOUT reply] */
	KVP_OP_GETATTR = 0x31, /* -> u64 ino  <- attr */
	KVP_OP_READDIR = 0x32, /* -> u64 ino, str start_after ("" = first), u32 max
				* <- u32 n, n x (str name, attr), u8 eof; names in byte order */
	KVP_OP_MKDIR = 0x33,   /* -> u64 parent, str name, u32 mode [, u32 uid, u32 gid]  <- attr */
	KVP_OP_RMDIR = 0x34,   /* -> u64 parent, str name  <- (empty); -ENOTEMPTY */
	KVP_OP_UNLINK = 0x35,  /* -> u64 parent, str name  <- (empty); chunks freed in background */
	KVP_OP_RENAME = 0x36,  /* -> u64 parent, str name, u64 newparent, str newname, u32 flags
				*    (1 = RENAME_NOREPLACE)  <- (empty); atomic */
	KVP_OP_ALLOC = 0x37,   /* -> u8 k, u8 m, u32 chunk_size, u32 nstripes (<= KVP_MAX_STRIPES)
				*    [, u8 flags (KVP_ALLOC_*; absent = 0)]
				* <- u64 write_id, u32 nn, nn x (u32 node_id, str addr),
				*    nstripes x (k+m) x (u32 node_id, u64 chunk_id)
				*    [, u8 min_stored: only with KVP_ALLOC_WRITE_AROUND]
				*    a stripe's slots are on distinct nodes; slot j < k holds data
				*    chunk j, slot k+i parity i. With KVP_ALLOC_WRITE_AROUND and fewer
				*    than k+m nodes up, parity slots may have node_id 0 (no node: not
				*    written). min_stored: chunks each stripe must store to commit.
				*    errors: -ENOSPC no room, -EHOSTDOWN fewer nodes up than needed */
	KVP_OP_COMMIT = 0x38,  /* -> u64 parent, str name, u32 mode, u64 write_id, u64 size,
				*    u32 chunk_size, u8 k, u8 m, u8 flags (1 = replace an existing
				*    regular file), u32 nstripes, nstripes x (k+m) x slot
				*    [, u32 uid, u32 gid: the owner; a replaced file's owner stays]
				*    A slot with node_id 0 was not stored (its node failed or none
				*    was placed): the stripe is marked for repair; every stripe needs
				*    at least min_stored slots with a node.
				* <- attr. One RocksDB write batch: visible whole or not at all.
				*    errors: -EEXIST (no replace flag), -EISDIR, -ENOENT parent,
				*    -EHOSTDOWN a stripe stores fewer than min_stored chunks */
	KVP_OP_ABORT = 0x39,   /* -> u64 write_id  <- (empty); its chunks become garbage */
	KVP_OP_LAYOUT = 0x3A,  /* -> u64 ino
				* <- u64 size, u32 chunk_size, u8 k, u8 m, u32 nstripes,
				*    u32 nn, nn x (u32 node_id, str addr, u8 state),
				*    nstripes x (k+m) x slot; a slot with node_id 0 holds no chunk
				*    (written degraded, not yet repaired): the table lists node 0
				*    with an empty addr and state DOWN */
	KVP_OP_STATFS = 0x3B,  /* -> (empty)  <- u64 raw_capacity, u64 raw_used, u64 files,
				*    u64 dirs, u8 k, u8 m, u32 chunk_size, u32 nodes_up, u32 nodes */
	KVP_OP_NODES = 0x3C,   /* -> [u8 flags (KVP_NODES_*; absent = 0)]
				* <- u32 n, n x (u32 node_id, u64 uuid, str addr,
				*    u8 state, u64 capacity, u64 used, u64 chunks, i64 heartbeat_ns)
				*    [, n x str zone: only with KVP_NODES_ZONES; "" = none] */
	KVP_OP_SETATTR = 0x3D, /* -> u64 ino, u32 valid (KVP_SET_*), u32 mode, i64 mtime_ns,
				*    i64 atime_ns  <- attr */
	KVP_OP_TOUCH = 0x3E,   /* -> u32 n (<= KVP_MAX_IDS), n x (u64 ino, i64 atime_ns)  <- (empty)
				*    batched access times; unknown inodes are ignored */
	KVP_OP_MAINT = 0x3F,   /* -> u8 action (enum kvp_maint), u32 node_id (0: every down node
				*    for REPAIR; the node for DRAIN / NODE_REMOVE; else 0)  <- (empty)
				*    REPAIR, DRAIN and SCRUB start a job on meta's repair worker and
				*    return at once (progress: MSTATUS); GC and RETENTION run one pass
				*    before answering. errors: -EBUSY a job is running, -ENOENT
				* unknown   node, -EBUSY NODE_REMOVE of a node that still holds chunks
				* or is up   and not drained, -EINVAL unknown action */
	KVP_OP_MSTATUS = 0x40, /* -> (empty)  <- u8 job kind (enum kvp_maint, 0 none yet), u8
				* running, u32 node_id, u64 total, u64 done, u64 failed, u64 bytes,
				*    i64 elapsed_ns, then u32 n, n x u64 counters (enum kvp_mstat
				* order; a newer meta may send more, an older one fewer) */
	KVP_OP_RSTATUS = 0x41, /* -> (empty)  <- u64 replica id, u8 state (0 unavailable, 1
				* follower, 2 candidate, 3 leader), u8 serving, u64 term, u64
				* leader id (0 none known), str leader Raft address, u64 last log
				* index, u64 applied, u64 commit, u32 n, n x (u64 id, str Raft
				* address, u64 match index: the leader's view, else 0), u64 last
				* snapshot's index, u64 snapshots taken, u64 bytes of entries
				* applied since it, u64 entries in memory, str leader's client
				* address ("" unknown; an older meta ends before these), u64 last
				* snapshot's size in bytes (0 none; an older meta ends before
				* it). Answered by every replica; -EOPNOTSUPP from a meta without
				* Raft. Parsed by kvp_rstatus_parse */
	KVP_OP_RCONF = 0x42,   /* -> u8 action (1 add a voter, 2 remove), u64 replica id, str Raft
				* address (add; "" for remove)  <- (empty), once the change is
				* committed (an added replica has caught up). Leader only;
				* -EOPNOTSUPP without Raft, -EINVAL bad id/address, -EBUSY a
				* change in progress */
	/* Benchmarks only (kvfs-meta-bench --grow): -EPERM unless kvfs-meta runs with
	 * --bench-fill. Creates n files in one write batch, each with the records an ALLOC +
	 * COMMIT of a file of that geometry and size leaves (inode, directory entry, stripe map
	 * on nodes meta places it on, owner and access-time index; chunks never written).
	 * -> u8 k, u8 m, u32 chunk_size, u64 size, u32 n (1..KVP_BFILL_MAX), n x (u64 parent,
	 *    str name) (distinct)  <- n x u64 ino; -EEXIST (nothing created) if a name is
	 *    taken */
	KVP_OP_BFILL = 0x43,
	/* Directory leases (docs/meta.md, "Directory leases"). The holder (a random id per mount
	 * process) numbers its sessions: a new one each time it drops every lease (its watch
	 * connection ended), announced by its next WATCH.
	 * LEASE: -> u64 holder, u64 session, u64 dir ino, u32 ms (asked; meta grants at most
	 * KVP_LEASE_MAX_MS), u64 renew (0: a new lease; else the id of the lease on dir the
	 * holder holds, to extend)  <- u64 lease_id, u32 granted_ms. From then until the lease
	 * is revoked or granted_ms have passed (measured by the holder from when it SENT the
	 * request), a change to dir's entries or its entries' attributes by anyone is answered
	 * only after the holder acknowledged its revocation (WATCH) or the lease ran out. The
	 * holder reads the listing (READDIR) after the grant. A renewal extends the lease (same
	 * id) only while meta has not revoked it. Errors: -ESRCH (no WATCH of this holder in this
	 * session on this replica yet), -ESTALE (the lease to renew was revoked or is over).
	 * WATCH: -> u64 holder, u64 session, u64 acked (the seq of the last revocation reply
	 * handled)  <- u64 seq, u32 n, n x (u64 dir, u64 lease_id): revoked leases; meta answers
	 * only when it has a revocation to send (a parked request), and the next WATCH
	 * acknowledges it. A session above the holder's last one makes meta forget every lease
	 * of the holder (it dropped them); one below is answered -ECANCELED. One WATCH at a time
	 * per holder, on a connection of its own. */
	KVP_OP_LEASE = 0x44,
	KVP_OP_WATCH = 0x45,
};
#define KVP_LEASE_MAX_MS 1000u

/* KVP_OP_ALLOC flags. WRITE_AROUND: the client stores a stripe without the chunks whose node
 * is absent or fails (COMMIT slots with node_id 0), so meta may place fewer than k+m nodes
 * and ends its reply with min_stored. */
enum kvp_alloc_flags { KVP_ALLOC_WRITE_AROUND = 1 };

/* KVP_OP_NODES flags. ZONES: the reply ends with each node's zone label (a client that does
 * not ask gets the reply older clients parse). */
enum kvp_nodes_flags { KVP_NODES_ZONES = 1 };

/* A failure-domain label (kvfs-node --zone): 1..KVP_ZONE_MAX-1 bytes of [A-Za-z0-9._-].
 * Placement never puts two chunks of a stripe in one zone when there are at least k+m zones;
 * a node without a zone is a zone of its own. */
#define KVP_ZONE_MAX 64
/* 0 when p (len bytes, no NUL needed) is a valid zone label, else -EINVAL. */
int kvp_zone_check(const char *p, size_t len);

/* KVP_OP_LOOKUP flags. LAYOUT: a regular file's reply goes on with the body LAYOUT would
 * answer, so an open right after the lookup needs no round trip of its own (an older meta
 * refuses the flag byte with -EBADMSG; the client then looks up without it). */
enum kvp_lookup_flags { KVP_LOOKUP_LAYOUT = 1 };

/* KVP_OP_MAINT actions. */
enum kvp_maint {
	KVP_MAINT_REPAIR = 1,	 /* rebuild every chunk on down node(s) onto other nodes */
	KVP_MAINT_DRAIN = 2,	 /* no new placements on the node; move all its chunks off it */
	KVP_MAINT_SCRUB = 3,	 /* read every chunk, check its CRC, rebuild bad or missing ones */
	KVP_MAINT_GC = 4,	 /* one orphan-chunk pass (nodes' LIST against metadata) now */
	KVP_MAINT_RETENTION = 5, /* one TTL expiry + watermark eviction pass now */
	KVP_MAINT_NODE_REMOVE = 6, /* forget a node that holds nothing (down or drained) */
	/* Compact the whole RocksDB of the meta that answers (a replica's own, not replicated)
	 * in the background; returns at once, -EBUSY while one runs. Progress: MSTATUS
	 * (KVP_MST_DB_*). After a bulk load, so reads stop paying for its level-0 files. */
	KVP_MAINT_COMPACT = 7,
};

/* KVP_OP_MSTATUS counters, in this order. */
enum kvp_mstat {
	KVP_MST_EXPIRED,	/* files removed by TTL */
	KVP_MST_EVICTED,	/* files removed by the capacity watermark */
	KVP_MST_EVICTED_BYTES,	/* their raw stored bytes */
	KVP_MST_ENOSPC,		/* ALLOCs refused for space after an eviction retry */
	KVP_MST_GC_SCANNED,	/* chunks listed by orphan passes */
	KVP_MST_GC_ORPHANS,	/* orphan chunks queued for deletion */
	KVP_MST_REPAIRED,	/* chunks rebuilt or moved (repair, drain, scrub) */
	KVP_MST_REPAIR_BYTES,	/* their bytes */
	KVP_MST_REPAIR_FAILED,	/* chunks that could not be rebuilt */
	KVP_MST_SCRUB_CHECKED,	/* chunks read by scrub */
	KVP_MST_SCRUB_CORRUPT,	/* failed their CRC */
	KVP_MST_SCRUB_MISSING,	/* absent on their node */
	KVP_MST_SCRUB_REPAIRED, /* corrupt or missing chunks rebuilt */
	KVP_MST_DEGR_WRITES,	/* stripes committed without some of their chunks */
	KVP_MST_DEGR_STRIPES,	/* gauge: stripes written degraded, not yet repaired */
	KVP_MST_DEGR_FILES,	/* gauge: files with such stripes */
	KVP_MST_DB_L0_FILES,	/* gauge: RocksDB table files in level 0 (a read checks each) */
	KVP_MST_DB_PENDING,	/* gauge: bytes RocksDB estimates compaction still has to rewrite */
	KVP_MST_DB_COMPACTING,	/* gauge: compactions running now (RocksDB's and MAINT COMPACT) */
	KVP_MST_DB_COMPACTS,	/* MAINT COMPACT runs finished */
	KVP_MST_LEASE_GRANTED,	/* directory leases granted (LEASE, new) */
	KVP_MST_LEASE_RENEWED,	/* leases extended by their holders */
	KVP_MST_LEASE_REVOKED,	/* leases revoked by a change in their directory */
	KVP_MST_LEASE_ACKED,	/* revocations the holder acknowledged */
	KVP_MST_LEASE_EXPIRED,	/* revocations that waited for the lease's end instead */
	KVP_MST_LEASE_LIVE,	/* gauge: leases held now */
	KVP_MST_COUNT
};

#define KVP_MAX_IDS	65536u
#define KVP_BFILL_MAX	512u /* files per BFILL: one batch stays under a Raft entry */
#define KVP_MAX_STRIPES 65536u
#define KVP_ROOT_INO	1u

/* DRAINING: up and readable, takes no new chunks, its chunks are being moved off. */
enum kvp_node_state { KVP_NODE_UP = 1, KVP_NODE_DOWN = 2, KVP_NODE_DRAINING = 3 };
enum kvp_setattr_valid { KVP_SET_MODE = 1, KVP_SET_MTIME = 2, KVP_SET_ATIME = 4 };

/* A file's or directory's attributes as metadata keeps them. stored = raw bytes the file
 * occupies on nodes (all k+m chunks of every stripe), for st_blocks. */
struct kvp_attr {
	uint64_t ino;
	uint32_t mode; /* S_IFDIR or S_IFREG | permission bits */
	uint32_t nlink;
	uint64_t size;
	int64_t mtime_ns, atime_ns, ctime_ns; /* as stat shows them; SETATTR sets them */
	uint64_t stored;
	uint32_t chunk_size;
	uint8_t k, m;
	/* Last access by kvfs's own clock (creation, TOUCH, never past meta's now; a SETATTR
	 * atime only moves it forward, to at most now): what retention and LRU eviction go by. */
	int64_t access_ns;
	/* Owner, as the creating client said (MKDIR / COMMIT); KVP_OWNER_NONE when none was
	 * recorded (files made before owners were kept, or by a client that sends none): the
	 * mount then shows its own user. */
	uint32_t uid, gid;
};
#define KVP_ATTR_SIZE  80
#define KVP_OWNER_NONE 0xFFFFFFFFu

/* -EREMCHG from a replica of a replicated meta ("not the leader"): its body is empty (no
 * leader known) or `str addr`, the client address (HOST:PORT, as --listen) of the replica
 * that serves as leader (docs/protocol.md, "Errors"). Parses b (untrusted, len bytes) into
 * addr: 0, -ENOENT (empty body) or -EBADMSG (anything but one str holding a usable IPv4
 * HOST:PORT, port not 0); addr is "" unless 0. */
int kvp_redirect_parse(const uint8_t *b, size_t len, char addr[KVP_ADDR_MAX]);

/* KVP_OP_RSTATUS's reply, parsed. Peers past KVP_RSTATUS_PEERS (a Raft group's most) are read
 * and dropped. */
#define KVP_RSTATUS_PEERS 9
struct kvp_rstatus {
	uint64_t id, term, leader_id; /* leader_id 0: none known */
	uint8_t state;		      /* 0 unavailable, 1 follower, 2 candidate, 3 leader */
	uint8_t serving;
	char leader_raft[KVP_ADDR_MAX]; /* the leader's Raft address */
	uint64_t last, applied, commit;
	uint32_t npeers; /* entries of peers[] filled */
	struct kvp_rstatus_peer {
		uint64_t id;
		char raft[KVP_ADDR_MAX];
		uint64_t match; /* the leader's view, else 0 */
	} peers[KVP_RSTATUS_PEERS];
	/* has_snap: the snapshot fields and leader_client came; has_snap_size: snap_size came
	 * (an older meta ends before each; fields that did not come are 0 / ""). */
	uint8_t has_snap, has_snap_size;
	uint64_t snap_index, snapshots, log_bytes, log_mem;
	char leader_client[KVP_ADDR_MAX]; /* "" unknown */
	uint64_t snap_size;
};
/* Parses an RSTATUS reply body (untrusted, len bytes) into s. 0, or -EBADMSG: a field cut
 * short (an optional group must come whole), a string of KVP_ADDR_MAX bytes or more, a state
 * over 3 or a serving flag over 1; s is zeroed then. Bytes after snap_size are ignored: a
 * newer meta may append fields. */
int kvp_rstatus_parse(const uint8_t *b, size_t len, struct kvp_rstatus *s);

/* ---- struct kvp_attr in bodies (80 bytes, docs/protocol.md) ---- */
void kvp_w_attr(struct kvp_wbuf *w, const struct kvp_attr *a);
void kvp_r_attr(struct kvp_rbuf *r, struct kvp_attr *a);

#endif
