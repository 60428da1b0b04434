/* kvch: chunk requests and replies, one function per op. Request bodies are small fixed
 * layouts (docs/protocol.md), built on the stack: no allocation on the data path. */
#include "kvch.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int kvch_is_transport(int rc)
{
	return rc == -ECONNRESET || rc == -ECONNABORTED || rc == -ECONNREFUSED ||
	       rc == -ETIMEDOUT || rc == -EPIPE || rc == -ENOTCONN || rc == -EHOSTUNREACH ||
	       rc == -ENETUNREACH;
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static int call_start(struct kvp_pool *p, const char *addr, uint16_t op, const void *body,
		      size_t blen, const void *bulk, size_t bulklen, struct kvch_call *c)
{
	*c = (struct kvch_call){0};
	int rc = kvp_pool_get(p, addr, &c->cl);
	if (rc)
		return rc;
	rc = kvp_call_start(c->cl, op, body, blen, bulk, bulklen, &c->call);
	if (rc) {
		kvp_pool_put(p, c->cl);
		*c = (struct kvch_call){0};
		return rc;
	}
	c->pool = p;
	return 0;
}

/* Waits and releases; c becomes idle. */
static int call_wait(struct kvch_call *c, int timeout_ms, uint8_t **rb, uint32_t *rl)
{
	if (!c->call)
		return -EAGAIN;
	int rc = kvp_call_wait(c->call, timeout_ms, rb, rl);
	kvp_pool_put(c->pool, c->cl);
	*c = (struct kvch_call){0};
	return rc;
}

size_t kvch_put_req(uint8_t b[KVCH_REQ_MAX], uint64_t chunk_id, uint32_t crc, uint32_t len)
{
	put_le(b, chunk_id, 8);
	put_le(b + 8, crc, 4);
	put_le(b + 12, len, 4);
	return 16;
}

size_t kvch_get_req(uint8_t b[KVCH_REQ_MAX], uint64_t chunk_id, uint32_t off, uint32_t len)
{
	put_le(b, chunk_id, 8);
	put_le(b + 8, off, 4);
	put_le(b + 12, len, 4);
	return 16;
}

size_t kvch_verify_req(uint8_t b[KVCH_REQ_MAX], uint64_t chunk_id)
{
	put_le(b, chunk_id, 8);
	return 8;
}

int kvch_put_start(struct kvp_pool *p, const char *addr, uint64_t chunk_id, uint32_t crc,
		   const void *data, uint32_t len, struct kvch_call *c)
{
	uint8_t h[KVCH_REQ_MAX];
	size_t n = kvch_put_req(h, chunk_id, crc, len);
	return call_start(p, addr, KVP_OP_PUT, h, n, data, len, c);
}

int kvch_get_start(struct kvp_pool *p, const char *addr, uint64_t chunk_id, uint32_t off,
		   uint32_t len, struct kvch_call *c)
{
	uint8_t h[KVCH_REQ_MAX];
	size_t n = kvch_get_req(h, chunk_id, off, len);
	return call_start(p, addr, KVP_OP_GET, h, n, NULL, 0, c);
}

int kvch_verify_start(struct kvp_pool *p, const char *addr, uint64_t chunk_id, struct kvch_call *c)
{
	uint8_t h[KVCH_REQ_MAX];
	size_t n = kvch_verify_req(h, chunk_id);
	return call_start(p, addr, KVP_OP_VERIFY, h, n, NULL, 0, c);
}

int kvch_put_finish(struct kvch_call *c, int timeout_ms)
{
	return call_wait(c, timeout_ms, NULL, NULL);
}

/* VERIFY answers `u32 crc32c, u32 len`: checked against len and want_crc. */
static int verify_reply(struct kvch_call *c, int timeout_ms, uint32_t len, uint32_t want_crc)
{
	uint8_t *b = NULL;
	uint32_t bl = 0;
	int rc = call_wait(c, timeout_ms, &b, &bl);
	if (rc)
		return rc;
	struct kvp_rbuf r;
	kvp_r_init(&r, b, bl);
	uint32_t crc = kvp_r_u32(&r), n = kvp_r_u32(&r);
	rc = kvp_r_end(&r) ? -EBADMSG : n != len || crc != want_crc ? -EILSEQ : 0;
	free(b);
	return rc;
}

int kvch_get_into(struct kvch_call *c, uint8_t *dst, uint32_t len)
{
	if (!c->call)
		return -EAGAIN;
	int rc = kvp_call_into(c->call, 8, dst, len);
	if (!rc) {
		c->into = dst;
		c->into_len = len;
	}
	return rc;
}

int kvch_get_finish(struct kvch_call *c, int timeout_ms, uint8_t *dst, uint32_t len,
		    const uint32_t *want_crc)
{
	/* Unless the answer is already in (a prefetch), its data goes straight into dst. */
	if (c->call && !c->into)
		kvch_get_into(c, dst, len);
	else if (c->into && (c->into != dst || c->into_len != len))
		return -EINVAL; /* kvch_get_into was told another place */
	int into = c->into != NULL;
	uint8_t *b = NULL;
	uint32_t bl = 0;
	int rc = call_wait(c, timeout_ms, &b, &bl);
	if (rc)
		return rc;
	/* The answer: `u32 crc32c, u32 len`, then the bytes, here or (bl == 8) in dst. */
	struct kvp_rbuf r;
	kvp_r_init(&r, b, bl);
	uint32_t crc = kvp_r_u32(&r), n = kvp_r_u32(&r);
	const uint8_t *p = into && bl == 8 ? dst : kvp_r_bytes(&r, n);
	if (!p || kvp_r_end(&r))
		rc = -EBADMSG;
	else if (n != len || (want_crc && crc != *want_crc) || kvec_crc32c(0, p, n) != crc)
		rc = -EILSEQ;
	else if (p != dst)
		memcpy(dst, p, len);
	free(b);
	return rc;
}

int kvch_verify_finish(struct kvch_call *c, int timeout_ms, uint32_t len, uint32_t want_crc)
{
	return verify_reply(c, timeout_ms, len, want_crc);
}

void kvch_cancel(struct kvch_call *c)
{
	if (c->call)
		call_wait(c, 0, NULL, NULL);
}

int kvch_del(struct kvp_pool *p, const char *addr, const uint64_t *ids, uint32_t n, int timeout_ms,
	     uint32_t *deleted)
{
	if (n > KVP_MAX_IDS)
		return -EINVAL;
	size_t blen = 4 + (size_t)n * 8;
	uint8_t *b = malloc(blen);
	if (!b)
		return -ENOMEM;
	put_le(b, n, 4);
	for (uint32_t i = 0; i < n; i++)
		put_le(b + 4 + (size_t)i * 8, ids[i], 8);
	struct kvch_call c;
	uint8_t *rb = NULL;
	uint32_t rl = 0;
	int rc = call_start(p, addr, KVP_OP_DEL, b, blen, NULL, 0, &c);
	free(b); /* sent: kvp_call_start does not keep the body */
	if (!rc)
		rc = call_wait(&c, timeout_ms, deleted ? &rb : NULL, deleted ? &rl : NULL);
	if (!rc && deleted) {
		struct kvp_rbuf r;
		kvp_r_init(&r, rb, rl);
		uint32_t d = kvp_r_u32(&r);
		if (kvp_r_end(&r))
			rc = -EBADMSG;
		else
			*deleted = d;
	}
	free(rb);
	return rc;
}

int kvch_list(struct kvp_pool *p, const char *addr, uint64_t start_after, uint32_t max,
	      int timeout_ms, struct kvch_entry *out, uint32_t *n, int *more)
{
	if (max > KVP_MAX_IDS)
		return -EINVAL;
	uint8_t h[12];
	put_le(h, start_after, 8);
	put_le(h + 8, max, 4);
	struct kvch_call c;
	uint8_t *rb = NULL;
	uint32_t rl = 0;
	int rc = call_start(p, addr, KVP_OP_LIST, h, sizeof(h), NULL, 0, &c);
	if (!rc)
		rc = call_wait(&c, timeout_ms, &rb, &rl);
	if (rc)
		return rc;
	struct kvp_rbuf r;
	kvp_r_init(&r, rb, rl);
	uint32_t cnt = kvp_r_u32(&r);
	if (cnt > max)
		rc = -EBADMSG;
	for (uint32_t i = 0; !rc && i < cnt && !r.err; i++) {
		out[i].chunk_id = kvp_r_u64(&r);
		out[i].mtime_ns = kvp_r_i64(&r);
	}
	uint8_t m = kvp_r_u8(&r);
	if (!rc && kvp_r_end(&r))
		rc = -EBADMSG;
	free(rb);
	if (rc)
		return rc;
	*n = cnt;
	*more = m != 0;
	return 0;
}
