#include "img.h"

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jpeglib.h>
#include <openssl/evp.h>
#include <png.h>
#include <webp/decode.h>

const struct img_prep img_prep_clip224 = {
    .size = 224,
    .mean = {0.48145466f, 0.4578275f, 0.40821073f},
    .std = {0.26862954f, 0.26130258f, 0.27577711f},
};

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
	if (err && errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return rc;
}

void img_limits_resolve(const struct img_limits *in, struct img_limits *out)
{
	struct img_limits l = in ? *in : (struct img_limits){0};
	if (!l.max_bytes)
		l.max_bytes = IMG_DEF_MAX_BYTES;
	if (!l.max_width)
		l.max_width = IMG_DEF_MAX_SIDE;
	if (!l.max_height)
		l.max_height = IMG_DEF_MAX_SIDE;
	if (!l.max_pixels)
		l.max_pixels = IMG_DEF_MAX_PIXELS;
	*out = l;
}

void img_free(struct img_image *im)
{
	if (!im)
		return;
	free(im->rgb);
	memset(im, 0, sizeof(*im));
}

int img_sniff(const void *data, size_t n)
{
	const uint8_t *p = data;
	static const uint8_t png[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
	if (n >= 8 && !memcmp(p, png, 8))
		return IMG_PNG;
	if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF)
		return IMG_JPEG;
	if (n >= 12 && !memcmp(p, "RIFF", 4) && !memcmp(p + 8, "WEBP", 4))
		return IMG_WEBP;
	return -EINVAL;
}

const char *img_format_name(int fmt)
{
	return fmt == IMG_PNG	 ? "PNG"
	       : fmt == IMG_JPEG ? "JPEG"
	       : fmt == IMG_WEBP ? "WebP"
				 : "unknown";
}

/* The size check every decoder makes from the header, before the pixels. */
static int check_size(const char *what, uint64_t w, uint64_t h, const struct img_limits *l,
		      char *err, size_t errlen)
{
	if (w == 0 || h == 0)
		return fail(err, errlen, -EINVAL, "%s image has a zero size (%llux%llu)", what,
			    (unsigned long long)w, (unsigned long long)h);
	if (w > l->max_width)
		return fail(err, errlen, -E2BIG,
			    "%s image is %llux%llu, past the %u-pixel width limit", what,
			    (unsigned long long)w, (unsigned long long)h, l->max_width);
	if (h > l->max_height)
		return fail(err, errlen, -E2BIG,
			    "%s image is %llux%llu, past the %u-pixel height limit", what,
			    (unsigned long long)w, (unsigned long long)h, l->max_height);
	if (w * h > l->max_pixels)
		return fail(err, errlen, -E2BIG, "%s image is %llux%llu, past the %llu-pixel limit",
			    what, (unsigned long long)w, (unsigned long long)h,
			    (unsigned long long)l->max_pixels);
	return 0;
}

/* ---- PNG ----
 * libpng reports errors by longjmp. The state that must survive one (the pixel buffer, the row
 * pointers) lives in struct png_ctx, owned by the caller of the function that calls setjmp, so
 * no local of the setjmp frame is read after the jump. */

struct png_ctx {
	const uint8_t *p;
	size_t n, off;
	const struct img_limits *lim;
	char *err;
	size_t errlen;
	int rc;
	uint32_t w, h;
	uint8_t *rgb;
	png_bytep *rows;
	char msg[160];
};

static void png_err_fn(png_structp png, png_const_charp msg)
{
	struct png_ctx *c = png_get_error_ptr(png);
	snprintf(c->msg, sizeof(c->msg), "%s", msg);
	png_longjmp(png, 1);
}

static void png_warn_fn(png_structp png, png_const_charp msg)
{
	(void)png;
	(void)msg; /* benign (an unknown chunk, a bad sRGB profile): the real damage is an error */
}

static void png_read_fn(png_structp png, png_bytep out, size_t len)
{
	struct png_ctx *c = png_get_io_ptr(png);
	if (len > c->n - c->off)
		png_error(png, "truncated PNG data");
	memcpy(out, c->p + c->off, len);
	c->off += len;
}

static void png_run(struct png_ctx *c, png_structp png, png_infop info)
{
	if (setjmp(png_jmpbuf(png))) {
		if (!c->rc)
			c->rc = fail(c->err, c->errlen, -EINVAL, "bad PNG image: %s", c->msg);
		return;
	}
	png_set_read_fn(png, c, png_read_fn);
	/* libpng's own guards, as well as ours: ancillary chunks are bounded too (a zTXt bomb) */
	png_set_user_limits(png, 0x7fffffff, 0x7fffffff); /* check_size gives the clear error */
	png_set_chunk_cache_max(png, 128);
	png_set_chunk_malloc_max(png, 1 << 20);
	png_read_info(png, info);
	png_uint_32 w, h;
	int depth, ctype, interlace;
	png_get_IHDR(png, info, &w, &h, &depth, &ctype, &interlace, NULL, NULL);
	if ((c->rc = check_size("PNG", w, h, c->lim, c->err, c->errlen)))
		return;
	if (depth == 16)
		png_set_strip_16(png);
	if (ctype == PNG_COLOR_TYPE_PALETTE)
		png_set_palette_to_rgb(png);
	if (ctype == PNG_COLOR_TYPE_GRAY && depth < 8)
		png_set_expand_gray_1_2_4_to_8(png);
	if (ctype == PNG_COLOR_TYPE_GRAY || ctype == PNG_COLOR_TYPE_GRAY_ALPHA)
		png_set_gray_to_rgb(png);
	/* alpha (and a palette's tRNS, which palette_to_rgb expands to alpha) is dropped, as by
	 * PIL's convert("RGB"); a no-op on images without it */
	png_set_strip_alpha(png);
	if (interlace != PNG_INTERLACE_NONE)
		png_set_interlace_handling(png);
	png_read_update_info(png, info);
	if (png_get_rowbytes(png, info) != (size_t)w * 3 || png_get_channels(png, info) != 3)
		png_error(png, "unexpected PNG layout after conversion");
	c->w = w;
	c->h = h;
	if (!(c->rgb = malloc((size_t)w * h * 3)) || !(c->rows = malloc(h * sizeof(*c->rows)))) {
		c->rc =
		    fail(c->err, c->errlen, -ENOMEM, "out of memory for a %ux%u PNG image", w, h);
		return;
	}
	for (uint32_t y = 0; y < h; y++)
		c->rows[y] = c->rgb + (size_t)y * w * 3;
	png_read_image(png, c->rows);
	png_read_end(png, NULL);
}

static int decode_png(const uint8_t *p, size_t n, const struct img_limits *lim,
		      struct img_image *out, char *err, size_t errlen)
{
	struct png_ctx c = {.p = p, .n = n, .lim = lim, .err = err, .errlen = errlen};
	png_structp png =
	    png_create_read_struct(PNG_LIBPNG_VER_STRING, &c, png_err_fn, png_warn_fn);
	png_infop info = png ? png_create_info_struct(png) : NULL;
	if (!info) {
		png_destroy_read_struct(&png, NULL, NULL);
		return fail(err, errlen, -ENOMEM, "out of memory for a PNG decoder");
	}
	png_run(&c, png, info);
	png_destroy_read_struct(&png, &info, NULL);
	free(c.rows);
	if (c.rc) {
		free(c.rgb);
		return c.rc;
	}
	out->w = c.w;
	out->h = c.h;
	out->rgb = c.rgb;
	return 0;
}

/* ---- JPEG ---- same pattern: the state a longjmp must not lose is in struct jpg_ctx. */

struct jpg_ctx {
	struct jpeg_error_mgr jerr; /* first: libjpeg's err pointer is cast back to the ctx */
	struct jpeg_progress_mgr prog;
	jmp_buf jb;
	const struct img_limits *lim;
	char *err;
	size_t errlen;
	int rc;
	uint32_t w, h;
	uint8_t *rgb;
	uint8_t *row;
	char msg[JMSG_LENGTH_MAX];
};

static void jpg_error_exit(j_common_ptr ci)
{
	struct jpg_ctx *c = (struct jpg_ctx *)ci->err;
	ci->err->format_message(ci, c->msg);
	longjmp(c->jb, 1);
}

/* A warning (premature end of data, corrupt data skipped) means the pixels are partly made
 * up: an error here, not a gray band at the bottom. Trace messages (level >= 0) are ignored. */
static void jpg_emit(j_common_ptr ci, int level)
{
	if (level < 0)
		jpg_error_exit(ci);
}

static void jpg_progress(j_common_ptr ci)
{
	struct jpg_ctx *c = (struct jpg_ctx *)ci->err;
	j_decompress_ptr d = (j_decompress_ptr)ci;
	if (ci->is_decompressor && d->input_scan_number > IMG_MAX_JPEG_SCANS) {
		snprintf(c->msg, sizeof(c->msg), "more than %d scans", IMG_MAX_JPEG_SCANS);
		longjmp(c->jb, 1);
	}
}

static void jpg_run(struct jpg_ctx *c, struct jpeg_decompress_struct *d, const uint8_t *p, size_t n)
{
	if (setjmp(c->jb)) {
		if (!c->rc)
			c->rc = fail(c->err, c->errlen, -EINVAL, "bad JPEG image: %s", c->msg);
		return;
	}
	jpeg_create_decompress(d);
	d->progress = &c->prog;
	jpeg_mem_src(d, p, (unsigned long)n);
	jpeg_read_header(d, TRUE);
	if ((c->rc =
		 check_size("JPEG", d->image_width, d->image_height, c->lim, c->err, c->errlen)))
		return;
	int cmyk = d->jpeg_color_space == JCS_CMYK || d->jpeg_color_space == JCS_YCCK;
	if (cmyk)
		d->out_color_space =
		    JCS_CMYK; /* libjpeg converts YCCK to CMYK; we do CMYK to RGB */
	else if (d->jpeg_color_space == JCS_GRAYSCALE || d->jpeg_color_space == JCS_YCbCr ||
		 d->jpeg_color_space == JCS_RGB)
		d->out_color_space = JCS_RGB;
	else {
		c->rc = fail(c->err, c->errlen, -EINVAL, "JPEG color space %d is not supported",
			     (int)d->jpeg_color_space);
		return;
	}
	jpeg_start_decompress(d);
	if (d->output_components != (cmyk ? 4 : 3)) {
		c->rc = fail(c->err, c->errlen, -EINVAL, "JPEG decodes to %d components",
			     d->output_components);
		return;
	}
	c->w = d->output_width;
	c->h = d->output_height;
	if (!(c->rgb = malloc((size_t)c->w * c->h * 3)) ||
	    !(c->row = malloc((size_t)c->w * (size_t)d->output_components))) {
		c->rc = fail(c->err, c->errlen, -ENOMEM, "out of memory for a %ux%u JPEG image",
			     c->w, c->h);
		return;
	}
	while (d->output_scanline < d->output_height) {
		uint32_t y = d->output_scanline;
		uint8_t *dst = c->rgb + (size_t)y * c->w * 3;
		JSAMPROW r = cmyk ? c->row : dst;
		if (jpeg_read_scanlines(d, &r, 1) != 1) {
			c->rc = fail(c->err, c->errlen, -EINVAL, "bad JPEG image: truncated");
			return;
		}
		if (!cmyk)
			continue;
		/* Adobe's CMYK JPEGs store the inks inverted (255 = no ink); others do not. */
		int inv = d->saw_Adobe_marker;
		for (uint32_t x = 0; x < c->w; x++) {
			unsigned k = inv ? c->row[4 * x + 3] : 255u - c->row[4 * x + 3];
			for (int ch = 0; ch < 3; ch++) {
				unsigned v = inv ? c->row[4 * x + ch] : 255u - c->row[4 * x + ch];
				dst[3 * x + ch] = (uint8_t)((v * k + 127) / 255);
			}
		}
	}
	jpeg_finish_decompress(d);
}

static int decode_jpeg(const uint8_t *p, size_t n, const struct img_limits *lim,
		       struct img_image *out, char *err, size_t errlen)
{
	if (n > 0xFFFFFFFFul)
		return fail(err, errlen, -E2BIG, "JPEG data too large");
	struct jpg_ctx c = {.lim = lim, .err = err, .errlen = errlen};
	struct jpeg_decompress_struct d;
	memset(&d, 0, sizeof(d));
	d.err = jpeg_std_error(&c.jerr);
	c.jerr.error_exit = jpg_error_exit;
	c.jerr.emit_message = jpg_emit;
	c.prog.progress_monitor = jpg_progress;
	jpg_run(&c, &d, p, n);
	jpeg_destroy_decompress(&d); /* safe after a jump at any point, even before create */
	free(c.row);
	if (c.rc) {
		free(c.rgb);
		return c.rc;
	}
	out->w = c.w;
	out->h = c.h;
	out->rgb = c.rgb;
	return 0;
}

/* ---- WebP: no longjmp, plain return codes ---- */

static int decode_webp(const uint8_t *p, size_t n, const struct img_limits *lim,
		       struct img_image *out, char *err, size_t errlen)
{
	WebPBitstreamFeatures f;
	VP8StatusCode st = WebPGetFeatures(p, n, &f);
	if (st == VP8_STATUS_NOT_ENOUGH_DATA)
		return fail(err, errlen, -EINVAL, "bad WebP image: truncated header");
	if (st != VP8_STATUS_OK)
		return fail(err, errlen, -EINVAL, "bad WebP image: header error %d", (int)st);
	if (f.has_animation)
		return fail(err, errlen, -EINVAL, "animated WebP images are not supported");
	int rc = check_size("WebP", (uint64_t)f.width, (uint64_t)f.height, lim, err, errlen);
	if (rc)
		return rc;
	size_t sz = (size_t)f.width * (size_t)f.height * 3;
	uint8_t *rgb = malloc(sz);
	if (!rgb)
		return fail(err, errlen, -ENOMEM, "out of memory for a %dx%d WebP image", f.width,
			    f.height);
	if (!WebPDecodeRGBInto(p, n, rgb, sz, f.width * 3)) {
		free(rgb);
		return fail(err, errlen, -EINVAL, "bad WebP image: truncated or corrupt data");
	}
	out->w = (uint32_t)f.width;
	out->h = (uint32_t)f.height;
	out->rgb = rgb;
	return 0;
}

int img_decode(const void *data, size_t n, const struct img_limits *lim_in, struct img_image *out,
	       char *err, size_t errlen)
{
	struct img_limits lim;
	img_limits_resolve(lim_in, &lim);
	memset(out, 0, sizeof(*out));
	if (n == 0)
		return fail(err, errlen, -EINVAL, "the image is empty");
	if (n > lim.max_bytes)
		return fail(err, errlen, -E2BIG, "the image is %zu bytes, past the %zu-byte limit",
			    n, lim.max_bytes);
	int fmt = img_sniff(data, n);
	int rc;
	switch (fmt) {
	case IMG_PNG:
		rc = decode_png(data, n, &lim, out, err, errlen);
		break;
	case IMG_JPEG:
		rc = decode_jpeg(data, n, &lim, out, err, errlen);
		break;
	case IMG_WEBP:
		rc = decode_webp(data, n, &lim, out, err, errlen);
		break;
	default:
		return fail(err, errlen, -EINVAL,
			    "unsupported image format (not PNG, JPEG or WebP by its first bytes)");
	}
	if (rc)
		return rc;
	out->fmt = (enum img_format)fmt;
	img_hash(out->rgb, out->w, out->h, out->hash);
	return 0;
}

void img_hash(const uint8_t *rgb, uint32_t w, uint32_t h, uint8_t out[32])
{
	uint8_t hdr[8];
	for (int i = 0; i < 4; i++) {
		hdr[i] = (uint8_t)(w >> (8 * i));
		hdr[4 + i] = (uint8_t)(h >> (8 * i));
	}
	EVP_MD_CTX *x = EVP_MD_CTX_new();
	unsigned len = 32;
	/* a failure (no memory for the context) leaves an all-zero hash, which no real image has:
	 * the cache then misses, never confuses two images */
	if (!x || !EVP_DigestInit_ex(x, EVP_sha256(), NULL) || !EVP_DigestUpdate(x, hdr, 8) ||
	    !EVP_DigestUpdate(x, rgb, (size_t)w * h * 3) || !EVP_DigestFinal_ex(x, out, &len))
		memset(out, 0, 32);
	EVP_MD_CTX_free(x);
}

/* ---- URLs ---- */

static int b64_val(unsigned char ch)
{
	if (ch >= 'A' && ch <= 'Z')
		return ch - 'A';
	if (ch >= 'a' && ch <= 'z')
		return ch - 'a' + 26;
	if (ch >= '0' && ch <= '9')
		return ch - '0' + 52;
	if (ch == '+' || ch == '-')
		return 62; /* '-' and '_': the URL-safe alphabet, which some clients send */
	if (ch == '/' || ch == '_')
		return 63;
	return -1;
}

int img_parse_url(const char *url, size_t len, const struct img_limits *lim_in, uint8_t **bytes,
		  size_t *n, int *declared, char *err, size_t errlen)
{
	struct img_limits lim;
	img_limits_resolve(lim_in, &lim);
	*bytes = NULL;
	*n = 0;
	*declared = 0;
	if ((len >= 7 && !strncasecmp(url, "http://", 7)) ||
	    (len >= 8 && !strncasecmp(url, "https://", 8))) {
		if (!lim.allow_fetch)
			return fail(err, errlen, -EPERM,
				    "image URLs over http(s) are not allowed: send the image as a "
				    "data URL (data:image/png;base64,...)");
		return fail(err, errlen, -ENOTSUP, "fetching image URLs is disabled");
	}
	if (len < 5 || strncasecmp(url, "data:", 5) != 0)
		return fail(err, errlen, -EINVAL,
			    "image URL must be a data URL (data:image/png;base64,...)");
	const char *comma = memchr(url, ',', len);
	if (!comma)
		return fail(err, errlen, -EINVAL, "data URL has no ',' before its data");
	const char *mt = url + 5, *end = comma;
	size_t mlen = (size_t)(end - mt);
	static const struct {
		const char *name;
		int fmt;
	} types[] = {{"image/png", IMG_PNG},
		     {"image/jpeg", IMG_JPEG},
		     {"image/jpg", IMG_JPEG},
		     {"image/webp", IMG_WEBP}};
	const char *semi = memchr(mt, ';', mlen);
	size_t tlen = semi ? (size_t)(semi - mt) : mlen;
	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
		if (tlen == strlen(types[i].name) && !strncasecmp(mt, types[i].name, tlen))
			*declared = types[i].fmt;
	if (!*declared)
		return fail(err, errlen, -EINVAL,
			    "data URL media type '%.*s' is not image/png, image/jpeg or image/webp",
			    (int)(tlen > 64 ? 64 : tlen), mt);
	if (mlen < 7 || strncasecmp(end - 7, ";base64", 7) != 0)
		return fail(err, errlen, -EINVAL, "data URL must be base64 (';base64,')");
	const char *d = comma + 1;
	size_t dl = len - (size_t)(d - url);
	while (dl && d[dl - 1] == '=')
		dl--;
	if (len - (size_t)(d - url) - dl > 2 || dl % 4 == 1)
		return fail(err, errlen, -EINVAL, "data URL has bad base64 padding or length");
	size_t out_len = dl / 4 * 3 + (dl % 4 ? dl % 4 - 1 : 0);
	if (out_len == 0)
		return fail(err, errlen, -EINVAL, "data URL holds no data");
	if (out_len > lim.max_bytes)
		return fail(err, errlen, -E2BIG, "the image is %zu bytes, past the %zu-byte limit",
			    out_len, lim.max_bytes);
	uint8_t *o = malloc(out_len);
	if (!o)
		return fail(err, errlen, -ENOMEM, "out of memory for a %zu-byte image", out_len);
	size_t w = 0;
	uint32_t acc = 0;
	for (size_t i = 0; i < dl; i++) {
		int v = b64_val((unsigned char)d[i]);
		if (v < 0) {
			free(o);
			return fail(err, errlen, -EINVAL,
				    "data URL has a byte that is not base64 at offset %zu", i);
		}
		acc = acc << 6 | (uint32_t)v;
		if (i % 4 == 3) {
			o[w++] = (uint8_t)(acc >> 16);
			o[w++] = (uint8_t)(acc >> 8);
			o[w++] = (uint8_t)acc;
			acc = 0;
		}
	}
	if (dl % 4 == 2)
		o[w++] = (uint8_t)(acc >> 4);
	else if (dl % 4 == 3) {
		o[w++] = (uint8_t)(acc >> 10);
		o[w++] = (uint8_t)(acc >> 2);
	}
	*bytes = o;
	*n = w;
	return 0;
}

int img_from_url(const char *url, size_t len, const struct img_limits *lim, struct img_image *out,
		 char *err, size_t errlen)
{
	uint8_t *b;
	size_t n;
	int declared;
	memset(out, 0, sizeof(*out));
	int rc = img_parse_url(url, len, lim, &b, &n, &declared, err, errlen);
	if (rc)
		return rc;
	int fmt = img_sniff(b, n);
	if (fmt > 0 && fmt != declared) {
		free(b);
		return fail(err, errlen, -EINVAL, "data URL says %s but the data is %s",
			    declared == IMG_PNG	   ? "image/png"
			    : declared == IMG_JPEG ? "image/jpeg"
						   : "image/webp",
			    img_format_name(fmt));
	}
	rc = img_decode(b, n, lim, out, err, errlen);
	free(b);
	return rc;
}

/* ---- preprocessing ---- */

/* Keys' cubic convolution kernel with a = -0.5 (PIL's and OpenCV's bicubic). */
static double cubic(double x)
{
	const double a = -0.5;
	x = fabs(x);
	if (x < 1)
		return ((a + 2) * x - (a + 3)) * x * x + 1;
	if (x < 2)
		return (((x - 5) * x + 8) * x - 4) * a;
	return 0;
}

/* The weights of one output coordinate along one axis: the input span [*lo, *lo + *k) and
 * its normalised weights in w (room for the widest span). */
static void axis_weights(uint32_t in, uint32_t out, uint32_t o, double *w, int *lo, int *k)
{
	double scale = (double)in / out, fs = scale > 1 ? scale : 1;
	double support = 2 * fs, center = (o + 0.5) * scale;
	int a = (int)floor(center - support + 0.5), b = (int)floor(center + support + 0.5);
	if (a < 0)
		a = 0;
	if (b > (int)in)
		b = (int)in;
	double sum = 0;
	for (int i = a; i < b; i++)
		sum += w[i - a] = cubic((i + 0.5 - center) / fs);
	for (int i = a; i < b; i++)
		w[i - a] = sum != 0 ? w[i - a] / sum : 0;
	*lo = a;
	*k = b - a;
}

static uint8_t clamp8(double v)
{
	return v <= 0 ? 0 : v >= 255 ? 255 : (uint8_t)(v + 0.5);
}

int img_resize(const uint8_t *rgb, uint32_t w, uint32_t h, uint32_t ow, uint32_t oh, uint8_t *out)
{
	if (!rgb || !w || !h || !ow || !oh)
		return -EINVAL;
	/* the widest span: 2 × support + 1 taps, support = 2 × the shrink factor (at least 1) */
	double fx = (double)w / ow, fy = (double)h / oh, f = fx > fy ? fx : fy;
	size_t maxk = 4 * (size_t)ceil(f > 1 ? f : 1) + 4;
	double *wt = malloc(maxk * sizeof(double));
	uint8_t *tmp = malloc((size_t)ow * h * 3);
	if (!wt || !tmp) {
		free(wt);
		free(tmp);
		return -ENOMEM;
	}
	for (uint32_t x = 0; x < ow; x++) { /* horizontal: w × h -> ow × h */
		int lo, k;
		axis_weights(w, ow, x, wt, &lo, &k);
		for (uint32_t y = 0; y < h; y++)
			for (int c = 0; c < 3; c++) {
				double s = 0;
				for (int i = 0; i < k; i++)
					s +=
					    wt[i] * rgb[((size_t)y * w + (size_t)(lo + i)) * 3 + c];
				tmp[((size_t)y * ow + x) * 3 + c] = clamp8(s);
			}
	}
	for (uint32_t y = 0; y < oh; y++) { /* vertical: ow × h -> ow × oh */
		int lo, k;
		axis_weights(h, oh, y, wt, &lo, &k);
		for (uint32_t x = 0; x < ow; x++)
			for (int c = 0; c < 3; c++) {
				double s = 0;
				for (int i = 0; i < k; i++)
					s += wt[i] * tmp[((size_t)(lo + i) * ow + x) * 3 + c];
				out[((size_t)y * ow + x) * 3 + c] = clamp8(s);
			}
	}
	free(wt);
	free(tmp);
	return 0;
}

int img_preprocess(const struct img_image *im, const struct img_prep *p, float *out)
{
	if (!im || !p || !out || p->size < 1 || p->size > 4096 || !im->rgb || !im->w || !im->h)
		return -EINVAL;
	for (int c = 0; c < 3; c++)
		if (!(p->std[c] > 0) || !isfinite(p->mean[c]))
			return -EINVAL;
	size_t s = (size_t)p->size;
	uint8_t *sq = malloc(s * s * 3);
	if (!sq)
		return -ENOMEM;
	int rc = img_resize(im->rgb, im->w, im->h, (uint32_t)s, (uint32_t)s, sq);
	if (rc) {
		free(sq);
		return rc;
	}
	for (int c = 0; c < 3; c++)
		for (size_t i = 0; i < s * s; i++)
			out[(size_t)c * s * s + i] =
			    (sq[i * 3 + c] / 255.0f - p->mean[c]) / p->std[c];
	free(sq);
	return 0;
}
