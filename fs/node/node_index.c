/* Chunk index: open addressing keyed by a mixed chunk id (ids from the metadata server are
 * often sequential, so the raw id would cluster). */
#include "node_index.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct node_index {
	struct node_chunk *slot;
	size_t cap; /* power of two */
	size_t n;
};

static size_t mix(uint64_t id)
{
	id ^= id >> 33;
	id *= 0xff51afd7ed558ccdull;
	id ^= id >> 33;
	id *= 0xc4ceb9fe1a85ec53ull;
	id ^= id >> 33;
	return (size_t)id;
}

int node_index_create(struct node_index **out)
{
	struct node_index *x = calloc(1, sizeof(*x));
	if (!x)
		return -ENOMEM;
	x->cap = 1024;
	x->slot = calloc(x->cap, sizeof(*x->slot));
	if (!x->slot) {
		free(x);
		return -ENOMEM;
	}
	*out = x;
	return 0;
}

void node_index_destroy(struct node_index *x)
{
	if (!x)
		return;
	free(x->slot);
	free(x);
}

static struct node_chunk *probe(const struct node_index *x, uint64_t id)
{
	size_t m = x->cap - 1;
	for (size_t i = mix(id) & m;; i = (i + 1) & m) {
		struct node_chunk *e = &x->slot[i];
		if (!e->state || e->id == id)
			return e;
	}
}

struct node_chunk *node_index_find(struct node_index *x, uint64_t id)
{
	struct node_chunk *e = probe(x, id);
	return e->state ? e : NULL;
}

static int grow(struct node_index *x)
{
	struct node_index nx = {.cap = x->cap * 2, .n = x->n};
	nx.slot = calloc(nx.cap, sizeof(*nx.slot));
	if (!nx.slot)
		return -ENOMEM;
	for (size_t i = 0; i < x->cap; i++)
		if (x->slot[i].state)
			*probe(&nx, x->slot[i].id) = x->slot[i];
	free(x->slot);
	*x = nx;
	return 0;
}

struct node_chunk *node_index_insert(struct node_index *x, uint64_t id)
{
	if ((x->n + 1) * 10 > x->cap * 7 && grow(x))
		return NULL;
	struct node_chunk *e = probe(x, id);
	if (!e->state) {
		memset(e, 0, sizeof(*e));
		e->id = id;
		e->state = NODE_CHUNK_WRITING;
		x->n++;
	}
	return e;
}

int node_index_remove(struct node_index *x, uint64_t id)
{
	struct node_chunk *e = probe(x, id);
	if (!e->state)
		return -ENOENT;
	/* Backward-shift deletion: move later members of the probe run into the hole so that
	 * lookups never need tombstones. */
	size_t m = x->cap - 1, hole = (size_t)(e - x->slot);
	for (size_t i = (hole + 1) & m; x->slot[i].state; i = (i + 1) & m) {
		size_t home = mix(x->slot[i].id) & m;
		/* Entry i may fill the hole if its home is not cyclically inside (hole, i]. */
		int inside = hole <= i ? (home > hole && home <= i) : (home > hole || home <= i);
		if (!inside) {
			x->slot[hole] = x->slot[i];
			hole = i;
		}
	}
	memset(&x->slot[hole], 0, sizeof(x->slot[hole]));
	x->n--;
	return 0;
}

size_t node_index_count(const struct node_index *x)
{
	return x->n;
}

static int cmp_chunk(const void *a, const void *b)
{
	uint64_t x = ((const struct node_chunk *)a)->id, y = ((const struct node_chunk *)b)->id;
	return x < y ? -1 : x > y;
}

/* Moves the n smallest ids of v[0..k) into v[0..n) (any order): quickselect, O(k) expected,
 * so a LIST page costs a pass over the ids above `after` plus sorting one page. */
static void select_smallest(struct node_chunk *v, size_t k, size_t n)
{
	size_t lo = 0, hi = k; /* the boundary n lies in [lo, hi) */
	while (hi - lo > 1) {
		uint64_t pivot = v[lo + (hi - 1 - lo) / 2].id; /* never the last: j < hi - 1 */
		size_t i = lo, j = hi - 1;
		/* Hoare partition: v[lo..i) <= pivot, v(j..hi) >= pivot. */
		for (;;) {
			while (v[i].id < pivot)
				i++;
			while (v[j].id > pivot)
				j--;
			if (i >= j)
				break;
			struct node_chunk t = v[i];
			v[i] = v[j];
			v[j] = t;
			i++;
			j--;
		}
		if (n <= j)
			hi = j + 1;
		else
			lo = j + 1;
	}
}

long node_index_list(struct node_index *x, uint64_t after, uint32_t max, struct node_chunk *out,
		     int *more)
{
	size_t k = 0;
	for (size_t i = 0; i < x->cap; i++)
		if (x->slot[i].state == NODE_CHUNK_LIVE && x->slot[i].id > after)
			k++;
	*more = 0;
	if (k == 0)
		return 0;
	struct node_chunk *tmp = malloc(k * sizeof(*tmp));
	if (!tmp)
		return -ENOMEM;
	size_t j = 0;
	for (size_t i = 0; i < x->cap; i++)
		if (x->slot[i].state == NODE_CHUNK_LIVE && x->slot[i].id > after)
			tmp[j++] = x->slot[i];
	size_t n = k < max ? k : max;
	if (n < k)
		select_smallest(tmp, k, n);
	qsort(tmp, n, sizeof(*tmp), cmp_chunk);
	if (n)
		memcpy(out, tmp, n * sizeof(*out));
	*more = k > n;
	free(tmp);
	return (long)n;
}
