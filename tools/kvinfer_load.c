/* kvinfer-load: a load generator for the OpenAI-compatible server (kvinfer serve / gateway).
 *
 * Workload: many requests sharing a few long prefixes (many users of one system prompt or
 * document): request i uses prefix i % prefixes (about --prefix-words words) plus its own short
 * question, streams (stream: true, include_usage) and measures the time to the first token.
 * Prints one line: requests/s, TTFT p50/p99, generated tokens/s, prompt and cached tokens
 * (with --label, for tables). --concurrency clients run at once.
 *
 * Usage: kvinfer-load --port P [--requests 16] [--concurrency 4] [--prefixes 2]
 *        [--prefix-words 300] [--max-tokens 8] [--offset 0] [--label NAME]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct load {
	int port, requests, conc, prefixes, words, max_tokens, offset;
	const char *label;
	pthread_mutex_t mu;
	int next;
	double *ttft;
	int nok, nfail;
	long gen_tokens, prompt_tokens, cached_tokens;
};

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char *const vocab[] = {"the",   "library", "opens",    "at",      "nine", "on",
				    "every", "weekday", "and",	    "closes",  "late", "trains",
				    "leave", "from",	"platform", "four",    "rain", "expected",
				    "today", "please",	"answer",   "briefly", "city", "museum"};

/* Prefix p: a deterministic pseudo-random text of `words` words. */
static void make_prompt(char *buf, size_t cap, int p, int words, int req)
{
	size_t off = (size_t)snprintf(buf, cap, "Document %d:", p);
	unsigned x = 2654435761u * (unsigned)(p + 1);
	for (int i = 0; i < words && off + 16 < cap; i++) {
		x = x * 1103515245u + 12345u;
		off += (size_t)snprintf(buf + off, cap - off, " %s",
					vocab[(x >> 16) % (sizeof(vocab) / sizeof(vocab[0]))]);
	}
	snprintf(buf + off, cap - off, " Question %d: what time is it?", req);
}

/* One streaming request; returns 0 and its TTFT / usage, -1 on failure. */
static int one(struct load *l, int req, double *ttft, long *gen, long *prompt, long *cached)
{
	size_t cap = (size_t)l->words * 12 + 256;
	char *prompt_text = malloc(cap), *body = malloc(cap + 256);
	make_prompt(prompt_text, cap, req % l->prefixes, l->words, req);
	int blen =
	    snprintf(body, cap + 256,
		     "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0,\"stream\":true,"
		     "\"stream_options\":{\"include_usage\":true}}",
		     prompt_text, l->max_tokens);
	free(prompt_text);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)l->port)};
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	double t0 = now();
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		free(body);
		if (fd >= 0)
			close(fd);
		return -1;
	}
	char hdr[256];
	int hl = snprintf(hdr, sizeof(hdr),
			  "POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
			  "Content-Length: %d\r\n\r\n",
			  blen);
	if (write(fd, hdr, (size_t)hl) != hl || write(fd, body, (size_t)blen) != blen) {
		free(body);
		close(fd);
		return -1;
	}
	free(body);
	size_t rcap = 1 << 16, len = 0;
	char *r = malloc(rcap);
	*ttft = -1;
	ssize_t n;
	while ((n = read(fd, r + len, rcap - len - 1)) > 0) {
		len += (size_t)n;
		r[len] = 0;
		if (*ttft < 0 && strstr(r, "\"text\""))
			*ttft = now() - t0;
		if (len + 1 == rcap)
			r = realloc(r, rcap *= 2);
	}
	close(fd);
	r[len] = 0;
	char *u = strstr(r, "\"usage\"");
	int ok = u && *ttft >= 0 && !strstr(r, "\"error\"");
	if (ok) {
		char *p = strstr(u, "\"prompt_tokens\":"), *c = strstr(u, "\"completion_tokens\":"),
		     *k = strstr(u, "\"cached_tokens\":");
		*prompt = p ? atol(p + 16) : 0;
		*gen = c ? atol(c + 20) : 0;
		*cached = k ? atol(k + 16) : 0;
	}
	free(r);
	return ok ? 0 : -1;
}

static void *client(void *arg)
{
	struct load *l = arg;
	for (;;) {
		pthread_mutex_lock(&l->mu);
		int i = l->next < l->requests ? l->next++ : -1;
		pthread_mutex_unlock(&l->mu);
		if (i < 0)
			return NULL;
		double t;
		long g = 0, p = 0, c = 0;
		int rc = one(l, i + l->offset, &t, &g, &p, &c);
		pthread_mutex_lock(&l->mu);
		if (rc) {
			l->nfail++;
		} else {
			l->ttft[l->nok++] = t;
			l->gen_tokens += g;
			l->prompt_tokens += p;
			l->cached_tokens += c;
		}
		pthread_mutex_unlock(&l->mu);
	}
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	struct load l = {.requests = 16,
			 .conc = 4,
			 .prefixes = 2,
			 .words = 300,
			 .max_tokens = 8,
			 .label = "run"};
	for (int i = 1; i + 1 < argc; i += 2) {
		const char *k = argv[i];
		int v = atoi(argv[i + 1]);
		if (!strcmp(k, "--port"))
			l.port = v;
		else if (!strcmp(k, "--requests"))
			l.requests = v;
		else if (!strcmp(k, "--concurrency"))
			l.conc = v;
		else if (!strcmp(k, "--prefixes"))
			l.prefixes = v;
		else if (!strcmp(k, "--prefix-words"))
			l.words = v;
		else if (!strcmp(k, "--max-tokens"))
			l.max_tokens = v;
		else if (!strcmp(k, "--offset")) /* first request number (question text) */
			l.offset = v;
		else if (!strcmp(k, "--label"))
			l.label = argv[i + 1];
		else {
			fprintf(stderr, "kvinfer-load: unknown option %s\n", k);
			return 2;
		}
	}
	if (l.port <= 0 || l.port > 65535 || l.requests < 1 || l.conc < 1 || l.conc > 256 ||
	    l.prefixes < 1 || l.words < 0 || l.words > 100000 || l.max_tokens < 1) {
		fprintf(stderr,
			"usage: kvinfer-load --port P [--requests N] [--concurrency C] "
			"[--prefixes K] [--prefix-words W] [--max-tokens T] [--label NAME]\n");
		return 2;
	}
	pthread_mutex_init(&l.mu, NULL);
	l.ttft = calloc((size_t)l.requests, sizeof(double));
	pthread_t th[256];
	double t0 = now();
	for (int i = 0; i < l.conc; i++)
		pthread_create(&th[i], NULL, client, &l);
	for (int i = 0; i < l.conc; i++)
		pthread_join(th[i], NULL);
	double wall = now() - t0;
	qsort(l.ttft, (size_t)l.nok, sizeof(double), cmp);
	double p50 = l.nok ? l.ttft[(l.nok - 1) / 2] : 0;
	double p99 = l.nok ? l.ttft[(int)((l.nok - 1) * 0.99 + 0.5)] : 0;
	printf("%-14s ok %3d fail %2d  %.3f req/s  TTFT p50 %8.1f ms  p99 %8.1f ms  %.1f gen tok/s"
	       "  prompt %ld cached %ld  wall %.1f s\n",
	       l.label, l.nok, l.nfail, l.nok / wall, p50 * 1e3, p99 * 1e3, l.gen_tokens / wall,
	       l.prompt_tokens, l.cached_tokens, wall);
	free(l.ttft);
	return l.nfail ? 1 : 0;
}
