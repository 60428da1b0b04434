/* Tests for ec/ (kvec): every erasure pattern for 10+1, 8+3, 4+2; too few survivors; file
 * lengths around chunk boundaries through the stripe layout; misaligned buffers with guards;
 * CRC32C convention and bit flips; the decode-table cache under eviction and threads. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <isa-l/erasure_code.h>

#include "kvec.h"

#define CS	   4096u /* chunk size for the exhaustive tests: small keeps ASan fast */
#define GUARD	   64
#define GUARD_BYTE 0xA5

/* xorshift64*: fixed seeds, so a failure reproduces. */
static uint64_t rnd(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ull;
}

static void fill(uint64_t *s, uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(rnd(s) >> 56);
}

/* A stripe of n chunks of len bytes, each with guard bytes on both sides, starting `mis`
 * bytes past a 64-byte boundary, plus a pristine copy to compare against. */
struct stripe {
	int k, m, n;
	size_t len;
	uint8_t *mem[KVEC_MAX_N];
	uint8_t *chunk[KVEC_MAX_N];
	uint8_t *orig[KVEC_MAX_N];
};

static void stripe_init(struct stripe *st, struct kvec_codec *c, size_t len, size_t mis,
			uint64_t *seed)
{
	st->k = kvec_codec_k(c);
	st->m = kvec_codec_m(c);
	st->n = st->k + st->m;
	st->len = len;
	for (int i = 0; i < st->n; i++) {
		st->mem[i] = aligned_alloc(64, (2 * GUARD + len + mis + 63) / 64 * 64);
		assert_non_null(st->mem[i]);
		memset(st->mem[i], GUARD_BYTE, 2 * GUARD + len + mis);
		st->chunk[i] = st->mem[i] + GUARD + mis;
		st->orig[i] = malloc(len + 1);
		assert_non_null(st->orig[i]);
		if (i < st->k)
			fill(seed, st->chunk[i], len);
	}
	assert_int_equal(kvec_encode(c, (const uint8_t *const *)st->chunk, st->chunk + st->k, len),
			 0);
	for (int i = 0; i < st->n; i++)
		memcpy(st->orig[i], st->chunk[i], len);
}

static void stripe_check_guards(const struct stripe *st)
{
	for (int i = 0; i < st->n; i++) {
		const uint8_t *p = st->chunk[i];
		for (int g = 1; g <= GUARD; g++)
			assert_int_equal(p[-g], GUARD_BYTE);
		for (int g = 0; g < GUARD; g++)
			assert_int_equal(p[st->len + g], GUARD_BYTE);
	}
}

static void stripe_free(struct stripe *st)
{
	for (int i = 0; i < st->n; i++) {
		free(st->mem[i]);
		free(st->orig[i]);
	}
}

/* Loses `lost`, rebuilds it, and checks every chunk equals the original. */
static void lose_and_rebuild(struct kvec_codec *c, struct stripe *st, uint64_t lost, uint64_t *seed)
{
	uint64_t all = (1ull << st->n) - 1;
	for (int i = 0; i < st->n; i++)
		if (lost >> i & 1)
			fill(seed, st->chunk[i], st->len); /* garbage, not zeros */
	assert_int_equal(kvec_reconstruct(c, st->chunk, all & ~lost, lost, st->len), 0);
	for (int i = 0; i < st->n; i++)
		assert_memory_equal(st->chunk[i], st->orig[i], st->len);
	stripe_check_guards(st);
}

static void test_codec_args(void **state)
{
	(void)state;
	struct kvec_codec *c = (void *)1;
	assert_int_equal(kvec_codec_create(0, 1, &c), -EINVAL);
	assert_null(c);
	assert_int_equal(kvec_codec_create(33, 1, &c), -EINVAL);
	assert_int_equal(kvec_codec_create(10, 9, &c), -EINVAL);
	assert_int_equal(kvec_codec_create(10, -1, &c), -EINVAL);
	assert_int_equal(kvec_codec_create(10, 1, NULL), -EINVAL);
	assert_int_equal(kvec_codec_create(32, 8, &c), 0);
	assert_int_equal(kvec_codec_k(c), 32);
	assert_int_equal(kvec_codec_m(c), 8);
	kvec_codec_destroy(c);
	kvec_codec_destroy(NULL);

	/* m = 0: encode is a no-op, any missing chunk is -EIO. */
	assert_int_equal(kvec_codec_create(4, 0, &c), 0);
	uint8_t a[4][16] = {{0}}, *p[4] = {a[0], a[1], a[2], a[3]};
	assert_int_equal(kvec_encode(c, (const uint8_t *const *)p, NULL, 16), -EINVAL);
	assert_int_equal(kvec_encode(c, (const uint8_t *const *)p, p, 16), 0);
	assert_int_equal(kvec_reconstruct(c, p, 0x7, 0x8, 16), -EIO);
	assert_int_equal(kvec_reconstruct(c, p, 0xF, 0xF, 16), 0);
	kvec_codec_destroy(c);
}

/* Parity must be the documented code (identity + gf_gen_cauchy1_matrix), not merely
 * self-consistent: stored chunks outlive this build. */
static void test_encode_matches_reference(void **state)
{
	(void)state;
	const int k = 8, m = 3;
	const size_t len = 1000;
	struct kvec_codec *c;
	assert_int_equal(kvec_codec_create(k, m, &c), 0);
	uint64_t seed = 11;
	struct stripe st;
	stripe_init(&st, c, len, 0, &seed);
	uint8_t mat[(8 + 3) * 8];
	gf_gen_cauchy1_matrix(mat, k + m, k);
	for (int p = 0; p < m; p++)
		for (size_t b = 0; b < len; b++) {
			uint8_t acc = 0;
			for (int j = 0; j < k; j++)
				acc ^= gf_mul(mat[(k + p) * k + j], st.chunk[j][b]);
			assert_int_equal(st.chunk[k + p][b], acc);
		}
	stripe_free(&st);
	kvec_codec_destroy(c);
}

/* Number of subsets of n things with lo..hi members. */
static int binom_sum(int n, int lo, int hi)
{
	int sum = 0;
	for (int e = lo; e <= hi; e++) {
		long long b = 1;
		for (int i = 0; i < e; i++)
			b = b * (n - i) / (i + 1);
		sum += (int)b;
	}
	return sum;
}

/* Every pattern of 1..m erasures; for each, rebuild all lost chunks, and also (for patterns of
 * two or more) each lost chunk alone, which must leave the other lost buffers untouched. */
static void exhaustive(int k, int m)
{
	struct kvec_codec *c;
	assert_int_equal(kvec_codec_create(k, m, &c), 0);
	uint64_t seed = 0x5EED0000u + (uint64_t)(k * 16 + m);
	struct stripe st;
	stripe_init(&st, c, CS, 0, &seed);
	const int n = k + m;
	const uint64_t all = (1ull << n) - 1;
	int patterns = 0;
	for (uint64_t lost = 1; lost <= all; lost++) {
		if (__builtin_popcountll(lost) > m)
			continue;
		patterns++;
		lose_and_rebuild(c, &st, lost, &seed);
		if (__builtin_popcountll(lost) < 2)
			continue;
		for (int w = 0; w < n; w++) {
			if (!(lost >> w & 1))
				continue;
			for (int i = 0; i < n; i++)
				if (lost >> i & 1)
					memset(st.chunk[i], 0x3C, CS);
			assert_int_equal(kvec_reconstruct(c, st.chunk, all & ~lost, 1ull << w, CS),
					 0);
			for (int i = 0; i < n; i++) {
				if (i == w || !(lost >> i & 1))
					assert_memory_equal(st.chunk[i], st.orig[i], CS);
				else
					for (size_t b = 0; b < CS; b++)
						assert_int_equal(st.chunk[i][b], 0x3C);
			}
		}
		for (int i = 0; i < n; i++)
			memcpy(st.chunk[i], st.orig[i], CS);
	}
	assert_int_equal(patterns, binom_sum(n, 1, m));
	stripe_free(&st);
	kvec_codec_destroy(c);
}

static void test_all_patterns_10_1(void **state)
{
	(void)state;
	exhaustive(10, 1);
}

static void test_all_patterns_8_3(void **state)
{
	(void)state;
	exhaustive(8, 3);
}

static void test_all_patterns_4_2(void **state)
{
	(void)state;
	exhaustive(4, 2);
}

/* More than m erasures (m+1 .. n): -EIO, and not one byte of any buffer changes. */
static void too_few(int k, int m)
{
	struct kvec_codec *c;
	assert_int_equal(kvec_codec_create(k, m, &c), 0);
	uint64_t seed = 99;
	const size_t len = 256;
	struct stripe st;
	stripe_init(&st, c, len, 3, &seed);
	const int n = k + m;
	const uint64_t all = (1ull << n) - 1;
	for (int i = 0; i < n; i++)
		memset(st.orig[i], 0x77, len); /* lost buffers hold a sentinel */
	int patterns = 0;
	for (uint64_t lost = 1; lost <= all; lost++) {
		if (__builtin_popcountll(lost) <= m)
			continue;
		patterns++;
		for (int i = 0; i < n; i++)
			memset(st.chunk[i], 0x77, len);
		assert_int_equal(kvec_reconstruct(c, st.chunk, all & ~lost, lost, len), -EIO);
		assert_int_equal(kvec_reconstruct(c, st.chunk, all & ~lost, all, len), -EIO);
		for (int i = 0; i < n; i++)
			assert_memory_equal(st.chunk[i], st.orig[i], len);
	}
	assert_int_equal(patterns, binom_sum(n, m + 1, n));
	stripe_check_guards(&st);
	stripe_free(&st);
	kvec_codec_destroy(c);
}

static void test_too_few_survivors(void **state)
{
	(void)state;
	too_few(10, 1);
	too_few(8, 3);
	too_few(4, 2);
}

static void test_reconstruct_args(void **state)
{
	(void)state;
	struct kvec_codec *c;
	assert_int_equal(kvec_codec_create(4, 2, &c), 0);
	uint64_t seed = 5;
	struct stripe st;
	stripe_init(&st, c, 100, 0, &seed);
	assert_int_equal(kvec_reconstruct(NULL, st.chunk, 0x3E, 0x1, 100), -EINVAL);
	assert_int_equal(kvec_reconstruct(c, NULL, 0x3E, 0x1, 100), -EINVAL);
	assert_int_equal(kvec_reconstruct(c, st.chunk, 0x7E, 0x1, 100), -EINVAL);
	assert_int_equal(kvec_reconstruct(c, st.chunk, 0x3E, 0x41, 100), -EINVAL);
	uint8_t *saved = st.chunk[0];
	st.chunk[0] = NULL; /* wanted buffer missing */
	assert_int_equal(kvec_reconstruct(c, st.chunk, 0x3E, 0x1, 100), -EINVAL);
	st.chunk[0] = saved;
	saved = st.chunk[3];
	st.chunk[3] = NULL; /* present buffer missing */
	assert_int_equal(kvec_reconstruct(c, st.chunk, 0x3E, 0x1, 100), -EINVAL);
	st.chunk[3] = saved;
	/* Entries that are neither present nor wanted may be NULL. */
	saved = st.chunk[5];
	st.chunk[5] = NULL;
	memset(st.chunk[0], 0, 100);
	assert_int_equal(kvec_reconstruct(c, st.chunk, 0x1E, 0x1, 100), 0);
	assert_memory_equal(st.chunk[0], st.orig[0], 100);
	st.chunk[5] = saved;
	/* Wanted bits that are present are not written. */
	memset(st.chunk[0], 0, 100);
	assert_int_equal(kvec_reconstruct(c, st.chunk, 0x3E, 0x3F, 100), 0);
	assert_memory_equal(st.chunk[0], st.orig[0], 100);
	for (int i = 1; i < 6; i++)
		assert_memory_equal(st.chunk[i], st.orig[i], 100);
	/* len 0: nothing to do, still validated. */
	assert_int_equal(kvec_reconstruct(c, st.chunk, 0x3E, 0x1, 0), 0);
	assert_int_equal(kvec_reconstruct(c, st.chunk, 0x3, 0x1C, 0), -EIO);
	stripe_free(&st);
	kvec_codec_destroy(c);
}

/* Misaligned chunks (1..63 bytes past alignment), odd lengths, guards on both sides. */
static void test_misaligned(void **state)
{
	(void)state;
	struct kvec_codec *c;
	assert_int_equal(kvec_codec_create(8, 3, &c), 0);
	uint64_t seed = 1234;
	const size_t lens[] = {1, 15, 31, 32, 33, 63, 64, 65, 4095, 4096 + 13};
	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
		size_t mis = 1 + rnd(&seed) % 63;
		struct stripe st;
		stripe_init(&st, c, lens[li], mis, &seed);
		stripe_check_guards(&st);
		for (int t = 0; t < 8; t++) {
			uint64_t lost = 0;
			int e = 1 + (int)(rnd(&seed) % 3);
			while (__builtin_popcountll(lost) < e)
				lost |= 1ull << (rnd(&seed) % 11);
			lose_and_rebuild(c, &st, lost, &seed);
		}
		stripe_free(&st);
	}
	kvec_codec_destroy(c);
}

static uint32_t crc32c_bitwise(uint32_t crc, const uint8_t *p, size_t n)
{
	crc = ~crc;
	while (n--) {
		crc ^= *p++;
		for (int i = 0; i < 8; i++)
			crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1)));
	}
	return ~crc;
}

static void test_crc32c_convention(void **state)
{
	(void)state;
	assert_int_equal(kvec_crc32c(0, "123456789", 9), 0xE3069283u);
	assert_int_equal(kvec_crc32c(0, NULL, 0), 0);
	/* 32 zero bytes: RFC 3720 B.4 test vector. */
	uint8_t z[32] = {0};
	assert_int_equal(kvec_crc32c(0, z, 32), 0x8A9136AAu);
	uint64_t seed = 77;
	uint8_t buf[3000];
	fill(&seed, buf, sizeof(buf));
	for (int t = 0; t < 200; t++) {
		size_t off = rnd(&seed) % 64, n = rnd(&seed) % (sizeof(buf) - 64);
		size_t cut = n ? rnd(&seed) % n : 0;
		uint32_t want = crc32c_bitwise(0, buf + off, n);
		assert_int_equal(kvec_crc32c(0, buf + off, n), want);
		uint32_t chained =
		    kvec_crc32c(kvec_crc32c(0, buf + off, cut), buf + off + cut, n - cut);
		assert_int_equal(chained, want);
	}
}

/* Flipped bits are caught by the per-chunk CRC; dropping the flagged chunks from the present
 * mask yields the original data, never the corrupted bytes. */
static void test_bitflip_detected(void **state)
{
	(void)state;
	struct kvec_codec *c;
	assert_int_equal(kvec_codec_create(8, 3, &c), 0);
	uint64_t seed = 4242;
	struct stripe st;
	stripe_init(&st, c, CS, 0, &seed);
	const int n = 11;
	const uint64_t all = (1ull << n) - 1;
	uint32_t crcs[11];
	assert_int_equal(kvec_crc_compute(n, (const uint8_t *const *)st.chunk, all, CS, crcs), 0);
	uint64_t bad = ~0ull;
	assert_int_equal(kvec_crc_check(n, (const uint8_t *const *)st.chunk, crcs, all, CS, &bad),
			 0);
	assert_int_equal(bad, 0);
	assert_int_equal(kvec_crc_check(65, (const uint8_t *const *)st.chunk, crcs, all, CS, &bad),
			 -EINVAL);
	assert_int_equal(
	    kvec_crc_check(n, (const uint8_t *const *)st.chunk, crcs, 1ull << n, CS, &bad),
	    -EINVAL);
	for (int t = 0; t < 300; t++) {
		int flips = 1 + (int)(rnd(&seed) % 3); /* chunks hit, up to m */
		uint64_t hit = 0;
		while (__builtin_popcountll(hit) < flips) {
			int ci = (int)(rnd(&seed) % n);
			size_t bit = rnd(&seed) % (CS * 8);
			st.chunk[ci][bit / 8] ^= (uint8_t)(1u << (bit % 8));
			hit |= 1ull << ci;
			if (t % 2) { /* sometimes a second bit in the same chunk */
				bit = rnd(&seed) % (CS * 8);
				st.chunk[ci][bit / 8] ^= (uint8_t)(1u << (bit % 8));
				if (!memcmp(st.chunk[ci], st.orig[ci], CS))
					hit &= ~(1ull << ci); /* flipped the same bit back */
			}
		}
		assert_int_equal(
		    kvec_crc_check(n, (const uint8_t *const *)st.chunk, crcs, all, CS, &bad), 0);
		assert_int_equal(bad, hit);
		assert_int_equal(kvec_reconstruct(c, st.chunk, all & ~bad, bad, CS), 0);
		for (int i = 0; i < n; i++)
			assert_memory_equal(st.chunk[i], st.orig[i], CS);
	}
	stripe_free(&st);
	kvec_codec_destroy(c);
}

static void test_layout(void **state)
{
	(void)state;
	struct kvec_layout l;
	assert_int_equal(kvec_layout_init(&l, 100, 0, 10, 1), -EINVAL);
	assert_int_equal(kvec_layout_init(&l, 100, 4095, 10, 1), -EINVAL);
	assert_int_equal(kvec_layout_init(&l, 100, 4097, 10, 1), -EINVAL);
	assert_int_equal(kvec_layout_init(&l, 100, (16u << 20) + 4096, 10, 1), -EINVAL);
	assert_int_equal(kvec_layout_init(&l, 100, 4096, 0, 1), -EINVAL);
	assert_int_equal(kvec_layout_init(&l, 100, 4096, 10, 9), -EINVAL);
	assert_int_equal(kvec_layout_init(NULL, 100, 4096, 10, 1), -EINVAL);
	assert_int_equal(kvec_layout_init(&l, 100, 16u << 20, 10, 1), 0);
	assert_int_equal(kvec_layout_init(&l, 100, 3 * 4096, 10, 1), 0); /* not a power of 2 */

	assert_int_equal(kvec_layout_init(&l, 0, 4096, 10, 1), 0);
	assert_int_equal(l.nstripes, 0);
	struct kvec_loc loc;
	uint64_t off;
	uint32_t len;
	assert_int_equal(kvec_layout_locate(&l, 0, &loc), -EINVAL);
	assert_int_equal(kvec_layout_chunk_range(&l, 0, 0, &off, &len), -EINVAL);

	/* 2.5 stripes of 4+2 with 4 KiB chunks: last stripe has chunks full, full, 0-byte... */
	uint64_t L = 2 * 4 * 4096 + 4096 + 100;
	assert_int_equal(kvec_layout_init(&l, L, 4096, 4, 2), 0);
	assert_int_equal(l.nstripes, 3);
	assert_int_equal(kvec_layout_stripe_bytes(&l), 4 * 4096);
	assert_int_equal(kvec_layout_chunk_range(&l, 2, 0, &off, &len), 0);
	assert_int_equal(off, 8 * 4096);
	assert_int_equal(len, 4096);
	assert_int_equal(kvec_layout_chunk_range(&l, 2, 1, &off, &len), 0);
	assert_int_equal(off, 9 * 4096);
	assert_int_equal(len, 100);
	assert_int_equal(kvec_layout_chunk_range(&l, 2, 2, &off, &len), 0);
	assert_int_equal(len, 0);
	assert_int_equal(kvec_layout_chunk_range(&l, 3, 0, &off, &len), -EINVAL);
	assert_int_equal(kvec_layout_chunk_range(&l, 0, 4, &off, &len), -EINVAL);
	assert_int_equal(kvec_layout_chunk_range(&l, 0, -1, &off, &len), -EINVAL);

	/* Stored lengths: data chunks their range, parity that of chunk 0; the empty data
	 * chunks of the last stripe store nothing, its parity does. */
	static const uint32_t want_last[6] = {4096, 100, 0, 0, 4096, 4096};
	for (int i = 0; i < 6; i++) {
		assert_int_equal(kvec_layout_slot_len(&l, 0, i), 4096);
		assert_int_equal(kvec_layout_slot_len(&l, 2, i), want_last[i]);
	}
	assert_int_equal(kvec_layout_slot_len(&l, 2, 6), 0);
	assert_int_equal(kvec_layout_slot_len(&l, 3, 0), 0);
	/* One byte in one stripe: data 0 and both parity hold it, the rest is empty. */
	struct kvec_layout one;
	assert_int_equal(kvec_layout_init(&one, 1, 4096, 4, 2), 0);
	static const uint32_t want_one[6] = {1, 0, 0, 0, 1, 1};
	for (int i = 0; i < 6; i++)
		assert_int_equal(kvec_layout_slot_len(&one, 0, i), want_one[i]);

	/* locate agrees with chunk_range for every byte. */
	for (uint64_t o = 0; o < L; o += 37) {
		assert_int_equal(kvec_layout_locate(&l, o, &loc), 0);
		assert_int_equal(kvec_layout_chunk_range(&l, loc.stripe, loc.chunk, &off, &len), 0);
		assert_int_equal(off + loc.offset, o);
		assert_true(loc.offset < len);
	}
	assert_int_equal(kvec_layout_locate(&l, L - 1, &loc), 0);
	assert_int_equal(loc.stripe, 2);
	assert_int_equal(loc.chunk, 1);
	assert_int_equal(loc.offset, 99);
	assert_int_equal(kvec_layout_locate(&l, L, &loc), -EINVAL);

	assert_int_equal(kvec_chunk_size_fit(0, 10, 1u << 20), 4096);
	assert_int_equal(kvec_chunk_size_fit(10 * 4096, 10, 1u << 20), 4096);
	assert_int_equal(kvec_chunk_size_fit(10 * 4096 + 1, 10, 1u << 20), 8192);
	assert_int_equal(kvec_chunk_size_fit(5u << 20, 10, 1u << 20), 512 * 1024);
	assert_int_equal(kvec_chunk_size_fit(100u << 20, 10, (1u << 20) + 5), 1u << 20);
	assert_int_equal(kvec_chunk_size_fit(100, 10, 4095), -EINVAL);
	assert_int_equal(kvec_chunk_size_fit(100, 0, 4096), -EINVAL);
}

/* A whole file through the layout: encode each stripe from pointers into the file buffer (the
 * last stripe through scratch), lose up to m chunks per stripe, rebuild, reassemble, compare. */
static void file_roundtrip(struct kvec_codec *c, uint64_t length, uint64_t *seed)
{
	const int k = kvec_codec_k(c), m = kvec_codec_m(c), n = k + m;
	struct kvec_layout l;
	assert_int_equal(kvec_layout_init(&l, length, CS, k, m), 0);
	uint8_t *file = malloc(length + 1), *back = malloc(length + 1);
	uint8_t *scratch = malloc(kvec_layout_scratch_size(&l));
	uint8_t *store = malloc((size_t)n * CS);
	assert_true(file && back && scratch && store);
	fill(seed, file, length);
	memset(back, 0xEE, length + 1);
	for (uint64_t s = 0; s < l.nstripes; s++) {
		const uint8_t *data[KVEC_MAX_K];
		int ns = kvec_layout_stripe_data(&l, s, file, NULL, 0, data);
		if (s + 1 < l.nstripes || length % kvec_layout_stripe_bytes(&l) == 0) {
			assert_int_equal(ns, 0); /* full stripes need no copy */
			for (int j = 0; j < k; j++)
				assert_ptr_equal(data[j], file + s * k * CS + (size_t)j * CS);
		} else {
			assert_int_equal(ns, -ENOBUFS);
			ns = kvec_layout_stripe_data(&l, s, file, scratch, 2 * CS, data);
			assert_true(ns >= 1 && ns <= k);
		}
		uint8_t *chunk[KVEC_MAX_N];
		for (int i = 0; i < n; i++)
			chunk[i] = store + (size_t)i * CS;
		for (int j = 0; j < k; j++)
			memcpy(chunk[j], data[j], CS); /* what the nodes would store */
		assert_int_equal(kvec_encode(c, data, chunk + k, CS), 0);
		uint64_t lost = 0;
		int e = (int)(rnd(seed) % (m + 1));
		while (__builtin_popcountll(lost) < e)
			lost |= 1ull << (rnd(seed) % n);
		for (int i = 0; i < n; i++)
			if (lost >> i & 1)
				memset(chunk[i], 0xDB, CS);
		assert_int_equal(kvec_reconstruct(c, chunk, ((1ull << n) - 1) & ~lost, lost, CS),
				 0);
		for (int j = 0; j < k; j++) {
			uint64_t off;
			uint32_t len;
			assert_int_equal(kvec_layout_chunk_range(&l, s, j, &off, &len), 0);
			memcpy(back + off, chunk[j], len);
			for (uint32_t b = len; b < CS; b++)
				assert_int_equal(chunk[j][b], 0); /* padding is zeros */
		}
	}
	assert_memory_equal(back, file, length);
	assert_int_equal(back[length], 0xEE);
	free(file);
	free(back);
	free(scratch);
	free(store);
}

static void test_lengths(void **state)
{
	(void)state;
	const int km[][2] = {{10, 1}, {4, 2}, {8, 3}};
	uint64_t seed = 31337;
	for (size_t t = 0; t < 3; t++) {
		struct kvec_codec *c;
		assert_int_equal(kvec_codec_create(km[t][0], km[t][1], &c), 0);
		const uint64_t sb = (uint64_t)km[t][0] * CS;
		const uint64_t lens[] = {0,
					 1,
					 CS - 1,
					 CS,
					 CS + 1,
					 sb - 1,
					 sb,
					 sb + 1,
					 3 * sb,
					 7 * sb + CS + 5,
					 5 * sb + 2 * CS + 1};
		for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
			file_roundtrip(c, lens[i], &seed);
		kvec_codec_destroy(c);
	}
}

/* More distinct patterns than cache slots: eviction must never serve a wrong table. */
static void test_cache(void **state)
{
	(void)state;
	struct kvec_codec *c;
	assert_int_equal(kvec_codec_create(8, 3, &c), 0);
	uint64_t seed = 8, hits, misses;
	struct stripe st;
	stripe_init(&st, c, 512, 0, &seed);
	lose_and_rebuild(c, &st, 0x5, &seed);
	lose_and_rebuild(c, &st, 0x5, &seed);
	kvec_codec_cache_stats(c, &hits, &misses);
	assert_int_equal(misses, 1);
	assert_int_equal(hits, 1);
	for (int round = 0; round < 3; round++)
		for (uint64_t lost = 1; lost < (1u << 11); lost++)
			if (__builtin_popcountll(lost) == 3)
				lose_and_rebuild(c, &st, lost, &seed);
	kvec_codec_cache_stats(c, &hits, &misses);
	assert_true(misses > KVEC_CACHE_SLOTS);
	stripe_free(&st);
	kvec_codec_destroy(c);
}

struct worker {
	struct kvec_codec *c;
	uint64_t seed;
	int errors; /* cmocka asserts must not fire off the main thread: count, check after join */
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	enum { K = 8, M = 3, N = 11, LEN = 1024 };
	uint8_t *mem = malloc(2 * N * LEN), *chunk[N], *orig[N];
	if (!mem) {
		w->errors++;
		return NULL;
	}
	for (int i = 0; i < N; i++) {
		chunk[i] = mem + i * LEN;
		orig[i] = mem + (N + i) * LEN;
		if (i < K)
			fill(&w->seed, chunk[i], LEN);
	}
	if (kvec_encode(w->c, (const uint8_t *const *)chunk, chunk + K, LEN))
		w->errors++;
	memcpy(orig[0], chunk[0], N * LEN);
	for (int t = 0; t < 400; t++) {
		uint64_t lost = 0;
		int e = 1 + (int)(rnd(&w->seed) % M);
		while (__builtin_popcountll(lost) < e)
			lost |= 1ull << (rnd(&w->seed) % N);
		for (int i = 0; i < N; i++)
			if (lost >> i & 1)
				memset(chunk[i], t, LEN);
		if (kvec_reconstruct(w->c, chunk, ((1ull << N) - 1) & ~lost, lost, LEN) ||
		    memcmp(chunk[0], orig[0], N * LEN))
			w->errors++;
	}
	free(mem);
	return NULL;
}

static void test_threads(void **state)
{
	(void)state;
	struct kvec_codec *c;
	assert_int_equal(kvec_codec_create(8, 3, &c), 0);
	pthread_t th[4];
	struct worker w[4];
	for (int i = 0; i < 4; i++) {
		w[i] = (struct worker){c, 1000 + (uint64_t)i, 0};
		assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(w[i].errors, 0);
	}
	kvec_codec_destroy(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_codec_args),
	    cmocka_unit_test(test_encode_matches_reference),
	    cmocka_unit_test(test_all_patterns_10_1),
	    cmocka_unit_test(test_all_patterns_8_3),
	    cmocka_unit_test(test_all_patterns_4_2),
	    cmocka_unit_test(test_too_few_survivors),
	    cmocka_unit_test(test_reconstruct_args),
	    cmocka_unit_test(test_misaligned),
	    cmocka_unit_test(test_crc32c_convention),
	    cmocka_unit_test(test_bitflip_detected),
	    cmocka_unit_test(test_layout),
	    cmocka_unit_test(test_lengths),
	    cmocka_unit_test(test_cache),
	    cmocka_unit_test(test_threads),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
