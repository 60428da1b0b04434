/* Thread pool: a generation counter announces a job; workers spin on it, then sleep.
 *
 * A job is S = 4n shares. Each is claimed exactly once (an atomic exchange on its flag) by
 * whichever thread gets to it: thread t scans from its own shares (t*4 ...) onwards, so on an
 * idle machine every thread runs its own four, and when a worker is descheduled or still
 * waking the others take its shares. Flags are reset by the caller for each job after fn/arg
 * are written, so a claim always sees the job it belongs to. */
#include "pool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

/* ~0.1 ms of pause loops before sleeping (103 us on this Xeon; longer on CPUs with a slower
 * pause): decode issues jobs every few tens of microseconds,
 * but on an oversubscribed machine spinning steals the cores the work needs */
#define SPIN_ITERS 10000

struct kvi_pool {
	int n;
	pthread_t *th;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	/* job fields are written by the caller before gen is bumped (release) and read by
	 * workers after they see the new gen (acquire) */
	kvi_pool_fn fn;
	void *arg;
	atomic_uint gen;
	int nshares;
	atomic_int pending;  /* shares not yet finished */
	atomic_int *claimed; /* per share: 1 once someone took it (reset per job) */
	atomic_int sleepers;
	atomic_int stop;
	unsigned long long jobs; /* caller-only */
	atomic_ullong shares;
	double wait_s; /* caller-only */
};

struct worker_arg {
	struct kvi_pool *p;
	int tid;
};

/* Runs every share still unclaimed, starting at this thread's own. fn/arg were written
 * before the flags were reset, and a successful exchange is ordered after the reset. */
static void take_shares(struct kvi_pool *p, int thread)
{
	int S = p->nshares, first = thread * KVI_POOL_SHARES_PER_THREAD;
	for (int k = 0; k < S; k++) {
		int i = (first + k) % S;
		if (!atomic_exchange(&p->claimed[i], 1)) {
			p->fn(p->arg, i, S, thread);
			atomic_fetch_add_explicit(&p->shares, 1, memory_order_relaxed);
			atomic_fetch_sub(&p->pending, 1);
		}
	}
}

static void *worker(void *a)
{
	struct worker_arg wa = *(struct worker_arg *)a;
	free(a);
	struct kvi_pool *p = wa.p;
	unsigned seen =
	    0; /* gen at creation: a job announced before this thread ran is not missed */
	for (;;) {
		unsigned g;
		int spins = 0;
		while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
			if (++spins < SPIN_ITERS) {
#if defined(__x86_64__) || defined(__i386__)
				__builtin_ia32_pause();
#endif
				continue;
			}
			pthread_mutex_lock(&p->mu);
			atomic_fetch_add(&p->sleepers, 1);
			while (atomic_load(&p->gen) == seen)
				pthread_cond_wait(&p->cv, &p->mu);
			atomic_fetch_sub(&p->sleepers, 1);
			pthread_mutex_unlock(&p->mu);
			spins = 0;
		}
		seen = g;
		if (atomic_load(&p->stop))
			return NULL;
		take_shares(p, wa.tid);
	}
}

static void announce(struct kvi_pool *p)
{
	atomic_fetch_add(&p->gen, 1); /* seq_cst: ordered before the sleepers load */
	/* a worker about to sleep re-checks gen under the mutex, so broadcasting under it
	 * cannot be missed; cheap when nobody waits */
	if (atomic_load(&p->sleepers) > 0 || atomic_load(&p->stop)) {
		pthread_mutex_lock(&p->mu);
		pthread_cond_broadcast(&p->cv);
		pthread_mutex_unlock(&p->mu);
	}
}

int kvi_pool_create(int nthreads, struct kvi_pool **out)
{
	if (nthreads < 1 || nthreads > 1024)
		return -EINVAL;
	struct kvi_pool *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->n = nthreads;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	atomic_init(&p->gen, 0);
	p->th = calloc((size_t)nthreads, sizeof(pthread_t));
	p->nshares = nthreads * KVI_POOL_SHARES_PER_THREAD;
	p->claimed = calloc((size_t)p->nshares, sizeof(atomic_int));
	if (!p->th || !p->claimed) {
		free(p->th);
		free(p->claimed);
		free(p);
		return -ENOMEM;
	}
	for (int i = 0; i < p->nshares; i++)
		atomic_init(&p->claimed[i], 1);
	for (int i = 1; i < nthreads; i++) {
		struct worker_arg *wa = malloc(sizeof(*wa));
		int rc = wa ? 0 : ENOMEM;
		if (wa) {
			wa->p = p;
			wa->tid = i;
			rc = pthread_create(&p->th[i], NULL, worker, wa);
			if (rc)
				free(wa);
		}
		if (rc) {
			p->n = i; /* join the ones started */
			kvi_pool_destroy(p);
			return -rc;
		}
	}
	*out = p;
	return 0;
}

void kvi_pool_destroy(struct kvi_pool *p)
{
	if (!p)
		return;
	atomic_store(&p->stop, 1);
	announce(p);
	for (int i = 1; i < p->n; i++)
		pthread_join(p->th[i], NULL);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	free(p->th);
	free(p->claimed);
	free(p);
}

int kvi_pool_size(const struct kvi_pool *p)
{
	return p->n;
}

void kvi_pool_run(struct kvi_pool *p, kvi_pool_fn fn, void *arg)
{
	p->jobs++;
	if (p->n == 1) {
		for (int i = 0; i < p->nshares; i++)
			fn(arg, i, p->nshares, 0);
		atomic_fetch_add_explicit(&p->shares, (unsigned long long)p->nshares,
					  memory_order_relaxed);
		return;
	}
	p->fn = fn;
	p->arg = arg;
	atomic_store(&p->pending, p->nshares);
	for (int i = 0; i < p->nshares; i++)
		atomic_store(&p->claimed[i], 0);
	announce(p);
	take_shares(p, 0);
	if (atomic_load(&p->pending) == 0)
		return;
	struct timespec t0, t1; /* vDSO: ~20 ns, against jobs of tens of microseconds */
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int spins = 0;
	while (atomic_load(&p->pending) > 0) {
		if (++spins > SPIN_ITERS / 8)
			sched_yield();
#if defined(__x86_64__) || defined(__i386__)
		else
			__builtin_ia32_pause();
#endif
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	p->wait_s += (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
}

void kvi_pool_stats(const struct kvi_pool *p, struct kvi_pool_stats *st)
{
	st->jobs = p->jobs;
	st->shares = atomic_load(&p->shares);
	st->wait_s = p->wait_s;
}

void kvi_pool_split(long n, int tid, int nthreads, long align, long *lo, long *hi)
{
	if (align < 1)
		align = 1;
	long units = (n + align - 1) / align;
	long per = units / nthreads, extra = units % nthreads;
	long u0 = tid * per + (tid < extra ? tid : extra);
	long u1 = u0 + per + (tid < extra ? 1 : 0);
	*lo = u0 * align < n ? u0 * align : n;
	*hi = u1 * align < n ? u1 * align : n;
}
