/* kvfs-mount's option table (common/cfg.h): one row per option fills struct mnt_cfg; the
 * command line, -o lists, --config files, --help and .kvfs/config all come from it. */
#include "mount.h"

#include <stddef.h>

#define O(name, type, field, lo, hi, def, help)                                                    \
	{                                                                                          \
		name, type, offsetof(struct mnt_cfg, field), lo, hi, def, help                     \
	}

const struct cfg_opt mnt_cfg_opts[] = {
    O("secret-file", CFG_STR, secret_file, 0, 0, NULL, "file holding the cluster secret"),
    O("entry-timeout", CFG_SECS, entry_timeout, 0, 86400, "1s",
      "how long the kernel caches a name"),
    O("attr-timeout", CFG_SECS, attr_timeout, 0, 86400, "10s",
      "how long the kernel caches attributes"),
    O("timeout", CFG_SECS, timeout, 0.1, 600, "5s", "per request to meta or a node"),
    O("meta-retry", CFG_SECS, meta_retry, 0, 3600, "30s",
      "keep retrying reads of metadata this long (from the request's start) while meta is "
      "away; then EIO"),
    O("max-file", CFG_SIZE, max_file, 4096, 1e15, "1G",
      "largest file one writer may buffer (larger: EFBIG)"),
    O("max-buffered", CFG_SIZE, max_buffered, 1 << 20, 1e15, "2G",
      "memory all files being written may buffer together"),
    O("readahead", CFG_SIZE, readahead, 0, 1 << 30, "4M",
      "kernel read-ahead window for sequential reads"),
    O("k", CFG_INT, k, 0, 64, "0", "data chunks per stripe of new files (0: cluster default)"),
    O("m", CFG_INT, m, 0, 16, "0", "parity chunks per stripe (0: cluster default)"),
    O("chunk", CFG_SIZE, chunk, 0, 16 << 20, "0", "largest chunk of new files (0: cluster's)"),
    O("threads", CFG_INT, threads, 1, 1024, "16", "FUSE worker threads at most"),
    O("log-level", CFG_INT, log_level, 0, 3, "2", "0 error, 1 warn, 2 info, 3 debug"),
    O("log-file", CFG_STR, log_file, 0, 0, NULL, "log here in the background (default: none)"),
    O("metrics-listen", CFG_STR, metrics_listen, 0, 0, NULL,
      "HOST:PORT to serve Prometheus /metrics on (port 0: any; empty: off)"),
    O("metrics-addr-file", CFG_STR, metrics_addr_file, 0, 0, NULL,
      "once serving metrics, write their HOST:PORT here (atomically)"),
    O("foreground", CFG_BOOL, foreground, 0, 0, "false", "stay in the foreground (-f)"),
    O("debug", CFG_BOOL, debug, 0, 0, "false", "trace FUSE requests; implies foreground (-d)"),
    O("allow-other", CFG_BOOL, allow_other, 0, 0, "false", "let other users use the mount"),
    O("readdirplus", CFG_BOOL, readdirplus, 0, 0, "true", "directory listings carry attributes"),
    O("xattr", CFG_BOOL, xattr, 0, 0, "true",
      "user.kvfs.* attributes (false: the kernel stops asking, ls -l saves 2 requests a file)"),
    O("keep-cache", CFG_BOOL, keep_cache, 0, 0, "true",
      "keep the page cache of (immutable) files across opens"),
    O("lookup-layout", CFG_BOOL, lookup_layout, 0, 0, "true",
      "a lookup brings the file's layout: its open needs no metadata round trip of its own"),
    O("open-prefetch", CFG_BOOL, open_prefetch, 0, 0, "true",
      "a read open of a file the kernel holds no pages of starts the GETs of its first stripe, "
      "so they overlap the kernel's first READ round trip"),
    O("splice-write", CFG_BOOL, splice_write, 0, 0, "false",
      "writes spliced out of /dev/fuse: one copy of the data in the mount, not two (measured "
      "no cheaper here: docs/benchmarks.md)"),
    O("lease-after", CFG_INT, lease_after, 0, 1000000, "32",
      "after meta found this many names looked up in one directory within a second, take a lease "
      "on the directory and answer its lookups from its listing until meta revokes it (0: never)"),
    O("lease", CFG_SECS, lease, 0.01, 1, "1s",
      "length of a directory lease asked for (meta grants at most 1 s)"),
    O("lease-pin", CFG_SECS, lease_pin, 0, 3600, "0",
      "how long the kernel may keep a name answered from a directory lease: the lease is kept "
      "renewed meanwhile, and the kernel's names dropped when it is revoked or lost (0: no "
      "longer than the lease has left, the default: docs/mount.md says why)"),
    CFG_END,
};
