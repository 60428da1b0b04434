/* tok — byte-level BPE and SentencePiece tokenizers over a GGUF vocabulary.
 *
 * The vocabulary is copied into one arena with a text -> id hash. BPE merges are a hash from
 * (left id, right id) to (rank, merged id). Both algorithms keep the symbols of one piece in a
 * linked list and candidate merges in a binary heap, validated lazily when popped, so a piece
 * of n bytes costs O(n log n) instead of the O(n^2) of a rescan per merge. */
#include "tok.h"

#include "gguf.h"
#include "tok_impl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_special(const void *a, const void *b)
{
	const struct special *x = a, *y = b;
	return x->len != y->len ? (x->len < y->len ? 1 : -1) : (x->id > y->id) - (x->id < y->id);
}

static int terr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int terr(char *err, size_t errlen, const char *fmt, ...)
{
	if (err && errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

static uint64_t fnv(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
	return h;
}

int32_t kvi_tok_find(const struct kvi_tok *t, const char *s, size_t n)
{
	size_t h = fnv(s, n) & t->hmask;
	while (t->htab[h]) {
		int32_t id = (int32_t)t->htab[h] - 1;
		if (t->len[id] == n && !memcmp(t->arena + t->off[id], s, n))
			return id;
		h = (h + 1) & t->hmask;
	}
	return -ENOENT;
}

/* ---- construction ---- */

static int gpt2_is_direct(int b)
{
	return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

int kvi_tok_utf8_put(char *o, unsigned cp)
{
	if (cp < 0x80) {
		o[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (char)(0xc0 | (cp >> 6));
		o[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	o[0] = (char)(0xe0 | (cp >> 12));
	o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
	o[2] = (char)(0x80 | (cp & 0x3f));
	return 3;
}

/* Decodes one UTF-8 code point; invalid or truncated sequences count as one byte (cp = -1). */
int kvi_tok_utf8_next(const uint8_t *s, size_t n, int *cp)
{
	uint8_t c = s[0];
	int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
	if (len == 1) {
		*cp = c;
		return 1;
	}
	if (!len || (size_t)len > n) {
		*cp = -1;
		return 1;
	}
	int v = c & (0x7f >> len);
	for (int i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80) {
			*cp = -1;
			return 1;
		}
		v = (v << 6) | (s[i] & 0x3f);
	}
	/* Overlong forms (e.g. C0 8D for '\r'), surrogates and values past U+10FFFF are invalid:
	 * the pre-tokenizer classifies ASCII by byte, so no multi-byte form may decode to ASCII. */
	static const int min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
	if (v < min_cp[len] || (v >= 0xd800 && v <= 0xdfff) || v > 0x10ffff) {
		*cp = -1;
		return 1;
	}
	*cp = v;
	return len;
}

static int build_gpt2(struct kvi_tok *t, const struct kvi_gguf *g, char *err, size_t errlen)
{
	int n = 0;
	for (int b = 0; b < 256; b++) {
		t->byte_cp[b] = (uint16_t)(gpt2_is_direct(b) ? b : 256 + n++);
	}
	for (int i = 0; i < 512; i++)
		t->cp_byte[i] = -1;
	for (int b = 0; b < 256; b++) {
		t->cp_byte[t->byte_cp[b]] = (int16_t)b;
		char s[4];
		int l = kvi_tok_utf8_put(s, t->byte_cp[b]);
		t->byte_tok[b] = kvi_tok_find(t, s, (size_t)l);
		if (t->byte_tok[b] < 0)
			return terr(err, errlen, "gpt2 vocabulary lacks the byte token for 0x%02x",
				    b);
	}
	int64_t mk = kvi_gguf_find_kv(g, "tokenizer.ggml.merges");
	enum kvi_gguf_type et;
	uint64_t cnt = 0;
	if (mk < 0 || kvi_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &cnt) ||
	    et != KVI_GGUF_STRING)
		return terr(err, errlen,
			    "gpt2 tokenizer needs 'tokenizer.ggml.merges' (string array)");
	if (cnt > INT32_MAX)
		return terr(err, errlen, "too many merges");
	size_t cap = 16;
	while (cap < 2 * cnt)
		cap *= 2;
	t->pairs = calloc(cap, sizeof(*t->pairs));
	if (!t->pairs)
		return -ENOMEM;
	t->pmask = cap - 1;
	for (uint64_t i = 0; i < cnt; i++) {
		const char *s;
		size_t l;
		kvi_gguf_arr_str(g, mk, i, &s, &l);
		const char *sp = memchr(s, ' ', l);
		if (!sp || sp == s || sp == s + l - 1)
			return terr(err, errlen, "merge %llu is not 'left right'",
				    (unsigned long long)i);
		size_t la = (size_t)(sp - s), lb = l - la - 1;
		int32_t a = kvi_tok_find(t, s, la), b = kvi_tok_find(t, sp + 1, lb);
		char *cat = malloc(la + lb);
		if (!cat)
			return -ENOMEM;
		memcpy(cat, s, la);
		memcpy(cat + la, sp + 1, lb);
		int32_t m = kvi_tok_find(t, cat, la + lb);
		free(cat);
		if (a < 0 || b < 0 || m < 0)
			continue; /* a merge whose parts are not tokens can never apply */
		uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
		size_t h = (size_t)((key * 0x9e3779b97f4a7c15ull) >> 20) & t->pmask;
		while (t->pairs[h].key && t->pairs[h].key != key)
			h = (h + 1) & t->pmask;
		if (t->pairs[h].key)
			continue; /* duplicate merge: the first (lowest rank) wins */
		t->pairs[h] = (struct pair){key, (int32_t)i, m};
	}
	return 0;
}

static int build_spm(struct kvi_tok *t, char *err, size_t errlen)
{
	if (!t->score)
		return terr(err, errlen, "llama tokenizer needs 'tokenizer.ggml.scores'");
	for (int b = 0; b < 256; b++) {
		char s[8];
		snprintf(s, sizeof(s), "<0x%02X>", b);
		t->byte_tok[b] = kvi_tok_find(t, s, 6);
	}
	return 0;
}

static int read_id(const struct kvi_gguf *g, const char *key, int32_t n, int32_t *out, char *err,
		   size_t errlen)
{
	uint32_t v;
	int ret = kvi_gguf_get_u32(g, key, &v);
	if (ret == -ENOENT)
		return 0;
	if (ret || v >= (uint32_t)n)
		return terr(err, errlen, "'%s' is not a token id below %d", key, n);
	*out = (int32_t)v;
	return 0;
}

static int build(struct kvi_tok *t, const struct kvi_gguf *g, char *err, size_t errlen)
{
	char model[32];
	int ret = kvi_gguf_get_strcpy(g, "tokenizer.ggml.model", model, sizeof(model));
	if (ret == -ENOENT)
		return -ENOENT;
	if (ret)
		return terr(err, errlen, "'tokenizer.ggml.model' is not a short string");
	if (!strcmp(model, "gpt2"))
		t->kind = KVI_TOK_GPT2;
	else if (!strcmp(model, "llama"))
		t->kind = KVI_TOK_SPM;
	else
		return terr(err, errlen, "unsupported tokenizer '%s' (supported: gpt2, llama)",
			    model);
	int64_t tk = kvi_gguf_find_kv(g, "tokenizer.ggml.tokens");
	enum kvi_gguf_type et;
	uint64_t cnt;
	if (tk < 0 || kvi_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &cnt) ||
	    et != KVI_GGUF_STRING || cnt == 0 || cnt > (1u << 24))
		return terr(err, errlen,
			    "'tokenizer.ggml.tokens' must be a non-empty string array "
			    "of at most 2^24 tokens");
	t->n = (int32_t)cnt;
	size_t total = 0;
	for (int32_t i = 0; i < t->n; i++) {
		const char *s;
		size_t l;
		kvi_gguf_arr_str(g, tk, (uint64_t)i, &s, &l);
		if (l > 65535)
			return terr(err, errlen, "token %d is %zu bytes long", i, l);
		total += l;
	}
	t->arena = malloc(total ? total : 1);
	t->off = calloc((size_t)t->n, sizeof(*t->off));
	t->len = calloc((size_t)t->n, sizeof(*t->len));
	t->type = calloc((size_t)t->n, sizeof(*t->type));
	size_t cap = 16;
	while (cap < 2 * (size_t)t->n)
		cap *= 2;
	t->htab = calloc(cap, sizeof(*t->htab));
	if (!t->arena || !t->off || !t->len || !t->type || !t->htab)
		return -ENOMEM;
	t->hmask = cap - 1;
	total = 0;
	for (int32_t i = 0; i < t->n; i++) {
		const char *s;
		size_t l;
		kvi_gguf_arr_str(g, tk, (uint64_t)i, &s, &l);
		memcpy(t->arena + total, s, l);
		t->off[i] = total;
		t->len[i] = (uint32_t)l;
		total += l;
		t->type[i] = TT_NORMAL;
		if (kvi_tok_find(t, s, l) >= 0)
			continue; /* duplicate text: the first id keeps it */
		size_t h = fnv(s, l) & t->hmask;
		while (t->htab[h])
			h = (h + 1) & t->hmask;
		t->htab[h] = (uint32_t)i + 1;
	}
	int64_t k = kvi_gguf_find_kv(g, "tokenizer.ggml.token_type");
	if (k >= 0) {
		if (kvi_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &cnt) ||
		    cnt != (uint64_t)t->n)
			return terr(err, errlen,
				    "'tokenizer.ggml.token_type' must have one entry per "
				    "token");
		for (int32_t i = 0; i < t->n; i++)
			if (kvi_gguf_arr_i32(g, k, (uint64_t)i, &t->type[i]))
				return terr(err, errlen,
					    "'tokenizer.ggml.token_type' is not integer");
	}
	k = kvi_gguf_find_kv(g, "tokenizer.ggml.scores");
	if (k >= 0) {
		if (kvi_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &cnt) ||
		    cnt != (uint64_t)t->n)
			return terr(err, errlen,
				    "'tokenizer.ggml.scores' must have one entry per "
				    "token");
		t->score = malloc((size_t)t->n * sizeof(float));
		if (!t->score)
			return -ENOMEM;
		for (int32_t i = 0; i < t->n; i++)
			if (kvi_gguf_arr_f32(g, k, (uint64_t)i, &t->score[i]))
				return terr(err, errlen, "'tokenizer.ggml.scores' is not float");
	}
	t->bos = t->eos = t->unk = -1;
	int32_t eot = -1, eom = -1;
	if ((ret = read_id(g, "tokenizer.ggml.bos_token_id", t->n, &t->bos, err, errlen)) ||
	    (ret = read_id(g, "tokenizer.ggml.eos_token_id", t->n, &t->eos, err, errlen)) ||
	    (ret = read_id(g, "tokenizer.ggml.unknown_token_id", t->n, &t->unk, err, errlen)) ||
	    (ret = read_id(g, "tokenizer.ggml.eot_token_id", t->n, &eot, err, errlen)) ||
	    (ret = read_id(g, "tokenizer.ggml.eom_token_id", t->n, &eom, err, errlen)))
		return ret;
	t->add_bos = t->kind == KVI_TOK_SPM;
	kvi_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos);
	char pre[32] = "";
	kvi_gguf_get_strcpy(g, "tokenizer.ggml.pre", pre, sizeof(pre));
	t->digit_run = !strcmp(pre, "qwen2") ? 1 : 3;
	t->ignore_merges =
	    !strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3") || !strcmp(pre, "smaug-bpe");
	t->add_space_prefix = t->kind == KVI_TOK_SPM;
	kvi_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix);
	int32_t cand[] = {t->eos, eot, eom};
	for (size_t i = 0; i < 3; i++)
		if (cand[i] >= 0)
			t->eog[t->n_eog++] = cand[i];
	static const char *names[] = {"<|eot_id|>", "<|im_end|>", "<|endoftext|>", "</s>",
				      "<|end_of_text|>"};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && t->n_eog < 8; i++) {
		int32_t id = kvi_tok_find(t, names[i], strlen(names[i]));
		if (id >= 0 && (t->type[id] == TT_CONTROL || t->type[id] == TT_USER))
			t->eog[t->n_eog++] = id;
	}
	t->specials = malloc((size_t)t->n * sizeof(*t->specials));
	if (!t->specials)
		return -ENOMEM;
	for (int32_t i = 0; i < t->n; i++)
		if ((t->type[i] == TT_CONTROL || t->type[i] == TT_USER) && t->len[i])
			t->specials[t->n_specials++] = (struct special){t->len[i], i};
	qsort(t->specials, t->n_specials, sizeof(*t->specials), cmp_special);
	return t->kind == KVI_TOK_GPT2 ? build_gpt2(t, g, err, errlen) : build_spm(t, err, errlen);
}

void kvi_tok_free(struct kvi_tok *t)
{
	if (!t)
		return;
	free(t->arena);
	free(t->off);
	free(t->len);
	free(t->score);
	free(t->type);
	free(t->htab);
	free(t->pairs);
	free(t->specials);
	free(t);
}

int kvi_tok_create(const struct kvi_gguf *g, struct kvi_tok **out, char *err, size_t errlen)
{
	struct kvi_tok *t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	if (err && errlen)
		err[0] = 0;
	int ret = build(t, g, err, errlen);
	if (ret) {
		if (ret == -ENOENT)
			terr(err, errlen, "no tokenizer in the file (tokenizer.ggml.model)");
		else if (ret == -ENOMEM)
			terr(err, errlen, "out of memory building the tokenizer");
		kvi_tok_free(t);
		return ret;
	}
	*out = t;
	return 0;
}

/* ---- decoding ---- */

static int emit(char *buf, size_t cap, size_t *pos, const void *p, size_t n)
{
	if (*pos + n >= cap) {
		*pos += n;
		return -ENOSPC;
	}
	memcpy(buf + *pos, p, n);
	*pos += n;
	return 0;
}

static void piece(const struct kvi_tok *t, int32_t id, int flags, char *buf, size_t cap,
		  size_t *pos, int *bad)
{
	const char *s = t->arena + t->off[id];
	size_t n = t->len[id];
	int ty = t->type[id];
	/* as llama.cpp renders them: unused (padding) entries are never text, control ones only
	 * on request */
	if (ty == TT_UNUSED || (ty == TT_CONTROL && !(flags & KVI_TOK_RENDER_SPECIAL)))
		return;
	if (ty == TT_CONTROL || ty == TT_USER || ty == TT_UNKNOWN) {
		*bad |= emit(buf, cap, pos, s, n);
		return;
	}
	if (t->kind == KVI_TOK_SPM) {
		unsigned b;
		if (ty == TT_BYTE && n == 6 && sscanf(s, "<0x%2X>", &b) == 1) {
			char c = (char)b;
			*bad |= emit(buf, cap, pos, &c, 1);
			return;
		}
		for (size_t i = 0; i < n;) {
			if (i + 3 <= n && !memcmp(s + i, "\xe2\x96\x81", 3)) {
				*bad |= emit(buf, cap, pos, " ", 1);
				i += 3;
			} else {
				*bad |= emit(buf, cap, pos, s + i, 1);
				i++;
			}
		}
		return;
	}
	for (size_t i = 0; i < n;) {
		int cp;
		size_t k = (size_t)kvi_tok_utf8_next((const uint8_t *)s + i, n - i, &cp);
		if (cp >= 0 && cp < 512 && t->cp_byte[cp] >= 0) {
			char c = (char)t->cp_byte[cp];
			*bad |= emit(buf, cap, pos, &c, 1);
		} else {
			*bad |= emit(buf, cap, pos, s + i, k);
		}
		i += k;
	}
}

int kvi_tok_decode_piece(const struct kvi_tok *t, int32_t id, int flags, char *buf, size_t cap)
{
	if (id < 0 || id >= t->n)
		return -EINVAL;
	size_t pos = 0;
	int bad = 0;
	piece(t, id, flags, buf, cap, &pos, &bad);
	if (bad || pos >= cap)
		return -ENOSPC;
	buf[pos] = 0;
	return (int)pos;
}

int kvi_tok_decode(const struct kvi_tok *t, const int32_t *ids, size_t n, int flags, char *buf,
		   size_t cap)
{
	size_t pos = 0;
	int bad = 0, strip = t->kind == KVI_TOK_SPM && t->add_space_prefix;
	for (size_t i = 0; i < n; i++) {
		if (ids[i] < 0 || ids[i] >= t->n)
			return -EINVAL;
		size_t before = pos;
		piece(t, ids[i], flags, buf, cap, &pos, &bad);
		if (strip && pos > before) {
			/* the first text piece loses the space encode added */
			if (!bad && buf[before] == ' ') {
				memmove(buf + before, buf + before + 1, pos - before - 1);
				pos--;
			}
			strip = 0;
		}
	}
	if (bad || pos >= cap || pos > INT32_MAX)
		return -ENOSPC;
	buf[pos] = 0;
	return (int)pos;
}

enum kvi_tok_kind kvi_tok_kind(const struct kvi_tok *t)
{
	return t->kind;
}

int32_t kvi_tok_n_vocab(const struct kvi_tok *t)
{
	return t->n;
}

int32_t kvi_tok_bos(const struct kvi_tok *t)
{
	return t->bos;
}

int32_t kvi_tok_eos(const struct kvi_tok *t)
{
	return t->eos;
}

int kvi_tok_wants_bos(const struct kvi_tok *t)
{
	return t->add_bos && t->bos >= 0;
}

int kvi_tok_is_eog(const struct kvi_tok *t, int32_t id)
{
	for (int i = 0; i < t->n_eog; i++)
		if (t->eog[i] == id)
			return 1;
	return 0;
}

const char *kvi_tok_text(const struct kvi_tok *t, int32_t id, size_t *len)
{
	if (id < 0 || id >= t->n)
		return NULL;
	if (len)
		*len = t->len[id];
	return t->arena + t->off[id];
}
