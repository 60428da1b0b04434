/* kvp — the RSTATUS reply's parser (kvp.h): one reader for the CLI, the benchmarks and the
 * tests, so a field added to the reply is read the same way everywhere. */
#include "kvp.h"

#include <errno.h>
#include <string.h>

/* The fields every meta with Raft sends. */
static void read_base(struct kvp_rbuf *r, struct kvp_rstatus *s)
{
	s->id = kvp_r_u64(r);
	s->state = kvp_r_u8(r);
	s->serving = kvp_r_u8(r);
	s->term = kvp_r_u64(r);
	s->leader_id = kvp_r_u64(r);
	kvp_r_str(r, s->leader_raft, sizeof(s->leader_raft));
	s->last = kvp_r_u64(r);
	s->applied = kvp_r_u64(r);
	s->commit = kvp_r_u64(r);
	uint32_t n = kvp_r_u32(r);
	/* n comes from the wire: the loop ends at the first read past the body. */
	for (uint32_t i = 0; i < n && !r->err; i++) {
		struct kvp_rstatus_peer p;
		p.id = kvp_r_u64(r);
		kvp_r_str(r, p.raft, sizeof(p.raft));
		p.match = kvp_r_u64(r);
		if (!r->err && s->npeers < KVP_RSTATUS_PEERS)
			s->peers[s->npeers++] = p;
	}
}

int kvp_rstatus_parse(const uint8_t *b, size_t len, struct kvp_rstatus *s)
{
	memset(s, 0, sizeof(*s));
	struct kvp_rbuf r;
	kvp_r_init(&r, b, len);
	read_base(&r, s);
	/* Each later group is absent (an older meta) or whole: a reader that stopped at any byte
	 * boundary would take a cut body for an older meta's. */
	if (!r.err && r.off < r.len) {
		s->snap_index = kvp_r_u64(&r);
		s->snapshots = kvp_r_u64(&r);
		s->log_bytes = kvp_r_u64(&r);
		s->log_mem = kvp_r_u64(&r);
		kvp_r_str(&r, s->leader_client, sizeof(s->leader_client));
		s->has_snap = !r.err;
	}
	if (!r.err && r.off < r.len) {
		s->snap_size = kvp_r_u64(&r);
		s->has_snap_size = !r.err;
	}
	if (r.err || s->state > 3 || s->serving > 1) {
		memset(s, 0, sizeof(*s));
		return -EBADMSG;
	}
	return 0;
}
