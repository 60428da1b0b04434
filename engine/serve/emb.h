/* emb — one vision tower's image embeddings as both serving forms make them: the tower's cache
 * fingerprint (the kve.h key's tower_fp) and an image's embeddings, from the kv dir when an
 * earlier request left them there, else encoded and saved. The embedded server (sch_vision.c)
 * and `kvinfer encode` workers (wk_enc.c) both go through here, so an entry one of them wrote
 * is the entry the other looks up.
 *
 * Thread-safety: emb_image may run on any number of threads; encodes are serialised on the
 * caller's mutex (vit_encode: one at a time per tower). Errors: 0 or a negative errno. */
#ifndef KVFS_EMB_H
#define KVFS_EMB_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "img.h"
#include "kvb.h"

struct vit;

/* SHA-256 of the preprocessing's version and vit_fingerprint(v): cached embeddings made by
 * another tower or another preprocessing are other entries. 0 or -EIO. */
int emb_tower_fp(const struct vit *v, uint8_t out[KVB_HASH]);

/* What one emb_image did. waiting (the caller's, may be NULL) counts the calls waiting for
 * the tower right now: an encoder's queue. */
struct emb_stat {
	_Atomic int *waiting;
	int cached;	 /* 1: from the kv dir, no encoding */
	uint64_t enc_ns; /* time encoding (waiting for mu included); 0 when cached */
};

/* The embeddings of im (vit_n_tokens(v) x vit_n_embd_out(v) floats into rows): kve_load from
 * dir (NULL or "": no cache), else img_preprocess + vit_encode under mu, then kve_save (a
 * failed save is logged: it costs the next request an encode, nothing else). fp is
 * emb_tower_fp(v); salt the tenant's (NULL = none); on_kvfs as kve_save's. -EINVAL for an
 * image the tower cannot take (non-finite embeddings), -ENOMEM. */
int emb_image(struct vit *v, pthread_mutex_t *mu, const uint8_t fp[KVB_HASH], const char *dir,
	      int on_kvfs, const char *salt, const struct img_image *im, float *rows,
	      struct emb_stat *st);

#endif
