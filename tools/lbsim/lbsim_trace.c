/* lbsim traces: the generator of realistic request streams and the trace file format
 * (lbsim.h; docs/balancing.md "Trace"). */
#include "lbsim.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TRACE_MAX_BLOCKS 65536	   /* 4 M prompt tokens: far past any context window */
#define TRACE_MAX_TOKENS (1 << 24) /* either count; their sum stays an int */

void lbsim_trace_free(struct lbsim_trace *t)
{
	free(t->r);
	free(t->blocks);
	memset(t, 0, sizeof(*t));
}

int lbsim_trace_add(struct lbsim_trace *t, double t_s, int ptok, int otok, uint64_t key,
		    const uint64_t *blk, int nblk)
{
	if (ptok < 1 || otok < 1 || ptok > TRACE_MAX_TOKENS || otok > TRACE_MAX_TOKENS ||
	    nblk < 0 || (size_t)nblk * LB_BLOCK_TOKENS > (size_t)ptok)
		return -EINVAL;
	if (t->n == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 1024;
		void *p = realloc(t->r, cap * sizeof(*t->r));
		if (!p)
			return -ENOMEM;
		t->r = p;
		t->cap = cap;
	}
	if (t->nblocks + (size_t)nblk > UINT32_MAX)
		return -E2BIG;
	if (t->nblocks + (size_t)nblk > t->bcap) {
		size_t cap = t->bcap ? t->bcap : 4096;
		while (cap < t->nblocks + (size_t)nblk)
			cap *= 2;
		void *p = realloc(t->blocks, cap * sizeof(*t->blocks));
		if (!p)
			return -ENOMEM;
		t->blocks = p;
		t->bcap = cap;
	}
	if (nblk)
		memcpy(t->blocks + t->nblocks, blk, (size_t)nblk * sizeof(*blk));
	t->r[t->n++] = (struct lbsim_req){.t = t_s,
					  .ptok = ptok,
					  .otok = otok,
					  .key = key,
					  .blk = (uint32_t)t->nblocks,
					  .nblk = nblk};
	t->nblocks += (size_t)nblk;
	return 0;
}

/* ---- file format ---- */

int lbsim_trace_write(FILE *f, const struct lbsim_trace *t)
{
	fprintf(f, "# t_ms prompt_tokens output_tokens key block_hashes\n");
	for (size_t i = 0; i < t->n; i++) {
		const struct lbsim_req *r = &t->r[i];
		fprintf(f, "%.3f %d %d %" PRIx64 " ", r->t * 1000.0, r->ptok, r->otok, r->key);
		if (!r->nblk)
			fputc('-', f);
		for (int j = 0; j < r->nblk; j++)
			fprintf(f, "%s%" PRIx64, j ? "," : "", t->blocks[r->blk + j]);
		fputc('\n', f);
	}
	return ferror(f) ? -EIO : 0;
}

static int parse_line(char *s, struct lbsim_trace *t, uint64_t *blk)
{
	char *end;
	double ms = strtod(s, &end);
	if (end == s || !isfinite(ms) || ms < 0)
		return -EINVAL;
	s = end;
	long ptok = strtol(s, &end, 10);
	if (end == s || ptok < 1 || ptok > TRACE_MAX_TOKENS)
		return -EINVAL;
	s = end;
	long otok = strtol(s, &end, 10);
	if (end == s || otok < 1 || otok > TRACE_MAX_TOKENS)
		return -EINVAL;
	s = end;
	while (*s == ' ' || *s == '\t')
		s++;
	uint64_t key = strtoull(s, &end, 16);
	if (end == s)
		return -EINVAL;
	s = end;
	while (*s == ' ' || *s == '\t')
		s++;
	int n = 0;
	if (*s == '-') {
		s++;
	} else {
		for (;;) {
			if (n == TRACE_MAX_BLOCKS)
				return -E2BIG;
			blk[n++] = strtoull(s, &end, 16);
			if (end == s)
				return -EINVAL;
			s = end;
			if (*s != ',')
				break;
			s++;
		}
	}
	while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
		s++;
	if (*s)
		return -EINVAL;
	return lbsim_trace_add(t, ms / 1000.0, (int)ptok, (int)otok, key, blk, n);
}

int lbsim_trace_read(FILE *f, struct lbsim_trace *t)
{
	memset(t, 0, sizeof(*t));
	uint64_t *blk = malloc(TRACE_MAX_BLOCKS * sizeof(*blk));
	char *line = NULL;
	size_t cap = 0;
	long no = 0;
	int rc = blk ? 0 : -ENOMEM;
	double last = 0;
	while (!rc && getline(&line, &cap, f) >= 0) {
		no++;
		char *s = line;
		while (*s == ' ' || *s == '\t')
			s++;
		if (*s == '#' || *s == '\n' || !*s)
			continue;
		rc = parse_line(s, t, blk);
		if (!rc && t->r[t->n - 1].t < last)
			rc = -EDOM;
		if (rc)
			fprintf(stderr, "trace line %ld: %s\n", no,
				rc == -EDOM	? "timestamps must not go backwards"
				: rc == -E2BIG	? "too many block hashes"
				: rc == -ENOMEM ? "out of memory"
						: "want: t_ms prompt_tokens output_tokens key "
						  "hash,hash,... (hex; '-' for none; a prompt "
						  "holds at most prompt_tokens/64 full blocks)");
		else
			last = t->r[t->n - 1].t;
	}
	free(line);
	free(blk);
	if (rc)
		lbsim_trace_free(t);
	return rc;
}

/* ---- generator ---- */

void lbsim_gen_defaults(struct lbsim_gen *g)
{
	*g = (struct lbsim_gen){.seed = 1,
				.requests = 20000,
				.rate = 0, /* lb-sim derives it from the replicas' capacity */
				.burst = 2.0,
				.burst_s = 10.0,
				.systems = 64,
				.docs = 2000,
				.zipf = 1.0,
				.p_doc = 0.3,
				.p_chat = 0.4,
				.chats = 2000,
				.max_turns = 8,
				.out_median = 200,
				.out_max = 2048};
}

static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static double rng_u(uint64_t *s) /* (0, 1) */
{
	return ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
}

static double rng_exp(uint64_t *s, double mean)
{
	return -mean * log(rng_u(s));
}

static double rng_normal(uint64_t *s)
{
	return sqrt(-2.0 * log(rng_u(s))) * cos(6.283185307179586 * rng_u(s));
}

static int rng_lognormal(uint64_t *s, double median, double sigma, int lo, int hi)
{
	double v = median * exp(sigma * rng_normal(s));
	return v < lo ? lo : v > hi ? hi : (int)v;
}

/* Zipf over n items by inverse CDF. */
struct zipf {
	double *cdf;
	int n;
};

static int zipf_init(struct zipf *z, int n, double a)
{
	z->n = n;
	z->cdf = malloc((size_t)n * sizeof(double));
	if (!z->cdf)
		return -ENOMEM;
	double sum = 0;
	for (int i = 0; i < n; i++)
		z->cdf[i] = sum += pow(i + 1, -a);
	for (int i = 0; i < n; i++)
		z->cdf[i] /= sum;
	return 0;
}

static int zipf_draw(const struct zipf *z, uint64_t *s)
{
	double u = rng_u(s);
	int lo = 0, hi = z->n - 1;
	while (lo < hi) {
		int mid = (lo + hi) / 2;
		if (z->cdf[mid] < u)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* A prompt is a list of segments of token content; two prompts share a block exactly when
 * the same segments fill it at the same positions. */
struct seg {
	uint64_t id;
	int len;
};

#define MAX_SEGS 64

struct prompt {
	struct seg s[MAX_SEGS];
	int n, tokens;
};

static void add_seg(struct prompt *p, uint64_t id, int len)
{
	if (p->n < MAX_SEGS && len > 0) {
		p->s[p->n++] = (struct seg){id, len};
		p->tokens += len;
	}
}

static uint64_t mix3(uint64_t h, uint64_t a, uint64_t b)
{
	uint64_t s = h ^ (a * 0x9e3779b97f4a7c15ULL) ^ (b + 0x632be59bd9b4e019ULL);
	return rng_next(&s);
}

/* Chained block hashes of p's full blocks into out; returns the count. */
static int prompt_blocks(const struct prompt *p, uint64_t *out)
{
	int nb = p->tokens / LB_BLOCK_TOKENS, si = 0, soff = 0;
	uint64_t h = LBP_SEED;
	for (int b = 0; b < nb; b++) {
		int need = LB_BLOCK_TOKENS;
		uint64_t c = 0;
		while (need > 0) {
			int take = p->s[si].len - soff < need ? p->s[si].len - soff : need;
			c = mix3(c, p->s[si].id, ((uint64_t)soff << 32) | (uint64_t)take);
			need -= take;
			soff += take;
			if (soff == p->s[si].len) {
				si++;
				soff = 0;
			}
		}
		out[b] = h = mix3(h, c, (uint64_t)b);
	}
	return nb;
}

struct chat {
	struct prompt p;
	int turns, last_out;
};

enum { SEG_SYS = 1, SEG_DOC = 2, SEG_NEW = 3 };

static uint64_t seg_id(int kind, uint64_t n)
{
	return ((uint64_t)kind << 56) | n;
}

static int sys_len(int i) /* 128..1024 tokens, fixed per system prompt */
{
	uint64_t s = 0x5157u + (uint64_t)i;
	return 128 + (int)(rng_next(&s) % 897);
}

static int doc_len(int i) /* 512..4096 tokens, fixed per document */
{
	uint64_t s = 0xd0c5u + (uint64_t)i;
	return 512 + (int)(rng_next(&s) % 3585);
}

int lbsim_generate(const struct lbsim_gen *g, struct lbsim_trace *t)
{
	memset(t, 0, sizeof(*t));
	if (g->requests == 0 || g->rate <= 0 || g->systems < 1 || g->docs < 1 || g->chats < 1 ||
	    g->max_turns < 1 || g->burst < 1 || g->burst_s <= 0)
		return -EINVAL;
	struct zipf zs = {0}, zd = {0};
	struct chat *ch = calloc((size_t)g->chats, sizeof(*ch));
	uint64_t *blk = malloc(sizeof(uint64_t) * 4096);
	int rc = -ENOMEM;
	if (!ch || !blk || zipf_init(&zs, g->systems, g->zipf) || zipf_init(&zd, g->docs, g->zipf))
		goto out;
	uint64_t s = g->seed, fresh = 0;
	double now = 0, spell_end = rng_exp(&s, g->burst_s);
	int bursting = 0;
	/* calm and burst spells are equally long on average: the calm rate is set so the mean
	 * rate is g->rate */
	double calm = g->rate * 2.0 / (1.0 + g->burst);
	rc = 0;
	for (size_t i = 0; i < g->requests && !rc; i++) {
		now += rng_exp(&s, 1.0 / (calm * (bursting ? g->burst : 1.0)));
		while (now > spell_end) {
			bursting = !bursting;
			spell_end += rng_exp(&s, g->burst_s);
		}
		int out = rng_lognormal(&s, g->out_median, 0.8, 1, g->out_max);
		int user = rng_lognormal(&s, 80, 0.9, 8, 2000);
		double u = rng_u(&s);
		struct prompt p = {0};
		if (u < g->p_chat) {
			struct chat *c = &ch[rng_next(&s) % (uint64_t)g->chats];
			if (c->turns == 0 || c->turns >= g->max_turns ||
			    c->p.tokens + c->last_out + user > 32768 || c->p.n + 2 > MAX_SEGS) {
				memset(c, 0, sizeof(*c));
				int sy = zipf_draw(&zs, &s);
				add_seg(&c->p, seg_id(SEG_SYS, (uint64_t)sy), sys_len(sy));
			} else {
				/* the next turn: the whole conversation so far, then the answer */
				add_seg(&c->p, seg_id(SEG_NEW, ++fresh), c->last_out);
			}
			add_seg(&c->p, seg_id(SEG_NEW, ++fresh), user);
			c->turns++;
			c->last_out = out;
			p = c->p;
		} else {
			int sy = zipf_draw(&zs, &s);
			add_seg(&p, seg_id(SEG_SYS, (uint64_t)sy), sys_len(sy));
			if (u < g->p_chat + g->p_doc) {
				int d = zipf_draw(&zd, &s);
				add_seg(&p, seg_id(SEG_DOC, (uint64_t)d), doc_len(d));
			}
			add_seg(&p, seg_id(SEG_NEW, ++fresh), user);
		}
		int nb = prompt_blocks(&p, blk);
		uint64_t key = nb ? blk[nb - 1] ^ (uint64_t)p.tokens : seg_id(SEG_NEW, fresh);
		rc = lbsim_trace_add(t, now, p.tokens, out, key, blk, nb);
	}
out:
	free(zs.cdf);
	free(zd.cdf);
	free(ch);
	free(blk);
	if (rc)
		lbsim_trace_free(t);
	return rc;
}
