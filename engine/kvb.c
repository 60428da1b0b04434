#include "kvb.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>

#include "kvb_int.h"
#include "kvec.h"

/* Header layout (little-endian), offsets in bytes:
 *   0 u32 magic  4 u16 version  6 u16 header_size  8 fingerprint[32]  40 hash[32]
 *  72 parent[32]  104 u32 n_layer  108 u32 n_head_kv  112 u32 head_dim  116 u32 dtype
 * 120 u32 block_tokens  124 u32 ntokens  128 u64 payload_bytes  136 u32 payload_crc
 * 140 u32 header_crc (CRC32C of the 4096 bytes with this field zero)  144 ids[ntokens] u32
 * rest zero. */
enum {
	O_MAGIC = 0,
	O_VER = 4,
	O_HSZ = 6,
	O_FP = 8,
	O_HASH = 40,
	O_PARENT = 72,
	O_GEOM = 104,
	O_NTOK = 124,
	O_PBYTES = 128,
	O_PCRC = 136,
	O_HCRC = 140,
	O_IDS = 144
};

static void sha256(const void *parts[], const size_t lens[], int n, uint8_t out[KVB_HASH])
{
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	EVP_DigestInit_ex(c, EVP_sha256(), NULL);
	for (int i = 0; i < n; i++)
		EVP_DigestUpdate(c, parts[i], lens[i]);
	unsigned int len = KVB_HASH;
	EVP_DigestFinal_ex(c, out, &len);
	EVP_MD_CTX_free(c);
}

void kvb_fingerprint(const uint8_t model_fp[KVB_HASH], const struct kvb_geom *g,
		     uint8_t out[KVB_HASH])
{
	uint8_t geo[20];
	kvb_put32(geo, g->n_layer);
	kvb_put32(geo + 4, g->n_head_kv);
	kvb_put32(geo + 8, g->head_dim);
	kvb_put32(geo + 12, g->dtype);
	kvb_put32(geo + 16, g->block_tokens);
	const void *p[] = {"kvfs-cache-fp-v1", model_fp, geo};
	const size_t l[] = {16, KVB_HASH, sizeof(geo)};
	sha256(p, l, 3, out);
}

void kvb_salt_digest(const char *salt, uint8_t out[KVB_HASH])
{
	const void *p[] = {"kvfs-salt-v1", salt ? salt : ""};
	const size_t l[] = {12, salt ? strlen(salt) : 0};
	sha256(p, l, 2, out);
}

void kvb_block_hash(const uint8_t *parent, const uint8_t fp[KVB_HASH],
		    const uint8_t salt_d[KVB_HASH], const int32_t *ids, uint32_t n,
		    uint8_t out[KVB_HASH])
{
	kvb_block_hash_images(parent, fp, salt_d, ids, n, 0, NULL, 0, out);
}

void kvb_block_hash_images(const uint8_t *parent, const uint8_t fp[KVB_HASH],
			   const uint8_t salt_d[KVB_HASH], const int32_t *ids, uint32_t n,
			   uint32_t start, const struct kvb_image *img, int nimg,
			   uint8_t out[KVB_HASH])
{
	static const uint8_t zero[KVB_HASH];
	uint8_t nb[4], idb[4 * 64];
	kvb_put32(nb, n);
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	EVP_DigestInit_ex(c, EVP_sha256(), NULL);
	EVP_DigestUpdate(c, "kvfs-block-v1", 13);
	EVP_DigestUpdate(c, parent ? parent : zero, KVB_HASH);
	EVP_DigestUpdate(c, fp, KVB_HASH);
	EVP_DigestUpdate(c, salt_d, KVB_HASH);
	EVP_DigestUpdate(c, nb, 4);
	/* ids as little-endian u32, in pieces so no allocation is needed */
	for (uint32_t i = 0; i < n; i += 64) {
		uint32_t m = n - i < 64 ? n - i : 64;
		for (uint32_t j = 0; j < m; j++)
			kvb_put32(idb + 4 * j, (uint32_t)ids[i + j]);
		EVP_DigestUpdate(c, idb, 4 * m);
	}
	/* Each overlapping image: a fixed-length record after the ids, whose count is fixed by
	 * n, so the input stays unambiguous and an image-free block hashes as before. */
	uint64_t end = (uint64_t)start + n;
	for (int k = 0; k < nimg; k++) {
		uint64_t a = img[k].pos, b = a + img[k].n;
		if (b <= start || a >= end)
			continue;
		uint64_t from = a > start ? a : start, to = b < end ? b : end;
		uint8_t r[12];
		kvb_put32(r, (uint32_t)(from - start));
		kvb_put32(r + 4, (uint32_t)(from - a));
		kvb_put32(r + 8, (uint32_t)(to - from));
		EVP_DigestUpdate(c, "kvfs-img-v1", 11);
		EVP_DigestUpdate(c, r, sizeof(r));
		EVP_DigestUpdate(c, img[k].hash, KVB_HASH);
	}
	unsigned int len = KVB_HASH;
	EVP_DigestFinal_ex(c, out, &len);
	EVP_MD_CTX_free(c);
}

int kvb_chain(const uint8_t fp[KVB_HASH], const uint8_t salt_d[KVB_HASH], const int32_t *ids,
	      int n_tokens, int B, uint8_t (*out)[KVB_HASH], int max_out)
{
	return kvb_chain_images(fp, salt_d, ids, n_tokens, B, NULL, 0, out, max_out);
}

int kvb_chain_images(const uint8_t fp[KVB_HASH], const uint8_t salt_d[KVB_HASH], const int32_t *ids,
		     int n_tokens, int B, const struct kvb_image *img, int nimg,
		     uint8_t (*out)[KVB_HASH], int max_out)
{
	if (B <= 0 || n_tokens < 0 || nimg < 0 || (nimg && !img))
		return -EINVAL;
	uint64_t prev_end = 0;
	for (int k = 0; k < nimg; k++) {
		uint64_t a = img[k].pos, b = a + img[k].n;
		if (img[k].n == 0 || b > (uint64_t)n_tokens || a < prev_end)
			return -EINVAL;
		prev_end = b;
	}
	int n = n_tokens / B;
	if (n > max_out)
		n = max_out;
	for (int i = 0; i < n; i++)
		kvb_block_hash_images(i ? out[i - 1] : NULL, fp, salt_d, ids + (size_t)i * B,
				      (uint32_t)B, (uint32_t)i * (uint32_t)B, img, nimg, out[i]);
	return n;
}

uint64_t kvb_payload_bytes(const struct kvb_geom *g)
{
	return (uint64_t)g->n_layer * 2 * g->block_tokens * g->n_head_kv * g->head_dim * 2;
}

uint32_t kvb_payload_crc(const void *payload, uint64_t len)
{
	return kvec_crc32c(0, payload, len);
}

static int geom_ok(const struct kvb_geom *g)
{
	return g->n_layer && g->n_layer <= 4096 && g->n_head_kv && g->n_head_kv <= 4096 &&
	       g->head_dim && g->head_dim <= 4096 && g->dtype == KVB_DTYPE_F16 && g->block_tokens &&
	       g->block_tokens <= KVB_MAX_TOKENS;
}

int kvb_header_write(const struct kvb_header *h, uint8_t out[KVB_HEADER_SIZE])
{
	if (!geom_ok(&h->geom) || h->ntokens == 0 || h->ntokens > h->geom.block_tokens ||
	    h->payload_bytes != kvb_payload_bytes(&h->geom))
		return -EINVAL;
	memset(out, 0, KVB_HEADER_SIZE);
	kvb_put32(out + O_MAGIC, KVB_MAGIC);
	out[O_VER] = KVB_VERSION;
	out[O_HSZ] = (uint8_t)(KVB_HEADER_SIZE & 0xFF);
	out[O_HSZ + 1] = (uint8_t)(KVB_HEADER_SIZE >> 8);
	memcpy(out + O_FP, h->fingerprint, KVB_HASH);
	memcpy(out + O_HASH, h->hash, KVB_HASH);
	memcpy(out + O_PARENT, h->parent, KVB_HASH);
	kvb_put32(out + O_GEOM, h->geom.n_layer);
	kvb_put32(out + O_GEOM + 4, h->geom.n_head_kv);
	kvb_put32(out + O_GEOM + 8, h->geom.head_dim);
	kvb_put32(out + O_GEOM + 12, h->geom.dtype);
	kvb_put32(out + O_GEOM + 16, h->geom.block_tokens);
	kvb_put32(out + O_NTOK, h->ntokens);
	kvb_put32(out + O_PBYTES, (uint32_t)h->payload_bytes);
	kvb_put32(out + O_PBYTES + 4, (uint32_t)(h->payload_bytes >> 32));
	kvb_put32(out + O_PCRC, h->payload_crc);
	for (uint32_t i = 0; i < h->ntokens; i++)
		kvb_put32(out + O_IDS + 4 * i, (uint32_t)h->tokens[i]);
	kvb_put32(out + O_HCRC, kvec_crc32c(0, out, KVB_HEADER_SIZE));
	return 0;
}

int kvb_header_check(const uint8_t in[KVB_HEADER_SIZE], const uint8_t fp[KVB_HASH],
		     const uint8_t hash[KVB_HASH], const uint8_t *parent, const struct kvb_geom *g,
		     const int32_t *ids, uint32_t ntokens, uint64_t file_size, struct kvb_header *h)
{
	static const uint8_t zero[KVB_HASH];
	if (kvb_get32(in + O_MAGIC) != KVB_MAGIC)
		return -EBADMSG;
	if (in[O_VER] != KVB_VERSION || in[O_VER + 1] != 0 ||
	    (in[O_HSZ] | (in[O_HSZ + 1] << 8)) != (int)KVB_HEADER_SIZE)
		return -EPROTO;
	/* CRC of the header with its own CRC field read as zero. */
	if (kvb_header_crc(in, KVB_HEADER_SIZE, O_HCRC) != kvb_get32(in + O_HCRC))
		return -EBADMSG;
	memcpy(h->fingerprint, in + O_FP, KVB_HASH);
	memcpy(h->hash, in + O_HASH, KVB_HASH);
	memcpy(h->parent, in + O_PARENT, KVB_HASH);
	h->geom.n_layer = kvb_get32(in + O_GEOM);
	h->geom.n_head_kv = kvb_get32(in + O_GEOM + 4);
	h->geom.head_dim = kvb_get32(in + O_GEOM + 8);
	h->geom.dtype = kvb_get32(in + O_GEOM + 12);
	h->geom.block_tokens = kvb_get32(in + O_GEOM + 16);
	h->ntokens = kvb_get32(in + O_NTOK);
	h->payload_bytes =
	    kvb_get32(in + O_PBYTES) | ((uint64_t)kvb_get32(in + O_PBYTES + 4) << 32);
	h->payload_crc = kvb_get32(in + O_PCRC);
	if (!geom_ok(&h->geom) || h->ntokens == 0 || h->ntokens > h->geom.block_tokens ||
	    h->payload_bytes != kvb_payload_bytes(&h->geom))
		return -EBADMSG;
	if (memcmp(h->fingerprint, fp, KVB_HASH) != 0 || memcmp(&h->geom, g, sizeof(*g)) != 0)
		return KVB_E_OTHER_MODEL;
	if (memcmp(h->hash, hash, KVB_HASH) != 0 ||
	    memcmp(h->parent, parent ? parent : zero, KVB_HASH) != 0 || h->ntokens != ntokens)
		return KVB_E_NOT_THIS;
	for (uint32_t i = 0; i < ntokens; i++) {
		h->tokens[i] = (int32_t)kvb_get32(in + O_IDS + 4 * i);
		if (h->tokens[i] != ids[i])
			return KVB_E_NOT_THIS;
	}
	if (file_size && file_size != KVB_HEADER_SIZE + h->payload_bytes)
		return -EIO;
	return 0;
}

const char *kvb_strerror(int err)
{
	switch (err) {
	case KVB_E_OTHER_MODEL:
		return "block of another model or KV geometry";
	case KVB_E_NOT_THIS:
		return "not this block (hash, parent or token ids differ)";
	default:
		return strerror(-err);
	}
}

int kvb_payload_check(const struct kvb_header *h, const void *payload, uint64_t len)
{
	if (len != h->payload_bytes || kvb_payload_crc(payload, len) != h->payload_crc)
		return -EBADMSG;
	return 0;
}

void kvb_hex(const uint8_t *b, size_t n, char *out)
{
	static const char hx[] = "0123456789abcdef";
	for (size_t i = 0; i < n; i++) {
		out[2 * i] = hx[b[i] >> 4];
		out[2 * i + 1] = hx[b[i] & 15];
	}
	out[2 * n] = 0;
}

int kvb_path(const uint8_t fp[KVB_HASH], const uint8_t h[KVB_HASH], char *out, size_t cap)
{
	char fph[2 * KVB_HASH + 1], hh[2 * KVB_HASH + 1];
	kvb_hex(fp, KVB_HASH, fph);
	kvb_hex(h, KVB_HASH, hh);
	int n = snprintf(out, cap, "%s/%.2s/%s.kvb", fph, hh, hh);
	return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}
