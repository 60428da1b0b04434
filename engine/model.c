/* model — turns a validated GGUF into a kvi_model: reads the architecture's hyper-parameters,
 * checks every tensor the forward pass uses against them (type, shape, alignment) and hashes
 * the result into the model fingerprint. */
#include "model.h"

#include "gguf.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include <openssl/evp.h>

size_t kvi_dtype_row_bytes(enum kvi_dtype t, int64_t n)
{
	if (n <= 0 || n > ((int64_t)1 << 40))
		return 0;
	switch (t) {
	case KVI_F32:
		return (size_t)n * 4;
	case KVI_F16:
	case KVI_BF16:
		return (size_t)n * 2;
	case KVI_Q8_0:
		return n % KVI_Q8_0_BLOCK ? 0 : (size_t)(n / KVI_Q8_0_BLOCK) * KVI_Q8_0_BYTES;
	case KVI_Q4_0:
		return n % 32 ? 0 : (size_t)(n / 32) * 18;
	case KVI_Q5_0:
		return n % 32 ? 0 : (size_t)(n / 32) * 22;
	case KVI_Q5_1:
		return n % 32 ? 0 : (size_t)(n / 32) * 24;
	case KVI_Q4_K:
		return n % 256 ? 0 : (size_t)(n / 256) * 144;
	case KVI_Q5_K:
		return n % 256 ? 0 : (size_t)(n / 256) * 176;
	case KVI_Q6_K:
		return n % 256 ? 0 : (size_t)(n / 256) * 210;
	}
	return 0;
}

int kvi_model_init_empty(const struct kvi_config *cfg, struct kvi_model **out)
{
	if (!cfg || cfg->n_layer < 0 || !out)
		return -EINVAL;
	struct kvi_model *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->cfg = *cfg;
	if (cfg->n_layer) {
		m->layers = calloc((size_t)cfg->n_layer, sizeof(*m->layers));
		if (!m->layers) {
			free(m);
			return -ENOMEM;
		}
	}
	*out = m;
	return 0;
}

void kvi_model_free(struct kvi_model *m)
{
	if (!m)
		return;
	kvi_gguf_close(m->priv);
	free(m->layers);
	free(m);
}

const struct kvi_gguf *kvi_model_gguf(const struct kvi_model *m)
{
	return m ? m->priv : NULL;
}

/* ---- fingerprint ----
 * A two-level SHA-256 so the weights hash in parallel: every tensor's bytes are cut into 64 MiB
 * chunks, each chunk is hashed on its own (worker threads), and the fingerprint is the SHA-256
 * of the header, then per tensor of name, type, shape, size and its chunk digests. docs/gguf.md
 * gives the exact layout. */

#define FP_CHUNK   ((size_t)64 << 20)
#define FP_THREADS 8

struct fp {
	EVP_MD_CTX *c;
	int bad;
};

struct fp_item {
	const uint8_t *p;
	size_t n;
	uint8_t md[32];
};

struct fp_job {
	struct fp_item *items;
	size_t n, fill;
	atomic_size_t next;
	atomic_int bad;
	struct fp *top; /* pass 3: the top-level digest */
	int pass;	/* 1 count, 2 collect, 3 hash */
};

static void fp_put(struct fp *f, const void *p, size_t n)
{
	if (!f->bad && n && EVP_DigestUpdate(f->c, p, n) != 1)
		f->bad = 1;
}

static void fp_i32(struct fp *f, int32_t v)
{
	fp_put(f, &v, 4);
}

static size_t n_chunks(const struct kvi_tensor *t)
{
	return t->data && t->nbytes ? (t->nbytes + FP_CHUNK - 1) / FP_CHUNK : 0;
}

static int fp_cb(void *ctx, const char *name, struct kvi_tensor *t, int kind)
{
	struct fp_job *j = ctx;
	size_t nc = n_chunks(t);
	(void)kind;
	if (j->pass == 1) {
		j->n += nc;
	} else if (j->pass == 2) {
		for (size_t c = 0; c < nc; c++) {
			size_t off = c * FP_CHUNK, len = t->nbytes - off;
			j->items[j->fill++] = (struct fp_item){
			    (const uint8_t *)t->data + off, len < FP_CHUNK ? len : FP_CHUNK, {0}};
		}
	} else {
		uint32_t type = (uint32_t)t->type;
		uint64_t nb = t->data ? t->nbytes : 0;
		fp_put(j->top, name, strlen(name) + 1);
		fp_put(j->top, &type, 4);
		fp_put(j->top, t->ne, sizeof(t->ne));
		fp_put(j->top, &nb, 8);
		for (size_t c = 0; c < nc; c++)
			fp_put(j->top, j->items[j->fill++].md, 32);
	}
	return 0;
}

static void *fp_worker(void *arg)
{
	struct fp_job *j = arg;
	for (;;) {
		size_t i = atomic_fetch_add(&j->next, 1);
		if (i >= j->n)
			break;
		unsigned int len = 0;
		if (EVP_Digest(j->items[i].p, j->items[i].n, j->items[i].md, &len, EVP_sha256(),
			       NULL) != 1 ||
		    len != 32)
			atomic_store(&j->bad, 1);
	}
	return NULL;
}

/* Calls fn for every tensor the forward pass uses, in the canonical (fingerprint) order. */
static int each_tensor(struct kvi_model *m,
		       int (*fn)(void *ctx, const char *name, struct kvi_tensor *t, int kind),
		       void *ctx);

enum { K_MAT = 0, K_NORM = 1, K_BIAS = 2, K_EMBD = 3, K_OUT = 4, K_FREQ = 5 };

int kvi_model_compute_fingerprint(struct kvi_model *m)
{
	struct fp_job j = {.pass = 1};
	atomic_init(&j.next, 0);
	atomic_init(&j.bad, 0);
	each_tensor(m, fp_cb, &j);
	j.items = calloc(j.n ? j.n : 1, sizeof(*j.items));
	if (!j.items)
		return -ENOMEM;
	j.pass = 2;
	each_tensor(m, fp_cb, &j);
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	size_t nt = cpus > 1 ? (size_t)cpus : 1;
	if (nt > FP_THREADS)
		nt = FP_THREADS;
	if (nt > j.n)
		nt = j.n ? j.n : 1;
	pthread_t th[FP_THREADS];
	size_t started = 0;
	for (size_t i = 1; i < nt; i++)
		if (pthread_create(&th[started], NULL, fp_worker, &j) == 0)
			started++;
	fp_worker(&j);
	for (size_t i = 0; i < started; i++)
		pthread_join(th[i], NULL);

	struct fp f = {.c = EVP_MD_CTX_new(), .bad = atomic_load(&j.bad)};
	if (!f.c) {
		free(j.items);
		return -ENOMEM;
	}
	const struct kvi_config *c = &m->cfg;
	char arch[32] = {0};
	memcpy(arch, c->arch, sizeof(arch) - 1);
	if (EVP_DigestInit_ex(f.c, EVP_sha256(), NULL) != 1)
		f.bad = 1;
	fp_put(&f, "kvfs-model-fp-v1", 17);
	fp_put(&f, arch, sizeof(arch));
	int32_t ints[] = {c->n_layer,	   c->n_embd,	  c->n_ff,
			  c->n_head,	   c->n_head_kv,  c->head_dim,
			  c->rope_dim,	   c->n_vocab,	  (int32_t)c->rope_style,
			  c->has_qkv_bias, c->tied_output};
	for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
		fp_i32(&f, ints[i]);
	fp_put(&f, &c->rope_base, 4);
	fp_put(&f, &c->rms_eps, 4);
	j.pass = 3;
	j.fill = 0;
	j.top = &f;
	each_tensor(m, fp_cb, &j);
	unsigned int n = 0;
	if (!f.bad && EVP_DigestFinal_ex(f.c, m->fingerprint, &n) != 1)
		f.bad = 1;
	EVP_MD_CTX_free(f.c);
	free(j.items);
	return f.bad || n != 32 ? -EIO : 0;
}

static int each_tensor(struct kvi_model *m,
		       int (*fn)(void *ctx, const char *name, struct kvi_tensor *t, int kind),
		       void *ctx)
{
	int ret;
	char nm[96];
	if ((ret = fn(ctx, "token_embd.weight", &m->tok_embd, K_EMBD)) ||
	    (ret = fn(ctx, "output_norm.weight", &m->out_norm, K_NORM)))
		return ret;
	if (!m->cfg.tied_output && (ret = fn(ctx, "output.weight", &m->output, K_OUT)))
		return ret;
	static const struct {
		const char *name;
		size_t off;
		int kind;
	} L[] = {
	    {"attn_norm.weight", offsetof(struct kvi_layer, attn_norm), K_NORM},
	    {"attn_q.weight", offsetof(struct kvi_layer, wq), K_MAT},
	    {"attn_k.weight", offsetof(struct kvi_layer, wk), K_MAT},
	    {"attn_v.weight", offsetof(struct kvi_layer, wv), K_MAT},
	    {"attn_output.weight", offsetof(struct kvi_layer, wo), K_MAT},
	    {"attn_q.bias", offsetof(struct kvi_layer, bq), K_BIAS},
	    {"attn_k.bias", offsetof(struct kvi_layer, bk), K_BIAS},
	    {"attn_v.bias", offsetof(struct kvi_layer, bv), K_BIAS},
	    {"ffn_norm.weight", offsetof(struct kvi_layer, ffn_norm), K_NORM},
	    {"ffn_gate.weight", offsetof(struct kvi_layer, w_gate), K_MAT},
	    {"ffn_up.weight", offsetof(struct kvi_layer, w_up), K_MAT},
	    {"ffn_down.weight", offsetof(struct kvi_layer, w_down), K_MAT},
	};
	/* optional: the loader marks its presence with ne[0] != 0 before calling us */
	if (m->rope_freqs.ne[0] && (ret = fn(ctx, "rope_freqs.weight", &m->rope_freqs, K_FREQ)))
		return ret;
	for (int l = 0; l < m->cfg.n_layer; l++) {
		for (size_t i = 0; i < sizeof(L) / sizeof(L[0]); i++) {
			if (L[i].kind == K_BIAS && !m->cfg.has_qkv_bias)
				continue;
			snprintf(nm, sizeof(nm), "blk.%d.%s", l, L[i].name);
			struct kvi_tensor *t =
			    (struct kvi_tensor *)((char *)&m->layers[l] + L[i].off);
			if ((ret = fn(ctx, nm, t, L[i].kind)))
				return ret;
		}
	}
	return 0;
}

/* ---- loading ---- */

struct ld {
	const struct kvi_gguf *g;
	struct kvi_model *m;
	char *err;
	size_t errlen;
};

static int lfail(struct ld *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int lfail(struct ld *l, const char *fmt, ...)
{
	if (l->err && l->errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(l->err, l->errlen, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

/* {arch}.suffix as a positive int in [lo, hi]; def < 0 means required. */
static int get_int(struct ld *l, const char *suffix, int def, int lo, int hi, int *out)
{
	char key[128];
	snprintf(key, sizeof(key), "%s.%s", l->m->cfg.arch, suffix);
	uint32_t v;
	int ret = kvi_gguf_get_u32(l->g, key, &v);
	if (ret == -ENOENT && def >= 0) {
		*out = def;
		return 0;
	}
	if (ret == -ENOENT)
		return lfail(l, "missing required key '%s'", key);
	if (ret == -EINVAL)
		return lfail(l, "key '%s' is not an integer (per-layer arrays are not supported)",
			     key);
	if (ret)
		return lfail(l, "key '%s' is negative or larger than 2^32 (allowed: [%d, %d])", key,
			     lo, hi);
	if (v < (uint32_t)lo || v > (uint32_t)hi)
		return lfail(l, "key '%s' = %u out of range [%d, %d]", key, v, lo, hi);
	*out = (int)v;
	return 0;
}

static int get_float(struct ld *l, const char *suffix, float def, float lo, float hi, float *out)
{
	char key[128];
	snprintf(key, sizeof(key), "%s.%s", l->m->cfg.arch, suffix);
	float v;
	int ret = kvi_gguf_get_f32(l->g, key, &v);
	if (ret == -ENOENT && def >= 0) {
		*out = def;
		return 0;
	}
	if (ret == -ENOENT)
		return lfail(l, "missing required key '%s'", key);
	if (ret)
		return lfail(l, "key '%s' is not a float", key);
	if (!isfinite(v) || v <= lo || v > hi)
		return lfail(l, "key '%s' = %g out of range (%g, %g]", key, v, lo, hi);
	*out = v;
	return 0;
}

static int read_config(struct ld *l)
{
	struct kvi_config *c = &l->m->cfg;
	int ret = kvi_gguf_get_strcpy(l->g, "general.architecture", c->arch, sizeof(c->arch));
	if (ret == -ENOENT)
		return lfail(l, "missing required key 'general.architecture'");
	if (ret)
		return lfail(l, "key 'general.architecture' is not a short string");
	if (!strcmp(c->arch, "llama")) {
		c->rope_style = KVI_ROPE_ADJACENT;
	} else if (!strcmp(c->arch, "qwen2")) {
		c->rope_style = KVI_ROPE_HALVES;
		c->has_qkv_bias = 1;
	} else {
		return lfail(l, "unsupported architecture '%s' (supported: llama, qwen2)", c->arch);
	}
	const int BIG = 1 << 20;
	if ((ret = get_int(l, "block_count", -1, 1, 4096, &c->n_layer)) ||
	    (ret = get_int(l, "embedding_length", -1, 1, BIG, &c->n_embd)) ||
	    (ret = get_int(l, "feed_forward_length", -1, 1, BIG, &c->n_ff)) ||
	    (ret = get_int(l, "attention.head_count", -1, 1, 4096, &c->n_head)) ||
	    (ret = get_int(l, "attention.head_count_kv", c->n_head, 1, 4096, &c->n_head_kv)) ||
	    (ret = get_int(l, "context_length", -1, 1, INT32_MAX, &c->n_ctx_train)))
		return ret;
	if (c->n_head % c->n_head_kv)
		return lfail(l, "%s.attention.head_count_kv = %d does not divide head_count = %d",
			     c->arch, c->n_head_kv, c->n_head);
	int hd = c->n_embd % c->n_head ? 0 : c->n_embd / c->n_head;
	if ((ret = get_int(l, "attention.key_length", hd, 2, 65536, &c->head_dim)))
		return ret;
	if (c->head_dim == 0)
		return lfail(l,
			     "%s.embedding_length %d is not a multiple of head_count %d and "
			     "attention.key_length is absent",
			     c->arch, c->n_embd, c->n_head);
	int vl;
	if ((ret = get_int(l, "attention.value_length", c->head_dim, 1, 65536, &vl)))
		return ret;
	if (vl != c->head_dim)
		return lfail(l, "%s.attention.value_length %d != key_length %d (unsupported)",
			     c->arch, vl, c->head_dim);
	if (c->head_dim % 2)
		return lfail(l, "head dimension %d is odd", c->head_dim);
	if ((ret = get_int(l, "rope.dimension_count", c->head_dim, 2, c->head_dim, &c->rope_dim)))
		return ret;
	if (c->rope_dim % 2)
		return lfail(l, "%s.rope.dimension_count %d is odd", c->arch, c->rope_dim);
	if ((ret = get_float(l, "rope.freq_base", 10000.0f, 0.0f, 1e12f, &c->rope_base)) ||
	    (ret =
		 get_float(l, "attention.layer_norm_rms_epsilon", -1.0f, 0.0f, 1.0f, &c->rms_eps)))
		return ret;
	return 0;
}

static const char *tname(uint32_t t)
{
	const char *n = kvi_gguf_type_name(t);
	return n ? n : "?";
}

/* Finds and checks one tensor: shape (ne0, ne1) with any trailing dims 1, allowed types. */
static int take(struct ld *l, const char *name, struct kvi_tensor *dst, int kind, int optional)
{
	const struct kvi_gguf_tensor *t = kvi_gguf_find_tensor(l->g, name);
	if (!t) {
		if (optional)
			return 1;
		return lfail(l, "missing tensor '%s'", name);
	}
	int is_vec = kind == K_NORM || kind == K_BIAS || kind == K_FREQ;
	/* llama.cpp writes vectors as F32; the forward pass converts F16/BF16 ones once */
	int float_type = t->type == KVI_F32 || t->type == KVI_F16 || t->type == KVI_BF16;
	int block_type = t->type == KVI_Q8_0 || t->type == KVI_Q4_0 || t->type == KVI_Q5_0 ||
			 t->type == KVI_Q5_1 || t->type == KVI_Q4_K || t->type == KVI_Q5_K ||
			 t->type == KVI_Q6_K;
	if (!float_type && (is_vec || !block_type))
		return lfail(l, "tensor '%s': type %s not supported here (%s)", name,
			     tname(t->type),
			     is_vec ? "norms and biases must be F32, F16 or BF16"
				    : "weights must be F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q5_1, "
				      "Q4_K, Q5_K or Q6_K");
	if (t->ne[2] != 1 || t->ne[3] != 1 || (is_vec && t->ne[1] != 1))
		return lfail(l, "tensor '%s': has %u dimensions, expected %d", name, t->n_dims,
			     is_vec ? 1 : 2);
	dst->type = (enum kvi_dtype)t->type;
	dst->ne[0] = t->ne[0];
	dst->ne[1] = t->ne[1];
	dst->data = t->data;
	dst->nbytes = t->nbytes;
	size_t al = t->type == KVI_F32 ? 4 : 2;
	if ((uintptr_t)t->data % al)
		return lfail(l, "tensor '%s': data is not %zu-byte aligned", name, al);
	return 0;
}

static int check_shape(struct ld *l, const char *name, const struct kvi_tensor *t, int64_t ne0,
		       int64_t ne1)
{
	if (t->ne[0] != ne0 || t->ne[1] != ne1)
		return lfail(l, "tensor '%s': shape (%lld, %lld), expected (%lld, %lld)", name,
			     (long long)t->ne[0], (long long)t->ne[1], (long long)ne0,
			     (long long)ne1);
	return 0;
}

/* each_tensor callback: take + the expected shape for that tensor. */
static int load_cb(void *ctx, const char *name, struct kvi_tensor *t, int kind)
{
	struct ld *l = ctx;
	const struct kvi_config *c = &l->m->cfg;
	int ret = take(l, name, t, kind, 0);
	if (ret)
		return ret;
	int64_t q = (int64_t)c->n_head * c->head_dim, kv = (int64_t)c->n_head_kv * c->head_dim;
	/* "blk.N.attn_q.weight" -> "attn_q.weight" (each_tensor makes the names, so the dot
	 * after N is always there). */
	const char *base = strncmp(name, "blk.", 4) ? name : strchr(name + 4, '.') + 1;
	int64_t e0 = c->n_embd, e1 = 1;
	if (kind == K_EMBD || kind == K_OUT) {
		e1 = c->n_vocab;
	} else if (kind == K_FREQ) {
		e0 = c->rope_dim / 2;
	} else if (!strcmp(base, "attn_q.weight")) {
		e1 = q;
	} else if (!strcmp(base, "attn_k.weight") || !strcmp(base, "attn_v.weight")) {
		e1 = kv;
	} else if (!strcmp(base, "attn_output.weight")) {
		e0 = q;
		e1 = c->n_embd;
	} else if (!strcmp(base, "attn_q.bias")) {
		e0 = q;
	} else if (!strcmp(base, "attn_k.bias") || !strcmp(base, "attn_v.bias")) {
		e0 = kv;
	} else if (!strcmp(base, "ffn_gate.weight") || !strcmp(base, "ffn_up.weight")) {
		e1 = c->n_ff;
	} else if (!strcmp(base, "ffn_down.weight")) {
		e0 = c->n_ff;
		e1 = c->n_embd;
	}
	return check_shape(l, name, t, e0, e1);
}

int kvi_model_from_gguf(struct kvi_gguf *g, struct kvi_model **out, char *err, size_t errlen)
{
	int ret;
	struct kvi_model *m = calloc(1, sizeof(*m));
	if (!m) {
		kvi_gguf_close(g);
		return -ENOMEM;
	}
	m->priv = g;
	struct ld l = {.g = g, .m = m, .err = err, .errlen = errlen};
	if ((ret = read_config(&l)))
		goto fail;
	const struct kvi_gguf_tensor *te = kvi_gguf_find_tensor(g, "token_embd.weight");
	if (!te) {
		ret = lfail(&l, "missing tensor 'token_embd.weight'");
		goto fail;
	}
	if (te->ne[1] < 1 || te->ne[1] > INT32_MAX) {
		ret = lfail(&l, "tensor 'token_embd.weight': vocabulary size %lld out of range",
			    (long long)te->ne[1]);
		goto fail;
	}
	m->cfg.n_vocab = (int)te->ne[1];
	m->cfg.tied_output = kvi_gguf_find_tensor(g, "output.weight") == NULL;
	if (!m->cfg.has_qkv_bias) {
		/* llama files may carry q/k/v biases too (some fine-tunes); use them if present. */
		m->cfg.has_qkv_bias = kvi_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
	}
	m->layers = calloc((size_t)m->cfg.n_layer, sizeof(*m->layers));
	if (!m->layers) {
		ret = -ENOMEM;
		goto fail;
	}
	if (kvi_gguf_find_tensor(g, "rope_freqs.weight"))
		m->rope_freqs.ne[0] = 1; /* present: each_tensor visits it, load_cb fills it */
	if ((ret = each_tensor(m, load_cb, &l)))
		goto fail;
	if (m->cfg.tied_output)
		m->output = m->tok_embd;
	if ((ret = kvi_model_compute_fingerprint(m))) {
		lfail(&l, "SHA-256 of the weights failed");
		goto fail;
	}
	*out = m;
	return 0;
fail:
	kvi_model_free(m);
	return ret;
}

int kvi_model_load(const char *path, struct kvi_model **out, char *err, size_t errlen)
{
	struct kvi_gguf *g = NULL;
	int ret = kvi_gguf_open(path, &g, err, errlen);
	if (ret)
		return ret;
	return kvi_model_from_gguf(g, out, err, errlen);
}
