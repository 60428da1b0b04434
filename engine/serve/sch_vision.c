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
#include "kvk_dev.h"
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
	/* the tower on the language model's device (--device host/cuda), so an image costs no
	 * CPU time beside a GPU model; its embeddings are within docs/vision.md's device
	 * tolerances of the CPU tower's, not bit-equal */
	if (s->o.device && (rc = vit_use_device(s->tower, s->o.device, s->o.gpu))) {
		klog_error("--mmproj %s: the tower on device %s: %s", s->o.mmproj,
			   s->o.device == KVK_DEV_CUDA ? "cuda" : "host", strerror(-rc));
		vit_free(s->tower);
		s->tower = NULL;
		return rc;
	}
	if (emb_tower_fp(s->tower, s->tower_fp)) {
		vit_free(s->tower);
		s->tower = NULL;
		return -EIO;
	}
	klog_info("vision tower %s: %d tokens per image, on %s", s->o.mmproj,
		  vit_n_tokens(s->tower), vit_backend(s->tower));
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

/* One image as the tokenizer sees it: where in the text, its placeholder count, its hash. */
struct vspan {
	size_t off;
	uint32_t n;
	const uint8_t *hash;
};

/* The prompt's tokens with each image's n placeholder tokens where its offset of the text
 * ends, as both serving forms build them (embedded: sch_vision_prepare; a prefill worker:
 * sch_vision_prepare_refs): r->toks / r->n, r->img (the spans), r->img_rows allocated for
 * nim x n x E floats (not filled). Every image has the same n (one tower). */
static int vision_tokenize(struct sch *s, struct sch_req *r, const char *prompt, int flags,
			   const struct vspan *im, int nim, int E)
{
	if (nim < 1 || nim > SCH_MAX_IMAGES)
		return -EINVAL;
	size_t len = strlen(prompt);
	uint32_t nt = im[0].n;
	for (int k = 0; k < nim; k++)
		if (im[k].off > len || (k && im[k].off < im[k - 1].off) || im[k].n != nt || !nt)
			return -EINVAL;
	size_t cap = len + 8 + (size_t)nim * nt;
	r->toks = malloc(cap * sizeof(int32_t));
	r->img = calloc((size_t)nim, sizeof(*r->img));
	r->img_rows = malloc((size_t)nim * nt * (size_t)E * sizeof(float));
	if (!r->toks || !r->img || !r->img_rows)
		return -ENOMEM;
	size_t n = 0, from = 0;
	for (int k = 0; k <= nim; k++) {
		size_t to = k < nim ? im[k].off : len, cnt = 0;
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
		r->img[k].n = nt;
		memcpy(r->img[k].hash, im[k].hash, KVB_HASH);
		for (uint32_t t = 0; t < nt; t++)
			r->toks[n++] = PLACEHOLDER_ID;
	}
	r->n = (int)n;
	r->nimg = nim;
	return r->n > s->o.max_ctx ? -E2BIG : 0;
}

int sch_vision_prepare(struct sch *s, struct sch_req *r, const char *prompt, int flags,
		       const struct sch_image *im, int nim)
{
	if (!s->tower || nim < 1 || nim > SCH_MAX_IMAGES)
		return -EINVAL;
	struct vspan sp[SCH_MAX_IMAGES];
	int nt = vit_n_tokens(s->tower), E = vit_n_embd_out(s->tower);
	for (int k = 0; k < nim; k++) {
		if (!im[k].img)
			return -EINVAL;
		sp[k] =
		    (struct vspan){.off = im[k].offset, .n = (uint32_t)nt, .hash = im[k].img->hash};
	}
	int rc = vision_tokenize(s, r, prompt, flags, sp, nim, E);
	for (int k = 0; !rc && k < nim; k++)
		rc = embed(s, im[k].img, r->salt, r->img_rows + (size_t)k * (size_t)nt * (size_t)E);
	return rc;
}

/* r's images' embeddings from the kv dir, where an encode worker saved them: a miss is an
 * error (-ENOENT), never an encode here. */
static int refs_load(struct sch *s, struct sch_req *r, const struct sch_image_ref *ref)
{
	if (!s->kx) {
		klog_warn("images need the kv dir their encoder saved them in (--kv-dir)");
		return -ENOENT;
	}
	int E = s->m->cfg.n_embd;
	uint8_t salt_d[KVB_HASH];
	kvb_salt_digest(r->salt, salt_d);
	for (int k = 0; k < r->nimg; k++) {
		uint32_t nt = r->img[k].n;
		int rc = kve_load(kvx_dir(s->kx), ref[k].tower_fp, salt_d, ref[k].hash, nt,
				  (uint32_t)E, r->img_rows + (size_t)k * nt * (size_t)E);
		if (rc) {
			klog_warn("image %d: no embeddings in the kv dir (%s)", k, strerror(-rc));
			return -ENOENT;
		}
		atomic_fetch_add(&s->c_emb_hits, 1);
	}
	return 0;
}

int sch_vision_prepare_refs(struct sch *s, struct sch_req *r, const char *prompt, int flags,
			    const struct sch_image_ref *ref, int nim)
{
	if (nim < 1 || nim > SCH_MAX_IMAGES)
		return -EINVAL;
	struct vspan sp[SCH_MAX_IMAGES];
	for (int k = 0; k < nim; k++)
		sp[k] =
		    (struct vspan){.off = ref[k].off, .n = ref[k].n_tokens, .hash = ref[k].hash};
	int rc = vision_tokenize(s, r, prompt, flags, sp, nim, s->m->cfg.n_embd);
	return rc ? rc : refs_load(s, r, ref);
}

int sch_vision_spans(struct sch *s, struct sch_req *r, const struct sch_image_ref *ref, int nim)
{
	if (nim < 1 || nim > SCH_MAX_IMAGES)
		return -EINVAL;
	int E = s->m->cfg.n_embd;
	uint32_t nt = ref[0].n_tokens;
	for (int k = 0; k < nim; k++)
		if (ref[k].n_tokens != nt || !nt || ref[k].off + (uint64_t)nt > (uint64_t)r->n ||
		    (k && ref[k].off < ref[k - 1].off + nt))
			return -EINVAL;
	r->img = calloc((size_t)nim, sizeof(*r->img));
	r->img_rows = malloc((size_t)nim * nt * (size_t)E * sizeof(float));
	if (!r->img || !r->img_rows)
		return -ENOMEM;
	for (int k = 0; k < nim; k++) {
		r->img[k].pos = (uint32_t)ref[k].off;
		r->img[k].n = nt;
		memcpy(r->img[k].hash, ref[k].hash, KVB_HASH);
	}
	r->nimg = nim;
	return refs_load(s, r, ref);
}

int sch_req_images(const struct sch_req *r, uint32_t *pos, int max)
{
	int n = r->nimg < max ? r->nimg : max;
	for (int k = 0; k < n; k++)
		pos[k] = r->img[k].pos;
	return n;
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
