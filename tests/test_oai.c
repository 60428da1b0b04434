/* Tests for engine/serve/oai: request validation (types, ranges, limits, malformed JSON), chat
 * rendering, and that every response we write parses back with the fields clients read. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "oai.h"

static const struct oai_limits LIM = {
    .max_prompt_bytes = 1000, .max_tokens = 512, .default_max_tokens = 16, .max_messages = 8};

static int parse(const char *body, int chat, struct oai_request *r, const char **param)
{
	char err[256];
	return oai_parse_request(body, strlen(body), chat, &LIM, r, err, sizeof(err), param);
}

static void test_completion_ok(void **state)
{
	(void)state;
	struct oai_request r;
	const char *param;
	assert_int_equal(
	    parse("{\"model\":\"m\",\"prompt\":\"hello\",\"max_tokens\":5,"
		  "\"temperature\":0,\"top_p\":0.5,\"seed\":42,\"stop\":[\"\\n\",\"x\"],"
		  "\"stream\":true,\"stream_options\":{\"include_usage\":true},"
		  "\"user\":\"tenant\",\"unknown_field\":[1,2]}",
		  0, &r, &param),
	    0);
	assert_string_equal(r.prompt, "hello");
	assert_string_equal(r.model, "m");
	assert_int_equal(r.max_tokens, 5);
	assert_true(r.temperature == 0 && r.top_p == 0.5);
	assert_true(r.has_seed && r.seed == 42);
	assert_int_equal(r.n_stop, 2);
	assert_string_equal(r.stop[0], "\n");
	assert_true(r.stream && r.include_usage);
	assert_string_equal(r.salt, "tenant");
	oai_request_free(&r);

	/* prompts: a list of strings, token ids, lists of token ids; n */
	assert_int_equal(parse("{\"prompt\":[\"a\",\"bc\"],\"n\":3}", 0, &r, &param), 0);
	assert_int_equal(r.n_prompts, 2);
	assert_int_equal(r.n, 3);
	assert_string_equal(r.prompts[1].text, "bc");
	assert_string_equal(r.prompt, "a");
	oai_request_free(&r);
	assert_int_equal(parse("{\"prompt\":[5,6,7]}", 0, &r, &param), 0);
	assert_int_equal(r.n_prompts, 1);
	assert_null(r.prompts[0].text);
	assert_int_equal(r.prompts[0].n_toks, 3);
	assert_int_equal(r.prompts[0].toks[2], 7);
	oai_request_free(&r);
	assert_int_equal(parse("{\"prompt\":[[5],[6,7]]}", 0, &r, &param), 0);
	assert_int_equal(r.n_prompts, 2);
	assert_int_equal(r.prompts[1].n_toks, 2);
	oai_request_free(&r);

	/* penalties and logit_bias */
	assert_int_equal(parse("{\"prompt\":\"a\",\"presence_penalty\":-1.5,"
			       "\"frequency_penalty\":0.5,\"logit_bias\":{\"7\":-100,\"42\":3.5}}",
			       0, &r, &param),
			 0);
	assert_true(r.presence_penalty == -1.5 && r.frequency_penalty == 0.5);
	assert_int_equal(r.n_bias, 2);
	assert_true(r.bias[0].id == 7 && r.bias[0].bias == -100);
	assert_true(r.bias[1].id == 42 && r.bias[1].bias == 3.5);
	oai_request_free(&r);

	/* Defaults, prompt as a one-element array, cache_salt wins over user. */
	assert_int_equal(
	    parse("{\"prompt\":[\"hi\"],\"cache_salt\":\"s\",\"user\":\"u\"}", 0, &r, &param), 0);
	assert_int_equal(r.max_tokens, 16);
	assert_true(r.temperature == 1.0);
	assert_string_equal(r.salt, "s");
	assert_null(r.model);
	oai_request_free(&r);
}

/* A member named twice in one object, at any depth, is a 400 naming it (not first-wins); the
 * same name in two different objects is fine. */
static void test_duplicate_keys(void **state)
{
	(void)state;
	struct oai_request r;
	const char *param;
	char err[256];
	static const struct {
		const char *body, *key;
	} dups[] = {
	    {"{\"prompt\":\"a\",\"max_tokens\":1,\"max_tokens\":4000}", "max_tokens"},
	    {"{\"max_tokens\":1,\"prompt\":\"a\",\"max_tokens\":1}", "max_tokens"},
	    {"{\"prompt\":\"a\",\"user\":\"x\",\"user\":\"y\"}", "user"},
	    {"{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true,"
	     "\"include_usage\":false}}",
	     "include_usage"},
	    {"{\"prompt\":\"a\",\"x\":[{\"k\":1},{\"k\":1,\"k\":2}]}", "k"},
	    /* names compare after unescaping: \u0075ser is user */
	    {"{\"prompt\":\"a\",\"user\":\"x\",\"\\u0075ser\":\"y\"}", "user"},
	};
	for (size_t i = 0; i < sizeof(dups) / sizeof(dups[0]); i++) {
		int rc = oai_parse_request(dups[i].body, strlen(dups[i].body), 0, &LIM, &r, err,
					   sizeof(err), &param);
		assert_int_equal(rc, -EINVAL);
		assert_non_null(param);
		assert_string_equal(param, dups[i].key);
		assert_non_null(strstr(err, dups[i].key));
	}
	assert_int_equal(parse("{\"prompt\":\"a\",\"x\":{\"prompt\":1},\"y\":[{\"k\":1},"
			       "{\"k\":2}]}",
			       0, &r, &param),
			 0);
	oai_request_free(&r);
	/* many members: sorted, not compared pairwise (this would take minutes at n^2) */
	size_t n = 100000, cap = n * 16 + 64, off = 0;
	char *big = malloc(cap);
	off += (size_t)snprintf(big + off, cap - off, "{\"prompt\":\"a\"");
	for (size_t i = 0; i < n; i++)
		off += (size_t)snprintf(big + off, cap - off, ",\"k%zu\":0", i);
	snprintf(big + off, cap - off, ",\"k7\":1}");
	assert_int_equal(oai_parse_request(big, strlen(big), 0, &LIM, &r, err, sizeof(err), &param),
			 -EINVAL);
	assert_string_equal(param, "k7");
	free(big);
}

static void test_bad_requests(void **state)
{
	(void)state;
	static const struct {
		const char *body;
		int chat, rc;
		const char *param;
	} cases[] = {
	    {"", 0, -EINVAL, NULL},
	    {"{", 0, -EINVAL, NULL},
	    {"[1,2]", 0, -EINVAL, NULL},
	    {"{\"prompt\":5}", 0, -EINVAL, "prompt"},
	    {"{\"prompt\":[]}", 0, -EINVAL, "prompt"},
	    {"{\"prompt\":[1,\"b\"]}", 0, -EINVAL, "prompt"},
	    {"{\"prompt\":[[1,2],[-1]]}", 0, -EINVAL, "prompt"},
	    {"{\"prompt\":[[1,2],[]]}", 0, -EINVAL, "prompt"},
	    {"{\"prompt\":[1.5]}", 0, -EINVAL, "prompt"},
	    {"{\"prompt\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\","
	     "\"k\",\"l\",\"m\",\"n\",\"o\",\"p\",\"q\"]}",
	     0, -EINVAL, "prompt"},
	    {"{\"prompt\":[\"a\",\"b\"],\"n\":9}", 0, -EINVAL, "n"},
	    {"{\"prompt\":\"a\",\"n\":17}", 0, -EINVAL, "n"},
	    {"{\"prompt\":[1,2],\"echo\":true}", 0, -EINVAL, "echo"},
	    {"{}", 0, -EINVAL, "prompt"},
	    {"{\"prompt\":\"a\",\"max_tokens\":0}", 0, -EINVAL, "max_tokens"},
	    {"{\"prompt\":\"a\",\"max_tokens\":513}", 0, -EINVAL, "max_tokens"},
	    {"{\"prompt\":\"a\",\"max_tokens\":2.5}", 0, -EINVAL, "max_tokens"},
	    {"{\"prompt\":\"a\",\"max_tokens\":\"5\"}", 0, -EINVAL, "max_tokens"},
	    {"{\"prompt\":\"a\",\"temperature\":3}", 0, -EINVAL, "temperature"},
	    {"{\"prompt\":\"a\",\"top_p\":-1}", 0, -EINVAL, "top_p"},
	    {"{\"prompt\":\"a\",\"stream\":\"yes\"}", 0, -EINVAL, "stream"},
	    {"{\"prompt\":\"a\",\"stop\":5}", 0, -EINVAL, "stop"},
	    {"{\"prompt\":\"a\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 0, -EINVAL, "stop"},
	    {"{\"prompt\":\"a\",\"user\":7}", 0, -EINVAL, "user"},
	    {"{\"prompt\":\"a\",\"model\":[]}", 0, -EINVAL, "model"},
	    /* OpenAI's parameters this server does not implement: refused, never ignored */
	    {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
	     "\"function\",\"function\":{\"name\":\"f\"}}]}",
	     1, -EINVAL, "tools"},
	    {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"auto\"}", 1,
	     -EINVAL, "tool_choice"},
	    {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{"
	     "\"type\":\"json_object\"}}",
	     1, -EINVAL, "response_format"},
	    {"{\"prompt\":\"a\",\"suffix\":\"end\"}", 0, -EINVAL, "suffix"},
	    {"{\"prompt\":\"a\",\"best_of\":3}", 0, -EINVAL, "best_of"},
	    {"{\"prompt\":\"a\",\"service_tier\":\"flex\"}", 0, -EINVAL, "service_tier"},
	    {"{\"prompt\":\"a\",\"store\":true}", 0, -EINVAL, "store"},
	    {"{\"prompt\":\"a\",\"metadata\":{\"k\":\"v\"}}", 0, -EINVAL, "metadata"},
	    {"{\"prompt\":\"a\",\"modalities\":[\"text\",\"audio\"]}", 0, -EINVAL, "modalities"},
	    {"{\"prompt\":\"a\",\"reasoning_effort\":\"high\"}", 0, -EINVAL, "reasoning_effort"},
	    {"{\"prompt\":\"a\",\"parallel_tool_calls\":true}", 0, -EINVAL, "parallel_tool_calls"},
	    {"{\"prompt\":\"a\",\"presence_penalty\":2.5}", 0, -EINVAL, "presence_penalty"},
	    {"{\"prompt\":\"a\",\"frequency_penalty\":\"x\"}", 0, -EINVAL, "frequency_penalty"},
	    {"{\"prompt\":\"a\",\"logit_bias\":[1]}", 0, -EINVAL, "logit_bias"},
	    {"{\"prompt\":\"a\",\"logit_bias\":{\"x\":1}}", 0, -EINVAL, "logit_bias"},
	    {"{\"prompt\":\"a\",\"logit_bias\":{\"-1\":1}}", 0, -EINVAL, "logit_bias"},
	    {"{\"prompt\":\"a\",\"logit_bias\":{\"5\":101}}", 0, -EINVAL, "logit_bias"},
	    {"{\"prompt\":\"a\",\"logit_bias\":{\"5\":\"1\"}}", 0, -EINVAL, "logit_bias"},
	    /* their neutral values ask for nothing: accepted */
	    {"{\"prompt\":\"a\",\"tools\":[],\"store\":false,\"metadata\":{},\"best_of\":1,"
	     "\"service_tier\":\"auto\",\"modalities\":[\"text\"],\"suffix\":null,"
	     "\"tool_choice\":\"none\"}",
	     0, 0, NULL},
	    {"{\"messages\":[]}", 1, -EINVAL, "messages"},
	    {"{\"messages\":\"hi\"}", 1, -EINVAL, "messages"},
	    {"{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 1, -EINVAL, "messages"},
	    {"{\"messages\":[{\"role\":\"user\"}]}", 1, -EINVAL, "messages"},
	    {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 1,
	     -EINVAL, "messages"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct oai_request r;
		const char *param = "unset";
		int rc = parse(cases[i].body, cases[i].chat, &r, &param);
		if (rc != cases[i].rc)
			fail_msg("case %zu (%s): rc %d", i, cases[i].body, rc);
		if (!rc)
			oai_request_free(&r);
		if (cases[i].param)
			assert_string_equal(param, cases[i].param);
	}
	/* Limits: prompt size and message count. */
	char big[1200];
	strcpy(big, "{\"prompt\":\"");
	memset(big + 11, 'a', 1180);
	strcpy(big + 1191, "\"}");
	struct oai_request r;
	assert_int_equal(parse(big, 0, &r, NULL), -E2BIG);
	char many[1024] = "{\"messages\":[";
	for (int i = 0; i < 9; i++)
		strcat(many, i ? ",{\"role\":\"user\",\"content\":\"x\"}"
			       : "{\"role\":\"user\",\"content\":\"x\"}");
	strcat(many, "]}");
	assert_int_equal(parse(many, 1, &r, NULL), -E2BIG);
	/* Not NUL-terminated input and embedded NUL. */
	assert_int_equal(
	    oai_parse_request("{\"prompt\":\"a\"}garbage", 14, 0, &LIM, &r, NULL, 0, NULL), 0);
	oai_request_free(&r);
	assert_int_equal(oai_parse_request("{\"prompt\":\"a\"}\0", 15, 0, &LIM, &r, NULL, 0, NULL),
			 -EINVAL);
}

static void test_chat(void **state)
{
	(void)state;
	struct oai_request r;
	assert_int_equal(
	    parse("{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
		  "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi \"},"
		  "{\"type\":\"text\",\"text\":\"there\"}]}]}",
		  1, &r, NULL),
	    0);
	assert_int_equal(r.n_messages, 2);
	assert_string_equal(r.messages[1].content, "Hi there");
	char *s;
	assert_int_equal(oai_render_chat(&r, "chatml", &s), 0);
	assert_string_equal(s, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi "
			       "there<|im_end|>\n<|im_start|>assistant\n");
	free(s);
	assert_int_equal(oai_render_chat(&r, NULL, &s), 0);
	assert_string_equal(s, "System: Be brief.\nUser: Hi there\nAssistant:");
	free(s);
	assert_int_equal(oai_render_chat(&r, "nope", &s), -EINVAL);
	oai_request_free(&r);
}

/* Several choices and logprobs in OpenAI's shapes; a banned token's -inf is written -9999
 * (JSON has no infinity), text offsets count from the echoed prompt. */
static void test_choices_logprobs(void **state)
{
	(void)state;
	struct oai_usage u = {.prompt_tokens = 2, .completion_tokens = 2};
	struct oai_lp_entry e[2] = {
	    {.token = "he", .logprob = -0.5f, .text_offset = 0, .n_top = 2},
	    {.token = "y", .logprob = -INFINITY, .text_offset = 2, .n_top = 1},
	};
	e[0].top[0].token = "he", e[0].top[0].logprob = -0.5f;
	e[0].top[1].token = "ha", e[0].top[1].logprob = -1.5f;
	e[1].top[0].token = "!", e[1].top[0].logprob = -0.1f;
	struct oai_choice ch[2] = {
	    {.index = 0, .text = "hey", .finish_reason = "length", .has_lp = 1, .lp = e, .n_lp = 2},
	    {.index = 1, .text = "ho", .finish_reason = "stop"},
	};
	char *s = oai_response_choices_json(1, "i", "m", 1, ch, 2, &u);
	cJSON *o = cJSON_Parse(s), *arr = cJSON_GetObjectItem(o, "choices");
	assert_int_equal(cJSON_GetArraySize(arr), 2);
	cJSON *c1 = cJSON_GetArrayItem(arr, 1);
	assert_int_equal(cJSON_GetObjectItem(c1, "index")->valueint, 1);
	assert_true(cJSON_IsNull(cJSON_GetObjectItem(c1, "logprobs")));
	cJSON *content = cJSON_GetObjectItem(
	    cJSON_GetObjectItem(cJSON_GetArrayItem(arr, 0), "logprobs"), "content");
	assert_int_equal(cJSON_GetArraySize(content), 2);
	cJSON *t1 = cJSON_GetArrayItem(content, 1);
	assert_true(cJSON_GetObjectItem(t1, "logprob")->valuedouble == -9999);
	assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(t1, "bytes"), 0)->valueint, 'y');
	cJSON *top0 = cJSON_GetObjectItem(cJSON_GetArrayItem(content, 0), "top_logprobs");
	assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(top0, 1), "token")->valuestring,
			    "ha");
	cJSON_Delete(o);
	free(s);

	ch[0].lp_base = 5; /* completions, after a 5-byte echoed prompt */
	s = oai_response_choices_json(0, "i", "m", 1, ch, 1, &u);
	o = cJSON_Parse(s);
	cJSON *lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0),
					"logprobs");
	assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "tokens"), 1)->valuestring,
			    "y");
	assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "text_offset"), 1)->valueint,
			 7);
	cJSON *tops = cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "top_logprobs"), 0);
	assert_true(cJSON_GetObjectItem(tops, "ha")->valuedouble == -1.5);
	cJSON_Delete(o);
	free(s);

	/* Floats print shortest-exact: the decimal that reads back to the same float, not %1.17g
	 * of the widened double; non-finite values stay valid JSON (-9999). */
	e[0].logprob = -0.0559661f, e[0].top[1].logprob = NAN;
	s = oai_response_choices_json(1, "i", "m", 1, ch, 1, &u);
	assert_non_null(strstr(s, "\"logprob\":-0.0559661,"));
	assert_null(strstr(s, "0.0559661000"));
	assert_null(strstr(s, "nan"));
	assert_non_null(o = cJSON_Parse(s));
	cJSON_Delete(o);
	free(s);
	s = oai_response_choices_json(0, "i", "m", 1, ch, 1, &u);
	assert_non_null(strstr(s, "\"token_logprobs\":[-0.0559661,-9999]"));
	assert_non_null(strstr(s, "\"ha\":-9999"));
	assert_non_null(o = cJSON_Parse(s));
	cJSON_Delete(o);
	free(s);
}

static void test_responses_parse(void **state)
{
	(void)state;
	struct oai_usage u = {.prompt_tokens = 10, .completion_tokens = 3, .cached_tokens = 8};
	char *s = oai_response_json(1, "id1", "m", 123, "he said \"hi\"\n", "length", &u);
	cJSON *o = cJSON_Parse(s);
	assert_non_null(o);
	assert_string_equal(cJSON_GetObjectItem(o, "object")->valuestring, "chat.completion");
	cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
	assert_string_equal(
	    cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"), "content")->valuestring,
	    "he said \"hi\"\n");
	assert_string_equal(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "length");
	cJSON *us = cJSON_GetObjectItem(o, "usage");
	assert_int_equal(cJSON_GetObjectItem(us, "total_tokens")->valueint, 13);
	assert_int_equal(
	    cJSON_GetObjectItem(cJSON_GetObjectItem(us, "prompt_tokens_details"), "cached_tokens")
		->valueint,
	    8);
	cJSON_Delete(o);
	free(s);

	s = oai_chunk_json(0, "id2", "m", 1, "tok", NULL, NULL);
	o = cJSON_Parse(s);
	c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
	assert_string_equal(cJSON_GetObjectItem(c0, "text")->valuestring, "tok");
	assert_true(cJSON_IsNull(cJSON_GetObjectItem(c0, "finish_reason")));
	cJSON_Delete(o);
	free(s);

	s = oai_chunk_json(1, "id3", "m", 1, NULL, NULL, &u); /* final usage chunk */
	o = cJSON_Parse(s);
	assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "choices")), 0);
	assert_non_null(cJSON_GetObjectItem(o, "usage"));
	cJSON_Delete(o);
	free(s);

	s = oai_error_json("bad \"thing\"", NULL, "max_tokens", NULL);
	o = cJSON_Parse(s);
	cJSON *e = cJSON_GetObjectItem(o, "error");
	assert_string_equal(cJSON_GetObjectItem(e, "message")->valuestring, "bad \"thing\"");
	assert_string_equal(cJSON_GetObjectItem(e, "type")->valuestring, "invalid_request_error");
	assert_string_equal(cJSON_GetObjectItem(e, "param")->valuestring, "max_tokens");
	cJSON_Delete(o);
	free(s);

	const char *ids[] = {"a", "b"};
	s = oai_models_json(ids, 2, 5);
	o = cJSON_Parse(s);
	assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "data")), 2);
	cJSON_Delete(o);
	free(s);
}

/* 1 if s[0..n) is well-formed UTF-8 (RFC 3629), by decoding every code point. */
static int is_utf8(const unsigned char *s, size_t n)
{
	size_t i = 0;
	while (i < n) {
		unsigned c = s[i], cp, len;
		if (c < 0x80) {
			i++;
			continue;
		}
		if ((c & 0xE0) == 0xC0)
			len = 2, cp = c & 0x1F;
		else if ((c & 0xF0) == 0xE0)
			len = 3, cp = c & 0x0F;
		else if ((c & 0xF8) == 0xF0)
			len = 4, cp = c & 0x07;
		else
			return 0;
		if (i + len > n)
			return 0;
		for (unsigned k = 1; k < len; k++) {
			if ((s[i + k] & 0xC0) != 0x80)
				return 0;
			cp = cp << 6 | (s[i + k] & 0x3F);
		}
		static const unsigned min[5] = {0, 0, 0x80, 0x800, 0x10000};
		if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
			return 0;
		i += len;
	}
	return 1;
}

/* Request bodies must be UTF-8; generated text that is not (byte tokens) is written with
 * U+FFFD, so every response is valid JSON. */
static void test_utf8(void **state)
{
	(void)state;
	static const char *const bad[] = {
	    "{\"prompt\":\"ab\xff\"}",		    /* not a UTF-8 byte */
	    "{\"prompt\":\"\xc0\xaf\"}",	    /* overlong '/' */
	    "{\"prompt\":\"\xed\xa0\x80\"}",	    /* a surrogate */
	    "{\"prompt\":\"\xf4\x90\x80\x80\"}",    /* past U+10FFFF */
	    "{\"prompt\":\"x\xe2\x82\"}",	    /* cut short */
	    "{\"prompt\":\"x\",\"stop\":\"\x80\"}", /* any field */
	    "{\"messages\":[{\"role\":\"user\",\"content\":\"\xfe\"}]}",
	};
	struct oai_request r;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const char *param = "unset";
		int rc = parse(bad[i], strstr(bad[i], "messages") != NULL, &r, &param);
		if (rc != -EINVAL)
			fail_msg("case %zu: rc %d", i, rc);
	}
	/* Every length of well-formed sequence passes unchanged. */
	const char *ok = "{\"prompt\":\"h\xc3\xa9 \xe2\x82\xac \xf0\x9d\x84\x9e \xef\xbf\xbf\"}";
	assert_int_equal(parse(ok, 0, &r, NULL), 0);
	assert_string_equal(r.prompt, "h\xc3\xa9 \xe2\x82\xac \xf0\x9d\x84\x9e \xef\xbf\xbf");
	oai_request_free(&r);

	/* Output: each byte that is not part of a well-formed sequence becomes U+FFFD. */
	const char *gen = "a\xff\xe2\x82\xac\xe2\x82";
	const char *want = "a\xef\xbf\xbd\xe2\x82\xac\xef\xbf\xbd\xef\xbf\xbd";
	struct oai_usage u = {.prompt_tokens = 1, .completion_tokens = 4};
	for (int k = 0; k < 4; k++) {
		char *s = k == 0   ? oai_response_json(0, "i", "m", 1, gen, "stop", &u)
			  : k == 1 ? oai_response_json(1, "i", "m", 1, gen, "stop", &u)
			  : k == 2 ? oai_chunk_json(0, "i", "m", 1, gen, NULL, NULL)
				   : oai_chunk_json(1, "i", "m", 1, gen, NULL, NULL);
		assert_non_null(s);
		assert_true(is_utf8((const unsigned char *)s, strlen(s)));
		cJSON *o = cJSON_Parse(s);
		cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
		cJSON *t =
		    k == 1   ? cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"), "content")
		    : k == 3 ? cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "delta"), "content")
			     : cJSON_GetObjectItem(c0, "text");
		assert_string_equal(t->valuestring, want);
		cJSON_Delete(o);
		free(s);
	}
	/* The salt fits the worker protocol; max_completion_tokens: null means absent. */
	char salt[300];
	snprintf(salt, sizeof(salt), "{\"prompt\":\"a\",\"user\":\"%0*d\"}", OAI_MAX_SALT, 0);
	assert_int_equal(parse(salt, 0, &r, NULL), 0);
	assert_int_equal(strlen(r.salt), OAI_MAX_SALT);
	oai_request_free(&r);
	snprintf(salt, sizeof(salt), "{\"prompt\":\"a\",\"user\":\"%0*d\"}", OAI_MAX_SALT + 1, 0);
	assert_int_equal(parse(salt, 0, &r, NULL), -EINVAL);
	assert_int_equal(
	    parse("{\"prompt\":\"a\",\"max_completion_tokens\":null,\"max_tokens\":40}", 0, &r,
		  NULL),
	    0);
	assert_int_equal(r.max_tokens, 40);
	oai_request_free(&r);
}

/* text_offset in the returned text: a character cut between tokens ("\xE2" then "\x82\xAC",
 * the euro sign) starts where its first byte does, both tokens inside it pointing at it; a
 * byte that is not UTF-8 is written as U+FFFD (3 bytes) and counts so; offsets past the text
 * (bytes held back) go on from its written end. */
static void test_text_offsets(void **state)
{
	(void)state;
	const char *t = "a\xE2\x82\xAC"
			"b\xE2\xE2"
			"c";
	size_t offs[] = {0, 1, 2, 4, 5, 6, 7, 8, 10}, out[9];
	oai_text_offsets(t, strlen(t), offs, 9, out);
	/* written: a(0) EURO(1..3) b(4) FFFD(5..7) FFFD(8..10) c(11); 12 bytes */
	const size_t want[] = {0, 1, 1, 4, 5, 8, 11, 12, 14};
	for (int i = 0; i < 9; i++)
		assert_int_equal(out[i], want[i]);
	/* the euro sign's own bytes, after another token's */
	size_t o2[] = {0, 0, 1};
	oai_text_offsets("\xE2\x82\xAC", 3, o2, 3, out);
	assert_int_equal(out[0], 0);
	assert_int_equal(out[2], 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_completion_ok),    cmocka_unit_test(test_bad_requests),
	    cmocka_unit_test(test_duplicate_keys),   cmocka_unit_test(test_chat),
	    cmocka_unit_test(test_responses_parse),  cmocka_unit_test(test_utf8),
	    cmocka_unit_test(test_choices_logprobs), cmocka_unit_test(test_text_offsets),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
