/* node_metrics — kvfs-node's /metrics (docs/operations.md, "Metrics"): per-op request counts,
 * errors and latency (through kvp_server's on_reply hook), bytes in and out, and the store's
 * chunks, bytes, capacity and CRC errors read at scrape time.
 *
 * node_metrics_start() registers everything and, when listen is non-empty, serves it over HTTP.
 * node_metrics_on_reply is the kvp_server_opts.on_reply hook (stats_ctx: the node_metrics); it is
 * thread-safe. Stop order: kvp server, node_metrics_stop (no more scrapes of the store), node
 * store, node_metrics_free (replies may still come while the store drains).
 */
#ifndef KVFS_NODE_METRICS_H
#define KVFS_NODE_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "kvp.h"

struct node_store;
struct node_metrics;

/* 0 or a negative errno (logged). addr_file may be empty. */
int node_metrics_start(struct node_store *s, const char *listen, const char *addr_file,
		       struct node_metrics **out);
/* Stops the HTTP server. NULL is a no-op. */
void node_metrics_stop(struct node_metrics *m);
/* Frees everything (stops HTTP first if still running). NULL is a no-op. */
void node_metrics_free(struct node_metrics *m);
/* The connection counters for kvp_server_opts.conn_stats; they live as long as m. */
struct kvp_conn_stats *node_metrics_conn_stats(struct node_metrics *m);
void node_metrics_on_reply(void *ctx, const struct kvp_hdr *req, int32_t status, size_t reply_bytes,
			   uint64_t ns);

#endif
