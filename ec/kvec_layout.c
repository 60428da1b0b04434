/* kvec stripe layout and CRC32C helpers: pure functions, no state. */
#include "kvec.h"

#include <errno.h>
#include <limits.h>
#include <string.h>

#include <isa-l/crc.h>

uint32_t kvec_crc32c(uint32_t seed, const void *buf, size_t len)
{
	/* crc32_iscsi neither inverts on entry nor on exit; we do both, zlib-style, so that
	 * the result is the standard CRC-32C and chains through `seed`. */
	uint32_t crc = ~seed;
	const unsigned char *p = buf;
	while (len > 0) {
		size_t n = len > (size_t)INT_MAX ? ((size_t)1 << 30) : len;
		crc = crc32_iscsi((unsigned char *)p, (int)n, crc);
		p += n;
		len -= n;
	}
	return ~crc;
}

static int check_crc_args(int n, const uint8_t *const *chunks, const uint32_t *crcs, uint64_t mask)
{
	if (!chunks || !crcs || n < 1 || n > 64)
		return -EINVAL;
	if (n < 64 && (mask >> n))
		return -EINVAL;
	for (int i = 0; i < n; i++)
		if ((mask >> i & 1) && !chunks[i])
			return -EINVAL;
	return 0;
}

int kvec_crc_compute(int n, const uint8_t *const *chunks, uint64_t mask, size_t len, uint32_t *crcs)
{
	int rc = check_crc_args(n, chunks, crcs, mask);
	if (rc)
		return rc;
	for (int i = 0; i < n; i++)
		if (mask >> i & 1)
			crcs[i] = kvec_crc32c(0, chunks[i], len);
	return 0;
}

int kvec_crc_check(int n, const uint8_t *const *chunks, const uint32_t *crcs, uint64_t mask,
		   size_t len, uint64_t *bad)
{
	int rc = check_crc_args(n, chunks, crcs, mask);
	if (rc)
		return rc;
	if (!bad)
		return -EINVAL;
	uint64_t b = 0;
	for (int i = 0; i < n; i++)
		if ((mask >> i & 1) && kvec_crc32c(0, chunks[i], len) != crcs[i])
			b |= 1ull << i;
	*bad = b;
	return 0;
}

static int valid_chunk_size(uint64_t cs)
{
	return cs >= KVEC_CHUNK_MIN && cs <= KVEC_CHUNK_MAX && cs % KVEC_CHUNK_ALIGN == 0;
}

int kvec_layout_init(struct kvec_layout *l, uint64_t length, uint32_t chunk_size, int k, int m)
{
	if (!l || !valid_chunk_size(chunk_size) || k < 1 || k > KVEC_MAX_K || m < 0 ||
	    m > KVEC_MAX_M)
		return -EINVAL;
	uint64_t sb = (uint64_t)k * chunk_size;
	l->length = length;
	l->chunk_size = chunk_size;
	l->k = k;
	l->m = m;
	l->nstripes = length / sb + (length % sb != 0);
	return 0;
}

int64_t kvec_chunk_size_fit(uint64_t length, int k, uint32_t max_chunk)
{
	if (k < 1 || k > KVEC_MAX_K || max_chunk < KVEC_CHUNK_MIN)
		return -EINVAL;
	uint64_t cap = max_chunk > KVEC_CHUNK_MAX ? KVEC_CHUNK_MAX : max_chunk;
	cap -= cap % KVEC_CHUNK_ALIGN;
	uint64_t per = length / (uint64_t)k + (length % (uint64_t)k != 0);
	uint64_t cs = (per + KVEC_CHUNK_ALIGN - 1) / KVEC_CHUNK_ALIGN * KVEC_CHUNK_ALIGN;
	if (cs < KVEC_CHUNK_MIN)
		cs = KVEC_CHUNK_MIN;
	return (int64_t)(cs > cap ? cap : cs);
}

uint64_t kvec_layout_stripe_bytes(const struct kvec_layout *l)
{
	return (uint64_t)l->k * l->chunk_size;
}

int kvec_layout_chunk_range(const struct kvec_layout *l, uint64_t s, int j, uint64_t *off,
			    uint32_t *len)
{
	if (!l || !off || !len || s >= l->nstripes || j < 0 || j >= l->k)
		return -EINVAL;
	uint64_t start = s * kvec_layout_stripe_bytes(l) + (uint64_t)j * l->chunk_size;
	uint64_t n = 0;
	if (start < l->length)
		n = l->length - start < l->chunk_size ? l->length - start : l->chunk_size;
	*off = start;
	*len = (uint32_t)n;
	return 0;
}

uint32_t kvec_layout_slot_len(const struct kvec_layout *l, uint64_t s, int i)
{
	uint64_t off;
	uint32_t len = 0;
	if (!l || i < 0 || i >= l->k + l->m)
		return 0;
	/* Parity is as long as the longest data chunk, which chunk 0 always is. */
	if (kvec_layout_chunk_range(l, s, i < l->k ? i : 0, &off, &len))
		return 0;
	return len;
}

int kvec_layout_locate(const struct kvec_layout *l, uint64_t offset, struct kvec_loc *loc)
{
	if (!l || !loc || offset >= l->length)
		return -EINVAL;
	uint64_t sb = kvec_layout_stripe_bytes(l);
	uint64_t in = offset % sb;
	loc->stripe = offset / sb;
	loc->chunk = (int)(in / l->chunk_size);
	loc->offset = (uint32_t)(in % l->chunk_size);
	return 0;
}

size_t kvec_layout_scratch_size(const struct kvec_layout *l)
{
	return (size_t)2 * l->chunk_size;
}

int kvec_layout_stripe_data(const struct kvec_layout *l, uint64_t s, const uint8_t *buf,
			    uint8_t *scratch, size_t scratch_len, const uint8_t **data)
{
	if (!l || !buf || !data || s >= l->nstripes)
		return -EINVAL;
	const size_t cs = l->chunk_size;
	int nscratch = 0, zeroed = 0;
	for (int j = 0; j < l->k; j++) {
		uint64_t off;
		uint32_t n;
		kvec_layout_chunk_range(l, s, j, &off, &n);
		if (n == cs) {
			data[j] = buf + off;
			continue;
		}
		/* Only the last stripe gets here, so the scratch need is known up front. */
		if (!scratch || scratch_len < kvec_layout_scratch_size(l))
			return -ENOBUFS;
		if (n > 0) {
			memcpy(scratch, buf + off, n);
			memset(scratch + n, 0, cs - n);
			data[j] = scratch;
		} else {
			if (!zeroed)
				memset(scratch + cs, 0, cs);
			zeroed = 1;
			data[j] = scratch + cs;
		}
		nscratch++;
	}
	return nscratch;
}
