/* img — images in the API, input side: data URLs, PNG/JPEG/WebP decoding (Debian's libpng,
 * libjpeg-turbo and libwebp), the image hash, and the vision tower's preprocessing.
 *
 * Every byte here is untrusted (it comes from a request body). The format is sniffed from the
 * magic bytes, never taken from the data URL's media type (a mismatch between the two is an
 * error). Limits are checked from the header before any pixel is decoded, so a decompression
 * bomb (a small file that declares a huge image) costs only its header. Warnings of the
 * decoders (a truncated JPEG, a bad PNG CRC) are errors: a damaged image is refused, never
 * half-decoded. Thread-safe: no global state.
 *
 * Errors: every function taking err/errlen writes a one-line message naming the problem
 * ("PNG image is 20000x20000, past the 8192-pixel width limit") and returns -EINVAL (not an
 * image, malformed, truncated, unsupported), -E2BIG (past a limit), -EPERM (an http(s) URL the
 * operator does not allow), -ENOTSUP (an allowed http(s) URL: fetching is not implemented) or
 * -ENOMEM.
 */
#ifndef KVFS_IMG_H
#define KVFS_IMG_H

#include <stddef.h>
#include <stdint.h>

enum img_format { IMG_PNG = 1, IMG_JPEG = 2, IMG_WEBP = 3 };

/* Defaults: OpenAI's 20 MB per image, 8192 pixels a side, 4096² pixels in all (48 MiB RGB). */
#define IMG_DEF_MAX_BYTES  ((size_t)20 << 20)
#define IMG_DEF_MAX_SIDE   8192u
#define IMG_DEF_MAX_PIXELS ((uint64_t)4096 * 4096)
/* Most scans of a progressive JPEG: thousands of tiny scans make decoding quadratic (the
 * libjpeg-turbo "-maxscans" advice); real encoders write about 10. */
#define IMG_MAX_JPEG_SCANS 256

struct img_limits {
	size_t max_bytes;    /* encoded image (after base64), 0 = IMG_DEF_MAX_BYTES */
	uint32_t max_width;  /* 0 = IMG_DEF_MAX_SIDE */
	uint32_t max_height; /* 0 = IMG_DEF_MAX_SIDE */
	uint64_t max_pixels; /* width × height, 0 = IMG_DEF_MAX_PIXELS */
	int allow_fetch;     /* 1: http(s) URLs pass the URL check (then -ENOTSUP: no fetcher) */
};

/* Copies *in (NULL = all defaults) into *out with every 0 replaced by its default. */
void img_limits_resolve(const struct img_limits *in, struct img_limits *out);

/* A decoded image: RGB8, row-major, no padding (w × h × 3 bytes). */
struct img_image {
	uint32_t w, h;
	enum img_format fmt; /* what it was encoded as */
	uint8_t *rgb;	     /* malloc'd; img_free frees it */
	/* SHA-256 of the decoded pixels and the size (img_hash): the embedding cache's key
	 * basis. The same pixels give the same hash whatever the encoding (PNG, lossless WebP). */
	uint8_t hash[32];
};

/* Frees im->rgb and zeroes *im. Safe on a zeroed image. */
void img_free(struct img_image *im);

/* The format from the magic bytes: IMG_PNG, IMG_JPEG, IMG_WEBP, or -EINVAL. */
int img_sniff(const void *data, size_t n);
/* "PNG", "JPEG", "WebP" or "unknown". */
const char *img_format_name(int fmt);

/* Decodes an encoded image (n bytes) into *out (RGB8, hash filled). lim NULL = defaults.
 * Conversions to RGB: PNG gray, gray+alpha, palette (with or without tRNS), 1/2/4/16-bit
 * samples and Adam7 interlacing; JPEG gray, YCbCr, CMYK and YCCK (Adobe inverted or not);
 * WebP lossy and lossless. Alpha is dropped (as PIL's convert("RGB") does), not blended.
 * Refused: animated WebP, JPEG with more than IMG_MAX_JPEG_SCANS scans, anything damaged. */
int img_decode(const void *data, size_t n, const struct img_limits *lim, struct img_image *out,
	       char *err, size_t errlen);

/* Parses a URL from an image_url part. "data:image/{png,jpeg,jpg,webp}[;param=value]*;base64,
 * DATA": base64-decodes DATA (RFC 4648, padding optional, no whitespace) into *bytes (malloc'd,
 * caller frees) of *n bytes, checked against lim->max_bytes before decoding; *declared is the
 * media type's format. "http://", "https://": -EPERM unless lim->allow_fetch, then -ENOTSUP
 * ("fetching image URLs is disabled"). Anything else: -EINVAL. len: the URL's length. */
int img_parse_url(const char *url, size_t len, const struct img_limits *lim, uint8_t **bytes,
		  size_t *n, int *declared, char *err, size_t errlen);

/* img_parse_url then img_decode; a data URL whose media type is not the sniffed format is
 * -EINVAL ("data URL says image/png but the data is JPEG"). */
int img_from_url(const char *url, size_t len, const struct img_limits *lim, struct img_image *out,
		 char *err, size_t errlen);

/* SHA-256 over (w as 4 bytes little-endian, h likewise, the w × h × 3 RGB bytes). */
void img_hash(const uint8_t *rgb, uint32_t w, uint32_t h, uint8_t out[32]);

/* The vision tower's input: a square of size × size, normalised per channel. */
struct img_prep {
	int size;	       /* 1..4096 */
	float mean[3], std[3]; /* on the [0, 1] scale; std > 0 */
};
/* CLIP's (OpenAI CLIP ViT) mean and std. */
extern const struct img_prep img_prep_clip224;

/* Resizes im to p->size × p->size and normalises into out (3 × size × size floats, CHW:
 * out[c][y][x] = (v / 255 - mean[c]) / std[c]). The resize stretches to the square (no crop,
 * no padding) with a separable bicubic filter (Keys, a = -0.5), widened by the scale factor
 * when shrinking so every input pixel counts: the convolution PIL's Image.resize(BICUBIC)
 * does, which CLIP's preprocessing uses; each pass rounds to 8 bits as PIL does. Returns 0,
 * -EINVAL (bad p or empty image) or -ENOMEM. */
int img_preprocess(const struct img_image *im, const struct img_prep *p, float *out);

/* The resize alone, RGB8 to RGB8 (ow × oh × 3 into out): what img_preprocess normalises. */
int img_resize(const uint8_t *rgb, uint32_t w, uint32_t h, uint32_t ow, uint32_t oh, uint8_t *out);

#endif
