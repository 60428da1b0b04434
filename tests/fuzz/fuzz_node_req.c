/* libFuzzer target: kvfs-node request parsing. Input: u16 op (little-endian) then the body.
 * Checks the parser's promises: it never reads outside the body, a parsed PUT's data and a
 * DEL's ids lie inside it exactly, and values it accepts are within their limits. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvp.h"
#include "node_req.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 2)
		return 0;
	uint16_t op = (uint16_t)(data[0] | data[1] << 8);
	size_t len = size - 2;
	/* A private copy sized exactly, so ASan sees any read past the body. */
	uint8_t *body = len ? malloc(len) : NULL;
	if (len)
		memcpy(body, data + 2, len);
	struct node_req r;
	int rc = node_req_parse(op, body, len, &r);
	if (rc != 0 && rc != -EBADMSG && rc != -EINVAL && rc != -EOPNOTSUPP)
		abort();
	if (rc == 0) {
		switch (op) {
		case KVP_OP_PUT:
			if (r.len > NODE_CHUNK_MAX || len != 16 + (size_t)r.len ||
			    (r.len && r.data != body + 16))
				abort();
			break;
		case KVP_OP_GET:
			if (len != 16)
				abort();
			break;
		case KVP_OP_DEL: {
			if (r.n > KVP_MAX_IDS || len != 4 + 8 * (size_t)r.n)
				abort();
			uint64_t x = 0;
			for (uint32_t i = 0; i < r.n; i++)
				x ^= node_req_del_id(&r, i);
			(void)x;
			break;
		}
		case KVP_OP_LIST:
			if (len != 12 || r.max > KVP_MAX_IDS)
				abort();
			break;
		case KVP_OP_STAT:
			if (len != 0)
				abort();
			break;
		case KVP_OP_VERIFY:
			if (len != 8 || r.off != 0 || r.len != NODE_LEN_TO_END)
				abort();
			break;
		default:
			abort();
		}
	}
	free(body);
	return 0;
}
