/* kvec — erasure coding (ISA-L Reed-Solomon over GF(2^8), Cauchy matrix), CRC32C and the stripe
 * layout of a file. The contract for every caller (client library, storage node, tools).
 *
 * Prefix kvec_ (ISA-L owns ec_*). Every call returns 0 or a negative errno unless it says
 * otherwise. The library never allocates or copies on the data path: encode and reconstruct
 * read and write the caller's buffers directly.
 *
 * Chunk numbering: a stripe has n = k + m chunks; indices 0..k-1 are data, k..k+m-1 parity.
 * Masks (uint64_t) have bit i set for chunk i; bits at or above n are invalid.
 *
 * Buffers: no alignment is required (ISA-L uses unaligned loads); 64-byte aligned buffers are
 * faster. All chunks of one call have the same length len (any value, 0 included). Buffers of
 * one call must not overlap, except that several *input* pointers may share one buffer (e.g.
 * one zero chunk standing in for every empty data chunk of the last stripe).
 *
 * Threads: a codec is immutable after kvec_codec_create() except for its decode-table cache,
 * which is protected by a mutex inside the codec; any number of threads may call kvec_encode()
 * and kvec_reconstruct() on one codec at once (on different buffers). create/destroy must not
 * race with other calls on the same codec. Layout and CRC functions are pure.
 */
#ifndef KVFS_KVEC_H
#define KVFS_KVEC_H

#include <stddef.h>
#include <stdint.h>

#define KVEC_MAX_K     32
#define KVEC_MAX_M     8
#define KVEC_MAX_N     (KVEC_MAX_K + KVEC_MAX_M)
#define KVEC_DEFAULT_K 10
#define KVEC_DEFAULT_M 1

/* Decode tables are cached per (source set, wanted set); at most this many per codec, least
 * recently used evicted. The cache is allocated at create, so reconstruct never allocates. */
#define KVEC_CACHE_SLOTS 64

/* ---- codec ---------------------------------------------------------------------------- */

struct kvec_codec;

/* Creates a k+m codec: 1 <= k <= KVEC_MAX_K, 0 <= m <= KVEC_MAX_M. The generator is ISA-L's
 * gf_gen_cauchy1_matrix: identity on top (data chunks are stored as is), Cauchy rows below, so
 * any k of the k+m chunks determine the rest. m = 0 is allowed (striping without redundancy:
 * encode writes nothing, reconstruct of any missing chunk fails with -EIO).
 * Returns 0 and *out, or -EINVAL (bad k/m, out == NULL) / -ENOMEM with *out = NULL.
 * Free with kvec_codec_destroy.
 */
int kvec_codec_create(int k, int m, struct kvec_codec **out);

/* Frees the codec; NULL is a no-op. No call on the codec may be in flight. */
void kvec_codec_destroy(struct kvec_codec *codec);

int kvec_codec_k(const struct kvec_codec *codec);
int kvec_codec_m(const struct kvec_codec *codec);

/* Decode-table cache counters since create (for tests and stats). Thread-safe. */
void kvec_codec_cache_stats(struct kvec_codec *codec, uint64_t *hits, uint64_t *misses);

/* Computes the m parity chunks of one stripe: parity[i] = sum_j C[i][j] * data[j] over len
 * bytes. data: k pointers, each to len readable bytes (pointers may repeat). parity: m pointers,
 * each to len writable bytes, distinct, not overlapping any data. No allocation, no locking.
 * Returns 0, -EINVAL on NULL arguments (len == 0 or m == 0: nothing is touched, returns 0). */
int kvec_encode(const struct kvec_codec *codec, const uint8_t *const *data, uint8_t *const *parity,
		size_t len);

/* Rebuilds, in place, every chunk in want_mask that is not in present_mask, from k of the
 * present chunks (the lowest-numbered k; data chunks first, so a read of a healthy stripe
 * touches no parity).
 *   chunks: k + m pointers. chunks[i] for i in present_mask: len readable bytes holding chunk i
 *           (never written). chunks[i] for i in want_mask & ~present_mask: len writable bytes
 *           that receive chunk i. Other entries are ignored and may be NULL.
 *   Bits of want_mask that are also present are ignored (the chunk is already there).
 * Returns 0 (also when nothing is missing), -EINVAL on NULL codec/chunks, a needed NULL
 * pointer or a mask bit >= k + m, -EIO when something wanted is missing and fewer than k chunks
 * are present; then no buffer is written. Never returns wrong data for k or more survivors:
 * callers must drop chunks whose CRC fails (kvec_crc_check) from present_mask first.
 * Thread-safe; takes the codec's cache mutex briefly (a miss inverts a k x k matrix, O(k^3)). */
int kvec_reconstruct(struct kvec_codec *codec, uint8_t *const *chunks, uint64_t present_mask,
		     uint64_t want_mask, size_t len);

/* ---- CRC32C ------------------------------------------------------------------------------ */

/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) as in iSCSI/ext4/RFC 3720, computed
 * with ISA-L crc32_iscsi. Convention (zlib-style, chainable): seed is a previous result, 0 to
 * start; internally the register starts at ~seed and the result is the register xor 0xFFFFFFFF.
 * So kvec_crc32c(0, "123456789", 9) == 0xE3069283 and
 * kvec_crc32c(kvec_crc32c(0, a, la), b, lb) == kvec_crc32c(0, a||b, la + lb).
 * Any len; buf may be NULL only when len == 0. */
uint32_t kvec_crc32c(uint32_t seed, const void *buf, size_t len);

/* For every chunk i in mask (bits < n <= 64): crcs[i] = kvec_crc32c(0, chunks[i], len).
 * Returns 0 or -EINVAL (NULL arguments, n outside 1..64, a mask bit >= n). */
int kvec_crc_compute(int n, const uint8_t *const *chunks, uint64_t mask, size_t len,
		     uint32_t *crcs);

/* Checks every chunk i in mask against expected crcs[i] over len bytes; *bad receives the mask
 * of chunks that do not match (to be treated as erasures: present_mask &= ~*bad).
 * Returns 0 or -EINVAL as kvec_crc_compute. */
int kvec_crc_check(int n, const uint8_t *const *chunks, const uint32_t *crcs, uint64_t mask,
		   size_t len, uint64_t *bad);

/* ---- stripe layout -------------------------------------------------------------------------- */

/* A file of `length` bytes is cut into stripes of k * chunk_size data bytes; data chunk j of
 * stripe s holds file bytes [s*k*cs + j*cs, +cs). The last stripe is padded with zeros for
 * encoding; the logical length is kept here (and in metadata), never derived from chunks.
 * The caller owns the struct (may live on the stack); fields are read-only after init. */
struct kvec_layout {
	uint64_t length;     /* logical file length in bytes */
	uint32_t chunk_size; /* bytes per chunk: multiple of KVEC_CHUNK_ALIGN in [MIN, MAX] */
	int k, m;
	uint64_t nstripes; /* ceil(length / (k * chunk_size)); 0 when length == 0 */
};

#define KVEC_CHUNK_ALIGN 4096u
#define KVEC_CHUNK_MIN	 4096u
#define KVEC_CHUNK_MAX	 (16u << 20)

/* Fills *l. chunk_size must be a multiple of 4 KiB in [4 KiB, 16 MiB] (not necessarily a
 * power of two, so a one-stripe file can use ceil(length / k) rounded up to 4 KiB and waste
 * less than 4 KiB per chunk). k, m as kvec_codec_create. Returns 0 or -EINVAL. */
int kvec_layout_init(struct kvec_layout *l, uint64_t length, uint32_t chunk_size, int k, int m);

/* Smallest valid chunk size that holds `length` in one stripe, capped at max_chunk (itself
 * rounded down to a valid size). Returns it, or -EINVAL for bad k / max_chunk < 4 KiB. */
int64_t kvec_chunk_size_fit(uint64_t length, int k, uint32_t max_chunk);

/* Data bytes per stripe: k * chunk_size. */
uint64_t kvec_layout_stripe_bytes(const struct kvec_layout *l);

/* File byte range of data chunk j (0 <= j < k) of stripe s (s < nstripes): *off, *len. *len is
 * chunk_size, except in the last stripe where it may be shorter or 0 (the rest is zero
 * padding). Returns 0 or -EINVAL (s or j out of range). */
int kvec_layout_chunk_range(const struct kvec_layout *l, uint64_t s, int j, uint64_t *off,
			    uint32_t *len);

/* Bytes stored for chunk i (0 <= i < k + m) of stripe s (s < nstripes): a data chunk holds its
 * file range (kvec_layout_chunk_range), a parity chunk as many bytes as data chunk 0, the
 * longest of the stripe. 0 means the chunk holds no byte of the file: an empty data chunk of
 * the last stripe (a file shorter than a stripe leaves some), never stored on any node, known
 * to be zeros. Writers skip it, readers take it as present, scrub, repair and drain have
 * nothing to check or copy. Parity of a stripe is never empty. Returns 0 for s or i out of
 * range. */
uint32_t kvec_layout_slot_len(const struct kvec_layout *l, uint64_t s, int i);

/* Where file byte `offset` (< length) lives. Returns 0 or -EINVAL (offset >= length). */
struct kvec_loc {
	uint64_t stripe;
	int chunk;	 /* data chunk index 0..k-1 */
	uint32_t offset; /* byte offset inside the chunk */
};
int kvec_layout_locate(const struct kvec_layout *l, uint64_t offset, struct kvec_loc *loc);

/* Bytes of scratch kvec_layout_stripe_data needs: 2 * chunk_size. */
size_t kvec_layout_scratch_size(const struct kvec_layout *l);

/* Points data[0..k-1] at the k data chunks of stripe s of a file held whole in memory at buf
 * (l->length readable bytes), ready for kvec_encode. Full chunks point straight into buf (no
 * copy); only the last stripe uses scratch: its short chunk is copied to scratch[0, cs) and
 * zero-padded, and all its empty chunks point at one zeroed chunk at scratch[cs, 2cs).
 * scratch: scratch_len >= kvec_layout_scratch_size(l) bytes, may be NULL for a stripe that
 * needs none; it must outlive the use of data[]. Returns the number of chunks that point into
 * scratch (0 for a full stripe), -EINVAL (bad s, NULL buf/data), -ENOBUFS (scratch too small). */
int kvec_layout_stripe_data(const struct kvec_layout *l, uint64_t s, const uint8_t *buf,
			    uint8_t *scratch, size_t scratch_len, const uint8_t **data);

#endif
