/* libFuzzer targets: one decoder of the worker protocol (engine/serve/kvw.h) over untrusted
 * bytes, built once per op with KVW_FUZZ_OP naming it (tests/CMakeLists.txt: fuzz_kvw_<op>).
 * What a worker or a balancer reads from any authenticated peer. Checks, besides ASan/UBSan:
 *  - a decoder answers 0 or one of its documented errors;
 *  - what it accepts re-encodes to a body the decoder accepts again, and encoding that gives
 *    the same bytes (the encoding is canonical after one pass);
 *  - for ops without normalised fields, the re-encoding is the input itself;
 *  - log-probability records (lp) keep their counts and texts inside their fields;
 *  - an ENCODE's pixels are exactly w x h x 3 bytes inside the body, its sizes in bounds. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvp_frame.h"
#include "kvw.h"

enum {
	OP_STATUS = 1,
	OP_PREFILL,
	OP_PREFILLED,
	OP_GENERATE,
	OP_DECODE,
	OP_EV,
	OP_HELLO,
	OP_NCCL_ID,
	OP_CANCEL,
	OP_ENCODE,
	OP_ENCODED
};

#ifndef KVW_FUZZ_OP
#error "define KVW_FUZZ_OP"
#endif

/* Decodes in, and on success encodes it again into out (bulk bytes appended). *exact: the
 * re-encoding must equal in. Returns the decoder's status. */
static int dec_enc(const uint8_t *in, size_t n, struct kvp_wbuf *out, int *exact)
{
	int rc;
	*exact = 1;
	switch (KVW_FUZZ_OP) {
	case OP_STATUS: {
		struct kvw_status s;
		if (!(rc = kvw_status_dec(in, n, &s)))
			kvw_status_enc(out, &s);
		return rc;
	}
	case OP_PREFILL:
	case OP_GENERATE: {
		struct kvw_prompt q;
		int pf = KVW_FUZZ_OP == OP_PREFILL;
		rc = pf ? kvw_prefill_dec(in, n, &q) : kvw_generate_dec(in, n, &q);
		if (!rc) {
			if (!q.text || strlen(q.text) != q.len || (q.salt && !q.salt[0]) ||
			    (q.nt && (q.len || !q.toks)) || (!q.nt && q.toks) ||
			    q.logprobs > 1 + KVW_MAX_TOP || q.nx >= KVW_MAX_CHOICES)
				abort();
			if (pf)
				kvw_prefill_enc(out, &q);
			else
				kvw_generate_enc(out, &q);
		}
		kvw_prompt_free(&q);
		*exact = 0; /* max_tokens < 0 reads 0; no peer drops the ticket */
		return rc;
	}
	case OP_PREFILLED: {
		struct kvw_prefilled p;
		if (!(rc = kvw_prefilled_dec(in, n, &p))) {
			if (!p.n || p.handed > 1 || p.nx >= KVW_MAX_CHOICES ||
			    (p.blen && (p.blk < in || p.blk + p.blen != in + n)) ||
			    (p.xlp && !p.lp) || (p.lp && p.nx && !p.xlp))
				abort();
			for (uint32_t i = 0; p.lp && i <= p.nx; i++) { /* texts end inside */
				const struct kvw_lp *l = i ? &p.xlp[i - 1] : p.lp;
				if (!l->present || l->n_top > KVW_MAX_TOP ||
				    strnlen(l->token, KVW_LP_TEXT) == KVW_LP_TEXT)
					abort();
			}
			kvw_prefilled_enc(out, &p);
			kvp_w_bytes(out, p.blk, p.blen);
		}
		kvw_prefilled_free(&p);
		return rc;
	}
	case OP_DECODE: {
		struct kvw_decode d;
		if (!(rc = kvw_decode_dec(in, n, &d))) {
			if (!d.n || !d.toks || d.nx >= KVW_MAX_CHOICES ||
			    (d.blen && (d.blk < in || d.blk + d.blen > in + n)))
				abort();
			kvw_decode_enc(out, &d);
		}
		kvw_decode_free(&d);
		*exact = 0; /* max_tokens */
		return rc;
	}
	case OP_EV: {
		struct kvw_ev e;
		if (!(rc = kvw_ev_dec(in, n, &e))) {
			if (e.kind == KVW_EV_PROMPT) {
				if (e.cached > e.prompt_tokens)
					abort();
				kvw_ev_prompt_enc(out, e.prompt_tokens, e.cached);
			} else if (e.choice >= KVW_MAX_CHOICES) {
				abort();
			} else if (e.kind == KVW_EV_TOKEN) {
				if (e.len && (e.text < in || e.text + e.len != in + n))
					abort();
				if (e.lp.n_top > KVW_MAX_TOP ||
				    strnlen(e.lp.token, KVW_LP_TEXT) == KVW_LP_TEXT)
					abort();
				kvw_ev_token_enc(out, e.choice, e.id, &e.lp, e.len);
				kvp_w_bytes(out, e.text, e.len);
			} else if (e.kind == KVW_EV_FINISH) {
				kvw_ev_finish_enc(out, e.choice, e.err, e.reason, e.msg);
			} else {
				abort();
			}
		}
		return rc;
	}
	case OP_HELLO: {
		char id[512];
		if (!(rc = kvw_hello_dec(in, n, id, sizeof(id))))
			kvw_hello_enc(out, id);
		return rc;
	}
	case OP_NCCL_ID: {
		uint32_t s;
		const uint8_t *id;
		if (!(rc = kvw_nccl_id_dec(in, n, &s, &id)))
			kvw_nccl_id_enc(out, s, id);
		return rc;
	}
	case OP_CANCEL: {
		uint8_t choice;
		if (!(rc = kvw_cancel_dec(in, n, &choice)))
			kvw_cancel_enc(out, choice);
		return rc;
	}
	case OP_ENCODE: {
		struct kvw_encode e;
		if (!(rc = kvw_encode_dec(in, n, &e))) {
			uint64_t px = (uint64_t)e.w * e.h;
			if (!e.w || !e.h || e.w > KVW_ENC_MAX_SIDE || e.h > KVW_ENC_MAX_SIDE ||
			    px > KVW_ENC_MAX_PIXELS || e.pix < in || e.pix + px * 3 != in + n ||
			    (e.salt && !e.salt[0]))
				abort();
			kvw_encode_enc(out, &e);
			kvp_w_bytes(out, e.pix, (size_t)px * 3);
		}
		return rc;
	}
	case OP_ENCODED: {
		struct kvw_encoded e;
		if (!(rc = kvw_encoded_dec(in, n, &e))) {
			if (!e.n_tokens || !e.dim || e.cached > 1)
				abort();
			kvw_encoded_enc(out, &e);
		}
		return rc;
	}
	}
	abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kvp_wbuf a, b;
	int exact, ignored;
	kvp_w_init(&a);
	kvp_w_init(&b);
	int rc = dec_enc(data, size, &a, &exact);
	if (rc == 0) {
		if (a.err)
			abort();
		if (exact && (a.len != size || (size && memcmp(a.p, data, size))))
			abort();
		if (dec_enc(a.p, a.len, &b, &ignored) || b.err || b.len != a.len ||
		    (a.len && memcmp(a.p, b.p, a.len)))
			abort();
	} else if (rc != -EBADMSG && rc != -ENOMEM && rc != -ENAMETOOLONG && rc != -EINVAL &&
		   !(KVW_FUZZ_OP == OP_ENCODE && rc == -E2BIG)) {
		abort();
	}
	kvp_w_free(&a);
	kvp_w_free(&b);
	return 0;
}
