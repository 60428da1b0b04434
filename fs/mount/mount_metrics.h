/* mount_metrics — kvfs-mount's /metrics (docs/operations.md, "Metrics"): FUSE requests and
 * their handler time per operation, the mount's own counters (struct mnt_counters) and the
 * client library's (kvc_get_stats: bytes, files committed, degraded reads, CRC errors).
 *
 * mnt_metrics_start() returns, in *ops, a copy of mnt_ops whose every handler counts and times
 * the real one (give it to fuse_session_new); with an empty --metrics-listen it still counts, but
 * serves nothing. Thread-safe. mnt_metrics_stop() after the session is destroyed.
 */
#ifndef KVFS_MOUNT_METRICS_H
#define KVFS_MOUNT_METRICS_H

#include "mount.h"

struct mnt_metrics;

/* m->c must be open. 0 or a negative errno (logged). Sets m->metrics. */
int mnt_metrics_start(struct mnt *m, const struct fuse_lowlevel_ops **ops);
/* Stops serving and frees m->metrics. NULL metrics is a no-op. */
void mnt_metrics_stop(struct mnt *m);

#endif
