/* kvfs-node metrics: see node_metrics.h. */
#define KVFS_LOG_TAG "node"
#include "node_metrics.h"
#include "kvp_conn_metrics.h"
#include "log.h"
#include "metrics.h"
#include "node_store.h"

#include <errno.h>
#include <stdlib.h>

enum { OP_PUT, OP_GET, OP_DEL, OP_LIST, OP_STAT, OP_VERIFY, OP_N };
static const char *const op_names[OP_N] = {"put", "get", "del", "list", "stat", "verify"};

struct node_metrics {
	struct met_reg *r;
	struct met_http *http;
	struct node_store *s;
	struct met_ops *ops;
	struct met_counter *rx, *tx, *put_bytes, *get_bytes;
	struct kvp_conn_stats conn;
};

struct kvp_conn_stats *node_metrics_conn_stats(struct node_metrics *m)
{
	return &m->conn;
}

static int op_index(uint16_t op)
{
	switch (op) {
	case KVP_OP_PUT:
		return OP_PUT;
	case KVP_OP_GET:
		return OP_GET;
	case KVP_OP_DEL:
		return OP_DEL;
	case KVP_OP_LIST:
		return OP_LIST;
	case KVP_OP_STAT:
		return OP_STAT;
	case KVP_OP_VERIFY:
		return OP_VERIFY;
	}
	return -1;
}

void node_metrics_on_reply(void *ctx, const struct kvp_hdr *req, int32_t status, size_t reply_bytes,
			   uint64_t ns)
{
	struct node_metrics *m = ctx;
	int i = op_index(req->op);
	met_ops_observe(m->ops, i, status != 0, ns);
	met_counter_add(m->rx, req->len);
	met_counter_add(m->tx, reply_bytes);
	/* payload only: PUT's body is u64 id, u32 crc, u32 len, then the chunk; GET's reply is
	 * u32 crc, u32 len, then the bytes */
	if (!status && i == OP_PUT && req->len >= 16)
		met_counter_add(m->put_bytes, req->len - 16);
	if (!status && i == OP_GET && reply_bytes >= 8)
		met_counter_add(m->get_bytes, reply_bytes - 8);
}

static void collect(void *ctx, struct met_out *o)
{
	struct node_metrics *m = ctx;
	struct node_stats st;
	node_store_stats(m->s, &st);
	met_out_family(o, "kvfs_node_chunks", "gauge", "Chunks stored");
	met_out_sample(o, "kvfs_node_chunks", NULL, (double)st.chunks);
	met_out_family(o, "kvfs_node_used_bytes", "gauge", "Bytes of chunk data stored");
	met_out_sample(o, "kvfs_node_used_bytes", NULL, (double)st.used);
	met_out_family(o, "kvfs_node_capacity_bytes", "gauge",
		       "Bytes of chunk data this node can hold: chunks held + free disk - "
		       "--reserve, capped by --capacity");
	met_out_sample(o, "kvfs_node_capacity_bytes", NULL, (double)st.capacity);
	met_out_family(o, "kvfs_node_usage_ratio", "gauge", "used / capacity");
	met_out_sample(o, "kvfs_node_usage_ratio", NULL,
		       st.capacity ? (double)st.used / (double)st.capacity : 0);
	met_out_family(o, "kvfs_node_disk_size_bytes", "gauge",
		       "Size of the data directory's filesystem (statvfs)");
	met_out_sample(o, "kvfs_node_disk_size_bytes", NULL, (double)st.disk_total);
	met_out_family(o, "kvfs_node_disk_free_bytes", "gauge",
		       "Free bytes of the data directory's filesystem for unprivileged writers");
	met_out_sample(o, "kvfs_node_disk_free_bytes", NULL, (double)st.disk_avail);
	met_out_family(o, "kvfs_node_crc_errors_total", "counter",
		       "Stored chunks found failing their CRC32C on read since start");
	met_out_sample(o, "kvfs_node_crc_errors_total", NULL, (double)st.crc_errors);
	kvp_conn_stats_collect(o, "kvfs_node", &m->conn);
	kvp_client_conn_stats_collect(o, "kvfs_node_client"); /* to meta, to other nodes */
}

int node_metrics_start(struct node_store *s, const char *listen, const char *addr_file,
		       struct node_metrics **out)
{
	struct node_metrics *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->s = s;
	int rc = met_reg_create(&m->r);
	if (rc) {
		free(m);
		return rc;
	}
	rc = met_ops_new(m->r, "kvfs_node", op_names, OP_N, &m->ops);
	m->rx = met_counter_new(m->r, "kvfs_node_received_bytes_total",
				"Request body bytes received (all ops)", NULL);
	m->tx = met_counter_new(m->r, "kvfs_node_sent_bytes_total",
				"Reply body bytes sent (all ops)", NULL);
	m->put_bytes = met_counter_new(m->r, "kvfs_node_put_bytes_total",
				       "Chunk bytes stored by successful PUTs", NULL);
	m->get_bytes = met_counter_new(m->r, "kvfs_node_get_bytes_total",
				       "Chunk bytes returned by successful GETs", NULL);
	struct met_hist *disk[3];
	static const char *const disk_ops[3] = {"put", "get", "del"};
	for (int i = 0; i < 3; i++) {
		const char *lab[] = {"op", disk_ops[i], NULL};
		disk[i] =
		    met_hist_new(m->r, "kvfs_node_disk_duration_seconds",
				 "Disk time of a request: handed to an I/O ring until its disk "
				 "work ended (queue wait included; CRC check and reply not)",
				 lab, NULL, 0);
	}
	if (!rc)
		rc = met_collector_add(m->r, collect, m);
	if (!rc)
		rc = met_http_serve(m->r, listen, addr_file, &m->http);
	if (rc) {
		met_reg_destroy(m->r);
		free(m);
		return rc;
	}
	node_store_set_disk_hist(s, disk[0], disk[1], disk[2]);
	*out = m;
	return 0;
}

void node_metrics_stop(struct node_metrics *m)
{
	if (!m)
		return;
	met_http_stop(m->http);
	m->http = NULL;
}

void node_metrics_free(struct node_metrics *m)
{
	if (!m)
		return;
	node_metrics_stop(m);
	met_reg_destroy(m->r);
	free(m);
}
