/* gguf_meta — typed access to a parsed GGUF's metadata and tensor table. Every value offset was
 * validated at open, so these only check types and indexes. Layering: this file calls gguf.c
 * (the parser, which owns the key lookup and integer decoding it needs itself for
 * general.alignment), never the reverse. */
#include "gguf.h"
#include "gguf_impl.h"

#include <errno.h>
#include <string.h>

size_t kvi_gguf_n_kv(const struct kvi_gguf *g)
{
	return g->n_kv;
}

const char *kvi_gguf_kv_key(const struct kvi_gguf *g, size_t i)
{
	return i < g->n_kv ? g->kvs[i].key : NULL;
}

enum kvi_gguf_type kvi_gguf_kv_type(const struct kvi_gguf *g, size_t i)
{
	return i < g->n_kv ? (enum kvi_gguf_type)g->kvs[i].type : (enum kvi_gguf_type) - 1;
}

static const struct kv *find(const struct kvi_gguf *g, const char *key)
{
	int64_t i = kvi_gguf_find_kv(g, key);
	return i < 0 ? NULL : &g->kvs[i];
}

static int get_int(const struct kvi_gguf *g, const char *key, int *neg, uint64_t *mag)
{
	const struct kv *kv = find(g, key);
	if (!kv)
		return -ENOENT;
	return kvi_gguf_int_at(g->base + kv->off, kv->type, neg, mag);
}

int kvi_gguf_get_u64(const struct kvi_gguf *g, const char *key, uint64_t *out)
{
	int neg;
	uint64_t m;
	int ret = get_int(g, key, &neg, &m);
	if (ret)
		return ret;
	if (neg)
		return -ERANGE;
	*out = m;
	return 0;
}

static int to_i32(int neg, uint64_t m, int32_t *out)
{
	if ((!neg && m > INT32_MAX) || (neg && m > (uint64_t)INT32_MAX + 1))
		return -ERANGE;
	*out = neg ? (int32_t)(-(int64_t)m) : (int32_t)m;
	return 0;
}

int kvi_gguf_get_i32(const struct kvi_gguf *g, const char *key, int32_t *out)
{
	int neg;
	uint64_t m;
	int ret = get_int(g, key, &neg, &m);
	return ret ? ret : to_i32(neg, m, out);
}

int kvi_gguf_get_f32(const struct kvi_gguf *g, const char *key, float *out)
{
	const struct kv *kv = find(g, key);
	if (!kv)
		return -ENOENT;
	if (kv->type == KVI_GGUF_F32) {
		memcpy(out, g->base + kv->off, 4);
	} else if (kv->type == KVI_GGUF_F64) {
		double d;
		memcpy(&d, g->base + kv->off, 8);
		*out = (float)d;
	} else {
		return -EINVAL;
	}
	return 0;
}

int kvi_gguf_get_bool(const struct kvi_gguf *g, const char *key, int *out)
{
	const struct kv *kv = find(g, key);
	if (!kv)
		return -ENOENT;
	if (kv->type != KVI_GGUF_BOOL)
		return -EINVAL;
	*out = g->base[kv->off] != 0;
	return 0;
}

int kvi_gguf_get_str(const struct kvi_gguf *g, const char *key, const char **s, size_t *len)
{
	const struct kv *kv = find(g, key);
	if (!kv)
		return -ENOENT;
	if (kv->type != KVI_GGUF_STRING)
		return -EINVAL;
	uint64_t n;
	memcpy(&n, g->base + kv->off, 8);
	*s = (const char *)g->base + kv->off + 8;
	*len = (size_t)n;
	return 0;
}

int kvi_gguf_get_strcpy(const struct kvi_gguf *g, const char *key, char *buf, size_t cap)
{
	const char *s;
	size_t n;
	int ret = kvi_gguf_get_str(g, key, &s, &n);
	if (ret)
		return ret;
	if (n >= cap)
		return -ERANGE;
	memcpy(buf, s, n);
	buf[n] = 0;
	return 0;
}

int kvi_gguf_get_arr(const struct kvi_gguf *g, const char *key, enum kvi_gguf_type *elem,
		     uint64_t *count)
{
	const struct kv *kv = find(g, key);
	if (!kv)
		return -ENOENT;
	if (kv->type != KVI_GGUF_ARRAY)
		return -EINVAL;
	if (elem)
		*elem = (enum kvi_gguf_type)kv->arr_type;
	if (count)
		*count = kv->arr_count;
	return 0;
}

static const struct kv *arr_kv(const struct kvi_gguf *g, int64_t kvi, uint64_t i, int *ret)
{
	if (kvi < 0 || (size_t)kvi >= g->n_kv || g->kvs[kvi].type != KVI_GGUF_ARRAY) {
		*ret = -EINVAL;
		return NULL;
	}
	if (i >= g->kvs[kvi].arr_count) {
		*ret = -ERANGE;
		return NULL;
	}
	return &g->kvs[kvi];
}

int kvi_gguf_arr_str(const struct kvi_gguf *g, int64_t kvi, uint64_t i, const char **s, size_t *len)
{
	int ret = 0;
	const struct kv *kv = arr_kv(g, kvi, i, &ret);
	if (!kv)
		return ret;
	if (kv->arr_type != KVI_GGUF_STRING)
		return -EINVAL;
	uint64_t n;
	memcpy(&n, g->base + kv->str_offs[i], 8);
	*s = (const char *)g->base + kv->str_offs[i] + 8;
	*len = (size_t)n;
	return 0;
}

int kvi_gguf_arr_f32(const struct kvi_gguf *g, int64_t kvi, uint64_t i, float *out)
{
	int ret = 0;
	const struct kv *kv = arr_kv(g, kvi, i, &ret);
	if (!kv)
		return ret;
	if (kv->arr_type == KVI_GGUF_F32) {
		memcpy(out, g->base + kv->off + i * 4, 4);
	} else if (kv->arr_type == KVI_GGUF_F64) {
		double d;
		memcpy(&d, g->base + kv->off + i * 8, 8);
		*out = (float)d;
	} else {
		return -EINVAL;
	}
	return 0;
}

int kvi_gguf_arr_i32(const struct kvi_gguf *g, int64_t kvi, uint64_t i, int32_t *out)
{
	int ret = 0;
	const struct kv *kv = arr_kv(g, kvi, i, &ret);
	if (!kv)
		return ret;
	size_t esz = kvi_gguf_scalar_size(kv->arr_type);
	int neg;
	uint64_t m;
	if (!esz || kvi_gguf_int_at(g->base + kv->off + i * esz, kv->arr_type, &neg, &m))
		return -EINVAL;
	return to_i32(neg, m, out);
}

size_t kvi_gguf_n_tensors(const struct kvi_gguf *g)
{
	return g->n_tensors;
}

const struct kvi_gguf_tensor *kvi_gguf_tensor(const struct kvi_gguf *g, size_t i)
{
	return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const struct kvi_gguf_tensor *kvi_gguf_find_tensor(const struct kvi_gguf *g, const char *name)
{
	if (!g->t_hash)
		return NULL;
	size_t h = kvi_gguf_hash(name) & g->t_hmask;
	while (g->t_hash[h]) {
		size_t i = g->t_hash[h] - 1;
		if (!strcmp(g->tensors[i].name, name))
			return &g->tensors[i];
		h = (h + 1) & g->t_hmask;
	}
	return NULL;
}
