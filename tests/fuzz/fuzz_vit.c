/* libFuzzer target: the vision tower's mmproj loader (engine/vit.c) on hostile GGUF buffers:
 * every clip.* key check, every tensor shape and type check, the vector conversions and the
 * fingerprint; towers small enough to run are encoded once too (a zero image), so a loader
 * check that lets a bad shape through shows up as an out-of-bounds access under ASan.
 * Hostile files must only fail, with -EINVAL and a message. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "vit.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kvi_gguf *g;
	char err[256];
	if (kvi_gguf_open_mem(data, size, &g, err, sizeof(err)))
		return 0;
	struct vit *v;
	int ret = vit_from_gguf(g, 1, &v, err, sizeof(err));
	if (ret) {
		if (!err[0] && ret == -22)
			abort(); /* every -EINVAL names its cause */
		return 0;
	}
	const struct vit_info *I = vit_get_info(v);
	size_t S = (size_t)I->image_size, T = (size_t)I->n_patches + (size_t)I->has_class;
	/* encode only towers that take milliseconds: the fuzzer's time is for the loader */
	if (T * T * (size_t)I->n_embd < (1u << 22) &&
	    (size_t)I->n_layer_run * T * (size_t)I->n_embd * (size_t)(I->n_embd + I->n_ff) <
		(1u << 26) &&
	    T * (size_t)I->n_mm_hidden * (size_t)(I->n_embd + I->n_embd_out) < (1u << 26)) {
		float *px = calloc(3 * S * S, sizeof(float));
		float *out =
		    malloc((size_t)vit_n_tokens(v) * (size_t)vit_n_embd_out(v) * sizeof(float));
		if (px && out)
			vit_encode(v, px, out);
		free(px);
		free(out);
	}
	vit_free(v);
	return 0;
}
