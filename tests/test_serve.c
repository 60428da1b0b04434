/* Tests for `kvinfer serve` (engine/serve/sch.c behind the gateway), end to end: the real
 * kvinfer binary on a synthetic model, a temporary --kv-dir, raw HTTP over loopback.
 * Non-streaming and streaming give the same greedy text; a repeated prompt reports
 * cached_tokens (0 the first time, > 0 the second) with identical output; 20 concurrent
 * clients; malformed bodies are 400s with error JSON and the server keeps serving; a client
 * that disconnects mid-stream has its KV blocks freed (the kv_blocks_used gauge). */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
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

static char tmpdir[256];
static pid_t server = -1;
static uint16_t port;

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

static int connect_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

static int send_req(int fd, const char *method, const char *path, const char *body)
{
	size_t bl = body ? strlen(body) : 0;
	char *req = malloc(bl + 512);
	int n = sprintf(req,
			"%s %s HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\n"
			"Content-Length: %zu\r\n\r\n",
			method, path, bl);
	if (body)
		memcpy(req + n, body, bl);
	size_t off = 0, total = (size_t)n + bl;
	while (off < total) {
		ssize_t w = write(fd, req + off, total - off);
		if (w <= 0)
			break;
		off += (size_t)w;
	}
	free(req);
	return off == total ? 0 : -1;
}

/* One HTTP/1.0 request (no chunked encoding: the body ends at EOF); returns the status and
 * the body (malloc'd), -1 when the server cannot be reached. */
static int http(const char *method, const char *path, const char *body, char **out)
{
	*out = NULL;
	int fd = connect_port();
	if (fd < 0)
		return -1;
	send_req(fd, method, path, body);
	size_t cap = 1 << 16, len = 0;
	char *buf = malloc(cap);
	ssize_t r;
	while ((r = read(fd, buf + len, cap - len - 1)) > 0) {
		len += (size_t)r;
		if (len + 1 == cap)
			buf = realloc(buf, cap *= 2);
	}
	buf[len] = 0;
	close(fd);
	int status = -1;
	sscanf(buf, "HTTP/1.%*d %d", &status);
	char *b = strstr(buf, "\r\n\r\n");
	*out = strdup(b ? b + 4 : "");
	free(buf);
	return status;
}

static cJSON *json(const char *s)
{
	cJSON *o = cJSON_Parse(s);
	if (!o)
		fail_msg("not JSON: %s", s);
	return o;
}

/* Value of a metric line "name value" in /metrics, or -1. */
static double metric(const char *name)
{
	char *b;
	if (http("GET", "/metrics", NULL, &b) != 200) {
		free(b);
		return -1;
	}
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
		      "--max-seqs", "24", "--ctx", "4096", (char *)NULL);
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

static int teardown(void **state)
{
	(void)state;
	if (server > 0) {
		kill(server, SIGTERM);
		int st = 0;
		waitpid(server, &st, 0);
		server = -1;
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
	char *c = completion(long_prompt, 12, 1, &c3, &n3);
	assert_int_equal(n3, 12);
	assert_string_equal(a, c); /* streamed = not streamed */
	assert_true(c3 >= 16);
	assert_true(metric("prefix_cache_hits") >= c2 + c3);
	free(a);
	free(b);
	free(c);
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

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_cached_and_stream),
	    cmocka_unit_test(test_concurrent),
	    cmocka_unit_test(test_errors_keep_serving),
	    cmocka_unit_test(test_disconnect_frees_kv),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
