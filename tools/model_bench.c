/* kvinfer-model-bench — what loading a model and tokenizing a prompt cost, each against a
 * baseline measured in the same run:
 *   load:        kvi_model_load (map, validate, fingerprint) vs read()ing the file once;
 *   fingerprint: kvi_model_compute_fingerprint (chunked, threaded) vs one-thread SHA-256 of
 *                the same bytes;
 *   tokenizer:   kvi_tok_encode of a ~2,048-token prompt vs mapping each byte to its byte token
 *                (the cheapest possible tokenizer), and decode.
 *
 *   kvinfer-model-bench FILE [--reps N]
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "cfg.h"
#include "gguf.h"
#include "model.h"
#include "tok.h"

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double read_file(const char *path)
{
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return -1;
	size_t cap = 8 << 20;
	char *buf = malloc(cap);
	double t0 = now();
	ssize_t n;
	while ((n = read(fd, buf, cap)) > 0)
		;
	double t = now() - t0;
	close(fd);
	free(buf);
	return n < 0 ? -1 : t;
}

/* One-thread SHA-256 over the bytes of every tensor of the model (the baseline). */
static double sha_one_thread(const struct kvi_gguf *g)
{
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	uint8_t md[32];
	double t0 = now();
	EVP_DigestInit_ex(c, EVP_sha256(), NULL);
	for (size_t i = 0; i < kvi_gguf_n_tensors(g); i++) {
		const struct kvi_gguf_tensor *t = kvi_gguf_tensor(g, i);
		EVP_DigestUpdate(c, t->data, t->nbytes);
	}
	EVP_DigestFinal_ex(c, md, NULL);
	EVP_MD_CTX_free(c);
	return now() - t0;
}

static const char *TEXT[] = {
    "The model reads the prompt once and keeps the attention keys and values. ",
    "A repeated prefix never has to be computed again: ",
    "kvfs stores those blocks for 72 hours on 11 nodes, any 10 of which can answer. ",
    "Numbers like 3.14159, 2048 and 1,000,000 split into digit groups; ",
    "na\xc3\xafve caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80 emoji, ",
    "it's what they'll say\n\n\tcode: for (i = 0; i < n; i++) x[i] += y[i];\n",
};

struct opts {
	int64_t reps;
};

static const struct cfg_opt OPTS[] = {
    {"reps", CFG_INT, offsetof(struct opts, reps), 1, 1000, "20", "tokenizer repetitions"},
    CFG_END,
};

int main(int argc, char **argv)
{
	struct opts o;
	int npos = 0;
	int ret = cfg_parse(OPTS, &o, argc, argv, "FILE.gguf", &npos);
	if (ret)
		return ret > 0 ? 0 : 2;
	if (npos != 1) {
		fprintf(stderr, "usage: kvinfer-model-bench FILE.gguf [--reps N]\n");
		return 2;
	}
	const char *path = argv[1];
	char err[512];
	double t_read = read_file(path); /* also warms the page cache for both */
	t_read = read_file(path);
	double t0 = now();
	struct kvi_model *m;
	if (kvi_model_load(path, &m, err, sizeof(err))) {
		fprintf(stderr, "kvinfer-model-bench: %s\n", err);
		return 1;
	}
	double t_load = now() - t0;
	size_t len;
	kvi_gguf_base(kvi_model_gguf(m), &len);
	double t_sha1 = sha_one_thread(kvi_model_gguf(m));
	t0 = now();
	kvi_model_compute_fingerprint(m);
	double t_fp = now() - t0;
	printf("file %s: %.1f MB, %s, %d layers, vocab %d\n", path, (double)len / 1e6, m->cfg.arch,
	       m->cfg.n_layer, m->cfg.n_vocab);
	printf("load (map+validate+fingerprint) %8.3f s   read() baseline %8.3f s   ratio %.2f\n",
	       t_load, t_read, t_load / t_read);
	printf("fingerprint (threaded, chunked) %8.3f s   1-thread SHA    %8.3f s   speedup %.2f\n",
	       t_fp, t_sha1, t_sha1 / t_fp);

	struct kvi_tok *t;
	if (kvi_tok_create(kvi_model_gguf(m), &t, err, sizeof(err))) {
		fprintf(stderr, "kvinfer-model-bench: %s\n", err);
		kvi_model_free(m);
		return 1;
	}
	size_t cap = 64 * 1024, n = 0, ntok = 0;
	char *text = malloc(cap), *out = malloc(cap);
	int32_t *ids = malloc(cap * sizeof(int32_t)), *base = malloc(cap * sizeof(int32_t));
	/* grow the prompt until it is ~2,048 tokens */
	for (size_t i = 0; ntok < 2048 && n + 256 < cap; i++) {
		const char *s = TEXT[i % (sizeof(TEXT) / sizeof(TEXT[0]))];
		memcpy(text + n, s, strlen(s));
		n += strlen(s);
		kvi_tok_encode(t, text, n, KVI_TOK_ADD_BOS, ids, cap, &ntok);
	}
	/* baseline table: the first token of each single byte */
	int32_t byte_tok[256];
	for (int b = 0; b < 256; b++) {
		char c = (char)b;
		int32_t one[8];
		size_t k = 0;
		kvi_tok_encode(t, &c, 1, 0, one, 8, &k);
		byte_tok[b] = k ? one[0] : 0;
	}
	t0 = now();
	for (int r = 0; r < o.reps; r++)
		kvi_tok_encode(t, text, n, KVI_TOK_ADD_BOS, ids, cap, &ntok);
	double t_enc = (now() - t0) / (double)o.reps;
	volatile int32_t sink = 0;
	int inner = 200;
	t0 = now();
	for (int r = 0; r < o.reps * inner; r++) {
		for (size_t i = 0; i < n; i++)
			base[i] = byte_tok[(uint8_t)text[i]];
		sink += base[r % n];
	}
	double t_base = (now() - t0) / (double)(o.reps * inner);
	t0 = now();
	for (int r = 0; r < o.reps; r++)
		kvi_tok_decode(t, ids, ntok, 0, out, cap);
	double t_dec = (now() - t0) / (double)o.reps;
	int rt = kvi_tok_decode(t, ids, ntok, 0, out, cap) == (int)n && !memcmp(out, text, n);
	printf("encode %zu bytes -> %zu tokens   %8.3f ms   byte-lookup baseline %8.4f ms   "
	       "ratio %.0f\n",
	       n, ntok, t_enc * 1e3, t_base * 1e3, t_enc / t_base);
	printf("decode %zu tokens                %8.3f ms   round trip %s\n", ntok, t_dec * 1e3,
	       rt ? "ok" : "MISMATCH");
	(void)sink;
	free(text);
	free(out);
	free(ids);
	free(base);
	kvi_tok_free(t);
	kvi_model_free(m);
	return rt ? 0 : 1;
}
