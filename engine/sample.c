/* Sampling: top-k by a bounded min-heap (O(V log k)), full sort only when top-k is off. */
#include "sample.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct cand {
	float logit;
	int32_t id;
};

struct kvi_sampler {
	struct kvi_sample_params p;
	int n_vocab;
	int count;
	uint64_t rng;
	struct cand *c; /* n_vocab */
	float *prob;	/* n_vocab */
	float *adj;	/* n_vocab: the adjusted logits, when the request adjusts them */
	int *counts;	/* n_vocab: times each token was generated, when penalties are on */
};

static int adjusts(const struct kvi_sample_params *p)
{
	return p->n_bias > 0 || p->presence_penalty != 0 || p->frequency_penalty != 0;
}

void kvi_sample_params_default(struct kvi_sample_params *p)
{
	*p = (struct kvi_sample_params){.temp = 0, .top_k = 40, .top_p = 0.95f};
}

int kvi_sampler_create(const struct kvi_sample_params *p, int n_vocab, struct kvi_sampler **out)
{
	if (!p || n_vocab < 1 || p->n_stop < 0 || p->n_stop > KVI_SAMPLE_MAX_STOP ||
	    p->n_bias < 0 || p->n_bias > KVI_SAMPLE_MAX_BIAS)
		return -EINVAL;
	for (int i = 0; i < p->n_bias; i++)
		if (p->bias[i].id < 0 || p->bias[i].id >= n_vocab || !isfinite(p->bias[i].bias))
			return -EINVAL;
	struct kvi_sampler *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->p = *p;
	s->n_vocab = n_vocab;
	s->rng = p->seed ^ 0x9e3779b97f4a7c15ull;
	s->c = malloc((size_t)n_vocab * sizeof(*s->c));
	s->prob = malloc((size_t)n_vocab * sizeof(float));
	s->adj = malloc((size_t)n_vocab * sizeof(float));
	if (p->presence_penalty != 0 || p->frequency_penalty != 0)
		s->counts = calloc((size_t)n_vocab, sizeof(int));
	if (!s->c || !s->prob || !s->adj ||
	    ((p->presence_penalty != 0 || p->frequency_penalty != 0) && !s->counts)) {
		kvi_sampler_destroy(s);
		return -ENOMEM;
	}
	*out = s;
	return 0;
}

void kvi_sampler_destroy(struct kvi_sampler *s)
{
	if (!s)
		return;
	free(s->c);
	free(s->prob);
	free(s->adj);
	free(s->counts);
	free(s);
}

/* splitmix64: tiny, well mixed, and the same sequence on every platform. */
static uint64_t next_u64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* "a ranks before b": higher logit first, lower id on ties (a total order). */
static int before(const struct cand *a, const struct cand *b)
{
	return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cmp_cand(const void *a, const void *b)
{
	return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

/* Min-heap on rank (root = the worst kept candidate). */
static void sift_down(struct cand *h, int n, int i)
{
	for (;;) {
		int l = 2 * i + 1, r = l + 1, w = i;
		if (l < n && before(&h[w], &h[l]))
			w = l;
		if (r < n && before(&h[w], &h[r]))
			w = r;
		if (w == i)
			return;
		struct cand t = h[i];
		h[i] = h[w];
		h[w] = t;
		i = w;
	}
}

static int32_t argmax(const float *l, int n)
{
	int32_t best = 0;
	for (int i = 1; i < n; i++)
		if (l[i] > l[best])
			best = i;
	return best;
}

/* logits with the request's bias and penalties applied (s->adj), or logits themselves. */
static const float *adjusted(struct kvi_sampler *s, const float *logits)
{
	if (!adjusts(&s->p))
		return logits;
	int V = s->n_vocab;
	memcpy(s->adj, logits, (size_t)V * sizeof(float));
	for (int i = 0; i < s->p.n_bias; i++)
		s->adj[s->p.bias[i].id] += s->p.bias[i].bias;
	if (s->counts)
		for (int i = 0; i < V; i++)
			if (s->counts[i])
				s->adj[i] -= (float)s->counts[i] * s->p.frequency_penalty +
					     s->p.presence_penalty;
	return s->adj;
}

float kvi_sampler_logprobs(struct kvi_sampler *s, const float *logits, int32_t tok, int n_top,
			   int32_t *top_id, float *top_lp)
{
	int V = s->n_vocab;
	const float *l = adjusted(s, logits);
	float mx = l[0];
	for (int i = 1; i < V; i++)
		mx = l[i] > mx ? l[i] : mx;
	double sum = 0;
	for (int i = 0; i < V; i++)
		sum += exp((double)l[i] - mx);
	float lse = mx + (float)log(sum);
	n_top = n_top < 0 ? 0 : n_top > 20 ? 20 : n_top > V ? V : n_top;
	/* the n_top best by insertion: n_top is small */
	for (int k = 0; k < n_top; k++)
		top_id[k] = -1;
	for (int i = 0; i < V; i++) {
		struct cand x = {l[i], i};
		int k = n_top;
		while (k > 0 && (top_id[k - 1] < 0 ||
				 before(&x, &(struct cand){l[top_id[k - 1]], top_id[k - 1]})))
			k--;
		if (k == n_top)
			continue;
		for (int m = n_top - 1; m > k; m--)
			top_id[m] = top_id[m - 1];
		top_id[k] = i;
	}
	for (int k = 0; k < n_top; k++)
		top_lp[k] = l[top_id[k]] - lse;
	return tok >= 0 && tok < V ? l[tok] - lse : -INFINITY;
}

int32_t kvi_sampler_sample(struct kvi_sampler *s, const float *logits)
{
	int V = s->n_vocab;
	logits = adjusted(s, logits);
	if (s->p.temp <= 0)
		return argmax(logits, V);
	int k = s->p.top_k > 0 && s->p.top_k < V ? s->p.top_k : V;
	struct cand *c = s->c;
	if (k < V) {
		for (int i = 0; i < k; i++)
			c[i] = (struct cand){logits[i], i};
		for (int i = k / 2 - 1; i >= 0; i--)
			sift_down(c, k, i);
		for (int i = k; i < V; i++) {
			struct cand x = {logits[i], i};
			if (before(&x, &c[0])) {
				c[0] = x;
				sift_down(c, k, 0);
			}
		}
	} else {
		for (int i = 0; i < V; i++)
			c[i] = (struct cand){logits[i], i};
	}
	qsort(c, (size_t)k, sizeof(*c), cmp_cand);
	/* softmax at temperature over the k kept, highest first */
	double sum = 0;
	for (int i = 0; i < k; i++) {
		s->prob[i] = expf((c[i].logit - c[0].logit) / s->p.temp);
		sum += s->prob[i];
	}
	int n = k;
	if (s->p.top_p > 0 && s->p.top_p < 1) {
		double cum = 0;
		for (int i = 0; i < k; i++) {
			cum += s->prob[i] / sum;
			if (cum >= s->p.top_p) {
				n = i + 1;
				break;
			}
		}
	}
	double total = 0;
	for (int i = 0; i < n; i++)
		total += s->prob[i];
	/* 53 random bits -> [0, total) */
	double r = (double)(next_u64(&s->rng) >> 11) * (1.0 / 9007199254740992.0) * total;
	double acc = 0;
	for (int i = 0; i < n; i++) {
		acc += s->prob[i];
		if (r < acc)
			return c[i].id;
	}
	return c[n - 1].id;
}

void kvi_sampler_skip_draw(struct kvi_sampler *s)
{
	if (s->p.temp > 0)
		(void)next_u64(&s->rng);
}

int kvi_sampler_is_stop(const struct kvi_sampler *s, int32_t tok)
{
	for (int i = 0; i < s->p.n_stop; i++)
		if (s->p.stop[i] == tok)
			return 1;
	return 0;
}

int kvi_sampler_accept(struct kvi_sampler *s, int32_t tok)
{
	s->count++;
	if (s->counts && tok >= 0 && tok < s->n_vocab)
		s->counts[tok]++;
	if (kvi_sampler_is_stop(s, tok))
		return 1;
	return s->p.max_tokens > 0 && s->count >= s->p.max_tokens;
}

int kvi_sampler_count(const struct kvi_sampler *s)
{
	return s->count;
}
