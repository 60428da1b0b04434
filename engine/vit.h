/* vit — a LLaVA-style vision tower: a CLIP ViT plus the "mlp" projector into a language
 * model's embedding space, loaded from llama.cpp's mmproj GGUF layout (docs/vision.md lists
 * every key and tensor read and the checks applied).
 *
 * Forward: pixels (float CHW, 3 x image_size x image_size, already resized and normalised with
 * vit_image_mean / vit_image_std) -> patch embedding (the conv as a GEMM) + class and position
 * embeddings -> pre-LN -> pre-norm transformer blocks (LayerNorm, non-causal multi-head
 * attention, GELU MLP) -> post-LN -> class token dropped -> projector (linear, GELU, linear) ->
 * vit_n_tokens() rows of vit_n_embd_out() floats. As llama.cpp does for this projector, the
 * last block is not run (LLaVA takes the penultimate layer's features): vit_info().n_layer_run
 * = block_count - 1.
 *
 * Weights stay in the file's read-only mapping (linear layers F32, F16, BF16 or Q8_0, the
 * patch kernel F32/F16/BF16); vectors (norms, biases, class and position embeddings) are
 * converted to f32 at load.
 *
 * Errors: functions return 0 or a negative errno: -EINVAL for a malformed or unsupported file
 * (with a message naming the key or tensor in err, errlen bytes, may be NULL), -ENOMEM, -errno
 * of open/mmap, -EIO for an OpenSSL failure.
 *
 * Thread-safety: vit_encode uses the tower's own thread pool and buffers (and, after
 * vit_use_device, its device context): one vit_encode at a time per struct vit (callers
 * serialise; successive calls may come from different threads). The getters are safe at any time.
 */
#ifndef KVFS_KVI_VIT_H
#define KVFS_KVI_VIT_H

#include <stddef.h>
#include <stdint.h>

struct vit;
struct kvi_gguf;

#define VIT_FINGERPRINT_BYTES 32

struct vit_info {
	int image_size;	 /* pixels per side (square images) */
	int patch_size;	 /* pixels per patch side; divides image_size */
	int n_patches;	 /* (image_size / patch_size)^2 = vit_n_tokens */
	int has_class;	 /* 1 when v.class_embd is present (a token before the patches) */
	int n_embd;	 /* tower width */
	int n_ff;	 /* MLP hidden width */
	int n_head;	 /* attention heads; divides n_embd */
	int n_layer;	 /* clip.vision.block_count: blocks in the file */
	int n_layer_run; /* blocks vit_encode runs: n_layer - 1 */
	int proj_dim;	 /* clip.vision.projection_dim as written (not used by the forward) */
	int n_mm_hidden; /* mm.0 output width */
	int n_embd_out;	 /* mm.2 output width: the language model's embedding size */
	int gelu_quick;	 /* 0: tanh GELU in the blocks (clip.use_gelu true); 1: quick GELU */
	float eps;	 /* LayerNorm epsilon */
};

/* Opens and checks an mmproj file. n_threads >= 1 (the CPU pool's size). *out is freed with
 * vit_free. The SHA-256 fingerprint of the whole file is computed here. */
int vit_load(const char *path, int n_threads, struct vit **out, char *err, size_t errlen);

/* The same from an opened GGUF; takes ownership of g in every case (closed on error, by
 * vit_free otherwise). For files in memory (tests, fuzzing). */
int vit_from_gguf(struct kvi_gguf *g, int n_threads, struct vit **out, char *err, size_t errlen);

/* NULL is a no-op. */
void vit_free(struct vit *v);

/* Encodes one image: pixels holds 3 * image_size^2 floats (CHW, RGB, normalised); out_embd
 * receives vit_n_tokens(v) * vit_n_embd_out(v) floats, token-major. Returns 0, -EINVAL for a
 * NULL argument, or -ERANGE when a value is not finite after the projector (a NaN/Inf pixel or
 * a broken file; out_embd is then unspecified). */
int vit_encode(struct vit *v, const float *pixels, float *out_embd);

/* Moves the forward onto a device backend (kernels/kvk_dev.h; docs/vision.md, "Device
 * path"): backend KVK_DEV_CUDA runs it on GPU `device`, KVK_DEV_HOST on the CPU references
 * (slow, for tests). Every weight is uploaded once (matrices as stored, vectors as f32); from
 * then on vit_encode runs there, with the same contract (pixels in and embeddings out are host
 * memory) and results within docs/vision.md's tolerances of the CPU forward, not bit-equal.
 * Call it once, before any concurrent use. Returns 0, -EINVAL (bad backend, or already on a
 * device), -ENODEV (no such GPU, or no CUDA in this build), -ENOMEM, -EIO (a device error,
 * logged). On failure the tower stays on the CPU and usable. */
int vit_use_device(struct vit *v, int backend, int device);
/* "cpu", or the device backend's name ("host", "cuda"). */
const char *vit_backend(const struct vit *v);

const struct vit_info *vit_get_info(const struct vit *v);
int vit_n_tokens(const struct vit *v);	 /* image embeddings produced per image */
int vit_n_embd_out(const struct vit *v); /* floats per embedding */
int vit_image_size(const struct vit *v);
/* Normalisation the tower expects: pixel = (rgb / 255 - mean[c]) / std[c]. */
void vit_image_mean(const struct vit *v, float mean[3]);
void vit_image_std(const struct vit *v, float std[3]);
/* SHA-256 of the whole mmproj file (metadata and tensor data): a cache key component. */
const uint8_t *vit_fingerprint(const struct vit *v);

#endif
