/* ktime — small time helpers shared by the modules (header only). */
#ifndef KVFS_KTIME_H
#define KVFS_KTIME_H

#include <pthread.h>
#include <time.h>

/* *ts = now on clock clk + ms milliseconds (ms >= 0): the absolute deadline that
 * pthread_cond_timedwait and friends take. */
static inline void kvfs_deadline(struct timespec *ts, clockid_t clk, long ms)
{
	clock_gettime(clk, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

/* A condition variable whose timed waits take CLOCK_MONOTONIC deadlines (kvfs_deadline with
 * CLOCK_MONOTONIC), so a wall-clock step never shortens or stretches a wait. 0 or an errno. */
static inline int kvfs_cond_init_mono(pthread_cond_t *c)
{
	pthread_condattr_t ca;
	int rc = pthread_condattr_init(&ca);
	if (rc)
		return rc;
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	rc = pthread_cond_init(c, &ca);
	pthread_condattr_destroy(&ca);
	return rc;
}

#endif
