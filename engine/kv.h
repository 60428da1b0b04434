/* kv — paged KV memory: a pool of fixed blocks of B tokens, and per-sequence block tables.
 *
 * A block holds the keys and values of B consecutive positions of one sequence for every
 * layer, as IEEE half floats (F16: half the bytes of f32, and what a cache file stores). Its
 * in-memory layout IS the export layout, so export/import are one copy and a cache file is
 * one large read:
 *
 *   block = [layer 0..n_layer-1][K, V][token 0..B-1][kv_head 0..n_head_kv-1][head_dim] f16 LE
 *   bytes = n_layer * 2 * B * n_head_kv * head_dim * 2
 *
 * K is stored after RoPE. Slots past a sequence's length inside its last block are undefined.
 *
 * Blocks are refcounted so sequences can share prefix blocks (kvi_seq_fork, kvi_seq_attach).
 * A sequence never writes into a shared block: before appending into a partly filled last
 * block whose refcount is > 1 it copies it (copy on write), so shared full prefix blocks are
 * never touched again.
 *
 * Thread-safety: none; a kvi_kv and its sequences are used by one thread at a time (the
 * engine's caller). Block data may be read by the engine's worker threads during a forward
 * pass, which the caller runs.
 */
#ifndef KVFS_KVI_KV_H
#define KVFS_KVI_KV_H

#include <stddef.h>
#include <stdint.h>

struct kvi_kv_geom {
	int n_layer;
	int n_head_kv;
	int head_dim;
	int block_tokens; /* B, default 64 */
};

struct kvi_kv;
struct kvi_seq;

/* n_blocks >= 1; every field of g >= 1. Returns 0, -EINVAL, -ENOMEM. The block memory is
 * reserved (not touched) up front. */
int kvi_kv_create(const struct kvi_kv_geom *g, int n_blocks, struct kvi_kv **out);
/* Every sequence must have been destroyed first. NULL is a no-op. */
void kvi_kv_destroy(struct kvi_kv *kv);

const struct kvi_kv_geom *kvi_kv_geom(const struct kvi_kv *kv);
int kvi_kv_n_blocks(const struct kvi_kv *kv);
int kvi_kv_n_free(const struct kvi_kv *kv);
/* Bytes of one block (the export size). */
size_t kvi_kv_block_bytes(const struct kvi_kv *kv);

/* A free block with refcount 1 (contents undefined): its id >= 0, or -ENOSPC. */
int kvi_kv_block_alloc(struct kvi_kv *kv);
/* Refcount +1 / -1 (at 0 the block is free again). -EINVAL for a bad or free id. */
int kvi_kv_block_ref(struct kvi_kv *kv, int id);
int kvi_kv_block_unref(struct kvi_kv *kv, int id);
/* Refcount of id, 0 if free, -EINVAL if out of range. */
int kvi_kv_block_refcount(const struct kvi_kv *kv, int id);

/* Copies block id into dst (the layout above). Returns the byte count, -EINVAL for a bad or
 * free id, -ENOSPC if cap < kvi_kv_block_bytes, or the host-sync hook's error (device engine,
 * see below). */
long kvi_kv_block_export(const struct kvi_kv *kv, int id, void *dst, size_t cap);
/* Fills block id (allocated, refcount 1: not shared) from src. len must equal
 * kvi_kv_block_bytes, else -EINVAL. The bytes are not interpreted (any f16 value is valid). */
int kvi_kv_block_import(struct kvi_kv *kv, int id, const void *src, size_t len);

/* ---- a device copy of the KV memory (engine/fwd_dev.h) -------------------------------------
 *
 * A device engine keeps the authoritative K/V of the blocks it computes in device memory and
 * uses this pool's block memory as the host mirror that export, import and the KV connector
 * (kvx) read and write. Two small hooks keep the two copies coherent:
 *  - a block's generation changes whenever its host memory may have received new contents
 *    from outside the engine: at kvi_kv_block_alloc (the allocator's caller may fill it, as
 *    kvx's loads do) and at kvi_kv_block_import. A device engine uploads a block of a sequence
 *    whose generation it has not seen.
 *  - before host memory of blocks is read (kvi_kv_block_export, kvx_save), kvi_kv_host_sync
 *    calls the hook the device engine registered, which downloads the blocks whose device copy
 *    is newer. Without a hook (the CPU engine) it does nothing. */

/* The block's generation (see above); 0 for a bad id. */
uint32_t kvi_kv_block_gen(const struct kvi_kv *kv, int id);

/* fn(arg, ids, n) must make the host memory of blocks ids[0..n) current; returns 0 or a negative
 * errno. NULL removes the hook. One hook per kv (the device engine that owns it). */
typedef int (*kvi_kv_sync_fn)(void *arg, const int32_t *ids, int n);
void kvi_kv_set_host_sync(struct kvi_kv *kv, kvi_kv_sync_fn fn, void *arg);
/* Calls the hook for ids[0..n); 0 without a hook, else the hook's result. */
int kvi_kv_host_sync(const struct kvi_kv *kv, const int32_t *ids, int n);

/* Pointer to the K (kv_sel 0) or V (kv_sel 1) row of token slot tok (0..B-1) of layer l in
 * block id: n_head_kv * head_dim halves. For the forward pass; no checks. */
uint16_t *kvi_kv_row(const struct kvi_kv *kv, int id, int layer, int kv_sel, int tok);

/* ---- sequences ---------------------------------------------------------------------- */

/* An empty sequence on kv. 0 or -ENOMEM. */
int kvi_seq_create(struct kvi_kv *kv, struct kvi_seq **out);
/* Drops the sequence's references to its blocks. NULL is a no-op. */
void kvi_seq_destroy(struct kvi_seq *s);

/* Tokens held (positions 0..len-1 have K/V). */
int kvi_seq_len(const struct kvi_seq *s);
int kvi_seq_n_blocks(const struct kvi_seq *s);
/* The block table: block ids for positions [i*B, (i+1)*B). Valid until the next change. */
const int32_t *kvi_seq_blocks(const struct kvi_seq *s);

/* Attaches existing blocks (e.g. just imported from a cache) as this empty sequence's prefix:
 * takes a reference on each, and sets len = n_tokens, which must satisfy
 * (nblocks - 1) * B < n_tokens <= nblocks * B (nblocks == 0: n_tokens == 0).
 * Returns 0, -EINVAL (bad ids, lengths, or sequence not empty), -ENOMEM. */
int kvi_seq_attach(struct kvi_seq *s, const int32_t *blocks, int nblocks, int n_tokens);

/* A new sequence sharing every block of src (refcounts +1). 0, -ENOMEM. */
int kvi_seq_fork(const struct kvi_seq *src, struct kvi_seq **out);

/* Shortens s to n_tokens (0 <= n_tokens <= len), dropping blocks no longer needed. 0 or
 * -EINVAL. */
int kvi_seq_truncate(struct kvi_seq *s, int n_tokens);

/* Makes positions len .. len + n_new - 1 writable: allocates blocks, and copies a shared
 * partly filled last block first. Returns 0 or -ENOSPC / -ENOMEM (nothing changed then
 * except possibly the copy, which is harmless). Does not change len. */
int kvi_seq_reserve(struct kvi_seq *s, int n_new);
/* len += n (after the forward pass wrote those positions; n <= reserved). */
void kvi_seq_advance(struct kvi_seq *s, int n);

/* The kv a sequence lives on. */
struct kvi_kv *kvi_seq_kv(const struct kvi_seq *s);

#endif
