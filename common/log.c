#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* The one piece of process-wide mutable state: a log level must be settable before any
 * module object exists (flag parsing), and every thread reads it on each log call. -1 = unread. */
static atomic_int g_level = -1;

void kvfs_log_set_level(int level)
{
	if (level < KVFS_LOG_ERROR)
		level = KVFS_LOG_ERROR;
	if (level > KVFS_LOG_DEBUG)
		level = KVFS_LOG_DEBUG;
	atomic_store(&g_level, level);
}

int kvfs_log_level(void)
{
	int l = atomic_load(&g_level);
	if (l >= 0)
		return l;
	l = KVFS_LOG_INFO;
	const char *e = getenv("KVFS_LOG_LEVEL");
	if (e && e[0] >= '0' && e[0] <= '3' && e[1] == 0)
		l = e[0] - '0';
	atomic_store(&g_level, l);
	return l;
}

void kvfs_log_at(int level, const char *tag, const char *fmt, ...)
{
	static const char *names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);

	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	gmtime_r(&ts.tv_sec, &tm);
	if (level < 0 || level > 3)
		level = 3;
	fprintf(stderr, "%02d:%02d:%02d.%03ld %s %s: %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
		ts.tv_nsec / 1000000, names[level], tag, msg);
}
