/* oai — the OpenAI-compatible API's JSON: parsing and validating request bodies of
 * POST /v1/completions and /v1/chat/completions, and writing responses, streaming chunks
 * (server-sent events), model lists and errors in OpenAI's error format.
 *
 * Everything here is pure (cJSON inside, no I/O) and thread-safe. Request bodies are untrusted:
 * every field is type-checked and bounded; a wrong type or out-of-range value is an error
 * naming the field. A parameter OpenAI defines that the server does not implement (tools,
 * response_format, logprobs, ...) is refused the same way unless it has its neutral value
 * (null, false, 0, empty): never silently ignored. A field OpenAI does not define is ignored.
 */
#ifndef KVFS_OAI_H
#define KVFS_OAI_H

#include <stddef.h>
#include <stdint.h>

#include "img.h"

#define OAI_MAX_STOP 4
/* Most logit_bias entries (KVI_SAMPLE_MAX_BIAS). */
#define OAI_MAX_BIAS 64
/* Longest cache salt ("cache_salt" or "user"), in bytes: what the worker protocol carries
 * (KVW_SALT_MAX with its NUL). */
#define OAI_MAX_SALT 255

/* An image_url content part, decoded (PNG, JPEG or WebP from a data URL; img.h). */
struct oai_image {
	size_t offset;	      /* where it sits in its message's content: the text bytes before it */
	struct img_image img; /* RGB8 pixels and their hash; freed by oai_request_free */
};

/* Most images in one request: when the limits say 0, and at most. */
#define OAI_DEF_MAX_IMAGES 8
#define OAI_MAX_IMAGES	   64

struct oai_message {
	char *role; /* "system", "user", "assistant" */
	/* The text: a string, or the "text" parts of a part array concatenated (nothing between
	 * them). Image parts are not in it: they are in images[], each at its offset. */
	char *content;
	struct oai_image *images;
	int n_images;
};

/* Most choices per request (n, or n × prompts), and most prompts in one completions request. */
#define OAI_MAX_CHOICES 16
#define OAI_MAX_PROMPTS 16

/* One completions prompt: text, or token ids (text NULL). */
struct oai_prompt {
	char *text;
	int32_t *toks;
	int n_toks;
};

struct oai_request {
	int chat;    /* 1: chat completions (messages), 0: completions (prompt) */
	char *model; /* may be NULL */
	/* completions: "prompt" as a string, a list of strings, token ids or a list of token id
	 * lists (1..OAI_MAX_PROMPTS); prompt is prompts[0].text (NULL for token ids). */
	struct oai_prompt *prompts;
	int n_prompts;
	char *prompt;
	int n; /* choices per prompt, 1..OAI_MAX_CHOICES; n × n_prompts <= OAI_MAX_CHOICES */
	struct oai_message *messages;
	int n_messages;
	int max_tokens;	    /* default: the limit's default_max_tokens */
	double temperature; /* default 1.0; 0 = greedy */
	double top_p;	    /* default 1.0 */
	int top_k;	    /* extension; 0 = off */
	int has_seed;
	uint64_t seed;
	char *stop[OAI_MAX_STOP];
	int n_stop;
	double presence_penalty;  /* -2..2, default 0 */
	double frequency_penalty; /* -2..2, default 0 */
	struct {
		int32_t id;
		double bias;  /* -100..100 */
	} bias[OAI_MAX_BIAS]; /* logit_bias: token id -> bias (ids checked by the backend) */
	int n_bias;
	int echo; /* completions: the prompt comes back before the completion */
	/* Log-probabilities of the generated tokens: chat "logprobs": true (and "top_logprobs"
	 * 0..20 alternatives), completions "logprobs": 0..5 (alternatives). */
	int logprobs;
	int top_logprobs;
	int stream;
	int include_usage; /* stream_options.include_usage */
	/* Cache salt (tenant): "cache_salt" if given, else "user", else NULL. Requests with
	 * different salts never share cached KV blocks. */
	char *salt;
};

struct oai_limits {
	size_t max_prompt_bytes; /* prompt text, or all message contents together */
	int max_tokens;		 /* upper bound for max_tokens */
	int default_max_tokens;
	int max_messages;
	/* Images (image_url parts): at most max_images in a request (0 = OAI_DEF_MAX_IMAGES),
	 * each within *img (NULL = img.h's defaults; not owned). */
	int max_images;
	const struct img_limits *img;
	/* width × height of all a request's images together; 0 = twice img's max_pixels */
	uint64_t max_image_pixels_total;
};

/* Parses body (len bytes, need not be NUL-terminated). On success fills *out (free with
 * oai_request_free) and returns 0. On failure returns -EINVAL (bad JSON, type or value),
 * or -E2BIG (prompt past the limit), writes a message into err naming the problem, and sets
 * *param (may be NULL) to the offending field's name for the error JSON (a static string, or
 * a per-thread buffer valid until this thread's next call). A member named twice in one object,
 * at any depth, is -EINVAL naming it: duplicates mean different things to different readers.
 * Chat image parts ({"type":"image_url","image_url":{"url":...}}) are decoded after every
 * other check passed; a bad, truncated, oversized, unsupported or http(s) image is -EINVAL
 * with img.h's message, prefixed by where it is ("messages[0].content[1]: ..."), param
 * "messages". Whether the model can take images is the caller's question (oai_count_images). */
int oai_parse_request(const char *body, size_t len, int chat, const struct oai_limits *lim,
		      struct oai_request *out, char *err, size_t errlen, const char **param);
void oai_request_free(struct oai_request *r);
/* The number of images in a parsed request (0 for completions). */
int oai_count_images(const struct oai_request *r);

/* Renders a chat request's messages into one prompt. template: "chatml" (<|im_start|>role\n
 * content<|im_end|>\n … <|im_start|>assistant\n), "llama3" (<|start_header_id|>role
 * <|end_header_id|>\n\ncontent<|eot_id|> …) or NULL/"plain" ("Role: content\n" lines, then
 * "Assistant:"). Returns 0 and a malloc'd *out, or -ENOMEM / -EINVAL (unknown template). */
int oai_render_chat(const struct oai_request *r, const char *tmpl, char **out);
/* oai_render_chat, with where each image of the messages goes: image_off[i] (i < max) gets
 * the bytes of *out before the i-th image, in message order (oai_count_images of them). */
int oai_render_chat_media(const struct oai_request *r, const char *tmpl, char **out,
			  size_t *image_off, int max);

/* ---- responses: every function returns a malloc'd NUL-terminated JSON string (caller frees)
 * or NULL on allocation failure ---- */

struct oai_usage {
	int prompt_tokens;
	int completion_tokens;
	int cached_tokens; /* usage.prompt_tokens_details.cached_tokens, always present */
};

/* {"error": {"message", "type", "param", "code"}} */
char *oai_error_json(const char *message, const char *type, const char *param, const char *code);

/* A whole (non-streaming) response: text_completion or chat.completion. finish_reason is
 * "stop" or "length". */
char *oai_response_json(int chat, const char *id, const char *model, int64_t created,
			const char *text, const char *finish_reason, const struct oai_usage *u);

/* One streaming chunk (the JSON after "data: "): a text delta (may be "" ) and, in the last
 * chunk, finish_reason; usage != NULL adds the usage object (the final usage chunk has an
 * empty choices array when text == NULL). */
char *oai_chunk_json(int chat, const char *id, const char *model, int64_t created, const char *text,
		     const char *finish_reason, const struct oai_usage *u);

/* The first chunk of a chat stream: delta {"role":"assistant","content":""}. OpenAI's clients
 * (the openai npm package's stream helper) take the message's role from it and fail without
 * it ("missing role for choice 0"). */
char *oai_chunk_role_json(const char *id, const char *model, int64_t created, int index);

/* ---- several choices (n, several prompts) and log-probabilities ---- */
#define OAI_MAX_TOP_LOGPROBS 20

/* One generated token's log-probability and its most likely alternatives. */
struct oai_lp_entry {
	const char *token; /* its text (bytes that are not UTF-8 are written as U+FFFD) */
	float logprob;	   /* shortest-exact; -inf (NaN) is written as -9999 */
	int text_offset;   /* where its text starts in the choice's text */
	int n_top;
	struct {
		const char *token;
		float logprob;
	} top[OAI_MAX_TOP_LOGPROBS];
};

struct oai_choice {
	int index;
	const char *text;
	const char *finish_reason; /* NULL: "stop" in a response, null in a chunk */
	int has_lp;		   /* write "logprobs" (else null / absent in a chunk) */
	const struct oai_lp_entry *lp;
	int n_lp;
	int lp_base; /* completions: added to every text_offset (the echoed prompt's length) */
};

/* Completions' text_offset: where byte offs[i] (non-decreasing) of generated text t[0..n)
 * starts in the text as the response writes it (each byte that is not well-formed UTF-8 as
 * U+FFFD, 3 bytes), into out[i]. A byte inside a character (a token that completes one an
 * earlier token began) maps to the character's start; an offset past n (bytes not yet
 * emitted) to the written length plus the bytes past n. */
void oai_text_offsets(const char *t, size_t n, const size_t *offs, int k, size_t *out);

/* A whole response with n choices; logprobs in OpenAI's chat shape ({"content": [{token,
 * logprob, bytes, top_logprobs}]}) or completions shape ({tokens, token_logprobs,
 * top_logprobs, text_offset}). */
char *oai_response_choices_json(int chat, const char *id, const char *model, int64_t created,
				const struct oai_choice *c, int n, const struct oai_usage *u);
/* One streaming chunk for choice c (NULL: none, e.g. the final usage chunk). */
char *oai_chunk_choice_json(int chat, const char *id, const char *model, int64_t created,
			    const struct oai_choice *c, const struct oai_usage *u);

/* GET /v1/models: {"object":"list","data":[{"id","object":"model","created","owned_by"}]} */
char *oai_models_json(const char *const *ids, int n, int64_t created);
/* GET /v1/models/{id}: one model object, {"id","object":"model","created","owned_by"}. */
char *oai_model_json(const char *id, int64_t created);

#endif
