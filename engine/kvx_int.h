/* kvx internals shared by kvx.c (lookup, load) and kvx_save.c (background writer).
 * Layering: kvx.c -> kvx_save.c -> this header; what both files need is here. */
#ifndef KVFS_KVX_INT_H
#define KVFS_KVX_INT_H

#include <liburing.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "kvb.h"
#include "kvx.h"

#define KVX_FUSE_SUPER_MAGIC 0x65735546 /* statfs f_type of any FUSE file system */
#define KVX_PATH_REL	     160	/* "<64 hex>/<2>/<64 hex>.kvb" and temp suffixes */
#define KVX_NS_PER_MS	     1000000ull
/* kvx_opts defaults and bounds (kvx.h) */
#define KVX_QUEUE_DEPTH_DEFAULT 64
#define KVX_QUEUE_DEPTH_MAX	4096
#define KVX_SAVE_SLOTS_DEFAULT	256
#define KVX_SAVE_SLOTS_MAX	65536
#define KVX_KNOWN_TTL_MS	60000
#define KVX_KNOWN_CAP		4096 /* entries of the known set, a power of two */
/* io_uring user data: the slot index above the op (KVX_OP_BITS low bits) */
#define KVX_OP_BITS 2
#define KVX_OP_MASK ((1u << KVX_OP_BITS) - 1)

enum kvx_slot_state { SLOT_FREE = 0, SLOT_QUEUED, SLOT_WRITING, SLOT_DONE };

/* One block being saved. Filled by the caller while FREE, read by the writer after QUEUED. */
struct kvx_slot {
	int state; /* enum kvx_slot_state; under kvx.mu */
	uint64_t seq;
	uint8_t hash[KVB_HASH], parent[KVB_HASH];
	int first;	 /* no parent */
	int block_id;	 /* the caller's reference, dropped when DONE is drained */
	const void *mem; /* the block's KV memory (read-only while referenced) */
	int32_t *tokens; /* B ids */
	int result;	 /* when DONE: 1 saved, 0 existed, < 0 error */
};

/* A recently seen block: probe skipped until t_ms + ttl. */
struct kvx_known {
	uint64_t key;
	uint64_t t_ms;
};

struct kvx {
	struct kvi_engine *e;
	struct kvi_kv *kv;
	struct kvx_opts o;
	struct kvb_geom g;
	uint8_t fp[KVB_HASH];
	char fphex[2 * KVB_HASH + 1];
	int B;
	uint64_t payload;
	char dir[PATH_MAX];
	char model_dir[PATH_MAX];
	int dirfd;
	int is_kvfs;

	struct io_uring ring; /* loads, caller thread */
	struct kvx_known *known;
	int known_cap; /* power of two */

	/* save queue: slots[] states, stats and stop are protected by mu */
	pthread_mutex_t mu;
	pthread_cond_t cv_work, cv_done;
	struct kvx_slot *slots;
	int nslots;
	int n_busy; /* slots not FREE */
	uint64_t next_seq;
	int stop;
	struct kvx_stats st;
	pthread_t writer;
	int writer_started;
	int32_t *slot_tokens;
	/* writer buffers, queue_depth each (allocated here so the writer cannot fail to) */
	struct kvx_slot **wbatch;
	void *wjobs;
	uint8_t *whdrs;
	int ring_ok; /* the load ring */
};

static inline uint64_t kvx_now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* ---- known set: recently seen present blocks (a probe saved, never a load skipped). Both
 * files use it; it lives here so that kvx_save.c never calls into kvx.c. ---- */

static inline uint64_t kvx_known_key(const uint8_t h[KVB_HASH])
{
	uint64_t k;
	memcpy(&k, h, 8);
	return k | 1; /* 0 marks an empty entry */
}

static inline void kvx_known_add(struct kvx *x, const uint8_t h[KVB_HASH])
{
	uint64_t k = kvx_known_key(h);
	x->known[k & (uint64_t)(x->known_cap - 1)] =
	    (struct kvx_known){k, kvx_now_ns() / KVX_NS_PER_MS};
}

static inline int kvx_known_has(struct kvx *x, const uint8_t h[KVB_HASH])
{
	uint64_t k = kvx_known_key(h);
	const struct kvx_known *e = &x->known[k & (uint64_t)(x->known_cap - 1)];
	return e->key == k && kvx_now_ns() / KVX_NS_PER_MS < e->t_ms + (uint64_t)x->o.known_ttl_ms;
}

/* kvx_save.c (lower: kvx.c calls it, never the reverse). */
/* Drops the references of finished saves (caller thread). */
void kvx_drain_done(struct kvx *x);
/* Size of the writer's per-block job record. */
size_t kvx_wjob_size(void);
/* Writer thread body. */
void *kvx_writer_main(void *arg);

#endif
