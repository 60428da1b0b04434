/* libFuzzer: OpenAI request bodies, both endpoints, and rendering what parsed. */
#include <stdint.h>
#include <stdlib.h>

#include "oai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const struct oai_limits lim = {.max_prompt_bytes = 1 << 16,
					      .max_tokens = 4096,
					      .default_max_tokens = 16,
					      .max_messages = 64};
	for (int chat = 0; chat < 2; chat++) {
		struct oai_request r;
		char err[128];
		if (oai_parse_request((const char *)data, size, chat, &lim, &r, err, sizeof(err),
				      NULL) == 0) {
			char *s = NULL;
			if (chat && oai_render_chat(&r, "chatml", &s) == 0)
				free(s);
			oai_request_free(&r);
		}
	}
	return 0;
}
