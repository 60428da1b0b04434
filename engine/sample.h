/* sample — choosing the next token from logits: greedy, temperature, top-k, top-p, a seeded
 * per-request RNG, stop tokens and a token budget.
 *
 * First the request's own adjustments of the logits, as OpenAI defines them: logit_bias[id]
 * is added, and each token already generated c times loses c * frequency_penalty +
 * (c > 0) * presence_penalty. Then the filters (as llama.cpp's default chain): top-k, then
 * softmax at temperature, then
 * top-p (the smallest set of most likely tokens whose probability reaches top_p), then a draw.
 * temp <= 0 means greedy: the highest logit, the lowest id on ties. The same seed and logits
 * always give the same tokens.
 *
 * Thread-safety: a sampler is one request's state; use it from one thread at a time.
 */
#ifndef KVFS_KVI_SAMPLE_H
#define KVFS_KVI_SAMPLE_H

#include <stdint.h>

#define KVI_SAMPLE_MAX_STOP 16
/* Most logit_bias entries a request may carry. */
#define KVI_SAMPLE_MAX_BIAS 64

struct kvi_logit_bias {
	int32_t id;
	float bias; /* added to the logit; -100..100 */
};

struct kvi_sample_params {
	float temp;	/* <= 0: greedy */
	int top_k;	/* <= 0: no limit */
	float top_p;	/* >= 1 (or <= 0): no limit */
	uint64_t seed;	/* RNG seed */
	int max_tokens; /* <= 0: no limit */
	int n_stop;	/* stop token ids in stop[0..n_stop) */
	int32_t stop[KVI_SAMPLE_MAX_STOP];
	float presence_penalty;	 /* -2..2; 0 = off */
	float frequency_penalty; /* -2..2; 0 = off */
	int n_bias;		 /* entries in bias[0..n_bias) */
	struct kvi_logit_bias bias[KVI_SAMPLE_MAX_BIAS];
};

/* temp 0 (greedy), top_k 40, top_p 0.95, seed 0, no max, no stop tokens. */
void kvi_sample_params_default(struct kvi_sample_params *p);

struct kvi_sampler;

/* n_vocab >= 1; n_stop <= KVI_SAMPLE_MAX_STOP; n_bias <= KVI_SAMPLE_MAX_BIAS, each id in
 * [0, n_vocab). Allocates its work buffers once. Returns 0, -EINVAL, -ENOMEM. */
int kvi_sampler_create(const struct kvi_sample_params *p, int n_vocab, struct kvi_sampler **out);
void kvi_sampler_destroy(struct kvi_sampler *s);

/* The next token id for logits[0..n_vocab) (not modified). */
int32_t kvi_sampler_sample(struct kvi_sampler *s, const float *logits);

/* log-probability of tok under the distribution the request samples from before temperature
 * and truncation: log_softmax of the adjusted logits (bias and penalties applied, as vLLM's
 * "processed" logprobs), for the same logits kvi_sampler_sample was just given; and the
 * n_top (<= 20) most likely tokens, most likely first, into top_id/top_lp. Returns tok's. */
float kvi_sampler_logprobs(struct kvi_sampler *s, const float *logits, int32_t tok, int n_top,
			   int32_t *top_id, float *top_lp);

/* Moves the random sequence past one draw, as kvi_sampler_sample at temp > 0 does: a sampler
 * continuing a sequence whose first token another sampler (same params and seed) drew stays
 * on that sampler's random sequence (the disaggregated decode worker after the prefill
 * worker's first token), so a seeded request samples the same tokens in both forms. */
void kvi_sampler_skip_draw(struct kvi_sampler *s);

/* Records that tok was emitted (it counts for the penalties from now on). Returns 1 when generation
 * must stop after it (tok is a stop token, or max_tokens have been emitted), else 0. */
int kvi_sampler_accept(struct kvi_sampler *s, int32_t tok);

/* 1 if tok is one of the stop tokens. */
int kvi_sampler_is_stop(const struct kvi_sampler *s, int32_t tok);

/* Tokens accepted so far. */
int kvi_sampler_count(const struct kvi_sampler *s);

#endif
