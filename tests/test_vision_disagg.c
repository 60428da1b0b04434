/* Images through the disaggregated server (issue 26): `kvinfer gateway --encode E0,E1` over
 * two `kvinfer encode` workers, a prefill and a decode worker sharing one kv dir, next to the
 * embedded server (`kvinfer serve --mmproj`) on a kv dir of its own. The same picture and
 * text give the same log-probabilities on both; a repeat encodes nothing (the encoders'
 * metrics) and reports the picture's tokens cached; another picture with the same text reuses
 * nothing from the picture on; a stream of distinct pictures spreads 40-60 % over the two
 * encoders; malformed pictures are 400s and the gateway stays up.
 *
 *   test_vision_disagg --cuda   every worker and the embedded server with --device cuda (the
 *                               towers and the language models on GPU 0; on the CUDA
 *                               emulation in CI): the first test only (the same logits
 *                               embedded and disaggregated, the repeat cached, another
 *                               picture); exits 77 without a GPU. */
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
#include <pthread.h>

#include "http_tutil.h"
#include "img_tutil.h"
#include "kvk_cuda.h"
#include "proc_tutil.h"

enum { B = 16, NE = 2, NBAL = 400, NCLI = 8 };
enum { P_E0, P_E1, P_PF, P_DC, P_SERVE, P_GW, P_GW2, NP };
static char tmpdir[256], bin[512], model[512], mmproj[512], kv[512], kv_emb[512], sec[512];
static pid_t pids[NP];
static uint16_t gw_port, gw2_port, serve_port, enc_mport[NE];
static int on_cuda; /* --cuda: every process gets --device cuda */

/* Appends "--device cuda" in place of argv's terminating NULL under --cuda (every argv below
 * keeps two spare NULL slots for it). */
static char **dev_args(char **argv)
{
	if (on_cuda) {
		int n = 0;
		while (argv[n])
			n++;
		argv[n] = "--device";
		argv[n + 1] = "cuda";
	}
	return argv;
}

/* Starts proc i with argv (NULL-terminated after the fixed part); its port from its port file. */
static uint16_t launch(int i, char **argv, const char *name)
{
	char log[600];
	snprintf(log, sizeof(log), "%s/%s.log", tmpdir, name);
	pids[i] = ptu_spawn(argv, log);
	char pf[600];
	snprintf(pf, sizeof(pf), "%s/%s.port", tmpdir, name);
	return ptu_wait_port(pf);
}

/* Starts proc i, a gateway in front of the prefill and decode workers at wport[0], wport[1]
 * with extra flags (ptu_gateway_at); its port from its port file. */
static uint16_t launch_gw(int i, const char *name, const uint16_t *wport, const char *const *extra)
{
	char log[600], pf[600];
	snprintf(log, sizeof(log), "%s/%s.log", tmpdir, name);
	snprintf(pf, sizeof(pf), "%s/%s.port", tmpdir, name);
	pids[i] = ptu_gateway_at(bin, pf, log, wport[0], wport[1], sec, extra);
	return ptu_wait_port(pf);
}

static int setup(void **state)
{
	(void)state;
	for (int i = 0; i < NP; i++)
		pids[i] = -1;
	if (ptu_scratch("test_vision_disagg", tmpdir, sizeof(tmpdir), bin, sizeof(bin)))
		return -1;
	snprintf(model, sizeof(model), "%s/m.gguf", tmpdir);
	snprintf(mmproj, sizeof(mmproj), "%s/mmproj.gguf", tmpdir);
	snprintf(kv, sizeof(kv), "%s/kv", tmpdir);
	snprintf(kv_emb, sizeof(kv_emb), "%s/kv-embedded", tmpdir);
	snprintf(sec, sizeof(sec), "%s/secret", tmpdir);
	mkdir(kv, 0755);
	mkdir(kv_emb, 0755);
	if (ptu_write_line(sec, "test-vision-disagg-secret-0123456789") ||
	    ptu_synth(tmpdir, model, mmproj))
		return -1;
	char pf[600], mf[NE][600], elist[200] = "";
	uint16_t eport[NE];
	for (int i = 0; i < NE; i++) {
		char name[16];
		snprintf(name, sizeof(name), "enc%d", i);
		snprintf(pf, sizeof(pf), "%s/%s.port", tmpdir, name);
		snprintf(mf[i], sizeof(mf[i]), "%s/%s.maddr", tmpdir, name);
		char log[600];
		snprintf(log, sizeof(log), "%s/%s.log", tmpdir, name);
		const char *cuda[] = {"--device", "cuda", NULL};
		pids[P_E0 + i] =
		    ptu_encoder(bin, mmproj, kv, sec, pf, mf[i], log, on_cuda ? cuda : NULL);
		if (!(eport[i] = ptu_wait_port(pf)))
			return -1;
		snprintf(elist + strlen(elist), sizeof(elist) - strlen(elist), "%s127.0.0.1:%u",
			 i ? "," : "", eport[i]);
	}
	for (int i = 0; i < NE; i++) { /* the metrics ports, from the address files */
		char a[128];
		if (!(enc_mport[i] = ptu_wait_addr(mf[i], a, sizeof(a))))
			return -1;
	}
	static const char *const role[2] = {"prefill", "decode"};
	uint16_t wport[2];
	for (int i = 0; i < 2; i++) {
		snprintf(pf, sizeof(pf), "%s/%s.port", tmpdir, role[i]);
		char *argv[] = {bin,
				(char *)role[i],
				"-m",
				model,
				"--kv-dir",
				kv,
				"--secret-file",
				sec,
				"-t",
				"1",
				"--block-tokens",
				"16",
				"--ctx",
				"512",
				"--port-file",
				pf,
				NULL,
				NULL,
				NULL};
		if (!(wport[i] = launch(P_PF + i, dev_args(argv), role[i])))
			return -1;
	}
	const char *gex[] = {"--encode", elist, NULL};
	if (!(gw_port = launch_gw(P_GW, "gateway", wport, gex)))
		return -1;
	/* the same workers behind a gateway handing the KV over directly */
	const char *g2ex[] = {"--encode", elist, "--handoff", "direct", NULL};
	if (!(gw2_port = launch_gw(P_GW2, "gateway2", wport, g2ex)))
		return -1;
	snprintf(pf, sizeof(pf), "%s/serve.port", tmpdir);
	char log[600];
	snprintf(log, sizeof(log), "%s/serve.log", tmpdir);
	const char *cuda[] = {"--device", "cuda", NULL};
	pids[P_SERVE] =
	    ptu_serve_vision(bin, model, mmproj, kv_emb, pf, log, on_cuda ? cuda : NULL);
	if (!(serve_port = ptu_wait_port(pf)))
		return -1;
	/* the gateway's first health round */
	ptu_sleep_ms(300);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	pid_t gw[2] = {pids[P_GW], pids[P_GW2]};
	pid_t rest[P_GW];
	for (int i = 0; i < P_GW; i++)
		rest[i] = pids[i];
	return ptu_finish(tmpdir, gw, 2, rest, P_GW);
}

/* ---- a picture: a PNG of a pattern that `seed` changes ---- */

/* ---- a request ---- */

struct answer {
	int status;
	int prompt_tokens, cached_tokens;
	char *text;
	char *logprobs;	 /* the token log-probabilities, printed */
	char *logprobs2; /* n = 2: the second choice's */
};

static void answer_free(struct answer *a)
{
	free(a->text);
	free(a->logprobs);
	free(a->logprobs2);
}

static char *lp_of(cJSON *choice)
{
	cJSON *lp = cJSON_GetObjectItem(cJSON_GetObjectItem(choice, "logprobs"), "content");
	cJSON *vals = cJSON_CreateArray();
	cJSON *e;
	cJSON_ArrayForEach(e, lp) cJSON_AddItemToArray(
	    vals, cJSON_CreateNumber(cJSON_GetObjectItem(e, "logprob")->valuedouble));
	char *s = cJSON_PrintUnformatted(vals);
	cJSON_Delete(vals);
	return s;
}

/* A greedy chat request on port: text, the picture (its data URL), more text; n choices. */
static struct answer ask_url_n(uint16_t port, const char *url, int max_tokens, int n)
{
	size_t len = strlen(url) + 512;
	char *body = malloc(len);
	snprintf(
	    body, len,
	    "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
	    "\"Describe this picture, please: \"},{\"type\":\"image_url\",\"image_url\":"
	    "{\"url\":\"%s\"}},{\"type\":\"text\",\"text\":\" in a few words. Thank you.\"}]}],"
	    "\"max_tokens\":%d,\"temperature\":0,\"logprobs\":true,\"n\":%d}",
	    url, max_tokens, n);
	char *resp = NULL;
	struct answer a = {0};
	a.status = htu_request(port, 0, "POST", "/v1/chat/completions", body, &resp);
	cJSON *o = resp ? cJSON_Parse(resp) : NULL;
	if (a.status == 200 && o) {
		cJSON *u = cJSON_GetObjectItem(o, "usage");
		a.prompt_tokens = cJSON_GetObjectItem(u, "prompt_tokens")->valueint;
		a.cached_tokens =
		    cJSON_GetObjectItem(cJSON_GetObjectItem(u, "prompt_tokens_details"),
					"cached_tokens")
			->valueint;
		cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
		a.text = strdup(
		    cJSON_GetObjectItem(cJSON_GetObjectItem(c, "message"), "content")->valuestring);
		a.logprobs = lp_of(c);
		if (n > 1)
			a.logprobs2 =
			    lp_of(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 1));
	} else {
		print_message("status %d: %s\n", a.status, resp ? resp : "");
	}
	cJSON_Delete(o);
	free(resp);
	free(body);
	return a;
}

static struct answer ask_url(uint16_t port, const char *url, int max_tokens)
{
	return ask_url_n(port, url, max_tokens, 1);
}

static struct answer ask_n(uint16_t port, int seed, int n)
{
	char *url = itu_picture_url(seed);
	struct answer a = ask_url_n(port, url, 4, n);
	free(url);
	if (a.status != 200)
		fail_msg("request with picture %d: status %d", seed, a.status);
	return a;
}

static struct answer ask(uint16_t port, int seed)
{
	return ask_n(port, seed, 1);
}

/* The sum over the encoders of a metric. */
static double enc_metric(const char *name)
{
	double s = 0;
	for (int i = 0; i < NE; i++) {
		double v = ptu_metric(enc_mport[i], name);
		if (v < 0)
			fail_msg("encoder %d: no %s", i, name);
		s += v;
	}
	return s;
}

/* 1 when tmpdir/<name>.log holds needle (what a process said about where it runs). */
static int log_has(const char *name, const char *needle)
{
	char path[600], line[1024];
	snprintf(path, sizeof(path), "%s/%s.log", tmpdir, name);
	FILE *f = fopen(path, "r");
	int found = 0;
	while (f && !found && fgets(line, sizeof(line), f))
		found = strstr(line, needle) != NULL;
	if (f)
		fclose(f);
	return found;
}

static void test_same_as_embedded_then_cached(void **state)
{
	(void)state;
	if (on_cuda) { /* the towers did move to the device (and the models are there) */
		assert_true(log_has("serve", "tokens per image, on cuda"));
		assert_true(log_has("enc0", "per image) on cuda"));
		assert_true(log_has("enc1", "per image) on cuda"));
	}
	struct answer e = ask(serve_port, 1);
	struct answer a = ask(gw_port, 1);
	print_message("embedded: %d tokens %s; disaggregated: %d tokens, %d cached %s\n",
		      e.prompt_tokens, e.logprobs, a.prompt_tokens, a.cached_tokens, a.logprobs);
	assert_int_equal(a.prompt_tokens, e.prompt_tokens);
	assert_string_equal(a.logprobs, e.logprobs);
	assert_string_equal(a.text, e.text);
	assert_int_equal(a.cached_tokens, 0);
	assert_true(enc_metric("encoder_encodes_total") == 1);
	assert_true(enc_metric("encoder_cache_hits_total") == 0);

	/* the same picture again: no encoding; every full block before the last token reused,
	 * the picture's tokens among them */
	struct answer r = ask(gw_port, 1);
	print_message("repeat: %d cached %s\n", r.cached_tokens, r.logprobs);
	assert_int_equal(r.prompt_tokens, a.prompt_tokens);
	assert_int_equal(r.cached_tokens, (a.prompt_tokens - 1) / B * B);
	assert_string_equal(r.logprobs, a.logprobs);
	assert_true(enc_metric("encoder_encodes_total") == 1);
	assert_true(enc_metric("encoder_cache_hits_total") == 1);
	assert_true(enc_metric("encoder_encode_seconds_count") == 1);

	/* another picture, the same text: encoded; the blocks from the picture on are not
	 * reused (they hold the other picture's KV) */
	struct answer o = ask(gw_port, 2);
	struct answer oe = ask(serve_port, 2);
	print_message("other picture: %d cached %s\n", o.cached_tokens, o.logprobs);
	assert_int_equal(o.prompt_tokens, a.prompt_tokens);
	assert_true(o.cached_tokens < r.cached_tokens);
	assert_true(o.cached_tokens <= a.prompt_tokens - 16 /* the picture's tokens */);
	assert_string_not_equal(o.logprobs, a.logprobs);
	assert_string_equal(o.logprobs, oe.logprobs);
	assert_true(enc_metric("encoder_encodes_total") == 2);
	answer_free(&e);
	answer_free(&a);
	answer_free(&r);
	answer_free(&o);
	answer_free(&oe);
}

/* The direct hand-over (the decode worker claims parked KV with the image-aware names) and
 * n = 2 (one PREFILL with the pictures, both choices decoded as forks) agree with the
 * embedded server too. */
static void test_direct_and_choices(void **state)
{
	(void)state;
	struct answer e = ask(serve_port, 5);
	struct answer d = ask(gw2_port, 5);
	print_message("direct: %d tokens, %d cached %s\n", d.prompt_tokens, d.cached_tokens,
		      d.logprobs);
	assert_int_equal(d.prompt_tokens, e.prompt_tokens);
	assert_string_equal(d.logprobs, e.logprobs);
	struct answer n2 = ask_n(gw_port, 5, 2);
	assert_string_equal(n2.logprobs, e.logprobs);
	assert_string_equal(n2.logprobs2, e.logprobs);
	struct answer n3 = ask_n(gw_port, 6, 2); /* a picture new to the prefill worker */
	struct answer e3 = ask(serve_port, 6);
	assert_string_equal(n3.logprobs, e3.logprobs);
	assert_string_equal(n3.logprobs2, e3.logprobs);
	answer_free(&e);
	answer_free(&d);
	answer_free(&n2);
	answer_free(&n3);
	answer_free(&e3);
}

/* One client of the stream: pictures 1000 + k for k = its index mod NCLI. */
static void *client(void *arg)
{
	intptr_t me = (intptr_t)arg;
	intptr_t bad = 0;
	for (int k = (int)me; k < NBAL; k += NCLI) {
		char *url = itu_picture_url(1000 + k);
		struct answer a = ask_url(gw_port, url, 1);
		free(url);
		bad += a.status != 200;
		answer_free(&a);
	}
	return (void *)bad;
}

/* A stream of distinct pictures from NCLI clients at once: each encoder gets 40-60 % of
 * them (image-hash affinity under the load bound, lbp_pick_encode). */
static void test_two_encoders_balance(void **state)
{
	(void)state;
	double before[NE];
	for (int i = 0; i < NE; i++)
		before[i] = ptu_metric(enc_mport[i], "encoder_requests_total");
	pthread_t t[NCLI];
	for (intptr_t i = 0; i < NCLI; i++)
		assert_int_equal(pthread_create(&t[i], NULL, client, (void *)i), 0);
	intptr_t bad = 0;
	for (int i = 0; i < NCLI; i++) {
		void *r = NULL;
		pthread_join(t[i], &r);
		bad += (intptr_t)r;
	}
	assert_int_equal(bad, 0);
	double got[NE];
	for (int i = 0; i < NE; i++) {
		got[i] = ptu_metric(enc_mport[i], "encoder_requests_total") - before[i];
		print_message("encoder %d: %.0f of %d pictures\n", i, got[i], NBAL);
	}
	assert_true(got[0] + got[1] == NBAL);
	for (int i = 0; i < NE; i++)
		assert_true(got[i] >= 0.4 * NBAL && got[i] <= 0.6 * NBAL);
}

/* Malformed pictures: each a 400, the gateway still serves pictures afterwards. */
static void test_bad_images(void **state)
{
	(void)state;
	static const char *const bad[] = {
	    "data:image/png;base64,iVBORw0KGgo=",	  /* a PNG signature, no more */
	    "data:image/png;base64,!!!notbase64!!!",	  /* not base64 */
	    "data:image/gif;base64,R0lGODlhAQABAAAAACw=", /* not a format taken */
	    "http://example.com/cat.png",		  /* fetching is off */
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct answer a = ask_url(gw_port, bad[i], 1);
		assert_int_equal(a.status, 400);
		answer_free(&a);
	}
	char *url = itu_picture_url(1);
	char *cut = strdup(url);
	cut[strlen(cut) * 2 / 3] = 0; /* truncated */
	struct answer t = ask_url(gw_port, cut, 1);
	assert_int_equal(t.status, 400);
	answer_free(&t);
	free(cut);
	struct answer ok = ask_url(gw_port, url, 1);
	assert_int_equal(ok.status, 200);
	answer_free(&ok);
	free(url);
	char log[600];
	snprintf(log, sizeof(log), "%s/gateway.log", tmpdir);
	if (!ptu_log_clean(log))
		fail_msg("%s has a sanitizer report", log);
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "--cuda")) {
		if (kvk_cuda_device_count() == 0) {
			printf("skipped: no GPU (or no CUDA in this build)\n");
			return 77;
		}
		on_cuda = 1;
		const struct CMUnitTest dev[] = {
		    cmocka_unit_test(test_same_as_embedded_then_cached),
		};
		return cmocka_run_group_tests_name("vision_disagg_cuda", dev, setup, teardown);
	}
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_same_as_embedded_then_cached),
	    cmocka_unit_test(test_direct_and_choices),
	    cmocka_unit_test(test_two_encoders_balance),
	    cmocka_unit_test(test_bad_images),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
