/* vit_dev — the vision tower's forward on a kvk_dev backend (vit.h: vit_use_device): the same
 * steps as vit_encode's CPU forward, each a device op (docs/vision.md, "Device path"). */
#define KVFS_LOG_TAG "vit"
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvk_dev.h"
#include "log.h"
#include "vit_int.h"

/* A weight matrix on the device: rows of n elements of type dt, as stored in the file. */
struct dmat {
	enum kvk_dtype dt;
	int n, rows;
	const void *p;
};

struct dblk {
	struct dmat q, k, v, o, up, down;
	const float *bq, *bk, *bv, *bo, *bup, *bdown; /* NULL: no bias */
	const float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
};

struct vit_dev {
	struct kvk_dev d;
	int broken;		 /* a device error happened: refuse further work */
	struct kvk_dev_arena ar; /* every device buffer */
	/* weights */
	struct dmat patch, mm0, mm2;
	const float *patch_b, *cls, *pos, *pre_w, *pre_b, *post_w, *post_b, *mm0_b, *mm2_b;
	struct dblk *blk;
	/* activations: T = patches (+ class token) rows */
	float *col;	      /* (NP, 3 p p) the im2col'd patches, uploaded */
	float *h;	      /* (T, E) residual stream */
	float *x;	      /* (T, E) normed input / projection output */
	float *q, *k, *v, *a; /* (T, E) */
	float *u;	      /* (T, F) */
	float *pin;	      /* (NP, E) the projector's input (the patch rows of h) */
	float *mid;	      /* (NP, H) */
	float *out;	      /* (NP, O) */
	void *act16;	      /* f16/bf16 GEMM input, the widest of the above */
};

static void *dalloc(struct vit_dev *D, size_t bytes, int *rc)
{
	return kvk_arena_alloc(&D->ar, bytes, rc);
}

static const void *upload(struct vit_dev *D, const void *src, size_t bytes, int *rc)
{
	return kvk_arena_upload(&D->ar, src, bytes, rc);
}

/* An f32 vector of the CPU tower (already converted at load); NULL stays NULL. */
static const float *up_vec(struct vit_dev *D, const float *h, size_t n, int *rc)
{
	return h ? upload(D, h, n * sizeof(float), rc) : NULL;
}

static void up_mat(struct vit_dev *D, const struct vit_mat *m, struct dmat *out, int *rc)
{
	out->dt = (enum kvk_dtype)m->type;
	out->n = (int)m->n;
	out->rows = (int)m->rows;
	out->p = upload(D, m->data, kvk_row_bytes(m->type, m->n) * m->rows, rc);
}

const char *vit_dev_backend(const struct vit_dev *D)
{
	return D->d.op->name;
}

void vit_dev_free(struct vit_dev *D)
{
	if (!D)
		return;
	kvk_arena_free(&D->ar);
	kvk_dev_close(&D->d);
	free(D->blk);
	free(D);
}

static size_t maxz(size_t a, size_t b)
{
	return a > b ? a : b;
}

int vit_dev_create(struct vit *v, int backend, int device, struct vit_dev **out)
{
	*out = NULL;
	const struct vit_info *I = &v->info;
	if (backend != KVK_DEV_HOST && backend != KVK_DEV_CUDA)
		return -EINVAL;
	if (I->n_embd / I->n_head > 256) {
		klog_error("vision tower: head_dim %d (the device attention takes <= 256)",
			   I->n_embd / I->n_head);
		return -EINVAL;
	}
	struct vit_dev *D = calloc(1, sizeof(*D));
	if (!D)
		return -ENOMEM;
	D->ar.d = &D->d;
	int rc = kvk_dev_open(&D->d, (enum kvk_dev_kind)backend, device);
	if (rc) {
		if (rc == -ENODEV)
			klog_error("vision tower: backend cuda: no GPU %d%s", device,
				   kvk_cuda_device_count() ? "" : " (or no CUDA in this build)");
		free(D);
		return rc;
	}
	D->blk = calloc((size_t)I->n_layer_run + 1, sizeof(*D->blk));
	if (!D->blk) {
		vit_dev_free(D);
		return -ENOMEM;
	}
	size_t E = (size_t)I->n_embd, F = (size_t)I->n_ff, NP = (size_t)I->n_patches;
	size_t T = NP + (size_t)I->has_class, K = (size_t)(3 * I->patch_size * I->patch_size);
	size_t Hm = (size_t)I->n_mm_hidden, O = (size_t)I->n_embd_out;
	up_mat(D, &v->patch, &D->patch, &rc);
	up_mat(D, &v->mm0, &D->mm0, &rc);
	up_mat(D, &v->mm2, &D->mm2, &rc);
	D->patch_b = up_vec(D, v->patch_b, E, &rc);
	D->cls = up_vec(D, v->cls, E, &rc);
	D->pos = up_vec(D, v->pos, T * E, &rc);
	D->pre_w = up_vec(D, v->pre_w, E, &rc);
	D->pre_b = up_vec(D, v->pre_b, E, &rc);
	D->post_w = up_vec(D, v->post_w, E, &rc);
	D->post_b = up_vec(D, v->post_b, E, &rc);
	D->mm0_b = up_vec(D, v->mm0_b, Hm, &rc);
	D->mm2_b = up_vec(D, v->mm2_b, O, &rc);
	/* only the blocks the forward runs (the last one is checked at load, never used) */
	for (int l = 0; l < I->n_layer_run && !rc; l++) {
		const struct vit_blk *b = &v->blk[l];
		struct dblk *db = &D->blk[l];
		up_mat(D, &b->q, &db->q, &rc);
		up_mat(D, &b->k, &db->k, &rc);
		up_mat(D, &b->v, &db->v, &rc);
		up_mat(D, &b->o, &db->o, &rc);
		up_mat(D, &b->up, &db->up, &rc);
		up_mat(D, &b->down, &db->down, &rc);
		db->bq = up_vec(D, b->bq, E, &rc);
		db->bk = up_vec(D, b->bk, E, &rc);
		db->bv = up_vec(D, b->bv, E, &rc);
		db->bo = up_vec(D, b->bo, E, &rc);
		db->bup = up_vec(D, b->bup, F, &rc);
		db->bdown = up_vec(D, b->bdown, E, &rc);
		db->ln1_w = up_vec(D, b->ln1_w, E, &rc);
		db->ln1_b = up_vec(D, b->ln1_b, E, &rc);
		db->ln2_w = up_vec(D, b->ln2_w, E, &rc);
		db->ln2_b = up_vec(D, b->ln2_b, E, &rc);
	}
	D->col = dalloc(D, NP * K * 4, &rc);
	D->h = dalloc(D, T * E * 4, &rc);
	D->x = dalloc(D, T * E * 4, &rc);
	D->q = dalloc(D, T * E * 4, &rc);
	D->k = dalloc(D, T * E * 4, &rc);
	D->v = dalloc(D, T * E * 4, &rc);
	D->a = dalloc(D, T * E * 4, &rc);
	D->u = dalloc(D, T * F * 4, &rc);
	D->pin = dalloc(D, NP * E * 4, &rc);
	D->mid = dalloc(D, NP * Hm * 4, &rc);
	D->out = dalloc(D, NP * O * 4, &rc);
	size_t wide = maxz(maxz(NP * K, T * E), maxz(T * F, NP * Hm));
	D->act16 = dalloc(D, wide * 2, &rc);
	if (!rc)
		rc = D->d.op->sync(&D->d);
	if (rc) {
		vit_dev_free(D);
		return rc;
	}
	klog_info("vision tower on %s: %.1f MiB of device memory", D->d.op->name,
		  (double)D->ar.bytes / 1048576.0);
	*out = D;
	return 0;
}

/* ---- forward ------------------------------------------------------------------------------ */

#define CK(call)                                                                                   \
	do {                                                                                       \
		int rc_ = (call);                                                                  \
		if (rc_)                                                                           \
			return rc_;                                                                \
	} while (0)

/* y (ntok, w->rows) = x (ntok, w->n) W^T (+ b). *conv says x is already in act16 as w->dt
 * (Q, K and V share one conversion); the caller resets it when x changes. F16/BF16 weights
 * take their activations converted to that type (cuBLAS on tensor cores), F32 runs in f32,
 * Q8_0 dequantizes the weights against f32 activations (as the device engine does). */
static int linear(struct vit_dev *D, float *y, const struct dmat *w, const float *x, int ntok,
		  const float *b, int *conv)
{
	const struct kvk_dev_ops *op = D->d.op;
	switch (w->dt) {
	case KVK_DT_F16:
	case KVK_DT_BF16:
		if (*conv != (int)w->dt)
			CK(op->convert(&D->d, D->act16, w->dt, x, (size_t)ntok * (size_t)w->n));
		*conv = (int)w->dt;
		CK(op->gemm(&D->d, y, D->act16, w->p, w->dt, ntok, w->rows, w->n));
		break;
	case KVK_DT_F32:
		CK(op->gemm(&D->d, y, x, w->p, KVK_DT_F32, ntok, w->rows, w->n));
		break;
	case KVK_DT_Q8_0:
		CK(op->q8_0_gemv(&D->d, y, w->p, x, w->rows, w->n, ntok));
		break;
	default:
		return -EINVAL; /* the loader admits nothing else */
	}
	return b ? op->add_bias(&D->d, y, b, (size_t)w->rows, (size_t)ntok) : 0;
}

static int forward(struct vit *v, struct vit_dev *D, const float *pixels, float *out_embd)
{
	const struct kvk_dev_ops *op = D->d.op;
	struct kvk_dev *d = &D->d;
	const struct vit_info *I = &v->info;
	size_t E = (size_t)I->n_embd, NP = (size_t)I->n_patches, C = (size_t)I->has_class;
	size_t T = NP + C, K = (size_t)(3 * I->patch_size * I->patch_size);
	int H = I->n_head, hd = I->n_embd / I->n_head, nt = (int)T, np = (int)NP;
	float scale = 1.0f / sqrtf((float)hd);
	int conv = 0;
	/* im2col on the host: a permutation of the pixels, the same bytes to upload either way */
	vit_im2col(v, pixels);
	CK(op->h2d(d, D->col, v->col, NP * K * sizeof(float)));
	/* patch embedding into rows C.., the class token in row 0, then the position rows */
	CK(linear(D, D->h + C * E, &D->patch, D->col, np, D->patch_b, &conv));
	if (C)
		CK(op->d2d(d, D->h, D->cls, E * sizeof(float)));
	CK(op->add(d, D->h, D->pos, T * E));
	if (D->pre_w)
		CK(op->layernorm(d, D->h, D->h, D->pre_w, D->pre_b, E, T, I->eps));
	for (int l = 0; l < I->n_layer_run; l++) {
		const struct dblk *b = &D->blk[l];
		CK(op->layernorm(d, D->x, D->h, b->ln1_w, b->ln1_b, E, T, I->eps));
		conv = 0;
		CK(linear(D, D->q, &b->q, D->x, nt, b->bq, &conv));
		CK(linear(D, D->k, &b->k, D->x, nt, b->bk, &conv));
		CK(linear(D, D->v, &b->v, D->x, nt, b->bv, &conv));
		CK(op->attn_dense(d, D->a, D->q, D->k, D->v, nt, H, hd, scale));
		conv = 0;
		CK(linear(D, D->x, &b->o, D->a, nt, b->bo, &conv));
		CK(op->add(d, D->h, D->x, T * E));
		CK(op->layernorm(d, D->x, D->h, b->ln2_w, b->ln2_b, E, T, I->eps));
		conv = 0;
		CK(linear(D, D->u, &b->up, D->x, nt, b->bup, &conv));
		CK(op->gelu(d, D->u, D->u, T * (size_t)I->n_ff, I->gelu_quick));
		conv = 0;
		CK(linear(D, D->x, &b->down, D->u, nt, b->bdown, &conv));
		CK(op->add(d, D->h, D->x, T * E));
	}
	if (D->post_w)
		CK(op->layernorm(d, D->h, D->h, D->post_w, D->post_b, E, T, I->eps));
	/* the projector sees the patch tokens only, from their own buffer (aligned for the
	 * Q8_0 kernel's vector loads whatever E is) */
	CK(op->d2d(d, D->pin, D->h + C * E, NP * E * sizeof(float)));
	conv = 0;
	CK(linear(D, D->mid, &D->mm0, D->pin, np, D->mm0_b, &conv));
	CK(op->gelu(d, D->mid, D->mid, NP * (size_t)I->n_mm_hidden, 0));
	conv = 0;
	CK(linear(D, D->out, &D->mm2, D->mid, np, D->mm2_b, &conv));
	CK(op->sync(d));
	return op->d2h(d, out_embd, D->out, NP * (size_t)I->n_embd_out * sizeof(float));
}

int vit_dev_encode(struct vit *v, const float *pixels, float *out_embd)
{
	struct vit_dev *D = v->dev;
	if (D->broken)
		return -EIO;
	int rc = forward(v, D, pixels, out_embd);
	if (rc) {
		klog_error("vision tower on %s: %d", D->d.op->name, rc);
		if (rc != -EINVAL)
			D->broken = 1;
		return rc;
	}
	size_t n = (size_t)v->info.n_patches * (size_t)v->info.n_embd_out;
	for (size_t i = 0; i < n; i++)
		if (!isfinite(out_embd[i]))
			return -ERANGE;
	return 0;
}
