/* kvfs-metrics-bench: what a daemon's metrics cost per request, against baselines measured in
 * the same run.
 *
 *   kvfs-metrics-bench [ITERS]     (default 20,000,000 per thread)
 *
 * Per request a daemon's on_reply hook does met_ops_observe (two counters and a histogram with
 * a CAS'd sum) and kvp_server reads CLOCK_MONOTONIC twice (receipt, reply). Baselines: one
 * relaxed atomic add (the cheapest possible counter) and an empty loop. Threads: 1 and 2,
 * all updating the same op (the contended worst case). Also: one scrape's render time of a
 * registry shaped like kvfs-meta's (18 ops). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "metrics.h"

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

enum mode { M_EMPTY, M_ATOMIC, M_CLOCK, M_OBSERVE, M_HOOK };

struct job {
	enum mode mode;
	long iters;
	struct met_ops *ops;
	_Atomic uint64_t *ctr;
	uint64_t sink;
};

static void *run(void *arg)
{
	struct job *j = arg;
	uint64_t sink = 0;
	for (long i = 0; i < j->iters; i++) {
		switch (j->mode) {
		case M_EMPTY:
			sink += (uint64_t)i;
			__asm__ volatile("" : : "r"(sink) : "memory");
			break;
		case M_ATOMIC:
			atomic_fetch_add_explicit(j->ctr, 1, memory_order_relaxed);
			break;
		case M_CLOCK: {
			struct timespec t;
			clock_gettime(CLOCK_MONOTONIC, &t);
			sink += (uint64_t)t.tv_nsec;
			break;
		}
		case M_OBSERVE:
			met_ops_observe(j->ops, 3, 0, (uint64_t)(i & 0xfffff));
			break;
		case M_HOOK: { /* what one request costs: two clock reads and an observe */
			struct timespec a, b;
			clock_gettime(CLOCK_MONOTONIC, &a);
			clock_gettime(CLOCK_MONOTONIC, &b);
			uint64_t ns = (uint64_t)(b.tv_nsec - a.tv_nsec) & 0xffffff;
			met_ops_observe(j->ops, 3, 0, ns);
			break;
		}
		}
	}
	j->sink = sink;
	return NULL;
}

static double ns_per_op(enum mode m, int threads, long iters, struct met_ops *ops,
			_Atomic uint64_t *ctr)
{
	pthread_t th[2];
	struct job j[2];
	double t0 = now_s();
	for (int i = 0; i < threads; i++) {
		j[i] = (struct job){.mode = m, .iters = iters, .ops = ops, .ctr = ctr};
		pthread_create(&th[i], NULL, run, &j[i]);
	}
	for (int i = 0; i < threads; i++)
		pthread_join(th[i], NULL);
	return (now_s() - t0) * 1e9 / (double)iters; /* per op of one thread */
}

int main(int argc, char **argv)
{
	long iters = argc > 1 ? atol(argv[1]) : 20000000L;
	if (iters < 1000) {
		fprintf(stderr, "usage: kvfs-metrics-bench [ITERS >= 1000]\n");
		return 2;
	}
	struct met_reg *r;
	struct met_ops *ops;
	static const char *const names[18] = {
	    "heartbeat", "lookup", "getattr", "readdir", "mkdir", "rmdir",
	    "unlink",	 "rename", "alloc",   "commit",	 "abort", "layout",
	    "statfs",	 "nodes",  "setattr", "touch",	 "maint", "mstatus"};
	if (met_reg_create(&r) || met_ops_new(r, "bench", names, 18, &ops))
		return 1;
	_Atomic uint64_t ctr = 0;
	static const char *const mname[] = {"empty loop", "atomic add (baseline)", "clock_gettime",
					    "met_ops_observe", "per request (2 clocks + observe)"};
	printf("%-34s %10s %10s %14s\n", "operation", "threads", "ns/op", "x atomic add");
	for (int threads = 1; threads <= 2; threads++) {
		double base = ns_per_op(M_ATOMIC, threads, iters, ops, &ctr);
		for (int m = M_EMPTY; m <= M_HOOK; m++) {
			double ns = m == M_ATOMIC ? base : ns_per_op(m, threads, iters, ops, &ctr);
			printf("%-34s %10d %10.2f %14.2f\n", mname[m], threads, ns, ns / base);
		}
	}
	int reps = 200;
	double t0 = now_s();
	size_t bytes = 0;
	for (int i = 0; i < reps; i++) {
		char *text;
		size_t len;
		if (met_render(r, &text, &len))
			return 1;
		bytes = len;
		free(text);
	}
	printf("render (18 ops: counters + histograms): %.1f us, %zu bytes\n",
	       (now_s() - t0) * 1e6 / reps, bytes);
	met_reg_destroy(r);
	return 0;
}
