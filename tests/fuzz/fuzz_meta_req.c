/* libFuzzer target for kvfs-meta request parsing: input = u16 opcode (little-endian) + body.
 * Every body that parses must be safe to walk: names checked, every slot, TOUCH entry and
 * BFILL name read within the body. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvp.h"
#include "meta_req.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 2)
		return 0;
	uint16_t op = (uint16_t)(data[0] | data[1] << 8);
	/* Copy so reads past the body are caught by ASan at the exact allocation end. */
	uint8_t *body = malloc(size - 2 + 1);
	if (!body)
		return 0;
	memcpy(body, data + 2, size - 2);
	struct mreq q;
	if (mreq_parse(op, body, size - 2, &q) == 0) {
		volatile uint64_t sink = 0;
		mreq_name_check(&q.name);
		mreq_name_check(&q.newname);
		for (uint16_t i = 0; i < q.name.len; i++)
			sink += (uint8_t)q.name.p[i];
		for (uint16_t i = 0; i < q.addr.len; i++)
			sink += (uint8_t)q.addr.p[i];
		if (q.zone.len) /* HEARTBEAT's optional zone, as mnodes_heartbeat checks it */
			sink += (uint64_t)kvp_zone_check(q.zone.p, q.zone.len);
		if (op == KVP_OP_COMMIT) {
			size_t n = (size_t)q.nstripes * (size_t)(q.k + q.m);
			for (size_t i = 0; i < n; i++) {
				struct mreq_slot s;
				mreq_slot_get(&q, i, &s);
				sink += s.chunk_id;
			}
		}
		if (op == KVP_OP_BFILL) { /* every name as mfile_bfill walks them */
			size_t off = 0;
			struct mreq_str nm;
			uint64_t parent;
			uint32_t got = 0;
			while (mreq_bfill_next(&q, &off, &parent, &nm) == 0) {
				sink += (uint64_t)mreq_name_check(&nm);
				for (uint16_t i = 0; i < nm.len; i++)
					sink += (uint8_t)nm.p[i];
				got++;
			}
			if (got != q.n)
				abort(); /* the parse promised n names */
		}
		if (op == KVP_OP_TOUCH)
			for (uint32_t i = 0; i < q.n; i++) {
				uint64_t ino;
				int64_t t;
				mreq_touch_get(&q, i, &ino, &t);
				sink += ino;
			}
		(void)sink;
	}
	free(body);
	return 0;
}
