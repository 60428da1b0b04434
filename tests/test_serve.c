/* Tests for `kvinfer serve` (engine/serve/sch.c behind the gateway), end to end: the real
 * kvinfer binary on a synthetic model, a temporary --kv-dir, raw HTTP over loopback.
 * Non-streaming and streaming give the same greedy text; a repeated prompt reports
 * cached_tokens (0 the first time, > 0 the second) with identical output; 20 concurrent
 * clients; malformed bodies are 400s with error JSON and the server keeps serving; a client
 * that disconnects mid-stream has its KV blocks freed (the kv_blocks_used gauge).
 * Disaggregated (kvinfer gateway + 2 prefill + 2 decode workers): the same greedy output as
 * embedded, cached_tokens on a repeat, 20 clients, and a decode worker killed mid-stream: its
 * request ends with an error event, new requests go to the survivor. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "lbp.h"

#include "http_tutil.h"
#include "prom_parse.h"

static char tmpdir[256];
static pid_t server = -1;
static uint16_t port;
static char embedded_text[4096]; /* greedy output of long_prompt, 12 tokens, embedded mode */
/* disaggregated mode: 2 prefill, 2 decode workers and a gateway */
static pid_t workers[4]; /* prefill 0, 1, decode 0, 1 */
static uint16_t wports[4];
static pid_t gateway = -1;
static pid_t gateway_cache = -1; /* test_disagg_cache_policy's, --policy cache */

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

static int connect_port(void)
{
	return htu_connect(port);
}

/* API keys (the key file setup_keys writes): every request is tenant alice's unless a test
 * picks another key. */
#define KEY_ALICE "alice-key-0123456789abcdef"
#define KEY_BOB	  "bob-key-0123456789abcdef"
#define KEY_CAROL "carol-key-0123456789abcdef" /* added by test_key_reload */
static const char *cur_key = KEY_ALICE;
static char keyfile[300], tsecret[300];

/* The Authorization header of cur_key ("" when NULL). */
static const char *auth_hdr(void)
{
	static __thread char h[128];
	if (!cur_key)
		return "";
	snprintf(h, sizeof(h), "Authorization: Bearer %s\r\n", cur_key);
	return h;
}

static int send_req(int fd, const char *method, const char *path, const char *body)
{
	return htu_send_h(fd, 0, method, path, auth_hdr(), body);
}

/* One HTTP/1.0 request (no chunked encoding: the body ends at EOF); returns the status and
 * the body (malloc'd), -1 when the server cannot be reached. */
static int http(const char *method, const char *path, const char *body, char **out)
{
	return htu_request_h(port, 0, method, path, auth_hdr(), body, out);
}

static cJSON *json(const char *s)
{
	cJSON *o = cJSON_Parse(s);
	if (!o)
		fail_msg("not JSON: %s", s);
	return o;
}

/* Value of a metric line "name value" in /metrics, or -1. A page that is not well-formed
 * exposition text (prom_parse.h) fails the test. */
static double metric(const char *name)
{
	char *b;
	if (http("GET", "/metrics", NULL, &b) != 200) {
		free(b);
		return -1;
	}
	struct prom_doc d;
	if (prom_parse(b, &d))
		fail_msg("/metrics: %s", d.err);
	prom_free(&d);
	double v = -1;
	size_t nl = strlen(name);
	for (char *p = b; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		if (!strncmp(p, name, nl) && p[nl] == ' ') {
			v = strtod(p + nl + 1, NULL);
			break;
		}
	free(b);
	return v;
}

static int run_cmd(char *const argv[])
{
	pid_t p = fork();
	if (p == 0) {
		execv(argv[0], argv);
		_exit(127);
	}
	int st = 0;
	waitpid(p, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	if (!f)
		return -1;
	fputs(text, f);
	return fclose(f);
}

/* The key file (alice, bob) and the tenant secret, in tmpdir. */
static int setup_keys(void)
{
	snprintf(keyfile, sizeof(keyfile), "%s/keys", tmpdir);
	snprintf(tsecret, sizeof(tsecret), "%s/tenant-secret", tmpdir);
	return write_file(keyfile, "# test keys\n" KEY_ALICE " alice\n\n" KEY_BOB " bob\n") ||
	       write_file(tsecret, "tenant-secret-for-test-serve-0123\n");
}

static int setup(void **state)
{
	(void)state;
	const char *bd = getenv("KVFS_BUILD_DIR");
	char synth[512], bin[512], model[512], kvdir[512], portf[512], logf[512];
	snprintf(synth, sizeof(synth), "%s/tools/kvinfer-synth", bd ? bd : "build");
	snprintf(bin, sizeof(bin), "%s/bin/kvinfer", bd ? bd : "build");
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_serve.XXXXXX");
	if (!mkdtemp(tmpdir))
		return -1;
	snprintf(model, sizeof(model), "%s/small.gguf", tmpdir);
	snprintf(kvdir, sizeof(kvdir), "%s/kv", tmpdir);
	snprintf(portf, sizeof(portf), "%s/port", tmpdir);
	snprintf(logf, sizeof(logf), "%s/log", tmpdir);
	mkdir(kvdir, 0755);
	if (setup_keys())
		return -1;
	char *sargv[] = {synth, "--preset", "small", "-o", model, NULL};
	if (run_cmd(sargv)) {
		fprintf(stderr, "cannot run %s\n", synth);
		return -1;
	}
	server = fork();
	if (server == 0) {
		freopen(logf, "w", stderr);
		execl(bin, bin, "serve", "-m", model, "--kv-dir", kvdir, "--port", "0",
		      "--port-file", portf, "-t", "1", "--block-tokens", "16", "--ignore-eos",
		      "--max-seqs", "24", "--ctx", "4096", "--api-keys", keyfile,
		      "--tenant-secret-file", tsecret, (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 200 && !port; i++) {
		sleep_ms(50);
		FILE *f = fopen(portf, "r");
		unsigned p = 0;
		if (f && fscanf(f, "%u", &p) == 1)
			port = (uint16_t)p;
		if (f)
			fclose(f);
	}
	return port ? 0 : -1;
}

/* Stops the embedded server; the temp dir (model) stays for the disaggregated group. */
static int teardown(void **state)
{
	(void)state;
	if (server > 0) {
		kill(server, SIGTERM);
		int st = 0;
		waitpid(server, &st, 0);
		server = -1;
	}
	return 0;
}

static int remove_tmpdir(void)
{
	if (getenv("KVFS_TEST_KEEP")) { /* debugging: keep the workers' logs */
		fprintf(stderr, "kept %s\n", tmpdir);
		return 0;
	}
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	return system(cmd) == 0 ? 0 : -1;
}

/* A prompt of about 100 tokens: several 16-token blocks. */
static const char *long_prompt =
    "You are a helpful assistant. Answer every question about the weather, the trains and the "
    "opening hours of the city library briefly and politely, in plain words, without lists. "
    "Question: when does the library open on Sunday?";

static char *completion(const char *prompt, int max_tokens, int stream, int *cached, int *ntok)
{
	char body[2048], *b;
	snprintf(body, sizeof(body),
		 "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0,\"stream\":%s%s}", prompt,
		 max_tokens, stream ? "true" : "false",
		 stream ? ",\"stream_options\":{\"include_usage\":true}" : "");
	int st = http("POST", "/v1/completions", body, &b);
	if (st != 200)
		fail_msg("status %d: %s", st, b ? b : "");
	size_t cap = 1 << 16;
	char *text = calloc(1, cap);
	cJSON *usage = NULL, *o = NULL;
	if (!stream) {
		o = json(b);
		cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
		snprintf(text, cap, "%s", cJSON_GetObjectItem(c0, "text")->valuestring);
		usage = cJSON_GetObjectItem(o, "usage");
	} else {
		int done = 0;
		for (char *p = b; (p = strstr(p, "data: "));) {
			p += 6;
			char *end = strstr(p, "\n\n");
			assert_non_null(end);
			*end = 0;
			if (!strcmp(p, "[DONE]")) {
				done = 1;
				break;
			}
			cJSON *e = json(p);
			assert_null(cJSON_GetObjectItem(e, "error"));
			cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(e, "choices"), 0);
			if (c0)
				strncat(text, cJSON_GetObjectItem(c0, "text")->valuestring,
					cap - strlen(text) - 1);
			if (cJSON_GetObjectItem(e, "usage")) {
				cJSON_Delete(o);
				o = e;
				usage = cJSON_GetObjectItem(e, "usage");
			} else {
				cJSON_Delete(e);
			}
			p = end + 2;
		}
		assert_true(done);
	}
	assert_non_null(usage);
	cJSON *d = cJSON_GetObjectItem(usage, "prompt_tokens_details");
	*cached = cJSON_GetObjectItem(d, "cached_tokens")->valueint;
	*ntok = cJSON_GetObjectItem(usage, "completion_tokens")->valueint;
	assert_true(cJSON_GetObjectItem(usage, "prompt_tokens")->valueint > 0);
	cJSON_Delete(o);
	free(b);
	return text;
}

static void test_cached_and_stream(void **state)
{
	(void)state;
	int c1, c2, c3, n1, n2, n3;
	char *a = completion(long_prompt, 12, 0, &c1, &n1);
	assert_int_equal(c1, 0); /* a fresh cache dir */
	assert_int_equal(n1, 12);
	/* the prompt's blocks are saved in the background: wait until they are published */
	for (int i = 0; i < 100 && metric("kvx_saved_blocks_total") < 1; i++)
		sleep_ms(20);
	char *b = completion(long_prompt, 12, 0, &c2, &n2);
	assert_true(c2 >= 16 && c2 % 16 == 0);
	assert_string_equal(a, b); /* the cached prefix changes nothing */
	snprintf(embedded_text, sizeof(embedded_text), "%s", a);
	char *c = completion(long_prompt, 12, 1, &c3, &n3);
	assert_int_equal(n3, 12);
	assert_string_equal(a, c); /* streamed = not streamed */
	assert_true(c3 >= 16);
	assert_true(metric("prefix_cache_hits_total") >= c2 + c3);
	free(a);
	free(b);
	free(c);
}

static void test_chat(void **state)
{
	(void)state;
	char *b;
	assert_int_equal(http("POST", "/v1/chat/completions",
			      "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
			      "{\"role\":\"user\",\"content\":\"Hello there\"}],"
			      "\"max_tokens\":5,\"temperature\":0}",
			      &b),
			 200);
	cJSON *o = json(b);
	cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
	cJSON *m = cJSON_GetObjectItem(c0, "message");
	assert_true(cJSON_IsString(cJSON_GetObjectItem(m, "content")));
	cJSON *u = cJSON_GetObjectItem(o, "usage");
	assert_int_equal(cJSON_GetObjectItem(u, "completion_tokens")->valueint, 5);
	assert_non_null(
	    cJSON_GetObjectItem(cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens"));
	cJSON_Delete(o);
	free(b);
	assert_int_equal(http("GET", "/v1/models", NULL, &b), 200);
	assert_non_null(strstr(b, "\"kvinfer\""));
	free(b);
}

struct cl {
	int id, ok;
	char text[4096];
};

static void *client(void *arg)
{
	struct cl *c = arg;
	char body[256], *b = NULL;
	snprintf(body, sizeof(body),
		 "{\"prompt\":\"client %d asks a question\",\"max_tokens\":16,\"temperature\":0}",
		 c->id % 4);
	if (http("POST", "/v1/completions", body, &b) == 200) {
		cJSON *o = cJSON_Parse(b);
		cJSON *u = cJSON_GetObjectItem(o, "usage");
		cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
		if (u && c0 && cJSON_GetObjectItem(u, "completion_tokens")->valueint == 16) {
			snprintf(c->text, sizeof(c->text), "%s",
				 cJSON_GetObjectItem(c0, "text")->valuestring);
			c->ok = 1;
		}
		cJSON_Delete(o);
	}
	free(b);
	return NULL;
}

static void test_concurrent(void **state)
{
	(void)state;
	struct cl cs[20];
	pthread_t th[20];
	for (int i = 0; i < 20; i++) {
		memset(&cs[i], 0, sizeof(cs[i]));
		cs[i].id = i;
		pthread_create(&th[i], NULL, client, &cs[i]);
	}
	for (int i = 0; i < 20; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < 20; i++) {
		assert_true(cs[i].ok);
		/* batch invariance: the same prompt gives the same greedy text in any batch */
		assert_string_equal(cs[i].text, cs[i % 4].text);
	}
}

static void test_errors_keep_serving(void **state)
{
	(void)state;
	const char *bad[] = {"{", "{\"prompt\":1}", "[]", "{\"prompt\":\"a\",\"max_tokens\":-1}",
			     "{\"prompt\":\"a\",\"temperature\":\"hot\"}"};
	char *b;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(http("POST", "/v1/completions", bad[i], &b), 400);
		cJSON *o = json(b);
		assert_non_null(cJSON_GetObjectItem(o, "error"));
		cJSON_Delete(o);
		free(b);
	}
	size_t big = 2u << 20; /* past the 1 MiB body limit */
	char *huge = malloc(big + 32);
	memset(huge, 'a', big + 31);
	memcpy(huge, "{\"prompt\":\"", 11);
	strcpy(huge + big, "\"}");
	assert_int_equal(http("POST", "/v1/completions", huge, &b), 400);
	free(huge);
	cJSON *o = json(b);
	assert_non_null(cJSON_GetObjectItem(o, "error"));
	cJSON_Delete(o);
	free(b);
	/* longer than the context (4096 tokens): refused, not crashed */
	assert_int_equal(http("POST", "/v1/completions",
			      "{\"prompt\":\"hi\",\"max_tokens\":4095,\"temperature\":0}", &b),
			 400);
	free(b);
	assert_int_equal(http("GET", "/health", NULL, &b), 200);
	free(b);
	int c, n;
	char *t = completion("still alive?", 4, 0, &c, &n);
	assert_int_equal(n, 4);
	free(t);
}

static void test_disconnect_frees_kv(void **state)
{
	(void)state;
	/* idle: no block is held (the gauge is published when the scheduler goes idle) */
	for (int i = 0; i < 100 && metric("kv_blocks_used") != 0; i++)
		sleep_ms(20);
	assert_true(metric("kv_blocks_used") == 0);
	int fd = connect_port();
	assert_true(fd >= 0);
	assert_int_equal(send_req(fd, "POST", "/v1/completions",
				  "{\"prompt\":\"a long story\",\"max_tokens\":3000,"
				  "\"temperature\":0,\"stream\":true}"),
			 0);
	char buf[4096];
	size_t got = 0;
	while (got < 2000) { /* several events: it is decoding */
		ssize_t r = read(fd, buf, sizeof(buf));
		assert_true(r > 0);
		got += (size_t)r;
	}
	assert_true(metric("kv_blocks_used") > 0);
	assert_true(metric("num_requests_running") == 1);
	close(fd);
	double used = -1;
	for (int i = 0; i < 200; i++) {
		used = metric("kv_blocks_used");
		if (used == 0 && metric("num_requests_running") == 0)
			break;
		sleep_ms(20);
	}
	assert_true(used == 0);
	assert_true(metric("kvfs_requests_total{outcome=\"cancelled\"}") >= 1);
}

static uint16_t wait_port(const char *path)
{
	for (int i = 0; i < 300; i++) {
		FILE *f = fopen(path, "r");
		unsigned p = 0;
		int ok = f && fscanf(f, "%u", &p) == 1;
		if (f)
			fclose(f);
		if (ok && p)
			return (uint16_t)p;
		sleep_ms(50);
	}
	return 0;
}

static int setup_disagg(void **state)
{
	(void)state;
	port = 0;
	const char *bd = getenv("KVFS_BUILD_DIR");
	char bin[512], model[512], kvdir[512], secret[512], pf[600], logf[600];
	snprintf(bin, sizeof(bin), "%s/bin/kvinfer", bd ? bd : "build");
	snprintf(model, sizeof(model), "%s/small.gguf", tmpdir);
	snprintf(kvdir, sizeof(kvdir), "%s/kv-disagg", tmpdir);
	snprintf(secret, sizeof(secret), "%s/secret", tmpdir);
	mkdir(kvdir, 0755);
	FILE *f = fopen(secret, "w");
	if (!f)
		return -1;
	fputs("test-serve-secret-0123456789abcdef\n", f);
	fclose(f);
	for (int i = 0; i < 4; i++) {
		snprintf(pf, sizeof(pf), "%s/wport%d", tmpdir, i);
		snprintf(logf, sizeof(logf), "%s/wlog%d", tmpdir, i);
		workers[i] = fork();
		if (workers[i] == 0) {
			if (!freopen(logf, "w", stderr))
				_exit(126);
			char maf[600];
			snprintf(maf, sizeof(maf), "%s/wmaddr%d", tmpdir, i);
			execl(bin, bin, i < 2 ? "prefill" : "decode", "-m", model, "--kv-dir",
			      kvdir, "--secret-file", secret, "--port-file", pf, "-t", "1",
			      "--block-tokens", "16", "--ignore-eos", "--ctx", "4096",
			      "--metrics-listen", "127.0.0.1:0", "--metrics-addr-file", maf,
			      (char *)NULL);
			_exit(127);
		}
	}
	for (int i = 0; i < 4; i++) {
		snprintf(pf, sizeof(pf), "%s/wport%d", tmpdir, i);
		if (!(wports[i] = wait_port(pf)))
			return -1;
	}
	char pl[128], dl[128];
	snprintf(pl, sizeof(pl), "127.0.0.1:%u,127.0.0.1:%u", wports[0], wports[1]);
	snprintf(dl, sizeof(dl), "127.0.0.1:%u,127.0.0.1:%u", wports[2], wports[3]);
	snprintf(pf, sizeof(pf), "%s/gport", tmpdir);
	snprintf(logf, sizeof(logf), "%s/glog", tmpdir);
	gateway = fork();
	if (gateway == 0) {
		if (!freopen(logf, "w", stderr))
			_exit(126);
		execl(bin, bin, "gateway", "--api-keys", keyfile, "--tenant-secret-file", tsecret,
		      "--prefill", pl, "--decode", dl, "--secret-file", secret, "--policy", "least",
		      "--port", "0", "--port-file", pf, (char *)NULL);
		_exit(127);
	}
	port = wait_port(pf);
	return port ? 0 : -1;
}

/* GET http://addr<path>, checked: well-formed (prom_parse), and `promtool check metrics`
 * silent when promtool is installed. Returns the page (caller frees). */
static char *checked_page(const char *addr, const char *path)
{
	char *b = NULL, why[2048];
	int st = prom_http_get(addr, path, &b);
	if (st != 200)
		fail_msg("GET http://%s%s: %d", addr, path, st);
	struct prom_doc d;
	if (prom_parse(b, &d))
		fail_msg("http://%s%s: %s\n%s", addr, path, d.err, b);
	prom_free(&d);
	/* vLLM's names carry a ':', which promtool lints (and vLLM's own pages fail): that lint
	 * only is tolerated on /metrics/vllm. */
	int rc = prom_promtool_except(b, strstr(path, "vllm") ? "should not contain ':'" : NULL,
				      why, sizeof(why));
	if (rc < 0)
		fail_msg("promtool check metrics on http://%s%s:\n%s", addr, path, why);
	if (rc == 1)
		print_message("promtool not installed: skipping `promtool check metrics`\n");
	return b;
}

/* The gateway's /metrics pass promtool in both forms: test_promtool_embedded here and
 * test_disagg_worker_metrics for the disaggregated gateway and its workers. */
static void test_promtool_embedded(void **state)
{
	(void)state;
	char addr[32];
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
	char *b = checked_page(addr, "/metrics");
	assert_non_null(strstr(b, "\nkv_blocks_capacity "));
	free(b);
	b = checked_page(addr, "/metrics/vllm");
	assert_non_null(strstr(b, "\nvllm:request_queue_time_seconds_count "));
	assert_non_null(strstr(b, "\nvllm:num_requests_running "));
	assert_non_null(strstr(b, "\nvllm:time_to_first_token_seconds_count "));
	free(b);
}

/* Prefill and decode workers serve /metrics (--metrics-listen) like every daemon: the
 * scheduler's families, promtool-clean, and vLLM's on /metrics/vllm; every worker has queued
 * requests by now (test_disagg_concurrent ran), so each queue-time histogram counted some. */
static void test_disagg_worker_metrics(void **state)
{
	(void)state;
	for (int i = 0; i < 4; i++) {
		char path[600], addr[64] = "";
		snprintf(path, sizeof(path), "%s/wmaddr%d", tmpdir, i);
		FILE *f = fopen(path, "r");
		assert_non_null(f);
		assert_non_null(fgets(addr, sizeof(addr), f));
		fclose(f);
		addr[strcspn(addr, "\n")] = 0;
		char *b = checked_page(addr, "/metrics");
		assert_non_null(strstr(b, "\nnum_requests_running "));
		assert_non_null(strstr(b, "\nkv_blocks_used "));
		free(b);
		b = checked_page(addr, "/metrics/vllm");
		struct prom_doc d;
		assert_int_equal(prom_parse(b, &d), 0);
		double n = 0;
		assert_int_equal(prom_get(&d, "vllm:request_queue_time_seconds_count", "", &n), 0);
		assert_true(n > 0);
		prom_free(&d);
		free(b);
	}
	char addr[32];
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
	free(checked_page(addr, "/metrics"));
	free(checked_page(addr, "/metrics/vllm"));
}

/* An over-long request is a 400 context_length_exceeded whose message says why, in both
 * forms (the disaggregated one said only "prefill failed"). */
static void test_too_long_says_why(void **state)
{
	(void)state;
	char *b;
	assert_int_equal(http("POST", "/v1/completions",
			      "{\"prompt\":\"hi there\",\"max_tokens\":4095,\"temperature\":0}",
			      &b),
			 400);
	cJSON *o = json(b), *e = cJSON_GetObjectItem(o, "error");
	assert_string_equal(cJSON_GetObjectItem(e, "code")->valuestring, "context_length_exceeded");
	const char *msg = cJSON_GetObjectItem(e, "message")->valuestring;
	if (!strstr(msg, "context"))
		fail_msg("message does not say why: %s", msg);
	cJSON_Delete(o);
	free(b);
}

static void stop_pid(pid_t *p)
{
	if (*p > 0) {
		kill(*p, SIGTERM);
		waitpid(*p, NULL, 0);
		*p = -1;
	}
}

static int teardown_disagg(void **state)
{
	stop_pid(&gateway);
	stop_pid(&gateway_cache);
	(void)state;
	for (int i = 0; i < 4; i++)
		stop_pid(&workers[i]);
	return remove_tmpdir();
}

static void test_disagg_same_output(void **state)
{
	(void)state;
	assert_true(embedded_text[0]);
	int c1, c2, n1, n2;
	char *a = completion(long_prompt, 12, 0, &c1, &n1);
	assert_int_equal(c1, 0);
	assert_string_equal(a, embedded_text); /* disaggregated = embedded, greedy */
	char *b = completion(long_prompt, 12, 1, &c2, &n2);
	assert_true(c2 >= 16 && c2 % 16 == 0); /* the prefill worker published the blocks */
	assert_string_equal(b, embedded_text);
	free(a);
	free(b);
}

static void test_disagg_concurrent(void **state)
{
	test_concurrent(state);
}

/* 1 when every replica is up and the gateway's view of its load is back to idle: nothing in
 * flight from this gateway, and the replica's last STATUS says nothing running or queued. */
static int replicas_idle(void)
{
	static const char *const zero[] = {"lb_replica_inflight", "lb_replica_running",
					   "lb_replica_queued_tokens"};
	for (int i = 0; i < 4; i++) {
		char name[160];
		const char *role = i < 2 ? "prefill" : "decode";
		snprintf(name, sizeof(name), "lb_replica_up{role=\"%s\",addr=\"127.0.0.1:%u\"}",
			 role, wports[i]);
		if (metric(name) != 1)
			return 0;
		snprintf(name, sizeof(name),
			 "lb_replica_kv_free_blocks{role=\"%s\",addr=\"127.0.0.1:%u\"}", role,
			 wports[i]);
		if (metric(name) <= 0) /* a real STATUS reply was parsed */
			return 0;
		for (int k = 0; k < 3; k++) {
			snprintf(name, sizeof(name), "%s{role=\"%s\",addr=\"127.0.0.1:%u\"}",
				 zero[k], role, wports[i]);
			if (metric(name) != 0)
				return 0;
		}
	}
	return 1;
}

/* After a burst, the per-replica load the gateway reports returns to 0 (health polls every
 * 200 ms; the few seconds allowed are for a loaded machine, not a speed check). */
static void test_disagg_load_returns_to_zero(void **state)
{
	test_concurrent(state);
	int idle = 0;
	for (int i = 0; i < 100 && !(idle = replicas_idle()); i++)
		sleep_ms(100);
	assert_true(idle);
}

static double picks(int i)
{
	char name[128];
	snprintf(name, sizeof(name),
		 "lb_replica_picks_total{role=\"prefill\",addr=\"127.0.0.1:%u\"}", wports[i]);
	return metric(name);
}

/* The cache policy's rendezvous owner of a prompt, by lbp's own rule (the highest
 * mix of replica identity and prompt key): 0 or 1. */
static int owner(const char *prompt)
{
	struct lbp_load r[2];
	for (int i = 0; i < 2; i++) {
		char a[64];
		snprintf(a, sizeof(a), "127.0.0.1:%u", wports[i]);
		r[i] = (struct lbp_load){.id = lbp_id(a), .up = 1};
	}
	struct lbp_set set = {.r = r, .n = 2};
	struct lbp_req q = {.key = lbp_hash(prompt, strlen(prompt), LBP_SEED),
			    .est_tokens = (int)strlen(prompt) / 4 + 1};
	return lbp_pick_prefill(LB_CACHE, &set, &q, NULL, NULL);
}

#define SIM_N 8

/* The prompts of the decision check: two long shared prefixes (several 256-byte blocks),
 * variants of each, a conversation that extends itself, and for the cache policy one prompt
 * owned by each replica. */
static void sim_prompts(char p[SIM_N][1100])
{
	char pre[2][900];
	for (int k = 0; k < 2; k++) {
		pre[k][0] = 0;
		for (int j = 0; j < 20; j++)
			snprintf(pre[k] + strlen(pre[k]), sizeof(pre[k]) - strlen(pre[k]),
				 "%s sentence %d of shared context %c, ", k ? "Another" : "The", j,
				 'A' + k);
	}
	snprintf(p[0], 1100, "%s question one", pre[0]);
	snprintf(p[1], 1100, "%s question one", pre[1]);
	snprintf(p[2], 1100, "%s question two", pre[0]);
	snprintf(p[3], 1100, "%s question one, then a follow-up about the answer", pre[0]);
	snprintf(p[4], 1100, "%s question three", pre[1]);
	int found = 0;
	for (int k = 0; k < 1000 && found != 3; k++) {
		char v[96];
		snprintf(v, sizeof(v), "variant %d of a question about caches", k);
		int o = owner(v);
		if (!(found & (1 << o))) {
			snprintf(p[5 + o], 1100, "%s", v);
			found |= 1 << o;
		}
	}
	assert_int_equal(found, 3);
	snprintf(p[7], 1100, "%s question two", pre[1]);
}

/* The balancer simulator decides as the running gateway does (issue: real-code check): the
 * same prompts, sent one at a time to a gateway with --policy P (replicas idle between them,
 * so only the policy and its memory decide), go to the same prefill replicas as lb-sim says
 * for a trace of those prompts with the same replica addresses. For cache, the prompts'
 * owners include both replicas (least would send everything to replica 0). */
static void check_sim_decisions(const char *policy)
{
	char prompts[SIM_N][1100];
	sim_prompts(prompts);
	const char *bd = getenv("KVFS_BUILD_DIR");
	char bin[512], sim[512], secret[512], pf[600], logf[600], pl[128], dl[128];
	char trace[600], dec[600];
	snprintf(bin, sizeof(bin), "%s/bin/kvinfer", bd ? bd : "build");
	snprintf(sim, sizeof(sim), "%s/tools/lb-sim", bd ? bd : "build");
	snprintf(secret, sizeof(secret), "%s/secret", tmpdir);
	snprintf(pl, sizeof(pl), "127.0.0.1:%u,127.0.0.1:%u", wports[0], wports[1]);
	snprintf(dl, sizeof(dl), "127.0.0.1:%u,127.0.0.1:%u", wports[2], wports[3]);
	snprintf(pf, sizeof(pf), "%s/gport-%s", tmpdir, policy);
	snprintf(logf, sizeof(logf), "%s/glog-%s", tmpdir, policy);
	snprintf(trace, sizeof(trace), "%s/trace-%s", tmpdir, policy);
	snprintf(dec, sizeof(dec), "%s/decisions-%s", tmpdir, policy);
	pid_t g = gateway_cache = fork();
	if (g == 0) {
		if (!freopen(logf, "w", stderr))
			_exit(126);
		execl(bin, bin, "gateway", "--api-keys", keyfile, "--tenant-secret-file", tsecret,
		      "--prefill", pl, "--decode", dl, "--secret-file", secret, "--policy", policy,
		      "--port", "0", "--port-file", pf, (char *)NULL);
		_exit(127);
	}
	uint16_t main_port = port;
	port = wait_port(pf); /* metric() and completion() talk to this gateway meanwhile */
	int ok = port != 0, real[SIM_N];
	FILE *tf = fopen(trace, "w");
	assert_non_null(tf);
	for (int i = 0; ok && i < SIM_N; i++) {
		int idle = 0;
		for (int k = 0; k < 100 && !(idle = replicas_idle()); k++)
			sleep_ms(100);
		double before[2] = {picks(0), picks(1)};
		int c, n;
		char *t = completion(prompts[i], 2, 0, &c, &n);
		free(t);
		real[i] = picks(0) == before[0] + 1 ? 0 : picks(1) == before[1] + 1 ? 1 : -1;
		ok = idle && real[i] >= 0;
		/* the trace line as the gateway sees the request (lbp.h): est tokens, key, blocks
		 */
		size_t len = strlen(prompts[i]);
		uint64_t blk[8];
		int nb = lbp_text_blocks(prompts[i], len, blk, 8);
		fprintf(tf, "%d %d 2 %" PRIx64 " ", i * 1000000, (int)(len / 4) + 1,
			lbp_hash(prompts[i], len, LBP_SEED));
		for (int j = 0; j < nb; j++)
			fprintf(tf, "%s%" PRIx64, j ? "," : "", blk[j]);
		fprintf(tf, "%s\n", nb ? "" : "-");
	}
	fclose(tf);
	port = main_port;
	stop_pid(&gateway_cache);
	assert_true(ok);
	if (!strcmp(policy, "cache"))
		assert_int_not_equal(real[5], real[6]); /* both owners met */

	char cmd[4096];
	snprintf(cmd, sizeof(cmd),
		 "%s --policy %s --trace %s --prefill 2 --decode 2 --pf-addrs %s --decisions %s "
		 ">/dev/null",
		 sim, policy, trace, pl, dec);
	assert_int_equal(system(cmd), 0);
	FILE *df = fopen(dec, "r");
	assert_non_null(df);
	int r, p, d, n = 0;
	while (fscanf(df, "%d %d %d", &r, &p, &d) == 3) {
		assert_true(r >= 0 && r < SIM_N);
		if (p != real[r])
			fail_msg("%s: request %d: the gateway chose prefill %d, lb-sim %d", policy,
				 r, real[r], p);
		n++;
	}
	fclose(df);
	assert_int_equal(n, SIM_N);
}

static void test_disagg_sim_decisions_cache(void **state)
{
	(void)state;
	check_sim_decisions("cache");
}

static void test_disagg_sim_decisions_prefix(void **state)
{
	(void)state;
	check_sim_decisions("prefix");
}

static void test_disagg_sim_decisions_chash(void **state)
{
	(void)state;
	check_sim_decisions("chash");
}

static void test_disagg_kill_decode(void **state)
{
	(void)state;
	int fd = connect_port();
	assert_true(fd >= 0);
	assert_int_equal(send_req(fd, "POST", "/v1/completions",
				  "{\"prompt\":\"a long story\",\"max_tokens\":3000,"
				  "\"temperature\":0,\"stream\":true}"),
			 0);
	size_t cap = 1 << 20, got = 0;
	char *buf = malloc(cap);
	while (got < 2000) {
		ssize_t r = read(fd, buf + got, cap - got - 1);
		assert_true(r > 0);
		got += (size_t)r;
	}
	/* which decode worker runs it: the one this gateway has a request in flight on */
	int victim = -1;
	for (int i = 2; i < 4; i++) {
		char name[128];
		snprintf(name, sizeof(name),
			 "lb_replica_inflight{role=\"decode\",addr=\"127.0.0.1:%u\"}", wports[i]);
		if (metric(name) == 1)
			victim = i;
	}
	assert_true(victim >= 2);
	kill(workers[victim], SIGKILL);
	waitpid(workers[victim], NULL, 0);
	workers[victim] = -1;
	ssize_t r;
	while (got + 1 < cap && (r = read(fd, buf + got, cap - got - 1)) > 0)
		got += (size_t)r;
	buf[got] = 0;
	close(fd);
	assert_non_null(strstr(buf, "\"error\"")); /* the stream ends with an error event */
	assert_non_null(strstr(buf, "data: [DONE]"));
	free(buf);
	/* new requests go to the survivor (a retry if the balancer had not noticed yet) */
	for (int k = 0; k < 3; k++) {
		int c, n;
		char *t = completion(long_prompt, 12, k == 1, &c, &n);
		assert_string_equal(t, embedded_text);
		free(t);
	}
}

/* cached_tokens of a greedy completion of prompt sent with key and extra JSON members
 * (",\"user\":\"x\"" or ""). */
static int cached_as(const char *key, const char *prompt, const char *extra)
{
	char body[2048], *b;
	snprintf(body, sizeof(body), "{\"prompt\":\"%s\",\"max_tokens\":2,\"temperature\":0%s}",
		 prompt, extra);
	const char *saved = cur_key;
	cur_key = key;
	int st = http("POST", "/v1/completions", body, &b);
	cur_key = saved;
	if (st != 200)
		fail_msg("status %d: %s", st, b ? b : "");
	cJSON *o = json(b);
	cJSON *d = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "prompt_tokens_details");
	int c = cJSON_GetObjectItem(d, "cached_tokens")->valueint;
	cJSON_Delete(o);
	free(b);
	return c;
}

/* A 401 in OpenAI's error format for path, sent with key (NULL: no Authorization). */
static void expect_401(const char *key, const char *method, const char *path, const char *body)
{
	char *b;
	const char *saved = cur_key;
	cur_key = key;
	int st = http(method, path, body, &b);
	cur_key = saved;
	assert_int_equal(st, 401);
	cJSON *o = json(b), *e = cJSON_GetObjectItem(o, "error");
	assert_non_null(e);
	assert_true(cJSON_IsString(cJSON_GetObjectItem(e, "message")));
	assert_string_equal(cJSON_GetObjectItem(e, "type")->valuestring, "invalid_request_error");
	assert_non_null(cJSON_GetObjectItem(e, "param"));
	assert_string_equal(cJSON_GetObjectItem(e, "code")->valuestring, "invalid_api_key");
	cJSON_Delete(o);
	free(b);
}

/* Every /v1 route needs a key the key file holds; /health and /metrics do not. */
static void test_api_keys_required(void **state)
{
	(void)state;
	double before = metric("kvfs_gateway_unauthorized_total");
	const char *body = "{\"prompt\":\"hi\",\"max_tokens\":1}";
	expect_401(NULL, "POST", "/v1/completions", body);
	expect_401("wrong-key-0123456789abcdef", "POST", "/v1/completions", body);
	expect_401(KEY_ALICE "x", "POST", "/v1/chat/completions", body);
	expect_401(NULL, "GET", "/v1/models", NULL);
	/* the other tenant's name is not a key */
	expect_401("alice", "GET", "/v1/models", NULL);
	assert_true(metric("kvfs_gateway_unauthorized_total") >= before + 5);
	char *b;
	const char *saved = cur_key;
	cur_key = NULL;
	assert_int_equal(http("GET", "/health", NULL, &b), 200);
	free(b);
	cur_key = saved;
	assert_int_equal(http("GET", "/v1/models", NULL, &b), 200);
	free(b);
}

/* Waits until the server published more than n KV blocks (the save is in the background). */
static void wait_saved(double n)
{
	for (int i = 0; i < 200 && metric("kvx_saved_blocks_total") <= n; i++)
		sleep_ms(20);
	assert_true(metric("kvx_saved_blocks_total") > n);
}

/* Tenant bob sends the very prompt and user / cache_salt alice used: he gets no cached token,
 * and the server counts no prefix-cache hit for him (so his request cannot be faster for
 * alice's: it computes every token). alice gets her hit; a cache_salt narrows within a tenant. */
static void tenant_probe(const char *prompt, int embedded)
{
	double saved0 = embedded ? metric("kvx_saved_blocks_total") : 0;
	assert_int_equal(cached_as(KEY_ALICE, prompt, ",\"user\":\"alice\""), 0);
	if (embedded)
		wait_saved(saved0);
	/* the same tenant and salt hit */
	int hit = cached_as(KEY_ALICE, prompt, ",\"user\":\"alice\"");
	assert_true(hit >= 16 && hit % 16 == 0);
	double hits = metric("prefix_cache_hits");
	double kvx_hits = embedded ? metric("kvx_hit_blocks_total") : 0;
	/* bob, naming alice's salt (as user; cache_salt is the same field) or none. Each probe
	 * leaves bob's own blocks behind, so each uses a salt bob has not used before. */
	assert_int_equal(cached_as(KEY_BOB, prompt, ",\"user\":\"alice\""), 0);
	assert_int_equal(cached_as(KEY_BOB, prompt, ""), 0);
	assert_true(metric("prefix_cache_hits") == hits); /* no hit was counted for bob */
	if (embedded) /* nor loaded from the cache by the engine */
		assert_true(metric("kvx_hit_blocks_total") == kvx_hits);
	/* a different salt within alice's tenant narrows: no hit either */
	assert_int_equal(cached_as(KEY_ALICE, prompt, ",\"cache_salt\":\"other\""), 0);
	assert_true(metric("prefix_cache_hits") == hits);
	assert_true(cached_as(KEY_ALICE, prompt, ",\"cache_salt\":\"alice\"") >= hit);
}

static void test_tenants_isolated(void **state)
{
	(void)state;
	tenant_probe("Tenant probe, embedded: the quick brown fox jumps over the lazy dog, then "
		     "the dog chases the fox around the farm until both are tired and sleep.",
		     1);
}

/* SIGHUP rereads the key file: a new key works, a removed one is refused. */
/* Rewrites the key file keeping its inode and mtime: only a SIGHUP makes the server see it. */
static void write_keys_quietly(const char *text)
{
	struct stat st;
	assert_int_equal(stat(keyfile, &st), 0);
	assert_int_equal(write_file(keyfile, text), 0);
	struct timespec ts[2] = {st.st_atim, st.st_mtim};
	assert_int_equal(utimensat(AT_FDCWD, keyfile, ts, 0), 0);
}

/* Status of GET /v1/models with key, polled up to ms until it is want; the last status. */
static int models_status(const char *key, int want, int ms)
{
	const char *saved = cur_key;
	int st = 0;
	cur_key = key;
	for (int t = 0; t <= ms; t += 20) {
		char *b = NULL;
		st = http("GET", "/v1/models", NULL, &b);
		free(b);
		if (st == want)
			break;
		sleep_ms(20);
	}
	cur_key = saved;
	return st;
}

/* SIGHUP rereads the key file: a new key works, a removed one is refused, a broken file keeps
 * the keys in force. An edited file is also reread without a signal (checked each second). */
static void test_key_reload(void **state)
{
	(void)state;
	expect_401(KEY_CAROL, "GET", "/v1/models", NULL);
	write_keys_quietly(KEY_ALICE " alice\n" KEY_CAROL " carol\n");
	sleep_ms(1500); /* unchanged mtime: no reload without the signal */
	assert_int_equal(models_status(KEY_CAROL, 200, 0), 401);
	kill(server, SIGHUP);
	assert_int_equal(models_status(KEY_CAROL, 200, 2000), 200);
	expect_401(KEY_BOB, "GET", "/v1/models", NULL);
	write_keys_quietly("short alice\n");
	kill(server, SIGHUP);
	sleep_ms(200);
	assert_int_equal(models_status(KEY_CAROL, 200, 0), 200);
	/* an edit, no signal: alice and bob again (the next groups use them) */
	assert_int_equal(setup_keys(), 0);
	assert_int_equal(models_status(KEY_BOB, 200, 5000), 200);
	assert_int_equal(models_status(KEY_CAROL, 401, 0), 401);
}

static void test_disagg_tenants(void **state)
{
	(void)state;
	expect_401(NULL, "POST", "/v1/completions", "{\"prompt\":\"hi\"}");
	tenant_probe("Tenant probe, disaggregated: a long walk along the river in the morning, "
		     "past the mill and the old bridge, to the market where bread is sold.",
		     0);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_cached_and_stream),	cmocka_unit_test(test_chat),
	    cmocka_unit_test(test_concurrent),		cmocka_unit_test(test_errors_keep_serving),
	    cmocka_unit_test(test_disconnect_frees_kv), cmocka_unit_test(test_api_keys_required),
	    cmocka_unit_test(test_tenants_isolated),	cmocka_unit_test(test_key_reload),
	    cmocka_unit_test(test_promtool_embedded),	cmocka_unit_test(test_too_long_says_why),
	};
	int rc = cmocka_run_group_tests(tests, setup, teardown);
	const struct CMUnitTest disagg[] = {
	    cmocka_unit_test(test_disagg_same_output),
	    cmocka_unit_test(test_disagg_concurrent),
	    cmocka_unit_test(test_disagg_load_returns_to_zero),
	    cmocka_unit_test(test_disagg_sim_decisions_cache),
	    cmocka_unit_test(test_disagg_sim_decisions_prefix),
	    cmocka_unit_test(test_disagg_sim_decisions_chash),
	    cmocka_unit_test(test_disagg_worker_metrics),
	    cmocka_unit_test(test_too_long_says_why),
	    cmocka_unit_test(test_disagg_kill_decode),
	    cmocka_unit_test(test_disagg_tenants),
	};
	/* the disaggregated group reuses the first one's model and temp dir */
	return rc | cmocka_run_group_tests(disagg, setup_disagg, teardown_disagg);
}
