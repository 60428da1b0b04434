/* Request body parsing for kvfs-node, kept apart from the daemon so it can be fuzzed. */
#include "node_req.h"
#include "kvp.h"

#include <errno.h>
#include <string.h>

int node_req_parse(uint16_t op, const uint8_t *body, size_t len, struct node_req *r)
{
	struct kvp_rbuf rb;
	memset(r, 0, sizeof(*r));
	r->op = op;
	kvp_r_init(&rb, body, len);
	int range = 0;
	switch (op) {
	case KVP_OP_PUT:
		r->id = kvp_r_u64(&rb);
		r->crc = kvp_r_u32(&rb);
		r->len = kvp_r_u32(&rb);
		if (rb.err)
			return -EBADMSG;
		/* The length field must match the bytes that follow exactly. */
		if (rb.len - rb.off != r->len)
			return -EBADMSG;
		r->data = kvp_r_bytes(&rb, r->len);
		range = r->len > NODE_CHUNK_MAX;
		break;
	case KVP_OP_GET:
		r->id = kvp_r_u64(&rb);
		r->off = kvp_r_u32(&rb);
		r->len = kvp_r_u32(&rb);
		break;
	case KVP_OP_VERIFY: /* served as a GET of the whole chunk that answers no data */
		r->id = kvp_r_u64(&rb);
		r->len = NODE_LEN_TO_END;
		break;
	case KVP_OP_DEL:
		r->n = kvp_r_u32(&rb);
		if (rb.err)
			return -EBADMSG;
		if ((rb.len - rb.off) / 8 != r->n || (rb.len - rb.off) % 8)
			return -EBADMSG;
		r->ids = kvp_r_bytes(&rb, (size_t)r->n * 8);
		range = r->n > KVP_MAX_IDS;
		break;
	case KVP_OP_LIST:
		r->start_after = kvp_r_u64(&rb);
		r->max = kvp_r_u32(&rb);
		range = r->max > KVP_MAX_IDS;
		break;
	case KVP_OP_STAT:
		break;
	default:
		return -EOPNOTSUPP;
	}
	if (kvp_r_end(&rb))
		return -EBADMSG;
	return range ? -EINVAL : 0;
}

uint64_t node_req_del_id(const struct node_req *r, uint32_t i)
{
	const uint8_t *p = r->ids + (size_t)i * 8;
	uint64_t v = 0;
	for (int b = 7; b >= 0; b--)
		v = v << 8 | p[b];
	return v;
}
