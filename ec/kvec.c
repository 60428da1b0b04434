/* kvec codec: encode and reconstruct on ISA-L, with a per-codec cache of decode tables. */
#include "kvec.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <isa-l/erasure_code.h>

/* ISA-L takes an int length; longer buffers go through in pieces of this many bytes (a multiple
 * of 64 so every piece but the last keeps the caller's alignment). */
#define KVEC_PIECE ((size_t)1 << 30)

/* ISA-L expands each GF coefficient into a 32-byte lookup table. */
#define KVEC_TBL_BYTES(k, rows) ((size_t)32 * (size_t)(k) * (size_t)(rows))
#define KVEC_TBL_MAX		KVEC_TBL_BYTES(KVEC_MAX_K, KVEC_MAX_M)

struct kvec_entry {
	uint64_t src;	/* the k chunks decoded from */
	uint64_t want;	/* the chunks rebuilt, in index order = table row order */
	uint64_t stamp; /* last use (codec clock); 0 = empty slot */
	uint8_t *tbls;	/* KVEC_TBL_BYTES(k, popcount(want)) bytes inside codec->slab */
};

struct kvec_codec {
	int k, m;
	uint8_t matrix[KVEC_MAX_N * KVEC_MAX_K]; /* (k+m) x k generator, row-major */
	uint8_t *enc_tbls;			 /* KVEC_TBL_BYTES(k, m); immutable after create */
	uint8_t *slab; /* KVEC_CACHE_SLOTS tables of KVEC_TBL_BYTES(k, m) */

	pthread_mutex_t lock;
	/* protected by lock: */
	uint64_t clock;
	uint64_t hits, misses;
	struct kvec_entry cache[KVEC_CACHE_SLOTS];
};

int kvec_codec_create(int k, int m, struct kvec_codec **out)
{
	if (!out)
		return -EINVAL;
	*out = NULL;
	if (k < 1 || k > KVEC_MAX_K || m < 0 || m > KVEC_MAX_M)
		return -EINVAL;
	struct kvec_codec *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->k = k;
	c->m = m;
	gf_gen_cauchy1_matrix(c->matrix, k + m, k);
	if (m > 0) {
		c->enc_tbls = malloc(KVEC_TBL_BYTES(k, m));
		c->slab = malloc(KVEC_CACHE_SLOTS * KVEC_TBL_BYTES(k, m));
		if (!c->enc_tbls || !c->slab) {
			free(c->enc_tbls);
			free(c->slab);
			free(c);
			return -ENOMEM;
		}
		ec_init_tables(k, m, &c->matrix[k * k], c->enc_tbls);
		for (int i = 0; i < KVEC_CACHE_SLOTS; i++)
			c->cache[i].tbls = c->slab + i * KVEC_TBL_BYTES(k, m);
	}
	int rc = pthread_mutex_init(&c->lock, NULL);
	if (rc) {
		free(c->enc_tbls);
		free(c->slab);
		free(c);
		return -rc;
	}
	*out = c;
	return 0;
}

void kvec_codec_destroy(struct kvec_codec *c)
{
	if (!c)
		return;
	pthread_mutex_destroy(&c->lock);
	free(c->enc_tbls);
	free(c->slab);
	free(c);
}

int kvec_codec_k(const struct kvec_codec *c)
{
	return c->k;
}

int kvec_codec_m(const struct kvec_codec *c)
{
	return c->m;
}

void kvec_codec_cache_stats(struct kvec_codec *c, uint64_t *hits, uint64_t *misses)
{
	pthread_mutex_lock(&c->lock);
	if (hits)
		*hits = c->hits;
	if (misses)
		*misses = c->misses;
	pthread_mutex_unlock(&c->lock);
}

/* Runs the ISA-L dot products over len bytes, in int-sized pieces. ISA-L only reads src. */
static void run_tables(int k, int rows, uint8_t *tbls, uint8_t *const *src, uint8_t *const *dst,
		       size_t len)
{
	if (len <= KVEC_PIECE) {
		ec_encode_data((int)len, k, rows, tbls, (unsigned char **)src,
			       (unsigned char **)dst);
		return;
	}
	uint8_t *s[KVEC_MAX_K], *d[KVEC_MAX_N];
	for (size_t off = 0; off < len; off += KVEC_PIECE) {
		size_t n = len - off < KVEC_PIECE ? len - off : KVEC_PIECE;
		for (int i = 0; i < k; i++)
			s[i] = src[i] + off;
		for (int i = 0; i < rows; i++)
			d[i] = dst[i] + off;
		ec_encode_data((int)n, k, rows, tbls, s, d);
	}
}

int kvec_encode(const struct kvec_codec *c, const uint8_t *const *data, uint8_t *const *parity,
		size_t len)
{
	if (!c || !data || !parity)
		return -EINVAL;
	if (len == 0 || c->m == 0)
		return 0;
	/* The tables are never written after create; ISA-L's prototype just lacks const. */
	run_tables(c->k, c->m, c->enc_tbls, (uint8_t *const *)data, parity, len);
	return 0;
}

/* Builds the decode tables that turn chunks `src` (k of them) into chunks `want`. */
static int build_tables(const struct kvec_codec *c, uint64_t src, uint64_t want, uint8_t *tbls)
{
	const int k = c->k;
	uint8_t b[KVEC_MAX_K * KVEC_MAX_K], inv[KVEC_MAX_K * KVEC_MAX_K];
	uint8_t coef[KVEC_MAX_M * KVEC_MAX_K];
	int r = 0;
	for (int i = 0; i < k + c->m; i++)
		if (src >> i & 1)
			memcpy(&b[k * r++], &c->matrix[k * i], k);
	/* Any k rows of identity + Cauchy are independent, so this cannot fail; kept as a guard. */
	if (gf_invert_matrix(b, inv, k))
		return -EIO;
	/* src = B * data, so data = inv * src, and chunk w = row w of the generator * data. */
	int rows = 0;
	for (int w = 0; w < k + c->m; w++) {
		if (!(want >> w & 1))
			continue;
		uint8_t *out = &coef[k * rows++];
		if (w < k) {
			memcpy(out, &inv[k * w], k);
			continue;
		}
		for (int j = 0; j < k; j++) {
			uint8_t acc = 0;
			for (int i = 0; i < k; i++)
				acc ^= gf_mul(c->matrix[k * w + i], inv[k * i + j]);
			out[j] = acc;
		}
	}
	ec_init_tables(k, rows, coef, tbls);
	return 0;
}

/* Copies the tables for (src, want) into tbls, from the cache or freshly built. */
static int get_tables(struct kvec_codec *c, uint64_t src, uint64_t want, uint8_t *tbls)
{
	size_t bytes = KVEC_TBL_BYTES(c->k, __builtin_popcountll(want));
	pthread_mutex_lock(&c->lock);
	for (int i = 0; i < KVEC_CACHE_SLOTS; i++) {
		struct kvec_entry *e = &c->cache[i];
		if (e->stamp && e->src == src && e->want == want) {
			memcpy(tbls, e->tbls, bytes);
			e->stamp = ++c->clock;
			c->hits++;
			pthread_mutex_unlock(&c->lock);
			return 0;
		}
	}
	c->misses++;
	pthread_mutex_unlock(&c->lock);

	/* Built outside the lock: O(k^3) must not stall other threads' hits. */
	int rc = build_tables(c, src, want, tbls);
	if (rc)
		return rc;

	pthread_mutex_lock(&c->lock);
	struct kvec_entry *victim = &c->cache[0];
	for (int i = 0; i < KVEC_CACHE_SLOTS; i++) {
		struct kvec_entry *e = &c->cache[i];
		if (e->stamp && e->src == src && e->want == want) {
			victim = NULL; /* another thread inserted it meanwhile */
			break;
		}
		if (e->stamp < victim->stamp)
			victim = e;
	}
	if (victim) {
		victim->src = src;
		victim->want = want;
		victim->stamp = ++c->clock;
		memcpy(victim->tbls, tbls, bytes);
	}
	pthread_mutex_unlock(&c->lock);
	return 0;
}

int kvec_reconstruct(struct kvec_codec *c, uint8_t *const *chunks, uint64_t present_mask,
		     uint64_t want_mask, size_t len)
{
	if (!c || !chunks)
		return -EINVAL;
	const int k = c->k, n = c->k + c->m;
	const uint64_t all = (n == 64) ? ~0ull : (1ull << n) - 1;
	if ((present_mask | want_mask) & ~all)
		return -EINVAL;
	const uint64_t missing = want_mask & ~present_mask;
	for (int i = 0; i < n; i++)
		if (((present_mask | missing) >> i & 1) && !chunks[i])
			return -EINVAL;
	if (!missing)
		return 0;
	if (__builtin_popcountll(present_mask) < k)
		return -EIO;

	/* Decode from the lowest k present chunks: data before parity, so the common cases
	 * (a lost data chunk, or parity rebuilt from intact data) use the cheapest rows. */
	uint64_t src = 0;
	uint8_t *srcp[KVEC_MAX_K], *dstp[KVEC_MAX_M];
	int ns = 0, nd = 0;
	for (int i = 0; i < n; i++) {
		if ((present_mask >> i & 1) && ns < k) {
			src |= 1ull << i;
			srcp[ns++] = chunks[i];
		} else if (missing >> i & 1) {
			dstp[nd++] = chunks[i];
		}
	}
	if (len == 0)
		return 0;

	uint8_t tbls[KVEC_TBL_MAX];
	int rc = get_tables(c, src, missing, tbls);
	if (rc)
		return rc;
	run_tables(k, nd, tbls, srcp, dstp, len);
	return 0;
}
