/* Tests for kvch (fs/chunk): every chunk op against real kvfs-node processes (started by
 * tests/harness with a meta they heartbeat to), and the stripe read both callers share — the
 * client's degraded read (data wanted, parity fallback, direct mode) and meta's rebuild of one
 * chunk (a parity chunk wanted) — with nodes killed, empty chunks and slots that store nothing.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "harness.h"
#include "kvch.h"
#include "kvec.h"
#include "ret_tutil.h"

#define K   4
#define M   2
#define N   (K + M)
#define CS  4096u
#define TMO 5000

static struct kvh_cluster g_cl;
static int g_up;
static struct kvp_pool *g_pool;

static int setup(void **state)
{
	(void)state;
	g_up = 1;
	if (kvh_cluster_start(&g_cl, N, NULL, NULL))
		return -1;
	return kvp_pool_create(&g_cl.secret, 2000, &g_pool);
}

static int teardown(void **state)
{
	(void)state;
	kvp_pool_destroy(g_pool);
	if (g_up)
		kvh_cluster_stop(&g_cl);
	return 0;
}

static void test_transport_list(void **state)
{
	(void)state;
	int yes[] = {-ECONNRESET, -ECONNABORTED, -ECONNREFUSED, -ETIMEDOUT,
		     -EPIPE,	  -ENOTCONN,	 -EHOSTUNREACH, -ENETUNREACH};
	int no[] = {0, -ENOENT, -EILSEQ, -EBADMSG, -ENOSPC, -EIO, -EOPNOTSUPP, -EINVAL};
	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
		assert_true(kvch_is_transport(yes[i]));
	for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
		assert_false(kvch_is_transport(no[i]));
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The one retry policy: transport errors only, attempts, timeouts and the wall-clock budget
 * each end it, and the waits double up to the cap. */
static void test_retry_policy(void **state)
{
	(void)state;
	struct kvch_retry r;
	struct kvch_retry_policy p = {.attempts = 4, .first_ms = 1, .max_ms = 4};
	kvch_retry_start(&r, &p);
	assert_false(kvch_retry_again(&r, -ENOENT)); /* an answer is final */
	assert_false(kvch_retry_again(&r, 0));
	int64_t t0 = now_ms();
	int n = 0;
	while (kvch_retry_again(&r, -ECONNREFUSED))
		n++;
	assert_int_equal(n, 3); /* 4 attempts: 3 retries */
	assert_int_equal(r.retries, 3);
	assert_true(now_ms() - t0 >= 1 + 2 + 4 - 1); /* waited 1, 2, 4 ms (clock granularity) */
	assert_int_equal(r.delay_ms, 4);	     /* capped */
	assert_int_equal(kvch_retry_left_ms(&r), -1);

	/* Two timeouts end it, whatever attempts are left. */
	p = (struct kvch_retry_policy){
	    .attempts = 10, .first_ms = 1, .max_ms = 1, .max_timeouts = 2};
	kvch_retry_start(&r, &p);
	assert_true(kvch_retry_again(&r, -ETIMEDOUT));
	assert_true(kvch_retry_again(&r, -ECONNRESET));
	assert_false(kvch_retry_again(&r, -ETIMEDOUT));

	/* The budget: no attempt starts that, taking as long as the last, would end past it. */
	p = (struct kvch_retry_policy){.first_ms = 10, .max_ms = 10, .budget_ms = 300};
	kvch_retry_start(&r, &p);
	struct timespec slow = {0, 200 * 1000000L}; /* a call that took 200 ms */
	nanosleep(&slow, NULL);
	assert_false(kvch_retry_again(&r, -ECONNREFUSED));
	assert_true(kvch_retry_left_ms(&r) <= 100);
	kvch_retry_start(&r, &p); /* fast failures go on until the budget is near */
	n = 0;
	while (kvch_retry_again(&r, -ECONNREFUSED))
		n++;
	assert_true(n >= 5 && n <= 30);
	assert_true(kvch_retry_left_ms(&r) < 30);

	/* The named policies are the ones documented (kvch.h, docs/client.md). */
	struct kvch_retry_policy meta = KVCH_RETRY_META, store = KVCH_RETRY_STORE,
				 mnt = KVCH_RETRY_MOUNT;
	assert_int_equal(meta.first_ms, 50);
	assert_int_equal(meta.max_timeouts, 2);
	assert_int_equal(store.attempts, 4);
	assert_int_equal(store.first_ms, 500);
	assert_int_equal(mnt.first_ms, 250);
	assert_int_equal(mnt.attempts, 0);
}

/* PUT, GET (whole, range, wrong expectations), VERIFY, LIST, DEL on one node. */
static void test_ops(void **state)
{
	(void)state;
	const char *a = g_cl.nodes[0].addr;
	uint8_t d[1000], got[1000];
	rt_fill(d, sizeof(d), 1);
	uint32_t crc = kvec_crc32c(0, d, sizeof(d)), bad = crc ^ 1;
	struct kvch_call c;
	for (uint64_t id = 101; id <= 103; id++) {
		assert_int_equal(kvch_put_start(g_pool, a, id, crc, d, sizeof(d), &c), 0);
		assert_int_equal(kvch_put_finish(&c, TMO), 0);
	}
	assert_int_equal(kvch_put_finish(&c, TMO), -EAGAIN); /* idle */

	assert_int_equal(kvch_get_start(g_pool, a, 101, 0, KVCH_TO_END, &c), 0);
	assert_int_equal(kvch_get_finish(&c, TMO, got, sizeof(got), &crc), 0);
	assert_memory_equal(got, d, sizeof(d));
	assert_int_equal(kvch_get_start(g_pool, a, 101, 100, 50, &c), 0);
	assert_int_equal(kvch_get_finish(&c, TMO, got, 50, NULL), 0);
	assert_memory_equal(got, d + 100, 50);
	/* Not the chunk metadata recorded: another CRC or another length. */
	assert_int_equal(kvch_get_start(g_pool, a, 101, 0, KVCH_TO_END, &c), 0);
	assert_int_equal(kvch_get_finish(&c, TMO, got, sizeof(got), &bad), -EILSEQ);
	assert_int_equal(kvch_get_start(g_pool, a, 101, 0, KVCH_TO_END, &c), 0);
	assert_int_equal(kvch_get_finish(&c, TMO, got, sizeof(got) - 1, NULL), -EILSEQ);

	assert_int_equal(kvch_verify_start(g_pool, a, 102, &c), 0);
	assert_int_equal(kvch_verify_finish(&c, TMO, sizeof(d), crc), 0);
	assert_int_equal(kvch_verify_start(g_pool, a, 102, &c), 0);
	assert_int_equal(kvch_verify_finish(&c, TMO, sizeof(d), bad), -EILSEQ);
	assert_int_equal(kvch_verify_start(g_pool, a, 999, &c), 0);
	assert_int_equal(kvch_verify_finish(&c, TMO, sizeof(d), crc), -ENOENT);

	/* LIST pages: 2 then 1. */
	struct kvch_entry e[3];
	uint32_t n = 0;
	int more = 0;
	assert_int_equal(kvch_list(g_pool, a, 100, 2, TMO, e, &n, &more), 0);
	assert_int_equal(n, 2);
	assert_true(more);
	assert_true(e[0].chunk_id == 101 && e[1].chunk_id == 102 && e[0].mtime_ns > 0);
	assert_int_equal(kvch_list(g_pool, a, 102, 3, TMO, e, &n, &more), 0);
	assert_int_equal(n, 1);
	assert_false(more);
	assert_true(e[0].chunk_id == 103);

	uint64_t ids[] = {101, 102, 103, 555};
	uint32_t deleted = 0;
	assert_int_equal(kvch_del(g_pool, a, ids, 4, TMO, &deleted), 0);
	assert_int_equal(deleted, 3);
	assert_int_equal(kvch_get_start(g_pool, a, 101, 0, KVCH_TO_END, &c), 0);
	assert_int_equal(kvch_get_finish(&c, TMO, got, sizeof(got), NULL), -ENOENT);
	assert_int_equal(kvch_list(g_pool, a, 0, 3, TMO, e, &n, &more), 0);
	assert_int_equal(n, 0);
}

/* A stripe stored on the 6 nodes: data chunk lengths lens[0..K-1] (0: empty, not stored). */
struct stripe_fx {
	struct kvec_codec *codec;
	uint8_t chunk[N][CS]; /* as encoded, zero-padded */
	struct kvch_stripe st;
	int fails[N]; /* failed() calls per chunk */
	int last_rc[N];
};

static int fx_usable(void *arg, int i)
{
	(void)arg;
	(void)i;
	return 1;
}

static void fx_failed(void *arg, int i, int rc)
{
	struct stripe_fx *fx = arg;
	fx->fails[i]++;
	fx->last_rc[i] = rc;
}

static void fx_store(struct stripe_fx *fx, const uint32_t *lens, uint64_t base)
{
	memset(fx, 0, sizeof(*fx));
	assert_int_equal(kvec_codec_create(K, M, &fx->codec), 0);
	const uint8_t *data[K];
	uint8_t *par[M];
	for (int j = 0; j < K; j++) {
		rt_fill(fx->chunk[j], lens[j], base + (uint64_t)j);
		data[j] = fx->chunk[j];
	}
	for (int i = 0; i < M; i++)
		par[i] = fx->chunk[K + i];
	assert_int_equal(kvec_encode(fx->codec, data, par, lens[0]), 0);
	struct kvch_stripe *st = &fx->st;
	*st = (struct kvch_stripe){.pool = g_pool,
				   .codec = fx->codec,
				   .k = K,
				   .m = M,
				   .timeout_ms = TMO,
				   .usable = fx_usable,
				   .failed = fx_failed,
				   .arg = fx};
	for (int i = 0; i < N; i++) {
		uint32_t len = i < K ? lens[i] : lens[0];
		uint32_t crc = kvec_crc32c(0, fx->chunk[i], len);
		st->slot[i] = (struct kvch_slot){.addr = g_cl.nodes[i].addr,
						 .node_id = (uint32_t)i + 1,
						 .chunk_id = base + (uint64_t)i,
						 .crc = crc,
						 .len = len};
		if (!len)
			continue;
		struct kvch_call c;
		assert_int_equal(kvch_put_start(g_pool, st->slot[i].addr, base + (uint64_t)i, crc,
						fx->chunk[i], len, &c),
				 0);
		assert_int_equal(kvch_put_finish(&c, TMO), 0);
	}
}

/* Reads the data chunks as the client does; checks them against what was stored. */
static int fx_read(struct stripe_fx *fx, int direct, uint64_t *failed)
{
	static uint8_t buf[N][CS];
	memset(buf, 0xAA, sizeof(buf));
	uint8_t *ptr[N];
	uint64_t want = 0;
	for (int i = 0; i < N; i++) {
		ptr[i] = buf[i];
		if (i < K && fx->st.slot[i].len)
			want |= 1ull << i;
	}
	struct kvch_fetch f = {0};
	kvch_fetch_start(&fx->st, &f, (1ull << K) - 1);
	int rc = kvch_stripe_read(&fx->st, &f, ptr, want, 0, direct, failed);
	assert_int_equal(f.started, 0);
	if (rc >= 0)
		for (int j = 0; j < K; j++)
			assert_memory_equal(buf[j], fx->chunk[j], fx->st.slot[j].len);
	return rc;
}

static void test_stripe_read(void **state)
{
	(void)state;
	static struct stripe_fx fx;
	uint32_t lens[K] = {CS, CS, 1000, 0}; /* a last stripe: short chunk, empty chunk */
	fx_store(&fx, lens, 1000);
	uint64_t failed = 0;
	assert_int_equal(fx_read(&fx, 1, &failed), 0); /* healthy: no decode, no parity */
	assert_int_equal(fx_read(&fx, 0, NULL), 0);
	for (int i = 0; i < N; i++)
		assert_int_equal(fx.fails[i], 0);

	/* Meta's rebuild of parity chunk 1 from the others (its own slot not asked). */
	static uint8_t rb[N][CS];
	uint8_t *rp[N];
	for (int i = 0; i < N; i++)
		rp[i] = rb[i];
	uint64_t all = (1ull << N) - 1, want = 1ull << (K + 1);
	struct kvch_fetch f = {0};
	kvch_fetch_start(&fx.st, &f, all & ~want);
	assert_int_equal(f.started, all & ~want & ~(1ull << 3)); /* chunk 3 is empty */
	assert_int_equal(kvch_stripe_read(&fx.st, &f, rp, want, all & ~f.started, 0, NULL), 1);
	assert_memory_equal(rb[K + 1], fx.chunk[K + 1], CS);

	/* A slot written degraded (node 0) is never asked: decoded around. */
	fx.st.slot[1].node_id = 0;
	fx.st.slot[1].addr = NULL;
	assert_int_equal(fx_read(&fx, 0, NULL), 1);
	assert_int_equal(fx.fails[1], 0);
	fx.st.slot[1].node_id = 2;
	fx.st.slot[1].addr = g_cl.nodes[1].addr;

	/* Data nodes 0 and 2 killed: direct mode names them; the degraded read decodes from
	 * parity, and each failure reached the hook as a transport error. */
	assert_int_equal(kvh_node_kill(&g_cl, 0, SIGKILL), 0);
	assert_int_equal(kvh_node_kill(&g_cl, 2, SIGKILL), 0);
	assert_int_equal(fx_read(&fx, 1, &failed), -EAGAIN);
	/* Only chunks asked and failed: one whose GET could not even start (refused) stays a
	 * candidate for the degraded read. */
	assert_int_equal(failed & ~((1ull << 0) | (1ull << 2)), 0);
	assert_true(fx.fails[0] && fx.fails[2] && !fx.fails[1] && !fx.fails[4]);
	assert_true(kvch_is_transport(fx.last_rc[0]) && kvch_is_transport(fx.last_rc[2]));
	assert_int_equal(fx_read(&fx, 0, NULL), 1);

	/* A third node down: fewer than k chunks, -EIO and nothing claimed. */
	assert_int_equal(kvh_node_kill(&g_cl, 4, SIGKILL), 0);
	assert_int_equal(fx_read(&fx, 0, NULL), -EIO);
	kvec_codec_destroy(fx.codec);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_transport_list),
	    cmocka_unit_test(test_retry_policy),
	    cmocka_unit_test(test_ops),
	    cmocka_unit_test(test_stripe_read),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
