/* gguf_impl — private to gguf.c / gguf_meta.c: the parsed-file structure and the parser's
 * helpers gguf_meta.c uses (gguf_meta.c -> gguf.c, never the reverse). Offsets point into
 * base[0..len); every one was bounds-checked by the parser, so accessors read without checks. */
#ifndef KVFS_KVI_GGUF_IMPL_H
#define KVFS_KVI_GGUF_IMPL_H

#include "gguf.h"

#include <stddef.h>
#include <stdint.h>

struct kv {
	char *key;
	uint32_t type;
	size_t off;	    /* value bytes (for arrays: first element) */
	uint32_t arr_type;  /* arrays only */
	uint64_t arr_count; /* arrays only */
	size_t *str_offs;   /* string arrays: offset of each element's length field */
};

struct kvi_gguf {
	const uint8_t *base;
	size_t len;
	int mapped;
	uint32_t version;
	uint32_t alignment;
	size_t data_off;
	struct kv *kvs;
	size_t n_kv;
	struct kvi_gguf_tensor *tensors;
	size_t n_tensors;
	uint32_t *kv_hash; /* open addressing, index+1, 0 = empty; size kv_hmask+1 */
	size_t kv_hmask;
	uint32_t *t_hash;
	size_t t_hmask;
};

/* Bytes of a scalar value type; 0 for string, array and unknown types. */
size_t kvi_gguf_scalar_size(uint32_t t);
/* FNV-1a of a NUL-terminated name (the key / tensor-name hash tables). */
uint64_t kvi_gguf_hash(const char *s);
/* Integer value of a scalar of type t at p, as sign + magnitude. -EINVAL if not an integer. */
int kvi_gguf_int_at(const uint8_t *p, uint32_t t, int *neg, uint64_t *mag);

#endif
