/* lbp — placement decisions of the prefill and decode balancers (see lbp.h). */
#include "lbp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[LB_NPOLICY] = {"rr", "least", "cache", "prefix", "chash"};

int lb_policy_parse(const char *s)
{
	for (int i = 0; i < LB_NPOLICY; i++)
		if (!strcmp(s, names[i]))
			return i;
	return -EINVAL;
}

const char *lb_policy_name(int p)
{
	return p >= 0 && p < LB_NPOLICY ? names[p] : "?";
}

uint64_t lbp_hash(const char *s, size_t n, uint64_t seed)
{
	uint64_t h = seed;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)s[i]) * 0x100000001b3ULL;
	return h;
}

uint64_t lbp_id(const char *addr)
{
	return lbp_hash(addr, strlen(addr), LBP_SEED);
}

int lbp_text_blocks(const char *text, size_t len, uint64_t *out, int max)
{
	uint64_t h = LBP_SEED;
	int n = 0;
	for (size_t off = 0; n < max && off + LBP_BLOCK_BYTES <= len; off += LBP_BLOCK_BYTES)
		out[n++] = h = lbp_hash(text + off, LBP_BLOCK_BYTES, h);
	return n;
}

uint64_t lbp_mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

int lbp_index_init(struct lbp_index *ix, int bits)
{
	memset(ix, 0, sizeof(*ix));
	if (bits < 10 || bits > 28)
		return -EINVAL;
	size_t n = (size_t)1 << bits;
	ix->hash = calloc(n, sizeof(*ix->hash));
	ix->owner = malloc(n * sizeof(*ix->owner));
	if (!ix->hash || !ix->owner) {
		lbp_index_free(ix);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		ix->owner[i] = -1;
	ix->mask = n - 1;
	return 0;
}

void lbp_index_free(struct lbp_index *ix)
{
	free(ix->hash);
	free(ix->owner);
	memset(ix, 0, sizeof(*ix));
}

void lbp_index_note(struct lbp_index *ix, const struct lbp_req *q, int i)
{
	if (!ix->hash)
		return;
	for (int j = 0; j < q->nblocks; j++) {
		uint64_t s = lbp_mix64(q->block[j]) & ix->mask;
		ix->hash[s] = q->block[j];
		ix->owner[s] = i;
	}
}

static int owner_of(const struct lbp_index *ix, uint64_t h)
{
	uint64_t s = lbp_mix64(h) & ix->mask;
	return ix->hash[s] == h ? ix->owner[s] : -1;
}

int lbp_index_match(const struct lbp_index *ix, const struct lbp_req *q, int *who)
{
	*who = -1;
	if (!ix || !ix->hash || q->nblocks <= 0)
		return 0;
	int o = owner_of(ix, q->block[0]);
	if (o < 0)
		return 0;
	int j = 1;
	while (j < q->nblocks && owner_of(ix, q->block[j]) == o)
		j++;
	*who = o;
	return j;
}

void lbp_index_drop(struct lbp_index *ix, int i)
{
	if (!ix->hash)
		return;
	for (uint64_t s = 0; s <= ix->mask; s++)
		if (ix->owner[s] == i)
			ix->owner[s] = -1;
}

static int usable(const struct lbp_set *s, int i, const unsigned char *skip)
{
	return s->r[i].up && !(skip && skip[i]);
}

static int pick_rr(struct lbp_set *s, const unsigned char *skip)
{
	for (int k = 0; k < s->n; k++) {
		int i = (int)(s->rr++ % (unsigned)s->n);
		if (usable(s, i, skip))
			return i;
	}
	return -1;
}

static long pf_load(const struct lbp_load *r)
{
	return (long)r->queued_tokens + r->inflight_tokens;
}

/* Lowest cost(i) = compute(i) + load(i) among usable replicas; ties to the first in the order
 * starting at `first` (the replica holding the prompt, which then wins ties), or, with no
 * holder (first < 0), at the round-robin cursor: idle replicas tie at 0, and always starting
 * at replica 0 piled the light load on the lowest indexes (lb-sim, 64 + 64 replicas: least's
 * prefill balance 0.854 -> 0.909). */
static int pick_cost(struct lbp_set *s, const unsigned char *skip, int first, int holder,
		     long holder_cost, long miss_cost)
{
	if (first < 0)
		first = (int)(s->rr++ % (unsigned)s->n);
	int best = -1;
	long bcost = 0;
	for (int k = 0; k < s->n; k++) {
		int i = (first + k) % s->n;
		if (!usable(s, i, skip))
			continue;
		long cost = (i == holder ? holder_cost : miss_cost) + pf_load(&s->r[i]);
		if (best < 0 || cost < bcost) {
			best = i;
			bcost = cost;
		}
	}
	return best;
}

/* Highest rendezvous score for key among usable replicas whose load is at most cap; -1 when
 * none is. */
static int owner_under(const struct lbp_set *s, const unsigned char *skip, uint64_t key, long cap)
{
	int own = -1;
	uint64_t top = 0;
	for (int i = 0; i < s->n; i++) {
		if (!usable(s, i, skip) || pf_load(&s->r[i]) > cap)
			continue;
		uint64_t h = lbp_mix64(s->r[i].id ^ key);
		if (own < 0 || h > top) {
			own = i;
			top = h;
		}
	}
	return own;
}

static int pick_chash(struct lbp_set *s, const struct lbp_req *q, const unsigned char *skip)
{
	uint64_t key =
	    q->nblocks > 0
		? q->block[(q->nblocks < LBP_CHASH_BLOCKS ? q->nblocks : LBP_CHASH_BLOCKS) - 1]
		: q->key;
	long sum = 0;
	int n = 0;
	for (int i = 0; i < s->n; i++)
		if (usable(s, i, skip)) {
			sum += pf_load(&s->r[i]);
			n++;
		}
	if (!n)
		return -1;
	long cap = (long)((1.0 + LBP_CHASH_EPS) * (double)sum / n) + q->est_tokens;
	int own = owner_under(s, skip, key, cap);
	return own >= 0 ? own : pick_cost(s, skip, -1, -1, 0, 0);
}

int lbp_pick_encode(struct lbp_set *s, uint64_t img_key, int cost, const unsigned char *skip)
{
	if (s->n <= 0)
		return -1;
	const struct lbp_req q = {.key = img_key, .est_tokens = cost};
	return pick_chash(s, &q, skip);
}

int lbp_pick_prefill(enum lb_policy p, struct lbp_set *s, const struct lbp_req *q,
		     const struct lbp_index *ix, const unsigned char *skip)
{
	if (s->n <= 0)
		return -1;
	long whole = (long)LB_CACHE_W * q->est_tokens;
	switch (p) {
	case LB_RR:
		return pick_rr(s, skip);
	case LB_CACHE: {
		/* the rendezvous owner of the whole prompt: repeats went there, so its KV is
		 * there; every other replica computes all of it */
		int own = -1;
		uint64_t top = 0;
		for (int i = 0; i < s->n; i++) {
			if (!usable(s, i, skip))
				continue;
			uint64_t h = lbp_mix64(s->r[i].id ^ q->key);
			if (own < 0 || h > top) {
				own = i;
				top = h;
			}
		}
		return own < 0 ? -1 : pick_cost(s, skip, own, own, 0, whole);
	}
	case LB_PREFIX: {
		int who;
		int m = lbp_index_match(ix, q, &who);
		long held = (long)m * LB_BLOCK_TOKENS;
		if (held > q->est_tokens)
			held = q->est_tokens;
		if (who < 0 || !usable(s, who, skip))
			return pick_cost(s, skip, -1, -1, 0, 0);
		return pick_cost(s, skip, who, who, whole - (long)LB_CACHE_W * held, whole);
	}
	case LB_CHASH:
		return pick_chash(s, q, skip);
	case LB_LEAST:
	default:
		return pick_cost(s, skip, -1, -1, 0, 0);
	}
}

int lbp_pick_decode(enum lb_policy p, struct lbp_set *s, const struct lbp_req *q,
		    const unsigned char *skip)
{
	if (s->n <= 0)
		return -1;
	if (p == LB_RR)
		return pick_rr(s, skip);
	/* ties rotate, as for prefill (pick_cost): on an idle cluster the first replica took
	 * every request (a demo: the second decode replica got 0 of 7) */
	int best = -1, fits_best = 0, start = (int)(s->rr++ % (unsigned)s->n);
	for (int k = 0; k < s->n; k++) {
		int i = (start + k) % s->n;
		if (!usable(s, i, skip))
			continue;
		const struct lbp_load *r = &s->r[i];
		/* prefix: a replica whose free KV cannot hold the request would queue it */
		int fits = (p != LB_PREFIX && p != LB_CHASH) || !q || r->kv_free >= q->kv_blocks;
		if (best < 0) {
			best = i;
			fits_best = fits;
			continue;
		}
		const struct lbp_load *b = &s->r[best];
		int better;
		if (fits != fits_best)
			better = fits;
		else if (!fits)
			better = r->kv_free > b->kv_free;
		else
			better = r->inflight < b->inflight ||
				 (r->inflight == b->inflight && r->kv_free > b->kv_free);
		if (better) {
			best = i;
			fits_best = fits;
		}
	}
	return best;
}
