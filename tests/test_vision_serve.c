/* Images through the embedded server with a vision tower (`kvinfer serve --mmproj`, issue 26):
 * the first request encodes its image; a repeat encodes nothing (its embeddings come from the
 * kv dir), reuses the KV blocks after the image and gives the same log-probabilities; another
 * image with the same text is encoded and reuses nothing from the image on; n = 2 forks the
 * image prompt; and a restarted server finds the embeddings and blocks in the kv dir. */
#include <cjson/cJSON.h>
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

#include "http_tutil.h"
#include "img_tutil.h"
#include "proc_tutil.h"

enum { B = 16 };
static char tmpdir[256], bin[512], model[512], mmproj[512], kv[512];
static pid_t pid = -1;
static uint16_t port;
static int restarts;

static int start(void)
{
	char pf[600], log[600];
	snprintf(pf, sizeof(pf), "%s/port%d", tmpdir, restarts);
	snprintf(log, sizeof(log), "%s/serve%d.log", tmpdir, restarts++);
	pid = ptu_serve_vision(bin, model, mmproj, kv, pf, log, NULL);
	port = ptu_wait_port(pf);
	return port ? 0 : -1;
}

static int setup(void **state)
{
	(void)state;
	if (ptu_scratch("test_vision_serve", tmpdir, sizeof(tmpdir), bin, sizeof(bin)))
		return -1;
	snprintf(model, sizeof(model), "%s/m.gguf", tmpdir);
	snprintf(mmproj, sizeof(mmproj), "%s/mmproj.gguf", tmpdir);
	snprintf(kv, sizeof(kv), "%s/kv", tmpdir);
	mkdir(kv, 0755);
	if (ptu_synth(tmpdir, model, mmproj))
		return -1;
	return start();
}

static int teardown(void **state)
{
	(void)state;
	return ptu_finish(tmpdir, &pid, 1, NULL, 0);
}

/* ---- a picture: a PNG of a pattern that `seed` changes ---- */

/* ---- a request ---- */

struct answer {
	int prompt_tokens, cached_tokens;
	char *text[2];
	char *logprobs[2]; /* the token log-probabilities, printed */
};

static void answer_free(struct answer *a)
{
	for (int i = 0; i < 2; i++) {
		free(a->text[i]);
		free(a->logprobs[i]);
	}
}

/* A greedy 4-token chat request: text, the picture, more text; n choices. */
static struct answer ask(int seed, int n)
{
	char *url = itu_picture_url(seed);
	size_t len = strlen(url) + 512;
	char *body = malloc(len);
	snprintf(
	    body, len,
	    "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
	    "\"Describe this picture, please: \"},{\"type\":\"image_url\",\"image_url\":"
	    "{\"url\":\"%s\"}},{\"type\":\"text\",\"text\":\" in a few words. Thank you.\"}]}],"
	    "\"max_tokens\":4,\"temperature\":0,\"logprobs\":true,\"n\":%d}",
	    url, n);
	char *resp = NULL;
	int st = htu_request(port, 0, "POST", "/v1/chat/completions", body, &resp);
	cJSON *o = resp ? cJSON_Parse(resp) : NULL;
	if (st != 200 || !o)
		fail_msg("status %d: %s", st, resp ? resp : "");
	struct answer a = {0};
	cJSON *u = cJSON_GetObjectItem(o, "usage");
	a.prompt_tokens = cJSON_GetObjectItem(u, "prompt_tokens")->valueint;
	a.cached_tokens =
	    cJSON_GetObjectItem(cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens")
		->valueint;
	cJSON *ch = cJSON_GetObjectItem(o, "choices");
	assert_int_equal(cJSON_GetArraySize(ch), n);
	for (int i = 0; i < n; i++) {
		cJSON *c = cJSON_GetArrayItem(ch, i);
		a.text[i] = strdup(
		    cJSON_GetObjectItem(cJSON_GetObjectItem(c, "message"), "content")->valuestring);
		cJSON *lp = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "logprobs"), "content");
		cJSON *vals = cJSON_CreateArray();
		cJSON *e;
		cJSON_ArrayForEach(e, lp) cJSON_AddItemToArray(
		    vals, cJSON_CreateNumber(cJSON_GetObjectItem(e, "logprob")->valuedouble));
		a.logprobs[i] = cJSON_PrintUnformatted(vals);
		cJSON_Delete(vals);
	}
	cJSON_Delete(o);
	free(resp);
	free(body);
	free(url);
	return a;
}

static double metric(const char *name)
{
	return ptu_metric(port, name);
}

static void test_repeat_and_other_image(void **state)
{
	(void)state;
	struct answer a = ask(1, 1);
	print_message("first: %d prompt tokens, %d cached, %s\n", a.prompt_tokens, a.cached_tokens,
		      a.logprobs[0]);
	assert_int_equal(a.cached_tokens, 0);
	assert_true(metric("vision_encodes_total") == 1);
	assert_true(metric("vision_images_total") == 1);

	/* the same picture again: no encoding, every full block before the last token reused */
	struct answer r = ask(1, 1);
	print_message("repeat: %d cached, %s\n", r.cached_tokens, r.logprobs[0]);
	assert_int_equal(r.prompt_tokens, a.prompt_tokens);
	assert_int_equal(r.cached_tokens, (a.prompt_tokens - 1) / B * B);
	assert_string_equal(r.logprobs[0], a.logprobs[0]);
	assert_string_equal(r.text[0], a.text[0]);
	assert_true(metric("vision_encodes_total") == 1);
	assert_true(metric("vision_embedding_cache_hits_total") == 1);

	/* another picture, the same text: encoded, and the blocks from the picture on are not
	 * reused (they hold the other picture's KV) */
	struct answer o = ask(2, 1);
	print_message("other image: %d cached, %s\n", o.cached_tokens, o.logprobs[0]);
	assert_int_equal(o.prompt_tokens, a.prompt_tokens);
	assert_true(o.cached_tokens < r.cached_tokens);
	assert_true(o.cached_tokens <= a.prompt_tokens - 16 /* the picture's tokens */);
	assert_string_not_equal(o.logprobs[0], a.logprobs[0]);
	assert_true(metric("vision_encodes_total") == 2);

	/* n = 2: the picture's prompt computed once, both greedy choices the first answer */
	struct answer n2 = ask(1, 2);
	for (int i = 0; i < 2; i++)
		assert_string_equal(n2.logprobs[i], a.logprobs[0]);
	assert_true(metric("vision_encodes_total") == 2);
	answer_free(&a);
	answer_free(&r);
	answer_free(&o);
	answer_free(&n2);
}

/* A new server on the same kv dir: the picture's embeddings and blocks are found there. */
static void test_restart_finds_kv_dir(void **state)
{
	(void)state;
	struct answer a = ask(3, 1); /* a picture this server encodes */
	assert_true(metric("vision_encodes_total") >= 1);
	ptu_stop(&pid);
	assert_int_equal(start(), 0);
	struct answer r = ask(3, 1);
	print_message("after a restart: %d cached, %s\n", r.cached_tokens, r.logprobs[0]);
	assert_true(metric("vision_encodes_total") == 0);
	assert_true(metric("vision_embedding_cache_hits_total") == 1);
	assert_int_equal(r.cached_tokens, (a.prompt_tokens - 1) / B * B);
	assert_string_equal(r.logprobs[0], a.logprobs[0]);
	answer_free(&a);
	answer_free(&r);
	char log[600];
	for (int i = 0; i < restarts; i++) {
		snprintf(log, sizeof(log), "%s/serve%d.log", tmpdir, i);
		if (!ptu_log_clean(log))
			fail_msg("%s has a sanitizer report", log);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_repeat_and_other_image),
	    cmocka_unit_test(test_restart_finds_kv_dir),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
