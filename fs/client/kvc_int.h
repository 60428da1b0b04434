/* kvc internals shared by the client library's .c files (not installed, not a contract). */
#ifndef KVFS_KVC_INT_H
#define KVFS_KVC_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "kvc.h"
#include "kvch.h"
#include "kvec.h"

#define KVC_BAD_NODE_MS	  3000 /* a node that timed out or refused is skipped this long */
#define KVC_META_ATTEMPTS 10   /* attempts of a meta call (KVCH_RETRY_META) */
#define KVC_TOUCH_MAX	  1024 /* access times held before a TOUCH is sent regardless */
#define KVC_TOUCH_MS	  30000
#define KVC_PREFETCH	  64 /* layouts kept from kvc_lookup_layout */
/* ... and for this long: the open in the same syscall as the lookup takes it. Longer, a
 * lookup with no open after it (a stat) left the layout for an open after another client
 * replaced the file, which read the old version (test_replace_other_mount). */
#define KVC_PREFETCH_MS 100

enum kvc_stage {
	KVC_ST_OPEN,
	KVC_ST_PREAD,
	KVC_ST_STRIPE_GET,
	KVC_ST_COMMIT,
	KVC_ST_ENCODE,
	KVC_ST_CRC,
	KVC_ST_PUT_SEND,
	KVC_ST_PUT_WAIT,
	KVC_ST_N
};

struct met_hist;
struct met_ops;

struct kvc_badnode {
	uint32_t id;
	int64_t until_ms;
};

/* Leaders' addresses a replica named in a redirect, kept past the configured list: a client
 * given one follower's address learns the leader's (kvc_meta.c). */
#define KVC_LEARNED_METAS 4

struct kvc {
	/* The configured metas (nconf), then learned ones; meta_mu protects metas and nmetas
	 * (a learned slot may be replaced when all are taken: copy an address under it). */
	char metas[KVC_MAX_METAS + KVC_LEARNED_METAS][KVP_ADDR_MAX];
	int nmetas, nconf, learn_next;
	pthread_mutex_t meta_mu;
	atomic_int meta_cur; /* the meta that answered last: the leader, as far as we know */
	struct kvp_secret secret;
	int timeout_ms;	     /* meta requests, node PUTs */
	int read_timeout_ms; /* node GETs: short, so a stopped node only delays a read briefly */
	int k, m;	     /* defaults for new files */
	uint32_t chunk_size; /* largest chunk a new file uses */
	uint64_t max_file, max_buffered;
	struct kvp_pool *pool; /* meta and node connections; thread-safe */

	pthread_mutex_t mu; /* protects codecs, bad, nbad, pre, pre_next */
	/* One codec per geometry met, made on first use and kept (open files point at them):
	 * a slot for every (k, m), so no mix of geometries can run out of them. */
	struct kvec_codec *codecs[KVEC_MAX_K][KVEC_MAX_M + 1];
	struct kvc_badnode bad[64];
	int nbad;

	atomic_uint_fast64_t buffered; /* bytes held by all writers */
	/* Writers waiting for buffer memory (kvc_buffer_wait) sleep on buf_cond (CLOCK_MONOTONIC);
	 * buf_freed counts the writers freed, protected by buf_mu. */
	pthread_mutex_t buf_mu;
	pthread_cond_t buf_cond;
	uint64_t buf_freed;
	atomic_uint_fast64_t st_written, st_read, st_files, st_degraded, st_crc, st_around;
	atomic_uint_fast64_t st_prefetched;

	/* Layouts that came with a lookup, for the open that follows (kvc_lookup_layout);
	 * protected by mu. b: the LAYOUT reply body, malloc'd; ino 0: free slot. */
	struct {
		uint64_t ino;
		int64_t at_ms;
		uint8_t *b;
		uint32_t len;
	} pre[KVC_PREFETCH];
	uint32_t pre_next;
	atomic_int lookup_flag_refused; /* meta predates KVP_LOOKUP_LAYOUT */

	/* Stage and meta round-trip latencies (kvc_set_metrics); NULL: not measured. */
	struct met_hist *stage[KVC_ST_N];
	struct met_ops *meta_ops;

	/* Access times not yet sent (kvc_touch.c); protected by mu. */
	int touch_interval_ms; /* 0 = KVC_TOUCH_MS, < 0 never */
	int64_t touch_last_ms;
	uint32_t ntouch;
	struct {
		uint64_t ino;
		int64_t atime_ns;
	} touch[KVC_TOUCH_MAX];
};

/* Records an access of ino; sends the batch when the interval has passed or it is full. */
void kvc__touch(struct kvc *c, uint64_t ino);

int64_t kvc__now_ms(void);
/* CLOCK_MONOTONIC in ns, for stage timing. */
uint64_t kvc__now_ns(void);
/* Observes now - t0 in stage st's histogram (no-op without metrics). */
void kvc__stage(struct kvc *c, enum kvc_stage st, uint64_t t0);

/* A request to meta on a pooled connection. attempts > 1 retries transport failures with
 * backoff (reconnecting); *retried (may be NULL) is set when a retry happened, so callers of
 * non-idempotent ops can interpret -EEXIST / -ENOENT. */
int kvc__meta_call(struct kvc *c, uint16_t op, const struct kvp_wbuf *req, int attempts,
		   uint8_t **rb, uint32_t *rl, int *retried);

/* The layout a kvc_lookup_layout brought for ino, if fresh: *b (caller frees) and *len, and
 * it is no longer kept. 0 or -ENOENT. */
int kvc__prefetched_take(struct kvc *c, uint64_t ino, uint8_t **b, uint32_t *len);

/* Codec for (k, m), created on first use and kept until kvc_close. */
int kvc__codec(struct kvc *c, int k, int m, struct kvec_codec **out);

void kvc__node_mark_bad(struct kvc *c, uint32_t id);
int kvc__node_is_bad(struct kvc *c, uint32_t id);

#endif
