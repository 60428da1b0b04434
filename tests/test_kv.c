/* Tests for engine/kv: block pool, refcounts, export/import layout, sequences (attach, fork,
 * copy on write, truncate), and refusals. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kv.h"

static struct kvi_kv *mk(int nblocks)
{
	struct kvi_kv_geom g = {.n_layer = 3, .n_head_kv = 2, .head_dim = 8, .block_tokens = 4};
	struct kvi_kv *kv = NULL;
	assert_int_equal(kvi_kv_create(&g, nblocks, &kv), 0);
	return kv;
}

static void test_create_bad(void **st)
{
	(void)st;
	struct kvi_kv_geom g = {.n_layer = 1, .n_head_kv = 1, .head_dim = 1, .block_tokens = 0};
	struct kvi_kv *kv;
	assert_int_equal(kvi_kv_create(&g, 4, &kv), -EINVAL);
	g.block_tokens = 4;
	assert_int_equal(kvi_kv_create(&g, 0, &kv), -EINVAL);
	assert_int_equal(kvi_kv_create(NULL, 4, &kv), -EINVAL);
}

static void test_alloc_refcount(void **st)
{
	(void)st;
	struct kvi_kv *kv = mk(3);
	assert_int_equal(kvi_kv_block_bytes(kv), (size_t)3 * 2 * 4 * 2 * 8 * 2);
	int a = kvi_kv_block_alloc(kv), b = kvi_kv_block_alloc(kv), c = kvi_kv_block_alloc(kv);
	assert_true(a >= 0 && b >= 0 && c >= 0 && a != b && b != c && a != c);
	assert_int_equal(kvi_kv_block_alloc(kv), -ENOSPC);
	assert_int_equal(kvi_kv_n_free(kv), 0);
	assert_int_equal(kvi_kv_block_ref(kv, b), 0);
	assert_int_equal(kvi_kv_block_refcount(kv, b), 2);
	assert_int_equal(kvi_kv_block_unref(kv, b), 0);
	assert_int_equal(kvi_kv_block_unref(kv, b), 0);
	assert_int_equal(kvi_kv_block_refcount(kv, b), 0);
	assert_int_equal(kvi_kv_block_unref(kv, b), -EINVAL); /* already free */
	assert_int_equal(kvi_kv_block_ref(kv, 99), -EINVAL);
	assert_int_equal(kvi_kv_block_ref(kv, -1), -EINVAL);
	assert_int_equal(kvi_kv_block_refcount(kv, 3), -EINVAL);
	assert_int_equal(kvi_kv_n_free(kv), 1);
	assert_int_equal(kvi_kv_block_alloc(kv), b);
	kvi_kv_block_unref(kv, a);
	kvi_kv_block_unref(kv, b);
	kvi_kv_block_unref(kv, c);
	assert_int_equal(kvi_kv_n_free(kv), 3);
	kvi_kv_destroy(kv);
}

/* The export layout is [layer][K,V][token][kv_head][head_dim]: check it through kvi_kv_row. */
static void test_export_layout(void **st)
{
	(void)st;
	struct kvi_kv *kv = mk(2);
	int id = kvi_kv_block_alloc(kv);
	const struct kvi_kv_geom *g = kvi_kv_geom(kv);
	int row = g->n_head_kv * g->head_dim;
	for (int l = 0; l < g->n_layer; l++)
		for (int s = 0; s < 2; s++)
			for (int t = 0; t < g->block_tokens; t++) {
				uint16_t *r = kvi_kv_row(kv, id, l, s, t);
				for (int i = 0; i < row; i++)
					r[i] = (uint16_t)(l * 1000 + s * 100 + t * 10 + i);
			}
	size_t bb = kvi_kv_block_bytes(kv);
	uint16_t *buf = malloc(bb + 16);
	assert_int_equal(kvi_kv_block_export(kv, id, buf, bb - 1), -ENOSPC);
	assert_int_equal(kvi_kv_block_export(kv, id, buf, bb + 16), (long)bb);
	size_t o = 0;
	for (int l = 0; l < g->n_layer; l++)
		for (int s = 0; s < 2; s++)
			for (int t = 0; t < g->block_tokens; t++)
				for (int i = 0; i < row; i++)
					assert_int_equal(buf[o++], l * 1000 + s * 100 + t * 10 + i);
	/* import into another block: same bytes back */
	int id2 = kvi_kv_block_alloc(kv);
	assert_int_equal(kvi_kv_block_import(kv, id2, buf, bb - 2), -EINVAL);
	assert_int_equal(kvi_kv_block_import(kv, id2, buf, bb), 0);
	uint16_t *buf2 = malloc(bb);
	assert_int_equal(kvi_kv_block_export(kv, id2, buf2, bb), (long)bb);
	assert_memory_equal(buf, buf2, bb);
	/* a shared block cannot be overwritten by import */
	kvi_kv_block_ref(kv, id2);
	assert_int_equal(kvi_kv_block_import(kv, id2, buf, bb), -EINVAL);
	kvi_kv_block_unref(kv, id2);
	kvi_kv_block_unref(kv, id2);
	assert_int_equal(kvi_kv_block_export(kv, id2, buf2, bb), -EINVAL); /* free */
	kvi_kv_block_unref(kv, id);
	free(buf);
	free(buf2);
	kvi_kv_destroy(kv);
}

static void test_seq_reserve_truncate(void **st)
{
	(void)st;
	struct kvi_kv *kv = mk(4);
	struct kvi_seq *s;
	assert_int_equal(kvi_seq_create(kv, &s), 0);
	assert_int_equal(kvi_seq_reserve(s, 6), 0);
	assert_int_equal(kvi_seq_n_blocks(s), 2);
	assert_int_equal(kvi_seq_len(s), 0);
	kvi_seq_advance(s, 6);
	assert_int_equal(kvi_seq_reserve(s, 11), -ENOSPC); /* needs 5 blocks, pool has 4 */
	assert_int_equal(kvi_seq_reserve(s, 10), 0);
	assert_int_equal(kvi_seq_n_blocks(s), 4);
	kvi_seq_advance(s, 10);
	assert_int_equal(kvi_seq_truncate(s, 17), -EINVAL);
	assert_int_equal(kvi_seq_truncate(s, 5), 0);
	assert_int_equal(kvi_seq_n_blocks(s), 2);
	assert_int_equal(kvi_kv_n_free(kv), 2);
	assert_int_equal(kvi_seq_truncate(s, 0), 0);
	assert_int_equal(kvi_kv_n_free(kv), 4);
	kvi_seq_destroy(s);
	kvi_kv_destroy(kv);
}

static void test_seq_attach_fork_cow(void **st)
{
	(void)st;
	struct kvi_kv *kv = mk(8);
	int32_t ids[2] = {kvi_kv_block_alloc(kv), kvi_kv_block_alloc(kv)};
	struct kvi_seq *s, *f;
	assert_int_equal(kvi_seq_create(kv, &s), 0);
	/* length must fall inside the last block */
	assert_int_equal(kvi_seq_attach(s, ids, 2, 4), -EINVAL);
	assert_int_equal(kvi_seq_attach(s, ids, 2, 9), -EINVAL);
	int32_t bad[2] = {ids[0], 7}; /* 7 is free */
	assert_int_equal(kvi_seq_attach(s, bad, 2, 6), -EINVAL);
	assert_int_equal(kvi_seq_attach(s, ids, 2, 6), 0);
	assert_int_equal(kvi_seq_attach(s, ids, 2, 6), -EINVAL); /* not empty */
	assert_int_equal(kvi_kv_block_refcount(kv, ids[0]), 2);
	kvi_kv_block_unref(kv, ids[0]);
	kvi_kv_block_unref(kv, ids[1]);
	kvi_kv_row(kv, ids[1], 2, 1, 1)[3] = 0x1234; /* position 5, layer 2, V */

	assert_int_equal(kvi_seq_fork(s, &f), 0);
	assert_int_equal(kvi_seq_len(f), 6);
	assert_int_equal(kvi_kv_block_refcount(kv, ids[1]), 2);
	/* appending to the fork copies the shared partial block, keeps the full one shared */
	assert_int_equal(kvi_seq_reserve(f, 1), 0);
	assert_int_equal(kvi_seq_blocks(f)[0], ids[0]);
	assert_int_not_equal(kvi_seq_blocks(f)[1], ids[1]);
	assert_int_equal(kvi_kv_block_refcount(kv, ids[1]), 1);
	assert_int_equal(kvi_kv_block_refcount(kv, ids[0]), 2);
	assert_int_equal(kvi_kv_row(kv, kvi_seq_blocks(f)[1], 2, 1, 1)[3], 0x1234);
	kvi_seq_destroy(f);
	kvi_seq_destroy(s);
	assert_int_equal(kvi_kv_n_free(kv), 8);
	kvi_kv_destroy(kv);
}

/* The device-copy hooks (kv.h): generations move at alloc and import only; export runs the
 * host-sync hook for its block first and returns its error; no hook costs nothing. */
struct hook_log {
	int calls, last_id, fail;
};

static int hook(void *arg, const int32_t *ids, int n)
{
	struct hook_log *h = arg;
	h->calls++;
	h->last_id = n == 1 ? ids[0] : -1;
	return h->fail;
}

static void test_device_hooks(void **st)
{
	(void)st;
	struct kvi_kv *kv = mk(2);
	size_t bb = kvi_kv_block_bytes(kv);
	uint8_t *buf = calloc(1, bb);
	assert_int_equal(kvi_kv_block_gen(kv, 0), 0);
	assert_int_equal(kvi_kv_block_gen(kv, 9), 0);
	int a = kvi_kv_block_alloc(kv);
	uint32_t g = kvi_kv_block_gen(kv, a);
	assert_true(g != 0);
	assert_int_equal(kvi_kv_block_ref(kv, a), 0);
	assert_int_equal(kvi_kv_block_unref(kv, a), 0);
	assert_int_equal(kvi_kv_block_gen(kv, a), g); /* refs do not change contents */
	assert_int_equal(kvi_kv_block_import(kv, a, buf, bb), 0);
	assert_int_equal(kvi_kv_block_gen(kv, a), g + 1);
	assert_int_equal(kvi_kv_block_unref(kv, a), 0);
	assert_int_equal(kvi_kv_block_alloc(kv), a); /* the same id again: a new generation */
	assert_int_equal(kvi_kv_block_gen(kv, a), g + 2);

	int32_t ids[2] = {a, a};
	assert_int_equal(kvi_kv_host_sync(kv, ids, 2), 0); /* no hook */
	assert_int_equal(kvi_kv_block_export(kv, a, buf, bb), (long)bb);
	struct hook_log h = {0, -1, 0};
	kvi_kv_set_host_sync(kv, hook, &h);
	assert_int_equal(kvi_kv_block_export(kv, a, buf, bb), (long)bb);
	assert_int_equal(h.calls, 1);
	assert_int_equal(h.last_id, a);
	assert_int_equal(kvi_kv_host_sync(kv, ids, 0), 0); /* nothing asked: not called */
	assert_int_equal(h.calls, 1);
	h.fail = -EIO;
	assert_int_equal(kvi_kv_block_export(kv, a, buf, bb), -EIO);
	assert_int_equal(kvi_kv_host_sync(kv, ids, 2), -EIO);
	kvi_kv_set_host_sync(kv, NULL, NULL);
	assert_int_equal(kvi_kv_block_export(kv, a, buf, bb), (long)bb);
	assert_int_equal(kvi_kv_block_unref(kv, a), 0);
	free(buf);
	kvi_kv_destroy(kv);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_create_bad),		cmocka_unit_test(test_alloc_refcount),
	    cmocka_unit_test(test_export_layout),	cmocka_unit_test(test_seq_reserve_truncate),
	    cmocka_unit_test(test_seq_attach_fork_cow), cmocka_unit_test(test_device_hooks),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
