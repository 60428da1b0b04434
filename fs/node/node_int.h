/* Private to fs/node: the store's state and the request objects its I/O threads run.
 * node_store.c owns layout, index, accounting and replies; node_io.c owns the rings. */
#ifndef KVFS_NODE_INT_H
#define KVFS_NODE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/uio.h>

#include "node_index.h"
#include "node_store.h"

struct met_hist;

#define NODE_SHARDS	  256
#define NODE_HDR_SIZE	  64
#define NODE_HDR_MAGIC	  0x4B43564Bu /* "KVCK" little-endian */
#define NODE_HDR_VERSION  1
#define NODE_DIRECT_ALIGN 4096

enum node_op_type { NODE_OP_PUT = 1, NODE_OP_GET = 2, NODE_OP_DEL = 3 };

/* One request in flight. Owned by exactly one thread at a time: the connection thread that
 * creates it, then its ring thread, then a completion worker that answers and frees it. */
struct node_op {
	enum node_op_type type;
	int stage;
	int err; /* first error, negative errno; 0 = fine so far */
	struct node_store *s;
	struct kvp_conn *conn; /* a reference, dropped when answered */
	struct kvp_hdr hdr;
	uint8_t *body; /* the request body (freed when answered) */
	struct node_req req;
	uint64_t charge; /* back-pressure bytes held */
	int fd;
	int shard;
	int inflight;	    /* SQEs in flight */
	size_t done, total; /* PUT: bytes written; GET: bytes read */
	size_t room;	    /* GET: buffer size (total rounded up to 4 KiB for O_DIRECT) */
	int direct;	    /* GET: opened with O_DIRECT */
	int cold_check;	    /* GET: switch to O_DIRECT unless the page cache holds it all */
	char name[20];	    /* 16 hex digits: the file name in its shard */
	char tmp[48];	    /* PUT: temp name in DIR/tmp */
	uint8_t hbuf[NODE_HDR_SIZE];
	struct iovec wiov[2]; /* PUT: what remains to write */
	uint8_t *buf;	      /* GET: header + chunk as read */
	uint32_t glen;	      /* GET: chunk length from the index */
	uint32_t roff, rlen;  /* GET: range to return */
	/* DEL: ids being unlinked */
	uint32_t dn, dnext, dfin;
	uint64_t *dids;
	uint32_t *dlens;
	char (*dnames)[20];
	uint64_t t_submit;    /* CLOCK_MONOTONIC ns when handed to a ring (disk latency) */
	struct node_op *next; /* queue link */
};

struct node_ring;
struct node_workq;

struct node_store {
	struct node_store_opts o;
	char dir[4096];
	int dir_fd, tmp_fd, lock_fd;
	int shard_fd[NODE_SHARDS];
	uint64_t uuid;
	atomic_uint_fast64_t tmp_seq;
	atomic_uint_fast64_t crc_errors;
	atomic_uint rr;		/* round-robin ring choice */
	atomic_int full_logged; /* "store full" logged since the last accepted PUT */
	atomic_int statvfs_logged;

	pthread_mutex_t mu; /* protects idx, live_bytes, live_count, pending_bytes, writing_disk */
	struct node_index *idx;
	uint64_t live_bytes, live_count;
	uint64_t pending_bytes; /* WRITING and DELETING chunks: still count against capacity */
	uint64_t writing_disk;	/* disk bytes (node_disk_need) of the PUTs being written */

	pthread_mutex_t adm_mu; /* protects adm_bytes */
	pthread_cond_t adm_cv;
	uint64_t adm_bytes;

	struct node_ring *rings;
	struct node_workq *wq;
	/* Disk latency by op type (node_store_set_disk_hist); set before requests arrive, may
	 * stay NULL (no metrics). */
	struct met_hist *disk_hist[NODE_OP_DEL + 1];
};

/* node_io.c */
int node_io_start(struct node_store *s);		       /* rings and workers; 0 or -errno */
void node_io_stop(struct node_store *s);		       /* drains every op, joins, frees */
void node_io_submit(struct node_store *s, struct node_op *op); /* hands op to a ring */

/* node_store.c: called on a completion worker once op's disk work has ended (op->err says
 * how); answers the request and frees op. */
void node_op_finish(struct node_op *op);

#endif
