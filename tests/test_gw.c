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

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/wait.h>

#include "gw.h"
#include "gw_auth.h"
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
	/* A member named twice is a 400 naming it, not first-wins (a proxy may read the last). */
	{
		char *b;
		assert_int_equal(http("POST", "/v1/completions",
				      "{\"prompt\":\"a\",\"max_tokens\":1,\"max_tokens\":4000}",
				      &b),
				 400);
		cJSON *o = json(b), *e = cJSON_GetObjectItem(o, "error");
		assert_string_equal(cJSON_GetObjectItem(e, "param")->valuestring, "max_tokens");
		assert_non_null(
		    strstr(cJSON_GetObjectItem(e, "message")->valuestring, "max_tokens"));
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

/* Value of one sample in port's /metrics, or -1. */
static double metric_at(uint16_t p, const char *name)
{
	char *b;
	double v = -1;
	if (htu_request(p, 1, "GET", "/metrics", NULL, &b) == 200) {
		size_t nl = strlen(name);
		for (char *q = b; q && *q; q = strchr(q, '\n'), q = q ? q + 1 : NULL)
			if (!strncmp(q, name, nl) && q[nl] == ' ') {
				v = strtod(q + nl + 1, NULL);
				break;
			}
	}
	free(b);
	return v;
}

/* A TCP connection to 127.0.0.1:port from source address src, or -1. */
static int connect_from(const char *src, uint16_t p)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in s = {.sin_family = AF_INET},
			   d = {.sin_family = AF_INET, .sin_port = htons(p)};
	inet_pton(AF_INET, src, &s.sin_addr);
	inet_pton(AF_INET, "127.0.0.1", &d.sin_addr);
	if (fd < 0 || bind(fd, (struct sockaddr *)&s, sizeof(s)) ||
	    connect(fd, (struct sockaddr *)&d, sizeof(d))) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

/* 512 idle connections from one address (127.0.0.2) do not keep /health or a real client
 * (127.0.0.1) out: that address gets 64, the rest are closed at accept and counted. With one
 * limit of 512 for everyone (before), /health got no answer until the idle ones timed out. */
static void test_idle_flood(void **state)
{
	(void)state;
	enum { N = 512 };
	static int fds[N];
	double refused0 = metric_at(port, "kvfs_gateway_connections_refused_total{reason="
					  "\"per_address\"}");
	for (int i = 0; i < N; i++)
		assert_true((fds[i] = connect_from("127.0.0.2", port)) >= 0);
	char *b;
	assert_int_equal(http("GET", "/health", NULL, &b), 200);
	free(b);
	assert_int_equal(
	    http("POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2}", &b), 200);
	free(b);
	/* MHD accepts them in order: by now all were accepted or refused */
	double refused = 0;
	for (int i = 0; i < 100; i++) {
		refused = metric_at(port, "kvfs_gateway_connections_refused_total{reason="
					  "\"per_address\"}");
		if (refused - refused0 >= N - 64)
			break;
		usleep(20000);
	}
	assert_true(refused - refused0 == N - 64);
	assert_true(metric_at(port, "kvfs_gateway_connections_open") >= 64);
	for (int i = 0; i < N; i++)
		close(fds[i]);
	/* and they are given back when the address leaves */
	double open = 0;
	for (int i = 0; i < 200; i++) {
		open = metric_at(port, "kvfs_gateway_connections_open");
		if (open <= 2) /* the scrape's own connection, and one closing */
			break;
		usleep(20000);
	}
	assert_true(open <= 2);
}

/* HTTPS: a self-signed certificate made with openssl; /health and a completion over TLS,
 * a plain-HTTP request to the TLS port gets no HTTP answer; a key that is not PEM is refused. */
static void test_tls(void **state)
{
	(void)state;
	char dir[] = "/tmp/test_gw_tls.XXXXXX", cmd[1024], cert[64], key[64];
	assert_non_null(mkdtemp(dir));
	snprintf(cert, sizeof(cert), "%s/cert.pem", dir);
	snprintf(key, sizeof(key), "%s/key.pem", dir);
	snprintf(cmd, sizeof(cmd),
		 "openssl req -x509 -newkey rsa:2048 -nodes -keyout %s -out %s -days 1 "
		 "-subj /CN=127.0.0.1 >/dev/null 2>&1",
		 key, cert);
	if (system(cmd) != 0) {
		fprintf(stderr, "openssl cannot make a certificate here: test_tls skipped\n");
		skip();
	}
	struct gw_opts o = {
	    .model_id = "tls-model", .max_body = 4096, .tls_cert = cert, .tls_key = key};
	struct gw_backend be = {.submit = be_submit, .cancel = be_cancel, .release = be_release};
	struct gw *tg = NULL;
	assert_int_equal(gw_start(&o, &be, &tg), 0);
	uint16_t tp = gw_port(tg);

	SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
	assert_non_null(ctx);
	assert_int_equal(SSL_CTX_load_verify_locations(ctx, cert, NULL), 1);
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
	static const char *const reqs[] = {
	    "GET /health HTTP/1.0\r\nHost: x\r\n\r\n",
	    "POST /v1/completions HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\n"
	    "Content-Length: 30\r\n\r\n{\"prompt\":\"hi\",\"max_tokens\":3}"};
	for (int i = 0; i < 2; i++) {
		int fd = htu_connect(tp);
		assert_true(fd >= 0);
		SSL *ssl = SSL_new(ctx);
		SSL_set_fd(ssl, fd);
		assert_int_equal(SSL_connect(ssl), 1); /* the certificate verifies */
		assert_int_equal(SSL_write(ssl, reqs[i], (int)strlen(reqs[i])),
				 (int)strlen(reqs[i]));
		char buf[8192];
		int len = 0, r;
		while ((r = SSL_read(ssl, buf + len, (int)sizeof(buf) - 1 - len)) > 0)
			len += r;
		buf[len] = 0;
		assert_non_null(strstr(buf, "HTTP/1.0 200") ? strstr(buf, "HTTP/1.0 200")
							    : strstr(buf, "HTTP/1.1 200"));
		if (i == 1)
			assert_non_null(strstr(buf, "w0 w1 w2"));
		SSL_free(ssl);
		close(fd);
	}
	SSL_CTX_free(ctx);
	char *b;
	assert_true(htu_request(tp, 1, "GET", "/health", NULL, &b) != 200);
	free(b);
	gw_stop(tg);

	FILE *f = fopen(key, "w");
	fputs("not a key\n", f);
	fclose(f);
	tg = NULL;
	assert_int_equal(gw_start(&o, &be, &tg), -EINVAL);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

/* gw_auth without HTTP: the key file's format and its errors, checks of Authorization values,
 * reload keeping the old keys on a bad file, and the salt against `openssl dgst -hmac`. */
static void test_auth_keys(void **state)
{
	(void)state;
	struct gw_keyset *ks;
	char err[160];
	static const struct {
		const char *text;
		int ok, n;
	} files[] = {
	    {"", 1, 0},
	    {"# only a comment\n\n   \n", 1, 0},
	    {"key-aaaaaaaaaaaaaaaa alice\nkey-bbbbbbbbbbbbbbbb bob\n", 1, 2},
	    {"  key-aaaaaaaaaaaaaaaa\talice  \r\nkey-cccccccccccccccc alice", 1, 2},
	    {"short alice\n", 0, 0},					/* key too short */
	    {"key-aaaaaaaaaaaaaaaa\n", 0, 0},				/* no tenant */
	    {"key-aaaaaaaaaaaaaaaa ali ce\n", 0, 0},			/* two words */
	    {"key-aaaaaaaaaaaaaaaa al/ice\n", 0, 0},			/* bad tenant character */
	    {"key-aaaa\"aaaaaaaaaaaa alice\n", 0, 0},			/* bad key character */
	    {"key-aaaaaaaaaaaaaaaa a\nkey-aaaaaaaaaaaaaaaa b\n", 0, 0}, /* key twice */
	};
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		int rc =
		    gw_keyset_parse(files[i].text, strlen(files[i].text), &ks, err, sizeof(err));
		if (!files[i].ok) {
			assert_int_equal(rc, -EINVAL);
			assert_non_null(strstr(err, "line "));
			continue;
		}
		assert_int_equal(rc, 0);
		assert_int_equal(gw_keyset_count(ks), files[i].n);
		gw_keyset_free(ks);
	}
	char dir[] = "/tmp/test_gw_auth.XXXXXX", keys[64], sec[64];
	assert_non_null(mkdtemp(dir));
	snprintf(keys, sizeof(keys), "%s/keys", dir);
	snprintf(sec, sizeof(sec), "%s/secret", dir);
	FILE *f = fopen(keys, "w");
	fputs("key-aaaaaaaaaaaaaaaa alice\nkey-bbbbbbbbbbbbbbbb bob\n", f);
	fclose(f);
	f = fopen(sec, "w");
	fputs("unit-tenant-secret-0123\n", f);
	fclose(f);
	struct gw_auth *a;
	struct gw_auth_opts o = {.keys_path = keys, .secret_path = sec};
	assert_int_equal(gw_auth_create(&o, &a), 0);
	char t[GW_TENANT_MAX + 1];
	assert_int_equal(gw_auth_check(a, "Bearer key-aaaaaaaaaaaaaaaa", t), 0);
	assert_string_equal(t, "alice");
	assert_int_equal(gw_auth_check(a, "bearer   key-bbbbbbbbbbbbbbbb ", t), 0);
	assert_string_equal(t, "bob");
	assert_int_equal(gw_auth_check(a, NULL, t), -EACCES);
	assert_int_equal(gw_auth_check(a, "Bearer", t), -EACCES);
	assert_int_equal(gw_auth_check(a, "Basic key-aaaaaaaaaaaaaaaa", t), -EACCES);
	assert_int_equal(gw_auth_check(a, "Bearer key-aaaaaaaaaaaaaaab", t), -EACCES);
	assert_int_equal(gw_auth_check(a, "Bearer key-aaaaaaaaaaaaaaaa2", t), -EACCES);
	/* salt = hex(HMAC-SHA256(secret, tenant [|| 0 || cache_salt])), as openssl computes it */
	char buf[GW_SALT_HEX];
	const char *salt;
	assert_int_equal(gw_auth_salt(a, "alice", NULL, buf, &salt), 0);
	assert_string_equal(salt,
			    "7ab8a81e6d4d00c0cbe7870b09e1ef56805fe6a85a98043389609123c7e417a3");
	assert_int_equal(gw_auth_salt(a, "alice", "x", buf, &salt), 0);
	assert_string_equal(salt,
			    "a9591a60a77b4ef28f381d775cadba5f65d357b7485c51504fb0524134c71189");
	/* reload: a bad file keeps the keys in force, a good one replaces them */
	f = fopen(keys, "w");
	fputs("key-cccccccccccccccc carol\nbroken\n", f);
	fclose(f);
	assert_int_equal(gw_auth_reload(a), -EINVAL);
	assert_int_equal(gw_auth_check(a, "Bearer key-aaaaaaaaaaaaaaaa", t), 0);
	f = fopen(keys, "w");
	fputs("key-cccccccccccccccc carol\n", f);
	fclose(f);
	assert_int_equal(gw_auth_reload(a), 0);
	assert_int_equal(gw_auth_check(a, "Bearer key-aaaaaaaaaaaaaaaa", t), -EACCES);
	assert_int_equal(gw_auth_check(a, "Bearer key-cccccccccccccccc", t), 0);
	assert_string_equal(t, "carol");
	gw_auth_destroy(a);
	/* keys need a secret; open excludes keys; a short secret is refused */
	struct gw_auth_opts nosec = {.keys_path = keys}, both = {.keys_path = keys, .open = 1};
	assert_int_equal(gw_auth_create(&nosec, &a), -EINVAL);
	assert_int_equal(gw_auth_create(&both, &a), -EINVAL);
	f = fopen(sec, "w");
	fputs("short\n", f);
	fclose(f);
	assert_int_equal(gw_auth_create(&o, &a), -EINVAL);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
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
	    cmocka_unit_test(test_idle_flood),
	    cmocka_unit_test(test_tls),
	    cmocka_unit_test(test_auth_keys),
	    cmocka_unit_test(test_metrics_vllm),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
