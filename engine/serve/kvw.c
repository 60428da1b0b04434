/* kvw — shared field codecs of the gateway <-> worker protocol (kvw.h). */
#include "kvw.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvp.h"
#include "sample.h"

int kvw_put_parse(const uint8_t *body, size_t len, struct kvw_put *p)
{
	memset(p, 0, sizeof(*p));
	struct kvp_rbuf rb;
	kvp_r_init(&rb, body, len);
	p->ticket = kvp_r_u64(&rb);
	p->n = kvp_r_u32(&rb);
	if (rb.err || p->n == 0 || (size_t)p->n * 4 > len - rb.off)
		return -EBADMSG;
	if (!(p->toks = malloc((size_t)p->n * sizeof(int32_t))))
		return -ENOMEM;
	for (uint32_t i = 0; i < p->n; i++)
		p->toks[i] = (int32_t)kvp_r_u32(&rb);
	p->first_block = kvp_r_u32(&rb);
	p->block_bytes = kvp_r_u32(&rb);
	p->n_blocks = kvp_r_u32(&rb);
	p->via = kvp_r_u8(&rb);
	p->session = kvp_r_u32(&rb);
	if (!rb.err && p->via == 0) {
		p->kv_len = (size_t)p->n_blocks * p->block_bytes; /* u32 x u32: no overflow */
		p->kv = kvp_r_bytes(&rb, p->kv_len);
	}
	int rc = kvp_r_end(&rb);
	if (rc) {
		free(p->toks);
		memset(p, 0, sizeof(*p));
	}
	return rc;
}

static uint32_t f2u(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static float u2f(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

void kvw_w_params(struct kvp_wbuf *w, const struct kvi_sample_params *p)
{
	kvp_w_u32(w, f2u(p->temp));
	kvp_w_u32(w, f2u(p->top_p));
	kvp_w_u32(w, (uint32_t)p->top_k);
	kvp_w_u64(w, p->seed);
	kvp_w_u32(w, (uint32_t)p->max_tokens);
}

void kvw_r_params(struct kvp_rbuf *r, struct kvi_sample_params *p)
{
	kvi_sample_params_default(p);
	p->temp = u2f(kvp_r_u32(r));
	p->top_p = u2f(kvp_r_u32(r));
	p->top_k = (int)kvp_r_u32(r);
	p->seed = kvp_r_u64(r);
	p->max_tokens = (int)kvp_r_u32(r);
	if (p->max_tokens < 0)
		p->max_tokens = 0;
}
