/* sch — continuous-batching scheduler over one engine (see sch.h). */
#define KVFS_LOG_TAG "sch"
#include "sch.h"
#include "sch_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "fwd.h"
#include "fwd_dev.h"
#include "kv.h"
#include "kvx.h"
#include "log.h"
#include "metrics.h"
#include "model.h"
#include "sample.h"
#include "gguf.h"
#include "tok.h"

void sch_opts_default(struct sch_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->threads = 1;
	o->max_seqs = SCH_MAX_SEQS;
	o->prefill_chunk = SCH_PREFILL_CHUNK;
	o->block_tokens = SCH_BLOCK_TOKENS;
}

const char *sch_model_arch(const struct sch *s)
{
	return s->m->cfg.arch;
}

void sch_req_free(struct sch_req *r)
{
	if (!r || atomic_fetch_sub(&r->refs, 1) != 1)
		return;
	sch_req_free(r->parent);
	free(r->toks);
	free(r->salt);
	free(r->blk);
	if (!r->img_borrowed) {
		free(r->img);
		free(r->img_rows);
	}
	free(r);
}

/* Scheduler thread: marks r ended (err 0: reason is "stop"/"length") and drops its KV now; the
 * finish callback runs when r leaves the run list (reap), as its last touch. */
static void req_end(struct sch_req *r, const char *reason, int err, const char *msg)
{
	kvi_seq_destroy(r->seq);
	r->seq = NULL;
	kvi_sampler_destroy(r->smp);
	r->smp = NULL;
	r->finished = 1;
	r->reason = reason;
	r->err = err;
	r->msg = msg;
}

static void req_report(struct sch_req *r)
{
	r->k.finish(r->u, r->reason, r->err, r->msg);
}

/* Length of the longest prefix of b[0..n) that ends on a UTF-8 character boundary. */
static int utf8_complete(const char *b, int n)
{
	int i = n, back = 0;
	while (i > 0 && back < 4 && ((unsigned char)b[i - 1] & 0xC0) == 0x80) {
		i--;
		back++;
	}
	if (i == 0)
		return n; /* only continuation bytes: not UTF-8 we can fix, pass it on */
	unsigned char c = (unsigned char)b[i - 1];
	int need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
	return back + 1 >= need ? n : i - 1;
}

/* Token t's text to the sink, its bytes that may start a UTF-8 character completed by the
 * next token held back; last: r's final token, everything goes (a flush after it would be
 * reported as one more token, counted past max_tokens). */
static void emit_piece(struct sch *s, struct sch_req *r, int32_t t, int last)
{
	char buf[256 + 8];
	memcpy(buf, r->utf8, (size_t)r->nutf8);
	int k = kvi_tok_decode_piece(s->tok, t, 0, buf + r->nutf8, 256);
	int n = r->nutf8 + (k > 0 ? k : 0);
	int ok = utf8_complete(buf, n);
	if (n - ok > 3 || last) /* cannot become valid: pass it on */
		ok = n;
	r->nutf8 = n - ok;
	memcpy(r->utf8, buf + ok, (size_t)r->nutf8);
	r->k.token(r->u, t, buf, (size_t)ok);
}

/* r asked for log-probabilities: t's under logits, and the alternatives', to the sink. Before
 * kvi_sampler_accept (the penalties as they were when t was sampled). */
static void report_logprob(struct sch *s, struct sch_req *r, int32_t t, const float *logits)
{
	enum { TXT = 128 };
	struct gw_logprob lp = {.n_top = r->logprobs - 1};
	int32_t ids[OAI_MAX_TOP_LOGPROBS];
	char txt[OAI_MAX_TOP_LOGPROBS + 1][TXT];
	lp.logprob = kvi_sampler_logprobs(r->smp, logits, t, lp.n_top, ids, lp.top_logprob);
	for (int i = 0; i <= lp.n_top; i++) {
		int k = kvi_tok_decode_piece(s->tok, i ? ids[i - 1] : t, 0, txt[i], TXT - 1);
		txt[i][k > 0 && k < TXT ? k : 0] = 0;
		if (i)
			lp.top_token[i - 1] = txt[i];
	}
	lp.token = txt[0];
	r->k.logprob(r->u, &lp);
}

/* Records sampled token t of r (logits: what it was sampled from, NULL when another worker
 * sampled it); returns 1 when r has ended. */
static int take_token(struct sch *s, struct sch_req *r, int32_t t, const float *logits)
{
	if (r->logprobs && logits && r->k.logprob)
		report_logprob(s, r, t, logits);
	int stop = kvi_sampler_accept(r->smp, t);
	if (!s->o.ignore_eos && kvi_tok_is_eog(s->tok, t)) {
		req_end(r, "stop", 0, NULL);
		return 1;
	}
	int end = stop || kvi_seq_len(r->seq) + 1 >= s->o.max_ctx;
	emit_piece(s, r, t, end);
	r->last = t;
	if (end) {
		req_end(r, "length", 0, NULL);
		return 1;
	}
	return 0;
}

static void publish(struct sch *s, int waiting)
{
	struct kvi_kv *kv = eng_kv(s);
	atomic_store(&s->g_waiting, waiting);
	atomic_store(&s->g_running, s->nrun);
	atomic_store(&s->g_kv_used, kvi_kv_n_blocks(kv) - kvi_kv_n_free(kv));
	atomic_store(&s->g_kv_total, kvi_kv_n_blocks(kv));
	int q = 0;
	for (int i = 0; i < s->nrun; i++)
		if (s->run[i]->st == RS_PREFILL)
			q += s->run[i]->n - s->run[i]->pos;
	atomic_store(&s->g_queued, q + atomic_load(&s->g_wait_tokens));
}

/* SCH_DECODE: the prompt's blocks from the cache plus the handed-over last one; 1 when the
 * whole prompt is in r->seq, 0 when the tail must be computed here (a miss: still correct). */
static int attach_handover(struct sch *s, struct sch_req *r, int cached)
{
	struct kvi_kv *kv = eng_kv(s);
	int B = kvi_kv_geom(kv)->block_tokens;
	if (!r->blk || r->blen != kvi_kv_block_bytes(kv) || cached != (r->n - 1) / B * B)
		return 0;
	int id = kvi_kv_block_alloc(kv);
	if (id < 0)
		return 0;
	int nb = cached / B, ok = 0;
	int32_t *ids = malloc((size_t)(nb + 1) * sizeof(int32_t));
	struct kvi_seq *full = NULL;
	if (ids && !kvi_kv_block_import(kv, id, r->blk, r->blen) && !kvi_seq_create(kv, &full)) {
		if (nb > 0)
			memcpy(ids, kvi_seq_blocks(r->seq), (size_t)nb * sizeof(int32_t));
		ids[nb] = id;
		if (!kvi_seq_attach(full, ids, nb + 1, r->n)) {
			kvi_seq_destroy(r->seq);
			r->seq = full;
			full = NULL;
			ok = 1;
		}
	}
	kvi_seq_destroy(full);
	kvi_kv_block_unref(kv, id); /* the sequence holds its own reference */
	free(ids);
	return ok;
}

/* Tests only (sch_opts.fork_delay_ms); ms <= 0 returns at once. */
static void sleep_ms(int ms)
{
	struct timespec d = {ms / 1000, (long)(ms % 1000) * 1000000L};
	if (ms > 0)
		nanosleep(&d, NULL);
}

static int64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Admits r: its sequence, the cached prefix, and the prompt accounting. 0 or -errno. */
static int admit_seq(struct sch *s, struct sch_req *r);

static int admit(struct sch *s, struct sch_req *r)
{
	met_hist_observe_ns(s->h_queue, (uint64_t)(mono_ns() - r->t_submit));
	int rc = kvi_sampler_create(&r->sp, s->n_vocab, &r->smp);
	if (rc)
		return rc;
	if (r->mode == SCH_DECODE) /* the prefill worker drew the first token */
		kvi_sampler_skip_draw(r->smp);
	if (r->parent && !r->parent->finished && r->parent->st == RS_PREFILL) {
		r->st = RS_FORK; /* fork_children gives it a sequence */
		return 0;
	}
	/* DECODE, a further choice admitted with its parent (admit_group), whose sequence holds
	 * the prompt (loaded, not yet stepped): a fork sharing those blocks */
	struct sch_req *p = r->parent;
	if (r->mode == SCH_DECODE && p && !p->finished && p->st == RS_DECODE && p->seq &&
	    kvi_seq_len(p->seq) == p->n) {
		int rc = kvi_seq_fork(p->seq, &r->seq);
		if (rc)
			return rc;
		r->pos = r->n;
		r->cached = p->cached;
		r->st = RS_DECODE;
		take_token(s, r, r->first, NULL);
		return 0;
	}
	return admit_seq(s, r);
}

/* Admits r's sequence: the parked hand-over, or the cached prefix (then prefill). 0 or
 * -errno. */
static int admit_seq(struct sch *s, struct sch_req *r)
{
	int rc = kvi_seq_create(eng_kv(s), &r->seq);
	if (rc)
		return rc;
	if (r->ticket && (rc = sch_parked_claim(s, r)) < 0)
		return rc;
	if (rc == 1) { /* handed over directly */
		r->pos = r->cached = r->n;
		r->st = RS_DECODE;
		if (r->k.prompt)
			r->k.prompt(r->u, r->n, r->n);
		take_token(s, r, r->first, NULL);
		return 0;
	}
	int cached = 0;
	if ((rc = sch_kvx_load(s, r, r->n, &cached)))
		return rc;
	r->pos = cached;
	r->cached = cached;
	r->st = RS_PREFILL;
	if (r->k.prompt)
		r->k.prompt(r->u, r->n, cached);
	if (r->mode == SCH_DECODE && attach_handover(s, r, cached)) {
		r->pos = r->n;
		r->st = RS_DECODE;
		take_token(s, r, r->first, NULL);
	}
	return 0;
}

/* SCH_PREFILL: publishes the prompt's full blocks and hands over the last one. */
static void prefill_done(struct sch *s, struct sch_req *r, int32_t first)
{
	struct kvi_kv *kv = eng_kv(s);
	int B = kvi_kv_geom(kv)->block_tokens;
	if (r->handoff) {
		/* the decode worker gets the KV directly: the saves are for later prompts and
		 * need not be waited for */
		sch_kvx_save(s, r);
		int rc = sch_handoff_run(s, r, first);
		if (rc)
			req_end(r, NULL, rc, "cannot hand the KV over");
		else
			req_end(r, "stop", 0, NULL);
		return;
	}
	if (s->kx) {
		sch_kvx_save(s, r);
		kvx_flush(s->kx); /* the decode worker loads them next */
	}
	size_t bb = kvi_kv_block_bytes(kv);
	long got = kvi_kv_block_export(kv, kvi_seq_blocks(r->seq)[(r->n - 1) / B], s->blkbuf, bb);
	if (got < 0) {
		req_end(r, NULL, (int)got, "cannot export the last block");
		return;
	}
	r->k.prefilled(r->u, r->toks, r->n, r->cached, first, s->blkbuf, (size_t)got);
	req_end(r, "stop", 0, NULL);
}

/* SCH_PREFILL, its prompt computed (s->logits its last position's) and first token t drawn:
 * t's logprob, then each further choice's first token (its own sampler, seed xseeds[i]) with
 * its logprob, to the sink. The prompt is computed once for every choice. */
static void prefill_choices(struct sch *s, struct sch_req *r, int32_t t)
{
	if (r->logprobs && r->k.logprob)
		report_logprob(s, r, t, s->logits);
	for (int i = 0; i < r->nx; i++) {
		struct kvi_sample_params sp = r->sp;
		sp.seed = r->xseeds[i];
		struct kvi_sampler *smp = NULL, *mine = r->smp;
		int32_t x = t;
		if (!kvi_sampler_create(&sp, s->n_vocab, &smp)) {
			x = kvi_sampler_sample(smp, s->logits);
			r->smp = smp; /* report_logprob asks r's sampler */
			if (r->logprobs && r->k.logprob)
				report_logprob(s, r, x, s->logits);
			r->smp = mine;
			kvi_sampler_destroy(smp);
		} else if (r->logprobs && r->k.logprob) {
			report_logprob(s, r, x, s->logits);
		}
		if (r->k.choice)
			r->k.choice(r->u, x);
	}
}

/* One prefill chunk of r; returns 1 when r ended, 0 otherwise. */
static void fork_children(struct sch *s, struct sch_req *p, const float *logits);

static int prefill_step(struct sch *s, struct sch_req *r)
{
	int n = r->n - r->pos;
	int last = n <= s->o.prefill_chunk;
	if (!last)
		n = s->o.prefill_chunk;
	float *lg = last ? s->logits : NULL;
	int rc = sch_eng_prefill_req(s, r, r->pos, n, lg);
	if (rc) {
		req_end(r, NULL, rc, rc == -ENOSPC ? "KV memory full" : "prefill failed");
		return 1;
	}
	r->pos += n;
	if (!last)
		return 0;
	/* SCH_DECODE after a cache miss takes the prefill worker's token (the same when greedy;
	 * its draw was skipped at admission) */
	int32_t t = r->mode == SCH_DECODE ? r->first : kvi_sampler_sample(r->smp, s->logits);
	if (r->mode == SCH_PREFILL) {
		prefill_choices(s, r, t);
		prefill_done(s, r, t);
		return 1;
	}
	sch_kvx_save(s, r);
	r->st = RS_DECODE;
	fork_children(s, r, s->logits); /* before r's token: it may end r */
	/* DECODE: the first token's logprob went with the PREFILL reply */
	return take_token(s, r, t, r->mode == SCH_DECODE ? NULL : s->logits);
}

/* Gives every request waiting in RS_FORK on p (whose prompt was just computed, logits its
 * last position's) a sequence sharing p's blocks, and its own first token. */
static void fork_children(struct sch *s, struct sch_req *p, const float *logits)
{
	for (int i = 0; i < s->nrun; i++) {
		struct sch_req *c = s->run[i];
		if (c->st != RS_FORK || c->parent != p || c->finished)
			continue;
		int rc = kvi_seq_fork(p->seq, &c->seq);
		if (rc) {
			req_end(c, NULL, rc, "cannot fork the prompt's KV");
			continue;
		}
		c->pos = c->n;
		c->cached = p->cached;
		c->st = RS_DECODE;
		if (c->k.prompt)
			c->k.prompt(c->u, c->n, p->cached);
		if (c->mode == SCH_DECODE) /* its first token came from the prefill worker */
			take_token(s, c, c->first, NULL);
		else
			take_token(s, c, kvi_sampler_sample(c->smp, logits), logits);
	}
}

/* Requests in RS_FORK whose parent ended (or got past its prefill) before forking them
 * compute their prompt themselves. */
static void fork_orphans(struct sch *s)
{
	for (int i = 0; i < s->nrun; i++) {
		struct sch_req *c = s->run[i];
		if (c->st != RS_FORK || c->finished ||
		    (!c->parent->finished && c->parent->st == RS_PREFILL))
			continue;
		int rc = admit_seq(s, c);
		if (rc)
			req_end(c, NULL, rc, "cannot admit the request");
	}
}

static void decode_step(struct sch *s)
{
	struct kvi_seq *seqs[s->o.max_seqs];
	int32_t toks[s->o.max_seqs];
	struct sch_req *rs[s->o.max_seqs];
	int n = 0;
	for (int i = 0; i < s->nrun; i++)
		if (s->run[i]->st == RS_DECODE && !s->run[i]->finished) {
			rs[n] = s->run[i];
			seqs[n] = rs[n]->seq;
			toks[n] = rs[n]->last;
			n++;
		}
	if (!n)
		return;
	int rc = s->de ? kvi_dev_engine_decode(s->de, seqs, toks, n, s->logits)
		       : kvi_engine_decode(s->e, seqs, toks, n, s->logits);
	atomic_fetch_add(&s->c_decode_tokens, (unsigned long long)n);
	for (int i = 0; i < n; i++) {
		if (rc) {
			req_end(rs[i], NULL, rc,
				rc == -ENOSPC ? "KV memory full" : "decode failed");
			continue;
		}
		const float *lg = s->logits + (size_t)i * s->n_vocab;
		take_token(s, rs[i], kvi_sampler_sample(rs[i]->smp, lg), lg);
	}
}

/* Drops ended requests from run[] and reports their finish. */
static void compact(struct sch *s)
{
	int k = 0;
	for (int i = 0; i < s->nrun; i++)
		if (!s->run[i]->finished)
			s->run[k++] = s->run[i];
		else
			req_report(s->run[i]);
	s->nrun = k;
}

/* Admits r, off the wait list (an ended one is reported by compact). */
static void admit_one(struct sch *s, struct sch_req *r)
{
	r->next = NULL;
	atomic_fetch_sub(&s->g_wait_tokens, r->n);
	int rc = admit(s, r);
	if (rc)
		req_end(r, NULL, rc, "cannot admit the request");
	s->run[s->nrun++] = r;
}

/* The batch slots parent r is admitted with: its own and its fork children's (all of them
 * when they fit in a batch at all: admitted later, a child could no longer fork the prompt) */
static int group_slots(const struct sch *s, const struct sch_req *r)
{
	int need = 1 + (r->nforks > 0 ? r->nforks : 0);
	return need < s->o.max_seqs ? need : s->o.max_seqs;
}

/* Parent p just admitted: admits its fork children now, in order, so that each forks p's
 * prompt KV (a child admitted after p's first decode step would have to load or compute the
 * prompt itself). They are all submitted (pending_forks) but one may still be in s->inq. */
static void admit_group(struct sch *s, struct sch_req *p, struct sch_req **wait, int *nwait)
{
	pthread_mutex_lock(&s->mu);
	struct sch_req *q = s->inq, **tail = wait;
	s->inq = NULL;
	s->inq_tail = &s->inq;
	pthread_mutex_unlock(&s->mu);
	while (*tail)
		tail = &(*tail)->next;
	*tail = q;
	for (; q; q = q->next)
		(*nwait)++;
	for (struct sch_req **pp = wait; *pp && s->nrun < s->o.max_seqs;) {
		struct sch_req *c = *pp;
		if (c->parent != p || atomic_load(&c->cancelled)) {
			pp = &c->next;
			continue;
		}
		*pp = c->next;
		(*nwait)--;
		admit_one(s, c);
	}
}

static void *sch_main(void *arg)
{
	struct sch *s = arg;
	struct sch_req *wait = NULL, **wait_tail = &wait;
	int nwait = 0;
	for (;;) {
		pthread_mutex_lock(&s->mu);
		while (!s->stop && !s->inq && !s->calls && !wait && s->nrun == 0) {
			pthread_mutex_unlock(&s->mu);
			if (s->kx)
				kvx_flush(s->kx); /* idle: drop the save references */
			struct timespec next;
			int parked = sch_parked_expire(s, 0, &next);
			publish(s, 0);
			pthread_mutex_lock(&s->mu);
			if (s->stop || s->inq || s->calls)
				break;
			if (parked) { /* wake when the first of them expires */
				pthread_cond_timedwait(&s->cv, &s->mu, &next);
			} else {
				pthread_cond_wait(&s->cv, &s->mu);
			}
		}
		int stop = s->stop;
		if (s->inq) {
			*wait_tail = s->inq;
			for (struct sch_req *r = s->inq; r; r = r->next) {
				nwait++;
				wait_tail = &r->next;
			}
			s->inq = NULL;
			s->inq_tail = &s->inq;
		}
		pthread_mutex_unlock(&s->mu);
		if (stop)
			break;
		if (wait && atomic_load(&wait->pending_forks) > 0)
			sleep_ms(2 * s->o.fork_delay_ms); /* tests: its forks come meanwhile */
		sch_run_calls(s);			  /* hand-overs to park, NCCL joins */
		sch_parked_expire(s, 0, NULL);
		/* 1. cancelled requests leave now, freeing their KV */
		for (int i = 0; i < s->nrun; i++)
			if (atomic_load(&s->run[i]->cancelled))
				req_end(s->run[i], NULL, -ECANCELED, "cancelled");
		compact(s);
		for (struct sch_req **pp = &wait; *pp;) {
			struct sch_req *r = *pp;
			if (atomic_load(&r->cancelled)) {
				*pp = r->next;
				nwait--;
				atomic_fetch_sub(&s->g_wait_tokens, r->n);
				req_end(r, NULL, -ECANCELED, "cancelled");
				req_report(r);
			} else {
				pp = &r->next;
			}
		}
		/* 2. admit, oldest first: a parent once its fork children are queued behind it
		 * (microseconds), with them (admit_group) */
		while (wait && atomic_load(&wait->pending_forks) <= 0 &&
		       s->nrun + group_slots(s, wait) <= s->o.max_seqs) {
			struct sch_req *r = wait;
			wait = r->next;
			nwait--;
			admit_one(s, r);
			if (r->nforks > 0)
				admit_group(s, r, &wait, &nwait);
		}
		wait_tail = &wait;
		for (struct sch_req *r = wait; r; r = r->next)
			wait_tail = &r->next;
		fork_orphans(s);
		/* 3. one prefill chunk, oldest first; 4. one decode step for the rest */
		for (int i = 0; i < s->nrun; i++)
			if (s->run[i]->st == RS_PREFILL) {
				prefill_step(s, s->run[i]);
				break;
			}
		decode_step(s);
		compact(s);
		atomic_fetch_add(&s->c_steps, 1);
		publish(s, nwait);
	}
	for (int i = 0; i < s->nrun; i++)
		if (!s->run[i]->finished)
			req_end(s->run[i], NULL, -ESHUTDOWN, "server shutting down");
	compact(s);
	while (wait) {
		struct sch_req *r = wait;
		wait = r->next;
		req_end(r, NULL, -ESHUTDOWN, "server shutting down");
		req_report(r);
	}
	sch_parked_expire(s, 1, NULL);
	pthread_mutex_lock(&s->mu);
	sch_fail_calls_locked(s, -EAGAIN);
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

/* ---- requests --------------------------------------------------------------------- */

int sch_submit(struct sch *s, const struct sch_job *j, const struct sch_sink *k, void *u,
	       struct sch_req **out)
{
	int forked = j->mode != SCH_PREFILL && j->fork_of; /* a further choice of n > 1 */
	struct sch_req *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->s = s;
	r->k = *k;
	r->u = u;
	r->t_submit = mono_ns();
	atomic_init(&r->refs, 1);
	atomic_init(&r->pending_forks, j->mode != SCH_PREFILL ? j->forks : 0);
	r->nforks = j->mode != SCH_PREFILL && j->forks > 0 ? j->forks : 0;
	r->logprobs = j->logprobs > 0 && j->logprobs <= OAI_MAX_TOP_LOGPROBS + 1 ? j->logprobs : 0;
	r->nx =
	    j->mode == SCH_PREFILL && j->xseeds && j->nx > 0 && j->nx < KVW_MAX_CHOICES ? j->nx : 0;
	for (int i = 0; i < r->nx; i++)
		r->xseeds[i] = j->xseeds[i];
	r->mode = j->mode;
	r->sp = j->sp;
	r->first = j->first;
	r->ticket = j->mode == SCH_DECODE ? j->ticket : 0;
	r->handoff = j->mode == SCH_PREFILL ? j->handoff : 0;
	r->skip_cached = r->handoff && j->handoff_skip_cached;
	int rc = -ERANGE; /* a logit_bias naming a token the vocabulary lacks */
	for (int i = 0; i < r->sp.n_bias; i++)
		if (r->sp.bias[i].id < 0 || r->sp.bias[i].id >= s->n_vocab)
			goto fail;
	rc = -EINVAL;
	if (r->handoff && (r->handoff > SCH_HANDOFF_DEVICE || !k->handoff ||
			   (r->handoff == SCH_HANDOFF_DEVICE && !sch_nccl_capable(s))))
		goto fail;
	rc = -ENOMEM;
	if (j->salt && !(r->salt = strdup(j->salt)))
		goto fail;
	if (forked) { /* the parent's prompt, its KV once computed */
		rc = -EINVAL;
		if (j->mode == SCH_DECODE && (j->first < 0 || j->first >= s->n_vocab))
			goto fail;
		rc = -ENOMEM;
		if (!(r->toks = malloc((size_t)j->fork_of->n * sizeof(int32_t))))
			goto fail;
		if (j->mode == SCH_DECODE && j->blk && j->blen) { /* for a fallback on its own */
			if (!(r->blk = malloc(j->blen)))
				goto fail;
			memcpy(r->blk, j->blk, j->blen);
			r->blen = j->blen;
		}
		memcpy(r->toks, j->fork_of->toks, (size_t)j->fork_of->n * sizeof(int32_t));
		r->n = j->fork_of->n;
		r->img = j->fork_of->img; /* alive while r holds its parent */
		r->nimg = j->fork_of->nimg;
		r->img_rows = j->fork_of->img_rows;
		r->img_borrowed = 1;
		atomic_fetch_add(&j->fork_of->refs, 1);
		r->parent = j->fork_of;
	} else if (j->mode == SCH_DECODE || j->toks) {
		rc = j->mode != SCH_DECODE && j->n > s->o.max_ctx ? -E2BIG : -EINVAL;
		if (j->n < 1 || j->n > s->o.max_ctx ||
		    (j->mode == SCH_DECODE && (j->first < 0 || j->first >= s->n_vocab)))
			goto fail;
		rc = -EINVAL;
		for (int i = 0; i < j->n; i++)
			if (j->toks[i] < 0 || j->toks[i] >= s->n_vocab)
				goto fail;
		rc = -ENOMEM;
		if (!(r->toks = malloc((size_t)j->n * sizeof(int32_t))))
			goto fail;
		memcpy(r->toks, j->toks, (size_t)j->n * sizeof(int32_t));
		r->n = j->n;
		if (j->blk && j->blen) {
			if (!(r->blk = malloc(j->blen)))
				goto fail;
			memcpy(r->blk, j->blk, j->blen);
			r->blen = j->blen;
		}
		rc = j->n_image_refs && j->mode != SCH_DECODE ? -EINVAL : 0;
		if (!rc && j->n_image_refs)
			rc = sch_vision_spans(s, r, j->image_refs, j->n_image_refs);
		if (rc)
			goto fail;
	} else if (j->n_image_refs) {
		int flags = (kvi_tok_wants_bos(s->tok) ? KVI_TOK_ADD_BOS : 0) |
			    (j->parse_special ? KVI_TOK_PARSE_SPECIAL : 0);
		rc = j->mode == SCH_PREFILL
			 ? sch_vision_prepare_refs(s, r, j->prompt, flags, j->image_refs,
						   j->n_image_refs)
			 : -EINVAL;
		if (rc)
			goto fail;
	} else if (j->n_images) {
		int flags = (kvi_tok_wants_bos(s->tok) ? KVI_TOK_ADD_BOS : 0) |
			    (j->parse_special ? KVI_TOK_PARSE_SPECIAL : 0);
		rc = j->mode == SCH_FULL
			 ? sch_vision_prepare(s, r, j->prompt, flags, j->images, j->n_images)
			 : -EINVAL;
		if (rc)
			goto fail;
	} else {
		size_t len = strlen(j->prompt), cnt = 0, cap = len + 8;
		int flags = (kvi_tok_wants_bos(s->tok) ? KVI_TOK_ADD_BOS : 0) |
			    (j->parse_special ? KVI_TOK_PARSE_SPECIAL : 0);
		if (!(r->toks = malloc(cap * sizeof(int32_t))))
			goto fail;
		rc = kvi_tok_encode(s->tok, j->prompt, len, flags, r->toks, cap, &cnt);
		if (rc || cnt == 0) {
			rc = -EINVAL;
			goto fail;
		}
		r->n = (int)cnt;
	}
	if (forked)
		sleep_ms(s->o.fork_delay_ms);
	rc = -E2BIG;
	/* max_tokens comes from the wire (up to INT32_MAX): compared so that nothing overflows.
	 * A prefill computes one token but checks the whole request's room, so that a request
	 * the decode side must refuse is refused before its prompt is computed. */
	int room = r->sp.max_tokens;
	if (j->mode == SCH_PREFILL && room < 1)
		room = 1;
	if (room > s->o.max_ctx - r->n)
		goto fail;
	pthread_mutex_lock(&s->mu);
	if (s->stop) {
		pthread_mutex_unlock(&s->mu);
		rc = -EAGAIN;
		goto fail;
	}
	atomic_fetch_add(&s->g_wait_tokens, r->n);
	*out = r; /* before the scheduler can see it: finish may free it */
	*s->inq_tail = r;
	s->inq_tail = &r->next;
	if (forked)
		atomic_fetch_sub(&j->fork_of->pending_forks, 1);
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return 0;
fail:
	if (forked) { /* the parent is cancelled by the caller */
		pthread_mutex_lock(&s->mu);
		atomic_fetch_sub(&j->fork_of->pending_forks, 1);
		pthread_cond_signal(&s->cv);
		pthread_mutex_unlock(&s->mu);
	}
	sch_req_free(r);
	return rc;
}

void sch_cancel(struct sch_req *r)
{
	struct sch *s = r->s;
	atomic_store(&r->cancelled, 1);
	pthread_mutex_lock(&s->mu);
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

void sch_load_get(struct sch *s, struct sch_load *out)
{
	out->waiting = atomic_load(&s->g_waiting);
	out->running = atomic_load(&s->g_running);
	out->queued_tokens = atomic_load(&s->g_queued);
	out->kv_total = atomic_load(&s->g_kv_total);
	out->kv_free = out->kv_total - atomic_load(&s->g_kv_used);
	out->prompt_computed = (uint32_t)atomic_load(&s->c_prefill_tokens);
}

int sch_handoff_blocks(const struct sch *s, int n, int first_block)
{
	int B = kvi_kv_geom(eng_kv(s))->block_tokens;
	return n / B + (n % B != 0) - first_block;
}

size_t sch_block_bytes(const struct sch *s)
{
	return kvi_kv_block_bytes(eng_kv(s));
}

const char *sch_cache_id(const struct sch *s)
{
	return s->kx ? kvx_model_dir(s->kx) : "";
}

size_t sch_handoff_max_bytes(const struct sch *s)
{
	size_t B = (size_t)kvi_kv_geom(eng_kv(s))->block_tokens, ctx = (size_t)s->o.max_ctx;
	return (ctx + B - 1) / B * sch_block_bytes(s) + ctx * sizeof(int32_t);
}

/* ---- gw_backend (embedded) -------------------------------------------------------------- */

static void gj_prompt(void *u, int n, int cached)
{
	gw_job_prompt(u, n, cached);
}
static void gj_token(void *u, int32_t id, const char *piece, size_t len)
{
	(void)id;
	gw_job_token(u, piece, len);
}
static void gj_logprob(void *u, const struct gw_logprob *lp)
{
	gw_job_logprob(u, lp);
}
static void gj_finish(void *u, const char *reason, int err, const char *msg)
{
	gw_job_finish(u, reason, err, msg);
}

void sch_sample_params(const struct oai_request *o, uint64_t id, struct kvi_sample_params *sp)
{
	kvi_sample_params_default(sp);
	sp->temp = (float)o->temperature;
	sp->top_p = (float)o->top_p;
	sp->top_k = o->top_k;
	sp->seed = o->has_seed ? o->seed : id * 0x9E3779B97F4A7C15ULL;
	sp->max_tokens = o->max_tokens;
	sp->presence_penalty = (float)o->presence_penalty;
	sp->frequency_penalty = (float)o->frequency_penalty;
	sp->n_bias = o->n_bias < KVI_SAMPLE_MAX_BIAS ? o->n_bias : KVI_SAMPLE_MAX_BIAS;
	for (int i = 0; i < sp->n_bias; i++)
		sp->bias[i] = (struct kvi_logit_bias){o->bias[i].id, (float)o->bias[i].bias};
}

static int be_submit(void *ctx, struct gw_job *job, const struct gw_req *q)
{
	struct sch *s = ctx;
	const struct oai_request *o = q->oai;
	static const struct sch_sink sink = {
	    .prompt = gj_prompt, .token = gj_token, .logprob = gj_logprob, .finish = gj_finish};
	struct sch_job j = {
	    .mode = SCH_FULL, .prompt = q->prompt, .parse_special = o->chat, .salt = o->salt};
	sch_sample_params(o, q->id, &j.sp);
	j.logprobs = o->logprobs ? 1 + o->top_logprobs : 0;
	j.toks = q->toks; /* a prompt of token ids */
	j.n = q->n_toks;
	j.forks = q->n_forks; /* n > 1: the others fork this one's prompt KV */
	j.fork_of = q->first ? gw_job_backend_data(q->first) : NULL;
	struct sch_image im[SCH_MAX_IMAGES];
	if (q->n_images > SCH_MAX_IMAGES)
		return -EINVAL;
	for (int i = 0; i < q->n_images; i++)
		im[i] = (struct sch_image){.offset = q->image_off[i], .img = q->images[i]};
	j.images = im;
	j.n_images = q->first ? 0 : q->n_images; /* a fork takes its parent's */
	struct sch_req *r = NULL;
	int rc = sch_submit(s, &j, &sink, job, &r);
	if (rc)
		return rc;
	gw_job_set_backend_data(job, r);
	return 0;
}

static void be_cancel(void *ctx, struct gw_job *job)
{
	(void)ctx;
	struct sch_req *r = gw_job_backend_data(job);
	if (r)
		sch_cancel(r);
}

static void be_release(void *ctx, struct gw_job *job)
{
	(void)ctx;
	sch_req_free(gw_job_backend_data(job));
}

/* One family of one unlabelled sample. */
static void out_one(struct met_out *o, const char *name, const char *type, const char *help,
		    double v)
{
	met_out_family(o, name, type, help);
	met_out_sample(o, name, NULL, v);
}

static void be_metrics(void *ctx, struct met_out *o)
{
	struct sch *s = ctx;
	sch_vision_metrics(s, o);
	out_one(o, "num_requests_running", "gauge", "Sequences in the running batch",
		atomic_load(&s->g_running));
	out_one(o, "num_requests_waiting", "gauge", "Requests waiting for a batch slot",
		atomic_load(&s->g_waiting));
	int used = atomic_load(&s->g_kv_used), total = atomic_load(&s->g_kv_total);
	out_one(o, "kv_blocks_used", "gauge", "KV cache blocks in use", used);
	out_one(o, "kv_blocks_capacity", "gauge", "KV cache blocks in the pool", total);
	out_one(o, "vllm:num_requests_running", "gauge",
		"Number of requests in model execution batches.", atomic_load(&s->g_running));
	out_one(o, "vllm:num_requests_waiting", "gauge",
		"Number of requests waiting to be processed.", atomic_load(&s->g_waiting));
	out_one(o, "vllm:kv_cache_usage_perc", "gauge",
		"KV-cache usage. 1 means 100 percent usage.", total ? (double)used / total : 0);
	out_one(o, "scheduler_steps_total", "counter", "Engine steps the scheduler ran",
		(double)atomic_load(&s->c_steps));
	out_one(o, "prefill_tokens_computed_total", "counter",
		"Prompt tokens computed (not taken from a cache)",
		(double)atomic_load(&s->c_prefill_tokens));
	out_one(o, "decode_tokens_total", "counter", "Tokens decoded",
		(double)atomic_load(&s->c_decode_tokens));
	if (s->kx) {
		struct kvx_stats st;
		kvx_stats_get(s->kx, &st);
		out_one(o, "kvx_hit_blocks_total", "counter",
			"Prompt KV blocks read from the kv dir", (double)st.hit_blocks);
		out_one(o, "kvx_saved_blocks_total", "counter",
			"Prompt KV blocks written to the kv dir", (double)st.saved_blocks);
	}
}

/* vLLM's request_latency_buckets, which its queue-time histogram uses. */
static const double vllm_req_b[] = {0.3,  0.5,	 0.8,	1.0,   1.5,   2.0,    2.5,
				    5.0,  10.0,	 15.0,	20.0,  30.0,  40.0,   50.0,
				    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

static int be_metrics_register(void *ctx, struct met_reg *r)
{
	struct sch *s = ctx;
	s->h_queue = met_hist_new(r, "vllm:request_queue_time_seconds",
				  "Histogram of time spent in WAITING phase for request.", NULL,
				  vllm_req_b, (int)(sizeof(vllm_req_b) / sizeof(vllm_req_b[0])));
	return s->h_queue ? 0 : -ENOMEM;
}

int sch_metrics_serve(struct sch *s, const char *listen, const char *addr_file)
{
	if (!listen || !*listen)
		return 0;
	int rc = met_reg_create(&s->mreg);
	if (rc)
		return rc;
	if ((rc = be_metrics_register(s, s->mreg)) ||
	    (rc = met_collector_add(s->mreg, be_metrics, s)) ||
	    (rc = met_http_serve(s->mreg, listen, addr_file, &s->mhttp))) {
		met_reg_destroy(s->mreg);
		s->mreg = NULL;
		s->h_queue = NULL;
		return rc;
	}
	return 0;
}

void sch_backend(struct sch *s, struct gw_backend *out)
{
	memset(out, 0, sizeof(*out));
	out->ctx = s;
	out->submit = be_submit;
	out->cancel = be_cancel;
	out->release = be_release;
	out->metrics = be_metrics;
	out->metrics_register = be_metrics_register;
}

/* ---- lifecycle ----------------------------------------------------------------------- */

int sch_create(const struct sch_opts *o, struct sch **out)
{
	char err[256] = "";
	struct sch *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->o = *o;
	if (s->o.threads < 1)
		s->o.threads = 1;
	if (s->o.max_seqs < 1)
		s->o.max_seqs = SCH_MAX_SEQS;
	if (s->o.prefill_chunk < 1)
		s->o.prefill_chunk = SCH_PREFILL_CHUNK;
	if (s->o.block_tokens < 1)
		s->o.block_tokens = SCH_BLOCK_TOKENS;
	pthread_mutex_init(&s->mu, NULL);
	pthread_mutex_init(&s->tower_mu, NULL);
	/* the idle wait for parked prompts' expiry is timed on CLOCK_MONOTONIC */
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_cond_init(&s->call_cv, NULL);
	s->inq_tail = &s->inq;
	s->calls_tail = &s->calls;
	int rc = kvi_model_load(o->model, &s->m, err, sizeof(err));
	if (rc) {
		klog_error("%s: %s", o->model, err[0] ? err : strerror(-rc));
		goto fail;
	}
	if ((rc = kvi_tok_create(kvi_model_gguf(s->m), &s->tok, err, sizeof(err)))) {
		klog_error("tokenizer: %s", err[0] ? err : strerror(-rc));
		goto fail;
	}
	if (s->o.max_ctx <= 0)
		s->o.max_ctx =
		    s->m->cfg.n_ctx_train < SCH_MAX_CTX ? s->m->cfg.n_ctx_train : SCH_MAX_CTX;
	struct kvi_engine_opts eo;
	kvi_engine_opts_default(&eo);
	eo.threads = s->o.threads;
	eo.block_tokens = s->o.block_tokens;
	eo.max_ctx = s->o.max_ctx;
	eo.max_batch_tokens =
	    s->o.prefill_chunk > s->o.max_seqs ? s->o.prefill_chunk : s->o.max_seqs;
	int per_seq = (s->o.max_ctx + eo.block_tokens - 1) / eo.block_tokens + 1;
	eo.kv_blocks = s->o.max_seqs * per_seq + 8;
	eo.isa = s->o.isa;
	if ((rc = s->o.device ? kvi_dev_engine_create(s->m, &eo, s->o.device, s->o.gpu, &s->de)
			      : kvi_engine_create(s->m, &eo, &s->e))) {
		klog_error("engine: %s", strerror(-rc));
		goto fail;
	}
	if (o->kv_dir && o->kv_dir[0]) {
		struct kvx_opts xo;
		kvx_opts_default(&xo);
		xo.dir = o->kv_dir;
		if ((rc = kvx_create_kv(eng_kv(s), s->m, &xo, &s->kx))) {
			klog_error("--kv-dir %s: %s", o->kv_dir, strerror(-rc));
			goto fail;
		}
	}
	if ((rc = sch_vision_open(s)))
		goto fail;
	s->n_vocab = s->m->cfg.n_vocab;
	s->logits = malloc((size_t)s->o.max_seqs * (size_t)s->n_vocab * sizeof(float));
	s->run = calloc((size_t)s->o.max_seqs, sizeof(*s->run));
	s->blkbuf = malloc(kvi_kv_block_bytes(eng_kv(s)));
	if (!s->logits || !s->run || !s->blkbuf) {
		rc = -ENOMEM;
		goto fail;
	}
	publish(s, 0);
	if ((rc = -pthread_create(&s->thr, NULL, sch_main, s)))
		goto fail;
	*out = s;
	return 0;
fail:
	sch_vision_close(s);
	pthread_mutex_destroy(&s->tower_mu);
	kvx_destroy(s->kx);
	kvi_engine_destroy(s->e);
	kvi_dev_engine_destroy(s->de);
	kvi_tok_free(s->tok);
	kvi_model_free(s->m);
	free(s->logits);
	free(s->run);
	free(s->blkbuf);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	pthread_cond_destroy(&s->call_cv);
	free(s);
	return rc;
}

void sch_stop(struct sch *s)
{
	pthread_mutex_lock(&s->mu);
	int was = s->stop;
	s->stop = 1;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
	if (was)
		return;
	pthread_join(s->thr, NULL);
	s->joined = 1;
	/* requests submitted after the thread's last look at the queue */
	while (s->inq) {
		struct sch_req *r = s->inq;
		s->inq = r->next;
		r->k.finish(r->u, NULL, -ESHUTDOWN, "server shutting down");
	}
}

void sch_destroy(struct sch *s)
{
	if (!s)
		return;
	sch_stop(s);
	met_http_stop(s->mhttp); /* its collector reads s */
	met_reg_destroy(s->mreg);
	sch_vision_close(s);
	pthread_mutex_destroy(&s->tower_mu);
	kvx_destroy(s->kx);
	kvi_engine_destroy(s->e);
	kvi_dev_engine_destroy(s->de);
	kvi_tok_free(s->tok);
	kvi_model_free(s->m);
	free(s->logits);
	free(s->run);
	free(s->blkbuf);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	pthread_cond_destroy(&s->call_cv);
	free(s);
}
