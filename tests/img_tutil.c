/* Test pictures (see img_tutil.h). */
#include "img_tutil.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/evp.h>
#include <png.h>

static void wr(png_structp png, png_bytep d, size_t n)
{
	struct itu_buf *b = png_get_io_ptr(png);
	b->p = realloc(b->p, b->n + n);
	memcpy(b->p + b->n, d, n);
	b->n += n;
}

static void nofl(png_structp png)
{
	(void)png;
}

struct itu_buf itu_png(uint32_t w, uint32_t h, int gray1, int seed)
{
	struct itu_buf b = {0};
	png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
	png_infop info = png_create_info_struct(png);
	if (setjmp(png_jmpbuf(png)))
		fail_msg("libpng write failed");
	png_set_write_fn(png, &b, wr, nofl);
	png_set_IHDR(png, info, w, h, gray1 ? 1 : 8,
		     gray1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
		     PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
	png_write_info(png, info);
	size_t rb = gray1 ? (w + 7) / 8 : (size_t)w * 3;
	uint8_t *row = calloc(rb, 1);
	for (uint32_t y = 0; y < h; y++) {
		if (!gray1)
			for (size_t x = 0; x < rb; x++)
				row[x] = (uint8_t)(x * 7 + y * 13 + (size_t)seed * 31 +
						   (size_t)(seed / 8) * x * y);
		png_write_row(png, row);
	}
	png_write_end(png, NULL);
	free(row);
	png_destroy_write_struct(&png, &info);
	return b;
}

char *itu_data_url(const char *mime, const uint8_t *p, size_t n)
{
	size_t pre = strlen("data:;base64,") + strlen(mime);
	char *s = malloc(pre + 4 * ((n + 2) / 3) + 1);
	sprintf(s, "data:%s;base64,", mime);
	EVP_EncodeBlock((unsigned char *)s + pre, p, (int)n);
	return s;
}

char *itu_picture_url(int seed)
{
	struct itu_buf b = itu_png(40, 30, 0, seed);
	char *s = itu_data_url("image/png", b.p, b.n);
	free(b.p);
	return s;
}
