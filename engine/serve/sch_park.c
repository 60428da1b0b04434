/* sch — direct hand-over of a prompt's KV from a prefill to a decode worker (sch.h): the
 * prefill side's export, the decode side's parked prompts, and the NCCL calls that must run on
 * the scheduler thread (the engine's device context belongs to it). */
#define KVFS_LOG_TAG "sch"
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvk_dev.h"
#include "kvk_nccl.h"
#include "ktime.h"
#include "log.h"
#include "sch_int.h"

/* ---- calls on the scheduler thread ------------------------------------------------------- */

/* Runs fn(s, arg) on the scheduler thread at its next step and waits for it. -EAGAIN when the
 * scheduler is stopping (fn did not run). */
static int sch_call(struct sch *s, int (*fn)(struct sch *s, void *arg), void *arg)
{
	struct sch_call c = {.fn = fn, .arg = arg};
	pthread_mutex_lock(&s->mu);
	if (s->stop) {
		pthread_mutex_unlock(&s->mu);
		return -EAGAIN;
	}
	*s->calls_tail = &c;
	s->calls_tail = &c.next;
	pthread_cond_signal(&s->cv);
	while (!c.done)
		pthread_cond_wait(&s->call_cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
	return c.rc;
}

void sch_run_calls(struct sch *s)
{
	pthread_mutex_lock(&s->mu);
	struct sch_call *c = s->calls;
	s->calls = NULL;
	s->calls_tail = &s->calls;
	pthread_mutex_unlock(&s->mu);
	while (c) {
		struct sch_call *next = c->next; /* c is the caller's: gone once done is seen */
		int rc = c->fn(s, c->arg);
		pthread_mutex_lock(&s->mu);
		c->rc = rc;
		c->done = 1;
		pthread_cond_broadcast(&s->call_cv);
		pthread_mutex_unlock(&s->mu);
		c = next;
	}
}

void sch_fail_calls_locked(struct sch *s, int rc)
{
	for (struct sch_call *c = s->calls, *next; c; c = next) {
		next = c->next;
		c->rc = rc;
		c->done = 1;
	}
	s->calls = NULL;
	s->calls_tail = &s->calls;
	pthread_cond_broadcast(&s->call_cv);
}

/* ---- parked prompts (decode side) --------------------------------------------------------- */

static void parked_free(struct sch *s, struct sch_parked *p)
{
	for (int i = 0; i < p->nids; i++)
		kvi_kv_block_unref(eng_kv(s), p->ids[i]);
	free(p->ids);
	free(p->toks);
	free(p);
}

static void pend_free(struct sch_pend *p)
{
	free(p->toks);
	free(p->kv);
	free(p);
}

static int expired(const struct timespec *now, const struct timespec *t)
{
	return now->tv_sec > t->tv_sec || (now->tv_sec == t->tv_sec && now->tv_nsec >= t->tv_nsec);
}

/* *next = the earlier of *next and t (the first time: t). */
static void earliest(struct timespec *next, int first, const struct timespec *t)
{
	if (next && (first || expired(next, t)))
		*next = *t;
}

int sch_parked_expire(struct sch *s, int all, struct timespec *next)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	int left = 0;
	pthread_mutex_lock(&s->mu);
	for (struct sch_pend **pp = &s->pend; *pp;) {
		struct sch_pend *p = *pp;
		if (all || expired(&now, &p->expires)) {
			if (!all)
				klog_warn("handed-over prompt %016llx never claimed: dropped",
					  (unsigned long long)p->ticket);
			*pp = p->next;
			s->pend_bytes -= p->len;
			pend_free(p);
		} else {
			earliest(next, !left++, &p->expires);
			pp = &p->next;
		}
	}
	pthread_mutex_unlock(&s->mu);
	for (struct sch_parked **pp = &s->parked; *pp;) {
		struct sch_parked *p = *pp;
		if (all || expired(&now, &p->expires)) {
			if (!all)
				klog_warn("handed-over prompt %016llx never claimed: dropped",
					  (unsigned long long)p->ticket);
			*pp = p->next;
			parked_free(s, p);
		} else {
			earliest(next, !left++, &p->expires);
			pp = &p->next;
		}
	}
	return left;
}

/* r->seq (empty) gets the prompt's first k blocks: from the kv dir, the rest computed. */
static int claim_prefix(struct sch *s, struct sch_req *r, int k)
{
	int B = kvi_kv_geom(eng_kv(s))->block_tokens, got = 0, rc = 0;
	if (k == 0)
		return 0;
	/* k * B + 1 tokens: the load leaves at least one token, here the one after block k */
	if ((rc = sch_kvx_load(s, r, k * B + 1, &got)))
		return rc;
	if (got < k * B) {
		klog_warn(
		    "handed-over prompt %016llx: %d of its %d cached tokens not in the kv dir: "
		    "computing them",
		    (unsigned long long)r->ticket, k * B - got, k * B);
		rc = sch_eng_prefill_req(s, r, got, k * B - got, NULL);
	}
	return rc ? rc : kvi_seq_n_blocks(r->seq) >= k ? 0 : -EIO;
}

/* The pending bytes of ticket as a parked prompt in fresh blocks; NULL when there are none
 * (*rc: 0) or they cannot be (*rc: -errno). */
static struct sch_parked *pend_take(struct sch *s, uint64_t ticket, int *rc)
{
	*rc = 0;
	struct sch_pend *q = NULL;
	pthread_mutex_lock(&s->mu);
	for (struct sch_pend **pp = &s->pend; *pp; pp = &(*pp)->next)
		if ((*pp)->ticket == ticket) {
			q = *pp;
			*pp = q->next; /* a ticket is claimed once, whether it matches or not */
			s->pend_bytes -= q->len;
			break;
		}
	pthread_mutex_unlock(&s->mu);
	if (!q)
		return NULL;
	struct kvi_kv *kv = eng_kv(s);
	size_t bb = kvi_kv_block_bytes(kv);
	int nb = (int)(q->len / bb);
	struct sch_parked *p = calloc(1, sizeof(*p));
	if (!p || !(p->ids = calloc((size_t)nb, sizeof(int32_t))))
		*rc = -ENOMEM;
	while (!*rc && p->nids < nb) {
		int id = kvi_kv_block_alloc(kv);
		if (id < 0)
			*rc = id;
		else
			p->ids[p->nids++] = id;
	}
	for (int i = 0; i < nb && !*rc; i++)
		*rc = kvi_kv_block_import(kv, p->ids[i], (const uint8_t *)q->kv + i * bb, bb);
	if (*rc) {
		if (p)
			parked_free(s, p);
		pend_free(q);
		return NULL;
	}
	p->ticket = q->ticket;
	p->toks = q->toks;
	q->toks = NULL;
	p->n = q->n;
	p->first_block = q->first_block;
	pend_free(q);
	return p;
}

int sch_parked_claim(struct sch *s, struct sch_req *r)
{
	struct sch_parked *p = NULL;
	for (struct sch_parked **pp = &s->parked; *pp; pp = &(*pp)->next)
		if ((*pp)->ticket == r->ticket) {
			p = *pp;
			*pp = p->next; /* a ticket is claimed once, whether it matches or not */
			break;
		}
	int rc = 0;
	if (!p)
		p = pend_take(s, r->ticket, &rc);
	if (!p)
		return rc;
	if (p->n != r->n || memcmp(p->toks, r->toks, (size_t)r->n * sizeof(int32_t))) {
		klog_warn("handed-over prompt %016llx does not match its request: not used",
			  (unsigned long long)p->ticket);
		parked_free(s, p);
		return 0;
	}
	struct kvi_kv *kv = eng_kv(s);
	int k = p->first_block, nb = k + p->nids;
	int32_t *ids = malloc((size_t)nb * sizeof(int32_t));
	struct kvi_seq *full = NULL;
	rc = ids ? claim_prefix(s, r, k) : -ENOMEM;
	if (!rc)
		rc = kvi_seq_create(kv, &full);
	if (!rc) {
		if (k) /* an empty sequence has no block array */
			memcpy(ids, kvi_seq_blocks(r->seq), (size_t)k * sizeof(int32_t));
		memcpy(ids + k, p->ids, (size_t)p->nids * sizeof(int32_t));
		rc = kvi_seq_attach(full, ids, nb, r->n);
	}
	free(ids);
	parked_free(s, p);
	if (rc) {
		kvi_seq_destroy(full);
		return rc;
	}
	kvi_seq_destroy(r->seq);
	r->seq = full;
	return 1;
}

struct park_arg {
	uint64_t ticket;
	const int32_t *toks;
	int n, first_block;
	struct kvk_nccl *comm;
	int peer;
};

/* NCCL: the sender is already sending; every refusal here leaves it to its watchdog (wk.c),
 * which aborts its side when this reply is an error. */
static int park_on_thread(struct sch *s, void *arg)
{
	struct park_arg *a = arg;
	struct kvi_kv *kv = eng_kv(s);
	int B = kvi_kv_geom(kv)->block_tokens;
	/* at least the last block is sent: it holds the prompt's last token */
	int nb = (a->n + B - 1) / B - a->first_block;
	for (struct sch_parked *p = s->parked; p; p = p->next)
		if (p->ticket == a->ticket)
			return -EEXIST;
	if (a->first_block < 0 || nb < 1)
		return -EINVAL;
	struct sch_parked *p = calloc(1, sizeof(*p));
	int rc = p ? 0 : -ENOMEM;
	if (!rc && (!(p->ids = calloc((size_t)nb, sizeof(int32_t))) ||
		    !(p->toks = malloc((size_t)a->n * sizeof(int32_t)))))
		rc = -ENOMEM;
	while (!rc && p->nids < nb) {
		int id = kvi_kv_block_alloc(kv);
		if (id < 0)
			rc = id;
		else
			p->ids[p->nids++] = id;
	}
	if (!rc)
		rc = kvi_dev_engine_nccl_recv(s->de, a->comm, p->ids, nb, a->peer);
	if (rc) {
		if (p)
			parked_free(s, p);
		return rc;
	}
	p->first_block = a->first_block;
	memcpy(p->toks, a->toks, (size_t)a->n * sizeof(int32_t));
	p->n = a->n;
	p->ticket = a->ticket;
	kvfs_deadline(&p->expires, CLOCK_MONOTONIC, SCH_PARK_MS);
	p->next = s->parked;
	s->parked = p;
	return 0;
}

static int park_check(const struct sch *s, uint64_t ticket, const int32_t *toks, int n)
{
	if (!ticket || n < 1 || n > s->o.max_ctx || !toks)
		return -EINVAL;
	for (int i = 0; i < n; i++)
		if (toks[i] < 0 || toks[i] >= s->n_vocab)
			return -EINVAL;
	return 0;
}

int sch_park(struct sch *s, uint64_t ticket, const int32_t *toks, int n, int first_block,
	     const void *kv, size_t len)
{
	int rc = park_check(s, ticket, toks, n);
	if (rc || !kv)
		return rc ? rc : -EINVAL;
	int B = kvi_kv_geom(eng_kv(s))->block_tokens; /* immutable: no lock needed */
	int nb = (n + B - 1) / B - first_block;
	if (first_block < 0 || nb < 1 || len != (size_t)nb * kvi_kv_block_bytes(eng_kv(s)))
		return -EINVAL;
	struct sch_pend *q = calloc(1, sizeof(*q));
	if (!q || !(q->toks = malloc((size_t)n * sizeof(int32_t))) || !(q->kv = malloc(len))) {
		if (q)
			pend_free(q);
		return -ENOMEM;
	}
	memcpy(q->toks, toks, (size_t)n * sizeof(int32_t));
	memcpy(q->kv, kv, len);
	q->ticket = ticket;
	q->n = n;
	q->first_block = first_block;
	q->len = len;
	kvfs_deadline(&q->expires, CLOCK_MONOTONIC, SCH_PARK_MS);
	pthread_mutex_lock(&s->mu);
	rc = s->stop ? -EAGAIN : s->pend_bytes + len > SCH_PARK_MAX_BYTES ? -ENOSPC : 0;
	for (struct sch_pend *p = s->pend; p && !rc; p = p->next)
		if (p->ticket == ticket)
			rc = -EEXIST;
	if (!rc) {
		q->next = s->pend;
		s->pend = q;
		s->pend_bytes += len;
		pthread_cond_signal(&s->cv); /* an idle scheduler times its wait for the expiry */
	}
	pthread_mutex_unlock(&s->mu);
	if (rc)
		pend_free(q);
	return rc;
}

int sch_park_nccl(struct sch *s, uint64_t ticket, const int32_t *toks, int n, int first_block,
		  struct kvk_nccl *c, int peer)
{
	int rc = park_check(s, ticket, toks, n);
	if (rc || !c)
		return rc ? rc : -EINVAL;
	if (!sch_nccl_capable(s))
		return -ENODEV;
	struct park_arg a = {.ticket = ticket,
			     .toks = toks,
			     .n = n,
			     .first_block = first_block,
			     .comm = c,
			     .peer = peer};
	return sch_call(s, park_on_thread, &a);
}

/* ---- NCCL -------------------------------------------------------------------------------- */

int sch_nccl_capable(const struct sch *s)
{
	return s->de && s->o.device == KVK_DEV_CUDA && kvk_nccl_available();
}

struct join_arg {
	const uint8_t *id;
	int rank;
	struct kvk_nccl *out;
};

static int join_on_thread(struct sch *s, void *arg)
{
	struct join_arg *a = arg;
	return kvi_dev_engine_nccl_join(s->de, a->id, a->rank, &a->out);
}

int sch_nccl_join(struct sch *s, const uint8_t *id, int rank, struct kvk_nccl **out)
{
	*out = NULL;
	if (!sch_nccl_capable(s))
		return -ENODEV;
	struct join_arg a = {.id = id, .rank = rank};
	int rc = sch_call(s, join_on_thread, &a);
	if (!rc)
		*out = a.out;
	return rc;
}

static int leave_on_thread(struct sch *s, void *arg)
{
	(void)s;
	kvk_nccl_comm_destroy(arg);
	return 0;
}

void sch_nccl_leave(struct sch *s, struct kvk_nccl *c)
{
	if (!c)
		return;
	if (!s->joined && !sch_call(s, leave_on_thread, c))
		return;
	if (s->joined) /* the thread is gone: the engine's context is free to use here */
		kvk_nccl_comm_destroy(c);
	else
		klog_warn("NCCL communicator left while the scheduler stops: not destroyed");
}

int sch_nccl_send(struct sch *s, struct kvk_nccl *c, const struct sch_handoff *h, int peer)
{
	if (!sch_nccl_capable(s))
		return -ENODEV;
	return kvi_dev_engine_nccl_send(s->de, c, h->blocks, h->n_blocks, peer);
}

/* ---- the prefill side's hand-over --------------------------------------------------------- */

int sch_handoff_run(struct sch *s, struct sch_req *r, int32_t first)
{
	struct kvi_kv *kv = eng_kv(s);
	int B = kvi_kv_geom(kv)->block_tokens;
	/* the cached prefix came from the kv dir, which the decode worker shares */
	int k = r->skip_cached ? r->cached / B : 0;
	int nb = (r->n + B - 1) / B - k;
	size_t bb = kvi_kv_block_bytes(kv);
	if (k + nb > kvi_seq_n_blocks(r->seq) || nb < 1)
		return -EIO;
	const int32_t *ids = kvi_seq_blocks(r->seq) + k;
	struct sch_handoff h = {.toks = r->toks,
				.n = r->n,
				.cached = r->cached,
				.first = first,
				.first_block = k,
				.blocks = ids,
				.n_blocks = nb,
				.block_bytes = bb};
	uint8_t *buf = NULL;
	if (r->handoff == SCH_HANDOFF_BYTES) {
		if (!(buf = malloc((size_t)nb * bb)))
			return -ENOMEM;
		for (int i = 0; i < nb; i++) {
			long got = kvi_kv_block_export(kv, ids[i], buf + (size_t)i * bb, bb);
			if (got != (long)bb) {
				free(buf);
				return got < 0 ? (int)got : -EIO;
			}
		}
		h.kv = buf;
	}
	r->k.handoff(r->u, s, &h);
	free(buf);
	return 0;
}
