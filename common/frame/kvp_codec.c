/* Frame header and body encoding: explicit little-endian, every read bounds-checked. */
#include "kvp_frame.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}
static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
	       ((uint32_t)p[3] << 24);
}
static uint64_t get64(const uint8_t *p)
{
	return (uint64_t)get32(p) | ((uint64_t)get32(p + 4) << 32);
}

void kvp_hdr_encode(const struct kvp_hdr *h, uint8_t out[KVP_HDR_SIZE])
{
	put32(out, h->magic);
	put16(out + 4, h->version);
	put16(out + 6, h->op);
	put64(out + 8, h->id);
	put32(out + 16, (uint32_t)h->status);
	put32(out + 20, h->flags);
	put32(out + 24, h->len);
	put32(out + 28, h->reserved);
}

int kvp_hdr_decode(const uint8_t in[KVP_HDR_SIZE], struct kvp_hdr *h, uint32_t max_body)
{
	h->magic = get32(in);
	h->version = get16(in + 4);
	h->op = get16(in + 6);
	h->id = get64(in + 8);
	h->status = (int32_t)get32(in + 16);
	h->flags = get32(in + 20);
	h->len = get32(in + 24);
	h->reserved = get32(in + 28);
	h->recv_ns = 0;
	if (h->magic != KVP_MAGIC || h->version != KVP_VERSION || h->reserved != 0 ||
	    (h->flags & ~KVP_F_RESP))
		return -EPROTO;
	if (h->len > max_body)
		return -EMSGSIZE;
	/* A status is 0 or a plausible negative errno; anything else is garbage. */
	if (h->status > 0 || h->status < -4095)
		return -EPROTO;
	return 0;
}

void kvp_w_init(struct kvp_wbuf *w)
{
	memset(w, 0, sizeof(*w));
}

void kvp_w_free(struct kvp_wbuf *w)
{
	free(w->p);
	memset(w, 0, sizeof(*w));
}

static uint8_t *w_room(struct kvp_wbuf *w, size_t n)
{
	if (w->err)
		return NULL;
	if (w->len + n > w->cap) {
		size_t cap = w->cap ? w->cap : 256;
		while (cap < w->len + n)
			cap *= 2;
		uint8_t *p = realloc(w->p, cap);
		if (!p) {
			w->err = -ENOMEM;
			return NULL;
		}
		w->p = p;
		w->cap = cap;
	}
	uint8_t *at = w->p + w->len;
	w->len += n;
	return at;
}

void kvp_w_u8(struct kvp_wbuf *w, uint8_t v)
{
	uint8_t *p = w_room(w, 1);
	if (p)
		*p = v;
}
void kvp_w_u16(struct kvp_wbuf *w, uint16_t v)
{
	uint8_t *p = w_room(w, 2);
	if (p)
		put16(p, v);
}
void kvp_w_u32(struct kvp_wbuf *w, uint32_t v)
{
	uint8_t *p = w_room(w, 4);
	if (p)
		put32(p, v);
}
void kvp_w_u64(struct kvp_wbuf *w, uint64_t v)
{
	uint8_t *p = w_room(w, 8);
	if (p)
		put64(p, v);
}
void kvp_w_i64(struct kvp_wbuf *w, int64_t v)
{
	kvp_w_u64(w, (uint64_t)v);
}
void kvp_w_bytes(struct kvp_wbuf *w, const void *src, size_t n)
{
	uint8_t *p = w_room(w, n);
	if (p && n)
		memcpy(p, src, n);
}
void kvp_w_str(struct kvp_wbuf *w, const char *s, size_t n)
{
	if (n > 65535) {
		if (!w->err)
			w->err = -ENAMETOOLONG;
		return;
	}
	kvp_w_u16(w, (uint16_t)n);
	kvp_w_bytes(w, s, n);
}
void kvp_w_cstr(struct kvp_wbuf *w, const char *s)
{
	kvp_w_str(w, s, strlen(s));
}

void kvp_r_init(struct kvp_rbuf *r, const void *p, size_t len)
{
	r->p = p;
	r->len = p ? len : 0;
	r->off = 0;
	r->err = 0;
}

const uint8_t *kvp_r_bytes(struct kvp_rbuf *r, size_t n)
{
	if (r->err || n > r->len - r->off) {
		if (!r->err)
			r->err = -EBADMSG;
		return NULL;
	}
	const uint8_t *p = r->p + r->off;
	r->off += n;
	return p;
}

uint8_t kvp_r_u8(struct kvp_rbuf *r)
{
	const uint8_t *p = kvp_r_bytes(r, 1);
	return p ? p[0] : 0;
}
uint16_t kvp_r_u16(struct kvp_rbuf *r)
{
	const uint8_t *p = kvp_r_bytes(r, 2);
	return p ? get16(p) : 0;
}
uint32_t kvp_r_u32(struct kvp_rbuf *r)
{
	const uint8_t *p = kvp_r_bytes(r, 4);
	return p ? get32(p) : 0;
}
uint64_t kvp_r_u64(struct kvp_rbuf *r)
{
	const uint8_t *p = kvp_r_bytes(r, 8);
	return p ? get64(p) : 0;
}
int64_t kvp_r_i64(struct kvp_rbuf *r)
{
	return (int64_t)kvp_r_u64(r);
}

size_t kvp_r_str(struct kvp_rbuf *r, char *dst, size_t cap)
{
	uint16_t n = kvp_r_u16(r);
	const uint8_t *p = kvp_r_bytes(r, n);
	if (cap)
		dst[0] = 0;
	if (!p)
		return 0;
	if ((size_t)n + 1 > cap) {
		if (!r->err)
			r->err = -ENAMETOOLONG;
		return 0;
	}
	if (memchr(p, 0, n)) {
		if (!r->err)
			r->err = -EBADMSG;
		return 0;
	}
	memcpy(dst, p, n);
	dst[n] = 0;
	return n;
}

int kvp_r_end(const struct kvp_rbuf *r)
{
	if (r->err)
		return r->err;
	return r->off == r->len ? 0 : -EBADMSG;
}

const char *kvp_strerror(int err)
{
	if (err < 0)
		err = -err;
	switch (err) {
	case 0:
		return "ok";
	case EHOSTDOWN:
		return "not enough peers up";
	case EILSEQ:
		return "data failed its checksum";
	case EPROTO:
		return "protocol error";
	case EACCES:
		return "authentication failed (shared secret)";
	case EREMCHG:
		return "not the leader (a replicated meta: ask another replica)";
	default:
		return strerror(err);
	}
}
