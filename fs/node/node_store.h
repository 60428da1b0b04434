/* node_store — the chunk store of one kvfs-node: files under one data directory, an in-memory
 * index, capacity accounting, and io_uring I/O threads that serve PUT/GET/DEL asynchronously.
 * docs/node.md describes the on-disk format and durability.
 *
 * Threading: every call is thread-safe. PUT/GET/DEL are accepted on the caller's (connection)
 * thread, run on one of `io_threads` I/O threads (one io_uring each, many requests in flight)
 * and are answered with kvp_reply from one of `workers` completion threads, which also verify
 * CRCs. A caller blocks in put/get/del only while more than max_inflight bytes of requests are
 * in flight (back-pressure on that connection).
 */
#ifndef KVFS_NODE_STORE_H
#define KVFS_NODE_STORE_H

#include <stdint.h>

#include "kvp.h"
#include "node_req.h"

struct node_store_opts {
	const char *dir;       /* created if absent */
	uint64_t capacity;     /* cap on chunk data bytes (0: none); PUT past it: -ENOSPC */
	uint64_t reserve;      /* bytes of dir's filesystem kept free; PUT into it: -ENOSPC */
	int sync;	       /* fdatasync chunk + fsync its directory before a PUT is acked */
	int io_threads;	       /* >= 1 */
	int workers;	       /* >= 1 */
	unsigned ring_depth;   /* SQ entries per ring, >= 8 */
	uint64_t max_inflight; /* back-pressure threshold in bytes */
	int direct_read;       /* GET reads with O_DIRECT (bypass the page cache) */
	int direct_cold;       /* GET of a chunk not wholly in the page cache: O_DIRECT */
};

/* capacity = the smaller of opts.capacity (when not 0) and the bytes of chunks this node holds
 * (live, being written or deleted) + what dir's filesystem has free for it (statvfs f_bavail,
 * less opts.reserve): it shrinks when anything else fills the disk, and capacity - used is
 * the room a new chunk really has. used = bytes of live chunk data. disk_total/disk_avail:
 * that filesystem's size and free bytes (0 if statvfs failed). */
struct node_stats {
	uint64_t uuid, capacity, used, chunks, crc_errors;
	uint64_t disk_total, disk_avail;
};

struct node_store;

/* Creates the directory layout if needed, takes an exclusive lock on DIR/lock (-EBUSY if
 * another node holds it), loads or creates the node uuid, deletes leftover temp files, scans
 * the chunks into the index and starts the threads. 0 or a negative errno (logged). */
int node_store_open(const struct node_store_opts *o, struct node_store **out);
/* Waits for every request in flight to be answered, stops the threads, frees. Call only once
 * no more requests can arrive (server stopped). NULL is a no-op. */
void node_store_close(struct node_store *s);

void node_store_stats(struct node_store *s, struct node_stats *st);

/* Histograms of the disk time of PUT, GET (and VERIFY) and DEL: from handing the request to an
 * I/O ring until its disk work ended (ring queue wait included, CRC check and reply not). Any
 * may be NULL. Call before the server accepts requests; they must outlive the store's last
 * request (node_metrics_free runs after node_store_close). */
struct met_hist;
void node_store_set_disk_hist(struct node_store *s, struct met_hist *put, struct met_hist *get,
			      struct met_hist *del);

/* LIST answered at once: appends the response body (u32 n, n x (u64 id, i64 mtime_ns),
 * u8 more) to out. 0 or -ENOMEM. */
int node_store_list(struct node_store *s, uint64_t after, uint32_t max, struct kvp_wbuf *out);

/* Asynchronous requests. node_store_get also serves VERIFY (r->op): the chunk is read and checked
 * as for a GET of all of it, and the reply carries its crc32c and length but no data. Each takes
 * ownership of body (r points into it) and answers h on c
 * exactly once, now or later (taking its own kvp_conn_ref). Errors travel in the reply:
 * PUT -EBADMSG (crc), -EEXIST, -ENOSPC, -EIO; GET -ENOENT, -EINVAL (range), -EILSEQ (stored
 * chunk corrupt), -EIO; DEL answers the number of ids it deleted. */
void node_store_put(struct node_store *s, struct kvp_conn *c, const struct kvp_hdr *h,
		    uint8_t *body, const struct node_req *r);
void node_store_get(struct node_store *s, struct kvp_conn *c, const struct kvp_hdr *h,
		    uint8_t *body, const struct node_req *r);
void node_store_del(struct node_store *s, struct kvp_conn *c, const struct kvp_hdr *h,
		    uint8_t *body, const struct node_req *r);

#endif
