/* kvinfer-synth — writes a valid GGUF model with the shapes of a real architecture,
 * deterministic pseudo-random weights and a byte-level BPE vocabulary.
 *
 * Timing depends on shapes, not values, so benchmarks run on these files. Weights are uniform
 * with standard deviation 1/sqrt(fan-in) (output projections further scaled by
 * 1/sqrt(2 n_layer)), norms near 1, so activations stay finite through every layer. Each row is
 * generated from its own seed (seed, tensor, row): the file is identical whatever the chunking,
 * and multi-GB files are streamed row by row, never held in memory.
 *
 *   kvinfer-synth --preset tiny --type f16 -o tiny.gguf [--seed 1]
 *   kvinfer-synth --preset small --type q4_k_m -o small-q4km.gguf
 *   kvinfer-synth --list
 *   kvinfer-synth --preset tiny -o tiny.gguf --mmproj tiny-mmproj.gguf [--vit vit-b16]
 *
 * --mmproj writes a vision tower + mlp projector in llama.cpp's mmproj layout whose output
 * width is the preset's embedding size (docs/vision.md).
 *
 * The quantized file types (q4_0, q4_k_m, q5_k_m) give each tensor the type llama.cpp's
 * quantizer gives it for that file type (src/llama-quant.cpp, without an importance matrix:
 * docs/gguf.md has the table), so the tensor mix, and the speed, is a real file's.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cfg.h"
#include "gguf_write.h"
#include "kvk.h"
#include "model.h"

struct preset {
	const char *name, *arch, *desc;
	int n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
	float rope_base, rms_eps;
	int tied, qkv_bias;
};

static const struct preset PRESETS[] = {
    {"tiny", "llama", "test model, untied output", 64, 2, 4, 2, 192, 512, 2048, 10000.0f, 1e-5f, 0,
     0},
    {"tiny-qwen2", "qwen2", "test model, qkv bias, tied", 64, 2, 4, 2, 192, 512, 2048, 1e6f, 1e-6f,
     1, 1},
    {"small", "llama", "quick benchmarks", 256, 4, 8, 4, 768, 4096, 4096, 10000.0f, 1e-5f, 0, 0},
    {"qwen2-0.5b", "qwen2", "Qwen2/2.5 0.5B shapes", 896, 24, 14, 2, 4864, 151936, 32768, 1e6f,
     1e-6f, 1, 1},
    {"llama-1b", "llama", "Llama 3.2 1B shapes", 2048, 16, 32, 8, 8192, 128256, 131072, 500000.0f,
     1e-5f, 1, 0},
    {"llama-8b", "llama", "Llama 3.1 8B shapes", 4096, 32, 32, 8, 14336, 128256, 131072, 500000.0f,
     1e-5f, 0, 0},
};
#define N_PRESETS (sizeof(PRESETS) / sizeof(PRESETS[0]))

/* ---- numbers ---- */

static uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint16_t f32_to_f16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	uint32_t sign = (x >> 16) & 0x8000, e = (x >> 23) & 0xff, m = x & 0x7fffff;
	if (e == 0xff)
		return (uint16_t)(sign | 0x7c00 | (m ? 0x200 : 0));
	int ne = (int)e - 127 + 15;
	if (ne >= 31)
		return (uint16_t)(sign | 0x7c00);
	if (ne <= 0) { /* subnormal or zero, round to nearest even */
		if (ne < -10)
			return (uint16_t)sign;
		m |= 0x800000;
		int sh = 14 - ne;
		uint32_t h = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
		if (rem > half || (rem == half && (h & 1)))
			h++;
		return (uint16_t)(sign | h);
	}
	uint32_t h = ((uint32_t)ne << 10) | (m >> 13), rem = m & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
		h++; /* may carry into the exponent, which is the right result */
	return (uint16_t)(sign | h);
}

static uint16_t f32_to_bf16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	x += 0x7fff + ((x >> 16) & 1);
	return (uint16_t)(x >> 16);
}

enum kind { T_EMBD, T_NORM, T_BIAS, T_MAT, T_MAT_OUT };

struct tdesc {
	enum kind kind;
	enum kvi_dtype type;
	int64_t ne0;
	uint64_t seed;
	float scale; /* uniform half-width */
};

struct gen {
	struct tdesc *t;
	size_t n, cap;
	float *row;
};

static uint64_t hash_name(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 1099511628211ull;
	return h;
}

static int fill(void *ctx, int ti, int64_t row0, int64_t nrows, void *buf)
{
	struct gen *g = ctx;
	const struct tdesc *t = &g->t[ti];
	size_t rb = kvi_dtype_row_bytes(t->type, t->ne0);
	for (int64_t r = 0; r < nrows; r++) {
		uint64_t s = t->seed ^ ((uint64_t)(row0 + r) * 0xd1b54a32d192ed03ull);
		float *x = g->row;
		for (int64_t i = 0; i < t->ne0; i++) {
			/* 24 random bits -> uniform in [-1, 1) */
			float u = (float)(splitmix(&s) >> 40) * (2.0f / 16777216.0f) - 1.0f;
			x[i] = t->kind == T_NORM ? 1.0f + t->scale * u : t->scale * u;
		}
		uint8_t *o = (uint8_t *)buf + (size_t)r * rb;
		switch (t->type) {
		case KVI_F32:
			memcpy(o, x, (size_t)t->ne0 * 4);
			break;
		case KVI_F16:
			for (int64_t i = 0; i < t->ne0; i++) {
				uint16_t h = f32_to_f16(x[i]);
				memcpy(o + 2 * i, &h, 2);
			}
			break;
		case KVI_BF16:
			for (int64_t i = 0; i < t->ne0; i++) {
				uint16_t h = f32_to_bf16(x[i]);
				memcpy(o + 2 * i, &h, 2);
			}
			break;
		case KVI_Q4_0:
		case KVI_Q5_0:
		case KVI_Q5_1:
		case KVI_Q4_K:
		case KVI_Q5_K:
		case KVI_Q6_K:
			if (kvk_quantize_row((enum kvk_wtype)t->type, o, x, (size_t)t->ne0))
				return -EINVAL;
			break;
		case KVI_Q8_0:
			for (int64_t b = 0; b < t->ne0 / KVI_Q8_0_BLOCK; b++) {
				const float *v = x + b * KVI_Q8_0_BLOCK;
				uint8_t *blk = o + b * KVI_Q8_0_BYTES;
				float amax = 0;
				for (int i = 0; i < KVI_Q8_0_BLOCK; i++)
					amax = fmaxf(amax, fabsf(v[i]));
				float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
				uint16_t dh = f32_to_f16(d);
				memcpy(blk, &dh, 2);
				for (int i = 0; i < KVI_Q8_0_BLOCK; i++)
					blk[2 + i] = (uint8_t)(int8_t)lrintf(v[i] * id);
			}
			break;
		}
	}
	return 0;
}

/* ---- vocabulary ---- */

/* GPT-2's byte -> printable code point map: printable Latin-1 bytes map to themselves, the
 * rest to 256, 257, ... in byte order. */
static int byte_cp(int b)
{
	if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
		return b;
	int n = 0;
	for (int c = 0; c < b; c++)
		if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255)))
			n++;
	return 256 + n;
}

static int utf8_put(char *o, int cp)
{
	if (cp < 0x80) {
		o[0] = (char)cp;
		return 1;
	}
	o[0] = (char)(0xc0 | (cp >> 6));
	o[1] = (char)(0x80 | (cp & 0x3f));
	return 2;
}

/* Words whose spellings become merges: enough to exercise BPE on English text. */
static const char *WORDS[] = {
    "the",     "and",	"that",	 "have",  "for",   "not",   "with",  "you",    "this",	"but",
    "his",     "from",	"they",	 "say",	  "her",   "she",   "will",  "one",    "all",	"would",
    "there",   "their", "what",	 "out",	  "about", "who",   "get",   "which",  "when",	"make",
    "can",     "like",	"time",	 "just",  "him",   "know",  "take",  "people", "into",	"year",
    "your",    "good",	"some",	 "could", "them",  "see",   "other", "than",   "then",	"now",
    "look",    "only",	"come",	 "its",	  "over",  "think", "also",  "back",   "after", "use",
    "two",     "how",	"our",	 "work",  "first", "well",  "way",   "even",   "new",	"want",
    "because", "any",	"these", "give",  "day",   "most",  "is",    "are",    "was",	"of",
    "to",      "in",	"it",	 "on",	  "be",	   "as",    "at",    "by",     "we",	"or",
    "an",      "ing",	"ed",	 "er",	  "ly",	   "tion",  "model", "cache",  "token", "hello",
    "world",   "Hello", "The",	 "kvfs",  "block", "file",  "store", "data",   "fast",	"GPU",
};

struct vocab {
	char **tok;
	int32_t *type;
	char **merges;
	size_t n, n_merges;
	int bos, eos;
};

static int vocab_has(const struct vocab *v, const char *s)
{
	for (size_t i = 0; i < v->n; i++)
		if (!strcmp(v->tok[i], s))
			return 1;
	return 0;
}

static int vocab_build(struct vocab *v, int n_vocab)
{
	v->tok = calloc((size_t)n_vocab, sizeof(char *));
	v->type = calloc((size_t)n_vocab, sizeof(int32_t));
	v->merges = calloc(4096, sizeof(char *));
	if (!v->tok || !v->type || !v->merges)
		return -ENOMEM;
	char sym[256][3];
	for (int b = 0; b < 256; b++) {
		int n = utf8_put(sym[b], byte_cp(b));
		sym[b][n] = 0;
		v->tok[v->n] = strdup(sym[b]);
		v->type[v->n++] = 1;
	}
	int room = n_vocab - 256 - 3;
	for (size_t w = 0; w < sizeof(WORDS) / sizeof(WORDS[0]); w++) {
		/* left-to-right prefix merges spell the word, then one merge puts the space in
		 * front of the whole word, the order a trained BPE would learn them in */
		char cur[136], next[280];
		const char *word = WORDS[w];
		strcpy(cur, sym[(uint8_t)*word++]);
		for (int last = 0; !last; word++) {
			const char *c = *word ? sym[(uint8_t)*word] : cur;
			const char *left = *word ? cur : sym[' '];
			last = !*word;
			snprintf(next, sizeof(next), "%s%s", left, c);
			if (!vocab_has(v, next)) {
				if (room <= 0 || v->n_merges >= 4096)
					goto done;
				char m[420];
				snprintf(m, sizeof(m), "%s %s", left, c);
				v->merges[v->n_merges++] = strdup(m);
				v->tok[v->n] = strdup(next);
				v->type[v->n++] = 1;
				room--;
			}
			if (!last)
				strcpy(cur, next);
		}
	}
done:
	v->bos = (int)v->n;
	v->tok[v->n] = strdup("<|begin_of_text|>");
	v->type[v->n++] = 3;
	v->eos = (int)v->n;
	v->tok[v->n] = strdup("<|end_of_text|>");
	v->type[v->n++] = 3;
	v->tok[v->n] = strdup("<|eot_id|>");
	v->type[v->n++] = 3;
	char f[32];
	while ((int)v->n < n_vocab) {
		snprintf(f, sizeof(f), "<|filler_%zu|>", v->n);
		v->tok[v->n] = strdup(f);
		/* normal, not unused (5): with random weights greedy decoding mostly picks these,
		 * and both engines print a normal token's text (an unused one prints as nothing),
		 * so the output of a synthetic model stays comparable; encode never produces them
		 * (no merge leads there) */
		v->type[v->n++] = 1;
	}
	for (size_t i = 0; i < v->n; i++)
		if (!v->tok[i])
			return -ENOMEM;
	for (size_t i = 0; i < v->n_merges; i++)
		if (!v->merges[i])
			return -ENOMEM;
	return 0;
}

static void vocab_free(struct vocab *v)
{
	for (size_t i = 0; i < v->n; i++)
		free(v->tok[i]);
	for (size_t i = 0; i < v->n_merges; i++)
		free(v->merges[i]);
	free(v->tok);
	free(v->type);
	free(v->merges);
}

/* ---- file types ---- */

struct ftype {
	const char *name;
	enum kvi_dtype base;
	uint32_t llama_ftype; /* general.file_type, llama.cpp's enum llama_ftype */
	int k_mix;	      /* the _M mixes: more bits for attn_v and ffn_down in some layers */
};

static const struct ftype FTYPES[] = {
    {"f32", KVI_F32, 0, 0},	 {"f16", KVI_F16, 1, 0},   {"bf16", KVI_BF16, 32, 0},
    {"q8_0", KVI_Q8_0, 7, 0},	 {"q4_0", KVI_Q4_0, 2, 0}, {"q4_k_m", KVI_Q4_K, 15, 1},
    {"q5_k_m", KVI_Q5_K, 17, 1},
};
#define N_FTYPES (sizeof(FTYPES) / sizeof(FTYPES[0]))

/* llama.cpp's use_more_bits: the first and last eighth of the layers and every third between */
static int more_bits(int l, int n)
{
	return l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2;
}

static int blck(enum kvi_dtype t)
{
	return t == KVI_Q4_K || t == KVI_Q5_K || t == KVI_Q6_K ? 256
	       : t == KVI_F32 || t == KVI_F16 || t == KVI_BF16 ? 1
							       : 32;
}

/* The type llama.cpp's quantizer writes for a 2-D tensor (layer -1 for token_embd/output):
 * output (or the tied token_embd) Q6_K, Q8_0 when its rows are not whole super-blocks;
 * with the _M mixes attn_v and ffn_down Q6_K where more_bits(layer); the rest the base type;
 * then its fallback for rows that are not whole blocks (Q4_K -> Q5_0, Q5_K -> Q5_1,
 * Q6_K -> Q8_0; a 32-block type -> F16). */
static int pick_type(const struct ftype *f, const char *name, int layer, int n_layer, int64_t ne0,
		     int tied, enum kvi_dtype *out)
{
	enum kvi_dtype t = f->base;
	if (t == KVI_F32 || t == KVI_F16 || t == KVI_BF16 || t == KVI_Q8_0) {
		*out = t;
		return 0;
	}
	int is_out = !strcmp(name, "output.weight") || (tied && !strcmp(name, "token_embd.weight"));
	if (is_out) {
		*out = ne0 % 256 ? KVI_Q8_0 : KVI_Q6_K;
		return 0;
	}
	if (f->k_mix && (strstr(name, "attn_v.weight") || strstr(name, "ffn_down")) &&
	    more_bits(layer, n_layer))
		t = KVI_Q6_K;
	if (ne0 % blck(t)) {
		t = t == KVI_Q6_K   ? KVI_Q8_0
		    : t == KVI_Q4_K ? KVI_Q5_0
		    : t == KVI_Q5_K ? KVI_Q5_1
				    : KVI_F16;
		if (ne0 % blck(t))
			t = KVI_F16;
	}
	*out = t;
	return 0;
}

/* ---- file ---- */

static int add_tensor(struct kvi_gguf_writer *w, struct gen *g, uint64_t seed, const char *name,
		      enum kind kind, const struct ftype *f, int layer, int n_layer, int tied,
		      int64_t ne0, int64_t ne1, float scale)
{
	enum kvi_dtype type = KVI_F32;
	if (kind != T_NORM && kind != T_BIAS) {
		int ret = pick_type(f, name, layer, n_layer, ne0, tied, &type);
		if (ret)
			return ret;
	}
	if (g->n == g->cap) {
		g->cap = g->cap ? g->cap * 2 : 64;
		struct tdesc *p = realloc(g->t, g->cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		g->t = p;
	}
	int64_t ne[2] = {ne0, ne1};
	int idx = kvi_gguf_w_tensor(w, name, (uint32_t)type, ne1 > 1 ? 2 : 1, ne, NULL);
	if (idx < 0)
		return idx;
	g->t[g->n++] = (struct tdesc){kind, type, ne0, seed ^ hash_name(name), scale};
	return 0;
}

static int write_model(const struct preset *p, const struct ftype *ft, const char *path,
		       uint64_t seed)
{
	struct kvi_gguf_writer *w = NULL;
	struct gen g = {0};
	struct vocab v = {0};
	int ret = kvi_gguf_writer_create(&w);
	if (!ret)
		ret = vocab_build(&v, p->n_vocab);
	if (ret)
		goto out;
	char k[128], name[64];
	const char *a = p->arch;
	int hd = p->n_embd / p->n_head;
#define KEY(s) (snprintf(k, sizeof(k), "%s.%s", a, s), k)
	kvi_gguf_w_str(w, "general.architecture", a);
	snprintf(name, sizeof(name), "kvfs synthetic %s", p->name);
	kvi_gguf_w_str(w, "general.name", name);
	kvi_gguf_w_alignment(w, 32);
	kvi_gguf_w_u32(w, "general.file_type", ft->llama_ftype);
	kvi_gguf_w_bool(w, "kvfs.synthetic", 1);
	kvi_gguf_w_u64(w, "kvfs.synthetic.seed", seed);
	kvi_gguf_w_u32(w, KEY("block_count"), (uint32_t)p->n_layer);
	kvi_gguf_w_u32(w, KEY("context_length"), (uint32_t)p->n_ctx);
	kvi_gguf_w_u32(w, KEY("embedding_length"), (uint32_t)p->n_embd);
	kvi_gguf_w_u32(w, KEY("feed_forward_length"), (uint32_t)p->n_ff);
	kvi_gguf_w_u32(w, KEY("attention.head_count"), (uint32_t)p->n_head);
	kvi_gguf_w_u32(w, KEY("attention.head_count_kv"), (uint32_t)p->n_head_kv);
	kvi_gguf_w_u32(w, KEY("rope.dimension_count"), (uint32_t)hd);
	kvi_gguf_w_f32(w, KEY("rope.freq_base"), p->rope_base);
	kvi_gguf_w_f32(w, KEY("attention.layer_norm_rms_epsilon"), p->rms_eps);
	kvi_gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
	kvi_gguf_w_str(w, "tokenizer.ggml.pre", strcmp(a, "qwen2") ? "llama-bpe" : "qwen2");
	kvi_gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v.tok, v.n);
	kvi_gguf_w_arr_i32(w, "tokenizer.ggml.token_type", v.type, v.n);
	kvi_gguf_w_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v.merges, v.n_merges);
	kvi_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v.bos);
	kvi_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v.eos);
	kvi_gguf_w_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)v.eos + 1);
	ret = kvi_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", strcmp(a, "qwen2") != 0);
	if (ret)
		goto out;
#undef KEY
	float emb = sqrtf(3.0f / (float)p->n_embd), in_e = emb,
	      in_ff = sqrtf(3.0f / (float)p->n_ff);
	float res = 1.0f / sqrtf(2.0f * (float)p->n_layer);
	int64_t q = (int64_t)p->n_head * hd, kv = (int64_t)p->n_head_kv * hd;
	ret = add_tensor(w, &g, seed, "token_embd.weight", T_EMBD, ft, -1, p->n_layer, p->tied,
			 p->n_embd, p->n_vocab, emb);
	if (!ret)
		ret = add_tensor(w, &g, seed, "output_norm.weight", T_NORM, ft, -1, p->n_layer,
				 p->tied, p->n_embd, 1, 0.05f);
	if (!ret && !p->tied)
		ret = add_tensor(w, &g, seed, "output.weight", T_MAT, ft, -1, p->n_layer, p->tied,
				 p->n_embd, p->n_vocab, in_e);
	for (int l = 0; l < p->n_layer && !ret; l++) {
		struct {
			const char *n;
			enum kind k;
			int64_t ne0, ne1;
			float s;
		} L[] = {
		    {"attn_norm.weight", T_NORM, p->n_embd, 1, 0.05f},
		    {"attn_q.weight", T_MAT, p->n_embd, q, in_e},
		    {"attn_k.weight", T_MAT, p->n_embd, kv, in_e},
		    {"attn_v.weight", T_MAT, p->n_embd, kv, in_e},
		    {"attn_output.weight", T_MAT_OUT, q, p->n_embd, sqrtf(3.0f / (float)q) * res},
		    {"attn_q.bias", T_BIAS, q, 1, 0.1f},
		    {"attn_k.bias", T_BIAS, kv, 1, 0.1f},
		    {"attn_v.bias", T_BIAS, kv, 1, 0.1f},
		    {"ffn_norm.weight", T_NORM, p->n_embd, 1, 0.05f},
		    {"ffn_gate.weight", T_MAT, p->n_embd, p->n_ff, in_e},
		    {"ffn_up.weight", T_MAT, p->n_embd, p->n_ff, in_e},
		    {"ffn_down.weight", T_MAT_OUT, p->n_ff, p->n_embd, in_ff * res},
		};
		for (size_t i = 0; i < sizeof(L) / sizeof(L[0]) && !ret; i++) {
			if (L[i].k == T_BIAS && !p->qkv_bias)
				continue;
			snprintf(name, sizeof(name), "blk.%d.%s", l, L[i].n);
			ret = add_tensor(w, &g, seed, name, L[i].k, ft, l, p->n_layer, p->tied,
					 L[i].ne0, L[i].ne1, L[i].s);
		}
	}
	if (ret)
		goto out;
	int64_t maxrow = p->n_ff > p->n_embd ? p->n_ff : p->n_embd;
	g.row = malloc((size_t)maxrow * sizeof(float));
	if (!g.row) {
		ret = -ENOMEM;
		goto out;
	}
	ret = kvi_gguf_w_write_file(w, path, fill, &g);
out:
	free(g.row);
	free(g.t);
	vocab_free(&v);
	kvi_gguf_writer_free(w);
	return ret;
}

/* ---- mmproj (vision tower + mlp projector, llama.cpp's layout; docs/vision.md) ---- */

struct vshape {
	const char *name, *desc;
	int image, patch, n_embd, n_ff, n_layer, n_head;
};

static const struct vshape VSHAPES[] = {
    {"tiny", "test tower: 32x32, 16 patches", 32, 8, 64, 128, 3, 4},
    {"vit-b16", "CLIP ViT-B/16 shapes: 224x224, 196 patches", 224, 16, 768, 3072, 12, 12},
};
#define N_VSHAPES (sizeof(VSHAPES) / sizeof(VSHAPES[0]))

static int add_vt(struct kvi_gguf_writer *w, struct gen *g, uint64_t seed, const char *name,
		  enum kind kind, enum kvi_dtype type, int n_dims, const int64_t *ne, float scale)
{
	if (g->n == g->cap) {
		g->cap = g->cap ? g->cap * 2 : 64;
		struct tdesc *p = realloc(g->t, g->cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		g->t = p;
	}
	if (kind == T_NORM || kind == T_BIAS || kind == T_EMBD)
		type = KVI_F32; /* vectors and tables stay f32, as llama.cpp's converter writes */
	if (type == KVI_Q8_0 && (n_dims == 4 || ne[0] % KVI_Q8_0_BLOCK))
		type = KVI_F16; /* the patch kernel (rows p wide) stays float */
	int idx = kvi_gguf_w_tensor(w, name, (uint32_t)type, n_dims, ne, NULL);
	if (idx < 0)
		return idx;
	g->t[g->n++] = (struct tdesc){kind, type, ne[0], seed ^ hash_name(name), scale};
	return 0;
}

/* A LLaVA-1.5-style mmproj: CLIP tower (class token, pre-LN, no post-LN, no patch bias, quick
 * GELU) and the two-layer mlp projector into an LM of width lm_embd. Matrices in `type` (F32,
 * F16, BF16 or Q8_0; the patch kernel F16 for Q8_0), vectors F32. */
static int write_mmproj(const struct vshape *s, int lm_embd, enum kvi_dtype type, const char *path,
			uint64_t seed)
{
	static const float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
	static const float stdv[3] = {0.26862954f, 0.26130258f, 0.27577711f};
	struct kvi_gguf_writer *w = NULL;
	struct gen g = {0};
	seed ^= 0x76697369ull; /* "visi": a tower's weights differ from its LM's */
	int ret = kvi_gguf_writer_create(&w);
	if (ret)
		return ret;
	char name[96];
	int np = (s->image / s->patch) * (s->image / s->patch);
	snprintf(name, sizeof(name), "kvfs synthetic mmproj %s", s->name);
	kvi_gguf_w_str(w, "general.architecture", "clip");
	kvi_gguf_w_str(w, "general.name", name);
	kvi_gguf_w_alignment(w, 32);
	kvi_gguf_w_u32(w, "general.file_type",
		       type == KVI_F32	  ? 0
		       : type == KVI_F16  ? 1
		       : type == KVI_Q8_0 ? 7
					  : 32);
	kvi_gguf_w_bool(w, "kvfs.synthetic", 1);
	kvi_gguf_w_u64(w, "kvfs.synthetic.seed", seed);
	kvi_gguf_w_bool(w, "clip.has_text_encoder", 0);
	kvi_gguf_w_bool(w, "clip.has_vision_encoder", 1);
	kvi_gguf_w_bool(w, "clip.has_llava_projector", 1);
	kvi_gguf_w_str(w, "clip.projector_type", "mlp");
	kvi_gguf_w_bool(w, "clip.use_gelu", 0);
	kvi_gguf_w_u32(w, "clip.vision.image_size", (uint32_t)s->image);
	kvi_gguf_w_u32(w, "clip.vision.patch_size", (uint32_t)s->patch);
	kvi_gguf_w_u32(w, "clip.vision.embedding_length", (uint32_t)s->n_embd);
	kvi_gguf_w_u32(w, "clip.vision.feed_forward_length", (uint32_t)s->n_ff);
	kvi_gguf_w_u32(w, "clip.vision.projection_dim", (uint32_t)lm_embd);
	kvi_gguf_w_u32(w, "clip.vision.attention.head_count", (uint32_t)s->n_head);
	kvi_gguf_w_f32(w, "clip.vision.attention.layer_norm_epsilon", 1e-5f);
	kvi_gguf_w_u32(w, "clip.vision.block_count", (uint32_t)s->n_layer);
	kvi_gguf_w_arr_f32(w, "clip.vision.image_mean", mean, 3);
	ret = kvi_gguf_w_arr_f32(w, "clip.vision.image_std", stdv, 3);
	int64_t E = s->n_embd, F = s->n_ff, P = s->patch, L = lm_embd;
	float in_e = sqrtf(3.0f / (float)E), in_ff = sqrtf(3.0f / (float)F);
	float res = 1.0f / sqrtf(2.0f * (float)s->n_layer);
	struct {
		const char *n;
		enum kind k;
		int nd;
		int64_t ne[4];
		float sc;
	} T[] = {
	    {"v.class_embd", T_EMBD, 1, {E}, 0.5f},
	    {"v.patch_embd.weight", T_MAT, 4, {P, P, 3, E}, sqrtf(3.0f / (float)(3 * P * P))},
	    {"v.position_embd.weight", T_EMBD, 2, {E, np + 1}, 0.5f},
	    {"v.pre_ln.weight", T_NORM, 1, {E}, 0.05f},
	    {"v.pre_ln.bias", T_BIAS, 1, {E}, 0.1f},
	};
	for (size_t i = 0; i < sizeof(T) / sizeof(T[0]) && !ret; i++)
		ret = add_vt(w, &g, seed, T[i].n, T[i].k, type, T[i].nd, T[i].ne, T[i].sc);
	for (int l = 0; l < s->n_layer && !ret; l++) {
		struct {
			const char *n;
			enum kind k;
			int64_t ne0, ne1;
			float sc;
		} B[] = {
		    {"ln1.weight", T_NORM, E, 1, 0.05f},
		    {"ln1.bias", T_BIAS, E, 1, 0.1f},
		    {"attn_q.weight", T_MAT, E, E, in_e},
		    {"attn_q.bias", T_BIAS, E, 1, 0.1f},
		    {"attn_k.weight", T_MAT, E, E, in_e},
		    {"attn_k.bias", T_BIAS, E, 1, 0.1f},
		    {"attn_v.weight", T_MAT, E, E, in_e},
		    {"attn_v.bias", T_BIAS, E, 1, 0.1f},
		    {"attn_out.weight", T_MAT_OUT, E, E, in_e * res},
		    {"attn_out.bias", T_BIAS, E, 1, 0.1f},
		    {"ln2.weight", T_NORM, E, 1, 0.05f},
		    {"ln2.bias", T_BIAS, E, 1, 0.1f},
		    {"ffn_up.weight", T_MAT, E, F, in_e},
		    {"ffn_up.bias", T_BIAS, F, 1, 0.1f},
		    {"ffn_down.weight", T_MAT_OUT, F, E, in_ff * res},
		    {"ffn_down.bias", T_BIAS, E, 1, 0.1f},
		};
		for (size_t i = 0; i < sizeof(B) / sizeof(B[0]) && !ret; i++) {
			int64_t ne[2] = {B[i].ne0, B[i].ne1};
			snprintf(name, sizeof(name), "v.blk.%d.%s", l, B[i].n);
			ret = add_vt(w, &g, seed, name, B[i].k, type, B[i].ne1 > 1 ? 2 : 1, ne,
				     B[i].sc);
		}
	}
	int64_t m0[2] = {E, L}, b0[1] = {L}, m2[2] = {L, L};
	if (!ret)
		ret = add_vt(w, &g, seed, "mm.0.weight", T_MAT, type, 2, m0, in_e);
	if (!ret)
		ret = add_vt(w, &g, seed, "mm.0.bias", T_BIAS, type, 1, b0, 0.1f);
	if (!ret)
		ret =
		    add_vt(w, &g, seed, "mm.2.weight", T_MAT, type, 2, m2, sqrtf(3.0f / (float)L));
	if (!ret)
		ret = add_vt(w, &g, seed, "mm.2.bias", T_BIAS, type, 1, b0, 0.1f);
	int64_t maxrow = F > E ? F : E;
	maxrow = maxrow > L ? maxrow : L;
	if (!ret && !(g.row = malloc((size_t)maxrow * sizeof(float))))
		ret = -ENOMEM;
	if (!ret)
		ret = kvi_gguf_w_write_file(w, path, fill, &g);
	free(g.row);
	free(g.t);
	kvi_gguf_writer_free(w);
	return ret;
}

struct opts {
	char preset[CFG_STR_MAX];
	char type[CFG_STR_MAX];
	char out[CFG_STR_MAX];
	char mmproj[CFG_STR_MAX];
	char vit[CFG_STR_MAX];
	int64_t seed;
	int list;
};

static const struct cfg_opt OPTS[] = {
    {"preset", CFG_STR, offsetof(struct opts, preset), 0, 0, "tiny", "model shape (--list)"},
    {"type", CFG_STR, offsetof(struct opts, type), 0, 0, "f16",
     "f32, f16, bf16, q8_0, q4_0, q4_k_m or q5_k_m"},
    {"out", CFG_STR, offsetof(struct opts, out), 0, 0, NULL, "output file (also -o FILE)"},
    {"mmproj", CFG_STR, offsetof(struct opts, mmproj), 0, 0, "",
     "also write a vision tower (llama.cpp mmproj layout) projecting into this model"},
    {"vit", CFG_STR, offsetof(struct opts, vit), 0, 0, "tiny", "mmproj shape: tiny or vit-b16"},
    {"seed", CFG_INT, offsetof(struct opts, seed), 0, 9007199254740991.0, "1", "weight seed"},
    {"list", CFG_BOOL, offsetof(struct opts, list), 0, 0, "false", "list presets and exit"},
    CFG_END,
};

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "-o"))
			argv[i] = "--out";
	struct opts o;
	int npos = 0;
	int ret = cfg_parse(OPTS, &o, argc, argv, "", &npos);
	if (ret)
		return ret > 0 ? 0 : 2;
	if (o.list) {
		for (size_t i = 0; i < N_PRESETS; i++) {
			const struct preset *p = &PRESETS[i];
			printf(
			    "%-12s %-6s embd %5d layers %3d heads %3d/%-2d ff %5d vocab %6d  %s\n",
			    p->name, p->arch, p->n_embd, p->n_layer, p->n_head, p->n_head_kv,
			    p->n_ff, p->n_vocab, p->desc);
		}
		for (size_t i = 0; i < N_VSHAPES; i++) {
			const struct vshape *v = &VSHAPES[i];
			printf(
			    "--vit %-8s image %4d patch %2d embd %4d layers %2d heads %2d ff %4d  "
			    "%s\n",
			    v->name, v->image, v->patch, v->n_embd, v->n_layer, v->n_head, v->n_ff,
			    v->desc);
		}
		return 0;
	}
	const struct preset *p = NULL;
	for (size_t i = 0; i < N_PRESETS; i++)
		if (!strcmp(PRESETS[i].name, o.preset))
			p = &PRESETS[i];
	if (!p) {
		fprintf(stderr, "kvinfer-synth: unknown preset '%s' (try --list)\n", o.preset);
		return 2;
	}
	const struct ftype *ft = NULL;
	for (size_t i = 0; i < N_FTYPES; i++)
		if (!strcmp(FTYPES[i].name, o.type))
			ft = &FTYPES[i];
	if (!ft || (!o.out[0] && !o.mmproj[0])) {
		fprintf(stderr, "kvinfer-synth: %s\n",
			!ft ? "--type must be f32, f16, bf16, q8_0, q4_0, q4_k_m or q5_k_m"
			    : "-o FILE (or --mmproj FILE) is required");
		return 2;
	}
	const struct vshape *vs = NULL;
	for (size_t i = 0; i < N_VSHAPES; i++)
		if (!strcmp(VSHAPES[i].name, o.vit))
			vs = &VSHAPES[i];
	if (!vs) {
		fprintf(stderr, "kvinfer-synth: unknown --vit shape '%s' (tiny, vit-b16)\n", o.vit);
		return 2;
	}
	struct timespec t0, t1;
	if (o.out[0]) {
		clock_gettime(CLOCK_MONOTONIC, &t0);
		ret = write_model(p, ft, o.out, (uint64_t)o.seed);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		if (ret) {
			fprintf(stderr, "kvinfer-synth: writing %s: %s\n", o.out, strerror(-ret));
			return 1;
		}
		printf("kvinfer-synth: wrote %s (%s, %s) in %.2f s\n", o.out, p->name, o.type,
		       (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
	}
	if (o.mmproj[0]) {
		/* the tower's matrices: f32, bf16 or q8_0 as asked, f16 for the other file
		 * types (llama.cpp publishes mmproj files in F16 and Q8_0) */
		enum kvi_dtype vt = ft->base;
		if (vt != KVI_F32 && vt != KVI_BF16 && vt != KVI_Q8_0)
			vt = KVI_F16;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		ret = write_mmproj(vs, p->n_embd, vt, o.mmproj, (uint64_t)o.seed);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		if (ret) {
			fprintf(stderr, "kvinfer-synth: writing %s: %s\n", o.mmproj,
				strerror(-ret));
			return 1;
		}
		printf("kvinfer-synth: wrote %s (mmproj %s -> %d wide) in %.2f s\n", o.mmproj,
		       vs->name, p->n_embd,
		       (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
	}
	return 0;
}
