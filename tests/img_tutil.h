/* img_tutil — test pictures for the image tests: PNGs written with libpng, data URLs. A libpng
 * failure fails the running cmocka test. */
#ifndef KVFS_TEST_IMG_TUTIL_H
#define KVFS_TEST_IMG_TUTIL_H

#include <stddef.h>
#include <stdint.h>

struct itu_buf {
	uint8_t *p; /* malloc'd; the caller frees */
	size_t n;
};

/* A w × h PNG: RGB8 of a pattern that seed changes (seeds 0..7 differ by a constant, larger
 * ones also in shape), or with gray1 a 1-bit gray image of zeros (a decompression bomb's body
 * compresses to almost nothing). */
struct itu_buf itu_png(uint32_t w, uint32_t h, int gray1, int seed);
/* "data:<mime>;base64,<p>", malloc'd. */
char *itu_data_url(const char *mime, const uint8_t *p, size_t n);
/* itu_png(40, 30, 0, seed) as an image/png data URL, malloc'd. */
char *itu_picture_url(int seed);

#endif
