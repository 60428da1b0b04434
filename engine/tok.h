/* tok — the tokenizer stored in a GGUF file's metadata.
 *
 * Two kinds, chosen by tokenizer.ggml.model:
 *   "gpt2"  byte-level BPE (Llama 3, Qwen2): tokens, merges (ranked by order), token_type.
 *           Text is pre-tokenized with a hand-written equivalent of the Llama-3 split regex
 *           (docs/gguf.md lists the simplifications), each piece is mapped through GPT-2's
 *           byte-to-unicode table and merged pair by pair, lowest rank first.
 *   "llama" SentencePiece BPE (Llama 1/2, Mistral): tokens, scores, token_type. Spaces become
 *           U+2581, a leading one is added (tokenizer.ggml.add_space_prefix, default true), the
 *           highest-scoring adjacent merge that is in the vocabulary is applied first, and
 *           pieces outside the vocabulary fall back to <0xXX> byte tokens.
 * Both run in O(n log n) per piece (heap of candidate merges, hashed pair/text lookups).
 *
 * decode(encode(s)) == s for any byte string s (valid UTF-8 or not, for gpt2; for llama, any
 * s whose bytes all have byte tokens and that holds no U+2581, which SentencePiece reads as a
 * space) when control tokens (BOS/EOS...) are skipped: they decode to "" unless
 * KVI_TOK_RENDER_SPECIAL is given. Encoding with KVI_TOK_PARSE_SPECIAL does not promise it.
 * Tokens typed unused (vocabulary padding such as <|filler_N|>) always decode to "", as in
 * llama.cpp.
 *
 * Thread-safety: a created tokenizer is immutable; encode/decode may run concurrently (each
 * call allocates its own scratch).
 */
#ifndef KVFS_KVI_TOK_H
#define KVFS_KVI_TOK_H

#include <stddef.h>
#include <stdint.h>

struct kvi_gguf;
struct kvi_tok;

enum kvi_tok_kind {
	KVI_TOK_GPT2 = 1,
	KVI_TOK_SPM = 2,
};

/* Flags for encode / decode. */
#define KVI_TOK_ADD_BOS 1 /* prepend BOS (encode; ignored when the vocab has none) */
#define KVI_TOK_PARSE_SPECIAL                                                                      \
	2			 /* control/user-defined token texts in the input become those     \
				    tokens (e.g. "<|eot_id|>"); otherwise they are plain text */
#define KVI_TOK_RENDER_SPECIAL 4 /* decode control tokens to their text instead of "" */

/* Builds a tokenizer from g's metadata (copied: g may be closed afterwards). Returns 0,
 * -ENOENT when the file has no tokenizer, -EINVAL (message in err) when it is malformed or of
 * an unsupported kind, -ENOMEM. */
int kvi_tok_create(const struct kvi_gguf *g, struct kvi_tok **out, char *err, size_t errlen);
void kvi_tok_free(struct kvi_tok *t); /* NULL is a no-op */

/* Encodes len bytes of text (need not be NUL-terminated). Writes at most max ids to out and
 * the full count to *n. Returns 0, or -ENOSPC when *n > max (out holds the first max). */
int kvi_tok_encode(const struct kvi_tok *t, const char *text, size_t len, int flags, int32_t *out,
		   size_t max, size_t *n);

/* Bytes of token id as text, written to buf (NUL-terminated when it fits). Returns the byte
 * count (without NUL), -EINVAL for an id outside the vocabulary, -ENOSPC if cap <= count. */
int kvi_tok_decode_piece(const struct kvi_tok *t, int32_t id, int flags, char *buf, size_t cap);

/* Decodes a sequence; for SentencePiece vocabularies the space added by encode in front of the
 * text is removed again. Same returns as decode_piece. */
int kvi_tok_decode(const struct kvi_tok *t, const int32_t *ids, size_t n, int flags, char *buf,
		   size_t cap);

enum kvi_tok_kind kvi_tok_kind(const struct kvi_tok *t);
int32_t kvi_tok_n_vocab(const struct kvi_tok *t);
int32_t kvi_tok_bos(const struct kvi_tok *t); /* -1 when absent */
int32_t kvi_tok_eos(const struct kvi_tok *t); /* -1 when absent */
/* tokenizer.ggml.add_bos_token (default: 1 for llama, 0 for gpt2 without the key). */
int kvi_tok_wants_bos(const struct kvi_tok *t);
/* End of generation: EOS, EOT (tokenizer.ggml.eot_token_id / eom_token_id) and the usual
 * end markers when present (<|eot_id|>, <|im_end|>, <|endoftext|>, </s>). */
int kvi_tok_is_eog(const struct kvi_tok *t, int32_t id);
/* Raw vocabulary text of id (not NUL-terminated), or NULL. */
const char *kvi_tok_text(const struct kvi_tok *t, int32_t id, size_t *len);
/* Id of the token whose raw text is exactly s[0..len), or -ENOENT. */
int32_t kvi_tok_find(const struct kvi_tok *t, const char *s, size_t len);

#endif
