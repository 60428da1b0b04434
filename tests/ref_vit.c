/* ref_vit — scalar reference of the vision tower (see ref_vit.h). */
#include "ref_vit.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double half_d(uint16_t h)
{
	int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
	double v = e == 0    ? ldexp(m, -24)
		   : e == 31 ? (m ? NAN : INFINITY)
			     : ldexp(1024 + m, e - 25);
	return sign ? -v : v;
}

/* Element i (flat) of a float tensor, or 0 for an absent one. */
static double el(const struct kvi_gguf_tensor *t, size_t i)
{
	if (!t)
		return 0;
	const uint8_t *p = t->data;
	if (t->type == 8) { /* Q8_0: blocks of 32 = f16 scale + 32 int8; rows are whole blocks */
		const uint8_t *blk = p + (i / 32) * 34;
		uint16_t d;
		memcpy(&d, blk, 2);
		return half_d(d) * (double)(int8_t)blk[2 + i % 32];
	}
	if (t->type == 0) {
		float f;
		memcpy(&f, p + 4 * i, 4);
		return f;
	}
	uint16_t h;
	memcpy(&h, p + 2 * i, 2);
	if (t->type == 1)
		return half_d(h);
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static const struct kvi_gguf_tensor *T(const struct kvi_gguf *g, const char *fmt, int l,
				       const char *s)
{
	char n[96];
	snprintf(n, sizeof(n), fmt, l, s);
	return kvi_gguf_find_tensor(g, n);
}

/* y[r] = sum_k W[r][k] x[k] + b[r] for W with rows of n */
static void lin(const struct kvi_gguf_tensor *w, const struct kvi_gguf_tensor *b, const double *x,
		int n, int rows, double *y)
{
	for (int r = 0; r < rows; r++) {
		double s = el(b, (size_t)r);
		for (int k = 0; k < n; k++)
			s += el(w, (size_t)r * (size_t)n + (size_t)k) * x[k];
		y[r] = s;
	}
}

static void lnorm(const struct kvi_gguf_tensor *w, const struct kvi_gguf_tensor *b, double *x,
		  int n, double eps)
{
	double m = 0, var = 0;
	for (int i = 0; i < n; i++)
		m += x[i];
	m /= n;
	for (int i = 0; i < n; i++)
		var += (x[i] - m) * (x[i] - m);
	var /= n;
	for (int i = 0; i < n; i++)
		x[i] = (x[i] - m) / sqrt(var + eps) * el(w, (size_t)i) + el(b, (size_t)i);
}

static double gelu_d(double x, int quick)
{
	if (quick)
		return x / (1 + exp(-1.702 * x));
	return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

int ref_vit_encode(const struct kvi_gguf *g, const float *pix, float *out)
{
	uint32_t S, P, E, F, L, H;
	float eps;
	int use_gelu = 0;
	if (kvi_gguf_get_u32(g, "clip.vision.image_size", &S) ||
	    kvi_gguf_get_u32(g, "clip.vision.patch_size", &P) ||
	    kvi_gguf_get_u32(g, "clip.vision.embedding_length", &E) ||
	    kvi_gguf_get_u32(g, "clip.vision.feed_forward_length", &F) ||
	    kvi_gguf_get_u32(g, "clip.vision.block_count", &L) ||
	    kvi_gguf_get_u32(g, "clip.vision.attention.head_count", &H) ||
	    kvi_gguf_get_f32(g, "clip.vision.attention.layer_norm_epsilon", &eps))
		return -EINVAL;
	kvi_gguf_get_bool(g, "clip.use_gelu", &use_gelu);
	const struct kvi_gguf_tensor *pw = kvi_gguf_find_tensor(g, "v.patch_embd.weight"),
				     *pb = kvi_gguf_find_tensor(g, "v.patch_embd.bias"),
				     *cls = kvi_gguf_find_tensor(g, "v.class_embd"),
				     *pos = kvi_gguf_find_tensor(g, "v.position_embd.weight"),
				     *m0 = kvi_gguf_find_tensor(g, "mm.0.weight"),
				     *m2 = kvi_gguf_find_tensor(g, "mm.2.weight");
	if (!pw || !pos || !m0 || !m2)
		return -EINVAL;
	int side = (int)(S / P), NP = side * side, C = cls != NULL, NT = NP + C, D = (int)(E / H);
	int MH = (int)m0->ne[1], O = (int)m2->ne[1];
	double *h = calloc((size_t)(unsigned)NT * E, sizeof(double)),
	       *x = calloc(E, sizeof(double));
	double *q = calloc((size_t)(unsigned)NT * E, sizeof(double)),
	       *k = calloc((size_t)(unsigned)NT * E, 8);
	double *v = calloc((size_t)(unsigned)NT * E, 8),
	       *u = calloc(F > (uint32_t)MH ? F : (size_t)MH, 8);
	double *a = calloc(E, 8), *sc = calloc((size_t)(unsigned)NT, 8),
	       *y = calloc(E > (uint32_t)O ? E : (size_t)O, 8);
	if (!h || !x || !q || !k || !v || !u || !a || !sc || !y)
		abort();
	/* embeddings: direct convolution, stride = kernel = P */
	for (int t = 0; t < NT; t++)
		for (int e = 0; e < (int)E; e++) {
			double s;
			if (C && t == 0) {
				s = el(cls, (size_t)e);
			} else {
				int pi = t - C, py = pi / side, px = pi % side;
				s = el(pb, (size_t)e);
				for (uint32_t c = 0; c < 3; c++)
					for (uint32_t ky = 0; ky < P; ky++)
						for (uint32_t kx = 0; kx < P; kx++)
							s += el(pw,
								(((size_t)e * 3 + c) * P + ky) * P +
								    kx) *
							     pix[(size_t)c * S * S +
								 ((size_t)py * P + ky) * S +
								 (size_t)px * P + kx];
			}
			h[(size_t)t * E + e] = s + el(pos, (size_t)t * E + (size_t)e);
		}
	const struct kvi_gguf_tensor *prew = kvi_gguf_find_tensor(g, "v.pre_ln.weight");
	for (int t = 0; t < NT && prew; t++)
		lnorm(prew, kvi_gguf_find_tensor(g, "v.pre_ln.bias"), h + (size_t)t * E, (int)E,
		      eps);
	const char *B = "v.blk.%d.%s";
	for (int l = 0; l + 1 < (int)L; l++) {
		for (int t = 0; t < NT; t++) {
			memcpy(x, h + (size_t)t * E, E * sizeof(double));
			lnorm(T(g, B, l, "ln1.weight"), T(g, B, l, "ln1.bias"), x, (int)E, eps);
			lin(T(g, B, l, "attn_q.weight"), T(g, B, l, "attn_q.bias"), x, (int)E,
			    (int)E, q + (size_t)t * E);
			lin(T(g, B, l, "attn_k.weight"), T(g, B, l, "attn_k.bias"), x, (int)E,
			    (int)E, k + (size_t)t * E);
			lin(T(g, B, l, "attn_v.weight"), T(g, B, l, "attn_v.bias"), x, (int)E,
			    (int)E, v + (size_t)t * E);
		}
		double *hn = calloc((size_t)(unsigned)NT * E, 8);
		if (!hn)
			abort();
		for (int t = 0; t < NT; t++) {
			for (uint32_t hh = 0; hh < H; hh++) {
				double mx = -INFINITY, sum = 0;
				for (int j = 0; j < NT; j++) {
					double d = 0;
					for (int c = 0; c < D; c++)
						d += q[(size_t)t * E + hh * D + c] *
						     k[(size_t)j * E + hh * D + c];
					sc[j] = d / sqrt(D);
					mx = fmax(mx, sc[j]);
				}
				for (int j = 0; j < NT; j++)
					sum += sc[j] = exp(sc[j] - mx);
				for (int c = 0; c < D; c++) {
					double o = 0;
					for (int j = 0; j < NT; j++)
						o += sc[j] / sum * v[(size_t)j * E + hh * D + c];
					a[hh * D + c] = o;
				}
			}
			lin(T(g, B, l, "attn_out.weight"), T(g, B, l, "attn_out.bias"), a, (int)E,
			    (int)E, y);
			for (uint32_t i = 0; i < E; i++)
				hn[(size_t)t * E + i] = h[(size_t)t * E + i] + y[i];
		}
		for (int t = 0; t < NT; t++) {
			double *r = hn + (size_t)t * E;
			memcpy(x, r, E * sizeof(double));
			lnorm(T(g, B, l, "ln2.weight"), T(g, B, l, "ln2.bias"), x, (int)E, eps);
			/* legacy LLaVA files name fc1 ffn_down: told apart by its row length */
			int sw = T(g, B, l, "ffn_down.weight")->ne[0] == (int64_t)E;
			const char *up = sw ? "ffn_down.weight" : "ffn_up.weight",
				   *upb = sw ? "ffn_down.bias" : "ffn_up.bias",
				   *dn = sw ? "ffn_up.weight" : "ffn_down.weight",
				   *dnb = sw ? "ffn_up.bias" : "ffn_down.bias";
			lin(T(g, B, l, up), T(g, B, l, upb), x, (int)E, (int)F, u);
			for (uint32_t i = 0; i < F; i++)
				u[i] = gelu_d(u[i], !use_gelu);
			lin(T(g, B, l, dn), T(g, B, l, dnb), u, (int)F, (int)E, y);
			for (uint32_t i = 0; i < E; i++)
				h[(size_t)t * E + i] = r[i] + y[i];
		}
		free(hn);
	}
	const struct kvi_gguf_tensor *postw = kvi_gguf_find_tensor(g, "v.post_ln.weight");
	for (int pi = 0; pi < NP; pi++) {
		double *r = h + (size_t)(pi + C) * E;
		if (postw)
			lnorm(postw, kvi_gguf_find_tensor(g, "v.post_ln.bias"), r, (int)E, eps);
		lin(m0, kvi_gguf_find_tensor(g, "mm.0.bias"), r, (int)E, MH, u);
		for (int i = 0; i < MH; i++)
			u[i] = gelu_d(u[i], 0);
		double *yo = calloc((size_t)(unsigned)O, 8);
		if (!yo)
			abort();
		lin(m2, kvi_gguf_find_tensor(g, "mm.2.bias"), u, MH, O, yo);
		for (int i = 0; i < O; i++)
			out[(size_t)pi * O + i] = (float)yo[i];
		free(yo);
	}
	free(h), free(x), free(q), free(k), free(v), free(u), free(a), free(sc), free(y);
	return 0;
}
