/* Pipelined RPC client: requests are written under a send lock, a reader thread matches
 * responses to waiting calls by id. A connection that fails fails every call in flight; the
 * pool then opens a new one on the next use. */
#define KVFS_LOG_TAG "rpc"
#include "kvp_frame.h"
#include "kvp_int.h"
#include "ktime.h"
#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define NBUCKET 64

struct kvp_call {
	uint64_t id;
	struct kvp_client *c;
	struct kvp_call *next; /* bucket chain; protected by c->mu */
	int done;	       /* protected by c->mu */
	int32_t status;
	uint8_t *body;
	uint32_t len;
	/* kvp_call_into: a response of exactly head + dst_len bytes is read straight into dst
	 * after its first head bytes. Set and read under c->mu; receiving: the reader has taken
	 * the call out of its bucket and is filling dst without the lock. */
	uint8_t *dst;
	uint32_t head, dst_len;
	int receiving;
};

struct kvp_client {
	struct kvp_sock *sk;
	char addr[KVP_ADDR_MAX];
	pthread_mutex_t send_mu; /* serialises frames on sk */
	pthread_mutex_t mu;	 /* protects bucket, next_id */
	pthread_cond_t cv;	 /* signalled when any call completes or the connection fails */
	struct kvp_call *bucket[NBUCKET];
	uint64_t next_id;
	atomic_int alive;
	pthread_t reader;
	/* pool bookkeeping, protected by the pool's lock */
	int refs, detached;
};

static void fail_all(struct kvp_client *c, int err)
{
	pthread_mutex_lock(&c->mu);
	for (int b = 0; b < NBUCKET; b++) {
		for (struct kvp_call *k = c->bucket[b]; k; k = k->next) {
			k->done = 1;
			k->status = err;
		}
		c->bucket[b] = NULL;
	}
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
}

static struct kvp_call **find_call(struct kvp_client *c, uint64_t id)
{
	struct kvp_call **pp = &c->bucket[id % NBUCKET];
	while (*pp && (*pp)->id != id)
		pp = &(*pp)->next;
	return pp;
}

/* The body of a response whose call asked for it (kvp_call_into): head bytes into a small
 * malloc'd buffer, the rest straight into the caller's dst, so a 2 MiB chunk is neither
 * allocated (a fresh mapping, faulted in page by page) nor copied once more. k is out of
 * its bucket: only this thread touches dst until done is set. */
static int recv_into(struct kvp_client *c, struct kvp_call *k, const struct kvp_hdr *h)
{
	uint8_t *b = k->head ? malloc(k->head) : NULL;
	int rc = k->head && !b ? -ENOMEM : 0;
	if (!rc)
		rc = kvp_io_read(c->sk, b, k->head, -1);
	if (!rc)
		rc = kvp_io_read(c->sk, k->dst, k->dst_len, -1);
	pthread_mutex_lock(&c->mu);
	k->receiving = 0;
	k->done = 1;
	k->status = rc ? -ECONNRESET : h->status;
	k->body = rc ? NULL : b;
	k->len = k->head;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	if (rc)
		free(b);
	return rc;
}

static void *reader_main(void *arg)
{
	struct kvp_client *c = arg;
	for (;;) {
		struct kvp_hdr h;
		uint8_t hb[KVP_HDR_SIZE], *body = NULL;
		int rc = kvp_io_read(c->sk, hb, sizeof(hb), -1);
		if (!rc)
			rc = kvp_hdr_decode(hb, &h, KVP_MAX_BODY);
		if (rc == 0 && !(h.flags & KVP_F_RESP))
			rc = -EPROTO;
		struct kvp_call *k = NULL;
		if (!rc) {
			pthread_mutex_lock(&c->mu);
			struct kvp_call **pp = find_call(c, h.id);
			if (*pp && (*pp)->dst && h.status == 0 &&
			    h.len == (uint64_t)(*pp)->head + (*pp)->dst_len) {
				k = *pp;
				*pp = k->next;
				k->receiving = 1;
			}
			pthread_mutex_unlock(&c->mu);
			if (k)
				rc = recv_into(c, k, &h);
			else if (h.len && !(body = malloc(h.len)))
				rc = -ENOMEM;
			else if (h.len)
				rc = kvp_io_read(c->sk, body, h.len, -1);
		}
		if (rc) {
			if (atomic_load(&c->alive) && rc != -ECONNRESET)
				klog_warn("connection to %s failed: %s", c->addr, kvp_strerror(rc));
			atomic_store(&c->alive, 0);
			fail_all(c, -ECONNRESET);
			free(body);
			return NULL;
		}
		if (k)
			continue;
		pthread_mutex_lock(&c->mu);
		struct kvp_call **pp = find_call(c, h.id);
		if ((k = *pp)) {
			*pp = k->next;
			k->done = 1;
			k->status = h.status;
			k->body = body;
			k->len = h.len;
			body = NULL;
			pthread_cond_broadcast(&c->cv);
		}
		pthread_mutex_unlock(&c->mu);
		free(body); /* a response nobody waits for any more (timed out) */
	}
}

int kvp_client_open(const char *addr, const struct kvp_secret *s, int timeout_ms,
		    struct kvp_client **out)
{
	if (strlen(addr) >= KVP_ADDR_MAX)
		return -EINVAL;
	struct kvp_sock *sk;
	int rc = kvp_sock_open(addr, s, timeout_ms, &sk);
	if (rc) {
		if (rc != -ECONNREFUSED)
			klog_warn("handshake with %s failed: %s", addr, kvp_strerror(rc));
		return rc;
	}
	struct kvp_client *c = calloc(1, sizeof(*c));
	if (!c) {
		kvp_sock_close(sk);
		return -ENOMEM;
	}
	c->sk = sk;
	strcpy(c->addr, addr);
	kvp_client_set_send_timeout(c, KVP_SEND_TIMEOUT_MS);
	pthread_mutex_init(&c->send_mu, NULL);
	pthread_mutex_init(&c->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->cv, &ca);
	pthread_condattr_destroy(&ca);
	c->next_id = 1;
	atomic_store(&c->alive, 1);
	rc = pthread_create(&c->reader, NULL, reader_main, c);
	if (rc) {
		kvp_sock_close(sk);
		free(c);
		return -rc;
	}
	*out = c;
	return 0;
}

void kvp_client_set_send_timeout(struct kvp_client *c, int ms)
{
	kvp_sock_set_send_timeout(c->sk, ms);
}

void kvp_client_close(struct kvp_client *c)
{
	if (!c)
		return;
	atomic_store(&c->alive, 0);
	kvp_sock_shutdown(c->sk);
	pthread_join(c->reader, NULL);
	fail_all(c, -ECONNABORTED);
	kvp_sock_close(c->sk);
	pthread_mutex_destroy(&c->send_mu);
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->cv);
	free(c);
}

void kvp_client_shutdown(struct kvp_client *c)
{
	atomic_store(&c->alive, 0);
	kvp_sock_shutdown(c->sk);
}

int kvp_client_alive(const struct kvp_client *c)
{
	return atomic_load(&((struct kvp_client *)c)->alive);
}

const char *kvp_client_addr(const struct kvp_client *c)
{
	return c->addr;
}

static void unlink_call(struct kvp_client *c, struct kvp_call *k)
{
	struct kvp_call **pp = &c->bucket[k->id % NBUCKET];
	while (*pp && *pp != k)
		pp = &(*pp)->next;
	if (*pp)
		*pp = k->next;
}

int kvp_call_start(struct kvp_client *c, uint16_t op, const void *body, size_t body_len,
		   const void *bulk, size_t bulk_len, struct kvp_call **out)
{
	if (!atomic_load(&c->alive))
		return -ECONNRESET;
	struct kvp_call *k = calloc(1, sizeof(*k));
	if (!k)
		return -ENOMEM;
	k->c = c;
	pthread_mutex_lock(&c->mu);
	k->id = c->next_id++;
	k->next = c->bucket[k->id % NBUCKET];
	c->bucket[k->id % NBUCKET] = k;
	pthread_mutex_unlock(&c->mu);

	struct kvp_hdr h = {.op = op, .id = k->id};
	pthread_mutex_lock(&c->send_mu);
	int rc = kvp_send(c->sk, &h, body, body_len, bulk, bulk_len);
	pthread_mutex_unlock(&c->send_mu);
	if (rc) {
		atomic_store(&c->alive, 0);
		kvp_sock_shutdown(c->sk);
		pthread_mutex_lock(&c->mu);
		unlink_call(c, k);
		pthread_mutex_unlock(&c->mu);
		free(k);
		return rc == -EMSGSIZE ? rc : -ECONNRESET;
	}
	*out = k;
	return 0;
}

int kvp_call_into(struct kvp_call *k, uint32_t head, void *dst, uint32_t len)
{
	struct kvp_client *c = k->c;
	int rc = -EALREADY;
	pthread_mutex_lock(&c->mu);
	if (!k->done && !k->receiving) {
		k->dst = dst;
		k->head = head;
		k->dst_len = len;
		rc = 0;
	}
	pthread_mutex_unlock(&c->mu);
	return rc;
}

/* The deadline passed while the reader fills the caller's dst: the caller may reuse dst once
 * we return, so the reader must be done with it first. A body on its way gets as long again
 * (at least 1 s); a peer that stalls mid-frame is cut off, which ends the read at once. Called
 * and returns with c->mu held. */
static int wait_receiving(struct kvp_client *c, struct kvp_call *k, int timeout_ms)
{
	struct timespec dl;
	kvfs_deadline(&dl, CLOCK_MONOTONIC, timeout_ms > 1000 ? timeout_ms : 1000);
	while (!k->done) {
		if (pthread_cond_timedwait(&c->cv, &c->mu, &dl) == ETIMEDOUT && !k->done) {
			atomic_store(&c->alive, 0);
			kvp_sock_shutdown(c->sk);
			while (!k->done)
				pthread_cond_wait(&c->cv, &c->mu);
			return -ETIMEDOUT;
		}
	}
	return 0;
}

/* kvp_call_wait; err_body: a response with a non-zero status hands over its body too. */
static int call_wait(struct kvp_call *k, int timeout_ms, uint8_t **body, uint32_t *len,
		     int err_body)
{
	struct kvp_client *c = k->c;
	struct timespec dl;
	kvfs_deadline(&dl, CLOCK_MONOTONIC, timeout_ms);
	int rc = 0;
	pthread_mutex_lock(&c->mu);
	while (!k->done) {
		if (pthread_cond_timedwait(&c->cv, &c->mu, &dl) == ETIMEDOUT && !k->done) {
			if (k->receiving) {
				rc = wait_receiving(c, k, timeout_ms);
				break;
			}
			unlink_call(c, k);
			rc = -ETIMEDOUT;
			break;
		}
	}
	pthread_mutex_unlock(&c->mu);
	if (!rc)
		rc = k->status;
	/* A transport error leaves k->body NULL: only a peer's response has one. */
	int give = rc == 0 || err_body;
	if (give && len)
		*len = rc == 0 || k->body ? k->len : 0;
	if (give && body) {
		*body = k->body;
		k->body = NULL;
	}
	free(k->body);
	free(k);
	return rc;
}

int kvp_call_wait(struct kvp_call *k, int timeout_ms, uint8_t **body, uint32_t *len)
{
	return call_wait(k, timeout_ms, body, len, 0);
}

int kvp_call(struct kvp_client *c, uint16_t op, const void *body, size_t body_len, const void *bulk,
	     size_t bulk_len, int timeout_ms, uint8_t **rbody, uint32_t *rlen)
{
	struct kvp_call *k;
	int rc = kvp_call_start(c, op, body, body_len, bulk, bulk_len, &k);
	if (rc)
		return rc;
	return kvp_call_wait(k, timeout_ms, rbody, rlen);
}

int kvp_call_detail(struct kvp_client *c, uint16_t op, const void *body, size_t body_len,
		    const void *bulk, size_t bulk_len, int timeout_ms, uint8_t **rbody,
		    uint32_t *rlen)
{
	*rbody = NULL;
	*rlen = 0;
	struct kvp_call *k;
	int rc = kvp_call_start(c, op, body, body_len, bulk, bulk_len, &k);
	if (rc)
		return rc;
	return call_wait(k, timeout_ms, rbody, rlen, 1);
}

/* ---- pool ---- */

struct pool_ent {
	char addr[KVP_ADDR_MAX];
	struct kvp_client *c;
};

struct kvp_pool {
	pthread_mutex_t mu; /* protects ents, n, and every client's refs/detached */
	struct pool_ent *ents;
	size_t n, cap;
	struct kvp_secret secret;
	int timeout_ms;
};

int kvp_pool_create(const struct kvp_secret *s, int connect_timeout_ms, struct kvp_pool **out)
{
	struct kvp_pool *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	pthread_mutex_init(&p->mu, NULL);
	p->secret = *s;
	p->timeout_ms = connect_timeout_ms;
	*out = p;
	return 0;
}

void kvp_pool_destroy(struct kvp_pool *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->n; i++)
		kvp_client_close(p->ents[i].c);
	free(p->ents);
	pthread_mutex_destroy(&p->mu);
	free(p);
}

static struct pool_ent *pool_find(struct kvp_pool *p, const char *addr)
{
	for (size_t i = 0; i < p->n; i++)
		if (strcmp(p->ents[i].addr, addr) == 0)
			return &p->ents[i];
	return NULL;
}

/* Drops the pool's hold on a failed client; closed now if unused, else by the last put. */
static void retire(struct pool_ent *e)
{
	struct kvp_client *old = e->c;
	e->c = NULL;
	if (!old)
		return;
	if (old->refs == 0)
		kvp_client_close(old);
	else
		old->detached = 1;
}

int kvp_pool_get(struct kvp_pool *p, const char *addr, struct kvp_client **out)
{
	if (strlen(addr) >= KVP_ADDR_MAX)
		return -EINVAL;
	pthread_mutex_lock(&p->mu);
	struct pool_ent *e = pool_find(p, addr);
	if (e && e->c && kvp_client_alive(e->c)) {
		e->c->refs++;
		*out = e->c;
		pthread_mutex_unlock(&p->mu);
		return 0;
	}
	pthread_mutex_unlock(&p->mu);

	/* Connect outside the lock: a hung peer must not stall calls to every other node. */
	struct kvp_client *c;
	int rc = kvp_client_open(addr, &p->secret, p->timeout_ms, &c);
	if (rc)
		return rc;

	pthread_mutex_lock(&p->mu);
	e = pool_find(p, addr);
	if (e && e->c && kvp_client_alive(e->c)) {
		/* Someone else connected meanwhile: use theirs. */
		e->c->refs++;
		*out = e->c;
		pthread_mutex_unlock(&p->mu);
		kvp_client_close(c);
		return 0;
	}
	if (!e) {
		if (p->n == p->cap) {
			size_t cap = p->cap ? p->cap * 2 : 16;
			struct pool_ent *ne = realloc(p->ents, cap * sizeof(*ne));
			if (!ne) {
				pthread_mutex_unlock(&p->mu);
				kvp_client_close(c);
				return -ENOMEM;
			}
			p->ents = ne;
			p->cap = cap;
		}
		e = &p->ents[p->n++];
		strcpy(e->addr, addr);
		e->c = NULL;
	}
	retire(e);
	e->c = c;
	c->refs = 1;
	*out = c;
	pthread_mutex_unlock(&p->mu);
	return 0;
}

void kvp_pool_abort(struct kvp_pool *p, const char *addr)
{
	pthread_mutex_lock(&p->mu);
	struct pool_ent *e = pool_find(p, addr);
	/* Only shut down: the reader fails the calls and the client is freed as any failed
	 * one (a client in e->c is not closed while p->mu is held). */
	if (e && e->c && kvp_client_alive(e->c))
		kvp_sock_shutdown(e->c->sk);
	pthread_mutex_unlock(&p->mu);
}

void kvp_pool_put(struct kvp_pool *p, struct kvp_client *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&p->mu);
	int close_it = --c->refs == 0 && c->detached;
	if (!close_it && !kvp_client_alive(c) && c->refs == 0) {
		struct pool_ent *e = pool_find(p, c->addr);
		if (e && e->c == c) {
			e->c = NULL;
			close_it = 1;
		}
	}
	pthread_mutex_unlock(&p->mu);
	if (close_it)
		kvp_client_close(c);
}
