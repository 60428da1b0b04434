/* kvw — the codec of the gateway <-> worker protocol (kvw.h): one encoder and one decoder per
 * body, so every length read from a peer is checked in this file only. */
#include "kvw.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "gw.h"
#include "kve.h"
#include "kvp_frame.h"

_Static_assert(KVW_ADDR_MAX == KVP_ADDR_MAX, "a peer address is a kvp address");
_Static_assert(KVW_MAX_TOP == OAI_MAX_TOP_LOGPROBS, "an lp carries what the API asks");
_Static_assert(KVW_MAX_CHOICES == OAI_MAX_CHOICES, "a PREFILL carries every choice's seed");

static uint32_t f2u(float f);
static float u2f(uint32_t u);

int kvw_empty_dec(const uint8_t *body, size_t len)
{
	(void)body;
	return len ? -EBADMSG : 0;
}

/* ---- images (PREFILL, its reply, DECODE) ---- */

/* what: 0 = PREFILL's and DECODE's (offset or pos, n_tokens, hash, tower_fp), 2 = the
 * PREFILL reply's (pos) */
static void w_images(struct kvp_wbuf *w, const struct kvw_image *im, uint32_t n, int what)
{
	n = n < KVW_MAX_IMAGES ? n : KVW_MAX_IMAGES;
	kvp_w_u32(w, n);
	for (uint32_t i = 0; i < n; i++) {
		kvp_w_u32(w, im[i].off);
		if (what == 2)
			continue;
		kvp_w_u32(w, im[i].n_tokens);
		kvp_w_bytes(w, im[i].hash, KVW_IMG_HASH);
		if (what == 0)
			kvp_w_bytes(w, im[i].tower_fp, KVW_IMG_HASH);
	}
}

/* Reads what w_images wrote; the count past KVW_MAX_IMAGES is -EBADMSG, offsets decreasing or
 * a token count out of 1..KVE_MAX_TOKENS -EINVAL (in *bad: checked after the body parsed). */
static int r_images(struct kvp_rbuf *r, struct kvw_image *im, uint32_t *n, int what, int *bad)
{
	*n = kvp_r_u32(r);
	if (*n > KVW_MAX_IMAGES)
		return -EBADMSG;
	for (uint32_t i = 0; i < *n && !r->err; i++) {
		im[i].off = kvp_r_u32(r);
		if (i && im[i].off < im[i - 1].off)
			*bad = 1;
		if (what == 2)
			continue;
		im[i].n_tokens = kvp_r_u32(r);
		if (!im[i].n_tokens || im[i].n_tokens > KVE_MAX_TOKENS)
			*bad = 1;
		const uint8_t *h = kvp_r_bytes(r, KVW_IMG_HASH);
		if (h)
			memcpy(im[i].hash, h, KVW_IMG_HASH);
		if (what == 0 && (h = kvp_r_bytes(r, KVW_IMG_HASH)))
			memcpy(im[i].tower_fp, h, KVW_IMG_HASH);
	}
	return 0;
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

static void w_toks(struct kvp_wbuf *w, const int32_t *toks, uint32_t n);

static void w_prompt(struct kvp_wbuf *w, const struct kvw_prompt *q)
{
	int ids = q->nt > 0;
	w_salt(w, q->salt);
	kvw_w_params(w, &q->sp);
	kvp_w_u8(w, q->logprobs);
	kvp_w_u8(w, q->parse_special);
	kvp_w_u32(w, ids ? 0 : q->len);
	kvp_w_bytes(w, q->text, ids ? 0 : q->len);
	w_toks(w, q->toks, q->nt);
}

int kvw_prefill_enc(struct kvp_wbuf *w, const struct kvw_prompt *q)
{
	int peer = q->peer && q->peer[0];
	uint32_t nx = q->nx < KVW_MAX_CHOICES ? q->nx : KVW_MAX_CHOICES - 1;
	w_prompt(w, q);
	kvp_w_cstr(w, peer ? q->peer : "");
	kvp_w_u64(w, peer ? q->ticket : 0);
	kvp_w_u32(w, nx);
	for (uint32_t i = 0; i < nx; i++)
		kvp_w_u64(w, q->seeds[i]);
	w_images(w, q->images, q->nimg, 0);
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

static int r_toks0(struct kvp_rbuf *r, uint32_t *n, int32_t **out, int allow0);

static int prompt_dec(const uint8_t *body, size_t len, struct kvw_prompt *q, int prefill)
{
	memset(q, 0, sizeof(*q));
	q->peer = q->peer_buf;
	struct kvp_rbuf rb;
	kvp_r_init(&rb, body, len);
	q->salt = r_salt(&rb, q->salt_buf, sizeof(q->salt_buf));
	kvw_r_params(&rb, &q->sp);
	q->logprobs = kvp_r_u8(&rb);
	q->parse_special = kvp_r_u8(&rb);
	q->len = kvp_r_u32(&rb);
	const uint8_t *p = kvp_r_bytes(&rb, q->len);
	int rc = r_toks0(&rb, &q->nt, &q->toks_buf, 1), bad = 0;
	if (rc)
		return rb.err ? rb.err : rc;
	q->toks = q->toks_buf;
	if (prefill) {
		kvp_r_str(&rb, q->peer_buf, sizeof(q->peer_buf));
		q->ticket = kvp_r_u64(&rb);
		q->nx = kvp_r_u32(&rb);
		if (q->nx >= KVW_MAX_CHOICES)
			return -EBADMSG;
		for (uint32_t i = 0; i < q->nx; i++)
			q->seeds[i] = kvp_r_u64(&rb);
		if ((rc = r_images(&rb, q->images, &q->nimg, 0, &bad)))
			return rc;
	}
	rc = kvp_r_end(&rb);
	if (rc)
		return rc;
	if ((q->len && memchr(p, 0, q->len)) || (q->nt && q->len)) /* not text; both */
		return -EBADMSG;
	if (q->logprobs > 1 + KVW_MAX_TOP)
		return -EINVAL;
	/* images go where bytes of a text prompt end */
	if (bad || (q->nimg && (q->nt || q->images[q->nimg - 1].off > q->len)))
		return -EINVAL;
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
	free(q->toks_buf);
	q->text_buf = NULL;
	q->text = NULL;
	q->toks_buf = NULL;
	q->toks = NULL;
}

/* ---- token lists ---- */

static void w_toks(struct kvp_wbuf *w, const int32_t *toks, uint32_t n)
{
	kvp_w_u32(w, n);
	for (uint32_t i = 0; i < n; i++)
		kvp_w_u32(w, (uint32_t)toks[i]);
}

/* u32 n (> 0, or >= 0 with allow0) then n ids, into a malloc'd array (none for 0); the count
 * is checked against the bytes left before anything is allocated. 0 or the error (r->err set
 * for a bad count). */
static int r_toks0(struct kvp_rbuf *r, uint32_t *n, int32_t **out, int allow0)
{
	*n = kvp_r_u32(r);
	if (r->err || (*n == 0 && !allow0) || (size_t)*n * 4 > r->len - r->off) {
		r->err = -EBADMSG;
		return -EBADMSG;
	}
	if (*n == 0)
		return 0;
	if (!(*out = malloc((size_t)*n * sizeof(int32_t))))
		return -ENOMEM;
	for (uint32_t i = 0; i < *n; i++)
		(*out)[i] = (int32_t)kvp_r_u32(r);
	return 0;
}

static int r_toks(struct kvp_rbuf *r, uint32_t *n, int32_t **out)
{
	return r_toks0(r, n, out, 0);
}

/* ---- log-probabilities ---- */

static void lp_copy(char *dst, const char *src)
{
	size_t n = src ? strnlen(src, KVW_LP_TEXT - 1) : 0;
	memcpy(dst, src ? src : "", n);
	dst[n] = 0;
}

void kvw_lp_from(struct kvw_lp *d, const struct gw_logprob *lp)
{
	d->present = 1;
	d->logprob = lp->logprob;
	lp_copy(d->token, lp->token);
	int nt = lp->n_top < 0 ? 0 : lp->n_top > KVW_MAX_TOP ? KVW_MAX_TOP : lp->n_top;
	d->n_top = (uint8_t)nt;
	for (int i = 0; i < nt; i++) {
		lp_copy(d->top_token[i], lp->top_token[i]);
		d->top_logprob[i] = lp->top_logprob[i];
	}
}

void kvw_lp_to(const struct kvw_lp *s, struct gw_logprob *lp)
{
	memset(lp, 0, sizeof(*lp));
	lp->token = s->token;
	lp->logprob = s->logprob;
	lp->n_top = s->n_top;
	for (int i = 0; i < s->n_top; i++) {
		lp->top_token[i] = s->top_token[i];
		lp->top_logprob[i] = s->top_logprob[i];
	}
}

static void w_lp(struct kvp_wbuf *w, const struct kvw_lp *lp)
{
	int on = lp && lp->present;
	kvp_w_u8(w, (uint8_t)on);
	if (!on)
		return;
	int nt = lp->n_top > KVW_MAX_TOP ? KVW_MAX_TOP : lp->n_top;
	kvp_w_u32(w, f2u(lp->logprob));
	kvp_w_cstr(w, lp->token);
	kvp_w_u8(w, (uint8_t)nt);
	for (int i = 0; i < nt; i++) {
		kvp_w_cstr(w, lp->top_token[i]);
		kvp_w_u32(w, f2u(lp->top_logprob[i]));
	}
}

/* Reads an lp into d (zeroed first); a bad flag, count or over-long text sets r->err. */
static void r_lp(struct kvp_rbuf *r, struct kvw_lp *d)
{
	memset(d, 0, sizeof(*d));
	d->present = kvp_r_u8(r);
	if (!d->present || r->err)
		return;
	if (d->present != 1) {
		r->err = -EBADMSG;
		return;
	}
	d->logprob = u2f(kvp_r_u32(r));
	kvp_r_str(r, d->token, sizeof(d->token));
	d->n_top = kvp_r_u8(r);
	if (d->n_top > KVW_MAX_TOP) {
		r->err = r->err ? r->err : -EBADMSG;
		d->n_top = 0;
		return;
	}
	for (int i = 0; i < d->n_top && !r->err; i++) {
		kvp_r_str(r, d->top_token[i], sizeof(d->top_token[i]));
		d->top_logprob[i] = u2f(kvp_r_u32(r));
	}
}

/* ---- PREFILL reply ---- */

int kvw_prefilled_enc(struct kvp_wbuf *w, const struct kvw_prefilled *p)
{
	w_toks(w, p->toks, p->n);
	kvp_w_u32(w, p->cached);
	kvp_w_u32(w, (uint32_t)p->first);
	w_lp(w, p->lp);
	uint32_t nx = p->nx < KVW_MAX_CHOICES ? p->nx : KVW_MAX_CHOICES - 1;
	kvp_w_u32(w, nx);
	for (uint32_t i = 0; i < nx; i++) {
		kvp_w_u32(w, (uint32_t)p->xfirst[i]);
		w_lp(w, p->xlp ? &p->xlp[i] : NULL);
	}
	w_images(w, p->images, p->nimg, 2);
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
	if (!(p->lp_buf = malloc(KVW_MAX_CHOICES * sizeof(*p->lp_buf))))
		return -ENOMEM;
	r_lp(&rb, &p->lp_buf[0]);
	p->nx = kvp_r_u32(&rb);
	if (p->nx >= KVW_MAX_CHOICES)
		return -EBADMSG;
	for (uint32_t i = 0; i < p->nx; i++) {
		p->xfirst[i] = (int32_t)kvp_r_u32(&rb);
		r_lp(&rb, &p->lp_buf[1 + i]);
	}
	int bad = 0;
	if ((rc = r_images(&rb, p->images, &p->nimg, 2, &bad)))
		return rc;
	p->handed = kvp_r_u8(&rb);
	p->blen = kvp_r_u32(&rb);
	p->blk = kvp_r_bytes(&rb, p->blen);
	rc = kvp_r_end(&rb);
	if (!rc && (p->handed > 1 || bad || (p->nimg && p->images[p->nimg - 1].off >= p->n)))
		rc = -EBADMSG;
	if (rc)
		return rc == -ENAMETOOLONG ? -EBADMSG : rc;
	/* every record present or none: the worker answers what the request asked */
	int on = p->lp_buf[0].present;
	for (uint32_t i = 0; i < p->nx; i++)
		if (p->lp_buf[1 + i].present != on)
			return -EBADMSG;
	p->lp = on ? &p->lp_buf[0] : NULL;
	p->xlp = on && p->nx ? &p->lp_buf[1] : NULL;
	return 0;
}

void kvw_prefilled_free(struct kvw_prefilled *p)
{
	free(p->toks_buf);
	free(p->lp_buf);
	p->toks_buf = NULL;
	p->toks = NULL;
	p->lp_buf = NULL;
	p->lp = p->xlp = NULL;
}

/* ---- DECODE ---- */

int kvw_decode_enc(struct kvp_wbuf *w, const struct kvw_decode *d)
{
	w_salt(w, d->salt);
	kvw_w_params(w, &d->sp);
	kvp_w_u8(w, d->logprobs);
	w_toks(w, d->toks, d->n);
	kvp_w_u32(w, (uint32_t)d->first);
	kvp_w_u32(w, d->blen);
	kvp_w_bytes(w, d->blk, d->blen);
	kvp_w_u64(w, d->ticket);
	kvp_w_u32(w, d->nx);
	for (uint32_t i = 0; i < d->nx && i < KVW_MAX_CHOICES - 1; i++) {
		kvp_w_u64(w, d->xseeds[i]);
		kvp_w_u32(w, (uint32_t)d->xfirst[i]);
	}
	w_images(w, d->images, d->nimg, 0);
	return w->err;
}

int kvw_decode_dec(const uint8_t *body, size_t len, struct kvw_decode *d)
{
	memset(d, 0, sizeof(*d));
	struct kvp_rbuf rb;
	kvp_r_init(&rb, body, len);
	d->salt = r_salt(&rb, d->salt_buf, sizeof(d->salt_buf));
	kvw_r_params(&rb, &d->sp);
	d->logprobs = kvp_r_u8(&rb);
	int rc = r_toks(&rb, &d->n, &d->toks_buf);
	if (rc)
		return rb.err ? rb.err : rc;
	d->toks = d->toks_buf;
	d->first = (int32_t)kvp_r_u32(&rb);
	d->blen = kvp_r_u32(&rb);
	d->blk = kvp_r_bytes(&rb, d->blen);
	d->ticket = kvp_r_u64(&rb);
	d->nx = kvp_r_u32(&rb);
	if (d->nx >= KVW_MAX_CHOICES)
		return -EBADMSG;
	for (uint32_t i = 0; i < d->nx; i++) {
		d->xseeds[i] = kvp_r_u64(&rb);
		d->xfirst[i] = (int32_t)kvp_r_u32(&rb);
	}
	int bad = 0;
	if ((rc = r_images(&rb, d->images, &d->nimg, 0, &bad)))
		return rc;
	rc = kvp_r_end(&rb);
	if (!rc && d->logprobs > 1 + KVW_MAX_TOP)
		rc = -EINVAL;
	/* the spans inside the prompt, in order, apart */
	for (uint32_t i = 0; !rc && i < d->nimg; i++)
		if (bad || (uint64_t)d->images[i].off + d->images[i].n_tokens > d->n ||
		    (i && d->images[i].off < d->images[i - 1].off + d->images[i - 1].n_tokens))
			rc = -EINVAL;
	return rc;
}

void kvw_decode_free(struct kvw_decode *d)
{
	free(d->toks_buf);
	d->toks_buf = NULL;
	d->toks = NULL;
}

/* ---- reply stream events ---- */

int kvw_cancel_enc(struct kvp_wbuf *w, uint8_t choice)
{
	kvp_w_u8(w, choice);
	return w->err;
}

int kvw_cancel_dec(const uint8_t *body, size_t len, uint8_t *choice)
{
	struct kvp_rbuf r;
	kvp_r_init(&r, body, len);
	*choice = kvp_r_u8(&r);
	return kvp_r_end(&r);
}

int kvw_ev_prompt_enc(struct kvp_wbuf *w, uint32_t prompt_tokens, uint32_t cached)
{
	kvp_w_u8(w, KVW_EV_PROMPT);
	kvp_w_u32(w, prompt_tokens);
	kvp_w_u32(w, cached);
	return w->err;
}

int kvw_ev_token_enc(struct kvp_wbuf *w, uint8_t choice, int32_t id, const struct kvw_lp *lp,
		     uint32_t len)
{
	kvp_w_u8(w, KVW_EV_TOKEN);
	kvp_w_u8(w, choice);
	kvp_w_u32(w, (uint32_t)id);
	w_lp(w, lp);
	kvp_w_u32(w, len);
	return w->err;
}

int kvw_ev_finish_enc(struct kvp_wbuf *w, uint8_t choice, int32_t err, const char *reason,
		      const char *msg)
{
	kvp_w_u8(w, KVW_EV_FINISH);
	kvp_w_u8(w, choice);
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
		e->choice = kvp_r_u8(&rb);
		e->id = (int32_t)kvp_r_u32(&rb);
		r_lp(&rb, &e->lp);
		e->len = kvp_r_u32(&rb);
		e->text = kvp_r_bytes(&rb, e->len);
		break;
	case KVW_EV_FINISH:
		e->choice = kvp_r_u8(&rb);
		e->err = (int32_t)kvp_r_u32(&rb);
		kvp_r_str(&rb, e->reason, sizeof(e->reason));
		kvp_r_str(&rb, e->msg, sizeof(e->msg));
		break;
	default:
		return -EBADMSG;
	}
	int rc = kvp_r_end(&rb);
	if (!rc && e->choice >= KVW_MAX_CHOICES)
		rc = -EBADMSG;
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

/* ---- ENCODE ---- */

int kvw_encode_enc(struct kvp_wbuf *w, const struct kvw_encode *e)
{
	w_salt(w, e->salt);
	kvp_w_bytes(w, e->hash, KVW_IMG_HASH);
	kvp_w_u32(w, e->w);
	kvp_w_u32(w, e->h);
	kvp_w_u32(w, (uint32_t)((uint64_t)e->w * e->h * 3));
	return w->err;
}

int kvw_encode_dec(const uint8_t *body, size_t len, struct kvw_encode *e)
{
	memset(e, 0, sizeof(*e));
	struct kvp_rbuf rb;
	kvp_r_init(&rb, body, len);
	e->salt = r_salt(&rb, e->salt_buf, sizeof(e->salt_buf));
	const uint8_t *hash = kvp_r_bytes(&rb, KVW_IMG_HASH);
	e->w = kvp_r_u32(&rb);
	e->h = kvp_r_u32(&rb);
	uint32_t n = kvp_r_u32(&rb);
	if (rb.err)
		return rb.err;
	memcpy(e->hash, hash, KVW_IMG_HASH);
	/* the sizes before the pixels: w x h x 3 is computed in 64 bits from values <= 2^32 */
	if ((uint64_t)e->w * e->h * 3 != n)
		return -EBADMSG;
	e->pix = kvp_r_bytes(&rb, n);
	int rc = kvp_r_end(&rb);
	if (rc)
		return rc;
	if (!e->w || !e->h)
		return -EINVAL;
	if (e->w > KVW_ENC_MAX_SIDE || e->h > KVW_ENC_MAX_SIDE ||
	    (uint64_t)e->w * e->h > KVW_ENC_MAX_PIXELS)
		return -E2BIG;
	return 0;
}

int kvw_encoded_enc(struct kvp_wbuf *w, const struct kvw_encoded *e)
{
	kvp_w_u32(w, e->n_tokens);
	kvp_w_u32(w, e->dim);
	kvp_w_bytes(w, e->tower_fp, KVW_IMG_HASH);
	kvp_w_u8(w, e->cached);
	return w->err;
}

int kvw_encoded_dec(const uint8_t *body, size_t len, struct kvw_encoded *e)
{
	memset(e, 0, sizeof(*e));
	struct kvp_rbuf rb;
	kvp_r_init(&rb, body, len);
	e->n_tokens = kvp_r_u32(&rb);
	e->dim = kvp_r_u32(&rb);
	const uint8_t *fp = kvp_r_bytes(&rb, KVW_IMG_HASH);
	e->cached = kvp_r_u8(&rb);
	int rc = kvp_r_end(&rb);
	if (rc)
		return rc;
	memcpy(e->tower_fp, fp, KVW_IMG_HASH);
	if (!e->n_tokens || e->n_tokens > KVE_MAX_TOKENS || !e->dim || e->dim > KVE_MAX_DIM ||
	    e->cached > 1)
		return -EBADMSG;
	return 0;
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
