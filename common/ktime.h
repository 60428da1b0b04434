/* ktime — small time helpers shared by the modules (header only). */
#ifndef KVFS_KTIME_H
#define KVFS_KTIME_H

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

#endif
