/* kvb — KV-cache block identity and block files.
 *
 * Identity (docs/kv-block-format.md gives every byte): a prompt is cut into blocks of B
 * tokens; block i is named by a chained hash
 *     salt_d = SHA-256("kvfs-salt-v1" || salt)
 *     h_i    = SHA-256("kvfs-block-v1" || h_{i-1} || fingerprint || salt_d || u32 n || ids)
 * with h_{-1} = 32 zero bytes, u32 and ids little-endian (ids as u32). The model fingerprint
 * (engine/model.h) covers the weights and architecture; the engine folds KV dtype and B into
 * the fingerprint it passes here (kvb_fingerprint). Every field has a fixed length, so no two
 * different inputs serialise alike. A tenant's salt changes every hash: without the salt a
 * tenant cannot name, probe or read another tenant's blocks.
 *
 * A block file is a 4096-byte header (so the payload can be read with O_DIRECT into an
 * aligned buffer) followed by the payload: the block's K/V bytes exactly as
 * kvi_kv_block_export writes them. The header carries magic, version, fingerprint, own and
 * parent hash, geometry, the block's token ids and CRC32Cs of header and payload. A reader
 * that expects hash h with parent p and tokens t checks all of them: any mismatch, truncation
 * or garbage is a miss, never loaded.
 *
 * Pure functions on caller buffers; thread-safe.
 */
#ifndef KVFS_KVB_H
#define KVFS_KVB_H

#include <stddef.h>
#include <stdint.h>

#define KVB_HASH	32
#define KVB_HEADER_SIZE 4096u
#define KVB_MAGIC	0x3142564Bu /* "KVB1" */
#define KVB_VERSION	1
#define KVB_MAX_TOKENS	896 /* token ids must fit in the header */
#define KVB_DTYPE_F16	1

struct kvb_geom {
	uint32_t n_layer, n_head_kv, head_dim;
	uint32_t dtype;	       /* KVB_DTYPE_F16 */
	uint32_t block_tokens; /* B */
};

/* What a block file says about itself. */
struct kvb_header {
	uint8_t fingerprint[KVB_HASH];
	uint8_t hash[KVB_HASH];
	uint8_t parent[KVB_HASH];
	struct kvb_geom geom;
	uint32_t ntokens; /* tokens in this block: B for a full block, fewer for a last one */
	uint64_t payload_bytes;
	uint32_t payload_crc;
	int32_t tokens[KVB_MAX_TOKENS];
};

/* Derives the fingerprint a cache uses from the model's: mixes in geometry (dtype, B, layers,
 * heads, head_dim), so changing any of them changes every block name. */
void kvb_fingerprint(const uint8_t model_fp[KVB_HASH], const struct kvb_geom *g,
		     uint8_t out[KVB_HASH]);
/* salt may be NULL or "" (no tenant). */
void kvb_salt_digest(const char *salt, uint8_t out[KVB_HASH]);
/* h = hash of a block given its parent (NULL = first block), the cache fingerprint, salt
 * digest and the block's n token ids. */
void kvb_block_hash(const uint8_t *parent, const uint8_t fp[KVB_HASH],
		    const uint8_t salt_d[KVB_HASH], const int32_t *ids, uint32_t n,
		    uint8_t out[KVB_HASH]);
/* Hashes of consecutive full blocks of a prompt: out[i] for tokens [i*B, (i+1)*B), for
 * i < n_tokens / B. Returns the number of blocks. */
int kvb_chain(const uint8_t fp[KVB_HASH], const uint8_t salt_d[KVB_HASH], const int32_t *ids,
	      int n_tokens, int B, uint8_t (*out)[KVB_HASH], int max_out);

/* An image in a prompt: tokens [pos, pos + n) are its placeholder tokens (the same ids for
 * every image), and hash names its pixels (SHA-256 of the decoded RGB, engine/serve/img.h).
 * The ids alone would let a block after one image be reused for another; the hash makes the
 * block names differ. */
struct kvb_image {
	uint32_t pos, n;
	uint8_t hash[KVB_HASH];
};

/* kvb_block_hash of a block whose first token is at prompt position `start`, with the images
 * overlapping it (docs/kv-block-format.md, "Images"): each adds its hash and the overlap's
 * place. With no image overlapping the block, the same hash as kvb_block_hash, so text-only
 * blocks keep their names. img sorted by pos, not overlapping (kvb_chain_images checks). */
void kvb_block_hash_images(const uint8_t *parent, const uint8_t fp[KVB_HASH],
			   const uint8_t salt_d[KVB_HASH], const int32_t *ids, uint32_t n,
			   uint32_t start, const struct kvb_image *img, int nimg,
			   uint8_t out[KVB_HASH]);
/* kvb_chain for a prompt with nimg images (nimg 0: the same as kvb_chain). Returns the number
 * of blocks, or -EINVAL when an image is empty, runs past n_tokens, or is out of order or
 * overlaps the one before. */
int kvb_chain_images(const uint8_t fp[KVB_HASH], const uint8_t salt_d[KVB_HASH], const int32_t *ids,
		     int n_tokens, int B, const struct kvb_image *img, int nimg,
		     uint8_t (*out)[KVB_HASH], int max_out);

/* Payload bytes of a block of this geometry. */
uint64_t kvb_payload_bytes(const struct kvb_geom *g);

/* Fills a KVB_HEADER_SIZE-byte header for a block file. -EINVAL for bad sizes. */
int kvb_header_write(const struct kvb_header *h, uint8_t out[KVB_HEADER_SIZE]);

/* kvb's own results, in a range of their own beside errno (as LMDB does): a well-formed header
 * of a block other than the one asked for. No errno says that; kvb_strerror names these and
 * errno values alike. */
#define KVB_E_OTHER_MODEL (-30801) /* another model fingerprint or KV geometry */
#define KVB_E_NOT_THIS	  (-30802) /* hash, parent or token ids differ: not this block */
const char *kvb_strerror(int err);

/* Parses and checks a header against what the reader expects: magic, version, header CRC,
 * fingerprint, hash, parent (NULL = first block: must be zeros), geometry, ntokens and token
 * ids, payload size. file_size (if not 0) must equal header + payload. On success fills *h.
 * Returns 0 or the first failure: -EBADMSG (garbage / CRC), -EPROTO (version),
 * KVB_E_OTHER_MODEL, KVB_E_NOT_THIS, -EIO (size: truncated). */
int kvb_header_check(const uint8_t in[KVB_HEADER_SIZE], const uint8_t fp[KVB_HASH],
		     const uint8_t hash[KVB_HASH], const uint8_t *parent, const struct kvb_geom *g,
		     const int32_t *ids, uint32_t ntokens, uint64_t file_size,
		     struct kvb_header *h);

/* Checks the payload's CRC32C against the header's. 0 or -EBADMSG. */
int kvb_payload_check(const struct kvb_header *h, const void *payload, uint64_t len);
uint32_t kvb_payload_crc(const void *payload, uint64_t len);

/* "<fp hex>/<first 2 hex of h>/<h hex>.kvb" relative to the cache directory. cap >= 140. */
int kvb_path(const uint8_t fp[KVB_HASH], const uint8_t h[KVB_HASH], char *out, size_t cap);
void kvb_hex(const uint8_t *b, size_t n, char *out);

#endif
