/* ref_vit — a plain scalar forward of the LLaVA vision tower (engine/vit.h), written to be
 * obviously correct and to share no code with the engine or the kernels: it reads the GGUF
 * itself, decodes weights with its own decoders, convolves directly (no im2col), sums in
 * double, one token at a time. Same semantics as vit_encode (docs/vision.md): class token
 * first, block_count - 1 blocks, class token dropped before the mlp projector. */
#ifndef KVFS_TEST_REF_VIT_H
#define KVFS_TEST_REF_VIT_H

#include "gguf.h"

/* out: n_patches x out_width floats. Returns 0, or -EINVAL when a key or tensor it needs is
 * missing (the caller loaded the file with vit_load first, so that is a test bug). */
int ref_vit_encode(const struct kvi_gguf *g, const float *pixels, float *out);

#endif
