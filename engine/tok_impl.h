/* tok_impl — private to tok.c / tok_encode.c: the tokenizer's tables. */
#ifndef KVFS_KVI_TOK_IMPL_H
#define KVFS_KVI_TOK_IMPL_H

#include "tok.h"

#include <stddef.h>
#include <stdint.h>

/* llama.cpp / GGUF token types */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

struct pair {
	uint64_t key; /* (left << 32 | right) + 1; 0 = empty slot */
	int32_t rank, merged;
};

struct special {
	uint32_t len;
	int32_t id;
};

/* Longest first, so a special that is a prefix of another never shadows it. */

struct kvi_tok {
	enum kvi_tok_kind kind;
	int32_t n;
	char *arena;
	size_t *off;
	uint32_t *len;
	float *score;
	int32_t *type;
	uint32_t *htab; /* id + 1 */
	size_t hmask;
	int32_t bos, eos, unk;
	int32_t eog[8];
	int n_eog;
	int add_bos, add_space_prefix;
	int digit_run; /* pre-tokenizer: longest run of digits in one piece (llama3 3, qwen2 1) */
	int ignore_merges; /* gpt2, Llama-3 pre-tokenizers: whole-piece tokens skip the merges */
	int32_t byte_tok[256];
	uint16_t byte_cp[256]; /* gpt2: byte -> code point */
	int16_t cp_byte[512];  /* gpt2: code point -> byte, -1 if none */
	struct pair *pairs;
	size_t pmask;
	struct special *specials; /* control / user-defined tokens, longest first */
	size_t n_specials;
};

/* UTF-8 helpers: put writes cp (< 0x10000) and returns its length; next decodes one code point
 * of s[0..n), n >= 1, returning its length, with cp = -1 and length 1 for an invalid byte. */
int kvi_tok_utf8_put(char *o, unsigned cp);
int kvi_tok_utf8_next(const uint8_t *s, size_t n, int *cp);

#endif
