/* kvx-bench — the KV connector end to end on one model and one cache directory:
 *
 *   1. cold:   empty cache, lookup (miss) + prefill of the whole prompt -> TTFT, then the
 *              blocks are saved in the background (time to flush reported apart)
 *   2. cached: a fresh connector, page cache of the block files dropped, lookup + io_uring load
 *              + prefill of the uncached tail -> TTFT; logits compared bit for bit with 1.
 *   3. load rate vs raw read of the same files, alternating, page cache dropped before each:
 *              kvx_load_prefix (bytes / load time) against plain read() of the same .kvb files,
 *              one thread (like cat) and --raw-threads threads in parallel; the ratio is taken
 *              against the faster raw figure.
 *
 *   kvx-bench --model M.gguf --kv-dir DIR [--also-dir DIR2] [--tokens 2048] [--threads 2]
 *
 * DIR may be a kvfs mount or a local directory; the bench works in DIR/kvx-bench-<pid>/ and
 * removes it at the end. With --also-dir the cold run's blocks are saved there too (no second
 * cold prefill) and steps 2 and 3 run on both directories. Page cache is dropped per file with
 * posix_fadvise(DONTNEED); caches inside a FUSE daemon cannot be dropped from here, which is why
 * the passes alternate.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "cfg.h"
#include "fwd.h"
#include "kvb.h"
#include "kvx.h"
#include "model.h"

struct bcfg {
	char model[CFG_STR_MAX], kv_dir[CFG_STR_MAX], also_dir[CFG_STR_MAX];
	int64_t tokens, threads, block, chunk, qd, reps, raw_threads, keep, load_only;
};

#define O(name, type, field, lo, hi, def, help)                                                    \
	{                                                                                          \
		name, type, offsetof(struct bcfg, field), lo, hi, def, help                        \
	}
static const struct cfg_opt opts[] = {
    O("model", CFG_STR, model, 0, 0, NULL, "GGUF model"),
    O("kv-dir", CFG_STR, kv_dir, 0, 0, NULL, "cache directory (a kvfs mount or local)"),
    O("also-dir", CFG_STR, also_dir, 0, 0, NULL, "a second cache directory to compare"),
    O("tokens", CFG_INT, tokens, 2, 65536, "2048", "prompt length"),
    O("threads", CFG_INT, threads, 1, 256, "2", "engine threads"),
    O("block", CFG_INT, block, 1, 896, "64", "KV block tokens"),
    O("chunk", CFG_INT, chunk, 1, 8192, "64", "prefill chunk (max batch tokens)"),
    O("queue-depth", CFG_INT, qd, 1, 4096, "64", "io_uring reads in flight"),
    O("reps", CFG_INT, reps, 1, 100, "3", "load / raw-read passes"),
    O("raw-threads", CFG_INT, raw_threads, 1, 256, "8", "threads of the parallel raw read"),
    O("keep", CFG_BOOL, keep, 0, 0, "false", "keep the bench directory"),
    O("load-only", CFG_BOOL, load_only, 0, 0, "false",
      "no prefill: blocks of random KV, step 3 only (load rate vs raw read)"),
    CFG_END,
};

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

struct files {
	char (*path)[1024];
	int n;
	uint64_t bytes;
};

static void drop_cache(const struct files *f)
{
	for (int i = 0; i < f->n; i++) {
		int fd = open(f->path[i], O_RDONLY);
		if (fd >= 0) {
			/* dirty pages (just written locally) are not dropped: write them first */
			if (fdatasync(fd) != 0 && errno != EINVAL && errno != ENOSYS)
				fprintf(stderr, "fdatasync %s: %s\n", f->path[i], strerror(errno));
			posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
			close(fd);
		}
	}
}

struct rawctx {
	const struct files *f;
	int next;
	pthread_mutex_t mu;
	uint64_t bytes;
	int err;
};

static void *raw_worker(void *arg)
{
	struct rawctx *c = arg;
	size_t cap = 1 << 20;
	char *buf = malloc(cap);
	uint64_t got = 0;
	for (;;) {
		pthread_mutex_lock(&c->mu);
		int i = c->next++;
		pthread_mutex_unlock(&c->mu);
		if (i >= c->f->n || !buf)
			break;
		int fd = open(c->f->path[i], O_RDONLY);
		if (fd < 0) {
			c->err = errno;
			continue;
		}
		ssize_t r;
		while ((r = read(fd, buf, cap)) > 0)
			got += (uint64_t)r;
		if (r < 0)
			c->err = errno;
		close(fd);
	}
	free(buf);
	pthread_mutex_lock(&c->mu);
	c->bytes += got;
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

/* Reads every file whole with nthreads threads; returns bytes/s (0 on error). */
static double raw_read(const struct files *f, int nthreads)
{
	struct rawctx c = {.f = f};
	pthread_mutex_init(&c.mu, NULL);
	pthread_t t[256];
	double t0 = now_s();
	for (int i = 0; i < nthreads; i++)
		pthread_create(&t[i], NULL, raw_worker, &c);
	for (int i = 0; i < nthreads; i++)
		pthread_join(t[i], NULL);
	double dt = now_s() - t0;
	pthread_mutex_destroy(&c.mu);
	if (c.err || c.bytes != f->bytes) {
		fprintf(stderr, "raw read: %s, %llu of %llu bytes\n", strerror(c.err),
			(unsigned long long)c.bytes, (unsigned long long)f->bytes);
		return 0;
	}
	return (double)c.bytes / dt;
}

struct ttft {
	double ttft_s, load_s;
	int cached;
	uint64_t loaded;
};

/* One request: lookup + load + prefill of the tail; logits after the prompt into l. */
static int request(struct kvi_engine *e, struct kvx *x, const int32_t *p, int n, float *l,
		   struct ttft *out, struct kvi_seq **seq_out)
{
	struct kvx_stats a, b;
	kvx_stats_get(x, &a);
	struct kvi_seq *s;
	int r = kvi_seq_create(kvi_engine_kv(e), &s);
	if (r)
		return r;
	double t0 = now_s();
	if ((r = kvx_load_prefix(x, s, p, n, NULL, &out->cached)) == 0)
		r = kvi_engine_prefill(e, s, p + out->cached, n - out->cached, l);
	out->ttft_s = now_s() - t0;
	kvx_stats_get(x, &b);
	out->load_s = (double)(b.load_ns - a.load_ns) * 1e-9;
	out->loaded = b.loaded_bytes - a.loaded_bytes;
	if (r || !seq_out)
		kvi_seq_destroy(s);
	else
		*seq_out = s;
	return r;
}

struct bench {
	struct bcfg c;
	struct kvi_model *m;
	struct kvi_engine *e;
	int32_t *p;
	int n, B, V;
	float *l0; /* cold logits */
	double cold_ttft;
};

/* Makes <root>/kvx-bench-<pid>; 0 or -1. */
static int bench_dir(const char *root, char *dir, size_t cap)
{
	snprintf(dir, cap, "%s/kvx-bench-%d", root, (int)getpid());
	if (mkdir(dir, 0755)) {
		fprintf(stderr, "kvx-bench: mkdir %s: %s\n", dir, strerror(errno));
		return -1;
	}
	return 0;
}

static struct kvx *connector(struct bench *b, const char *dir)
{
	struct kvx_opts xo;
	kvx_opts_default(&xo);
	xo.dir = dir;
	xo.queue_depth = (int)b->c.qd;
	struct kvx *x = NULL;
	int r = kvx_create(b->e, b->m, &xo, &x);
	if (r)
		fprintf(stderr, "kvx-bench: kvx on %s: %s\n", dir, strerror(-r));
	return x;
}

/* Saves seq's blocks into dir and waits for them. */
static int save_all(struct bench *b, struct kvx *x, struct kvi_seq *s, const char *what)
{
	double ts = now_s();
	int queued = kvx_save(x, s, b->p, b->n, NULL);
	double t_queue = now_s() - ts;
	kvx_flush(x);
	double t_flush = now_s() - ts;
	struct kvx_stats st;
	kvx_stats_get(x, &st);
	printf("save (%s): %d blocks queued in %.3f ms (caller), written in %.3f s (%llu saved, "
	       "%llu errors)\n",
	       what, queued, t_queue * 1e3, t_flush, (unsigned long long)st.saved_blocks,
	       (unsigned long long)st.save_errors);
	return st.save_errors ? -1 : 0;
}

/* Steps 2 and 3 on one directory. Returns 0 when the logits matched. */
static int measure(struct bench *b, const char *dir)
{
	struct statfs sfs;
	int fuse = statfs(dir, &sfs) == 0 && (unsigned)sfs.f_type == 0x65735546;
	int n = b->n, B = b->B;
	printf("--- %s (%s)\n", dir, fuse ? "kvfs mount" : "local directory");
	struct kvb_geom g = {(uint32_t)b->m->cfg.n_layer, (uint32_t)b->m->cfg.n_head_kv,
			     (uint32_t)b->m->cfg.head_dim, KVB_DTYPE_F16, (uint32_t)B};
	uint8_t fp[KVB_HASH], sd[KVB_HASH];
	kvb_fingerprint(b->m->fingerprint, &g, fp);
	kvb_salt_digest(NULL, sd);
	int nb = (n - 1) / B;
	uint8_t(*h)[KVB_HASH] = malloc((size_t)(nb + 1) * KVB_HASH);
	struct files f = {.path = malloc((size_t)(nb + 1) * 1024), .n = nb};
	float *l1 = malloc((size_t)b->V * 4);
	kvb_chain(fp, sd, b->p, nb * B, B, h, nb);
	for (int i = 0; i < nb; i++) {
		char rel[200];
		kvb_path(fp, h[i], rel, sizeof(rel));
		snprintf(f.path[i], 1024, "%s/%s", dir, rel);
		f.bytes += KVB_HEADER_SIZE + kvb_payload_bytes(&g);
	}
	struct kvx *x = connector(b, dir);
	if (!x)
		return -1;
	struct ttft hot;
	drop_cache(&f);
	int r = 0, same = 1;
	if (b->c.load_only)
		goto rate;
	r = request(b->e, x, b->p, n, l1, &hot, NULL);
	if (r) {
		fprintf(stderr, "kvx-bench: cached run: %s\n", strerror(-r));
		return -1;
	}
	same = memcmp(b->l0, l1, (size_t)b->V * 4) == 0;
	printf("cached: TTFT %.3f s (%d tokens cached, %d computed); load %.3f s, %.1f MiB, "
	       "%.0f MiB/s\n",
	       hot.ttft_s, hot.cached, n - hot.cached, hot.load_s, hot.loaded / 1048576.0,
	       hot.loaded / 1048576.0 / hot.load_s);
	printf("TTFT cold / cached = %.1fx (bar >= 10x); logits bit-identical to cold: %s\n",
	       b->cold_ttft / hot.ttft_s, same ? "yes" : "NO");

rate:;
	double best_load = 0, best_raw1 = 0, best_rawp = 0, ratios[100] = {0};
	for (int rep = 0; rep < b->c.reps; rep++) {
		drop_cache(&f);
		double raw1 = raw_read(&f, 1);
		drop_cache(&f);
		double rawp = raw_read(&f, (int)b->c.raw_threads);
		drop_cache(&f);
		struct kvi_seq *ls;
		kvi_seq_create(kvi_engine_kv(b->e), &ls);
		struct kvx_stats a, z;
		kvx_stats_get(x, &a);
		int cached = 0;
		kvx_load_prefix(x, ls, b->p, n, NULL, &cached);
		kvx_stats_get(x, &z);
		kvi_seq_destroy(ls);
		double rate = (double)(z.loaded_bytes - a.loaded_bytes) /
			      ((double)(z.load_ns - a.load_ns) * 1e-9);
		printf("pass %d: kvx load %.0f MiB/s (%d blocks), raw read 1 thread %.0f MiB/s, "
		       "%d threads %.0f MiB/s\n",
		       rep, rate / 1048576, cached / B, raw1 / 1048576, (int)b->c.raw_threads,
		       rawp / 1048576);
		ratios[rep] = rate / fmax(fmax(raw1, rawp), 1);
		best_load = fmax(best_load, rate);
		best_raw1 = fmax(best_raw1, raw1);
		best_rawp = fmax(best_rawp, rawp);
	}
	double raw = fmax(best_raw1, best_rawp);
	for (int i = 1; i < b->c.reps; i++) /* sort the per-pass ratios for the median */
		for (int k = i; k > 0 && ratios[k - 1] > ratios[k]; k--) {
			double t = ratios[k];
			ratios[k] = ratios[k - 1];
			ratios[k - 1] = t;
		}
	printf("per pass kvx / faster raw of that pass: median %.2f, min %.2f, max %.2f\n",
	       ratios[b->c.reps / 2], ratios[0], ratios[b->c.reps - 1]);
	printf("best: kvx load %.0f MiB/s, raw %.0f MiB/s (1 thread %.0f) -> ratio %.2f "
	       "(bar >= 0.6)\n",
	       best_load / 1048576, raw / 1048576, best_raw1 / 1048576,
	       raw > 0 ? best_load / raw : 0);
	kvx_destroy(x);
	free(h), free(f.path), free(l1);
	return same ? 0 : -1;
}

int main(int argc, char **argv)
{
	struct bench b;
	memset(&b, 0, sizeof(b));
	int npos;
	int r = cfg_parse(opts, &b.c, argc, argv, "", &npos);
	if (r)
		return r == 1 ? 0 : 2;
	if (!b.c.model[0] || !b.c.kv_dir[0]) {
		fprintf(stderr, "kvx-bench: --model and --kv-dir are required\n");
		return 2;
	}
	char err[256];
	double t0 = now_s();
	if ((r = kvi_model_load(b.c.model, &b.m, err, sizeof(err)))) {
		fprintf(stderr, "kvx-bench: %s: %s\n", b.c.model, err);
		return 1;
	}
	printf("model %s (%s, %d layers, %d kv heads x %d) loaded in %.2f s\n", b.c.model,
	       b.m->cfg.arch, b.m->cfg.n_layer, b.m->cfg.n_head_kv, b.m->cfg.head_dim,
	       now_s() - t0);
	b.n = (int)b.c.tokens;
	b.B = (int)b.c.block;
	b.V = b.m->cfg.n_vocab;
	struct kvi_engine_opts eo;
	kvi_engine_opts_default(&eo);
	eo.threads = (int)b.c.threads;
	eo.block_tokens = b.B;
	eo.max_batch_tokens = (int)b.c.chunk;
	eo.max_ctx = b.n + b.B;
	eo.kv_blocks = 3 * ((b.n + b.B - 1) / b.B) + 4;
	if ((r = kvi_engine_create(b.m, &eo, &b.e))) {
		fprintf(stderr, "kvx-bench: engine: %s\n", strerror(-r));
		return 1;
	}
	char dir[2][CFG_STR_MAX + 64];
	int ndir = b.c.also_dir[0] ? 2 : 1;
	if (bench_dir(b.c.kv_dir, dir[0], sizeof(dir[0])) ||
	    (ndir > 1 && bench_dir(b.c.also_dir, dir[1], sizeof(dir[1]))))
		return 1;
	printf("isa %s, %d threads, B=%d, chunk %d, prompt %d tokens, queue depth %d\n",
	       kvi_engine_isa(b.e), eo.threads, b.B, eo.max_batch_tokens, b.n, (int)b.c.qd);
	b.p = malloc((size_t)b.n * sizeof(int32_t));
	b.l0 = malloc((size_t)b.V * 4);
	unsigned seed = 42;
	for (int i = 0; i < b.n; i++) {
		seed = seed * 1103515245u + 12345u;
		b.p[i] = (int32_t)((seed >> 8) % (unsigned)b.V);
	}

	/* 1. cold, on the first directory (its lookup misses) */
	struct kvx *x = connector(&b, dir[0]);
	if (!x)
		return 1;
	struct ttft cold;
	struct kvi_seq *s;
	if (b.c.load_only) { /* KV blocks of pseudo-random bytes: files as big as real ones */
		struct kvi_kv *kv = kvi_engine_kv(b.e);
		if (kvi_seq_create(kv, &s) || kvi_seq_reserve(s, b.n))
			return 1;
		uint64_t z = 1;
		for (int i = 0; i < kvi_seq_n_blocks(s); i++) {
			uint64_t *q = (uint64_t *)kvi_kv_row(kv, kvi_seq_blocks(s)[i], 0, 0, 0);
			for (size_t k = 0; k < kvi_kv_block_bytes(kv) / 8; k++)
				q[k] = (z = z * 6364136223846793005ull + 1442695040888963407ull);
		}
		kvi_seq_advance(s, b.n);
		goto save;
	}
	printf("cold prefill of %d tokens...\n", b.n);
	fflush(stdout);
	if ((r = request(b.e, x, b.p, b.n, b.l0, &cold, &s))) {
		fprintf(stderr, "kvx-bench: cold run: %s\n", strerror(-r));
		return 1;
	}
	b.cold_ttft = cold.ttft_s;
	printf("cold:   TTFT %.3f s (%d tokens computed, %.1f tok/s)\n", cold.ttft_s, b.n,
	       b.n / cold.ttft_s);
save:;
	int bad = save_all(&b, x, s, dir[0]);
	kvx_destroy(x);
	if (ndir > 1) {
		if (!(x = connector(&b, dir[1])))
			return 1;
		bad |= save_all(&b, x, s, dir[1]);
		kvx_destroy(x);
	}
	kvi_seq_destroy(s);
	fflush(stdout);

	for (int d = 0; d < ndir; d++)
		bad |= measure(&b, dir[d]);
	kvi_engine_destroy(b.e);
	for (int d = 0; d < ndir && !b.c.keep; d++) {
		char cmd[1024];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir[d]);
		if (system(cmd) != 0)
			fprintf(stderr, "kvx-bench: could not remove %s\n", dir[d]);
	}
	kvi_model_free(b.m);
	free(b.p), free(b.l0);
	return bad ? 1 : 0;
}
