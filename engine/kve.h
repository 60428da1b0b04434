/* kve — cached image embeddings: what the vision tower made of one image, as a file beside the
 * KV blocks (docs/kv-block-format.md, "Image embeddings"), so a repeated image is never encoded
 * twice, by any engine sharing the kv dir.
 *
 * Identity: key = SHA-256("kvfs-emb-v1" ‖ tower_fp ‖ salt_d ‖ img), where tower_fp is the
 * tower's fingerprint (its weights and preprocessing), salt_d the tenant's salt digest
 * (kvb_salt_digest) and img the SHA-256 of the decoded pixels (never of the base64: the same
 * picture sent as PNG or WebP is one entry). Path "<tower_fp hex>/<2 hex of key>/<key
 * hex>.kve" under the kv dir.
 *
 * A file is a 4096-byte header (magic "KVE1", version, tower_fp, key, img, n_tokens, dim,
 * dtype, payload size, CRC32Cs of payload and header) and the payload: n_tokens × dim floats,
 * little-endian F32. The reader checks everything it expects, as for KV blocks: anything wrong
 * is a miss, never loaded. Publication is atomic: on a kvfs mount the file appears whole at
 * close; elsewhere it is written under a temporary name and renamed without replacing.
 * Thread-safe; no state. */
#ifndef KVFS_KVE_H
#define KVFS_KVE_H

#include <stddef.h>
#include <stdint.h>

#include "kvb.h"

#define KVE_HEADER_SIZE 4096u
#define KVE_MAGIC	0x3145564Bu /* "KVE1" */
#define KVE_VERSION	1
#define KVE_DTYPE_F32	1
#define KVE_MAX_TOKENS	16384u
#define KVE_MAX_DIM	65536u

struct kve_header {
	uint8_t tower_fp[KVB_HASH];
	uint8_t key[KVB_HASH];
	uint8_t img[KVB_HASH];
	uint32_t n_tokens, dim, dtype;
	uint64_t payload_bytes; /* n_tokens * dim * 4 */
	uint32_t payload_crc;
};

void kve_key(const uint8_t tower_fp[KVB_HASH], const uint8_t salt_d[KVB_HASH],
	     const uint8_t img[KVB_HASH], uint8_t out[KVB_HASH]);
/* "<tower_fp hex>/<2 hex>/<key hex>.kve" relative to the kv dir. cap >= 140; -ENAMETOOLONG. */
int kve_path(const uint8_t tower_fp[KVB_HASH], const uint8_t key[KVB_HASH], char *out, size_t cap);

/* Fills a header from h (payload_bytes and payload_crc as given). -EINVAL for bad sizes. */
int kve_header_write(const struct kve_header *h, uint8_t out[KVE_HEADER_SIZE]);
/* Parses and checks a header against what the reader expects. file_size (if not 0) must be
 * header + payload. 0, -EBADMSG (garbage, CRC), -EPROTO (version), KVB_E_OTHER_MODEL (another
 * tower fingerprint, n_tokens or dim), KVB_E_NOT_THIS (key or img differ), -EIO (size). */
int kve_header_check(const uint8_t in[KVE_HEADER_SIZE], const uint8_t tower_fp[KVB_HASH],
		     const uint8_t key[KVB_HASH], const uint8_t img[KVB_HASH], uint32_t n_tokens,
		     uint32_t dim, uint64_t file_size, struct kve_header *h);

/* Writes the embeddings of image img (n_tokens × dim floats) under dir, making the
 * directories. on_kvfs: dir is a kvfs mount (kvx_dir_on_kvfs), published by close; else a
 * temporary name renamed without replacing. 0 when written, 1 when the entry was already there
 * (another writer was first: never replaced), or a negative errno (nothing left behind). */
int kve_save(const char *dir, int on_kvfs, const uint8_t tower_fp[KVB_HASH],
	     const uint8_t salt_d[KVB_HASH], const uint8_t img[KVB_HASH], uint32_t n_tokens,
	     uint32_t dim, const float *emb);
/* Reads the entry for img into out (n_tokens × dim floats, the caller's). 0 on a hit,
 * -ENOENT when absent, or why the file was not used (kve_header_check's results, -EBADMSG for
 * a payload failing its CRC, -errno): a miss either way, out then unspecified. */
int kve_load(const char *dir, const uint8_t tower_fp[KVB_HASH], const uint8_t salt_d[KVB_HASH],
	     const uint8_t img[KVB_HASH], uint32_t n_tokens, uint32_t dim, float *out);

#endif
