/* kvfs-meta metrics: see meta_metrics.h. */
#define KVFS_LOG_TAG "meta"
#include "meta_metrics.h"
#include "kvp_conn_metrics.h"
#include "log.h"
#include "metrics.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CALL_MS 2000

/* Request ops by opcode; NULL: not a meta request. */
static const char *const op_names[0x41] = {
    [KVP_OP_HEARTBEAT] = "heartbeat", [KVP_OP_LOOKUP] = "lookup", [KVP_OP_GETATTR] = "getattr",
    [KVP_OP_READDIR] = "readdir",     [KVP_OP_MKDIR] = "mkdir",	  [KVP_OP_RMDIR] = "rmdir",
    [KVP_OP_UNLINK] = "unlink",	      [KVP_OP_RENAME] = "rename", [KVP_OP_ALLOC] = "alloc",
    [KVP_OP_COMMIT] = "commit",	      [KVP_OP_ABORT] = "abort",	  [KVP_OP_LAYOUT] = "layout",
    [KVP_OP_STATFS] = "statfs",	      [KVP_OP_NODES] = "nodes",	  [KVP_OP_SETATTR] = "setattr",
    [KVP_OP_TOUCH] = "touch",	      [KVP_OP_MAINT] = "maint",	  [KVP_OP_MSTATUS] = "mstatus",
};
#define NOPS ((int)(sizeof(op_names) / sizeof(op_names[0])))

/* MSTATUS counters in enum kvp_mstat order: metric name, help. A newer meta may send more;
 * those are left out until named here. */
static const char *const mstat_names[][2] = {
    [KVP_MST_EXPIRED] = {"kvfs_meta_expired_files_total", "Files removed by TTL expiry"},
    [KVP_MST_EVICTED] = {"kvfs_meta_evicted_files_total",
			 "Files evicted by the capacity watermark (LRU)"},
    [KVP_MST_EVICTED_BYTES] = {"kvfs_meta_evicted_bytes_total",
			       "Raw stored bytes of the evicted files"},
    [KVP_MST_ENOSPC] = {"kvfs_meta_alloc_enospc_total",
			"ALLOCs refused for space after an eviction retry"},
    [KVP_MST_GC_SCANNED] = {"kvfs_meta_gc_scanned_chunks_total",
			    "Chunks listed by orphan-GC passes"},
    [KVP_MST_GC_ORPHANS] = {"kvfs_meta_gc_orphan_chunks_total",
			    "Orphan chunks found by GC and queued for deletion"},
    [KVP_MST_REPAIRED] = {"kvfs_meta_repaired_chunks_total",
			  "Chunks rebuilt or moved by repair, drain and scrub"},
    [KVP_MST_REPAIR_BYTES] = {"kvfs_meta_repaired_bytes_total", "Bytes of those chunks"},
    [KVP_MST_REPAIR_FAILED] = {"kvfs_meta_repair_failed_chunks_total",
			       "Chunks that could not be rebuilt"},
    [KVP_MST_SCRUB_CHECKED] = {"kvfs_meta_scrub_checked_chunks_total", "Chunks read by scrub"},
    [KVP_MST_SCRUB_CORRUPT] = {"kvfs_meta_scrub_corrupt_chunks_total",
			       "Chunks scrub found failing their CRC"},
    [KVP_MST_SCRUB_MISSING] = {"kvfs_meta_scrub_missing_chunks_total",
			       "Chunks scrub found absent on their node"},
    [KVP_MST_SCRUB_REPAIRED] = {"kvfs_meta_scrub_repaired_chunks_total",
				"Corrupt or missing chunks scrub rebuilt"},
    [KVP_MST_DEGR_WRITES] = {"kvfs_meta_degraded_stripe_writes_total",
			     "Stripes committed without some of their chunks (a node down or "
			     "unreachable), marked for repair"},
    [KVP_MST_DEGR_STRIPES] = {"kvfs_meta_degraded_stripes",
			      "Stripes short of chunks (written degraded), not yet repaired"},
    [KVP_MST_DEGR_FILES] = {"kvfs_meta_degraded_files", "Files with degraded stripes"},
    [KVP_MST_DB_L0_FILES] = {"kvfs_meta_db_l0_files",
			     "RocksDB table files in level 0 (a point read checks each one)"},
    [KVP_MST_DB_PENDING] = {"kvfs_meta_db_pending_compaction_bytes",
			    "Bytes RocksDB estimates compaction still has to rewrite"},
    [KVP_MST_DB_COMPACTING] = {"kvfs_meta_db_compactions_running",
			       "Compactions running now (RocksDB's own and kvfs compact)"},
    [KVP_MST_DB_COMPACTS] = {"kvfs_meta_db_full_compactions_total",
			     "Full compactions (kvfs compact) finished"},
    [KVP_MST_LEASE_GRANTED] = {"kvfs_meta_lease_granted_total",
			       "Directory leases granted to mounts (docs/meta.md)"},
    [KVP_MST_LEASE_RENEWED] = {"kvfs_meta_lease_renewed_total",
			       "Directory leases extended by their holders"},
    [KVP_MST_LEASE_REVOKED] = {"kvfs_meta_lease_revoked_total",
			       "Directory leases revoked by a change in their directory"},
    [KVP_MST_LEASE_ACKED] = {"kvfs_meta_lease_acked_total",
			     "Lease revocations the holder acknowledged"},
    [KVP_MST_LEASE_EXPIRED] =
	{"kvfs_meta_lease_expired_waits_total",
	 "Lease revocations that waited for the lease to run out (holder silent)"},
    [KVP_MST_LEASE_LIVE] = {"kvfs_meta_leases", "Directory leases held now"},
};
#define NMSTAT ((int)(sizeof(mstat_names) / sizeof(mstat_names[0])))

struct meta_metrics {
	struct met_reg *r;
	struct met_http *http;
	struct met_ops *ops;
	struct kvp_secret secret;
	char self[KVP_ADDR_MAX + 8];
	struct kvp_client *cl; /* used only by the collector, which the registry serialises */
	struct met_counter *scrape_errors;
	struct kvp_conn_stats conn;
};

struct kvp_conn_stats *meta_metrics_conn_stats(struct meta_metrics *mm)
{
	return &mm->conn;
}

void meta_metrics_on_reply(void *ctx, const struct kvp_hdr *req, int32_t status, size_t reply_bytes,
			   uint64_t ns)
{
	(void)reply_bytes;
	struct meta_metrics *mm = ctx;
	met_ops_observe(mm->ops, req->op < NOPS && op_names[req->op] ? req->op : -1, status != 0,
			ns);
}

/* One request to meta itself; reopens the connection once if it has failed. */
static int self_call(struct meta_metrics *mm, uint16_t op, uint8_t **rb, uint32_t *rl)
{
	for (int attempt = 0; attempt < 2; attempt++) {
		if (mm->cl && !kvp_client_alive(mm->cl)) {
			kvp_client_close(mm->cl);
			mm->cl = NULL;
		}
		if (!mm->cl && kvp_client_open(mm->self, &mm->secret, CALL_MS, &mm->cl))
			return -ECONNREFUSED;
		int rc = kvp_call(mm->cl, op, NULL, 0, NULL, 0, CALL_MS, rb, rl);
		if (rc != -ECONNRESET && rc != -ECONNABORTED && rc != -ETIMEDOUT)
			return rc;
	}
	return -ECONNRESET;
}

static void gauge(struct met_out *o, const char *name, const char *help, double v)
{
	met_out_family(o, name, "gauge", help);
	met_out_sample(o, name, NULL, v);
}

static int collect_statfs(struct meta_metrics *mm, struct met_out *o)
{
	uint8_t *b = NULL;
	uint32_t len = 0;
	int rc = self_call(mm, KVP_OP_STATFS, &b, &len);
	if (rc)
		return rc;
	struct kvp_rbuf r;
	kvp_r_init(&r, b, len);
	uint64_t raw = kvp_r_u64(&r), used = kvp_r_u64(&r), files = kvp_r_u64(&r);
	uint64_t dirs = kvp_r_u64(&r);
	unsigned k = kvp_r_u8(&r), m = kvp_r_u8(&r);
	uint32_t chunk = kvp_r_u32(&r), up = kvp_r_u32(&r), nodes = kvp_r_u32(&r);
	rc = kvp_r_end(&r);
	free(b);
	if (rc)
		return rc;
	gauge(o, "kvfs_meta_files", "Regular files in the namespace", (double)files);
	gauge(o, "kvfs_meta_dirs", "Directories in the namespace (the root included)",
	      (double)dirs);
	gauge(o, "kvfs_meta_raw_capacity_bytes", "Sum of the capacity of the nodes up",
	      (double)raw);
	gauge(o, "kvfs_meta_raw_used_bytes", "Sum of the bytes stored on the nodes up",
	      (double)used);
	gauge(o, "kvfs_meta_usable_capacity_bytes", "Raw capacity x k / (k+m)",
	      k + m ? (double)raw * k / (k + m) : 0);
	gauge(o, "kvfs_meta_usage_ratio", "Raw used / raw capacity",
	      raw ? (double)used / (double)raw : 0);
	gauge(o, "kvfs_meta_ec_data_chunks", "Data chunks per stripe (cluster default)", k);
	gauge(o, "kvfs_meta_ec_parity_chunks", "Parity chunks per stripe (cluster default)", m);
	gauge(o, "kvfs_meta_chunk_size_bytes", "Largest chunk (cluster default)", chunk);
	met_out_family(o, "kvfs_meta_nodes", "gauge", "Registered nodes, by state");
	met_out_sample(o, "kvfs_meta_nodes", (const char *const[]){"state", "up", NULL}, up);
	met_out_sample(o, "kvfs_meta_nodes", (const char *const[]){"state", "all", NULL}, nodes);
	return 0;
}

struct node_row {
	char id[16], addr[KVP_ADDR_MAX];
	unsigned state;
	uint64_t cap, used, chunks;
	double age;
};

static int collect_nodes(struct meta_metrics *mm, struct met_out *o)
{
	uint8_t *b = NULL;
	uint32_t len = 0;
	int rc = self_call(mm, KVP_OP_NODES, &b, &len);
	if (rc)
		return rc;
	struct kvp_rbuf r;
	kvp_r_init(&r, b, len);
	uint32_t n = kvp_r_u32(&r);
	struct node_row *rows = calloc(n ? n : 1, sizeof(*rows));
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	int64_t now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
	for (uint32_t i = 0; rows && i < n && !r.err; i++) {
		snprintf(rows[i].id, sizeof(rows[i].id), "%u", kvp_r_u32(&r));
		kvp_r_u64(&r); /* uuid */
		kvp_r_str(&r, rows[i].addr, sizeof(rows[i].addr));
		rows[i].state = kvp_r_u8(&r);
		rows[i].cap = kvp_r_u64(&r);
		rows[i].used = kvp_r_u64(&r);
		rows[i].chunks = kvp_r_u64(&r);
		int64_t hb = kvp_r_i64(&r);
		rows[i].age = hb > 0 && now > hb ? (double)(now - hb) / 1e9 : 0;
	}
	rc = rows ? kvp_r_end(&r) : -ENOMEM;
	free(b);
	if (rc) {
		free(rows);
		return rc;
	}
	static const struct {
		const char *name, *help;
	} fam[] = {
	    {"kvfs_meta_node_state", "Node state: 1 up, 2 down, 3 draining"},
	    {"kvfs_meta_node_capacity_bytes", "Node capacity as last heartbeated"},
	    {"kvfs_meta_node_used_bytes", "Node bytes stored as last heartbeated"},
	    {"kvfs_meta_node_chunks", "Node chunks as last heartbeated"},
	    {"kvfs_meta_node_heartbeat_age_seconds", "Seconds since the node's last heartbeat"},
	};
	unsigned down = 0, draining = 0;
	for (int f = 0; f < 5; f++) {
		met_out_family(o, fam[f].name, "gauge", fam[f].help);
		for (uint32_t i = 0; i < n; i++) {
			const char *lab[] = {"node", rows[i].id, "addr", rows[i].addr, NULL};
			double v = f == 0   ? rows[i].state
				   : f == 1 ? (double)rows[i].cap
				   : f == 2 ? (double)rows[i].used
				   : f == 3 ? (double)rows[i].chunks
					    : rows[i].age;
			met_out_sample(o, fam[f].name, lab, v);
			if (f == 0) {
				down += rows[i].state == KVP_NODE_DOWN;
				draining += rows[i].state == KVP_NODE_DRAINING;
			}
		}
	}
	gauge(o, "kvfs_meta_nodes_down", "Registered nodes that are down", down);
	gauge(o, "kvfs_meta_nodes_draining", "Registered nodes being drained", draining);
	free(rows);
	return 0;
}

static int collect_mstatus(struct meta_metrics *mm, struct met_out *o)
{
	uint8_t *b = NULL;
	uint32_t len = 0;
	int rc = self_call(mm, KVP_OP_MSTATUS, &b, &len);
	if (rc)
		return rc;
	struct kvp_rbuf r;
	kvp_r_init(&r, b, len);
	unsigned kind = kvp_r_u8(&r), running = kvp_r_u8(&r);
	kvp_r_u32(&r); /* node */
	uint64_t total = kvp_r_u64(&r), done = kvp_r_u64(&r), failed = kvp_r_u64(&r);
	kvp_r_u64(&r); /* bytes */
	kvp_r_i64(&r); /* elapsed */
	uint32_t n = kvp_r_u32(&r);
	uint64_t v[64] = {0};
	for (uint32_t i = 0; i < n && !r.err; i++) {
		uint64_t x = kvp_r_u64(&r);
		if (i < 64)
			v[i] = x;
	}
	rc = kvp_r_end(&r);
	free(b);
	if (rc)
		return rc;
	for (int i = 0; i < NMSTAT && i < (int)n; i++) {
		int gauge = i == KVP_MST_DEGR_STRIPES || i == KVP_MST_DEGR_FILES ||
			    i == KVP_MST_DB_L0_FILES || i == KVP_MST_DB_PENDING ||
			    i == KVP_MST_DB_COMPACTING || i == KVP_MST_LEASE_LIVE;
		met_out_family(o, mstat_names[i][0], gauge ? "gauge" : "counter",
			       mstat_names[i][1]);
		met_out_sample(o, mstat_names[i][0], NULL, (double)v[i]);
	}
	gauge(o, "kvfs_meta_maint_job_running",
	      "1 while a repair / drain / scrub job runs (kind: kvfs_meta_maint_job_kind)",
	      running);
	gauge(o, "kvfs_meta_maint_job_kind",
	      "Last maintenance job: 0 none, 1 repair, 2 drain, 3 scrub", kind);
	gauge(o, "kvfs_meta_maint_job_total_chunks", "Chunks the last job has to handle",
	      (double)total);
	gauge(o, "kvfs_meta_maint_job_done_chunks", "Chunks the last job has handled",
	      (double)done);
	gauge(o, "kvfs_meta_maint_job_failed_chunks", "Chunks the last job failed on",
	      (double)failed);
	return 0;
}

static void collect(void *ctx, struct met_out *o)
{
	struct meta_metrics *mm = ctx;
	int bad = 0;
	bad += collect_statfs(mm, o) != 0;
	bad += collect_nodes(mm, o) != 0;
	bad += collect_mstatus(mm, o) != 0;
	met_counter_add(mm->scrape_errors, (uint64_t)bad);
	kvp_conn_stats_collect(o, "kvfs_meta", &mm->conn);
}

int meta_metrics_create(const struct kvp_secret *secret, struct meta_metrics **out)
{
	struct meta_metrics *mm = calloc(1, sizeof(*mm));
	if (!mm)
		return -ENOMEM;
	mm->secret = *secret;
	int rc = met_reg_create(&mm->r);
	if (!rc)
		rc = met_ops_new(mm->r, "kvfs_meta", op_names, NOPS, &mm->ops);
	if (rc) {
		met_reg_destroy(mm->r);
		free(mm);
		return rc;
	}
	mm->scrape_errors = met_counter_new(mm->r, "kvfs_meta_scrape_errors_total",
					    "Scrape-time requests (STATFS, NODES, MSTATUS) that "
					    "failed; their figures were left out",
					    NULL);
	*out = mm;
	return 0;
}

int meta_metrics_serve(struct meta_metrics *mm, const char *self, const char *listen,
		       const char *addr_file)
{
	snprintf(mm->self, sizeof(mm->self), "%s", self);
	int rc = met_collector_add(mm->r, collect, mm);
	return rc ? rc : met_http_serve(mm->r, listen, addr_file, &mm->http);
}

void meta_metrics_free(struct meta_metrics *mm)
{
	if (!mm)
		return;
	met_http_stop(mm->http);
	kvp_client_close(mm->cl);
	met_reg_destroy(mm->r);
	free(mm);
}
