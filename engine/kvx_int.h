/* kvx internals shared by kvx.c (lookup, load) and kvx_save.c (background writer). */
#ifndef KVFS_KVX_INT_H
#define KVFS_KVX_INT_H

#include <liburing.h>
#include <limits.h>
#include <pthread.h>

#include "kvb.h"
#include "kvx.h"

#define KVX_FUSE_SUPER_MAGIC 0x65735546 /* statfs f_type of any FUSE file system */
#define KVX_PATH_REL	     160	/* "<64 hex>/<2>/<64 hex>.kvb" and temp suffixes */

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

uint64_t kvx_now_ns(void);
void kvx_known_add(struct kvx *x, const uint8_t h[KVB_HASH]);
int kvx_known_has(struct kvx *x, const uint8_t h[KVB_HASH]);
/* Drops the references of finished saves (caller thread). */
void kvx_drain_done(struct kvx *x);
/* Size of the writer's per-block job record. */
size_t kvx_wjob_size(void);
/* Writer thread body. */
void *kvx_writer_main(void *arg);

#endif
