/* pool — a small persistent thread pool for the forward pass (no thread creation per op).
 *
 * kvi_pool_run(p, fn, arg) calls fn(arg, tid, n) once on each of the n threads (the caller is
 * tid 0, n - 1 workers are the pool's) and returns when all have returned. fn splits its work
 * by tid itself, statically, so which thread computes what is a pure function of (tid, n).
 * Workers spin briefly between jobs (decode issues thousands of small jobs a second), then
 * sleep on a condition variable.
 *
 * Thread-safety: one kvi_pool_run at a time per pool (the engine is single-caller). */
#ifndef KVFS_KVI_POOL_H
#define KVFS_KVI_POOL_H

struct kvi_pool;

typedef void (*kvi_pool_fn)(void *arg, int tid, int nthreads);

/* nthreads >= 1 (1 = no workers, run inline). Returns 0, -EINVAL or -ENOMEM / -errno of
 * pthread_create. */
int kvi_pool_create(int nthreads, struct kvi_pool **out);
/* Joins the workers. NULL is a no-op. */
void kvi_pool_destroy(struct kvi_pool *p);
int kvi_pool_size(const struct kvi_pool *p);
void kvi_pool_run(struct kvi_pool *p, kvi_pool_fn fn, void *arg);

/* [*lo, *hi) = part tid of n items split into nthreads contiguous parts whose boundaries are
 * multiples of align (except the end). */
void kvi_pool_split(long n, int tid, int nthreads, long align, long *lo, long *hi);

#endif
