/* kvinfer bench — engine throughput with its baselines measured in the same run:
 *   - machine: FMA peak estimate (threads x measured clock x 32 flop/cycle, 64 for AVX-512)
 *     and memory bandwidth (memcpy, and a multi-threaded read stream, the decode roofline's
 *     input);
 *   - kernels: matmul GFLOP/s at the model's real shapes, batch 1 and the prefill chunk;
 *   - model: prefill and decode tokens/s, decode beside bandwidth / weight bytes per token.
 * The model comes from a GGUF file (-m) or is built in memory with random weights at a named
 * shape (--shape qwen2-0.5b|llama-1b --type f16|q8_0|bf16|f32), which needs no file. */
#define KVFS_LOG_TAG "bench"
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cfg.h"
#include "fwd.h"
#include "kvinfer_cli.h"
#include "kvk.h"
#include "log.h"
#include "model.h"
#include "pool.h"

struct bench_cfg {
	char model[CFG_STR_MAX], shape[CFG_STR_MAX], type[CFG_STR_MAX], isa[CFG_STR_MAX];
	char device[CFG_STR_MAX];
	int64_t threads, prompt, gen, batch, skip_kernels;
};

#define BOFF(f) offsetof(struct bench_cfg, f)
static const struct cfg_opt bench_opts[] = {
    {"model", CFG_STR, BOFF(model), 0, 0, NULL, "GGUF model file (-m)"},
    {"shape", CFG_STR, BOFF(shape), 0, 0, NULL, "random in-memory model: qwen2-0.5b, llama-1b"},
    {"type", CFG_STR, BOFF(type), 0, 0, "f16", "weight type for --shape: f32 f16 bf16 q8_0"},
    {"threads", CFG_INT, BOFF(threads), 0, 256, "2", "threads, 0 = all cores"},
    {"prompt", CFG_INT, BOFF(prompt), 1, 1 << 20, "512", "prompt tokens to prefill"},
    {"gen", CFG_INT, BOFF(gen), 0, 1 << 20, "64", "tokens to decode"},
    {"batch", CFG_INT, BOFF(batch), 1, 4096, "256", "prefill chunk (tokens per pass)"},
    {"isa", CFG_STR, BOFF(isa), 0, 0, "auto", "matmul kernels: auto, avx512, avx2, scalar"},
    {"skip-kernels", CFG_INT, BOFF(skip_kernels), 0, 1, "0", "1 = skip the kernel microbench"},
    {"device", CFG_STR, BOFF(device), 0, 0, "cpu", KVINFER_DEVICE_HELP},
    CFG_END,
};

/* ---- random in-memory models ------------------------------------------------------------ */

struct shape {
	const char *name;
	struct kvi_config c;
};

static const struct shape shapes[] = {
    {"qwen2-0.5b",
     {"qwen2", 24, 896, 4864, 14, 2, 64, 64, 1000000.0f, 1e-6f, 32768, 151936, KVI_ROPE_HALVES, 1,
      1}},
    {"llama-1b",
     {"llama", 16, 2048, 8192, 32, 8, 64, 64, 500000.0f, 1e-5f, 131072, 128256, KVI_ROPE_ADJACENT,
      0, 1}},
};

static uint64_t xs(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* Random but tame weights: f16/bf16 magnitudes 2^-7..2^-4, Q8_0 scale 2^-9. */
static int rand_tensor(struct kvi_tensor *t, enum kvi_dtype wt, int64_t ne0, int64_t ne1,
		       uint64_t *s)
{
	t->type = wt;
	t->ne[0] = ne0;
	t->ne[1] = ne1;
	t->nbytes = kvk_row_bytes((enum kvk_wtype)wt, (size_t)ne0) * (size_t)ne1;
	uint8_t *d = malloc(t->nbytes);
	if (!d)
		return -ENOMEM;
	size_t n = (size_t)(ne0 * ne1);
	if (wt == KVI_F32) {
		for (size_t i = 0; i < n; i++)
			((float *)d)[i] = (float)((int)(xs(s) % 2001) - 1000) * 6e-5f;
	} else if (wt == KVI_F16 || wt == KVI_BF16) {
		uint16_t *h = (uint16_t *)d;
		for (size_t i = 0; i < n; i += 4) {
			uint64_t r = xs(s);
			for (size_t k = 0; k < 4 && i + k < n; k++, r >>= 16) {
				/* sign, mantissa random; exponent 2^-7 .. 2^-4 (no inf/nan) */
				uint16_t v = (uint16_t)(r & 0x83ff);
				uint16_t ex = (uint16_t)(8 + ((r >> 10) & 3));
				h[i + k] =
				    wt == KVI_F16
					? (uint16_t)(v | ex << 10)
					: (uint16_t)((v & 0x8000) | (ex + 112) << 7 | (v & 0x7f));
			}
		}
	} else {
		uint16_t sc = kvk_f32_to_f16(1.0f / 512);
		for (size_t b = 0; b < n / 32; b++) {
			memcpy(d + b * 34, &sc, 2);
			for (int i = 0; i < 32; i += 8) {
				uint64_t r = xs(s);
				memcpy(d + b * 34 + 2 + i, &r, 8);
			}
		}
	}
	t->data = d;
	return 0;
}

static int ones(struct kvi_tensor *t, int64_t n)
{
	float *d = malloc((size_t)n * 4);
	if (!d)
		return -ENOMEM;
	for (int64_t i = 0; i < n; i++)
		d[i] = 1.0f;
	*t = (struct kvi_tensor){KVI_F32, {n, 1}, d, (size_t)n * 4};
	return 0;
}

static void free_random_model(struct kvi_model *m)
{
	for (int l = 0; l < m->cfg.n_layer; l++) {
		struct kvi_layer *L = &m->layers[l];
		struct kvi_tensor *ts[] = {&L->attn_norm, &L->wq,     &L->wk,	&L->wv,
					   &L->wo,	  &L->bq,     &L->bk,	&L->bv,
					   &L->ffn_norm,  &L->w_gate, &L->w_up, &L->w_down};
		for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
			free((void *)ts[i]->data);
	}
	free((void *)m->tok_embd.data);
	free((void *)m->out_norm.data);
	if (!m->cfg.tied_output)
		free((void *)m->output.data);
	kvi_model_free(m);
}

static int random_model(const struct kvi_config *c, enum kvi_dtype wt, struct kvi_model **out)
{
	struct kvi_model *m;
	int rc = kvi_model_init_empty(c, &m);
	if (rc)
		return rc;
	uint64_t s = 88172645463325252ull;
	int64_t E = c->n_embd, Q = (int64_t)c->n_head * c->head_dim;
	int64_t K = (int64_t)c->n_head_kv * c->head_dim, F = c->n_ff;
	rc |= rand_tensor(&m->tok_embd, wt, E, c->n_vocab, &s);
	rc |= ones(&m->out_norm, E);
	m->output = m->tok_embd;
	for (int l = 0; l < c->n_layer && !rc; l++) {
		struct kvi_layer *L = &m->layers[l];
		rc |= ones(&L->attn_norm, E) | ones(&L->ffn_norm, E);
		rc |= rand_tensor(&L->wq, wt, E, Q, &s) | rand_tensor(&L->wk, wt, E, K, &s);
		rc |= rand_tensor(&L->wv, wt, E, K, &s) | rand_tensor(&L->wo, wt, Q, E, &s);
		rc |= rand_tensor(&L->w_gate, wt, E, F, &s) | rand_tensor(&L->w_up, wt, E, F, &s);
		rc |= rand_tensor(&L->w_down, wt, F, E, &s);
		if (c->has_qkv_bias)
			rc |= rand_tensor(&L->bq, KVI_F32, Q, 1, &s) |
			      rand_tensor(&L->bk, KVI_F32, K, 1, &s) |
			      rand_tensor(&L->bv, KVI_F32, K, 1, &s);
	}
	if (rc) {
		free_random_model(m);
		return -ENOMEM;
	}
	*out = m;
	return 0;
}

/* ---- machine baselines ------------------------------------------------------------------ */

static double cpu_mhz(char *name, size_t cap)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	double mhz = 0;
	char line[512];
	snprintf(name, cap, "?");
	while (f && fgets(line, sizeof(line), f)) {
		char *colon = strchr(line, ':');
		if (!colon)
			continue;
		if (!strncmp(line, "cpu MHz", 7) && mhz == 0)
			mhz = strtod(colon + 1, NULL);
		if (!strncmp(line, "model name", 10) && !strcmp(name, "?")) {
			snprintf(name, cap, "%s", colon + 2);
			name[strcspn(name, "\n")] = 0;
		}
	}
	if (f)
		fclose(f);
	return mhz;
}

/* The core clock in MHz as it runs now (turbo or throttled), from a chain of dependent
 * register-register adds (one per cycle on every x86 core since the P6; not add-immediate,
 * which Golden Cove folds at rename, several per cycle): the best of several short runs, so
 * a run that lost the core to another process does not count. 0 where not x86. */
static double clock_mhz(void)
{
#if defined(__x86_64__)
	double best = 0;
	for (int r = 0; r < 9; r++) {
		uint64_t x = 0, one = 1;
		const long iters = 1 << 19; /* x 16 adds: ~3 ms at 3 GHz */
		double t0 = kvinfer_now();
		for (long i = 0; i < iters; i++)
			__asm__ volatile("add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
					 "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
					 "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
					 "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0"
					 : "+r"(x)
					 : "r"(one));
		double mhz = (double)iters * 16 / (kvinfer_now() - t0) / 1e6;
		best = mhz > best ? mhz : best;
	}
	return best;
#else
	return 0;
#endif
}

struct rd_job {
	const uint64_t *buf;
	size_t n;
	uint64_t sink[64];
};

static void rd_run(void *arg, int tid, int nth, int thread)
{
	struct rd_job *j = arg;
	long lo, hi;
	kvi_pool_split((long)j->n, tid, nth, 64, &lo, &hi);
	uint64_t a = 0, b = 0, c = 0, d = 0;
	for (long i = lo; i + 4 <= hi; i += 4) {
		a += j->buf[i];
		b ^= j->buf[i + 1];
		c += j->buf[i + 2];
		d ^= j->buf[i + 3];
	}
	j->sink[thread % 64] += a + b + c + d;
}

/* Read GB/s of buf with the pool's threads: the best of 8 passes, so that a pass slowed by
 * another process on a shared machine does not set the roofline. */
static double read_probe(struct kvi_pool *pool, const void *buf, size_t bytes)
{
	struct rd_job j = {(const uint64_t *)buf, bytes / 8, {0}};
	double best = 1e9;
	for (int r = 0; r < 8; r++) {
		double t0 = kvinfer_now();
		kvi_pool_run(pool, rd_run, &j);
		double t = kvinfer_now() - t0;
		best = t < best ? t : best;
	}
	return (double)bytes / best / 1e9;
}

/* memcpy GB/s (bytes copied per second) and read GB/s with the pool's threads. */
static void bandwidth(struct kvi_pool *pool, double *copy_gbs, double *read_gbs)
{
	size_t bytes = (size_t)256 << 20;
	uint8_t *a = malloc(bytes), *b = malloc(bytes);
	*copy_gbs = *read_gbs = 0;
	if (!a || !b)
		goto out;
	memset(a, 1, bytes);
	memset(b, 2, bytes);
	double best = 1e9;
	for (int r = 0; r < 4; r++) {
		double t0 = kvinfer_now();
		memcpy(r % 2 ? a : b, r % 2 ? b : a, bytes);
		double t = kvinfer_now() - t0;
		best = t < best ? t : best;
	}
	*copy_gbs = (double)bytes / best / 1e9;
	*read_gbs = read_probe(pool, a, bytes);
out:
	free(a);
	free(b);
}

/* The read probe alone, on a fresh buffer (0 when out of memory). */
static double read_again(struct kvi_pool *pool)
{
	size_t bytes = (size_t)256 << 20;
	uint8_t *a = malloc(bytes);
	double gbs = 0;
	if (a) {
		memset(a, 1, bytes);
		gbs = read_probe(pool, a, bytes);
	}
	free(a);
	return gbs;
}

static double proc_cpu(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Sums /proc/self/task/<tid>/schedstat over this process's threads: *run = seconds on a CPU,
 * *wait = seconds runnable but waiting for one (others' work, or our own threads outnumbering
 * the cores). Wall time x threads minus both is time asleep (the pool's workers idle between
 * jobs, the caller yielding). Returns 0, or -1 where the kernel has no schedstat. */
static int sched_times(double *run, double *wait)
{
	*run = *wait = 0;
	DIR *d = opendir("/proc/self/task");
	if (!d)
		return -1;
	struct dirent *de;
	int n = 0;
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		char path[64];
		snprintf(path, sizeof(path), "/proc/self/task/%.20s/schedstat", de->d_name);
		FILE *f = fopen(path, "r");
		unsigned long long r = 0, w = 0;
		if (f && fscanf(f, "%llu %llu", &r, &w) == 2) {
			*run += (double)r * 1e-9;
			*wait += (double)w * 1e-9;
			n++;
		}
		if (f)
			fclose(f);
	}
	closedir(d);
	return n ? 0 : -1;
}

static double loadavg(void)
{
	double l = -1;
	FILE *f = fopen("/proc/loadavg", "r");
	if (f) {
		if (fscanf(f, "%lf", &l) != 1)
			l = -1;
		fclose(f);
	}
	return l;
}

/* ---- kernel microbench ---------------------------------------------------------------- */

struct mm_bench {
	enum kvk_isa isa;
	enum kvk_wtype wt;
	const void *w, *act;
	float *y;
	size_t n, rows, ntok;
	float **scratch;
};

static void mmb_run(void *arg, int tid, int nth, int thread)
{
	struct mm_bench *b = arg;
	long lo, hi;
	kvi_pool_split((long)b->rows, tid, nth, 16, &lo, &hi);
	kvk_matmul(b->isa, b->wt, b->y, b->rows, b->w, b->n, (size_t)lo, (size_t)hi, b->act,
		   b->ntok, b->scratch[thread]);
}

/* GFLOP/s by the wall clock; *gf_cpu by CPU time / threads (what the threads would do
 * with their cores to themselves: the machine may be shared). */
static double kernel_gflops(struct kvi_pool *pool, enum kvk_isa isa, enum kvk_wtype wt, size_t rows,
			    size_t n, size_t ntok, double *gf_cpu)
{
	*gf_cpu = 0;
	uint64_t s = 12345;
	struct kvi_tensor t;
	if (rand_tensor(&t, (enum kvi_dtype)wt, (int64_t)n, (int64_t)rows, &s))
		return 0;
	int nth = kvi_pool_size(pool);
	float *x = malloc(n * ntok * 4), *y = malloc(rows * ntok * 4);
	void *act = malloc(kvk_act_bytes(wt, n, ntok));
	float **scr = calloc((size_t)nth, sizeof(float *));
	double gf = 0;
	if (!x || !y || !act || !scr)
		goto out;
	for (int i = 0; i < nth; i++)
		if (!(scr[i] =
			  aligned_alloc(64, (kvk_matmul_scratch_floats(wt, n) * 4 + 64) & ~63ul)))
			goto out;
	for (size_t i = 0; i < n * ntok; i++)
		x[i] = (float)((int)(xs(&s) % 2001) - 1000) * 1e-3f;
	kvk_act_prepare(wt, act, ntok, x, n, n, 0, ntok);
	struct mm_bench b = {isa, wt, t.data, act, y, n, rows, ntok, scr};
	kvi_pool_run(pool, mmb_run, &b); /* warm up */
	int iters = 0;
	double t0 = kvinfer_now(), c0 = proc_cpu(), el;
	do {
		kvi_pool_run(pool, mmb_run, &b);
		iters++;
	} while ((el = kvinfer_now() - t0) < 0.4);
	double flop = 2.0 * (double)rows * (double)n * (double)ntok * iters;
	gf = flop / el / 1e9;
	*gf_cpu = flop / ((proc_cpu() - c0) / nth) / 1e9;
out:
	for (int i = 0; scr && i < nth; i++)
		free(scr[i]);
	free(scr);
	free(x);
	free(y);
	free(act);
	free((void *)t.data);
	return gf;
}

static size_t weight_bytes(const struct kvi_model *m)
{
	size_t b = m->output.nbytes; /* the output matrix is read every token; embd rows are not */
	for (int l = 0; l < m->cfg.n_layer; l++) {
		const struct kvi_layer *L = &m->layers[l];
		b += L->wq.nbytes + L->wk.nbytes + L->wv.nbytes + L->wo.nbytes;
		b += L->w_gate.nbytes + L->w_up.nbytes + L->w_down.nbytes;
	}
	return b;
}

static int parse_type(const char *s, enum kvi_dtype *t)
{
	static const struct {
		const char *n;
		enum kvi_dtype t;
	} tab[] = {{"f32", KVI_F32}, {"f16", KVI_F16}, {"bf16", KVI_BF16}, {"q8_0", KVI_Q8_0}};
	for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++)
		if (!strcmp(s, tab[i].n)) {
			*t = tab[i].t;
			return 0;
		}
	return -EINVAL;
}

int kvinfer_cmd_bench(int argc, char **argv)
{
	static const char *const shorts[] = {"-m", "--model", "-t", "--threads", NULL};
	kvinfer_short_flags(argc, argv, shorts);
	struct bench_cfg bc;
	int npos = 0, rc = cfg_parse(bench_opts, &bc, argc, argv,
				     "(-m MODEL.gguf | --shape NAME [--type T]) [options]", &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	enum kvi_dtype wt = KVI_F16;
	int isa = kvinfer_parse_isa(bc.isa);
	const struct shape *sh = NULL;
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
		if (!strcmp(bc.shape, shapes[i].name))
			sh = &shapes[i];
	if (npos || isa < 0 || parse_type(bc.type, &wt) || (!bc.model[0] && !sh) ||
	    (bc.model[0] && bc.shape[0])) {
		fprintf(stderr, "kvinfer bench: need -m MODEL.gguf or --shape qwen2-0.5b|llama-1b "
				"(and a valid --type/--isa); see --help\n");
		return 2;
	}
	if (kvinfer_eng_check(bc.device, "kvinfer bench"))
		return 1;
	int threads = bc.threads > 0 ? (int)bc.threads : kvinfer_default_threads();
	struct kvi_model *m = NULL;
	char err[256] = "";
	if (bc.model[0])
		rc = kvi_model_load(bc.model, &m, err, sizeof(err));
	else
		rc = random_model(&sh->c, wt, &m);
	if (rc) {
		fprintf(stderr, "kvinfer bench: model: %s\n", err[0] ? err : strerror(-rc));
		return 1;
	}
	const struct kvi_config *c = &m->cfg;
	struct kvi_pool *pool = NULL;
	if (kvi_pool_create(threads, &pool)) {
		fprintf(stderr, "kvinfer bench: threads\n");
		return 1;
	}
	char cpu[128];
	double mhz_info = cpu_mhz(cpu, sizeof(cpu)), mhz = clock_mhz();
	int measured = mhz > 0;
	if (!measured)
		mhz = mhz_info;
	enum kvk_isa kisa = isa ? (enum kvk_isa)isa : kvk_isa_best();
	if (kisa > kvk_isa_best())
		kisa = kvk_isa_best();
	/* 2 FMA pipes x lanes x 2 flop per FMA per cycle per core; lanes: the widest FMA the
	 * kernels use (16 for the AVX-512 float kernels, 8 otherwise) */
	int lanes = kisa == KVK_ISA_AVX512 ? 16 : 8;
	double peak = threads * mhz * 1e6 * 4 * lanes / 1e9;
	double copy_gbs, read_gbs;
	bandwidth(pool, &copy_gbs, &read_gbs);
	printf("machine: %s, %d threads, clock %.0f MHz %s (/proc/cpuinfo: %.0f MHz), load "
	       "average %.1f\n",
	       cpu, threads, mhz, measured ? "measured" : "from /proc/cpuinfo", mhz_info,
	       loadavg());
	printf("  peak estimate: %.1f GFLOP/s f32 FMA (threads x clock x %d flop/cycle: two "
	       "%d-lane FMA pipes, the widest these kernels use)\n",
	       peak, 4 * lanes, lanes);
	printf("  memcpy: %.2f GB/s copied; read stream (%d threads): %.2f GB/s\n", copy_gbs,
	       threads, read_gbs);
	if (!bc.skip_kernels) {
		printf("kernels (%s), y = W x at this model's shapes (%d x %d), GFLOP/s and %% of "
		       "peak:\n",
		       kvk_isa_name(kisa), c->n_ff, c->n_embd);
		enum kvk_wtype kts[2] = {KVK_W_F16, KVK_W_Q8_0};
		size_t ntoks[2] = {1, (size_t)bc.batch};
		for (int i = 0; i < 2; i++)
			for (int k = 0; k < 2; k++) {
				double gc;
				double g = kernel_gflops(pool, kisa, kts[i], (size_t)c->n_ff,
							 (size_t)c->n_embd, ntoks[k], &gc);
				double wb =
				    (double)kvk_row_bytes(kts[i], (size_t)c->n_embd) * c->n_ff;
				printf("  %-5s batch %3zu: %7.1f GFLOP/s  %5.1f%% of peak; by CPU "
				       "time %7.1f = %5.1f%%",
				       kts[i] == KVK_W_F16 ? "f16" : "q8_0", ntoks[k], g,
				       100 * g / peak, gc, 100 * gc / peak);
				if (ntoks[k] == 1)
					printf("  (weights streamed at %.1f GB/s)",
					       g * 1e9 / (2.0 * c->n_ff * c->n_embd) * wb / 1e9);
				printf("\n");
			}
	}
	struct kvi_engine_opts eo;
	kvi_engine_opts_default(&eo);
	eo.threads = threads;
	eo.max_batch_tokens = (int)bc.batch;
	eo.max_ctx = (int)(bc.prompt + bc.gen + 1);
	eo.isa = isa;
	struct kvinfer_eng e = {0};
	struct kvi_seq *seq = NULL;
	int32_t *toks = malloc((size_t)(bc.prompt + bc.gen + 1) * sizeof(int32_t));
	float *logits = malloc((size_t)c->n_vocab * 4);
	int ret = 1;
	if (!toks || !logits) {
		fprintf(stderr, "kvinfer bench: out of memory\n");
		goto out;
	}
	if (kvinfer_eng_create(m, &eo, bc.device, "kvinfer bench", &e))
		goto out;
	uint64_t s = 777;
	for (int64_t i = 0; i < bc.prompt; i++)
		toks[i] = (int32_t)(xs(&s) % (uint64_t)c->n_vocab);
	if (e.dev) { /* first use of a GPU (library setup, GEMM heuristics) is not the engine's */
		int nw = bc.prompt < bc.batch ? (int)bc.prompt : (int)bc.batch;
		if (kvi_seq_create(kvinfer_eng_kv(&e), &seq) ||
		    kvinfer_eng_prefill(&e, seq, toks, nw, logits) ||
		    kvinfer_eng_decode(&e, &seq, toks, 1, logits)) {
			fprintf(stderr, "kvinfer bench: warm-up on %s failed\n", e.name);
			goto out;
		}
		kvi_seq_destroy(seq);
		seq = NULL;
	}
	if (kvi_seq_create(kvinfer_eng_kv(&e), &seq)) {
		fprintf(stderr, "kvinfer bench: out of memory\n");
		goto out;
	}
	double a0 = e.cpu ? kvi_engine_attn_cpu_s(e.cpu) : 0;
	double t0 = kvinfer_now(), c0 = proc_cpu();
	rc = kvinfer_eng_prefill(&e, seq, toks, (int)bc.prompt, logits);
	double tp = kvinfer_now() - t0, cp = (proc_cpu() - c0) / threads;
	double ap = e.cpu ? kvi_engine_attn_cpu_s(e.cpu) - a0 : 0;
	if (rc) {
		fprintf(stderr, "kvinfer bench: prefill: %s\n", strerror(-rc));
		goto out;
	}
	double td = 0, cd = proc_cpu(), sr0 = 0, sw0 = 0;
	int have_sched = !sched_times(&sr0, &sw0);
	double tall = kvinfer_now(); /* the schedstat window: decode steps and the argmaxes */
	struct kvi_pool_stats ps0 = {0}, ps1 = {0};
	if (e.cpu)
		kvi_engine_pool_stats(e.cpu, &ps0);
	for (int64_t i = 0; i < bc.gen; i++) {
		int32_t t = 0;
		for (int v = 1; v < c->n_vocab; v++)
			if (logits[v] > logits[t])
				t = v;
		t0 = kvinfer_now();
		rc = kvinfer_eng_decode(&e, &seq, &t, 1, logits);
		td += kvinfer_now() - t0;
		if (rc) {
			fprintf(stderr, "kvinfer bench: decode: %s\n", strerror(-rc));
			goto out;
		}
	}
	cd = (proc_cpu() - cd) / threads; /* includes the argmax between steps */
	double sr1 = 0, sw1 = 0;
	have_sched = have_sched && !sched_times(&sr1, &sw1);
	tall = kvinfer_now() - tall;
	if (e.cpu)
		kvi_engine_pool_stats(e.cpu, &ps1);
	size_t wbytes = weight_bytes(m);
	printf("model: %s (%s), %d layers, embd %d, ff %d, vocab %d, %.2f GB of matmul weights; "
	       "engine %s\n",
	       bc.model[0] ? bc.model : sh->name, bc.model[0] ? c->arch : bc.type, c->n_layer,
	       c->n_embd, c->n_ff, c->n_vocab, wbytes / 1e9, e.name);
	printf("  prefill: %lld tokens (chunk %lld) in %.2f s = %.2f tok/s; by CPU time / threads "
	       "%.2f tok/s\n",
	       (long long)bc.prompt, (long long)bc.batch, tp, bc.prompt / tp, bc.prompt / cp);
	if (e.cpu)
		printf("  prefill attention: %.2f CPU s of %.2f = %.0f%% (threads' CPU clocks)\n",
		       ap, cp * threads, 100 * ap / (cp * threads));
	if (bc.gen > 0 && e.dev) {
		printf(
		    "  decode:  %lld tokens in %.2f s = %.2f tok/s; weights streamed at %.1f GB/s "
		    "(weight bytes x tok/s; compare with the device's memory bandwidth)\n",
		    (long long)bc.gen, td, bc.gen / td, wbytes * (bc.gen / td) / 1e9);
	} else if (bc.gen > 0) {
		/* probed again now: the roofline is the better of the two */
		double read2 = read_again(pool), rd = read2 > read_gbs ? read2 : read_gbs;
		double roof = rd * 1e9 / (double)wbytes;
		printf(
		    "  decode:  %lld tokens in %.2f s = %.2f tok/s (by CPU time / threads %.2f); "
		    "bandwidth roofline %.2f tok/s (read stream %.2f GB/s, best of before and "
		    "after %.2f, / weight bytes): %.0f%% of it\n",
		    (long long)bc.gen, td, bc.gen / td, bc.gen / cd, roof, rd, read2,
		    100 * (bc.gen / td) / roof);
		/* where the threads' wall time went: why the wall rate falls short of the CPU-time
		 * rate. Over the schedstat window (decode steps and the argmax between them); the
		 * rate without the run queue takes the window's mean wait off td */
		double tw = tall * threads, rn = sr1 - sr0, wt = sw1 - sw0;
		if (have_sched && tw > 0)
			printf("  decode thread time: %.0f%% on a CPU, %.0f%% waiting for a CPU "
			       "(run queue), %.0f%% asleep; wall rate with no run-queue wait %.2f "
			       "tok/s\n",
			       100 * rn / tw, 100 * wt / tw, 100 * (tw - rn - wt) / tw,
			       bc.gen / (td - td / tall * wt / threads > 0
					     ? td - td / tall * wt / threads
					     : td));
		if (e.cpu && threads > 1)
			printf("  decode thread pool: %.1f jobs per token, the caller waiting for "
			       "workers after its own shares %.0f%% of the wall time\n",
			       (double)(ps1.jobs - ps0.jobs) / (double)bc.gen,
			       100 * (ps1.wait_s - ps0.wait_s) / td);
	}
	printf("load average at the end: %.1f (others' work on the machine lowers wall-clock "
	       "figures)\n",
	       loadavg());
	ret = 0;
out:
	kvi_seq_destroy(seq);
	kvinfer_eng_destroy(&e);
	kvi_pool_destroy(pool);
	free(toks);
	free(logits);
	if (bc.model[0])
		kvi_model_free(m);
	else
		free_random_model(m);
	return ret;
}
