/* Image parts of chat requests against the real servers, in both forms: `kvinfer serve`
 * (embedded) and `kvinfer gateway` over one prefill and one decode worker. Text-part arrays
 * are answered (as the same text in a string); every bad image is a 400 in OpenAI's error
 * format naming its problem, a good one a 400 saying the model has no vision encoder, and
 * the server answers the next request and logs no sanitizer report. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/evp.h>
#include <png.h>
#include <zlib.h>

#include "http_tutil.h"
#include "img_tutil.h"
#include "proc_tutil.h"

enum { EMB, DIS, NFORM };
static const char *const form_name[NFORM] = {"embedded", "disaggregated"};
static char tmpdir[256];
static pid_t gpids[2] = {-1, -1}; /* serve, gateway */
static pid_t wpids[2] = {-1, -1}; /* prefill, decode */
static uint16_t ports[NFORM];

static int setup(void **state)
{
	(void)state;
	char bin[512], model[512], kv[2][512], secret[512], pf[4][600], log[4][600];
	if (ptu_scratch("test_img_serve", tmpdir, sizeof(tmpdir), bin, sizeof(bin)))
		return -1;
	snprintf(model, sizeof(model), "%s/m.gguf", tmpdir);
	snprintf(secret, sizeof(secret), "%s/secret", tmpdir);
	for (int i = 0; i < 2; i++) {
		snprintf(kv[i], sizeof(kv[i]), "%s/kv%d", tmpdir, i);
		mkdir(kv[i], 0755);
	}
	for (int i = 0; i < 4; i++) {
		snprintf(pf[i], sizeof(pf[i]), "%s/port%d", tmpdir, i);
		snprintf(log[i], sizeof(log[i]), "%s/log%d", tmpdir, i);
	}
	if (ptu_write_line(secret, "test-img-serve-secret-0123456789abcdef") ||
	    ptu_synth(tmpdir, model, NULL))
		return -1;
		/* a small side limit, so one test image is over it: the option reaches the parser
		 */
#define IMGOPT "--image-max-side", "64"
#define WK(cmd, kvd, portf)                                                                        \
	bin, cmd, "-m", model, "--kv-dir", kvd, "-t", "1", "--block-tokens", "16", "--ctx", "512", \
	    "--port-file", portf
	char *serve[] = {WK("serve", kv[0], pf[0]), "--port", "0", "--open-gateway", IMGOPT, NULL};
	char *pre[] = {WK("prefill", kv[1], pf[1]), "--secret-file", secret, NULL};
	char *dec[] = {WK("decode", kv[1], pf[2]), "--secret-file", secret, NULL};
#undef WK
	gpids[0] = ptu_spawn(serve, log[0]);
	wpids[0] = ptu_spawn(pre, log[1]);
	wpids[1] = ptu_spawn(dec, log[2]);
	uint16_t wp[3];
	for (int i = 0; i < 3; i++)
		if (!(wp[i] = ptu_wait_port(pf[i])))
			return -1;
	const char *gw[] = {IMGOPT, NULL};
	gpids[1] = ptu_gateway_at(bin, pf[3], log[3], wp[1], wp[2], secret, gw);
	ports[EMB] = wp[0];
	ports[DIS] = ptu_wait_port(pf[3]);
	return ports[DIS] ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	return ptu_finish(tmpdir, gpids, 2, wpids, 2);
}

/* ---- images ---- */

/* ---- requests ---- */

static int post(int form, const char *body, cJSON **out)
{
	char *b = NULL;
	int st = htu_request(ports[form], 0, "POST", "/v1/chat/completions", body, &b);
	*out = b ? cJSON_Parse(b) : NULL;
	if (!*out)
		fail_msg("%s: status %d, not JSON: %s", form_name[form], st, b ? b : "");
	free(b);
	return st;
}

/* The answer to a greedy 4-token chat request whose user content is content (JSON). */
static char *answer(int form, const char *content)
{
	size_t n = strlen(content) + 200;
	char *body = malloc(n);
	snprintf(body, n,
		 "{\"messages\":[{\"role\":\"user\",\"content\":%s}],\"max_tokens\":4,"
		 "\"temperature\":0}",
		 content);
	cJSON *o;
	int st = post(form, body, &o);
	if (st != 200)
		fail_msg("%s: %d %s", form_name[form], st, cJSON_PrintUnformatted(o));
	cJSON *m = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0),
				       "message");
	char *t = strdup(cJSON_GetObjectItem(m, "content")->valuestring);
	cJSON_Delete(o);
	free(body);
	return t;
}

static void test_text_parts(void **state)
{
	(void)state;
	for (int f = 0; f < NFORM; f++) {
		char *a = answer(f, "\"Once upon a time\"");
		char *b = answer(f, "[{\"type\":\"text\",\"text\":\"Once upon\"},"
				    "{\"type\":\"text\",\"text\":\" a time\"}]");
		char *c = answer(f, "[{\"text\":\"Once upon a time\"}]");
		assert_true(strlen(a) > 0);
		assert_string_equal(a, b);
		assert_string_equal(a, c);
		printf("%s: text parts answered \"%s\"\n", form_name[f], a);
		free(a);
		free(b);
		free(c);
	}
}

/* Posts an image part (url) after a text part; expects a 400 whose message has msg. */
static void expect_image_400(int form, const char *url, const char *msg)
{
	size_t n = strlen(url) + 300;
	char *body = malloc(n);
	snprintf(body, n,
		 "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
		 "\"What is this?\"},{\"type\":\"image_url\",\"image_url\":{\"url\":\"%s\"}}]}],"
		 "\"max_tokens\":4}",
		 url);
	cJSON *o;
	int st = post(form, body, &o);
	cJSON *e = cJSON_GetObjectItem(o, "error");
	cJSON *m = e ? cJSON_GetObjectItem(e, "message") : NULL;
	cJSON *p = e ? cJSON_GetObjectItem(e, "param") : NULL;
	cJSON *t = e ? cJSON_GetObjectItem(e, "type") : NULL;
	if (st != 400 || !cJSON_IsString(m) || !strstr(m->valuestring, msg) || !cJSON_IsString(p) ||
	    strcmp(p->valuestring, "messages") || !cJSON_IsString(t) ||
	    strcmp(t->valuestring, "invalid_request_error"))
		fail_msg("%s: want 400 '%s', got %d %s", form_name[form], msg, st,
			 cJSON_PrintUnformatted(o));
	cJSON_Delete(o);
	free(body);
}

static void test_bad_images(void **state)
{
	(void)state;
	struct itu_buf good = itu_png(8, 6, 0, 0), wide = itu_png(100, 10, 0, 0),
		       bomb = itu_png(6000, 6000, 1, 0);
	/* the same PNG claiming 100000 × 100000, its header CRC made right */
	uint8_t *huge = malloc(good.n);
	memcpy(huge, good.p, good.n);
	for (int i = 0; i < 4; i++)
		huge[16 + i] = huge[20 + i] = (uint8_t)(100000u >> (24 - 8 * i));
	uint32_t crc = (uint32_t)crc32(0, huge + 12, 17);
	for (int i = 0; i < 4; i++)
		huge[29 + i] = (uint8_t)(crc >> (24 - 8 * i));
	struct {
		char *url;
		const char *msg;
	} cases[] = {
	    {itu_data_url("image/png", good.p, good.n - 9), "bad PNG image"},
	    {itu_data_url("image/png", (const uint8_t *)"hello world", 11),
	     "unsupported image format"},
	    {itu_data_url("image/png", huge, good.n), "100000x100000"},
	    {itu_data_url("image/png", bomb.p, bomb.n), "6000x6000"},
	    {itu_data_url("image/png", wide.p, wide.n), "64-pixel width limit"},
	    {itu_data_url("image/jpeg", good.p, good.n), "says image/jpeg but the data is PNG"},
	    {strdup("data:image/png;base64,@@@@"), "not base64"},
	    {strdup("https://example.com/cat.png"), "not allowed"},
	    {itu_data_url("image/png", good.p, good.n),
	     "model has no vision encoder (start with --mmproj)"},
	};
	int nc = (int)(sizeof(cases) / sizeof(cases[0]));
	for (int f = 0; f < NFORM; f++)
		for (int i = 0; i < nc; i++) {
			expect_image_400(f, cases[i].url, cases[i].msg);
			/* still up: a text request right after is answered */
			free(answer(f, "[{\"type\":\"text\",\"text\":\"Hello\"}]"));
		}
	for (int i = 0; i < nc; i++)
		free(cases[i].url);
	free(huge);
	free(good.p);
	free(wide.p);
	free(bomb.p);
	for (int i = 0; i < 4; i++) {
		char path[600];
		snprintf(path, sizeof(path), "%s/log%d", tmpdir, i);
		if (!ptu_log_clean(path))
			fail_msg("%s has a sanitizer report", path);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_text_parts),
	    cmocka_unit_test(test_bad_images),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
