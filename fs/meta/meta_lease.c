/* Directory leases and their revocation (meta_lease.h; docs/meta.md, "Directory leases"). */
#define KVFS_LOG_TAG "meta"
#include "meta_lease.h"
#include "ktime.h"
#include "log.h"
#include "meta_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NBUCKET 256

struct ml_lease {
	uint64_t dir, holder, id;
	int64_t end; /* monotonic ns: past it the holder no longer uses the lease */
	struct ml_lease *next;
};

struct ml_rev {
	uint64_t dir, id, seq;
};

struct ml_holder {
	uint64_t id;
	uint64_t session;      /* of its last WATCH: a LEASE of another session is refused */
	struct kvp_conn *conn; /* the parked WATCH's connection (referenced), or NULL */
	struct kvp_hdr hdr;    /* the parked WATCH */
	/* Revocations are numbered per holder: sent is the last one queued, delivered the last
	 * one written to a WATCH reply, acked the last one the holder has handled. */
	uint64_t sent, delivered, acked;
	struct ml_rev *q; /* queued, seq > acked */
	size_t nq, capq;
	struct ml_holder *next;
};

struct mlease {
	pthread_mutex_t mu;
	pthread_cond_t cv; /* CLOCK_MONOTONIC; broadcast when a holder acknowledges */
	struct ml_lease *b[NBUCKET];
	struct ml_holder *holders;
	uint64_t next_id;
	atomic_ullong live;	    /* leases in the table: 0 lets a change skip everything */
	_Atomic int64_t hold_until; /* monotonic ns: namespace changes wait until then (Raft) */
	int64_t pruned;		    /* mu; monotonic ns of the last sweep of ended leases */
	atomic_ullong granted, renewed, revoked, acked, expired_waits;
};

/* A WATCH reply to send once mu is released. */
struct ml_send {
	struct kvp_conn *conn;
	struct kvp_hdr hdr;
	struct kvp_wbuf body;
	int32_t status;
};

int mlease_create(struct mlease **out)
{
	struct mlease *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	pthread_mutex_init(&l->mu, NULL);
	kvfs_cond_init_mono(&l->cv);
	*out = l;
	return 0;
}

void mlease_destroy(struct mlease *l)
{
	if (!l)
		return;
	for (int i = 0; i < NBUCKET; i++)
		while (l->b[i]) {
			struct ml_lease *e = l->b[i];
			l->b[i] = e->next;
			free(e);
		}
	while (l->holders) {
		struct ml_holder *h = l->holders;
		l->holders = h->next;
		if (h->conn) {
			kvp_reply(h->conn, &h->hdr, -ECANCELED, NULL, 0, NULL, 0);
			kvp_conn_unref(h->conn);
		}
		free(h->q);
		free(h);
	}
	pthread_cond_destroy(&l->cv);
	pthread_mutex_destroy(&l->mu);
	free(l);
}

static struct ml_holder *holder_find(struct mlease *l, uint64_t id)
{
	for (struct ml_holder *h = l->holders; h; h = h->next)
		if (h->id == id)
			return h;
	return NULL;
}

static unsigned bucket(uint64_t dir)
{
	return (unsigned)((dir * 0x9E3779B97F4A7C15ull) >> 56) % NBUCKET;
}

int mlease_grant(struct meta *m, const struct mreq *q, struct kvp_wbuf *out)
{
	struct mlease *l = m->lease;
	uint32_t ms = q->max < KVP_LEASE_MAX_MS ? q->max : KVP_LEASE_MAX_MS;
	if (ms == 0)
		return -EINVAL;
	pthread_mutex_lock(&l->mu);
	struct ml_holder *h = holder_find(l, q->uuid);
	if (!h || h->session != q->session) {
		/* No WATCH of this session yet: a grant now could be forgotten by that WATCH
		 * when it comes (a new session drops the holder's leases), unrevoked. */
		pthread_mutex_unlock(&l->mu);
		return -ESRCH;
	}
	struct ml_lease **pp = &l->b[bucket(q->ino)], *e = *pp;
	while (e && !(e->dir == q->ino && e->holder == q->uuid))
		e = e->next;
	int64_t now = meta_mono_ns();
	if (q->renew) {
		/* A renewal: only of the lease still in the table (never revoked, so the
		 * holder's listing is exact), and not of one already over. */
		if (!e || e->id != q->renew || e->end <= now) {
			pthread_mutex_unlock(&l->mu);
			return -ESTALE;
		}
		e->end = now + (int64_t)ms * 1000000;
		pthread_mutex_unlock(&l->mu);
		atomic_fetch_add_explicit(&l->renewed, 1, memory_order_relaxed);
		kvp_w_u64(out, q->renew);
		kvp_w_u32(out, ms);
		return 0;
	}
	if (!e) {
		e = calloc(1, sizeof(*e));
		if (!e) {
			pthread_mutex_unlock(&l->mu);
			return -ENOMEM;
		}
		e->dir = q->ino;
		e->holder = q->uuid;
		e->next = *pp;
		*pp = e;
		atomic_fetch_add(&l->live, 1);
	}
	/* Registered before the holder can read the listing: a change applied after this is
	 * revoked, one applied before it is in the listing. */
	e->id = ++l->next_id;
	e->end = now + (int64_t)ms * 1000000;
	uint64_t id = e->id;
	pthread_mutex_unlock(&l->mu);
	atomic_fetch_add_explicit(&l->granted, 1, memory_order_relaxed);
	kvp_w_u64(out, id);
	kvp_w_u32(out, ms);
	return 0;
}

/* The holder's undelivered revocations into s (a reply to its parked WATCH); l->mu held. */
static int deliver(struct ml_holder *h, struct ml_send *s)
{
	if (!h->conn || h->sent == h->delivered)
		return 0;
	kvp_w_init(&s->body);
	kvp_w_u64(&s->body, h->sent);
	uint32_t n = 0;
	for (size_t i = 0; i < h->nq; i++)
		n += h->q[i].seq > h->delivered;
	kvp_w_u32(&s->body, n);
	for (size_t i = 0; i < h->nq; i++)
		if (h->q[i].seq > h->delivered) {
			kvp_w_u64(&s->body, h->q[i].dir);
			kvp_w_u64(&s->body, h->q[i].id);
		}
	s->conn = h->conn;
	s->hdr = h->hdr;
	s->status = 0;
	h->conn = NULL;
	h->delivered = h->sent;
	return 1;
}

static void send_one(struct ml_send *s)
{
	int rc = s->body.err;
	if (rc == 0)
		kvp_reply(s->conn, &s->hdr, s->status, s->status ? NULL : s->body.p,
			  s->status ? 0 : s->body.len, NULL, 0);
	else
		kvp_reply(s->conn, &s->hdr, rc, NULL, 0, NULL, 0);
	kvp_conn_unref(s->conn);
	kvp_w_free(&s->body);
}

int mlease_watch(struct meta *m, struct kvp_conn *c, const struct kvp_hdr *hdr,
		 const struct mreq *q)
{
	struct mlease *l = m->lease;
	struct ml_send s[2];
	int ns = 0;
	pthread_mutex_lock(&l->mu);
	struct ml_holder *h = holder_find(l, q->uuid);
	if (!h && !(h = calloc(1, sizeof(*h)))) {
		pthread_mutex_unlock(&l->mu);
		kvp_reply(c, hdr, -ENOMEM, NULL, 0, NULL, 0);
		return 0;
	}
	if (!h->id) {
		h->id = q->uuid;
		h->next = l->holders;
		l->holders = h;
	} else if (q->session < h->session) {
		/* a WATCH from a connection the holder has given up, overtaken by a newer one */
		pthread_mutex_unlock(&l->mu);
		kvp_reply(c, hdr, -ECANCELED, NULL, 0, NULL, 0);
		return 0;
	}
	if (h->conn) { /* an earlier WATCH, from a connection the holder has given up */
		s[ns].conn = h->conn;
		s[ns].hdr = h->hdr;
		s[ns].status = -ECANCELED;
		kvp_w_init(&s[ns++].body);
		h->conn = NULL;
	}
	if (q->session != h->session) {
		/* A new session: the holder dropped every lease before it began it. */
		h->session = q->session;
		for (int i = 0; i < NBUCKET; i++)
			for (struct ml_lease **pp = &l->b[i]; *pp;) {
				struct ml_lease *e = *pp;
				if (e->holder == h->id) {
					*pp = e->next;
					free(e);
					atomic_fetch_sub(&l->live, 1);
				} else
					pp = &e->next;
			}
		h->acked = h->delivered = h->sent;
		h->nq = 0;
	} else if (q->acked > h->acked && q->acked <= h->delivered) {
		h->acked = q->acked;
		size_t k = 0;
		for (size_t i = 0; i < h->nq; i++)
			if (h->q[i].seq > h->acked)
				h->q[k++] = h->q[i];
		h->nq = k;
		atomic_fetch_add_explicit(&l->acked, 1, memory_order_relaxed);
	}
	pthread_cond_broadcast(&l->cv);
	kvp_conn_ref(c);
	h->conn = c;
	h->hdr = *hdr;
	ns += deliver(h, &s[ns]);
	pthread_mutex_unlock(&l->mu);
	for (int i = 0; i < ns; i++)
		send_one(&s[i]);
	return 0;
}

/* A holder whose acknowledgement a change waits for. */
struct ml_wait {
	uint64_t holder, seq;
	int64_t end;
};

/* Removes every lease on the dirs, queues their revocations and fills the replies to send
 * (sends, at most one per holder: *nsend) and what to wait for (*nw). l->mu held. */
static int revoke_locked(struct mlease *l, const uint64_t *dirs, int nd, struct ml_wait **w,
			 size_t *nw, struct ml_send **sends, size_t *nsend)
{
	int64_t now = meta_mono_ns();
	if (now - l->pruned > 1000000000) {
		/* Ended leases nobody revoked: without this sweep `live` would stay above 0
		 * and every change pay for the lookups of its directories. */
		l->pruned = now;
		for (int i = 0; i < NBUCKET; i++)
			for (struct ml_lease **pp = &l->b[i]; *pp;) {
				struct ml_lease *e = *pp;
				if (e->end <= now) {
					*pp = e->next;
					free(e);
					atomic_fetch_sub(&l->live, 1);
				} else
					pp = &e->next;
			}
	}
	for (int d = 0; d < nd; d++) {
		for (struct ml_lease **pp = &l->b[bucket(dirs[d])]; *pp;) {
			struct ml_lease *e = *pp;
			if (e->dir != dirs[d]) {
				pp = &e->next;
				continue;
			}
			*pp = e->next;
			atomic_fetch_sub(&l->live, 1);
			struct ml_holder *h = holder_find(l, e->holder);
			if (h && e->end > now) {
				if (h->nq == h->capq) {
					size_t cap = h->capq ? h->capq * 2 : 8;
					struct ml_rev *nq = realloc(h->q, cap * sizeof(*nq));
					if (!nq) {
						/* cannot tell the holder: its lease must run out */
						struct ml_wait *nw2 =
						    realloc(*w, (*nw + 1) * sizeof(**w));
						if (nw2) {
							*w = nw2;
							(*w)[(*nw)++] = (struct ml_wait){
							    .holder = 0, .end = e->end};
						}
						free(e);
						continue;
					}
					h->q = nq;
					h->capq = cap;
				}
				h->q[h->nq++] =
				    (struct ml_rev){.dir = e->dir, .id = e->id, .seq = ++h->sent};
				struct ml_wait *nw2 = realloc(*w, (*nw + 1) * sizeof(**w));
				if (nw2) {
					*w = nw2;
					(*w)[(*nw)++] = (struct ml_wait){
					    .holder = h->id, .seq = h->sent, .end = e->end};
				}
				atomic_fetch_add_explicit(&l->revoked, 1, memory_order_relaxed);
			}
			free(e);
		}
	}
	/* one reply per holder that has something undelivered and a parked WATCH */
	for (struct ml_holder *h = l->holders; h; h = h->next) {
		if (!h->conn || h->sent == h->delivered)
			continue;
		struct ml_send *ns = realloc(*sends, (*nsend + 1) * sizeof(**sends));
		if (!ns)
			continue; /* the wait ends with the lease instead */
		*sends = ns;
		*nsend += deliver(h, &(*sends)[*nsend]);
	}
	return 0;
}

static void revoke(struct mlease *l, const uint64_t *dirs, int nd, int wait)
{
	struct ml_wait *w = NULL;
	struct ml_send *s = NULL;
	size_t nw = 0, nsend = 0;
	pthread_mutex_lock(&l->mu);
	revoke_locked(l, dirs, nd, &w, &nw, &s, &nsend);
	pthread_mutex_unlock(&l->mu);
	for (size_t i = 0; i < nsend; i++)
		send_one(&s[i]);
	free(s);
	if (!wait || !nw) {
		free(w);
		return;
	}
	pthread_mutex_lock(&l->mu);
	for (;;) {
		int64_t now = meta_mono_ns(), next = 0;
		for (size_t i = 0; i < nw; i++) {
			if (!w[i].end)
				continue;
			struct ml_holder *h = w[i].holder ? holder_find(l, w[i].holder) : NULL;
			if (h && h->acked >= w[i].seq)
				w[i].end = 0;
			else if (now >= w[i].end) {
				atomic_fetch_add_explicit(&l->expired_waits, 1,
							  memory_order_relaxed);
				w[i].end = 0;
			} else if (!next || w[i].end < next)
				next = w[i].end;
		}
		if (!next)
			break;
		struct timespec t = {.tv_sec = next / 1000000000, .tv_nsec = next % 1000000000};
		pthread_cond_timedwait(&l->cv, &l->mu, &t);
	}
	pthread_mutex_unlock(&l->mu);
	free(w);
}

void mlease_revoke_nowait(struct meta *m, uint64_t dir)
{
	if (m->lease && atomic_load(&m->lease->live))
		revoke(m->lease, &dir, 1, 0);
}

void mlease_lead(struct mlease *l, int64_t hold_ns)
{
	atomic_store(&l->hold_until, meta_mono_ns() + hold_ns);
}

/* Adds dir and the directory holding it (whose entry shows dir's times) to dirs. */
static void add_dir(struct meta *m, uint64_t *dirs, int *nd, int cap, uint64_t dir)
{
	if (!dir || *nd >= cap)
		return;
	dirs[(*nd)++] = dir;
	struct mino d;
	if (*nd < cap && mdb_inode_get(m, NULL, dir, &d) == 0 && d.parent && d.parent != dir)
		dirs[(*nd)++] = d.parent;
}

void mlease_after(struct meta *m, uint16_t op, const struct mreq *q)
{
	struct mlease *l = m->lease;
	switch (op) {
	case KVP_OP_COMMIT:
	case KVP_OP_UNLINK:
	case KVP_OP_RMDIR:
	case KVP_OP_MKDIR:
	case KVP_OP_RENAME:
	case KVP_OP_SETATTR:
	case KVP_OP_BFILL:
		break;
	default:
		return; /* TOUCH moves access times only: docs/meta.md, "Directory leases" */
	}
	/* A new leader does not know the leases its predecessor granted: it waits them out. */
	int64_t until = atomic_load(&l->hold_until), now = meta_mono_ns();
	if (until > now) {
		struct timespec t = {.tv_sec = (until - now) / 1000000000,
				     .tv_nsec = (until - now) % 1000000000};
		nanosleep(&t, NULL);
	}
	if (!atomic_load(&l->live))
		return;
	uint64_t dirs[8];
	int nd = 0;
	if (op == KVP_OP_SETATTR) {
		struct mino f;
		if (mdb_inode_get(m, NULL, q->ino, &f) == 0 && f.parent && f.parent != q->ino)
			dirs[nd++] = f.parent;
	} else if (op == KVP_OP_BFILL) {
		size_t off = 0;
		uint64_t p;
		struct mreq_str nm;
		while (mreq_bfill_next(q, &off, &p, &nm) == 0) {
			uint64_t one[2];
			int n1 = 0;
			add_dir(m, one, &n1, 2, p);
			revoke(l, one, n1, 1);
		}
		return;
	} else {
		add_dir(m, dirs, &nd, 8, q->parent);
		if (op == KVP_OP_RENAME && q->newparent != q->parent)
			add_dir(m, dirs, &nd, 8, q->newparent);
	}
	if (nd)
		revoke(l, dirs, nd, 1);
}

void mlease_get_stats(struct mlease *l, struct mlease_stats *o)
{
	o->granted = atomic_load(&l->granted);
	o->renewed = atomic_load(&l->renewed);
	o->revoked = atomic_load(&l->revoked);
	o->acked = atomic_load(&l->acked);
	o->expired_waits = atomic_load(&l->expired_waits);
	o->live = atomic_load(&l->live);
}
