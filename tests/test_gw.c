/* Tests for engine/serve/gw, the HTTP gateway, over real sockets: endpoints, streaming (SSE
 * ending in [DONE]), stop strings, usage, errors as OpenAI error JSON with the right status,
 * oversize bodies, client disconnects cancelling the backend, 20 concurrent clients, metrics.
 * The backend here is a small token generator thread (the real engine backends are tested
 * in their own suites); the HTTP side is the real libmicrohttpd server. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "gw.h"
#include "http_tutil.h"
#include "metrics.h"
#include "prom_parse.h"

static atomic_int cancels, submits;

struct gen {
	struct gw_job *job;
	int max, slow, fail;
	atomic_int cancelled;
	char prompt[64];
};

static void *gen_main(void *arg)
{
	struct gen *g = arg;
	if (strcmp(g->prompt, "toolong") == 0) { /* refused by a worker after the submit */
		usleep(20000);
		gw_job_finish(g->job, NULL, -E2BIG, "prompt and max_tokens exceed the context");
		return NULL;
	}
	gw_job_prompt(g->job, (int)strlen(g->prompt), 3);
	/* Produces "w0 w1 w2 ..." or, for prompt "stop", "hello world END more text". */
	static const char *stop_words[] = {"hel", "lo wor", "ld E", "ND ", "more", " text"};
	int i;
	for (i = 0; i < g->max; i++) {
		if (atomic_load(&g->cancelled))
			break;
		char piece[32];
		if (strcmp(g->prompt, "stop") == 0)
			snprintf(piece, sizeof(piece), "%s", stop_words[i % 6]);
		else
			snprintf(piece, sizeof(piece), "w%d ", i);
		gw_job_token(g->job, piece, strlen(piece));
		if (g->fail && i == 1)
			break;
		usleep(g->slow ? 50000 : 1000);
	}
	if (g->fail)
		gw_job_finish(g->job, NULL, -EIO, "replica died");
	else if (atomic_load(&g->cancelled))
		gw_job_finish(g->job, NULL, -ECANCELED, "cancelled");
	else
		gw_job_finish(g->job, i == g->max ? "length" : "stop", 0, NULL);
	return NULL;
}

static int be_submit(void *ctx, struct gw_job *job, const struct gw_req *req)
{
	(void)ctx;
	if (strcmp(req->prompt, "busy") == 0)
		return -EAGAIN;
	struct gen *g = calloc(1, sizeof(*g));
	g->job = job;
	g->max = req->oai->max_tokens;
	g->slow = strcmp(req->prompt, "slow") == 0;
	g->fail = strcmp(req->prompt, "fail") == 0;
	snprintf(g->prompt, sizeof(g->prompt), "%s", req->prompt);
	gw_job_set_backend_data(job, g);
	atomic_fetch_add(&submits, 1);
	pthread_t t;
	pthread_create(&t, NULL, gen_main, g);
	pthread_detach(t);
	return 0;
}

static void be_cancel(void *ctx, struct gw_job *job)
{
	(void)ctx;
	struct gen *g = gw_job_backend_data(job);
	atomic_store(&g->cancelled, 1);
	atomic_fetch_add(&cancels, 1);
}

static void be_release(void *ctx, struct gw_job *job)
{
	(void)ctx;
	free(gw_job_backend_data(job));
}

static void be_metrics(void *ctx, struct met_out *out)
{
	(void)ctx;
	const char *lab[] = {"replica", "test", NULL};
	met_out_family(out, "kvfs_replica_load", "gauge", "A backend's own family");
	met_out_sample(out, "kvfs_replica_load", lab, 0);
}

static struct gw *gw;
static uint16_t port;

/* One HTTP/1.1 request; returns the status and the body (malloc'd). */
static int http(const char *method, const char *path, const char *body, char **out)
{
	return htu_request(port, 1, method, path, body, out);
}

static int setup(void **state)
{
	(void)state;
	struct gw_opts o = {.model_id = "test-model,alias-b", .max_body = 4096};
	struct gw_backend be = {
	    .submit = be_submit, .cancel = be_cancel, .release = be_release, .metrics = be_metrics};
	assert_int_equal(gw_start(&o, &be, &gw), 0);
	port = gw_port(gw);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	gw_stop(gw);
	return 0;
}

static cJSON *json(const char *s)
{
	cJSON *o = cJSON_Parse(s);
	if (!o)
		fail_msg("not JSON: %s", s);
	return o;
}

static void test_basic_endpoints(void **state)
{
	(void)state;
	char *b;
	assert_int_equal(http("GET", "/health", NULL, &b), 200);
	free(b);
	assert_int_equal(http("GET", "/v1/models", NULL, &b), 200);
	cJSON *o = json(b);
	assert_string_equal(
	    cJSON_GetArrayItem(cJSON_GetObjectItem(o, "data"), 0)->child->valuestring,
	    "test-model");
	cJSON_Delete(o);
	free(b);
	assert_int_equal(http("GET", "/nope", NULL, &b), 404);
	o = json(b);
	assert_non_null(cJSON_GetObjectItem(o, "error"));
	cJSON_Delete(o);
	free(b);
	assert_int_equal(http("GET", "/v1/completions", NULL, &b), 405);
	free(b);
}

/* The string member key of the JSON object o, or "" (for assertions). */
static const char *jstr(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsString(v) ? v->valuestring : "";
}

/* Models as OpenAI's clients see them: every --model-id alias is listed and retrievable; a
 * request names one (echoed in the response) or none (the first); any other name, and a
 * retrieve of one, is a 404 model_not_found; response ids are random, never cmpl-1. */
static void test_models(void **state)
{
	(void)state;
	char *b;
	assert_int_equal(http("GET", "/v1/models", NULL, &b), 200);
	cJSON *o = json(b), *d = cJSON_GetObjectItem(o, "data");
	assert_int_equal(cJSON_GetArraySize(d), 2);
	assert_string_equal(jstr(cJSON_GetArrayItem(d, 1), "id"), "alias-b");
	assert_string_equal(jstr(cJSON_GetArrayItem(d, 1), "object"), "model");
	cJSON_Delete(o);
	free(b);
	assert_int_equal(http("GET", "/v1/models/alias-b", NULL, &b), 200);
	o = json(b);
	assert_string_equal(jstr(o, "id"), "alias-b");
	assert_string_equal(jstr(o, "object"), "model");
	cJSON_Delete(o);
	free(b);
	static const char *const nf[][3] = {
	    {"GET", "/v1/models/gpt-4", NULL},
	    {"POST", "/v1/completions", "{\"model\":\"gpt-4\",\"prompt\":\"a\"}"},
	    {"POST", "/v1/chat/completions",
	     "{\"model\":\"gpt-4\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}"},
	};
	int subs = atomic_load(&submits);
	for (size_t i = 0; i < sizeof(nf) / sizeof(nf[0]); i++) {
		assert_int_equal(http(nf[i][0], nf[i][1], nf[i][2], &b), 404);
		o = json(b);
		cJSON *e = cJSON_GetObjectItem(o, "error");
		assert_string_equal(jstr(e, "code"), "model_not_found");
		assert_string_equal(jstr(e, "type"), "invalid_request_error");
		assert_string_equal(jstr(e, "param"), "model");
		assert_non_null(strstr(jstr(e, "message"), "gpt-4"));
		cJSON_Delete(o);
		free(b);
	}
	assert_int_equal(atomic_load(&submits), subs); /* nothing reached the backend */
	char ids[2][64];
	for (int i = 0; i < 2; i++) {
		const char *req = i ? "{\"model\":\"alias-b\",\"prompt\":\"a\",\"max_tokens\":1}"
				    : "{\"prompt\":\"a\",\"max_tokens\":1}";
		assert_int_equal(http("POST", "/v1/completions", req, &b), 200);
		o = json(b);
		assert_string_equal(jstr(o, "model"), i ? "alias-b" : "test-model");
		snprintf(ids[i], sizeof(ids[i]), "%s", jstr(o, "id"));
		cJSON_Delete(o);
		free(b);
		assert_int_equal(strlen(ids[i]), strlen("cmpl-") + 24);
		assert_int_equal(strspn(ids[i] + 5, "0123456789abcdef"), 24);
	}
	assert_string_not_equal(ids[0], ids[1]);
}

static void test_completion(void **state)
{
	(void)state;
	char *b;
	assert_int_equal(http("POST", "/v1/completions",
			      "{\"prompt\":\"abc\",\"max_tokens\":4,\"user\":\"t\"}", &b),
			 200);
	cJSON *o = json(b);
	cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
	assert_string_equal(cJSON_GetObjectItem(c0, "text")->valuestring, "w0 w1 w2 w3 ");
	assert_string_equal(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "length");
	cJSON *u = cJSON_GetObjectItem(o, "usage");
	assert_int_equal(cJSON_GetObjectItem(u, "completion_tokens")->valueint, 4);
	assert_int_equal(cJSON_GetObjectItem(u, "prompt_tokens")->valueint, 3);
	assert_int_equal(
	    cJSON_GetObjectItem(cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens")
		->valueint,
	    3);
	cJSON_Delete(o);
	free(b);

	/* Chat, with a stop string spanning tokens: cut before it, finish_reason stop. */
	assert_int_equal(http("POST", "/v1/chat/completions",
			      "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
			      "\"max_tokens\":10,\"stop\":\"END\"}",
			      &b),
			 200);
	o = json(b);
	c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
	/* The chat prompt is rendered, so the generator makes w-words: no stop hit. */
	assert_string_equal(
	    cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"), "content")->valuestring,
	    "w0 w1 w2 w3 w4 w5 w6 w7 w8 w9 ");
	cJSON_Delete(o);
	free(b);
	assert_int_equal(http("POST", "/v1/completions",
			      "{\"prompt\":\"stop\",\"max_tokens\":10,\"stop\":[\"END\"]}", &b),
			 200);
	o = json(b);
	c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
	assert_string_equal(cJSON_GetObjectItem(c0, "text")->valuestring, "hello world ");
	assert_string_equal(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "stop");
	cJSON_Delete(o);
	free(b);
}

/* The data of the next server-sent event in a response body at *cur (terminated in place), or
 * NULL when none is left; *cur moves past the event. */
static char *sse_next(char **cur)
{
	char *p = strstr(*cur, "data: ");
	if (!p)
		return NULL;
	p += 6;
	char *end = strstr(p, "\n\n");
	assert_non_null(end);
	*end = 0;
	*cur = end + 2;
	return p;
}

/* A chat stream starts with the assistant's role, as OpenAI's does: the official client's
 * stream helper (finalChatCompletion) throws "missing role for choice 0" without it. The role
 * comes once, then the content deltas, whose text is the non-streamed answer. */
static void test_chat_stream_role(void **state)
{
	(void)state;
	char *b;
	assert_int_equal(http("POST", "/v1/chat/completions",
			      "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
			      "\"max_tokens\":5,\"stream\":true}",
			      &b),
			 200);
	char text[256] = "";
	int events = 0, roles = 0;
	for (char *cur = b, *p; (p = sse_next(&cur));) {
		if (strcmp(p, "[DONE]") == 0)
			break;
		cJSON *o = json(p);
		cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
		cJSON *d = c0 ? cJSON_GetObjectItem(c0, "delta") : NULL;
		cJSON *role = d ? cJSON_GetObjectItem(d, "role") : NULL;
		cJSON *content = d ? cJSON_GetObjectItem(d, "content") : NULL;
		if (events == 0) {
			assert_true(cJSON_IsString(role));
			assert_string_equal(role->valuestring, "assistant");
		}
		roles += role != NULL;
		if (cJSON_IsString(content))
			strcat(text, content->valuestring);
		events++;
		cJSON_Delete(o);
	}
	assert_int_equal(roles, 1);
	assert_string_equal(text, "w0 w1 w2 w3 w4 ");
	free(b);
}

static void test_stream(void **state)
{
	(void)state;
	char *b;
	assert_int_equal(http("POST", "/v1/completions",
			      "{\"prompt\":\"stop\",\"max_tokens\":10,\"stop\":\"END\","
			      "\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
			      &b),
			 200);
	/* Reassemble the text from the events; check the order of the final events. */
	char text[256] = "";
	int events = 0, saw_finish = 0, saw_usage = 0;
	for (char *cur = b, *p; (p = sse_next(&cur));) {
		events++;
		if (strcmp(p, "[DONE]") == 0) {
			assert_null(strstr(cur, "data: "));
			break;
		}
		cJSON *o = json(p);
		cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
		if (c0) {
			strcat(text, cJSON_GetObjectItem(c0, "text")->valuestring);
			cJSON *fr = cJSON_GetObjectItem(c0, "finish_reason");
			if (cJSON_IsString(fr)) {
				assert_string_equal(fr->valuestring, "stop");
				saw_finish = 1;
			}
		}
		if (cJSON_GetObjectItem(o, "usage")) {
			assert_true(saw_finish);
			saw_usage = 1;
		}
		cJSON_Delete(o);
	}
	assert_string_equal(text, "hello world ");
	assert_true(saw_finish && saw_usage && events >= 4);
	free(b);

	/* A backend failure mid-stream ends with an error event, then [DONE]. */
	assert_int_equal(http("POST", "/v1/completions",
			      "{\"prompt\":\"fail\",\"max_tokens\":10,\"stream\":true}", &b),
			 200);
	assert_non_null(strstr(b, "\"error\""));
	assert_non_null(strstr(b, "replica died"));
	assert_non_null(strstr(b, "data: [DONE]"));
	free(b);
}

static void test_errors(void **state)
{
	(void)state;
	const char *bad[] = {"{", "{\"prompt\":1}", "[]", "{\"prompt\":\"a\",\"max_tokens\":-1}",
			     "{\"prompt\":\"a\",\"temperature\":\"hot\"}"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char *b;
		assert_int_equal(http("POST", "/v1/completions", bad[i], &b), 400);
		cJSON *o = json(b);
		cJSON *e = cJSON_GetObjectItem(o, "error");
		assert_non_null(e);
		assert_string_equal(cJSON_GetObjectItem(e, "type")->valuestring,
				    "invalid_request_error");
		cJSON_Delete(o);
		free(b);
	}
	/* A parameter OpenAI defines and the server does not do: a 400 naming it, not ignored. */
	char *tb;
	assert_int_equal(http("POST", "/v1/chat/completions",
			      "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
			      "\"response_format\":{\"type\":\"json_object\"}}",
			      &tb),
			 400);
	cJSON *to = json(tb);
	cJSON *te = cJSON_GetObjectItem(to, "error");
	assert_string_equal(jstr(te, "param"), "response_format");
	assert_non_null(strstr(jstr(te, "message"), "'response_format' is not supported"));
	cJSON_Delete(to);
	free(tb);
	/* Oversize body (the test gateway allows 4096 bytes). */
	char *big = malloc(10000);
	memset(big, ' ', 9999);
	big[9999] = 0;
	memcpy(big, "{\"prompt\":\"", 11);
	char *b;
	assert_int_equal(http("POST", "/v1/completions", big, &b), 400);
	assert_non_null(strstr(b, "request_too_large"));
	free(b);
	free(big);
	assert_int_equal(http("POST", "/v1/completions", "{\"prompt\":\"busy\"}", &b), 503);
	free(b);
	/* Refused by the backend after the submit, before any token: a client error, also for
	 * a stream (no 200 and error event). */
	for (int stream = 0; stream < 2; stream++) {
		assert_int_equal(http("POST", "/v1/completions",
				      stream ? "{\"prompt\":\"toolong\",\"stream\":true}"
					     : "{\"prompt\":\"toolong\"}",
				      &b),
				 400);
		assert_non_null(strstr(b, "context_length_exceeded"));
		free(b);
	}
	/* Still alive. */
	assert_int_equal(http("GET", "/health", NULL, &b), 200);
	free(b);
}

/* The value of the sample `name` (with its labels) in /metrics, or -1. */
static double metric(const char *name)
{
	char *b = NULL;
	double v = -1;
	if (http("GET", "/metrics", NULL, &b) == 200) {
		size_t n = strlen(name);
		for (char *p = b; (p = strstr(p, name)); p += n)
			if ((p == b || p[-1] == '\n') && p[n] == ' ')
				v = strtod(p + n + 1, NULL);
	}
	free(b);
	return v;
}

static void test_disconnect_cancels(void **state)
{
	(void)state;
	int before = atomic_load(&cancels);
	double ok0 = metric("kvfs_requests_total{outcome=\"ok\"}");
	double serr0 = metric("kvfs_requests_total{outcome=\"server_error\"}");
	double canc0 = metric("kvfs_requests_total{outcome=\"cancelled\"}");
	for (int stream = 0; stream < 2; stream++) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
		inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
		assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
		char req[512];
		const char *body = stream
				       ? "{\"prompt\":\"slow\",\"max_tokens\":100,\"stream\":true}"
				       : "{\"prompt\":\"slow\",\"max_tokens\":100}";
		int n = snprintf(req, sizeof(req),
				 "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
				 "%zu\r\n\r\n%s",
				 strlen(body), body);
		assert_int_equal(write(fd, req, (size_t)n), n);
		usleep(200000);
		close(fd);
	}
	for (int i = 0; i < 100 && atomic_load(&cancels) < before + 2; i++)
		usleep(20000);
	assert_int_equal(atomic_load(&cancels), before + 2);
	/* Counted once each, as cancelled (they were also counted ok or server errors). */
	for (int i = 0; i < 100 && metric("kvfs_requests_running") != 0; i++)
		usleep(20000);
	assert_true(metric("kvfs_requests_total{outcome=\"cancelled\"}") == canc0 + 2);
	assert_true(metric("kvfs_requests_total{outcome=\"ok\"}") == ok0);
	assert_true(metric("kvfs_requests_total{outcome=\"server_error\"}") == serr0);
}

static void *client(void *arg)
{
	char *b;
	int st = http("POST", "/v1/completions", "{\"prompt\":\"p\",\"max_tokens\":8}", &b);
	*(int *)arg = st == 200 && strstr(b, "w7 ") != NULL;
	free(b);
	return NULL;
}

static void test_concurrent_and_metrics(void **state)
{
	(void)state;
	pthread_t t[20];
	int ok[20];
	for (int i = 0; i < 20; i++)
		pthread_create(&t[i], NULL, client, &ok[i]);
	for (int i = 0; i < 20; i++) {
		pthread_join(t[i], NULL);
		assert_true(ok[i]);
	}
	char *b;
	assert_int_equal(http("GET", "/metrics", NULL, &b), 200);
	struct prom_doc d;
	if (prom_parse(b, &d))
		fail_msg("/metrics: %s", d.err);
	double v;
	assert_int_equal(prom_get(&d, "kvfs_requests_total", "outcome=\"ok\"", &v), 0);
	assert_true(v >= 20);
	assert_int_equal(prom_get(&d, "time_to_first_token_seconds_count", "", &v), 0);
	assert_true(v >= 20);
	assert_true(d.n > 20);
	prom_free(&d);
	free(b);
}

/* /metrics is well-formed exposition text: every family (the gateway's and the backend's)
 * has one # HELP and one # TYPE before its samples, which form one block (prom_parse is
 * strict about that); promtool, when installed, agrees. */
static void test_metrics_well_formed(void **state)
{
	(void)state;
	static const char *const fams[] = {
	    "kvfs_requests_total",     "kvfs_requests_running",	      "prompt_tokens_total",
	    "generation_tokens_total", "cached_tokens_total",	      "prefix_cache_queries_total",
	    "prefix_cache_hits_total", "time_to_first_token_seconds", "inter_token_latency_seconds",
	    "kvfs_replica_load"};
	char *b, why[2048];
	assert_int_equal(http("GET", "/metrics", NULL, &b), 200);
	int ran;
	if (prom_check_page(b, fams, (int)(sizeof(fams) / sizeof(fams[0])), &ran, why, sizeof(why)))
		fail_msg("/metrics: %s\n%s", why, b);
	if (!ran)
		print_message("promtool not installed: skipping `promtool check metrics`\n");
	struct prom_doc d;
	assert_int_equal(prom_parse(b, &d), 0);
	double v;
	assert_int_equal(prom_get(&d, "kvfs_replica_load", "replica=\"test\"", &v), 0);
	assert_int_equal(prom_get(&d, "prefix_cache_hits_total", "", &v), 0);
	assert_null(strstr(b, "vllm:"));
	prom_free(&d);
	free(b);
}

/* vLLM's names for the same quantities, on /metrics/vllm (promtool lints the ':' vLLM's names
 * carry, so they are kept off /metrics): same meaning, same buckets as vLLM's. */
static void test_metrics_vllm(void **state)
{
	(void)state;
	static const char *const fams[] = {
	    "vllm:prompt_tokens_total",		"vllm:generation_tokens_total",
	    "vllm:prefix_cache_queries_total",	"vllm:prefix_cache_hits_total",
	    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"};
	char *b;
	assert_int_equal(http("GET", "/metrics/vllm", NULL, &b), 200);
	struct prom_doc d;
	if (prom_parse(b, &d))
		fail_msg("/metrics/vllm: %s\n%s", d.err, b);
	for (size_t i = 0; i < sizeof(fams) / sizeof(fams[0]); i++)
		if (prom_family_once(b, fams[i]))
			fail_msg("%s: not one HELP and one TYPE\n%s", fams[i], b);
	double hits, q, tq, th, v;
	assert_int_equal(prom_get(&d, "vllm:prefix_cache_hits_total", "", &hits), 0);
	assert_int_equal(prom_get(&d, "vllm:prefix_cache_queries_total", "", &q), 0);
	assert_true(hits > 0 && q > 0);
	/* vLLM's first and last TTFT buckets, and its ITL's */
	assert_int_equal(
	    prom_get(&d, "vllm:time_to_first_token_seconds_bucket", "le=\"0.001\"", &v), 0);
	assert_int_equal(prom_get(&d, "vllm:time_to_first_token_seconds_bucket", "le=\"2560\"", &v),
			 0);
	assert_int_equal(
	    prom_get(&d, "vllm:inter_token_latency_seconds_bucket", "le=\"0.075\"", &v), 0);
	assert_null(strstr(b, "kvfs_requests_total"));
	prom_free(&d);
	free(b);
	/* the same counts as the plain page's */
	assert_int_equal(http("GET", "/metrics", NULL, &b), 200);
	assert_int_equal(prom_parse(b, &d), 0);
	assert_int_equal(prom_get(&d, "prefix_cache_hits_total", "", &th), 0);
	assert_int_equal(prom_get(&d, "prefix_cache_queries_total", "", &tq), 0);
	assert_true(th >= hits && tq >= q);
	prom_free(&d);
	free(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_basic_endpoints),
	    cmocka_unit_test(test_models),
	    cmocka_unit_test(test_completion),
	    cmocka_unit_test(test_stream),
	    cmocka_unit_test(test_chat_stream_role),
	    cmocka_unit_test(test_errors),
	    cmocka_unit_test(test_disconnect_cancels),
	    cmocka_unit_test(test_concurrent_and_metrics),
	    cmocka_unit_test(test_metrics_well_formed),
	    cmocka_unit_test(test_metrics_vllm),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
