/* kvp frames — the framing layer every kvfs process speaks (storage daemons, clients, and the
 * inference engine's gateway <-> worker RPC): frames, body encoding, the TLS transport
 * (kvp_sock), a pipelined RPC client, a connection pool and a connection server. It knows no
 * op beyond the plaintext handshake's; fs/proto/kvp.h defines the filesystem's ops on top of
 * it, engine/serve/kvw.h the engine's. docs/protocol.md is the byte-level specification, this
 * header its C contract.
 *
 * Frame: a 32-byte header, then `len` body bytes. All integers little-endian.
 *   u32 magic "KVFS" (0x5346564B) | u16 version (1) | u16 op | u64 id | i32 status |
 *   u32 flags (bit 0: response) | u32 len | u32 reserved (0)
 * A request's id is chosen by the sender; the response carries the same id, so many requests
 * may be in flight on one connection and be answered in any order. status is 0 or a negative
 * errno (Linux numbering) in responses, 0 in requests. A frame whose header fails any check,
 * or whose body does not parse exactly, closes that connection (never the daemon).
 * Op ranges: 0x01-0x0F the handshake (here), 0x10-0xFF the filesystem (kvp.h), 0x100 and up
 * the engine (kvw.h).
 *
 * Threading: kvp_client and kvp_server are thread-safe; the body codecs are plain functions on
 * caller-owned state. All calls return 0 / a count or a negative errno.
 */
#ifndef KVFS_KVP_FRAME_H
#define KVFS_KVP_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define KVP_MAGIC    0x5346564Bu
#define KVP_VERSION  1
#define KVP_HDR_SIZE 32
/* Largest body any peer accepts: a 16 MiB chunk plus its fields. */
#define KVP_MAX_BODY ((16u << 20) + 4096u)
#define KVP_ADDR_MAX 64

#define KVP_F_RESP 1u

/* The plaintext handshake's ops (docs/protocol.md, "Insecure plaintext mode"). */
enum kvp_frame_op {
	KVP_OP_HELLO = 0x01, /* server -> client: 32-byte nonce_s */
	KVP_OP_AUTH = 0x02,  /* -> 32-byte nonce_c, 32-byte mac_c  <- 32-byte mac_s */
};

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
/* 0 when every read succeeded and the body was consumed exactly; else -EBADMSG (or the
 * sticky error). Call once after parsing a whole body. */
int kvp_r_end(const struct kvp_rbuf *r);

/* ---- sockets ---- */
/* "host:port" -> parts. host is an IPv4 literal or "localhost". -EINVAL otherwise. */
int kvp_addr_parse(const char *addr, char *host, size_t hostcap, uint16_t *port);
/* Listening TCP socket on host:port (port 0 = ephemeral); *bound gets the port. Returns fd. */
int kvp_listen(const char *host, uint16_t port, uint16_t *bound);
/* Connected blocking TCP socket (TCP_NODELAY), failing after timeout_ms. Returns fd. A bare
 * socket: kvp_sock_open is how a process talks to the cluster. */
int kvp_connect(const char *addr, int timeout_ms);

/* ---- the cluster secret ---- */
struct kvp_secret {
	uint8_t key[64];
	size_t len; /* 16..64 bytes */
	/* 1: talk plaintext with the HMAC handshake (no confidentiality, no per-frame integrity:
	 * anyone on the path can read and change frames). Set from the environment variable
	 * KVFS_INSECURE_PLAINTEXT=1 by kvp_secret_load/_from_string, which log a warning. Both
	 * ends must agree; a TLS end and a plaintext end fail their handshake. */
	int insecure_plaintext;
};
/* Reads the secret from a file (its bytes, trailing newline stripped; 16..64 bytes).
 * -EINVAL with a log line naming the problem. */
int kvp_secret_load(const char *path, struct kvp_secret *s);
int kvp_secret_from_string(const char *text, struct kvp_secret *s);

/* ---- kvp_sock: one cluster connection (docs/protocol.md, "Transport") ----
 * By default TLS 1.3 with an external PSK derived from the cluster secret (HKDF-SHA256), cipher
 * TLS_AES_128_GCM_SHA256, (EC)DHE key exchange; kernel TLS is requested and used where the
 * kernel offers it. Both ends prove the secret in the handshake; afterwards a changed, dropped,
 * replayed, reordered or injected byte fails the record's AEAD tag and the connection. With
 * secret->insecure_plaintext, the HMAC challenge-response handshake and plaintext frames.
 *
 * Threading: one thread may read while another writes (the reader and the senders of a
 * pipelined client): every OpenSSL call on the connection is made under its own lock over a
 * non-blocking socket, and waiting for the socket happens outside that lock. Two concurrent
 * writers must serialise themselves (frames must not interleave); so must two readers.
 * A process using TLS ignores SIGPIPE (set at first use if it was SIG_DFL): OpenSSL writes
 * with write(2), and a peer's reset must be an error, not the death of the process. */
struct kvp_sock;
/* Connects and runs the client handshake, the whole of both within timeout_ms. -EACCES: the
 * server refused our secret or proved a different one; -EPROTO: the peer does not speak our
 * transport (logged: e.g. a TLS client against a plaintext server); -ETIMEDOUT; -ECONNREFUSED. */
int kvp_sock_open(const char *addr, const struct kvp_secret *s, int timeout_ms,
		  struct kvp_sock **out);
/* Server side on an accepted fd: the handshake within timeout_ms for the whole exchange, so a
 * peer trickling bytes is cut off at the deadline. On success *out owns fd; on failure the
 * caller still does. Errors as kvp_sock_open. */
int kvp_sock_accept(int fd, const struct kvp_secret *s, int timeout_ms, struct kvp_sock **out);
/* Frees the TLS state and closes the fd. NULL is a no-op. Not concurrent with any other call. */
void kvp_sock_close(struct kvp_sock *k);
/* shutdown(2) both ways: any thread blocked on k returns an error. Thread-safe. */
void kvp_sock_shutdown(struct kvp_sock *k);
/* The socket, for shutdown(2) (a half-close) and poll(2): never read or write it directly. */
int kvp_sock_fd(const struct kvp_sock *k);
/* A send that makes no progress for ms fails with -EAGAIN (<= 0: wait forever, the default). */
void kvp_sock_set_send_timeout(struct kvp_sock *k, int ms);
/* 1 when the kernel encrypts this connection's sends (kTLS), else 0. */
int kvp_sock_ktls_send(const struct kvp_sock *k);
/* 1 when TLS protects this connection. */
int kvp_sock_tls(const struct kvp_sock *k);
/* Raw bytes inside the connection, for tests that forge frames: writes all n bytes (0 or
 * -errno); reads up to n bytes waiting at most timeout_ms (< 0: forever): a count, 0 at the
 * end of the stream, -ETIMEDOUT, -EBADMSG for a record that fails its check, or -errno. */
int kvp_sock_write(struct kvp_sock *k, const void *p, size_t n);
long kvp_sock_read(struct kvp_sock *k, void *p, size_t n, int timeout_ms);

/* Sends one frame: header, then body (may be NULL), then bulk (may be NULL). h->len is set
 * from body_len + bulk_len. Serialise concurrent senders on one k. */
int kvp_send(struct kvp_sock *k, struct kvp_hdr *h, const void *body, size_t body_len,
	     const void *bulk, size_t bulk_len);
/* Receives one frame: checks the header, then reads the body into a malloc'd buffer (*body,
 * caller frees; NULL when len is 0). Waits forever for it (until kvp_sock_shutdown).
 * -ECONNRESET on EOF, -EPROTO/-EMSGSIZE on a bad header, -EBADMSG on a record failing its
 * integrity check. */
int kvp_recv(struct kvp_sock *k, struct kvp_hdr *h, uint8_t **body, uint32_t max_body);

/* Counters a server keeps for its daemon's /metrics (kvp_server_opts.conn_stats). */
struct kvp_conn_stats {
	_Atomic uint64_t accepted;   /* connections accepted */
	_Atomic uint64_t refused;    /* closed at once: over the unauthenticated caps */
	_Atomic uint64_t hs_failed;  /* handshakes failed: wrong secret, not our protocol */
	_Atomic uint64_t hs_timeout; /* handshakes not done within the deadline */
	_Atomic uint64_t accept_err; /* accept() failed (EMFILE, ENFILE, ENOBUFS ...) */
};

/* This process's outgoing connections (kvp_sock_open, under every client): hs_failed and
 * hs_timeout count handshakes that failed after the TCP connect succeeded (a refused or
 * unreachable address is not one); the other fields stay 0. A client whose secret or
 * transport mode differs from the cluster's, or a peer that is not kvfs, shows here, where a
 * log line alone would be lost. Process-wide, never freed. */
const struct kvp_conn_stats *kvp_client_conn_stats(void);

/* ---- pipelined RPC client: one kvp_sock and a reader thread ---- */
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
/* Breaks the connection (shutdown(2)): every call in flight, and every later one, fails with
 * -ECONNRESET; close it as usual. Thread-safe: for a thread parked in kvp_call_wait. */
void kvp_client_shutdown(struct kvp_client *c);
const char *kvp_client_addr(const struct kvp_client *c);

/* Sends a request (body then bulk, no copy: both may be freed when this returns) and returns a
 * handle to wait on. Many may be in flight on one client from any threads. */
int kvp_call_start(struct kvp_client *c, uint16_t op, const void *body, size_t body_len,
		   const void *bulk, size_t bulk_len, struct kvp_call **out);
/* Asks for the response body to be received into the caller's memory: when it arrives with
 * status 0 and exactly head + len bytes, its first head bytes become *body of kvp_call_wait
 * (malloc'd, caller frees) and the rest is read straight into dst, with no allocation or copy;
 * any other response is delivered as usual (dst untouched). dst must stay valid until
 * kvp_call_wait returns; dst may be written even when the caller then rejects the answer.
 * Call before kvp_call_wait, from the thread that will wait. 0, or -EALREADY when the
 * response is already in or arriving (it is delivered as usual). */
int kvp_call_into(struct kvp_call *call, uint32_t head, void *dst, uint32_t len);
/* Waits for the response and frees the call (also on error). Returns the peer's status (0 or
 * negative errno) or a transport error: -ETIMEDOUT (the late response is then discarded),
 * -ECONNRESET / -ECONNABORTED. On status 0, *body (malloc'd, caller frees; may be NULL when
 * len is 0) and *len receive the response body; pass NULL to discard it. */
int kvp_call_wait(struct kvp_call *call, int timeout_ms, uint8_t **body, uint32_t *len);
/* start + wait. */
int kvp_call(struct kvp_client *c, uint16_t op, const void *body, size_t body_len, const void *bulk,
	     size_t bulk_len, int timeout_ms, uint8_t **rbody, uint32_t *rlen);
/* As kvp_call, but a response with a non-zero status hands over its body too: an error's
 * detail, for the few errors a protocol gives one (kvfs-meta's -EREMCHG names the leader,
 * docs/protocol.md, "Errors"). *rbody (malloc'd, caller frees, NULL when empty) and *rlen are
 * set for any status the peer sent; NULL and 0 after a transport error. The body is the
 * peer's: parse it as untrusted. */
int kvp_call_detail(struct kvp_client *c, uint16_t op, const void *body, size_t body_len,
		    const void *bulk, size_t bulk_len, int timeout_ms, uint8_t **rbody,
		    uint32_t *rlen);

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

/* ---- server: an accept thread and one thread per connection (handshake, then requests) ----
 * The accept loop wakes at least every 100 ms to join finished connections, so descriptors
 * come back even while accept() fails (EMFILE); it then sleeps instead of spinning. */
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
	/* Optional counters (may be NULL), owned by the daemon, must outlive the server. */
	struct kvp_conn_stats *conn_stats;
	/* Connections still in their handshake, at most (0: 256) in all and (0: 64) from one
	 * source address; one more is closed at once. With the handshake deadline they bound what
	 * idle or trickling peers can hold: descriptors, threads. */
	int max_unauth, max_unauth_per_addr;
};
int kvp_server_start(const struct kvp_server_opts *o, struct kvp_server **out);
uint16_t kvp_server_port(const struct kvp_server *s);
/* Stops accepting, closes every connection, joins all threads. */
void kvp_server_stop(struct kvp_server *s);

/* Answers request h on c; an error status (non-zero) is sent with an empty body. Thread-safe;
 * -EPIPE if the connection has closed meanwhile. A reply the peer does not take within the server's
 * send_timeout_ms closes the connection (-EAGAIN), so later replies on it return -EPIPE at once. */
int kvp_reply(struct kvp_conn *c, const struct kvp_hdr *req, int32_t status, const void *body,
	      size_t body_len, const void *bulk, size_t bulk_len);
/* An error reply (status non-zero) that carries a body of at most KVP_ERR_BODY_MAX bytes, for
 * the errors whose protocol defines one (kvp_reply drops the body of any error). -EINVAL for
 * status 0 or a longer body; else as kvp_reply. */
#define KVP_ERR_BODY_MAX 256
int kvp_reply_err(struct kvp_conn *c, const struct kvp_hdr *req, int32_t status, const void *body,
		  size_t body_len);
void kvp_conn_ref(struct kvp_conn *c);
void kvp_conn_unref(struct kvp_conn *c);
/* The peer's "ip:port", for logs. */
const char *kvp_conn_peer(const struct kvp_conn *c);

/* Readable name of a negative errno or status, for logs and CLIs. Transport-generic wording
 * (the framing layer serves the filesystem and the engine alike): what a status means for
 * one protocol is that protocol's docs (docs/protocol.md for the filesystem's). */
const char *kvp_strerror(int err);

#endif
