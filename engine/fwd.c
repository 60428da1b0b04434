/* The forward pass: one batch of tokens (a prefill chunk of one sequence, or one token of each
 * of several sequences) through every layer, with K/V written into paged blocks first and
 * attention reading every position (this batch's too) back from them, so a position's keys
 * are the same f16 values however the prompt was chunked. */
#define KVFS_LOG_TAG "fwd"
#include "fwd.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvk.h"
#include "kvk_ops.h"
#include "log.h"
#include "pool.h"

struct kvi_engine {
	const struct kvi_model *m;
	struct kvi_config c;
	struct kvi_engine_opts o;
	enum kvk_isa isa;
	size_t kv_block_stride; /* halves from a KV block to the next (same layer, K or V) */
	struct kvi_pool *pool;
	struct kvi_kv *kv;
	int q_dim, kv_dim;
	double *inv_freq; /* rope_dim / 2 */
	/* norm weights and biases converted to f32 once: per layer attn, ffn; then out */
	float *norm_attn, *norm_ffn, *norm_out;
	float *bq, *bk, *bv; /* per layer, or NULL */
	/* activations, T = max_batch_tokens rows each */
	float *x;	       /* (T, n_embd) residual stream */
	float *xn;	       /* (T, max(n_embd, q_dim)) normed input / matmul output */
	float *q;	       /* (T, q_dim) */
	float *k, *v;	       /* (T, kv_dim) */
	float *att;	       /* (T, q_dim) attention output */
	float *gate;	       /* (T, n_ff) */
	float *up;	       /* (T, n_ff) */
	void *actq;	       /* Q8_0 activations for the widest input */
	void *actk;	       /* Q4_0/K-quant activations (one format for the four types) */
	float *rope_cs;	       /* (T, rope_dim / 2, 2) cos, sin */
	int32_t *pos;	       /* (T) */
	int *rows;	       /* (T) 0, 1, 2, ...: "every batch row" for logits */
	struct kvi_seq **bseq; /* (T) */
	float **scratch;       /* per thread: matmul panel */
	float **scores;	       /* per thread: kvk_flash_scratch_floats(head_dim, group) */
	double *attn_cpu;      /* per thread: CPU seconds in attn_run (kvi_engine_attn_cpu_s) */
	int *qtile;	       /* (T + 1) first row of each attention query tile, then T */
	int nqtile;
	/* F16 matmul weights repacked for this ISA (kvk_f16_pack), owned here: PK_PER slots per
	 * layer then the output; .data NULL where the model's own tensor is used. NULL if none. */
	struct kvi_tensor *pk;
};

/* slots of e->pk per layer: wq wk wv wo gate up down */
enum { PK_PER = 7 };

struct pack_job {
	struct kvi_tensor *dst;
	const struct kvi_tensor *src;
};

static void pack_run(void *arg, int tid, int nth, int thread)
{
	(void)thread;
	struct pack_job *j = arg;
	long lo, hi;
	kvi_pool_split((long)j->src->ne[1], tid, nth, 16, &lo, &hi);
	kvk_f16_pack((uint16_t *)j->dst->data, j->src->data, (size_t)j->src->ne[1],
		     (size_t)j->src->ne[0], (size_t)lo, (size_t)hi);
}

/* the model tensor of slot s of e->pk */
static const struct kvi_tensor *pk_src(const struct kvi_model *m, size_t L, size_t s)
{
	if (s == L * PK_PER)
		return &m->output;
	const struct kvi_layer *ly = &m->layers[s / PK_PER];
	switch (s % PK_PER) {
	case 0:
		return &ly->wq;
	case 1:
		return &ly->wk;
	case 2:
		return &ly->wv;
	case 3:
		return &ly->wo;
	case 4:
		return &ly->w_gate;
	case 5:
		return &ly->w_up;
	default:
		return &ly->w_down;
	}
}

/* Repacks the F16 matmul weights when this ISA's kernels stream kvk_f16_pack's layout faster
 * (AVX-512: 32 contiguous bytes per load where the file's layout needs a 16-row gather; the
 * results are the same bits). Costs one copy of those weights in memory. */
static int pack_weights(struct kvi_engine *e)
{
	const struct kvi_model *m = e->m;
	size_t L = (size_t)e->c.n_layer, ns = L * PK_PER + 1;
	if (!kvk_f16_pack_wanted(e->isa))
		return 0;
	e->pk = calloc(ns, sizeof(*e->pk));
	if (!e->pk)
		return -ENOMEM;
	for (size_t s = 0; s < ns; s++) {
		const struct kvi_tensor *t = pk_src(m, L, s);
		if (t->type != KVI_F16 || t->ne[1] < 16) /* under one panel: nothing to gain */
			continue;
		size_t nb = kvk_f16_pack_bytes((size_t)t->ne[1], (size_t)t->ne[0]);
		void *d = aligned_alloc(64, (nb + 63) & ~(size_t)63);
		if (!d)
			return -ENOMEM;
		e->pk[s] = *t;
		e->pk[s].type = (enum kvi_dtype)KVK_W_F16_P16;
		e->pk[s].data = d;
		e->pk[s].nbytes = nb;
		struct pack_job j = {&e->pk[s], t};
		kvi_pool_run(e->pool, pack_run, &j);
	}
	return 0;
}

/* the engine's packed copy of a model tensor (slot s of e->pk), or the tensor itself */
static const struct kvi_tensor *wsel(const struct kvi_engine *e, const struct kvi_tensor *t,
				     size_t s)
{
	return e->pk && e->pk[s].data ? &e->pk[s] : t;
}

void kvi_engine_opts_default(struct kvi_engine_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->threads = 1;
	o->block_tokens = 64;
	o->max_batch_tokens = 64;
}

int kvi_engine_opts_resolve(struct kvi_engine_opts *o, const struct kvi_config *c)
{
	if (o->max_ctx <= 0)
		o->max_ctx = c->n_ctx_train > 0 && c->n_ctx_train < 4096 ? c->n_ctx_train : 4096;
	if (o->block_tokens <= 0)
		o->block_tokens = 64;
	if (o->max_batch_tokens <= 0)
		o->max_batch_tokens = 64;
	if (o->kv_blocks <= 0)
		o->kv_blocks = 2 * ((o->max_ctx + o->block_tokens - 1) / o->block_tokens);
	return o->max_ctx > (1 << 24) || o->max_batch_tokens > 65536 ? -EINVAL : 0;
}

/* ---- validation ---------------------------------------------------------------------- */

static int check_tensor(const struct kvi_tensor *t, const char *name, int l, int64_t ne0,
			int64_t ne1, int optional)
{
	if (optional && !t->data)
		return 0;
	if (!t->data || !kvk_wtype_valid(t->type) || t->ne[0] != ne0 || t->ne[1] != ne1) {
		klog_error("tensor %s (layer %d): want %lld x %lld, have %lld x %lld type %d%s",
			   name, l, (long long)ne0, (long long)ne1, (long long)t->ne[0],
			   (long long)t->ne[1], (int)t->type, t->data ? "" : " (missing)");
		return -EINVAL;
	}
	size_t rb = kvk_row_bytes((enum kvk_wtype)t->type, (size_t)ne0);
	if (rb == 0 || t->nbytes < rb * (size_t)ne1) {
		klog_error("tensor %s (layer %d): %zu bytes, type %d needs %zu", name, l, t->nbytes,
			   (int)t->type, rb * (size_t)ne1);
		return -EINVAL;
	}
	return 0;
}

int kvi_engine_check_model(const struct kvi_model *m)
{
	const struct kvi_config *c = &m->cfg;
	if (c->n_layer < 1 || c->n_embd < 1 || c->n_ff < 1 || c->n_head < 1 || c->n_head_kv < 1 ||
	    c->n_head % c->n_head_kv || c->head_dim < 1 || c->rope_dim < 2 || c->rope_dim % 2 ||
	    c->rope_dim > c->head_dim || c->n_vocab < 1 || !(c->rope_base > 0) ||
	    !(c->rms_eps > 0) || c->head_dim > 1024 ||
	    (c->rope_style != KVI_ROPE_ADJACENT && c->rope_style != KVI_ROPE_HALVES) ||
	    !m->layers) {
		klog_error("unsupported configuration (layers %d embd %d ff %d heads %d/%d "
			   "head_dim %d rope_dim %d vocab %d)",
			   c->n_layer, c->n_embd, c->n_ff, c->n_head, c->n_head_kv, c->head_dim,
			   c->rope_dim, c->n_vocab);
		return -EINVAL;
	}
	int64_t E = c->n_embd, Q = (int64_t)c->n_head * c->head_dim;
	int64_t K = (int64_t)c->n_head_kv * c->head_dim, F = c->n_ff;
	int rc = 0;
	rc |= check_tensor(&m->tok_embd, "token_embd", -1, E, c->n_vocab, 0);
	rc |= check_tensor(&m->out_norm, "output_norm", -1, E, 1, 0);
	rc |= check_tensor(&m->output, "output", -1, E, c->n_vocab, 0);
	for (int l = 0; l < c->n_layer && !rc; l++) {
		const struct kvi_layer *L = &m->layers[l];
		rc |= check_tensor(&L->attn_norm, "attn_norm", l, E, 1, 0);
		rc |= check_tensor(&L->wq, "attn_q", l, E, Q, 0);
		rc |= check_tensor(&L->wk, "attn_k", l, E, K, 0);
		rc |= check_tensor(&L->wv, "attn_v", l, E, K, 0);
		rc |= check_tensor(&L->wo, "attn_output", l, Q, E, 0);
		rc |= check_tensor(&L->bq, "attn_q.bias", l, Q, 1, 1);
		rc |= check_tensor(&L->bk, "attn_k.bias", l, K, 1, 1);
		rc |= check_tensor(&L->bv, "attn_v.bias", l, K, 1, 1);
		rc |= check_tensor(&L->ffn_norm, "ffn_norm", l, E, 1, 0);
		rc |= check_tensor(&L->w_gate, "ffn_gate", l, E, F, 0);
		rc |= check_tensor(&L->w_up, "ffn_up", l, E, F, 0);
		rc |= check_tensor(&L->w_down, "ffn_down", l, F, E, 0);
	}
	return rc ? -EINVAL : 0;
}

/* ---- creation ------------------------------------------------------------------------ */

static void *zalloc(size_t bytes)
{
	void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
	if (p)
		memset(p, 0, (bytes + 63) & ~(size_t)63);
	return p;
}

static void vec_to_f32(const struct kvi_tensor *t, float *out)
{
	kvk_row_to_f32((enum kvk_wtype)t->type, t->data, (size_t)t->ne[0], 0, out);
}

static size_t max3(size_t a, size_t b, size_t c)
{
	size_t m = a > b ? a : b;
	return m > c ? m : c;
}

int kvi_engine_create(const struct kvi_model *m, const struct kvi_engine_opts *o,
		      struct kvi_engine **out)
{
	int rc = kvi_engine_check_model(m);
	if (rc)
		return rc;
	struct kvi_engine_opts opt;
	kvi_engine_opts_default(&opt);
	if (o)
		opt = *o;
	const struct kvi_config *c = &m->cfg;
	if (opt.threads <= 0)
		opt.threads = 1;
	if (kvi_engine_opts_resolve(&opt, c) || opt.threads > 256)
		return -EINVAL;

	struct kvi_engine *e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->m = m;
	e->c = *c;
	e->o = opt;
	e->isa = opt.isa ? (enum kvk_isa)opt.isa : kvk_isa_best();
	if (e->isa != KVK_ISA_SCALAR && e->isa > kvk_isa_best())
		e->isa = kvk_isa_best(); /* one this CPU lacks: the best it has */
	e->o.isa = e->isa;
	e->q_dim = c->n_head * c->head_dim;
	e->kv_dim = c->n_head_kv * c->head_dim;

	struct kvi_kv_geom g = {c->n_layer, c->n_head_kv, c->head_dim, opt.block_tokens};
	rc = kvi_kv_create(&g, opt.kv_blocks, &e->kv);
	if (rc)
		goto fail;
	e->kv_block_stride =
	    (size_t)(kvi_kv_row(e->kv, 1, 0, 0, 0) - kvi_kv_row(e->kv, 0, 0, 0, 0));
	rc = kvi_pool_create(opt.threads, &e->pool);
	if (rc)
		goto fail;
	rc = -ENOMEM;

	size_t T = (size_t)opt.max_batch_tokens, E = (size_t)c->n_embd, L = (size_t)c->n_layer;
	size_t QD = (size_t)e->q_dim, KD = (size_t)e->kv_dim, F = (size_t)c->n_ff;
	size_t R2 = (size_t)c->rope_dim / 2;
	e->inv_freq = zalloc(R2 * sizeof(double));
	e->norm_attn = zalloc(L * E * 4);
	e->norm_ffn = zalloc(L * E * 4);
	e->norm_out = zalloc(E * 4);
	e->x = zalloc(T * E * 4);
	e->xn = zalloc(T * (E > QD ? E : QD) * 4);
	e->q = zalloc(T * QD * 4);
	e->k = zalloc(T * KD * 4);
	e->v = zalloc(T * KD * 4);
	e->att = zalloc(T * QD * 4);
	e->gate = zalloc(T * F * 4);
	e->up = zalloc(T * F * 4);
	e->actq = zalloc(kvk_act_bytes(KVK_W_Q8_0, max3(E, QD, F) / 32 * 32 + 32, T));
	e->actk = zalloc(kvk_act_bytes(KVK_W_Q4_K, max3(E, QD, F) / 32 * 32 + 32, T));
	e->rope_cs = zalloc(T * R2 * 2 * 4);
	e->pos = zalloc(T * sizeof(int32_t));
	e->rows = zalloc(T * sizeof(int));
	e->bseq = zalloc(T * sizeof(*e->bseq));
	e->qtile = zalloc((T + 1) * sizeof(int));
	e->attn_cpu = zalloc((size_t)opt.threads * sizeof(double));
	e->scratch = calloc((size_t)opt.threads, sizeof(float *));
	e->scores = calloc((size_t)opt.threads, sizeof(float *));
	if (!e->inv_freq || !e->norm_attn || !e->norm_ffn || !e->norm_out || !e->x || !e->xn ||
	    !e->q || !e->k || !e->v || !e->att || !e->gate || !e->up || !e->actq || !e->actk ||
	    !e->rope_cs || !e->pos || !e->rows || !e->bseq || !e->qtile || !e->attn_cpu ||
	    !e->scratch || !e->scores)
		goto fail;
	size_t sc =
	    max3(kvk_matmul_scratch_floats(KVK_W_F16, E), kvk_matmul_scratch_floats(KVK_W_F16, QD),
		 kvk_matmul_scratch_floats(KVK_W_F16, F));
	for (int i = 0; i < opt.threads; i++) {
		e->scratch[i] = zalloc(sc * 4);
		e->scores[i] =
		    zalloc(kvk_flash_scratch_floats(c->head_dim, c->n_head / c->n_head_kv) * 4);
		if (!e->scratch[i] || !e->scores[i])
			goto fail;
	}
	int has_bias = 0;
	for (size_t l = 0; l < L; l++)
		has_bias |= m->layers[l].bq.data || m->layers[l].bk.data || m->layers[l].bv.data;
	if (has_bias) {
		e->bq = zalloc(L * QD * 4);
		e->bk = zalloc(L * KD * 4);
		e->bv = zalloc(L * KD * 4);
		if (!e->bq || !e->bk || !e->bv)
			goto fail;
	}
	for (size_t l = 0; l < L; l++) {
		const struct kvi_layer *ly = &m->layers[l];
		vec_to_f32(&ly->attn_norm, e->norm_attn + l * E);
		vec_to_f32(&ly->ffn_norm, e->norm_ffn + l * E);
		if (ly->bq.data)
			vec_to_f32(&ly->bq, e->bq + l * QD);
		if (ly->bk.data)
			vec_to_f32(&ly->bk, e->bk + l * KD);
		if (ly->bv.data)
			vec_to_f32(&ly->bv, e->bv + l * KD);
	}
	vec_to_f32(&m->out_norm, e->norm_out);
	rc = pack_weights(e);
	if (rc)
		goto fail;
	rc = -ENOMEM;
	for (size_t t = 0; t < T; t++)
		e->rows[t] = (int)t;
	for (size_t i = 0; i < R2; i++)
		e->inv_freq[i] = pow((double)c->rope_base, -2.0 * (double)i / c->rope_dim);
	*out = e;
	return 0;
fail:
	kvi_engine_destroy(e);
	return rc;
}

void kvi_engine_destroy(struct kvi_engine *e)
{
	if (!e)
		return;
	kvi_pool_destroy(e->pool);
	kvi_kv_destroy(e->kv);
	if (e->pk)
		for (size_t s = 0; s < (size_t)e->c.n_layer * PK_PER + 1; s++)
			free((void *)e->pk[s].data);
	free(e->pk);
	for (int i = 0; i < e->o.threads; i++) {
		if (e->scratch)
			free(e->scratch[i]);
		if (e->scores)
			free(e->scores[i]);
	}
	free(e->scratch);
	free(e->scores);
	void *bufs[] = {e->inv_freq, e->norm_attn, e->norm_ffn, e->norm_out, e->bq,	 e->bk,
			e->bv,	     e->x,	   e->xn,	e->q,	     e->k,	 e->v,
			e->att,	     e->gate,	   e->up,	e->actq,     e->actk,	 e->rope_cs,
			e->pos,	     e->rows,	   e->bseq,	e->qtile,    e->attn_cpu};
	for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
		free(bufs[i]);
	free(e);
}

struct kvi_kv *kvi_engine_kv(struct kvi_engine *e)
{
	return e->kv;
}

const struct kvi_config *kvi_engine_config(const struct kvi_engine *e)
{
	return &e->c;
}

const struct kvi_engine_opts *kvi_engine_opts(const struct kvi_engine *e)
{
	return &e->o;
}

const char *kvi_engine_isa(const struct kvi_engine *e)
{
	return kvk_isa_name(e->isa);
}

void kvi_engine_pool_stats(const struct kvi_engine *e, struct kvi_pool_stats *st)
{
	kvi_pool_stats(e->pool, st);
}

static double thread_cpu_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double kvi_engine_attn_cpu_s(const struct kvi_engine *e)
{
	double s = 0;
	for (int i = 0; i < e->o.threads; i++)
		s += e->attn_cpu[i];
	return s;
}

/* ---- parallel jobs --------------------------------------------------------------------- */

/* Up to three matrices sharing one input (Q/K/V, gate/up). Each thread takes its share of
 * every matrix's rows; each row is computed whole by one thread. */
struct mm_job {
	struct kvi_engine *e;
	int n_mm;
	const struct kvi_tensor *w[3];
	float *y[3];
	const void *act[3];
	size_t n, ntok;
	int swiglu;   /* 2 matrices: y[0] = silu(y[0]) * y[1] on this thread's rows */
	float *resid; /* 1 matrix: resid += y[0] on this thread's rows (ld = rows) */
};

static void mm_run(void *arg, int tid, int nth, int thread)
{
	struct mm_job *j = arg;
	for (int i = 0; i < j->n_mm; i++) {
		const struct kvi_tensor *w = j->w[i];
		long lo, hi;
		kvi_pool_split((long)w->ne[1], tid, nth, 16 /* whole panels */, &lo, &hi);
		kvk_matmul(j->e->isa, (enum kvk_wtype)w->type, j->y[i], (size_t)w->ne[1], w->data,
			   j->n, (size_t)lo, (size_t)hi, j->act[i], j->ntok, j->e->scratch[thread]);
	}
	/* elementwise epilogues on the rows this thread just wrote: no extra pass, no sync */
	size_t R = (size_t)j->w[0]->ne[1];
	long lo, hi;
	kvi_pool_split((long)R, tid, nth, 16, &lo, &hi);
	for (size_t t = 0; t < j->ntok && (j->swiglu || j->resid); t++) {
		float *y0 = j->y[0] + t * R;
		if (j->swiglu) { /* vectorized: no call per element */
			const float *y1 = j->y[1] + t * R;
			for (size_t r = (size_t)lo; r < (size_t)hi; r++)
				y0[r] = y0[r] / (1.0f + kvk_exp(-y0[r])) * y1[r];
		} else {
			for (size_t r = (size_t)lo; r < (size_t)hi; r++)
				j->resid[t * R + r] += y0[r];
		}
	}
}

struct prep_job {
	void *act;
	const float *x;
	size_t n, ntok;
};

static void prep_run(void *arg, int tid, int nth, int thread)
{
	(void)thread;
	struct prep_job *j = arg;
	long lo, hi;
	kvi_pool_split((long)j->ntok, tid, nth, 1, &lo, &hi);
	kvk_act_prepare(KVK_W_Q8_0, j->act, j->ntok, j->x, j->n, j->n, (size_t)lo, (size_t)hi);
}

/* y_i = W_i x for the n_mm matrices, x: (ntok, n) contiguous. */
static void matmuls(struct kvi_engine *e, const float *x, size_t n, size_t ntok, int n_mm,
		    const struct kvi_tensor *const *w, float *const *y, int swiglu, float *resid)
{
	struct mm_job j = {
	    .e = e, .n_mm = n_mm, .n = n, .ntok = ntok, .swiglu = swiglu, .resid = resid};
	int prepared = 0, prepared_k = 0;
	for (int i = 0; i < n_mm; i++) {
		j.w[i] = w[i];
		j.y[i] = y[i];
		if (w[i]->type == KVI_Q8_0) {
			struct prep_job pj = {e->actq, x, n, ntok};
			if (!prepared && ntok >= 8) /* per token: any split gives the same bytes */
				kvi_pool_run(e->pool, prep_run, &pj);
			else if (!prepared)
				kvk_act_prepare(KVK_W_Q8_0, e->actq, ntok, x, n, n, 0, ntok);
			prepared = 1;
			j.act[i] = e->actq;
		} else if (w[i]->type == KVI_Q4_0 || w[i]->type == KVI_Q5_0 ||
			   w[i]->type == KVI_Q5_1 || w[i]->type == KVI_Q4_K ||
			   w[i]->type == KVI_Q5_K || w[i]->type == KVI_Q6_K) {
			/* one format for all four (a Q4_K_M layer mixes Q4_K and Q6_K) */
			if (!prepared_k)
				kvk_act_prepare(KVK_W_Q4_K, e->actk, ntok, x, n, n, 0, ntok);
			prepared_k = 1;
			j.act[i] = e->actk;
		} else {
			j.act[i] = x;
		}
	}
	kvi_pool_run(e->pool, mm_run, &j);
}

struct attn_job {
	struct kvi_engine *e;
	int layer;
	struct kvk_kv_pages pg; /* this layer's K/V pools as kvk_flash_attn_f16 reads them */
};

/* One (query tile, KV head, part of its query-head group) per task: kvk_flash_attn_f16 runs
 * the tile's tokens x heads against key tiles at absolute positions with an online softmax,
 * each key tile read once per query tile (kvk.h). A row's arithmetic depends only on its
 * position, so how the batch was cut into tiles and tasks changes speed, never bits. Tasks go
 * KV head first, so a long prefill's two threads take different heads of the same tiles
 * (equal work) rather than early and late tiles. A job with fewer (tile, KV head) pairs than
 * the pool has shares (decode) splits each group into parts so every thread has work. */
static void attn_run(void *arg, int tid, int nth, int thread)
{
	struct attn_job *j = arg;
	struct kvi_engine *e = j->e;
	const struct kvi_config *c = &e->c;
	int hd = c->head_dim, grp = c->n_head / c->n_head_kv, nq = e->nqtile;
	/* the fewest parts (a divisor of the group) that give every share a task: whole groups
	 * share each converted K/V tile among the most rows */
	int parts = 1;
	while ((long)nq * c->n_head_kv * parts < nth && parts < grp)
		for (parts++; grp % parts; parts++)
			;
	int per = grp / parts;
	float scale = 1.0f / sqrtf((float)hd);
	long lo, hi;
	double c0 = thread_cpu_s(); /* two clock reads per thread and layer: ~1 us */
	kvi_pool_split((long)nq * c->n_head_kv * parts, tid, nth, 1, &lo, &hi);
	for (long task = lo; task < hi; task++) {
		int kvh = (int)(task / ((long)nq * parts));
		int rem = (int)(task % ((long)nq * parts)), qt = rem / parts;
		int h0 = kvh * grp + (rem % parts) * per, t0 = e->qtile[qt];
		int nt = e->qtile[qt + 1] - t0;
		size_t off = (size_t)t0 * e->q_dim + (size_t)h0 * hd;
		kvk_flash_attn_f16(e->isa, e->att + off, (size_t)e->q_dim, e->q + off,
				   (size_t)e->q_dim, nt, e->pos[t0], per, kvh, &j->pg,
				   kvi_seq_blocks(e->bseq[t0]), scale, e->scores[thread]);
	}
	e->attn_cpu[thread] += thread_cpu_s() - c0;
}

/* Cuts batch rows into query tiles for attn_run: runs of up to KVK_FLASH_QT rows of one
 * sequence at consecutive positions (a prefill chunk; each decode row alone). */
static void qtiles_make(struct kvi_engine *e, int ntok)
{
	int n = 0;
	for (int t = 0; t < ntok; t++)
		if (t == 0 || e->bseq[t] != e->bseq[t - 1] || e->pos[t] != e->pos[t - 1] + 1 ||
		    t - e->qtile[n - 1] == KVK_FLASH_QT)
			e->qtile[n++] = t;
	e->qtile[n] = ntok;
	e->nqtile = n;
}

/* ---- one forward pass ------------------------------------------------------------------ */

static void rope_apply(const struct kvi_engine *e, float *v, const float *cs)
{
	int half = e->c.rope_dim / 2;
	for (int i = 0; i < half; i++) {
		int a = e->c.rope_style == KVI_ROPE_ADJACENT ? 2 * i : i;
		int b = e->c.rope_style == KVI_ROPE_ADJACENT ? 2 * i + 1 : i + half;
		float c = cs[2 * i], s = cs[2 * i + 1], x0 = v[a], x1 = v[b];
		v[a] = x0 * c - x1 * s;
		v[b] = x0 * s + x1 * c;
	}
}

/* Runs e->pos/e->bseq tokens toks[0..ntok) (blocks reserved), then writes logits for the nsel
 * batch rows sel[] to out (nsel rows of n_vocab). */
static void forward(struct kvi_engine *e, const int32_t *toks, int ntok, const int *sel, int nsel,
		    float *out, const struct kvi_inject *inj, int ninj, int off)
{
	const struct kvi_config *c = &e->c;
	const struct kvi_model *m = e->m;
	size_t E = (size_t)c->n_embd, QD = (size_t)e->q_dim, KD = (size_t)e->kv_dim;
	size_t F = (size_t)c->n_ff, T = (size_t)ntok;
	int hd = c->head_dim, B = e->o.block_tokens, half = c->rope_dim / 2;

	for (size_t t = 0; t < T; t++) {
		kvk_row_to_f32((enum kvk_wtype)m->tok_embd.type, m->tok_embd.data, E,
			       (size_t)toks[t], e->x + t * E);
		for (int k = 0; k < ninj; k++) {
			long r = (long)off + (long)t - inj[k].pos;
			if (r >= 0 && r < inj[k].n)
				memcpy(e->x + t * E, inj[k].rows + (size_t)r * E,
				       E * sizeof(float));
		}
		float *cs = e->rope_cs + t * (size_t)half * 2;
		for (int i = 0; i < half; i++) {
			double a = (double)e->pos[t] * e->inv_freq[i];
			cs[2 * i] = (float)cos(a);
			cs[2 * i + 1] = (float)sin(a);
		}
	}
	qtiles_make(e, ntok);
	for (int l = 0; l < c->n_layer; l++) {
		const struct kvi_layer *L = &m->layers[l];
		kvk_rmsnorm_f32(e->xn, e->x, e->norm_attn + (size_t)l * E, E, T, c->rms_eps);
		size_t s0 = (size_t)l * PK_PER;
		const struct kvi_tensor *wqkv[3] = {wsel(e, &L->wq, s0), wsel(e, &L->wk, s0 + 1),
						    wsel(e, &L->wv, s0 + 2)};
		float *yqkv[3] = {e->q, e->k, e->v};
		matmuls(e, e->xn, E, T, 3, wqkv, yqkv, 0, NULL);
		for (size_t t = 0; t < T; t++) {
			float *q = e->q + t * QD, *k = e->k + t * KD, *v = e->v + t * KD;
			if (e->bq) {
				const float *bq = e->bq + (size_t)l * QD,
					    *bk = e->bk + (size_t)l * KD;
				const float *bv = e->bv + (size_t)l * KD;
				for (size_t i = 0; i < QD; i++)
					q[i] += bq[i];
				for (size_t i = 0; i < KD; i++) {
					k[i] += bk[i];
					v[i] += bv[i];
				}
			}
			const float *cs = e->rope_cs + t * (size_t)half * 2;
			for (int h = 0; h < c->n_head; h++)
				rope_apply(e, q + h * hd, cs);
			for (int h = 0; h < c->n_head_kv; h++)
				rope_apply(e, k + h * hd, cs);
			int p = e->pos[t], blk = kvi_seq_blocks(e->bseq[t])[p / B];
			uint16_t *kr = kvi_kv_row(e->kv, blk, l, 0, p % B);
			uint16_t *vr = kvi_kv_row(e->kv, blk, l, 1, p % B);
			for (size_t i = 0; i < KD; i++) {
				kr[i] = kvk_f32_to_f16(k[i]);
				vr[i] = kvk_f32_to_f16(v[i]);
			}
		}
		struct attn_job aj = {e, l, {0}};
		aj.pg.k = kvi_kv_row(e->kv, 0, l, 0, 0);
		aj.pg.v = kvi_kv_row(e->kv, 0, l, 1, 0);
		aj.pg.block_stride = e->kv_block_stride;
		aj.pg.num_blocks = e->o.kv_blocks;
		aj.pg.block_tokens = B;
		aj.pg.n_kv_heads = c->n_head_kv;
		aj.pg.head_dim = hd;
		kvi_pool_run(e->pool, attn_run, &aj);
		const struct kvi_tensor *wo[1] = {wsel(e, &L->wo, s0 + 3)};
		float *yo[1] = {e->xn};
		matmuls(e, e->att, QD, T, 1, wo, yo, 0, e->x); /* x += Wo att */

		kvk_rmsnorm_f32(e->xn, e->x, e->norm_ffn + (size_t)l * E, E, T, c->rms_eps);
		const struct kvi_tensor *wgu[2] = {wsel(e, &L->w_gate, s0 + 4),
						   wsel(e, &L->w_up, s0 + 5)};
		float *ygu[2] = {e->gate, e->up};
		matmuls(e, e->xn, E, T, 2, wgu, ygu, 1, NULL); /* gate = silu(gate) * up */
		const struct kvi_tensor *wd[1] = {wsel(e, &L->w_down, s0 + 6)};
		float *yd[1] = {e->xn};
		matmuls(e, e->gate, F, T, 1, wd, yd, 0, e->x); /* x += Wdown h */
	}
	if (nsel == 0)
		return;
	for (int i = 0; i < nsel; i++)
		kvk_rmsnorm_f32(e->xn + (size_t)i * E, e->x + (size_t)sel[i] * E, e->norm_out, E, 1,
				c->rms_eps);
	const struct kvi_tensor *wout[1] = {wsel(e, &m->output, (size_t)c->n_layer * PK_PER)};
	float *yout[1] = {out};
	matmuls(e, e->xn, E, (size_t)nsel, 1, wout, yout, 0, NULL);
}

/* ---- public entry points --------------------------------------------------------------- */

static int check_tokens(const int32_t *t, int n, int n_vocab)
{
	for (int i = 0; i < n; i++)
		if (t[i] < 0 || t[i] >= n_vocab)
			return -EINVAL;
	return 0;
}

int kvi_engine_check_prefill(const struct kvi_kv *kv, int n_vocab, int max_ctx,
			     const struct kvi_seq *seq, const int32_t *tokens, int n)
{
	if (n < 1 || !tokens || !seq || kvi_seq_kv(seq) != kv || check_tokens(tokens, n, n_vocab))
		return -EINVAL;
	if ((long)kvi_seq_len(seq) + n > max_ctx)
		return -E2BIG;
	return 0;
}

int kvi_engine_check_decode(const struct kvi_kv *kv, int n_vocab, int max_ctx,
			    struct kvi_seq *const *seqs, const int32_t *tokens, int nseq)
{
	if (nseq < 1 || !tokens || !seqs || check_tokens(tokens, nseq, n_vocab))
		return -EINVAL;
	for (int i = 0; i < nseq; i++) {
		if (!seqs[i] || kvi_seq_kv(seqs[i]) != kv)
			return -EINVAL;
		if (kvi_seq_len(seqs[i]) + 1 > max_ctx)
			return -E2BIG;
		for (int k = 0; k < i; k++)
			if (seqs[k] == seqs[i])
				return -EINVAL;
	}
	return 0;
}

int kvi_engine_check_inject(const struct kvi_inject *inject, int ninject, int n)
{
	if (ninject < 0 || (ninject && !inject))
		return -EINVAL;
	for (int k = 0; k < ninject; k++)
		if (inject[k].pos < 0 || inject[k].n < 1 || !inject[k].rows ||
		    (long)inject[k].pos + inject[k].n > n)
			return -EINVAL;
	return 0;
}

int kvi_engine_prefill(struct kvi_engine *e, struct kvi_seq *seq, const int32_t *tokens, int n,
		       float *logits_last)
{
	return kvi_engine_prefill_inject(e, seq, tokens, n, NULL, 0, logits_last);
}

int kvi_engine_prefill_inject(struct kvi_engine *e, struct kvi_seq *seq, const int32_t *tokens,
			      int n, const struct kvi_inject *inject, int ninject,
			      float *logits_last)
{
	int rc = kvi_engine_check_prefill(e->kv, e->c.n_vocab, e->o.max_ctx, seq, tokens, n);
	if (!rc)
		rc = kvi_engine_check_inject(inject, ninject, n);
	if (rc)
		return rc;
	for (int off = 0; off < n; off += e->o.max_batch_tokens) {
		int cnt = n - off < e->o.max_batch_tokens ? n - off : e->o.max_batch_tokens;
		rc = kvi_seq_reserve(seq, cnt);
		if (rc)
			return rc;
		int len = kvi_seq_len(seq);
		for (int i = 0; i < cnt; i++) {
			e->pos[i] = len + i;
			e->bseq[i] = seq;
		}
		int want = off + cnt == n && logits_last;
		forward(e, tokens + off, cnt, e->rows + cnt - 1, want, logits_last, inject, ninject,
			off);
		kvi_seq_advance(seq, cnt);
	}
	return 0;
}

int kvi_engine_decode(struct kvi_engine *e, struct kvi_seq *const *seqs, const int32_t *tokens,
		      int nseq, float *logits)
{
	int rc = kvi_engine_check_decode(e->kv, e->c.n_vocab, e->o.max_ctx, seqs, tokens, nseq);
	if (rc)
		return rc;
	for (int off = 0; off < nseq; off += e->o.max_batch_tokens) {
		int cnt = nseq - off < e->o.max_batch_tokens ? nseq - off : e->o.max_batch_tokens;
		for (int i = 0; i < cnt; i++) {
			rc = kvi_seq_reserve(seqs[off + i], 1);
			if (rc)
				return rc;
			e->pos[i] = kvi_seq_len(seqs[off + i]);
			e->bseq[i] = seqs[off + i];
		}
		forward(e, tokens + off, cnt, e->rows, logits ? cnt : 0,
			logits ? logits + (size_t)off * e->c.n_vocab : NULL, NULL, 0, 0);
		for (int i = 0; i < cnt; i++)
			kvi_seq_advance(seqs[off + i], 1);
	}
	return 0;
}
