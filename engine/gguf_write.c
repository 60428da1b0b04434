/* gguf_write — metadata is serialized into a byte buffer as it is added; tensor descriptions
 * are kept until the write, when offsets are laid out and data is streamed through a FILE
 * (a real file, or open_memstream for the in-memory variant). */
#include "gguf_write.h"

#include "gguf.h"
#include "model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK_BYTES (4u << 20)

struct wtensor {
	char *name;
	uint32_t type;
	int n_dims;
	int64_t ne[4];
	const void *data;
	size_t nbytes, row_bytes;
	int64_t rows;
	uint64_t offset;
};

struct kvi_gguf_writer {
	uint8_t *kv;
	size_t kv_len, kv_cap;
	uint64_t n_kv;
	struct wtensor *t;
	size_t n_t, t_cap;
	uint32_t align;
	int oom; /* a failed append poisons the writer: the final write reports -ENOMEM */
};

int kvi_gguf_writer_create(struct kvi_gguf_writer **out)
{
	struct kvi_gguf_writer *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->align = KVI_GGUF_DEFAULT_ALIGNMENT;
	*out = w;
	return 0;
}

void kvi_gguf_writer_free(struct kvi_gguf_writer *w)
{
	if (!w)
		return;
	for (size_t i = 0; i < w->n_t; i++)
		free(w->t[i].name);
	free(w->t);
	free(w->kv);
	free(w);
}

static void put(struct kvi_gguf_writer *w, const void *p, size_t n)
{
	if (w->oom)
		return;
	if (w->kv_len + n > w->kv_cap) {
		size_t nc = w->kv_cap ? w->kv_cap : 256;
		while (nc < w->kv_len + n)
			nc *= 2;
		uint8_t *q = realloc(w->kv, nc);
		if (!q) {
			w->oom = 1;
			return;
		}
		w->kv = q;
		w->kv_cap = nc;
	}
	memcpy(w->kv + w->kv_len, p, n);
	w->kv_len += n;
}

static void put_u32(struct kvi_gguf_writer *w, uint32_t v)
{
	put(w, &v, 4);
}

static void put_u64(struct kvi_gguf_writer *w, uint64_t v)
{
	put(w, &v, 8);
}

static void put_str(struct kvi_gguf_writer *w, const char *s)
{
	size_t n = strlen(s);
	put_u64(w, n);
	put(w, s, n);
}

static int key(struct kvi_gguf_writer *w, const char *k, uint32_t type)
{
	if (!k || !*k)
		return -EINVAL;
	put_str(w, k);
	put_u32(w, type);
	w->n_kv++;
	return w->oom ? -ENOMEM : 0;
}

int kvi_gguf_w_u32(struct kvi_gguf_writer *w, const char *k, uint32_t v)
{
	int ret = key(w, k, KVI_GGUF_U32);
	put_u32(w, v);
	return ret ? ret : w->oom ? -ENOMEM : 0;
}

int kvi_gguf_w_i32(struct kvi_gguf_writer *w, const char *k, int32_t v)
{
	int ret = key(w, k, KVI_GGUF_I32);
	put(w, &v, 4);
	return ret ? ret : w->oom ? -ENOMEM : 0;
}

int kvi_gguf_w_u64(struct kvi_gguf_writer *w, const char *k, uint64_t v)
{
	int ret = key(w, k, KVI_GGUF_U64);
	put_u64(w, v);
	return ret ? ret : w->oom ? -ENOMEM : 0;
}

int kvi_gguf_w_f32(struct kvi_gguf_writer *w, const char *k, float v)
{
	int ret = key(w, k, KVI_GGUF_F32);
	put(w, &v, 4);
	return ret ? ret : w->oom ? -ENOMEM : 0;
}

int kvi_gguf_w_bool(struct kvi_gguf_writer *w, const char *k, int v)
{
	int ret = key(w, k, KVI_GGUF_BOOL);
	uint8_t b = v != 0;
	put(w, &b, 1);
	return ret ? ret : w->oom ? -ENOMEM : 0;
}

int kvi_gguf_w_str(struct kvi_gguf_writer *w, const char *k, const char *v)
{
	int ret = key(w, k, KVI_GGUF_STRING);
	put_str(w, v);
	return ret ? ret : w->oom ? -ENOMEM : 0;
}

int kvi_gguf_w_arr_str(struct kvi_gguf_writer *w, const char *k, const char *const *v, size_t n)
{
	int ret = key(w, k, KVI_GGUF_ARRAY);
	put_u32(w, KVI_GGUF_STRING);
	put_u64(w, n);
	for (size_t i = 0; i < n; i++)
		put_str(w, v[i]);
	return ret ? ret : w->oom ? -ENOMEM : 0;
}

int kvi_gguf_w_arr_f32(struct kvi_gguf_writer *w, const char *k, const float *v, size_t n)
{
	int ret = key(w, k, KVI_GGUF_ARRAY);
	put_u32(w, KVI_GGUF_F32);
	put_u64(w, n);
	put(w, v, n * 4);
	return ret ? ret : w->oom ? -ENOMEM : 0;
}

int kvi_gguf_w_arr_i32(struct kvi_gguf_writer *w, const char *k, const int32_t *v, size_t n)
{
	int ret = key(w, k, KVI_GGUF_ARRAY);
	put_u32(w, KVI_GGUF_I32);
	put_u64(w, n);
	put(w, v, n * 4);
	return ret ? ret : w->oom ? -ENOMEM : 0;
}

int kvi_gguf_w_alignment(struct kvi_gguf_writer *w, uint32_t align)
{
	if (!align || (align & (align - 1)))
		return -EINVAL;
	w->align = align;
	return kvi_gguf_w_u32(w, "general.alignment", align);
}

int kvi_gguf_w_tensor(struct kvi_gguf_writer *w, const char *name, uint32_t type, int n_dims,
		      const int64_t *ne, const void *data)
{
	if (!name || !*name || n_dims < 1 || n_dims > 4)
		return -EINVAL;
	struct wtensor t = {.type = type, .n_dims = n_dims, .data = data, .rows = 1};
	for (int d = 0; d < 4; d++)
		t.ne[d] = d < n_dims ? ne[d] : 1;
	for (int d = 1; d < 4; d++) {
		if (t.ne[d] < 0 || __builtin_mul_overflow(t.rows, t.ne[d], &t.rows))
			return -EINVAL;
	}
	t.row_bytes = kvi_dtype_row_bytes((enum kvi_dtype)type, t.ne[0]);
	if (!t.row_bytes || __builtin_mul_overflow(t.row_bytes, (size_t)t.rows, &t.nbytes))
		return -EINVAL;
	if (w->n_t == w->t_cap) {
		size_t nc = w->t_cap ? w->t_cap * 2 : 64;
		struct wtensor *p = realloc(w->t, nc * sizeof(*p));
		if (!p)
			return -ENOMEM;
		w->t = p;
		w->t_cap = nc;
	}
	t.name = strdup(name);
	if (!t.name)
		return -ENOMEM;
	w->t[w->n_t] = t;
	return (int)w->n_t++;
}

static int pad(FILE *f, uint64_t pos, uint32_t align)
{
	static const uint8_t zeros[256];
	uint64_t n = (align - pos % align) % align;
	while (n) {
		size_t k = n > sizeof(zeros) ? sizeof(zeros) : (size_t)n;
		if (fwrite(zeros, 1, k, f) != k)
			return -EIO;
		n -= k;
	}
	return 0;
}

static int emit(struct kvi_gguf_writer *w, FILE *f, kvi_gguf_fill_fn fill, void *ctx)
{
	if (w->oom)
		return -ENOMEM;
	uint64_t pos = 4 + 4 + 8 + 8 + w->kv_len, off = 0;
	for (size_t i = 0; i < w->n_t; i++) {
		struct wtensor *t = &w->t[i];
		pos += 8 + strlen(t->name) + 4 + 8 * (uint64_t)t->n_dims + 4 + 8;
		t->offset = off;
		off += t->nbytes;
		off += (w->align - off % w->align) % w->align;
	}
	uint32_t ver = 3;
	uint64_t nt = w->n_t;
	if (fwrite("GGUF", 1, 4, f) != 4 || fwrite(&ver, 4, 1, f) != 1 ||
	    fwrite(&nt, 8, 1, f) != 1 || fwrite(&w->n_kv, 8, 1, f) != 1 ||
	    fwrite(w->kv, 1, w->kv_len, f) != w->kv_len)
		return -EIO;
	for (size_t i = 0; i < w->n_t; i++) {
		struct wtensor *t = &w->t[i];
		uint64_t nl = strlen(t->name), ne;
		uint32_t nd = (uint32_t)t->n_dims;
		if (fwrite(&nl, 8, 1, f) != 1 || fwrite(t->name, 1, nl, f) != nl ||
		    fwrite(&nd, 4, 1, f) != 1)
			return -EIO;
		for (int d = 0; d < t->n_dims; d++) {
			ne = (uint64_t)t->ne[d];
			if (fwrite(&ne, 8, 1, f) != 1)
				return -EIO;
		}
		if (fwrite(&t->type, 4, 1, f) != 1 || fwrite(&t->offset, 8, 1, f) != 1)
			return -EIO;
	}
	if (pad(f, pos, w->align))
		return -EIO;
	uint8_t *chunk = NULL;
	int ret = 0;
	for (size_t i = 0; i < w->n_t && !ret; i++) {
		struct wtensor *t = &w->t[i];
		if (t->data) {
			if (fwrite(t->data, 1, t->nbytes, f) != t->nbytes)
				ret = -EIO;
		} else if (t->nbytes) {
			int64_t per = t->row_bytes >= CHUNK_BYTES ? 1 : CHUNK_BYTES / t->row_bytes;
			if (!chunk) {
				size_t cap = CHUNK_BYTES;
				for (size_t j = 0; j < w->n_t; j++)
					if (w->t[j].row_bytes > cap)
						cap = w->t[j].row_bytes;
				chunk = malloc(cap);
				if (!chunk) {
					ret = -ENOMEM;
					break;
				}
			}
			for (int64_t r = 0; r < t->rows && !ret; r += per) {
				int64_t n = t->rows - r < per ? t->rows - r : per;
				size_t nb = (size_t)n * t->row_bytes;
				if (fill)
					ret = fill(ctx, (int)i, r, n, chunk);
				else
					memset(chunk, 0, nb);
				if (!ret && fwrite(chunk, 1, nb, f) != nb)
					ret = -EIO;
			}
		}
		if (!ret && i + 1 < w->n_t && pad(f, t->offset + t->nbytes, w->align))
			ret = -EIO;
	}
	free(chunk);
	return ret;
}

int kvi_gguf_w_write_file(struct kvi_gguf_writer *w, const char *path, kvi_gguf_fill_fn fill,
			  void *ctx)
{
	size_t pl = strlen(path);
	char *tmp = malloc(pl + 5);
	if (!tmp)
		return -ENOMEM;
	memcpy(tmp, path, pl);
	memcpy(tmp + pl, ".tmp", 5);
	FILE *f = fopen(tmp, "wb");
	if (!f) {
		int e = errno;
		free(tmp);
		return -e;
	}
	setvbuf(f, NULL, _IOFBF, 1 << 20);
	int ret = emit(w, f, fill, ctx);
	if (fclose(f) && !ret)
		ret = -EIO;
	if (!ret && rename(tmp, path))
		ret = -errno;
	if (ret)
		unlink(tmp);
	free(tmp);
	return ret;
}

int kvi_gguf_w_write_mem(struct kvi_gguf_writer *w, kvi_gguf_fill_fn fill, void *ctx, void **buf,
			 size_t *len)
{
	char *p = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&p, &n);
	if (!f)
		return -ENOMEM;
	int ret = emit(w, f, fill, ctx);
	if (fclose(f) && !ret)
		ret = -ENOMEM;
	if (ret) {
		free(p);
		return ret;
	}
	*buf = p;
	*len = n;
	return 0;
}
