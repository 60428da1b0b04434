/* libFuzzer target: GGUF parsing from a buffer, every metadata accessor, model building
 * (shape checks + SHA-256 over the tensor bytes) and the tokenizer (create, encode, decode).
 * Any crash, leak or out-of-bounds read (ASan) is a bug: hostile files must only fail. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "model.h"
#include "tok.h"

static void poke_metadata(const struct kvi_gguf *g)
{
	volatile uint32_t sink = 0;
	for (size_t i = 0; i < kvi_gguf_n_kv(g); i++) {
		const char *key = kvi_gguf_kv_key(g, i);
		uint32_t u;
		int32_t s;
		float f;
		int b;
		const char *str;
		size_t len;
		kvi_gguf_get_u32(g, key, &u);
		kvi_gguf_get_i32(g, key, &s);
		kvi_gguf_get_f32(g, key, &f);
		kvi_gguf_get_bool(g, key, &b);
		if (!kvi_gguf_get_str(g, key, &str, &len) && len)
			sink += (uint8_t)str[0] + (uint8_t)str[len - 1];
		enum kvi_gguf_type et;
		uint64_t cnt;
		if (kvi_gguf_get_arr(g, key, &et, &cnt) || !cnt)
			continue;
		int64_t k = kvi_gguf_find_kv(g, key);
		uint64_t idx[2] = {0, cnt - 1};
		for (int j = 0; j < 2; j++) {
			if (!kvi_gguf_arr_str(g, k, idx[j], &str, &len) && len)
				sink += (uint8_t)str[len - 1];
			kvi_gguf_arr_f32(g, k, idx[j], &f);
			kvi_gguf_arr_i32(g, k, idx[j], &s);
		}
	}
	for (size_t i = 0; i < kvi_gguf_n_tensors(g); i++) {
		const struct kvi_gguf_tensor *t = kvi_gguf_tensor(g, i);
		if (t->nbytes)
			sink += ((const uint8_t *)t->data)[0] +
				((const uint8_t *)t->data)[t->nbytes - 1];
		if (kvi_gguf_find_tensor(g, t->name) != t)
			abort();
	}
	(void)sink;
}

static void poke_tok(const struct kvi_gguf *g)
{
	struct kvi_tok *t;
	char err[256];
	if (kvi_tok_create(g, &t, err, sizeof(err)))
		return;
	static const char text[] =
	    "Hello, world! \xf0\x9f\x98\x80 it's  12345\n\t<s></s><|eot_id|>";
	int32_t ids[256];
	size_t n;
	int ret = kvi_tok_encode(t, text, sizeof(text) - 1, KVI_TOK_ADD_BOS | KVI_TOK_PARSE_SPECIAL,
				 ids, 256, &n);
	if (ret == 0) {
		char out[2048];
		kvi_tok_decode(t, ids, n, KVI_TOK_RENDER_SPECIAL, out, sizeof(out));
		for (size_t i = 0; i < n; i++) {
			kvi_tok_decode_piece(t, ids[i], 0, out, sizeof(out));
			kvi_tok_is_eog(t, ids[i]);
		}
	}
	kvi_tok_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kvi_gguf *g;
	char err[512];
	if (kvi_gguf_open_mem(data, size, &g, err, sizeof(err)))
		return 0;
	poke_metadata(g);
	poke_tok(g);
	struct kvi_model *m;
	if (kvi_model_from_gguf(g, &m, err, sizeof(err)) == 0)
		kvi_model_free(m);
	return 0;
}
