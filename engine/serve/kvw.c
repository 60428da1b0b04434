/* kvw — shared field codecs of the gateway <-> worker protocol (kvw.h). */
#include "kvw.h"

#include <string.h>

#include "kvp.h"
#include "sample.h"

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
