/* pool — a small persistent thread pool for the forward pass (no thread creation per op).
 *
 * kvi_pool_run(p, fn, arg) calls fn(arg, share, nshares, thread) exactly once for each share
 * 0 <= share < nshares (nshares = KVI_POOL_SHARES_PER_THREAD * threads, fixed per pool) and
 * returns when all have returned. Threads take shares dynamically (their own first, then any
 * left), so a descheduled or late worker never stalls a job: the others take its shares. fn
 * splits its work by share statically, so what a share computes is a pure function of
 * (share, nshares) whichever thread runs it; per-thread scratch is indexed by `thread`
 * (0 = the caller), which is unique among concurrently running shares.
 * Workers spin briefly between jobs (decode issues thousands of small jobs a second), then
 * sleep on a condition variable.
 *
 * Thread-safety: one kvi_pool_run at a time per pool (the engine is single-caller). */
#ifndef KVFS_KVI_POOL_H
#define KVFS_KVI_POOL_H

struct kvi_pool;

#define KVI_POOL_SHARES_PER_THREAD 4

typedef void (*kvi_pool_fn)(void *arg, int share, int nshares, int thread);

/* nthreads >= 1 (1 = no workers, run inline). Returns 0, -EINVAL or -ENOMEM / -errno of
 * pthread_create. */
int kvi_pool_create(int nthreads, struct kvi_pool **out);
/* Joins the workers. NULL is a no-op. */
void kvi_pool_destroy(struct kvi_pool *p);
int kvi_pool_size(const struct kvi_pool *p); /* threads */
void kvi_pool_run(struct kvi_pool *p, kvi_pool_fn fn, void *arg);

/* What the pool has done since it was created, for benchmarks: jobs = kvi_pool_run calls,
 * shares = fn calls (jobs x nshares when every job ran whole), wait_s = seconds the caller spent
 * after running the shares it could take, waiting for workers to finish theirs (a worker still
 * waking, descheduled, or given the larger share). Counted only with workers (nthreads > 1).
 * Read by the pool's single caller between runs. */
struct kvi_pool_stats {
	unsigned long long jobs, shares;
	double wait_s;
};
void kvi_pool_stats(const struct kvi_pool *p, struct kvi_pool_stats *st);

/* [*lo, *hi) = part tid of n items split into nthreads contiguous parts whose boundaries are
 * multiples of align (except the end). */
void kvi_pool_split(long n, int tid, int nthreads, long align, long *lo, long *hi);

#endif
