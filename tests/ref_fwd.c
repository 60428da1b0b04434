/* Reference forward pass (see ref_fwd.h). Speed is irrelevant here; clarity is the point. */
#include "ref_fwd.h"

#include "kvk.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct ref_fwd {
	const struct kvi_model *m;
	int max_ctx, n;
	float *kc, *vc; /* (layer, pos, n_head_kv * head_dim) */
};

/* ---- number decoding, independent of kernels/ -------------------------------------------- */

static double half_to_double(uint16_t h)
{
	int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
	double v;
	if (e == 0)
		v = ldexp(m, -24);
	else if (e == 31)
		v = m ? NAN : INFINITY;
	else
		v = ldexp(1024 + m, e - 25);
	return sign ? -v : v;
}

static double bf16_to_double(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* Element (row r, column k) of a 2-D tensor. */
static double elem(const struct kvi_tensor *t, int64_t r, int64_t k)
{
	const uint8_t *b = t->data;
	int64_t n = t->ne[0];
	uint16_t h;
	switch (t->type) {
	case KVI_F32: {
		float f;
		memcpy(&f, b + 4 * (r * n + k), 4);
		return f;
	}
	case KVI_F16:
		memcpy(&h, b + 2 * (r * n + k), 2);
		return half_to_double(h);
	case KVI_BF16:
		memcpy(&h, b + 2 * (r * n + k), 2);
		return bf16_to_double(h);
	case KVI_Q8_0: {
		const uint8_t *blk = b + (r * (n / 32) + k / 32) * 34;
		memcpy(&h, blk, 2);
		return half_to_double(h) * (int8_t)blk[2 + k % 32];
	}
	default: /* block types: whole rows only (row_at) */
		return NAN;
	}
}

/* Row r of t as floats; the block types (Q4_0, K-quants) through the kernels' dequantization,
 * which tests/test_kernels_kq.c checks on hand-built blocks. */
static void row_at(const struct kvi_tensor *t, int64_t r, float *out)
{
	int bt = t->type == KVI_Q4_0 || t->type == KVI_Q5_0 || t->type == KVI_Q5_1 ||
		 t->type == KVI_Q4_K || t->type == KVI_Q5_K || t->type == KVI_Q6_K;
	if (bt) {
		kvk_row_to_f32((enum kvk_wtype)t->type, t->data, (size_t)t->ne[0], (size_t)r, out);
		return;
	}
	for (int64_t k = 0; k < t->ne[0]; k++)
		out[k] = (float)elem(t, r, k);
}

/* y = W x, W (in, out) */
static void matvec(const struct kvi_tensor *w, const float *x, float *y)
{
	float *row = malloc((size_t)w->ne[0] * sizeof(float));
	for (int64_t r = 0; r < w->ne[1]; r++) {
		double s = 0;
		row_at(w, r, row);
		for (int64_t k = 0; k < w->ne[0]; k++)
			s += (double)row[k] * x[k];
		y[r] = (float)s;
	}
	free(row);
}

static void rmsnorm(const struct kvi_tensor *w, const float *x, float *y, int n, float eps)
{
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	double sc = 1.0 / sqrt(ss / n + eps);
	for (int i = 0; i < n; i++)
		y[i] = (float)(x[i] * sc * elem(w, 0, i));
}

static void rope(const struct kvi_config *c, float *v, int pos)
{
	int half = c->rope_dim / 2;
	for (int i = 0; i < half; i++) {
		double th = pos * pow(c->rope_base, -2.0 * i / c->rope_dim);
		int a = c->rope_style == KVI_ROPE_ADJACENT ? 2 * i : i;
		int b = c->rope_style == KVI_ROPE_ADJACENT ? 2 * i + 1 : i + half;
		double x0 = v[a], x1 = v[b];
		v[a] = (float)(x0 * cos(th) - x1 * sin(th));
		v[b] = (float)(x0 * sin(th) + x1 * cos(th));
	}
}

int ref_fwd_create(const struct kvi_model *m, int max_ctx, struct ref_fwd **out)
{
	struct ref_fwd *r = calloc(1, sizeof(*r));
	const struct kvi_config *c = &m->cfg;
	size_t kvd = (size_t)c->n_head_kv * c->head_dim;
	r->m = m;
	r->max_ctx = max_ctx;
	r->kc = calloc((size_t)c->n_layer * max_ctx * kvd, sizeof(float));
	r->vc = calloc((size_t)c->n_layer * max_ctx * kvd, sizeof(float));
	*out = r;
	return 0;
}

void ref_fwd_destroy(struct ref_fwd *r)
{
	if (!r)
		return;
	free(r->kc);
	free(r->vc);
	free(r);
}

void ref_fwd_step(struct ref_fwd *r, int32_t tok, float *logits)
{
	const struct kvi_model *m = r->m;
	const struct kvi_config *c = &m->cfg;
	int E = c->n_embd, hd = c->head_dim, H = c->n_head, HK = c->n_head_kv, F = c->n_ff;
	int QD = H * hd, KD = HK * hd, pos = r->n++;
	float *x = calloc(E, 4), *xn = calloc(E > QD ? E : QD, 4), *q = calloc(QD, 4);
	float *k = calloc(KD, 4), *v = calloc(KD, 4), *att = calloc(QD, 4);
	float *g = calloc(F, 4), *u = calloc(F, 4), *o = calloc(E, 4);
	double *sc = calloc(pos + 1, sizeof(double));
	row_at(&m->tok_embd, tok, x);
	for (int l = 0; l < c->n_layer; l++) {
		const struct kvi_layer *L = &m->layers[l];
		rmsnorm(&L->attn_norm, x, xn, E, c->rms_eps);
		matvec(&L->wq, xn, q);
		matvec(&L->wk, xn, k);
		matvec(&L->wv, xn, v);
		if (L->bq.data)
			for (int i = 0; i < QD; i++)
				q[i] += (float)elem(&L->bq, 0, i);
		if (L->bk.data)
			for (int i = 0; i < KD; i++)
				k[i] += (float)elem(&L->bk, 0, i);
		if (L->bv.data)
			for (int i = 0; i < KD; i++)
				v[i] += (float)elem(&L->bv, 0, i);
		for (int h = 0; h < H; h++)
			rope(c, q + h * hd, pos);
		for (int h = 0; h < HK; h++)
			rope(c, k + h * hd, pos);
		float *kl = r->kc + ((size_t)l * r->max_ctx) * KD;
		float *vl = r->vc + ((size_t)l * r->max_ctx) * KD;
		memcpy(kl + (size_t)pos * KD, k, KD * 4);
		memcpy(vl + (size_t)pos * KD, v, KD * 4);
		for (int h = 0; h < H; h++) {
			int kh = h / (H / HK);
			double mx = -INFINITY, sum = 0;
			for (int p = 0; p <= pos; p++) {
				double s = 0;
				for (int i = 0; i < hd; i++)
					s += (double)q[h * hd + i] *
					     kl[(size_t)p * KD + kh * hd + i];
				sc[p] = s / sqrt(hd);
				if (sc[p] > mx)
					mx = sc[p];
			}
			for (int p = 0; p <= pos; p++)
				sum += sc[p] = exp(sc[p] - mx);
			for (int i = 0; i < hd; i++) {
				double a = 0;
				for (int p = 0; p <= pos; p++)
					a += sc[p] * vl[(size_t)p * KD + kh * hd + i];
				att[h * hd + i] = (float)(a / sum);
			}
		}
		matvec(&L->wo, att, o);
		for (int i = 0; i < E; i++)
			x[i] += o[i];
		rmsnorm(&L->ffn_norm, x, xn, E, c->rms_eps);
		matvec(&L->w_gate, xn, g);
		matvec(&L->w_up, xn, u);
		for (int i = 0; i < F; i++)
			g[i] = (float)(g[i] / (1.0 + exp(-(double)g[i])) * u[i]);
		matvec(&L->w_down, g, o);
		for (int i = 0; i < E; i++)
			x[i] += o[i];
	}
	if (logits) {
		rmsnorm(&m->out_norm, x, xn, E, c->rms_eps);
		matvec(&m->output, xn, logits);
	}
	free(x), free(xn), free(q), free(k), free(v), free(att), free(g), free(u), free(o);
	free(sc);
}

/* ---- random models -------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* uniform in [-a, a] */
static float urand(uint64_t *s, float a)
{
	return (float)((double)(rng_next(s) >> 11) / 9007199254740992.0 * 2 - 1) * a;
}

static uint16_t to_half(float f)
{
	/* exact for the values we produce: round to nearest via the double path */
	if (f == 0)
		return 0;
	int sign = f < 0;
	double a = fabs(f);
	int e;
	frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
	int he = e - 1 + 15;
	uint16_t h;
	if (he <= 0) {
		h = (uint16_t)nearbyint(a / ldexp(1, -24));
	} else {
		double mant = a / ldexp(1, e - 1) - 1; /* [0, 1) */
		long mm = lrint(mant * 1024);
		if (mm == 1024) {
			mm = 0;
			he++;
		}
		h = (uint16_t)((he << 10) | mm);
	}
	return (uint16_t)(h | (sign << 15));
}

static void fill(struct kvi_tensor *t, enum kvi_dtype wt, int64_t ne0, int64_t ne1, float amp,
		 uint64_t *s)
{
	t->type = wt;
	t->ne[0] = ne0;
	t->ne[1] = ne1;
	size_t n = (size_t)(ne0 * ne1);
	if (wt == KVI_F32) {
		float *d = malloc(n * 4);
		for (size_t i = 0; i < n; i++)
			d[i] = urand(s, amp);
		t->data = d;
		t->nbytes = n * 4;
	} else if (wt == KVI_F16 || wt == KVI_BF16) {
		uint16_t *d = malloc(n * 2);
		for (size_t i = 0; i < n; i++) {
			float f = urand(s, amp);
			if (wt == KVI_F16) {
				d[i] = to_half(f);
			} else {
				uint32_t u;
				memcpy(&u, &f, 4);
				d[i] = (uint16_t)(u >> 16); /* truncation: any bf16 is fine */
			}
		}
		t->data = d;
		t->nbytes = n * 2;
	} else if (wt != KVI_Q8_0) { /* Q4_0, K-quants: the kernels' quantizer */
		size_t rb = kvi_dtype_row_bytes(wt, ne0);
		uint8_t *d = malloc(rb * (size_t)ne1);
		float *row = malloc((size_t)ne0 * 4);
		for (int64_t r = 0; r < ne1; r++) {
			for (int64_t i = 0; i < ne0; i++)
				row[i] = urand(s, amp);
			kvk_quantize_row((enum kvk_wtype)wt, d + (size_t)r * rb, row, (size_t)ne0);
		}
		free(row);
		t->data = d;
		t->nbytes = rb * (size_t)ne1;
	} else {
		size_t nb = n / 32;
		uint8_t *d = malloc(nb * 34);
		for (size_t b = 0; b < nb; b++) {
			uint16_t h = to_half(amp / 127.0f * (0.5f + urand(s, 0.5f) + 0.5f));
			memcpy(d + b * 34, &h, 2);
			for (int i = 0; i < 32; i++)
				d[b * 34 + 2 + i] =
				    (uint8_t)(int8_t)((int)(rng_next(s) % 255) - 127);
		}
		t->data = d;
		t->nbytes = nb * 34;
	}
}

struct kvi_model *ref_model_random(const struct kvi_config *cfg, enum kvi_dtype wt, uint64_t seed)
{
	struct kvi_model *m;
	if (kvi_model_init_empty(cfg, &m))
		return NULL;
	const struct kvi_config *c = &m->cfg;
	uint64_t s = seed * 2654435761u + 1;
	int64_t E = c->n_embd, Q = (int64_t)c->n_head * c->head_dim;
	int64_t K = (int64_t)c->n_head_kv * c->head_dim, F = c->n_ff;
	float ae = 1.0f / sqrtf((float)E), aq = 1.0f / sqrtf((float)Q), af = 1.0f / sqrtf((float)F);
	fill(&m->tok_embd, wt, E, c->n_vocab, 1.0f, &s);
	for (int l = 0; l < c->n_layer; l++) {
		struct kvi_layer *L = &m->layers[l];
		fill(&L->attn_norm, KVI_F32, E, 1, 1.0f, &s);
		fill(&L->ffn_norm, KVI_F32, E, 1, 1.0f, &s);
		float *an = (float *)L->attn_norm.data, *fn = (float *)L->ffn_norm.data;
		for (int64_t i = 0; i < E; i++) {
			an[i] = 1.0f + 0.5f * an[i];
			fn[i] = 1.0f + 0.5f * fn[i];
		}
		/* q/k larger than 1/sqrt(n) so attention is not uniform */
		fill(&L->wq, wt, E, Q, 3 * ae, &s);
		fill(&L->wk, wt, E, K, 3 * ae, &s);
		fill(&L->wv, wt, E, K, 1.7f * ae, &s);
		fill(&L->wo, wt, Q, E, 1.7f * aq, &s);
		if (c->has_qkv_bias) {
			fill(&L->bq, KVI_F32, Q, 1, 0.5f, &s);
			fill(&L->bk, KVI_F32, K, 1, 0.5f, &s);
			fill(&L->bv, KVI_F32, K, 1, 0.5f, &s);
		}
		fill(&L->w_gate, wt, E, F, 1.7f * ae, &s);
		fill(&L->w_up, wt, E, F, 1.7f * ae, &s);
		fill(&L->w_down, wt, F, E, 1.7f * af, &s);
	}
	fill(&m->out_norm, KVI_F32, E, 1, 1.0f, &s);
	float *on = (float *)m->out_norm.data;
	for (int64_t i = 0; i < E; i++)
		on[i] = 1.0f + 0.5f * on[i];
	if (c->tied_output)
		m->output = m->tok_embd;
	else
		fill(&m->output, wt, E, c->n_vocab, 3 * ae, &s);
	return m;
}

void ref_model_free(struct kvi_model *m)
{
	if (!m)
		return;
	for (int l = 0; l < m->cfg.n_layer; l++) {
		struct kvi_layer *L = &m->layers[l];
		const struct kvi_tensor *ts[] = {&L->attn_norm, &L->wq,	    &L->wk,   &L->wv,
						 &L->wo,	&L->bq,	    &L->bk,   &L->bv,
						 &L->ffn_norm,	&L->w_gate, &L->w_up, &L->w_down};
		for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
			free((void *)ts[i]->data);
	}
	free((void *)m->tok_embd.data);
	free((void *)m->out_norm.data);
	if (!m->cfg.tied_output)
		free((void *)m->output.data);
	kvi_model_free(m);
}

struct kvi_config ref_cfg_tiny_llama(int n_vocab)
{
	struct kvi_config c = {.arch = "llama",
			       .n_layer = 2,
			       .n_embd = 64,
			       .n_ff = 96,
			       .n_head = 4,
			       .n_head_kv = 2,
			       .head_dim = 16,
			       .rope_dim = 16,
			       .rope_base = 10000,
			       .rms_eps = 1e-5f,
			       .n_ctx_train = 512,
			       .n_vocab = n_vocab,
			       .rope_style = KVI_ROPE_ADJACENT};
	return c;
}

struct kvi_config ref_cfg_tiny_qwen(void)
{
	struct kvi_config c = ref_cfg_tiny_llama(203);
	strcpy(c.arch, "qwen2");
	c.n_head_kv = 1;
	c.rope_style = KVI_ROPE_HALVES;
	c.rope_base = 1000000;
	c.rms_eps = 1e-6f;
	c.has_qkv_bias = 1;
	c.tied_output = 1;
	return c;
}

struct kvi_config ref_cfg_odd(void)
{
	struct kvi_config c = ref_cfg_tiny_llama(37);
	c.n_embd = 60;
	c.head_dim = 15;
	c.rope_dim = 14;
	c.n_ff = 100;
	return c;
}

/* ---- helpers the engine tests share -------------------------------------------------------- */

void ref_tokens(int32_t *t, int n, int vocab, unsigned seed)
{
	for (int i = 0; i < n; i++) {
		seed = seed * 1103515245u + 12345u;
		t[i] = (int32_t)((seed >> 8) % (unsigned)vocab);
	}
}

int ref_argmax(const float *l, int n)
{
	int b = 0;
	for (int i = 1; i < n; i++)
		if (l[i] > l[b])
			b = i;
	return b;
}

double ref_rel_err(const float *a, const float *ref, int n)
{
	double mx = 1, d = 0;
	for (int i = 0; i < n; i++) {
		mx = fmax(mx, fabs(ref[i]));
		d = fmax(d, fabs((double)a[i] - ref[i]));
		if (isnan(a[i]))
			return INFINITY;
	}
	return d / mx;
}
