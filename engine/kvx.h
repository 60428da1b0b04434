/* kvx — the KV connector: prompt-prefix KV blocks as files under a cache directory.
 *
 * Before prefill, kvx_load_prefix finds the longest cached prefix of a prompt and reads it with
 * io_uring straight into the engine's paged KV memory (a block's memory layout is its file
 * payload, engine/kv.h); the caller then prefills only the tail. After prefill, kvx_save queues
 * the sequence's new full blocks; a background thread with its own io_uring writes them as
 * block files (engine/kvb.h, docs/kv-block-format.md):
 *     <dir>/<cache fingerprint hex>/<2 hex>/<block hash hex>.kvb
 * The directory is any directory: a kvfs mount in production, a local one for tests.
 *
 * Lookup: the chained hashes of the prompt's full blocks, but never the whole prompt (the block
 * holding the last token is always computed, so prefill yields logits). Presence is probed by
 * binary search (blocks are chained, so presence is monotone unless eviction made a hole): about
 * log2(blocks) + 1 faccessat calls. All hit blocks are then opened and read with many io_uring
 * operations in flight, one readv per block (4096-byte header + the block's KV memory), and
 * checked: header (magic, version, CRC, fingerprint, hash, parent, geometry, token ids), file
 * size and payload CRC. The first block that fails ends the hit: it and every later block are
 * dropped, the reason is logged and counted. A bad file is never loaded, only recomputed.
 *
 * Save: blocks are not copied. kvx_save takes a reference on each new full block of the
 * sequence (full prefix blocks are never written again, kv.h) and queues it; the writer thread
 * reads the block memory while writing and the reference is dropped on the caller's thread at
 * its next kvx call. A block file is published atomically: on a kvfs (FUSE) mount a file is
 * visible only after close, and it is created with O_EXCL so the second of two racing writers
 * skips it; on a local directory it is written under a temporary name and renamed into place
 * (RENAME_NOREPLACE). A block whose file exists is skipped. When every save slot is busy the
 * rest of a save is dropped and counted: saving never blocks the caller.
 *
 * Isolation: the cache salt (tenant) enters every block hash, so a tenant cannot name another
 * tenant's files; a probe for them takes exactly the "absent" path (docs/kv-block-format.md).
 *
 * Thread-safety: one caller thread per kvx (the engine's caller; kvx touches the engine's kv).
 * kvx runs one writer thread of its own. Several kvx (engines, processes) may share a directory.
 * Order of destruction: kvx_destroy before kvi_engine_destroy (it drops block references).
 */
#ifndef KVFS_KVX_H
#define KVFS_KVX_H

#include <stdint.h>

#include "fwd.h"
#include "kv.h"
#include "kvb.h"
#include "model.h"

struct kvx_opts {
	const char *dir;  /* cache directory (must exist); copied */
	int queue_depth;  /* io_uring entries and reads in flight; default 64, 1..4096 */
	int save_slots;	  /* blocks queued or being written at once; default 256, 1..65536 */
	int load_enable;  /* default 1 */
	int save_enable;  /* default 1 */
	int known_ttl_ms; /* how long a block seen present is trusted without a probe; 60000 */
};

void kvx_opts_default(struct kvx_opts *o);

/* Counters since kvx_create. Misses: why the block that ended a hit was not loaded. */
struct kvx_stats {
	uint64_t lookups;	   /* kvx_load_prefix calls */
	uint64_t probes;	   /* filesystem presence probes by lookups */
	uint64_t hit_blocks;	   /* blocks loaded into KV memory */
	uint64_t cached_tokens;	   /* tokens those blocks hold */
	uint64_t loaded_bytes;	   /* file bytes read for loaded blocks */
	uint64_t load_ns;	   /* wall time inside kvx_load_prefix */
	uint64_t miss_absent;	   /* no file (includes other tenants' and evicted blocks) */
	uint64_t miss_corrupt;	   /* bad magic / CRC / payload CRC / version */
	uint64_t miss_wrong_model; /* fingerprint or geometry of another model */
	uint64_t miss_mismatch;	   /* hash, parent or token ids differ */
	uint64_t miss_truncated;   /* file shorter or longer than header + payload */
	uint64_t miss_io;	   /* open/read errors other than absence, or no KV memory */
	uint64_t saved_blocks;	   /* files published */
	uint64_t skipped_existing; /* already present (probe, O_EXCL or rename race) */
	uint64_t save_errors;
	uint64_t dropped_saves; /* not queued: every save slot busy */
};

struct kvx;

/* e and m: the engine and its model; both must outlive the kvx. The cache fingerprint is
 * kvb_fingerprint(m->fingerprint, the engine's KV geometry, F16). Checks that o->dir is a
 * directory. Returns 0, -EINVAL, -ENOTDIR/-ENOENT (dir), -ENOMEM, or the io_uring / pthread
 * error. */
int kvx_create(struct kvi_engine *e, const struct kvi_model *m, const struct kvx_opts *o,
	       struct kvx **out);
/* The same over any engine's KV pool: kvx_create(e, ...) is kvx_create_kv(kvi_engine_kv(e),
 * ...). A device engine (engine/fwd_dev.h) passes kvi_dev_engine_kv(e): kvx then reads and
 * writes the pool's host mirror, which the device engine keeps coherent through the hooks of
 * kv.h (loaded blocks are uploaded before attention reads them; kvx_save makes the host copy of
 * the blocks it queues current first). */
int kvx_create_kv(struct kvi_kv *kv, const struct kvi_model *m, const struct kvx_opts *o,
		  struct kvx **out);
/* Waits for queued saves, drops block references, stops the writer. NULL is a no-op. */
void kvx_destroy(struct kvx *x);
/* 1 when dir is on a kvfs mount: a FUSE file system whose root (dir's last ancestor on the same
 * device) has kvfs-mount's status directory, .kvfs/cluster. kvx then publishes each block by
 * closing it (the mount makes it visible whole or not at all); anywhere else, another FUSE file
 * system (sshfs, ...) included, it writes a temporary name and renames it. */
int kvx_dir_on_kvfs(const char *dir);

/* Loads the longest cached prefix of tokens[0..n) into seq, which must be empty and on the
 * engine's kv, and sets *cached to its length in tokens (a multiple of B, < n; 0 when nothing
 * was found or loading is disabled). salt may be NULL or "" (no tenant). A miss is not an error.
 * Returns 0, or -EINVAL (bad arguments, seq not empty), -ENOMEM. */
int kvx_load_prefix(struct kvx *x, struct kvi_seq *seq, const int32_t *tokens, int n,
		    const char *salt, int *cached);

/* Queues the full blocks of seq holding tokens[0..n) (n <= kvi_seq_len(seq)) that are not
 * known to be cached, for writing in the background. Returns the number of blocks queued
 * (>= 0), -EINVAL, -ENOMEM, or the error of making the host copy current (a device engine's
 * download, kv.h; counted as save errors). Never waits for file I/O. */
int kvx_save(struct kvx *x, struct kvi_seq *seq, const int32_t *tokens, int n, const char *salt);

/* kvx_load_prefix and kvx_save for a prompt with images: tokens[img[k].pos ..][img[k].n] are
 * an image's placeholders, and the block names carry its pixels' hash (kvb_chain_images), so
 * the KV after an image is found only for the same image. nimg 0: as the calls above;
 * -EINVAL for spans kvb_chain_images refuses. */
int kvx_load_prefix_images(struct kvx *x, struct kvi_seq *seq, const int32_t *tokens, int n,
			   const char *salt, const struct kvb_image *img, int nimg, int *cached);
int kvx_save_images(struct kvx *x, struct kvi_seq *seq, const int32_t *tokens, int n,
		    const char *salt, const struct kvb_image *img, int nimg);

/* Waits until every queued save is finished and their block references are dropped. */
void kvx_flush(struct kvx *x);

/* A consistent copy of the counters. Thread-safe. */
void kvx_stats_get(struct kvx *x, struct kvx_stats *out);

/* "<dir>/<fingerprint hex>": where this kvx's blocks live (for tools and tests). */
const char *kvx_model_dir(const struct kvx *x);
/* The kv dir itself, and whether it is a kvfs mount (kvx_dir_on_kvfs): for the files kept
 * beside the blocks (image embeddings, engine/kve.h). */
const char *kvx_dir(const struct kvx *x);
int kvx_is_kvfs(const struct kvx *x);

#endif
