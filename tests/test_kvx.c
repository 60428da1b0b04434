/* Tests for engine/kvx, the KV connector, on a small random model (tests/ref_fwd.c).
 *
 * Every run is checked against a cold reference computed without any cache and with another
 * prefill chunk size: the logits after the prompt must be bit-identical (memcmp) and the greedy
 * tokens equal, whether the prefix was loaded from block files (full or partial hit), computed,
 * or came from a damaged cache (which must be a counted miss).
 *
 *   test_kvx            on a local temporary directory
 *   test_kvx --mount    the same suite on a real kvfs mount: meta + 11 nodes + kvfs-mount
 *                       (skipped, exit 77, without /dev/fuse or without kvfs-mount)
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "build_tutil.h"
#include "fwd.h"
#include "kvb.h"
#include "kvx.h"
#include "ref_fwd.h"

enum { B = 16, NPROMPT = 100, NGEN = 6, NFULL = NPROMPT / B };

/* Shared fixture: the models and the cold reference output. */
struct fix {
	char root[512]; /* where each test makes its cache directory */
	int seq;
	struct kvi_config cfg;
	struct kvi_model *m, *m2; /* m2: other weights, other fingerprint */
	int32_t prompt[NPROMPT];
	float *ref_logits;
	int32_t ref_tokens[NGEN];
};

struct out {
	int cached;
	float *logits; /* after the prompt */
	int32_t tokens[NGEN];
	struct kvx_stats st;
};

static struct fix *F;

static struct kvi_engine *engine(const struct kvi_model *m, int chunk)
{
	struct kvi_engine_opts o;
	kvi_engine_opts_default(&o);
	o.threads = 1;
	o.max_batch_tokens = chunk;
	o.block_tokens = B;
	o.max_ctx = 256;
	o.kv_blocks = 32;
	struct kvi_engine *e = NULL;
	assert_int_equal(kvi_engine_create(m, &o, &e), 0);
	return e;
}

/* Prefill (after a cache lookup when x != NULL), then NGEN greedy tokens; saves the prompt's
 * blocks and waits for the writer. */
static void generate(struct kvi_engine *e, struct kvx *x, const int32_t *prompt, int n,
		     const char *salt, struct out *o)
{
	int V = F->cfg.n_vocab;
	float *l = malloc((size_t)V * sizeof(float));
	assert_non_null(l);
	struct kvi_seq *s;
	assert_int_equal(kvi_seq_create(kvi_engine_kv(e), &s), 0);
	o->cached = 0;
	if (x)
		assert_int_equal(kvx_load_prefix(x, s, prompt, n, salt, &o->cached), 0);
	assert_int_equal(kvi_seq_len(s), o->cached);
	assert_true(o->cached < n && o->cached % B == 0);
	assert_int_equal(kvi_engine_prefill(e, s, prompt + o->cached, n - o->cached, l), 0);
	memcpy(o->logits, l, (size_t)V * sizeof(float));
	if (x)
		assert_true(kvx_save(x, s, prompt, n, salt) >= 0);
	for (int i = 0; i < NGEN; i++) {
		o->tokens[i] = ref_argmax(l, V);
		if (i + 1 < NGEN)
			assert_int_equal(kvi_engine_decode(e, &s, &o->tokens[i], 1, l), 0);
	}
	if (x) {
		kvx_flush(x);
		kvx_stats_get(x, &o->st);
	}
	kvi_seq_destroy(s);
	free(l);
}

/* One engine + connector on dir, one request; the engine's chunk differs from the reference. */
static void run(const char *dir, const char *salt, struct out *o)
{
	struct kvi_engine *e = engine(F->m, 8);
	struct kvx_opts xo;
	kvx_opts_default(&xo);
	xo.dir = dir;
	xo.queue_depth = 4; /* fewer than the blocks: exercises the refill of the pipeline */
	struct kvx *x = NULL;
	assert_int_equal(kvx_create(e, F->m, &xo, &x), 0);
	generate(e, x, F->prompt, NPROMPT, salt, o);
	kvx_destroy(x);
	kvi_engine_destroy(e);
}

static void assert_like_ref(const struct out *o)
{
	assert_memory_equal(o->logits, F->ref_logits, (size_t)F->cfg.n_vocab * sizeof(float));
	assert_memory_equal(o->tokens, F->ref_tokens, sizeof(o->tokens));
}

static void new_dir(char *out, size_t cap)
{
	snprintf(out, cap, "%s/c%d", F->root, F->seq++);
	assert_int_equal(mkdir(out, 0755), 0);
}

/* Path of block i of the (unsalted) prompt under dir. */
static void block_path(const char *dir, const struct kvi_model *m, const char *salt, int i,
		       char *out, size_t cap)
{
	struct kvb_geom g = {(uint32_t)F->cfg.n_layer, (uint32_t)F->cfg.n_head_kv,
			     (uint32_t)F->cfg.head_dim, KVB_DTYPE_F16, B};
	uint8_t fp[KVB_HASH], sd[KVB_HASH], h[NFULL][KVB_HASH];
	kvb_fingerprint(m->fingerprint, &g, fp);
	kvb_salt_digest(salt, sd);
	kvb_chain(fp, sd, F->prompt, NPROMPT, B, h, NFULL);
	char rel[200];
	assert_int_equal(kvb_path(fp, h[i], rel, sizeof(rel)), 0);
	snprintf(out, cap, "%s/%s", dir, rel);
}

static int count_files(const char *dir, const char *suffix)
{
	char cmd[1200];
	snprintf(cmd, sizeof(cmd), "find '%s' -type f -name '*%s' | wc -l", dir, suffix);
	FILE *p = popen(cmd, "r");
	int n = -1;
	if (p) {
		if (fscanf(p, "%d", &n) != 1)
			n = -1;
		pclose(p);
	}
	return n;
}

static void out_init(struct out *o)
{
	memset(o, 0, sizeof(*o));
	o->logits = malloc((size_t)F->cfg.n_vocab * sizeof(float));
	assert_non_null(o->logits);
}

/* Cold run saves every full block; then full hit, partial hit (a later block deleted), a hole
 * (an early block deleted), no hit (another directory): all identical to the reference. */
static void test_hit_partial_none(void **st)
{
	(void)st;
	char dir[600], p[1200];
	new_dir(dir, sizeof(dir));
	struct out o;
	out_init(&o);

	run(dir, NULL, &o); /* cold */
	assert_int_equal(o.cached, 0);
	assert_like_ref(&o);
	assert_int_equal((int)o.st.saved_blocks, NFULL);
	assert_int_equal(count_files(dir, ".kvb"), NFULL);
	assert_int_equal(count_files(dir, ".tmp.*"), 0);

	run(dir, NULL, &o); /* full hit: every block before the last token */
	assert_int_equal(o.cached, ((NPROMPT - 1) / B) * B);
	assert_int_equal((int)o.st.hit_blocks, (NPROMPT - 1) / B);
	assert_int_equal((int)o.st.loaded_bytes,
			 ((NPROMPT - 1) / B) * (int)(KVB_HEADER_SIZE + 2 * 2 * B * 2 * 16 * 2));
	assert_true(o.st.probes <= 1);
	assert_int_equal((int)o.st.saved_blocks, 0);
	assert_like_ref(&o);

	block_path(dir, F->m, NULL, 4, p, sizeof(p));
	assert_int_equal(unlink(p), 0);
	run(dir, NULL, &o); /* partial hit: blocks 0..3; the save puts block 4 back */
	assert_int_equal(o.cached, 4 * B);
	assert_int_equal((int)o.st.miss_absent, 1);
	assert_true(o.st.probes <= 4);
	assert_int_equal((int)o.st.saved_blocks, 1);
	assert_like_ref(&o);
	assert_int_equal(count_files(dir, ".kvb"), NFULL);

	block_path(dir, F->m, NULL, 1, p, sizeof(p));
	assert_int_equal(unlink(p), 0);
	run(dir, NULL, &o); /* a hole (eviction): the load stops at block 1 */
	assert_int_equal(o.cached, 1 * B);
	assert_int_equal((int)o.st.miss_absent, 1);
	assert_like_ref(&o);

	char other[600];
	new_dir(other, sizeof(other));
	run(other, NULL, &o); /* no hit */
	assert_int_equal(o.cached, 0);
	assert_like_ref(&o);
	free(o.logits);
}

/* A prompt whose length is a multiple of B: its last block is never a hit. Short prompts
 * (< 1 block) never look anything up. */
static void test_boundaries(void **st)
{
	(void)st;
	char dir[600];
	new_dir(dir, sizeof(dir));
	struct kvi_engine *e = engine(F->m, 8);
	struct kvx_opts xo;
	kvx_opts_default(&xo);
	xo.dir = dir;
	struct kvx *x = NULL;
	assert_int_equal(kvx_create(e, F->m, &xo, &x), 0);
	struct out o;
	out_init(&o);
	generate(e, x, F->prompt, 4 * B, NULL, &o);
	assert_int_equal((int)o.st.saved_blocks, 4);
	generate(e, x, F->prompt, 4 * B, NULL, &o);
	assert_int_equal(o.cached, 3 * B);
	generate(e, x, F->prompt, 4 * B + 1, NULL, &o);
	assert_int_equal(o.cached, 4 * B);
	generate(e, x, F->prompt, B - 3, NULL, &o);
	assert_int_equal(o.cached, 0);
	kvx_destroy(x);
	kvi_engine_destroy(e);
	free(o.logits);
}

static void write_file(const char *p, const void *b, size_t n)
{
	FILE *f = fopen(p, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(b, 1, n, f), n);
	assert_int_equal(fclose(f), 0);
}

static size_t read_file(const char *p, uint8_t **b)
{
	FILE *f = fopen(p, "rb");
	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	*b = malloc((size_t)n + 1);
	assert_int_equal(fread(*b, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	return (size_t)n;
}

enum damage {
	D_PAYLOAD,
	D_HEADER,
	D_TRUNC,
	D_LONG,
	D_EMPTY,
	D_GARBAGE,
	D_OTHER_MODEL,
	D_OTHER_BLOCK
};

/* Block 2 damaged in one way: the run loads blocks 0..1, recomputes the rest, output right,
 * and the miss lands in the expected counter. */
static void damaged(enum damage d)
{
	char dir[600], p[1200], q[1200];
	new_dir(dir, sizeof(dir));
	struct out o;
	out_init(&o);
	run(dir, NULL, &o);
	block_path(dir, F->m, NULL, 2, p, sizeof(p));
	uint8_t *b;
	size_t n = read_file(p, &b);
	/* files are immutable on kvfs: replace, never edit in place */
	assert_int_equal(unlink(p), 0);
	switch (d) {
	case D_PAYLOAD:
		b[KVB_HEADER_SIZE + 1000] ^= 0x40;
		write_file(p, b, n);
		break;
	case D_HEADER:
		b[200] ^= 1; /* a token id: header CRC */
		write_file(p, b, n);
		break;
	case D_TRUNC:
		write_file(p, b, n - 100);
		break;
	case D_LONG:
		b = realloc(b, n + 10);
		memset(b + n, 0, 10);
		write_file(p, b, n + 10);
		break;
	case D_EMPTY:
		write_file(p, b, 0);
		break;
	case D_GARBAGE:
		for (size_t i = 0; i < n; i++)
			b[i] = (uint8_t)(i * 7 + 3);
		write_file(p, b, n);
		break;
	case D_OTHER_MODEL: { /* the other model's block 2, copied under this model's name */
		struct kvi_engine *e = engine(F->m2, 16);
		struct kvx_opts xo;
		kvx_opts_default(&xo);
		xo.dir = dir;
		struct kvx *x = NULL;
		assert_int_equal(kvx_create(e, F->m2, &xo, &x), 0);
		struct out o2;
		out_init(&o2);
		generate(e, x, F->prompt, NPROMPT, NULL, &o2);
		kvx_destroy(x);
		kvi_engine_destroy(e);
		free(o2.logits);
		block_path(dir, F->m2, NULL, 2, q, sizeof(q));
		free(b);
		n = read_file(q, &b);
		write_file(p, b, n);
		break;
	}
	case D_OTHER_BLOCK: /* this model's block 3 under block 2's name */
		block_path(dir, F->m, NULL, 3, q, sizeof(q));
		free(b);
		n = read_file(q, &b);
		write_file(p, b, n);
		break;
	}
	free(b);
	run(dir, NULL, &o);
	assert_int_equal(o.cached, 2 * B);
	assert_like_ref(&o);
	const uint64_t *got[8] = {
	    &o.st.miss_corrupt,	  &o.st.miss_corrupt, &o.st.miss_truncated,   &o.st.miss_truncated,
	    &o.st.miss_truncated, &o.st.miss_corrupt, &o.st.miss_wrong_model, &o.st.miss_mismatch};
	assert_int_equal((int)*got[d], 1);
	assert_int_equal((int)(o.st.miss_absent + o.st.miss_corrupt + o.st.miss_truncated +
			       o.st.miss_wrong_model + o.st.miss_mismatch + o.st.miss_io),
			 1);
	/* the bad file is left alone (the cache's eviction owns it); a save skips it */
	assert_int_equal((int)o.st.saved_blocks, 0);
	free(o.logits);
}

static void test_corrupt_payload(void **st)
{
	(void)st;
	damaged(D_PAYLOAD);
}
static void test_corrupt_header(void **st)
{
	(void)st;
	damaged(D_HEADER);
}
static void test_truncated(void **st)
{
	(void)st;
	damaged(D_TRUNC);
}
static void test_too_long(void **st)
{
	(void)st;
	damaged(D_LONG);
}
static void test_empty(void **st)
{
	(void)st;
	damaged(D_EMPTY);
}
static void test_garbage(void **st)
{
	(void)st;
	damaged(D_GARBAGE);
}
static void test_wrong_model(void **st)
{
	(void)st;
	damaged(D_OTHER_MODEL);
}
static void test_wrong_block(void **st)
{
	(void)st;
	damaged(D_OTHER_BLOCK);
}

/* Tenants: salts share no block; each tenant hits only its own; a miss on another tenant's
 * prefix looks exactly like an absent block (same counter, same probes). */
static void test_salts(void **st)
{
	(void)st;
	char dir[600], other[600];
	new_dir(dir, sizeof(dir));
	new_dir(other, sizeof(other));
	struct out o, cold;
	out_init(&o);
	out_init(&cold);
	run(dir, "tenant-a", &o);
	assert_int_equal((int)o.st.saved_blocks, NFULL);
	run(dir, "tenant-b", &o);
	assert_int_equal(o.cached, 0);
	assert_int_equal((int)o.st.miss_absent, 1);
	assert_int_equal((int)o.st.saved_blocks, NFULL);
	assert_like_ref(&o);
	run(other, "tenant-b", &cold); /* truly empty cache: the same observable miss */
	assert_int_equal((int)cold.st.probes, (int)o.st.probes);
	assert_int_equal((int)cold.st.miss_absent, 1);
	run(dir, NULL, &o);
	assert_int_equal(o.cached, 0);
	assert_int_equal(count_files(dir, ".kvb"), 3 * NFULL);
	run(dir, "tenant-a", &o);
	assert_int_equal(o.cached, ((NPROMPT - 1) / B) * B);
	assert_like_ref(&o);
	free(o.logits);
	free(cold.logits);
}

struct racer {
	const char *dir;
	pthread_barrier_t *bar;
	struct out o;
};

static void *race_main(void *arg)
{
	struct racer *r = arg;
	struct kvi_engine *e = NULL;
	struct kvi_engine_opts eo;
	kvi_engine_opts_default(&eo);
	eo.threads = 1;
	eo.max_batch_tokens = 8;
	eo.block_tokens = B;
	eo.max_ctx = 256;
	eo.kv_blocks = 32;
	if (kvi_engine_create(F->m, &eo, &e))
		return NULL;
	struct kvx_opts xo;
	kvx_opts_default(&xo);
	xo.dir = r->dir;
	struct kvx *x = NULL;
	if (kvx_create(e, F->m, &xo, &x)) {
		kvi_engine_destroy(e);
		return NULL;
	}
	pthread_barrier_wait(r->bar);
	/* cmocka asserts are not for threads: report through r->o and check in the test */
	struct kvi_seq *s;
	int V = F->cfg.n_vocab;
	kvi_seq_create(kvi_engine_kv(e), &s);
	kvx_load_prefix(x, s, F->prompt, NPROMPT, NULL, &r->o.cached);
	if (kvi_engine_prefill(e, s, F->prompt + r->o.cached, NPROMPT - r->o.cached, r->o.logits) ==
	    0) {
		kvx_save(x, s, F->prompt, NPROMPT, NULL);
		float *l = malloc((size_t)V * sizeof(float));
		memcpy(l, r->o.logits, (size_t)V * sizeof(float));
		for (int i = 0; i < NGEN; i++) {
			r->o.tokens[i] = ref_argmax(l, V);
			if (i + 1 < NGEN)
				kvi_engine_decode(e, &s, &r->o.tokens[i], 1, l);
		}
		free(l);
	}
	kvx_flush(x);
	kvx_stats_get(x, &r->o.st);
	kvi_seq_destroy(s);
	kvx_destroy(x);
	kvi_engine_destroy(e);
	return NULL;
}

/* Two engines on the same prompt at the same time: both right, the cache holds each block
 * exactly once, valid (a third run hits all of it). Run a few rounds to vary the interleaving. */
static void test_concurrent(void **st)
{
	(void)st;
	for (int round = 0; round < 3; round++) {
		char dir[600];
		new_dir(dir, sizeof(dir));
		pthread_barrier_t bar;
		pthread_barrier_init(&bar, NULL, 2);
		struct racer r[2];
		pthread_t t[2];
		for (int i = 0; i < 2; i++) {
			r[i].dir = dir;
			r[i].bar = &bar;
			out_init(&r[i].o);
			assert_int_equal(pthread_create(&t[i], NULL, race_main, &r[i]), 0);
		}
		for (int i = 0; i < 2; i++)
			pthread_join(t[i], NULL);
		pthread_barrier_destroy(&bar);
		for (int i = 0; i < 2; i++) {
			assert_like_ref(&r[i].o);
			assert_int_equal((int)r[i].o.st.save_errors, 0);
		}
		/* each block published once: by RENAME_NOREPLACE locally, O_EXCL on kvfs */
		assert_int_equal((int)(r[0].o.st.saved_blocks + r[1].o.st.saved_blocks), NFULL);
		assert_int_equal(count_files(dir, ".kvb"), NFULL);
		assert_int_equal(count_files(dir, ".tmp.*"), 0);
		struct out o;
		out_init(&o);
		run(dir, NULL, &o);
		assert_int_equal(o.cached, ((NPROMPT - 1) / B) * B);
		assert_like_ref(&o);
		for (int i = 0; i < 2; i++)
			free(r[i].o.logits);
		free(o.logits);
	}
}

/* One save slot: the rest of a save is dropped (counted), the caller never waits, and a
 * later save fills in what was dropped. */
static void test_drop_when_full(void **st)
{
	(void)st;
	char dir[600];
	new_dir(dir, sizeof(dir));
	struct kvi_engine *e = engine(F->m, 8);
	struct kvx_opts xo;
	kvx_opts_default(&xo);
	xo.dir = dir;
	xo.save_slots = 1;
	struct kvx *x = NULL;
	assert_int_equal(kvx_create(e, F->m, &xo, &x), 0);
	struct out o;
	out_init(&o);
	generate(e, x, F->prompt, NPROMPT, NULL, &o);
	assert_int_equal((int)o.st.dropped_saves, NFULL - 1);
	assert_int_equal((int)o.st.saved_blocks, 1);
	for (int i = 0; i < NFULL; i++)
		generate(e, x, F->prompt, NPROMPT, NULL, &o);
	assert_int_equal(count_files(dir, ".kvb"), NFULL);
	assert_like_ref(&o);
	kvx_destroy(x);
	kvi_engine_destroy(e);
	free(o.logits);
}

static void test_bad_args(void **st)
{
	(void)st;
	struct kvi_engine *e = engine(F->m, 8);
	struct kvx_opts xo;
	kvx_opts_default(&xo);
	struct kvx *x = NULL;
	assert_int_equal(kvx_create(e, F->m, &xo, &x), -EINVAL);
	xo.dir = "/nonexistent/kvx";
	assert_int_equal(kvx_create(e, F->m, &xo, &x), -ENOENT);
	char dir[600];
	new_dir(dir, sizeof(dir));
	xo.dir = dir;
	assert_int_equal(kvx_create(e, F->m, &xo, &x), 0);
	struct kvi_seq *s;
	assert_int_equal(kvi_seq_create(kvi_engine_kv(e), &s), 0);
	int c = -1;
	assert_int_equal(kvx_load_prefix(x, s, F->prompt, 0, NULL, &c), -EINVAL);
	assert_int_equal(kvi_engine_prefill(e, s, F->prompt, 3, NULL), 0);
	assert_int_equal(kvx_load_prefix(x, s, F->prompt, 40, NULL, &c), -EINVAL); /* not empty */
	assert_int_equal(kvx_save(x, s, F->prompt, 4, NULL), -EINVAL); /* past its length */
	kvi_seq_destroy(s);
	kvx_destroy(x);
	kvi_engine_destroy(e);
}

/* Runs a shell command; its stdout (up to cap bytes) into out. Returns the exit status. */
static int run_cmd(const char *cmd, char *out, size_t cap)
{
	FILE *p = popen(cmd, "r");
	if (!p)
		return -1;
	size_t n = fread(out, 1, cap - 1, p);
	out[n] = 0;
	int st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The CLI: `kvinfer generate --kv-dir` twice on a synthetic model: the second run loads the
 * prompt's blocks, prints the same tokens, and reports the cached tokens; another salt shares
 * nothing. Skipped when kvinfer or kvinfer-synth is not built. */
static void test_cli(void **st)
{
	(void)st;
	const char *b = tu_need_build_dir();
	char kvinfer[600], synth[600], dir[600], model[700], cmd[4096];
	snprintf(kvinfer, sizeof(kvinfer), "%s/bin/kvinfer", b);
	snprintf(synth, sizeof(synth), "%s/tools/kvinfer-synth", b);
	if (access(kvinfer, X_OK) || access(synth, X_OK))
		tu_no_build("kvinfer / kvinfer-synth");
	new_dir(dir, sizeof(dir));
	snprintf(model, sizeof(model), "%s/tiny.gguf", dir);
	snprintf(cmd, sizeof(cmd), "'%s' --preset tiny --type f16 -o '%s' >/dev/null 2>&1", synth,
		 model);
	static char out[3][16384];
	char mk[700];
	assert_int_equal(run_cmd(cmd, out[0], sizeof(out[0])), 0);
	snprintf(mk, sizeof(mk), "%s/cache", dir);
	assert_int_equal(mkdir(mk, 0755), 0);
	const char *salts[3] = {"", "", "--salt tenant-b"};
	int cached[3];
	for (int i = 0; i < 3; i++) {
		/* 300 tokens: 4 blocks of 64 before the last token; the report line at the end */
		snprintf(
		    cmd, sizeof(cmd),
		    "'%s' generate -m '%s' -t 1 -n 6 --kv-dir '%s' %s --tokens $(seq -s, 1 300) "
		    "2>'%s/err%d' && grep -o 'kv cache: [0-9]* cached' '%s/err%d'",
		    kvinfer, model, mk, salts[i], dir, i, dir, i);
		assert_int_equal(run_cmd(cmd, out[i], sizeof(out[i])), 0);
		char *k = strstr(out[i], "kv cache: ");
		assert_non_null(k);
		cached[i] = atoi(k + 10);
		*k = 0; /* keep the generated tokens before it */
	}
	assert_int_equal(cached[0], 0);
	assert_int_equal(cached[1], 4 * 64);
	assert_int_equal(cached[2], 0);
	assert_string_equal(out[0], out[1]);
	assert_string_equal(out[0], out[2]);
	assert_true(strlen(out[0]) >= 6);
}

static void fingerprint(struct kvi_model *m, uint8_t seed)
{
	for (int i = 0; i < 32; i++)
		m->fingerprint[i] = (uint8_t)(seed * 31 + i);
}

static int setup(void **st)
{
	(void)st;
	F->cfg = ref_cfg_tiny_llama(211);
	F->m = ref_model_random(&F->cfg, KVI_F16, 7);
	F->m2 = ref_model_random(&F->cfg, KVI_F16, 8);
	if (!F->m || !F->m2)
		return -1;
	fingerprint(F->m, 1);
	fingerprint(F->m2, 2);
	ref_tokens(F->prompt, NPROMPT, F->cfg.n_vocab, 12345);
	/* the reference: no cache, a different chunk size, prompt in one piece */
	F->ref_logits = malloc((size_t)F->cfg.n_vocab * sizeof(float));
	struct kvi_engine *e = engine(F->m, 64);
	struct out o;
	o.logits = F->ref_logits;
	generate(e, NULL, F->prompt, NPROMPT, NULL, &o);
	memcpy(F->ref_tokens, o.tokens, sizeof(o.tokens));
	kvi_engine_destroy(e);
	return 0;
}

static int teardown(void **st)
{
	(void)st;
	ref_model_free(F->m);
	ref_model_free(F->m2);
	free(F->ref_logits);
	return 0;
}

int kvx_mount_start(char *root, size_t cap);
void kvx_mount_stop(void);

static int g_on_mount;

/* kvx publishes by close only on kvfs, known by what kvfs says of itself (.kvfs/cluster at the
 * mount's root), not by the FUSE magic number every FUSE file system shares (on sshfs that
 * skipped the temporary name and rename, so readers could see half a block). A local
 * directory holding a .kvfs/cluster of its own is still local. */
static void test_publish_mode(void **st)
{
	(void)st;
	if (g_on_mount) {
		assert_int_equal(kvx_dir_on_kvfs(F->root), 1);
		return;
	}
	assert_int_equal(kvx_dir_on_kvfs(F->root), 0);
	char d[700];
	snprintf(d, sizeof(d), "%s/.kvfs", F->root);
	assert_int_equal(mkdir(d, 0755), 0);
	snprintf(d, sizeof(d), "%s/.kvfs/cluster", F->root);
	FILE *f = fopen(d, "w");
	assert_non_null(f);
	fclose(f);
	assert_int_equal(kvx_dir_on_kvfs(F->root), 0);
	unlink(d);
	snprintf(d, sizeof(d), "%s/.kvfs", F->root);
	rmdir(d);
}

int main(int argc, char **argv)
{
	static struct fix fix;
	F = &fix;
	int mount = argc > 1 && strcmp(argv[1], "--mount") == 0;
	g_on_mount = mount;
	if (mount) {
		int r = kvx_mount_start(fix.root, sizeof(fix.root));
		if (r == 77)
			return 77;
		if (r) {
			fprintf(stderr, "test_kvx --mount: could not start a kvfs mount\n");
			return 1;
		}
	} else {
		snprintf(fix.root, sizeof(fix.root), "/tmp/test_kvx.XXXXXX");
		if (!mkdtemp(fix.root))
			return 1;
	}
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_hit_partial_none),
	    cmocka_unit_test(test_boundaries),
	    cmocka_unit_test(test_corrupt_payload),
	    cmocka_unit_test(test_corrupt_header),
	    cmocka_unit_test(test_truncated),
	    cmocka_unit_test(test_too_long),
	    cmocka_unit_test(test_empty),
	    cmocka_unit_test(test_garbage),
	    cmocka_unit_test(test_wrong_model),
	    cmocka_unit_test(test_wrong_block),
	    cmocka_unit_test(test_salts),
	    cmocka_unit_test(test_concurrent),
	    cmocka_unit_test(test_drop_when_full),
	    cmocka_unit_test(test_bad_args),
	    cmocka_unit_test(test_cli),
	    cmocka_unit_test(test_publish_mode),
	};
	int r = cmocka_run_group_tests_name(mount ? "kvx on a kvfs mount" : "kvx on a local dir",
					    tests, setup, teardown);
	if (mount) {
		kvx_mount_stop();
	} else if (!getenv("KVFS_TEST_KEEP")) {
		char cmd[600];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", fix.root);
		if (system(cmd) != 0)
			fprintf(stderr, "could not remove %s\n", fix.root);
	}
	return r;
}
