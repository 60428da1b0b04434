/* kvch: chunk transfer. The one place that speaks the node's chunk ops (PUT, GET, VERIFY, DEL,
 * LIST: docs/protocol.md) and the one parallel stripe read that falls back to parity and
 * decodes. libkvfs (read and write paths) and kvfs-meta (repair, drain, scrub, deletion queue,
 * orphan collection) both use it; neither encodes a chunk request or parses a chunk reply.
 *
 * The transport under it is kvp's connection pool (TCP today): every call takes the pool and a
 * node's "host:port", so replacing the transport touches this module and fs/proto only.
 *
 * Errors: 0 or a negative errno. The node's own answers pass through (-ENOENT no such chunk,
 * -EILSEQ stored chunk fails its CRC, -ENOSPC, -EOPNOTSUPP an op the node does not know);
 * a reply that does not parse is -EBADMSG; a reply for a chunk other than the one expected
 * (other length or CRC) is -EILSEQ. kvch_is_transport() says which errors mean the node or the
 * connection failed rather than the chunk.
 *
 * Threading: no state of its own; a struct kvch_call or kvch_fetch belongs to one thread at a
 * time. The pool is thread-safe. */
#ifndef KVFS_KVCH_H
#define KVFS_KVCH_H

#include <stddef.h>
#include <stdint.h>

#include "kvec.h"
#include "kvp.h"

#define KVCH_TO_END 0xFFFFFFFFu /* GET length: from offset to the end of the chunk */

/* 1 for errors that mean "the node or the connection failed" (refused, reset, aborted, timed
 * out, broken pipe, not connected, host or network unreachable), not "the node answered no":
 * the caller may mark the node bad and go around it, or retry. The one list of these for every
 * chunk and metadata client (libkvfs, kvfs-meta, kvfs-mount). */
int kvch_is_transport(int rc);

/* ---- retry policy: one for chunk and metadata calls ----
 * What is retried: only transport errors (kvch_is_transport), or a failure the caller judged
 * the same (a write whose placement hit an unreachable node). Answers (-ENOENT, -ENOSPC, ...)
 * are final. How: attempt, then wait first_ms, doubling up to max_ms between attempts, until
 * `attempts` attempts were made, `max_timeouts` of them timed out (an unanswered call costs a
 * whole timeout: give up sooner than on a refused connection, a restarting server), or the
 * next attempt, taking as long as the last one, would end past `budget_ms` from
 * kvch_retry_start (so the caller answers within its budget). 0 in a field: no such limit.
 * The named policies below are every one in use; docs/client.md, "Retries". */
struct kvch_retry_policy {
	int attempts;	  /* most attempts in all (1: no retry) */
	int first_ms;	  /* wait before the second attempt */
	int max_ms;	  /* waits double up to this */
	int max_timeouts; /* attempts that may end in -ETIMEDOUT */
	int budget_ms;	  /* wall-clock budget, the calls' own time included */
};
/* libkvfs's metadata calls (attempts set per op: 10 for most, 1 to 3 for ones a caller
 * repeats anyway): 50 ms doubling to 1 s, two timeouts at most: ~5.5 s for a refused
 * connection. */
#define KVCH_RETRY_META ((struct kvch_retry_policy){10, 50, 1000, 2, 0})
/* libkvfs looking for the leader of a replicated meta while every replica refuses (an
 * election): short waits, so the new leader is found within 250 ms of serving; ~7 s in all. */
#define KVCH_RETRY_LEADER ((struct kvch_retry_policy){30, 50, 250, 0, 0})
/* A write whose chunks could not all be stored: placed and stored again after 0.5, 1, 2 s,
 * giving meta time to mark the dead node down. */
#define KVCH_RETRY_STORE ((struct kvch_retry_policy){4, 500, 2000, 0, 0})
/* kvfs-mount's metadata requests while meta is away (over libkvfs's own retries): every 250 ms
 * within --meta-retry; the mount fills budget_ms. */
#define KVCH_RETRY_MOUNT ((struct kvch_retry_policy){0, 250, 250, 0, 0})

/* One request's retries; lives on the caller's stack. */
struct kvch_retry {
	struct kvch_retry_policy p;
	int64_t attempt_ms, deadline_ms; /* CLOCK_MONOTONIC; deadline 0: none */
	int retries, timeouts, delay_ms;
};
/* Call before the first attempt (the budget counts from here). */
void kvch_retry_start(struct kvch_retry *r, const struct kvch_retry_policy *p);
/* After a failed attempt (rc its error): 1 when the policy allows another, after sleeping the
 * backoff (blocks the calling thread up to max_ms); 0 when it is spent. kvch_retry_again
 * retries transport errors only, kvch_retry_wait whatever the caller judged transient. */
int kvch_retry_again(struct kvch_retry *r, int rc);
int kvch_retry_wait(struct kvch_retry *r, int rc);
/* Milliseconds of budget left (0 when spent), -1 without a budget. */
int kvch_retry_left_ms(const struct kvch_retry *r);

/* Request bodies, for callers that bring their own connection (kvfs-node-bench drives one
 * kvp_client): each writes its body into b and returns its length. The functions below use
 * them; nothing else lays out a chunk request. */
#define KVCH_REQ_MAX 16
size_t kvch_put_req(uint8_t b[KVCH_REQ_MAX], uint64_t chunk_id, uint32_t crc, uint32_t len);
size_t kvch_get_req(uint8_t b[KVCH_REQ_MAX], uint64_t chunk_id, uint32_t off, uint32_t len);
size_t kvch_verify_req(uint8_t b[KVCH_REQ_MAX], uint64_t chunk_id);

/* One chunk request in flight: holds a pool reference to its connection until waited for or
 * cancelled. Zero-initialised = idle. */
struct kvch_call {
	struct kvp_pool *pool;
	struct kvp_client *cl;
	struct kvp_call *call;
	uint8_t *into; /* kvch_get_into's dst, NULL until then */
	uint32_t into_len;
};

/* Starting a request: 0, or the connect / send error (the call stays idle). Data for PUT is
 * not copied: it must stay valid until kvch_*_finish. */
int kvch_put_start(struct kvp_pool *p, const char *addr, uint64_t chunk_id, uint32_t crc,
		   const void *data, uint32_t len, struct kvch_call *c);
/* GET of bytes [off, off + len) of a chunk; len KVCH_TO_END: to its end. */
int kvch_get_start(struct kvp_pool *p, const char *addr, uint64_t chunk_id, uint32_t off,
		   uint32_t len, struct kvch_call *c);
/* VERIFY: the node reads and checks the whole chunk and answers its CRC and length only. */
int kvch_verify_start(struct kvp_pool *p, const char *addr, uint64_t chunk_id, struct kvch_call *c);

/* Finishing one: waits up to timeout_ms, releases the connection, leaves c idle. An idle c
 * returns -EAGAIN. */
int kvch_put_finish(struct kvch_call *c, int timeout_ms);
/* The reply must hold exactly len bytes whose CRC32C is the one the node sent and, when
 * want_crc is not NULL, *want_crc (a whole chunk as metadata recorded it). They land in dst
 * (len bytes): received straight into it unless the answer was already in (then copied). On
 * error dst's contents are undefined (a bad chunk may have been received into it). */
int kvch_get_finish(struct kvch_call *c, int timeout_ms, uint8_t *dst, uint32_t len,
		    const uint32_t *want_crc);
/* Asks a GET in flight to receive its data straight into dst (len bytes: the length the
 * finish will expect), which must then stay valid until kvch_get_finish, called with the same
 * dst and len (else -EINVAL), or kvch_cancel. Do this for every GET of a batch before waiting
 * on the first, or the others arrive into fresh buffers meanwhile. 0, -EAGAIN (c idle), or
 * -EALREADY (the answer is in or arriving: it is copied at the finish). */
int kvch_get_into(struct kvch_call *c, uint8_t *dst, uint32_t len);
/* The node's answer must be length len and CRC want_crc, else -EILSEQ. */
int kvch_verify_finish(struct kvch_call *c, int timeout_ms, uint32_t len, uint32_t want_crc);
/* Drops the answer (also of a call in flight): the pool reference is released. */
void kvch_cancel(struct kvch_call *c);

/* DEL of n (<= KVP_MAX_IDS) chunks; *deleted (may be NULL): how many the node had. */
int kvch_del(struct kvp_pool *p, const char *addr, const uint64_t *ids, uint32_t n, int timeout_ms,
	     uint32_t *deleted);

struct kvch_entry {
	uint64_t chunk_id;
	int64_t mtime_ns;
};
/* LIST of up to max (<= KVP_MAX_IDS) chunk ids after start_after, in id order, into out (room
 * for max). *n: entries; *more: 1 when the node holds more after the last. */
int kvch_list(struct kvp_pool *p, const char *addr, uint64_t start_after, uint32_t max,
	      int timeout_ms, struct kvch_entry *out, uint32_t *n, int *more);

/* ---- stripe read: k data chunks in parallel, parity and decode only when needed ---- */

/* Where chunk i of a stripe is. node_id 0 or addr NULL: no chunk stored (a slot written
 * degraded); len 0: an empty chunk, never stored, all zeros. */
struct kvch_slot {
	const char *addr;
	uint32_t node_id;
	uint64_t chunk_id;
	uint32_t crc; /* of the whole chunk, as metadata recorded it */
	uint32_t len; /* stored length (kvec_layout_slot_len) */
};

/* One stripe to read, filled by the caller. */
struct kvch_stripe {
	struct kvp_pool *pool;
	struct kvec_codec *codec; /* (k, m); needed only when something is missing */
	int k, m;
	struct kvch_slot slot[KVEC_MAX_N];
	int timeout_ms;	      /* each GET */
	int retry_timeout_ms; /* GETs that timed out are asked once more with this; 0: never */
	/* Optional. usable(arg, i): 0 when chunk i's node is known down or bad, so it is asked
	 * only after every usable one. failed(arg, i, rc): each GET of chunk i that failed to
	 * start or to finish, with its error (mark the node bad on kvch_is_transport(rc)). */
	int (*usable)(void *arg, int i);
	void (*failed)(void *arg, int i, int rc);
	void *arg;
};

/* The GETs of one stripe in flight (e.g. a prefetch). Zero-initialised = idle. */
struct kvch_fetch {
	uint64_t started; /* chunk i's GET is in call[i] */
	struct kvch_call call[KVEC_MAX_N];
};

/* Starts the GETs of the chunks in `which` that are stored and usable; adds them to
 * f->started. A GET that cannot start is reported to st->failed. */
void kvch_fetch_start(const struct kvch_stripe *st, struct kvch_fetch *f, uint64_t which);
/* Drops every GET in flight; f becomes idle. */
void kvch_fetch_cancel(struct kvch_fetch *f);

/* Reads the chunks of `want` into ptr[i], finishing the GETs f has started (every chunk of
 * f->started is collected into ptr[i]) and leaves f idle. Empty chunks count as present.
 * direct: no decode: when a chunk of want is missing, returns -EAGAIN with *failed the chunks
 * that were asked (or in avoid) and failed, not merely slow. Else gathers k chunks (parity
 * first, then data not yet asked; usable nodes before the rest; never the chunks of avoid),
 * asks slow ones once more, and reconstructs what is missing of want: each ptr[i] then needs
 * room for the stripe's chunk length (slot[0].len); present data chunks shorter than that are
 * zero-padded. Returns 0 (nothing decoded), 1 (decoded), -EIO (fewer than k chunks readable),
 * -EAGAIN (direct), or a codec error. */
int kvch_stripe_read(const struct kvch_stripe *st, struct kvch_fetch *f, uint8_t *const *ptr,
		     uint64_t want, uint64_t avoid, int direct, uint64_t *failed);

#endif
