/* gguf — a validating, zero-copy reader of GGUF files (versions 2 and 3).
 *
 * The whole header (key/value metadata and tensor infos) is parsed and checked at open:
 * every length, count, type, dimension, offset and byte range, with no allocation larger than
 * the file can justify. Nothing is read outside the buffer afterwards. Tensor data pointers
 * and string pointers point into the file's read-only mapping (or the caller's buffer); GGUF
 * strings are not NUL-terminated, so strings come back as (pointer, length). Keys and tensor
 * names are copied and NUL-terminated (a key or name with an embedded NUL is rejected).
 *
 * Errors: open returns a negative errno (-EINVAL malformed, -ENOMEM, -errno of open/mmap) and
 * writes a message naming the offending key / tensor / field into err (errlen bytes, may be
 * NULL). Getters return 0, -ENOENT when the key is absent, -EINVAL when it has another type.
 *
 * The mapping is MAP_PRIVATE and read-only: a file truncated by someone else while it is mapped
 * makes later reads of the lost pages fault (SIGBUS), as with any mmap'd model; replace model
 * files by rename, never in place.
 *
 * Thread-safety: an opened kvi_gguf is immutable; concurrent readers need no locking.
 */
#ifndef KVFS_KVI_GGUF_H
#define KVFS_KVI_GGUF_H

#include <stddef.h>
#include <stdint.h>

struct kvi_model;

/* Metadata value types, GGUF's numbering. */
enum kvi_gguf_type {
	KVI_GGUF_U8 = 0,
	KVI_GGUF_I8 = 1,
	KVI_GGUF_U16 = 2,
	KVI_GGUF_I16 = 3,
	KVI_GGUF_U32 = 4,
	KVI_GGUF_I32 = 5,
	KVI_GGUF_F32 = 6,
	KVI_GGUF_BOOL = 7,
	KVI_GGUF_STRING = 8,
	KVI_GGUF_ARRAY = 9,
	KVI_GGUF_U64 = 10,
	KVI_GGUF_I64 = 11,
	KVI_GGUF_F64 = 12,
};

#define KVI_GGUF_MAX_DIMS	   4
#define KVI_GGUF_DEFAULT_ALIGNMENT 32

struct kvi_gguf_tensor {
	const char *name; /* NUL-terminated copy */
	uint32_t n_dims;  /* 1..4 */
	int64_t ne[4];	  /* ne[0] contiguous; unused dims are 1 */
	uint32_t type;	  /* ggml type id (enum kvi_dtype for the ones the engine computes) */
	uint64_t offset;  /* relative to the data section, aligned */
	const void *data; /* inside the mapping */
	size_t nbytes;	  /* from type and shape, checked to lie inside the file */
};

struct kvi_gguf;

/* Maps path read-only and parses it. *out is freed with kvi_gguf_close. */
int kvi_gguf_open(const char *path, struct kvi_gguf **out, char *err, size_t errlen);

/* Parses a caller-owned buffer; it is not copied and must outlive *out. */
int kvi_gguf_open_mem(const void *buf, size_t len, struct kvi_gguf **out, char *err, size_t errlen);

/* NULL is a no-op. */
void kvi_gguf_close(struct kvi_gguf *g);

uint32_t kvi_gguf_version(const struct kvi_gguf *g);
uint32_t kvi_gguf_alignment(const struct kvi_gguf *g);
/* The whole file / buffer. */
const void *kvi_gguf_base(const struct kvi_gguf *g, size_t *len);

/* ---- metadata ---- */
size_t kvi_gguf_n_kv(const struct kvi_gguf *g);
const char *kvi_gguf_kv_key(const struct kvi_gguf *g, size_t i);
enum kvi_gguf_type kvi_gguf_kv_type(const struct kvi_gguf *g, size_t i);
/* Index of key, or -ENOENT. */
int64_t kvi_gguf_find_kv(const struct kvi_gguf *g, const char *key);

/* Scalar getters. Integer getters accept any integer type whose value fits the result
 * (writers disagree on u32 vs i32 vs u64); f32 accepts f32 and f64; -ERANGE if it does not fit. */
int kvi_gguf_get_u32(const struct kvi_gguf *g, const char *key, uint32_t *out);
int kvi_gguf_get_i32(const struct kvi_gguf *g, const char *key, int32_t *out);
int kvi_gguf_get_u64(const struct kvi_gguf *g, const char *key, uint64_t *out);
int kvi_gguf_get_f32(const struct kvi_gguf *g, const char *key, float *out);
int kvi_gguf_get_bool(const struct kvi_gguf *g, const char *key, int *out);
/* String value: *s points into the file, not NUL-terminated. */
int kvi_gguf_get_str(const struct kvi_gguf *g, const char *key, const char **s, size_t *len);
/* Copies a string value NUL-terminated; -ERANGE if it does not fit in cap. */
int kvi_gguf_get_strcpy(const struct kvi_gguf *g, const char *key, char *buf, size_t cap);

/* Arrays: element type and count (-EINVAL if the key is not an array). Nested arrays are
 * validated at open but their elements are not accessible. */
int kvi_gguf_get_arr(const struct kvi_gguf *g, const char *key, enum kvi_gguf_type *elem,
		     uint64_t *count);
/* Element i of the array at kv index kv (from kvi_gguf_find_kv). -EINVAL on a type mismatch,
 * -ERANGE if i >= count. O(1). */
int kvi_gguf_arr_str(const struct kvi_gguf *g, int64_t kv, uint64_t i, const char **s, size_t *len);
int kvi_gguf_arr_f32(const struct kvi_gguf *g, int64_t kv, uint64_t i, float *out);
/* Any integer element type whose value fits an int32. */
int kvi_gguf_arr_i32(const struct kvi_gguf *g, int64_t kv, uint64_t i, int32_t *out);

/* ---- tensors ---- */
size_t kvi_gguf_n_tensors(const struct kvi_gguf *g);
const struct kvi_gguf_tensor *kvi_gguf_tensor(const struct kvi_gguf *g, size_t i);
/* NULL when absent. O(1) (hash). */
const struct kvi_gguf_tensor *kvi_gguf_find_tensor(const struct kvi_gguf *g, const char *name);

/* ggml type name ("F16", "Q8_0", ...), or NULL for a type this reader does not know. */
const char *kvi_gguf_type_name(uint32_t type);

/* ---- model glue (implemented in model.c) ---- */
/* The GGUF a loaded model was read from; NULL for a hand-built model. Lives as long as m. */
const struct kvi_gguf *kvi_model_gguf(const struct kvi_model *m);

/* Builds a model from an opened GGUF (kvi_model_load = kvi_gguf_open + this). Takes ownership
 * of g in every case (closed on error, by kvi_model_free otherwise). Same errors as
 * kvi_model_load. */
int kvi_model_from_gguf(struct kvi_gguf *g, struct kvi_model **out, char *err, size_t errlen);

/* Recomputes m->fingerprint from m->cfg and its tensors (the loader calls it; tests that build
 * a model by hand may too). See docs/gguf.md for the exact byte sequence hashed. Returns 0 or
 * -ENOMEM / -EIO (OpenSSL failure). */
int kvi_model_compute_fingerprint(struct kvi_model *m);

#endif
