/* node_req — parses kvfs-node request bodies (PUT, GET, DEL, LIST, STAT, VERIFY) from untrusted
 * bytes.
 *
 * Pure functions over caller-owned memory: no allocation, no I/O, thread-safe. Pointers in a
 * parsed request (PUT data, DEL ids) point into the body the caller passed and live as long as
 * it does. Body layouts are those beside the opcodes in fs/proto/kvp.h.
 */
#ifndef KVFS_NODE_REQ_H
#define KVFS_NODE_REQ_H

#include <stddef.h>
#include <stdint.h>

/* Largest chunk a node stores (one erasure-coded chunk, docs/ec.md). */
#define NODE_CHUNK_MAX (16u << 20)
/* GET len meaning "from offset to the end of the chunk". */
#define NODE_LEN_TO_END 0xFFFFFFFFu

struct node_req {
	uint16_t op;
	uint64_t id;	      /* PUT, GET, VERIFY */
	uint32_t crc;	      /* PUT: crc32c of data as the client computed it */
	uint32_t off, len;    /* GET: range (VERIFY: 0, to the end); PUT: len = data bytes */
	const uint8_t *data;  /* PUT: len bytes inside the body */
	uint32_t n;	      /* DEL: number of ids */
	const uint8_t *ids;   /* DEL: n little-endian u64 inside the body; see node_req_del_id */
	uint64_t start_after; /* LIST */
	uint32_t max;	      /* LIST */
};

/* Parses body (len bytes; body may be NULL when len is 0) of a request with opcode op.
 * Returns 0; -EBADMSG when the body does not have the op's layout exactly (the connection
 * should be closed); -EINVAL when it parses but a value is out of range (PUT len above
 * NODE_CHUNK_MAX, DEL n or LIST max above KVP_MAX_IDS: answer the error, keep the
 * connection); -EOPNOTSUPP for an op a node does not serve. */
int node_req_parse(uint16_t op, const uint8_t *body, size_t len, struct node_req *r);

/* The i-th id of a parsed DEL request; i < r->n. */
uint64_t node_req_del_id(const struct node_req *r, uint32_t i);

#endif
