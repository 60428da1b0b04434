/* kvw — the codec of the gateway <-> worker protocol (kvw.h): one encoder and one decoder per
 * body, so every length read from a peer is checked in this file only. */
#include "kvw.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvp_frame.h"

_Static_assert(KVW_ADDR_MAX == KVP_ADDR_MAX, "a peer address is a kvp address");

int kvw_empty_dec(const uint8_t *body, size_t len)
{
	(void)body;
	return len ? -EBADMSG : 0;
}

/* ---- STATUS ---- */

int kvw_status_enc(struct kvp_wbuf *w, const struct kvw_status *s)
{
	kvp_w_u32(w, s->waiting);
	kvp_w_u32(w, s->running);
	kvp_w_u32(w, s->queued_tokens);
	kvp_w_u32(w, s->kv_free);
	kvp_w_u32(w, s->kv_total);
	kvp_w_u32(w, s->prompt_computed);
	return w->err;
}

int kvw_status_dec(const uint8_t *body, size_t len, struct kvw_status *s)
{
	struct kvp_rbuf rb;
	kvp_r_init(&rb, body, len);
	s->waiting = kvp_r_u32(&rb);
	s->running = kvp_r_u32(&rb);
	s->queued_tokens = kvp_r_u32(&rb);
	s->kv_free = kvp_r_u32(&rb);
	s->kv_total = kvp_r_u32(&rb);
	s->prompt_computed = kvp_r_u32(&rb);
	return kvp_r_end(&rb);
}

/* ---- PREFILL / GENERATE ---- */

static void w_salt(struct kvp_wbuf *w, const char *salt)
{
	kvp_w_cstr(w, salt ? salt : "");
}

static void w_prompt(struct kvp_wbuf *w, const struct kvw_prompt *q)
{
	w_salt(w, q->salt);
	kvw_w_params(w, &q->sp);
	kvp_w_u8(w, q->parse_special);
	kvp_w_u32(w, q->len);
	kvp_w_bytes(w, q->text, q->len);
}

int kvw_prefill_enc(struct kvp_wbuf *w, const struct kvw_prompt *q)
{
	int peer = q->peer && q->peer[0];
	w_prompt(w, q);
	kvp_w_cstr(w, peer ? q->peer : "");
	kvp_w_u64(w, peer ? q->ticket : 0);
	return w->err;
}

int kvw_generate_enc(struct kvp_wbuf *w, const struct kvw_prompt *q)
{
	w_prompt(w, q);
	return w->err;
}

/* Reads the salt into buf; the decoded pointer is NULL for none. */
static const char *r_salt(struct kvp_rbuf *r, char *buf, size_t cap)
{
	kvp_r_str(r, buf, cap);
	return buf[0] ? buf : NULL;
}

static int prompt_dec(const uint8_t *body, size_t len, struct kvw_prompt *q, int prefill)
{
	memset(q, 0, sizeof(*q));
	q->peer = q->peer_buf;
	struct kvp_rbuf rb;
	kvp_r_init(&rb, body, len);
	q->salt = r_salt(&rb, q->salt_buf, sizeof(q->salt_buf));
	kvw_r_params(&rb, &q->sp);
	q->parse_special = kvp_r_u8(&rb);
	q->len = kvp_r_u32(&rb);
	const uint8_t *p = kvp_r_bytes(&rb, q->len);
	if (prefill) {
		kvp_r_str(&rb, q->peer_buf, sizeof(q->peer_buf));
		q->ticket = kvp_r_u64(&rb);
	}
	int rc = kvp_r_end(&rb);
	if (rc)
		return rc;
	if (q->len && memchr(p, 0, q->len)) /* a NUL inside: not text */
		return -EBADMSG;
	if (!(q->text_buf = malloc((size_t)q->len + 1)))
		return -ENOMEM;
	if (q->len)
		memcpy(q->text_buf, p, q->len);
	q->text_buf[q->len] = 0;
	q->text = q->text_buf;
	if (q->peer[0]) { /* a direct hand-over: a valid address and a ticket */
		char host[KVW_ADDR_MAX];
		uint16_t port;
		if (!q->ticket || kvp_addr_parse(q->peer, host, sizeof(host), &port) || !port)
			return -EINVAL;
	}
	return 0;
}

int kvw_prefill_dec(const uint8_t *body, size_t len, struct kvw_prompt *q)
{
	return prompt_dec(body, len, q, 1);
}

int kvw_generate_dec(const uint8_t *body, size_t len, struct kvw_prompt *q)
{
	return prompt_dec(body, len, q, 0);
}

void kvw_prompt_free(struct kvw_prompt *q)
{
	free(q->text_buf);
	q->text_buf = NULL;
	q->text = NULL;
}

/* ---- token lists ---- */

static void w_toks(struct kvp_wbuf *w, const int32_t *toks, uint32_t n)
{
	kvp_w_u32(w, n);
	for (uint32_t i = 0; i < n; i++)
		kvp_w_u32(w, (uint32_t)toks[i]);
}

/* u32 n (> 0) then n ids, into a malloc'd array; the count is checked against the bytes left
 * before anything is allocated. 0 or the error (r->err set for a bad count). */
static int r_toks(struct kvp_rbuf *r, uint32_t *n, int32_t **out)
{
	*n = kvp_r_u32(r);
	if (r->err || *n == 0 || (size_t)*n * 4 > r->len - r->off) {
		r->err = -EBADMSG;
		return -EBADMSG;
	}
	if (!(*out = malloc((size_t)*n * sizeof(int32_t))))
		return -ENOMEM;
	for (uint32_t i = 0; i < *n; i++)
		(*out)[i] = (int32_t)kvp_r_u32(r);
	return 0;
}

/* ---- PREFILL reply ---- */

int kvw_prefilled_enc(struct kvp_wbuf *w, const struct kvw_prefilled *p)
{
	w_toks(w, p->toks, p->n);
	kvp_w_u32(w, p->cached);
	kvp_w_u32(w, (uint32_t)p->first);
	kvp_w_u8(w, p->handed);
	kvp_w_u32(w, p->blen);
	return w->err;
}

int kvw_prefilled_dec(const uint8_t *body, size_t len, struct kvw_prefilled *p)
{
	memset(p, 0, sizeof(*p));
	struct kvp_rbuf rb;
	kvp_r_init(&rb, body, len);
	int rc = r_toks(&rb, &p->n, &p->toks_buf);
	if (rc)
		return rc;
	p->toks = p->toks_buf;
	p->cached = kvp_r_u32(&rb);
	p->first = (int32_t)kvp_r_u32(&rb);
	p->handed = kvp_r_u8(&rb);
	p->blen = kvp_r_u32(&rb);
	p->blk = kvp_r_bytes(&rb, p->blen);
	rc = kvp_r_end(&rb);
	if (!rc && p->handed > 1)
		rc = -EBADMSG;
	return rc;
}

void kvw_prefilled_free(struct kvw_prefilled *p)
{
	free(p->toks_buf);
	p->toks_buf = NULL;
	p->toks = NULL;
}

/* ---- DECODE ---- */

int kvw_decode_enc(struct kvp_wbuf *w, const struct kvw_decode *d)
{
	w_salt(w, d->salt);
	kvw_w_params(w, &d->sp);
	w_toks(w, d->toks, d->n);
	kvp_w_u32(w, (uint32_t)d->first);
	kvp_w_u32(w, d->blen);
	kvp_w_bytes(w, d->blk, d->blen);
	kvp_w_u64(w, d->ticket);
	return w->err;
}

int kvw_decode_dec(const uint8_t *body, size_t len, struct kvw_decode *d)
{
	memset(d, 0, sizeof(*d));
	struct kvp_rbuf rb;
	kvp_r_init(&rb, body, len);
	d->salt = r_salt(&rb, d->salt_buf, sizeof(d->salt_buf));
	kvw_r_params(&rb, &d->sp);
	int rc = r_toks(&rb, &d->n, &d->toks_buf);
	if (rc)
		return rb.err ? rb.err : rc;
	d->toks = d->toks_buf;
	d->first = (int32_t)kvp_r_u32(&rb);
	d->blen = kvp_r_u32(&rb);
	d->blk = kvp_r_bytes(&rb, d->blen);
	d->ticket = kvp_r_u64(&rb);
	return kvp_r_end(&rb);
}

void kvw_decode_free(struct kvw_decode *d)
{
	free(d->toks_buf);
	d->toks_buf = NULL;
	d->toks = NULL;
}

/* ---- reply stream events ---- */

int kvw_ev_prompt_enc(struct kvp_wbuf *w, uint32_t prompt_tokens, uint32_t cached)
{
	kvp_w_u8(w, KVW_EV_PROMPT);
	kvp_w_u32(w, prompt_tokens);
	kvp_w_u32(w, cached);
	return w->err;
}

int kvw_ev_token_enc(struct kvp_wbuf *w, int32_t id, uint32_t len)
{
	kvp_w_u8(w, KVW_EV_TOKEN);
	kvp_w_u32(w, (uint32_t)id);
	kvp_w_u32(w, len);
	return w->err;
}

int kvw_ev_finish_enc(struct kvp_wbuf *w, int32_t err, const char *reason, const char *msg)
{
	kvp_w_u8(w, KVW_EV_FINISH);
	kvp_w_u32(w, (uint32_t)err);
	kvp_w_cstr(w, reason ? reason : "");
	kvp_w_cstr(w, msg ? msg : "");
	return w->err;
}

int kvw_ev_dec(const uint8_t *body, size_t len, struct kvw_ev *e)
{
	memset(e, 0, sizeof(*e));
	struct kvp_rbuf rb;
	kvp_r_init(&rb, body, len);
	e->kind = kvp_r_u8(&rb);
	switch (e->kind) {
	case KVW_EV_PROMPT:
		e->prompt_tokens = kvp_r_u32(&rb);
		e->cached = kvp_r_u32(&rb);
		if (e->prompt_tokens > INT32_MAX || e->cached > e->prompt_tokens)
			rb.err = -EBADMSG;
		break;
	case KVW_EV_TOKEN:
		e->id = (int32_t)kvp_r_u32(&rb);
		e->len = kvp_r_u32(&rb);
		e->text = kvp_r_bytes(&rb, e->len);
		break;
	case KVW_EV_FINISH:
		e->err = (int32_t)kvp_r_u32(&rb);
		kvp_r_str(&rb, e->reason, sizeof(e->reason));
		kvp_r_str(&rb, e->msg, sizeof(e->msg));
		break;
	default:
		return -EBADMSG;
	}
	int rc = kvp_r_end(&rb);
	return rc == -ENAMETOOLONG ? -EBADMSG : rc;
}

/* ---- HELLO / NCCL_ID replies ---- */

int kvw_hello_enc(struct kvp_wbuf *w, const char *cache_id)
{
	kvp_w_cstr(w, cache_id ? cache_id : "");
	return w->err;
}

int kvw_hello_dec(const uint8_t *body, size_t len, char *id, size_t cap)
{
	struct kvp_rbuf rb;
	kvp_r_init(&rb, body, len);
	kvp_r_str(&rb, id, cap);
	return kvp_r_end(&rb);
}

int kvw_nccl_id_enc(struct kvp_wbuf *w, uint32_t session, const uint8_t id[KVW_NCCL_ID_BYTES])
{
	kvp_w_u32(w, session);
	kvp_w_bytes(w, id, KVW_NCCL_ID_BYTES);
	return w->err;
}

int kvw_nccl_id_dec(const uint8_t *body, size_t len, uint32_t *session, const uint8_t **id)
{
	struct kvp_rbuf rb;
	kvp_r_init(&rb, body, len);
	*session = kvp_r_u32(&rb);
	*id = kvp_r_bytes(&rb, KVW_NCCL_ID_BYTES);
	return kvp_r_end(&rb);
}

/* ---- KV_PUT ---- */

int kvw_put_enc(struct kvp_wbuf *w, const struct kvw_put *p)
{
	kvp_w_u64(w, p->ticket);
	w_toks(w, p->toks, p->n);
	kvp_w_u32(w, p->first_block);
	kvp_w_u32(w, p->block_bytes);
	kvp_w_u32(w, p->n_blocks);
	kvp_w_u8(w, p->via);
	kvp_w_u32(w, p->via ? p->session : 0);
	return w->err;
}

int kvw_put_dec(const uint8_t *body, size_t len, struct kvw_put *p)
{
	memset(p, 0, sizeof(*p));
	struct kvp_rbuf rb;
	kvp_r_init(&rb, body, len);
	p->ticket = kvp_r_u64(&rb);
	int rc = r_toks(&rb, &p->n, &p->toks_buf);
	if (rc)
		return rc;
	p->toks = p->toks_buf;
	p->first_block = kvp_r_u32(&rb);
	p->block_bytes = kvp_r_u32(&rb);
	p->n_blocks = kvp_r_u32(&rb);
	p->via = kvp_r_u8(&rb);
	p->session = kvp_r_u32(&rb);
	if (!rb.err && p->via == 0) {
		p->kv_len = (size_t)p->n_blocks * p->block_bytes; /* u32 x u32: no overflow */
		p->kv = kvp_r_bytes(&rb, p->kv_len);
	}
	return kvp_r_end(&rb);
}

void kvw_put_free(struct kvw_put *p)
{
	free(p->toks_buf);
	p->toks_buf = NULL;
	p->toks = NULL;
}

/* ---- sampling parameters ---- */

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
	kvp_w_u32(w, f2u(p->presence_penalty));
	kvp_w_u32(w, f2u(p->frequency_penalty));
	int nb = p->n_bias < 0			   ? 0
		 : p->n_bias > KVI_SAMPLE_MAX_BIAS ? KVI_SAMPLE_MAX_BIAS
						   : p->n_bias;
	kvp_w_u32(w, (uint32_t)nb);
	for (int i = 0; i < nb; i++) {
		kvp_w_u32(w, (uint32_t)p->bias[i].id);
		kvp_w_u32(w, f2u(p->bias[i].bias));
	}
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
	p->presence_penalty = u2f(kvp_r_u32(r));
	p->frequency_penalty = u2f(kvp_r_u32(r));
	uint32_t nb = kvp_r_u32(r);
	if (nb > KVI_SAMPLE_MAX_BIAS) {
		r->err = r->err ? r->err : -EBADMSG;
		return;
	}
	for (uint32_t i = 0; i < nb && !r->err; i++) {
		p->bias[i].id = (int32_t)kvp_r_u32(r);
		p->bias[i].bias = u2f(kvp_r_u32(r));
	}
	p->n_bias = r->err ? 0 : (int)nb;
	/* the sampler refuses a bad id or bias (kvi_sampler_create: -EINVAL) */
}
