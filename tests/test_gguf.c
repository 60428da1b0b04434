/* Tests for engine/gguf.c, gguf_meta.c, gguf_write.c: the writer round-trips through the
 * reader, every typed getter answers right (value, -ENOENT, -EINVAL, -ERANGE), and every header
 * validation path rejects a hostile file, built byte by byte, with a message naming the
 * problem. Run under ASan in CI, so "never a crash or out-of-bounds read" is checked too. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <math.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "gguf.h"
#include "gguf_write.h"
#include "model.h"

/* The model layer on top of the reader (one check: an empty but valid file). */
static void expect_model_fail(const void *buf, size_t len, const char *substr)
{
	char err[512] = "";
	struct kvi_gguf *g = NULL;
	struct kvi_model *m = NULL;
	int ret = kvi_gguf_open_mem(buf, len, &g, err, sizeof(err));
	if (!ret)
		ret = kvi_model_from_gguf(g, &m, err, sizeof(err));
	if (!ret)
		kvi_model_free(m);
	if (ret >= 0 || !strstr(err, substr))
		fail_msg("expected failure containing '%s', got %d '%s'", substr, ret, err);
}

static void test_writer_to_file(void **state)
{
	(void)state;
	struct kvi_gguf_writer *w;
	assert_int_equal(kvi_gguf_writer_create(&w), 0);
	assert_int_equal(kvi_gguf_w_alignment(w, 64), 0);
	assert_int_equal(kvi_gguf_w_alignment(w, 48), -EINVAL);
	float data[64];
	for (int i = 0; i < 64; i++)
		data[i] = (float)i;
	int64_t ne[2] = {32, 2};
	assert_int_equal(kvi_gguf_w_tensor(w, "a", KVI_F32, 2, ne, data), 0);
	ne[0] = 33;
	assert_int_equal(kvi_gguf_w_tensor(w, "q", KVI_Q8_0, 1, ne, NULL), -EINVAL);
	ne[0] = 64;
	assert_int_equal(kvi_gguf_w_tensor(w, "b", KVI_Q8_0, 1, ne, NULL), 1);
	char path[] = "/tmp/test_gguf_w_XXXXXX";
	int fd = mkstemp(path);
	close(fd);
	assert_int_equal(kvi_gguf_w_write_file(w, path, NULL, NULL), 0);
	kvi_gguf_writer_free(w);
	struct kvi_gguf *g;
	char err[256];
	assert_int_equal(kvi_gguf_open(path, &g, err, sizeof(err)), 0);
	assert_int_equal(kvi_gguf_alignment(g), 64);
	assert_int_equal(kvi_gguf_version(g), 3);
	assert_int_equal(kvi_gguf_n_tensors(g), 2);
	const struct kvi_gguf_tensor *a = kvi_gguf_find_tensor(g, "a");
	assert_non_null(a);
	assert_int_equal((uintptr_t)a->data % 64, 0);
	assert_memory_equal(a->data, data, sizeof(data));
	const struct kvi_gguf_tensor *b = kvi_gguf_find_tensor(g, "b");
	assert_int_equal(b->nbytes, 68);
	assert_int_equal(b->offset % 64, 0);
	assert_null(kvi_gguf_find_tensor(g, "c"));
	assert_string_equal(kvi_gguf_type_name(b->type), "Q8_0");
	kvi_gguf_close(g);
	unlink(path);
}

static void test_getters(void **state)
{
	(void)state;
	struct kvi_gguf_writer *w;
	assert_int_equal(kvi_gguf_writer_create(&w), 0);
	kvi_gguf_w_u32(w, "u", 7);
	kvi_gguf_w_i32(w, "i", -3);
	kvi_gguf_w_u64(w, "big", 1ull << 40);
	kvi_gguf_w_f32(w, "f", 1.5f);
	kvi_gguf_w_bool(w, "b", 1);
	kvi_gguf_w_str(w, "s", "hello");
	const char *strs[] = {"a", "", "ccc"};
	kvi_gguf_w_arr_str(w, "as", strs, 3);
	float fs[] = {0.5f, -2.0f};
	kvi_gguf_w_arr_f32(w, "af", fs, 2);
	int32_t is[] = {1, -1, 3};
	kvi_gguf_w_arr_i32(w, "ai", is, 3);
	void *buf;
	size_t len;
	assert_int_equal(kvi_gguf_w_write_mem(w, NULL, NULL, &buf, &len), 0);
	kvi_gguf_writer_free(w);
	struct kvi_gguf *g;
	char err[256];
	assert_int_equal(kvi_gguf_open_mem(buf, len, &g, err, sizeof(err)), 0);
	assert_int_equal(kvi_gguf_n_kv(g), 9);
	assert_string_equal(kvi_gguf_kv_key(g, 0), "u");
	assert_int_equal(kvi_gguf_kv_type(g, 6), KVI_GGUF_ARRAY);
	uint32_t u;
	int32_t i;
	uint64_t u64;
	float f;
	int b;
	assert_int_equal(kvi_gguf_get_u32(g, "u", &u), 0);
	assert_int_equal(u, 7);
	assert_int_equal(kvi_gguf_get_i32(g, "u", &i), 0);
	assert_int_equal(i, 7);
	assert_int_equal(kvi_gguf_get_i32(g, "i", &i), 0);
	assert_int_equal(i, -3);
	assert_int_equal(kvi_gguf_get_u32(g, "i", &u), -ERANGE);
	assert_int_equal(kvi_gguf_get_u32(g, "big", &u), -ERANGE);
	assert_int_equal(kvi_gguf_get_u64(g, "big", &u64), 0);
	assert_true(u64 == 1ull << 40);
	assert_int_equal(kvi_gguf_get_u32(g, "missing", &u), -ENOENT);
	assert_int_equal(kvi_gguf_get_u32(g, "f", &u), -EINVAL);
	assert_int_equal(kvi_gguf_get_f32(g, "f", &f), 0);
	assert_true(f == 1.5f);
	assert_int_equal(kvi_gguf_get_f32(g, "u", &f), -EINVAL);
	assert_int_equal(kvi_gguf_get_bool(g, "b", &b), 0);
	assert_int_equal(b, 1);
	assert_int_equal(kvi_gguf_get_bool(g, "u", &b), -EINVAL);
	const char *s;
	size_t sl;
	assert_int_equal(kvi_gguf_get_str(g, "s", &s, &sl), 0);
	assert_int_equal(sl, 5);
	assert_memory_equal(s, "hello", 5);
	char sb[8];
	assert_int_equal(kvi_gguf_get_strcpy(g, "s", sb, sizeof(sb)), 0);
	assert_string_equal(sb, "hello");
	assert_int_equal(kvi_gguf_get_strcpy(g, "s", sb, 5), -ERANGE);
	assert_int_equal(kvi_gguf_get_str(g, "as", &s, &sl), -EINVAL);
	enum kvi_gguf_type et;
	uint64_t cnt;
	assert_int_equal(kvi_gguf_get_arr(g, "as", &et, &cnt), 0);
	assert_int_equal(et, KVI_GGUF_STRING);
	assert_int_equal(cnt, 3);
	assert_int_equal(kvi_gguf_get_arr(g, "s", &et, &cnt), -EINVAL);
	int64_t k = kvi_gguf_find_kv(g, "as");
	assert_true(k >= 0);
	assert_int_equal(kvi_gguf_arr_str(g, k, 2, &s, &sl), 0);
	assert_int_equal(sl, 3);
	assert_memory_equal(s, "ccc", 3);
	assert_int_equal(kvi_gguf_arr_str(g, k, 1, &s, &sl), 0);
	assert_int_equal(sl, 0);
	assert_int_equal(kvi_gguf_arr_str(g, k, 3, &s, &sl), -ERANGE);
	assert_int_equal(kvi_gguf_arr_f32(g, k, 0, &f), -EINVAL);
	k = kvi_gguf_find_kv(g, "af");
	assert_int_equal(kvi_gguf_arr_f32(g, k, 1, &f), 0);
	assert_true(f == -2.0f);
	k = kvi_gguf_find_kv(g, "ai");
	assert_int_equal(kvi_gguf_arr_i32(g, k, 1, &i), 0);
	assert_int_equal(i, -1);
	assert_int_equal(kvi_gguf_arr_str(g, k, 0, &s, &sl), -EINVAL);
	assert_int_equal(kvi_gguf_find_kv(g, "nope"), -ENOENT);
	assert_int_equal(kvi_gguf_arr_i32(g, -5, 0, &i), -EINVAL);
	kvi_gguf_close(g);
	free(buf);
}

/* ---- hostile headers, built byte by byte ---- */

struct raw {
	uint8_t *p;
	size_t len, cap;
};

static void r_put(struct raw *r, const void *d, size_t n)
{
	if (r->len + n > r->cap) {
		r->cap = (r->len + n) * 2 + 64;
		r->p = realloc(r->p, r->cap);
		assert_non_null(r->p);
	}
	memcpy(r->p + r->len, d, n);
	r->len += n;
}

static void r_u32(struct raw *r, uint32_t v)
{
	r_put(r, &v, 4);
}

static void r_u64(struct raw *r, uint64_t v)
{
	r_put(r, &v, 8);
}

static void r_str(struct raw *r, const char *s)
{
	r_u64(r, strlen(s));
	r_put(r, s, strlen(s));
}

static void r_hdr(struct raw *r, uint32_t ver, uint64_t nt, uint64_t nkv)
{
	r->len = 0;
	r_put(r, "GGUF", 4);
	r_u32(r, ver);
	r_u64(r, nt);
	r_u64(r, nkv);
}

static void r_kv_u32(struct raw *r, const char *k, uint32_t v)
{
	r_str(r, k);
	r_u32(r, KVI_GGUF_U32);
	r_u32(r, v);
}

static void r_tensor(struct raw *r, const char *name, uint32_t nd, const uint64_t *ne,
		     uint32_t type, uint64_t off)
{
	r_str(r, name);
	r_u32(r, nd);
	for (uint32_t i = 0; i < nd; i++)
		r_u64(r, ne[i]);
	r_u32(r, type);
	r_u64(r, off);
}

/* Pads to 32 and appends n zero bytes of tensor data. */
static void r_data(struct raw *r, size_t n)
{
	static const uint8_t z[4096];
	size_t pad = (32 - r->len % 32) % 32;
	r_put(r, z, pad);
	while (n) {
		size_t k = n > sizeof(z) ? sizeof(z) : n;
		r_put(r, z, k);
		n -= k;
	}
}

/* gguf-level failure (the model layer is not reached). */
static void expect_gguf_fail(struct raw *r, const char *substr)
{
	char err[512] = "";
	struct kvi_gguf *g = NULL;
	int ret = kvi_gguf_open_mem(r->p, r->len, &g, err, sizeof(err));
	if (ret >= 0) {
		kvi_gguf_close(g);
		fail_msg("expected failure containing '%s', but the file opened", substr);
	}
	if (!strstr(err, substr))
		fail_msg("expected '%s' in '%s'", substr, err);
	assert_null(g);
}

static void expect_gguf_ok(struct raw *r)
{
	char err[512] = "";
	struct kvi_gguf *g = NULL;
	if (kvi_gguf_open_mem(r->p, r->len, &g, err, sizeof(err)))
		fail_msg("expected success, got '%s'", err);
	kvi_gguf_close(g);
}

static void test_bad_header(void **state)
{
	(void)state;
	struct raw r = {0};
	r_put(&r, "GGU", 3);
	expect_gguf_fail(&r, "bad magic");
	r_hdr(&r, 3, 0, 0);
	r.p[3] = 'X';
	expect_gguf_fail(&r, "bad magic");
	r_hdr(&r, 1, 0, 0);
	expect_gguf_fail(&r, "unsupported GGUF version 1");
	r_hdr(&r, 0x03000000, 0, 0);
	expect_gguf_fail(&r, "big-endian");
	r_hdr(&r, 2, 0, 0);
	expect_gguf_ok(&r);
	r_hdr(&r, 3, 0, 0);
	expect_gguf_ok(&r);
	r.len -= 1;
	expect_gguf_fail(&r, "truncated file: kv count");
	r_hdr(&r, 3, 0, 1ull << 60);
	expect_gguf_fail(&r, "kv count");
	r_hdr(&r, 3, 1ull << 60, 0);
	expect_gguf_fail(&r, "tensor count");
	r_hdr(&r, 3, 0, UINT64_MAX);
	r_kv_u32(&r, "a", 1);
	expect_gguf_fail(&r, "kv count");
	/* model layer on an empty but valid file */
	r_hdr(&r, 3, 0, 0);
	expect_model_fail(r.p, r.len, "general.architecture");
	free(r.p);
}

static void test_bad_kv(void **state)
{
	(void)state;
	struct raw r = {0};
	r_hdr(&r, 3, 0, 1);
	r_u64(&r, 1000);
	r_put(&r, "abcdefghijklmnop", 16);
	expect_gguf_fail(&r, "runs past the end");
	r_hdr(&r, 3, 0, 1);
	r_u64(&r, UINT64_MAX);
	r_put(&r, "abcdefgh", 8);
	expect_gguf_fail(&r, "runs past the end");
	r_hdr(&r, 3, 0, 1);
	r_kv_u32(&r, "", 1);
	expect_gguf_fail(&r, "name length 0");
	r_hdr(&r, 3, 0, 1);
	r_u64(&r, 3);
	r_put(&r, "a\0b", 3);
	r_u32(&r, KVI_GGUF_U32);
	r_u32(&r, 1);
	expect_gguf_fail(&r, "NUL");
	r_hdr(&r, 3, 0, 1);
	r_str(&r, "k");
	r_u32(&r, 13);
	r_u32(&r, 0);
	r_u32(&r, 0);
	expect_gguf_fail(&r, "key 'k': unknown value type 13");
	r_hdr(&r, 3, 0, 1);
	r_str(&r, "k");
	r_u32(&r, KVI_GGUF_U64);
	r_u32(&r, 0);
	expect_gguf_fail(&r, "truncated file: k needs 8 bytes");
	r_hdr(&r, 3, 0, 1);
	r_str(&r, "k");
	r_u32(&r, KVI_GGUF_BOOL);
	uint8_t two = 2;
	r_put(&r, &two, 1);
	r_put(&r, "pad pad pad pad ", 16);
	expect_gguf_fail(&r, "neither 0 nor 1");
	/* arrays */
	r_hdr(&r, 3, 0, 1);
	r_str(&r, "arr");
	r_u32(&r, KVI_GGUF_ARRAY);
	r_u32(&r, 77);
	r_u64(&r, 1);
	r_u32(&r, 0);
	expect_gguf_fail(&r, "unknown array element type 77");
	r_hdr(&r, 3, 0, 1);
	r_str(&r, "arr");
	r_u32(&r, KVI_GGUF_ARRAY);
	r_u32(&r, KVI_GGUF_U32);
	r_u64(&r, 1ull << 40);
	r_u32(&r, 0);
	expect_gguf_fail(&r, "array count");
	r_hdr(&r, 3, 0, 1);
	r_str(&r, "arr");
	r_u32(&r, KVI_GGUF_ARRAY);
	r_u32(&r, KVI_GGUF_STRING);
	r_u64(&r, 1ull << 62);
	r_str(&r, "x");
	expect_gguf_fail(&r, "array count");
	r_hdr(&r, 3, 0, 1);
	r_str(&r, "arr");
	r_u32(&r, KVI_GGUF_ARRAY);
	r_u32(&r, KVI_GGUF_STRING);
	r_u64(&r, 2);
	r_str(&r, "x");
	r_u64(&r, 50);
	expect_gguf_fail(&r, "runs past the end");
	r_hdr(&r, 3, 0, 1);
	r_str(&r, "arr");
	r_u32(&r, KVI_GGUF_ARRAY);
	r_u32(&r, KVI_GGUF_BOOL);
	r_u64(&r, 3);
	uint8_t bools[3] = {0, 1, 5};
	r_put(&r, bools, 3);
	r_put(&r, "padding padding ", 16);
	expect_gguf_fail(&r, "neither 0 nor 1");
	/* nested arrays: two levels are fine, deeper than the limit is not */
	r_hdr(&r, 3, 0, 1);
	r_str(&r, "nest");
	r_u32(&r, KVI_GGUF_ARRAY);
	r_u32(&r, KVI_GGUF_ARRAY);
	r_u64(&r, 2);
	for (int i = 0; i < 2; i++) {
		r_u32(&r, KVI_GGUF_STRING);
		r_u64(&r, 1);
		r_str(&r, "in");
	}
	expect_gguf_ok(&r);
	r_hdr(&r, 3, 0, 1);
	r_str(&r, "deep");
	r_u32(&r, KVI_GGUF_ARRAY);
	for (int i = 0; i < 20; i++) {
		r_u32(&r, KVI_GGUF_ARRAY);
		r_u64(&r, 1);
	}
	r_u32(&r, KVI_GGUF_U8);
	r_u64(&r, 0);
	expect_gguf_fail(&r, "nested deeper");
	/* duplicates and alignment */
	r_hdr(&r, 3, 0, 2);
	r_kv_u32(&r, "dup", 1);
	r_kv_u32(&r, "dup", 2);
	expect_gguf_fail(&r, "duplicate metadata key 'dup'");
	r_hdr(&r, 3, 0, 1);
	r_kv_u32(&r, "general.alignment", 48);
	expect_gguf_fail(&r, "power of two");
	r_hdr(&r, 3, 0, 1);
	r_kv_u32(&r, "general.alignment", 0);
	expect_gguf_fail(&r, "power of two");
	r_hdr(&r, 3, 0, 1);
	r_str(&r, "general.alignment");
	r_u32(&r, KVI_GGUF_STRING);
	r_str(&r, "32");
	expect_gguf_fail(&r, "general.alignment");
	free(r.p);
}

static void test_bad_tensor_info(void **state)
{
	(void)state;
	struct raw r = {0};
	uint64_t ne[5] = {32, 2, 1, 1, 1};
	r_hdr(&r, 3, 1, 0);
	r_tensor(&r, "t", 2, ne, KVI_F32, 0);
	r_data(&r, 256);
	expect_gguf_ok(&r);
	r_hdr(&r, 3, 1, 0);
	r_tensor(&r, "t", 5, ne, KVI_F32, 0);
	r_data(&r, 256);
	expect_gguf_fail(&r, "n_dims 5");
	r_hdr(&r, 3, 1, 0);
	r_tensor(&r, "t", 0, ne, KVI_F32, 0);
	r_data(&r, 256);
	expect_gguf_fail(&r, "n_dims 0");
	uint64_t huge[3] = {1ull << 63, 1, 1};
	r_hdr(&r, 3, 1, 0);
	r_tensor(&r, "t", 1, huge, KVI_F32, 0);
	r_data(&r, 64);
	expect_gguf_fail(&r, "too large");
	uint64_t ovf[3] = {1ull << 32, 1ull << 32, 1ull << 32};
	r_hdr(&r, 3, 1, 0);
	r_tensor(&r, "t", 3, ovf, KVI_F32, 0);
	r_data(&r, 64);
	expect_gguf_fail(&r, "overflows");
	uint64_t bytes_ovf[1] = {1ull << 62};
	r_hdr(&r, 3, 1, 0);
	r_tensor(&r, "t", 1, bytes_ovf, KVI_F32, 0);
	r_data(&r, 64);
	expect_gguf_fail(&r, "overflows");
	r_hdr(&r, 3, 1, 0);
	r_tensor(&r, "t", 2, ne, 99, 0);
	r_data(&r, 256);
	expect_gguf_fail(&r, "tensor 't': unknown ggml type 99");
	uint64_t odd[2] = {33, 1};
	r_hdr(&r, 3, 1, 0);
	r_tensor(&r, "t", 2, odd, KVI_Q8_0, 0);
	r_data(&r, 256);
	expect_gguf_fail(&r, "not a multiple of the Q8_0 block");
	r_hdr(&r, 3, 1, 0);
	r_tensor(&r, "t", 2, ne, KVI_F32, 4);
	r_data(&r, 512);
	expect_gguf_fail(&r, "not aligned");
	r_hdr(&r, 3, 1, 0);
	r_tensor(&r, "t", 2, ne, KVI_F32, 32);
	r_data(&r, 256);
	expect_gguf_fail(&r, "outside the file");
	r_hdr(&r, 3, 1, 0);
	r_tensor(&r, "t", 2, ne, KVI_F32, UINT64_MAX - 31);
	r_data(&r, 256);
	expect_gguf_fail(&r, "outside the file");
	r_hdr(&r, 3, 1, 0);
	r_tensor(&r, "t", 2, ne, KVI_F32, 0);
	expect_gguf_fail(&r, "outside the file"); /* no data section at all */
	r_hdr(&r, 3, 2, 0);
	r_tensor(&r, "t", 2, ne, KVI_F32, 0);
	r_tensor(&r, "t", 2, ne, KVI_F32, 256);
	r_data(&r, 512);
	expect_gguf_fail(&r, "duplicate tensor name 't'");
	r_hdr(&r, 3, 2, 0);
	r_tensor(&r, "t", 2, ne, KVI_F32, 0);
	r_tensor(&r, "u", 2, ne, KVI_F32, 224);
	r_data(&r, 512);
	expect_gguf_fail(&r, "tensors 't' and 'u' overlap");
	r_hdr(&r, 3, 2, 0);
	r_tensor(&r, "t", 2, ne, KVI_F32, 0);
	r_tensor(&r, "u", 2, ne, KVI_F32, 256);
	r_data(&r, 512);
	expect_gguf_ok(&r);
	char longname[80];
	memset(longname, 'n', 65);
	longname[65] = 0;
	r_hdr(&r, 3, 1, 0);
	r_tensor(&r, longname, 2, ne, KVI_F32, 0);
	r_data(&r, 256);
	expect_gguf_fail(&r, "name length 65");
	free(r.p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_writer_to_file),  cmocka_unit_test(test_getters),
	    cmocka_unit_test(test_bad_header),	    cmocka_unit_test(test_bad_kv),
	    cmocka_unit_test(test_bad_tensor_info),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
