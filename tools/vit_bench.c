/* kvinfer-vit-bench — time of one image encode by the vision tower (engine/vit.h) on the CPU:
 * load an mmproj, encode a fixed pseudo-random image --iters times after one warm-up, print
 * the median and best wall time. docs/benchmarks.md records its figures.
 *
 *   kvinfer-synth --preset llama-1b --mmproj /tmp/vitb16.gguf --vit vit-b16
 *   kvinfer-vit-bench /tmp/vitb16.gguf --threads 2 --iters 5
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cfg.h"
#include "kvk.h"
#include "vit.h"

struct opts {
	int64_t threads, iters;
};

static const struct cfg_opt OPTS[] = {
    {"threads", CFG_INT, offsetof(struct opts, threads), 1, 1024, "1", "CPU threads"},
    {"iters", CFG_INT, offsetof(struct opts, iters), 1, 1000, "5", "timed encodes"},
    CFG_END,
};

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	struct opts o;
	int npos = 0;
	int ret = cfg_parse(OPTS, &o, argc, argv, "MMPROJ", &npos);
	if (ret)
		return ret > 0 ? 0 : 2;
	if (npos != 1) {
		fprintf(stderr, "usage: kvinfer-vit-bench MMPROJ [--threads N] [--iters N]\n");
		return 2;
	}
	const char *path = argv[1];
	char err[256] = "";
	struct vit *v;
	double t0 = now();
	ret = vit_load(path, (int)o.threads, &v, err, sizeof(err));
	if (ret) {
		fprintf(stderr, "kvinfer-vit-bench: %s: %s\n", path, err[0] ? err : strerror(-ret));
		return 1;
	}
	double t_load = now() - t0;
	const struct vit_info *I = vit_get_info(v);
	size_t S = (size_t)I->image_size, n_out = (size_t)vit_n_tokens(v) * vit_n_embd_out(v);
	float *px = malloc(3 * S * S * sizeof(float)), *out = malloc(n_out * sizeof(float));
	double *t = calloc((size_t)o.iters, sizeof(double));
	if (!px || !out || !t) {
		fprintf(stderr, "kvinfer-vit-bench: out of memory\n");
		return 1;
	}
	uint64_t s = 1;
	for (size_t i = 0; i < 3 * S * S; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		px[i] = (float)((s >> 40) & 0xffffff) / 4194304.0f - 2.0f;
	}
	ret = vit_encode(v, px, out); /* warm-up: page in the weights */
	for (int64_t i = 0; i < o.iters && !ret; i++) {
		double a = now();
		ret = vit_encode(v, px, out);
		t[i] = now() - a;
	}
	if (ret) {
		fprintf(stderr, "kvinfer-vit-bench: encode: %s\n", strerror(-ret));
		return 1;
	}
	qsort(t, (size_t)o.iters, sizeof(double), cmp_d);
	/* multiply-adds of the matmuls: patch conv, blocks run, projector */
	double T = I->n_patches + I->has_class, E = I->n_embd;
	double flop = 2.0 * I->n_patches * 3 * I->patch_size * I->patch_size * E +
		      I->n_layer_run * (2.0 * T * (4 * E * E + 2 * E * I->n_ff) + 4.0 * T * T * E) +
		      2.0 * I->n_patches *
			  ((double)E * I->n_mm_hidden + (double)I->n_mm_hidden * I->n_embd_out);
	printf("vit %dx%d patch %d embd %d blocks %d/%d heads %d ff %d -> %d x %d, %s, %d threads, "
	       "isa %s\n",
	       I->image_size, I->image_size, I->patch_size, I->n_embd, I->n_layer_run, I->n_layer,
	       I->n_head, I->n_ff, vit_n_tokens(v), vit_n_embd_out(v), path, (int)o.threads,
	       kvk_isa_name(kvk_isa_best()));
	printf("load %.3f s (incl. SHA-256 of the file); encode median %.1f ms, best %.1f ms "
	       "(%.1f GFLOP/s at the median), %d iters\n",
	       t_load, t[o.iters / 2] * 1e3, t[0] * 1e3, flop / t[o.iters / 2] / 1e9, (int)o.iters);
	free(px), free(out), free(t);
	vit_free(v);
	return 0;
}
