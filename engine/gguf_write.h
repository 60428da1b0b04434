/* gguf_write — builds GGUF v3 files: in memory (tests, fuzz seeds) or streamed to disk with
 * tensor data produced row by row by a callback (multi-GB synthetic models never sit in memory).
 *
 * Usage: create, add metadata and tensor descriptions in the order they are to appear, then
 * write once. Tensors may carry data (copied when written; must stay valid until then) or NULL
 * (their rows come from the fill callback). Only the engine's types (F32, F16, BF16, Q8_0)
 * can be written. Calls return 0 or a negative errno (-EINVAL bad argument, -ENOMEM, -EIO).
 * Not thread-safe; one writer per thread.
 */
#ifndef KVFS_KVI_GGUF_WRITE_H
#define KVFS_KVI_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>

struct kvi_gguf_writer;

int kvi_gguf_writer_create(struct kvi_gguf_writer **out);
void kvi_gguf_writer_free(struct kvi_gguf_writer *w); /* NULL is a no-op */

/* Metadata (keys are not checked for duplicates: tests write hostile files with this too). */
int kvi_gguf_w_u32(struct kvi_gguf_writer *w, const char *key, uint32_t v);
int kvi_gguf_w_i32(struct kvi_gguf_writer *w, const char *key, int32_t v);
int kvi_gguf_w_u64(struct kvi_gguf_writer *w, const char *key, uint64_t v);
int kvi_gguf_w_f32(struct kvi_gguf_writer *w, const char *key, float v);
int kvi_gguf_w_bool(struct kvi_gguf_writer *w, const char *key, int v);
int kvi_gguf_w_str(struct kvi_gguf_writer *w, const char *key, const char *v);
/* Arrays: strings are NUL-terminated. */
int kvi_gguf_w_arr_str(struct kvi_gguf_writer *w, const char *key, const char *const *v, size_t n);
int kvi_gguf_w_arr_f32(struct kvi_gguf_writer *w, const char *key, const float *v, size_t n);
int kvi_gguf_w_arr_i32(struct kvi_gguf_writer *w, const char *key, const int32_t *v, size_t n);
/* Sets the data alignment (power of two) and writes general.alignment. Default 32. */
int kvi_gguf_w_alignment(struct kvi_gguf_writer *w, uint32_t align);

/* Describes a tensor of n_dims (1..4) dims ne[] of ggml type `type`; data is NULL or
 * nbytes long (see kvi_dtype_row_bytes). Returns the tensor's index (>= 0) or -errno. */
int kvi_gguf_w_tensor(struct kvi_gguf_writer *w, const char *name, uint32_t type, int n_dims,
		      const int64_t *ne, const void *data);

/* Produces rows [row0, row0 + nrows) of tensor `tensor` (rows of ne[0] elements) into buf.
 * Returns 0 or a negative errno, which aborts the write. */
typedef int (*kvi_gguf_fill_fn)(void *ctx, int tensor, int64_t row0, int64_t nrows, void *buf);

/* Writes the file (to path.tmp, then renamed). fill may be NULL when every tensor has data. */
int kvi_gguf_w_write_file(struct kvi_gguf_writer *w, const char *path, kvi_gguf_fill_fn fill,
			  void *ctx);

/* Writes the whole file into a malloc'd buffer (*buf, freed by the caller). Tensors without
 * data are filled by fill, or zeroed when fill is NULL. */
int kvi_gguf_w_write_mem(struct kvi_gguf_writer *w, kvi_gguf_fill_fn fill, void *ctx, void **buf,
			 size_t *len);

#endif
