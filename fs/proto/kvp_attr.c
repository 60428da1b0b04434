/* kvp — the body codec of struct kvp_attr (kvp.h), the one fs-specific field type: the
 * generic codec (integers, strings, bytes) is the framing layer's (common/frame/kvp_frame.h). */
#include "kvp.h"

#include <errno.h>

void kvp_w_attr(struct kvp_wbuf *w, const struct kvp_attr *a)
{
	kvp_w_u64(w, a->ino);
	kvp_w_u32(w, a->mode);
	kvp_w_u32(w, a->nlink);
	kvp_w_u64(w, a->size);
	kvp_w_i64(w, a->mtime_ns);
	kvp_w_i64(w, a->atime_ns);
	kvp_w_i64(w, a->ctime_ns);
	kvp_w_u64(w, a->stored);
	kvp_w_u32(w, a->chunk_size);
	kvp_w_u8(w, a->k);
	kvp_w_u8(w, a->m);
	kvp_w_u16(w, 0);
	kvp_w_i64(w, a->access_ns);
	kvp_w_u32(w, a->uid);
	kvp_w_u32(w, a->gid);
}

void kvp_r_attr(struct kvp_rbuf *r, struct kvp_attr *a)
{
	a->ino = kvp_r_u64(r);
	a->mode = kvp_r_u32(r);
	a->nlink = kvp_r_u32(r);
	a->size = kvp_r_u64(r);
	a->mtime_ns = kvp_r_i64(r);
	a->atime_ns = kvp_r_i64(r);
	a->ctime_ns = kvp_r_i64(r);
	a->stored = kvp_r_u64(r);
	a->chunk_size = kvp_r_u32(r);
	a->k = kvp_r_u8(r);
	a->m = kvp_r_u8(r);
	(void)kvp_r_u16(r);
	a->access_ns = kvp_r_i64(r);
	a->uid = kvp_r_u32(r);
	a->gid = kvp_r_u32(r);
}

int kvp_zone_check(const char *p, size_t len)
{
	if (len == 0 || len >= KVP_ZONE_MAX)
		return -EINVAL;
	for (size_t i = 0; i < len; i++) {
		char ch = p[i];
		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-'))
			return -EINVAL;
	}
	return 0;
}

int kvp_redirect_parse(const uint8_t *b, size_t len, char addr[KVP_ADDR_MAX])
{
	addr[0] = 0;
	if (len == 0)
		return -ENOENT;
	struct kvp_rbuf r;
	kvp_r_init(&r, b, len);
	kvp_r_str(&r, addr, KVP_ADDR_MAX);
	char host[KVP_ADDR_MAX];
	uint16_t port;
	/* Too long (-ENAMETOOLONG from the reader) is as malformed as the rest. */
	if (kvp_r_end(&r) || kvp_addr_parse(addr, host, sizeof(host), &port) || port == 0) {
		addr[0] = 0;
		return -EBADMSG;
	}
	return 0;
}
