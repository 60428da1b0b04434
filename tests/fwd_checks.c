/* Engine contract checks for both engines (see fwd_checks.h). */
#include "fwd_checks.h"

#include "kvk.h"
#include "model.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ref_fwd.h"

struct kvi_kv *fwdc_kv(struct fwdc_engine e)
{
	return e.de ? kvi_dev_engine_kv(e.de) : kvi_engine_kv(e.ce);
}

int fwdc_prefill(struct fwdc_engine e, struct kvi_seq *s, const int32_t *tok, int n, float *logits)
{
	return e.de ? kvi_dev_engine_prefill(e.de, s, tok, n, logits)
		    : kvi_engine_prefill(e.ce, s, tok, n, logits);
}

int fwdc_decode(struct fwdc_engine e, struct kvi_seq *const *s, const int32_t *tok, int n,
		float *logits)
{
	return e.de ? kvi_dev_engine_decode(e.de, s, tok, n, logits)
		    : kvi_engine_decode(e.ce, s, tok, n, logits);
}

void fwdc_destroy(struct fwdc_engine e)
{
	kvi_dev_engine_destroy(e.de);
	kvi_engine_destroy(e.ce);
}

static void same_logits(const float *got, const float *want, int n, double tol)
{
	if (tol < 0)
		assert_memory_equal(got, want, (size_t)n * sizeof(float));
	else
		assert_true(ref_rel_err(got, want, n) <= tol);
}

void fwdc_fork_cow(struct fwdc_engine e, int n_vocab, double tol)
{
	int V = n_vocab;
	int32_t a[30], b[30];
	ref_tokens(a, 30, V, 1);
	memcpy(b, a, sizeof(a));
	for (int i = 20; i < 30; i++)
		b[i] = (a[i] + 1) % V;
	float *la = malloc(V * 4), *lb = malloc(V * 4), *ref = malloc(V * 4);
	assert_true(la && lb && ref);
	struct kvi_kv *kv = fwdc_kv(e);
	struct kvi_seq *s, *f, *cold;
	assert_int_equal(kvi_seq_create(kv, &s), 0);
	assert_int_equal(fwdc_prefill(e, s, a, 20, NULL), 0);
	assert_int_equal(kvi_seq_fork(s, &f), 0);
	assert_int_equal(kvi_kv_block_refcount(kv, kvi_seq_blocks(s)[1]), 2);
	assert_int_equal(fwdc_prefill(e, s, a + 20, 10, la), 0);
	assert_int_equal(fwdc_prefill(e, f, b + 20, 10, lb), 0);
	assert_int_not_equal(kvi_seq_blocks(s)[1], kvi_seq_blocks(f)[1]);
	assert_int_equal(kvi_seq_blocks(s)[0], kvi_seq_blocks(f)[0]);
	assert_int_equal(kvi_seq_create(kv, &cold), 0);
	assert_int_equal(fwdc_prefill(e, cold, b, 30, ref), 0);
	same_logits(lb, ref, V, tol);
	kvi_seq_destroy(cold);
	assert_int_equal(kvi_seq_create(kv, &cold), 0);
	assert_int_equal(fwdc_prefill(e, cold, a, 30, ref), 0);
	same_logits(la, ref, V, tol);
	kvi_seq_destroy(cold);
	kvi_seq_destroy(s);
	kvi_seq_destroy(f);
	free(la), free(lb), free(ref);
}

void fwdc_limits(struct fwdc_engine e, int n_vocab)
{
	struct kvi_seq *s, *s2;
	assert_int_equal(kvi_seq_create(fwdc_kv(e), &s), 0);
	int32_t t[50] = {0};
	t[3] = n_vocab; /* out of range */
	assert_int_equal(fwdc_prefill(e, s, t, 5, NULL), -EINVAL);
	t[3] = -1;
	assert_int_equal(fwdc_prefill(e, s, t, 5, NULL), -EINVAL);
	t[3] = 0;
	assert_int_equal(fwdc_prefill(e, s, t, 0, NULL), -EINVAL);
	assert_int_equal(fwdc_prefill(e, s, t, 41, NULL), -E2BIG);
	assert_int_equal(fwdc_prefill(e, s, t, 40, NULL), 0);
	assert_int_equal(fwdc_decode(e, &s, t, 1, NULL), -E2BIG);
	assert_int_equal(kvi_seq_create(fwdc_kv(e), &s2), 0);
	assert_int_equal(fwdc_prefill(e, s2, t, 20, NULL), -ENOSPC); /* 3 blocks in use */
	assert_int_equal(kvi_seq_len(s2), 0);
	kvi_seq_destroy(s2);
	kvi_seq_destroy(s);
}

int fwdc_prefill_inject(struct fwdc_engine e, struct kvi_seq *s, const int32_t *tok, int n,
			const struct kvi_inject *inj, int ninj, float *logits)
{
	return e.de ? kvi_dev_engine_prefill_inject(e.de, s, tok, n, inj, ninj, logits)
		    : kvi_engine_prefill_inject(e.ce, s, tok, n, inj, ninj, logits);
}

void fwdc_inject(struct fwdc_engine e, const struct kvi_model *m, double tol)
{
	enum { N = 40, A = 10, NA = 12 };
	int V = m->cfg.n_vocab;
	size_t E = (size_t)m->cfg.n_embd;
	int32_t tok[N], alt[N];
	ref_tokens(tok, N, V, 12);
	memcpy(alt, tok, sizeof(tok));
	for (int i = A; i < A + NA; i++)
		alt[i] = (tok[i] + 17 + i) % V;
	float *rows = malloc(sizeof(float) * E * NA);
	for (int i = 0; i < NA; i++)
		kvk_row_to_f32((enum kvk_wtype)m->tok_embd.type, m->tok_embd.data, E,
			       (size_t)alt[A + i], rows + (size_t)i * E);
	float *want = malloc((size_t)V * 4), *got = malloc((size_t)V * 4);
	struct kvi_kv *kv = fwdc_kv(e);
	struct kvi_seq *s;
	assert_int_equal(kvi_seq_create(kv, &s), 0);
	assert_int_equal(fwdc_prefill(e, s, alt, N, want), 0);
	kvi_seq_destroy(s);
	assert_int_equal(kvi_seq_create(kv, &s), 0);
	assert_int_equal(fwdc_prefill(e, s, tok, N, got), 0);
	assert_memory_not_equal(want, got, (size_t)V * 4); /* the rows matter */
	kvi_seq_destroy(s);
	const struct kvi_inject one[1] = {{A, NA, rows}};
	const struct kvi_inject two[2] = {{A, 5, rows}, {A + 5, NA - 5, rows + 5 * E}};
	const struct kvi_inject *sets[2] = {one, two};
	for (int k = 0; k < 2; k++) {
		assert_int_equal(kvi_seq_create(kv, &s), 0);
		assert_int_equal(fwdc_prefill_inject(e, s, tok, N, sets[k], k + 1, got), 0);
		same_logits(got, want, V, tol);
		kvi_seq_destroy(s);
	}
	/* bad spans: nothing runs */
	assert_int_equal(kvi_seq_create(kv, &s), 0);
	const struct kvi_inject bad[4] = {
	    {-1, 2, rows}, {0, 0, rows}, {N - 1, 2, rows}, {0, 1, NULL}};
	for (int i = 0; i < 4; i++)
		assert_int_equal(fwdc_prefill_inject(e, s, tok, N, &bad[i], 1, got), -EINVAL);
	assert_int_equal(fwdc_prefill_inject(e, s, tok, N, NULL, 1, got), -EINVAL);
	assert_int_equal(kvi_seq_len(s), 0);
	kvi_seq_destroy(s);
	free(rows), free(want), free(got);
}
