/* img: PNG/JPEG/WebP decoding, data URLs, the image hash, the tower's preprocessing, and the
 * image parts of chat requests (oai). The images are made here with the same libraries'
 * encoders (libpng, libjpeg, libwebp), so every case knows its pixels. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <jpeglib.h>
#include <openssl/evp.h>
#include <png.h>
#include <webp/encode.h>
#include <zlib.h>

#include "img.h"
#include "oai.h"

/* ---- encoders ---- */

struct mbuf {
	uint8_t *p;
	size_t n, cap;
};

static void mbuf_put(struct mbuf *b, const void *p, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2;
		b->p = realloc(b->p, b->cap);
		assert_non_null(b->p);
	}
	memcpy(b->p + b->n, p, n);
	b->n += n;
}

static void png_wr(png_structp png, png_bytep d, size_t n)
{
	mbuf_put(png_get_io_ptr(png), d, n);
}

static void png_fl(png_structp png)
{
	(void)png;
}

/* A PNG of w × h with libpng; rows: bytes per row as the color type and depth say. */
static struct mbuf enc_png(uint32_t w, uint32_t h, int ctype, int depth, const uint8_t *px,
			   size_t rowbytes, int interlace, const png_color *pal, int npal,
			   const uint8_t *trns, int ntrns)
{
	struct mbuf b = {0};
	png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
	png_infop info = png_create_info_struct(png);
	assert_non_null(info);
	if (setjmp(png_jmpbuf(png)))
		fail_msg("libpng write failed");
	png_set_write_fn(png, &b, png_wr, png_fl);
	png_set_IHDR(png, info, w, h, depth, ctype,
		     interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
		     PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
	if (pal)
		png_set_PLTE(png, info, pal, npal);
	if (trns)
		png_set_tRNS(png, info, trns, ntrns, NULL);
	png_write_info(png, info);
	if (depth == 16)
		png_set_swap(png); /* rows are given host-order (little-endian) 16-bit */
	png_bytep *rows = malloc(h * sizeof(*rows));
	for (uint32_t y = 0; y < h; y++)
		rows[y] = (png_bytep)px + y * rowbytes;
	png_write_image(png, rows);
	png_write_end(png, NULL);
	free(rows);
	png_destroy_write_struct(&png, &info);
	return b;
}

static struct mbuf enc_png_rgb(uint32_t w, uint32_t h, const uint8_t *rgb)
{
	return enc_png(w, h, PNG_COLOR_TYPE_RGB, 8, rgb, (size_t)w * 3, 0, NULL, 0, NULL, 0);
}

/* A JPEG with libjpeg: comps 1 (gray), 3 (RGB) or 4 (CMYK; adobe: with libjpeg's Adobe
 * marker, which it writes for CMYK by default). */
static struct mbuf enc_jpeg_opt(uint32_t w, uint32_t h, int comps, const uint8_t *px, int quality,
				int progressive, int adobe)
{
	struct jpeg_compress_struct c;
	struct jpeg_error_mgr je;
	c.err = jpeg_std_error(&je);
	jpeg_create_compress(&c);
	unsigned char *out = NULL;
	unsigned long n = 0;
	jpeg_mem_dest(&c, &out, &n);
	c.image_width = w;
	c.image_height = h;
	c.input_components = comps;
	c.in_color_space = comps == 1 ? JCS_GRAYSCALE : comps == 3 ? JCS_RGB : JCS_CMYK;
	jpeg_set_defaults(&c);
	jpeg_set_quality(&c, quality, TRUE);
	if (progressive)
		jpeg_simple_progression(&c);
	if (!adobe)
		c.write_Adobe_marker = FALSE;
	jpeg_start_compress(&c, TRUE);
	while (c.next_scanline < h) {
		JSAMPROW r = (JSAMPROW)px + (size_t)c.next_scanline * w * comps;
		jpeg_write_scanlines(&c, &r, 1);
	}
	jpeg_finish_compress(&c);
	jpeg_destroy_compress(&c);
	struct mbuf b = {0};
	mbuf_put(&b, out, n);
	free(out);
	return b;
}

static struct mbuf enc_jpeg(uint32_t w, uint32_t h, int comps, const uint8_t *px, int quality,
			    int progressive)
{
	return enc_jpeg_opt(w, h, comps, px, quality, progressive, 1);
}

static struct mbuf enc_webp(uint32_t w, uint32_t h, const uint8_t *rgb, int lossless)
{
	uint8_t *out = NULL;
	size_t n = lossless ? WebPEncodeLosslessRGB(rgb, (int)w, (int)h, (int)w * 3, &out)
			    : WebPEncodeRGB(rgb, (int)w, (int)h, (int)w * 3, 90, &out);
	assert_true(n > 0);
	struct mbuf b = {0};
	mbuf_put(&b, out, n);
	WebPFree(out);
	return b;
}

static uint8_t *pattern(uint32_t w, uint32_t h, unsigned seed)
{
	uint8_t *p = malloc((size_t)w * h * 3);
	for (size_t i = 0; i < (size_t)w * h * 3; i++) {
		seed = seed * 1103515245u + 12345u;
		p[i] = (uint8_t)(seed >> 16);
	}
	return p;
}

/* A smooth image (JPEG keeps it within a few levels). */
static uint8_t *smooth(uint32_t w, uint32_t h)
{
	uint8_t *p = malloc((size_t)w * h * 3);
	for (uint32_t y = 0; y < h; y++)
		for (uint32_t x = 0; x < w; x++) {
			uint8_t *q = p + ((size_t)y * w + x) * 3;
			q[0] = (uint8_t)(x * 255 / (w - 1));
			q[1] = (uint8_t)(y * 255 / (h - 1));
			q[2] = 128;
		}
	return p;
}

static char *data_url(const char *mime, const struct mbuf *b)
{
	size_t pre = strlen("data:;base64,") + strlen(mime);
	char *s = malloc(pre + 4 * ((b->n + 2) / 3) + 1);
	sprintf(s, "data:%s;base64,", mime);
	EVP_EncodeBlock((unsigned char *)s + pre, b->p, (int)b->n);
	return s;
}

static int max_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
	int m = 0;
	for (size_t i = 0; i < n; i++) {
		int d = abs((int)a[i] - (int)b[i]);
		m = d > m ? d : m;
	}
	return m;
}

/* ---- decoding ---- */

static void test_png_rgb(void **state)
{
	(void)state;
	uint8_t *px = pattern(7, 5, 1);
	struct mbuf b = enc_png_rgb(7, 5, px);
	struct img_image im;
	char err[200];
	assert_int_equal(img_decode(b.p, b.n, NULL, &im, err, sizeof(err)), 0);
	assert_int_equal(im.fmt, IMG_PNG);
	assert_int_equal(im.w, 7);
	assert_int_equal(im.h, 5);
	assert_memory_equal(im.rgb, px, 7 * 5 * 3);
	img_free(&im);
	/* interlaced (Adam7): the same pixels */
	struct mbuf bi = enc_png(7, 5, PNG_COLOR_TYPE_RGB, 8, px, 21, 1, NULL, 0, NULL, 0);
	assert_int_equal(img_decode(bi.p, bi.n, NULL, &im, err, sizeof(err)), 0);
	assert_memory_equal(im.rgb, px, 7 * 5 * 3);
	img_free(&im);
	free(bi.p);
	free(b.p);
	free(px);
}

/* Gray, gray+alpha, RGBA, palette with tRNS, 1-bit gray, 16-bit RGB: all to RGB8. */
static void test_png_kinds(void **state)
{
	(void)state;
	struct img_image im;
	char err[200];
	const uint32_t w = 4, h = 2;
	uint8_t exp[4 * 2 * 3];
	/* gray 8 */
	uint8_t g[8] = {0, 50, 100, 150, 200, 250, 7, 9};
	for (int i = 0; i < 8; i++)
		exp[3 * i] = exp[3 * i + 1] = exp[3 * i + 2] = g[i];
	struct mbuf b = enc_png(w, h, PNG_COLOR_TYPE_GRAY, 8, g, 4, 0, NULL, 0, NULL, 0);
	assert_int_equal(img_decode(b.p, b.n, NULL, &im, err, sizeof(err)), 0);
	assert_memory_equal(im.rgb, exp, sizeof(exp));
	img_free(&im);
	free(b.p);
	/* gray + alpha: alpha dropped */
	uint8_t ga[16];
	for (int i = 0; i < 8; i++) {
		ga[2 * i] = g[i];
		ga[2 * i + 1] = (uint8_t)(i * 30);
	}
	b = enc_png(w, h, PNG_COLOR_TYPE_GRAY_ALPHA, 8, ga, 8, 0, NULL, 0, NULL, 0);
	assert_int_equal(img_decode(b.p, b.n, NULL, &im, err, sizeof(err)), 0);
	assert_memory_equal(im.rgb, exp, sizeof(exp));
	img_free(&im);
	free(b.p);
	/* RGBA */
	uint8_t *rgb = pattern(w, h, 3), rgba[32];
	for (int i = 0; i < 8; i++) {
		memcpy(rgba + 4 * i, rgb + 3 * i, 3);
		rgba[4 * i + 3] = (uint8_t)(255 - i);
	}
	b = enc_png(w, h, PNG_COLOR_TYPE_RGB_ALPHA, 8, rgba, 16, 0, NULL, 0, NULL, 0);
	assert_int_equal(img_decode(b.p, b.n, NULL, &im, err, sizeof(err)), 0);
	assert_memory_equal(im.rgb, rgb, 24);
	img_free(&im);
	free(b.p);
	/* palette, 4-bit indexes, with a tRNS chunk */
	png_color pal[3] = {{255, 0, 0}, {0, 255, 0}, {1, 2, 3}};
	uint8_t tr[3] = {0, 128, 255};
	uint8_t idx[4] = {0x01, 0x20, 0x21, 0x00}; /* 2 bytes a row of 4 4-bit indexes */
	b = enc_png(w, h, PNG_COLOR_TYPE_PALETTE, 4, idx, 2, 0, pal, 3, tr, 3);
	assert_int_equal(img_decode(b.p, b.n, NULL, &im, err, sizeof(err)), 0);
	int order[8] = {0, 1, 2, 0, 2, 1, 0, 0};
	for (int i = 0; i < 8; i++) {
		assert_int_equal(im.rgb[3 * i], pal[order[i]].red);
		assert_int_equal(im.rgb[3 * i + 1], pal[order[i]].green);
		assert_int_equal(im.rgb[3 * i + 2], pal[order[i]].blue);
	}
	img_free(&im);
	free(b.p);
	/* 1-bit gray: 0 -> 0, 1 -> 255 */
	uint8_t bits[2] = {0xA0, 0x50}; /* row 0: 1010, row 1: 0101 */
	b = enc_png(w, h, PNG_COLOR_TYPE_GRAY, 1, bits, 1, 0, NULL, 0, NULL, 0);
	assert_int_equal(img_decode(b.p, b.n, NULL, &im, err, sizeof(err)), 0);
	for (int i = 0; i < 8; i++)
		assert_int_equal(im.rgb[3 * i + 1], ((i + i / 4) % 2) ? 0 : 255);
	img_free(&im);
	free(b.p);
	/* 16-bit RGB: the high byte (libpng's strip_16 keeps it) */
	uint16_t s16[24];
	for (int i = 0; i < 24; i++)
		s16[i] = (uint16_t)(rgb[i] << 8 | 0x7F);
	b = enc_png(w, h, PNG_COLOR_TYPE_RGB, 16, (uint8_t *)s16, 24, 0, NULL, 0, NULL, 0);
	assert_int_equal(img_decode(b.p, b.n, NULL, &im, err, sizeof(err)), 0);
	assert_memory_equal(im.rgb, rgb, 24);
	img_free(&im);
	free(b.p);
	free(rgb);
}

static void test_jpeg(void **state)
{
	(void)state;
	struct img_image im;
	char err[200];
	uint8_t *px = smooth(32, 24);
	struct mbuf b = enc_jpeg(32, 24, 3, px, 98, 0);
	assert_int_equal(img_decode(b.p, b.n, NULL, &im, err, sizeof(err)), 0);
	assert_int_equal(im.fmt, IMG_JPEG);
	assert_int_equal(im.w, 32);
	assert_int_equal(im.h, 24);
	assert_true(max_diff(im.rgb, px, 32 * 24 * 3) <= 12);
	img_free(&im);
	free(b.p);
	/* progressive: the same */
	b = enc_jpeg(32, 24, 3, px, 98, 1);
	assert_int_equal(img_decode(b.p, b.n, NULL, &im, err, sizeof(err)), 0);
	assert_true(max_diff(im.rgb, px, 32 * 24 * 3) <= 12);
	img_free(&im);
	free(b.p);
	/* gray: R = G = B, near the gray input */
	uint8_t g[32 * 24];
	for (int i = 0; i < 32 * 24; i++)
		g[i] = (uint8_t)(i % 32 * 8);
	b = enc_jpeg(32, 24, 1, g, 98, 0);
	assert_int_equal(img_decode(b.p, b.n, NULL, &im, err, sizeof(err)), 0);
	for (int i = 0; i < 32 * 24; i++) {
		assert_int_equal(im.rgb[3 * i], im.rgb[3 * i + 1]);
		assert_int_equal(im.rgb[3 * i], im.rgb[3 * i + 2]);
		assert_true(abs((int)im.rgb[3 * i] - g[i]) <= 12);
	}
	img_free(&im);
	free(b.p);
	/* CMYK: libjpeg writes an Adobe marker and the values as given, which Adobe's
	 * convention reads as inverted inks (255 = none, as Photoshop writes them): C=255 M=0
	 * Y=0 K=255 is full magenta and yellow, no cyan, no black: red. */
	uint8_t cmyk[16 * 8 * 4];
	for (int i = 0; i < 16 * 8; i++) {
		cmyk[4 * i] = 255;
		cmyk[4 * i + 1] = 0;
		cmyk[4 * i + 2] = 0;
		cmyk[4 * i + 3] = 255;
	}
	b = enc_jpeg(16, 8, 4, cmyk, 100, 0);
	assert_int_equal(img_decode(b.p, b.n, NULL, &im, err, sizeof(err)), 0);
	for (int i = 1; i < 16 * 8; i++)
		assert_memory_equal(im.rgb + 3 * i, im.rgb, 3);
	assert_true(im.rgb[0] > 240 && im.rgb[1] < 15 && im.rgb[2] < 15);
	img_free(&im);
	free(b.p);
	/* the same inks without the Adobe marker are read as plain (255 = full ink): black */
	b = enc_jpeg_opt(16, 8, 4, cmyk, 100, 0, 0);
	assert_int_equal(img_decode(b.p, b.n, NULL, &im, err, sizeof(err)), 0);
	assert_true(im.rgb[0] < 15 && im.rgb[1] < 15 && im.rgb[2] < 15);
	img_free(&im);
	free(b.p);
	/* and C=0 M=255 Y=255 K=0 plain: red */
	for (int i = 0; i < 16 * 8; i++) {
		cmyk[4 * i] = 0;
		cmyk[4 * i + 1] = 255;
		cmyk[4 * i + 2] = 255;
		cmyk[4 * i + 3] = 0;
	}
	b = enc_jpeg_opt(16, 8, 4, cmyk, 100, 0, 0);
	assert_int_equal(img_decode(b.p, b.n, NULL, &im, err, sizeof(err)), 0);
	assert_true(im.rgb[0] > 240 && im.rgb[1] < 15 && im.rgb[2] < 15);
	img_free(&im);
	free(b.p);
	free(px);
}

static void test_webp(void **state)
{
	(void)state;
	struct img_image im;
	char err[200];
	uint8_t *px = pattern(9, 6, 5);
	struct mbuf b = enc_webp(9, 6, px, 1);
	assert_int_equal(img_decode(b.p, b.n, NULL, &im, err, sizeof(err)), 0);
	assert_int_equal(im.fmt, IMG_WEBP);
	assert_int_equal(im.w, 9);
	assert_int_equal(im.h, 6);
	assert_memory_equal(im.rgb, px, 9 * 6 * 3);
	img_free(&im);
	free(b.p);
	uint8_t *sm = smooth(32, 32);
	b = enc_webp(32, 32, sm, 0);
	assert_int_equal(img_decode(b.p, b.n, NULL, &im, err, sizeof(err)), 0);
	assert_true(max_diff(im.rgb, sm, 32 * 32 * 3) <= 24);
	img_free(&im);
	free(b.p);
	free(sm);
	free(px);
}

/* Same pixels as PNG and lossless WebP: the same hash; a changed pixel or the same bytes in
 * another shape: another. */
static void test_hash(void **state)
{
	(void)state;
	struct img_image a, c, d;
	char err[200];
	uint8_t *px = pattern(6, 4, 11);
	struct mbuf p = enc_png_rgb(6, 4, px), wb = enc_webp(6, 4, px, 1);
	assert_int_equal(img_decode(p.p, p.n, NULL, &a, err, sizeof(err)), 0);
	assert_int_equal(img_decode(wb.p, wb.n, NULL, &c, err, sizeof(err)), 0);
	assert_memory_equal(a.hash, c.hash, 32);
	/* the hash is SHA-256 of (w, h little-endian 32-bit, pixels): recomputed here */
	uint8_t hdr[8] = {6, 0, 0, 0, 4, 0, 0, 0}, ref[32];
	EVP_MD_CTX *x = EVP_MD_CTX_new();
	unsigned len = 32;
	EVP_DigestInit_ex(x, EVP_sha256(), NULL);
	EVP_DigestUpdate(x, hdr, 8);
	EVP_DigestUpdate(x, px, 6 * 4 * 3);
	EVP_DigestFinal_ex(x, ref, &len);
	EVP_MD_CTX_free(x);
	assert_memory_equal(a.hash, ref, 32);
	/* same bytes as 4 × 6 */
	struct mbuf t = enc_png_rgb(4, 6, px);
	assert_int_equal(img_decode(t.p, t.n, NULL, &d, err, sizeof(err)), 0);
	assert_memory_not_equal(a.hash, d.hash, 32);
	img_free(&d);
	free(t.p);
	px[5] ^= 1;
	t = enc_png_rgb(6, 4, px);
	assert_int_equal(img_decode(t.p, t.n, NULL, &d, err, sizeof(err)), 0);
	assert_memory_not_equal(a.hash, d.hash, 32);
	img_free(&d);
	free(t.p);
	img_free(&a);
	img_free(&c);
	free(p.p);
	free(wb.p);
	free(px);
}

/* Rewrites a PNG's IHDR width and height, with a correct CRC (only the limits can object). */
static void png_set_dims(uint8_t *p, uint32_t w, uint32_t h)
{
	uint8_t *ihdr = p + 8; /* length(4) "IHDR" data(13) crc(4) */
	for (int i = 0; i < 4; i++) {
		ihdr[8 + i] = (uint8_t)(w >> (24 - 8 * i));
		ihdr[12 + i] = (uint8_t)(h >> (24 - 8 * i));
	}
	uint32_t crc = (uint32_t)crc32(0, ihdr + 4, 17);
	for (int i = 0; i < 4; i++)
		ihdr[21 + i] = (uint8_t)(crc >> (24 - 8 * i));
}

/* Every prefix of a good image is refused with -EINVAL and a message (never a crash, never a
 * half image passed as whole). */
static void all_prefixes_fail(const struct mbuf *b)
{
	char err[200];
	for (size_t n = 0; n < b->n; n++) {
		struct img_image im;
		err[0] = 0;
		int rc = img_decode(b->p, n, NULL, &im, err, sizeof(err));
		if (rc == 0)
			fail_msg("a %zu-byte prefix of %zu decoded", n, b->n);
		assert_int_equal(rc, -EINVAL);
		assert_true(strlen(err) > 0);
		assert_null(im.rgb);
	}
}

static void test_malformed(void **state)
{
	(void)state;
	struct img_image im;
	char err[200];
	/* wrong magic */
	static const char gif[] = "GIF89a\x01\x00\x01\x00\x00\x00\x00";
	assert_int_equal(img_decode(gif, sizeof(gif), NULL, &im, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "unsupported image format"));
	assert_int_equal(img_decode("", 0, NULL, &im, err, sizeof(err)), -EINVAL);
	/* truncated, every length */
	uint8_t *px = smooth(16, 16);
	struct mbuf p = enc_png_rgb(16, 16, px), j = enc_jpeg(16, 16, 3, px, 90, 0),
		    jp = enc_jpeg(16, 16, 3, px, 90, 1), w = enc_webp(16, 16, px, 1),
		    wl = enc_webp(16, 16, px, 0);
	all_prefixes_fail(&p);
	all_prefixes_fail(&j);
	all_prefixes_fail(&jp);
	all_prefixes_fail(&w);
	all_prefixes_fail(&wl);
	/* a flipped byte in the PNG's pixel data: its CRC catches it */
	uint8_t *c = malloc(p.n);
	memcpy(c, p.p, p.n);
	c[p.n - 20] ^= 0x40;
	assert_int_equal(img_decode(c, p.n, NULL, &im, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "PNG"));
	/* zero size in the header */
	memcpy(c, p.p, p.n);
	png_set_dims(c, 0, 16);
	assert_int_equal(img_decode(c, p.n, NULL, &im, err, sizeof(err)), -EINVAL);
	/* huge dimensions in the header: refused from the header, as too big */
	memcpy(c, p.p, p.n);
	png_set_dims(c, 100000, 100000);
	assert_int_equal(img_decode(c, p.n, NULL, &im, err, sizeof(err)), -E2BIG);
	assert_non_null(strstr(err, "100000x100000"));
	memcpy(c, p.p, p.n);
	png_set_dims(c, 5000, 5000); /* within the sides, past the pixels */
	assert_int_equal(img_decode(c, p.n, NULL, &im, err, sizeof(err)), -E2BIG);
	assert_non_null(strstr(err, "pixel limit"));
	free(c);
	/* JPEG: SOF0's height and width set to 60000 */
	c = malloc(j.n);
	memcpy(c, j.p, j.n);
	size_t i;
	for (i = 2; i + 9 < j.n && !(c[i] == 0xFF && c[i + 1] == 0xC0); i++)
		;
	assert_true(i + 9 < j.n);
	c[i + 5] = 0xEA, c[i + 6] = 0x60, c[i + 7] = 0xEA, c[i + 8] = 0x60;
	assert_int_equal(img_decode(c, j.n, NULL, &im, err, sizeof(err)), -E2BIG);
	assert_non_null(strstr(err, "JPEG image is 60000x60000"));
	c[i + 5] = 0, c[i + 6] = 0; /* height 0 */
	assert_int_equal(img_decode(c, j.n, NULL, &im, err, sizeof(err)), -EINVAL);
	free(c);
	/* each format past a small limit, and the encoded size limit */
	struct img_limits l = {.max_width = 15};
	assert_int_equal(img_decode(p.p, p.n, &l, &im, err, sizeof(err)), -E2BIG);
	assert_int_equal(img_decode(j.p, j.n, &l, &im, err, sizeof(err)), -E2BIG);
	assert_int_equal(img_decode(w.p, w.n, &l, &im, err, sizeof(err)), -E2BIG);
	assert_non_null(strstr(err, "width limit"));
	l = (struct img_limits){.max_height = 15};
	assert_int_equal(img_decode(wl.p, wl.n, &l, &im, err, sizeof(err)), -E2BIG);
	assert_non_null(strstr(err, "height limit"));
	l = (struct img_limits){.max_bytes = p.n - 1};
	assert_int_equal(img_decode(p.p, p.n, &l, &im, err, sizeof(err)), -E2BIG);
	assert_non_null(strstr(err, "byte limit"));
	free(p.p);
	free(j.p);
	free(jp.p);
	free(w.p);
	free(wl.p);
	free(px);
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* A real decompression bomb: a 6000 × 6000 1-bit PNG (36 Mpx, 108 MB as RGB) of a few KB,
 * refused from its header in well under the time decoding would take. */
static void test_bomb(void **state)
{
	(void)state;
	const uint32_t s = 6000;
	uint8_t *zero = calloc((size_t)s * (s / 8), 1);
	struct mbuf b = enc_png(s, s, PNG_COLOR_TYPE_GRAY, 1, zero, s / 8, 0, NULL, 0, NULL, 0);
	free(zero);
	assert_true(b.n < 64 << 10);
	struct img_image im;
	char err[200];
	double t0 = now_s();
	assert_int_equal(img_decode(b.p, b.n, NULL, &im, err, sizeof(err)), -E2BIG);
	double dt = now_s() - t0;
	assert_non_null(strstr(err, "6000x6000"));
	assert_true(dt < 0.05);
	/* allowed by the limits, it decodes: the refusal above was the limit, not the file */
	struct img_limits l = {.max_pixels = (uint64_t)s * s};
	assert_int_equal(img_decode(b.p, b.n, &l, &im, err, sizeof(err)), 0);
	assert_int_equal(im.w, s);
	img_free(&im);
	printf("bomb: %zu-byte PNG of %ux%u refused in %.3f ms\n", b.n, s, s, dt * 1e3);
	free(b.p);
}

/* ---- data URLs ---- */

static void test_data_url(void **state)
{
	(void)state;
	struct img_image im;
	char err[200];
	uint8_t *px = pattern(5, 3, 9);
	uint8_t *sm = smooth(8, 8);
	struct mbuf p = enc_png_rgb(5, 3, px), j = enc_jpeg(8, 8, 3, sm, 90, 0);
	free(sm);
	char *u = data_url("image/png", &p);
	assert_int_equal(img_from_url(u, strlen(u), NULL, &im, err, sizeof(err)), 0);
	assert_memory_equal(im.rgb, px, 45);
	img_free(&im);
	/* padding left out (dropped '='s) still decodes */
	size_t ul = strlen(u);
	while (u[ul - 1] == '=')
		ul--;
	assert_int_equal(img_from_url(u, ul, NULL, &im, err, sizeof(err)), 0);
	img_free(&im);
	free(u);
	/* a media type parameter, and jpg as jpeg */
	u = data_url("image/jpg;name=x.jpg", &j);
	assert_int_equal(img_from_url(u, strlen(u), NULL, &im, err, sizeof(err)), 0);
	img_free(&im);
	free(u);
	/* PNG data called JPEG */
	u = data_url("image/jpeg", &p);
	assert_int_equal(img_from_url(u, strlen(u), NULL, &im, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "says image/jpeg but the data is PNG"));
	free(u);
	/* not an image type, no base64, not base64, bad padding, empty */
	static const struct {
		const char *url;
		const char *msg;
	} bad[] = {
	    {"data:text/plain;base64,aGVsbG8=", "is not image/png"},
	    {"data:image/png,abcd", "must be base64"},
	    {"data:image/png;base64,ab!d", "not base64"},
	    {"data:image/png;base64,abcde", "padding or length"},
	    {"data:image/png;base64,ab===", "padding or length"},
	    {"data:image/png;base64,", "no data"},
	    {"data:image/png;base64", "no ','"},
	    {"ftp://x/y.png", "must be a data URL"},
	    {"", "must be a data URL"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = 0;
		assert_int_equal(
		    img_from_url(bad[i].url, strlen(bad[i].url), NULL, &im, err, sizeof(err)),
		    -EINVAL);
		if (!strstr(err, bad[i].msg))
			fail_msg("'%s': '%s' lacks '%s'", bad[i].url, err, bad[i].msg);
	}
	/* valid base64 that is not an image */
	static const char txt[] = "data:image/webp;base64,aGVsbG8gd29ybGQ=";
	assert_int_equal(img_from_url(txt, strlen(txt), NULL, &im, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "unsupported image format"));
	/* http(s): refused; allowed, still refused (no fetcher) */
	static const char h[] = "https://example.com/cat.png";
	assert_int_equal(img_from_url(h, strlen(h), NULL, &im, err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "not allowed"));
	struct img_limits l = {.allow_fetch = 1};
	assert_int_equal(img_from_url(h, strlen(h), &l, &im, err, sizeof(err)), -ENOTSUP);
	assert_string_equal(err, "fetching image URLs is disabled");
	/* past the byte limit: refused from the base64 length, before decoding */
	u = data_url("image/png", &p);
	l = (struct img_limits){.max_bytes = p.n - 1};
	uint8_t *bytes = (uint8_t *)1;
	size_t n = 1;
	int decl = 0;
	assert_int_equal(img_parse_url(u, strlen(u), &l, &bytes, &n, &decl, err, sizeof(err)),
			 -E2BIG);
	assert_null(bytes);
	l.max_bytes = p.n;
	assert_int_equal(img_parse_url(u, strlen(u), &l, &bytes, &n, &decl, err, sizeof(err)), 0);
	assert_int_equal(n, p.n);
	assert_int_equal(decl, IMG_PNG);
	assert_memory_equal(bytes, p.p, p.n);
	free(bytes);
	free(u);
	free(p.p);
	free(j.p);
	free(px);
}

/* ---- preprocessing ---- */

/* The test's own reference: Keys' cubic (a = -0.5) written from its definition, a separable
 * filter whose support grows with the shrink factor, rounding after each pass (PIL). */
static double ref_k(double x)
{
	x = fabs(x);
	return x < 1   ? 1.5 * x * x * x - 2.5 * x * x + 1
	       : x < 2 ? -0.5 * x * x * x + 2.5 * x * x - 4 * x + 2
		       : 0;
}

static double ref_tap(uint32_t in, uint32_t out, uint32_t o, uint32_t i)
{
	double sc = (double)in / out, f = sc > 1 ? sc : 1, c = (o + 0.5) * sc, sum = 0;
	for (uint32_t k = 0; k < in; k++) /* the kernel is 0 past ±2: no span to work out */
		sum += ref_k((k + 0.5 - c) / f);
	return ref_k((i + 0.5 - c) / f) / sum;
}

static uint8_t r8(double v)
{
	return v <= 0 ? 0 : v >= 255 ? 255 : (uint8_t)floor(v + 0.5);
}

static void ref_resize(const uint8_t *in, uint32_t w, uint32_t h, uint32_t ow, uint32_t oh,
		       uint8_t *out)
{
	uint8_t *t = malloc((size_t)ow * h * 3);
	for (uint32_t y = 0; y < h; y++)
		for (uint32_t x = 0; x < ow; x++)
			for (int c = 0; c < 3; c++) {
				double s = 0;
				for (uint32_t i = 0; i < w; i++)
					s += ref_tap(w, ow, x, i) * in[(y * w + i) * 3 + c];
				t[(y * ow + x) * 3 + c] = r8(s);
			}
	for (uint32_t y = 0; y < oh; y++)
		for (uint32_t x = 0; x < ow; x++)
			for (int c = 0; c < 3; c++) {
				double s = 0;
				for (uint32_t i = 0; i < h; i++)
					s += ref_tap(h, oh, y, i) * t[(i * ow + x) * 3 + c];
				out[(y * ow + x) * 3 + c] = r8(s);
			}
	free(t);
}

static void test_resize(void **state)
{
	(void)state;
	uint8_t *px = pattern(13, 9, 21);
	uint8_t same[13 * 9 * 3];
	/* the same size: the pixels unchanged (the kernel is 1 at 0, 0 at ±1, ±2) */
	assert_int_equal(img_resize(px, 13, 9, 13, 9, same), 0);
	assert_memory_equal(same, px, sizeof(same));
	/* one color stays that color, up and down */
	uint8_t one[13 * 9 * 3], big[40 * 40 * 3], small[4 * 4 * 3];
	for (int i = 0; i < 13 * 9; i++)
		one[3 * i] = 10, one[3 * i + 1] = 200, one[3 * i + 2] = 77;
	assert_int_equal(img_resize(one, 13, 9, 40, 40, big), 0);
	for (int i = 0; i < 40 * 40; i++)
		assert_memory_equal(big + 3 * i, one, 3);
	assert_int_equal(img_resize(one, 13, 9, 4, 4, small), 0);
	for (int i = 0; i < 16; i++)
		assert_memory_equal(small + 3 * i, one, 3);
	/* against the reference, shrinking and growing, non-square */
	const uint32_t sz[][2] = {{5, 7}, {24, 24}, {4, 3}, {13, 9}, {1, 1}};
	for (size_t k = 0; k < sizeof(sz) / sizeof(sz[0]); k++) {
		uint32_t ow = sz[k][0], oh = sz[k][1];
		uint8_t *a = malloc(ow * oh * 3), *b = malloc(ow * oh * 3);
		assert_int_equal(img_resize(px, 13, 9, ow, oh, a), 0);
		ref_resize(px, 13, 9, ow, oh, b);
		assert_memory_equal(a, b, ow * oh * 3);
		free(a);
		free(b);
	}
	/* normalisation: CHW, (v / 255 - mean) / std */
	struct img_image im = {.w = 13, .h = 9, .rgb = px};
	struct img_prep p = {.size = 6, .mean = {0.5f, 0.25f, 0.0f}, .std = {0.5f, 2.0f, 1.0f}};
	float out[3 * 36];
	uint8_t sq[36 * 3];
	assert_int_equal(img_preprocess(&im, &p, out), 0);
	ref_resize(px, 13, 9, 6, 6, sq);
	for (int c = 0; c < 3; c++)
		for (int i = 0; i < 36; i++)
			assert_float_equal(out[c * 36 + i],
					   (sq[3 * i + c] / 255.0 - p.mean[c]) / p.std[c], 1e-5);
	/* bad preparations */
	p.std[1] = 0;
	assert_int_equal(img_preprocess(&im, &p, out), -EINVAL);
	p.std[1] = 1;
	p.size = 0;
	assert_int_equal(img_preprocess(&im, &p, out), -EINVAL);
	/* CLIP's 224 from 1024 × 768: the cost the tower's input adds (docs/benchmarks.md) */
	uint8_t *b1k = pattern(1024, 768, 8);
	struct img_image im1k = {.w = 1024, .h = 768, .rgb = b1k};
	float *o1k = malloc(3 * 224 * 224 * sizeof(float));
	double t0 = now_s();
	assert_int_equal(img_preprocess(&im1k, &img_prep_clip224, o1k), 0);
	printf("preprocess: 1024x768 -> 224x224 CHW in %.1f ms\n", (now_s() - t0) * 1e3);
	free(o1k);
	free(b1k);
	/* CLIP's 224 on a larger image runs */
	float *o224 = malloc(3 * 224 * 224 * sizeof(float));
	uint8_t *b300 = pattern(300, 200, 4);
	struct img_image im2 = {.w = 300, .h = 200, .rgb = b300};
	assert_int_equal(img_preprocess(&im2, &img_prep_clip224, o224), 0);
	for (int i = 0; i < 3 * 224 * 224; i++)
		assert_true(o224[i] > -2.0f && o224[i] < 2.2f);
	free(o224);
	free(b300);
	free(px);
}

/* ---- chat requests with image parts ---- */

static const struct oai_limits olim = {
    .max_prompt_bytes = 1 << 16, .max_tokens = 4096, .default_max_tokens = 16, .max_messages = 64};

static char *chat_body(const char *url_a, const char *url_b)
{
	size_t n = strlen(url_a) + (url_b ? strlen(url_b) : 0) + 512;
	char *s = malloc(n);
	snprintf(s, n,
		 "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
		 "\"Look: \"},{\"type\":\"image_url\",\"image_url\":{\"url\":\"%s\",\"detail\":"
		 "\"low\"}},{\"type\":\"text\",\"text\":\"and\"}%s%s%s]}]}",
		 url_a, url_b ? ",{\"type\":\"image_url\",\"image_url\":{\"url\":\"" : "",
		 url_b ? url_b : "", url_b ? "\"}}" : "");
	return s;
}

static void test_oai_images(void **state)
{
	(void)state;
	uint8_t *px = pattern(4, 4, 2);
	struct mbuf p = enc_png_rgb(4, 4, px), w = enc_webp(4, 4, px, 1);
	char *ua = data_url("image/png", &p), *ub = data_url("image/webp", &w);
	char *body = chat_body(ua, ub);
	struct oai_request r;
	char err[300];
	const char *param;
	assert_int_equal(
	    oai_parse_request(body, strlen(body), 1, &olim, &r, err, sizeof(err), &param), 0);
	assert_string_equal(r.messages[0].content, "Look: and");
	assert_int_equal(oai_count_images(&r), 2);
	assert_int_equal(r.messages[0].n_images, 2);
	assert_int_equal(r.messages[0].images[0].offset, 6);
	assert_int_equal(r.messages[0].images[1].offset, 9);
	assert_memory_equal(r.messages[0].images[0].img.rgb, px, 48);
	assert_memory_equal(r.messages[0].images[0].img.hash, r.messages[0].images[1].img.hash, 32);
	oai_request_free(&r);
	free(body);
	/* a broken second image: a 400 naming where and what */
	p.n -= 10;
	char *ut = data_url("image/png", &p);
	body = chat_body(ua, ut);
	assert_int_equal(
	    oai_parse_request(body, strlen(body), 1, &olim, &r, err, sizeof(err), &param), -EINVAL);
	assert_string_equal(param, "messages");
	assert_non_null(strstr(err, "messages[0], image 1: bad PNG image"));
	free(body);
	/* an http URL */
	body = chat_body("http://example.com/a.png", NULL);
	assert_int_equal(
	    oai_parse_request(body, strlen(body), 1, &olim, &r, err, sizeof(err), &param), -EINVAL);
	assert_non_null(strstr(err, "not allowed"));
	free(body);
	/* more images than the limit */
	struct oai_limits one = olim;
	one.max_images = 1;
	body = chat_body(ua, ub);
	assert_int_equal(
	    oai_parse_request(body, strlen(body), 1, &one, &r, err, sizeof(err), &param), -EINVAL);
	assert_non_null(strstr(err, "too many images"));
	free(body);
	/* the two 4 × 4 images together past a 20-pixel total: the second is refused */
	struct oai_limits tot = olim;
	tot.max_image_pixels_total = 20;
	body = chat_body(ua, ub);
	assert_int_equal(
	    oai_parse_request(body, strlen(body), 1, &tot, &r, err, sizeof(err), &param), -EINVAL);
	assert_non_null(strstr(err, "messages[0], image 1: WebP image is 4x4, past the 4-pixel"));
	assert_non_null(strstr(err, "together"));
	tot.max_image_pixels_total = 32;
	assert_int_equal(
	    oai_parse_request(body, strlen(body), 1, &tot, &r, err, sizeof(err), &param), 0);
	oai_request_free(&r);
	free(body);
	/* bad parts: an unknown type, image_url without url, text without text */
	static const char *const badp[] = {
	    "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\"}]}]}",
	    "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":"
	    "{}}]}]}",
	    "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":"
	    "\"data:image/png;base64,AA\"}]}]}",
	    "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
	    "{\"messages\":[{\"role\":\"user\",\"content\":[7]}]}",
	};
	for (size_t i = 0; i < sizeof(badp) / sizeof(badp[0]); i++) {
		assert_int_equal(oai_parse_request(badp[i], strlen(badp[i]), 1, &olim, &r, err,
						   sizeof(err), &param),
				 -EINVAL);
		assert_non_null(strstr(err, "messages[0].content[0]"));
	}
	/* a request refused for another field decodes nothing: same error as without images */
	body = chat_body(ut, NULL);
	size_t bl = strlen(body);
	body = realloc(body, bl + 32);
	strcpy(body + bl - 1, ",\"temperature\":9}");
	assert_int_equal(
	    oai_parse_request(body, strlen(body), 1, &olim, &r, err, sizeof(err), &param), -EINVAL);
	assert_string_equal(param, "temperature");
	free(body);
	free(ut);
	free(ua);
	free(ub);
	free(p.p);
	free(w.p);
	free(px);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_png_rgb), cmocka_unit_test(test_png_kinds),
	    cmocka_unit_test(test_jpeg),    cmocka_unit_test(test_webp),
	    cmocka_unit_test(test_hash),    cmocka_unit_test(test_malformed),
	    cmocka_unit_test(test_bomb),    cmocka_unit_test(test_data_url),
	    cmocka_unit_test(test_resize),  cmocka_unit_test(test_oai_images),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
