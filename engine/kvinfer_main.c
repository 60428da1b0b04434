/* kvinfer — the engine's command line: one binary, subcommands in the table below.
 *
 *   kvinfer generate -m MODEL.gguf -p "prompt" -n N [--threads T] [--temp X] ...
 *                    [--logits FILE]  (every position's logits, f32 rows, for comparisons)
 *   kvinfer bench (-m MODEL.gguf | --shape qwen2-0.5b|llama-1b --type f16|q8_0) ...
 * Both take --device cpu|cuda|host (kvinfer_eng.c).
 *
 * To add a subcommand: write `int kvinfer_cmd_<name>(int argc, char **argv)` (argv[0] is the
 * subcommand name) and add a row to `cmds`. */
#define KVFS_LOG_TAG "kvinfer"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cfg.h"
#include "fwd.h"
#include "gguf.h"
#include "kvinfer_cli.h"
#include "kvk.h"
#include "kvx.h"
#include "log.h"
#include "model.h"
#include "sample.h"
#include "tok.h"

/* ---- generate ------------------------------------------------------------------------ */

struct gen_cfg {
	char model[CFG_STR_MAX];
	int64_t n_predict, threads, top_k, seed, batch, block_tokens, ctx;
	char temp[CFG_STR_MAX], top_p[CFG_STR_MAX], isa[CFG_STR_MAX], device[CFG_STR_MAX];
	int no_bos, ignore_eos, special;
	char kv_dir[CFG_STR_MAX], salt[CFG_STR_MAX]; /* KV connector (engine/kvx.h) */
	char logits[CFG_STR_MAX];		     /* --logits FILE */
};

#define GOFF(f) offsetof(struct gen_cfg, f)
static const struct cfg_opt gen_opts[] = {
    {"model", CFG_STR, GOFF(model), 0, 0, NULL, "GGUF model file (-m)"},
    {"n-predict", CFG_INT, GOFF(n_predict), 0, 1 << 20, "64", "tokens to generate (-n)"},
    {"threads", CFG_INT, GOFF(threads), 0, 256, "0", "threads, 0 = all cores (-t)"},
    {"temp", CFG_STR, GOFF(temp), 0, 0, "0", "temperature, 0 = greedy"},
    {"top-k", CFG_INT, GOFF(top_k), 0, 1 << 30, "40", "top-k, 0 = off"},
    {"top-p", CFG_STR, GOFF(top_p), 0, 0, "0.95", "top-p, 1 = off"},
    {"seed", CFG_INT, GOFF(seed), 0, 1e18, "0", "sampling seed"},
    {"batch", CFG_INT, GOFF(batch), 1, 4096, "256", "prefill chunk (tokens per pass)"},
    {"block-tokens", CFG_INT, GOFF(block_tokens), 1, 4096, "64", "KV block size B"},
    {"ctx", CFG_INT, GOFF(ctx), 0, 1 << 24, "0", "max context, 0 = prompt + n-predict"},
    {"isa", CFG_STR, GOFF(isa), 0, 0, "auto", "matmul kernels: auto, avx512, avx2, scalar"},
    {"device", CFG_STR, GOFF(device), 0, 0, "cpu", KVINFER_DEVICE_HELP},
    {"no-bos", CFG_BOOL, GOFF(no_bos), 0, 0, "false", "do not add BOS"},
    {"ignore-eos", CFG_BOOL, GOFF(ignore_eos), 0, 0, "false", "do not stop at end tokens"},
    {"special", CFG_BOOL, GOFF(special), 0, 0, "false", "parse/render control tokens"},
    {"kv-dir", CFG_STR, GOFF(kv_dir), 0, 0, NULL,
     "KV block cache directory (a kvfs mount or local): load the cached prompt prefix, save "
     "new blocks"},
    {"salt", CFG_STR, GOFF(salt), 0, 0, NULL, "cache salt (tenant): salts share no blocks"},
    {"logits", CFG_STR, GOFF(logits), 0, 0, NULL,
     "write the logits after every prompt token (teacher-forced) and every generated one to "
     "FILE: rows of n_vocab little-endian f32, to compare with another engine"},
    CFG_END,
};

static int parse_token_list(const char *s, int32_t **out, int *n)
{
	int cap = 16, cnt = 0;
	int32_t *v = malloc((size_t)cap * sizeof(int32_t));
	while (v && *s) {
		char *end;
		errno = 0;
		long x = strtol(s, &end, 10);
		if (errno || end == s || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
			free(v);
			return -EINVAL;
		}
		if (cnt == cap) {
			int32_t *nv = realloc(v, (size_t)(cap *= 2) * sizeof(int32_t));
			if (!nv) {
				free(v);
				return -ENOMEM;
			}
			v = nv;
		}
		v[cnt++] = (int32_t)x;
		s = *end ? end + 1 : end;
	}
	if (!v)
		return -ENOMEM;
	*out = v;
	*n = cnt;
	return 0;
}

/* One generate run: what it holds (freed by gen_free in reverse order) and its timings. */
struct gen {
	struct gen_cfg gc;
	float temp, top_p;
	int isa;
	struct kvi_model *m;
	struct kvi_tok *tok; /* NULL with --tokens and a model without a tokenizer */
	struct kvinfer_eng eng;
	struct kvi_seq *seq;
	struct kvi_sampler *smp;
	struct kvx *kx; /* --kv-dir */
	FILE *lf;	/* --logits */
	long lrows;
	int32_t *ptoks;
	int nprompt, from_tokens, threads, cached, ngen, saved;
	float *logits;
	double t0, tl, t1, t_first, td; /* start, after lookup, after prefill, first token */
};

static void gen_free(struct gen *g)
{
	if (g->lf)
		fclose(g->lf);
	kvi_seq_destroy(g->seq);
	kvx_destroy(g->kx); /* before the engine: it holds KV block references */
	kvi_sampler_destroy(g->smp);
	kvinfer_eng_destroy(&g->eng);
	kvi_tok_free(g->tok);
	kvi_model_free(g->m);
	free(g->ptoks);
	free(g->logits);
}

/* The model, its tokenizer and the prompt's token ids (from -p or --tokens). */
static int gen_load(struct gen *g, const char *prompt, const char *toklist)
{
	char err[256] = "";
	int rc = kvi_model_load(g->gc.model, &g->m, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "kvinfer: %s: %s\n", g->gc.model, err[0] ? err : strerror(-rc));
		return rc;
	}
	rc = kvi_tok_create(kvi_model_gguf(g->m), &g->tok, err, sizeof(err));
	if (rc && !toklist) {
		fprintf(stderr, "kvinfer: tokenizer: %s\n", err[0] ? err : strerror(-rc));
		return rc;
	}
	if (toklist) {
		g->from_tokens = 1;
		if (parse_token_list(toklist, &g->ptoks, &g->nprompt) || g->nprompt == 0) {
			fprintf(stderr, "kvinfer: --tokens: want a list like 1,2,3\n");
			return -EINVAL;
		}
		return 0;
	}
	size_t len = strlen(prompt), n = 0, cap = len + 8;
	int flags = (!g->gc.no_bos && kvi_tok_wants_bos(g->tok) ? KVI_TOK_ADD_BOS : 0) |
		    (g->gc.special ? KVI_TOK_PARSE_SPECIAL : 0);
	g->ptoks = malloc(cap * sizeof(int32_t));
	if (!g->ptoks || kvi_tok_encode(g->tok, prompt, len, flags, g->ptoks, cap, &n) || n == 0) {
		fprintf(stderr, "kvinfer: cannot tokenize the prompt\n");
		return -EINVAL;
	}
	g->nprompt = (int)n;
	return 0;
}

/* The engine, the KV connector (--kv-dir), the sampler and the sequence. */
static int gen_start(struct gen *g)
{
	struct kvi_engine_opts eo;
	kvi_engine_opts_default(&eo);
	eo.threads = g->gc.threads > 0 ? (int)g->gc.threads : kvinfer_default_threads();
	eo.max_batch_tokens = (int)g->gc.batch;
	eo.block_tokens = (int)g->gc.block_tokens;
	eo.max_ctx = g->gc.ctx > 0 ? (int)g->gc.ctx : g->nprompt + (int)g->gc.n_predict + 1;
	eo.isa = g->isa;
	g->threads = eo.threads;
	int rc = kvinfer_eng_create(g->m, &eo, g->gc.device, "kvinfer", &g->eng);
	if (rc)
		return rc;
	if (g->gc.kv_dir[0]) {
		struct kvx_opts xo;
		kvx_opts_default(&xo);
		xo.dir = g->gc.kv_dir;
		if ((rc = kvx_create_kv(kvinfer_eng_kv(&g->eng), g->m, &xo, &g->kx))) {
			fprintf(stderr, "kvinfer: --kv-dir %s: %s\n", g->gc.kv_dir, strerror(-rc));
			return rc;
		}
	}
	struct kvi_sample_params sp;
	kvi_sample_params_default(&sp);
	sp.temp = g->temp;
	sp.top_k = (int)g->gc.top_k;
	sp.top_p = g->top_p;
	sp.seed = (uint64_t)g->gc.seed;
	sp.max_tokens = (int)g->gc.n_predict;
	int V = g->m->cfg.n_vocab;
	g->logits = malloc((size_t)V * sizeof(float));
	if (!g->logits || kvi_sampler_create(&sp, V, &g->smp) ||
	    kvi_seq_create(kvinfer_eng_kv(&g->eng), &g->seq)) {
		fprintf(stderr, "kvinfer: out of memory\n");
		return -ENOMEM;
	}
	klog_info("model %s: %s, %d layers, embd %d, vocab %d; %d threads, engine %s", g->gc.model,
		  g->m->cfg.arch, g->m->cfg.n_layer, g->m->cfg.n_embd, V, eo.threads, g->eng.name);
	return 0;
}

/* Appends one row of logits to the --logits file (little-endian hosts only: x86, arm64). */
static int gen_dump(struct gen *g)
{
	if (!g->lf)
		return 0;
	size_t V = (size_t)g->m->cfg.n_vocab;
	if (fwrite(g->logits, sizeof(float), V, g->lf) != V) {
		fprintf(stderr, "\nkvinfer: --logits %s: write failed\n", g->gc.logits);
		return -EIO;
	}
	g->lrows++;
	return 0;
}

/* Prefill with every prompt position's logits dumped: one token at a time, which gives the
 * same logits as one pass (the engine is batch-invariant). */
static int gen_prefill_dump(struct gen *g)
{
	for (int i = 0; i < g->nprompt; i++) {
		int rc = kvinfer_eng_prefill(&g->eng, g->seq, g->ptoks + i, 1, g->logits);
		if (rc || (rc = gen_dump(g)))
			return rc;
	}
	return 0;
}

/* Prints token t (its text, or its id without a tokenizer). */
static void gen_print(const struct gen *g, int32_t t)
{
	char buf[512];
	if (g->tok && kvi_tok_decode_piece(g->tok, t, g->gc.special ? KVI_TOK_RENDER_SPECIAL : 0,
					   buf, sizeof(buf)) > 0)
		fputs(buf, stdout);
	else if (!g->tok)
		printf(" %d", t);
}

/* The cached prefix (--kv-dir), prefill of the rest, then sampling and decoding. */
static int gen_run(struct gen *g)
{
	if (g->tok && !g->from_tokens) /* echo the prompt as the tokenizer sees it */
		for (int i = 0; i < g->nprompt; i++)
			gen_print(g, g->ptoks[i]);
	fflush(stdout);
	g->t0 = kvinfer_now();
	int rc;
	if (g->kx &&
	    (rc = kvx_load_prefix(g->kx, g->seq, g->ptoks, g->nprompt, g->gc.salt, &g->cached))) {
		fprintf(stderr, "\nkvinfer: cache lookup: %s\n", strerror(-rc));
		return rc;
	}
	g->tl = kvinfer_now();
	if (g->lf)
		rc = gen_prefill_dump(g);
	else
		rc = kvinfer_eng_prefill(&g->eng, g->seq, g->ptoks + g->cached,
					 g->nprompt - g->cached, g->logits);
	g->t1 = g->t_first = kvinfer_now();
	if (rc) {
		fprintf(stderr, "\nkvinfer: prefill: %s\n", strerror(-rc));
		return rc;
	}
	while (g->gc.n_predict > 0) {
		int32_t t = kvi_sampler_sample(g->smp, g->logits);
		if (g->ngen == 0)
			g->t_first = kvinfer_now(); /* TTFT: request start to the first token */
		int stop = kvi_sampler_accept(g->smp, t);
		int eog = g->tok && !g->gc.ignore_eos && kvi_tok_is_eog(g->tok, t);
		g->ngen++;
		if (eog)
			break;
		gen_print(g, t);
		fflush(stdout);
		if (g->kx && !g->saved) { /* after the first token: queue the prompt's new blocks */
			kvx_save(g->kx, g->seq, g->ptoks, g->nprompt, g->gc.salt);
			g->saved = 1;
		}
		if (stop)
			break;
		double a = kvinfer_now();
		rc = kvinfer_eng_decode(&g->eng, &g->seq, &t, 1, g->logits);
		g->td += kvinfer_now() - a;
		if (rc) {
			fprintf(stderr, "\nkvinfer: decode: %s\n", strerror(-rc));
			return rc;
		}
		if ((rc = gen_dump(g)))
			return rc;
	}
	if (g->kx && !g->saved)
		kvx_save(g->kx, g->seq, g->ptoks, g->nprompt, g->gc.salt);
	return 0;
}

/* Prefill and decode rates, TTFT, and the KV connector's counters, on stderr. */
static void gen_report(struct gen *g)
{
	int computed = g->nprompt - g->cached;
	int ndec = g->ngen > 0 ? g->ngen - 1 : 0; /* the first token came from prefill */
	fprintf(stderr, "\n\nprefill: %d tokens in %.3f s = %.2f tok/s\n", computed, g->t1 - g->tl,
		computed / (g->t1 - g->tl));
	if (g->kx) {
		struct kvx_stats ks;
		kvx_flush(g->kx); /* the saves, after the output: counted below */
		kvx_stats_get(g->kx, &ks);
		fprintf(
		    stderr,
		    "kv cache: %d cached tokens, %d computed; loaded %.1f MiB in %.3f ms; "
		    "TTFT %.1f ms; saved %llu blocks (%llu existed, %llu errors, %llu dropped); "
		    "misses: %llu absent, %llu corrupt, %llu wrong model, %llu mismatch, %llu "
		    "truncated, %llu i/o\n",
		    g->cached, computed, ks.loaded_bytes / 1048576.0, ks.load_ns * 1e-6,
		    (g->t_first - g->t0) * 1e3, (unsigned long long)ks.saved_blocks,
		    (unsigned long long)ks.skipped_existing, (unsigned long long)ks.save_errors,
		    (unsigned long long)ks.dropped_saves, (unsigned long long)ks.miss_absent,
		    (unsigned long long)ks.miss_corrupt, (unsigned long long)ks.miss_wrong_model,
		    (unsigned long long)ks.miss_mismatch, (unsigned long long)ks.miss_truncated,
		    (unsigned long long)ks.miss_io);
	} else {
		fprintf(stderr, "TTFT %.1f ms\n", (g->t_first - g->t0) * 1e3);
	}
	if (g->lf)
		fprintf(stderr, "logits: %ld rows x %d f32 (LE) in %s\n", g->lrows,
			g->m->cfg.n_vocab, g->gc.logits);
	if (g->eng.dev)
		fprintf(stderr, "decode:  %d tokens in %.3f s = %.2f tok/s (%s)\n", ndec, g->td,
			g->td > 0 ? ndec / g->td : 0.0, g->eng.name);
	else
		fprintf(stderr, "decode:  %d tokens in %.3f s = %.2f tok/s (%d threads, %s)\n",
			ndec, g->td, g->td > 0 ? ndec / g->td : 0.0, g->threads, g->eng.name);
}

static int cmd_generate(int argc, char **argv)
{
	static const char *const shorts[] = {"-m", "--model",	"-n", "--n-predict",
					     "-t", "--threads", NULL};
	kvinfer_short_flags(argc, argv, shorts);
	/* the prompt may be longer than a cfg string: taken out before cfg_parse */
	char *prompt = kvinfer_take_flag(&argc, argv, "-p");
	if (!prompt)
		prompt = kvinfer_take_flag(&argc, argv, "--prompt");
	char *toklist = kvinfer_take_flag(&argc, argv, "--tokens");
	struct gen g;
	memset(&g, 0, sizeof(g));
	int npos = 0;
	int rc = cfg_parse(gen_opts, &g.gc, argc, argv,
			   "-m MODEL.gguf (-p PROMPT | --tokens 1,2,3) [options]", &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	g.isa = kvinfer_parse_isa(g.gc.isa);
	if (!g.gc.model[0] || (!prompt && !toklist) || kvinfer_parse_float(g.gc.temp, &g.temp) ||
	    kvinfer_parse_float(g.gc.top_p, &g.top_p) || g.isa < 0 || npos) {
		fprintf(stderr, "kvinfer generate: need -m MODEL and -p PROMPT or --tokens "
				"(valid --temp/--top-p/--isa); see --help\n");
		return 2;
	}
	if (kvinfer_eng_check(g.gc.device, "kvinfer generate"))
		return 1;
	if (g.gc.logits[0] && g.gc.kv_dir[0]) {
		fprintf(stderr, "kvinfer generate: --logits needs every prompt token computed: not "
				"with --kv-dir\n");
		return 2;
	}
	if (g.gc.logits[0] && !(g.lf = fopen(g.gc.logits, "wb"))) {
		fprintf(stderr, "kvinfer generate: --logits %s: %s\n", g.gc.logits,
			strerror(errno));
		return 1;
	}
	int ret = 1;
	if (!gen_load(&g, prompt, toklist) && !gen_start(&g) && !gen_run(&g)) {
		gen_report(&g);
		ret = 0;
	}
	gen_free(&g);
	return ret;
}

/* ---- dispatch ------------------------------------------------------------------------ */

int kvinfer_cmd_serve(int argc, char **argv);	/* engine/serve/serve_main.c */
int kvinfer_cmd_gateway(int argc, char **argv); /* engine/serve/gw_main.c */
int kvinfer_cmd_prefill(int argc, char **argv); /* engine/serve/wk.c */
int kvinfer_cmd_decode(int argc, char **argv);	/* engine/serve/wk.c */
int kvinfer_cmd_encode(int argc, char **argv);	/* engine/serve/wk_enc.c */

static const struct {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *help;
} cmds[] = {
    {"generate", cmd_generate, "generate text from a prompt, printing tokens as they come"},
    {"bench", kvinfer_cmd_bench, "prefill/decode tok/s and matmul GFLOP/s vs machine peak"},
    {"serve", kvinfer_cmd_serve, "OpenAI-compatible server: gateway + engine in one process"},
    {"gateway", kvinfer_cmd_gateway, "OpenAI-compatible gateway over prefill/decode workers"},
    {"prefill", kvinfer_cmd_prefill, "prefill worker (disaggregated serving)"},
    {"decode", kvinfer_cmd_decode, "decode worker (disaggregated serving)"},
    {"encode", kvinfer_cmd_encode, "vision encoder worker (disaggregated serving, images)"},
};

int main(int argc, char **argv)
{
	size_t n = sizeof(cmds) / sizeof(cmds[0]);
	if (argc >= 2)
		for (size_t i = 0; i < n; i++)
			if (!strcmp(argv[1], cmds[i].name))
				return cmds[i].fn(argc - 1, argv + 1);
	fprintf(argc >= 2 && strcmp(argv[1], "--help") ? stderr : stdout,
		"usage: kvinfer COMMAND [options]   (kvinfer COMMAND --help)\n");
	for (size_t i = 0; i < n; i++)
		printf("  %-10s %s\n", cmds[i].name, cmds[i].help);
	return argc >= 2 && !strcmp(argv[1], "--help") ? 0 : 2;
}
