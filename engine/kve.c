#include "kve.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvb_int.h"
#include "kvec.h"

/* The payload is the floats' memory as it is. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "kve files are little-endian");

/* Header layout (little-endian), offsets in bytes:
 *   0 u32 magic  4 u16 version  6 u16 header_size  8 tower_fp[32]  40 key[32]  72 img[32]
 * 104 u32 n_tokens  108 u32 dim  112 u32 dtype  116 u64 payload_bytes  124 u32 payload_crc
 * 128 u32 header_crc (CRC32C of the 4096 bytes with this field zero); rest zero. */
enum {
	O_MAGIC = 0,
	O_VER = 4,
	O_HSZ = 6,
	O_FP = 8,
	O_KEY = 40,
	O_IMG = 72,
	O_NTOK = 104,
	O_DIM = 108,
	O_DTYPE = 112,
	O_PBYTES = 116,
	O_PCRC = 124,
	O_HCRC = 128
};

void kve_key(const uint8_t tower_fp[KVB_HASH], const uint8_t salt_d[KVB_HASH],
	     const uint8_t img[KVB_HASH], uint8_t out[KVB_HASH])
{
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	EVP_DigestInit_ex(c, EVP_sha256(), NULL);
	EVP_DigestUpdate(c, "kvfs-emb-v1", 11);
	EVP_DigestUpdate(c, tower_fp, KVB_HASH);
	EVP_DigestUpdate(c, salt_d, KVB_HASH);
	EVP_DigestUpdate(c, img, KVB_HASH);
	unsigned int len = KVB_HASH;
	EVP_DigestFinal_ex(c, out, &len);
	EVP_MD_CTX_free(c);
}

int kve_path(const uint8_t tower_fp[KVB_HASH], const uint8_t key[KVB_HASH], char *out, size_t cap)
{
	char f[2 * KVB_HASH + 1], k[2 * KVB_HASH + 1];
	kvb_hex(tower_fp, KVB_HASH, f);
	kvb_hex(key, KVB_HASH, k);
	int n = snprintf(out, cap, "%s/%.2s/%s.kve", f, k, k);
	return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

static int sizes_ok(uint32_t n_tokens, uint32_t dim, uint64_t payload_bytes)
{
	return n_tokens && n_tokens <= KVE_MAX_TOKENS && dim && dim <= KVE_MAX_DIM &&
	       payload_bytes == (uint64_t)n_tokens * dim * sizeof(float);
}

int kve_header_write(const struct kve_header *h, uint8_t out[KVE_HEADER_SIZE])
{
	if (!sizes_ok(h->n_tokens, h->dim, h->payload_bytes) || h->dtype != KVE_DTYPE_F32)
		return -EINVAL;
	memset(out, 0, KVE_HEADER_SIZE);
	kvb_put32(out + O_MAGIC, KVE_MAGIC);
	out[O_VER] = KVE_VERSION;
	out[O_HSZ] = (uint8_t)(KVE_HEADER_SIZE & 0xFF);
	out[O_HSZ + 1] = (uint8_t)(KVE_HEADER_SIZE >> 8);
	memcpy(out + O_FP, h->tower_fp, KVB_HASH);
	memcpy(out + O_KEY, h->key, KVB_HASH);
	memcpy(out + O_IMG, h->img, KVB_HASH);
	kvb_put32(out + O_NTOK, h->n_tokens);
	kvb_put32(out + O_DIM, h->dim);
	kvb_put32(out + O_DTYPE, h->dtype);
	kvb_put32(out + O_PBYTES, (uint32_t)h->payload_bytes);
	kvb_put32(out + O_PBYTES + 4, (uint32_t)(h->payload_bytes >> 32));
	kvb_put32(out + O_PCRC, h->payload_crc);
	kvb_put32(out + O_HCRC, kvec_crc32c(0, out, KVE_HEADER_SIZE));
	return 0;
}

int kve_header_check(const uint8_t in[KVE_HEADER_SIZE], const uint8_t tower_fp[KVB_HASH],
		     const uint8_t key[KVB_HASH], const uint8_t img[KVB_HASH], uint32_t n_tokens,
		     uint32_t dim, uint64_t file_size, struct kve_header *h)
{
	if (kvb_get32(in + O_MAGIC) != KVE_MAGIC)
		return -EBADMSG;
	if (in[O_VER] != KVE_VERSION || in[O_VER + 1] != 0 ||
	    (in[O_HSZ] | (in[O_HSZ + 1] << 8)) != (int)KVE_HEADER_SIZE)
		return -EPROTO;
	if (kvb_header_crc(in, KVE_HEADER_SIZE, O_HCRC) != kvb_get32(in + O_HCRC))
		return -EBADMSG;
	memcpy(h->tower_fp, in + O_FP, KVB_HASH);
	memcpy(h->key, in + O_KEY, KVB_HASH);
	memcpy(h->img, in + O_IMG, KVB_HASH);
	h->n_tokens = kvb_get32(in + O_NTOK);
	h->dim = kvb_get32(in + O_DIM);
	h->dtype = kvb_get32(in + O_DTYPE);
	h->payload_bytes =
	    kvb_get32(in + O_PBYTES) | ((uint64_t)kvb_get32(in + O_PBYTES + 4) << 32);
	h->payload_crc = kvb_get32(in + O_PCRC);
	if (!sizes_ok(h->n_tokens, h->dim, h->payload_bytes) || h->dtype != KVE_DTYPE_F32)
		return -EBADMSG;
	if (memcmp(h->tower_fp, tower_fp, KVB_HASH) != 0 || h->n_tokens != n_tokens ||
	    h->dim != dim)
		return KVB_E_OTHER_MODEL;
	if (memcmp(h->key, key, KVB_HASH) != 0 || memcmp(h->img, img, KVB_HASH) != 0)
		return KVB_E_NOT_THIS;
	if (file_size && file_size != KVE_HEADER_SIZE + h->payload_bytes)
		return -EIO;
	return 0;
}

/* mkdir -p of the entry's two directories under dir (EEXIST is fine). */
static int make_dirs(const char *dir, const char *rel)
{
	char p[PATH_MAX];
	const char *s1 = strchr(rel, '/'), *s2 = s1 ? strchr(s1 + 1, '/') : NULL;
	if (!s2)
		return -EINVAL;
	for (const char *end = s1; end; end = end == s1 ? s2 : NULL) {
		int n = snprintf(p, sizeof(p), "%s/%.*s", dir, (int)(end - rel), rel);
		if (n < 0 || (size_t)n >= sizeof(p))
			return -ENAMETOOLONG;
		if (mkdir(p, 0755) != 0 && errno != EEXIST)
			return -errno;
	}
	return 0;
}

static int write_all(int fd, const void *p, size_t n)
{
	for (size_t done = 0; done < n;) {
		ssize_t w = write(fd, (const char *)p + done, n - done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? -errno : -EIO;
		done += (size_t)w;
	}
	return 0;
}

static int read_all(int fd, void *p, size_t n)
{
	for (size_t done = 0; done < n;) {
		ssize_t r = read(fd, (char *)p + done, n - done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return r < 0 ? -errno : -EIO;
		done += (size_t)r;
	}
	return 0;
}

int kve_save(const char *dir, int on_kvfs, const uint8_t tower_fp[KVB_HASH],
	     const uint8_t salt_d[KVB_HASH], const uint8_t img[KVB_HASH], uint32_t n_tokens,
	     uint32_t dim, const float *emb)
{
	struct kve_header h = {.n_tokens = n_tokens, .dim = dim, .dtype = KVE_DTYPE_F32};
	h.payload_bytes = (uint64_t)n_tokens * dim * sizeof(float);
	memcpy(h.tower_fp, tower_fp, KVB_HASH);
	memcpy(h.img, img, KVB_HASH);
	kve_key(tower_fp, salt_d, img, h.key);
	if (!sizes_ok(n_tokens, dim, h.payload_bytes))
		return -EINVAL;
	h.payload_crc = kvec_crc32c(0, emb, h.payload_bytes);
	uint8_t *hb = malloc(KVE_HEADER_SIZE);
	if (!hb)
		return -ENOMEM;
	char rel[160], path[PATH_MAX], tmp[PATH_MAX];
	int rc = kve_header_write(&h, hb);
	if (!rc)
		rc = kve_path(tower_fp, h.key, rel, sizeof(rel));
	if (!rc)
		rc = make_dirs(dir, rel);
	int n = snprintf(path, sizeof(path), "%s/%s", dir, rel);
	if (!rc && (n < 0 || (size_t)n >= sizeof(path)))
		rc = -ENAMETOOLONG;
	/* elsewhere than kvfs a reader could see a half-written file under the final name */
	n = on_kvfs ? snprintf(tmp, sizeof(tmp), "%s", path)
		    : snprintf(tmp, sizeof(tmp), "%s.tmp.%d.%lx", path, (int)getpid(),
			       (unsigned long)pthread_self());
	if (!rc && (n < 0 || (size_t)n >= sizeof(tmp)))
		rc = -ENAMETOOLONG;
	int fd = -1;
	if (!rc) {
		fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		if (fd < 0)
			rc = errno == EEXIST && on_kvfs ? 1 : -errno;
	}
	if (fd >= 0) {
		rc = write_all(fd, hb, KVE_HEADER_SIZE);
		if (!rc)
			rc = write_all(fd, emb, h.payload_bytes);
		if (close(fd) != 0 && !rc)
			rc = -errno; /* kvfs publishes at close: its failure is the write's */
		if (rc) {
			unlink(tmp); /* ours (O_EXCL): never another writer's file */
		} else if (!on_kvfs) {
			if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) != 0) {
				int e = errno;
				if (e == EINVAL || e == ENOSYS) /* link never replaces either */
					e = link(tmp, path) == 0 ? 0 : errno;
				unlink(tmp);
				rc = e == 0 ? 0 : e == EEXIST ? 1 : -e;
			}
		}
	}
	free(hb);
	return rc;
}

int kve_load(const char *dir, const uint8_t tower_fp[KVB_HASH], const uint8_t salt_d[KVB_HASH],
	     const uint8_t img[KVB_HASH], uint32_t n_tokens, uint32_t dim, float *out)
{
	uint8_t key[KVB_HASH];
	kve_key(tower_fp, salt_d, img, key);
	char rel[160], path[PATH_MAX];
	int rc = kve_path(tower_fp, key, rel, sizeof(rel));
	if (rc)
		return rc;
	int n = snprintf(path, sizeof(path), "%s/%s", dir, rel);
	if (n < 0 || (size_t)n >= sizeof(path))
		return -ENAMETOOLONG;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	uint8_t *hb = malloc(KVE_HEADER_SIZE);
	struct stat st;
	struct kve_header h;
	rc = !hb ? -ENOMEM : fstat(fd, &st) != 0 ? -errno : 0;
	if (!rc && (uint64_t)st.st_size < KVE_HEADER_SIZE)
		rc = -EIO;
	if (!rc)
		rc = read_all(fd, hb, KVE_HEADER_SIZE);
	if (!rc)
		rc = kve_header_check(hb, tower_fp, key, img, n_tokens, dim, (uint64_t)st.st_size,
				      &h);
	if (!rc)
		rc = read_all(fd, out, h.payload_bytes);
	if (!rc && kvec_crc32c(0, out, h.payload_bytes) != h.payload_crc)
		rc = -EBADMSG;
	free(hb);
	close(fd);
	return rc;
}
