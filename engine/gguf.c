/* gguf — validating GGUF reader. Every read goes through rd_* which checks the remaining
 * length first; allocations grow with what has actually been parsed, so a hostile count can
 * never make us allocate more than a small multiple of the file size. */
#include "gguf.h"
#include "gguf_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads little-endian fields with memcpy: port it before using a big-endian host"
#endif

#define MAX_KEY_LEN	 65535
#define MAX_NAME_LEN	 64 /* GGML_MAX_NAME, the limit the writers obey */
#define MAX_ARRAY_DEPTH	 8
#define MIN_KV_BYTES	 (8 + 1 + 4 + 1)	 /* key len, 1-byte key, type, u8 value */
#define MIN_TENSOR_BYTES (8 + 1 + 4 + 8 + 4 + 8) /* name len, name, n_dims, 1 dim, type, off */

struct rd {
	const uint8_t *p;
	size_t len, pos;
	char *err;
	size_t errlen;
};

static int fail(struct rd *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct rd *r, const char *fmt, ...)
{
	if (r->err && r->errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(r->err, r->errlen, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

static int rd_need(struct rd *r, size_t n, const char *what)
{
	if (r->len - r->pos < n)
		return fail(r, "truncated file: %s needs %zu bytes at offset %zu, file has %zu",
			    what, n, r->pos, r->len);
	return 0;
}

static int rd_u32(struct rd *r, uint32_t *v, const char *what)
{
	int ret = rd_need(r, 4, what);
	if (ret)
		return ret;
	memcpy(v, r->p + r->pos, 4);
	r->pos += 4;
	return 0;
}

static int rd_u64(struct rd *r, uint64_t *v, const char *what)
{
	int ret = rd_need(r, 8, what);
	if (ret)
		return ret;
	memcpy(v, r->p + r->pos, 8);
	r->pos += 8;
	return 0;
}

/* A string: u64 length then bytes. Returns its offset/length without copying. */
static int rd_str(struct rd *r, size_t *off, size_t *slen, const char *what)
{
	uint64_t n;
	int ret = rd_u64(r, &n, what);
	if (ret)
		return ret;
	if (n > r->len - r->pos)
		return fail(r, "%s: string length %llu at offset %zu runs past the end of the file",
			    what, (unsigned long long)n, r->pos - 8);
	*off = r->pos;
	*slen = (size_t)n;
	r->pos += (size_t)n;
	return 0;
}

size_t kvi_gguf_scalar_size(uint32_t t)
{
	switch (t) {
	case KVI_GGUF_U8:
	case KVI_GGUF_I8:
	case KVI_GGUF_BOOL:
		return 1;
	case KVI_GGUF_U16:
	case KVI_GGUF_I16:
		return 2;
	case KVI_GGUF_U32:
	case KVI_GGUF_I32:
	case KVI_GGUF_F32:
		return 4;
	case KVI_GGUF_U64:
	case KVI_GGUF_I64:
	case KVI_GGUF_F64:
		return 8;
	default:
		return 0;
	}
}

/* Validates one value of type t at r->pos and skips it. Arrays recurse (bounded depth). */
static int skip_value(struct rd *r, uint32_t t, int depth, const char *key)
{
	size_t sz = kvi_gguf_scalar_size(t);
	if (sz) {
		int ret = rd_need(r, sz, key);
		if (ret)
			return ret;
		if (t == KVI_GGUF_BOOL && r->p[r->pos] > 1)
			return fail(r, "key '%s': bool value %u is neither 0 nor 1", key,
				    r->p[r->pos]);
		r->pos += sz;
		return 0;
	}
	if (t == KVI_GGUF_STRING) {
		size_t o, n;
		return rd_str(r, &o, &n, key);
	}
	if (t != KVI_GGUF_ARRAY)
		return fail(r, "key '%s': unknown value type %u", key, t);
	if (depth >= MAX_ARRAY_DEPTH)
		return fail(r, "key '%s': arrays nested deeper than %d", key, MAX_ARRAY_DEPTH);
	uint32_t et;
	uint64_t cnt;
	int ret = rd_u32(r, &et, key);
	if (!ret)
		ret = rd_u64(r, &cnt, key);
	if (ret)
		return ret;
	size_t esz = kvi_gguf_scalar_size(et);
	size_t min = esz ? esz : et == KVI_GGUF_STRING ? 8 : et == KVI_GGUF_ARRAY ? 12 : 0;
	if (!min)
		return fail(r, "key '%s': unknown array element type %u", key, et);
	if (cnt > (r->len - r->pos) / min)
		return fail(r, "key '%s': array count %llu exceeds the remaining %zu bytes", key,
			    (unsigned long long)cnt, r->len - r->pos);
	if (esz && et != KVI_GGUF_BOOL) {
		r->pos += (size_t)cnt * esz;
		return 0;
	}
	for (uint64_t i = 0; i < cnt; i++) {
		ret = skip_value(r, et, depth + 1, key);
		if (ret)
			return ret;
	}
	return 0;
}

uint64_t kvi_gguf_hash(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 1099511628211ull;
	return h;
}

/* ---- key lookup and integer values: the parser reads general.alignment with them ---- */

int64_t kvi_gguf_find_kv(const struct kvi_gguf *g, const char *key)
{
	if (!g->kv_hash)
		return -ENOENT;
	size_t h = kvi_gguf_hash(key) & g->kv_hmask;
	while (g->kv_hash[h]) {
		size_t i = g->kv_hash[h] - 1;
		if (!strcmp(g->kvs[i].key, key))
			return (int64_t)i;
		h = (h + 1) & g->kv_hmask;
	}
	return -ENOENT;
}

int kvi_gguf_int_at(const uint8_t *p, uint32_t t, int *neg, uint64_t *mag)
{
	int is_signed =
	    t == KVI_GGUF_I8 || t == KVI_GGUF_I16 || t == KVI_GGUF_I32 || t == KVI_GGUF_I64;
	if (!is_signed && t != KVI_GGUF_U8 && t != KVI_GGUF_U16 && t != KVI_GGUF_U32 &&
	    t != KVI_GGUF_U64)
		return -EINVAL;
	size_t sz = kvi_gguf_scalar_size(t);
	uint64_t u = 0;
	memcpy(&u, p, sz); /* little-endian, as the file and the rest of this parser */
	if (is_signed && sz < 8 && ((u >> (sz * 8 - 1)) & 1))
		u |= ~0ull << (sz * 8); /* sign-extend */
	if (is_signed) {
		int64_t s = (int64_t)u;
		*neg = s < 0;
		*mag = s < 0 ? (uint64_t)0 - u : u;
	} else {
		*neg = 0;
		*mag = u;
	}
	return 0;
}

int kvi_gguf_get_u32(const struct kvi_gguf *g, const char *key, uint32_t *out)
{
	int64_t i = kvi_gguf_find_kv(g, key);
	if (i < 0)
		return (int)i;
	int neg;
	uint64_t m;
	int ret = kvi_gguf_int_at(g->base + g->kvs[i].off, g->kvs[i].type, &neg, &m);
	if (ret)
		return ret;
	if (neg || m > UINT32_MAX)
		return -ERANGE;
	*out = (uint32_t)m;
	return 0;
}

/* Builds an index+1 hash over n names; returns -EEXIST naming the first duplicate. */
static int build_hash(struct rd *r, uint32_t **tab, size_t *mask, size_t n,
		      const char *(*name_of)(const void *, size_t), const void *arr,
		      const char *what)
{
	size_t cap = 16;
	while (cap < 2 * n)
		cap *= 2;
	*tab = calloc(cap, sizeof(**tab));
	if (!*tab)
		return -ENOMEM;
	*mask = cap - 1;
	for (size_t i = 0; i < n; i++) {
		const char *nm = name_of(arr, i);
		size_t h = kvi_gguf_hash(nm) & *mask;
		while ((*tab)[h]) {
			if (!strcmp(name_of(arr, (*tab)[h] - 1), nm))
				return fail(r, "duplicate %s '%s'", what, nm);
			h = (h + 1) & *mask;
		}
		(*tab)[h] = (uint32_t)(i + 1);
	}
	return 0;
}

static const char *kv_name_of(const void *a, size_t i)
{
	return ((const struct kv *)a)[i].key;
}

static const char *t_name_of(const void *a, size_t i)
{
	return ((const struct kvi_gguf_tensor *)a)[i].name;
}

/* Copies a name NUL-terminated, rejecting empty, over-long or NUL-containing ones. */
static int copy_name(struct rd *r, size_t off, size_t n, size_t max, char **out, const char *what,
		     size_t idx)
{
	if (n == 0 || n > max)
		return fail(r, "%s %zu: name length %zu not in 1..%zu", what, idx, n, max);
	if (memchr(r->p + off, 0, n))
		return fail(r, "%s %zu: name contains a NUL byte", what, idx);
	*out = malloc(n + 1);
	if (!*out)
		return -ENOMEM;
	memcpy(*out, r->p + off, n);
	(*out)[n] = 0;
	return 0;
}

static int grow(void **arr, size_t *cap, size_t need, size_t elsz)
{
	if (need <= *cap)
		return 0;
	size_t nc = *cap ? *cap * 2 : 16;
	while (nc < need)
		nc *= 2;
	void *p = realloc(*arr, nc * elsz);
	if (!p)
		return -ENOMEM;
	memset((char *)p + *cap * elsz, 0, (nc - *cap) * elsz);
	*arr = p;
	*cap = nc;
	return 0;
}

static int parse_kv(struct rd *r, struct kvi_gguf *g, size_t i)
{
	struct kv *kv = &g->kvs[i];
	size_t ko, kl;
	int ret = rd_str(r, &ko, &kl, "metadata key");
	if (!ret)
		ret = copy_name(r, ko, kl, MAX_KEY_LEN, &kv->key, "metadata key", i);
	if (ret)
		return ret;
	g->n_kv = i + 1; /* so close() frees the key even if the value is bad */
	if ((ret = rd_u32(r, &kv->type, kv->key)))
		return ret;
	if (kv->type != KVI_GGUF_ARRAY) {
		kv->off = r->pos;
		return skip_value(r, kv->type, 0, kv->key);
	}
	if ((ret = rd_u32(r, &kv->arr_type, kv->key)) || (ret = rd_u64(r, &kv->arr_count, kv->key)))
		return ret;
	kv->off = r->pos;
	uint32_t et = kv->arr_type;
	size_t esz = kvi_gguf_scalar_size(et);
	if (et == KVI_GGUF_STRING) {
		if (kv->arr_count > (r->len - r->pos) / 8)
			return fail(r, "key '%s': array count %llu exceeds the remaining %zu bytes",
				    kv->key, (unsigned long long)kv->arr_count, r->len - r->pos);
		kv->str_offs = malloc((size_t)(kv->arr_count ? kv->arr_count : 1) * sizeof(size_t));
		if (!kv->str_offs)
			return -ENOMEM;
		for (uint64_t j = 0; j < kv->arr_count; j++) {
			size_t so, sl;
			kv->str_offs[j] = r->pos;
			if ((ret = rd_str(r, &so, &sl, kv->key)))
				return ret;
		}
		return 0;
	}
	if (!esz && et != KVI_GGUF_ARRAY)
		return fail(r, "key '%s': unknown array element type %u", kv->key, et);
	/* Rewind over the header so skip_value validates counts and elements uniformly. */
	r->pos -= 12;
	return skip_value(r, KVI_GGUF_ARRAY, 0, kv->key);
}

/* ggml type table: elements per block and bytes per block. */
struct ttype {
	uint32_t id;
	const char *name;
	uint32_t blck, bytes;
};
static const struct ttype TTYPES[] = {
    {0, "F32", 1, 4},	    {1, "F16", 1, 2},	    {2, "Q4_0", 32, 18},    {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},    {7, "Q5_1", 32, 24},    {8, "Q8_0", 32, 34},    {9, "Q8_1", 32, 36},
    {10, "Q2_K", 256, 84},  {11, "Q3_K", 256, 110}, {12, "Q4_K", 256, 144}, {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210}, {15, "Q8_K", 256, 292}, {24, "I8", 1, 1},	    {25, "I16", 1, 2},
    {26, "I32", 1, 4},	    {27, "I64", 1, 8},	    {28, "F64", 1, 8},	    {30, "BF16", 1, 2},
};

static const struct ttype *ttype_of(uint32_t id)
{
	for (size_t i = 0; i < sizeof(TTYPES) / sizeof(TTYPES[0]); i++)
		if (TTYPES[i].id == id)
			return &TTYPES[i];
	return NULL;
}

const char *kvi_gguf_type_name(uint32_t type)
{
	const struct ttype *t = ttype_of(type);
	return t ? t->name : NULL;
}

static int parse_tensor(struct rd *r, struct kvi_gguf *g, size_t i)
{
	struct kvi_gguf_tensor *t = &g->tensors[i];
	size_t no, nl;
	int ret = rd_str(r, &no, &nl, "tensor name");
	char *name = NULL;
	if (!ret)
		ret = copy_name(r, no, nl, MAX_NAME_LEN, &name, "tensor", i);
	if (ret)
		return ret;
	t->name = name;
	g->n_tensors = i + 1;
	if ((ret = rd_u32(r, &t->n_dims, name)))
		return ret;
	if (t->n_dims < 1 || t->n_dims > KVI_GGUF_MAX_DIMS)
		return fail(r, "tensor '%s': n_dims %u not in 1..%d", name, t->n_dims,
			    KVI_GGUF_MAX_DIMS);
	for (int d = 0; d < 4; d++)
		t->ne[d] = 1;
	for (uint32_t d = 0; d < t->n_dims; d++) {
		uint64_t v;
		if ((ret = rd_u64(r, &v, name)))
			return ret;
		if (v > (uint64_t)INT64_MAX)
			return fail(r, "tensor '%s': dimension %u is %llu (too large)", name, d,
				    (unsigned long long)v);
		t->ne[d] = (int64_t)v;
	}
	if ((ret = rd_u32(r, &t->type, name)) || (ret = rd_u64(r, &t->offset, name)))
		return ret;
	const struct ttype *tt = ttype_of(t->type);
	if (!tt)
		return fail(r, "tensor '%s': unknown ggml type %u", name, t->type);
	int64_t rows = 1;
	for (uint32_t d = 1; d < 4; d++)
		if (__builtin_mul_overflow(rows, t->ne[d], &rows))
			return fail(r, "tensor '%s': element count overflows", name);
	if (t->ne[0] % tt->blck)
		return fail(r,
			    "tensor '%s': row length %lld is not a multiple of the %s block (%u)",
			    name, (long long)t->ne[0], tt->name, tt->blck);
	uint64_t rowb, nb;
	int64_t el;
	if (__builtin_mul_overflow(t->ne[0], rows, &el))
		return fail(r, "tensor '%s': element count overflows", name);
	if (__builtin_mul_overflow((uint64_t)(t->ne[0] / tt->blck), (uint64_t)tt->bytes, &rowb) ||
	    __builtin_mul_overflow(rowb, (uint64_t)rows, &nb) || nb > SIZE_MAX)
		return fail(r, "tensor '%s': byte size overflows", name);
	t->nbytes = (size_t)nb;
	return 0;
}

static void gguf_free(struct kvi_gguf *g)
{
	for (size_t i = 0; i < g->n_kv; i++) {
		free(g->kvs[i].key);
		free(g->kvs[i].str_offs);
	}
	free(g->kvs);
	for (size_t i = 0; i < g->n_tensors; i++)
		free((char *)g->tensors[i].name);
	free(g->tensors);
	free(g->kv_hash);
	free(g->t_hash);
	if (g->mapped)
		munmap((void *)g->base, g->len);
	free(g);
}

static int cmp_offset(const void *a, const void *b)
{
	const struct kvi_gguf_tensor *x = *(const struct kvi_gguf_tensor *const *)a;
	const struct kvi_gguf_tensor *y = *(const struct kvi_gguf_tensor *const *)b;
	return (x->offset > y->offset) - (x->offset < y->offset);
}

/* Two tensors sharing bytes would let one weight silently alias another. */
static int check_overlap(struct rd *r, struct kvi_gguf *g)
{
	if (g->n_tensors < 2)
		return 0;
	const struct kvi_gguf_tensor **v = malloc(g->n_tensors * sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < g->n_tensors; i++)
		v[i] = &g->tensors[i];
	qsort(v, g->n_tensors, sizeof(*v), cmp_offset);
	int ret = 0;
	for (size_t i = 0; i + 1 < g->n_tensors && !ret; i++)
		if (v[i]->nbytes && v[i + 1]->nbytes &&
		    v[i]->offset + v[i]->nbytes > v[i + 1]->offset)
			ret = fail(r, "tensors '%s' and '%s' overlap in the data section",
				   v[i]->name, v[i + 1]->name);
	free(v);
	return ret;
}

static int parse(struct kvi_gguf *g, char *err, size_t errlen)
{
	struct rd r = {.p = g->base, .len = g->len, .err = err, .errlen = errlen};
	int ret;
	if (g->len < 4 || memcmp(g->base, "GGUF", 4))
		return fail(&r, "bad magic: not a GGUF file");
	r.pos = 4;
	if ((ret = rd_u32(&r, &g->version, "version")))
		return ret;
	if (g->version != 2 && g->version != 3)
		return fail(&r, "unsupported GGUF version %u (supported: 2, 3%s)", g->version,
			    g->version > 0xffff ? "; big-endian file?" : "");
	uint64_t nt, nkv;
	if ((ret = rd_u64(&r, &nt, "tensor count")) || (ret = rd_u64(&r, &nkv, "kv count")))
		return ret;
	if (nkv > (r.len - r.pos) / MIN_KV_BYTES)
		return fail(&r,
			    "kv count %llu exceeds what the remaining %zu bytes can hold "
			    "(truncated or corrupt file)",
			    (unsigned long long)nkv, r.len - r.pos);
	if (nt > (r.len - r.pos) / MIN_TENSOR_BYTES)
		return fail(&r,
			    "tensor count %llu exceeds what the remaining %zu bytes can hold "
			    "(truncated or corrupt file)",
			    (unsigned long long)nt, r.len - r.pos);
	if (nkv >= UINT32_MAX || nt >= UINT32_MAX)
		return fail(&r, "too many keys or tensors");
	size_t cap = 0;
	for (size_t i = 0; i < nkv; i++) {
		if ((ret = grow((void **)&g->kvs, &cap, i + 1, sizeof(*g->kvs))))
			return ret;
		if ((ret = parse_kv(&r, g, i)))
			return ret;
	}
	g->n_kv = (size_t)nkv;
	if ((ret = build_hash(&r, &g->kv_hash, &g->kv_hmask, g->n_kv, kv_name_of, g->kvs,
			      "metadata key")))
		return ret;

	g->alignment = KVI_GGUF_DEFAULT_ALIGNMENT;
	uint32_t al;
	ret = kvi_gguf_get_u32(g, "general.alignment", &al);
	if (ret == 0) {
		if (al == 0 || (al & (al - 1)))
			return fail(&r, "general.alignment %u is not a power of two", al);
		g->alignment = al;
	} else if (ret != -ENOENT) {
		return fail(&r, "key 'general.alignment': not an unsigned 32-bit integer");
	}

	cap = 0;
	for (size_t i = 0; i < nt; i++) {
		if ((ret = grow((void **)&g->tensors, &cap, i + 1, sizeof(*g->tensors))))
			return ret;
		if ((ret = parse_tensor(&r, g, i)))
			return ret;
	}
	g->n_tensors = (size_t)nt;
	if ((ret = build_hash(&r, &g->t_hash, &g->t_hmask, g->n_tensors, t_name_of, g->tensors,
			      "tensor name")))
		return ret;

	size_t pad = (g->alignment - r.pos % g->alignment) % g->alignment;
	g->data_off = r.pos + pad;
	for (size_t i = 0; i < g->n_tensors; i++) {
		struct kvi_gguf_tensor *t = &g->tensors[i];
		if (t->offset % g->alignment)
			return fail(&r, "tensor '%s': offset %llu is not aligned to %u", t->name,
				    (unsigned long long)t->offset, g->alignment);
		if (g->data_off > g->len || t->offset > g->len - g->data_off ||
		    t->nbytes > g->len - g->data_off - t->offset)
			return fail(&r,
				    "tensor '%s': data [%llu, +%zu) lies outside the file "
				    "(data section at %zu, file %zu bytes)",
				    t->name, (unsigned long long)t->offset, t->nbytes, g->data_off,
				    g->len);
		t->data = g->base + g->data_off + t->offset;
	}
	return check_overlap(&r, g);
}

static int open_common(struct kvi_gguf *g, struct kvi_gguf **out, char *err, size_t errlen)
{
	if (err && errlen)
		err[0] = 0;
	int ret = parse(g, err, errlen);
	if (ret) {
		if (ret == -ENOMEM && err && errlen)
			snprintf(err, errlen, "out of memory parsing GGUF header");
		gguf_free(g);
		return ret;
	}
	*out = g;
	return 0;
}

int kvi_gguf_open_mem(const void *buf, size_t len, struct kvi_gguf **out, char *err, size_t errlen)
{
	struct kvi_gguf *g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	g->base = buf;
	g->len = buf ? len : 0;
	return open_common(g, out, err, errlen);
}

int kvi_gguf_open(const char *path, struct kvi_gguf **out, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		if (err && errlen)
			snprintf(err, errlen, "%s: %s", path, strerror(e));
		return -e;
	}
	struct stat st;
	int bad_stat = fstat(fd, &st) < 0;
	if (bad_stat || !S_ISREG(st.st_mode) || st.st_size == 0) {
		int e = bad_stat ? errno : 0; /* errno is stale after a successful fstat */
		if (err && errlen)
			snprintf(err, errlen, "%s: %s", path,
				 e ? strerror(e) : "empty or not a regular file");
		close(fd);
		return e ? -e : -EINVAL;
	}
	void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	int e = errno;
	close(fd);
	if (p == MAP_FAILED) {
		if (err && errlen)
			snprintf(err, errlen, "%s: mmap: %s", path, strerror(e));
		return -e;
	}
	struct kvi_gguf *g = calloc(1, sizeof(*g));
	if (!g) {
		munmap(p, (size_t)st.st_size);
		return -ENOMEM;
	}
	g->base = p;
	g->len = (size_t)st.st_size;
	g->mapped = 1;
	return open_common(g, out, err, errlen);
}

void kvi_gguf_close(struct kvi_gguf *g)
{
	if (g)
		gguf_free(g);
}

uint32_t kvi_gguf_version(const struct kvi_gguf *g)
{
	return g->version;
}

uint32_t kvi_gguf_alignment(const struct kvi_gguf *g)
{
	return g->alignment;
}

const void *kvi_gguf_base(const struct kvi_gguf *g, size_t *len)
{
	if (len)
		*len = g->len;
	return g->base;
}
