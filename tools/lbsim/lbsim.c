/* lbsim — the event loop, the simulated replicas and the measures (lbsim.h). */
#include "lbsim.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void lbsim_cfg_defaults(struct lbsim_cfg *c)
{
	*c = (struct lbsim_cfg){.prefill = 64,
				.decode = 64,
				.pf_policy = LB_PREFIX,
				.dc_policy = LB_PREFIX,
				.pf_tps = 8000,
				.kvfs_tps = 80000,
				.pf_overhead_ms = 5,
				.local_blocks = 16384,
				.status_ms = 200,
				.handoff_ms = 5,
				.kv_blocks = 8192,
				.max_batch = 256,
				.step_base_ms = 20,
				.step_seq_ms = 0.1,
				.window_s = 10};
}

/* ---- a set of block hashes (the shared kvfs cache, the oracle): open addressing ---- */

struct hset {
	uint64_t *k; /* 0 = empty; a hash of 0 is stored as 1 */
	size_t mask, n;
};

static int hset_grow(struct hset *h)
{
	size_t cap = h->k ? (h->mask + 1) * 2 : 1 << 16;
	uint64_t *k = calloc(cap, sizeof(*k));
	if (!k)
		return -ENOMEM;
	for (size_t i = 0; h->k && i <= h->mask; i++) {
		if (!h->k[i])
			continue;
		size_t s = lbp_mix64(h->k[i]) & (cap - 1);
		while (k[s])
			s = (s + 1) & (cap - 1);
		k[s] = h->k[i];
	}
	free(h->k);
	h->k = k;
	h->mask = cap - 1;
	return 0;
}

static int hset_has(const struct hset *h, uint64_t v)
{
	v += !v;
	for (size_t s = lbp_mix64(v) & h->mask; h->k[s]; s = (s + 1) & h->mask)
		if (h->k[s] == v)
			return 1;
	return 0;
}

static int hset_add(struct hset *h, uint64_t v)
{
	if (!h->k || (h->n + 1) * 2 > h->mask + 1) {
		int rc = hset_grow(h);
		if (rc)
			return rc;
	}
	v += !v;
	size_t s = lbp_mix64(v) & h->mask;
	for (; h->k[s]; s = (s + 1) & h->mask)
		if (h->k[s] == v)
			return 0;
	h->k[s] = v;
	h->n++;
	return 0;
}

/* ---- a replica's local cache: LRU of block hashes ---- */

struct lru {
	uint64_t *key;
	uint32_t *prev, *next; /* list of nodes, most recent at head; UINT32_MAX = none */
	uint32_t *slot;	       /* hash table of node + 1; 0 = empty */
	uint32_t cap, n, head, tail, mask;
};

#define NIL UINT32_MAX

static int lru_init(struct lru *l, uint32_t cap)
{
	memset(l, 0, sizeof(*l));
	uint32_t ts = 16;
	while (ts < cap * 2)
		ts *= 2;
	l->key = malloc(cap * sizeof(*l->key));
	l->prev = malloc(cap * sizeof(*l->prev));
	l->next = malloc(cap * sizeof(*l->next));
	l->slot = calloc(ts, sizeof(*l->slot));
	if (!l->key || !l->prev || !l->next || !l->slot)
		return -ENOMEM;
	l->cap = cap;
	l->mask = ts - 1;
	l->head = l->tail = NIL;
	return 0;
}

static void lru_free(struct lru *l)
{
	free(l->key);
	free(l->prev);
	free(l->next);
	free(l->slot);
}

static uint32_t lru_find_slot(const struct lru *l, uint64_t k)
{
	uint32_t s = (uint32_t)lbp_mix64(k) & l->mask;
	while (l->slot[s] && l->key[l->slot[s] - 1] != k)
		s = (s + 1) & l->mask;
	return s;
}

static void lru_unlink(struct lru *l, uint32_t i)
{
	if (l->prev[i] != NIL)
		l->next[l->prev[i]] = l->next[i];
	else
		l->head = l->next[i];
	if (l->next[i] != NIL)
		l->prev[l->next[i]] = l->prev[i];
	else
		l->tail = l->prev[i];
}

static void lru_push_head(struct lru *l, uint32_t i)
{
	l->prev[i] = NIL;
	l->next[i] = l->head;
	if (l->head != NIL)
		l->prev[l->head] = i;
	l->head = i;
	if (l->tail == NIL)
		l->tail = i;
}

/* Linear-probing deletion: shift later entries of the cluster back into the hole. */
static void lru_slot_del(struct lru *l, uint32_t s)
{
	uint32_t j = s;
	l->slot[s] = 0;
	for (;;) {
		j = (j + 1) & l->mask;
		if (!l->slot[j])
			return;
		uint32_t home = (uint32_t)lbp_mix64(l->key[l->slot[j] - 1]) & l->mask;
		/* move it when its home is not cyclically in (s, j] */
		if ((j > s && (home <= s || home > j)) || (j < s && (home <= s && home > j))) {
			l->slot[s] = l->slot[j];
			l->slot[j] = 0;
			s = j;
		}
	}
}

/* 1 when present (and made most recent). */
static int lru_touch(struct lru *l, uint64_t k)
{
	uint32_t s = lru_find_slot(l, k);
	if (!l->slot[s])
		return 0;
	uint32_t i = l->slot[s] - 1;
	lru_unlink(l, i);
	lru_push_head(l, i);
	return 1;
}

static void lru_put(struct lru *l, uint64_t k)
{
	if (lru_touch(l, k) || !l->cap)
		return;
	uint32_t i;
	if (l->n < l->cap) {
		i = l->n++;
	} else {
		i = l->tail;
		lru_unlink(l, i);
		lru_slot_del(l, lru_find_slot(l, l->key[i]));
	}
	l->key[i] = k;
	l->slot[lru_find_slot(l, k)] = i + 1;
	lru_push_head(l, i);
}

/* ---- events ---- */

enum ev_type { EV_ARRIVE, EV_PF_DONE, EV_DC_ARRIVE, EV_DC_STEP, EV_STATUS, EV_WINDOW };

struct ev {
	double t;
	uint64_t seq;
	int type, idx;
};

struct heap {
	struct ev *e;
	size_t n, cap;
	uint64_t seq;
};

static int ev_less(const struct ev *a, const struct ev *b)
{
	return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static int heap_push(struct heap *h, double t, int type, int idx)
{
	if (h->n == h->cap) {
		size_t cap = h->cap ? h->cap * 2 : 1024;
		void *p = realloc(h->e, cap * sizeof(*h->e));
		if (!p)
			return -ENOMEM;
		h->e = p;
		h->cap = cap;
	}
	size_t i = h->n++;
	struct ev v = {t, h->seq++, type, idx};
	while (i && ev_less(&v, &h->e[(i - 1) / 2])) {
		h->e[i] = h->e[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	h->e[i] = v;
	return 0;
}

static struct ev heap_pop(struct heap *h)
{
	struct ev top = h->e[0], last = h->e[--h->n];
	size_t i = 0;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= h->n)
			break;
		if (c + 1 < h->n && ev_less(&h->e[c + 1], &h->e[c]))
			c++;
		if (!ev_less(&h->e[c], &last))
			break;
		h->e[i] = h->e[c];
		i = c;
	}
	if (h->n)
		h->e[i] = last;
	return top;
}

/* ---- replicas ---- */

struct rstate { /* per request */
	double t_pf_start, t_pf_done, t_admit, t_done;
	int pf, dc, est_uncached, kv_need, left;
	int next; /* FIFO link in a replica's queue */
};

struct pfrep {
	struct lru cache;
	int head, tail; /* queue of requests, -1 = empty */
	int running;	/* request, -1 = idle */
	long queued_tok;
	double busy_since, busy_win, idle_since;
};

struct dcrep {
	int *act; /* active requests */
	int nact, kv_used;
	int head, tail;
	int stepping;
	double step_t0, seq_win, step_len;
};

struct sim {
	const struct lbsim_cfg *c;
	const struct lbsim_trace *t;
	struct rstate *rs;
	struct pfrep *pf;
	struct dcrep *dc;
	struct lbp_load *pfl, *dcl;
	struct lbp_set pfs, dcs;
	struct lbp_index ix;
	struct hset kvfs, oracle;
	struct heap h;
	int oq_head, oq_tail; /* oracle: one central prefill queue */
	double now, win_start, last_arrival;
	size_t done, arrived;
	double in_tok, hit_local_tok, hit_kvfs_tok, oracle_tok, out_tok, itl_sum;
	double pf_bal_sum, dc_bal_sum;
	int pf_bal_n, dc_bal_n;
	double *ttft;
	uint64_t *blkbuf;
};

static void q_push(struct sim *s, int *head, int *tail, int r)
{
	s->rs[r].next = -1;
	if (*tail >= 0)
		s->rs[*tail].next = r;
	else
		*head = r;
	*tail = r;
}

static int q_pop(struct sim *s, int *head, int *tail)
{
	int r = *head;
	if (r >= 0) {
		*head = s->rs[r].next;
		if (*head < 0)
			*tail = -1;
	}
	return r;
}

static struct lbp_req req_view(const struct sim *s, int r)
{
	const struct lbsim_req *q = &s->t->r[r];
	return (struct lbp_req){.key = q->key,
				.est_tokens = q->ptok,
				.kv_blocks =
				    (q->ptok + q->otok + LB_BLOCK_TOKENS - 1) / LB_BLOCK_TOKENS,
				.block = s->t->blocks + q->blk,
				.nblocks = q->nblk};
}

/* Leading blocks of r in replica p's local cache (touching them). */
static int local_run(struct sim *s, int p, int r, int touch)
{
	const struct lbsim_req *q = &s->t->r[r];
	const uint64_t *b = s->t->blocks + q->blk;
	int j = 0;
	if (touch) {
		while (j < q->nblk && lru_touch(&s->pf[p].cache, b[j]))
			j++;
	} else {
		while (j < q->nblk && s->pf[p].cache.slot[lru_find_slot(&s->pf[p].cache, b[j])])
			j++;
	}
	return j;
}

static int pf_start(struct sim *s, int p, int r)
{
	const struct lbsim_req *q = &s->t->r[r];
	const uint64_t *b = s->t->blocks + q->blk;
	int loc = local_run(s, p, r, 1), j = loc;
	while (j < q->nblk && hset_has(&s->kvfs, b[j]))
		j++;
	double tl = (double)loc * LB_BLOCK_TOKENS, tk = (double)(j - loc) * LB_BLOCK_TOKENS;
	double compute = q->ptok - tl - tk;
	s->in_tok += q->ptok;
	s->hit_local_tok += tl;
	s->hit_kvfs_tok += tk;
	double dur = s->c->pf_overhead_ms / 1000.0 + compute / s->c->pf_tps + tk / s->c->kvfs_tps;
	s->pf[p].running = r;
	s->pf[p].busy_since = s->now;
	s->rs[r].t_pf_start = s->now;
	s->rs[r].pf = p;
	return heap_push(&s->h, s->now + dur, EV_PF_DONE, p);
}

static void busy_add(struct sim *s, struct pfrep *p, double until)
{
	double from = p->busy_since > s->win_start ? p->busy_since : s->win_start;
	if (until > from)
		p->busy_win += until - from;
}

static int oracle_dispatch(struct sim *s)
{
	/* each idle replica takes the queue's head; among idle ones the head goes to the one
	 * holding the longest run of its blocks, ties to the one idle longest */
	while (s->oq_head >= 0) {
		int best = -1, bl = -1, r = s->oq_head;
		for (int p = 0; p < s->c->prefill; p++) {
			if (s->pf[p].running >= 0)
				continue;
			int l = local_run(s, p, r, 0);
			if (l > bl || (l == bl && s->pf[p].idle_since < s->pf[best].idle_since)) {
				bl = l;
				best = p;
			}
		}
		if (best < 0)
			return 0;
		q_pop(s, &s->oq_head, &s->oq_tail);
		int rc = pf_start(s, best, r);
		if (rc)
			return rc;
	}
	return 0;
}

static int on_arrive(struct sim *s, int r)
{
	const struct lbsim_req *q = &s->t->r[r];
	s->arrived++;
	const uint64_t *b = s->t->blocks + q->blk;
	int j = 0;
	while (j < q->nblk && hset_has(&s->oracle, b[j]))
		j++;
	s->oracle_tok += (double)j * LB_BLOCK_TOKENS;
	for (int k = 0; k < q->nblk; k++)
		if (hset_add(&s->oracle, b[k]))
			return -ENOMEM;
	if (s->c->oracle) {
		q_push(s, &s->oq_head, &s->oq_tail, r);
		return oracle_dispatch(s);
	}
	struct lbp_req v = req_view(s, r);
	int p = lbp_pick_prefill(s->c->pf_policy, &s->pfs, &v, &s->ix, NULL);
	if (p < 0)
		return -EIO;
	lbp_index_note(&s->ix, &v, p);
	s->pfl[p].inflight++;
	s->pfl[p].inflight_tokens += v.est_tokens;
	struct pfrep *pr = &s->pf[p];
	s->rs[r].pf = p;
	s->rs[r].est_uncached = q->ptok - local_run(s, p, r, 0) * LB_BLOCK_TOKENS;
	pr->queued_tok += s->rs[r].est_uncached;
	if (pr->running < 0)
		return pf_start(s, p, r);
	q_push(s, &pr->head, &pr->tail, r);
	return 0;
}

static int on_pf_done(struct sim *s, int p)
{
	struct pfrep *pr = &s->pf[p];
	int r = pr->running;
	const struct lbsim_req *q = &s->t->r[r];
	const uint64_t *b = s->t->blocks + q->blk;
	busy_add(s, pr, s->now);
	for (int j = 0; j < q->nblk; j++) {
		lru_put(&pr->cache, b[j]);
		if (hset_add(&s->kvfs, b[j]))
			return -ENOMEM;
	}
	s->rs[r].t_pf_done = s->now;
	if (!s->c->oracle) {
		pr->queued_tok -= s->rs[r].est_uncached;
		s->pfl[p].inflight--;
		s->pfl[p].inflight_tokens -= q->ptok;
	}
	int rc = heap_push(&s->h, s->now + s->c->handoff_ms / 1000.0, EV_DC_ARRIVE, r);
	pr->running = -1;
	pr->idle_since = s->now;
	if (rc)
		return rc;
	if (s->c->oracle)
		return oracle_dispatch(s);
	int nx = q_pop(s, &pr->head, &pr->tail);
	return nx >= 0 ? pf_start(s, p, nx) : 0;
}

static int dc_admit(struct sim *s, int d)
{
	struct dcrep *dr = &s->dc[d];
	while (dr->head >= 0 && dr->nact < s->c->max_batch) {
		int r = dr->head;
		int need = s->rs[r].kv_need;
		if (dr->kv_used + need > s->c->kv_blocks && dr->nact > 0)
			break;
		q_pop(s, &dr->head, &dr->tail);
		dr->kv_used += need;
		dr->act[dr->nact++] = r;
		s->rs[r].t_admit = s->now;
		s->rs[r].left = s->t->r[r].otok - 1; /* the prefill made the first token */
	}
	if (!dr->stepping && dr->nact > 0) {
		dr->stepping = 1;
		dr->step_t0 = s->now;
		dr->step_len = (s->c->step_base_ms + s->c->step_seq_ms * dr->nact) / 1000.0;
		return heap_push(&s->h, s->now + dr->step_len, EV_DC_STEP, d);
	}
	return 0;
}

static int on_dc_arrive(struct sim *s, int r)
{
	struct lbp_req v = req_view(s, r);
	int d = lbp_pick_decode(s->c->oracle ? LB_PREFIX : s->c->dc_policy, &s->dcs, &v, NULL);
	if (d < 0)
		return -EIO;
	s->dcl[d].inflight++;
	if (s->c->oracle) /* the oracle sees free KV as it is, not as last reported */
		s->dcl[d].kv_free -= v.kv_blocks;
	s->rs[r].dc = d;
	s->rs[r].kv_need = v.kv_blocks;
	double ttft = s->rs[r].t_pf_done + s->c->handoff_ms / 1000.0 - s->t->r[r].t;
	s->ttft[r] = ttft;
	q_push(s, &s->dc[d].head, &s->dc[d].tail, r);
	if (s->c->decisions)
		fprintf(s->c->decisions, "%d %d %d\n", r, s->rs[r].pf, d);
	return dc_admit(s, d);
}

static int on_dc_step(struct sim *s, int d)
{
	struct dcrep *dr = &s->dc[d];
	double from = dr->step_t0 > s->win_start ? dr->step_t0 : s->win_start;
	dr->seq_win += (s->now - from) * dr->nact;
	s->out_tok += dr->nact;
	for (int i = 0; i < dr->nact;) {
		int r = dr->act[i];
		if (--s->rs[r].left > 0) {
			i++;
			continue;
		}
		s->rs[r].t_done = s->now;
		int ot = s->t->r[r].otok;
		s->itl_sum += ot > 1 ? (s->now - s->rs[r].t_admit) / (ot - 1) : 0;
		dr->kv_used -= s->rs[r].kv_need;
		s->dcl[d].inflight--;
		if (s->c->oracle)
			s->dcl[d].kv_free += s->rs[r].kv_need;
		dr->act[i] = dr->act[--dr->nact];
		s->done++;
	}
	dr->stepping = 0;
	return dc_admit(s, d);
}

static void on_status(struct sim *s)
{
	for (int p = 0; p < s->c->prefill; p++)
		s->pfl[p].queued_tokens = (int)s->pf[p].queued_tok;
	if (s->c->oracle)
		return;
	for (int d = 0; d < s->c->decode; d++)
		s->dcl[d].kv_free = s->c->kv_blocks - s->dc[d].kv_used;
}

static double balance(const double *v, int n)
{
	double sum = 0, max = 0;
	for (int i = 0; i < n; i++) {
		sum += v[i];
		if (v[i] > max)
			max = v[i];
	}
	return max > 0 ? sum / n / max : -1;
}

static int on_window(struct sim *s, double *tmp)
{
	int np = s->c->prefill, nd = s->c->decode;
	double len = s->now > s->win_start ? s->now - s->win_start : s->c->window_s;
	for (int p = 0; p < np; p++) {
		if (s->pf[p].running >= 0)
			busy_add(s, &s->pf[p], s->now);
		tmp[p] = s->pf[p].busy_win;
	}
	double bp = balance(tmp, np);
	double pmin = tmp[0], pmax = tmp[0], psum = 0;
	for (int p = 0; p < np; p++) {
		psum += tmp[p];
		pmin = tmp[p] < pmin ? tmp[p] : pmin;
		pmax = tmp[p] > pmax ? tmp[p] : pmax;
		s->pf[p].busy_win = 0;
	}
	for (int d = 0; d < nd; d++) {
		struct dcrep *dr = &s->dc[d];
		if (dr->stepping) {
			double from = dr->step_t0 > s->win_start ? dr->step_t0 : s->win_start;
			dr->seq_win += (s->now - from) * dr->nact;
		}
		tmp[d] = dr->seq_win / len;
		dr->seq_win = 0;
	}
	double bd = balance(tmp, nd);
	double dmin = tmp[0], dmax = tmp[0], dsum = 0;
	for (int d = 0; d < nd; d++) {
		dsum += tmp[d];
		dmin = tmp[d] < dmin ? tmp[d] : dmin;
		dmax = tmp[d] > dmax ? tmp[d] : dmax;
	}
	/* only windows while requests still arrive: the ramp-down measures the trace's end */
	if (s->now <= s->last_arrival) {
		if (bp >= 0) {
			s->pf_bal_sum += bp;
			s->pf_bal_n++;
		}
		if (bd >= 0) {
			s->dc_bal_sum += bd;
			s->dc_bal_n++;
		}
	}
	if (s->c->series)
		fprintf(s->c->series, "%.1f %.4f %.4f %.4f %.2f %.2f %.2f\n", s->now, pmin / len,
			psum / np / len, pmax / len, dmin, dsum / nd, dmax);
	s->win_start = s->now;
	return 0;
}

/* The next tick of a periodic event: period after now, or, while nothing is in flight, the
 * next arrival (a trace may pause for days; ticking through the pause measures nothing). */
static double next_tick(const struct sim *s, double period)
{
	double next = s->now + period;
	if (s->done == s->arrived && s->arrived < s->t->n && s->t->r[s->arrived].t > next)
		next = s->t->r[s->arrived].t;
	return next;
}

/* Nearest-rank percentile: the smallest value with at least p of the values at or below. */
static size_t pct_index(size_t n, double p)
{
	size_t k = (size_t)ceil(p * (double)n);
	return k ? k - 1 : 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void sim_free(struct sim *s)
{
	for (int p = 0; s->pf && p < s->c->prefill; p++)
		lru_free(&s->pf[p].cache);
	for (int d = 0; s->dc && d < s->c->decode; d++)
		free(s->dc[d].act);
	free(s->pf);
	free(s->dc);
	free(s->pfl);
	free(s->dcl);
	free(s->rs);
	free(s->ttft);
	free(s->kvfs.k);
	free(s->oracle.k);
	free(s->h.e);
	lbp_index_free(&s->ix);
}

static int sim_init(struct sim *s, const struct lbsim_cfg *c, const struct lbsim_trace *t)
{
	memset(s, 0, sizeof(*s));
	s->c = c;
	s->t = t;
	s->oq_head = s->oq_tail = -1;
	int np = c->prefill, nd = c->decode;
	s->pf = calloc((size_t)np, sizeof(*s->pf));
	s->dc = calloc((size_t)nd, sizeof(*s->dc));
	s->pfl = calloc((size_t)np, sizeof(*s->pfl));
	s->dcl = calloc((size_t)nd, sizeof(*s->dcl));
	s->rs = calloc(t->n, sizeof(*s->rs));
	s->ttft = calloc(t->n, sizeof(*s->ttft));
	if (!s->pf || !s->dc || !s->pfl || !s->dcl || !s->rs || !s->ttft)
		return -ENOMEM;
	if (hset_grow(&s->kvfs) || hset_grow(&s->oracle))
		return -ENOMEM;
	int rc = lbp_index_init(&s->ix, 22);
	if (rc)
		return rc;
	for (int p = 0; p < np; p++) {
		char name[32];
		snprintf(name, sizeof(name), "sim-prefill-%d", p);
		s->pfl[p] =
		    (struct lbp_load){.id = lbp_id(c->pf_addr ? c->pf_addr[p] : name), .up = 1};
		s->pf[p].head = s->pf[p].tail = s->pf[p].running = -1;
		if (lru_init(&s->pf[p].cache, (uint32_t)c->local_blocks))
			return -ENOMEM;
	}
	for (int d = 0; d < nd; d++) {
		char name[32];
		snprintf(name, sizeof(name), "sim-decode-%d", d);
		s->dcl[d] = (struct lbp_load){.id = lbp_id(name), .up = 1, .kv_free = c->kv_blocks};
		s->dc[d].head = s->dc[d].tail = -1;
		s->dc[d].act = malloc((size_t)c->max_batch * sizeof(int));
		if (!s->dc[d].act)
			return -ENOMEM;
	}
	s->pfs = (struct lbp_set){.r = s->pfl, .n = np};
	s->dcs = (struct lbp_set){.r = s->dcl, .n = nd};
	return 0;
}

int lbsim_run(const struct lbsim_cfg *c, const struct lbsim_trace *t, struct lbsim_report *out)
{
	if (c->prefill < 1 || c->decode < 1 || c->prefill > LBSIM_MAX || c->decode > LBSIM_MAX ||
	    t->n == 0 || t->n > INT32_MAX || c->pf_tps <= 0 || c->kvfs_tps <= 0 ||
	    c->max_batch < 1 || c->kv_blocks < 1 || c->window_s <= 0 || c->status_ms <= 0 ||
	    c->local_blocks < 0)
		return -EINVAL;
	struct sim s;
	int rc = sim_init(&s, c, t);
	double *tmp = malloc(sizeof(double) * LBSIM_MAX);
	if (!rc && !tmp)
		rc = -ENOMEM;
	s.last_arrival = t->r[t->n - 1].t;
	s.win_start = t->r[0].t;
	for (size_t i = 0; !rc && i < t->n; i++)
		rc = heap_push(&s.h, t->r[i].t, EV_ARRIVE, (int)i);
	if (!rc)
		rc = heap_push(&s.h, t->r[0].t, EV_STATUS, 0);
	if (!rc)
		rc = heap_push(&s.h, t->r[0].t + c->window_s, EV_WINDOW, 0);
	while (!rc && s.h.n) {
		struct ev e = heap_pop(&s.h);
		s.now = e.t;
		switch (e.type) {
		case EV_ARRIVE:
			rc = on_arrive(&s, e.idx);
			break;
		case EV_PF_DONE:
			rc = on_pf_done(&s, e.idx);
			break;
		case EV_DC_ARRIVE:
			rc = on_dc_arrive(&s, e.idx);
			break;
		case EV_DC_STEP:
			rc = on_dc_step(&s, e.idx);
			break;
		case EV_STATUS:
			on_status(&s);
			if (s.done < t->n)
				rc = heap_push(&s.h, next_tick(&s, c->status_ms / 1000.0),
					       EV_STATUS, 0);
			break;
		case EV_WINDOW:
			rc = on_window(&s, tmp);
			if (!rc && s.done < t->n)
				rc = heap_push(&s.h, next_tick(&s, c->window_s), EV_WINDOW, 0);
			break;
		}
	}
	if (!rc && s.done != t->n)
		rc = -EIO; /* a request never finished: a bug in the model */
	if (!rc) {
		double end = 0;
		for (size_t i = 0; i < t->n; i++)
			end = s.rs[i].t_done > end ? s.rs[i].t_done : end;
		qsort(s.ttft, t->n, sizeof(double), cmp_double);
		*out = (struct lbsim_report){
		    .requests = t->n,
		    .makespan_s = end - t->r[0].t,
		    .pf_balance = s.pf_bal_n ? s.pf_bal_sum / s.pf_bal_n : 1,
		    .dc_balance = s.dc_bal_n ? s.dc_bal_sum / s.dc_bal_n : 1,
		    .hit_local = s.hit_local_tok / s.in_tok,
		    .hit_total = (s.hit_local_tok + s.hit_kvfs_tok) / s.in_tok,
		    .hit_oracle = s.oracle_tok / s.in_tok,
		    .ttft_p50 = s.ttft[pct_index(t->n, 0.50)],
		    .ttft_p99 = s.ttft[pct_index(t->n, 0.99)],
		    .decode_tps = s.out_tok / (end - t->r[0].t),
		    .itl_mean_ms = 1000.0 * s.itl_sum / (double)t->n};
	}
	free(tmp);
	sim_free(&s);
	return rc;
}
