/* Connection server: an accept thread, one thread per connection. Each connection first runs
 * the handshake (TLS, or the insecure plaintext one) under one deadline for the whole exchange;
 * then every frame is checked and handed to the handler. A bad frame or a failed handshake
 * closes that connection and is logged; the daemon goes on. Connections still in their
 * handshake are capped in all and per source address, so peers that connect and say nothing
 * cannot take every descriptor; the accept loop reaps finished connections on every pass, so
 * descriptors come back even while accept() fails. */
#define KVFS_LOG_TAG "server"
#include "kvp_frame.h"
#include "log.h"

#include <poll.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define AUTH_TIMEOUT_MS	     5000
#define MAX_UNAUTH	     256
#define MAX_UNAUTH_PER_ADDR  64
#define REAP_EVERY_MS	     100
#define ACCEPT_ERR_PAUSE_MS  100
#define ACCEPT_ERR_LOG_EVERY 10000

struct kvp_conn {
	int fd;
	struct kvp_sock *sk; /* set by its thread once the handshake is done, before any reply */
	uint32_t ip;	     /* source address, network order */
	atomic_int authed;   /* the handshake succeeded (or the connection is over) */
	atomic_int refs;
	atomic_int closed;
	atomic_int finished; /* its thread has ended and may be joined */
	pthread_mutex_t send_mu;
	pthread_t th;
	char peer[32];
	/* copied from the server's options: replies may come after the server is freed */
	void (*on_reply)(void *stats_ctx, const struct kvp_hdr *req, int32_t status,
			 size_t reply_bytes, uint64_t ns);
	void *stats_ctx;
	int send_timeout_ms;
	struct kvp_server *srv;
	struct kvp_conn *next; /* server list; protected by srv->mu */
};

struct kvp_server {
	struct kvp_server_opts o;
	char name[32];
	int lfd;
	uint16_t port;
	atomic_int stopping;
	pthread_t acceptor;
	pthread_mutex_t mu; /* protects conns */
	struct kvp_conn *conns;
};

void kvp_conn_ref(struct kvp_conn *c)
{
	atomic_fetch_add(&c->refs, 1);
}

void kvp_conn_unref(struct kvp_conn *c)
{
	if (atomic_fetch_sub(&c->refs, 1) == 1) {
		if (c->sk)
			kvp_sock_close(c->sk);
		else
			close(c->fd);
		pthread_mutex_destroy(&c->send_mu);
		free(c);
	}
}

const char *kvp_conn_peer(const struct kvp_conn *c)
{
	return c->peer;
}

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int reply(struct kvp_conn *c, const struct kvp_hdr *req, int32_t status, const void *body,
		 size_t body_len, const void *bulk, size_t bulk_len)
{
	struct kvp_hdr h = {.op = req->op, .id = req->id, .status = status, .flags = KVP_F_RESP};
	pthread_mutex_lock(&c->send_mu);
	int rc = atomic_load(&c->closed) || !c->sk
		     ? -EPIPE
		     : kvp_send(c->sk, &h, body, body_len, bulk, bulk_len);
	pthread_mutex_unlock(&c->send_mu);
	if (rc && rc != -EPIPE) {
		if (!atomic_exchange(&c->closed, 1) && rc == -EAGAIN)
			klog_warn("peer %s took no reply bytes for %d ms: closing connection",
				  c->peer, c->send_timeout_ms);
		shutdown(c->fd, SHUT_RDWR);
	}
	if (c->on_reply && req->recv_ns) {
		uint64_t now = mono_ns();
		c->on_reply(c->stats_ctx, req, status, body_len + bulk_len,
			    now > req->recv_ns ? now - req->recv_ns : 0);
	}
	return rc;
}

int kvp_reply(struct kvp_conn *c, const struct kvp_hdr *req, int32_t status, const void *body,
	      size_t body_len, const void *bulk, size_t bulk_len)
{
	if (status)
		return reply(c, req, status, NULL, 0, NULL, 0);
	return reply(c, req, status, body, body_len, bulk, bulk_len);
}

int kvp_reply_err(struct kvp_conn *c, const struct kvp_hdr *req, int32_t status, const void *body,
		  size_t body_len)
{
	if (!status || body_len > KVP_ERR_BODY_MAX)
		return -EINVAL;
	return reply(c, req, status, body, body_len, NULL, 0);
}

static void *conn_main(void *arg)
{
	struct kvp_conn *c = arg;
	struct kvp_server *s = c->srv;
	uint32_t max = s->o.max_body ? s->o.max_body : KVP_MAX_BODY;
	struct kvp_conn_stats *cs = s->o.conn_stats;
	struct kvp_sock *sk = NULL;
	int rc = kvp_sock_accept(c->fd, s->o.secret, AUTH_TIMEOUT_MS, &sk);
	if (rc) {
		if (cs)
			atomic_fetch_add(rc == -ETIMEDOUT ? &cs->hs_timeout : &cs->hs_failed, 1);
		if (!atomic_load(&s->stopping))
			klog_warn("%s: refused peer %s: %s", s->name, c->peer, kvp_strerror(rc));
		atomic_store(&c->authed, 1);
		goto out;
	}
	/* A reply blocked this long without sending a byte fails with EAGAIN and closes the
	 * connection (kvp_reply). */
	kvp_sock_set_send_timeout(sk, c->send_timeout_ms);
	pthread_mutex_lock(&c->send_mu);
	c->sk = sk;
	pthread_mutex_unlock(&c->send_mu);
	atomic_store(&c->authed, 1);
	while (!atomic_load(&s->stopping)) {
		struct kvp_hdr h;
		uint8_t *body;
		rc = kvp_recv(c->sk, &h, &body, max);
		if (rc == -ECONNRESET)
			break;
		if (rc) {
			if (!atomic_load(&s->stopping) && !atomic_load(&c->closed))
				klog_warn("%s: bad frame from %s (%s): closing connection", s->name,
					  c->peer, kvp_strerror(rc));
			break;
		}
		if (h.flags & KVP_F_RESP || h.status != 0) {
			klog_warn("%s: unexpected response frame from %s: closing connection",
				  s->name, c->peer);
			free(body);
			break;
		}
		h.recv_ns = mono_ns();
		rc = s->o.handler(s->o.ctx, c, &h, body);
		if (rc) {
			klog_warn("%s: malformed request op 0x%x from %s (%s): closing connection",
				  s->name, h.op, c->peer, kvp_strerror(rc));
			break;
		}
	}
out:
	pthread_mutex_lock(&c->send_mu);
	atomic_store(&c->closed, 1);
	shutdown(c->fd, SHUT_RDWR);
	pthread_mutex_unlock(&c->send_mu);
	atomic_store(&c->finished, 1);
	return NULL;
}

/* Joins and frees connections whose threads have ended. Called with s->mu held. */
static void reap(struct kvp_server *s, int all)
{
	struct kvp_conn **pp = &s->conns;
	while (*pp) {
		struct kvp_conn *c = *pp;
		if (all || atomic_load(&c->finished)) {
			*pp = c->next;
			if (all) {
				atomic_store(&c->closed, 1);
				shutdown(c->fd, SHUT_RDWR);
			}
			pthread_join(c->th, NULL);
			kvp_conn_unref(c);
		} else {
			pp = &c->next;
		}
	}
}

/* 1 when one more connection from ip would pass a cap on those still in their handshake.
 * Called with s->mu held. */
static int unauth_room(struct kvp_server *s, uint32_t ip)
{
	int all = 0, same = 0;
	for (struct kvp_conn *c = s->conns; c; c = c->next) {
		if (atomic_load(&c->authed))
			continue;
		all++;
		same += c->ip == ip;
	}
	int max = s->o.max_unauth > 0 ? s->o.max_unauth : MAX_UNAUTH;
	int per = s->o.max_unauth_per_addr > 0 ? s->o.max_unauth_per_addr : MAX_UNAUTH_PER_ADDR;
	return all < max && same < per;
}

static void *accept_main(void *arg)
{
	struct kvp_server *s = arg;
	struct kvp_conn_stats *cs = s->o.conn_stats;
	int64_t last_err_log = -ACCEPT_ERR_LOG_EVERY, last_refuse_log = -ACCEPT_ERR_LOG_EVERY;
	while (!atomic_load(&s->stopping)) {
		/* Reap on every pass, not only after an accept: when accept() fails for want of
		 * descriptors, the finished connections are what gives them back. */
		pthread_mutex_lock(&s->mu);
		reap(s, 0);
		pthread_mutex_unlock(&s->mu);
		struct pollfd pfd = {.fd = s->lfd, .events = POLLIN};
		if (poll(&pfd, 1, REAP_EVERY_MS) <= 0)
			continue;
		struct sockaddr_in sa;
		socklen_t sl = sizeof(sa);
		int fd = accept4(s->lfd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN)
				continue;
			if (atomic_load(&s->stopping))
				break;
			if (cs)
				atomic_fetch_add(&cs->accept_err, 1);
			struct timespec ts;
			clock_gettime(CLOCK_MONOTONIC, &ts);
			int64_t now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
			if (now - last_err_log >= ACCEPT_ERR_LOG_EVERY) {
				klog_error("%s: accept: %s (pausing; reaping finished connections)",
					   s->name, strerror(errno));
				last_err_log = now;
			}
			/* The listening socket stays readable: without a pause this spins. */
			usleep(ACCEPT_ERR_PAUSE_MS * 1000);
			continue;
		}
		if (cs)
			atomic_fetch_add(&cs->accepted, 1);
		pthread_mutex_lock(&s->mu);
		int room = unauth_room(s, sa.sin_addr.s_addr);
		pthread_mutex_unlock(&s->mu);
		if (!room) {
			if (cs)
				atomic_fetch_add(&cs->refused, 1);
			struct timespec ts;
			clock_gettime(CLOCK_MONOTONIC, &ts);
			int64_t now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
			if (now - last_refuse_log >= ACCEPT_ERR_LOG_EVERY) {
				char ip[INET_ADDRSTRLEN] = "?";
				inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
				klog_warn(
				    "%s: too many connections in their handshake (from %s or in "
				    "all): closing new ones",
				    s->name, ip);
				last_refuse_log = now;
			}
			close(fd);
			continue;
		}
		int one = 1, buf = 4 << 20;
		setsockopt(fd, IPPROTO_TCP, 1 /* TCP_NODELAY */, &one, sizeof(one));
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
		struct kvp_conn *c = calloc(1, sizeof(*c));
		if (!c) {
			close(fd);
			continue;
		}
		c->fd = fd;
		c->ip = sa.sin_addr.s_addr;
		c->srv = s;
		c->on_reply = s->o.on_reply;
		c->stats_ctx = s->o.stats_ctx;
		c->send_timeout_ms =
		    s->o.send_timeout_ms > 0 ? s->o.send_timeout_ms : KVP_SEND_TIMEOUT_MS;
		atomic_store(&c->refs, 1); /* the server list's reference */
		pthread_mutex_init(&c->send_mu, NULL);
		char ip[INET_ADDRSTRLEN] = "?";
		inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
		snprintf(c->peer, sizeof(c->peer), "%s:%u", ip, ntohs(sa.sin_port));
		pthread_mutex_lock(&s->mu);
		if (pthread_create(&c->th, NULL, conn_main, c) != 0) {
			pthread_mutex_unlock(&s->mu);
			klog_error("%s: cannot start a connection thread", s->name);
			kvp_conn_unref(c);
			continue;
		}
		c->next = s->conns;
		s->conns = c;
		pthread_mutex_unlock(&s->mu);
	}
	return NULL;
}

int kvp_server_start(const struct kvp_server_opts *o, struct kvp_server **out)
{
	if (!o->handler || !o->secret)
		return -EINVAL;
	struct kvp_server *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->o = *o;
	snprintf(s->name, sizeof(s->name), "%s", o->name ? o->name : "server");
	s->lfd = kvp_listen(o->host ? o->host : "127.0.0.1", o->port, &s->port);
	if (s->lfd < 0) {
		int rc = s->lfd;
		klog_error("%s: cannot listen on %s:%u: %s", s->name,
			   o->host ? o->host : "127.0.0.1", o->port, kvp_strerror(rc));
		free(s);
		return rc;
	}
	pthread_mutex_init(&s->mu, NULL);
	if (pthread_create(&s->acceptor, NULL, accept_main, s) != 0) {
		close(s->lfd);
		free(s);
		return -EAGAIN;
	}
	*out = s;
	return 0;
}

uint16_t kvp_server_port(const struct kvp_server *s)
{
	return s->port;
}

void kvp_server_stop(struct kvp_server *s)
{
	if (!s)
		return;
	atomic_store(&s->stopping, 1);
	shutdown(s->lfd, SHUT_RDWR);
	pthread_join(s->acceptor, NULL);
	close(s->lfd);
	pthread_mutex_lock(&s->mu);
	reap(s, 1);
	pthread_mutex_unlock(&s->mu);
	pthread_mutex_destroy(&s->mu);
	free(s);
}
