/* tok_encode — text to token ids: special-token splitting, the Llama-3 / Qwen2 pre-tokenizer,
 * byte-level BPE and SentencePiece merging (see tok.h). */
#include "tok.h"
#include "tok_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int pair_find(const struct kvi_tok *t, int32_t a, int32_t b, int32_t *rank, int32_t *merged)
{
	uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
	size_t h = (size_t)((key * 0x9e3779b97f4a7c15ull) >> 20) & t->pmask;
	while (t->pairs[h].key) {
		if (t->pairs[h].key == key) {
			*rank = t->pairs[h].rank;
			*merged = t->pairs[h].merged;
			return 1;
		}
		h = (h + 1) & t->pmask;
	}
	return 0;
}

/* ---- encoding ---- */

struct ivec {
	int32_t *v;
	size_t n, cap;
	int oom;
};

static void push(struct ivec *o, int32_t id)
{
	if (o->n == o->cap) {
		size_t nc = o->cap ? o->cap * 2 : 64;
		int32_t *p = realloc(o->v, nc * sizeof(*p));
		if (!p) {
			o->oom = 1;
			return;
		}
		o->v = p;
		o->cap = nc;
	}
	o->v[o->n++] = id;
}

struct sym {
	int32_t id;
	int prev, next;
	uint32_t start, len;
};

struct cand {
	double key; /* lower first */
	int left, right;
	int32_t a, b; /* gpt2: ids at push; spm: total length */
};

struct work {
	struct sym *sym;
	struct cand *heap;
	size_t nheap, cap_sym, cap_heap;
	char *buf; /* gpt2: byte-level text of a piece; spm: the escaped text */
	size_t cap_buf;
	int oom;
};

static int reserve(void **p, size_t *cap, size_t need, size_t el)
{
	if (need <= *cap)
		return 0;
	size_t nc = *cap ? *cap : 64;
	while (nc < need)
		nc *= 2;
	void *q = realloc(*p, nc * el);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = nc;
	return 0;
}

static int cand_less(const struct cand *x, const struct cand *y)
{
	return x->key < y->key || (x->key == y->key && x->left < y->left);
}

static void heap_push(struct work *w, struct cand c)
{
	if (reserve((void **)&w->heap, &w->cap_heap, w->nheap + 1, sizeof(c))) {
		w->oom = 1;
		return;
	}
	size_t i = w->nheap++;
	while (i && cand_less(&c, &w->heap[(i - 1) / 2])) {
		w->heap[i] = w->heap[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	w->heap[i] = c;
}

static struct cand heap_pop(struct work *w)
{
	struct cand top = w->heap[0], last = w->heap[--w->nheap];
	size_t i = 0;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= w->nheap)
			break;
		if (c + 1 < w->nheap && cand_less(&w->heap[c + 1], &w->heap[c]))
			c++;
		if (!cand_less(&w->heap[c], &last))
			break;
		w->heap[i] = w->heap[c];
		i = c;
	}
	if (w->nheap)
		w->heap[i] = last;
	return top;
}

static void gpt2_try(const struct kvi_tok *t, struct work *w, int l, int r)
{
	int32_t rank, merged;
	if (l >= 0 && r >= 0 && pair_find(t, w->sym[l].id, w->sym[r].id, &rank, &merged))
		heap_push(w, (struct cand){rank, l, r, w->sym[l].id, w->sym[r].id});
}

/* BPE over one pre-tokenized piece. */
static void gpt2_piece(const struct kvi_tok *t, struct work *w, const uint8_t *s, size_t n,
		       struct ivec *o)
{
	/* Llama 3 ("ignore_merges"): a piece that is a token as a whole is emitted directly. */
	if (reserve((void **)&w->buf, &w->cap_buf, n * 2, 1) ||
	    reserve((void **)&w->sym, &w->cap_sym, n, sizeof(*w->sym))) {
		w->oom = 1;
		return;
	}
	size_t bl = 0;
	for (size_t i = 0; i < n; i++)
		bl += (size_t)kvi_tok_utf8_put(w->buf + bl, t->byte_cp[s[i]]);
	int32_t whole = t->ignore_merges ? kvi_tok_find(t, w->buf, bl) : -1;
	if (whole >= 0 && t->type[whole] == TT_NORMAL) {
		push(o, whole);
		return;
	}
	for (size_t i = 0; i < n; i++)
		w->sym[i] =
		    (struct sym){t->byte_tok[s[i]], (int)i - 1, i + 1 < n ? (int)i + 1 : -1, 0, 1};
	w->nheap = 0;
	for (size_t i = 0; i + 1 < n; i++)
		gpt2_try(t, w, (int)i, (int)i + 1);
	while (w->nheap) {
		struct cand c = heap_pop(w);
		struct sym *L = &w->sym[c.left], *R = &w->sym[c.right];
		if (!L->len || !R->len || L->next != c.right || L->id != c.a || R->id != c.b)
			continue; /* stale */
		int32_t rank, merged = -1;
		if (!pair_find(t, L->id, R->id, &rank, &merged))
			continue;
		L->id = merged;
		L->next = R->next;
		if (R->next >= 0)
			w->sym[R->next].prev = c.left;
		R->len = 0;
		gpt2_try(t, w, L->prev, c.left);
		gpt2_try(t, w, c.left, L->next);
	}
	for (int i = 0; i >= 0; i = w->sym[i].next)
		push(o, w->sym[i].id);
}

static int is_space(int c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static int is_digit(int c)
{
	return c >= '0' && c <= '9';
}

/* Non-ASCII code points count as letters (the simplification docs/gguf.md describes). */
static int is_letter(int c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80 || c < 0;
}

/* Length of the next piece of s[0..n) under the Llama-3 split regex (Qwen2: digits one by one;
 * see docs/gguf.md). */
static size_t pretok_next(const struct kvi_tok *t, const uint8_t *s, size_t n)
{
	int c, c2;
	size_t l = (size_t)kvi_tok_utf8_next(s, n, &c);
	if (c == '\'' && n > 1) {
		static const char *con[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
		for (size_t i = 0; i < 7; i++) {
			size_t cl = strlen(con[i]);
			if (cl <= n && !strncasecmp((const char *)s, con[i], cl))
				return cl;
		}
	}
	size_t p = l;
	if (is_letter(c) || (c != '\r' && c != '\n' && !is_digit(c) && p < n &&
			     (kvi_tok_utf8_next(s + p, n - p, &c2), is_letter(c2)))) {
		while (p < n) {
			size_t k = (size_t)kvi_tok_utf8_next(s + p, n - p, &c2);
			if (!is_letter(c2))
				break;
			p += k;
		}
		return p;
	}
	if (is_digit(c)) {
		while (p < n && p < (size_t)t->digit_run && is_digit(s[p]))
			p++;
		return p;
	}
	/* punctuation run, optionally after one space, then trailing newlines */
	size_t q = c == ' ' ? l : 0;
	size_t r = q;
	while (r < n) {
		size_t k = (size_t)kvi_tok_utf8_next(s + r, n - r, &c2);
		if (is_space(c2) || is_letter(c2) || is_digit(c2))
			break;
		r += k;
	}
	if (r > q) {
		while (r < n && (s[r] == '\r' || s[r] == '\n'))
			r++;
		return r;
	}
	/* whitespace: through the last newline of the run, else leave one space for the next
	 * piece unless the run ends the text */
	size_t e = 0, last_nl = 0;
	while (e < n && is_space(s[e])) {
		if (s[e] == '\r' || s[e] == '\n')
			last_nl = e + 1;
		e++;
	}
	if (last_nl)
		return last_nl;
	if (e == n || e == 1)
		return e;
	return e - 1;
}

static void gpt2_text(const struct kvi_tok *t, struct work *w, const uint8_t *s, size_t n,
		      struct ivec *o)
{
	while (n) {
		size_t k = pretok_next(t, s, n);
		if (k == 0 || k > n)
			k = 1; /* cannot happen (see utf8_next); never loop or overrun if it did */
		gpt2_piece(t, w, s, k, o);
		s += k;
		n -= k;
	}
}

static void spm_try(const struct kvi_tok *t, struct work *w, int l, int r)
{
	if (l < 0 || r < 0)
		return;
	uint32_t len = w->sym[l].len + w->sym[r].len;
	int32_t id = kvi_tok_find(t, w->buf + w->sym[l].start, len);
	if (id >= 0)
		heap_push(w, (struct cand){-(double)t->score[id], l, r, (int32_t)len, 0});
}

/* SentencePiece BPE over one escaped fragment (spaces already U+2581). */
static void spm_text(const struct kvi_tok *t, struct work *w, const char *s, size_t n,
		     struct ivec *o)
{
	if (!n)
		return;
	if (reserve((void **)&w->sym, &w->cap_sym, n, sizeof(*w->sym))) {
		w->oom = 1;
		return;
	}
	int ns = 0;
	for (size_t i = 0; i < n;) {
		int cp;
		size_t k = (size_t)kvi_tok_utf8_next((const uint8_t *)s + i, n - i, &cp);
		w->sym[ns] = (struct sym){0, ns - 1, -1, (uint32_t)(s + i - w->buf), (uint32_t)k};
		if (ns)
			w->sym[ns - 1].next = ns;
		ns++;
		i += k;
	}
	w->nheap = 0;
	for (int i = 0; i + 1 < ns; i++)
		spm_try(t, w, i, i + 1);
	while (w->nheap) {
		struct cand c = heap_pop(w);
		struct sym *L = &w->sym[c.left], *R = &w->sym[c.right];
		if (!L->len || !R->len || L->next != c.right || L->len + R->len != (uint32_t)c.a)
			continue;
		L->len += R->len;
		L->next = R->next;
		if (R->next >= 0)
			w->sym[R->next].prev = c.left;
		R->len = 0;
		spm_try(t, w, L->prev, c.left);
		spm_try(t, w, c.left, L->next);
	}
	for (int i = 0; i >= 0; i = w->sym[i].next) {
		const char *p = w->buf + w->sym[i].start;
		int32_t id = kvi_tok_find(t, p, w->sym[i].len);
		if (id >= 0 && t->type[id] != TT_UNUSED) {
			push(o, id);
			continue;
		}
		for (uint32_t j = 0; j < w->sym[i].len; j++) {
			int32_t b = t->byte_tok[(uint8_t)p[j]];
			if (b >= 0)
				push(o, b);
			else if (t->unk >= 0 && (j == 0))
				push(o, t->unk); /* one <unk> per symbol */
		}
	}
}

/* Escapes a fragment into w->buf (spaces -> U+2581, optional leading one) and encodes it. */
static void spm_fragment(const struct kvi_tok *t, struct work *w, const uint8_t *s, size_t n,
			 int prefix, struct ivec *o)
{
	if (reserve((void **)&w->buf, &w->cap_buf, 3 * n + 3, 1)) {
		w->oom = 1;
		return;
	}
	size_t bl = 0;
	if (prefix)
		bl += (size_t)kvi_tok_utf8_put(w->buf, 0x2581);
	for (size_t i = 0; i < n; i++) {
		if (s[i] == ' ')
			bl += (size_t)kvi_tok_utf8_put(w->buf + bl, 0x2581);
		else
			w->buf[bl++] = (char)s[i];
	}
	spm_text(t, w, w->buf, bl, o);
}

/* Longest special token starting at s, or -1. */
static int32_t special_at(const struct kvi_tok *t, const uint8_t *s, size_t n)
{
	for (size_t i = 0; i < t->n_specials; i++) {
		int32_t id = t->specials[i].id;
		uint32_t l = t->specials[i].len;
		if (l <= n && (uint8_t)t->arena[t->off[id]] == s[0] &&
		    !memcmp(t->arena + t->off[id], s, l))
			return id;
	}
	return -1;
}

int kvi_tok_encode(const struct kvi_tok *t, const char *text, size_t len, int flags, int32_t *out,
		   size_t max, size_t *n)
{
	struct ivec o = {0};
	struct work w = {0};
	const uint8_t *s = (const uint8_t *)text;
	if ((flags & KVI_TOK_ADD_BOS) && t->bos >= 0)
		push(&o, t->bos);
	size_t i = 0, frag = 0;
	int first = 1;
	while (i <= len) {
		int32_t sp = -1;
		if (i < len && (flags & KVI_TOK_PARSE_SPECIAL))
			sp = special_at(t, s + i, len - i);
		if (sp < 0 && i < len) {
			i++;
			continue;
		}
		if (i > frag) {
			if (t->kind == KVI_TOK_GPT2)
				gpt2_text(t, &w, s + frag, i - frag, &o);
			else
				spm_fragment(t, &w, s + frag, i - frag,
					     first && t->add_space_prefix, &o);
		}
		first = 0;
		if (sp < 0)
			break;
		push(&o, sp);
		i += t->len[sp];
		frag = i;
	}
	int ret = o.oom || w.oom ? -ENOMEM : 0;
	free(w.sym);
	free(w.heap);
	free(w.buf);
	if (!ret) {
		*n = o.n;
		if (o.n && max)
			memcpy(out, o.v, (o.n < max ? o.n : max) * sizeof(int32_t));
		ret = o.n > max ? -ENOSPC : 0;
	}
	free(o.v);
	return ret;
}
