/* Tests for engine/tok.c: gpt2 (byte-level BPE) and llama (SentencePiece) vocabularies built in
 * memory; known merges give the expected ids; encode/decode round-trips ASCII, multi-byte
 * UTF-8, emoji, whitespace runs, invalid UTF-8 and the empty string; special tokens. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "build_tutil.h"
#include "gguf.h"
#include "gguf_write.h"
#include "tok.h"

static int byte_cp(int b)
{
	int n = 0;
	for (int c = 0; c <= b; c++) {
		int direct =
		    (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255);
		if (c == b)
			return direct ? b : 256 + n;
		if (!direct)
			n++;
	}
	return -1;
}

static void cp_utf8(int cp, char *o)
{
	if (cp < 0x80) {
		o[0] = (char)cp;
		o[1] = 0;
	} else {
		o[0] = (char)(0xc0 | (cp >> 6));
		o[1] = (char)(0x80 | (cp & 0x3f));
		o[2] = 0;
	}
}

struct fixture {
	void *buf;
	struct kvi_gguf *g;
	struct kvi_tok *t;
};

static void open_tok(struct kvi_gguf_writer *w, struct fixture *f)
{
	size_t len;
	char err[256];
	assert_int_equal(kvi_gguf_w_write_mem(w, NULL, NULL, &f->buf, &len), 0);
	kvi_gguf_writer_free(w);
	assert_int_equal(kvi_gguf_open_mem(f->buf, len, &f->g, err, sizeof(err)), 0);
	int ret = kvi_tok_create(f->g, &f->t, err, sizeof(err));
	if (ret)
		fail_msg("kvi_tok_create: %s", err);
	/* the tokenizer copies what it needs: the file may go away */
	kvi_gguf_close(f->g);
	free(f->buf);
}

/* ids: 0..255 bytes, 256.. merges, then specials */
static const char *GPT2_MERGES[] = {
    "h e", "l l",	   "he ll", "hell o",	      "\xc4\xa0 w",
    "o r", "\xc4\xa0w or", "l d",   "\xc4\xa0wor ld", "1 2",
};
enum {
	G_HE = 256,
	G_LL,
	G_HELL,
	G_HELLO,
	G_SW,
	G_OR,
	G_SWOR,
	G_LD,
	G_SWORLD,
	G_12,
	G_BOS,
	G_EOS,
	G_FILL,
	G_N
};

static int setup_gpt2_pre(void **state, const char *pre)
{
	static char bytes[256][3];
	const char *toks[G_N];
	int32_t types[G_N];
	for (int b = 0; b < 256; b++) {
		cp_utf8(byte_cp(b), bytes[b]);
		toks[b] = bytes[b];
		types[b] = 1;
	}
	const char *merged[] = {
	    "he", "ll",		 "hell", "hello",	  "\xc4\xa0w",
	    "or", "\xc4\xa0wor", "ld",	 "\xc4\xa0world", "12",
	};
	for (int i = 0; i < 10; i++) {
		toks[256 + i] = merged[i];
		types[256 + i] = 1;
	}
	toks[G_BOS] = "<|bos|>";
	toks[G_EOS] = "<|eos|>";
	types[G_BOS] = types[G_EOS] = 3;
	toks[G_FILL] = "<|filler_267|>"; /* a padding entry, as converted vocabularies have */
	types[G_FILL] = 5;
	struct kvi_gguf_writer *w;
	assert_int_equal(kvi_gguf_writer_create(&w), 0);
	kvi_gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
	kvi_gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, G_N);
	kvi_gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, G_N);
	kvi_gguf_w_arr_str(w, "tokenizer.ggml.merges", GPT2_MERGES, 10);
	if (pre)
		kvi_gguf_w_str(w, "tokenizer.ggml.pre", pre);
	kvi_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", G_BOS);
	kvi_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", G_EOS);
	struct fixture *f = calloc(1, sizeof(*f));
	open_tok(w, f);
	*state = f;
	return 0;
}

static int setup_gpt2(void **state)
{
	return setup_gpt2_pre(state, "llama-bpe");
}

static int setup_qwen2(void **state)
{
	return setup_gpt2_pre(state, "qwen2");
}

enum {
	S_UNK = 0,
	S_BOS,
	S_EOS,
	S_BYTE0,
	S_SP = S_BYTE0 + 256,
	S_H,
	S_E,
	S_L,
	S_O,
	S_W,
	S_R,
	S_D,
	S_SH,
	S_HE,
	S_LL,
	S_SHE,
	S_LLO,
	S_SHELLO,
	S_SW,
	S_OR,
	S_SWOR,
	S_LD,
	S_SWORLD,
	S_N
};

static int setup_spm(void **state)
{
	static char bytes[256][8];
	const char *toks[S_N];
	int32_t types[S_N];
	float scores[S_N];
	toks[S_UNK] = "<unk>";
	toks[S_BOS] = "<s>";
	toks[S_EOS] = "</s>";
	types[S_UNK] = 2;
	types[S_BOS] = types[S_EOS] = 3;
	scores[S_UNK] = scores[S_BOS] = scores[S_EOS] = 0;
	for (int b = 0; b < 256; b++) {
		snprintf(bytes[b], sizeof(bytes[b]), "<0x%02X>", b);
		toks[S_BYTE0 + b] = bytes[b];
		types[S_BYTE0 + b] = 6;
		scores[S_BYTE0 + b] = 0;
	}
	static const struct {
		int id;
		const char *s;
		float score;
	} P[] = {
	    {S_SP, "\xe2\x96\x81", -1},
	    {S_H, "h", -2},
	    {S_E, "e", -2},
	    {S_L, "l", -2},
	    {S_O, "o", -2},
	    {S_W, "w", -2},
	    {S_R, "r", -2},
	    {S_D, "d", -2},
	    {S_SH, "\xe2\x96\x81h", -7},
	    {S_HE, "he", -6},
	    {S_LL, "ll", -5},
	    {S_SHE, "\xe2\x96\x81he", -8},
	    {S_LLO, "llo", -9},
	    {S_SHELLO, "\xe2\x96\x81hello", -12},
	    {S_SW, "\xe2\x96\x81w", -7},
	    {S_OR, "or", -6},
	    {S_SWOR, "\xe2\x96\x81wor", -8},
	    {S_LD, "ld", -5},
	    {S_SWORLD, "\xe2\x96\x81world", -12},
	};
	for (size_t i = 0; i < sizeof(P) / sizeof(P[0]); i++) {
		toks[P[i].id] = P[i].s;
		types[P[i].id] = 1;
		scores[P[i].id] = P[i].score;
	}
	struct kvi_gguf_writer *w;
	assert_int_equal(kvi_gguf_writer_create(&w), 0);
	kvi_gguf_w_str(w, "tokenizer.ggml.model", "llama");
	kvi_gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, S_N);
	kvi_gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, S_N);
	kvi_gguf_w_arr_f32(w, "tokenizer.ggml.scores", scores, S_N);
	kvi_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", S_BOS);
	kvi_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", S_EOS);
	kvi_gguf_w_u32(w, "tokenizer.ggml.unknown_token_id", S_UNK);
	struct fixture *f = calloc(1, sizeof(*f));
	open_tok(w, f);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	kvi_tok_free(f->t);
	free(f);
	return 0;
}

static void expect_ids(const struct kvi_tok *t, const char *text, int flags, const int32_t *want,
		       size_t nwant)
{
	int32_t ids[256];
	size_t n = 0;
	assert_int_equal(kvi_tok_encode(t, text, strlen(text), flags, ids, 256, &n), 0);
	if (n != nwant || memcmp(ids, want, n * sizeof(int32_t))) {
		char got[512] = "";
		for (size_t i = 0; i < n && i < 40; i++)
			snprintf(got + strlen(got), sizeof(got) - strlen(got), "%d ", ids[i]);
		fail_msg("'%s': got %zu ids [%s], want %zu", text, n, got, nwant);
	}
}

static void roundtrip(const struct kvi_tok *t, const char *text, size_t len, int flags)
{
	size_t cap = len * 4 + 8, n = 0;
	int32_t *ids = malloc(cap * sizeof(int32_t));
	char *out = malloc(len + 16);
	assert_int_equal(kvi_tok_encode(t, text, len, flags, ids, cap, &n), 0);
	for (size_t i = 0; i < n; i++)
		assert_true(ids[i] >= 0 && ids[i] < kvi_tok_n_vocab(t));
	int r = kvi_tok_decode(t, ids, n, 0, out, len + 16);
	if (r != (int)len || memcmp(out, text, len))
		fail_msg("round trip of '%.*s' (%zu bytes, %zu ids) gave %d bytes '%.*s'", (int)len,
			 text, len, n, r, r > 0 ? r : 0, out);
	free(ids);
	free(out);
}

static const char *SAMPLES[] = {
    "",
    "a",
    "hello world",
    "Hello, world! How are you?",
    "  leading and trailing spaces   ",
    "multiple   spaces\n\n\ttabs\r\nand\nnewlines\n",
    "na\xc3\xafve caf\xc3\xa9 r\xc3\xa9sum\xc3\xa9",
    "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe6\x96\x87",
    "emoji \xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd mix",
    "it's don't WE'LL they're I'm you've he'd",
    "numbers 1234567 and 3.14159, x=42;",
    "code: for (int i = 0; i < n; i++) { x[i] += 1; }",
    "\xff\xfe invalid \xc3 utf8 \xe2\x82",
    "\xc0\x8d\xff 12345\x01 overlong \xe0\x80\x8a \xed\xa0\x80 \xf4\x90\x80\x80 end",
    " ",
    "\n",
    "<|bos|> not special unless asked",
};

static void test_gpt2_known(void **state)
{
	struct fixture *f = *state;
	const struct kvi_tok *t = f->t;
	assert_int_equal(kvi_tok_kind(t), KVI_TOK_GPT2);
	assert_int_equal(kvi_tok_n_vocab(t), G_N);
	assert_int_equal(kvi_tok_bos(t), G_BOS);
	assert_int_equal(kvi_tok_eos(t), G_EOS);
	assert_true(kvi_tok_is_eog(t, G_EOS));
	assert_false(kvi_tok_is_eog(t, G_BOS));
	assert_false(kvi_tok_wants_bos(t));
	expect_ids(t, "hello world", 0, (int32_t[]){G_HELLO, G_SWORLD}, 2);
	expect_ids(t, "hellohello", 0, (int32_t[]){G_HELLO, G_HELLO}, 2);
	expect_ids(t, " worlds", 0, (int32_t[]){G_SWORLD, 's'}, 2);
	expect_ids(t, "hel", 0, (int32_t[]){G_HE, 'l'}, 2);
	expect_ids(t, "hello", KVI_TOK_ADD_BOS, (int32_t[]){G_BOS, G_HELLO}, 2);
	/* ' ' is byte 32 -> U+0120; 'x' alone */
	expect_ids(t, " x", 0, (int32_t[]){' ', 'x'}, 2);
	/* digits split in groups of three, then merged */
	expect_ids(t, "123412", 0, (int32_t[]){G_12, '3', '4', G_12}, 4);
	expect_ids(t, "<|eos|>hello<|bos|>", KVI_TOK_PARSE_SPECIAL,
		   (int32_t[]){G_EOS, G_HELLO, G_BOS}, 3);
	size_t n;
	int32_t ids[4];
	assert_int_equal(kvi_tok_encode(t, "<|eos|>", 7, 0, ids, 4, &n), -ENOSPC);
	assert_int_equal(n, 7); /* "<|", "eos", "|>": 7 byte tokens */
	char buf[32];
	assert_int_equal(kvi_tok_decode_piece(t, G_SWORLD, 0, buf, sizeof(buf)), 6);
	assert_string_equal(buf, " world");
	assert_int_equal(kvi_tok_decode_piece(t, G_EOS, 0, buf, sizeof(buf)), 0);
	assert_int_equal(kvi_tok_decode_piece(t, G_EOS, KVI_TOK_RENDER_SPECIAL, buf, sizeof(buf)),
			 7);
	assert_string_equal(buf, "<|eos|>");
	assert_int_equal(kvi_tok_decode_piece(t, G_SWORLD, 0, buf, 6), -ENOSPC);
	assert_int_equal(kvi_tok_decode_piece(t, -1, 0, buf, sizeof(buf)), -EINVAL);
	assert_int_equal(kvi_tok_decode_piece(t, G_N, 0, buf, sizeof(buf)), -EINVAL);
	/* unused (padding) tokens render as nothing, special or not, as llama.cpp renders them */
	assert_int_equal(kvi_tok_decode_piece(t, G_FILL, 0, buf, sizeof(buf)), 0);
	assert_string_equal(buf, "");
	assert_int_equal(kvi_tok_decode_piece(t, G_FILL, KVI_TOK_RENDER_SPECIAL, buf, sizeof(buf)),
			 0);
	assert_string_equal(buf, "");
	assert_int_equal(kvi_tok_find(t, "hello", 5), G_HELLO);
	assert_int_equal(kvi_tok_find(t, "nope", 4), -ENOENT);
}

/* Reference BPE: rescan for the lowest-rank pair (leftmost on ties) after every merge. */
static size_t naive_bpe(const struct kvi_tok *t, const char *s, size_t n, int32_t *ids)
{
	int32_t a[10], b[10], m[10];
	for (int i = 0; i < 10; i++) {
		const char *sp = strchr(GPT2_MERGES[i], ' ');
		char cat[32];
		size_t la = (size_t)(sp - GPT2_MERGES[i]);
		a[i] = kvi_tok_find(t, GPT2_MERGES[i], la);
		b[i] = kvi_tok_find(t, sp + 1, strlen(sp + 1));
		snprintf(cat, sizeof(cat), "%.*s%s", (int)la, GPT2_MERGES[i], sp + 1);
		m[i] = kvi_tok_find(t, cat, strlen(cat));
	}
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		ids[k++] = (uint8_t)s[i]; /* the fixture's byte tokens are ids 0..255 */
	for (;;) {
		int best = -1;
		size_t at = 0;
		for (size_t i = 0; i + 1 < k; i++)
			for (int r = 0; r < 10; r++)
				if (ids[i] == a[r] && ids[i + 1] == b[r] &&
				    (best < 0 || r < best)) {
					best = r;
					at = i;
				}
		if (best < 0)
			return k;
		ids[at] = m[best];
		memmove(ids + at + 1, ids + at + 2, (k - at - 2) * sizeof(int32_t));
		k--;
	}
}

/* The heap-based BPE gives the same ids as the reference on random single-piece words. */
static void test_bpe_matches_naive(void **state)
{
	struct fixture *f = *state;
	static const char alpha[] = "helowrd";
	uint64_t rng = 2024;
	char s[256];
	int32_t got[256], want[256];
	for (int it = 0; it < 2000; it++) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		size_t n = 8 + (size_t)(rng >> 33) % 200;
		for (size_t i = 0; i < n; i++) {
			rng = rng * 6364136223846793005ull + 1442695040888963407ull;
			s[i] = alpha[(rng >> 33) % 7];
		}
		size_t k = 0;
		assert_int_equal(kvi_tok_encode(f->t, s, n, 0, got, 256, &k), 0);
		size_t kw = naive_bpe(f->t, s, n, want);
		if (k != kw || memcmp(got, want, k * sizeof(int32_t)))
			fail_msg("'%.*s': %zu ids, reference %zu", (int)n, s, k, kw);
	}
}

/* Reference SentencePiece: rescan for the best-scoring mergeable pair after every merge. */
static size_t naive_spm(const struct kvi_tok *t, const char *text, size_t n, int32_t *ids)
{
	char buf[1024];
	size_t bl = 0;
	uint32_t st[512], ln[512];
	size_t k = 0;
	memcpy(buf, "\xe2\x96\x81", 3);
	bl = 3;
	for (size_t i = 0; i < n; i++) {
		if (text[i] == ' ') {
			memcpy(buf + bl, "\xe2\x96\x81", 3);
			bl += 3;
		} else {
			buf[bl++] = text[i];
		}
	}
	for (size_t i = 0; i < bl;) { /* ASCII or U+2581 only */
		size_t cl = (uint8_t)buf[i] == 0xe2 ? 3 : 1;
		st[k] = (uint32_t)i;
		ln[k++] = (uint32_t)cl;
		i += cl;
	}
	for (;;) {
		int best = -1;
		float bs = 0;
		for (size_t i = 0; i + 1 < k; i++) {
			int32_t id = kvi_tok_find(t, buf + st[i], ln[i] + ln[i + 1]);
			if (id < 0)
				continue;
			float sc = -1e9f;
			/* the fixture's scores: recover them through the known ids */
			static const struct {
				int id;
				float s;
			} SC[] = {{S_SP, -1},	{S_H, -2},	 {S_E, -2},	 {S_L, -2},
				  {S_O, -2},	{S_W, -2},	 {S_R, -2},	 {S_D, -2},
				  {S_SH, -7},	{S_HE, -6},	 {S_LL, -5},	 {S_SHE, -8},
				  {S_LLO, -9},	{S_SHELLO, -12}, {S_SW, -7},	 {S_OR, -6},
				  {S_SWOR, -8}, {S_LD, -5},	 {S_SWORLD, -12}};
			for (size_t j = 0; j < sizeof(SC) / sizeof(SC[0]); j++)
				if (SC[j].id == id)
					sc = SC[j].s;
			if (best < 0 || sc > bs) {
				best = (int)i;
				bs = sc;
			}
		}
		if (best < 0)
			break;
		ln[best] += ln[best + 1];
		memmove(st + best + 1, st + best + 2, (k - (size_t)best - 2) * sizeof(uint32_t));
		memmove(ln + best + 1, ln + best + 2, (k - (size_t)best - 2) * sizeof(uint32_t));
		k--;
	}
	size_t o = 0;
	for (size_t i = 0; i < k; i++) {
		int32_t id = kvi_tok_find(t, buf + st[i], ln[i]);
		if (id >= 0) {
			ids[o++] = id;
			continue;
		}
		for (uint32_t j = 0; j < ln[i]; j++)
			ids[o++] = S_BYTE0 + (uint8_t)buf[st[i] + j];
	}
	return o;
}

static void test_spm_matches_naive(void **state)
{
	struct fixture *f = *state;
	static const char alpha[] = "helowrd  ";
	uint64_t rng = 77;
	char s[200];
	int32_t got[1024], want[1024];
	for (int it = 0; it < 2000; it++) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		size_t n = 1 + (size_t)(rng >> 33) % 150;
		for (size_t i = 0; i < n; i++) {
			rng = rng * 6364136223846793005ull + 1442695040888963407ull;
			s[i] = alpha[(rng >> 33) % 9];
		}
		size_t k = 0;
		assert_int_equal(kvi_tok_encode(f->t, s, n, 0, got, 1024, &k), 0);
		size_t kw = naive_spm(f->t, s, n, want);
		if (k != kw || memcmp(got, want, k * sizeof(int32_t)))
			fail_msg("'%.*s': %zu ids, reference %zu", (int)n, s, k, kw);
	}
}

/* Random byte strings biased to the interesting bytes (UTF-8 lead and continuation bytes,
 * whitespace, digits, quotes) round-trip: a cheap, deterministic cousin of fuzz_tok. */
static void test_random_bytes(void **state)
{
	struct fixture *f = *state;
	static const uint8_t pick[] = {0xc0, 0xc3, 0xe2, 0xed, 0xf0, 0xf4, 0xff, 0x80, 0x8d, 0x96,
				       0x81, 0xbf, ' ',	 '\n', '\r', '\t', '1',	 '2',  '\'', 's',
				       'a',  'Z',  '.',	 '<',  '|',  '>',  0x00, 0x7f};
	uint64_t rng = 4242;
	uint8_t s[96];
	for (int it = 0; it < 3000; it++) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		size_t n = (size_t)(rng >> 33) % sizeof(s);
		for (size_t i = 0; i < n; i++) {
			rng = rng * 6364136223846793005ull + 1442695040888963407ull;
			unsigned r = (unsigned)(rng >> 33);
			s[i] = r & 1 ? pick[(r >> 1) % sizeof(pick)] : (uint8_t)(r >> 8);
		}
		int marker = 0;
		for (size_t i = 0; i + 2 < n; i++)
			marker |= s[i] == 0xe2 && s[i + 1] == 0x96 && s[i + 2] == 0x81;
		if (kvi_tok_kind(f->t) == KVI_TOK_SPM && marker)
			continue; /* SentencePiece reads U+2581 as a space (tok.h) */
		roundtrip(f->t, (const char *)s, n, it & 1 ? KVI_TOK_ADD_BOS : 0);
	}
}

/* Qwen2's pre-tokenizer splits digits one by one: "12" never merges. */
static void test_qwen2_digits(void **state)
{
	struct fixture *f = *state;
	expect_ids(f->t, "a 123", 0, (int32_t[]){'a', ' ', '1', '2', '3'}, 5);
	expect_ids(f->t, "hello world", 0, (int32_t[]){G_HELLO, G_SWORLD}, 2);
}

/* The vocabulary kvinfer-synth writes (built next to this test) loads and round-trips. */
static void test_synth_vocab(void **state)
{
	(void)state;
	const char *bd = tu_need_build_dir();
	char cmd[1024], path[] = "/tmp/test_tok_synth_XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	close(fd);
	snprintf(cmd, sizeof(cmd),
		 "%s/tools/kvinfer-synth --preset tiny-qwen2 --type f32 -o %s >/dev/null", bd,
		 path);
	assert_int_equal(system(cmd), 0);
	struct kvi_gguf *g;
	struct kvi_tok *t;
	char err[256];
	assert_int_equal(kvi_gguf_open(path, &g, err, sizeof(err)), 0);
	if (kvi_tok_create(g, &t, err, sizeof(err)))
		fail_msg("%s", err);
	kvi_gguf_close(g);
	unlink(path);
	assert_int_equal(kvi_tok_n_vocab(t), 512);
	assert_true(kvi_tok_is_eog(t, kvi_tok_eos(t)));
	/* " the" was merged by the generator: one token */
	int32_t ids[8];
	size_t n;
	assert_int_equal(kvi_tok_encode(t, " the", 4, 0, ids, 8, &n), 0);
	assert_int_equal(n, 1);
	for (size_t i = 0; i < sizeof(SAMPLES) / sizeof(SAMPLES[0]); i++)
		roundtrip(t, SAMPLES[i], strlen(SAMPLES[i]), KVI_TOK_ADD_BOS);
	kvi_tok_free(t);
}

static void test_roundtrip(void **state)
{
	struct fixture *f = *state;
	for (size_t i = 0; i < sizeof(SAMPLES) / sizeof(SAMPLES[0]); i++) {
		roundtrip(f->t, SAMPLES[i], strlen(SAMPLES[i]), 0);
		roundtrip(f->t, SAMPLES[i], strlen(SAMPLES[i]), KVI_TOK_ADD_BOS);
	}
	/* every byte value, including NUL */
	char all[512];
	for (int i = 0; i < 512; i++)
		all[i] = (char)(i * 7 + 3);
	roundtrip(f->t, all, sizeof(all), 0);
	/* a long prompt: many pieces, long whitespace and letter runs */
	size_t n = 0, cap = 64 * 1024;
	char *big = malloc(cap);
	uint64_t s = 99;
	while (n + 64 < cap) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		unsigned r = (unsigned)(s >> 33);
		const char *p = SAMPLES[r % (sizeof(SAMPLES) / sizeof(SAMPLES[0]))];
		size_t l = strlen(p);
		memcpy(big + n, p, l);
		n += l;
		if (r & 0x100)
			for (unsigned k = 0; k < (r >> 12) % 40; k++)
				big[n++] = (r & 0x200) ? ' ' : 'a';
	}
	roundtrip(f->t, big, n, 0);
	free(big);
}

static void test_spm_known(void **state)
{
	struct fixture *f = *state;
	const struct kvi_tok *t = f->t;
	assert_int_equal(kvi_tok_kind(t), KVI_TOK_SPM);
	assert_true(kvi_tok_wants_bos(t));
	assert_true(kvi_tok_is_eog(t, S_EOS));
	expect_ids(t, "hello world", 0, (int32_t[]){S_SHELLO, S_SWORLD}, 2);
	expect_ids(t, "hello world", KVI_TOK_ADD_BOS, (int32_t[]){S_BOS, S_SHELLO, S_SWORLD}, 3);
	expect_ids(t, "hi", 0, (int32_t[]){S_SH, S_BYTE0 + 'i'}, 2);
	expect_ids(t, "", KVI_TOK_ADD_BOS, (int32_t[]){S_BOS}, 1);
	expect_ids(t, "\xc3\xa9", 0, (int32_t[]){S_SP, S_BYTE0 + 0xc3, S_BYTE0 + 0xa9}, 3);
	expect_ids(t, "</s>hello", KVI_TOK_PARSE_SPECIAL, (int32_t[]){S_EOS, S_HE, S_LLO}, 3);
	char buf[32];
	assert_int_equal(kvi_tok_decode_piece(t, S_SWORLD, 0, buf, sizeof(buf)), 6);
	assert_string_equal(buf, " world");
	assert_int_equal(kvi_tok_decode_piece(t, S_BYTE0 + 'A', 0, buf, sizeof(buf)), 1);
	assert_string_equal(buf, "A");
	assert_int_equal(
	    kvi_tok_decode(t, (int32_t[]){S_BOS, S_SHELLO, S_SWORLD}, 3, 0, buf, sizeof(buf)), 11);
	assert_string_equal(buf, "hello world");
}

/* Malformed tokenizer metadata is rejected with a message. */
static void test_bad_metadata(void **state)
{
	(void)state;
	struct {
		const char *model;
		int tokens, merges, scores, bad_bos;
		const char *want;
	} C[] = {
	    {NULL, 1, 1, 0, 0, "no tokenizer"},
	    {"bert", 1, 1, 0, 0, "unsupported tokenizer 'bert'"},
	    {"gpt2", 0, 1, 0, 0, "tokenizer.ggml.tokens"},
	    {"gpt2", 1, 0, 0, 0, "tokenizer.ggml.merges"},
	    {"gpt2", 2, 1, 0, 0, "lacks the byte token"},
	    {"llama", 1, 0, 0, 0, "tokenizer.ggml.scores"},
	    {"gpt2", 1, 1, 0, 1, "bos_token_id"},
	};
	static char bytes[256][3];
	const char *toks[256];
	for (int b = 0; b < 256; b++) {
		cp_utf8(byte_cp(b), bytes[b]);
		toks[b] = bytes[b];
	}
	for (size_t i = 0; i < sizeof(C) / sizeof(C[0]); i++) {
		struct kvi_gguf_writer *w;
		assert_int_equal(kvi_gguf_writer_create(&w), 0);
		if (C[i].model)
			kvi_gguf_w_str(w, "tokenizer.ggml.model", C[i].model);
		if (C[i].tokens)
			kvi_gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks,
					   C[i].tokens == 2 ? 200 : 256);
		if (C[i].merges)
			kvi_gguf_w_arr_str(w, "tokenizer.ggml.merges", GPT2_MERGES, 2);
		if (C[i].bad_bos)
			kvi_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 999);
		void *buf;
		size_t len;
		assert_int_equal(kvi_gguf_w_write_mem(w, NULL, NULL, &buf, &len), 0);
		kvi_gguf_writer_free(w);
		struct kvi_gguf *g;
		char err[256];
		assert_int_equal(kvi_gguf_open_mem(buf, len, &g, err, sizeof(err)), 0);
		struct kvi_tok *t = NULL;
		assert_true(kvi_tok_create(g, &t, err, sizeof(err)) < 0);
		if (!strstr(err, C[i].want))
			fail_msg("case %zu: want '%s' in '%s'", i, C[i].want, err);
		assert_null(t);
		kvi_gguf_close(g);
		free(buf);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_gpt2_known, setup_gpt2, teardown),
	    cmocka_unit_test_setup_teardown(test_roundtrip, setup_gpt2, teardown),
	    cmocka_unit_test_setup_teardown(test_spm_known, setup_spm, teardown),
	    cmocka_unit_test_setup_teardown(test_roundtrip, setup_spm, teardown),
	    cmocka_unit_test_setup_teardown(test_bpe_matches_naive, setup_gpt2, teardown),
	    cmocka_unit_test_setup_teardown(test_spm_matches_naive, setup_spm, teardown),
	    cmocka_unit_test_setup_teardown(test_random_bytes, setup_gpt2, teardown),
	    cmocka_unit_test_setup_teardown(test_random_bytes, setup_spm, teardown),
	    cmocka_unit_test_setup_teardown(test_qwen2_digits, setup_qwen2, teardown),
	    cmocka_unit_test_setup_teardown(test_roundtrip, setup_qwen2, teardown),
	    cmocka_unit_test(test_synth_vocab),
	    cmocka_unit_test(test_bad_metadata),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
