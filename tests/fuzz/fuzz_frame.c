/* libFuzzer target: the frame header decoder, the generic body reader over untrusted bytes and
 * meta's redirect body (kvp_redirect_parse).
 * Input: a 32-byte header candidate, then a script of reads over the rest. Checks that a decoded
 * header obeys every rule docs/protocol.md states, that reads never go past the buffer and that
 * the reader's error is sticky. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < KVP_HDR_SIZE + 1)
		return 0;
	struct kvp_hdr h;
	uint32_t max = 1u << (data[KVP_HDR_SIZE] % 25);
	if (kvp_hdr_decode(data, &h, max) == 0) {
		if (h.magic != KVP_MAGIC || h.version != KVP_VERSION || h.reserved || h.len > max)
			abort();
		uint8_t again[KVP_HDR_SIZE];
		kvp_hdr_encode(&h, again);
		if (memcmp(again, data, KVP_HDR_SIZE) != 0)
			abort();
	}
	/* Body script: the first byte of each step picks a read, the rest is the buffer. */
	size_t n = size - KVP_HDR_SIZE - 1;
	const uint8_t *ops = data + KVP_HDR_SIZE + 1;
	size_t nops = n < 16 ? n : 16;
	size_t blen = n - nops;
	uint8_t *buf = blen ? malloc(blen) : NULL;
	if (blen)
		memcpy(buf, ops + nops, blen);
	struct kvp_rbuf r;
	kvp_r_init(&r, buf, blen);
	char s[KVP_NAME_MAX + 1];
	struct kvp_attr a;
	int failed = 0;
	for (size_t i = 0; i < nops; i++) {
		switch (ops[i] % 9) {
		case 0:
			kvp_r_u8(&r);
			break;
		case 1:
			kvp_r_u16(&r);
			break;
		case 2:
			kvp_r_u32(&r);
			break;
		case 3:
			kvp_r_u64(&r);
			break;
		case 4:
			kvp_r_i64(&r);
			break;
		case 5: {
			const uint8_t *p = kvp_r_bytes(&r, ops[i] / 9);
			if (p && (p < buf || p + ops[i] / 9 > buf + blen))
				abort();
			break;
		}
		case 6:
			if (kvp_r_str(&r, s, sizeof(s)) >= sizeof(s) ||
			    memchr(s, 0, sizeof(s)) == NULL)
				abort();
			break;
		case 7:
			kvp_r_attr(&r, &a);
			break;
		case 8:
			kvp_r_end(&r);
			break;
		}
		if (r.off > r.len)
			abort();
		if (failed && !r.err)
			abort(); /* errors are sticky */
		failed = r.err != 0;
	}
	/* The same bytes as meta's -EREMCHG body: a leader address is only ever accepted as a
	 * usable HOST:PORT, and a refusal leaves none. */
	char addr[KVP_ADDR_MAX];
	memset(addr, 'x', sizeof(addr));
	int rc = kvp_redirect_parse(buf, blen, addr);
	char host[KVP_ADDR_MAX];
	uint16_t port;
	if (!memchr(addr, 0, sizeof(addr)))
		abort();
	if (rc == 0 && (kvp_addr_parse(addr, host, sizeof(host), &port) || port == 0))
		abort();
	if (rc && (addr[0] || (rc != -ENOENT && rc != -EBADMSG) || (rc == -ENOENT) != !blen))
		abort();
	free(buf);
	return 0;
}
