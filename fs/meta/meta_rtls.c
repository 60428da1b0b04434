/* mrtls: libraft's transport over kvfs's TLS (meta_rtls.h). */
#define KVFS_LOG_TAG "raft-tls"
#include "meta_rtls.h"

#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

/* The dialer's identity, first thing inside TLS: magic, id (le64), address length (le16),
 * address. libraft's accept callback needs both; the TLS handshake already proved that the
 * dialer holds the cluster secret. */
#define HELLO_MAGIC "KVRAFT01"
#define HELLO_FIXED (8 + 8 + 2)
#define ADDR_MAX    256
/* A dial (TCP connect and handshake) gives up after this: a partitioned peer whose SYNs are
 * dropped ends the attempt, and libraft retries. It also bounds how long closing the
 * transport waits for a dial in flight. */
#define DIAL_MS 1000
/* An accepted connection must finish its handshake and hello within this. */
#define ANSWER_MS 5000
/* Unauthenticated connections in their handshake at once; more are closed at once, so a
 * flood of half-open connections costs a bounded number of threads. */
#define MAX_HANDSHAKES 64
/* ... and at most this many from one IPv4 address, so one host cannot take every slot and
 * keep replicas on other hosts from reconnecting. */
#define MAX_HANDSHAKES_PER_IP 8
#define RELAY_BUF	      (64 * 1024)

struct rtls;

/* One connection. Lives while refs > 0: each thread running on it holds one, and one more
 * while it waits in the done list for the loop. */
struct rconn {
	struct rtls *x;
	int server;
	int rawfd;	    /* accepted socket before the handshake owns it (-1 after) */
	struct kvp_sock *k; /* after the handshake */
	int fd[2];	    /* socketpair: [0] the relay's end, [1] libraft's (-1 once handed) */
	int status;	    /* for the loop: 0 ready, else the failure (negative errno) */
	raft_id id;	    /* the peer's (dialer's, for an accepted connection) */
	char addr[ADDR_MAX];
	char peer[64]; /* "host:port" the TCP connection came from or went to, for logs */
	struct raft_uv_connect *req;
	raft_uv_connect_cb cb;
	int refs;
	uint32_t ip;	     /* accepted: the peer's IPv4 address (network order) */
	int handshaking;     /* accepted, handshake not over (x->mu) */
	struct rconn *next;  /* x->conns */
	struct rconn *dnext; /* x->done */
};

struct rtls {
	struct raft_uv_transport *t;
	uv_loop_t *loop;
	uv_async_t async;
	struct kvp_secret sec;
	raft_id id;
	char addr[ADDR_MAX];
	raft_uv_accept_cb accept_cb;
	int lfd, efd; /* listening socket; eventfd that stops the listener */
	pthread_t lthr;
	int lthr_started;
	raft_uv_transport_close_cb close_cb;
	_Atomic uint64_t refused;

	/* mu protects everything below. */
	pthread_mutex_t mu;
	struct rconn *conns;		 /* every connection alive */
	struct rconn *done, **done_tail; /* handed to the loop (FIFO) */
	unsigned handshakes;		 /* accepted, not yet authenticated */
	int closing;
	int async_closed;
};

static struct rtls *X(struct raft_uv_transport *t)
{
	return t->impl;
}

/* Logs a refused peer: the first 20, then every 1000th, so a flood cannot fill the log. */
static void refused(struct rtls *x, const char *peer, const char *why)
{
	uint64_t n = atomic_fetch_add(&x->refused, 1) + 1;
	if (n <= 20 || n % 1000 == 0)
		klog_warn("refused a Raft connection from %s: %s (%llu refused so far)", peer, why,
			  (unsigned long long)n);
}

/* Drops one reference (mu held): the last frees c. The loop is woken while mu is still held,
 * so a closing transport cannot free x between the wake and the unlock (on_async). */
static void unref_locked(struct rconn *c)
{
	struct rtls *x = c->x;
	if (--c->refs > 0)
		return;
	for (struct rconn **p = &x->conns; *p; p = &(*p)->next)
		if (*p == c) {
			*p = c->next;
			break;
		}
	if (c->k)
		kvp_sock_close(c->k);
	if (c->rawfd >= 0)
		close(c->rawfd);
	if (c->fd[0] >= 0)
		close(c->fd[0]);
	if (c->fd[1] >= 0)
		close(c->fd[1]);
	free(c);
	if (x->closing && !x->conns && !x->async_closed)
		uv_async_send(&x->async);
}

static void unref(struct rconn *c)
{
	struct rtls *x = c->x;
	pthread_mutex_lock(&x->mu);
	unref_locked(c);
	pthread_mutex_unlock(&x->mu);
}

/* Hands c to the loop thread (status 0: its fd[1] is ready for libraft). */
static void post(struct rconn *c, int status)
{
	struct rtls *x = c->x;
	pthread_mutex_lock(&x->mu);
	c->status = status;
	c->refs++;
	c->dnext = NULL;
	*x->done_tail = c;
	x->done_tail = &c->dnext;
	uv_async_send(&x->async);
	pthread_mutex_unlock(&x->mu);
}

/* c's connection is authenticated: k owns the socket from here on. A transport that began
 * closing meanwhile has not seen k: shut it here so every later call on it fails. */
static void set_sock(struct rconn *c, struct kvp_sock *k)
{
	pthread_mutex_lock(&c->x->mu);
	c->k = k;
	c->rawfd = -1;
	if (c->x->closing)
		kvp_sock_shutdown(k);
	pthread_mutex_unlock(&c->x->mu);
}

static int send_all(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -EPIPE;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* TLS -> libraft. Ends when either side closes or fails, and then closes both ways, so the
 * other relay thread (blocked on either) returns too. */
static void relay_down(struct rconn *c)
{
	uint8_t *buf = malloc(RELAY_BUF);
	for (long n; buf && (n = kvp_sock_read(c->k, buf, RELAY_BUF, -1)) > 0;)
		if (send_all(c->fd[0], buf, (size_t)n))
			break;
	free(buf);
	shutdown(c->fd[0], SHUT_RDWR);
	kvp_sock_shutdown(c->k);
}

/* libraft -> TLS: a blocking write, so a peer that stops reading fills libraft's pipe and
 * libraft's own queue limits apply (backpressure), and the loop never blocks. */
static void *relay_up(void *arg)
{
	struct rconn *c = arg;
	uint8_t *buf = malloc(RELAY_BUF);
	for (ssize_t n; buf;) {
		n = recv(c->fd[0], buf, RELAY_BUF, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0 || kvp_sock_write(c->k, buf, (size_t)n))
			break;
	}
	free(buf);
	kvp_sock_shutdown(c->k);
	shutdown(c->fd[0], SHUT_RDWR);
	unref(c);
	return NULL;
}

/* Ready: the socketpair, the second relay thread, then this thread relays down. Drops the
 * calling thread's reference. */
static void run(struct rconn *c)
{
	int sp[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp)) {
		post(c, -errno);
		unref(c);
		return;
	}
	fcntl(sp[1], F_SETFL, fcntl(sp[1], F_GETFL) | O_NONBLOCK);
	pthread_mutex_lock(&c->x->mu);
	c->fd[0] = sp[0];
	c->fd[1] = sp[1];
	c->refs++;
	int closing = c->x->closing;
	pthread_mutex_unlock(&c->x->mu);
	pthread_t th;
	if (closing || pthread_create(&th, NULL, relay_up, c)) {
		unref(c); /* the reference taken for relay_up */
		post(c, closing ? -ECANCELED : -EAGAIN);
		unref(c);
		return;
	}
	pthread_detach(th);
	post(c, 0);
	relay_down(c);
	unref(c);
}

static void *dial_main(void *arg)
{
	struct rconn *c = arg;
	struct rtls *x = c->x;
	struct kvp_sock *k;
	int rc = kvp_sock_open(c->addr, &x->sec, DIAL_MS, &k);
	if (rc == 0)
		set_sock(c, k);
	if (rc) {
		/* A replica down or restarting is routine (libraft retries every second): not
		 * worth more than a debug line. A peer that refused our secret is not. */
		if (rc == -EACCES || rc == -EPROTO)
			klog_warn("Raft peer %llu at %s refused our TLS handshake: %s",
				  (unsigned long long)c->id, c->addr, strerror(-rc));
		else
			klog_debug("Raft peer %llu at %s: %s", (unsigned long long)c->id, c->addr,
				   strerror(-rc));
		post(c, rc);
		unref(c);
		return NULL;
	}
	size_t al = strlen(x->addr);
	uint8_t hello[HELLO_FIXED + ADDR_MAX];
	memcpy(hello, HELLO_MAGIC, 8);
	for (int i = 0; i < 8; i++)
		hello[8 + i] = (uint8_t)(x->id >> (8 * i));
	hello[16] = (uint8_t)al;
	hello[17] = (uint8_t)(al >> 8);
	memcpy(hello + HELLO_FIXED, x->addr, al);
	kvp_sock_set_send_timeout(c->k, DIAL_MS);
	rc = kvp_sock_write(c->k, hello, HELLO_FIXED + al);
	kvp_sock_set_send_timeout(c->k, 0);
	if (rc) {
		post(c, rc);
		unref(c);
		return NULL;
	}
	run(c);
	return NULL;
}

/* Reads exactly n bytes by deadline (ms, CLOCK_MONOTONIC as uv_hrtime/1e6). */
static int read_exact(struct kvp_sock *k, uint8_t *p, size_t n, uint64_t deadline)
{
	while (n) {
		uint64_t now = uv_hrtime() / 1000000;
		if (now >= deadline)
			return -ETIMEDOUT;
		long r = kvp_sock_read(k, p, n, (int)(deadline - now));
		if (r == 0)
			return -ECONNRESET;
		if (r < 0)
			return (int)r;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

static void *answer_main(void *arg)
{
	struct rconn *c = arg;
	struct rtls *x = c->x;
	uint64_t deadline = uv_hrtime() / 1000000 + ANSWER_MS;
	struct kvp_sock *k;
	int rc = kvp_sock_accept(c->rawfd, &x->sec, ANSWER_MS, &k);
	pthread_mutex_lock(&x->mu);
	x->handshakes--;
	c->handshaking = 0;
	pthread_mutex_unlock(&x->mu);
	if (rc == 0)
		set_sock(c, k);
	if (rc) {
		refused(x, c->peer,
			rc == -EACCES	   ? "wrong cluster secret"
			: rc == -EPROTO	   ? "not kvfs TLS (a plaintext peer?)"
			: rc == -ETIMEDOUT ? "handshake timed out"
					   : strerror(-rc));
		unref(c);
		return NULL;
	}
	uint8_t hello[HELLO_FIXED];
	rc = read_exact(c->k, hello, HELLO_FIXED, deadline);
	size_t al = rc ? 0 : (size_t)hello[16] | (size_t)hello[17] << 8;
	if (!rc && (memcmp(hello, HELLO_MAGIC, 8) || al == 0 || al >= ADDR_MAX))
		rc = -EPROTO;
	if (!rc)
		rc = read_exact(c->k, (uint8_t *)c->addr, al, deadline);
	if (rc) {
		refused(x, c->peer, rc == -EPROTO ? "bad Raft hello" : strerror(-rc));
		unref(c);
		return NULL;
	}
	c->addr[al] = 0;
	c->id = 0;
	for (int i = 0; i < 8; i++)
		c->id |= (raft_id)hello[8 + i] << (8 * i);
	run(c);
	return NULL;
}

static struct rconn *conn_new(struct rtls *x, int server)
{
	struct rconn *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->x = x;
	c->server = server;
	c->rawfd = c->fd[0] = c->fd[1] = -1;
	c->refs = 1;
	return c;
}

/* Starts c's first thread, linking c into x->conns; the transport must not be closing. */
static int conn_start(struct rtls *x, struct rconn *c, void *(*fn)(void *))
{
	pthread_mutex_lock(&x->mu);
	if (x->closing) {
		pthread_mutex_unlock(&x->mu);
		return -ECANCELED;
	}
	c->next = x->conns;
	x->conns = c;
	pthread_t th;
	int rc = pthread_create(&th, NULL, fn, c);
	if (rc) {
		x->conns = c->next;
		pthread_mutex_unlock(&x->mu);
		return -rc;
	}
	pthread_detach(th);
	pthread_mutex_unlock(&x->mu);
	return 0;
}

static void *listen_main(void *arg)
{
	struct rtls *x = arg;
	for (;;) {
		struct pollfd p[2] = {{.fd = x->lfd, .events = POLLIN},
				      {.fd = x->efd, .events = POLLIN}};
		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (p[1].revents)
			break;
		struct sockaddr_in sa;
		socklen_t sl = sizeof(sa);
		int fd = accept4(x->lfd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE || errno == ENOMEM)
				usleep(100000); /* out of descriptors: do not spin */
			continue;
		}
		char peer[64];
		const uint8_t *ip = (const uint8_t *)&sa.sin_addr;
		snprintf(peer, sizeof(peer), "%u.%u.%u.%u:%u", ip[0], ip[1], ip[2], ip[3],
			 ntohs(sa.sin_port));
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		pthread_mutex_lock(&x->mu);
		unsigned same = 0;
		for (struct rconn *o = x->conns; o; o = o->next)
			same += o->handshaking && o->ip == sa.sin_addr.s_addr;
		int busy = x->handshakes >= MAX_HANDSHAKES || same >= MAX_HANDSHAKES_PER_IP;
		if (!busy)
			x->handshakes++;
		pthread_mutex_unlock(&x->mu);
		struct rconn *c = busy ? NULL : conn_new(x, 1);
		if (!c) {
			close(fd);
			refused(x, peer,
				!busy ? "out of memory"
				: same >= MAX_HANDSHAKES_PER_IP
				    ? "too many handshakes from this address at once"
				    : "too many handshakes at once");
			if (!busy) {
				pthread_mutex_lock(&x->mu);
				x->handshakes--;
				pthread_mutex_unlock(&x->mu);
			}
			continue;
		}
		c->rawfd = fd;
		c->ip = sa.sin_addr.s_addr;
		c->handshaking = 1;
		snprintf(c->peer, sizeof(c->peer), "%s", peer);
		if (conn_start(x, c, answer_main)) {
			pthread_mutex_lock(&x->mu);
			x->handshakes--;
			pthread_mutex_unlock(&x->mu);
			close(fd);
			free(c);
		}
	}
	return NULL;
}

/* ---- on the loop thread ---- */

static void pipe_free_cb(uv_handle_t *h)
{
	raft_free(h);
}

/* libraft's end of c as a uv_pipe_t (raft_malloc'd: libraft frees it with raft_free after
 * uv_close), or NULL. Takes fd[1] in either case. */
static uv_stream_t *make_stream(struct rtls *x, struct rconn *c)
{
	int fd = c->fd[1];
	c->fd[1] = -1;
	uv_pipe_t *p = raft_malloc(sizeof(*p));
	if (!p) {
		close(fd);
		return NULL;
	}
	if (uv_pipe_init(x->loop, p, 0)) {
		raft_free(p);
		close(fd);
		return NULL;
	}
	if (uv_pipe_open(p, fd)) {
		close(fd);
		uv_close((uv_handle_t *)p, pipe_free_cb);
		return NULL;
	}
	return (uv_stream_t *)p;
}

static void async_closed(uv_handle_t *h)
{
	struct rtls *x = h->data;
	if (x->close_cb)
		x->close_cb(x->t);
}

static void on_async(uv_async_t *a)
{
	struct rtls *x = a->data;
	for (;;) {
		pthread_mutex_lock(&x->mu);
		struct rconn *c = x->done;
		if (c) {
			x->done = c->dnext;
			if (!x->done)
				x->done_tail = &x->done;
		}
		int closing = x->closing;
		pthread_mutex_unlock(&x->mu);
		if (!c)
			break;
		uv_stream_t *s = NULL;
		if (c->status == 0 && !closing)
			s = make_stream(x, c);
		if (c->server) {
			if (s)
				x->accept_cb(x->t, c->id, c->addr, s);
		} else {
			c->cb(c->req, s, s ? 0 : closing ? RAFT_CANCELED : RAFT_NOCONNECTION);
		}
		/* Not handed to libraft (closing or failed): the relay sees its peer end
		 * close and ends. */
		if (!s && c->fd[1] >= 0) {
			close(c->fd[1]);
			c->fd[1] = -1;
		}
		unref(c);
	}
	pthread_mutex_lock(&x->mu);
	int done = x->closing && !x->conns && !x->done && !x->async_closed;
	if (done)
		x->async_closed = 1;
	pthread_mutex_unlock(&x->mu);
	if (done) {
		if (x->lthr_started) {
			pthread_join(x->lthr, NULL);
			x->lthr_started = 0;
		}
		uv_close((uv_handle_t *)&x->async, async_closed);
	}
}

static int t_init(struct raft_uv_transport *t, raft_id id, const char *address)
{
	struct rtls *x = X(t);
	if (strlen(address) >= ADDR_MAX)
		return RAFT_NAMETOOLONG;
	x->id = id;
	snprintf(x->addr, sizeof(x->addr), "%s", address);
	return 0;
}

static int t_listen(struct raft_uv_transport *t, raft_uv_accept_cb cb)
{
	struct rtls *x = X(t);
	char host[ADDR_MAX];
	uint16_t port;
	if (kvp_addr_parse(x->addr, host, sizeof(host), &port)) {
		snprintf(t->errmsg, sizeof(t->errmsg), "bad Raft address %.64s", x->addr);
		return RAFT_INVALID;
	}
	int fd = kvp_listen(host, port, &port);
	if (fd < 0) {
		snprintf(t->errmsg, sizeof(t->errmsg), "listen on %.64s: %s", x->addr,
			 strerror(-fd));
		return RAFT_IOERR;
	}
	x->lfd = fd;
	x->accept_cb = cb;
	int rc = pthread_create(&x->lthr, NULL, listen_main, x);
	if (rc) {
		snprintf(t->errmsg, sizeof(t->errmsg), "listener thread: %s", strerror(rc));
		return RAFT_NOMEM;
	}
	x->lthr_started = 1;
	return 0;
}

static int t_connect(struct raft_uv_transport *t, struct raft_uv_connect *req, raft_id id,
		     const char *address, raft_uv_connect_cb cb)
{
	struct rtls *x = X(t);
	if (strlen(address) >= ADDR_MAX)
		return RAFT_NAMETOOLONG;
	struct rconn *c = conn_new(x, 0);
	if (!c)
		return RAFT_NOMEM;
	c->id = id;
	c->req = req;
	c->cb = cb;
	snprintf(c->addr, sizeof(c->addr), "%s", address);
	snprintf(c->peer, sizeof(c->peer), "%.63s", address);
	if (conn_start(x, c, dial_main)) {
		free(c);
		return RAFT_NOMEM;
	}
	return 0;
}

/* Stops the listener, cuts every connection (the relays see their sockets shut and end),
 * cancels dials in flight (their callbacks run with RAFT_CANCELED once their threads end, at
 * most DIAL_MS later), and calls cb once no thread is left. */
static void t_close(struct raft_uv_transport *t, raft_uv_transport_close_cb cb)
{
	struct rtls *x = X(t);
	x->close_cb = cb;
	pthread_mutex_lock(&x->mu);
	x->closing = 1;
	for (struct rconn *c = x->conns; c; c = c->next) {
		if (c->rawfd >= 0)
			shutdown(c->rawfd, SHUT_RDWR);
		if (c->k)
			kvp_sock_shutdown(c->k);
		if (c->fd[0] >= 0)
			shutdown(c->fd[0], SHUT_RDWR);
	}
	pthread_mutex_unlock(&x->mu);
	uint64_t one = 1;
	if (x->efd >= 0 && write(x->efd, &one, sizeof(one)) < 0)
		klog_warn("cannot stop the Raft listener: %s", strerror(errno));
	uv_async_send(&x->async);
}

int mrtls_init(struct raft_uv_transport *t, uv_loop_t *loop, const struct kvp_secret *s)
{
	struct rtls *x = calloc(1, sizeof(*x));
	if (!x)
		return RAFT_NOMEM;
	memset(t, 0, sizeof(*t));
	x->t = t;
	x->loop = loop;
	x->sec = *s;
	x->lfd = -1;
	x->efd = eventfd(0, EFD_CLOEXEC);
	x->done_tail = &x->done;
	pthread_mutex_init(&x->mu, NULL);
	if (x->efd < 0 || uv_async_init(loop, &x->async, on_async)) {
		if (x->efd >= 0)
			close(x->efd);
		pthread_mutex_destroy(&x->mu);
		free(x);
		return RAFT_NOMEM;
	}
	x->async.data = x;
	t->impl = x;
	t->init = t_init;
	t->listen = t_listen;
	t->connect = t_connect;
	t->close = t_close;
	return 0;
}

void mrtls_free(struct raft_uv_transport *t)
{
	struct rtls *x = X(t);
	if (!x)
		return;
	if (x->lthr_started)
		pthread_join(x->lthr, NULL);
	if (x->lfd >= 0)
		close(x->lfd);
	if (x->efd >= 0)
		close(x->efd);
	explicit_bzero(x->sec.key, sizeof(x->sec.key));
	pthread_mutex_destroy(&x->mu);
	free(x);
	t->impl = NULL;
}
