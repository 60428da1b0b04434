/* lb_group — the choices of one prompt in the disaggregated gateway (lb_int.h struct lgroup):
 * one PREFILL computes the prompt for all of them, each choice then DECODEs on its own. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "lb_int.h"

void lb_grp_put(struct lgroup *g)
{
	if (!g || atomic_fetch_sub(&g->refs, 1) != 1)
		return;
	free(g->toks);
	free(g->blk);
	free(g->lps);
	pthread_mutex_destroy(&g->mu);
	pthread_cond_destroy(&g->cv);
	free(g);
}

void lb_grp_publish(struct lgroup *g, int rc, const struct pf_result *pr)
{
	if (!g)
		return;
	pthread_mutex_lock(&g->mu);
	if (!g->done && !rc) {
		g->toks = malloc((size_t)pr->n * sizeof(int32_t));
		g->blk = pr->blen ? malloc(pr->blen) : NULL;
		if (pr->lps)
			g->lps = malloc((size_t)g->n * sizeof(*g->lps));
		if (!g->toks || (pr->blen && !g->blk) || (pr->lps && !g->lps) ||
		    pr->nx != g->n - 1) /* a worker that did not answer every choice */
			rc = pr->nx != g->n - 1 ? -EIO : -ENOMEM;
		else {
			memcpy(g->toks, pr->toks, (size_t)pr->n * sizeof(int32_t));
			if (pr->blen)
				memcpy(g->blk, pr->blk, pr->blen);
			if (pr->lps)
				memcpy(g->lps, pr->lps, (size_t)g->n * sizeof(*g->lps));
			g->ntoks = pr->n;
			g->cached = pr->cached;
			g->blen = pr->blen;
			g->first[0] = pr->first;
			memcpy(g->first + 1, pr->xfirst, (size_t)pr->nx * sizeof(int32_t));
		}
	}
	if (!g->done) {
		g->done = 1;
		g->rc = rc;
		pthread_cond_broadcast(&g->cv);
	}
	pthread_mutex_unlock(&g->mu);
}

void lb_grp_wake(struct lreq *q)
{
	if (!q->grp)
		return;
	pthread_mutex_lock(&q->grp->mu);
	pthread_cond_broadcast(&q->grp->cv);
	pthread_mutex_unlock(&q->grp->mu);
}

int lb_grp_join(struct lreq *q, const struct gw_req *g)
{
	if (g->n_forks > 0 && g->n_forks < KVW_MAX_CHOICES) {
		struct lgroup *grp = calloc(1, sizeof(*grp));
		if (!grp)
			return -ENOMEM;
		atomic_init(&grp->refs, 1);
		pthread_mutex_init(&grp->mu, NULL);
		pthread_cond_init(&grp->cv, NULL);
		grp->n = g->n_forks + 1;
		for (int k = 0; k < grp->n; k++)
			grp->seeds[k] = q->sp.seed + (uint64_t)k * 0x9E3779B97F4A7C15ULL;
		q->grp = grp;
		return 0;
	}
	struct lreq *f = g->first ? gw_job_backend_data(g->first) : NULL;
	int k = f && f->grp ? g->index - f->index : 0;
	if (k <= 0 || k >= f->grp->n)
		return 0; /* not a choice of a group: a request of its own */
	atomic_fetch_add(&f->grp->refs, 1);
	q->grp = f->grp;
	q->choice = k;
	q->sp.seed = f->grp->seeds[k]; /* the seed its first token was drawn with */
	return 0;
}
