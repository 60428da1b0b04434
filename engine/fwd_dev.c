/* The forward pass on a kvk_dev backend (fwd_dev.h): weights uploaded once, activations
 * allocated at create, paged KV in device memory with kv.h's block layout, and the host mirror
 * kept coherent for export/import and the KV connector. */
#define KVFS_LOG_TAG "fwd_dev"
#include "fwd_dev.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvk.h"
#include "kvk_dev.h"
#include "kvk_nccl.h"
#include "log.h"

/* A weight matrix in device memory: ne1 rows of ne0 elements of type dt. */
struct dw {
	enum kvk_dtype dt;
	int ne0, ne1;
	const void *p;
};

struct dlayer {
	struct dw wq, wk, wv, wo, gate, up, down;
	const float *attn_norm, *ffn_norm; /* (n_embd) f32 */
	const float *bq, *bk, *bv;	   /* f32, or NULL */
};

struct kvi_dev_engine {
	const struct kvi_model *m;
	struct kvi_config c;
	struct kvi_engine_opts o;
	struct kvk_dev d;
	struct kvi_kv *kv;
	int q_dim, kv_dim, max_blocks; /* max_blocks: block-table entries for max_ctx */
	int broken;		       /* a device error happened: refuse further work */
	/* every device allocation, freed at destroy */
	struct kvk_dev_arena ar; /* every device buffer */
	/* weights */
	struct dlayer *L;
	struct dw embd, out;
	const float *out_norm;
	/* paged KV: n_blocks blocks of kv.h's layout; per-layer K / V pointers into block 0 */
	uint16_t *kvmem;
	uint16_t **kptr, **vptr; /* host arrays of n_layer device pointers */
	struct kvk_kv_layers layers;
	uint32_t *dev_gen; /* per block: generation whose contents the device holds (0: none) */
	uint8_t *host_ok;  /* per block: host mirror equals the device copy */
	int32_t *run_ids;  /* (kv_blocks) scratch: the ids of one run of blocks to move */
	/* activations (device), T = max_batch_tokens rows each */
	float *x;      /* (T, n_embd) residual stream */
	float *xn;     /* (T, max(n_embd, q_dim)) normed input / projection output */
	float *q;      /* (T, n_head, head_dim) */
	float *k, *v;  /* (T, n_head_kv, head_dim) */
	float *att;    /* (T, q_dim) */
	float *gate;   /* (T, n_ff) */
	float *up;     /* (T, n_ff) */
	void *act16;   /* (T, max(n_embd, q_dim, n_ff)) f16/bf16 GEMM input */
	float *logits; /* (T, n_vocab) */
	/* per-pass integers: ids, pos, slots, seq lens (T each), then block tables (T, max_blocks)
	 */
	int32_t *meta, *hmeta; /* device, host */
};

#define META_IDS(e, p)	  ((p) + 0 * (size_t)(e)->o.max_batch_tokens)
#define META_POS(e, p)	  ((p) + 1 * (size_t)(e)->o.max_batch_tokens)
#define META_SLOTS(e, p)  ((p) + 2 * (size_t)(e)->o.max_batch_tokens)
#define META_LENS(e, p)	  ((p) + 3 * (size_t)(e)->o.max_batch_tokens)
#define META_TABLES(e, p) ((p) + 4 * (size_t)(e)->o.max_batch_tokens)

/* ---- device memory --------------------------------------------------------------------- */

static void *dalloc(struct kvi_dev_engine *e, size_t bytes, int *rc)
{
	return kvk_arena_alloc(&e->ar, bytes, rc);
}

static const void *upload(struct kvi_dev_engine *e, const void *src, size_t bytes, int *rc)
{
	return kvk_arena_upload(&e->ar, src, bytes, rc);
}

/* A 1-D tensor (norm, bias) as f32 on the device; NULL for an absent optional one. */
static const float *upload_vec(struct kvi_dev_engine *e, const struct kvi_tensor *t, int *rc)
{
	if (!t->data || *rc)
		return NULL;
	size_t n = (size_t)t->ne[0];
	float *h = malloc(n * sizeof(float));
	if (!h) {
		*rc = -ENOMEM;
		return NULL;
	}
	kvk_row_to_f32((enum kvk_wtype)t->type, t->data, n, 0, h);
	const float *p = upload(e, h, n * sizeof(float), rc);
	free(h);
	return p;
}

/* A matrix as stored (F32/F16/BF16/Q8_0/Q4_0/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K); a tensor already uploaded
 * (tied output) is shared. */
static void upload_mat(struct kvi_dev_engine *e, const struct kvi_tensor *t, struct dw *out,
		       const struct kvi_tensor *same, const struct dw *same_dw, int *rc)
{
	out->dt = (enum kvk_dtype)t->type;
	out->ne0 = (int)t->ne[0];
	out->ne1 = (int)t->ne[1];
	if (same && same->data == t->data && same->type == t->type) {
		out->p = same_dw->p;
		return;
	}
	size_t bytes = kvk_row_bytes((enum kvk_wtype)t->type, (size_t)t->ne[0]) * (size_t)t->ne[1];
	out->p = upload(e, t->data, bytes, rc);
}

/* ---- creation -------------------------------------------------------------------------- */

static int host_sync(void *arg, const int32_t *ids, int n);

int kvi_dev_engine_create(const struct kvi_model *m, const struct kvi_engine_opts *o, int backend,
			  int device, struct kvi_dev_engine **out)
{
	*out = NULL;
	int rc = kvi_engine_check_model(m);
	if (rc)
		return rc;
	const struct kvi_config *c = &m->cfg;
	if (c->head_dim % 2 || c->head_dim > 256) {
		klog_error("device engine: head_dim %d (the attention kernels need an even "
			   "head_dim <= 256)",
			   c->head_dim);
		return -EINVAL;
	}
	struct kvi_engine_opts opt;
	kvi_engine_opts_default(&opt);
	if (o)
		opt = *o;
	if (kvi_engine_opts_resolve(&opt, c) || (long)opt.kv_blocks * opt.block_tokens > INT32_MAX)
		return -EINVAL;
	opt.threads = 1;
	opt.isa = 0;

	struct kvi_dev_engine *e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->m = m;
	e->c = *c;
	e->o = opt;
	e->q_dim = c->n_head * c->head_dim;
	e->kv_dim = c->n_head_kv * c->head_dim;
	e->max_blocks = (opt.max_ctx + opt.block_tokens - 1) / opt.block_tokens;
	e->ar.d = &e->d;
	if ((rc = kvk_dev_open(&e->d, (enum kvk_dev_kind)backend, device))) {
		if (rc == -ENODEV)
			klog_error("device engine: backend %s: no GPU%s",
				   backend == KVK_DEV_CUDA ? "cuda" : "?",
				   kvk_cuda_device_count() ? " with that index"
							   : " (or no CUDA in this build)");
		free(e);
		return rc;
	}
	struct kvi_kv_geom g = {c->n_layer, c->n_head_kv, c->head_dim, opt.block_tokens};
	if ((rc = kvi_kv_create(&g, opt.kv_blocks, &e->kv)))
		goto fail;
	rc = -ENOMEM;
	size_t L = (size_t)c->n_layer, NB = (size_t)opt.kv_blocks;
	e->L = calloc(L, sizeof(*e->L));
	e->kptr = calloc(L, sizeof(uint16_t *));
	e->vptr = calloc(L, sizeof(uint16_t *));
	e->dev_gen = calloc(NB, sizeof(uint32_t));
	e->host_ok = calloc(NB, 1);
	e->run_ids = calloc(NB, sizeof(int32_t));
	size_t T = (size_t)opt.max_batch_tokens, MB = (size_t)e->max_blocks;
	size_t nmeta = 4 * T + T * MB;
	e->hmeta = calloc(nmeta, sizeof(int32_t));
	if (!e->L || !e->kptr || !e->vptr || !e->dev_gen || !e->host_ok || !e->run_ids || !e->hmeta)
		goto fail;
	rc = 0;

	/* weights */
	upload_mat(e, &m->tok_embd, &e->embd, NULL, NULL, &rc);
	upload_mat(e, &m->output, &e->out, &m->tok_embd, &e->embd, &rc);
	e->out_norm = upload_vec(e, &m->out_norm, &rc);
	for (size_t l = 0; l < L && !rc; l++) {
		const struct kvi_layer *ly = &m->layers[l];
		struct dlayer *dl = &e->L[l];
		upload_mat(e, &ly->wq, &dl->wq, NULL, NULL, &rc);
		upload_mat(e, &ly->wk, &dl->wk, NULL, NULL, &rc);
		upload_mat(e, &ly->wv, &dl->wv, NULL, NULL, &rc);
		upload_mat(e, &ly->wo, &dl->wo, NULL, NULL, &rc);
		upload_mat(e, &ly->w_gate, &dl->gate, NULL, NULL, &rc);
		upload_mat(e, &ly->w_up, &dl->up, NULL, NULL, &rc);
		upload_mat(e, &ly->w_down, &dl->down, NULL, NULL, &rc);
		dl->attn_norm = upload_vec(e, &ly->attn_norm, &rc);
		dl->ffn_norm = upload_vec(e, &ly->ffn_norm, &rc);
		dl->bq = upload_vec(e, &ly->bq, &rc);
		dl->bk = upload_vec(e, &ly->bk, &rc);
		dl->bv = upload_vec(e, &ly->bv, &rc);
	}

	/* paged KV in kv.h's layout: block b, layer l, K at b * stride + l * 2 * slab */
	size_t slab = (size_t)opt.block_tokens * (size_t)e->kv_dim; /* halves */
	size_t stride = L * 2 * slab;
	e->kvmem = dalloc(e, NB * stride * 2, &rc);
	for (size_t l = 0; l < L && !rc; l++) {
		e->kptr[l] = e->kvmem + l * 2 * slab;
		e->vptr[l] = e->kptr[l] + slab;
	}
	e->layers =
	    (struct kvk_kv_layers){c->n_layer,	opt.kv_blocks, opt.block_tokens, c->n_head_kv,
				   c->head_dim, stride,	       e->kptr,		 e->vptr};
	if (!rc && kvk_kv_payload_bytes(&e->layers) != kvi_kv_block_bytes(e->kv))
		rc = -EINVAL; /* the two layouts must agree: a block is its payload */

	/* activations */
	size_t E = (size_t)c->n_embd, QD = (size_t)e->q_dim, KD = (size_t)e->kv_dim;
	size_t F = (size_t)c->n_ff, V = (size_t)c->n_vocab;
	size_t wide = E > QD ? E : QD;
	e->x = dalloc(e, T * E * 4, &rc);
	e->xn = dalloc(e, T * wide * 4, &rc);
	e->q = dalloc(e, T * QD * 4, &rc);
	e->k = dalloc(e, T * KD * 4, &rc);
	e->v = dalloc(e, T * KD * 4, &rc);
	e->att = dalloc(e, T * QD * 4, &rc);
	e->gate = dalloc(e, T * F * 4, &rc);
	e->up = dalloc(e, T * F * 4, &rc);
	e->act16 = dalloc(e, T * (wide > F ? wide : F) * 2, &rc);
	e->logits = dalloc(e, T * V * 4, &rc);
	e->meta = dalloc(e, nmeta * sizeof(int32_t), &rc);
	if (!rc)
		rc = e->d.op->memset(&e->d, e->meta, 0, nmeta * sizeof(int32_t));
	if (!rc)
		rc = e->d.op->sync(&e->d);
	if (rc)
		goto fail;
	kvi_kv_set_host_sync(e->kv, host_sync, e);
	klog_info("device engine on %s: %.1f MiB of device memory (%d KV blocks of %d tokens)",
		  e->d.op->name, (double)e->ar.bytes / 1048576.0, opt.kv_blocks, opt.block_tokens);
	*out = e;
	return 0;
fail:
	if (rc == -EINVAL)
		klog_error("device engine: bad configuration");
	kvi_dev_engine_destroy(e);
	return rc;
}

void kvi_dev_engine_destroy(struct kvi_dev_engine *e)
{
	if (!e)
		return;
	kvk_arena_free(&e->ar);
	kvk_dev_close(&e->d);
	kvi_kv_destroy(e->kv);
	free(e->L);
	free(e->kptr);
	free(e->vptr);
	free(e->dev_gen);
	free(e->host_ok);
	free(e->run_ids);
	free(e->hmeta);
	free(e);
}

struct kvi_kv *kvi_dev_engine_kv(struct kvi_dev_engine *e)
{
	return e->kv;
}

const struct kvi_config *kvi_dev_engine_config(const struct kvi_dev_engine *e)
{
	return &e->c;
}

const struct kvi_engine_opts *kvi_dev_engine_opts(const struct kvi_dev_engine *e)
{
	return &e->o;
}

const char *kvi_dev_engine_backend(const struct kvi_dev_engine *e)
{
	return e->d.op->name;
}

size_t kvi_dev_engine_device_bytes(const struct kvi_dev_engine *e)
{
	return e->ar.bytes;
}

/* ---- KV coherence (fwd_dev.h) ------------------------------------------------------------ */

static uint16_t *host_block(const struct kvi_dev_engine *e, int id)
{
	return kvi_kv_row(e->kv, id, 0, 0, 0); /* a block's start: its payload */
}

/* Blocks move between the mirror and the device in runs of consecutive ids: their mirror
 * memory is contiguous, so a run is one kv_unpack / kv_pack call (kvx allocates the blocks of
 * a loaded prefix in order, so a whole prefix is usually one run). */
struct run {
	int32_t first;
	int n;
	int up; /* 1: mirror -> device, 0: device -> mirror */
};

static int run_flush(struct kvi_dev_engine *e, struct run *r)
{
	if (r->n == 0)
		return 0;
	for (int i = 0; i < r->n; i++)
		e->run_ids[i] = r->first + i;
	int rc =
	    r->up ? e->d.op->kv_unpack(&e->d, &e->layers, host_block(e, r->first), e->run_ids, r->n)
		  : e->d.op->kv_pack(&e->d, host_block(e, r->first), &e->layers, e->run_ids, r->n);
	if (rc) {
		klog_error("%s of KV blocks %d..%d: %d", r->up ? "upload" : "download", r->first,
			   r->first + r->n - 1, rc);
		return rc;
	}
	for (int i = 0; i < r->n; i++) {
		int32_t id = r->first + i;
		if (r->up)
			e->dev_gen[id] = kvi_kv_block_gen(e->kv, id);
		e->host_ok[id] = 1;
	}
	r->n = 0;
	return 0;
}

static int run_add(struct kvi_dev_engine *e, struct run *r, int32_t id)
{
	if (r->n && id == r->first + r->n) {
		r->n++;
		return 0;
	}
	int rc = run_flush(e, r);
	r->first = id;
	r->n = 1;
	return rc;
}

/* The kv.h hook: device -> mirror for the blocks whose device copy is newer. */
static int host_sync(void *arg, const int32_t *ids, int n)
{
	struct kvi_dev_engine *e = arg;
	if (e->broken)
		return -EIO;
	struct run r = {0, 0, 0};
	int rc = 0;
	for (int i = 0; i < n && !rc; i++) {
		int32_t id = ids[i];
		if (id < 0 || id >= e->o.kv_blocks)
			return -EINVAL;
		if (e->dev_gen[id] != kvi_kv_block_gen(e->kv, id) || e->host_ok[id])
			continue; /* the mirror is the newer (or the same) copy */
		rc = run_add(e, &r, id);
	}
	if (!rc)
		rc = run_flush(e, &r);
	if (rc)
		e->broken = 1;
	return rc;
}

/* Makes positions len .. len + n_new - 1 of seq writable on the device: uploads blocks the
 * device has not seen, reserves (kv.h), repeats a copy on write on the device and marks the
 * blocks about to be written as device-owned. */
static int seq_prepare(struct kvi_dev_engine *e, struct kvi_seq *seq, int n_new)
{
	const int32_t *bl = kvi_seq_blocks(seq);
	int nb = kvi_seq_n_blocks(seq), B = e->o.block_tokens, rc = 0;
	struct run r = {0, 0, 1};
	for (int i = 0; i < nb && !rc; i++)
		if (e->dev_gen[bl[i]] != kvi_kv_block_gen(e->kv, bl[i]))
			rc = run_add(e, &r, bl[i]);
	if (rc || (rc = run_flush(e, &r)))
		return rc;
	int len = kvi_seq_len(seq), first = len / B;
	int old = len % B && first < nb ? bl[first] : -1;
	int rrc = kvi_seq_reserve(seq, n_new);
	bl = kvi_seq_blocks(seq);
	if (old >= 0 && bl[first] != old) { /* copy on write happened (even if reserve failed) */
		size_t bytes = kvi_kv_block_bytes(e->kv);
		rc = e->d.op->d2d(&e->d, (uint8_t *)e->kvmem + (size_t)bl[first] * bytes,
				  (uint8_t *)e->kvmem + (size_t)old * bytes, bytes);
		if (rc)
			return rc;
		e->dev_gen[bl[first]] = kvi_kv_block_gen(e->kv, bl[first]);
		e->host_ok[bl[first]] = 0;
	}
	if (rrc)
		return rrc;
	for (int i = first; i < kvi_seq_n_blocks(seq); i++) {
		e->dev_gen[bl[i]] = kvi_kv_block_gen(e->kv, bl[i]);
		e->host_ok[bl[i]] = 0;
	}
	return 0;
}

/* ---- one forward pass ---------------------------------------------------------------------- */

#define CK(call)                                                                                   \
	do {                                                                                       \
		int rc_ = (call);                                                                  \
		if (rc_)                                                                           \
			return rc_;                                                                \
	} while (0)

/* y (ntok, w->ne1) = x (ntok, w->ne0) W^T. *conv says x is already in act16 as w->dt. */
static int matmul(struct kvi_dev_engine *e, float *y, const struct dw *w, const float *x, int ntok,
		  int *conv)
{
	const struct kvk_dev_ops *op = e->d.op;
	switch (w->dt) {
	case KVK_DT_F16:
	case KVK_DT_BF16:
		if (*conv != (int)w->dt)
			CK(op->convert(&e->d, e->act16, w->dt, x, (size_t)ntok * w->ne0));
		*conv = (int)w->dt;
		return op->gemm(&e->d, y, e->act16, w->p, w->dt, ntok, w->ne1, w->ne0);
	case KVK_DT_F32:
		return op->gemm(&e->d, y, x, w->p, KVK_DT_F32, ntok, w->ne1, w->ne0);
	case KVK_DT_Q8_0:
		return op->q8_0_gemv(&e->d, y, w->p, x, w->ne1, w->ne0, ntok);
	case KVK_DT_Q4_0:
	case KVK_DT_Q5_0:
	case KVK_DT_Q5_1:
	case KVK_DT_Q4_K:
	case KVK_DT_Q5_K:
	case KVK_DT_Q6_K:
		return op->kq_gemv(&e->d, y, w->p, w->dt, x, w->ne1, w->ne0, ntok);
	}
	return -EINVAL;
}

/* The pass over ntok tokens whose ids, positions, slots, lengths and tables are in e->meta.
 * prefill: one sequence, queries at q_start.., table row 0; else one token per sequence.
 * Logits of rows sel0 .. sel0 + nsel - 1 go to out (host). */
static int forward(struct kvi_dev_engine *e, int ntok, int prefill, int q_start, int sel0, int nsel,
		   float *out, const struct kvi_inject *inj, int ninj, int off)
{
	const struct kvk_dev_ops *op = e->d.op;
	struct kvk_dev *d = &e->d;
	const struct kvi_config *c = &e->c;
	size_t E = (size_t)c->n_embd, QD = (size_t)e->q_dim, KD = (size_t)e->kv_dim;
	size_t F = (size_t)c->n_ff, T = (size_t)ntok;
	int hd = c->head_dim, style = c->rope_style == KVI_ROPE_HALVES;
	float scale = 1.0f / sqrtf((float)hd);
	const int32_t *ids = META_IDS(e, e->meta), *pos = META_POS(e, e->meta);
	const int32_t *slots = META_SLOTS(e, e->meta), *lens = META_LENS(e, e->meta);
	const int32_t *tables = META_TABLES(e, e->meta);

	CK(op->embed(d, e->x, e->embd.p, e->embd.dt, (size_t)c->n_vocab, E, ids, T));
	for (int k = 0; k < ninj; k++) { /* each span's part in this pass, one upload */
		long a = inj[k].pos - (long)off, b = a + inj[k].n;
		a = a < 0 ? 0 : a;
		b = b > ntok ? ntok : b;
		if (a < b)
			CK(op->h2d(d, e->x + (size_t)a * E,
				   inj[k].rows + (size_t)(a + off - inj[k].pos) * E,
				   (size_t)(b - a) * E * sizeof(float)));
	}
	for (int l = 0; l < c->n_layer; l++) {
		const struct dlayer *L = &e->L[l];
		int conv = -1;
		CK(op->rmsnorm(d, e->xn, e->x, L->attn_norm, E, T, c->rms_eps));
		CK(matmul(e, e->q, &L->wq, e->xn, ntok, &conv));
		CK(matmul(e, e->k, &L->wk, e->xn, ntok, &conv));
		CK(matmul(e, e->v, &L->wv, e->xn, ntok, &conv));
		if (L->bq)
			CK(op->add_bias(d, e->q, L->bq, QD, T));
		if (L->bk)
			CK(op->add_bias(d, e->k, L->bk, KD, T));
		if (L->bv)
			CK(op->add_bias(d, e->v, L->bv, KD, T));
		CK(op->rope(d, e->q, T, (size_t)c->n_head, (size_t)hd, (size_t)c->rope_dim, pos,
			    c->rope_base, style));
		CK(op->rope(d, e->k, T, (size_t)c->n_head_kv, (size_t)hd, (size_t)c->rope_dim, pos,
			    c->rope_base, style));
		CK(op->kv_store(d, &e->layers, l, e->k, e->v, slots, ntok));
		struct kvk_kv_pages pg = {e->kptr[l],
					  e->vptr[l],
					  e->layers.block_stride,
					  e->o.kv_blocks,
					  e->o.block_tokens,
					  c->n_head_kv,
					  hd};
		if (prefill)
			CK(op->attn_prefill(d, e->att, e->q, &pg, tables, ntok, q_start, c->n_head,
					    scale));
		else
			CK(op->attn_decode(d, e->att, e->q, &pg, tables, e->max_blocks, lens, ntok,
					   c->n_head, scale));
		conv = -1;
		CK(matmul(e, e->xn, &L->wo, e->att, ntok, &conv));
		CK(op->add(d, e->x, e->xn, T * E));
		CK(op->rmsnorm(d, e->xn, e->x, L->ffn_norm, E, T, c->rms_eps));
		conv = -1;
		CK(matmul(e, e->gate, &L->gate, e->xn, ntok, &conv));
		CK(matmul(e, e->up, &L->up, e->xn, ntok, &conv));
		CK(op->swiglu(d, e->gate, e->gate, e->up, T * F));
		conv = -1;
		CK(matmul(e, e->xn, &L->down, e->gate, ntok, &conv));
		CK(op->add(d, e->x, e->xn, T * E));
	}
	if (nsel > 0) {
		int conv = -1;
		CK(op->rmsnorm(d, e->xn, e->x + (size_t)sel0 * E, e->out_norm, E, (size_t)nsel,
			       c->rms_eps));
		CK(matmul(e, e->logits, &e->out, e->xn, nsel, &conv));
		CK(op->d2h(d, out, e->logits, (size_t)nsel * (size_t)c->n_vocab * sizeof(float)));
	}
	return op->sync(d);
}

/* Uploads the first `tables` block-table entries after the four per-token arrays. */
static int send_meta(struct kvi_dev_engine *e, size_t tables)
{
	size_t n = 4 * (size_t)e->o.max_batch_tokens + tables;
	return e->d.op->h2d(&e->d, e->meta, e->hmeta, n * sizeof(int32_t));
}

/* ---- public entry points --------------------------------------------------------------- */

/* A device error is sticky: the device state (KV, mirror flags) can no longer be trusted. */
static int fail_dev(struct kvi_dev_engine *e, int rc)
{
	if (rc == -EIO || rc == -ENODEV) {
		klog_error("device engine: device error, engine disabled");
		e->broken = 1;
	}
	return rc;
}

int kvi_dev_engine_prefill(struct kvi_dev_engine *e, struct kvi_seq *seq, const int32_t *tokens,
			   int n, float *logits_last)
{
	return kvi_dev_engine_prefill_inject(e, seq, tokens, n, NULL, 0, logits_last);
}

int kvi_dev_engine_prefill_inject(struct kvi_dev_engine *e, struct kvi_seq *seq,
				  const int32_t *tokens, int n, const struct kvi_inject *inject,
				  int ninject, float *logits_last)
{
	if (e->broken)
		return -EIO;
	int rc = kvi_engine_check_prefill(e->kv, e->c.n_vocab, e->o.max_ctx, seq, tokens, n);
	if (!rc)
		rc = kvi_engine_check_inject(inject, ninject, n);
	if (rc)
		return rc;
	int B = e->o.block_tokens;
	for (int off = 0; off < n; off += e->o.max_batch_tokens) {
		int cnt = n - off < e->o.max_batch_tokens ? n - off : e->o.max_batch_tokens;
		rc = seq_prepare(e, seq, cnt);
		if (rc)
			return rc == -ENOSPC || rc == -ENOMEM ? rc : fail_dev(e, rc);
		int len = kvi_seq_len(seq), nb = kvi_seq_n_blocks(seq);
		const int32_t *bl = kvi_seq_blocks(seq);
		for (int i = 0; i < cnt; i++) {
			int p = len + i;
			META_IDS(e, e->hmeta)[i] = tokens[off + i];
			META_POS(e, e->hmeta)[i] = p;
			META_SLOTS(e, e->hmeta)[i] = bl[p / B] * B + p % B;
			META_LENS(e, e->hmeta)[i] = p + 1;
		}
		memcpy(META_TABLES(e, e->hmeta), bl, (size_t)nb * sizeof(int32_t));
		int want = off + cnt == n && logits_last;
		if ((rc = send_meta(e, (size_t)nb)) ||
		    (rc =
			 forward(e, cnt, 1, len, cnt - 1, want, logits_last, inject, ninject, off)))
			return fail_dev(e, rc);
		kvi_seq_advance(seq, cnt);
	}
	return 0;
}

int kvi_dev_engine_decode(struct kvi_dev_engine *e, struct kvi_seq *const *seqs,
			  const int32_t *tokens, int nseq, float *logits)
{
	if (e->broken)
		return -EIO;
	int rc = kvi_engine_check_decode(e->kv, e->c.n_vocab, e->o.max_ctx, seqs, tokens, nseq);
	if (rc)
		return rc;
	int B = e->o.block_tokens, MB = e->max_blocks;
	for (int off = 0; off < nseq; off += e->o.max_batch_tokens) {
		int cnt = nseq - off < e->o.max_batch_tokens ? nseq - off : e->o.max_batch_tokens;
		int32_t *tab = META_TABLES(e, e->hmeta);
		for (int i = 0; i < cnt; i++) {
			struct kvi_seq *s = seqs[off + i];
			rc = seq_prepare(e, s, 1);
			if (rc)
				return rc == -ENOSPC || rc == -ENOMEM ? rc : fail_dev(e, rc);
			int p = kvi_seq_len(s), nb = kvi_seq_n_blocks(s);
			const int32_t *bl = kvi_seq_blocks(s);
			META_IDS(e, e->hmeta)[i] = tokens[off + i];
			META_POS(e, e->hmeta)[i] = p;
			META_SLOTS(e, e->hmeta)[i] = bl[p / B] * B + p % B;
			META_LENS(e, e->hmeta)[i] = p + 1;
			memcpy(tab + (size_t)i * MB, bl, (size_t)nb * sizeof(int32_t));
			memset(tab + (size_t)i * MB + nb, 0, (size_t)(MB - nb) * sizeof(int32_t));
		}
		if ((rc = send_meta(e, (size_t)cnt * MB)) ||
		    (rc = forward(e, cnt, 0, 0, 0, logits ? cnt : 0,
				  logits ? logits + (size_t)off * e->c.n_vocab : NULL, NULL, 0, 0)))
			return fail_dev(e, rc);
		for (int i = 0; i < cnt; i++)
			kvi_seq_advance(seqs[off + i], 1);
	}
	return 0;
}

/* ---- NCCL ------------------------------------------------------------------------------- */

static int nccl_ready(const struct kvi_dev_engine *e)
{
	if (e->broken)
		return -EIO;
	return e->d.kind == KVK_DEV_CUDA && e->d.cu && kvk_nccl_available() ? 0 : -ENODEV;
}

static int ids_valid(const struct kvi_dev_engine *e, const int32_t *ids, int n)
{
	if (n < 0 || (n && !ids))
		return 0;
	for (int i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= e->o.kv_blocks)
			return 0;
	return 1;
}

int kvi_dev_engine_nccl_join(struct kvi_dev_engine *e, const uint8_t *id, int rank,
			     struct kvk_nccl **out)
{
	*out = NULL;
	int rc = nccl_ready(e);
	return rc ? rc : kvk_nccl_comm_create(out, e->d.cu, id, 2, rank);
}

int kvi_dev_engine_nccl_send(struct kvi_dev_engine *e, struct kvk_nccl *c, const int32_t *ids,
			     int n, int peer)
{
	int rc = nccl_ready(e);
	if (rc)
		return rc;
	if (!ids_valid(e, ids, n))
		return -EINVAL;
	/* blocks filled on the host (a cached prefix) that no pass has uploaded yet */
	struct run r = {0, 0, 1};
	for (int i = 0; i < n && !rc; i++)
		if (e->dev_gen[ids[i]] != kvi_kv_block_gen(e->kv, ids[i]))
			rc = run_add(e, &r, ids[i]);
	if (!rc)
		rc = run_flush(e, &r);
	if (rc) {
		e->broken = 1;
		return rc;
	}
	return kvk_nccl_send_kv(c, &e->layers, ids, n, peer);
}

int kvi_dev_engine_nccl_recv(struct kvi_dev_engine *e, struct kvk_nccl *c, const int32_t *ids,
			     int n, int peer)
{
	int rc = nccl_ready(e);
	if (rc)
		return rc;
	if (!ids_valid(e, ids, n))
		return -EINVAL;
	if ((rc = kvk_nccl_recv_kv(c, &e->layers, ids, n, peer)))
		return rc;
	for (int i = 0; i < n; i++) {
		e->dev_gen[ids[i]] = kvi_kv_block_gen(e->kv, ids[i]);
		e->host_ok[ids[i]] = 0;
	}
	return 0;
}
