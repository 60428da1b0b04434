/* fwd_checks — checks of the engine contract (fwd.h) that the CPU engine (test_fwd) and the
 * device engine (test_fwd_dev) must both pass, run on either through one small handle. The
 * checks fail the running cmocka test; they take no ownership of the engine. */
#ifndef KVFS_TEST_FWD_CHECKS_H
#define KVFS_TEST_FWD_CHECKS_H

#include <stdint.h>

#include "fwd.h"
#include "fwd_dev.h"

/* An engine of either kind: exactly one of de, ce is set. */
struct fwdc_engine {
	struct kvi_dev_engine *de;
	struct kvi_engine *ce;
};

struct kvi_kv *fwdc_kv(struct fwdc_engine e);
/* kvi_dev_engine_prefill or kvi_engine_prefill, whichever e is. */
int fwdc_prefill(struct fwdc_engine e, struct kvi_seq *s, const int32_t *tok, int n, float *logits);
/* kvi_dev_engine_decode or kvi_engine_decode, whichever e is. */
int fwdc_decode(struct fwdc_engine e, struct kvi_seq *const *s, const int32_t *tok, int n,
		float *logits);
/* kvi_dev_engine_prefill_inject or kvi_engine_prefill_inject, whichever e is. */
int fwdc_prefill_inject(struct fwdc_engine e, struct kvi_seq *s, const int32_t *tok, int n,
			const struct kvi_inject *inj, int ninj, float *logits);
/* Destroys whichever engine e holds. */
void fwdc_destroy(struct fwdc_engine e);

/* A sequence forked after 20 tokens (block_tokens 16: the second block is shared, partly
 * filled) and its parent continue with 10 different tokens each: the partial block is copied
 * on write, the full one stays shared, and each one's logits match a cold run of its tokens:
 * bitwise when tol < 0, else ref_rel_err <= tol. e: block_tokens 16, max_ctx >= 30, 8 free
 * KV blocks; n_vocab: its model's. */
void fwdc_fork_cow(struct fwdc_engine e, int n_vocab, double tol);

/* Token ids out of range, n = 0, a prompt past max_ctx and a decode past it, and KV blocks
 * running out are refused with -EINVAL, -E2BIG and -ENOSPC (the refused sequence stays
 * empty). e: max_ctx 40, block_tokens 16, kv_blocks 3, nothing allocated yet. */
void fwdc_limits(struct fwdc_engine e, int n_vocab);

/* Injected input embeddings (an image's tower output at its placeholder tokens): the
 * embedding rows of other token ids, injected as one span and as two across prefill chunks,
 * give the logits of prefilling those ids (bitwise when tol < 0, else ref_rel_err <= tol),
 * and bad spans are refused before anything runs. m: e's model (F16 token embeddings), e:
 * prefill chunk 7, max_ctx >= 40, 6 free KV blocks of 16. */
void fwdc_inject(struct fwdc_engine e, const struct kvi_model *m, double tol);

#endif
