/* Forged frames inside an authenticated connection (TLS by default), for hostile-peer tests.
 * Header-only: included by the tests that need it. */
#ifndef KVFS_SOCK_TUTIL_H
#define KVFS_SOCK_TUTIL_H

#include "kvp_frame.h"

#include <errno.h>
#include <stdint.h>

/* An authenticated connection to addr (asserts). */
static inline struct kvp_sock *sock_authed(const char *addr, const struct kvp_secret *s)
{
	struct kvp_sock *k = NULL;
	assert_int_equal(kvp_sock_open(addr, s, 5000, &k), 0);
	return k;
}

/* 1 when the peer closed k within 5 s (end of stream or reset), after any bytes it sent. */
static inline int sock_closed(struct kvp_sock *k)
{
	char tmp[4096];
	long n;
	while ((n = kvp_sock_read(k, tmp, sizeof(tmp), 5000)) > 0)
		;
	return n == 0 || n == -ECONNRESET || n == -EPIPE;
}

/* A header claiming len body bytes for op, then body_len bytes of body. */
static inline void sock_send_raw(struct kvp_sock *k, uint16_t op, uint32_t len, const void *body,
				 size_t body_len)
{
	struct kvp_hdr h = {
	    .magic = KVP_MAGIC, .version = KVP_VERSION, .op = op, .id = 7, .len = len};
	uint8_t hb[KVP_HDR_SIZE];
	kvp_hdr_encode(&h, hb);
	assert_int_equal(kvp_sock_write(k, hb, sizeof(hb)), 0);
	if (body_len)
		assert_int_equal(kvp_sock_write(k, body, body_len), 0);
}

#endif
