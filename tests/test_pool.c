/* Tests for engine/pool: every share of every job runs exactly once, with the arguments the
 * header promises, over many rounds and thread counts (workers spinning, sleeping and
 * waking, shares taken over from slow threads), and the counters kvi_pool_stats reports.
 * A job that lost a share, ran one twice, or returned before a share finished fails here. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "pool.h"

#define MAXS (8 * KVI_POOL_SHARES_PER_THREAD)

struct job {
	int nthreads;
	unsigned round;
	atomic_int runs[MAXS]; /* fn calls per share */
	atomic_int bad;	       /* calls with arguments out of the header's ranges */
	atomic_int busy[8];    /* per thread index: shares it is running now (must be <= 1) */
	atomic_int done[MAXS]; /* set as the share's last act: all must be set on return */
};

static void spin_ns(long ns)
{
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	do
		clock_gettime(CLOCK_MONOTONIC, &b);
	while ((b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec) < ns);
}

static void share_fn(void *arg, int share, int nshares, int thread)
{
	struct job *j = arg;
	if (share < 0 || share >= nshares || nshares != j->nthreads * KVI_POOL_SHARES_PER_THREAD ||
	    thread < 0 || thread >= j->nthreads)
		atomic_fetch_add(&j->bad, 1);
	if (thread >= 0 && thread < 8 && atomic_fetch_add(&j->busy[thread], 1) != 0)
		atomic_fetch_add(&j->bad, 1); /* two shares at once under one thread index */
	if (share >= 0 && share < MAXS) {
		atomic_fetch_add(&j->runs[share], 1);
		/* a few shares take long, so other threads must take over the rest; some rounds
		 * pause between jobs long enough that the workers go to sleep */
		if ((j->round * 7u + (unsigned)share) % 13u == 0)
			spin_ns(50000);
	}
	if (thread >= 0 && thread < 8)
		atomic_fetch_sub(&j->busy[thread], 1);
	if (share >= 0 && share < MAXS)
		atomic_store(&j->done[share], 1);
}

static void run_rounds(int nthreads, int rounds)
{
	struct kvi_pool *p = NULL;
	assert_int_equal(kvi_pool_create(nthreads, &p), 0);
	assert_int_equal(kvi_pool_size(p), nthreads);
	int S = nthreads * KVI_POOL_SHARES_PER_THREAD;
	struct kvi_pool_stats st0, st1;
	kvi_pool_stats(p, &st0);
	for (int r = 0; r < rounds; r++) {
		static struct job j;
		j.nthreads = nthreads;
		j.round = (unsigned)r;
		atomic_store(&j.bad, 0);
		for (int i = 0; i < MAXS; i++) {
			atomic_store(&j.runs[i], 0);
			atomic_store(&j.done[i], 0);
		}
		for (int i = 0; i < 8; i++)
			atomic_store(&j.busy[i], 0);
		kvi_pool_run(p, share_fn, &j);
		/* read right after the return: a share still running, or one run late, shows */
		for (int i = 0; i < S; i++) {
			if (atomic_load(&j.runs[i]) != 1 || !atomic_load(&j.done[i]))
				fail_msg("threads %d round %d: share %d ran %d times (done %d)",
					 nthreads, r, i, atomic_load(&j.runs[i]),
					 atomic_load(&j.done[i]));
		}
		for (int i = S; i < MAXS; i++)
			assert_int_equal(atomic_load(&j.runs[i]), 0);
		assert_int_equal(atomic_load(&j.bad), 0);
		if (r % 97 == 0)
			usleep(
			    2000); /* past the workers' spin: they sleep, the next job wakes them */
	}
	/* a late duplicate run would land after the check above: look once more */
	usleep(1000);
	kvi_pool_stats(p, &st1);
	assert_int_equal(st1.jobs - st0.jobs, (unsigned long long)rounds);
	assert_int_equal(st1.shares - st0.shares, (unsigned long long)rounds * (unsigned)S);
	assert_true(st1.wait_s >= st0.wait_s);
	kvi_pool_destroy(p);
}

static void test_every_share_once(void **st)
{
	(void)st;
	for (int n = 1; n <= 5; n++)
		run_rounds(n, n == 1 ? 200 : 2000);
	/* varying thread counts back to back, pools created and destroyed between */
	for (int k = 0; k < 20; k++)
		run_rounds(1 + k % 4, 50);
}

static void test_create_errors(void **st)
{
	(void)st;
	struct kvi_pool *p = NULL;
	assert_int_equal(kvi_pool_create(0, &p), -EINVAL);
	assert_int_equal(kvi_pool_create(-1, &p), -EINVAL);
	kvi_pool_destroy(NULL);
}

static void test_split(void **st)
{
	(void)st;
	/* parts cover [0, n) in order, each boundary a multiple of align (but the end) */
	for (long n = 0; n < 200; n += 7)
		for (int nth = 1; nth <= 9; nth++)
			for (long align = 1; align <= 32; align *= 4) {
				long prev = 0;
				for (int t = 0; t < nth; t++) {
					long lo, hi;
					kvi_pool_split(n, t, nth, align, &lo, &hi);
					assert_int_equal(lo, prev);
					assert_true(hi >= lo);
					assert_true(lo % align == 0 || lo == n);
					prev = hi;
				}
				assert_int_equal(prev, n);
			}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_every_share_once),
	    cmocka_unit_test(test_create_errors),
	    cmocka_unit_test(test_split),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
