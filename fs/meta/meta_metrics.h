/* meta_metrics — kvfs-meta's /metrics (docs/operations.md, "Metrics"): per-op request counts,
 * errors and latency (kvp_server's on_reply hook), and, at scrape time, the namespace and
 * cluster figures of STATFS, every node of NODES and the retention / GC / repair / scrub
 * counters of MSTATUS.
 *
 * The scrape-time figures are read through meta's own protocol, over one loopback connection
 * to its own address, so this module depends only on the wire contract (kvp.h), never on the
 * database's internals; those three requests therefore also appear in the request counters.
 * A figure whose request fails (an older meta without MSTATUS, say) is left out of the scrape.
 *
 * meta_metrics_create() before kvp_server_start (its result is the on_reply stats_ctx);
 * meta_metrics_serve() once the server listens. Thread-safe; free after kvp_server_stop.
 */
#ifndef KVFS_META_METRICS_H
#define KVFS_META_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "kvp.h"

struct meta_metrics;

int meta_metrics_create(const struct kvp_secret *secret, struct meta_metrics **out);
/* self: meta's own HOST:PORT; listen empty: no HTTP server. 0 or a negative errno (logged). */
int meta_metrics_serve(struct meta_metrics *mm, const char *self, const char *listen,
		       const char *addr_file);
/* Stops HTTP, closes the loopback connection, frees. NULL is a no-op. */
void meta_metrics_free(struct meta_metrics *mm);
/* The connection counters for kvp_server_opts.conn_stats; they live as long as mm. */
struct kvp_conn_stats *meta_metrics_conn_stats(struct meta_metrics *mm);
void meta_metrics_on_reply(void *ctx, const struct kvp_hdr *req, int32_t status, size_t reply_bytes,
			   uint64_t ns);

#endif
