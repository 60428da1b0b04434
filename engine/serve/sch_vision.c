/* sch_vision — images in FULL requests (issue 26, the embedded form): the tower of
 * sch_opts.mmproj, each image's placeholder tokens in the prompt, its embeddings from the kv
 * dir (engine/kve.h) or encoded here, and the image hashes in the KV block names (kvb.h).
 *
 * Encoding runs in sch_submit's caller (a connection thread), not on the scheduler thread, so
 * the running batch keeps decoding while an image is encoded; one encode at a time (the tower
 * has one set of buffers). Placeholder tokens are id 0: their input is the embedding, their id
 * only names the block, together with the image's hash. */
#define KVFS_LOG_TAG "sch"
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "emb.h"
#include "img.h"
#include "kve.h"
#include "log.h"
#include "metrics.h"
#include "sch_int.h"
#include "tok.h"
#include "vit.h"

#define PLACEHOLDER_ID 0

int sch_vision_open(struct sch *s)
{
	if (!s->o.mmproj || !*s->o.mmproj)
		return 0;
	char err[256] = "";
	int rc =
	    vit_load(s->o.mmproj, s->o.threads > 0 ? s->o.threads : 1, &s->tower, err, sizeof(err));
	if (rc) {
		klog_error("--mmproj %s: %s", s->o.mmproj, err[0] ? err : strerror(-rc));
		return rc;
	}
	if (vit_n_embd_out(s->tower) != s->m->cfg.n_embd) {
		klog_error(
		    "--mmproj %s: the projector makes %d-wide embeddings, the model takes %d",
		    s->o.mmproj, vit_n_embd_out(s->tower), s->m->cfg.n_embd);
		vit_free(s->tower);
		s->tower = NULL;
		return -EINVAL;
	}
	if (emb_tower_fp(s->tower, s->tower_fp)) {
		vit_free(s->tower);
		s->tower = NULL;
		return -EIO;
	}
	klog_info("vision tower %s: %d tokens per image", s->o.mmproj, vit_n_tokens(s->tower));
	return 0;
}

void sch_vision_close(struct sch *s)
{
	vit_free(s->tower);
	s->tower = NULL;
}

int sch_has_vision(const struct sch *s)
{
	return s->tower != NULL;
}

/* The embeddings of one image into rows: the kv dir's copy, else the tower's (then saved). */
static int embed(struct sch *s, const struct img_image *im, const char *salt, float *rows)
{
	struct emb_stat st = {0};
	atomic_fetch_add(&s->c_images, 1);
	int rc = emb_image(s->tower, &s->tower_mu, s->tower_fp, s->kx ? kvx_dir(s->kx) : NULL,
			   s->kx ? kvx_is_kvfs(s->kx) : 0, salt, im, rows, &st);
	if (rc)
		return rc;
	if (st.cached) {
		atomic_fetch_add(&s->c_emb_hits, 1);
	} else {
		atomic_fetch_add(&s->c_encode_ns, (unsigned long long)st.enc_ns);
		atomic_fetch_add(&s->c_encodes, 1);
	}
	return 0;
}

int sch_vision_prepare(struct sch *s, struct sch_req *r, const char *prompt, int flags,
		       const struct sch_image *im, int nim)
{
	if (!s->tower || nim < 1 || nim > SCH_MAX_IMAGES)
		return -EINVAL;
	size_t len = strlen(prompt);
	for (int k = 0; k < nim; k++)
		if (!im[k].img || im[k].offset > len || (k && im[k].offset < im[k - 1].offset))
			return -EINVAL;
	int nt = vit_n_tokens(s->tower), E = vit_n_embd_out(s->tower);
	size_t cap = len + 8 + (size_t)nim * (size_t)nt;
	r->toks = malloc(cap * sizeof(int32_t));
	r->img = calloc((size_t)nim, sizeof(*r->img));
	r->img_rows = malloc((size_t)nim * (size_t)nt * (size_t)E * sizeof(float));
	if (!r->toks || !r->img || !r->img_rows)
		return -ENOMEM;
	size_t n = 0, from = 0;
	for (int k = 0; k <= nim; k++) {
		size_t to = k < nim ? im[k].offset : len, cnt = 0;
		if (to > from) {
			int rc = kvi_tok_encode(s->tok, prompt + from, to - from, flags,
						r->toks + n, cap - n, &cnt);
			if (rc)
				return -EINVAL;
			n += cnt;
			flags &= ~KVI_TOK_ADD_BOS;
		}
		from = to;
		if (k == nim)
			break;
		r->img[k].pos = (uint32_t)n;
		r->img[k].n = (uint32_t)nt;
		memcpy(r->img[k].hash, im[k].img->hash, KVB_HASH);
		for (int t = 0; t < nt; t++)
			r->toks[n++] = PLACEHOLDER_ID;
	}
	r->n = (int)n;
	r->nimg = nim;
	if (r->n > s->o.max_ctx)
		return -E2BIG;
	for (int k = 0; k < nim; k++) {
		int rc =
		    embed(s, im[k].img, r->salt, r->img_rows + (size_t)k * (size_t)nt * (size_t)E);
		if (rc)
			return rc;
	}
	return 0;
}

int sch_vision_inject(const struct sch_req *r, int pos, int n, struct kvi_inject *out)
{
	if (!r->nimg)
		return 0;
	int E = r->s->m->cfg.n_embd, got = 0;
	long end = (long)pos + n;
	for (int k = 0; k < r->nimg; k++) {
		long a = r->img[k].pos, b = a + r->img[k].n;
		long from = a > pos ? a : pos, to = b < end ? b : end;
		if (from >= to)
			continue;
		out[got++] = (struct kvi_inject){
		    .pos = (int)(from - pos),
		    .n = (int)(to - from),
		    .rows =
			r->img_rows + ((size_t)k * r->img[k].n + (size_t)(from - a)) * (size_t)E};
	}
	return got;
}

int sch_kvx_load(struct sch *s, struct sch_req *r, int n, int *cached)
{
	*cached = 0;
	if (!s->kx)
		return 0;
	/* only the images inside the tokens looked up name blocks here; one running past n is
	 * left out with every token from its start (the blocks looked up then end before it) */
	int ni = 0;
	while (ni < r->nimg && r->img[ni].pos < (uint32_t)n) {
		if ((long)r->img[ni].pos + r->img[ni].n > n) {
			n = (int)r->img[ni].pos + 1;
			break;
		}
		ni++;
	}
	return kvx_load_prefix_images(s->kx, r->seq, r->toks, n, r->salt, r->img, ni, cached);
}

void sch_kvx_save(struct sch *s, struct sch_req *r)
{
	if (s->kx)
		kvx_save_images(s->kx, r->seq, r->toks, r->n, r->salt, r->img, r->nimg);
}

void sch_vision_metrics(struct sch *s, struct met_out *o)
{
	if (!s->tower)
		return;
	static const struct {
		const char *name, *help;
	} f[] = {
	    {"vision_images_total", "Images in requests, each counted once per request"},
	    {"vision_encodes_total", "Images the vision tower encoded (not found in the kv dir)"},
	    {"vision_embedding_cache_hits_total",
	     "Images whose embeddings came from the kv dir, with no encoding"},
	    {"vision_encode_seconds_total",
	     "Time spent encoding images, waits for the tower included"},
	};
	double v[4] = {(double)atomic_load(&s->c_images), (double)atomic_load(&s->c_encodes),
		       (double)atomic_load(&s->c_emb_hits),
		       (double)atomic_load(&s->c_encode_ns) / 1e9};
	for (int i = 0; i < 4; i++) {
		met_out_family(o, f[i].name, "counter", f[i].help);
		met_out_sample(o, f[i].name, NULL, v[i]);
	}
}
