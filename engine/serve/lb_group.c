/* lb_group — the choices of one prompt in the disaggregated gateway (lb_int.h struct lgroup):
 * one PREFILL computes the prompt for all of them, one DECODE generates them all (forks of
 * one sequence on one decode worker), each choice's events relayed to its own request. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lb_int.h"

void lb_grp_put(struct lgroup *g)
{
	if (!g || atomic_fetch_sub(&g->refs, 1) != 1)
		return;
	for (int k = 0; k < KVW_MAX_CHOICES; k++)
		while (g->evq[k]) {
			struct lgev *e = g->evq[k];
			g->evq[k] = e->next;
			free(e);
		}
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
		for (int k = 0; k < KVW_MAX_CHOICES; k++)
			grp->evtail[k] = &grp->evq[k];
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

/* Queues e for its choice; g->mu held. */
static void push_locked(struct lgroup *g, struct lgev *e)
{
	int k = e->ev.choice;
	e->next = NULL;
	*g->evtail[k] = e;
	g->evtail[k] = &e->next;
	if (e->ev.kind == KVW_EV_FINISH)
		g->ended[k] = 1;
	pthread_cond_broadcast(&g->cv);
}

static struct lgev *finish_ev(int k, int err, const char *msg)
{
	struct lgev *e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	e->ev.kind = KVW_EV_FINISH;
	e->ev.choice = (uint8_t)k;
	e->ev.err = err;
	snprintf(e->ev.msg, sizeof(e->ev.msg), "%s", msg ? msg : "");
	return e;
}

int lb_grp_push(struct lgroup *g, const struct kvw_ev *ev)
{
	int k = ev->choice;
	if (k < 1 || k >= g->n)
		return 0; /* the worker answered a choice it was not asked for: ignored */
	uint32_t len = ev->kind == KVW_EV_TOKEN ? ev->len : 0;
	struct lgev *e = malloc(sizeof(*e) + len);
	int rc = 0;
	if (e) {
		e->ev = *ev;
		if (len)
			memcpy(e->text, ev->text, len);
		e->ev.text = NULL;
	} else {
		rc = -ENOMEM;
		e = finish_ev(k, -ENOMEM, "out of memory");
	}
	pthread_mutex_lock(&g->mu);
	if (e && !g->gone[k] && !g->ended[k]) {
		push_locked(g, e);
		e = NULL;
	}
	g->ended[k] |= rc != 0; /* its FINISH could not be queued: nothing more is */
	pthread_mutex_unlock(&g->mu);
	free(e);
	return rc;
}

void lb_grp_end(struct lgroup *g, int err, const char *msg)
{
	if (!g)
		return;
	pthread_mutex_lock(&g->mu);
	for (int k = 1; k < g->n; k++) {
		if (g->ended[k] || g->gone[k])
			continue;
		struct lgev *e = finish_ev(k, err, msg);
		if (e)
			push_locked(g, e);
		g->ended[k] = 1;
		pthread_cond_broadcast(&g->cv); /* without e, the choice sees ended */
	}
	pthread_mutex_unlock(&g->mu);
}

int lb_grp_live(struct lgroup *g)
{
	int n = 0;
	pthread_mutex_lock(&g->mu);
	for (int k = 1; k < g->n; k++)
		n += !g->ended[k] && !g->gone[k];
	pthread_mutex_unlock(&g->mu);
	return n;
}

int lb_grp_untold(struct lgroup *g, uint8_t *ks)
{
	int n = 0;
	pthread_mutex_lock(&g->mu);
	for (int k = 1; k < g->n; k++)
		if (g->gone[k] && !g->ended[k] && !g->told[k]) {
			g->told[k] = 1;
			ks[n++] = (uint8_t)k;
		}
	pthread_mutex_unlock(&g->mu);
	return n;
}

static int cancelled(struct lreq *q)
{
	pthread_mutex_lock(&q->mu);
	int c = q->cancelled;
	pthread_mutex_unlock(&q->mu);
	return c;
}

void lb_grp_follow(struct lreq *q)
{
	struct lgroup *g = q->grp;
	int k = q->choice, ntok = 0;
	for (;;) {
		pthread_mutex_lock(&g->mu);
		while (!g->evq[k] && !g->ended[k] && !cancelled(q))
			pthread_cond_wait(&g->cv, &g->mu);
		int c = cancelled(q);
		struct lgev *e = c ? NULL : g->evq[k];
		if (e) {
			g->evq[k] = e->next;
			if (!g->evq[k])
				g->evtail[k] = &g->evq[k];
		}
		if (!e) /* cancelled, or ended with no FINISH queued (out of memory) */
			g->gone[k] = 1;
		pthread_mutex_unlock(&g->mu);
		if (!e) {
			gw_job_finish(q->job, NULL, c ? -ECANCELED : -ENOMEM,
				      c ? "cancelled" : "out of memory");
			return;
		}
		if (e->ev.kind == KVW_EV_TOKEN) {
			/* the first token's logprob came with the PREFILL reply */
			const struct kvw_lp *lp = e->ev.lp.present ? &e->ev.lp
						  : ntok == 0	   ? q->first_lp
								   : NULL;
			if (lp && q->logprobs) {
				struct gw_logprob gl;
				kvw_lp_to(lp, &gl);
				gw_job_logprob(q->job, &gl);
			}
			gw_job_token(q->job, (const char *)e->text, e->ev.len);
			ntok++;
			free(e);
			continue;
		}
		int err = e->ev.err;
		gw_job_finish(q->job,
			      err ? NULL : (!strcmp(e->ev.reason, "length") ? "length" : "stop"),
			      err, err ? e->ev.msg : NULL);
		free(e);
		pthread_mutex_lock(&g->mu);
		g->gone[k] = 1;
		pthread_mutex_unlock(&g->mu);
		return;
	}
}

void lb_grp_leave(struct lreq *q)
{
	if (!q->grp || q->choice < 1)
		return;
	pthread_mutex_lock(&q->grp->mu);
	q->grp->gone[q->choice] = 1;
	pthread_mutex_unlock(&q->grp->mu);
}
