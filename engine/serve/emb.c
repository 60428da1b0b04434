/* emb — an image's embeddings, cached in the kv dir (emb.h). */
#define KVFS_LOG_TAG "emb"
#include "emb.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kve.h"
#include "log.h"
#include "vit.h"

/* Changes when the preprocessing (img_preprocess's resize or normalisation) does: cached
 * embeddings made with another one are then other entries. */
#define PREP_VERSION "kvfs-vit-prep-v1 img_preprocess bicubic-stretch"

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

int emb_tower_fp(const struct vit *v, uint8_t out[KVB_HASH])
{
	unsigned int len = KVB_HASH;
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) &&
		 EVP_DigestUpdate(c, PREP_VERSION, sizeof(PREP_VERSION) - 1) &&
		 EVP_DigestUpdate(c, vit_fingerprint(v), VIT_FINGERPRINT_BYTES) &&
		 EVP_DigestFinal_ex(c, out, &len);
	EVP_MD_CTX_free(c);
	return ok ? 0 : -EIO;
}

int emb_image(struct vit *v, pthread_mutex_t *mu, const uint8_t fp[KVB_HASH], const char *dir,
	      int on_kvfs, const char *salt, const struct img_image *im, float *rows,
	      struct emb_stat *st)
{
	int nt = vit_n_tokens(v), E = vit_n_embd_out(v);
	uint8_t salt_d[KVB_HASH];
	kvb_salt_digest(salt, salt_d);
	st->cached = 0;
	st->enc_ns = 0;
	_Atomic int *waiting = st->waiting;
	int cache = dir && *dir;
	if (cache && kve_load(dir, fp, salt_d, im->hash, (uint32_t)nt, (uint32_t)E, rows) == 0) {
		st->cached = 1;
		return 0;
	}
	int size = vit_image_size(v);
	struct img_prep p = {.size = size};
	vit_image_mean(v, p.mean);
	vit_image_std(v, p.std);
	float *px = malloc((size_t)3 * (size_t)size * (size_t)size * sizeof(float));
	if (!px)
		return -ENOMEM;
	int rc = img_preprocess(im, &p, px);
	if (!rc) {
		uint64_t t0 = now_ns();
		if (waiting)
			atomic_fetch_add(waiting, 1);
		pthread_mutex_lock(mu);
		if (waiting)
			atomic_fetch_sub(waiting, 1);
		rc = vit_encode(v, px, rows);
		pthread_mutex_unlock(mu);
		st->enc_ns = now_ns() - t0;
	}
	free(px);
	if (rc)
		return rc == -ERANGE ? -EINVAL : rc;
	if (cache) {
		int sr =
		    kve_save(dir, on_kvfs, fp, salt_d, im->hash, (uint32_t)nt, (uint32_t)E, rows);
		if (sr < 0)
			klog_warn("saving an image's embeddings: %s", strerror(-sr));
	}
	return 0;
}
