/* kvfs_admin — the cluster-maintenance commands of the `kvfs` CLI (repair, drain, scrub, gc,
 * expire, jobs, node add/remove), driving kvfs-meta's MAINT / MSTATUS ops. */
#ifndef KVFS_ADMIN_H
#define KVFS_ADMIN_H

#include "kvc.h"

/* Usage lines for these commands, to append to the CLI's. */
#define KVFS_ADMIN_USAGE                                                                           \
	"  repair [NODE]          rebuild the chunks of every down node (or NODE) elsewhere\n"     \
	"  drain NODE             stop placing on NODE and move all its chunks off it\n"           \
	"  scrub                  read every chunk, check its CRC, rebuild bad or missing ones\n"  \
	"  gc                     delete chunks no metadata references (older than --gc-grace)\n"  \
	"  expire                 run the TTL expiry and watermark eviction pass now\n"            \
	"  jobs                   the repair worker's last job and the retention counters\n"       \
	"  compact                compact meta's database (after a bulk load) and wait for it\n"   \
	"  node remove NODE       forget a node that holds nothing (down, or drained)\n"           \
	"  node add               how to add a node (it joins by heartbeat)"

/* Runs cmd with its na arguments a. Returns the exit status (0 ok, 1 failure, 2 usage), or -1
 * when cmd is not an admin command. */
int kvfs_admin_cmd(struct kvc *c, const char *cmd, char **a, int na);

#endif
