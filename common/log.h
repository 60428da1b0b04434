/* log — one logging call for every module.
 *
 * Each .c file may define KVFS_LOG_TAG (a short module name) before including this header.
 * Lines go to stderr as "<time> <level> <tag>: message". Thread-safe: one fprintf per line.
 */
#ifndef KVFS_LOG_H
#define KVFS_LOG_H

enum kvfs_log_level {
	KVFS_LOG_ERROR = 0,
	KVFS_LOG_WARN = 1,
	KVFS_LOG_INFO = 2,
	KVFS_LOG_DEBUG = 3,
};

#ifndef KVFS_LOG_TAG
#define KVFS_LOG_TAG "kvfs"
#endif

/* The level is process-wide (it mirrors a daemon's --log-level flag); the default is INFO, or
 * the value of the environment variable KVFS_LOG_LEVEL (0-3) read on first use. */
void kvfs_log_set_level(int level);
int kvfs_log_level(void);

void kvfs_log_at(int level, const char *tag, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define klog(level, ...)                                                                           \
	do {                                                                                       \
		if ((level) <= kvfs_log_level())                                                   \
			kvfs_log_at((level), KVFS_LOG_TAG, __VA_ARGS__);                           \
	} while (0)
#define klog_error(...) klog(KVFS_LOG_ERROR, __VA_ARGS__)
#define klog_warn(...)	klog(KVFS_LOG_WARN, __VA_ARGS__)
#define klog_info(...)	klog(KVFS_LOG_INFO, __VA_ARGS__)
#define klog_debug(...) klog(KVFS_LOG_DEBUG, __VA_ARGS__)

#endif
