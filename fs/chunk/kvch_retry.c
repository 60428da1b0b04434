/* kvch_retry: the one retry policy of chunk and metadata calls (kvch.h, "Retry policy"). */
#include "kvch.h"

#include <errno.h>
#include <time.h>

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
	while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
		;
}

void kvch_retry_start(struct kvch_retry *r, const struct kvch_retry_policy *p)
{
	r->p = *p;
	r->attempt_ms = mono_ms();
	r->deadline_ms = p->budget_ms > 0 ? r->attempt_ms + p->budget_ms : 0;
	r->retries = 0;
	r->timeouts = 0;
	r->delay_ms = p->first_ms;
}

int kvch_retry_wait(struct kvch_retry *r, int rc)
{
	if (rc == -ETIMEDOUT && r->p.max_timeouts > 0 && ++r->timeouts >= r->p.max_timeouts)
		return 0;
	if (r->p.attempts > 0 && r->retries + 1 >= r->p.attempts)
		return 0;
	int64_t now = mono_ms();
	/* A failed call can cost far more than the wait (a timeout, or a client's own retries
	 * under it): the next one starts only if, taking as long as this one, it would end
	 * before the deadline, so the caller answers within its budget. */
	if (r->deadline_ms && now + r->delay_ms + (now - r->attempt_ms) > r->deadline_ms)
		return 0;
	sleep_ms(r->delay_ms);
	r->delay_ms = r->delay_ms * 2 > r->p.max_ms ? r->p.max_ms : r->delay_ms * 2;
	r->retries++;
	r->attempt_ms = mono_ms();
	return 1;
}

int kvch_retry_again(struct kvch_retry *r, int rc)
{
	return kvch_is_transport(rc) && kvch_retry_wait(r, rc);
}

int kvch_retry_left_ms(const struct kvch_retry *r)
{
	if (!r->deadline_ms)
		return -1;
	int64_t left = r->deadline_ms - mono_ms();
	return left > 0 ? (int)left : 0;
}
