/* kvp — the kvfs wire protocol: frames, body encoding, authentication, a pipelined RPC client
 * and a connection server. Every kvfs daemon and client speaks it; docs/protocol.md is the
 * byte-level specification and this header its C contract.
 *
 * Frame: a 32-byte header, then `len` body bytes. All integers little-endian.
 *   u32 magic "KVFS" (0x5346564B) | u16 version (1) | u16 op | u64 id | i32 status |
 *   u32 flags (bit 0: response) | u32 len | u32 reserved (0)
 * A request's id is chosen by the sender; the response carries the same id, so many requests
 * may be in flight on one connection and be answered in any order. status is 0 or a negative
 * errno (Linux numbering) in responses, 0 in requests. A frame whose header fails any check,
 * or whose body does not parse exactly, closes that connection (never the daemon).
 *
 * Threading: kvp_client and kvp_server are thread-safe; the body codecs are plain functions on
 * caller-owned state. All calls return 0 / a count or a negative errno.
 */
#ifndef KVFS_KVP_H
#define KVFS_KVP_H

#include <stddef.h>
#include <stdint.h>

#define KVP_MAGIC    0x5346564Bu
#define KVP_VERSION  1
#define KVP_HDR_SIZE 32
/* Largest body any peer accepts: a 16 MiB chunk plus its fields. */
#define KVP_MAX_BODY ((16u << 20) + 4096u)
#define KVP_NAME_MAX 255
#define KVP_ADDR_MAX 64

#define KVP_F_RESP 1u

/* Opcodes. Body layouts: "->" request, "<-" response body when status is 0. `str` is u16 length
 * + bytes (no NUL), `attr` is struct kvp_attr as encoded by kvp_w_attr (72 bytes), `slot` is
 * (u32 node_id, u64 chunk_id, u32 crc32c). Enum values only ever grow. */
enum kvp_op {
	/* handshake (docs/protocol.md, "Authentication") */
	KVP_OP_HELLO = 0x01, /* server -> client: 32-byte nonce_s */
	KVP_OP_AUTH = 0x02,  /* -> 32-byte nonce_c, 32-byte mac_c  <- 32-byte mac_s */

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
				  * <- u32 node_id (stable for a uuid) */

	/* metadata server, from clients */
	KVP_OP_LOOKUP = 0x30,  /* -> u64 parent, str name  <- attr */
	KVP_OP_GETATTR = 0x31, /* -> u64 ino  <- attr */
	KVP_OP_READDIR = 0x32, /* -> u64 ino, str start_after ("" = first), u32 max
				* <- u32 n, n x (str name, attr), u8 eof; names in byte order */
	KVP_OP_MKDIR = 0x33,   /* -> u64 parent, str name, u32 mode  <- attr */
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
	KVP_OP_NODES =
	    0x3C,	       /* -> (empty)  <- u32 n, n x (u32 node_id, u64 uuid, str addr,
				*    u8 state, u64 capacity, u64 used, u64 chunks, i64 heartbeat_ns) */
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
};

/* KVP_OP_ALLOC flags. WRITE_AROUND: the client stores a stripe without the chunks whose node
 * is absent or fails (COMMIT slots with node_id 0), so meta may place fewer than k+m nodes
 * and ends its reply with min_stored. */
enum kvp_alloc_flags { KVP_ALLOC_WRITE_AROUND = 1 };

/* KVP_OP_MAINT actions. */
enum kvp_maint {
	KVP_MAINT_REPAIR = 1,	 /* rebuild every chunk on down node(s) onto other nodes */
	KVP_MAINT_DRAIN = 2,	 /* no new placements on the node; move all its chunks off it */
	KVP_MAINT_SCRUB = 3,	 /* read every chunk, check its CRC, rebuild bad or missing ones */
	KVP_MAINT_GC = 4,	 /* one orphan-chunk pass (nodes' LIST against metadata) now */
	KVP_MAINT_RETENTION = 5, /* one TTL expiry + watermark eviction pass now */
	KVP_MAINT_NODE_REMOVE = 6, /* forget a node that holds nothing (down or drained) */
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
	KVP_MST_COUNT
};

#define KVP_MAX_IDS	65536u
#define KVP_MAX_STRIPES 65536u
#define KVP_ROOT_INO	1u

/* DRAINING: up and readable, takes no new chunks, its chunks are being moved off. */
enum kvp_node_state { KVP_NODE_UP = 1, KVP_NODE_DOWN = 2, KVP_NODE_DRAINING = 3 };
enum kvp_setattr_valid { KVP_SET_MODE = 1, KVP_SET_MTIME = 2, KVP_SET_ATIME = 4 };

struct kvp_hdr {
	uint32_t magic;
	uint16_t version;
	uint16_t op;
	uint64_t id;
	int32_t status;
	uint32_t flags;
	uint32_t len;
	uint32_t reserved;
	/* Not on the wire: CLOCK_MONOTONIC ns at which kvp_server received this request (0 for
	 * frames from elsewhere). Copies of the header carry it to a later kvp_reply. */
	uint64_t recv_ns;
};

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
};
#define KVP_ATTR_SIZE 72

/* ---- header ---- */
void kvp_hdr_encode(const struct kvp_hdr *h, uint8_t out[KVP_HDR_SIZE]);
/* Decodes and checks magic, version, reserved and len <= max_body.
 * Returns 0, -EPROTO (magic/version/reserved) or -EMSGSIZE (len). */
int kvp_hdr_decode(const uint8_t in[KVP_HDR_SIZE], struct kvp_hdr *h, uint32_t max_body);

/* ---- body writer: a growable buffer; errors are sticky, checked once at the end ---- */
struct kvp_wbuf {
	uint8_t *p;
	size_t len, cap;
	int err; /* 0 or -ENOMEM / -ENAMETOOLONG */
};
void kvp_w_init(struct kvp_wbuf *w);
void kvp_w_free(struct kvp_wbuf *w);
void kvp_w_u8(struct kvp_wbuf *w, uint8_t v);
void kvp_w_u16(struct kvp_wbuf *w, uint16_t v);
void kvp_w_u32(struct kvp_wbuf *w, uint32_t v);
void kvp_w_u64(struct kvp_wbuf *w, uint64_t v);
void kvp_w_i64(struct kvp_wbuf *w, int64_t v);
void kvp_w_bytes(struct kvp_wbuf *w, const void *p, size_t n);
void kvp_w_str(struct kvp_wbuf *w, const char *s, size_t n); /* n > 65535: -ENAMETOOLONG */
void kvp_w_cstr(struct kvp_wbuf *w, const char *s);
void kvp_w_attr(struct kvp_wbuf *w, const struct kvp_attr *a);

/* ---- body reader over untrusted bytes: every read is bounds-checked; after an overrun every
 * later read returns zeros and err stays -EBADMSG ---- */
struct kvp_rbuf {
	const uint8_t *p;
	size_t len, off;
	int err;
};
void kvp_r_init(struct kvp_rbuf *r, const void *p, size_t len);
uint8_t kvp_r_u8(struct kvp_rbuf *r);
uint16_t kvp_r_u16(struct kvp_rbuf *r);
uint32_t kvp_r_u32(struct kvp_rbuf *r);
uint64_t kvp_r_u64(struct kvp_rbuf *r);
int64_t kvp_r_i64(struct kvp_rbuf *r);
/* Points *p at n bytes inside the buffer (no copy); NULL and -EBADMSG if fewer remain. */
const uint8_t *kvp_r_bytes(struct kvp_rbuf *r, size_t n);
/* A str field copied into dst as a C string; -ENAMETOOLONG in r->err if it needs more than
 * cap-1 bytes, -EBADMSG if it contains a NUL byte. Returns its length. */
size_t kvp_r_str(struct kvp_rbuf *r, char *dst, size_t cap);
void kvp_r_attr(struct kvp_rbuf *r, struct kvp_attr *a);
/* 0 when every read succeeded and the body was consumed exactly; else -EBADMSG (or the
 * sticky error). Call once after parsing a whole body. */
int kvp_r_end(const struct kvp_rbuf *r);

/* ---- sockets ---- */
/* "host:port" -> parts. host is an IPv4 literal or "localhost". -EINVAL otherwise. */
int kvp_addr_parse(const char *addr, char *host, size_t hostcap, uint16_t *port);
/* Listening TCP socket on host:port (port 0 = ephemeral); *bound gets the port. Returns fd. */
int kvp_listen(const char *host, uint16_t port, uint16_t *bound);
/* Connected TCP socket (TCP_NODELAY), failing after timeout_ms. Returns fd. */
int kvp_connect(const char *addr, int timeout_ms);
/* Sends one frame: header, then body (may be NULL), then bulk (may be NULL), with no copy.
 * h->len is set from body_len + bulk_len. Handles short writes; not thread-safe per fd. */
int kvp_send(int fd, struct kvp_hdr *h, const void *body, size_t body_len, const void *bulk,
	     size_t bulk_len);
/* Receives one frame: checks the header, then reads the body into a malloc'd buffer (*body,
 * caller frees; NULL when len is 0). -ECONNRESET on EOF, -EPROTO/-EMSGSIZE on a bad header. */
int kvp_recv(int fd, struct kvp_hdr *h, uint8_t **body, uint32_t max_body);

/* ---- authentication: HMAC-SHA256 challenge-response on the cluster secret ---- */
struct kvp_secret {
	uint8_t key[64];
	size_t len; /* 16..64 bytes */
};
/* Reads the secret from a file (its bytes, trailing newline stripped; 16..64 bytes).
 * -EINVAL with a log line naming the problem. */
int kvp_secret_load(const char *path, struct kvp_secret *s);
int kvp_secret_from_string(const char *text, struct kvp_secret *s);
/* Run on a freshly accepted/connected fd before any other frame. Both sides prove the secret;
 * the server also learns the client proved it. -EACCES when the peer fails, -ETIMEDOUT,
 * -EPROTO on a malformed handshake. timeout_ms bounds the whole exchange. */
int kvp_auth_server(int fd, const struct kvp_secret *s, int timeout_ms);
int kvp_auth_client(int fd, const struct kvp_secret *s, int timeout_ms);

/* ---- pipelined RPC client: one authenticated connection and a reader thread ---- */
struct kvp_client;
struct kvp_call;

/* Default bound on a send that makes no progress, for clients and servers. */
#define KVP_SEND_TIMEOUT_MS 30000

int kvp_client_open(const char *addr, const struct kvp_secret *s, int timeout_ms,
		    struct kvp_client **out);
/* Fails every call in flight with -ECONNABORTED, joins the reader, frees. NULL is a no-op. */
void kvp_client_close(struct kvp_client *c);
/* How long sending one request may make no progress (the peer takes no byte: stopped, wedged)
 * before it fails and the connection with it (KVP_SEND_TIMEOUT_MS from kvp_client_open). A send
 * holds the connection's send lock, so without a bound every other call to that peer queued
 * behind it forever, their own timeouts unused. */
void kvp_client_set_send_timeout(struct kvp_client *c, int ms);
/* 1 while the connection works; 0 once it has failed (open a new one). */
int kvp_client_alive(const struct kvp_client *c);
const char *kvp_client_addr(const struct kvp_client *c);

/* Sends a request (body then bulk, no copy: both may be freed when this returns) and returns a
 * handle to wait on. Many may be in flight on one client from any threads. */
int kvp_call_start(struct kvp_client *c, uint16_t op, const void *body, size_t body_len,
		   const void *bulk, size_t bulk_len, struct kvp_call **out);
/* Waits for the response and frees the call (also on error). Returns the peer's status (0 or
 * negative errno) or a transport error: -ETIMEDOUT (the late response is then discarded),
 * -ECONNRESET / -ECONNABORTED. On status 0, *body (malloc'd, caller frees; may be NULL when
 * len is 0) and *len receive the response body; pass NULL to discard it. */
int kvp_call_wait(struct kvp_call *call, int timeout_ms, uint8_t **body, uint32_t *len);
/* start + wait. */
int kvp_call(struct kvp_client *c, uint16_t op, const void *body, size_t body_len, const void *bulk,
	     size_t bulk_len, int timeout_ms, uint8_t **rbody, uint32_t *rlen);

/* ---- connection pool: one live client per address, reopened when it has failed ---- */
struct kvp_pool;
int kvp_pool_create(const struct kvp_secret *s, int connect_timeout_ms, struct kvp_pool **out);
void kvp_pool_destroy(struct kvp_pool *p);
/* A live client for addr, opened on first use or after a failure. The pool owns it: release
 * with kvp_pool_put, never close it. -ECONNREFUSED etc. when it cannot connect. */
int kvp_pool_get(struct kvp_pool *p, const char *addr, struct kvp_client **out);
void kvp_pool_put(struct kvp_pool *p, struct kvp_client *c);
/* Breaks the pool's live connection to addr, if any (it never connects): every call in flight
 * on it fails with -ECONNRESET and the next kvp_pool_get reconnects. For a peer that stopped
 * answering: its calls would otherwise wait out their whole timeouts. */
void kvp_pool_abort(struct kvp_pool *p, const char *addr);

/* ---- server: an accept thread and one thread per authenticated connection ---- */
struct kvp_server;
struct kvp_conn;

/* Called on the connection's thread for each request frame. The handler owns body (free() it)
 * and must answer exactly once with kvp_reply, now or later from any thread (take a
 * kvp_conn_ref to reply after returning). Returning non-zero closes the connection (use it
 * for a body that does not parse). */
typedef int (*kvp_handler_fn)(void *ctx, struct kvp_conn *c, const struct kvp_hdr *h,
			      uint8_t *body);

struct kvp_server_opts {
	const char *name; /* for logs, e.g. "node" */
	const char *host; /* listen address, e.g. "127.0.0.1" */
	uint16_t port;	  /* 0 = ephemeral */
	const struct kvp_secret *secret;
	uint32_t max_body; /* 0 = KVP_MAX_BODY */
	/* How long one reply may wait for room in a peer's socket without sending a byte before
	 * the connection is closed (0 = KVP_SEND_TIMEOUT_MS). Replies go out on shared threads
	 * (a node's completion workers): without a bound, a peer that stops reading (stopped,
	 * partitioned) would hold one of them for as long as it keeps the connection open. */
	int send_timeout_ms;
	kvp_handler_fn handler;
	void *ctx;
	/* Optional, for metrics: called by every kvp_reply to this server's requests, on the
	 * replying thread, with the request (req->op, req->len: its body bytes), the reply status,
	 * the reply's body + bulk bytes (0 on error) and the ns since the request was received.
	 * Must be thread-safe and cheap; stats_ctx must outlive every connection (replies may come
	 * after kvp_server_stop from threads the daemon still runs). */
	void (*on_reply)(void *stats_ctx, const struct kvp_hdr *req, int32_t status,
			 size_t reply_bytes, uint64_t ns);
	void *stats_ctx;
};
int kvp_server_start(const struct kvp_server_opts *o, struct kvp_server **out);
uint16_t kvp_server_port(const struct kvp_server *s);
/* Stops accepting, closes every connection, joins all threads. */
void kvp_server_stop(struct kvp_server *s);

/* Answers request h on c. Thread-safe; -EPIPE if the connection has closed meanwhile. A reply
 * the peer does not take within the server's send_timeout_ms closes the connection (-EAGAIN),
 * so later replies on it return -EPIPE at once. */
int kvp_reply(struct kvp_conn *c, const struct kvp_hdr *req, int32_t status, const void *body,
	      size_t body_len, const void *bulk, size_t bulk_len);
void kvp_conn_ref(struct kvp_conn *c);
void kvp_conn_unref(struct kvp_conn *c);
/* The peer's "ip:port", for logs. */
const char *kvp_conn_peer(const struct kvp_conn *c);

/* Readable name of a negative errno or kvfs status, for logs and CLIs. */
const char *kvp_strerror(int err);

#endif
