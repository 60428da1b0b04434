/* libFuzzer: the image input path. The input's first byte picks the route: a data URL
 * (the rest is the URL: base64, media type, then the decoders), raw image bytes (the
 * decoders directly), or a chat request body with image parts (oai). Whatever decodes is
 * preprocessed to a small square, so the resize sees every shape a decoder can produce. */
#include <stdint.h>
#include <stdlib.h>

#include "img.h"
#include "oai.h"

static void prep(const struct img_image *im)
{
	static float out[3 * 16 * 16];
	struct img_prep p = img_prep_clip224;
	p.size = 16;
	if (img_preprocess(im, &p, out))
		abort(); /* a decoded image always preprocesses */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	/* limits small enough that a bomb cannot make a run slow: 1 Mpx */
	static const struct img_limits lim = {
	    .max_bytes = 1 << 20, .max_width = 4096, .max_height = 4096, .max_pixels = 1 << 20};
	struct img_image im;
	char err[256];
	int route = data[0] % 3;
	data++, size--;
	if (route == 0 &&
	    img_from_url((const char *)data, size, &lim, &im, err, sizeof(err)) == 0) {
		prep(&im);
		img_free(&im);
	} else if (route == 1 && img_decode(data, size, &lim, &im, err, sizeof(err)) == 0) {
		prep(&im);
		img_free(&im);
	} else if (route == 2) {
		const struct oai_limits ol = {.max_prompt_bytes = 1 << 16,
					      .max_tokens = 4096,
					      .default_max_tokens = 16,
					      .max_messages = 64,
					      .max_images = 4,
					      .img = &lim};
		struct oai_request r;
		if (oai_parse_request((const char *)data, size, 1, &ol, &r, err, sizeof(err),
				      NULL) == 0) {
			for (int m = 0; m < r.n_messages; m++)
				for (int i = 0; i < r.messages[m].n_images; i++)
					prep(&r.messages[m].images[i].img);
			oai_request_free(&r);
		}
	}
	return 0;
}
