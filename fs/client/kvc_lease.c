/* kvc: directory leases, the holder's side (kvc.h, kvc_lease_*; docs/meta.md, "Directory
 * leases"). A watch thread keeps one WATCH parked on the meta it is connected to and drops the
 * leases meta revokes; a lookup that finds no lease counts toward a burst in its directory and,
 * at the burst's end, takes a lease and reads the listing on that same meta. */
#define KVFS_LOG_TAG "kvc"
#include "kvc_int.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define KL_SLOTS	  64
#define KL_PAGE		  4096u
#define KL_BURST_NS	  1000000000
#define KL_WATCH_MS	  (24 * 3600 * 1000)
#define KL_RETRY_NS	  200000000
#define KL_BACKOFF_NS	  250000000
#define KL_BACKOFF_MAX_NS 8000000000

struct kl_ent {
	uint32_t off; /* name in names */
	uint16_t len;
	uint8_t pinned; /* answered with pin_ms: lost() names it */
	struct kvp_attr a;
};

struct kl_dir {
	uint64_t dir;
	int state;	     /* 0 none, 1 a lease being fetched, 2 held */
	uint64_t id;	     /* held: the lease id */
	uint64_t revoked_id; /* fetching: the highest id meta revoked meanwhile */
	int64_t end;	     /* held: monotonic ns past which it is not used */
	struct kl_ent *e;    /* held: the listing, in meta's (byte) order */
	size_t n;
	char *names;
	uint32_t burst; /* lookups meta answered "found" since burst_t0 */
	int64_t burst_t0;
	/* After a revocation no new lease until quiet_until: a directory that keeps changing
	 * would otherwise be listed again and again (backoff doubles, up to KL_BACKOFF_MAX_NS,
	 * and starts over once a lease ends unrevoked). */
	int64_t backoff, quiet_until;
	int renewing;  /* held: a renewal is on its way */
	size_t last_n; /* entries of the last listing read: a big directory needs a bigger burst */
	/* held: names pinned (kl_ent.pinned), and when the last pin given runs out (monotonic ns,
	 * with a margin for the reply's way to the kernel); the keeper renews until then. */
	size_t npinned;
	int64_t pin_until;
};

/* A lease with pins that ended: the names to hand to lost(). */
struct kl_lost {
	uint64_t dir;
	char *names; /* n NUL-terminated names back to back */
	size_t n;
};

struct kvc_lease {
	struct kvc *c;
	struct kvc_lease_opts o;
	uint64_t holder;
	pthread_mutex_t mu; /* protects d, epoch, addr, watching, wcl */
	struct kl_dir d[KL_SLOTS];
	/* The session: moves when the watch connection ends (every lease is dropped); a WATCH
	 * announces it to meta, which then refuses LEASEs of older ones (kvp.h). */
	uint64_t epoch;
	char addr[KVP_ADDR_MAX];
	int watching;		/* a WATCH was sent on the connection to addr */
	struct kvp_client *wcl; /* the watch connection (the watch thread opens and closes it) */
	pthread_t thr, keeper;
	int keeper_started;
	pthread_mutex_t cb_mu; /* held around each lost() call; protects muted */
	int muted;	       /* kvc_lease_mute: no more lost() calls */
	atomic_int stop;
	atomic_ullong granted, renewed, hits, negatives, revoked, dropped, refused;
	atomic_ullong pinned, lost, expired;
};

static int64_t mono_ns(void)
{
	return (int64_t)kvc__now_ns();
}

static void dir_free(struct kl_dir *d)
{
	free(d->e);
	free(d->names);
	d->e = NULL;
	d->names = NULL;
	d->n = 0;
	d->state = 0;
	d->npinned = 0;
	d->pin_until = 0;
}

/* Copies d's pinned names into *o (d still held); l->mu held. A copy that fails leaves
 * o->names NULL: the caller then names nothing, and the kernel keeps its entries until they
 * run out (logged). */
static void take_pins(struct kl_dir *d, struct kl_lost *o)
{
	size_t len = 0;
	*o = (struct kl_lost){.dir = d->dir};
	if (!d->npinned)
		return;
	for (size_t i = 0; i < d->n; i++)
		if (d->e[i].pinned)
			len += d->e[i].len + 1u;
	char *p = malloc(len ? len : 1);
	if (!p) {
		klog_warn("directory %llu: %zu pinned names not invalidated (no memory)",
			  (unsigned long long)d->dir, d->npinned);
		return;
	}
	o->names = p;
	for (size_t i = 0; i < d->n; i++)
		if (d->e[i].pinned) {
			memcpy(p, d->names + d->e[i].off, d->e[i].len);
			p += d->e[i].len;
			*p++ = 0;
			o->n++;
		}
}

/* Appends d's pins to *v (grown as needed); l->mu held. */
static void add_lost(struct kl_dir *d, struct kl_lost **v, size_t *n, size_t *cap)
{
	if (!d->npinned)
		return;
	if (*n == *cap) {
		size_t nc = *cap ? *cap * 2 : 4;
		struct kl_lost *nv = realloc(*v, nc * sizeof(*nv));
		if (!nv) {
			klog_warn("directory %llu: pinned names not invalidated (no memory)",
				  (unsigned long long)d->dir);
			return;
		}
		*v = nv;
		*cap = nc;
	}
	take_pins(d, &(*v)[(*n)++]);
}

/* Hands each lost lease's names to lost() and frees v; no lock held. */
static void call_lost(struct kvc_lease *l, struct kl_lost *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		pthread_mutex_lock(&l->cb_mu);
		if (v[i].names && l->o.lost && !l->muted)
			l->o.lost(l->o.arg, v[i].dir, v[i].names, v[i].n);
		pthread_mutex_unlock(&l->cb_mu);
		free(v[i].names);
		atomic_fetch_add_explicit(&l->lost, 1, memory_order_relaxed);
	}
	free(v);
}

static struct kl_dir *slot(struct kvc_lease *l, uint64_t dir)
{
	return &l->d[(dir * 0x9E3779B97F4A7C15ull >> 40) % KL_SLOTS];
}

/* Every lease dropped (the watch connection ended: revocations may be lost); l->mu held. Pins
 * are appended to *v (call_lost once l->mu is released). */
static void drop_all(struct kvc_lease *l, struct kl_lost **v, size_t *n, size_t *cap)
{
	for (int i = 0; i < KL_SLOTS; i++)
		if (l->d[i].state == 2) {
			add_lost(&l->d[i], v, n, cap);
			dir_free(&l->d[i]);
			atomic_fetch_add_explicit(&l->dropped, 1, memory_order_relaxed);
		}
	l->epoch++;
	l->watching = 0;
}

static void *watch_main(void *arg)
{
	struct kvc_lease *l = arg;
	uint64_t acked = 0, session = 0;
	while (!atomic_load(&l->stop)) {
		pthread_mutex_lock(&l->mu);
		struct kvp_client *cl = l->wcl;
		pthread_mutex_unlock(&l->mu);
		if (!cl) {
			char addr[KVP_ADDR_MAX];
			pthread_mutex_lock(&l->c->meta_mu);
			int cur = atomic_load(&l->c->meta_cur);
			memcpy(addr, l->c->metas[cur < l->c->nmetas ? cur : 0], KVP_ADDR_MAX);
			pthread_mutex_unlock(&l->c->meta_mu);
			if (kvp_client_open(addr, &l->c->secret, l->c->timeout_ms, &cl)) {
				nanosleep(&(struct timespec){0, KL_RETRY_NS}, NULL);
				continue;
			}
			pthread_mutex_lock(&l->mu);
			l->wcl = cl;
			snprintf(l->addr, sizeof(l->addr), "%s", addr);
			session = l->epoch; /* every lease of earlier sessions is dropped */
			pthread_mutex_unlock(&l->mu);
			if (atomic_load(&l->stop)) /* kvc_lease_close may have missed it */
				kvp_client_shutdown(cl);
			acked = 0;
		}
		uint8_t req[24];
		struct kvp_wbuf w;
		kvp_w_init(&w);
		kvp_w_u64(&w, l->holder);
		kvp_w_u64(&w, session);
		kvp_w_u64(&w, acked);
		memcpy(req, w.p, sizeof(req));
		kvp_w_free(&w);
		struct kvp_call *call;
		int rc = kvp_call_start(cl, KVP_OP_WATCH, req, sizeof(req), NULL, 0, &call);
		if (rc == 0) {
			/* A LEASE sent from now on (another connection to the same meta) finds
			 * the holder once meta has read this; before that it is refused. */
			pthread_mutex_lock(&l->mu);
			l->watching = 1;
			pthread_mutex_unlock(&l->mu);
		}
		uint8_t *b = NULL;
		uint32_t bl = 0;
		if (rc == 0)
			rc = kvp_call_wait(call, KL_WATCH_MS, &b, &bl);
		if (rc == 0) {
			struct kvp_rbuf r;
			kvp_r_init(&r, b, bl);
			uint64_t seq = kvp_r_u64(&r);
			uint32_t n = kvp_r_u32(&r);
			struct kl_lost *lv = NULL;
			size_t ln = 0, lcap = 0;
			pthread_mutex_lock(&l->mu);
			for (uint32_t i = 0; i < n && !r.err; i++) {
				uint64_t dir = kvp_r_u64(&r), id = kvp_r_u64(&r);
				struct kl_dir *d = slot(l, dir);
				if (r.err || d->dir != dir)
					continue;
				if (d->state == 2 && d->id <= id) {
					add_lost(d, &lv, &ln, &lcap);
					dir_free(d);
					d->backoff = d->backoff ? d->backoff * 2 : KL_BACKOFF_NS;
					if (d->backoff > KL_BACKOFF_MAX_NS)
						d->backoff = KL_BACKOFF_MAX_NS;
					d->quiet_until = mono_ns() + d->backoff;
					atomic_fetch_add_explicit(&l->revoked, 1,
								  memory_order_relaxed);
				} else if (d->state == 1 && id > d->revoked_id)
					d->revoked_id = id;
			}
			if (r.err) /* cannot tell what was revoked: nothing is trusted */
				drop_all(l, &lv, &ln, &lcap);
			pthread_mutex_unlock(&l->mu);
			/* Before the acknowledgement (the next WATCH): the change waits for the
			 * holder's cached names to be dropped. */
			call_lost(l, lv, ln);
			free(b);
			if (r.err) {
				rc = -EBADMSG;
			} else {
				acked = seq;
				continue;
			}
		}
		if (rc == -EOPNOTSUPP) { /* a meta without leases: lookups all go to meta */
			klog_info("meta %s grants no directory leases", l->addr);
			atomic_store(&l->stop, 1);
		}
		/* The connection (or the meta behind it) is gone: so is every lease taken on it. */
		struct kl_lost *lv = NULL;
		size_t ln = 0, lcap = 0;
		pthread_mutex_lock(&l->mu);
		drop_all(l, &lv, &ln, &lcap);
		cl = l->wcl;
		l->wcl = NULL;
		pthread_mutex_unlock(&l->mu);
		call_lost(l, lv, ln);
		kvp_client_close(cl);
		if (!atomic_load(&l->stop)) {
			klog_debug("lease watch on %s: %s", l->addr, kvp_strerror(rc));
			nanosleep(&(struct timespec){0, KL_RETRY_NS}, NULL);
		}
	}
	return NULL;
}

static void *keep_main(void *arg);

int kvc_lease_open(struct kvc *c, const struct kvc_lease_opts *o, struct kvc_lease **out)
{
	struct kvc_lease *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->c = c;
	l->o = *o;
	if (l->o.ms == 0 || l->o.ms > KVP_LEASE_MAX_MS)
		l->o.ms = KVP_LEASE_MAX_MS;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	/* Unique per mount process and start: pid, time and the object's address mixed. */
	l->holder = ((uint64_t)ts.tv_nsec << 32 ^ (uint64_t)ts.tv_sec ^ (uint64_t)getpid() << 20 ^
		     (uint64_t)(uintptr_t)l) *
			0x9E3779B97F4A7C15ull |
		    1;
	l->epoch = 1;
	pthread_mutex_init(&l->mu, NULL);
	pthread_mutex_init(&l->cb_mu, NULL);
	if (!l->o.lost)
		l->o.pin_ms = 0;
	int rc = pthread_create(&l->thr, NULL, watch_main, l);
	if (rc) {
		pthread_mutex_destroy(&l->cb_mu);
		pthread_mutex_destroy(&l->mu);
		free(l);
		return -rc;
	}
	if (l->o.pin_ms) {
		if ((rc = pthread_create(&l->keeper, NULL, keep_main, l))) {
			klog_warn("no lease keeper thread (%s): no names pinned", strerror(rc));
			l->o.pin_ms = 0;
		} else {
			l->keeper_started = 1;
		}
	}
	*out = l;
	return 0;
}

void kvc_lease_close(struct kvc_lease *l)
{
	if (!l)
		return;
	atomic_store(&l->stop, 1);
	pthread_mutex_lock(&l->mu);
	if (l->wcl)
		kvp_client_shutdown(l->wcl);
	pthread_mutex_unlock(&l->mu);
	pthread_join(l->thr, NULL);
	if (l->keeper_started)
		pthread_join(l->keeper, NULL);
	for (int i = 0; i < KL_SLOTS; i++)
		dir_free(&l->d[i]);
	pthread_mutex_destroy(&l->cb_mu);
	pthread_mutex_destroy(&l->mu);
	free(l);
}

void kvc_lease_mute(struct kvc_lease *l)
{
	if (!l)
		return;
	pthread_mutex_lock(&l->cb_mu); /* waits for a lost() call in progress */
	l->muted = 1;
	pthread_mutex_unlock(&l->cb_mu);
}

static int ent_cmp(const char *names, const struct kl_ent *e, const char *name, size_t len)
{
	size_t n = e->len < len ? e->len : len;
	int c = memcmp(names + e->off, name, n);
	return c ? c : (e->len > len) - (e->len < len);
}

/* From a held lease d: 0 (*out), -ENOENT; l->mu held. */
static int answer(struct kvc_lease *l, struct kl_dir *d, const char *name, struct kvp_attr *out,
		  int64_t now, int64_t *left_ns)
{
	size_t lo = 0, hi = d->n, len = strlen(name);
	*left_ns = d->end - now;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = ent_cmp(d->names, &d->e[mid], name, len);
		if (c == 0) {
			*out = d->e[mid].a;
			atomic_fetch_add_explicit(&l->hits, 1, memory_order_relaxed);
			if (l->o.pin_ms) {
				/* The caller keeps the answer pin_ms: the keeper keeps the lease
				 * that long (plus 1 s for the reply to reach the kernel). */
				int64_t pin = (int64_t)l->o.pin_ms * 1000000;
				if (!d->e[mid].pinned) {
					d->e[mid].pinned = 1;
					d->npinned++;
					atomic_fetch_add_explicit(&l->pinned, 1,
								  memory_order_relaxed);
				}
				if (now + pin + 1000000000 > d->pin_until)
					d->pin_until = now + pin + 1000000000;
				*left_ns = pin;
			}
			return 0;
		}
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	atomic_fetch_add_explicit(&l->negatives, 1, memory_order_relaxed);
	return -ENOENT;
}

/* One LEASE call on cl: a new lease (id 0) or the extension of lease id; *got: the lease's id,
 * *ms granted from *sent_ns. 0 or -errno (-ESTALE: id was revoked meanwhile). */
static int lease_call(struct kvc_lease *l, struct kvp_client *cl, uint64_t session, uint64_t dir,
		      uint64_t id, int64_t *sent_ns, uint32_t *ms, uint64_t *got)
{
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u64(&w, l->holder);
	kvp_w_u64(&w, session);
	kvp_w_u64(&w, dir);
	kvp_w_u32(&w, l->o.ms);
	kvp_w_u64(&w, id);
	uint8_t *b = NULL;
	uint32_t bl = 0;
	*sent_ns = mono_ns(); /* the lease is counted from here, before meta granted it */
	int rc = w.err ? w.err
		       : kvp_call(cl, KVP_OP_LEASE, w.p, w.len, NULL, 0, l->c->timeout_ms, &b, &bl);
	kvp_w_free(&w);
	if (rc == 0) {
		struct kvp_rbuf r;
		kvp_r_init(&r, b, bl);
		*got = kvp_r_u64(&r);
		*ms = kvp_r_u32(&r);
		rc = kvp_r_end(&r) || *ms == 0 ? -EBADMSG : 0;
	}
	free(b);
	return rc;
}

/* LEASE then the whole listing, on the meta at addr; fills d's listing fields. 0 or -errno. */
static int fetch(struct kvc_lease *l, const char *addr, uint64_t session, uint64_t dir,
		 struct kl_dir *d, int64_t *sent_ns, uint32_t *ms)
{
	struct kvp_client *cl;
	int rc = kvp_pool_get(l->c->pool, addr, &cl);
	if (rc)
		return rc;
	rc = lease_call(l, cl, session, dir, 0, sent_ns, ms, &d->id);
	struct kvp_wbuf w;
	uint8_t *b;
	uint32_t bl = 0;
	size_t cap = 0, ncap = 0, nlen = 0;
	char last[KVP_NAME_MAX];
	uint16_t lastlen = 0;
	for (int eof = 0; rc == 0 && !eof;) {
		kvp_w_init(&w);
		kvp_w_u64(&w, dir);
		kvp_w_u16(&w, lastlen);
		kvp_w_bytes(&w, last, lastlen);
		kvp_w_u32(&w, KL_PAGE);
		b = NULL;
		rc = w.err ? w.err
			   : kvp_call(cl, KVP_OP_READDIR, w.p, w.len, NULL, 0, l->c->timeout_ms, &b,
				      &bl);
		kvp_w_free(&w);
		if (rc)
			break;
		struct kvp_rbuf r;
		kvp_r_init(&r, b, bl);
		uint32_t n = kvp_r_u32(&r);
		for (uint32_t i = 0; i < n && !r.err; i++) {
			uint16_t len = kvp_r_u16(&r);
			const uint8_t *p = kvp_r_bytes(&r, len);
			struct kvp_attr a;
			kvp_r_attr(&r, &a);
			if (r.err || !p || len == 0 || len > KVP_NAME_MAX)
				break;
			if (d->n == cap) {
				cap = cap ? cap * 2 : 256;
				struct kl_ent *ne = realloc(d->e, cap * sizeof(*ne));
				if (!ne) {
					rc = -ENOMEM;
					break;
				}
				d->e = ne;
			}
			if (nlen + len > ncap) {
				ncap = (ncap ? ncap * 2 : 8192) + len;
				char *nn = realloc(d->names, ncap);
				if (!nn) {
					rc = -ENOMEM;
					break;
				}
				d->names = nn;
			}
			memcpy(d->names + nlen, p, len);
			d->e[d->n++] = (struct kl_ent){.off = (uint32_t)nlen, .len = len, .a = a};
			nlen += len;
			memcpy(last, p, len);
			lastlen = len;
		}
		eof = kvp_r_u8(&r);
		if (!rc && (r.err || kvp_r_end(&r)))
			rc = -EBADMSG;
		free(b);
	}
	kvp_pool_put(l->c->pool, cl);
	return rc;
}

/* Asks the meta at addr to extend lease id on dir: 0 (*ms granted from *sent_ns), or -ESTALE
 * (revoked meanwhile) or another error. */
static int renew(struct kvc_lease *l, const char *addr, uint64_t session, uint64_t dir, uint64_t id,
		 int64_t *sent_ns, uint32_t *ms)
{
	struct kvp_client *cl;
	int rc = kvp_pool_get(l->c->pool, addr, &cl);
	if (rc)
		return rc;
	uint64_t got = 0;
	rc = lease_call(l, cl, session, dir, id, sent_ns, ms, &got);
	kvp_pool_put(l->c->pool, cl);
	return rc == 0 && got != id ? -EBADMSG : rc;
}

/* A lookup answered "found" from held lease d, with less than half of it left: extends it
 * (the listing stays). l->mu held on entry and on return (released meanwhile). */
static void renew_held(struct kvc_lease *l, struct kl_dir *d, uint64_t dir)
{
	d->renewing = 1;
	uint64_t id = d->id, epoch = l->epoch;
	char addr[KVP_ADDR_MAX];
	memcpy(addr, l->addr, sizeof(addr));
	pthread_mutex_unlock(&l->mu);
	int64_t sent = 0;
	uint32_t ms = 0;
	int rc = renew(l, addr, epoch, dir, id, &sent, &ms);
	pthread_mutex_lock(&l->mu);
	/* Still the same lease, never revoked (a revocation would have freed it): the listing
	 * is exact, and meta extended the lease from a moment after sent. */
	if (d->dir == dir && d->state == 2 && d->id == id && l->epoch == epoch) {
		d->renewing = 0;
		int64_t end = sent + (int64_t)ms * 990000;
		if (rc == 0 && end > d->end) {
			d->end = end;
			atomic_fetch_add_explicit(&l->renewed, 1, memory_order_relaxed);
		}
	}
}

/* The keeper (pin_ms > 0): every 50 ms, a held lease with live pins and less than 70 % of it
 * left is renewed (one at a time, as renew_held; early, so that a loaded machine's slow
 * renewal or late tick does not lose the pins); one with less than 10 % left (renewals
 * failing: meta away or slow) is dropped and its pins named to lost(), ahead of its end, so
 * the kernel drops them before meta lets a change through on the lease's expiry. Pins that
 * ran out (the kernel dropped them) are forgotten and the lease left to run out, or to be
 * renewed by use as any other. */
static void *keep_main(void *arg)
{
	struct kvc_lease *l = arg;
	while (!atomic_load(&l->stop)) {
		nanosleep(&(struct timespec){0, 50000000}, NULL);
		struct kl_lost *lv = NULL;
		size_t ln = 0, lcap = 0;
		pthread_mutex_lock(&l->mu);
		for (int i = 0; i < KL_SLOTS && !atomic_load(&l->stop); i++) {
			struct kl_dir *d = &l->d[i];
			if (d->state != 2 || !d->npinned)
				continue;
			int64_t now = mono_ns(), left = d->end - now;
			if (now >= d->pin_until) {
				for (size_t j = 0; j < d->n; j++)
					d->e[j].pinned = 0;
				d->npinned = 0;
				continue;
			}
			if (left < (int64_t)l->o.ms * 100000) {
				add_lost(d, &lv, &ln, &lcap);
				dir_free(d);
				atomic_fetch_add_explicit(&l->expired, 1, memory_order_relaxed);
				continue;
			}
			if (left < (int64_t)l->o.ms * 700000 && !d->renewing)
				renew_held(l, d, d->dir); /* releases l->mu meanwhile */
		}
		pthread_mutex_unlock(&l->mu);
		call_lost(l, lv, ln);
	}
	return NULL;
}

int kvc_lease_lookup(struct kvc_lease *l, uint64_t dir, const char *name, struct kvp_attr *out,
		     int64_t *left_ns)
{
	if (!l)
		return -EAGAIN;
	int64_t now = mono_ns();
	int rc = -EAGAIN;
	pthread_mutex_lock(&l->mu);
	struct kl_dir *d = slot(l, dir);
	if (d->dir == dir && d->state == 2) {
		if (now < d->end)
			rc = answer(l, d, name, out, now, left_ns);
		else if (d->npinned && now < d->pin_until) {
			/* ran out with pins: the keeper names them to lost() (not from here,
			 * a request's thread) */
		} else {
			dir_free(d); /* ran out unrevoked: a burst that goes on takes a new one */
			d->backoff = 0;
		}
	}
	pthread_mutex_unlock(&l->mu);
	return rc;
}

void kvc_lease_note(struct kvc_lease *l, uint64_t dir)
{
	if (!l || l->o.after <= 0)
		return;
	int64_t now = mono_ns();
	pthread_mutex_lock(&l->mu);
	struct kl_dir *d = slot(l, dir);
	if (d->dir == dir && d->state == 2) {
		/* renewed by use: a lease still in use when half of it is gone */
		if (!d->renewing && now < d->end && d->end - now < (int64_t)l->o.ms * 500000)
			renew_held(l, d, dir);
		pthread_mutex_unlock(&l->mu);
		return;
	}
	if (d->dir != dir) {
		/* another directory's lease on its way, or held with pins the kernel may keep */
		if (d->state == 1 || (d->state == 2 && d->npinned && now < d->pin_until)) {
			pthread_mutex_unlock(&l->mu);
			return;
		}
		dir_free(d);
		*d = (struct kl_dir){.dir = dir};
	}
	if (d->state != 0 || !l->watching || now < d->quiet_until) {
		pthread_mutex_unlock(&l->mu);
		return;
	}
	if (now - d->burst_t0 > KL_BURST_NS) {
		d->burst_t0 = now;
		d->burst = 0;
	}
	/* The listing costs meta and the wire O(entries): once a directory is known to be big,
	 * a burst must be as big as 1/16 of it to pay for the next one. */
	size_t need = (size_t)l->o.after > d->last_n / 16 ? (size_t)l->o.after : d->last_n / 16;
	if (++d->burst < need) {
		pthread_mutex_unlock(&l->mu);
		return;
	}
	d->state = 1;
	d->burst = 0;
	d->revoked_id = 0;
	uint64_t epoch = l->epoch;
	char addr[KVP_ADDR_MAX];
	memcpy(addr, l->addr, sizeof(addr));
	pthread_mutex_unlock(&l->mu);

	struct kl_dir f = {.dir = dir};
	int64_t sent = 0;
	uint32_t ms = 0;
	int rc = fetch(l, addr, epoch, dir, &f, &sent, &ms);

	pthread_mutex_lock(&l->mu);
	now = mono_ns();
	/* 1% under what meta granted: the two clocks' rates may differ a little */
	int64_t end = sent + (int64_t)ms * 990000;
	if (rc == 0 && d->dir == dir && d->state == 1 && l->epoch == epoch &&
	    d->revoked_id < f.id && now < end) {
		d->e = f.e;
		d->names = f.names;
		d->n = f.n;
		d->id = f.id;
		d->end = end;
		d->state = 2;
		d->renewing = 0;
		d->last_n = f.n;
		pthread_mutex_unlock(&l->mu);
		atomic_fetch_add_explicit(&l->granted, 1, memory_order_relaxed);
		return;
	}
	if (d->dir == dir && d->state == 1)
		d->state = 0;
	pthread_mutex_unlock(&l->mu);
	free(f.e);
	free(f.names);
	if (rc)
		klog_debug("lease on directory %llu from %s: %s", (unsigned long long)dir, addr,
			   kvp_strerror(rc));
	if (rc == -EREMCHG || kvch_is_transport(rc)) {
		/* That meta no longer leads (or is away): the watch moves to the one libkvfs
		 * talks to now, dropping every lease taken on the old one. */
		pthread_mutex_lock(&l->mu);
		if (l->wcl && l->epoch == epoch)
			kvp_client_shutdown(l->wcl);
		pthread_mutex_unlock(&l->mu);
	}
	atomic_fetch_add_explicit(&l->refused, 1, memory_order_relaxed);
}

void kvc_lease_get_stats(struct kvc_lease *l, struct kvc_lease_stats *o)
{
	memset(o, 0, sizeof(*o));
	if (!l)
		return;
	o->granted = atomic_load(&l->granted);
	o->renewed = atomic_load(&l->renewed);
	o->hits = atomic_load(&l->hits);
	o->negatives = atomic_load(&l->negatives);
	o->revoked = atomic_load(&l->revoked);
	o->dropped = atomic_load(&l->dropped);
	o->refused = atomic_load(&l->refused);
	o->pinned = atomic_load(&l->pinned);
	o->lost = atomic_load(&l->lost);
	o->expired = atomic_load(&l->expired);
}
