/* vit_int — the tower's state shared by the CPU forward (vit.c) and the device forward
 * (vit_dev.c). Private to engine/. */
#ifndef KVFS_KVI_VIT_INT_H
#define KVFS_KVI_VIT_INT_H

#include "kvk.h"
#include "vit.h"

struct kvi_pool;
struct vit_dev;

struct vit_mat {
	enum kvk_wtype type;
	const void *data; /* rows of n (ne[0]) elements, in the mapping */
	size_t n, rows;
};

struct vit_blk {
	struct vit_mat q, k, v, o, up, down;
	float *bq, *bk, *bv, *bo, *bup, *bdown; /* NULL: no bias */
	float *ln1_w, *ln1_b, *ln2_w, *ln2_b;	/* weights required, biases optional */
};

struct vit {
	struct kvi_gguf *g;
	struct vit_info info;
	float mean[3], std[3];
	uint8_t fp[VIT_FINGERPRINT_BYTES];

	struct vit_mat patch, mm0, mm2;
	float *patch_b, *cls, *pos; /* pos: n_pos x n_embd */
	float *pre_w, *pre_b, *post_w, *post_b;
	float *mm0_b, *mm2_b;
	struct vit_blk *blk;

	/* forward state */
	struct kvi_pool *pool;
	enum kvk_isa isa;
	int n_threads;
	float *x, *h, *q, *k, *v, *a, *u, *col, *mid;
	float **scratch; /* per thread: matmul scratch */
	float **ascr;	 /* per thread: attention's head copies and scores */
	int has_q8;	 /* some matrix is Q8_0: act holds quantized activations */
	void *act;
	struct vit_dev *dev; /* vit_use_device: the forward runs there; NULL: CPU */
};

/* vit.c: gathers the patches of pixels into v->col (im2col, (c, y, x) order per patch) on
 * the tower's pool. */
void vit_im2col(struct vit *v, const float *pixels);

/* vit_dev.c: uploads the tower (weights as stored, vectors as f32) to a kvk_dev backend and
 * allocates its activations. 0, -EINVAL, -ENODEV, -ENOMEM, -EIO; *out freed by vit_dev_free. */
int vit_dev_create(struct vit *v, int backend, int device, struct vit_dev **out);
void vit_dev_free(struct vit_dev *d);
/* vit_encode's contract on the device; v->col is used as the im2col staging buffer. */
int vit_dev_encode(struct vit *v, const float *pixels, float *out_embd);
const char *vit_dev_backend(const struct vit_dev *d);

#endif
