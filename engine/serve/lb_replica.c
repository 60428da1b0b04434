/* lb_replica — the replica table of the balancers (see lb.h): the address lists, the
 * policies that pick a replica, up/down state and the health thread that polls STATUS. */
#define KVFS_LOG_TAG "lb"
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "ktime.h"
#include "kvw.h"
#include "lb_int.h"
#include "log.h"

int lb_handoff_parse(const char *s)
{
	if (!strcmp(s, "fs"))
		return LB_HANDOFF_FS;
	if (!strcmp(s, "direct"))
		return LB_HANDOFF_DIRECT;
	return -EINVAL;
}

struct lbp_req lb_req_of(const struct lreq *q, uint64_t *blk)
{
	/* a prompt of token ids: its count is known, its bytes stand for its text */
	const char *txt = q->toks ? (const char *)q->toks : q->prompt;
	size_t plen = q->toks ? (size_t)q->ntoks * sizeof(int32_t) : strlen(q->prompt);
	int est = q->toks ? q->ntoks : (int)(plen / 4) + 1;
	int out = q->sp.max_tokens > 0 ? q->sp.max_tokens : 0;
	return (struct lbp_req){.key = lbp_hash(txt, plen, LBP_SEED),
				.est_tokens = est,
				.kv_blocks = (est + out + LB_BLOCK_TOKENS - 1) / LB_BLOCK_TOKENS,
				.block = blk,
				.nblocks =
				    blk ? lbp_text_blocks(txt, plen, blk, LB_MAX_BLOCKS) : 0};
}

int lb_pick_encoder(struct lb *l, uint64_t img_key, int cost, const unsigned char *skip)
{
	struct lbp_load v[LB_MAX_REPLICAS];
	for (int i = 0; i < l->en.n; i++) {
		const struct replica *r = &l->en.r[i];
		v[i] = (struct lbp_load){.id = r->id,
					 .up = r->up,
					 .queued_tokens = r->queued_tokens,
					 .inflight_tokens = r->inflight_tokens,
					 .inflight = r->inflight};
	}
	struct lbp_set set = {.r = v, .n = l->en.n, .rr = l->en.rr};
	return lbp_pick_encode(&set, img_key, cost, skip);
}

/* The policy decides on lbp's view of the stage, rebuilt per pick (at most LB_MAX_REPLICAS
 * entries) from the replica table, so lb-sim, which calls the same functions, decides alike. */
int lb_pick(struct lb *l, struct role *ro, int prefill, const struct lbp_req *q,
	    const unsigned char *skip)
{
	struct lbp_load v[LB_MAX_REPLICAS];
	for (int i = 0; i < ro->n; i++) {
		const struct replica *r = &ro->r[i];
		v[i] = (struct lbp_load){.id = r->id,
					 .up = r->up,
					 .queued_tokens = r->queued_tokens,
					 .inflight_tokens = r->inflight_tokens,
					 .inflight = r->inflight,
					 .kv_free = r->kv_free};
	}
	struct lbp_set set = {.r = v, .n = ro->n, .rr = ro->rr};
	int i = prefill ? lbp_pick_prefill(l->o.policy, &set, q, &l->index, skip)
			: lbp_pick_decode(l->o.policy, &set, q, skip);
	ro->rr = set.rr;
	return i;
}

static int64_t lb_mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Caller holds l->mu. */
static void lb_set_down(struct replica *r)
{
	if (r->up || !r->down_ms) {
		r->down_ms = lb_mono_ms();
		r->broken = 0;
	}
	r->up = 0;
}

void lb_mark_down(struct lb *l, struct replica *r)
{
	pthread_mutex_lock(&l->mu);
	if (r->up)
		klog_warn("replica %s is down", r->addr);
	lb_set_down(r);
	r->failures++;
	pthread_mutex_unlock(&l->mu);
}

/* ---- health -------------------------------------------------------------------------- */

/* One STATUS poll per replica. The calls are all started before any is waited for: polled one
 * after the other, a replica slow to answer (a busy worker on a loaded machine, up to
 * STATUS_TIMEOUT_MS) held back every later replica's refresh, which then kept showing the
 * load of a burst long finished while still up. A replica that does not answer is marked down
 * and its reported load cleared, so no old figure outlives the answer it came from. */
struct probe {
	struct replica *r;
	struct kvp_client *c;
	struct kvp_call *k;
	int rc;
};

static void probe_apply(struct lb *l, struct probe *p, uint8_t *body, uint32_t len)
{
	struct kvw_status st = {0};
	int rc = p->rc;
	if (!rc)
		rc = kvw_status_dec(body, len, &st);
	int running = (int)st.running, queued = (int)st.queued_tokens;
	int kv_free = (int)st.kv_free;
	uint32_t computed = st.prompt_computed;
	pthread_mutex_lock(&l->mu);
	struct replica *r = p->r;
	if (!rc && !r->up)
		klog_info("replica %s is up", r->addr);
	if (rc) {
		if (r->up)
			klog_warn("replica %s does not answer its health check: %s", r->addr,
				  kvp_strerror(rc));
		lb_set_down(r);
	} else {
		r->up = 1;
		r->down_ms = 0;
	}
	r->running = rc ? 0 : running;
	r->queued_tokens = rc ? 0 : queued;
	r->kv_free = rc ? 0 : kv_free;
	if (!rc)
		r->computed = computed;
	pthread_mutex_unlock(&l->mu);
}

static void check_all(struct lb *l)
{
	struct probe ps[3 * LB_MAX_REPLICAS];
	int n = 0;
	for (int i = 0; i < l->pf.n; i++)
		ps[n++] = (struct probe){.r = &l->pf.r[i]};
	for (int i = 0; i < l->dc.n; i++)
		ps[n++] = (struct probe){.r = &l->dc.r[i]};
	for (int i = 0; i < l->en.n; i++)
		ps[n++] = (struct probe){.r = &l->en.r[i]};
	/* addr is set once in lb_create and never written after: no lock needed to read it */
	for (int i = 0; i < n; i++) {
		struct probe *p = &ps[i];
		p->rc = kvp_pool_get(l->pool, p->r->addr, &p->c);
		if (!p->rc)
			p->rc = kvp_call_start(p->c, KVW_OP_STATUS, NULL, 0, NULL, 0, &p->k);
	}
	for (int i = 0; i < n; i++) {
		struct probe *p = &ps[i];
		uint8_t *body = NULL;
		uint32_t len = 0;
		if (p->k)
			p->rc = kvp_call_wait(p->k, STATUS_TIMEOUT_MS, &body, &len);
		if (p->c)
			kvp_pool_put(l->pool, p->c);
		probe_apply(l, p, body, len);
		free(body);
	}
}

/* Breaks what this gateway has in flight on replicas down for HUNG_MS: the prefill calls on
 * the pooled connection, the decode streams of the requests there. Caller holds l->mu. */
static void break_hung(struct lb *l)
{
	struct role *roles[3] = {&l->pf, &l->dc, &l->en};
	int64_t now = lb_mono_ms();
	for (int k = 0; k < 3; k++)
		for (int i = 0; i < roles[k]->n; i++) {
			struct replica *r = &roles[k]->r[i];
			if (r->up || !r->down_ms || r->broken || now - r->down_ms < HUNG_MS)
				continue;
			r->broken = 1;
			if (r->inflight)
				klog_warn("replica %s down for %d ms: breaking %d requests there",
					  r->addr, HUNG_MS, r->inflight);
			kvp_pool_abort(l->pool, r->addr);
			for (struct lreq *q = l->active.head; q; q = q->next) {
				pthread_mutex_lock(&q->mu);
				if (q->dec == r && q->sk)
					kvp_sock_shutdown(q->sk);
				pthread_mutex_unlock(&q->mu);
			}
		}
}

void *lb_health_main(void *arg)
{
	struct lb *l = arg;
	pthread_mutex_lock(&l->mu);
	while (!l->stop) {
		pthread_mutex_unlock(&l->mu);
		check_all(l);
		pthread_mutex_lock(&l->mu);
		break_hung(l);
		struct timespec ts;
		kvfs_deadline(&ts, CLOCK_REALTIME, HEALTH_PERIOD_MS);
		if (!l->stop)
			pthread_cond_timedwait(&l->cv, &l->mu, &ts);
	}
	pthread_mutex_unlock(&l->mu);
	return NULL;
}

int lb_parse_list(const char *s, struct role *ro)
{
	ro->n = 0;
	while (s && *s) {
		const char *e = strchr(s, ',');
		size_t n = e ? (size_t)(e - s) : strlen(s);
		char host[KVP_ADDR_MAX];
		uint16_t port;
		if (ro->n == LB_MAX_REPLICAS || n == 0 || n >= KVP_ADDR_MAX)
			return -EINVAL;
		memcpy(ro->r[ro->n].addr, s, n);
		ro->r[ro->n].addr[n] = 0;
		if (kvp_addr_parse(ro->r[ro->n].addr, host, sizeof(host), &port) || port == 0)
			return -EINVAL;
		ro->r[ro->n].up = 1; /* until a check says otherwise */
		ro->r[ro->n].id = lbp_id(ro->r[ro->n].addr);
		ro->n++;
		s = e ? e + 1 : NULL;
	}
	return ro->n ? 0 : -EINVAL;
}
