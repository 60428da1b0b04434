/* Paged KV memory: one reserved arena of equal blocks, a free stack, refcounts, and growable
 * per-sequence block tables. */
#include "kv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct kvi_kv {
	struct kvi_kv_geom g;
	int n_blocks;
	size_t block_bytes, row_halves;
	uint8_t *mem;
	int32_t *refs;
	int32_t *free_stack; /* ids of free blocks; top at n_free - 1 */
	int n_free;
	uint32_t *gen; /* per block: bumped at alloc and import (kv.h, device copy) */
	kvi_kv_sync_fn sync_fn;
	void *sync_arg;
};

struct kvi_seq {
	struct kvi_kv *kv;
	int32_t *blocks;
	int n_blocks, cap;
	int len;
};

int kvi_kv_create(const struct kvi_kv_geom *g, int n_blocks, struct kvi_kv **out)
{
	if (!g || n_blocks < 1 || g->n_layer < 1 || g->n_head_kv < 1 || g->head_dim < 1 ||
	    g->block_tokens < 1)
		return -EINVAL;
	struct kvi_kv *kv = calloc(1, sizeof(*kv));
	if (!kv)
		return -ENOMEM;
	kv->g = *g;
	kv->n_blocks = n_blocks;
	kv->row_halves = (size_t)g->n_head_kv * (size_t)g->head_dim;
	kv->block_bytes = (size_t)g->n_layer * 2 * (size_t)g->block_tokens * kv->row_halves * 2;
	size_t total = kv->block_bytes * (size_t)n_blocks;
	if (total / (size_t)n_blocks != kv->block_bytes)
		goto fail;
	/* untouched pages of a large allocation are not committed until used */
	kv->mem = aligned_alloc(64, (total + 63) & ~(size_t)63);
	kv->refs = calloc((size_t)n_blocks, sizeof(int32_t));
	kv->free_stack = malloc((size_t)n_blocks * sizeof(int32_t));
	kv->gen = calloc((size_t)n_blocks, sizeof(uint32_t));
	if (!kv->mem || !kv->refs || !kv->free_stack || !kv->gen)
		goto fail;
	/* lowest ids on top, so allocation order is 0, 1, 2, ... */
	for (int i = 0; i < n_blocks; i++)
		kv->free_stack[i] = n_blocks - 1 - i;
	kv->n_free = n_blocks;
	*out = kv;
	return 0;
fail:
	kvi_kv_destroy(kv);
	return -ENOMEM;
}

void kvi_kv_destroy(struct kvi_kv *kv)
{
	if (!kv)
		return;
	free(kv->mem);
	free(kv->refs);
	free(kv->free_stack);
	free(kv->gen);
	free(kv);
}

const struct kvi_kv_geom *kvi_kv_geom(const struct kvi_kv *kv)
{
	return &kv->g;
}

int kvi_kv_n_blocks(const struct kvi_kv *kv)
{
	return kv->n_blocks;
}

int kvi_kv_n_free(const struct kvi_kv *kv)
{
	return kv->n_free;
}

size_t kvi_kv_block_bytes(const struct kvi_kv *kv)
{
	return kv->block_bytes;
}

int kvi_kv_block_alloc(struct kvi_kv *kv)
{
	if (kv->n_free == 0)
		return -ENOSPC;
	int id = kv->free_stack[--kv->n_free];
	kv->refs[id] = 1;
	kv->gen[id]++;
	return id;
}

static int live(const struct kvi_kv *kv, int id)
{
	return id >= 0 && id < kv->n_blocks && kv->refs[id] > 0;
}

int kvi_kv_block_ref(struct kvi_kv *kv, int id)
{
	if (!live(kv, id))
		return -EINVAL;
	kv->refs[id]++;
	return 0;
}

int kvi_kv_block_unref(struct kvi_kv *kv, int id)
{
	if (!live(kv, id))
		return -EINVAL;
	if (--kv->refs[id] == 0)
		kv->free_stack[kv->n_free++] = id;
	return 0;
}

int kvi_kv_block_refcount(const struct kvi_kv *kv, int id)
{
	if (id < 0 || id >= kv->n_blocks)
		return -EINVAL;
	return kv->refs[id];
}

long kvi_kv_block_export(const struct kvi_kv *kv, int id, void *dst, size_t cap)
{
	if (!live(kv, id) || !dst)
		return -EINVAL;
	if (cap < kv->block_bytes)
		return -ENOSPC;
	int32_t one = id;
	int rc = kvi_kv_host_sync(kv, &one, 1);
	if (rc)
		return rc;
	memcpy(dst, kv->mem + (size_t)id * kv->block_bytes, kv->block_bytes);
	return (long)kv->block_bytes;
}

int kvi_kv_block_import(struct kvi_kv *kv, int id, const void *src, size_t len)
{
	if (!live(kv, id) || kv->refs[id] != 1 || !src || len != kv->block_bytes)
		return -EINVAL;
	memcpy(kv->mem + (size_t)id * kv->block_bytes, src, len);
	kv->gen[id]++;
	return 0;
}

uint32_t kvi_kv_block_gen(const struct kvi_kv *kv, int id)
{
	return id >= 0 && id < kv->n_blocks ? kv->gen[id] : 0;
}

void kvi_kv_set_host_sync(struct kvi_kv *kv, kvi_kv_sync_fn fn, void *arg)
{
	kv->sync_fn = fn;
	kv->sync_arg = arg;
}

int kvi_kv_host_sync(const struct kvi_kv *kv, const int32_t *ids, int n)
{
	return kv->sync_fn && n > 0 ? kv->sync_fn(kv->sync_arg, ids, n) : 0;
}

uint16_t *kvi_kv_row(const struct kvi_kv *kv, int id, int layer, int kv_sel, int tok)
{
	size_t off =
	    (((size_t)layer * 2 + (size_t)kv_sel) * (size_t)kv->g.block_tokens + (size_t)tok) *
	    kv->row_halves;
	return (uint16_t *)(kv->mem + (size_t)id * kv->block_bytes) + off;
}

int kvi_seq_create(struct kvi_kv *kv, struct kvi_seq **out)
{
	struct kvi_seq *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->kv = kv;
	*out = s;
	return 0;
}

void kvi_seq_destroy(struct kvi_seq *s)
{
	if (!s)
		return;
	for (int i = 0; i < s->n_blocks; i++)
		kvi_kv_block_unref(s->kv, s->blocks[i]);
	free(s->blocks);
	free(s);
}

int kvi_seq_len(const struct kvi_seq *s)
{
	return s->len;
}

int kvi_seq_n_blocks(const struct kvi_seq *s)
{
	return s->n_blocks;
}

const int32_t *kvi_seq_blocks(const struct kvi_seq *s)
{
	return s->blocks;
}

struct kvi_kv *kvi_seq_kv(const struct kvi_seq *s)
{
	return s->kv;
}

static int grow(struct kvi_seq *s, int need)
{
	if (need <= s->cap)
		return 0;
	int cap = s->cap ? s->cap : 8;
	while (cap < need)
		cap *= 2;
	int32_t *b = realloc(s->blocks, (size_t)cap * sizeof(int32_t));
	if (!b)
		return -ENOMEM;
	s->blocks = b;
	s->cap = cap;
	return 0;
}

int kvi_seq_attach(struct kvi_seq *s, const int32_t *blocks, int nblocks, int n_tokens)
{
	int B = s->kv->g.block_tokens;
	if (s->n_blocks || s->len || nblocks < 0 || (nblocks > 0 && !blocks))
		return -EINVAL;
	if (nblocks == 0 ? n_tokens != 0
			 : (n_tokens <= (long)(nblocks - 1) * B || n_tokens > (long)nblocks * B))
		return -EINVAL;
	for (int i = 0; i < nblocks; i++)
		if (!live(s->kv, blocks[i]))
			return -EINVAL;
	int rc = grow(s, nblocks);
	if (rc)
		return rc;
	for (int i = 0; i < nblocks; i++) {
		s->kv->refs[blocks[i]]++;
		s->blocks[i] = blocks[i];
	}
	s->n_blocks = nblocks;
	s->len = n_tokens;
	return 0;
}

int kvi_seq_fork(const struct kvi_seq *src, struct kvi_seq **out)
{
	struct kvi_seq *s;
	int rc = kvi_seq_create(src->kv, &s);
	if (rc)
		return rc;
	rc = kvi_seq_attach(s, src->blocks, src->n_blocks, src->len);
	if (rc) {
		kvi_seq_destroy(s);
		return rc;
	}
	*out = s;
	return 0;
}

int kvi_seq_truncate(struct kvi_seq *s, int n_tokens)
{
	if (n_tokens < 0 || n_tokens > s->len)
		return -EINVAL;
	int B = s->kv->g.block_tokens;
	int keep = (n_tokens + B - 1) / B;
	while (s->n_blocks > keep)
		kvi_kv_block_unref(s->kv, s->blocks[--s->n_blocks]);
	s->len = n_tokens;
	return 0;
}

int kvi_seq_reserve(struct kvi_seq *s, int n_new)
{
	struct kvi_kv *kv = s->kv;
	int B = kv->g.block_tokens;
	if (n_new <= 0)
		return n_new < 0 ? -EINVAL : 0;
	/* copy on write: the block holding position len is partly filled and shared */
	if (s->len % B && kv->refs[s->blocks[s->len / B]] > 1) {
		int nb = kvi_kv_block_alloc(kv);
		if (nb < 0)
			return nb;
		int old = s->blocks[s->len / B];
		memcpy(kv->mem + (size_t)nb * kv->block_bytes,
		       kv->mem + (size_t)old * kv->block_bytes, kv->block_bytes);
		kvi_kv_block_unref(kv, old);
		s->blocks[s->len / B] = nb;
	}
	long need = ((long)s->len + n_new + B - 1) / B;
	if (need > (long)s->n_blocks + kv->n_free)
		return -ENOSPC;
	int rc = grow(s, (int)need);
	if (rc)
		return rc;
	while (s->n_blocks < need)
		s->blocks[s->n_blocks++] = kvi_kv_block_alloc(kv);
	return 0;
}

void kvi_seq_advance(struct kvi_seq *s, int n)
{
	s->len += n;
}
