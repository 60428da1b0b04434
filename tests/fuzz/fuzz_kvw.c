/* libFuzzer target: the KVW_OP_KV_PUT body decoder (engine/serve/kvw.c) over untrusted bytes —
 * what a decode worker reads from any authenticated peer. Checks that an accepted body's
 * fields agree with its length and that the KV bytes lie inside it. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvp_frame.h"
#include "kvw.h"
#include "sample.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kvw_put p;
	int rc = kvw_put_dec(data, size, &p);
	if (rc == 0) {
		size_t fixed = 8 + 4 + (size_t)p.n * 4 + 4 + 4 + 4 + 1 + 4;
		if (p.n == 0 || !p.toks || p.toks != p.toks_buf)
			abort();
		if (p.via == 0) {
			if (p.kv_len != (size_t)p.n_blocks * p.block_bytes ||
			    fixed + p.kv_len != size ||
			    (p.kv_len && (p.kv < data || p.kv + p.kv_len > data + size)))
				abort();
		} else if (p.kv || p.kv_len || fixed != size) {
			abort();
		}
		for (uint32_t i = 0; i < p.n; i++) /* every id was read (ASan: inside the array) */
			if (p.toks[i] !=
			    (int32_t)(data[12 + 4 * i] | data[13 + 4 * i] << 8 |
				      data[14 + 4 * i] << 16 | (uint32_t)data[15 + 4 * i] << 24))
				abort();
	} else if (rc != -EBADMSG && rc != -ENOMEM) {
		abort();
	}
	kvw_put_free(&p);
	/* the sampling-parameter field of PREFILL / DECODE on the same bytes */
	struct kvp_rbuf rb;
	struct kvi_sample_params sp;
	kvp_r_init(&rb, data, size);
	kvw_r_params(&rb, &sp);
	(void)kvp_r_end(&rb);
	return 0;
}
