/* Request body parsing for kvfs-meta: shape only, every length checked against the bytes
 * present before use; nothing is copied. */
#include "meta_req.h"
#include "kvp.h"

#include <errno.h>
#include <string.h>

static void rstr(struct kvp_rbuf *r, struct mreq_str *s)
{
	uint16_t n = kvp_r_u16(r);
	const uint8_t *p = kvp_r_bytes(r, n);
	s->p = p ? (const char *)p : "";
	s->len = p ? n : 0;
}

/* n fixed-size entries: n * each must fit in what remains (checked in 64 bits first). */
static const uint8_t *rarray(struct kvp_rbuf *r, uint64_t n, size_t each)
{
	if (r->err)
		return NULL;
	if (n > (r->len - r->off) / each) {
		r->err = -EBADMSG;
		return NULL;
	}
	return kvp_r_bytes(r, (size_t)n * each);
}

/* The optional trailing owner of MKDIR / COMMIT: an older client sends none. */
static void rowner(struct kvp_rbuf *r, struct mreq *q)
{
	if (!r->err && r->off < r->len) {
		q->uid = kvp_r_u32(r);
		q->gid = kvp_r_u32(r);
	}
}

int mreq_parse(uint16_t op, const uint8_t *body, size_t len, struct mreq *q)
{
	struct kvp_rbuf r;
	memset(q, 0, sizeof(*q));
	q->op = op;
	q->name.p = q->newname.p = q->addr.p = q->zone.p = "";
	q->uid = q->gid = KVP_OWNER_NONE;
	kvp_r_init(&r, body, len);
	switch (op) {
	case KVP_OP_HEARTBEAT:
		q->uuid = kvp_r_u64(&r);
		rstr(&r, &q->addr);
		q->capacity = kvp_r_u64(&r);
		q->used = kvp_r_u64(&r);
		q->chunks = kvp_r_u64(&r);
		if (!r.err && r.off < r.len) /* optional: a node without --zone sends none */
			rstr(&r, &q->zone);
		break;
	case KVP_OP_LOOKUP:
		q->parent = kvp_r_u64(&r);
		rstr(&r, &q->name);
		if (!r.err && r.off < r.len) /* optional: older clients send none */
			q->flags = kvp_r_u8(&r);
		break;
	case KVP_OP_RMDIR:
	case KVP_OP_UNLINK:
		q->parent = kvp_r_u64(&r);
		rstr(&r, &q->name);
		break;
	case KVP_OP_GETATTR:
	case KVP_OP_LAYOUT:
		q->ino = kvp_r_u64(&r);
		break;
	case KVP_OP_READDIR:
		q->ino = kvp_r_u64(&r);
		rstr(&r, &q->name);
		q->max = kvp_r_u32(&r);
		break;
	case KVP_OP_MKDIR:
		q->parent = kvp_r_u64(&r);
		rstr(&r, &q->name);
		q->mode = kvp_r_u32(&r);
		rowner(&r, q);
		break;
	case KVP_OP_RENAME:
		q->parent = kvp_r_u64(&r);
		rstr(&r, &q->name);
		q->newparent = kvp_r_u64(&r);
		rstr(&r, &q->newname);
		q->flags = kvp_r_u32(&r);
		break;
	case KVP_OP_ALLOC:
		q->k = kvp_r_u8(&r);
		q->m = kvp_r_u8(&r);
		q->chunk_size = kvp_r_u32(&r);
		q->nstripes = kvp_r_u32(&r);
		if (r.off < r.len) /* optional: an older client sends no flags */
			q->flags = kvp_r_u8(&r);
		break;
	case KVP_OP_COMMIT:
		q->parent = kvp_r_u64(&r);
		rstr(&r, &q->name);
		q->mode = kvp_r_u32(&r);
		q->write_id = kvp_r_u64(&r);
		q->size = kvp_r_u64(&r);
		q->chunk_size = kvp_r_u32(&r);
		q->k = kvp_r_u8(&r);
		q->m = kvp_r_u8(&r);
		q->flags = kvp_r_u8(&r);
		q->nstripes = kvp_r_u32(&r);
		q->slots = rarray(&r, (uint64_t)q->nstripes * (q->k + q->m), MREQ_SLOT_SIZE);
		rowner(&r, q);
		break;
	case KVP_OP_BFILL:
		q->k = kvp_r_u8(&r);
		q->m = kvp_r_u8(&r);
		q->chunk_size = kvp_r_u32(&r);
		q->size = kvp_r_u64(&r);
		q->n = kvp_r_u32(&r);
		if (!r.err && (q->n == 0 || q->n > KVP_BFILL_MAX))
			r.err = -EBADMSG;
		q->names = r.err ? NULL : body + r.off;
		for (uint32_t i = 0; i < q->n && !r.err; i++) {
			struct mreq_str s;
			kvp_r_u64(&r);
			rstr(&r, &s);
		}
		q->names_len = r.err ? 0 : (size_t)(body + r.off - q->names);
		break;
	case KVP_OP_ABORT:
		q->write_id = kvp_r_u64(&r);
		break;
	case KVP_OP_NODES:
		if (r.off < r.len) /* optional: an older client sends no flags */
			q->flags = kvp_r_u8(&r);
		break;
	case KVP_OP_STATFS:
	case KVP_OP_MSTATUS:
	case KVP_OP_RSTATUS:
		break;
	case KVP_OP_RCONF:
		q->action = kvp_r_u8(&r);
		q->uuid = kvp_r_u64(&r);
		rstr(&r, &q->addr);
		break;
	case KVP_OP_MAINT:
		q->action = kvp_r_u8(&r);
		q->node_id = kvp_r_u32(&r);
		break;
	case KVP_OP_SETATTR:
		q->ino = kvp_r_u64(&r);
		q->valid = kvp_r_u32(&r);
		q->mode = kvp_r_u32(&r);
		q->mtime_ns = kvp_r_i64(&r);
		q->atime_ns = kvp_r_i64(&r);
		break;
	case KVP_OP_LEASE:
		q->uuid = kvp_r_u64(&r);
		q->session = kvp_r_u64(&r);
		q->ino = kvp_r_u64(&r);
		q->max = kvp_r_u32(&r);
		q->renew = kvp_r_u64(&r);
		break;
	case KVP_OP_WATCH:
		q->uuid = kvp_r_u64(&r);
		q->session = kvp_r_u64(&r);
		q->acked = kvp_r_u64(&r);
		break;
	case KVP_OP_TOUCH:
		q->n = kvp_r_u32(&r);
		q->touch = rarray(&r, q->n, MREQ_TOUCH_SIZE);
		break;
	default:
		return -EOPNOTSUPP;
	}
	return kvp_r_end(&r) ? -EBADMSG : 0;
}

int mreq_name_check(const struct mreq_str *s)
{
	if (s->len == 0)
		return -EINVAL;
	if (s->len > KVP_NAME_MAX)
		return -ENAMETOOLONG;
	if (memchr(s->p, '/', s->len) || memchr(s->p, 0, s->len))
		return -EINVAL;
	if ((s->len == 1 && s->p[0] == '.') || (s->len == 2 && s->p[0] == '.' && s->p[1] == '.'))
		return -EINVAL;
	return 0;
}

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
	return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

void mreq_slot_get(const struct mreq *q, size_t i, struct mreq_slot *out)
{
	const uint8_t *p = q->slots + i * MREQ_SLOT_SIZE;
	out->node_id = le32(p);
	out->chunk_id = le64(p + 4);
	out->crc = le32(p + 12);
}

int mreq_bfill_next(const struct mreq *q, size_t *off, uint64_t *parent, struct mreq_str *name)
{
	if (*off >= q->names_len)
		return -ENOENT;
	struct kvp_rbuf r;
	kvp_r_init(&r, q->names + *off, q->names_len - *off);
	*parent = kvp_r_u64(&r);
	rstr(&r, name);
	if (r.err)
		return -ENOENT; /* not after a parse: every name was checked there */
	*off += r.off;
	return 0;
}

void mreq_touch_get(const struct mreq *q, size_t i, uint64_t *ino, int64_t *atime_ns)
{
	const uint8_t *p = q->touch + i * MREQ_TOUCH_SIZE;
	*ino = le64(p);
	*atime_ns = (int64_t)le64(p + 8);
}
