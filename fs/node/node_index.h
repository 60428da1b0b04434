/* node_index — the in-memory chunk index of a storage node: chunk id -> (length, mtime, state).
 *
 * An open-addressing hash map (linear probing, backward-shift deletion) that grows at 70 % load.
 * Not thread-safe: the store calls it under its own lock. Entry pointers stay valid only until
 * the next insert or remove.
 */
#ifndef KVFS_NODE_INDEX_H
#define KVFS_NODE_INDEX_H

#include <stddef.h>
#include <stdint.h>

enum node_chunk_state {
	NODE_CHUNK_WRITING = 1,	 /* a PUT is writing it: not served, not listed */
	NODE_CHUNK_LIVE = 2,	 /* on disk under its final name: served and listed */
	NODE_CHUNK_DELETING = 3, /* a DEL is unlinking it: not served, not listed */
};

struct node_chunk {
	uint64_t id;
	int64_t mtime_ns;
	uint32_t len;
	uint8_t state; /* enum node_chunk_state; 0 = empty slot */
};

struct node_index;

int node_index_create(struct node_index **out); /* 0 or -ENOMEM */
void node_index_destroy(struct node_index *x);	/* NULL is a no-op */

struct node_chunk *node_index_find(struct node_index *x, uint64_t id); /* NULL if absent */
/* Inserts id (must be absent) and returns its entry with state/len/mtime to fill in, or NULL
 * (-ENOMEM). */
struct node_chunk *node_index_insert(struct node_index *x, uint64_t id);
/* Removes id; 0 or -ENOENT. */
int node_index_remove(struct node_index *x, uint64_t id);
size_t node_index_count(const struct node_index *x);

/* Copies up to max LIVE entries with id > after, in ascending id order, into out (room for
 * max). Returns how many were copied; *more is 1 when further LIVE ids exist past the last one.
 * Costs O(entries) plus sorting one page; -ENOMEM if scratch space fails. */
long node_index_list(struct node_index *x, uint64_t after, uint32_t max, struct node_chunk *out,
		     int *more);

#endif
