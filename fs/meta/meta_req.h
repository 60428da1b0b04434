/* mreq — parsing of kvfs-meta request bodies, kept apart from the server so it can be fuzzed.
 *
 * mreq_parse() decodes one request body (layouts in enum kvp_op, fs/proto/kvp.h) into a struct
 * mreq whose strings and arrays point INTO the body (no copies, no allocation): the body must
 * outlive the struct. Parsing checks only the shape (every length against the bytes present,
 * the body consumed exactly); a body that does not parse must close the connection. Values
 * that parse but are wrong (a bad name, k+m too large, ...) are the handlers' business and are
 * answered with a negative errno; mreq_name_check() is the shared name rule.
 *
 * Thread-safety: plain functions on caller-owned state.
 */
#ifndef KVFS_META_REQ_H
#define KVFS_META_REQ_H

#include <stddef.h>
#include <stdint.h>

/* A str field: bytes inside the body, not NUL-terminated, may contain anything. */
struct mreq_str {
	const char *p;
	uint16_t len;
};

/* One slot of a stripe map on the wire: u32 node_id, u64 chunk_id, u32 crc32c. */
#define MREQ_SLOT_SIZE 16
/* One TOUCH entry: u64 ino, i64 atime_ns. */
#define MREQ_TOUCH_SIZE 16

struct mreq_slot {
	uint32_t node_id;
	uint64_t chunk_id;
	uint32_t crc;
};

struct mreq {
	uint16_t op;
	uint64_t ino;	 /* GETATTR, READDIR, LAYOUT, SETATTR, LEASE */
	uint64_t parent; /* LOOKUP, MKDIR, RMDIR, UNLINK, RENAME, COMMIT */
	struct mreq_str
	    name;	    /* LOOKUP, MKDIR, RMDIR, UNLINK, RENAME, COMMIT; READDIR start_after */
	uint64_t newparent; /* RENAME */
	struct mreq_str newname;
	uint32_t flags;		    /* RENAME flags, COMMIT, ALLOC, NODES and LOOKUP flags (u8) */
	uint32_t mode;		    /* MKDIR, COMMIT, SETATTR */
	uint32_t uid, gid;	    /* MKDIR, COMMIT: KVP_OWNER_NONE when not sent */
	uint32_t max;		    /* READDIR; LEASE: ms */
	uint32_t valid;		    /* SETATTR */
	int64_t mtime_ns, atime_ns; /* SETATTR */
	uint64_t write_id;	    /* COMMIT, ABORT */
	uint64_t size;		    /* COMMIT, BFILL */
	uint32_t chunk_size, nstripes; /* ALLOC, COMMIT */
	uint8_t k, m;		       /* ALLOC, COMMIT */
	const uint8_t *slots;	       /* COMMIT: nstripes * (k+m) * MREQ_SLOT_SIZE bytes */
	uint32_t n;		       /* TOUCH: entry count */
	const uint8_t *touch;	       /* TOUCH: n * MREQ_TOUCH_SIZE bytes */
	uint8_t action;		       /* MAINT: enum kvp_maint; RCONF: 1 add, 2 remove */
	uint32_t node_id;	       /* MAINT */
	/* BFILL: n entries (u64 parent, str name) in names_len bytes; walk with
	 * mreq_bfill_next */
	const uint8_t *names;
	size_t names_len;
	/* HEARTBEAT */
	uint64_t uuid, capacity, used, chunks; /* LEASE, WATCH: uuid = holder */
	uint64_t session, renew;	       /* LEASE (renew), WATCH */
	uint64_t acked;			       /* WATCH */
	struct mreq_str addr;
	struct mreq_str zone; /* len 0: none */
};

/* Parses body (len bytes) of a request with opcode op. Returns 0, -EBADMSG when the body does
 * not parse (caller closes the connection), -EOPNOTSUPP when op is not a meta request. */
int mreq_parse(uint16_t op, const uint8_t *body, size_t len, struct mreq *out);

/* The rule for a directory entry name: 1..KVP_NAME_MAX bytes, no '/' or NUL, not "." or "..".
 * Returns 0, -ENAMETOOLONG or -EINVAL. */
int mreq_name_check(const struct mreq_str *name);

/* Slot i (0 .. nstripes*(k+m)-1) of a parsed COMMIT. i must be in range. */
void mreq_slot_get(const struct mreq *q, size_t i, struct mreq_slot *out);
/* The next BFILL entry at *off (0 for the first) into *parent and *name, advancing *off. 0,
 * or -ENOENT past the last; a parsed request's n entries are all there. */
int mreq_bfill_next(const struct mreq *q, size_t *off, uint64_t *parent, struct mreq_str *name);
/* TOUCH entry i (0 .. n-1). */
void mreq_touch_get(const struct mreq *q, size_t i, uint64_t *ino, int64_t *atime_ns);

#endif
